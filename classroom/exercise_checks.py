"""Automatic checks for notebook 9's exercises: `check(number, answer)` says whether an answer is right.

It returns "correct", "unsolved" (the answer is still the notebook's stub, which raises NotImplementedError
or is None) or "not yet: ..." with a hint. The checks test properties and compare with simulations or with
sampling.py where they can, rather than with a copy of the solution; tests/test_exercises.py runs them on
the solutions (notebooks/solutions/) and on wrong answers.
"""

import math
import numpy as np

import sampling
from classroom import lossless

GRID = [(alpha, K) for alpha in (0.0, 0.3, 0.75, 0.99, 1.0) for K in (1, 2, 4, 8)]


def close(a, b, tolerance=1e-6):
    return a is not None and math.isclose(float(a), float(b), rel_tol=tolerance, abs_tol=tolerance)


def simulated_tokens_per_loop(alpha, K, rng, n=200_000):
    accepted = rng.random((n, K)) < alpha
    return 1 + np.cumprod(accepted, axis=1).sum(axis=1).mean()  # drafts accepted before the first rejection


def check_tokens_per_loop(tokens_per_loop):
    rng = np.random.default_rng(0)
    for alpha, K in [(0.5, 2), (0.8, 4)]:
        simulated = simulated_tokens_per_loop(alpha, K, rng)
        assert abs(tokens_per_loop(alpha, K) - simulated) < 0.02, (
            f"alpha={alpha}, K={K}: a simulation gives {simulated:.3f} tokens per loop, you give "
            f"{tokens_per_loop(alpha, K)}. A loop yields 1 + the drafts accepted before the first rejection")
    assert close(tokens_per_loop(1.0, 4), 5), "alpha = 1: every draft is accepted, so K + 1 tokens (mind 0 / 0)"
    assert close(tokens_per_loop(0.0, 4), 1), "alpha = 0: the first draft is rejected, and the correction comes"


def check_speedup(speedup):
    for alpha, K in GRID:
        for c, v in [(0.05, 1.0), (0.3, 1.0), (0.1, 1.8)]:
            assert close(speedup(alpha, c, K, v), sampling.expected_speedup(alpha, c, K, v)), (
                f"alpha={alpha}, c={c}, K={K}, v={v}: a loop costs K draft steps and one verification, K c + v "
                f"decode steps, and yields the tokens of exercise 1")
    assert close(speedup(0.6, 0.2, 1), 1.6 / 1.2), "with the default v = 1, K = 1 gives (1 + alpha) / (1 + c)"


def random_pair(rng, n_vocab=6):
    p, q = rng.random(n_vocab) * (rng.random(n_vocab) > 0.3), rng.random(n_vocab) * (rng.random(n_vocab) > 0.3)
    p[0], q[1] = 1.0, 1.0  # never all zero
    return p / p.sum(), q / q.sum()


def check_acceptance_rate(acceptance_rate):
    rng = np.random.default_rng(1)
    for _ in range(20):
        p, q = random_pair(rng)
        drafts = rng.choice(len(p), size=200_000, p=p)
        measured = np.mean(rng.random(len(drafts)) < np.minimum(1, q[drafts] / p[drafts]))
        assert abs(acceptance_rate(p, q) - measured) < 0.01, (
            f"p={np.round(p, 2)}, q={np.round(q, 2)}: drafts from p are accepted {measured:.3f} of the time, you "
            f"give {acceptance_rate(p, q)}. Sum p(x) min(1, q(x)/p(x)) over x")
        assert close(acceptance_rate(p, q), 1 - 0.5 * np.abs(p - q).sum(), 1e-9), "is it 1 - TV(p, q)?"


def check_pays(pays):
    for alpha in (0.0, 0.04, 0.2, 0.45, 0.7, 0.85, 0.97, 1.0):
        for c in (0.0, 0.05, 0.3, 0.5, 0.9, 1.0):
            if alpha == c:  # a tie: at best a speedup of exactly 1, on the edge either answer describes
                continue
            truth = any(sampling.expected_speedup(alpha, c, K) > 1 for K in range(1, 64))
            assert bool(pays(alpha, c)) == truth, (
                f"alpha={alpha:.2f}, c={c}: {'some K gives' if truth else 'no K gives'} a speedup above 1. "
                f"Compare K = 1, (1 + alpha) / (1 + c), with the general case 1 + alpha + ... + alpha^K <= 1 + K alpha")


def check_best_K(best_K):
    cases = [(0.8, 0.1, lambda K: 1.0), (0.8, 0.1, lambda K: 1 + 0.15 * K), (0.6, 0.3, lambda K: 1.0),
             (0.95, 0.02, lambda K: 1 + 0.02 * K), (0.2, 0.3, lambda K: 1.0), (0.7, 0.05, lambda K: 0.8 + 0.25 * K)]
    for alpha, c, verify_cost in cases:
        speedups = {K: sampling.expected_speedup(alpha, c, K, verify_cost(K)) for K in range(1, 33)}
        best = max(speedups, key=speedups.get)
        expected = best if speedups[best] > 1 else 0
        assert best_K(alpha, c, verify_cost) == expected, (
            f"alpha={alpha}, c={c}, v(K) = {[round(verify_cost(K), 2) for K in (1, 2, 3)]}...: the best K in 1..32 "
            f"is {best} (speedup {speedups[best]:.2f}); answer 0 when no K beats plain decoding")


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
        assert close(corrected_speedup(alpha, 0.1, K), sampling.expected_speedup(alpha, 0.1, K)), (
            f"alpha={alpha}, K={K}: count every token a target call yields, the accepted drafts and one more")


def check_underestimate(underestimate):
    published = 0.5 * (1 - 0.5**4) / (1 - 0.5) / (4 * 0.1 + 1)
    assert close(underestimate, sampling.expected_speedup(0.5, 0.1, 4) - published, 1e-2), (
        "the two speedups differ by the dropped token's share: one token over the loop's cost K c + 1")


def check_prompt_lookup(PromptLookupDraft):
    stats = sampling.SpeculativeStats()
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
        stats = sampling.SpeculativeStats()
        for origin in origins:
            stats.record_tokens(origin)
        assert close(alpha_from_origins(origins), stats.acceptance_rate, 1e-12), (
            "each corrected token is one judged draft that was rejected; bonus tokens and target steps judge none")
    assert alpha_from_origins(["bonus", "target"]) is None, "nothing judged: return None"


EXERCISES = {1: check_tokens_per_loop, 2: check_speedup, 3: check_acceptance_rate, 4: check_pays, 5: check_best_K,
             6: check_one_step_output, 7: check_corrected_speedup, "7b": check_underestimate,
             8: check_prompt_lookup, 9: check_tokens_at_one_step, 10: check_alpha_from_origins}


def check(number, answer):
    """-> "correct", "unsolved" or "not yet: <hint>"; printed too, for the notebook."""
    try:
        if answer is None:
            raise NotImplementedError
        EXERCISES[number](answer)
        verdict = "correct"
    except NotImplementedError:
        verdict = "unsolved"
    except AssertionError as error:
        verdict = f"not yet: {error}"
    except Exception as error:  # a bug in the answer: say what, do not stop the notebook
        verdict = f"not yet: {type(error).__name__}: {error}"
    print(f"exercise {number}: {verdict}")
    return verdict
