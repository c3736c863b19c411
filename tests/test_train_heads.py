"""tools/train_heads.py on a tiny target (the CPU): a few steps write a head that drafters/heads.py loads, the
target stays frozen, and a run stopped half-way resumes from its saved state to the very head an uninterrupted
run writes."""

import numpy as np
import pytest

import gpt2
import sampling
import utils
from drafters.eagle import EagleDraft
from drafters.heads import flatten, load_head
from helpers import assert_a_stopped_run_resumes_to, stop_training_at, tiny_training_setup
from speedup.stats import SpeculativeStats

jax = pytest.importorskip("jax")
from tools import train_heads  # noqa: E402

TINY_TARGET = dict(n_vocab=4096, n_ctx=32, n_embd=16, n_head=2, n_layer=2)


@pytest.fixture()
def tiny_setup(tmp_path):  # -> (models_dir holding a tiny teach-target, corpus_dir)
    return tiny_training_setup(tmp_path, TINY_TARGET, copies=2)


def train(models_dir, corpus_dir, state_dir, steps=4, **options):
    train_heads.main("eagle", models_dir=models_dir, corpus_dir=corpus_dir, steps=steps, batch_size=2, seq_len=16,
                     warmup=1, eval_every=2, validation_tokens=300, state_dir=state_dir, save_minutes=0, **options)
    return load_head(models_dir / "teach-eagle", drafter="eagle")


def test_a_few_steps_write_a_head_and_a_run_stopped_half_way_resumes_to_the_same_head(tiny_setup, tmp_path, monkeypatch):
    models_dir, corpus_dir = tiny_setup
    target_before = (models_dir / "teach-target" / "model.ckpt.data-00000-of-00001").read_bytes()
    whole, info = train(models_dir, corpus_dir, tmp_path / "whole")
    assert whole["fc"]["w"].shape == (32, 16) and whole["fc"]["w"].dtype == np.float32
    assert info["target"] == "teach-target" and info["training"]["steps_done"] == 4
    assert [entry["step"] for entry in info["training"]["evals"]] == [2, 4]
    assert all(np.isfinite(entry["feature_loss"]) for entry in info["training"]["evals"])
    assert [path.name for path in corpus_dir.iterdir()] == ["train.txt"]  # its evaluations read no held-out text
    assert (models_dir / "teach-target" / "model.ckpt.data-00000-of-00001").read_bytes() == target_before

    assert_a_stopped_run_resumes_to(whole, monkeypatch, lambda: train(models_dir, corpus_dir, tmp_path / "stopped"))


def test_an_unknown_drafter_or_a_missing_corpus_is_a_one_line_error(tiny_setup, tmp_path):
    models_dir, _ = tiny_setup
    with pytest.raises(SystemExit, match="unknown drafter 'lookahead'"):
        train_heads.main("lookahead", models_dir=models_dir)
    with pytest.raises(SystemExit, match="build it with python tools/build_corpus.py"):
        train_heads.main("eagle", models_dir=models_dir, corpus_dir=tmp_path / "nowhere")


def test_a_later_session_starts_from_a_committed_head(tiny_setup, tmp_path):
    models_dir, corpus_dir = tiny_setup
    first, first_info = train(models_dir, corpus_dir, tmp_path / "first")
    (models_dir / "teach-eagle").rename(tmp_path / "committed")
    again, info = train(models_dir, corpus_dir, tmp_path / "second", steps=2, lr=0.0, init_from=tmp_path / "committed")
    assert info["training"]["recipe"]["init_from"] == str(tmp_path / "committed")
    assert info["training"]["continued_from"]["steps_done"] == first_info["training"]["steps_done"]  # history kept
    for name, array in flatten(first).items():  # a learning rate of 0 keeps the head it started from
        np.testing.assert_array_equal(flatten(again)[name], array)


def test_greedy_continuations_join_the_windows_and_a_resumed_run_reads_the_same_pool(tiny_setup, tmp_path, monkeypatch):
    models_dir, corpus_dir = tiny_setup
    options = {"continued": 2, "pool": 6, "prompt_tokens": 4, "continued_tokens": 8}
    whole, info = train(models_dir, corpus_dir, tmp_path / "whole", **options)
    assert info["training"]["recipe"]["continued"] == 2
    assert all(0 <= entry["greedy_top1_agreement"] <= 1 for entry in info["training"]["evals"])
    with np.load(tmp_path / "whole" / "eagle" / "pool.npz") as pool:
        rows = pool["rows"]
    assert rows.shape == (6, 12) and rows.dtype == np.int32

    written = []
    real_continuations = train_heads.continuations
    monkeypatch.setattr(train_heads, "continuations", lambda *args, **kw: written.append(args[3]) or
                        real_continuations(*args, **kw))
    stop_training_at(monkeypatch, 3, lambda: train(models_dir, corpus_dir, tmp_path / "stopped", **options))
    resumed, _ = train(models_dir, corpus_dir, tmp_path / "stopped", **options)
    assert written == [6, 64, 64]  # the pool once; the validation prompts' continuations at each start
    for name, array in flatten(whole).items():
        np.testing.assert_allclose(flatten(resumed)[name], array, atol=1e-6)


def test_a_data_seed_draws_other_data_from_the_same_pool(tiny_setup, tmp_path):
    models_dir, corpus_dir = tiny_setup
    options = {"continued": 2, "pool": 6, "prompt_tokens": 4, "continued_tokens": 8}
    heads = {}
    for name, data_seed in (("default", None), ("same", 0), ("other", 1)):
        heads[name], info = train(models_dir, corpus_dir, tmp_path / name, data_seed=data_seed, **options)
        assert info["training"]["recipe"].get("data_seed") == data_seed
    pools = [(tmp_path / name / "eagle" / "pool.npz").read_bytes() for name in heads]
    assert pools[0] == pools[1] == pools[2]  # the pool is the seed's: a continued run reuses it
    for name, array in flatten(heads["default"]).items():
        np.testing.assert_array_equal(flatten(heads["same"])[name], array)
    assert not np.allclose(flatten(heads["other"])["fc/w"], flatten(heads["default"])["fc/w"])
    with pytest.raises(SystemExit, match="--data_seed must be a whole number"):
        train(models_dir, corpus_dir, tmp_path / "bad", data_seed="one")


def test_the_unrolled_steps_are_the_chain_s_draft_steps(tmp_path):
    """EAGLE-3's training-time test teaches the head what EagleDraft.propose computes: step d at slot s is the d-th
    draft step after the true pairs of slots 0..s-d+1, each step reading the previous one's predicted feature."""
    from drafters import eagle

    params = gpt2.init_params(TINY_TARGET, np.random.default_rng(1))
    head = eagle.init_head(TINY_TARGET, np.random.default_rng(2))
    window = np.random.default_rng(3).integers(0, TINY_TARGET["n_vocab"], 12)
    states, _ = gpt2.hidden_states(window, **params, n_head=2, cache=None, start=0)
    features = states[-1]  # [12, n_embd]
    unrolled = np.asarray(train_heads.Eagle(TINY_TARGET, unroll=3).predicted(
        jax.tree.map(jax.numpy.asarray, head), jax.numpy.asarray(params["wte"]), jax.numpy.asarray(features),
        jax.numpy.asarray(window), 3))  # [3, 11, n_embd]
    assert unrolled.shape == (3, 11, 16) and unrolled.dtype == np.float32
    for step in (1, 2, 3):
        for slot in range(step - 1, 11):
            last_true = slot - step + 1
            cache = gpt2.empty_cache({**TINY_TARGET, "n_layer": 1})[0]
            predicted = eagle.head_forward(features[:last_true + 1], window[1:last_true + 2], head, params["wte"], 2,
                                           cache, 0)[-1:]
            for later in range(2, step + 1):  # the head's own pair: its feature beside the text's token
                position = last_true + later - 1
                predicted = eagle.head_forward(predicted, window[position + 1:position + 2], head, params["wte"], 2,
                                               cache, position)
            np.testing.assert_allclose(unrolled[step - 1, slot], predicted[0], atol=2e-5)
    assert np.abs(unrolled[1, 1:] - unrolled[0, 1:]).max() > 1e-3  # the steps differ: own features are not true ones


def test_unroll_is_eagle_s_alone():
    with pytest.raises(SystemExit, match="--unroll"):
        train_heads.main("medusa", unroll=2)


def test_a_head_given_taps_starts_as_it_was_and_learns_to_fuse_the_lower_stream(tiny_setup, tmp_path):
    """--taps 1 (EAGLE-3's fusion): the zero fuse matrix leaves the loss as it was; a few steps make it non-zero, and
    the head written drafts through drafters/eagle.py."""
    params = jax.tree.map(jax.numpy.asarray, gpt2.init_params(TINY_TARGET, np.random.default_rng(0)))
    head = train_heads.Eagle(TINY_TARGET).init(TINY_TARGET, np.random.default_rng(1), params)
    window, key = jax.numpy.asarray(np.random.default_rng(2).integers(0, 4096, 13)), jax.random.PRNGKey(0)
    tapped = train_heads.Eagle(TINY_TARGET, taps=(1,))
    assert float(tapped.loss(tapped.start(head), params, window, key)) == pytest.approx(
        float(train_heads.Eagle(TINY_TARGET).loss(head, params, window, key)), rel=1e-6)
    models_dir, corpus_dir = tiny_setup
    trained, info = train(models_dir, corpus_dir, tmp_path / "tapped", taps=(1,))
    assert info["training"]["recipe"]["taps"] == [1] and trained["fuse"]["1"]["w"].shape == (16, 16)
    assert np.abs(trained["fuse"]["1"]["w"]).max() > 0
    _, hparams, target_params = utils.load_encoder_hparams_and_params("teach-target", models_dir)
    continued = train_heads.Eagle(TINY_TARGET).start(trained)  # no --taps: the head keeps fusing block 1
    assert train_heads.Eagle(TINY_TARGET).loss(continued, params, window, key) == pytest.approx(
        float(tapped.loss(trained, params, window, key)), rel=1e-6)
    extended = train_heads.Eagle(TINY_TARGET, taps=(1,)).start(trained)["fuse"]  # block 1's matrix kept, not zeroed
    assert set(extended) == {"1"} and np.array_equal(extended["1"]["w"], trained["fuse"]["1"]["w"])
    target = gpt2.GPT2Model(target_params, hparams)
    drafts, _ = EagleDraft(target, trained).propose(np.arange(8), 2, sampling.GREEDY, np.random.default_rng(0),
                                                    SpeculativeStats())
    assert target.taps == (1,) and len(drafts) == 2
    for drafter, taps in (("medusa", 1), ("eagle", (0,)), ("eagle", (1, 1)), ("eagle", 2)):
        with pytest.raises(SystemExit, match="--taps"):  # refused before anything is written
            train_heads.main(drafter, models_dir=models_dir, corpus_dir=corpus_dir, taps=taps,
                             state_dir=tmp_path / "refused")
    assert not (tmp_path / "refused").exists()


def test_the_classification_weight_scales_eagle_s_token_loss_alone():
    params = jax.tree.map(jax.numpy.asarray, gpt2.init_params(TINY_TARGET, np.random.default_rng(0)))
    head = train_heads.Eagle(TINY_TARGET).init(TINY_TARGET, np.random.default_rng(1), params)
    window, key = jax.numpy.asarray(np.random.default_rng(2).integers(0, 4096, 13)), jax.random.PRNGKey(0)
    loss = {weight: float(train_heads.Eagle(TINY_TARGET, unroll=2, classification_weight=weight).loss(
        head, params, window, key)) for weight in (0.0, 0.1, 1.0)}
    assert loss[1.0] - loss[0.0] > 1.0  # a cross-entropy over 4096 tokens from a random head: several nats
    np.testing.assert_allclose(loss[1.0] - loss[0.0], 10 * (loss[0.1] - loss[0.0]), rtol=1e-4)
    assert train_heads.CLASSIFICATION_WEIGHT == 0.1  # EAGLE's, the default
    for drafter, weight in (("medusa", 1.0), ("eagle", -1.0), ("eagle", "high")):
        with pytest.raises(SystemExit, match="--classification_weight"):
            train_heads.main(drafter, classification_weight=weight)


def test_medusa_s_self_distillation_learns_the_target_s_distribution_of_each_head_s_token(tiny_setup, tmp_path):
    """--medusa_labels target: the loss is drafters/medusa.head_distillation_loss on the target's own logits (its
    logits are its features after ln_f read out through wte), recorded in the recipe; refused for other drafters."""
    from drafters import medusa

    params = jax.tree.map(jax.numpy.asarray, gpt2.init_params(TINY_TARGET, np.random.default_rng(0)))
    kind = train_heads.Medusa(TINY_TARGET, labels="target")
    heads = kind.init(TINY_TARGET, np.random.default_rng(1), params)
    window = jax.numpy.asarray(np.random.default_rng(2).integers(0, 4096, 13))
    features = train_heads.target_features(params, TINY_TARGET["n_head"], window)
    expected = medusa.head_distillation_loss(np.asarray(features), np.asarray(features @ params["wte"].T),
                                             jax.tree.map(np.asarray, heads), np.asarray(params["wte"]).T)
    assert float(kind.loss(heads, params, window, None)) == pytest.approx(float(expected), rel=1e-5)
    corpus = float(train_heads.Medusa(TINY_TARGET).loss(heads, params, window, None))
    assert abs(corpus - float(expected)) > 1e-3  # the labels differ: the text's tokens, the target's distribution
    models_dir, corpus_dir = tiny_setup
    train_heads.main("medusa", models_dir=models_dir, corpus_dir=corpus_dir, steps=2, batch_size=2, seq_len=16,
                     warmup=1, eval_every=2, validation_tokens=300, state_dir=tmp_path / "state", save_minutes=0,
                     medusa_labels="target")
    _, info = load_head(models_dir / "teach-medusa", drafter="medusa")
    assert info["training"]["recipe"]["medusa_labels"] == "target"
    for drafter, labels in (("eagle", "target"), ("medusa", "soft")):
        with pytest.raises(SystemExit, match="--medusa_labels"):
            train_heads.main(drafter, medusa_labels=labels)
