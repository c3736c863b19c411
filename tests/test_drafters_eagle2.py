"""drafters/eagle2.py: EAGLE-2's dynamic draft tree, grown by EAGLE's head (untrained) and verified as a token tree.

The head's tree-attention log-probabilities must be its chain's for each node's path, computed by hand; the tree
must be the nodes of highest cumulative log-probability within the budget, closed under ancestors, siblings most
likely first, and branch at temperature 0; the head's cache must give what a fresh head gives after a tree; and
tree verification with it must stay exact: greedy tokens identical to autoregressive decoding, the exact oracle's
law equal to the target's.
"""

import functools

import numpy as np
import pytest

import engine
import gpt2
import sampling
from classroom import exact_law
from conftest import bundled_pair_after
from drafters import eagle2
from drafters.eagle import head_forward, init_head
from drafters.eagle2 import EagleTree, GrownTree, rerank
from gpt2_cases import random_params
from helpers import TINY, GPT2Problem, TinyGPT2Context
from speedup.stats import SpeculativeStats
from verifiers.tree import tree_speculative_sampling

PROMPT = "def mean(values):\n    total = 0\n    for"
DYNAMIC = functools.partial(tree_speculative_sampling, drafts="dynamic", n_drafts=2)


def random_head(hparams, seed):  # weights ten times GPT-2's init, so that the head's p is far from uniform
    head = init_head(hparams, np.random.default_rng(seed))
    head["fc"]["w"] = 10 * head["fc"]["w"]
    return head


def chain_log_probs(target, head, x, path):  # -> [n_vocab]: the head's log-probabilities after x and then path
    """The chain the head would draft along path, recomputed without a cache: the pairs (f_j, x_{j+1}) from the
    target's true features, then (the head's last prediction, the next token of path)."""
    params, n_head = target.params, target.hparams["n_head"]
    features = gpt2.hidden_states(x[:-1], **params, n_head=n_head, cache=None, start=0)[0][-1]  # f_0..f_{n-2}
    tokens = np.asarray(x[1:])
    for t in range(len(path) + 1):
        inputs = np.concatenate([features, params["wte"][tokens]], axis=-1) @ head["fc"]["w"] + head["fc"]["b"]
        predicted, _ = gpt2.transformer_block(inputs, **head["block"], n_head=n_head)  # causal: no cache needed
        features, tokens = np.concatenate([features, predicted[-1:]]), np.append(tokens, path[t:t + 1])
    return gpt2.log_softmax(predicted[-1:] @ params["wte"].T)[0]


def path_of(parents, tokens, node):  # -> the tokens from the root down to node
    path = []
    while node >= 0:
        path.insert(0, tokens[node])
        node = parents[node]
    return path


@pytest.fixture(scope="module")
def bundled():  # -> (the prompt's tokens, the bundled target in the plain layout, a random head for it)
    tokens, _, target = bundled_pair_after(PROMPT)
    return np.array(tokens), target, random_head(target.hparams, 0)


def tiny_target():
    return gpt2.GPT2Model(random_params(TINY, 3), TINY)


def test_each_nodes_log_probabilities_are_the_heads_chain_along_its_path(bundled):
    tokens, target, head = bundled
    grown = EagleTree(target, head, n_nodes=8).grow(tokens, 3, 2)
    assert len(grown.after) == 5 and len(grown.tokens) == 10  # the root, then 2 nodes a depth; 2 children each
    for node, (_, log_probs) in grown.after.items():
        path = path_of(grown.parents, grown.tokens, node)
        assert log_probs.dtype == np.float32 and len(path) == (0 if node == -1 else grown.depths[node])
        np.testing.assert_allclose(log_probs, chain_log_probs(target, head, tokens, path), rtol=1e-5, atol=1e-4)


def test_the_head_runs_once_per_depth(bundled, monkeypatch):
    """The frontier of each depth is fed to the head in one call; the root's call feeds the true pairs."""
    tokens, target, head = bundled
    calls = []  # the rows of each call

    def counted(features, *arguments, **keywords):
        calls.append(len(features))
        return head_forward(features, *arguments, **keywords)

    monkeypatch.setattr(eagle2, "head_forward", counted)
    EagleTree(target, head, n_nodes=8).draft_tree(tokens, 4, 3, sampling.GREEDY, SpeculativeStats())
    assert calls == [len(tokens) - 1, 3, 3, 3]


def test_values_are_the_sums_of_the_log_probabilities_along_the_path(bundled):
    tokens, target, head = bundled
    grown = EagleTree(target, head, n_nodes=8).grow(tokens, 3, 3)
    for node, token in enumerate(grown.tokens):
        parent = grown.parents[node]
        above = 0.0 if parent == -1 else grown.values[parent]
        assert grown.values[node] == pytest.approx(above + grown.after[parent][1][token], abs=1e-6)
        assert grown.values[node] <= above and grown.depths[node] <= 3
    expanded_at_2 = [node for node in grown.after if node >= 0 and grown.depths[node] == 2]
    depth_2 = sorted(grown.at_depth(2), key=lambda node: -grown.values[node])
    assert sorted(expanded_at_2) == sorted(depth_2[:3])  # the frontier's 3 best were expanded


@pytest.mark.parametrize("n_nodes", [1, 4, 7, 100])
def test_the_tree_is_the_budgets_best_nodes_closed_under_ancestors_siblings_most_likely_first(bundled, n_nodes):
    tokens, target, head = bundled
    drafter = EagleTree(target, head, n_nodes=n_nodes)
    stats = SpeculativeStats()
    tree = drafter.draft_tree(tokens, 3, 3, sampling.SamplingSettings(), stats)
    grown = drafter.grow(tokens, 3, 3)  # the same tree again: the head resumes from its true pairs
    assert len(tree.tokens) == min(n_nodes, len(grown.tokens))
    assert stats.draft_calls == len(grown.after) == 1 + 2 * 3  # a readout for the root and each expanded node
    assert all(parent < node for node, parent in enumerate(tree.parents))  # parents before children
    grown_path = {tuple(path_of(grown.parents, grown.tokens, node)): node for node in range(len(grown.tokens))}
    kept = [grown_path[tuple(path_of(tree.parents, tree.tokens, node))] for node in range(len(tree.tokens))]
    threshold = sorted(grown.values, reverse=True)[len(kept) - 1]
    assert all(grown.values[node] >= threshold for node in kept)  # the n_nodes highest values
    for node in [-1, *range(len(tree.tokens))]:
        assert all(p_prime is None for _, p_prime in tree.candidates[node])  # chosen tokens: the one-hot rule
        children = [tree.tokens[child] for child, _ in tree.candidates[node]]
        if children:  # the head's most likely tokens after the node, most likely first
            log_probs = grown.after[-1 if node == -1 else kept[node]][1]
            assert children == np.argsort(-log_probs, kind="stable")[:len(children)].tolist()


def test_on_a_tie_the_parent_wins_so_a_kept_node_keeps_its_ancestors():
    grown, feature = GrownTree(), np.zeros(2, np.float32)
    grown.expand(-1, feature, np.array([0.0, 0.0, -5.0], np.float32), 2)  # nodes 0 and 1 (tokens 0, 1): value 0
    grown.expand(0, feature, np.array([-3.0, -4.0, 0.0], np.float32), 1)  # node 2 (token 2, under node 0): 0 too
    assert grown.values == [0.0, 0.0, 0.0] and grown.depths == [1, 1, 2]
    for n_nodes, tokens, parents in [(1, [0], [-1]), (2, [0, 1], [-1, -1]), (3, [0, 1, 2], [-1, -1, 0])]:
        tree = rerank(grown, n_nodes)
        assert (tree.tokens, tree.parents) == (tokens, parents)


def test_at_temperature_0_the_tree_still_branches(bundled):
    """Ranked by the untempered head: the tempered p is one-hot at temperature 0 and would give a chain."""
    tokens, target, head = bundled
    tree = EagleTree(target, head, n_nodes=6).draft_tree(tokens, 3, 2, sampling.GREEDY, SpeculativeStats())
    assert len(tree.tokens) == 6 > 3 and max(len(children) for children in tree.candidates.values()) == 2


def test_after_a_tree_the_head_gives_what_a_fresh_head_gives(bundled):
    """The tree's slots are scratch: after a verification the head resumes from true pairs only."""
    tokens, target, head = bundled
    drafter = EagleTree(target, head, n_nodes=8)
    tree = drafter.draft_tree(tokens, 3, 2, sampling.SamplingSettings(), SpeculativeStats())
    verified = np.concatenate([tokens, tree.tokens[:1], [7]])  # the first child accepted, then a correction
    for x in (verified, tokens[:-2]):  # after a loop, and after a rollback into the prompt
        cached, fresh = drafter.grow(x, 3, 2), EagleTree(target, head, n_nodes=8).grow(x, 3, 2)
        assert (cached.tokens, cached.parents) == (fresh.tokens, fresh.parents)
        np.testing.assert_allclose(cached.values, fresh.values, rtol=1e-5, atol=1e-5)  # the pairs fed in other pieces
    drafter.draft_tree(verified, 3, 2, sampling.GREEDY, SpeculativeStats())
    chain = [drafter, EagleTree(target, head, n_nodes=8)]
    p_cached, p_fresh = (model.propose(verified, 2, sampling.GREEDY, np.random.default_rng(0), SpeculativeStats())[1]
                         for model in chain)
    np.testing.assert_array_equal(p_cached, p_fresh)  # the chain after a tree: the same as a fresh head's


@pytest.mark.parametrize("layout", ["plain", "panels"])
def test_greedy_tokens_equal_autoregressive_decoding_on_the_bundled_target(bundled, layout):
    """The plain target, and one laid out in panels (engine.fast_model, as main.py builds it)."""
    tokens, target, head = bundled
    if layout != "plain":
        target = engine.fast_model(target.params, target.hparams, layout=layout)
    expected = sampling.autoregressive_sampling(tokens, target, 12, temperature=0)
    target.reset()
    stats = SpeculativeStats()
    got = DYNAMIC(tokens, EagleTree(target, head, n_nodes=6), target, 12, 3, 0, temperature=0, stats=stats)
    np.testing.assert_array_equal(got, expected)
    assert stats.target_calls == stats.loops and stats.drafted > stats.loops and stats.draft_calls > 0


@pytest.mark.parametrize("n_nodes, K", [(3, 2), (8, 4)])
def test_greedy_tokens_equal_autoregressive_decoding_on_a_tiny_gpt2(n_nodes, K):
    """n_ctx 12: the last loops' trees are cut to the room left in the target's and the head's context."""
    target, head = tiny_target(), random_head(TINY, 5)
    for prompt in ([1, 2], [0, 3, 3, 1]):
        expected = sampling.autoregressive_sampling(prompt, target, 12 - len(prompt), temperature=0)
        target.reset()
        got = DYNAMIC(prompt, EagleTree(target, head, n_nodes=n_nodes), target, 12 - len(prompt), K, 0,
                      temperature=0)
        np.testing.assert_array_equal(got, expected)


def test_the_tree_fits_the_context_left():
    target = tiny_target()
    x = np.array([1, 2, 0, 3, 1, 1, 2, 0, 3, 2])  # 10 of n_ctx 12: room for 2 nodes, and 3 head slots
    tree = EagleTree(target, random_head(TINY, 5), n_nodes=8).draft_tree(x, 3, 3, sampling.GREEDY,
                                                                        SpeculativeStats())
    assert len(tree.tokens) == 2
    assert target.tree_logits(x, tree.tokens, tree.parents).shape == (3, TINY["n_vocab"])


def test_no_tree_for_a_prompt_of_one_token(bundled):
    tokens, target, head = bundled
    stats = SpeculativeStats()
    tree = EagleTree(target, head, n_nodes=4).draft_tree(tokens[:1], 3, 2, sampling.GREEDY, stats)
    assert tree.tokens == [] and tree.candidates == {-1: []} and stats.draft_calls == 0


@pytest.mark.parametrize("settings", [sampling.SamplingSettings(), sampling.SamplingSettings(0.7, top_k=3),
                                      sampling.GREEDY])
def test_the_exact_oracle_passes_tree_verification_of_the_dynamic_tree(settings):
    drafter = functools.partial(EagleTree, head=random_head(TINY, 5), n_nodes=4)
    problem = GPT2Problem(f"tiny GPT-2, EAGLE-2 tree of 4 nodes, K=2, N=3, {settings}", drafter,
                          TinyGPT2Context(random_params(TINY, 3)), (1, 2), 3, 2, settings, True, 0)
    check = exact_law.check_exact(DYNAMIC, problems=[problem])
    assert check.passed, check.report
    assert check.results[0].paths > 1 or settings == sampling.GREEDY  # sampling, the verification did branch


@pytest.mark.parametrize("replacement", [True, False])
def test_the_exact_oracle_passes_a_sampled_tree_of_the_heads_drafts(replacement):
    """The tree of several drafts drawn from the head's p (SpecInfer's independent drafts, or RSD's with distinct first
    tokens), verified by recursive rejection against their p' rather than one-hot: the target's law exactly."""
    sampled = functools.partial(tree_speculative_sampling, drafts="sampled", n_drafts=2, replacement=replacement)
    drafter = functools.partial(EagleTree, head=random_head(TINY, 5), n_nodes=4)
    problem = GPT2Problem(f"tiny GPT-2, EAGLE head, sampled tree of 2 drafts, replacement={replacement}, K=2, N=3",
                          drafter, TinyGPT2Context(random_params(TINY, 3)), (1, 2), 3, 2, sampling.SamplingSettings(),
                          True, 0)
    check = exact_law.check_exact(sampled, problems=[problem])
    assert check.passed, check.report
    assert check.results[0].paths > 1  # the verification did branch


@pytest.mark.parametrize("n_nodes", [0, -2, 2.5, "4", True, None])
def test_a_bad_budget_is_refused_in_one_line(n_nodes):
    with pytest.raises(ValueError, match=r"^n_nodes \(the draft tree's budget of nodes\) must be an integer of at "
                                         r"least 1, got [^\n]*$"):
        EagleTree(tiny_target(), random_head(TINY, 5), n_nodes=n_nodes)
