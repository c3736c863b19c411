"""check_lossless, the chi-square checker a user runs on any decoder, passes every drafter made from the target at
temperature 1 with K = 2, on a tiny random GPT-2 whose features drive the drafter (the exact oracle proves the same
in each drafter's own tests; this is the check a reader runs on their own drafter)."""

import functools

import numpy as np
import pytest

import sampling
from classroom import lossless
from drafters.eagle import EagleDraft, init_head
from drafters.eagle2 import EagleTree
from drafters.eagle3 import Eagle3Draft, vocabulary_d2t
from drafters.eagle3 import init_head as init_eagle3_head
from drafters.frspec import ReducedVocabularyEagle
from drafters.early_exit import EarlyExit
from drafters.kangaroo import AdaptedEarlyExit, init_adapter
from drafters.medusa import MedusaDraft, init_heads
from gpt2_cases import random_params
from helpers import TINY, GPT2Problem, TinyGPT2Context, count_reused_rows
from verifiers.tree import tree_speculative_sampling

PARAMS = random_params(TINY, 3)
RNG = np.random.default_rng(5)
EAGLE_HEAD = init_head(TINY, RNG)
EAGLE_HEAD["fc"]["w"] *= 10  # far from uniform, so that the drafts' p differ from token to token
MEDUSA_HEADS = init_heads(TINY, 2, RNG)
for medusa_head in MEDUSA_HEADS["heads"]:
    medusa_head["w"] = RNG.standard_normal(medusa_head["w"].shape).astype(np.float32)  # trained heads are not zero
ADAPTER = init_adapter(TINY, RNG, PARAMS["ln_f"])
ADAPTER["attn"]["c_proj"]["w"] = RNG.standard_normal(ADAPTER["attn"]["c_proj"]["w"].shape).astype(np.float32)
EAGLE3_HEAD = init_eagle3_head(TINY, RNG, draft_vocab_size=2, n_taps=2)  # the tiny target's 2 blocks, ids 0 and 2
EAGLE3_HEAD["lm_head"]["w"] *= 10

CHAIN = sampling.speculative_sampling
TREE = functools.partial(tree_speculative_sampling, n_drafts=2, drafts="dynamic")
DRAFTERS = {
    "EAGLE chain": (lambda target: EagleDraft(target, EAGLE_HEAD), CHAIN),
    "EAGLE-2 tree": (lambda target: EagleTree(target, EAGLE_HEAD, n_nodes=3), TREE),
    "EAGLE-3 chain": (lambda target: Eagle3Draft(target, EAGLE3_HEAD, 3, vocabulary_d2t([0, 2]), (1, 2)), CHAIN),
    "EAGLE-3 tree": (lambda target: Eagle3Draft(target, EAGLE3_HEAD, 3, vocabulary_d2t([0, 2]), (1, 2)), TREE),
    "FR-Spec reduced vocabulary": (lambda target: ReducedVocabularyEagle(target, EAGLE_HEAD, 3, [0, 2]), CHAIN),
    "Medusa chain": (lambda target: MedusaDraft(target, MEDUSA_HEADS), CHAIN),
    "Medusa tree": (lambda target: MedusaDraft(target, MEDUSA_HEADS, n_nodes=3), TREE),
    "early exit": (lambda target: EarlyExit(target, exit_layer=1), CHAIN),
    "Kangaroo": (lambda target: AdaptedEarlyExit(target, ADAPTER, exit_layer=1), CHAIN),
}


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_check_lossless_passes_every_drafter_at_temperature_1(monkeypatch, name):
    drafter, decoder = DRAFTERS[name]
    problem = GPT2Problem(f"tiny GPT-2, {name}, K=2, N=3", drafter, TinyGPT2Context(PARAMS), (1, 2), 3, 2,
                          sampling.SamplingSettings(), True, 3000)
    reused = count_reused_rows(monkeypatch)
    check = lossless.check_lossless(decoder, problems=[problem])
    assert check.passed, check.report
    assert (max(reused, default=0) > 0) == (name in ("early exit", "Kangaroo"))  # theirs start at the exit


def test_the_same_check_fails_the_eagle_chain_under_the_zoos_residual_bug():
    from classroom.drafter_zoo import RESIDUAL_AT_REJECTED_TOKEN

    problem = GPT2Problem("tiny GPT-2, EAGLE chain, K=2, N=3", DRAFTERS["EAGLE chain"][0], TinyGPT2Context(PARAMS),
                          (1, 2), 3, 2, sampling.SamplingSettings(), True, 3000)
    check = lossless.check_lossless(RESIDUAL_AT_REJECTED_TOKEN.decoder(), problems=[problem])
    assert not check.passed, check.report
