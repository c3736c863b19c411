"""Train the bundled teaching pair: a GPT-2-shaped target and a tiny draft distilled from it.

Both models are gpt2.py's own forward pass run by jax.numpy (one source of model math). They train
together: each step updates the target on next-token cross-entropy and the draft on the KL divergence
from the target's current next-token distribution (distillation), so the draft learns to agree with
the target rather than with the data. The result is written in OpenAI's release layout
(TensorBundle V2 checkpoint, hparams.json, encoder.json, vocab.bpe) and loads through the same code
as OpenAI's GPT-2.

    python tools/build_corpus.py && python tools/train_bpe.py        # corpus and vocabulary in build/
    python tools/train_pair.py --steps 1500                          # about an hour on 2 CPU cores
    python tools/train_pair.py --tokens build/pack/tokens.npz --bpe_dir build/pack ...   # a packed corpus
                                                                     # (tools/pack_corpus.py), no text needed

The recipe scales: raise --steps, --batch_size and the shapes on an accelerator.
"""

import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpt2  # noqa: E402
from encoder import get_encoder_from_dir  # noqa: E402
from engine.tf_checkpoint import write_atomically  # noqa: E402
from tools.pack_corpus import load_packed_tokens  # noqa: E402
from utils import save_gpt2_checkpoint  # noqa: E402

def load_tokens(corpus_file, encoder, cache_file):
    """The corpus as one array of token ids, each document followed by <|endoftext|>; cached on disk beside
    the vocabulary it was encoded with, and encoded again when the corpus or that vocabulary is newer."""
    sources = (corpus_file, cache_file.parent / "encoder.json")
    if cache_file.exists() and cache_file.stat().st_mtime > max(path.stat().st_mtime for path in sources):
        return np.load(cache_file)
    ids = encoder.encode(corpus_file.read_text(encoding="utf-8"), allow_eot=True) + [encoder.eot_token]
    tokens = np.asarray(ids, dtype=np.uint16)
    np.save(cache_file, tokens)
    return tokens


def load_splits(corpus_dir, bpe_dir, encoder, tokens=None):
    """(train, held-out) token arrays: from a tools/pack_corpus.py file when `tokens` names one, else
    encoded from the corpus text (and cached beside the vocabulary)."""
    if tokens:
        return load_packed_tokens(tokens, bpe_dir)
    return (load_tokens(corpus_dir / "train.txt", encoder, bpe_dir / "train_tokens.npy"),
            load_tokens(corpus_dir / "heldout.txt", encoder, bpe_dir / "heldout_tokens.npy"))


def batches(tokens, batch_size, seq_len, rng):
    """Endless random windows of seq_len + 1 tokens: [batch_size, seq_len + 1]."""
    while True:
        starts = rng.integers(0, len(tokens) - seq_len - 1, batch_size)
        yield np.stack([tokens[s:s + seq_len + 1] for s in starts]).astype(np.int32)


def batched_logits(params, n_head, inputs):  # [batch, seq] -> [batch, seq, n_vocab]
    return jax.vmap(lambda seq: gpt2.gpt2(seq, **params, n_head=n_head))(inputs)


def cross_entropy(logits, targets):  # mean negative log-likelihood of targets, in nats
    log_probs = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(log_probs, targets[..., None], axis=-1))


def distillation_kl(teacher_logits, student_logits):  # mean KL(teacher || student) over positions
    teacher = jax.nn.log_softmax(teacher_logits)
    student = jax.nn.log_softmax(student_logits)
    return jnp.mean(jnp.sum(jnp.exp(teacher) * (teacher - student), axis=-1))


def adamw_init(params):
    zeros = jax.tree.map(jnp.zeros_like, params)  # JAX arrays are immutable: m and v may share them
    return {"m": zeros, "v": zeros, "t": jnp.zeros((), jnp.int32)}


def adamw_update(params, grads, state, lr, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8, clip=1.0):
    """AdamW with global-norm gradient clipping; weight decay only on matrices, as nanoGPT does."""
    norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
    grads = jax.tree.map(lambda g: g * jnp.minimum(1.0, clip / (norm + 1e-6)), grads)
    t = state["t"] + 1
    m = jax.tree.map(lambda m, g: beta1 * m + (1 - beta1) * g, state["m"], grads)
    v = jax.tree.map(lambda v, g: beta2 * v + (1 - beta2) * g * g, state["v"], grads)
    correction = jnp.sqrt(1 - beta2**t) / (1 - beta1**t)

    def update(p, m, v):
        decay = weight_decay * p if p.ndim == 2 else 0.0
        return p - lr * (correction * m / (jnp.sqrt(v) + eps) + decay)

    return jax.tree.map(update, params, m, v), {"m": m, "v": v, "t": t}


def learning_rate(step, steps, peak, warmup):
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def make_train_step(target_heads, draft_heads):
    def losses(params, batch):
        inputs, targets = batch[:, :-1], batch[:, 1:]
        target_logits = batched_logits(params["target"], target_heads, inputs)
        draft_logits = batched_logits(params["draft"], draft_heads, inputs)
        target_loss = cross_entropy(target_logits, targets)
        draft_loss = distillation_kl(jax.lax.stop_gradient(target_logits), draft_logits)
        return target_loss + draft_loss, (target_loss, draft_loss)

    @jax.jit
    def train_step(params, opt_state, batch, lr):
        grads, (target_loss, draft_loss) = jax.grad(losses, has_aux=True)(params, batch)
        params, opt_state = adamw_update(params, grads, opt_state, lr)
        return params, opt_state, target_loss, draft_loss

    return train_step


def make_evaluate(target_heads, draft_heads):
    @jax.jit
    def evaluate(params, batch):
        """Held-out cross-entropy of both models and how often their argmaxes agree (greedy acceptance)."""
        inputs, targets = batch[:, :-1], batch[:, 1:]
        target_logits = batched_logits(params["target"], target_heads, inputs)
        draft_logits = batched_logits(params["draft"], draft_heads, inputs)
        agreement = jnp.mean(jnp.argmax(target_logits, -1) == jnp.argmax(draft_logits, -1))
        return cross_entropy(target_logits, targets), cross_entropy(draft_logits, targets), agreement

    return evaluate


def held_out_metrics(evaluate, params, tokens, seq_len, n_windows=64, batch_size=16):
    """Mean metrics over fixed, non-overlapping held-out windows (the same ones on every run)."""
    n_windows = min(n_windows, (len(tokens) - 1) // seq_len)
    windows = np.stack([tokens[i * seq_len:(i + 1) * seq_len + 1] for i in range(n_windows)]).astype(np.int32)
    sums = np.zeros(3)
    for start in range(0, n_windows - batch_size + 1, batch_size):
        sums += np.array([float(v) for v in evaluate(params, windows[start:start + batch_size])])
    target_ce, draft_ce, agreement = sums / (n_windows // batch_size)
    return {"target_loss": target_ce, "target_perplexity": math.exp(target_ce), "draft_loss": draft_ce,
            "draft_perplexity": math.exp(draft_ce), "argmax_agreement": agreement}


def write_model(out_dir, params, hparams, bpe_dir):
    """A model folder in OpenAI's release layout (float16 weights), written beside the destination and
    renamed into place, so an interrupted run never leaves a half-written model."""
    tmp_dir = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    save_gpt2_checkpoint(params, hparams, tmp_dir, dtype=np.float16)
    for name in ("encoder.json", "vocab.bpe"):
        shutil.copyfile(bpe_dir / name, tmp_dir / name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp_dir, out_dir)


def write_pair(out_dir, params, hparams, bpe_dir, names, log):
    for role, name in names.items():
        write_model(out_dir / name, params[role], hparams[role], bpe_dir)
    write_atomically(out_dir / "training_log.json", (json.dumps(log, indent=2) + "\n").encode())


def main(corpus_dir="build/corpus", bpe_dir="build/bpe4096", out_dir="models", steps=1500, batch_size=16,
         seq_len=256, lr=1e-3, warmup=100, seed=0, eval_every=250,
         target_shape=(256, 12, 8), draft_shape=(128, 1, 4), target_name="teach-target", draft_name="teach-draft",
         tokens=None):
    """Train the pair for `steps` steps; shapes are (n_embd, n_layer, n_head); n_ctx is seq_len.
    tokens: a tokens.npz from tools/pack_corpus.py, read instead of corpus_dir (its vocabulary must be bpe_dir's)."""
    corpus_dir, bpe_dir, out_dir = Path(corpus_dir), Path(bpe_dir), Path(out_dir)
    encoder = get_encoder_from_dir(bpe_dir)
    train, held_out = load_splits(corpus_dir, bpe_dir, encoder, tokens)
    print(f"train tokens {len(train):,}, held-out tokens {len(held_out):,}, vocabulary {encoder.n_vocab}", flush=True)

    def hparams_for(shape):
        n_embd, n_layer, n_head = shape
        return {"n_vocab": encoder.n_vocab, "n_ctx": seq_len, "n_embd": n_embd, "n_head": n_head, "n_layer": n_layer}

    hparams = {"target": hparams_for(target_shape), "draft": hparams_for(draft_shape)}
    names = {"target": target_name, "draft": draft_name}
    rng = np.random.default_rng(seed)
    params = {name: jax.tree.map(jnp.asarray, gpt2.init_params(hp, rng)) for name, hp in hparams.items()}
    opt_state = adamw_init(params)
    train_step = make_train_step(hparams["target"]["n_head"], hparams["draft"]["n_head"])
    evaluate = make_evaluate(hparams["target"]["n_head"], hparams["draft"]["n_head"])

    log = {"recipe": {"steps": steps, "batch_size": batch_size, "seq_len": seq_len, "lr": lr, "warmup": warmup,
                      "seed": seed, "hparams": hparams, "tokens": str(tokens) if tokens else None,
                      "jax": jax.__version__,
                      "device": str(jax.devices()[0].device_kind)}, "evals": [],
           "train_tokens": int(len(train)), "held_out_tokens": int(len(held_out))}
    started = time.perf_counter()
    data = batches(train, batch_size, seq_len, rng)
    for step in range(steps):
        batch = next(data)
        params, opt_state, target_loss, draft_loss = train_step(
            params, opt_state, batch, learning_rate(step, steps, lr, warmup))
        if step % 50 == 0 or step == steps - 1:
            target_loss, draft_loss = float(target_loss), float(draft_loss)  # waits for the step to finish
            print(f"step {step:5d}  target {target_loss:.3f}  draft KL {draft_loss:.3f}  "
                  f"{(time.perf_counter() - started) / 60:.1f} min", flush=True)
        if (step + 1) % eval_every == 0 or step == steps - 1:
            metrics = held_out_metrics(evaluate, params, held_out, seq_len)
            metrics.update(step=step + 1, minutes=(time.perf_counter() - started) / 60)
            log["evals"].append(metrics)
            log.update(steps_done=step + 1, tokens_seen=(step + 1) * batch_size * seq_len, minutes=metrics["minutes"])
            write_pair(out_dir, params, hparams, bpe_dir, names, log)  # a usable pair at every evaluation
            print("held-out", json.dumps({k: round(v, 4) for k, v in metrics.items()}), flush=True)

    print(f"wrote {out_dir / target_name} and {out_dir / draft_name} after {log['minutes']:.1f} min", flush=True)


if __name__ == "__main__":
    import fire

    fire.Fire(main)
