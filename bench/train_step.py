"""Seconds and page faults per training step of tools/train_pair.py, on the bundled pair, on this CPU.

Each step blocks until it is done, so the seconds are the step's own (the training loop's log counts time
at dispatch). On the CPU, XLA takes its buffers (gigabytes a step at batch 8 x 512) from fresh memory; where
those come as 4 KiB pages, every step pays a million minor page faults in the kernel. Huge pages avoid most
of them: compare a run with glibc asking for them (no root needed) against one without:

    python bench/train_step.py --steps 30
    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python bench/train_step.py --steps 30

The tokens are random (a step's cost does not depend on them). Prints one JSON object.
"""

import argparse
import json
import os
import resource
import statistics
import time
from pathlib import Path

import numpy as np

from bench.machine import cpu_model

REPO = Path(__file__).resolve().parents[1]

TRANSPARENT_HUGEPAGES = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def transparent_hugepages():
    """The kernel's setting, the bracketed word of 'always [madvise] never'; None where it has none."""
    if not TRANSPARENT_HUGEPAGES.exists():
        return None
    text = TRANSPARENT_HUGEPAGES.read_text()
    return text[text.index("[") + 1:text.index("]")] if "[" in text else text.strip()


def minor_faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models_dir", default=str(REPO / "models"), help="a folder holding the pair to train")
    parser.add_argument("--steps", type=int, default=30, help="timed steps, after one untimed (compiling) step")
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--repeat_share", type=float, default=0.5, help="as tools/train_pair.py's")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1:
        parser.error("--steps and --batch_size must be positive")
    if not (Path(args.models_dir) / "teach-target").is_dir():
        parser.error(f"{args.models_dir} holds no teach-target folder")

    import jax
    import jax.numpy as jnp
    from tools import train_pair
    from encoder import get_encoder_from_dir

    names = {"target": "teach-target", "draft": "teach-draft"}
    encoder = get_encoder_from_dir(Path(args.models_dir) / names["target"])
    params, hparams = train_pair.warm_start(args.models_dir, names, encoder)
    params = jax.tree.map(jnp.asarray, params)
    opt_state = train_pair.adamw_init(params)
    train_step = train_pair.make_train_step(hparams["target"]["n_head"], hparams["draft"]["n_head"])
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, encoder.n_vocab, size=1 << 20, dtype=np.int32)
    data = train_pair.batches(tokens, args.batch_size, hparams["target"]["n_ctx"], rng, args.repeat_share)

    seconds, faults = [], []
    for step in range(args.steps + 1):
        started, faults_before = time.perf_counter(), minor_faults()
        params, opt_state, target_loss, _ = train_step(params, opt_state, next(data), 1e-5)
        float(target_loss)  # waits for the step
        if step > 0:  # the first step compiles
            seconds.append(time.perf_counter() - started)
            faults.append(minor_faults() - faults_before)

    print(json.dumps({
        "cpu": cpu_model(), "cores": os.cpu_count(), "jax": jax.__version__,
        "transparent_hugepages": transparent_hugepages(),
        "GLIBC_TUNABLES": os.environ.get("GLIBC_TUNABLES"),
        "batch": [args.batch_size, hparams["target"]["n_ctx"]], "steps": args.steps,
        "median_seconds": statistics.median(seconds), "seconds_range": [min(seconds), max(seconds)],
        "median_minor_faults": statistics.median(faults)}))


if __name__ == "__main__":
    main()
