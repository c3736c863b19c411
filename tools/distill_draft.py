"""Second stage of the bundled pair: distil a deeper draft from the finished target.

train_pair.py trains a one-layer draft beside the target. One layer cannot compose attention heads, so
it cannot learn to copy from earlier context (an "induction head" takes two), and copying is much of
what a target does on code and reference text. This stage grows the draft to --n_layer blocks (default 2)
and distils it from the frozen, finished target on the same corpus. Each new block starts as an identity
(its output projections are zero), so the grown draft starts exactly where the smaller draft ended.

    python tools/distill_draft.py --steps 150          # after tools/train_pair.py
"""

import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpt2  # noqa: E402
import train_pair  # noqa: E402
import utils  # noqa: E402
from encoder import get_encoder_from_dir  # noqa: E402


def grow(params, hparams, n_layer, rng):
    """The draft with blocks appended up to n_layer, each new one an identity map at first."""
    grown_hparams = {**hparams, "n_layer": n_layer}
    fresh = gpt2.init_params(grown_hparams, rng)["blocks"][hparams["n_layer"]:]
    for block in fresh:  # zero output projections: the residual stream passes through unchanged
        block["attn"]["c_proj"]["w"][:] = 0
        block["mlp"]["c_proj"]["w"][:] = 0
    return {**params, "blocks": params["blocks"] + fresh}, grown_hparams


def make_distill_step(target_heads, draft_heads):
    def loss(draft_params, target_params, batch):
        inputs = batch[:, :-1]
        teacher = jax.lax.stop_gradient(train_pair.batched_logits(target_params, target_heads, inputs))
        return train_pair.distillation_kl(teacher, train_pair.batched_logits(draft_params, draft_heads, inputs))

    @jax.jit
    def step(draft_params, target_params, opt_state, batch, lr):
        value, grads = jax.value_and_grad(loss)(draft_params, target_params, batch)
        draft_params, opt_state = train_pair.adamw_update(draft_params, grads, opt_state, lr)
        return draft_params, opt_state, value

    return step


def main(models_dir="models", corpus_dir="build/corpus", bpe_dir="build/bpe4096", steps=150, n_layer=2,
         batch_size=16, lr=1e-3, warmup=10, seed=1, eval_every=50, target_name="teach-target",
         draft_name="teach-draft", tokens=None, repeat_share=0.0, random_share=0.0):
    """Grow the draft to n_layer blocks and distil it for `steps` steps of batch_size windows of the target's n_ctx.
    tokens: a tokens.npz from tools/pack_corpus.py, read instead of corpus_dir (its vocabulary must be bpe_dir's).
    repeat_share, random_share: the shares of windows that repeat one of their spans and of windows that are a random
    sequence written over and over (train_pair.batches), where a target that copies can teach the draft to copy."""
    models_dir, corpus_dir, bpe_dir = Path(models_dir), Path(corpus_dir), Path(bpe_dir)
    encoder = get_encoder_from_dir(bpe_dir)
    train, held_out = train_pair.load_splits(corpus_dir, bpe_dir, encoder, tokens)
    _, target_hparams, target_params = utils.load_encoder_hparams_and_params(target_name, models_dir)
    _, draft_hparams, draft_params = utils.load_encoder_hparams_and_params(draft_name, models_dir)
    rng = np.random.default_rng(seed)
    draft_params, draft_hparams = grow(draft_params, draft_hparams, n_layer, rng)
    params = {"target": jax.tree.map(jnp.asarray, target_params), "draft": jax.tree.map(jnp.asarray, draft_params)}
    seq_len = target_hparams["n_ctx"]
    step_fn = make_distill_step(target_hparams["n_head"], draft_hparams["n_head"])
    evaluate = train_pair.make_evaluate(target_hparams["n_head"], draft_hparams["n_head"])
    opt_state = train_pair.adamw_init(params["draft"])

    log = json.loads((models_dir / "training_log.json").read_text())
    stage = {"recipe": {"steps": steps, "n_layer": n_layer, "batch_size": batch_size, "seq_len": seq_len, "lr": lr,
                        "warmup": warmup, "seed": seed, "draft_hparams": draft_hparams,
                        "tokens": str(tokens) if tokens else None, "repeat_share": repeat_share,
                        "random_share": random_share}, "evals": []}
    log["draft_distillation"] = stage
    stage["evals"].append({"step": 0, **train_pair.held_out_metrics(evaluate, params, held_out, seq_len)})
    print("held-out", json.dumps(stage["evals"][-1]), flush=True)
    data = train_pair.batches(train, batch_size, seq_len, rng, repeat_share, random_share, encoder.n_vocab)
    started = time.perf_counter()
    for step in range(steps):
        params["draft"], opt_state, kl = step_fn(params["draft"], params["target"], opt_state, next(data),
                                                 train_pair.learning_rate(step, steps, lr, warmup))
        if step % 25 == 0:
            print(f"step {step:4d}  draft KL {float(kl):.3f}  {(time.perf_counter() - started) / 60:.1f} min", flush=True)
        if (step + 1) % eval_every == 0 or step == steps - 1:
            metrics = train_pair.held_out_metrics(evaluate, params, held_out, seq_len)
            evaluation = {"step": step + 1, "minutes": (time.perf_counter() - started) / 60, **metrics}
            train_pair.write_stage_evaluation(models_dir, draft_name, params["draft"], draft_hparams, bpe_dir, log,
                                              stage, evaluation)


if __name__ == "__main__":
    import fire

    fire.Fire(main)
