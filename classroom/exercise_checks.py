"""Automatic checks for notebook 9's exercises: `check(number, answer)` says whether an answer is right.

It returns "correct", "unsolved" (the answer is still the notebook's stub, which raises NotImplementedError
or is None) or "not yet: ..." with a hint. The checks test properties and compare with simulations or with
sampling.py where they can, rather than with a copy of the solution; tests/test_exercises.py runs them on
the solutions (notebooks/solutions/), on the textbook formulas a student would type, and on wrong answers.
A correct formula that divides 0 by 0 at an edge (alpha = 1, p(x) = q(x) = 0) gets a hint about that edge,
never a bare exception. `blind_bugs()` and `blind_diff(label)` hand out exercise 11's quiz: five bugs that notebook
7 does not show, patched into the reference as the bug zoo patches its own, unnamed. "block" is notebook 10's exercise (block verification's expected drafts on a toy).
"""

import math
import re
from fractions import Fraction
from itertools import product

import numpy as np

import sampling
from classroom import bug_zoo, lossless
from speedup.stats import SpeculativeStats, expected_speedup

GRID = [(alpha, K) for alpha in (0.0, 0.3, 0.75, 0.99, 1.0) for K in (1, 2, 4, 8)]


def close(a, b, tolerance=1e-6):
    return a is not None and math.isclose(float(a), float(b), rel_tol=tolerance, abs_tol=tolerance)


ALPHA_ONE = ("alpha = 1 divides 0 by 0 in a closed form over 1 - alpha, such as (1 - alpha^(K+1)) / (1 - alpha): "
             "every draft is accepted there, so every loop yields exactly K + 1 tokens (the sum 1 + alpha + ... + "
             "alpha^K at alpha = 1); treat alpha = 1 apart")


def at(function, alpha, *args):
    """function(alpha, *args), with a textbook formula's ZeroDivisionError at alpha = 1 turned into the hint."""
    try:
        return function(alpha, *args)
    except ZeroDivisionError:
        if alpha == 1:
            raise AssertionError(ALPHA_ONE) from None
        raise


def simulated_loop_tokens(alpha, K, rng, n=200_000):  # -> the tokens of n loops
    accepted = rng.random((n, K)) < alpha
    return 1 + np.cumprod(accepted, axis=1).sum(axis=1)  # 1 + the drafts accepted before the first rejection


def check_tokens_per_loop(tokens_per_loop):
    rng = np.random.default_rng(0)
    for alpha, K in [(0.5, 2), (0.8, 4)]:
        simulated = simulated_loop_tokens(alpha, K, rng).mean()
        assert abs(tokens_per_loop(alpha, K) - simulated) < 0.02, (
            f"alpha={alpha}, K={K}: a simulation gives {simulated:.3f} tokens per loop, you give "
            f"{tokens_per_loop(alpha, K)}. A loop yields 1 + the drafts accepted before the first rejection")
    assert close(at(tokens_per_loop, 1.0, 4), 5), "alpha = 1: every draft is accepted, so K + 1 tokens"
    assert close(at(tokens_per_loop, 0.0, 4), 1), "alpha = 0: the first draft is rejected, and the correction comes"


def check_speedup(speedup):
    for alpha, K in GRID:
        for c, v in [(0.05, 1.0), (0.3, 1.0), (0.1, 1.8)]:
            assert close(at(speedup, alpha, c, K, v), expected_speedup(alpha, c, K, v)), (
                f"alpha={alpha}, c={c}, K={K}, v={v}: a loop costs K draft steps and one verification, K c + v "
                f"decode steps, and yields the tokens of exercise 1")
    assert close(speedup(0.6, 0.2, 1), 1.6 / 1.2), "with the default v = 1, K = 1 gives (1 + alpha) / (1 + c)"


def random_pair(rng, n_vocab=6, shared_zero=False):
    """A draft p and a target q with zeros where the other has mass; with shared_zero, a token both rule out."""
    p, q = rng.random(n_vocab) * (rng.random(n_vocab) > 0.3), rng.random(n_vocab) * (rng.random(n_vocab) > 0.3)
    p[0], q[1] = 1.0, 1.0  # never all zero
    both_zero = (p == 0) & (q == 0)
    q[both_zero] = 0.5  # no shared zero unless asked for
    if shared_zero:
        p[-1] = q[-1] = 0.0
    return p / p.sum(), q / q.sum()


def check_acceptance_rate(acceptance_rate):
    rng = np.random.default_rng(1)
    for _ in range(20):
        p, q = random_pair(rng)
        drafts = rng.choice(len(p), size=200_000, p=p)
        measured = np.mean(rng.random(len(drafts)) < np.minimum(1, q[drafts] / p[drafts]))
        assert abs(acceptance_rate(p, q) - measured) < 0.01, (
            f"p={np.round(p, 2)}, q={np.round(q, 2)}: drafts from p are accepted {measured:.3f} of the time, you "
            f"give {acceptance_rate(p, q)}. A draft x comes with probability p(x) and is then kept with "
            f"probability min(1, q(x)/p(x)): add up over x the chance that x is drafted and kept")
        assert close(acceptance_rate(p, q), 1 - 0.5 * np.abs(p - q).sum(), 1e-9), "is it 1 - TV(p, q)?"
    p, q = random_pair(rng, shared_zero=True)
    answer = float(acceptance_rate(p, q))
    assert not math.isnan(answer), (
        f"p={np.round(p, 2)}, q={np.round(q, 2)}: you give nan. Where p(x) = q(x) = 0, q(x)/p(x) is 0/0, but the "
        f"term p(x) min(1, q(x)/p(x)) is 0: the draft never proposes x. Write the term as min(p(x), q(x)), "
        f"which needs no division")
    assert close(answer, 1 - 0.5 * np.abs(p - q).sum(), 1e-9), f"p={np.round(p, 2)}, q={np.round(q, 2)}: you give {answer}"


def check_pays(pays):
    for alpha in (0.0, 0.04, 0.2, 0.45, 0.7, 0.85, 0.97, 1.0):
        for c in (0.0, 0.05, 0.3, 0.5, 0.9, 1.0):
            if alpha == c:  # a tie: at best a speedup of exactly 1, on the edge either answer describes
                continue
            truth = any(expected_speedup(alpha, c, K) > 1 for K in range(1, 64))
            assert bool(pays(alpha, c)) == truth, (
                f"alpha={alpha:.2f}, c={c}: {'some K gives' if truth else 'no K gives'} a speedup above 1. "
                f"Compare K = 1, (1 + alpha) / (1 + c), with the general case 1 + alpha + ... + alpha^K <= 1 + K alpha")


def check_best_K(best_K):
    # v(m): the target's call scoring m tokens, in decode steps (v(1) = 1); a loop of K drafts scores K + 1
    cases = [(0.8, 0.1, lambda m: 1.0), (0.8, 0.1, lambda m: 1 + 0.15 * (m - 1)), (0.6, 0.3, lambda m: 1.0),
             (0.95, 0.02, lambda m: 1 + 0.02 * (m - 1)), (0.2, 0.3, lambda m: 1.0), (0.85, 0.05, lambda m: max(1, m / 4)),
             (0.9, 0.02, lambda m: 1.0 if m <= 5 else 1 + 0.4 * (m - 5))]
    for alpha, c, verify_cost in cases:
        speedups = {K: expected_speedup(alpha, c, K, verify_cost(K + 1)) for K in range(1, 33)}
        best = max(speedups, key=speedups.get)
        expected = best if speedups[best] > 1 else 0
        assert best_K(alpha, c, verify_cost) == expected, (
            f"alpha={alpha}, c={c}, v(m) = {[round(verify_cost(m), 2) for m in range(1, 8)]} for m = 1..7: the best "
            f"K in 1..32 is {best} (speedup {speedups[best]:.2f}); K drafts make the target score K + 1 tokens, so "
            f"their loop costs K c + v(K + 1); answer 0 when no K beats plain decoding")


def simulated_step(drawn_from, p, q, rng, n=200_000):
    """One accept/reject step run n times with the kit's own rule, drafts drawn from drawn_from."""
    drafts = rng.choice(len(q), size=n, p=drawn_from)
    ratio = np.minimum(1, q[drafts] / np.where(p[drafts] > 0, p[drafts], np.inf))
    residual = sampling.max_fn(q - p, fallback=q)
    out = np.where(rng.random(n) < ratio, drafts, rng.choice(len(q), size=n, p=residual / residual.sum()))
    return np.bincount(out, minlength=len(q)) / n


def check_one_step_output(one_step_output):
    rng = np.random.default_rng(2)
    for _ in range(5):
        p, q = random_pair(rng)
        argmax = np.eye(len(p))[np.argmax(p)]
        for drawn_from, judged_with in [(p, p), (argmax, argmax), (argmax, p)]:
            yours = np.asarray(one_step_output(drawn_from, judged_with, q), dtype=float)
            simulated = simulated_step(drawn_from, judged_with, q, rng)
            assert yours.shape == q.shape and abs(yours.sum() - 1) < 1e-9, "return a distribution over the vocabulary"
            assert np.abs(yours - simulated).max() < 0.01, (
                f"p={np.round(p, 2)}, q={np.round(q, 2)}, drafts {'argmax' if drawn_from is argmax else 'from p'}, "
                f"judged with {'one-hot' if judged_with is argmax else 'p'}: a simulation gives "
                f"{np.round(simulated, 3)}, you give {np.round(yours, 3)}")


def check_corrected_speedup(corrected_speedup):
    for alpha, K in GRID:
        assert close(at(corrected_speedup, alpha, 0.1, K), expected_speedup(alpha, 0.1, K)), (
            f"alpha={alpha}, K={K}: count every token a target call yields, the accepted drafts and one more")


def check_underestimate(underestimate):
    published = 0.5 * (1 - 0.5**4) / (1 - 0.5) / (4 * 0.1 + 1)
    true = expected_speedup(0.5, 0.1, 4)
    if close(underestimate, true / published, 1e-2):
        return  # the ratio answers "by how much" too
    assert not close(underestimate, published - true, 1e-2), "the sign: the true speedup minus the write-up's"
    assert close(underestimate, true - published, 1e-2), (
        "give the true speedup minus the write-up's (or their ratio): the two differ by the dropped token's "
        "share, one token over the loop's cost K c + 1")


def check_prompt_lookup(PromptLookupDraft):
    stats = SpeculativeStats()
    settings = sampling.SamplingSettings()
    lookup = PromptLookupDraft(n_vocab=8)
    drafts, p = lookup.propose(np.array([1, 2, 3, 4, 5, 1, 2]), 3, settings, np.random.default_rng(0), stats)
    assert list(drafts) == [3, 4, 5], f"after ... 1, 2 the text once continued 3, 4, 5: you propose {list(drafts)}"
    assert np.asarray(p).shape == (3, 8) and np.allclose(np.asarray(p)[np.arange(3), drafts], 1), (
        "p must be the distribution each draft was drawn from: one-hot at the proposed token")
    drafts, p = lookup.propose(np.array([1, 2, 3, 4]), 3, settings, np.random.default_rng(0), stats)
    assert len(drafts) == 0 and np.asarray(p).shape == (0, 8), "no earlier match: propose nothing, p of shape (0, 8)"
    drafts, _ = lookup.propose(np.array([5, 6, 7, 5, 6]), 4, settings, np.random.default_rng(0), stats)
    assert 0 < len(drafts) <= 4 and drafts[0] == 7, "propose at most K tokens, from after the latest earlier match"

    def decoder(x, draft_model, target_model, N, K, rng, **kwargs):
        return sampling.speculative_sampling(x, PromptLookupDraft(target_model.n_vocab), target_model, N, K, rng,
                                             **kwargs)

    verdict = lossless.check_lossless(decoder, sample_scale=0.3, stop_at_failure=True)
    assert verdict.passed, "speculative sampling with your draft is not lossless:\n" + verdict.report


def check_tokens_at_one_step(tokens_at_one_step):
    assert close(tokens_at_one_step(989e12, 3.35e12, 2), 989e12 * 2 / (2 * 3.35e12), 1e-3), (
        "an H100 in bfloat16 (989 TFLOP/s, 3.35 TB/s, 2 bytes a weight): each weight read from memory takes "
        "bytes_per_parameter / bandwidth seconds; each token multiplies it once, 2 flops, in 2 / flops seconds")
    assert close(tokens_at_one_step(80e9, 30e9, 4), 80e9 * 4 / (2 * 30e9), 1e-3)


def check_alpha_from_origins(alpha_from_origins):
    rng = np.random.default_rng(3)
    for _ in range(20):
        origins = rng.choice(["accepted", "corrected", "bonus", "target"], size=30, p=[0.6, 0.2, 0.15, 0.05]).tolist()
        stats = SpeculativeStats()
        for origin in origins:
            stats.record_tokens(origin)
        assert close(alpha_from_origins(origins), stats.acceptance_rate, 1e-12), (
            "each corrected token is one judged draft that was rejected; bonus tokens and target steps judge none")
    assert alpha_from_origins(["bonus", "target"]) is None, "nothing judged: return None"


# ---- 11: the blind bug quiz ----------------------------------------------------------------------------------

PROOF_STEPS = {
    1: "the drafts are not drawn from the p that enters q/p and (q - p)+",
    2: "the acceptance test is not min(1, q/p)",
    3: "the correction after a rejection is not drawn from (q - p)+",
    4: "the bonus token after K acceptances is not drawn from q given all K drafts",
    5: "the uniform of the acceptance test is not independent of the draft (random numbers reused)",
    6: "the target's q is not conditioned on the accepted text (its cache not rolled back)",
    7: "the target's q is not the distribution the request asked for (its settings)",
    8: "none: the output follows q exactly, only the speed suffers",
}
QUIZ_SOURCE = "none: a textbook mistake written for the quiz, not one of the zoo's public reports"
QUIZ = [  # (a bug notebook 7 does not show, the proof step it breaks)
    (bug_zoo.Variant("sharpened_drafts", "drafts drawn from p squared", QUIZ_SOURCE, "step 1", (bug_zoo.Patch(
        sampling, "draw_drafts", "x_draft = np.append(x_draft, sample(p[-1], rng))",
        "x_draft = np.append(x_draft, sample(p[-1] ** 2 / np.sum(p[-1] ** 2), rng))  # (bug)"),)), 1),
    (bug_zoo.Variant("accept_with_q", "a draft accepted with probability q alone", QUIZ_SOURCE, "step 2", (bug_zoo.Patch(
        sampling, "speculative_sampling", bug_zoo.ACCEPT_TEST, "if r < float(q[t][token]):  # (bug)"),)), 2),
    (bug_zoo.Variant("correction_from_p_minus_q", "the correction from (p - q)+", QUIZ_SOURCE, "step 3", (bug_zoo.Patch(
        sampling, "speculative_sampling", bug_zoo.CORRECTION,
        "x = np.append(x, sample(max_fn(p[t] - q[t], fallback=q[t]), rng))  # (bug)"),)), 3),
    (bug_zoo.Variant("bonus_from_first_row", "the bonus token from q given no draft", QUIZ_SOURCE, "step 4", (bug_zoo.Patch(
        sampling, "speculative_sampling", "x = np.append(x, sample(q[K_n], rng))",
        "x = np.append(x, sample(q[0], rng))  # (bug)"),)), 4),
    (bug_zoo.Variant("reseeded_per_loop", "the generator re-seeded at every loop", QUIZ_SOURCE, "step 5", (bug_zoo.Patch(
        sampling, "speculative_sampling", "stats.loops += 1",
        "stats.loops += 1\nrng = np.random.default_rng(n)  # (bug)"),)), 5),
]
QUIZ_BUGS = {variant.name: step for variant, step in QUIZ}
LABELS = "ABCDE"


def quiz_variants():  # label -> the quiz's Variant, in an order shuffled once and for all (seed 9)
    variants = [variant for variant, _ in QUIZ]
    order = np.random.default_rng(9).permutation(len(variants))
    return {label: variants[i] for label, i in zip(LABELS, order)}


def blind_bugs():
    """-> {"A": decoder, ..., "E": decoder}: the quiz's five decoders, named by their label only."""
    decoders = {}
    for label, variant in quiz_variants().items():
        decoder = variant.decoder()

        def blind(*args, decoder=decoder, **kwargs):
            return decoder(*args, **kwargs)

        blind.__name__ = blind.__qualname__ = f"decoder_{label}"
        decoders[label] = blind
    return decoders


def blind_diff(label):
    """Decoder `label`'s change to the reference, as a unified diff, with the zoo's "(bug)" comments removed."""
    diff = quiz_variants()[label].diff()
    return re.sub(r" *# \(bug\).*", "", diff)


def check_bug_quiz(answers):
    if not isinstance(answers, dict) or set(answers) != set(LABELS):
        raise AssertionError(f"answer with a dict {{label: proof step}} for the labels {list(LABELS)}")
    if all(answer is None for answer in answers.values()):
        raise NotImplementedError
    marks = []
    for label, variant in quiz_variants().items():
        if answers[label] is None:
            marks.append(f"{label} unanswered")
        elif answers[label] == QUIZ_BUGS[variant.name]:
            marks.append(f"{label} right")
        else:
            marks.append(f"{label} wrong (not step {answers[label]}: which distribution does its changed line draw "
                         f"from, or condition on?)")
    assert all(mark.endswith("right") for mark in marks), "; ".join(marks)


# ---- 12: the spread of the time for N tokens -------------------------------------------------------------------


def check_tokens_per_loop_variance(variance):
    rng = np.random.default_rng(4)
    for alpha, K in [(0.5, 2), (0.8, 4), (0.95, 8)]:
        simulated = simulated_loop_tokens(alpha, K, rng).var()
        assert abs(at(variance, alpha, K) - simulated) < 0.03 * simulated, (
            f"alpha={alpha}, K={K}: a simulation gives a variance of {simulated:.3f} tokens per loop, you give "
            f"{at(variance, alpha, K)}. The tokens T = 1 + min(G, K) with G geometric; P(T >= t) = alpha^(t-1) "
            f"for t = 1..K+1, and E[T^2] = sum over t of (2t - 1) P(T >= t)")
    assert close(at(variance, 1.0, 4), 0), "alpha = 1: every loop yields K + 1 tokens, no spread"
    assert close(at(variance, 0.0, 4), 0), "alpha = 0: every loop yields 1 token, no spread"


def simulated_loops(alpha, K, N, rng, runs=20_000):  # -> the loops each of `runs` runs needs for N tokens
    tokens = np.cumsum(simulated_loop_tokens(alpha, K, rng, runs * N).reshape(runs, N), axis=1)
    return (tokens < N).sum(axis=1) + 1  # a run needs at most N loops: each yields a token at least


def check_time_for_tokens(time_for_tokens):
    rng = np.random.default_rng(5)
    for alpha, K, c, v in [(0.8, 4, 0.1, 1.0), (0.5, 2, 0.05, 1.2), (0.95, 4, 0.1, 1.6), (1.0, 3, 0.1, 1.0),
                           (0.0, 2, 0.2, 1.0)]:
        loops = simulated_loops(alpha, K, 128, rng) * (K * c + v)  # the time in decode steps
        mean, spread = (float(value) for value in at(time_for_tokens, alpha, K, c, v, 128))
        assert abs(mean - loops.mean()) < 0.05 * loops.mean(), (
            f"alpha={alpha}, K={K}, c={c}, v={v}, N=128: a simulation takes {loops.mean():.2f} decode steps on "
            f"average, you give {mean:.2f}: about N / E[T] loops of K c + v steps each")
        assert abs(spread - loops.std()) <= 0.06 * loops.std() + 1e-9, (
            f"alpha={alpha}, K={K}, c={c}, v={v}, N=128: the simulated runs spread by {loops.std():.3f} decode steps "
            f"(a standard deviation), you give {spread:.3f}. The loops needed for N tokens have a variance of "
            f"about N Var[T] / E[T]^3 (the central limit theorem for renewals)")


# ---- 13: the batch size at which speculation stops paying ------------------------------------------------------


def roofline_seconds(rows, weight_bytes, bytes_per_parameter, bytes_per_second, flops_per_second):
    """A call multiplying `rows` rows by every weight: the longer of reading the weights and the arithmetic."""
    return max(weight_bytes / bytes_per_second, 2 * rows * weight_bytes / bytes_per_parameter / flops_per_second)


def roofline_break_even(weight_bytes, bytes_per_parameter, bytes_per_second, flops_per_second, alpha, c, K):
    """The batch size at which the roofline's speedup falls to 1, by bisection (0 if even a tiny batch loses)."""
    machine = (weight_bytes, bytes_per_parameter, bytes_per_second, flops_per_second)

    def speedup(B):
        v = roofline_seconds((K + 1) * B, *machine) / roofline_seconds(B, *machine)
        return expected_speedup(alpha, c, K, v)

    low, high = 1e-9, 1e9
    if speedup(low) <= 1:
        return 0.0
    for _ in range(200):
        middle = math.sqrt(low * high)
        low, high = (middle, high) if speedup(middle) > 1 else (low, middle)
    return high


def check_break_even_batch(break_even_batch):
    cases = [(3.1e9, 2, 3.35e12, 989e12, 0.8, 0.05, 4),  # a 1.5 B-parameter model in bfloat16 on an H100
             (6.2e9, 2, 3.35e12, 989e12, 0.8, 0.05, 4),  # the same machine, twice the model
             (498e6, 4, 30e9, 80e9, 0.7, 0.1, 4),  # GPT-2 124M in float32 on one core of a CPU
             (63e6, 4, 27e9, 40e9, 0.7, 0.28, 4),  # a small target on a slow core: B = 1 already loses
             (3.1e9, 2, 3.35e12, 989e12, 0.6, 0.1, 8), (3.1e9, 2, 3.35e12, 989e12, 0.3, 0.5, 4)]  # the last never pays
    for case in cases:
        expected = roofline_break_even(*case)
        yours = break_even_batch(*case)
        assert yours is not None and math.isclose(float(yours), expected, rel_tol=1e-3, abs_tol=1e-6), (
            f"weights {case[0]:.3g} bytes ({case[1]} a parameter), {case[2]:.3g} bytes/s, {case[3]:.3g} flop/s, "
            f"alpha={case[4]}, c={case[5]}, K={case[6]}: the roofline's speedup falls to 1 at B = {expected:.3g}, "
            f"you give {yours}. Verifying costs v = time((K + 1) B rows) / time(B rows); the speedup "
            f"E[T] / (K c + v) is 1 where v = E[T] - K c (0 if it is below 1 even for a tiny batch)")


# ---- 14: the acceptance rate a reported speedup implies ------------------------------------------------------


def check_implied_alpha(implied_alpha):
    for alpha in (0.0, 0.2, 0.5, 0.58, 0.8, 0.95):
        for c, K, v in [(0.0, 4, 1.0), (0.1, 4, 1.0), (0.05, 2, 1.3), (0.3, 8, 1.0)]:
            speedup = expected_speedup(alpha, c, K, v)
            yours = implied_alpha(speedup, c, K, v)
            assert close(yours, alpha, 1e-4), (
                f"c={c}, K={K}, v={v}: alpha = {alpha} gives a speedup of {speedup:.4f}, and your alpha for it is "
                f"{yours}. The speedup of exercise 2 grows with alpha, so one alpha in [0, 1] gives each speedup "
                f"between 1 / (K c + v) and (K + 1) / (K c + v): search for it (bisection will do)")
    assert close(implied_alpha(2.0, 0.0, 4), 0.5188, 1e-3), "the default v = 1: 2x at c = 0, K = 4"
    for unreachable in (5.01, 0.5):  # above (K + 1) / (K c + v) = 5, below 1 / (K c + v) = 1
        try:
            answer = implied_alpha(unreachable, 0.0, 4)
        except ValueError:
            continue
        raise AssertionError(f"a speedup of {unreachable} at c = 0, K = 4, v = 1 needs no alpha in [0, 1] (they give "
                             f"1x to 5x), but you give {answer}: raise ValueError")


# ---- notebook 10: block verification's expected drafts on a toy ------------------------------------------------


def block_expected_kept(p, q, K):  # -> E[drafts kept per loop], exact, for p and q the same after every prefix
    """Block verification (Sun et al.) over every draft sequence: b_i, r_i, h_i, then E[tau] = sum_i i P(tau = i)."""
    total = Fraction(0)
    for drafts in product(range(len(p)), repeat=K):
        b = [Fraction(1)]
        for token in drafts:
            b.append(min(Fraction(1), b[-1] * q[token] / p[token]))
        r = [sum(max(b[i] * q[v] - p[v], Fraction(0)) for v in range(len(p))) for i in range(K + 1)]
        h = [None] + [r[i] / (r[i] + 1 - b[i]) if r[i] else Fraction(0) for i in range(1, K)] + [b[K]]
        kept = sum(i * h[i] * math.prod(1 - h[j] for j in range(i + 1, K + 1)) for i in range(1, K + 1))
        total += math.prod(p[token] for token in drafts) * kept
    return total


def check_block_toy(answer):
    p, q = [Fraction(3, 4), Fraction(1, 4)], [Fraction(1, 4), Fraction(3, 4)]
    answer = Fraction(answer).limit_denominator(1000)
    assert answer != Fraction(3, 4), ("that is token verification's alpha + alpha^2; block verification keeps more "
                                      "where a later draft makes up for an earlier one")
    assert answer == block_expected_kept(p, q, 2), (
        "start from the pair ab, where b_2 = min(1, b_1 q(b) / p(b)), then weigh each pair's E[tau] by p of the pair")


EXERCISES = {1: check_tokens_per_loop, 2: check_speedup, 3: check_acceptance_rate, 4: check_pays, 5: check_best_K,
             6: check_one_step_output, 7: check_corrected_speedup, "7b": check_underestimate,
             8: check_prompt_lookup, 9: check_tokens_at_one_step, 10: check_alpha_from_origins, 11: check_bug_quiz,
             12: check_tokens_per_loop_variance, "12b": check_time_for_tokens, 13: check_break_even_batch,
             14: check_implied_alpha, "block": check_block_toy}


def check(number, answer, exercises=EXERCISES):
    """-> "correct", "unsolved" or "not yet: <hint>"; printed too, for the notebook. exercises: number -> its check
    (notebook 11's are classroom/drafter_exercises.py's)."""
    try:
        if answer is None:
            raise NotImplementedError
        exercises[number](answer)
        verdict = "correct"
    except NotImplementedError:
        verdict = "unsolved"
    except AssertionError as error:
        verdict = f"not yet: {error}"
    except Exception as error:  # a bug in the answer: say what, do not stop the notebook
        verdict = f"not yet: {type(error).__name__}: {error}"
    print(f"exercise {number}: {verdict}")
    return verdict
