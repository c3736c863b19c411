"""classroom/verifier_zoo.py: every verifier bug applies to today's verifier, and the checkers catch each one.

lossless.check_lossless (a chi-square at 8,700 runs) catches the bugs marked chi_square_sees_it; the others move
the law by less than it can see, and classroom/exact_law.check_exact, which computes the law exactly, fails them
all and measures the total variation each effect text quotes. The references pass both.
"""

import functools
import re

import numpy as np
import pytest

import sampling
from classroom import bug_zoo, exact_law, lossless, verifier_zoo
from conftest import REPO
from verifiers.block import block_speculative_sampling

NAMES = list(verifier_zoo.ZOO)


def exact_problems(bug):
    return [*exact_law.default_exact_problems(), *bug.extra_problems()]


@functools.cache
def exact_check(name, reference=False):
    bug = verifier_zoo.ZOO[name]
    decoder = bug.variant.reference() if reference else bug.variant.decoder()
    return exact_law.check_exact(decoder, problems=exact_problems(bug))


def test_every_verifier_bug_is_named_after_a_public_report_and_patches_a_verifier():
    assert len(NAMES) == len(set(NAMES)) >= 3
    for bug in verifier_zoo.BUGS:
        variant = bug.variant
        assert re.search(r"[\w.-]+/[\w.-]+#\d+|PR #\d+|no public report found", variant.source), variant.source
        assert variant.title and variant.effect and variant.patches
        assert variant.entry[0].__name__.startswith("verifiers.")


@pytest.mark.parametrize("name", NAMES)
def test_every_patch_applies_to_the_current_verifier_and_changes_it(name):
    variant = verifier_zoo.ZOO[name].variant
    decoder = variant.decoder()  # raises StalePatch if a line it replaces is gone
    entry_module, entry_name = variant.entry
    assert decoder is not getattr(entry_module, entry_name) and decoder.__name__ == f"{entry_name}_{name}"
    diff = variant.diff()
    for patch in variant.patches:
        assert f"--- a/{patch.module.__name__.replace('.', '/')}.py" in diff
    assert "\n+" in diff and "\n-" in diff and "(bug)" in diff


def test_a_patched_verifier_calls_the_patched_function_and_leaves_the_module_alone():
    """verify_block is patched in a copy of verifiers/block.py: the copy's decoder calls it, the real one does not."""
    from verifiers import block
    original = block.verify_block
    variant = verifier_zoo.ZOO["block_stops_at_first_failure"].variant
    problem = verifier_zoo.block_problems()[0]
    outputs = {}
    for label, decoder in [("bug", variant.decoder()), ("reference", variant.reference())]:
        draft, target = problem.models()
        runs = [tuple(decoder(np.array(problem.prompt), draft, target, 4, 3, np.random.default_rng(seed)))
                for seed in range(200)]
        outputs[label] = runs
    assert block.verify_block is original
    assert outputs["bug"] != outputs["reference"]  # same seeds, different tokens: the patch ran


def test_a_stale_verifier_patch_names_the_module_and_the_bug():
    from verifiers import block
    stale = bug_zoo.Variant("stale", "a bug against yesterday's verifier", "example/repo#1", "none",
                            (bug_zoo.Patch(block, "verify_block", "tau = 0", "tau = 1"),),
                            entry=(block, "block_speculative_sampling"))
    with pytest.raises(bug_zoo.StalePatch, match=r"bug 'stale': verifiers.block.verify_block no longer contains"):
        stale.decoder()


@pytest.mark.parametrize("name", [name for name in NAMES if verifier_zoo.ZOO[name].chi_square_sees_it])
def test_check_lossless_catches_the_loud_bugs(name):
    result = lossless.check_lossless(verifier_zoo.ZOO[name].variant.decoder(), stop_at_failure=True)
    assert not result.passed and result.p_value < 1e-3, result.report


@pytest.mark.parametrize("name", NAMES)
def test_check_exact_fails_every_bug_at_the_total_variation_its_effect_quotes(name):
    bug = verifier_zoo.ZOO[name]
    check = exact_check(name)
    assert not check.passed, check.report
    assert check.max_tv == pytest.approx(bug.exact_tv, abs=5e-4), check.report
    if not bug.chi_square_sees_it:  # the subtle ones: below what a chi-square at 8,700 runs sees
        assert check.max_tv < 0.05
    if bug.exact_tv < exact_law.TV_TOLERANCE:  # a law that is right but for outputs of probability zero
        assert any(result.impossible for result in check.results), check.report


REFERENCES = list({(bug.variant.entry, bug.variant.settings): bug.variant.name for bug in verifier_zoo.BUGS}.values())


@pytest.mark.parametrize("name", REFERENCES)  # one per verifier and settings
def test_the_references_pass_the_exact_check_and_the_chi_square(name):
    check = exact_check(name, reference=True)
    assert check.passed, check.report
    result = lossless.check_lossless(verifier_zoo.ZOO[name].variant.reference())
    assert result.passed, result.report


def test_typical_acceptance_is_lossy_by_design_every_draft_kept_and_the_output_follows_p():
    exhibit = verifier_zoo.TYPICAL_ACCEPTANCE
    problem = exhibit.example()
    law = exact_law.exact_output_law(exhibit.decoder, problem).law
    first_two = {}
    for tokens, probability in law.items():
        first_two[tokens[:2]] = first_two.get(tokens[:2], 0) + float(probability)
    for tokens, probability in first_two.items():  # both drafts kept: the first two tokens are p x p
        assert probability == pytest.approx([0.9, 0.1][tokens[0]] * [0.9, 0.1][tokens[1]], abs=1e-6)
    check = exact_law.check_exact(exhibit.decoder, problems=[problem])
    assert not check.passed and check.max_tv == pytest.approx(0.45, abs=1e-6), check.report
    assert not lossless.check_lossless(exhibit.decoder, stop_at_failure=True).passed


def test_typical_acceptance_moves_the_law_for_every_threshold_that_keeps_a_draft_and_the_exact_verifiers_do_not():
    """q = (0.6, 0.4), p = (0.9, 0.1): Medusa's defaults and a zero threshold keep every draft (0.45); a threshold of
    0.5 keeps only token 0's drafts, further from q; one of 0.7 keeps none, the target's own tokens (0)."""
    tv = {setting: verifier_zoo.typical_total_variation(*setting) for setting in [(0.09, 0.3), (0, 0), (0.5, 1.0),
                                                                                 (0.7, 2.0)]}
    assert tv[(0.09, 0.3)] == pytest.approx(0.45, abs=1e-6) and tv[(0, 0)] == pytest.approx(0.45, abs=1e-6)
    assert tv[(0.5, 1.0)] > 0.5 and tv[(0.7, 2.0)] == 0
    problem = verifier_zoo.typical_example()
    for exact in (sampling.speculative_sampling, block_speculative_sampling):
        assert exact_law.check_exact(exact, problems=[problem]).max_tv <= exact_law.TV_TOLERANCE
    with pytest.raises(ValueError, match="epsilon and delta must be non-negative numbers, got -0.1 and 0.3"):
        verifier_zoo.typical_total_variation(-0.1, 0.3)


def test_the_readme_and_the_docstrings_quote_the_zoo_s_range_of_total_variation():
    """The smallest and largest exact_tv of the zoo (each measured above), as the README and exact_law say them."""
    measured = [bug.exact_tv for bug in verifier_zoo.BUGS]
    assert 0.0 in measured  # the bug that only reaches an output of probability zero
    quoted = f"{min(tv for tv in measured if tv):.2f}-{max(measured):.2f}"
    assert quoted == "0.02-0.61"
    readme = " ".join((REPO / "README.md").read_text().split())
    assert f"real bugs are off by {quoted} or reach a token of probability zero" in readme
    low, high = quoted.split("-")
    for doc in (" ".join(exact_law.__doc__.split()), " ".join(verifier_zoo.__doc__.split())):
        assert f"{low} to {high}" in doc and "probability zero" in doc


def test_what_typical_acceptance_buys_for_its_total_variation():
    """At Medusa's thresholds every draft of typical_example() is kept (3 tokens a call, K = 2) where Algorithm 2
    keeps fewer, at a total variation of 0.45; at thresholds high enough to be lossless it keeps none (1 a call)."""
    typical, exact = verifier_zoo.typical_tokens_per_call(0.09, 0.3)
    assert typical == 3.0 and 1.5 < exact < 2.5 and verifier_zoo.typical_total_variation(0.09, 0.3) > 0.4
    lossless_typical, _ = verifier_zoo.typical_tokens_per_call(0.7, 2.0)
    assert lossless_typical == 1.0 and verifier_zoo.typical_total_variation(0.7, 2.0) == pytest.approx(0, abs=1e-12)
