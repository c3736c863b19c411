"""A stage for the bundled target: train it against its own greedy loops (sequence-level unlikelihood).

A small language model continued greedily falls into loops (`self,` over and over), and one that has
learnt to copy from its context falls into them sooner: once a phrase has been written twice, copying
predicts a third time. Welleck et al. (2020, "Neural Text Generation with Unlikelihood Training") train
against it directly. Each step here continues a few training prompts greedily with the current target,
marks every token of the continuation that belongs to a 4-gram the continuation has already written, and
adds -log(1 - p(token)) for those tokens to the usual cross-entropy on training windows. Only repeats
inside the continuation count, so copying from the prompt (what prompt lookup and the copy bar reward)
is never penalised. The draft is left as it is: distil it again afterwards (tools/distill_draft.py).

    python tools/unlikelihood_target.py --models_dir PAIR --tokens build/pack/tokens.npz --bpe_dir build/pack
"""

import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from tools import train_pair
import utils
from encoder import get_encoder_from_dir
from batching import gpt2_batched
from cli import backends


def repeated_ngram_mask(tokens, start, n=4):
    """[len(tokens)] bool: True on each token from `start` on that lies in an n-gram which already occurs
    earlier in tokens[start:] (the continuation), Welleck et al.'s candidates for sequence-level unlikelihood."""
    mask = np.zeros(len(tokens), dtype=bool)
    seen = set()
    for i in range(start, len(tokens) - n + 1):
        gram = tuple(tokens[i:i + n])
        if gram in seen:
            mask[i:i + n] = True
        seen.add(gram)
    return mask


def unlikelihood(logits, tokens, mask):
    """Mean over positions of -log(1 - p(token)) where mask is set; logits [batch, seq, n_vocab] predict tokens."""
    others = jnp.where(jax.nn.one_hot(tokens, logits.shape[-1], dtype=bool), -jnp.inf, logits)
    # log(1 - p) from the other tokens' logits: exact, and with a gradient, even where p rounds to 1
    log_not_token = jax.nn.logsumexp(others, axis=-1) - jax.nn.logsumexp(logits, axis=-1)
    return -jnp.mean(jnp.where(mask, log_not_token, 0.0))


def make_step(n_head, alpha):
    def loss(params, batch, continued, mask):
        text_loss = train_pair.cross_entropy(train_pair.batched_logits(params, n_head, batch[:, :-1]), batch[:, 1:])
        loop_logits = train_pair.batched_logits(params, n_head, continued[:, :-1])
        loop_loss = unlikelihood(loop_logits, continued[:, 1:], mask[:, 1:])
        return text_loss + alpha * loop_loss, (text_loss, loop_loss)

    @jax.jit
    def step(params, opt_state, batch, continued, mask, lr):
        grads, losses = jax.grad(loss, has_aux=True)(params, batch, continued, mask)
        params, opt_state = train_pair.adamw_update(params, grads, opt_state, lr)
        return params, opt_state, losses

    return step


def greedy_continuations(params, hparams, prompts, n_tokens, backend="numpy"):
    """[len(prompts), prompt length + n_tokens] int32: each prompt (all of one length) continued greedily by the
    target as it is now, all of them in one batched forward pass a token: on the host (batching/sampling_batched.py,
    the plain layout, as the weights change every step) or, backend "jax", by jax_backend's device loop."""
    if backend == "numpy":
        model = gpt2_batched.BatchedGPT2Model(jax.tree.map(np.asarray, params), hparams, len(prompts), layout="plain")
    else:
        model = backends.make_batched_model(params, hparams, len(prompts), backend)
    decoders = backends.batched_decoders(model)
    return np.stack(decoders.autoregressive_sampling(prompts, model, n_tokens, temperature=0)).astype(np.int32)


def main(models_dir="models", corpus_dir="build/corpus", bpe_dir="build/bpe4096", steps=600, batch_size=8,
         n_prompts=4, prompt_tokens=32, n_tokens=96, ngram=4, alpha=1.0, lr=1e-4, warmup=10, seed=2,
         eval_every=200, repeat_share=0.0, twice_share=0.0, target_name="teach-target", draft_name="teach-draft",
         tokens=None, backend="numpy"):
    """Train the target in models_dir for `steps` steps: cross-entropy on batch_size training windows plus alpha
    times the unlikelihood of the repeated `ngram`-grams in n_prompts greedy continuations of n_tokens tokens
    (prompts of prompt_tokens training tokens). The target is rewritten in place at every evaluation, with this
    stage's recipe and evaluations under "target_unlikelihood" in models_dir's training_log.json.
    repeat_share, twice_share: the shares of training windows that repeat one of their spans and that end in a span
    written twice (train_pair.batches): cross-entropy there rewards copying from the context, while the
    unlikelihood term penalises repeating the continuation's own text.
    tokens: a tokens.npz from tools/pack_corpus.py, read instead of corpus_dir (its vocabulary must be bpe_dir's).
    backend: where the greedy continuations are decoded, numpy or, on an accelerator, jax."""
    models_dir, corpus_dir, bpe_dir = Path(models_dir), Path(corpus_dir), Path(bpe_dir)
    encoder = get_encoder_from_dir(bpe_dir)
    train, held_out = train_pair.load_splits(corpus_dir, bpe_dir, encoder, tokens)
    _, hparams, target_params = utils.load_encoder_hparams_and_params(target_name, models_dir)
    _, draft_hparams, draft_params = utils.load_encoder_hparams_and_params(draft_name, models_dir)
    params = {"target": jax.tree.map(jnp.asarray, target_params), "draft": jax.tree.map(jnp.asarray, draft_params)}
    seq_len = hparams["n_ctx"]
    step_fn = make_step(hparams["n_head"], alpha)
    evaluate = train_pair.make_evaluate(hparams["n_head"], draft_hparams["n_head"])
    opt_state = train_pair.adamw_init(params["target"])
    rng = np.random.default_rng(seed)

    log = json.loads((models_dir / "training_log.json").read_text())
    recipe = {"steps": steps, "batch_size": batch_size, "n_prompts": n_prompts, "prompt_tokens": prompt_tokens,
              "n_tokens": n_tokens, "ngram": ngram, "alpha": alpha, "lr": lr, "warmup": warmup, "seed": seed,
              "repeat_share": repeat_share, **({"twice_share": twice_share} if twice_share else {}),
              "tokens": str(tokens) if tokens else None, "backend": backend}
    stage = {"recipe": recipe, "evals": []}
    log["target_unlikelihood"] = stage
    stage["evals"].append({"step": 0, **train_pair.held_out_metrics(evaluate, params, held_out, seq_len)})
    print("held-out", json.dumps(stage["evals"][-1]), flush=True)
    data = train_pair.batches(train, batch_size, seq_len, rng, repeat_share, twice_share=twice_share)
    started, looped = time.perf_counter(), []
    for step in range(steps):
        starts = rng.integers(0, len(train) - prompt_tokens, n_prompts)
        prompts = [train[s:s + prompt_tokens] for s in starts]
        continued = greedy_continuations(params["target"], hparams, prompts, n_tokens, backend)
        mask = np.stack([repeated_ngram_mask(row, prompt_tokens, ngram) for row in continued])
        looped.append(mask.sum() / (n_prompts * n_tokens))  # the share of greedy tokens inside a repeated n-gram
        params["target"], opt_state, (text_loss, loop_loss) = step_fn(
            params["target"], opt_state, next(data), continued, mask, train_pair.learning_rate(step, steps, lr, warmup))
        if step % 25 == 0:
            print(f"step {step:4d}  text {float(text_loss):.3f}  loops {float(loop_loss):.3f}  "
                  f"looped tokens {np.mean(looped[-25:]):.2f}  {(time.perf_counter() - started) / 60:.1f} min",
                  flush=True)
        if (step + 1) % eval_every == 0 or step == steps - 1:
            metrics = train_pair.held_out_metrics(evaluate, params, held_out, seq_len)
            evaluation = {"step": step + 1, "minutes": (time.perf_counter() - started) / 60,
                          "looped_tokens": float(np.mean(looped[-eval_every:])), **metrics}
            train_pair.write_stage_evaluation(models_dir, target_name, params["target"], hparams, bpe_dir, log, stage,
                                              evaluation)


if __name__ == "__main__":
    import fire

    fire.Fire(main)
