"""engine/plan_cache.py: a measured layout plan is kept per machine, so a second build measures nothing; a corrupt
or stale file is ignored and rewritten; and the cache lives where the test run says, never in the user's home."""

import json

import numpy as np
import pytest

import engine
import gpt2
from engine import measure, plan_cache
from gpt2_cases import random_params

HPARAMS = {"n_vocab": 64, "n_ctx": 16, "n_embd": 32, "n_head": 2, "n_layer": 1}


@pytest.fixture
def counted(monkeypatch, tmp_path):  # -> the list of measurements made; the cache in tmp_path, none in memory
    monkeypatch.setenv("SPECULATIVE_KIT_CACHE", str(tmp_path))
    calls, real = [], measure.measure_costs_by_layout
    monkeypatch.setattr(measure, "measure_costs_by_layout", lambda *args, **kw: calls.append(args) or real(*args, **kw))
    monkeypatch.setattr(measure, "MEASURED_PLANS", {})
    return calls


def build_twice(params):  # -> the two models' plans, a new process's lookup between them
    first = engine.fast_model(params, HPARAMS).plan
    measure.MEASURED_PLANS.clear()  # what a second `python main.py` starts with
    return first, engine.fast_model(params, HPARAMS).plan


def test_a_second_build_reads_the_kept_plan_and_measures_nothing(counted, tmp_path):
    params = random_params(HPARAMS, seed=0)
    first, second = build_twice(params)
    assert len(counted) == 1 and second == first  # the same layouts, rows to feed and costs
    (kept,) = tmp_path.glob("layout-plan-*.json")
    key = json.loads(kept.read_text())["key"]
    assert key["cpu"] == plan_cache.cpu_identity() and key["blas"] == plan_cache.blas_identity()
    model, plain = engine.fast_model(params, HPARAMS), gpt2.GPT2Model(params, HPARAMS)
    np.testing.assert_allclose(model.logits([1, 2, 3, 4], 3), plain.logits([1, 2, 3, 4], 3), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("damage", ["corrupt", "stale", "not a plan"])
def test_a_corrupt_or_stale_file_is_ignored_and_rewritten(counted, tmp_path, damage):
    params = random_params(HPARAMS, seed=0)
    engine.fast_model(params, HPARAMS)
    (kept,) = tmp_path.glob("layout-plan-*.json")
    content = json.loads(kept.read_text())
    if damage == "corrupt":
        kept.write_text(kept.read_text()[:40])
    elif damage == "stale":
        kept.write_text(json.dumps({**content, "key": {**content["key"], "version": plan_cache.VERSION - 1}}))
    else:
        kept.write_text(json.dumps({**content, "plan": {"attn.c_attn": content["plan"]["attn.c_attn"]}}))
    measure.MEASURED_PLANS.clear()
    engine.fast_model(params, HPARAMS)
    assert len(counted) == 2  # measured again
    assert json.loads(kept.read_text())["key"] == content["key"]  # rewritten whole, for this machine
    assert plan_cache.load(content["key"]) == engine.fast_model(params, HPARAMS).plan
    measure.MEASURED_PLANS.clear()
    engine.fast_model(params, HPARAMS)
    assert len(counted) == 2  # and read back the next time


def test_other_shapes_or_threads_get_their_own_plan(counted, tmp_path):
    engine.fast_model(random_params(HPARAMS, seed=0), HPARAMS)
    wider = dict(HPARAMS, n_embd=64)
    engine.fast_model(random_params(wider, seed=0), wider)
    assert len(counted) == 2 and len(list(tmp_path.glob("layout-plan-*.json"))) == 2


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECULATIVE_KIT_CACHE", str(tmp_path / "kit"))
    assert plan_cache.cache_folder() == tmp_path / "kit"
    monkeypatch.delenv("SPECULATIVE_KIT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert plan_cache.cache_folder() == tmp_path / "xdg" / "speculative-sampling-kit"


def test_the_test_run_never_writes_to_the_users_cache():
    import os

    assert os.environ["SPECULATIVE_KIT_CACHE"] and plan_cache.cache_folder() == plan_cache.Path(
        os.environ["SPECULATIVE_KIT_CACHE"])
