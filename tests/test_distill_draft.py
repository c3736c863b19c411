"""tools/distill_draft.py's on-policy rows (--continued): the target's continuations are what sampling.py's
Algorithm 1 writes, the pool is kept and read back, every position weighs alike in the loss, and a few steps
of the stage run on a tiny pair (the CPU)."""

import json

import numpy as np
import pytest

import gpt2
import sampling
import utils
from conftest import REPO
from helpers import train_tiny_pair

jax = pytest.importorskip("jax")
from tools import distill_draft, train_pair  # noqa: E402


def test_greedy_continuations_are_algorithm_1s_tokens_for_training_prompts():
    _, hparams, params = utils.load_encoder_hparams_and_params("teach-target", REPO / "models")
    tokens = np.arange(1000, dtype=np.uint16) * 3 % 4096  # a corpus whose windows are easy to find again
    rows = distill_draft.continuations(params, hparams, tokens, 3, 6, 5, 0.0, np.random.default_rng(0), batch_size=2)
    assert rows.dtype == np.int32 and rows.shape == (3, 11)
    for row in rows:
        start = int(np.flatnonzero(tokens == row[0])[0])
        assert row[:6].tolist() == tokens[start:start + 6].tolist()  # a window of the corpus
        greedy = sampling.autoregressive_sampling(row[:6].astype(np.int64), gpt2.GPT2Model(params, hparams), 5,
                                                  temperature=0)
        assert row.tolist() == greedy.tolist()
    sampled, again = (distill_draft.continuations(params, hparams, tokens, 3, 6, 5, 1.0, np.random.default_rng(0),
                                                  batch_size=2) for _ in range(2))
    assert np.array_equal(sampled, again) and np.array_equal(sampled[:, :6], rows[:, :6])  # same prompts, seeded
    assert not np.array_equal(sampled, rows)  # temperature 1 draws, where greedy takes the argmax


def test_the_jax_backend_writes_the_same_continuations(monkeypatch):  # --pool_backend jax, for an accelerator
    from jax_backend import sampling_jax

    device_calls = []
    on_device = sampling_jax.batched_autoregressive_sampling
    monkeypatch.setattr(sampling_jax, "batched_autoregressive_sampling",
                        lambda *args, **kwargs: device_calls.append(1) or on_device(*args, **kwargs))
    _, hparams, params = utils.load_encoder_hparams_and_params("teach-target", REPO / "models")
    tokens = np.arange(1000, dtype=np.uint16) * 7 % 4096
    for temperature in (0.0, 1.0):
        on_numpy, on_jax = (distill_draft.continuations(params, hparams, tokens, 3, 6, 8, temperature,
                                                        np.random.default_rng(1), batch_size=2, backend=backend)
                            for backend in ("numpy", "jax"))
        assert on_jax.dtype == np.int32 and np.array_equal(on_numpy, on_jax)
    assert len(device_calls) == 4  # two batches of rows at each temperature, each one device loop


def test_the_pool_is_written_once_and_read_back_only_for_the_same_settings(tmp_path):
    pool_file = tmp_path / "cache" / "pool.npz"
    rows = np.arange(12, dtype=np.int32).reshape(3, 4)
    made_with = {"target_sha256": "ab", "rows": 3, "prompt_tokens": 2, "continued_tokens": 2, "temperature": 0.0}
    assert np.array_equal(distill_draft.load_or_write_pool(pool_file, made_with, lambda: rows), rows)

    def never():
        raise AssertionError("the pool was made again")

    read = distill_draft.load_or_write_pool(pool_file, made_with, never)
    assert read.dtype == np.int32 and np.array_equal(read, rows)
    assert [p.name for p in pool_file.parent.iterdir()] == ["pool.npz"]  # no temporary file left beside it
    with pytest.raises(ValueError, match="made with .*\"target_sha256\": \"ab\".*delete it or name another"):
        distill_draft.load_or_write_pool(pool_file, {**made_with, "target_sha256": "cd"}, never)
    with pytest.raises(ValueError, match="made with"):
        distill_draft.load_or_write_pool(pool_file, {**made_with, "temperature": 1.0}, never)
    np.savez(pool_file, rows=rows)  # a pool that does not say how it was made
    with pytest.raises(ValueError, match="made with null"):
        distill_draft.load_or_write_pool(pool_file, made_with, never)
    assert np.array_equal(distill_draft.load_or_write_pool(None, made_with, lambda: rows), rows)  # no file: made anew


def test_every_position_weighs_alike_in_the_loss():
    rng = np.random.default_rng(1)
    target = jax.tree.map(jax.numpy.asarray, gpt2.init_params({"n_vocab": 64, "n_ctx": 32, "n_embd": 16,
                                                                "n_head": 2, "n_layer": 1}, rng))
    draft = jax.tree.map(jax.numpy.asarray, gpt2.init_params({"n_vocab": 64, "n_ctx": 32, "n_embd": 8,
                                                               "n_head": 2, "n_layer": 1}, rng))
    step = distill_draft.make_distill_step(2, 2)
    windows = rng.integers(0, 64, (1, 25)).astype(np.int32)  # 24 positions
    rows = rng.integers(0, 64, (2, 9)).astype(np.int32)  # 16 positions
    none = {25: np.zeros((0, 25), np.int32), 9: np.zeros((0, 9), np.int32)}

    def kl(batch, continued):  # lr 0: the draft does not move between the calls
        return float(step(draft, target, train_pair.adamw_init(draft), batch, continued, 0.0)[2])

    only_windows, only_rows = kl(windows, none[9]), kl(none[25], rows)
    assert only_windows != pytest.approx(only_rows)
    assert kl(windows, rows) == pytest.approx((24 * only_windows + 16 * only_rows) / 40, rel=1e-5)


def test_the_stage_distils_on_continuations_and_reports_their_agreement(packed, tmp_path):
    _, pack_dir, _ = packed
    tokens = pack_dir / "tokens.npz"
    train_tiny_pair(pack_dir, tmp_path)
    before = utils.load_encoder_hparams_and_params("teach-draft", tmp_path)[2]
    pool_file = tmp_path / "pool.npz"
    distill_draft.main(models_dir=tmp_path, corpus_dir=tmp_path / "no-corpus", bpe_dir=pack_dir, steps=2,
                       batch_size=0, warmup=1, eval_every=2, tokens=tokens, continued=3, pool=5, prompt_tokens=4,
                       continued_tokens=6, pool_file=pool_file, pool_batch=2)
    after = utils.load_encoder_hparams_and_params("teach-draft", tmp_path)[2]
    assert after["wte"].dtype == np.float32 and not np.array_equal(after["wte"], before["wte"])
    assert np.load(pool_file)["rows"].shape == (5, 10)
    stage = json.loads((tmp_path / "training_log.json").read_text())["draft_distillation"]
    assert stage["recipe"]["continued"] == 3 and stage["recipe"]["pool_temperature"] == 0.0
    assert stage["recipe"]["pool_batch"] == 2
    assert [e["step"] for e in stage["evals"]] == [0, 2]
    assert all(0 <= e["greedy_continuation_agreement"] <= 1 for e in stage["evals"])
    with pytest.raises(ValueError, match="a step needs windows or continuations"):
        distill_draft.main(models_dir=tmp_path, bpe_dir=pack_dir, tokens=tokens, batch_size=0, continued=0)
    with pytest.raises(ValueError, match="pool_batch must be at least 1"):
        distill_draft.main(models_dir=tmp_path, bpe_dir=pack_dir, tokens=tokens, continued=3, pool_batch=0)
