"""speedup/costs.py: the formula at measured costs, the best K and the break-even alpha, the measurement itself on
small models, and AutoK, which chooses K every loop and never changes the greedy tokens."""

import numpy as np
import pytest

import gpt2
import sampling
from speedup import costs
from speedup.stats import SpeculativeStats, expected_tokens_per_loop
from helpers import HPARAMS, count_reused_rows, perturbed, random_target


def flat_costs(c, v=1.0, max_scored=16):
    """Costs with a draft step of c decode steps and every verification costing v steps (v(1) = 1)."""
    return costs.MeasuredCosts(decode_step_seconds=0.01, draft_step_seconds=0.01 * c,
                               verify_steps=(1.0,) + (v,) * (max_scored - 1))


def test_expected_speedup_is_the_formula_at_the_measured_verification_cost():
    measured = costs.MeasuredCosts(0.01, 0.002, (1.0, 1.5, 1.7, 2.0, 2.2))
    assert measured.cost_ratio == pytest.approx(0.2) and measured.K_max == 4
    assert measured.expected_speedup(0.8, 3) == pytest.approx(expected_tokens_per_loop(0.8, 3) / (3 * 0.2 + 2.0))
    assert measured.expected_speedup(0.8, 0) == 1.0  # no drafts: autoregressive decoding itself


def test_K_1_pays_exactly_when_alpha_exceeds_c_with_verification_at_one_step():
    for c in (0.1, 0.3, 0.6):
        measured = flat_costs(c)
        assert measured.expected_speedup(c + 0.01, 1) > 1 > measured.expected_speedup(c - 0.01, 1)
        assert measured.expected_speedup(0.5, 1) == pytest.approx((1 + 0.5) / (1 + c))
        assert measured.break_even_alpha(1) == pytest.approx(c, abs=1e-9)


def test_best_K_maximises_the_expected_speedup_and_is_zero_when_nothing_pays():
    measured = flat_costs(0.1)
    for alpha in (0.5, 0.8, 0.95):
        best = measured.best_K(alpha)
        assert all(measured.expected_speedup(alpha, best) >= measured.expected_speedup(alpha, K) for K in range(16))
    assert measured.best_K(0.95) > measured.best_K(0.5) >= 1  # a better draft is worth more drafts
    assert measured.best_K(0.95, K_max=3) == 3
    costly = flat_costs(0.3, v=2.5)  # a CPU where verification costs 2.5 steps and the draft a third of one
    assert costly.best_K(0.6) == 0 and costly.lowest_break_even()[0] > 0.6
    hopeless = flat_costs(1.0, v=1.5)  # a draft as costly as the target: K + 1 tokens for K + 1.5 steps
    assert hopeless.lowest_break_even() == (None, None) and hopeless.best_K(1.0) == 0
    assert "no K can pay" in " ".join(costs.describe(hopeless))


def test_break_even_alpha_is_where_the_speedup_crosses_one():
    measured = costs.MeasuredCosts(0.01, 0.003, tuple([1.0, 1.4, 1.6, 1.8, 2.0, 2.1, 2.2, 2.3, 2.4]))
    for K in range(1, 9):
        alpha = measured.break_even_alpha(K)
        if alpha is None:
            assert measured.expected_speedup(1.0, K) <= 1
        else:
            assert measured.expected_speedup(alpha, K) == pytest.approx(1.0, abs=1e-6)
    alpha, K = measured.lowest_break_even()
    assert alpha == min(a for a in (measured.break_even_alpha(k) for k in range(1, 9)) if a is not None)
    assert "pays here only when alpha exceeds" in " ".join(costs.describe(measured, K=4))


def test_a_loop_measured_below_one_step_is_called_noise_not_a_free_verification():
    noisy = costs.MeasuredCosts(0.01, 0.0001, (1.0, 0.93, 1.3))  # v(2) came out below one decode step
    alpha, K = noisy.lowest_break_even()
    assert alpha < 1e-6 and K == 1  # the formula would pay from alpha 0
    words = " ".join(costs.describe(noisy))
    assert "timing noise" in words and "0.94 decode steps" in words
    assert "timing noise" not in " ".join(costs.describe(costs.MeasuredCosts(0.01, 0.003, (1.0, 1.2, 1.4))))


def test_accepted_lengths_read_the_loops_from_the_origins():
    origins = ["accepted", "accepted", "corrected", "bonus", "target", "accepted", "bonus", "corrected"]
    assert costs.accepted_lengths(origins) == [2, 0, 1, 0]  # the plain step is no loop of speculation
    geometric = costs.geometric_accepted_lengths(0.7, 4)
    assert geometric.sum() == pytest.approx(1.0) and geometric[-1] == pytest.approx(0.7**4)


@pytest.fixture(scope="module")
def pair():
    target_params = random_target()
    return (gpt2.GPT2Model(perturbed(target_params, 0.05, 1), HPARAMS), gpt2.GPT2Model(target_params, HPARAMS))


def test_measure_costs_gives_every_verification_length_in_decode_steps(pair):
    draft, target = pair
    measured = costs.measure_costs(target, draft, [1, 2, 3, 4], budget_seconds=0.1, max_scored=8)
    assert len(measured.verify_steps) == 8 and measured.verify_steps[0] == 1.0
    assert measured.decode_step_seconds > 0 and measured.draft_step_seconds > 0
    assert all(v > 0 for v in measured.verify_steps)
    assert len(target.cached_tokens) == len(draft.cached_tokens) == 0  # left reset
    no_room = [1] * (HPARAMS["n_ctx"] - 1)
    with pytest.raises(ValueError, match="room"):
        costs.measure_costs(target, draft, no_room)
    assert costs.measure_costs(target, object(), [1, 2, 3], budget_seconds=0.05).draft_step_seconds == 0


def test_an_early_exits_draft_step_hands_the_timed_target_nothing_to_reuse(pair, monkeypatch):
    """The decode step and v are the plain recompute's: the target never starts a timed row at the exit."""
    from drafters.early_exit import EarlyExit

    _, target = pair
    reused = count_reused_rows(monkeypatch)
    costs.measure_costs(target, EarlyExit(target, 1), [1, 2, 3, 4], budget_seconds=0.05, max_scored=4)
    assert len(reused) > 1 and max(reused[1:]) == 0  # the first call, a warm-up, reads x itself: the draft fed it


def test_auto_K_decodes_the_autoregressive_tokens_and_chooses_none_where_nothing_pays(pair):
    draft, target = pair
    prompt = [5, 6, 7]
    expected = sampling.autoregressive_sampling(prompt, target, 30, temperature=0)
    paying, hopeless = costs.AutoK(draft, flat_costs(0.05)), costs.AutoK(draft, flat_costs(1.0, v=1.5))
    for auto in (paying, hopeless):
        stats = SpeculativeStats()
        out = sampling.speculative_sampling(prompt, auto, target, 30, 8, temperature=0, stats=stats)
        np.testing.assert_array_equal(out, expected)
        assert len(auto.chosen) == stats.loops
    assert set(hopeless.chosen) == {0}  # no K pays at any alpha: every loop a plain step, never a try
    assert max(paying.chosen) >= 4 and all(K <= 8 for K in paying.chosen)  # the cap is the decoder's K
    assert paying.n_vocab == draft.n_vocab and paying.n_ctx == draft.n_ctx
    paying.reset()
    assert paying.chosen == [] and len(draft.cached_tokens) == 0


def test_auto_K_follows_the_runs_alpha_weighting_recent_drafts_more():
    auto = costs.AutoK(None, flat_costs(0.1))
    stats = SpeculativeStats()
    stats.record_tokens("accepted", 7)  # a previous run's counts, in a stats object shared across runs
    auto.observe(stats)
    prior = auto.alpha()
    assert prior == pytest.approx(costs.PRIOR_ACCEPTED / (costs.PRIOR_ACCEPTED + costs.PRIOR_REJECTED))
    stats.record_tokens("accepted", 40)
    auto.observe(stats)
    assert auto.alpha() > 0.9 > prior
    stats.record_tokens("corrected", 60)
    auto.observe(stats)
    assert auto.alpha() < 0.2  # the last sixty judgements outweigh the forty before them
    forgetful, steadfast = costs.AutoK(None, flat_costs(0.1), memory=0.5), costs.AutoK(None, flat_costs(0.1), memory=1)
    for auto in (forgetful, steadfast):
        stats = SpeculativeStats()
        auto.observe(stats)
        stats.record_tokens("corrected", 20)
        auto.observe(stats)
        stats.record_tokens("accepted", 5)
        auto.observe(stats)
    assert forgetful.alpha() > 0.75 and steadfast.alpha() < 0.3  # memory 1 counts every judgement alike


def test_auto_K_drafts_only_what_is_worth_drafting_at_an_optimistic_alpha():
    costly = flat_costs(0.3, v=1.8)
    auto = costs.AutoK(None, costly)
    stats = SpeculativeStats()
    auto.observe(stats)
    stats.record_tokens("accepted", 30)
    auto.observe(stats)
    best = costly.best_K(auto.optimistic_alpha(), K_max=12)  # the decoder's K is the largest to consider
    assert auto.worth_drafting(12) == best > 0
    assert costly.expected_speedup(auto.optimistic_alpha(), best) >= costs.WORTH_DRAFTING
    assert auto.alpha() < auto.optimistic_alpha() < 1
    hesitant = costs.AutoK(None, costly, prior_accepted=76, prior_rejected=24, optimism=0)  # alpha 0.76: K = 4
    assert costly.best_K(hesitant.alpha()) > 0 and hesitant.worth_drafting(12) == 0  # pays by 3%, not 5%
    unsure = costs.AutoK(None, costly, prior_accepted=0.76, prior_rejected=0.24)  # the same mean, from little evidence
    assert unsure.worth_drafting(12) > 0  # worth trying


class Proposals:
    """Stands for the draft: AutoK tells it how many tokens to propose, and it proposes that many."""

    def propose(self, x, K, settings, rng, stats):
        return np.zeros(K, np.int64), np.ones((K, 1), np.float32)  # token 0, drawn from p one-hot at it


def test_auto_K_tries_again_once_plain_steps_have_faded_the_evidence():
    def drafting_loops(memory):  # a draft the target always rejects, 400 loops
        auto = costs.AutoK(Proposals(), flat_costs(0.3, v=1.8), memory=memory)
        stats, drafting = SpeculativeStats(), []
        for loop in range(400):
            if len(auto.propose(None, 8, None, None, stats)[0]):
                drafting.append(loop)
                stats.record_tokens("corrected")
            else:
                stats.record_tokens("target")
        return drafting

    fading, steadfast = drafting_loops(costs.MEMORY), drafting_loops(1.0)
    assert steadfast == [0]  # evidence that never fades: one rejection ends speculation for good
    assert fading[0] == 0 and len(fading) >= 4  # fading evidence: it tries again, and again
    gaps = np.diff(fading)
    assert gaps.min() >= 20 and all(later >= earlier for earlier, later in zip(gaps, gaps[1:]))  # rarely, then rarer
