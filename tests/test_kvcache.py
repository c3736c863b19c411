"""kvcache/: one rollback decision (contract.cache_resume) that every cached model calls, so that the bug zoo's
cache bugs reach them all, the JAX model included; and a core that changes nothing on import and repeats a seeded
run from process to process in its default (plain) layout."""

import ctypes
import subprocess
import sys

import numpy as np
import pytest

import gpt2
import sampling
from batching import gpt2_batched
from classroom import bug_zoo, lossless
from conftest import REPO
from gpt2_cases import random_params
from helpers import HPARAMS, perturbed, random_target
from kvcache import contract

TINY = {"n_vocab": 40, "n_ctx": 32, "n_embd": 16, "n_head": 2, "n_layer": 2}


def counting_cache_resume(monkeypatch):
    calls = []
    real = contract.cache_resume
    monkeypatch.setattr(contract, "cache_resume", lambda *args: calls.append(args) or real(*args))
    return calls


def cached_models():
    params = random_params(TINY, seed=0)
    yield "GPT2Model", lambda x, n: gpt2.GPT2Model(params, TINY).logits(x, n)
    yield "CachedTableModel", lambda x, n: lossless.CachedTableModel(lossless.random_context_table(4, 1)).logits(x, n)
    yield "BatchedGPT2Model", lambda x, n: gpt2_batched.BatchedGPT2Model(params, TINY, 1).logits([x], n)
    jax_backend = pytest.importorskip("jax_backend.gpt2_jax")
    yield "JaxGPT2Model", lambda x, n: jax_backend.JaxGPT2Model(params, TINY).logits(x, n)


def test_every_cached_model_calls_the_one_rollback_decision(monkeypatch):
    calls = counting_cache_resume(monkeypatch)
    for name, call in cached_models():
        before = len(calls)
        call([1, 2, 3], 2)
        assert len(calls) == before + 1 and calls[-1][1].tolist() == [1, 2, 3] and calls[-1][2] == 2, name


@pytest.mark.slow  # JAX compiles its programs: the slow tier
def test_the_zoos_cache_bugs_break_the_jax_model_too():
    """bug_zoo patches contract.cache_resume: the JAX model, which re-derived the decision before, now runs it."""
    gpt2_jax = pytest.importorskip("jax_backend.gpt2_jax")
    target_params = random_target()  # test_bug_zoo's pair, whose greedy tokens the bugs change
    target = gpt2_jax.JaxGPT2Model(target_params, HPARAMS)
    draft = gpt2_jax.JaxGPT2Model(perturbed(target_params, 0.3, 1), HPARAMS)
    prompt = [1, 2, 3]
    expected = sampling.autoregressive_sampling(prompt, gpt2.GPT2Model(target_params, HPARAMS), 24, temperature=0)
    original = contract.cache_resume
    for name in ("no_rollback", "cache_position_plus_one"):
        target.reset(), draft.reset()
        buggy = bug_zoo.ZOO[name].decoder()(prompt, draft, target, 24, 4, 0, temperature=0)
        assert not np.array_equal(buggy, expected), name
        assert contract.cache_resume is original
    target.reset(), draft.reset()
    assert np.array_equal(sampling.speculative_sampling(prompt, draft, target, 24, 4, temperature=0), expected)


def run_python(code):
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_importing_the_kit_leaves_openblas_threads_as_they_were():
    from engine.threads import openblas_call

    if openblas_call("get_num_threads", ctypes.c_int) is None:
        pytest.skip("NumPy has no OpenBLAS of its own here")
    before, after = run_python("""
import ctypes
from engine.threads import openblas_call
before = openblas_call("get_num_threads", ctypes.c_int)
import gpt2, sampling, verifiers, main, engine
print(before, openblas_call("get_num_threads", ctypes.c_int))
""").split()
    assert before == after


def test_a_seeded_run_of_the_bundled_pair_repeats_in_another_process():
    """GPT2Model's default layout is the checkpoint's arrays: nothing measured, so two processes agree bit for bit."""
    code = f"""
import numpy as np
import gpt2, sampling, utils
_, dh, dp = utils.load_encoder_hparams_and_params("teach-draft", {str(REPO / "models")!r})
_, th, tp = utils.load_encoder_hparams_and_params("teach-target", {str(REPO / "models")!r})
tokens = sampling.speculative_sampling([10, 20, 30], gpt2.GPT2Model(dp, dh), gpt2.GPT2Model(tp, th), 48, 4,
                                       rng=np.random.default_rng(7), temperature=1.0)
print(" ".join(map(str, tokens)))
"""
    first, second = run_python(code), run_python(code)
    assert first == second and len(first.split()) >= 3 + 48
