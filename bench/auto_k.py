"""--K auto's settings, replayed: costs.AutoK against fixed K on the bundled pair's own acceptances.

At temperature 0 a draft is accepted exactly when the draft's greedy token is the target's, so a prompt's
acceptances are fixed once the target's greedy continuation is known: draft j of a loop is accepted when the
draft, given the target's tokens so far, predicts the target's next token (a loop's earlier drafts, when
accepted, are the target's tokens). This records that sequence for each prompt of the development split that
bench/pair.py calibrated on (its JSON's prompts.dev: bench/spec_splits.py's, one forward pass of each model) and
replays any K policy against it, pricing each loop at the costs bench/pair.py measured in those runs (a loop of K
drafts: K c + v, both in decode steps, from its calibration's row for the nearest K; a plain step:
1; a draft that missed m plain steps feeds them with its next step, at the target's measured v(m + 1), extended
in a straight line beyond the measured 16 tokens).
Temperature 1 is replayed with independent acceptances, alpha drawn around --alpha_t1 for each prompt.

The replay runs in seconds, where a real measurement of one setting takes a minute and moves by 5-10% from
run to run; it reproduced bench/pair.py's fixed-K medians within a few percent. speedup/costs.py's AutoK settings
(PRIOR_*, MEMORY, OPTIMISM, WORTH_DRAFTING) were chosen with it; bench/pair.py --K ...,auto then measures
the chosen ones for real, on the test split.

    python bench/auto_k.py --pair bench/results/pair_cpu_zen4_stage14.json     # the costs of a bench/pair.py run

Prints one JSON line per setting, then one JSON object as its last line.
"""

import argparse
import itertools
import json
import statistics
from pathlib import Path

import numpy as np

import engine
import sampling
import utils
from bench import spec_splits
from speedup import costs
from speedup.stats import SpeculativeStats

FIXED_K = (1, 2, 3, 4, 6, 8)
SETTINGS = {"memory": (0.96, 0.97, 0.98), "optimism": (0.25, 0.5, 0.75), "prior": ((0.8, 0.2), (1.4, 0.6)),
            "worth_drafting": (1.05, 1.1)}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", required=True, help="a bench/pair.py JSON (its last line): the loops' costs")
    parser.add_argument("--models_dir", default="models")
    spec_splits.add_prompts_dir_argument(parser)
    parser.add_argument("--alpha_t1", type=float, default=0.72, help="mean alpha of the temperature-1 replay")
    return parser.parse_args(argv)


def greedy_acceptances(draft, target, prompts, n_tokens):
    """For each prompt, whether the draft's greedy token equals the target's at each new position."""
    matches = []
    for prompt in prompts:
        draft.reset()
        target.reset()
        out = sampling.autoregressive_sampling(prompt, target, n_tokens, temperature=0)
        predicted = draft.logits(out[:-1], n_last=n_tokens).argmax(axis=-1)  # given the target's tokens so far
        matches.append(predicted == out[len(prompt):])
    return matches


class NoDraft:
    """Stands for the draft in a replay: AutoK only needs to be told how many tokens to propose."""

    def propose(self, x, K, settings, rng, stats):
        return np.zeros(K, np.int64), np.ones((K, 1), np.float32)  # token 0, drawn from a one-hot p


def replay(accepted, choose, loop_steps, catch_up_steps):
    """One prompt's speedup over autoregressive decoding: choose(stats) gives each loop's K.

    loop_steps(K): a loop of K drafts, in decode steps; catch_up_steps(m): the draft's first step feeding the m
    tokens it missed during plain steps, beyond a step's own price."""
    n, steps, stats, N, missed = 0, 0.0, SpeculativeStats(), len(accepted), 0
    while n < N:
        K = min(choose(stats), N - n - 1)
        if K == 0:
            steps, n, missed = steps + 1, n + 1, missed + 1
            stats.record_tokens("target")
            continue
        taken = int(np.argmin(np.append(accepted[n:n + K], False)))  # drafts accepted before the first rejection
        steps += loop_steps(K) + (catch_up_steps(missed) if missed else 0)
        missed = 0
        stats.record_tokens("accepted", taken)
        stats.record_tokens("corrected" if taken < K else "bonus")
        n += taken + 1
    return N / steps


def main(argv=None):
    args = parse_args(argv)
    pair = json.loads(Path(args.pair).read_text().strip().splitlines()[-1])
    calibrated = pair["prompts"]["dev"]  # the prompts the pair run calibrated on, and its rows there
    prompts, _ = spec_splits.bench_prompts(argparse.Namespace(
        n_prompts=len(calibrated["ids"]), prompt_tokens=calibrated["prompt_tokens"], models_dir=args.models_dir,
        target=pair["target"], prompts_dir=args.prompts_dir), "dev")
    rows = {row["K"]: row for row in pair["calibration"]["by_K"]}
    nearest = lambda K: rows[min(rows, key=lambda k: abs(k - K))]
    loop_steps = lambda K: K * nearest(K)["cost_ratio"] + nearest(K)["verify_steps"]
    measured = costs.MeasuredCosts(pair["costs"]["decode_step_seconds"], pair["costs"]["draft_step_seconds"],
                                   tuple(pair["costs"]["verify_steps"]))
    # feeding the draft m + 1 tokens at once costs about what the target's m + 1 do, in its own steps; beyond the
    # measured 16, each further token costs what the last eight measured did on average
    top, slope = measured.K_max + 1, (measured.v(measured.K_max + 1) - measured.v(measured.K_max // 2 + 1)) / (
        measured.K_max - measured.K_max // 2)
    scored_steps = lambda m: measured.v(m) if m <= top else measured.v(top) + slope * (m - top)
    catch_up_steps = lambda m: measured.cost_ratio * (scored_steps(m + 1) - 1)
    _, target_hparams, target_params = utils.load_encoder_hparams_and_params(pair["target"], args.models_dir)
    _, draft_hparams, draft_params = utils.load_encoder_hparams_and_params(pair["draft"], args.models_dir)
    draft, target = engine.fast_model(draft_params, draft_hparams), engine.fast_model(target_params, target_hparams)
    greedy = greedy_acceptances(draft, target, prompts, pair["n_tokens"])
    rng = np.random.default_rng(0)
    sampled = [rng.random(pair["n_tokens"]) < np.clip(args.alpha_t1 + 0.08 * rng.standard_normal(), 0.3, 0.97)
               for _ in prompts]

    def median_speedup(matches, policy):  # policy() -> a fresh choose(stats)
        return statistics.median(replay(accepted, policy(), loop_steps, catch_up_steps) for accepted in matches)

    def auto(memory, optimism, prior, worth_drafting):
        def policy():
            chooser = costs.AutoK(NoDraft(), measured, prior_accepted=prior[0], prior_rejected=prior[1], memory=memory,
                                  optimism=optimism, worth_drafting=worth_drafting)
            return lambda stats: len(chooser.propose(None, 12, None, None, stats)[0])
        return policy

    fixed = {K: median_speedup(greedy, lambda K=K: (lambda stats: K)) for K in FIXED_K}
    result = {"pair": args.pair, "split": "dev", "prompts": calibrated, "fixed_K_temperature_0": fixed,
              "best_fixed_temperature_0": max(fixed.values()), "alpha_t1": args.alpha_t1, "settings": []}
    for values in itertools.product(*SETTINGS.values()):
        setting = dict(zip(SETTINGS, values))
        row = {**setting, "temperature_0": median_speedup(greedy, auto(*values)),
               "temperature_1": median_speedup(sampled, auto(*values))}
        row["temperature_0_over_best_fixed"] = row["temperature_0"] / result["best_fixed_temperature_0"]
        result["settings"].append(row)
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    chosen = next(row for row in result["settings"] if row["memory"] == costs.MEMORY and row["prior"] == (
        costs.PRIOR_ACCEPTED, costs.PRIOR_REJECTED) and row["worth_drafting"] == costs.WORTH_DRAFTING
                  and row["optimism"] == costs.OPTIMISM)
    result["costs_py_settings"] = chosen
    print(json.dumps(result))


if __name__ == "__main__":
    main()
