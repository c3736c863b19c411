"""classroom/bug_zoo.py: every bug applies to today's reference, and lossless.py catches every one of them.

The reference passing the same checks is tests/test_lossless.py's first test. Each verdict here is one
check_lossless run at its default sample size and seed, stopped at the first test that fails the bug.
"""

import functools
import re

import numpy as np
import pytest

import gpt2
import sampling
from classroom import bug_zoo, lossless
from speedup.stats import SpeculativeStats
from kvcache import contract
from helpers import HPARAMS, perturbed, random_target

DISTRIBUTION_BUGS = [bug.name for bug in bug_zoo.BUGS if not bug.speed_only]
SPEED_BUGS = [bug.name for bug in bug_zoo.BUGS if bug.speed_only]


@functools.cache
def verdict(name):
    variant = bug_zoo.ZOO[name]  # a bug's verdict is found at its first failing test: the rest cannot change it
    return lossless.check_lossless(variant.decoder(), stop_at_failure=not (variant.lossless or variant.speed_only))


def test_the_zoo_holds_at_least_ten_bugs_each_named_after_a_public_report():
    assert len(bug_zoo.BUGS) >= 10 and len(set(bug_zoo.ZOO)) == len(bug_zoo.BUGS) + 1
    for variant in bug_zoo.ZOO.values():
        assert re.search(r"[\w.-]+/[\w.-]+#\d+|PR #\d+|#\d+", variant.source), variant.source
        assert variant.title and variant.effect and variant.patches


@pytest.mark.parametrize("name", list(bug_zoo.ZOO))
def test_every_patch_applies_to_the_current_reference_and_changes_it(name):
    variant = bug_zoo.ZOO[name]
    decoder = variant.decoder()  # raises StalePatch if a line it replaces is gone
    assert decoder is not sampling.speculative_sampling and callable(decoder)
    diff = variant.diff()
    assert diff.startswith("--- a/") and "\n+" in diff and "\n-" in diff
    for patch in variant.patches:
        assert f"a/{patch.module.__name__.replace('.', '/')}.py" in diff


def test_a_patch_whose_lines_are_gone_raises_naming_the_bug_and_the_lines():
    stale = bug_zoo.Variant("stale", "a bug against yesterday's code", "example/repo#1", "none",
                            (bug_zoo.Patch(sampling, "speculative_sampling", "r = rng.uniform()", "r = 0.5"),))
    with pytest.raises(bug_zoo.StalePatch, match=r"bug 'stale': sampling.speculative_sampling no longer contains "
                                                 r"the line\(s\) \['r = rng.uniform\(\)'\]"):
        stale.decoder()


@pytest.mark.parametrize("name", DISTRIBUTION_BUGS)
def test_check_lossless_catches_the_bug(name):
    result = verdict(name)
    assert not result.passed and result.p_value < 1e-3, result.report
    n_tests = len(lossless.default_problems()) + 1
    assert result.subtests[-1].p_value * n_tests <= lossless.ALPHA  # stopped at the first test that fails it


@pytest.mark.parametrize("name", SPEED_BUGS)
def test_a_speed_only_bug_passes_the_distribution_check_and_fails_tokens_per_call(name):
    decoder = bug_zoo.ZOO[name].decoder()
    assert verdict(name).passed, verdict(name).report  # it is lossless: only slower
    speed = lossless.check_tokens_per_call(decoder)
    assert not speed.passed and speed.target_calls > speed.expected_calls, speed.report


def test_the_reference_and_the_distribution_bugs_make_the_formulas_number_of_calls():
    assert lossless.check_tokens_per_call(sampling.speculative_sampling).passed
    assert lossless.check_tokens_per_call(bug_zoo.ZOO["correction_from_q"].decoder()).passed  # no rejections here


def test_exact_match_verification_is_lossless_but_accepts_less():
    variant = bug_zoo.EXACT_MATCH_VERIFICATION
    assert variant.lossless and variant.name not in [bug.name for bug in bug_zoo.BUGS]
    assert verdict(variant.name).passed, verdict(variant.name).report
    problem = lossless.default_problems()[0]
    accepted = {}
    for label, decoder in [("rejection", sampling.speculative_sampling), ("exact match", variant.decoder())]:
        stats = SpeculativeStats()
        draft, target = problem.models()
        for seed in range(300):
            decoder(np.array(problem.prompt), draft, target, 8, 2, np.random.default_rng(seed), stats=stats)
        accepted[label] = stats.acceptance_rate
    assert accepted["exact match"] < accepted["rejection"] - 0.1


def test_model_side_bugs_reach_every_cached_model_and_are_undone_afterwards():
    """A cache bug patched into contract.cache_resume breaks greedy identity on a real (random-weight) GPT2Model."""
    original = contract.cache_resume
    target_params = random_target()
    target = gpt2.GPT2Model(target_params, HPARAMS)
    draft = gpt2.GPT2Model(perturbed(target_params, 0.3, 1), HPARAMS)
    prompt = [1, 2, 3]
    expected = sampling.autoregressive_sampling(prompt, target, 24, temperature=0)
    for name in ("no_rollback", "cache_position_plus_one"):
        target.reset(), draft.reset()
        buggy = bug_zoo.ZOO[name].decoder()(prompt, draft, target, 24, 4, 0, temperature=0)
        assert not np.array_equal(buggy, expected), name
        assert contract.cache_resume is original  # restored
    target.reset(), draft.reset()
    assert np.array_equal(sampling.speculative_sampling(prompt, draft, target, 24, 4, temperature=0), expected)


def test_a_model_side_patch_is_undone_even_when_the_decoder_raises():
    original = contract.cache_resume
    with pytest.raises(ValueError):
        bug_zoo.ZOO["no_rollback"].decoder()([1, 2], lossless.TableCallable(lossless.random_context_table(4, 1)),
                                             lossless.TableCallable(lossless.random_context_table(4, 2)), -1, 2)
    assert contract.cache_resume is original
