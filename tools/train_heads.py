"""Train a drafter's head on the frozen bundled target: EAGLE's feature head, Medusa's heads, Kangaroo's adapter.

    python tools/build_corpus.py                     # once: build/corpus/train.txt
    python tools/train_heads.py eagle                # -> models/teach-eagle
    python tools/train_heads.py eagle3               # -> models/teach-eagle3 (tools/train_eagle3.py)
    python tools/train_heads.py medusa               # -> models/teach-medusa
    python tools/train_heads.py kangaroo             # -> models/teach-kangaroo

The target (models/teach-target) never changes. The head sees the training split only (build/corpus/train.txt;
the held-out split stays unseen, its evaluations too), less its last validation_tokens, which measure it. A recipe
is kept or dropped by the head's α at K 4 on the bench's development split, never on the test split that reports it:
`python bench/spec_bench.py --at_K4_only --at_K4_split dev --drafters draft,eagle-chain,eagle-tree`. Each batch is
windows of seq_len + 1 tokens, and the target's features for them are computed inside the same jitted step. The loss
is the paper's:

- EAGLE (Li et al. 2024, arXiv 2401.15077): the head reads the target's feature f_i beside the embedding of token
  i+1 and predicts f_{i+1}: smooth L1 between predicted and true features, plus 0.1 times the cross-entropy from
  the target's next-token distribution (f_{i+1} read out) to the head's (the prediction read out through the same
  frozen unembedding); --classification_weight sets that 0.1 (EAGLE-3 drops the feature loss for the token loss
  alone). Uniform noise U(-0.1, 0.1) on the input features teaches the head to read its own imperfect predictions,
  which is what it reads from the second draft step on. With --unroll D the head is also
  trained on those predictions themselves: EAGLE-3's training-time test (Li et al. 2025, arXiv 2503.01840). Draft
  step d reads the head's own pairs of steps 2..d after the true ones (unrolled_mask), and the loss is the mean over
  the D steps; at temperature 0 a chain's step d is accepted only if steps 1..d-1 were, so the tokens beside those
  predicted features are the text's own. With --taps 2,4 the head also reads EAGLE-3's fusion of lower layers
  (drafters/eagle.fused_features): the residual stream after those blocks, normed as the next block norms it, through
  a matrix per block added to f_i at the true positions; the matrices start at zero, so a head continued with taps
  starts as it was (a head that fuses some blocks already keeps fusing them, with or without --taps).
- EAGLE-3 (Li et al. 2025, arXiv 2503.01840), its own draft (drafters/eagle3.py): the token loss alone, over a draft
  vocabulary of --draft_vocab_size ids, under the training-time test of 7 steps weighted 0.8^i (tools/train_eagle3.py).
- Medusa-1 (Cai et al. 2024, arXiv 2401.10774): head k reads the target's feature at position i and predicts the
  corpus token i+1+k; cross-entropy per head, weighted 0.8^k (drafters/medusa.head_loss); --medusa_labels target:
  the target's distribution of that token instead (soft labels, this kit's variant: medusa.head_distillation_loss).
  The heads' top-ranked tokens are then scored on the validation windows: the accuracies MedusaDraft prunes by.
- Kangaroo (Liu et al. 2024, arXiv 2404.18911): the adapter reads the residual stream after the target's first
  exit_layer blocks; the cross-entropy from the target's own next-token distribution to the adapted exit's
  (distillation).

With --continued N, each step also trains on N of the target's own greedy continuations of training prompts, the
text a speculative run at temperature 0 drafts for: Medusa's self-distillation (Cai et al. 2024, section 2.3.2) and
the on-policy data of DistillSpec (Zhou et al. 2023), as tools/distill_draft.py gives the draft. The target's
features on its own greedy text differ from its features on the corpus, and a head trained on the corpus alone
agrees with the target less there. The pool of --pool continuations is written once (distill_draft.continuations)
into state_dir beside the run's state; evaluations then also score the head on greedy continuations of validation
prompts (their prompt_tokens included).

The run saves its whole state (head, optimiser, sampler, log) atomically to state_dir every save_minutes, and the
same command run again resumes from it. The sampler starts from --seed, which also makes the pool; a run continuing a
head (--init_from) passes a --data_seed of its own to draw other windows and pool rows than the run before it drew.
At every evaluation it writes the head (drafters/heads.py) to out_dir/<name>, its head.json holding the recipe and the
log, so a usable head exists however far it got.
"""

import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import gpt2
import utils
from drafters import eagle, kangaroo, medusa
from drafters.early_exit import default_exit_layer
from drafters.heads import load_head, save_head
from kvcache.tree import MASKED
from tools import train_pair
from tools.distill_draft import continuations, load_or_write_pool

TARGET = "teach-target"
NOISE = 0.1  # EAGLE's U(-0.1, 0.1) on the input features
CLASSIFICATION_WEIGHT = 0.1  # EAGLE's weight on the token cross-entropy beside the feature regression


def target_features(target_params, n_head, window, taps=()):  # [seq] -> [seq, n_embd]: the frozen target's f
    """The target's state after ln_f at each position (with taps: the residual stream after those blocks first)."""
    states, _ = gpt2.hidden_states(window, **target_params, n_head=n_head, cache=None, start=0, taps=taps)
    states = [jax.lax.stop_gradient(state) for state in states]
    return states if taps else states[-1]


def smooth_l1(predicted, true):  # [..., n_embd] x2 -> [...]: mean over features, beta 1 (PyTorch's SmoothL1Loss)
    difference = jnp.abs(predicted - true)
    return jnp.mean(jnp.where(difference < 1, 0.5 * difference**2, difference - 0.5), axis=-1)


def soft_cross_entropy(target_logits, logits):  # [..., n_vocab] x2 -> [...]: -sum p_target log p_head
    return -jnp.sum(jax.nn.softmax(target_logits) * jax.nn.log_softmax(logits), axis=-1)


def unrolled_mask(n, depth):  # -> [depth*n, depth*n]: rows and columns ordered (step, slot), step by step
    """Who sees whom when `depth` chain draft steps are taught at once, at every slot 0..n-1 of a window. Step 1 at
    slot s is the head reading the true pair at slot s (causal over the true pairs). Step d at slot s drafts the same
    position as step 1 at slot s, but after the true pairs up to slot s-d+1 only: it sees those, and the head's own
    pairs of steps 2..d at slots s-d+2..s, one per step, as EagleDraft.propose's d-th step sees its cache."""
    step, slot = np.repeat(np.arange(depth), n), np.tile(np.arange(n), depth)
    query_step, query_slot, key_step, key_slot = step[:, None], slot[:, None], step[None, :], slot[None, :]
    true_pair = (key_step == 0) & (key_slot <= query_slot - query_step)
    own_pair = (key_step >= 1) & (key_step <= query_step) & (key_slot == query_slot - query_step + key_step)
    return np.where(true_pair | own_pair, 0.0, MASKED).astype(np.float32)


def mean_by_step(values):  # [depth, n] -> [depth]: each step's mean over the slots it drafts from (unrolled_mask)
    depth, n = values.shape
    drafts = np.arange(n)[None, :] >= np.arange(depth)[:, None]  # step d (1-based) from slot d-1 on
    return jnp.sum(values * drafts, axis=1) / drafts.sum(axis=1)


class Eagle:
    """EAGLE's head: predicted feature f^_{i+1} = head(f_i + noise, token_{i+1}), read out as the target reads f."""

    name, default_out, eval_depth = "eagle", "teach-eagle", 4  # agreement is reported for draft steps 1..K = 4

    def __init__(self, hparams, unroll=1, classification_weight=CLASSIFICATION_WEIGHT, taps=()):
        self.n_head, self.unroll, self.classification_weight = hparams["n_head"], unroll, classification_weight
        self.taps = tuple(taps)

    def init(self, hparams, rng, target_params):
        return self.start(eagle.init_head(hparams, rng))

    def start(self, head):  # a fresh or loaded head, given a zero fuse matrix for each of --taps it lacks
        return eagle.init_fuse(head, self.taps)

    def features(self, head, target_params, window):  # -> the true f [seq, n_embd], what the head reads of them
        taps = eagle.head_taps(head)  # the blocks the head fuses: --taps, and those of the head it continues
        if not taps:
            features = target_features(target_params, self.n_head, window)
            return features, features
        *residuals, features = target_features(target_params, self.n_head, window, taps)
        return features, eagle.fused_features(features, residuals, head, eagle.tap_norms(target_params, taps))

    def predicted(self, head, wte, features, window, depth):  # -> f^ at draft steps 1..depth, [depth, seq-1, n_embd]
        """Step d's prediction at slot s is of f_{s+1}, as is every step's: see unrolled_mask."""
        n, tokens = len(window) - 1, window[1:]  # slot s: the pair (feature, x_{s+1})
        mask = unrolled_mask(n, depth)
        inputs, paired = features[:-1], tokens  # step 1 reads the true features
        for step in range(1, depth + 1):  # one block: steps <= d come out the same however many steps follow
            predicted = eagle.head_forward(inputs, paired, head, wte, self.n_head, None, 0, mask[:step * n, :step * n])
            if step < depth:  # step d+1 at slot s reads step d's prediction at slot s-1 (slot 0's is never seen)
                latest = predicted[-n:]
                inputs = jnp.concatenate([inputs, jnp.zeros_like(latest[:1]), latest[:-1]])
                paired = jnp.concatenate([paired, tokens])
        return predicted.reshape(depth, n, -1)

    def loss(self, head, target_params, window, key):  # one window [seq] -> scalar
        features, read = self.features(head, target_params, window)
        noisy = read + jax.random.uniform(key, read.shape, minval=-NOISE, maxval=NOISE)
        predicted = self.predicted(head, target_params["wte"], noisy, window, self.unroll)
        true, unembedding = features[1:], target_params["wte"].T  # no noise on what it must predict
        losses = smooth_l1(predicted, true) + self.classification_weight * soft_cross_entropy(
            true @ unembedding, predicted @ unembedding)  # [depth, n]
        return jnp.mean(mean_by_step(losses))  # each step weighs the same

    def metrics(self, head, target_params, window):  # one window -> {name: scalar}, without noise
        features, read = self.features(head, target_params, window)
        predicted = self.predicted(head, target_params["wte"], read, window, self.eval_depth)
        true, unembedding = features[1:], target_params["wte"].T
        by_step = mean_by_step(jnp.argmax(predicted @ unembedding, -1) == jnp.argmax(true @ unembedding, -1))
        return {"feature_loss": jnp.mean(smooth_l1(predicted[0], true)), "top1_agreement": by_step[0],
                **{f"top1_agreement_step{d + 1}": by_step[d] for d in range(1, self.eval_depth)}}

    def info(self, head, target_params, validation):  # what the drafter needs beside the arrays
        return {}


def agreement(logits, target_logits):  # the share of positions where both argmaxes agree (greedy acceptance)
    return jnp.mean(jnp.argmax(logits, -1) == jnp.argmax(target_logits, -1))


class Medusa:
    """Medusa-1's heads on the target's feature at i, head k predicting the corpus token i+1+k (labels "target": its
    distribution by the target)."""

    name, default_out, n_heads, top = "medusa", "teach-medusa", 4, 4

    def __init__(self, hparams, labels="corpus"):
        self.n_head, self.labels = hparams["n_head"], labels

    def init(self, hparams, rng, target_params):
        return medusa.init_heads(hparams, self.n_heads, rng)

    def features_and_labels(self, target_params, window):  # -> [m, n_embd], [m, n_heads]
        labels = medusa.head_targets(window, self.n_heads)
        return target_features(target_params, self.n_head, window)[:len(labels)], labels

    def loss(self, heads, target_params, window, key):
        if self.labels == "target":  # the features [seq, n_embd] after ln_f: the target's logits are f @ wte.T
            f, unembedding = target_features(target_params, self.n_head, window), target_params["wte"].T
            return medusa.head_distillation_loss(f, f @ unembedding, heads, unembedding)
        features, labels = self.features_and_labels(target_params, window)
        return medusa.head_loss(features, labels, heads, target_params["wte"].T)

    def ranked_hits(self, heads, target_params, window):  # -> [m, n_heads, top]: head k's rank-r token is the label
        features, labels = self.features_and_labels(target_params, window)
        ranked = jnp.argsort(-medusa.head_logits(features, heads, target_params["wte"].T), axis=-1)[..., :self.top]
        return ranked == labels[..., None]

    def metrics(self, heads, target_params, window):
        top1 = jnp.mean(self.ranked_hits(heads, target_params, window)[..., 0], axis=0)  # [n_heads]
        return {f"head{k + 1}_top1": top1[k] for k in range(self.n_heads)}

    def info(self, heads, target_params, validation):  # the measured accuracies MedusaDraft prunes its tree by
        hits = jax.jit(jax.vmap(self.ranked_hits, in_axes=(None, None, 0)))(heads, target_params, validation)
        return {"accuracies": [[round(float(share), 4) for share in head] for head in jnp.mean(hits, axis=(0, 1))]}


class Kangaroo:
    """Kangaroo's adapter on the exit after the target's first exit_layer blocks, distilled from the target."""

    name, default_out = "kangaroo", "teach-kangaroo"

    def __init__(self, hparams):
        self.n_head, self.exit_layer = hparams["n_head"], default_exit_layer(hparams["n_layer"])

    def init(self, hparams, rng, target_params):
        return kangaroo.init_adapter(hparams, rng, target_params["ln_f"])

    def logits(self, adapter, target_params, window):  # -> the adapted exit's logits, the target's: [seq, n_vocab] x2
        exit_state, features = target_features(target_params, self.n_head, window, taps=(self.exit_layer,))
        adapted = kangaroo.adapter_forward(exit_state, adapter, self.n_head, None, 0)
        unembedding = target_params["wte"].T
        return adapted @ unembedding, features @ unembedding

    def loss(self, adapter, target_params, window, key):
        logits, target_logits = self.logits(adapter, target_params, window)
        return jnp.mean(soft_cross_entropy(target_logits, logits))

    def metrics(self, adapter, target_params, window):
        logits, target_logits = self.logits(adapter, target_params, window)
        return {"distillation_loss": jnp.mean(soft_cross_entropy(target_logits, logits)),
                "top1_agreement": agreement(logits, target_logits)}

    def info(self, adapter, target_params, validation):
        return {"exit_layer": self.exit_layer}


KINDS = {kind.name: kind for kind in (Eagle, Medusa, Kangaroo)}


def eagle3_kind(hparams, train, draft_vocab_size):  # EAGLE-3's draft over the training tokens' most frequent ids
    from tools import train_eagle3  # imported here: it builds on this module's Eagle

    size = train_eagle3.DRAFT_VOCAB_SIZE if draft_vocab_size is None else draft_vocab_size
    if not isinstance(size, int) or not 1 <= size <= hparams["n_vocab"]:
        raise SystemExit(f"train_heads: --draft_vocab_size must be a whole number in 1..{hparams['n_vocab']}")
    return train_eagle3.Eagle3(hparams, train_eagle3.training_vocabulary(train, hparams["n_vocab"], size))


def make_step(kind):
    def rows_loss(head, target_params, rows, key):  # [n_rows, length] -> the mean of the rows' losses
        keys = jax.random.split(key, len(rows))
        return jnp.mean(jax.vmap(kind.loss, in_axes=(None, None, 0, 0))(head, target_params, rows, keys))

    def batch_loss(head, target_params, batch, continued, key):  # each row weighs the same, window or continuation
        groups = [rows for rows in (batch, continued) if len(rows)]
        keys = [key] if len(groups) == 1 else jax.random.split(key, len(groups))  # one group: unsplit, as before --continued
        parts = [(len(rows), rows_loss(head, target_params, rows, row_key)) for rows, row_key in zip(groups, keys)]
        return sum(n * loss for n, loss in parts) / sum(n for n, _ in parts)

    @jax.jit
    def step(head, opt_state, target_params, batch, continued, key, lr):
        value, grads = jax.value_and_grad(batch_loss)(head, target_params, batch, continued, key)
        head, opt_state = train_pair.adamw_update(head, grads, opt_state, lr, weight_decay=0.0)
        return head, opt_state, value

    return step


def validation_metrics(kind, head, target_params, windows, batch_size=8):  # -> {name: mean over the windows}
    evaluate = jax.jit(jax.vmap(kind.metrics, in_axes=(None, None, 0)))
    sums = {}
    for start in range(0, len(windows), batch_size):
        for name, values in evaluate(head, target_params, windows[start:start + batch_size]).items():
            sums[name] = sums.get(name, 0.0) + float(jnp.sum(values))
    return {name: total / len(windows) for name, total in sums.items()}


def main(drafter, models_dir="models", corpus_dir="build/corpus", out_name=None, steps=2000, batch_size=8,
         seq_len=256, lr=1e-3, warmup=100, seed=0, eval_every=250, validation_tokens=200_000,
         state_dir="~/.cache/speculative-sampling-kit/train_heads", save_minutes=5.0, init_from=None, continued=0,
         pool=4096, prompt_tokens=32, continued_tokens=160, unroll=1, classification_weight=CLASSIFICATION_WEIGHT,
         taps=(), data_seed=None, draft_vocab_size=None, medusa_labels="corpus"):
    """Train `drafter`'s head (one of KINDS) for `steps` steps of batch_size windows; write it to
    models_dir/out_name (the kind's default name) at every evaluation; resume from state_dir/drafter. init_from: a
    head folder to start from instead of a fresh head (a committed head, trained on in a later session: the state
    in state_dir does not outlive the machine). continued: rows per step drawn from a pool of `pool` greedy
    continuations of the target (prompt_tokens training tokens, then continued_tokens it wrote), beside the
    batch_size windows. unroll (EAGLE's head only): the draft steps each window teaches, the head reading its own
    predicted features from the second on. classification_weight (EAGLE's head only): the token cross-entropy's
    weight beside the feature regression. data_seed: the sampler's seed for windows and pool rows (default seed, which
    also makes the pool): a run continuing a head gives a new one, or it replays the data the earlier run drew.
    draft_vocab_size (EAGLE-3 only): the draft vocabulary's size (tools/train_eagle3.DRAFT_VOCAB_SIZE). medusa_labels
    (Medusa only): "corpus", the text's tokens (Medusa-1), or "target", the target's distribution of them."""
    if drafter not in (*KINDS, "eagle3"):
        raise SystemExit(f"train_heads: unknown drafter {drafter!r}: choose one of {', '.join(KINDS)}, eagle3")
    if unroll != 1 and (drafter != "eagle" or not isinstance(unroll, int) or unroll < 1):
        raise SystemExit("train_heads: --unroll must be a whole number of draft steps >= 1, for eagle only")
    if classification_weight != CLASSIFICATION_WEIGHT and (
            drafter != "eagle" or not isinstance(classification_weight, (int, float)) or classification_weight < 0):
        raise SystemExit("train_heads: --classification_weight must be a number >= 0, for eagle only")
    if data_seed is not None and not isinstance(data_seed, int):
        raise SystemExit("train_heads: --data_seed must be a whole number")
    if draft_vocab_size is not None and drafter != "eagle3":
        raise SystemExit("train_heads: --draft_vocab_size is for eagle3 only")
    if medusa_labels != "corpus" and (drafter != "medusa" or medusa_labels != "target"):
        raise SystemExit("train_heads: --medusa_labels must be corpus or target, for medusa only")
    models_dir, corpus_dir = Path(models_dir), Path(corpus_dir)
    state_dir = Path(state_dir).expanduser() / drafter
    if not (corpus_dir / "train.txt").exists():
        raise SystemExit(f"train_heads: {corpus_dir / 'train.txt'} is missing: build it with python tools/build_corpus.py")
    encoder, hparams, target_params = utils.load_encoder_hparams_and_params(TARGET, models_dir)
    taps = (taps,) if isinstance(taps, int) else tuple(taps)
    if taps and (drafter != "eagle" or not all(isinstance(n, int) for n in taps) or list(taps) != sorted(set(taps))
                 or not 1 <= taps[0] <= taps[-1] < hparams["n_layer"]):
        raise SystemExit(f"train_heads: --taps must be increasing layers 1..{hparams['n_layer'] - 1}, for eagle only")
    state_dir.mkdir(parents=True, exist_ok=True)
    tokens = train_pair.load_tokens(corpus_dir / "train.txt", encoder, state_dir / "train_tokens.npy",
                                    vocabulary_file=models_dir / TARGET / "encoder.json")
    train, validation = tokens[:-validation_tokens], tokens[-validation_tokens:]
    n_windows = min(64, (len(validation) - 1) // (seq_len + 1))
    validation_windows = np.stack([validation[i * (seq_len + 1):(i + 1) * (seq_len + 1)]
                                   for i in range(n_windows)]).astype(np.int32)
    kind = (KINDS[drafter](hparams, unroll, classification_weight, taps) if drafter == "eagle"
            else eagle3_kind(hparams, train, draft_vocab_size) if drafter == "eagle3"
            else KINDS[drafter](hparams, medusa_labels) if drafter == "medusa" else KINDS[drafter](hparams))
    recipe = {"drafter": drafter, "steps": steps, "batch_size": batch_size, "seq_len": seq_len, "lr": lr,
              "warmup": warmup, "seed": seed, "target": TARGET, "validation_tokens": validation_tokens,
              **({"init_from": str(init_from)} if init_from else {}), **({"unroll": unroll} if unroll > 1 else {}),
              **({"classification_weight": classification_weight}
                 if classification_weight != CLASSIFICATION_WEIGHT else {}), **({"taps": list(taps)} if taps else {}),
              **({"data_seed": data_seed} if data_seed is not None else {}),
              **({"draft_vocab_size": draft_vocab_size} if draft_vocab_size is not None else {}),
              **({"medusa_labels": medusa_labels} if medusa_labels != "corpus" else {}),
              **({"continued": continued, "pool": pool, "prompt_tokens": prompt_tokens,
                  "continued_tokens": continued_tokens} if continued else {})}
    pool_rows = greedy_rows = np.zeros((0, prompt_tokens + continued_tokens), np.int32)
    if continued:  # each from a generator of its own: the run's sampler state does not depend on them
        made_with = {"target": TARGET, "rows": pool, "prompt_tokens": prompt_tokens,
                     "continued_tokens": continued_tokens, "temperature": 0.0, "seed": seed}
        pool_rows = load_or_write_pool(state_dir / "pool.npz", made_with, lambda: continuations(
            target_params, hparams, train, pool, prompt_tokens, continued_tokens, 0.0, np.random.default_rng(seed)))
        greedy_rows = continuations(target_params, hparams, validation, 64, prompt_tokens, continued_tokens, 0.0,
                                    np.random.default_rng(seed + 1))
    state = train_pair.load_state(state_dir, recipe)
    if state is None:
        rng = np.random.default_rng(seed if data_seed is None else data_seed)
        initial, earlier = load_head(init_from, drafter) if init_from else (kind.init(hparams, rng, target_params), {})
        initial = kind.start(initial) if drafter == "eagle" else initial
        if "d2t" in earlier and earlier["d2t"] != kind.info(initial, target_params, None)["d2t"]:
            raise SystemExit(f"train_heads: {init_from} drafts over another vocabulary than this run's tokens give")
        head = jax.tree.map(jnp.asarray, initial)
        log = {"recipe": recipe, "jax": jax.__version__, "device": str(jax.devices()[0].device_kind),
               "train_tokens": int(len(train)), "evals": [], "steps_done": 0, "minutes": 0.0,
               **({"continued_from": earlier["training"]} if "training" in earlier else {})}
        state = {"params": head, "opt_state": train_pair.adamw_init(head), "log": log, "rng": rng.bit_generator.state}
    else:
        print(f"resuming {state_dir / 'state.pkl'} at step {state['log']['steps_done']}", flush=True)
    rng = np.random.default_rng()
    rng.bit_generator.state = state["rng"]
    head, opt_state, log = jax.tree.map(jnp.asarray, state["params"]), state["opt_state"], state["log"]
    target_params = jax.tree.map(jnp.asarray, target_params)
    step_fn, out_name = make_step(kind), out_name or kind.default_out
    print(f"{drafter}: {len(train):,} training tokens, {n_windows} validation windows, to {models_dir / out_name}",
          flush=True)

    def save_state():  # the sampler's state goes with the step it serves next: a resumed run sees the same data
        train_pair.save_state(state_dir, {"params": head, "opt_state": opt_state, "log": log,
                                          "rng": rng.bit_generator.state})

    started, minutes_before, last_save = time.perf_counter(), log["minutes"], time.perf_counter()
    data = train_pair.batches(train, batch_size, seq_len, rng)
    for step in range(log["steps_done"], steps):
        key = jax.random.PRNGKey(int(rng.integers(2**31)))
        batch = next(data)
        rows = pool_rows[rng.integers(0, len(pool_rows), continued)] if continued else pool_rows
        head, opt_state, loss = step_fn(head, opt_state, target_params, batch, rows, key,
                                        train_pair.learning_rate(step, steps, lr, warmup))
        log.update(steps_done=step + 1, minutes=minutes_before + (time.perf_counter() - started) / 60)
        if step % 50 == 0:
            print(f"step {step:5d}  loss {float(loss):.4f}  {log['minutes']:.1f} min", flush=True)
        if (step + 1) % eval_every == 0 or step == steps - 1:
            metrics = validation_metrics(kind, head, target_params, validation_windows)
            if continued:
                metrics.update({f"greedy_{name}": value for name, value in
                                validation_metrics(kind, head, target_params, greedy_rows).items()})
            log["evals"].append({"step": step + 1, "minutes": round(log["minutes"], 2), **metrics})
            print("validation", json.dumps({k: round(v, 4) for k, v in metrics.items()}), flush=True)
            info = {"drafter": drafter, "target": TARGET, "target_hparams": hparams,
                    **kind.info(head, target_params, validation_windows), "training": log}
            save_head(models_dir / out_name, jax.tree.map(np.asarray, head), info)
        if time.perf_counter() - last_save > 60 * save_minutes or step == steps - 1:
            save_state()
            last_save = time.perf_counter()
    print(f"wrote {models_dir / out_name} after {log['minutes']:.1f} min", flush=True)


if __name__ == "__main__":
    import fire

    fire.Fire(main)
