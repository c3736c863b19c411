"""Token-tree scoring (SpecInfer, Miao et al. 2023; the tree attention of Medusa and EAGLE): GPT2Model.tree_logits
and keep_tree_path against plain feeds of every root-to-node path, on tiny random GPT-2s in the plain and the
measured layouts, with and without a cache, and on the bundled target; the same contract on
classroom.lossless.CachedTableModel, the table model tree decoders are checked on; and that bench/tree.py runs.
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import engine
import gpt2
import utils
from classroom.lossless import CachedTableModel, ContextTable, random_context_table
from gpt2_cases import random_params

REPO = Path(__file__).resolve().parents[1]
TINY = dict(n_vocab=37, n_ctx=32, n_embd=16, n_head=4, n_layer=2)
TOLERANCE = dict(rtol=1e-4, atol=1e-4)  # float32 sums taken in another order (more rows, another layout)


def random_tree(rng, n, max_depth=5):  # -> parents [n]: each node a child of the root or of a shallower node
    parents, depths = [], []
    for _ in range(n):
        choices = [-1] + [node for node, depth in enumerate(depths) if depth < max_depth]
        parent = int(rng.choice(choices))
        parents.append(parent)
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return parents


def path_to(node, parents):  # -> the node indices from the root down to node
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def random_case(rng, n_vocab, n_prefix):  # -> x, tokens, parents, a random node's path
    n = int(rng.integers(1, 17))
    parents = random_tree(rng, n)
    tokens = rng.integers(0, n_vocab, n)
    x = rng.integers(0, n_vocab, n_prefix)
    return x, tokens, parents, path_to(int(rng.integers(n)), parents)


def expected_tree_logits(reference, x, tokens, parents):  # -> [n + 1, n_vocab]: plain feeds of x and every path
    rows = [reference.logits(x)[0]]
    for node in range(len(tokens)):
        rows.append(reference.logits(np.concatenate([x, tokens[path_to(node, parents)]]))[0])
    return np.array(rows)


# ---------------------------------------------------------------------------------------------- GPT-2


@pytest.fixture(scope="module")
def tiny():
    params = random_params(TINY, seed=3)
    models = {(layout, use_cache): engine.fast_model(params, TINY, use_cache=use_cache, layout=layout)
              for layout in ("plain", "auto") for use_cache in (True, False)}
    return params, models, gpt2.GPT2Model(params, TINY, use_cache=False)


def kv_layers(model):  # n_layer x (keys, values): a NumPy model's cache, a JAX model's DeviceCache.layers
    return getattr(model.cache, "layers", model.cache)


def check_tree_then_path(model, reference, fresh_model, x, tokens, parents, path, rng):
    """tree_logits against plain feeds; after keep_tree_path(path), the cache and the next call against a fresh model."""
    logits = model.tree_logits(x, tokens, parents)
    assert logits.dtype == np.float32 and logits.shape == (len(tokens) + 1, reference.n_vocab)
    np.testing.assert_allclose(logits, expected_tree_logits(reference, x, tokens, parents), **TOLERANCE)

    model.keep_tree_path(path)
    kept = np.concatenate([x, tokens[path]])
    fresh = fresh_model()
    fresh.logits(kept)
    if getattr(model, "use_cache", True):  # JaxGPT2Model always caches
        assert np.array_equal(model.cached_tokens, kept)
        for (keys, values), (fresh_keys, fresh_values) in zip(kv_layers(model), kv_layers(fresh)):
            np.testing.assert_allclose(keys[:, :len(kept)], fresh_keys[:, :len(kept)], **TOLERANCE)
            np.testing.assert_allclose(values[:, :len(kept)], fresh_values[:, :len(kept)], **TOLERANCE)
        np.testing.assert_allclose(model.features[:len(kept)], fresh.features[:len(kept)], **TOLERANCE)  # moved too
    following = np.concatenate([kept, rng.integers(0, reference.n_vocab, 2)])
    got, expected = model.logits(following, n_last=3), fresh.logits(following, n_last=3)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, **TOLERANCE)


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("layout", ["plain", "auto"])
def test_every_path_of_a_random_tree_equals_its_plain_feed(tiny, layout, use_cache):
    params, models, reference = tiny
    model = models[layout, use_cache]
    model.reset()
    fresh_model = lambda: engine.fast_model(params, TINY, layout=model.plan)  # the same layout, a new cache
    rng = np.random.default_rng(0)
    for _ in range(12):
        x, tokens, parents, path = random_case(rng, TINY["n_vocab"], int(rng.integers(1, 10)))
        if rng.random() < 0.5:  # sometimes the cache already holds part of x, or a sequence that diverges from it
            model.logits(np.concatenate([x[:rng.integers(1, len(x) + 1)], rng.integers(0, TINY["n_vocab"], 2)]))
        check_tree_then_path(model, reference, fresh_model, x, tokens, parents, path, rng)


def test_a_chain_tree_equals_feeding_the_chain(tiny):
    params, models, _ = tiny
    rng = np.random.default_rng(1)
    for layout in ("plain", "auto"):
        model = models[layout, True]
        for n in (1, 4, 16):
            x, chain = rng.integers(0, TINY["n_vocab"], 7), rng.integers(0, TINY["n_vocab"], n)
            model.reset()
            model.logits(x)  # x cached: both calls feed x's last token and the n new ones
            expected = model.logits(np.concatenate([x, chain]), n_last=n + 1)
            model.reset()
            model.logits(x)
            got = model.tree_logits(x, chain, np.arange(n) - 1)
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_an_empty_tree_gives_the_logits_after_x(tiny):
    _, models, reference = tiny
    x = np.array([4, 8, 15, 16])
    for model in (models["plain", True], models["plain", False]):
        model.reset()
        got = model.tree_logits(x, [], [])
        assert got.shape == (1, TINY["n_vocab"]) and got.dtype == np.float32
        np.testing.assert_allclose(got, reference.logits(x), **TOLERANCE)
        model.keep_tree_path([])
        np.testing.assert_allclose(model.logits(np.append(x, 23)), reference.logits(np.append(x, 23)), **TOLERANCE)


def test_a_tree_up_to_the_end_of_the_context(tiny):
    _, models, reference = tiny
    model = models["plain", True]
    rng = np.random.default_rng(2)
    x, tokens, parents = rng.integers(0, TINY["n_vocab"], 16), rng.integers(0, TINY["n_vocab"], 16), random_tree(rng, 16)
    model.reset()
    np.testing.assert_allclose(model.tree_logits(x, tokens, parents), expected_tree_logits(reference, x, tokens, parents),
                               **TOLERANCE)
    with pytest.raises(ValueError, match="context"):
        model.tree_logits(np.append(x, 0), tokens, parents)


@pytest.mark.parametrize("tokens, parents, match", [
    ([1, 2, 3], [-1, 1, 0], r"parents\[1\] = 1"),  # a node its own parent
    ([1, 2, 3], [-1, 0, 2], r"parents\[2\] = 2"),
    ([1, 2], [0, -1], r"parents\[0\] = 0"),  # a parent after its child
    ([1, 2], [-1, -2], r"parents\[1\] = -2"),
    ([1, 2, 3], [-1, 0], "3 tokens but 2 parents"),
    ([1, 2], [-1, 0, 1], "2 tokens but 3 parents"),
    ([1, 2], [-1, 0.5], "integers"),
    ([[1, 2]], [[-1, 0]], "1-D"),
    ([1, 37], [-1, 0], r"token ids must lie in \[0, 37\)"),
    ([1, -1], [-1, 0], r"token ids must lie in \[0, 37\)"),
])
@pytest.mark.parametrize("use_cache", [True, False])
def test_bad_trees_are_rejected(tiny, tokens, parents, match, use_cache):
    _, models, _ = tiny
    with pytest.raises(ValueError, match=match):
        models["plain", use_cache].tree_logits([3, 5], tokens, parents)


@pytest.mark.parametrize("use_cache", [True, False])
def test_keep_tree_path_takes_only_a_path_down_from_the_root_after_its_tree(tiny, use_cache):
    _, models, _ = tiny
    model = models["plain", use_cache]
    model.reset()
    with pytest.raises(ValueError, match="must follow a tree_logits call"):
        model.keep_tree_path([])
    with pytest.raises(ValueError, match="1 to 32"):
        model.tree_logits([], [1], [-1])
    parents = [-1, 0, -1, 1]
    for bad, match in [([1], "not a path"), ([0, 2], "not a path"), ([0, 3], "not a path"), ([4], "index"),
                       ([-1], "index"), ([0.0], "integers")]:
        model.tree_logits([3, 5], [1, 2, 3, 4], parents)
        with pytest.raises(ValueError, match=match):
            model.keep_tree_path(bad)
    model.tree_logits([3, 5], [1, 2, 3, 4], parents)
    model.keep_tree_path([0, 1, 3])
    with pytest.raises(ValueError, match="must follow a tree_logits call"):  # once per tree
        model.keep_tree_path([0])
    if use_cache:  # a logits call in between overwrites the tree's slots
        model.tree_logits([3, 5], [1, 2, 3, 4], parents)
        model.logits([3, 5, 1, 2, 9])
        with pytest.raises(ValueError, match="must follow a tree_logits call"):
            model.keep_tree_path([0])


def test_the_bundled_target_scores_trees_like_plain_feeds():
    _, hparams, params = utils.load_encoder_hparams_and_params("teach-target", REPO / "models")
    model = engine.fast_model(params, hparams, layout="panels")  # a laid-out path (measuring "auto" takes long here)
    reference = gpt2.GPT2Model(params, hparams, use_cache=False)
    fresh_model = lambda: engine.fast_model(params, hparams, layout=model.plan)
    rng = np.random.default_rng(4)
    for _ in range(3):
        x, tokens, parents, path = random_case(rng, hparams["n_vocab"], int(rng.integers(1, 40)))
        check_tree_then_path(model, reference, fresh_model, x, tokens, parents, path, rng)


# ---------------------------------------------------------------------------------------------- tables


def test_cached_table_model_scores_every_path_like_the_table():
    table = random_context_table(5, seed=7)
    model = CachedTableModel(table, n_ctx=40)
    rng = np.random.default_rng(5)
    for _ in range(20):
        x, tokens, parents, path = random_case(rng, 5, int(rng.integers(1, 8)))
        if rng.random() < 0.5:
            model.logits(np.concatenate([x[:rng.integers(1, len(x) + 1)], rng.integers(0, 5, 2)]))
        logits = model.tree_logits(x, tokens, parents)
        assert logits.dtype == np.float32 and logits.shape == (len(tokens) + 1, 5)
        expected = [table.logits_at(x, np.array([len(x) - 1]))[0]]  # x's last token and the one before it
        for node in range(len(tokens)):
            sequence = np.concatenate([x, tokens[path_to(node, parents)]])
            expected.append(table.logits_at(sequence, np.array([len(sequence) - 1]))[0])  # the node and its parent
        np.testing.assert_array_equal(logits, np.array(expected))

        model.keep_tree_path(path)
        kept = np.concatenate([x, tokens[path]])
        assert np.array_equal(model.cached_tokens, kept) and np.array_equal(model.cache[:len(kept)], kept)
        following = np.concatenate([kept, rng.integers(0, 5, 2)])
        np.testing.assert_array_equal(model.logits(following, n_last=3),
                                      CachedTableModel(table, n_ctx=40).logits(following, n_last=3))


def test_cached_table_model_reads_its_cache_and_rejects_bad_trees():
    table = ContextTable(np.arange(27, dtype=np.float32).reshape(3, 3, 3))  # logits name their context
    model = CachedTableModel(table, n_ctx=8)
    logits = model.tree_logits([0, 1], [2, 0, 1], [-1, 0, -1])
    np.testing.assert_array_equal(logits, table.table[[0, 1, 2, 1], [1, 2, 0, 1]])  # [two back, previous]
    model.keep_tree_path([2])  # node 2 moves from its slot, 4, to its depth's, 2
    assert model.cache[:3].tolist() == [0, 1, 1] and model.cached_tokens.tolist() == [0, 1, 1]
    for tokens, parents, match in [([1, 2], [-1, 1], r"parents\[1\]"), ([1], [-1, 0], "1 tokens but 2"),
                                   ([3], [-1], r"\[0, 3\)"), ([0] * 7, [-1] * 7, "overruns")]:
        with pytest.raises(ValueError, match=match):
            model.tree_logits([0, 1], tokens, parents)
    with pytest.raises(ValueError, match="must follow a tree_logits call"):
        model.keep_tree_path([0])
    model.tree_logits([0, 1], [2, 0], [-1, -1])
    with pytest.raises(ValueError, match="not a path"):
        model.keep_tree_path([0, 1])


# ---------------------------------------------------------------------------------------------- bench/tree.py


def test_tree_bench_smoke_run_on_a_tiny_model():
    command = [sys.executable, str(REPO / "bench" / "tree.py"), "--small", "--repeats", "2", "--sizes", "1,4,16"]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result["small"] and result["repeats"] == 2 and result["machine"]["cpu"] and result["machine"]["blas"]
    assert [row["n"] for row in result["by_n"]] == [1, 4, 16]
    assert result["by_n"][1]["parents"] == [-1, 0, -1, -1]  # three chains from the root: 2, 1, 1
    for row in result["by_n"]:
        assert len(row["parents"]) == row["n"]
        for name in ("decode_ms", "chain_ms", "tree_ms", "keep_ms", "tree_over_chain", "chain_over_decode"):
            assert 0 < row[name]["min"] <= row[name]["median"] <= row[name]["max"]
    assert set(result["bar"]) == {"tree_over_chain<=1.1"}


# ---------------------------------------------------------------------------------------------- JAX


@pytest.mark.slow  # JAX compiles its programs: the slow tier
def test_the_jax_model_scores_a_tree_in_one_call_as_gpt2model_does(tiny):
    """JaxGPT2Model.tree_logits and keep_tree_path: one padded device call each, the same contract, and a
    compilation per bucket, not per tree (the random trees need at most the buckets 1..32)."""
    pytest.importorskip("jax")
    from jax_backend import gpt2_jax

    params, _, reference = tiny
    model = gpt2_jax.JaxGPT2Model(params, TINY)
    fresh_model = lambda: gpt2_jax.JaxGPT2Model(params, TINY)
    traces = gpt2_jax.TRACES["feed_tree"]
    rng = np.random.default_rng(6)
    for case in range(14):
        n_prefix = 20 if case < 2 else int(rng.integers(1, 10))  # the first two end near the context's end
        x, tokens, parents, path = random_case(rng, TINY["n_vocab"], n_prefix)
        if case < 2:  # x cached whole: the block of x's last token and the nodes must begin earlier to fit
            model.logits(x)
        elif rng.random() < 0.5:  # the cache holds part of x, or a sequence that diverges from it
            model.logits(np.concatenate([x[:rng.integers(1, len(x) + 1)], rng.integers(0, TINY["n_vocab"], 2)]))
        tokens, parents = tokens[:TINY["n_ctx"] - len(x)], parents[:TINY["n_ctx"] - len(x)]
        path = [node for node in path if node < len(tokens)]
        check_tree_then_path(model, reference, fresh_model, x, tokens, parents, path, rng)
    assert gpt2_jax.TRACES["feed_tree"] - traces <= 6
    with pytest.raises(ValueError, match="must follow a tree_logits call"):
        model.keep_tree_path([])
