"""tools/unlikelihood_target.py: which greedy tokens count as a loop, the loss it puts on them, and a few steps
of the stage on a tiny pair (the CPU)."""

import json

import numpy as np
import pytest

import utils
from conftest import REPO
from helpers import train_tiny_pair

jax = pytest.importorskip("jax")
from tools import train_pair, unlikelihood_target  # noqa: E402


def test_only_ngrams_repeated_inside_the_continuation_are_marked():
    prompt = [7, 8, 9, 10, 11]
    continuation = [7, 8, 9, 10, 1, 2, 3, 4, 5, 1, 2, 3, 4, 6]  # copies the prompt's 4-gram, then repeats its own
    mask = unlikelihood_target.repeated_ngram_mask(prompt + continuation, len(prompt))
    assert mask.dtype == bool and mask.shape == (19,)
    assert not mask[:9].any()  # the prompt, and the copy of it: copying from the prompt is not a loop
    assert np.flatnonzero(mask).tolist() == [14, 15, 16, 17]  # the second 1 2 3 4
    assert not unlikelihood_target.repeated_ngram_mask([1, 2, 3, 4, 1, 2, 3], 0).any()  # 3 tokens again: no 4-gram
    assert unlikelihood_target.repeated_ngram_mask([5, 5, 5, 5, 5], 0).tolist() == [False, True, True, True, True]


def test_unlikelihood_is_minus_log_one_minus_p_on_marked_tokens_only():
    import jax.numpy as jnp

    logits = jnp.asarray(np.random.default_rng(0).normal(size=(1, 3, 5)) * 4, jnp.float32)
    tokens = jnp.asarray([[1, 4, 2]])
    mask = jnp.asarray([[True, False, True]])
    p = np.asarray(jax.nn.softmax(logits))[0, [0, 1, 2], [1, 4, 2]]
    expected = -(np.log1p(-p[0]) + np.log1p(-p[2])) / 3
    loss = unlikelihood_target.unlikelihood(logits, tokens, mask)
    assert loss.dtype == jnp.float32 and float(loss) == pytest.approx(expected, rel=1e-5)
    certain = jnp.asarray([[[0.0, 30.0, 0.0]]], jnp.float32)  # p = 1 - 2e-13: finite, and its gradient too
    grad = jax.grad(lambda x: unlikelihood_target.unlikelihood(x, jnp.asarray([[1]]), jnp.asarray([[True]])))(certain)
    assert float(unlikelihood_target.unlikelihood(certain, jnp.asarray([[1]]), jnp.asarray([[True]]))) > 25
    assert np.isfinite(np.asarray(grad)).all() and float(grad[0, 0, 1]) > 0.9  # pushes the looping token down


def test_the_stage_trains_the_target_and_leaves_the_draft(packed, tmp_path):
    _, pack_dir, _ = packed
    tokens = pack_dir / "tokens.npz"
    train_tiny_pair(pack_dir, tmp_path)
    before = {role: utils.load_encoder_hparams_and_params(f"teach-{role}", tmp_path)[2] for role in ("target", "draft")}
    unlikelihood_target.main(models_dir=tmp_path, corpus_dir=tmp_path / "no-corpus", bpe_dir=pack_dir, steps=2,
                             batch_size=2, n_prompts=2, prompt_tokens=8, n_tokens=16, eval_every=2, tokens=tokens,
                             twice_share=0.5)
    after = {role: utils.load_encoder_hparams_and_params(f"teach-{role}", tmp_path)[2] for role in ("target", "draft")}
    assert after["target"]["wte"].dtype == np.float32
    assert not np.array_equal(after["target"]["wte"], before["target"]["wte"])
    assert np.array_equal(after["draft"]["wte"], before["draft"]["wte"])
    stage = json.loads((tmp_path / "training_log.json").read_text())["target_unlikelihood"]
    assert stage["recipe"]["n_tokens"] == 16 and stage["recipe"]["twice_share"] == 0.5
    assert [e["step"] for e in stage["evals"]] == [0, 2]
    assert 0 <= stage["evals"][-1]["looped_tokens"] <= 1


def test_the_jax_backend_continues_as_the_host_does():  # --backend jax, for an accelerator
    _, hparams, params = utils.load_encoder_hparams_and_params("teach-target", REPO / "models")
    prompts = [np.arange(8) * 5 + 100 * row for row in range(3)]
    on_host = unlikelihood_target.greedy_continuations(params, hparams, prompts, 12)
    on_jax = unlikelihood_target.greedy_continuations(jax.tree.map(jax.numpy.asarray, params), hparams, prompts, 12,
                                                      backend="jax")
    assert on_jax.dtype == np.int32 and on_jax.shape == (3, 20) and np.array_equal(on_host, on_jax)
    with pytest.raises(ValueError, match="unknown backend"):
        unlikelihood_target.greedy_continuations(params, hparams, prompts, 12, backend="tpu")
