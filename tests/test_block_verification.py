"""verifiers/block.py: block verification (Sun et al., arXiv 2403.10444) against exact calculations.

An exact enumerator (fractions, every draft sequence of a small toy) gives the rule's law and its expected
accepted drafts; the code's b and h are checked against it, and the code itself against autoregressive
greedy decoding, classroom/lossless.py's chi-square check and the contract of speculative_sampling.
"""

from fractions import Fraction
from itertools import product

import numpy as np
import pytest

import gpt2
import sampling
import utils
from classroom import lossless
from conftest import REPO
from speedup.drafts import PromptLookup
from speedup.stats import SpeculativeStats
from verifiers.block import block_speculative_sampling, block_weights, verify_block

# ---- exact toys: p and q as fractions, given the drafts so far ------------------------------------------


def random_distribution(rng, V, zeros=0.3):  # -> tuple of V Fractions summing to 1, some of them 0
    weights = rng.integers(1, 6, V) * (rng.random(V) >= zeros)
    if not weights.any():
        weights[rng.integers(V)] = 1
    return tuple(Fraction(int(w), int(weights.sum())) for w in weights)


class Toy:
    """p(prefix) and q(prefix) over V tokens: fixed (context-free) or drawn per prefix, some with q = p."""

    def __init__(self, V, seed, context_free=True):
        self.V, self.context_free, self.rng = V, context_free, np.random.default_rng(seed)
        self.tables = {}

    def pq(self, prefix):
        key = () if self.context_free else tuple(prefix)
        if key not in self.tables:
            p = random_distribution(self.rng, self.V)
            same = not self.context_free and self.rng.random() < 0.25  # b_i = 1 with q_i = p_i: the paper's 0 / 0
            self.tables[key] = (p, p if same else random_distribution(self.rng, self.V))
        return self.tables[key]

    def p(self, prefix):
        return self.pq(prefix)[0]

    def q(self, prefix):
        return self.pq(prefix)[1]


class FixedToy(Toy):
    def __init__(self, p, q):
        super().__init__(len(p), 0)
        self.tables[()] = (tuple(map(Fraction, p)), tuple(map(Fraction, q)))


def exact_weights(toy, drafts):  # -> b [K + 1], h [K + 1], the paper's definitions in fractions
    K = len(drafts)
    b = [Fraction(1)]
    for i in range(1, K + 1):
        prefix, token = drafts[:i - 1], drafts[i - 1]
        b.append(min(Fraction(1), b[-1] * toy.q(prefix)[token] / toy.p(prefix)[token]))
    h = [None]
    for i in range(1, K):
        r = sum(max(b[i] * q_v - p_v, 0) for q_v, p_v in zip(toy.q(drafts[:i]), toy.p(drafts[:i])))
        h.append(r / (r + 1 - b[i]) if r > 0 else Fraction(0))
    return b, h + [b[K]]


def tau_law(h):  # -> P(tau = i | drafts), i = 0..K: tau is the last i with eta_i < h_i
    K = len(h) - 1
    law = []
    for i in range(K + 1):
        later_fail = 1
        for j in range(i + 1, K + 1):
            later_fail *= 1 - h[j]
        law.append(later_fail * (h[i] if i else 1))
    return law


def draft_sequences(toy, K):  # -> (drafts, their probability under p), every sequence of positive probability
    for drafts in product(range(toy.V), repeat=K):
        probability = Fraction(1)
        for i, token in enumerate(drafts):
            probability *= toy.p(drafts[:i])[token]
        if probability:
            yield drafts, probability


def block_law(toy, K):  # -> {a loop's new tokens: probability}, expected accepted drafts
    law, expected_tau = {}, Fraction(0)
    for drafts, probability in draft_sequences(toy, K):
        b, h = exact_weights(toy, drafts)
        for tau, p_tau in enumerate(tau_law(h)):
            if not p_tau:
                continue
            q, p = toy.q(drafts[:tau]), toy.p(drafts[:tau])
            residual = q if tau == K else [max(b[tau] * q_v - p_v, 0) for q_v, p_v in zip(q, p)]
            assert sum(residual) > 0, "the rule stops where there is nothing to draw from"
            for v, mass in enumerate(residual):
                out = drafts[:tau] + (v,)
                law[out] = law.get(out, 0) + probability * p_tau * mass / sum(residual)
            expected_tau += probability * p_tau * tau
    return law, expected_tau


def token_accepted(toy, K):  # -> Algorithm 2's expected accepted drafts: sum_i P(the first i pass)
    expected = Fraction(0)
    for drafts, probability in draft_sequences(toy, K):
        passed = 1
        for i, token in enumerate(drafts):
            passed *= min(Fraction(1), toy.q(drafts[:i])[token] / toy.p(drafts[:i])[token])
            expected += probability * passed
    return expected


def stream_law(toy, law, K):  # -> P(the first K + 1 tokens): each loop output, continued by the target
    stream = {}
    for out, probability in law.items():
        for rest in product(range(toy.V), repeat=K + 1 - len(out)):
            sequence, continued = out + rest, probability
            for i in range(len(out), K + 1):
                continued *= toy.q(sequence[:i])[sequence[i]]
            if continued:
                stream[sequence] = stream.get(sequence, 0) + continued
    return stream


def target_law(toy, K):
    law = {}
    for sequence in product(range(toy.V), repeat=K + 1):
        probability = Fraction(1)
        for i, token in enumerate(sequence):
            probability *= toy.q(sequence[:i])[token]
        if probability:
            law[sequence] = probability
    return law


def random_toys(count, seed, context_free=True):  # -> (toy, K), V in 2..5, K in 1..5, V^K at most 625
    rng = np.random.default_rng(seed)
    toys = []
    while len(toys) < count:
        V, K = int(rng.integers(2, 6)), int(rng.integers(1, 6))
        if V ** K <= 625:
            toys.append((Toy(V, int(rng.integers(1 << 30)), context_free), K))
    return toys


def as_float32(toy, drafts):  # -> the code's p [K, V] and q [K + 1, V] along the drafts
    K = len(drafts)
    p = np.array([toy.p(drafts[:i]) for i in range(K)], dtype=np.float32).reshape(K, toy.V)
    q = np.array([toy.q(drafts[:i]) for i in range(K + 1)], dtype=np.float32)
    return p, q


# ---- the exact facts -------------------------------------------------------------------------------------


def test_the_papers_two_token_example_gives_10_9_and_11_9():
    for p, q in [((Fraction(1, 3), Fraction(2, 3)), (Fraction(2, 3), Fraction(1, 3))),
                 ((Fraction(2, 3), Fraction(1, 3)), (Fraction(1, 3), Fraction(2, 3)))]:
        toy = FixedToy(p, q)
        assert token_accepted(toy, 2) == Fraction(10, 9)
        assert block_law(toy, 2)[1] == Fraction(11, 9)


@pytest.mark.parametrize("context_free", [True, False])
def test_a_loop_of_block_verification_follows_the_target_exactly(context_free):
    for toy, K in random_toys(12, seed=1 if context_free else 2, context_free=context_free):
        law, _ = block_law(toy, K)
        assert sum(law.values()) == 1
        assert stream_law(toy, law, K) == target_law(toy, K)


def test_block_verification_keeps_at_least_as_many_drafts_as_token_verification():
    gains = []
    for toy, K in random_toys(50, seed=3):
        block, token = block_law(toy, K)[1], token_accepted(toy, K)
        assert block >= token
        gains.append(block - token)
    assert max(gains) > 0  # and strictly more somewhere: the check can tell the two apart


def token_verification_tau_law(toy, drafts):  # -> Algorithm 2's P(tau = i | drafts), i = 0..K
    passed = [Fraction(1)]  # P(the first i drafts pass)
    for i, token in enumerate(drafts):
        passed.append(passed[-1] * min(Fraction(1), toy.q(drafts[:i])[token] / toy.p(drafts[:i])[token]))
    return [passed[i] - passed[i + 1] for i in range(len(drafts))] + [passed[-1]]


class OneHotDraftToy(Toy):
    """toy's q, with p one-hot at the next draft along `drafts`: prompt lookup's p (after them, toy's p)."""

    def __init__(self, toy, drafts):
        self.toy, self.drafts, self.V = toy, drafts, toy.V

    def p(self, prefix):
        if len(prefix) < len(self.drafts):
            return tuple(Fraction(v == self.drafts[len(prefix)]) for v in range(self.V))
        return self.toy.p(prefix)

    def q(self, prefix):
        return self.toy.q(prefix)


def test_the_code_keeps_11_9_drafts_per_loop_in_the_papers_example():
    p, q = np.array([1 / 3, 2 / 3], np.float32), np.array([2 / 3, 1 / 3], np.float32)
    rng, taus = np.random.default_rng(8), []
    for _ in range(6000):
        drafts = np.array([sampling.sample(p, rng), sampling.sample(p, rng)])
        taus.append(verify_block(drafts, np.stack([p, p]), np.stack([q, q, q]), rng)[0])
    standard_error = np.std(taus) / np.sqrt(len(taus))  # about 0.01, a tenth of the gap 11/9 - 10/9
    assert abs(np.mean(taus) - 11 / 9) < 4 * standard_error


def test_at_K_1_and_for_one_hot_drafts_block_verification_is_token_verification():
    for toy, K in random_toys(10, seed=5, context_free=False):
        for drafts, _ in draft_sequences(toy, 1):  # K = 1: h_1 = b_1 = min(1, q/p), the same test
            assert tau_law(exact_weights(toy, drafts)[1]) == token_verification_tau_law(toy, drafts)
        for drafts in product(range(toy.V), repeat=K):  # one-hot drafts: P(tau = i) = b_i - b_{i+1} for both
            one_hot = OneHotDraftToy(toy, drafts)
            assert tau_law(exact_weights(one_hot, drafts)[1]) == token_verification_tau_law(one_hot, drafts)


# ---- the code against the exact rule ---------------------------------------------------------------------


class ScriptedUniforms:
    """An rng whose random() returns given numbers: the etas a test chooses."""

    def __init__(self, values):
        self.values = list(values)

    def random(self):
        return self.values.pop(0)


def test_the_codes_b_h_tau_and_residual_are_the_papers():
    rng = np.random.default_rng(6)
    for toy, K in random_toys(12, seed=7, context_free=False):
        for drafts, _ in draft_sequences(toy, K):
            b, h = exact_weights(toy, drafts)
            p, q = as_float32(toy, drafts)
            code_b, code_h = block_weights(np.array(drafts), p, q)
            np.testing.assert_allclose(code_b, [float(v) for v in b], atol=1e-5)
            np.testing.assert_allclose(code_h[1:], [float(v) for v in h[1:]], atol=1e-5)
            # etas 0.01 on either side of h_i (within [0.005, 0.999]), so float rounding cannot flip a test
            eta = [min(max(float(h_i) + rng.choice([-0.01, 0.01]), 0.005), 0.999) for h_i in h[1:]]
            uniforms = ScriptedUniforms(eta)
            tau, probs = verify_block(np.array(drafts), p, q, uniforms)
            assert not uniforms.values  # one eta per position, all drawn
            assert tau == max((i for i in range(1, K + 1) if eta[i - 1] < h[i]), default=0)
            exact_q, exact_p = toy.q(drafts[:tau]), toy.p(drafts[:tau])
            residual = q[K] if tau == K else [float(max(b[tau] * q_v - p_v, 0)) for q_v, p_v in zip(exact_q, exact_p)]
            np.testing.assert_allclose(probs, np.array(residual) / np.sum(residual), atol=1e-5)


def test_a_threshold_of_zero_rejects_a_uniform_of_zero():
    drafts = np.array([1, 0])
    p = np.array([[0.5, 0.5], [0.5, 0.5]], np.float32)
    q = np.array([[1.0, 0.0], [0.5, 0.5], [0.5, 0.5]], np.float32)  # q_0(x~_1) = 0: b_1 = b_2 = 0
    b, h = block_weights(drafts, p, q)
    assert b[1:] == [0.0, 0.0] and h[1:] == [0.0, 0.0]
    tau, probs = verify_block(drafts, p, q, ScriptedUniforms([0.0, 0.0]))
    assert tau == 0 and probs.tolist() == [1.0, 0.0]


def test_long_blocks_do_not_underflow():
    # 300 drafts of ratio q/p = 1/16 take b to 2^-1200, below float64's smallest number; 15 of ratio 2^100
    # bring it back to 1, which a product in linear space, stuck at 0, would never reach
    K = 315
    drafts = np.zeros(K, dtype=np.int64)
    p = np.array([[0.5, 0.5]] * 300 + [[2.0 ** -100, 1.0]] * 15, np.float32)
    q = np.array([[2.0 ** -5, 1 - 2.0 ** -5]] * 300 + [[1.0, 0.0]] * 16, np.float32)
    b, h = block_weights(drafts, p, q)
    assert abs(b[K] - 1) < 1e-9 and h[K] == b[K]


# ---- the decoder's contract ------------------------------------------------------------------------------


def test_lossless_by_chi_square_and_the_bonus_token():
    check = lossless.check_lossless(block_speculative_sampling)
    assert check.passed, check.report
    speed = lossless.check_tokens_per_call(block_speculative_sampling)
    assert speed.passed, speed.report


@pytest.mark.parametrize("cached", [False, True])
def test_greedy_equals_autoregressive_greedy_on_tables(cached):
    kind = lossless.CachedTableModel if cached else lossless.TableCallable
    draft, target = kind(lossless.random_context_table(5, 11)), kind(lossless.random_context_table(5, 12))
    for K in (1, 2, 4, 7):
        for prompt in ([0], [3, 1, 4]):
            expected = sampling.autoregressive_sampling(prompt, target, 9, temperature=0)
            for model in (draft, target):
                getattr(model, "reset", lambda: None)()
            got = block_speculative_sampling(prompt, draft, target, 9, K, rng=K, temperature=0)
            np.testing.assert_array_equal(got, expected)
            lookup = block_speculative_sampling(prompt, PromptLookup(5), target, 9, K, rng=K, temperature=0)
            np.testing.assert_array_equal(lookup, expected)


def test_greedy_equals_autoregressive_greedy_on_the_bundled_pair():
    encoder, target_hparams, target_params = utils.load_encoder_hparams_and_params("teach-target", REPO / "models")
    _, draft_hparams, draft_params = utils.load_encoder_hparams_and_params("teach-draft", REPO / "models")
    target = gpt2.GPT2Model(target_params, target_hparams)
    draft = gpt2.GPT2Model(draft_params, draft_hparams)
    prompt = encoder.encode("def fibonacci(n):")
    expected = sampling.autoregressive_sampling(prompt, target, 16, temperature=0)
    for K in (2, 5):
        target.reset()
        draft.reset()
        stats = SpeculativeStats()
        got = block_speculative_sampling(prompt, draft, target, 16, K, rng=0, temperature=0, stats=stats)
        np.testing.assert_array_equal(got, expected)
        assert stats.accepted > 0


def test_stats_and_output_follow_speculative_samplings_contract():
    lengths = []

    class Target(lossless.TableCallable):
        def __call__(self, x):
            lengths.append(len(x))
            return super().__call__(x)

    draft = lossless.TableCallable(lossless.random_context_table(4, 2))
    target = Target(lossless.random_context_table(4, 1))
    stats, new_tokens = SpeculativeStats(), []
    out = block_speculative_sampling(np.array([2, 0], dtype=np.int32), draft, target, 20, 3, rng=0, stats=stats,
                                     progress=new_tokens.append)
    assert out.dtype == np.int64 and len(out) == 22 and out[:2].tolist() == [2, 0]
    assert stats.generated == sum(new_tokens) == 20 and stats.loops == stats.target_calls == len(new_tokens)
    assert stats.accepted == stats.origins.count("accepted")
    # one token per loop from the target: a correction, a bonus, or its own step where no draft fits before T
    assert stats.loops == sum(stats.origins.count(origin) for origin in ("corrected", "bonus", "target"))
    assert stats.drafted == stats.draft_calls and max(lengths) == 21  # drafts never reach T = 22
    again = block_speculative_sampling([2, 0], draft, target, 20, 3, rng=0)
    np.testing.assert_array_equal(again, out)  # a seed repeats the tokens
    empty = block_speculative_sampling([2, 0], draft, target, 0, 3, rng=0)
    assert empty.dtype == np.int64 and empty.tolist() == [2, 0]


@pytest.mark.parametrize("x, K", [([1, 2], 0), ([1, 2], 1.5), ([], 2), ([[1, 2]], 2), ([0.5, 1.0], 2)])
def test_bad_input_raises_value_error(x, K):
    model = lossless.TableCallable(lossless.random_context_table(4, 1))
    with pytest.raises(ValueError):
        block_speculative_sampling(x, model, model, 3, K)
