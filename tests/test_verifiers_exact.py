"""Every verifier beyond Algorithm 2 is exact: classroom/exact_law.check_exact computes its output law on small
tables (every draft, every choice of its random numbers) and finds the target's, up to float32 rounding, with no
output of target probability zero reachable. Its bugs are failed in tests/test_verifier_zoo.py."""

import functools

import pytest

from classroom import exact_law
from verifiers.block import block_speculative_sampling
from verifiers.multi_draft import multi_draft_speculative_sampling
from verifiers.tree import tree_speculative_sampling


def with_drafts(decoder, n_drafts, **keywords):  # n_drafts and the rest bound by keyword: the checker's signature
    return functools.partial(decoder, n_drafts=n_drafts, **keywords)


DECODERS = {
    "block verification": block_speculative_sampling,
    "2 drafts, without replacement (RSD)": with_drafts(multi_draft_speculative_sampling, 2),
    "2 drafts, with replacement (SpecInfer)": with_drafts(multi_draft_speculative_sampling, 2, replacement=True),
    "a tree of 2 sampled drafts": with_drafts(tree_speculative_sampling, 2, drafts="sampled"),
    "a tree of 3 drafts with replacement (candidates repeat)": with_drafts(tree_speculative_sampling, 3,
                                                                           replacement=True),
    "a top-2 tree (one-hot children)": with_drafts(tree_speculative_sampling, 2, drafts="top_k"),
    "a tree of 2 prompt-lookup matches": with_drafts(tree_speculative_sampling, 2, drafts="lookup"),
}


@pytest.mark.parametrize("name", DECODERS)
def test_the_exact_law_of_every_verifier_is_the_targets(name):
    check = exact_law.check_exact(DECODERS[name])
    assert check.passed and check.max_tv <= exact_law.TV_TOLERANCE, check.report
    assert len(check.results) == len(exact_law.default_exact_problems()) >= 4
