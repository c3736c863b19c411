"""drafters/medusa.py: Medusa-1's heads as a chain drafter and as a sparse-tree drafter.

The heads must be separate objects and their logits the residual block's formula read out through the target's
unembedding, on NumPy and JAX alike; head k at the feature that produced x's last token must draft x_{n-1+k} (a
head trained to continue a periodic sequence shows it); the tree must keep the n_nodes paths of highest expected
acceptance, each with its ancestors; and every decoder must stay exact: greedy tokens identical to autoregressive
decoding, the exact oracle's law equal to the target's at temperature 1, for the chain and the tree.
"""

import functools

import numpy as np
import pytest

import engine
import gpt2
import sampling
from classroom import exact_law, lossless, verifier_zoo
from conftest import bundled_pair_after
from drafters.features import true_features
from drafters.medusa import (MedusaDraft, best_paths, head_distillation_loss, head_logits, head_loss, head_targets,
                             init_heads, loss_weights)
from gpt2_cases import random_params
from helpers import HPARAMS, TINY, GPT2Problem, TinyGPT2Context, assert_greedy_equals_autoregressive, random_target
from speedup.stats import SpeculativeStats
from verifiers.tree import tree_speculative_sampling

PROMPT = "def mean(values):\n    total = 0\n    for"
DYNAMIC_TREE = functools.partial(tree_speculative_sampling, drafts="dynamic", n_drafts=2)


def random_heads(hparams, n_heads, seed, scale=1.0):  # w random (init_heads' is zero), so the heads disagree
    rng = np.random.default_rng(seed)
    heads = init_heads(hparams, n_heads, rng)
    for head in heads["heads"]:
        head["w"] = (scale * rng.standard_normal(head["w"].shape) / np.sqrt(hparams["n_embd"])).astype(np.float32)
    return heads


def by_hand(feature, heads, wte):  # [n_embd] -> [n_heads, n_vocab]: h_k = f + SiLU(f w_k + b_k), then h_k wte^T
    rows = []
    for head in heads["heads"]:
        z = feature.astype(np.float64) @ head["w"] + head["b"]
        rows.append((feature + z / (1 + np.exp(-z))) @ wte.T.astype(np.float64))
    return np.array(rows)


@pytest.fixture(scope="module")
def bundled():  # -> (the prompt's tokens, the bundled target in the plain layout, random heads for it)
    tokens, _, target = bundled_pair_after(PROMPT)
    return np.array(tokens), target, random_heads(target.hparams, 4, 0, scale=4.0)


# ---- the heads ----------------------------------------------------------------------------------------------


def test_init_heads_are_medusas_resblocks_each_with_its_own_arrays():
    heads = init_heads(TINY, 3, np.random.default_rng(0))["heads"]
    assert len(heads) == 3 and all(head["w"].shape == (8, 8) and head["b"].shape == (8,) for head in heads)
    assert all(head["w"].dtype == head["b"].dtype == np.float32 and not head["w"].any() for head in heads)
    assert all(np.abs(head["b"]).max() <= 1 / np.sqrt(8) for head in heads)  # nn.Linear's default bias
    arrays = [array for head in heads for array in head.values()]
    assert len({id(array) for array in arrays}) == len(arrays)  # no array shared by two heads


def test_changing_one_heads_arrays_leaves_the_others_logits_unchanged():
    heads, rng = random_heads(TINY, 3, 1), np.random.default_rng(2)
    feature, wte = rng.standard_normal(8).astype(np.float32), rng.standard_normal((4, 8)).astype(np.float32)
    before = head_logits(feature, heads, wte.T)
    heads["heads"][1]["w"] += 1.0  # in place, as an optimiser step would
    heads["heads"][1]["b"] -= 0.5
    after = head_logits(feature, heads, wte.T)
    np.testing.assert_array_equal(after[[0, 2]], before[[0, 2]])
    assert np.abs(after[1] - before[1]).max() > 1e-2


def test_head_logits_are_the_residual_block_read_out_through_the_unembedding_batched_or_not():
    heads, rng = random_heads(TINY, 3, 3, scale=3.0), np.random.default_rng(4)
    features, wte = rng.standard_normal((2, 5, 8)).astype(np.float32), rng.standard_normal((4, 8)).astype(np.float32)
    logits = head_logits(features, heads, wte.T)
    assert logits.shape == (2, 5, 3, 4) and logits.dtype == np.float32
    for i, j in [(0, 0), (1, 3)]:
        np.testing.assert_allclose(logits[i, j], by_hand(features[i, j], heads, wte), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(head_logits(features[i, j], heads, wte.T), logits[i, j])


def test_with_b_zero_too_every_head_starts_as_the_targets_own_prediction_from_its_feature():
    """w zero (Medusa's init) and b zero: h_k = f, read out through the shared unembedding, is the target's q."""
    target, x = gpt2.GPT2Model(random_params(TINY, 3), TINY), np.array([1, 2, 0, 3])
    heads = init_heads(TINY, 2, np.random.default_rng(0))
    for head in heads["heads"]:
        head["b"][:] = 0
    feature = true_features(target, x[:-1])[-1]
    expected = target.logits(x[:-1])[0]  # the target's logits at position n-2, the ones that drew x's last token
    for row in head_logits(feature, heads, target.params["wte"].T):
        np.testing.assert_allclose(row, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # JAX
def test_head_logits_and_loss_on_jax_equal_numpy():
    jnp = pytest.importorskip("jax.numpy")
    import jax

    heads, rng = random_heads(TINY, 3, 5, scale=3.0), np.random.default_rng(6)
    features, wte = rng.standard_normal((6, 8)).astype(np.float32), rng.standard_normal((4, 8)).astype(np.float32)
    labels = rng.integers(0, 4, (6, 3))
    on_jax = jax.tree_util.tree_map(jnp.asarray, heads)
    logits = head_logits(jnp.asarray(features), on_jax, jnp.asarray(wte.T))
    assert logits.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(logits), head_logits(features, heads, wte.T), rtol=1e-5, atol=1e-5)
    loss = head_loss(jnp.asarray(features), jnp.asarray(labels), on_jax, jnp.asarray(wte.T))
    assert float(loss) == pytest.approx(float(head_loss(features, labels, heads, wte.T)), rel=1e-5)


def test_the_loss_is_medusa_1s_cross_entropy_weighted_by_0_8_to_the_k():
    heads, rng = random_heads(TINY, 3, 7, scale=3.0), np.random.default_rng(8)
    features, wte = rng.standard_normal((5, 8)).astype(np.float32), rng.standard_normal((4, 8)).astype(np.float32)
    labels = rng.integers(0, 4, (5, 3))
    np.testing.assert_allclose(loss_weights(3), [0.8, 0.64, 0.512], rtol=1e-6)
    expected = 0.0
    for i in range(5):
        rows = by_hand(features[i], heads, wte)
        log_probs = rows - np.log(np.exp(rows).sum(axis=-1, keepdims=True))
        expected -= sum(0.8 ** k * log_probs[k - 1, labels[i, k - 1]] for k in (1, 2, 3)) / 5
    assert float(head_loss(features, labels, heads, wte.T)) == pytest.approx(expected, rel=1e-5)


def test_self_distillation_sets_head_k_against_the_targets_distribution_one_position_before_its_token():
    """At feature i head k's token is i+1+k, which the target predicts from position i+k: with the target's logits
    one-hot-sharp at the text's tokens, the distillation loss is head_loss on head_targets' labels; by hand otherwise."""
    heads, rng = random_heads(TINY, 3, 7, scale=3.0), np.random.default_rng(9)
    features, wte = rng.standard_normal((10, 8)).astype(np.float32), rng.standard_normal((4, 8)).astype(np.float32)
    text = rng.integers(0, 4, 10)  # a feature per token; the target's logits at position t predict text[t + 1]
    sharp = (100.0 * np.eye(4, dtype=np.float32))[np.append(text[1:], 0)]  # [10, 4], the last row never read
    labels = head_targets(text, 3)  # [6, 3]: features 0..5
    distilled = float(head_distillation_loss(features, sharp, heads, wte.T))
    assert distilled == pytest.approx(float(head_loss(features[:6], labels, heads, wte.T)), rel=1e-4)
    soft = rng.standard_normal((10, 4)).astype(np.float32)
    expected = 0.0
    for i in range(6):
        rows = by_hand(features[i], heads, wte)
        log_probs = rows - np.log(np.exp(rows).sum(axis=-1, keepdims=True))
        for k in (1, 2, 3):
            teacher = np.exp(soft[i + k]) / np.exp(soft[i + k]).sum()
            expected -= 0.8 ** k * (teacher * log_probs[k - 1]).sum() / 6
    assert float(head_distillation_loss(features, soft, heads, wte.T)) == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ValueError, match="has no feature with labels for 3 heads"):
        head_distillation_loss(features[:4], soft[:4], heads, wte.T)


def test_head_k_is_labelled_with_the_token_k_plus_1_after_its_feature():
    tokens = np.arange(10, 20)
    labels = head_targets(tokens, 3)
    assert labels.shape == (6, 3)
    assert labels[0].tolist() == [12, 13, 14] and labels[-1].tolist() == [17, 18, 19]  # feature 0: x_2, x_3, x_4
    assert head_targets(np.stack([tokens, tokens + 10]), 2).shape == (2, 7, 2)
    with pytest.raises(ValueError, match="has no feature with labels for 9 heads"):
        head_targets(tokens, 9)


@pytest.mark.slow  # JAX
def test_heads_trained_on_a_periodic_text_draft_its_continuation():
    """The indexing, end to end: heads trained through head_loss on head_targets' labels (JAX), then drafting after
    every prefix. Head k must draft x_{n-1+k}: a feature or a label off by one drafts the period shifted."""
    jnp = pytest.importorskip("jax.numpy")
    import jax

    target, text = gpt2.GPT2Model(random_params(TINY, 3), TINY), np.array([1, 3, 0, 2] * 3)
    labels = head_targets(text, 3)
    features = jnp.asarray(true_features(target, text)[:len(labels)])
    loss_and_grad = jax.jit(jax.value_and_grad(lambda heads: head_loss(features, jnp.asarray(labels), heads,
                                                                       jnp.asarray(target.params["wte"].T))))
    heads = jax.tree_util.tree_map(jnp.asarray, init_heads(TINY, 3, np.random.default_rng(0)))
    for _ in range(300):
        loss, grads = loss_and_grad(heads)
        heads = jax.tree_util.tree_map(lambda value, grad: value - grad, heads, grads)
    drafter = MedusaDraft(target, jax.tree_util.tree_map(np.asarray, heads))
    for n in range(2, 10):  # the features at n-2 = 0..7 were trained
        drafts, _ = drafter.propose(text[:n], 3, sampling.GREEDY, np.random.default_rng(0), SpeculativeStats())
        assert drafts.tolist() == text[n:n + 3].tolist(), (n, float(loss))


# ---- the chain ----------------------------------------------------------------------------------------------


def test_p_is_each_heads_distribution_at_the_feature_that_produced_the_last_token(bundled):
    tokens, target, heads = bundled
    drafter, settings, stats = MedusaDraft(target, heads), sampling.SamplingSettings(0.8, top_k=40), SpeculativeStats()
    for K, expected_drafts in [(3, 3), (9, 4)]:  # min(K, n_heads)
        drafts, p = drafter.propose(tokens, K, settings, np.random.default_rng(0), stats)
        assert drafts.shape == (expected_drafts,) and p.shape == (expected_drafts, target.n_vocab)
        assert p.dtype == np.float32 and np.count_nonzero(p[0]) <= 40
        assert all(p[t][drafts[t]] > 0 for t in range(expected_drafts))
        states, _ = gpt2.hidden_states(tokens[:-1], **target.params, n_head=target.hparams["n_head"], cache=None,
                                       start=0)
        feature = states[-1][-1]  # f_{n-2}, after ln_f
        expected = sampling.logits_to_probs(by_hand(feature, heads, target.params["wte"])[:expected_drafts], settings)
        np.testing.assert_allclose(p, expected, atol=1e-5)
    assert stats.draft_calls == 7  # one step per head read out


def test_no_drafts_for_K_0_or_a_prompt_of_one_token(bundled):
    tokens, target, heads = bundled
    for x, K in ((tokens, 0), (tokens[:1], 4)):
        drafter = MedusaDraft(target, heads)
        drafts, p = drafter.propose(x, K, sampling.GREEDY, np.random.default_rng(0), SpeculativeStats())
        assert drafts.shape == (0,) and p.shape == (0, target.n_vocab)
        assert drafter.draft_tree(x, K, 2, sampling.GREEDY, SpeculativeStats()).tokens == []


@pytest.mark.parametrize("layout", ["plain", "panels"])
def test_greedy_chain_equals_autoregressive_decoding_on_the_bundled_target(bundled, layout):
    tokens, target, heads = bundled
    if layout != "plain":
        target = engine.fast_model(target.params, target.hparams, layout=layout)
    assert_greedy_equals_autoregressive(tokens, MedusaDraft(target, heads), target)


def test_greedy_chain_and_tree_equal_autoregressive_decoding_on_a_random_gpt2():
    target = gpt2.GPT2Model(random_target(), HPARAMS)
    tokens = np.array([5, 17, 3, 42, 8])
    assert_greedy_equals_autoregressive(tokens, MedusaDraft(target, random_heads(HPARAMS, 3, 9, 4.0)), target)
    assert_greedy_tree_equals_autoregressive(tokens, MedusaDraft(target, random_heads(HPARAMS, 3, 9, 4.0)), target)


def assert_greedy_tree_equals_autoregressive(tokens, drafter, target, N=16, K=4):
    target.reset()
    expected = sampling.autoregressive_sampling(tokens, target, N, 0, temperature=0)
    target.reset()
    stats = SpeculativeStats()
    got = tree_speculative_sampling(tokens, drafter, target, N, K, 0, n_drafts=3, drafts="dynamic", temperature=0,
                                    stats=stats)
    np.testing.assert_array_equal(got, expected)
    assert stats.drafted > stats.loops  # more than one node a loop: a tree, even at temperature 0


def test_the_tree_fits_the_context_left_and_decodes_up_to_its_end():
    """TINY's n_ctx 12: after 10 tokens there is room for 2 nodes, and a run that ends at n_ctx writes the
    autoregressive tokens through its last loops' trimmed trees."""
    target = gpt2.GPT2Model(random_params(TINY, 3), TINY)
    drafter = MedusaDraft(target, random_heads(TINY, 3, 2, scale=3.0), n_nodes=8)
    x = np.array([1, 2, 0, 3, 1, 1, 2, 0, 3, 2])
    tree = drafter.draft_tree(x, 3, 3, sampling.GREEDY, SpeculativeStats())
    assert len(tree.tokens) == 2
    assert target.tree_logits(x, tree.tokens, tree.parents).shape == (3, TINY["n_vocab"])
    assert_greedy_tree_equals_autoregressive(np.array([1, 2, 0]), drafter, target, N=TINY["n_ctx"] - 3, K=3)


def test_greedy_tree_equals_autoregressive_decoding_on_the_bundled_target(bundled):
    tokens, target, heads = bundled
    assert_greedy_tree_equals_autoregressive(tokens, MedusaDraft(target, heads, n_nodes=6), target)


# ---- the tree -----------------------------------------------------------------------------------------------


def all_paths(confidence):  # -> {ranks: product}, every path of every depth, by brute force
    paths, frontier = {}, [()]
    for row in confidence:
        frontier = [(*path, rank) for path in frontier for rank in range(len(row))]
        paths.update({path: np.prod([confidence[k][r] for k, r in enumerate(path)]) for path in frontier})
    return paths


def tree_paths(tree):  # -> the path of tokens to each node, in node order
    paths = []
    for token, parent in zip(tree.tokens, tree.parents):
        paths.append((*paths[parent], token) if parent >= 0 else (token,))
    return paths


@pytest.mark.parametrize("accuracies", [None, [[0.7, 0.2, 0.05], [0.5, 0.3, 0.1], [0.45, 0.2, 0.15]]])
@pytest.mark.parametrize("n_nodes", [1, 4, 9])
def test_the_tree_keeps_the_n_nodes_paths_of_highest_expected_acceptance_with_their_ancestors(accuracies, n_nodes):
    target, x = gpt2.GPT2Model(random_target(), HPARAMS), np.array([5, 17, 3, 42])
    heads = random_heads(HPARAMS, 3, 10, 4.0)
    tree = MedusaDraft(target, heads, accuracies, n_nodes).draft_tree(x, 5, 3, sampling.GREEDY, SpeculativeStats())
    probs = sampling.softmax(head_logits(true_features(target, x[:-1])[-1], heads, target.params["wte"].T)
                             .astype(np.float64))
    ranked = np.argsort(-probs, axis=-1, kind="stable")[:, :3]
    confidence = np.take_along_axis(probs, ranked, axis=-1) if accuracies is None else np.array(accuracies)
    scores = all_paths(confidence)
    best = sorted(scores, key=lambda path: -scores[path])[:n_nodes]  # random heads: no ties
    expected = {tuple(int(ranked[k, r]) for k, r in enumerate(path)) for path in best}
    assert len(tree.tokens) == n_nodes and set(tree_paths(tree)) == expected
    assert all(parent < node for node, parent in enumerate(tree.parents))  # parents first
    assert {path[:-1] for path in expected if len(path) > 1} <= expected  # every node's ancestors kept


def test_best_paths_are_parents_first_and_skip_paths_that_cannot_be_right():
    confidence = [[0.9, 0.5], [0.6, 0.0], [1.0, 0.3]]
    assert best_paths(confidence, 5) == [(0,), (0, 0), (0, 0, 0), (1,), (1, 0)]  # ties: the parent first
    assert len(best_paths(confidence, 100)) == 2 + 2 + 4  # the paths through rank 1 of head 2 are dropped


class LazyRows:  # best_paths' confidence, recording which rows the search reads
    def __init__(self, rows):
        self.rows, self.read = rows, set()

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, k):
        self.read.add(k)
        return self.rows[k]


@pytest.mark.parametrize("seed", range(20))
def test_best_paths_under_ceilings_keep_the_same_paths_and_read_no_row_past_them(seed):
    """Ties included (confidences on a coarse grid): the bounded search keeps what ranking every row at once keeps,
    and reads row k only if a kept path has k ranks."""
    rng = np.random.default_rng(seed)
    confidence = rng.integers(0, 5, size=(4, 3)) / 4
    ceilings = confidence.max(axis=1)
    for n_nodes in (1, 3, 7, 40):
        lazy = LazyRows(confidence)
        kept = best_paths(lazy, n_nodes, ceilings)
        assert kept == best_paths(confidence, n_nodes)
        assert lazy.read <= {len(path) for path in kept} | {0}


class RecordingUnembedding:  # the target's unembedding, recording how many rows each readout multiplies
    __array_ufunc__ = None  # NumPy's matmul defers to __rmatmul__

    def __init__(self, matrix):
        self.matrix, self.rows = matrix, []

    def __rmatmul__(self, states):  # [..., n_embd] @ it
        self.rows.append(int(np.prod(states.shape[:-1])))
        return states @ self.matrix


@pytest.mark.parametrize("n_nodes", [3, 6, 60])
def test_the_tree_reads_out_only_the_heads_it_reaches(bundled, n_nodes):
    """With measured accuracies (no two alike here: no tie), a tree that stops at depth d reads out heads 1..d, one
    readout of one row each; its tokens are those of the paths ranked over every head's readout."""
    tokens, target, heads = bundled
    accuracies = np.array([[0.17, 0.08, 0.046], [0.093, 0.061, 0.041], [0.068, 0.05, 0.036], [0.054, 0.049, 0.038]])
    drafter, stats = MedusaDraft(target, heads, accuracies, n_nodes), SpeculativeStats()
    drafter.unembedding = RecordingUnembedding(drafter.unembedding)
    tree = drafter.draft_tree(tokens, 4, 3, sampling.GREEDY, stats)
    depth = max(len(path) for path in tree_paths(tree))
    assert drafter.unembedding.rows == [1] * depth and stats.draft_calls == depth
    assert depth < 4 if n_nodes < 60 else depth == 4
    probs = sampling.softmax(head_logits(true_features(target, tokens[:-1])[-1], heads, drafter.unembedding.matrix)
                             .astype(np.float64))
    ranked = np.argsort(-probs, axis=-1, kind="stable")[:, :3]
    expected = [tuple(int(ranked[k, r]) for k, r in enumerate(path)) for path in best_paths(accuracies, n_nodes)]
    assert tree_paths(tree) == expected


def test_the_tree_is_as_deep_as_the_heads_and_K_allow():
    target, x = gpt2.GPT2Model(random_target(), HPARAMS), np.array([5, 17, 3, 42])
    for n_heads, K in [(2, 5), (4, 3)]:
        drafter = MedusaDraft(target, random_heads(HPARAMS, n_heads, 11, 4.0), n_nodes=200)
        stats = SpeculativeStats()
        tree = drafter.draft_tree(x, K, 2, sampling.GREEDY, stats)
        depth = min(n_heads, K)
        assert len(tree.tokens) == sum(2 ** d for d in range(1, depth + 1)) and stats.draft_calls == depth


# ---- exactness by the exact oracle on a tiny random GPT-2 ---------------------------------------------------


def medusa_problems(n_heads):
    drafter = functools.partial(MedusaDraft, heads=random_heads(TINY, n_heads, 12, 4.0), n_nodes=3)
    context = TinyGPT2Context(random_params(TINY, 3))
    return [GPT2Problem(f"tiny GPT-2, {n_heads} Medusa heads, K=2, N=3", drafter, context, (1, 2), 3, 2,
                        sampling.SamplingSettings(), True, 0)]


@pytest.mark.parametrize("decoder", [sampling.speculative_sampling, DYNAMIC_TREE], ids=["chain", "tree"])
@pytest.mark.parametrize("n_heads", [1, 3])  # one head: fewer drafts than K
def test_the_exact_oracle_passes_the_chain_and_the_tree_at_temperature_1(decoder, n_heads):
    check = exact_law.check_exact(decoder, problems=medusa_problems(n_heads))
    assert check.passed, check.report
    assert check.results[0].paths > 1  # the draws did branch


def test_typical_acceptance_on_medusas_heads_is_lossy_where_the_exact_chain_is_not():
    """Medusa's lossy verification, only through the zoo's decoder that says so: with the paper's thresholds its
    law is off the target's (the chain's is exact, above)."""
    assert verifier_zoo.typical_total_variation(0.09, 0.3, medusa_problems(3)[0]) > 0.1


# ---- bad inputs ---------------------------------------------------------------------------------------------


def test_bad_targets_heads_accuracies_and_budgets_are_refused(bundled):
    _, target, heads = bundled
    bad = [((lossless.CachedTableModel(lossless.random_context_table(4, 0)), heads), {}, "gpt2.GPT2Model"),
           ((target, init_heads({"n_embd": 64}, 2, np.random.default_rng(0))), {},
            r"Medusa's heads: heads.0.w must be \[384, 384\] for a target of n_embd 384, got \[64, 64\]"),
           ((target, {"heads": []}), {}, "Medusa's heads: no head"),
           ((target, heads), {"accuracies": np.ones((3, 2))}, r"accuracies must be \[4, top\]"),
           ((target, heads), {"accuracies": np.full((4, 2), 1.5)}, "accuracies must be"),
           ((target, heads), {"n_nodes": 0}, r"n_nodes \(the draft tree's budget of nodes\) must be an integer of at "
                                             "least 1, got 0")]
    for args, kwargs, message in bad:
        with pytest.raises(ValueError, match=message):
            MedusaDraft(*args, **kwargs)
    with pytest.raises(ValueError, match="n_heads must be a positive integer"):
        init_heads(target.hparams, 0, np.random.default_rng(0))
    drafter = MedusaDraft(target, heads, accuracies=np.full((4, 2), 0.5))
    with pytest.raises(ValueError, match="n_drafts 3 asks for more ranks than the 2"):
        drafter.draft_tree(np.array([1, 2, 3]), 2, 3, sampling.GREEDY, SpeculativeStats())
