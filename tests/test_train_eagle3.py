"""tools/train_eagle3.py through tools/train_heads.py on a tiny 8-block target (the CPU): the token loss is the target's
distribution restricted to the draft vocabulary, masked where the target's argmax lies outside; the steps weigh
0.8^i; the trainer's first step is the drafter's first draft; a few steps write a head that drafters/eagle3.py drafts
with, and a run stopped half-way resumes to the very head an uninterrupted run writes."""

import numpy as np
import pytest

import gpt2
import sampling
import utils
from drafters.eagle3 import Eagle3Draft, d2t_vocabulary
from drafters.heads import load_head
from helpers import assert_a_stopped_run_resumes_to, tiny_training_setup
from speedup.stats import SpeculativeStats

jax = pytest.importorskip("jax")
from tools import train_eagle3, train_heads  # noqa: E402

TARGET8 = dict(n_vocab=4096, n_ctx=32, n_embd=16, n_head=2, n_layer=8)  # 8 blocks: taps after 2, 4 and 5


@pytest.fixture()
def tiny_setup(tmp_path):  # -> (models_dir holding a tiny 8-block teach-target, corpus_dir)
    return tiny_training_setup(tmp_path, TARGET8)


@pytest.fixture()
def short_unroll(monkeypatch):  # 3 draft steps, not 7: what is taught is the same, the CPU compiles far less
    assert train_eagle3.TTT_STEPS == 7  # EAGLE-3's trainer's length
    monkeypatch.setattr(train_eagle3, "TTT_STEPS", 3)


def train(models_dir, corpus_dir, state_dir, steps=4, **options):
    train_heads.main("eagle3", models_dir=models_dir, corpus_dir=corpus_dir, steps=steps, batch_size=2, seq_len=8,
                     warmup=1, eval_every=steps, validation_tokens=300, state_dir=state_dir, save_minutes=0,
                     draft_vocab_size=64, **options)
    return load_head(models_dir / "teach-eagle3", drafter="eagle3")


def test_the_token_loss_restricts_the_target_to_the_vocabulary_and_masks_what_lies_outside():
    vocabulary, inside = np.array([0, 2]), np.array([True, False, True, False])
    target_logits = np.log(np.array([[0.2, 0.1, 0.6, 0.1],  # argmax 2, inside: p restricted = (0.25, 0.75)
                                     [0.1, 0.7, 0.1, 0.1]], np.float32))  # argmax 1, outside: masked
    draft = np.log(np.array([[[0.5, 0.5], [0.9, 0.1]]], np.float32))  # [depth 1, n 2, size 2]
    loss = np.asarray(train_eagle3.token_loss(draft, target_logits, vocabulary, inside))
    assert loss.shape == (1, 2) and loss.dtype == np.float32
    np.testing.assert_allclose(loss[0], [np.log(2), 0.0], rtol=1e-5)  # -(0.25 + 0.75) log 0.5; the masked one 0


def test_the_steps_weigh_0_8_to_the_i_and_the_first_is_the_drafters_first_draft(short_unroll):
    params = gpt2.init_params(TARGET8, np.random.default_rng(1))
    window = np.random.default_rng(3).integers(0, 4096, 12)
    vocabulary = np.arange(0, 4096, 2)  # half the ids: the random target's argmax falls inside at about half the slots
    kind = train_eagle3.Eagle3(TARGET8, vocabulary)
    head = kind.init(TARGET8, np.random.default_rng(2), params)
    head["lm_head"]["w"] *= 10
    as_jax = lambda tree: jax.tree.map(jax.numpy.asarray, tree)
    steps = np.asarray(kind.step_losses(as_jax(head), as_jax(params), window, 3))
    assert steps.shape == (3,) and kind.unroll == 3 and len(set(steps.tolist())) == 3
    assert float(kind.loss(as_jax(head), as_jax(params), window, None)) == pytest.approx(
        float(np.sum(0.8 ** np.arange(3) * steps)), rel=1e-5)
    logits, _ = kind.logits(as_jax(head), as_jax(params), window, 1)  # [1, 11, size]
    drafter = Eagle3Draft(gpt2.GPT2Model(params, TARGET8), head, 4, kind.info(head, params, None)["d2t"])
    for slot in (0, 5, 10):  # the pair (g_s, x_{s+1}) drafts x_{s+2}: propose after x[:s+2]
        _, p = drafter.propose(window[:slot + 2], 1, sampling.SamplingSettings(), 0, SpeculativeStats())
        np.testing.assert_allclose(p[0, vocabulary], np.asarray(jax.nn.softmax(logits[0, slot])), atol=1e-5)


def test_a_few_steps_write_a_head_that_drafts_and_a_run_stopped_half_way_resumes_to_it(tiny_setup, tmp_path,
                                                                                       monkeypatch, short_unroll):
    models_dir, corpus_dir = tiny_setup
    whole, info = train(models_dir, corpus_dir, tmp_path / "whole")
    assert whole["fc"]["w"].shape == (48, 16) and whole["lm_head"]["w"].shape == (16, 64)
    assert info["layers"] == [2, 4, 5] and info["training"]["recipe"]["draft_vocab_size"] == 64
    tokens = np.load(tmp_path / "whole" / "eagle3" / "train_tokens.npy")[:-300]  # the run's training split
    np.testing.assert_array_equal(d2t_vocabulary(info["d2t"]),
                                  train_eagle3.training_vocabulary(tokens, 4096, 64))
    assert all(np.isfinite(entry["token_loss"]) and 0 <= entry["top1_agreement_step4"] <= 1
               for entry in info["training"]["evals"])
    _, hparams, target_params = utils.load_encoder_hparams_and_params("teach-target", models_dir)
    drafts, p = Eagle3Draft(gpt2.GPT2Model(target_params, hparams), whole, 4, info["d2t"], info["layers"]).propose(
        np.arange(8), 3, sampling.GREEDY, np.random.default_rng(0), SpeculativeStats())
    assert np.isin(drafts, d2t_vocabulary(info["d2t"])).all() and p.shape == (3, 4096)

    assert_a_stopped_run_resumes_to(whole, monkeypatch, lambda: train(models_dir, corpus_dir, tmp_path / "stopped"))


def test_a_draft_vocab_size_is_eagle3_s_alone_and_a_whole_number(tiny_setup, tmp_path):
    models_dir, corpus_dir = tiny_setup
    with pytest.raises(SystemExit, match="--draft_vocab_size is for eagle3 only"):
        train_heads.main("eagle", draft_vocab_size=64)
    for size in (0, 5000, 1.5):
        with pytest.raises(SystemExit, match=r"--draft_vocab_size must be a whole number in 1\.\.4096"):
            train_heads.main("eagle3", models_dir=models_dir, corpus_dir=corpus_dir, state_dir=tmp_path / "bad",
                             draft_vocab_size=size)
