"""speedup/drafts.py: prompt lookup proposes what followed the latest match of the text's ending, and speculative
sampling with it stays exact: the autoregressive tokens at temperature 0, the target's law of three tokens
(classroom/exact_law.py's exact oracle) at temperature 1 and with top-k and top-p."""

import numpy as np
import pytest

import gpt2
import sampling
from speedup import drafts
from speedup.stats import SpeculativeStats
from classroom import exact_law
from helpers import DRAFT_TABLE, HPARAMS, TARGET_TABLE, random_target, table_problem


def test_lookup_proposes_what_followed_the_latest_match_of_the_longest_ngram():
    lookup = drafts.PromptLookup(n_vocab=100)
    #           0  1  2  3  4  5  6  7  8  9 10 11
    x = np.array([5, 6, 7, 1, 2, 5, 6, 8, 9, 3, 5, 6])
    # the bigram (5, 6) occurs at 0 and 5: the latest, at 5, is followed by 8, 9, 3, ...
    np.testing.assert_array_equal(lookup.lookup(x, 3), [8, 9, 3])
    np.testing.assert_array_equal(lookup.lookup(x, 10), [8, 9, 3, 5, 6])  # fewer than K: the text ends
    trigram = np.array([1, 2, 3, 9, 2, 3, 7, 1, 2, 3])  # (2, 3) matches latest at 4, but (1, 2, 3) only at 0
    np.testing.assert_array_equal(lookup.lookup(trigram, 2), [9, 2])
    assert len(lookup.lookup(np.array([1, 2, 3, 4]), 5)) == 0  # nothing repeats: no drafts
    assert len(lookup.lookup(np.array([4]), 5)) == 0
    only_trigrams = drafts.PromptLookup(n_vocab=100, min_ngram=3)
    assert len(only_trigrams.lookup(x, 3)) == 0  # (5, 6) is only a bigram match


def test_propose_gives_one_hot_float32_p_and_counts_its_time():
    lookup = drafts.PromptLookup(n_vocab=10)
    stats = SpeculativeStats()
    tokens, p = lookup.propose(np.array([1, 2, 3, 1, 2]), 4, sampling.SamplingSettings(), None, stats)
    assert tokens.dtype == np.int64 and list(tokens) == [3, 1, 2]
    assert p.dtype == np.float32 and p.shape == (3, 10) and (p.argmax(axis=1) == tokens).all() and p.sum() == 3
    assert stats.draft_calls == 3 and stats.draft_seconds > 0


@pytest.mark.parametrize("bad", [dict(n_vocab=0), dict(n_vocab=5, min_ngram=0), dict(n_vocab=5, max_ngram=1, min_ngram=2)])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        drafts.PromptLookup(**bad)


def test_copied_fraction_tells_copying_from_looping():
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    assert drafts.copied_fraction(prompt, [3, 4, 5, 6, 7]) == 1.0
    assert drafts.copied_fraction(prompt, [9, 9, 9, 9, 9, 9]) == 0.0  # a loop of its own repeats nothing of the prompt
    assert drafts.copied_fraction(prompt, [1, 2]) == 0.0  # no 4-gram at all
    assert drafts.copied_fraction(prompt, [4, 5, 6, 7, 0]) == 0.5


def test_greedy_prompt_lookup_gives_exactly_the_autoregressive_tokens():
    target = gpt2.GPT2Model(random_target(), HPARAMS)
    lookup = drafts.PromptLookup(HPARAMS["n_vocab"])
    drafted = 0
    for prompt in ([1, 2, 3, 1, 2, 3, 1, 2], [50, 7, 50, 7, 50], [9, 8, 7]):
        expected = sampling.autoregressive_sampling(prompt, target, 30, temperature=0)
        for K in (1, 3, 8):
            stats = SpeculativeStats()
            out = sampling.speculative_sampling(prompt, lookup, target, 30, K, temperature=0, stats=stats)
            np.testing.assert_array_equal(out, expected, err_msg=f"K={K}, prompt {prompt}")
            drafted += stats.drafted
        np.testing.assert_array_equal(sampling.greedy_assisted_generation(prompt, lookup, target, 30), expected)
    assert drafted > 50  # the lookup did propose


# a prompt that repeats itself, so the lookup proposes from the first token on; the oracle runs the decoder with
# the lookup in place of the problem's draft
REPEATING_PROMPT = [0, 1, 3, 2, 0, 1, 3, 2, 0]


def with_lookup(lookup, stats=None):  # speculative sampling drafting from lookup, with the oracle's signature
    def decoder(x, draft_model, target_model, N, K, rng, **settings):
        return sampling.speculative_sampling(x, lookup, target_model, N, K, rng, stats=stats, **settings)
    return decoder


def lookup_check(lookup, settings, stats=None):  # -> the exact law's check on the tables, prompt REPEATING_PROMPT
    problem = table_problem(DRAFT_TABLE, TARGET_TABLE, settings, prompt=REPEATING_PROMPT)
    return exact_law.check_exact(with_lookup(lookup, stats), problems=[problem])


@pytest.mark.parametrize("kwargs", [{}, {"temperature": 1.7, "top_k": 3, "top_p": 0.8}], ids=["plain", "top-k, top-p"])
def test_prompt_lookup_sampling_follows_the_target(kwargs):
    stats = SpeculativeStats()
    check = lookup_check(drafts.PromptLookup(n_vocab=4), sampling.SamplingSettings(**kwargs), stats)
    assert check.passed and check.max_tv <= exact_law.TV_TOLERANCE, check.report  # its exact law is the target's
    assert not check.results[0].impossible
    assert stats.accepted > 0 and stats.rejected > 0  # both branches of the rule ran, over every path


def test_a_lookup_scored_against_the_wrong_p_is_caught():
    """The control: drafting the looked-up token but dividing by a soft p (not the one-hot it came from)."""

    class SoftLookup(drafts.PromptLookup):
        def propose(self, x, K, settings, rng, stats):
            tokens, p = super().propose(x, K, settings, rng, stats)
            return tokens, np.full_like(p, 1 / self.n_vocab)  # the wrong p enters q/p

    check = lookup_check(SoftLookup(n_vocab=4), sampling.SamplingSettings())
    assert not check.passed, check.report
    assert check.max_tv > 0.05 or check.results[0].impossible, check.report
