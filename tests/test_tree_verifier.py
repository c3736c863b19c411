"""The token-tree verifier (verifiers/tree.py): the tree's scores through tree_logits equal path-by-path scoring,
sampled trees are multi_draft token for token, greedy decoding is exact, every way of growing the tree is
lossless, one target call per loop."""

import functools

import numpy as np
import pytest

import sampling
from classroom import lossless
from conftest import bundled_pair_after
from speedup.stats import SpeculativeStats
from verifiers.multi_draft import multi_draft_speculative_sampling
from verifiers.tree import (TokenTree, lookup_continuations, score_paths, score_tree, top_k_tree,
                            tree_speculative_sampling)

TARGET, DRAFT = lossless.random_context_table(4, 1), lossless.random_context_table(4, 2)


class CountedTreeModel(lossless.CachedTableModel):
    """lossless's cached table model (which has tree_logits and keep_tree_path), counting its tree calls."""

    tree_calls = 0

    def tree_logits(self, x, tokens, parents):
        self.tree_calls += 1
        return super().tree_logits(x, tokens, parents)


def tree_decoder(n_drafts, drafts, replacement=False):
    """tree_speculative_sampling with speculative_sampling's signature (cached targets score the tree in one call)."""
    return functools.partial(tree_speculative_sampling, n_drafts=n_drafts, drafts=drafts, replacement=replacement)


@pytest.fixture(scope="module")
def bundled_pair():
    return bundled_pair_after("def mean(values):\n    total = 0\n    for value in values:\n        total")


def test_tree_logits_of_the_cached_table_model_equal_each_path_scored_as_a_sequence():
    tree = TokenTree()
    for draft in ([1, 2, 3], [1, 0], [3, 3, 1], [1, 2, 0]):
        tree.add_draft(draft, [None] * len(draft))
    assert tree.tokens == [1, 2, 3, 0, 3, 3, 1, 0] and tree.parents == [-1, 0, 1, 0, -1, 4, 5, 1]
    x, settings = np.array([2, 0, 1]), sampling.SamplingSettings(0.8)
    by_paths = score_paths(lossless.CachedTableModel(TARGET), x, tree.tokens, tree.parents, settings)
    stats = SpeculativeStats()
    by_tree = score_tree(lossless.CachedTableModel(TARGET), x, tree.tokens, tree.parents, settings, stats)
    assert by_tree.dtype == np.float32 and by_tree.shape == (9, 4) and stats.target_calls == 1
    np.testing.assert_array_equal(by_tree, by_paths)


def test_a_sampled_draft_is_a_candidate_at_every_node_it_passes_duplicates_included():
    tree = TokenTree()
    p = np.full(4, 0.25, dtype=np.float32)
    for draft in ([1, 2], [3, 0], [1, 2]):
        tree.add_draft(draft, [p, p])
    assert [child for child, _ in tree.candidates[-1]] == [0, 2, 0]  # in draft order, 1 twice
    assert [child for child, _ in tree.candidates[0]] == [1, 1] and tree.candidates[1] == []
    assert tree.add_choice(-1, 1) == 0 and len(tree.candidates[-1]) == 3  # a chosen token already there: no new try


@pytest.mark.parametrize("target_kind", [lossless.TableCallable, lossless.CachedTableModel])
def test_a_sampled_tree_is_multi_draft_token_for_token(target_kind):
    for seed in range(8):
        for replacement, n_drafts in [(True, 3), (False, 3), (False, 1)]:
            expected_stats, stats = SpeculativeStats(), SpeculativeStats()
            expected = multi_draft_speculative_sampling([2, 0], target_kind(DRAFT), target_kind(TARGET), 10, 3, seed,
                                                        n_drafts=n_drafts, replacement=replacement,
                                                        stats=expected_stats)
            got = tree_speculative_sampling([2, 0], target_kind(DRAFT), target_kind(TARGET), 10, 3, seed,
                                            n_drafts=n_drafts, replacement=replacement, stats=stats)
            assert got.tolist() == expected.tolist()
            assert stats.origins == expected_stats.origins and stats.drafted == expected_stats.drafted


@pytest.mark.parametrize("drafts", ["sampled", "top_k", "lookup"])
def test_greedy_equals_autoregressive_on_tables(drafts):
    for n_drafts in (1, 2, 3):
        for prompt, K in [((2, 0), 1), ((0,), 3), ((3, 3, 1, 3, 3), 4)]:
            expected = sampling.autoregressive_sampling(prompt, lossless.TableCallable(TARGET), 8, temperature=0)
            got = tree_decoder(n_drafts, drafts)(prompt, lossless.CachedTableModel(DRAFT),
                                                 lossless.CachedTableModel(TARGET), 8, K, K, temperature=0)
            assert got.tolist() == expected.tolist()


def test_greedy_equals_autoregressive_on_the_bundled_pair(bundled_pair):
    prompt, draft, target = bundled_pair
    expected = sampling.autoregressive_sampling(prompt, target, 12, temperature=0)
    for drafts, n_drafts in [("sampled", 3), ("top_k", 2), ("lookup", 3)]:
        stats = SpeculativeStats()
        got = tree_speculative_sampling(prompt, draft, target, 12, 3, 0, n_drafts=n_drafts, drafts=drafts,
                                        temperature=0, stats=stats)
        assert got.tolist() == expected.tolist()
        assert stats.target_calls == stats.loops
        assert stats.accepted > 0 or drafts == "lookup"


@pytest.mark.parametrize("drafts, n_drafts, replacement", [("sampled", 3, False), ("top_k", 2, False), ("lookup", 3, False)])
def test_check_lossless_passes(drafts, n_drafts, replacement):
    check = lossless.check_lossless(tree_decoder(n_drafts, drafts, replacement))
    assert check.passed, check.report


def test_one_target_call_per_loop_and_K_plus_1_tokens_from_a_perfect_draft():
    assert lossless.check_tokens_per_call(tree_decoder(1, "sampled")).passed  # it counts the model's calls
    target, stats = CountedTreeModel(TARGET), SpeculativeStats()
    out = tree_speculative_sampling([2, 0], lossless.CachedTableModel(TARGET), target, 24, 3, 0, n_drafts=3,
                                    stats=stats)
    assert len(out) == 26 and target.tree_calls == stats.target_calls == stats.loops == 6 and stats.accepted == 18


def test_top_k_trees_hold_the_k_most_likely_tokens_at_every_node():
    stats = SpeculativeStats()
    x = np.array([2, 0])
    tree = top_k_tree(lossless.TableCallable(DRAFT), x, 2, 2, sampling.SamplingSettings(), stats)
    assert len(tree.tokens) <= 2 + 4 and stats.draft_calls == 1 + len(tree.candidates[-1])
    for node in [-1, *range(len(tree.tokens))]:
        children = [tree.tokens[child] for child, p_prime in tree.candidates[node] if p_prime is None]
        if node == -1 or tree.parents[node] == -1:  # the root and depth 1 are expanded
            context = x if node == -1 else np.append(x, tree.tokens[node])
            p = sampling.next_token_probs(lossless.TableCallable(DRAFT), context, 1,
                                          sampling.SamplingSettings())[0]
            assert children == [t for t in np.argsort(-p, kind="stable")[:2] if p[t] > 0]
        else:
            assert children == []


class TopKTreeDrafter(lossless.CachedTableModel):
    """A drafter that grows its own tree (drafts="dynamic"): here top_k_tree's, through the drafter hook."""

    def draft_tree(self, x, K, n_drafts, settings, stats):
        return top_k_tree(self, x, K, n_drafts, settings, stats)


def test_a_tree_the_drafter_grows_itself_is_verified_as_the_same_tree_grown_by_the_verifier():
    for temperature in (0, 1):
        runs = {drafts: tree_speculative_sampling([2, 0], TopKTreeDrafter(DRAFT), lossless.CachedTableModel(TARGET),
                                                  16, 3, 7, n_drafts=2, drafts=drafts, temperature=temperature)
                for drafts in ("top_k", "dynamic")}
        assert runs["top_k"].tolist() == runs["dynamic"].tolist()


def test_lookup_takes_the_latest_distinct_continuations_of_the_longest_matching_ngram():
    x = [5, 6, 1, 5, 6, 2, 9, 5, 6, 1, 7, 5, 6]
    assert lookup_continuations(x, 2, 3) == [(1, 7), (2, 9), (1, 5)]
    assert lookup_continuations(x, 2, 2) == [(1, 7), (2, 9)]
    assert lookup_continuations([4, 5, 6, 4, 5, 3, 4, 5, 6], 3, 3) == [(4, 5, 3)]  # the trigram 4 5 6 wins
    assert lookup_continuations([1, 2, 3], 3, 3) == []


@pytest.mark.parametrize("bad, match", [(dict(n_drafts=0), "n_drafts"), (dict(drafts="beam"), "drafts must be"),
                                        (dict(K=0), "K must be")])
def test_bad_inputs_raise_value_error(bad, match):
    arguments = dict(K=2, n_drafts=2, drafts="sampled") | bad
    with pytest.raises(ValueError, match=match):
        tree_speculative_sampling([2, 0], lossless.TableCallable(DRAFT), lossless.TableCallable(TARGET), 4,
                                  arguments["K"], n_drafts=arguments["n_drafts"], drafts=arguments["drafts"])
