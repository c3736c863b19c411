"""Bugs of the verifiers beyond Algorithm 2 (verifiers/) as bug_zoo's small patches, and one rule lossy by design.

Each bug is a few lines of today's verifier replaced (bug_zoo.Patch; bug_zoo.Variant with the verifier as its
entry and its settings bound, so every decoder here has speculative_sampling's signature): block verification's
three from vllm-ascend, recursive rejection over several drafts or a tree (multi_draft.recursive_rejection,
tree.top_k_tree) with llama.cpp's and sglang's, and the residual left un-updated between candidates, for which
no public report was found. Each report a source names is one we have read.

Some move the output law by less than lossless.check_lossless sees at its sample size (about 0.05 in total
variation), and one only reaches outputs of probability zero: classroom/exact_law.check_exact computes the law
exactly on small tables and fails every one. exact_tv is the largest total variation it measures over its default
problems and the bug's extra_problems() (tests/test_verifier_zoo.py measures it again); the effect texts quote it.
Together: 0.02 to 0.61, and 0 for the bug that only reaches an output of probability zero (the range the README
and exact_law's docstring quote; tests/test_verifier_zoo.py holds them to it).

TYPICAL_ACCEPTANCE is not a bug but a rule that trades the target's law for acceptance on purpose (Medusa's
typical acceptance, vLLM #5015): a labelled exhibit of what "lossy" means, next to the bugs that are lossy by
accident.
"""

import math
from dataclasses import dataclass

import numpy as np

from classroom import exact_law, lossless
from classroom.bug_zoo import Patch, Variant
from sampling import SamplingSettings, draw_drafts, is_real, sample, speculative_sampling, timed_probs
from speedup.stats import SpeculativeStats
from verifiers import block, multi_draft, tree
from verifiers.loop import Loop, decode

BLOCK = (block, "block_speculative_sampling")
# multi_draft_speculative_sampling is the tree's sampled mode: the tree's decoder runs the patched rules
SPECINFER = ((tree, "tree_speculative_sampling"), (("n_drafts", 2), ("replacement", True), ("drafts", "sampled")))
TOP_K_TREE = ((tree, "tree_speculative_sampling"), (("n_drafts", 2), ("drafts", "top_k")))
RECURSIVE_TEST = """
    if accepts(r, residual, p_prime, token):
        return i, residual
"""
RESIDUAL_UPDATE = "residual = next_residual(residual, p_prime)"
TAU = "tau = max((i for i in range(1, K + 1) if eta[i - 1] < h[i]), default=0)"


def block_problems():
    """One more problem for block verification: three drafts of a draft that proposes every token. On check_exact's
    own problems the drafts propose two tokens, and a draft that has no more mass than the target on either leaves
    b_tau q - p and q - p proportional, so the unscaled residual happens to be right there."""
    draft, target = lossless.random_context_table(3, 11), lossless.random_context_table(3, 12)
    return (lossless.Problem("plain callables, V=3, full draft, K=3, N=4", draft, target, (2, 0), 4, 3,
                             SamplingSettings(), False, n_samples=1500, n_joint=4),)


@dataclass(frozen=True)
class VerifierBug:
    variant: Variant
    exact_tv: float  # the largest total variation check_exact measures over its problems and extra_problems()
    chi_square_sees_it: bool  # whether lossless.check_lossless fails it at its default sample size and seed
    extra_problems: object = tuple  # () -> problems check_exact runs beside its default ones


BUGS = [
    VerifierBug(Variant(
        "block_residual_unscaled", "block verification's residual left unscaled",
        "vllm-project/vllm-ascend#7807 (fixed by PR #7808)",
        "after keeping tau < K drafts the token comes from norm((q_tau - p_tau)+), token verification's residual, "
        "not norm((b_tau q_tau - p_tau)+): where b_tau < 1 the tokens the draft favours are under-weighted "
        "(total variation 0.019 on block_problems(); none on check_exact's own problems)",
        (Patch(block, "verify_block", "return tau, max_fn(b[tau] * q[tau] - p[tau], fallback=q[tau])",
               "return tau, max_fn(q[tau] - p[tau], fallback=q[tau])  # (bug) b_tau left out"),),
        entry=BLOCK), 0.0194, False, block_problems),
    VerifierBug(Variant(
        "block_running_product", "block verification's acceptance reduced to a running product",
        "vllm-project/vllm-ascend PR #7603 (fixed by PR #7808)",
        "tau is the largest i whose running product b_i = min(1, prod q/p) passes its uniform, without the residual "
        "mass r_i in h_i = r_i / (r_i + 1 - b_i): a prefix is kept with the wrong probability (total variation "
        "0.29 on block_problems(), 0.024 on check_exact's own). vllm-ascend also compared b_i with a running "
        "product of the uniforms; the zoo keeps one uniform per position, which the exact oracle follows",
        (Patch(block, "verify_block", TAU,
               "tau = max((i for i in range(1, K + 1) if eta[i - 1] < b[i]), default=0)  # (bug) b_i for h_i"),),
        entry=BLOCK), 0.2915, True, block_problems),
    VerifierBug(Variant(
        "block_stops_at_first_failure", "block verification stopping at the first failed test",
        "vllm-project/vllm-ascend PR #11985 (a review asked for it)",
        "tau is the number of leading drafts that pass their tests h_i, as in token verification, but h_i is block "
        "verification's: a block whose early draft fails is cut short though the rule keeps it, and the residual "
        "then over-weights what the kept drafts already supplied (total variation 0.61 on block_problems(), 0.025 "
        "on check_exact's own)",
        (Patch(block, "verify_block", TAU, """
            tau = 0  # (bug) stop at the first failed test, as token verification does
            while tau < K and eta[tau] < h[tau + 1]:
                tau += 1
            """),),
        entry=BLOCK), 0.6074, True, block_problems),
    VerifierBug(Variant(
        "residual_not_updated", "several candidates scored without updating the residual",
        "no public report found (SpecInfer's rule, Miao et al. 2023, with its update left out)",
        "every candidate is tested against q itself and a rejection's residual is norm((q - p')+) of q, not of the "
        "last residual: a second candidate is accepted as if the first had never taken its share, so tokens "
        "drafted often are over-weighted (total variation 0.15 on check_exact's problems)",
        (Patch(multi_draft, "recursive_rejection", RECURSIVE_TEST + RESIDUAL_UPDATE, """
            if accepts(r, q, p_prime, token):  # (bug) every candidate against q itself
                return i, residual
            residual = next_residual(q, p_prime)  # (bug) the residual of q, never of the last residual
            """),),
        entry=SPECINFER[0], settings=SPECINFER[1]), 0.1504, True),
    VerifierBug(Variant(
        "top_k_scored_as_sampled", "top-k branches scored with the sampled-draft ratio min(1, q/p)",
        "ggml-org/llama.cpp examples/speculative: branches of the draft's most likely tokens (PR #3624) tested "
        "with r <= p_tgt / p_dft and the residual max(0, p_tgt - p_dft) (PR #5625)",
        "the children of a node are the draft's k most likely tokens, chosen, not drawn from p, but they are "
        "accepted with min(1, q'/p) and rejected into (q' - p)+ as if drawn: the chosen tokens are under-weighted "
        "where p > q' and the rest of q' over-weighted (total variation 0.22 on check_exact's problems)",
        (Patch(tree, "top_k_tree", "expand(tree.add_choice(node, token), [*path, token])", """
            child = tree.add_choice(node, token)
            tree.candidates[node][-1] = (child, p)  # (bug) a chosen child scored as if drawn from p
            expand(child, [*path, token])
            """),),
        entry=TOP_K_TREE[0], settings=TOP_K_TREE[1]), 0.2180, True),
    VerifierBug(Variant(
        "zero_uniform_accepts_impossible", "a uniform of exactly 0 accepting a draft of target probability 0",
        "sgl-project/sglang#35771",
        "the test u <= q'(c) / p'(c) accepts a candidate with q'(c) = 0 when u = 0.0, which numpy's random() can "
        "return: an output the target rules out, with probability 2^-53 per test (total variation 0; check_exact "
        "reaches the output and fails it). llama.cpp's examples/speculative tests r <= p_tgt / p_dft too",
        (Patch(multi_draft, "recursive_rejection", RECURSIVE_TEST, """
            if r <= min(1.0, float(residual[token]) / float(p_prime[token])):  # (bug) <= takes q'(c) = 0 at r = 0
                return i, residual
            """),),
        entry=TOP_K_TREE[0], settings=TOP_K_TREE[1]), 0.0, False),
]

ZOO = {bug.variant.name: bug for bug in BUGS}


# ---- lossy by design: Medusa's typical acceptance ---------------------------------------------------------


def typical_threshold(q, epsilon, delta):  # [n_vocab] -> the probability a draft must exceed under q
    """min(epsilon, delta exp(-H(q))): Medusa's posterior_threshold and posterior_alpha (defaults 0.09 and 0.3)."""
    positive = q[q > 0].astype(np.float64)
    entropy = float(-(positive * np.log(positive)).sum())
    return min(epsilon, delta * math.exp(-entropy))


def typical_acceptance_sampling(x, draft_model, target_model, N, K, rng=None, *, epsilon=0.09, delta=0.3,
                                temperature=1.0, top_k=0, top_p=1.0, stats=None, progress=None):
    """LOSSY BY DESIGN. Medusa's typical acceptance (Cai et al. 2024, arXiv 2401.10774) on Algorithm 2's loop:
    keep the drafts while the target gives each more than typical_threshold, then draw one token from q.

    A draft the target finds plausible is kept whatever the draft's own p says, so the output follows the draft
    wherever both are plausible: with q = (0.6, 0.4) and p = (0.9, 0.1) every draft is kept and the tokens
    follow p. At temperature 0 it is greedy decoding (only the argmax exceeds the threshold).
    """
    settings = SamplingSettings(temperature, top_k, top_p)

    def one_loop(x, K_n, rng, stats):  # -> Loop: the typical drafts, then the target's own token
        drafts, _ = draw_drafts(draft_model, x, K_n, settings, rng, stats)
        q = timed_probs(target_model, np.append(x, drafts), len(drafts) + 1, settings, stats, "target")
        t = 0  # keep the drafts while the target finds each typical: no uniform, no ratio, no residual
        while t < len(drafts) and q[t][drafts[t]] > typical_threshold(q[t], epsilon, delta):
            t += 1
        return Loop(len(drafts), list(drafts[:t]), sample(q[t], rng), rejected=t < len(drafts))

    return decode(x, [draft_model, target_model], N, K, rng, stats, progress, one_loop)


def typical_example():
    """q = (0.6, 0.4) and p = (0.9, 0.1) in every context, K = 2, N = 3: both tokens exceed the threshold
    min(0.09, 0.3 exp(-H(q))) = 0.09, so both drafts are always kept and follow p; only the third token is q's."""
    def constant(probs):
        return lossless.ContextTable(np.broadcast_to(np.log(np.float32(probs)), (2, 2, 2)))

    return lossless.Problem("q = (0.6, 0.4), p = (0.9, 0.1), K=2, N=3", constant([0.9, 0.1]), constant([0.6, 0.4]),
                            (0,), 3, 2, SamplingSettings(), False, n_samples=1500)


def typical_total_variation(epsilon, delta, problem=None):  # -> a float, 0 for an exact verifier
    """The exact total variation between typical acceptance's output (thresholds epsilon and delta) and the
    target's law, by classroom/exact_law's oracle on problem (None: typical_example()).

    A threshold above every probability the target gives rejects every draft, and then (only then) the output is
    the target's: lossless and useless."""
    if not all(is_real(value) and value >= 0 for value in (epsilon, delta)):
        raise ValueError(f"epsilon and delta must be non-negative numbers, got {epsilon!r} and {delta!r}")
    problem = typical_example() if problem is None else problem
    return exact_law.check_exact(typical_acceptance_sampling, problems=[problem], epsilon=epsilon,
                                 delta=delta).max_tv


def typical_tokens_per_call(epsilon, delta, problem=None, runs=400, seed=0):  # -> (typical's, Algorithm 2's)
    """What typical acceptance buys for its total variation: tokens per target call, typical acceptance with
    thresholds epsilon and delta against speculative sampling, each decoding problem's N tokens `runs` times
    (problem None: typical_example(), where Algorithm 2 accepts a draft with probability sum min(p, q) = 0.7)."""
    problem = typical_example() if problem is None else problem
    rng, per_call = np.random.default_rng(seed), []
    for decoder, options in ((typical_acceptance_sampling, {"epsilon": epsilon, "delta": delta}),
                             (speculative_sampling, {})):
        stats = SpeculativeStats()
        for _ in range(runs):
            draft, target = problem.models()
            decoder(np.array(problem.prompt), draft, target, problem.N, problem.K, rng, stats=stats, **options)
        per_call.append(stats.tokens_per_target_call)
    return tuple(per_call)


@dataclass(frozen=True)
class LossyByDesign:
    """A rule that gives up the target's law on purpose, shown beside the bugs that do it by accident."""

    name: str
    source: str
    effect: str
    decoder: object
    example: object  # () -> the lossless.Problem that shows it


TYPICAL_ACCEPTANCE = LossyByDesign(
    "typical_acceptance", "vllm-project/vllm#5015 (typical acceptance trades quality for acceptance); "
    "SafeAILab/EAGLE#148 (EAGLE samples with strict speculative sampling, not Medusa's typical acceptance)",
    "drafts the target finds typical are kept as drawn from p: in typical_example() every draft is kept and the "
    "first two tokens follow p, (0.9, 0.1) where the target says (0.6, 0.4): total variation 0.45",
    typical_acceptance_sampling, typical_example)
