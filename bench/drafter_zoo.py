"""What the drafters' wiring bugs (classroom/drafter_zoo.py) cost: alpha and tokens per target call, greedy, on the
bundled target with its trained heads, each drafter wired right and with one bug.

    python bench/drafter_zoo.py [--bugs feature_off_by_one,...] [--K 4] [--n_prompts 4] [--n_tokens 48]

Each bug keeps the output exact (both wirings must decode the same tokens, or the run stops), so acceptance is all it
can lose, and only a trained head shows it. A bug whose head is not in --models_dir (tools/train_heads.py writes
models/teach-eagle, models/teach-medusa and models/teach-eagle3) is reported as skipped, with the reason. The bench
chooses nothing: its prompts are --n_prompts open prompts of the held-out text's test split (bench/prompts/test.json,
bench/spec_splits.py; their first --prompt_tokens tokens), named in the JSON's "prompts" with their split. Prints one
JSON object.
"""

import argparse
import json

import engine
import utils
from bench import spec_splits
from bench.heldout import add_greedy_run_arguments
from bench.machine import machine_line
from classroom import drafter_zoo
from drafters.eagle3 import vocabulary_d2t
from drafters.load import load_drafter


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models_dir", default="models")
    parser.add_argument("--target", default="teach-target")
    parser.add_argument("--bugs", default=",".join(drafter_zoo.ZOO))
    add_greedy_run_arguments(parser)
    spec_splits.add_prompts_dir_argument(parser)
    args = parser.parse_args(argv)
    args.bugs = args.bugs.split(",")
    unknown = [name for name in args.bugs if name not in drafter_zoo.ZOO]
    if unknown:
        parser.error(f"unknown bug {unknown[0]!r}: choose from {', '.join(drafter_zoo.ZOO)}")
    return args


def trained_head(kind, target, models_dir):  # -> what the zoo builds the drafter from, as drafters/load.py loads it
    """The head's arrays (EAGLE's, Medusa's), or EAGLE-3's arrays with the maps its head.json gives."""
    drafter = load_drafter(kind, target, models_dir)
    if kind == "eagle3":
        return drafter_zoo.Eagle3Head(drafter.eagle3, vocabulary_d2t(drafter.vocabulary).tolist(), drafter.layers)
    return drafter.head if kind == "eagle" else drafter.heads


def measure_bug(bug, target, prompts, args):  # -> the row for one bug
    row = {"bug": bug.variant.name, "title": bug.variant.title, "source": bug.variant.source, "drafter": bug.kind}
    try:
        head = trained_head(bug.kind, target, args.models_dir)
    except ValueError as error:  # no trained head here, or one trained on another target
        return {**row, "skipped": str(error)}
    rows = drafter_zoo.lost_acceptance(bug, target, head, prompts, N=args.n_tokens, K=args.K)
    lost = rows["right"]["tokens_per_target_call"] - rows["with_bug"]["tokens_per_target_call"]
    return {**row, **rows, "lost_tokens_per_target_call": lost}


def main(argv=None):
    args = parse_args(argv)
    prompts, record = spec_splits.bench_prompts(args, "test")
    _, hparams, params = utils.load_encoder_hparams_and_params(args.target, args.models_dir)
    target = engine.fast_model(params, hparams)
    rows = [measure_bug(drafter_zoo.ZOO[name], target, prompts, args) for name in args.bugs]
    print(json.dumps({"machine": machine_line(), "target": args.target, "K": args.K, "split": "test",
                      "prompts": record, "n_prompts": args.n_prompts, "prompt_tokens": args.prompt_tokens,
                      "n_tokens": args.n_tokens, "temperature": 0, "by_bug": rows}))


if __name__ == "__main__":
    main()
