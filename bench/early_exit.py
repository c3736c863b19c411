"""The untrained early exit (drafters/early_exit.py) on the bundled target, greedy: alpha, tokens per target call and c
for several exit layers, and Leviathan et al.'s expected speedup at the measured c and v(K + 1).

    python bench/early_exit.py [--exit_layers 1,2,4,6] [--K 4] [--n_prompts 4] [--n_tokens 48]

Prompts are evenly spaced stretches of the held-out text (default: the sample committed in tests/fixtures). Every
speculative run's tokens must equal autoregressive decoding's. Prints one JSON object.
"""

import argparse
import json

import engine
import sampling
import utils
from bench.heldout import add_greedy_run_arguments, greedy_acceptance, greedy_prompts, held_out_tokens, require_heldout
from bench.machine import machine_line
from drafters.early_exit import EarlyExit
from speedup import costs


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models_dir", default="models")
    parser.add_argument("--target", default="teach-target")
    parser.add_argument("--heldout", default="tests/fixtures/heldout_sample.txt")
    parser.add_argument("--exit_layers", default="1,2,4,6")
    add_greedy_run_arguments(parser)
    args = parser.parse_args(argv)
    args.exit_layers = [int(layer) for layer in args.exit_layers.split(",")]
    return args


def measure_exit(target, exit_layer, prompts, expected, K, N):  # -> the row for one exit layer
    draft = EarlyExit(target, exit_layer)
    measured = costs.measure_costs(target, draft, prompts[0], sampling.GREEDY)
    total = greedy_acceptance(target, draft, prompts, expected, K, N, f"exit layer {exit_layer}")
    alpha = total.acceptance_rate
    best_K = measured.best_K(alpha)
    return {"exit_layer": exit_layer, "alpha": alpha, "tokens_per_target_call": total.tokens_per_target_call,
            "c": measured.cost_ratio, "v_K_plus_1": measured.v(K + 1), "expected_speedup": measured.expected_speedup(
                alpha, K), "best_K": best_K, "best_expected_speedup": measured.expected_speedup(alpha, best_K)}


def main(argv=None):
    args = parse_args(argv)
    require_heldout(args.heldout)
    encoder, hparams, params = utils.load_encoder_hparams_and_params(args.target, args.models_dir)
    target = engine.fast_model(params, hparams)
    tokens = held_out_tokens(encoder, args.heldout)
    prompts, expected = greedy_prompts(target, tokens, args.n_prompts, args.prompt_tokens, args.n_tokens)
    rows = [measure_exit(target, layer, prompts, expected, args.K, args.n_tokens) for layer in args.exit_layers]
    print(json.dumps({"machine": machine_line(), "target": args.target, "n_layer": target.hparams["n_layer"], "K": args.K,
                      "heldout": args.heldout, "n_prompts": args.n_prompts, "prompt_tokens": args.prompt_tokens,
                      "n_tokens": args.n_tokens, "temperature": 0, "by_exit_layer": rows}))


if __name__ == "__main__":
    main()
