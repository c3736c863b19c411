"""Second stage of the bundled pair: distil a deeper draft from the finished target.

train_pair.py trains a one-layer draft beside the target. One layer cannot compose attention heads, so
it cannot learn to copy from earlier context (an "induction head" takes two), and copying is much of
what a target does on code and reference text. This stage grows the draft to --n_layer blocks (default 2)
and distils it from the frozen, finished target on the same corpus. Each new block starts as an identity
(its output projections are zero), so the grown draft starts exactly where the smaller draft ended.

    python tools/distill_draft.py --steps 150          # after tools/train_pair.py

With --continued N, each step also distils on N of the target's own continuations of training prompts
(greedy at --pool_temperature 0). Speculative sampling judges the draft on exactly that text: the prompt
and what the target wrote after it. Training the draft on it is the on-policy data of Zhou et al. (2023,
"DistillSpec: Improving Speculative Decoding via Knowledge Distillation"). The target is frozen, so the
continuations are written once, --pool of them, in batches by batching/sampling_batched.py (or, with
--pool_backend jax, by jax_backend's device loop on an accelerator), and kept in --pool_file when one is named.
"""

import hashlib
import itertools
import json
import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import gpt2
from tools import train_pair
import utils
from encoder import get_encoder_from_dir
from cli import backends


def grow(params, hparams, n_layer, rng):
    """The draft with blocks appended up to n_layer, each new one an identity map at first."""
    grown_hparams = {**hparams, "n_layer": n_layer}
    fresh = gpt2.init_params(grown_hparams, rng)["blocks"][hparams["n_layer"]:]
    for block in fresh:  # zero output projections: the residual stream passes through unchanged
        block["attn"]["c_proj"]["w"][:] = 0
        block["mlp"]["c_proj"]["w"][:] = 0
    return {**params, "blocks": params["blocks"] + fresh}, grown_hparams


def continuations(params, hparams, tokens, n_rows, prompt_tokens, n_tokens, temperature, rng, batch_size=64,
                  backend="numpy"):
    """[n_rows, prompt_tokens + n_tokens] int32: random prompts from tokens, each continued by the target
    (params, numpy) for n_tokens tokens at `temperature` (0: greedy), batch_size rows per batched pass, decoded
    on `backend` (jax: sampling_jax's device loop, the same tokens up to float32 rounding)."""
    model = backends.make_batched_model(params, hparams, batch_size, backend)
    decoders = backends.batched_decoders(model)
    rows = []
    while len(rows) < n_rows:
        n = min(batch_size, n_rows - len(rows))
        prompts = [tokens[s:s + prompt_tokens] for s in rng.integers(0, len(tokens) - prompt_tokens, n)]
        seeds = [int(seed) for seed in rng.integers(0, 2**63, n)]  # one Generator per row
        model.reset()
        rows += decoders.autoregressive_sampling(prompts, model, n_tokens, seeds, temperature=temperature)
    return np.stack(rows).astype(np.int32)


def load_or_write_pool(pool_file, made_with, make_pool):
    """make_pool()'s rows, read from pool_file when it exists and was made with the same settings (made_with: a
    dict naming the target and the pool's shape), else made and written there atomically."""
    if pool_file and Path(pool_file).exists():
        with np.load(pool_file) as stored:
            recorded = str(stored["made_with"]) if "made_with" in stored.files else "null"
            if json.loads(recorded) != made_with:
                raise ValueError(f"{pool_file} holds continuations made with {recorded}, not {json.dumps(made_with)}: "
                                 "delete it or name another --pool_file")
            return stored["rows"]
    rows = make_pool()
    if pool_file:
        Path(pool_file).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(f"{pool_file}.tmp.npz")
        np.savez(tmp, rows=rows, made_with=json.dumps(made_with))
        os.replace(tmp, pool_file)
    return rows


def make_distill_step(target_heads, draft_heads):
    def kl_and_count(draft_params, target_params, windows):  # mean KL over the windows' positions, and their number
        inputs = windows[:, :-1]
        teacher = jax.lax.stop_gradient(train_pair.batched_logits(target_params, target_heads, inputs))
        student = train_pair.batched_logits(draft_params, draft_heads, inputs)
        return train_pair.distillation_kl(teacher, student), inputs.size

    def loss(draft_params, target_params, batch, continued):
        parts = [kl_and_count(draft_params, target_params, windows) for windows in (batch, continued) if len(windows)]
        return sum(kl * count for kl, count in parts) / sum(count for _, count in parts)  # every position weighs alike

    @jax.jit
    def step(draft_params, target_params, opt_state, batch, continued, lr):
        value, grads = jax.value_and_grad(loss)(draft_params, target_params, batch, continued)
        draft_params, opt_state = train_pair.adamw_update(draft_params, grads, opt_state, lr)
        return draft_params, opt_state, value

    return step


def make_continued_agreement(draft_heads, prompt_tokens):
    @jax.jit
    def agreement(draft_params, rows):
        """How often the draft's argmax is the token a greedy target wrote, over the rows' continued positions."""
        predicted = jnp.argmax(train_pair.batched_logits(draft_params, draft_heads, rows[:, :-1]), -1)
        return jnp.mean(predicted[:, prompt_tokens - 1:] == rows[:, prompt_tokens:])

    return agreement


def main(models_dir="models", corpus_dir="build/corpus", bpe_dir="build/bpe4096", steps=150, n_layer=2,
         batch_size=16, lr=1e-3, warmup=10, seed=1, eval_every=50, target_name="teach-target",
         draft_name="teach-draft", tokens=None, repeat_share=0.0, random_share=0.0, continued=0, pool=4096,
         prompt_tokens=32, continued_tokens=160, pool_temperature=0.0, pool_file=None, pool_backend="numpy",
         pool_batch=64):
    """Grow the draft to n_layer blocks and distil it for `steps` steps of batch_size windows of the target's n_ctx.
    tokens: a tokens.npz from tools/pack_corpus.py, read instead of corpus_dir (its vocabulary must be bpe_dir's).
    repeat_share, random_share: the shares of windows that repeat one of their spans and of windows that are a random
    sequence written over and over (train_pair.batches), where a target that copies can teach the draft to copy.
    continued: rows per step drawn from a pool of `pool` target continuations (prompt_tokens training tokens, then
    continued_tokens at pool_temperature), beside the batch_size windows; pool_file keeps the pool between runs;
    pool_backend "jax" writes it on an accelerator (jax_backend), minutes of CPU cores saved, pool_batch rows at a
    time (an accelerator's memory holds hundreds). Evaluations then add the draft's argmax agreement with greedy
    continuations of held-out prompts."""
    if batch_size < 0 or continued < 0 or batch_size + continued == 0:
        raise ValueError(f"a step needs windows or continuations: batch_size {batch_size}, continued {continued}")
    if pool_batch < 1:
        raise ValueError(f"pool_batch must be at least 1, not {pool_batch}")
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
                        "random_share": random_share, "continued": continued}, "evals": []}
    if continued:
        stage["recipe"].update(pool=pool, prompt_tokens=prompt_tokens, continued_tokens=continued_tokens,
                               pool_temperature=pool_temperature, pool_backend=pool_backend,
                               pool_batch=pool_batch)
        target_file = models_dir / target_name / "model.ckpt.data-00000-of-00001"
        made_with = {"target_sha256": hashlib.sha256(target_file.read_bytes()).hexdigest(), "rows": pool,
                     "prompt_tokens": prompt_tokens, "continued_tokens": continued_tokens,
                     "temperature": pool_temperature}
        pool_rows = load_or_write_pool(pool_file, made_with, lambda: continuations(
            target_params, target_hparams, train, pool, prompt_tokens, continued_tokens, pool_temperature, rng,
            batch_size=pool_batch, backend=pool_backend))
        greedy_held_out = continuations(target_params, target_hparams, held_out, 64, prompt_tokens, continued_tokens,
                                        0.0, np.random.default_rng(0), backend=pool_backend)  # the same rows each run
        agreement = make_continued_agreement(draft_hparams["n_head"], prompt_tokens)

    def metrics():
        found = train_pair.held_out_metrics(evaluate, params, held_out, seq_len)
        if continued:
            found["greedy_continuation_agreement"] = float(agreement(params["draft"], greedy_held_out))
        return found

    log["draft_distillation"] = stage
    stage["evals"].append({"step": 0, **metrics()})
    print("held-out", json.dumps(stage["evals"][-1]), flush=True)
    no_rows = np.zeros((0, seq_len + 1), np.int32)
    data = (train_pair.batches(train, batch_size, seq_len, rng, repeat_share, random_share, encoder.n_vocab)
            if batch_size else itertools.repeat(no_rows))
    no_continued = np.zeros((0, prompt_tokens + continued_tokens), np.int32)
    started = time.perf_counter()
    for step in range(steps):
        rows = pool_rows[rng.integers(0, len(pool_rows), continued)] if continued else no_continued
        params["draft"], opt_state, kl = step_fn(params["draft"], params["target"], opt_state, next(data), rows,
                                                 train_pair.learning_rate(step, steps, lr, warmup))
        if step % 25 == 0:
            print(f"step {step:4d}  draft KL {float(kl):.3f}  {(time.perf_counter() - started) / 60:.1f} min", flush=True)
        if (step + 1) % eval_every == 0 or step == steps - 1:
            evaluation = {"step": step + 1, "minutes": (time.perf_counter() - started) / 60, **metrics()}
            train_pair.write_stage_evaluation(models_dir, draft_name, params["draft"], draft_hparams, bpe_dir, log,
                                              stage, evaluation)


if __name__ == "__main__":
    import fire

    fire.Fire(main)
