"""tools/pack_corpus.py encodes the corpus exactly as the trainer does, and tools/train_pair.py and
tools/distill_draft.py train from the packed tokens alone (tiny shapes, a few steps, on the CPU)."""

import json
import shutil

import numpy as np
import pytest

import utils
from conftest import REPO
from encoder import get_encoder_from_dir
from helpers import VOCABULARY, stop_training_at
from tools import pack_corpus


def test_packed_tokens_are_the_trainers_encoding(packed):
    corpus, pack_dir, record = packed
    encoder = get_encoder_from_dir(VOCABULARY)
    train, heldout = pack_corpus.load_packed_tokens(pack_dir / "tokens.npz", VOCABULARY)
    for split, ids in [("train", train), ("heldout", heldout)]:
        text = (corpus / f"{split}.txt").read_text(encoding="utf-8")
        assert ids.dtype == np.uint16
        assert ids.tolist() == encoder.encode(text, allow_eot=True) + [encoder.eot_token]
        assert encoder.decode(ids[:-1].tolist()) == text
        assert record["tokens"][split] == len(ids)
    assert list(heldout).count(encoder.eot_token) == 2  # the separator and the final one
    on_disk = json.loads((pack_dir / "pack.json").read_text())
    assert on_disk == record and record["n_vocab"] == 4096
    assert record["tokens_npz_bytes"] == (pack_dir / "tokens.npz").stat().st_size
    for name in pack_corpus.VOCABULARY_FILES:
        assert (pack_dir / name).read_bytes() == (VOCABULARY / name).read_bytes()


def test_packed_tokens_refuse_another_vocabulary_or_bad_arrays(packed, tmp_path):
    _, pack_dir, _ = packed
    other = tmp_path / "other"
    shutil.copytree(pack_dir, other)
    with open(other / "vocab.bpe", "a", encoding="utf-8") as file:
        file.write("\n")
    with pytest.raises(ValueError, match="another vocabulary.*vocab.bpe differs"):
        pack_corpus.load_packed_tokens(other / "tokens.npz", VOCABULARY)
    shutil.copyfile(VOCABULARY / "vocab.bpe", other / "vocab.bpe")
    np.savez_compressed(other / "tokens.npz", train=np.array([1, 4096], np.uint16), heldout=np.array([1], np.uint16))
    with pytest.raises(ValueError, match="train holds token 4096, beyond a vocabulary of 4096"):
        pack_corpus.load_packed_tokens(other / "tokens.npz", VOCABULARY)
    np.savez_compressed(other / "tokens.npz", train=np.array([1, 2], np.int64), heldout=np.array([1], np.uint16))
    with pytest.raises(ValueError, match="uint16"):
        pack_corpus.load_packed_tokens(other / "tokens.npz", VOCABULARY)


def test_pack_cli_reports_a_missing_corpus(tmp_path):
    with pytest.raises(SystemExit, match="pack_corpus: error: .*train.txt"):
        pack_corpus.main(["--corpus_dir", str(tmp_path / "nowhere"), "--out_dir", str(tmp_path / "out")])


def test_train_and_distill_from_packed_tokens(packed, tmp_path):
    pytest.importorskip("jax")
    from tools import distill_draft, train_pair

    _, pack_dir, _ = packed
    tokens = pack_dir / "tokens.npz"
    train_pair.main(corpus_dir=tmp_path / "no-corpus", bpe_dir=pack_dir, out_dir=tmp_path, steps=2, batch_size=2,
                    seq_len=16, warmup=1, eval_every=2, target_shape=(32, 2, 4), draft_shape=(16, 1, 2), tokens=tokens,
                    state_dir=tmp_path / "state")
    log = json.loads((tmp_path / "training_log.json").read_text())
    assert log["recipe"]["tokens"] == str(tokens) and log["steps_done"] == 2
    assert log["train_tokens"] == len(pack_corpus.load_packed_tokens(tokens, pack_dir)[0])
    encoder, hparams, _ = utils.load_encoder_hparams_and_params("teach-target", tmp_path)
    assert hparams == {"n_vocab": 4096, "n_ctx": 16, "n_embd": 32, "n_head": 4, "n_layer": 2}

    distill_draft.main(models_dir=tmp_path, corpus_dir=tmp_path / "no-corpus", bpe_dir=pack_dir, steps=2, n_layer=2,
                       batch_size=2, warmup=1, eval_every=2, tokens=tokens, repeat_share=0.5, random_share=0.5)
    _, draft_hparams, draft_params = utils.load_encoder_hparams_and_params("teach-draft", tmp_path)
    assert draft_hparams["n_layer"] == 2 and len(draft_params["blocks"]) == 2
    stage = json.loads((tmp_path / "training_log.json").read_text())["draft_distillation"]
    assert stage["recipe"]["batch_size"] == 2 and [e["step"] for e in stage["evals"]] == [0, 2]
    assert stage["recipe"]["repeat_share"] == stage["recipe"]["random_share"] == 0.5
    assert not (tmp_path / "no-corpus").exists()  # nothing was read from (or cached beside) a corpus folder


def test_training_resumes_where_it_was_interrupted_and_warm_starts_from_a_pair(packed, tmp_path, monkeypatch):
    """An interrupted run, run again, ends with the very weights of an uninterrupted one (the state holds the
    optimiser, the step and the data sampler); a run with another recipe refuses the saved state; --init_from
    starts from a pair folder's weights."""
    pytest.importorskip("jax")
    import pickle

    from tools import train_pair

    _, pack_dir, _ = packed
    run = dict(corpus_dir=tmp_path / "no-corpus", bpe_dir=pack_dir, steps=4, batch_size=2, seq_len=16, warmup=1,
               eval_every=2, target_shape=(32, 2, 4), draft_shape=(16, 2, 2), tokens=pack_dir / "tokens.npz",
               repeat_share=0.5, save_minutes=0)
    train_pair.main(out_dir=tmp_path / "whole", state_dir=tmp_path / "whole-state", **run)
    stop_training_at(monkeypatch, 2, lambda: train_pair.main(out_dir=tmp_path / "resumed",
                                                             state_dir=tmp_path / "resumed-state", **run))
    states = [pickle.loads((tmp_path / name / "state.pkl").read_bytes()) for name in ("resumed-state",)]
    assert states[0]["log"]["steps_done"] == 2
    train_pair.main(out_dir=tmp_path / "resumed", state_dir=tmp_path / "resumed-state", **run)
    whole, resumed = (pickle.loads((tmp_path / name / "state.pkl").read_bytes()) for name in ("whole-state", "resumed-state"))
    assert resumed["log"]["steps_done"] == whole["log"]["steps_done"] == 4
    leaves = lambda state: jax_leaves(state["params"]) + jax_leaves(state["opt_state"])
    assert all(np.array_equal(a, b) for a, b in zip(leaves(whole), leaves(resumed)))
    with pytest.raises(SystemExit, match="another recipe .*steps"):
        train_pair.main(out_dir=tmp_path / "resumed", state_dir=tmp_path / "resumed-state", **{**run, "steps": 5})

    warm = train_pair.main(out_dir=tmp_path / "warm", state_dir=tmp_path / "warm-state",
                           init_from=tmp_path / "whole", **{**run, "steps": 1})
    assert warm is None
    _, hparams, params = utils.load_encoder_hparams_and_params("teach-draft", tmp_path / "warm")
    assert hparams["n_layer"] == 2
    log = json.loads((tmp_path / "warm" / "training_log.json").read_text())
    assert log["recipe"]["init_from"] == str(tmp_path / "whole") and log["evals"][-1]["target_copy_accuracy"] >= 0


def test_training_windows_repeat_spans_and_random_sequences_on_request():
    """repeat_share windows hold one of their own spans twice; random_share windows are a random sequence written
    over and over; twice_share windows end in a span written twice in a row; the rest are the corpus's own tokens."""
    pytest.importorskip("jax")
    from tools import train_pair

    corpus = np.arange(5000).astype(np.uint16)
    plain = next(train_pair.batches(corpus, 16, 128, np.random.default_rng(0)))
    assert plain.dtype == np.int32 and plain.shape == (16, 129) and (np.diff(plain, axis=1) == 1).all()
    for window in next(train_pair.batches(corpus, 16, 128, np.random.default_rng(0), repeat_share=1.0)):
        values, counts = np.unique(window, return_counts=True)  # the corpus's tokens are distinct: a copy shows twice
        twice = values[counts == 2]
        assert 32 <= len(twice) <= 64 and counts.max() == 2 and (np.diff(twice) == 1).all()  # one span, in order
    windows = next(train_pair.batches(corpus, 16, 128, np.random.default_rng(0), random_share=1.0, n_vocab=4096))
    for window in windows:
        period = next(n for n in range(32, 65) if np.array_equal(window[n:], window[:-n]))
        assert int(window.max()) < 4096 and len(set(window[:period].tolist())) > period // 2  # random, not a run
    assert len({tuple(window[:8]) for window in windows}) == 16  # each window draws its own sequence
    lengths = []
    for window in next(train_pair.batches(corpus, 16, 128, np.random.default_rng(0), twice_share=1.0)):
        breaks = np.flatnonzero(np.diff(window) != 1)  # the corpus counts up: only the second copy's start breaks it
        length = len(window) - 1 - int(breaks[0])
        assert len(breaks) == 1 and 32 <= length <= 64 and np.array_equal(window[-length:], window[-2 * length:-length])
        lengths.append(length)
    assert len(set(lengths)) > 4  # lengths vary


def jax_leaves(tree):
    import jax

    return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]


def test_the_model_cards_accelerator_commands_are_the_committed_pairs_recipe():
    """models/README.md's accelerator commands name only parameters the scripts have, with the values that
    models/training_log.json records for the committed pair."""
    pytest.importorskip("jax")
    import inspect
    import re

    from tools import distill_draft, train_pair, unlikelihood_target

    card = (REPO / "models" / "README.md").read_text(encoding="utf-8")
    section = card.split("## Rebuilding the pair on an accelerator\n")[1].split("\n## ")[0]
    commands = {}
    for script, main in [("train_pair", train_pair.main), ("distill_draft", distill_draft.main),
                         ("unlikelihood_target", unlikelihood_target.main)]:
        for command in re.findall(rf"python3 tools/{script}\.py (.*?)&&", section, flags=re.S):
            flags = dict(re.findall(r"--(\w+) (\S+)", command))
            assert set(flags) <= set(inspect.signature(main).parameters), script
            commands.setdefault(script, []).append(flags)
    log = json.loads((REPO / "models" / "training_log.json").read_text())
    (pair,), (unlikelihood,) = commands["train_pair"], commands["unlikelihood_target"]
    assert [pair[key] for key in ("steps", "batch_size", "seq_len", "warmup", "repeat_share")] == [
        str(log["recipe"][key]) for key in ("steps", "batch_size", "seq_len", "warmup", "repeat_share")]
    assert float(pair["lr"]) == log["recipe"]["lr"]
    target = log["recipe"]["hparams"]["target"]
    assert pair["target_shape"] == '"({n_embd},{n_layer},{n_head})"'.format(**target)
    recorded = log["target_unlikelihood"]["recipe"]
    assert [unlikelihood[key] for key in ("steps", "batch_size", "n_prompts", "backend")] == [
        str(recorded[key]) for key in ("steps", "batch_size", "n_prompts", "backend")]
    # the distillations, oldest first, as the log nests them (each continued_from the one before)
    stages, stage = [], log["draft_distillation"]
    while stage:
        stages.insert(0, stage["recipe"])
        stage = stage.get("continued_from")
    assert len(commands["distill_draft"]) == len(stages) == 6
    for flags, recipe in zip(commands["distill_draft"], stages):
        assert [flags[key] for key in ("steps", "batch_size", "n_layer")] == [
            str(recipe[key]) for key in ("steps", "batch_size", "n_layer")]
        assert float(flags["lr"]) == recipe["lr"] and int(flags.get("continued", 0)) == recipe["continued"]
        for key in {"pool", "seed", "warmup", "pool_batch"} & set(flags):
            assert int(flags[key]) == recipe[key], key
    # the corpus is packed with the pair's own vocabulary: pack_corpus.py's default
    assert re.search(r"python tools/pack_corpus\.py +#", section)
