"""EAGLE-3's draft (drafters/eagle3.py) as tools/train_heads.py trains it: the token loss alone, under the
training-time test.

    python tools/train_heads.py eagle3                # -> models/teach-eagle3

The loss is EAGLE-3's (Li et al. 2025, arXiv 2503.01840), as its reference trainer (SafeAILab/EAGLE, traineagle3) and
SpecForge compute it: no feature regression; at each draft position the cross-entropy from the target's next-token
distribution restricted to the draft vocabulary (its logits at those ids, renormalised) to the draft's, zero where the
target's own argmax lies outside the vocabulary (the draft could not propose it). The training-time test unrolls
TTT_STEPS draft steps, the draft reading its own output from the second on (train_heads.Eagle.predicted and
unrolled_mask, shared with EAGLE's head), and step i's mean loss weighs STEP_WEIGHT**i. No noise on the fused
features: the unrolled steps already show the draft its own imperfect reads, which is what EAGLE-1's noise stood for.

The draft vocabulary is the --draft_vocab_size ids most frequent in the training tokens the run sees
(drafters/frspec.draft_vocabulary, as tools/draft_vocabulary.py counts them), so it is the run's own and is written
to head.json as d2t beside the blocks fused ("layers").
"""

import jax
import jax.numpy as jnp
import numpy as np

from drafters import eagle3
from drafters.frspec import draft_vocabulary
from tools.train_heads import Eagle, mean_by_step, target_features

TTT_STEPS = 7  # the training-time test's draft steps: EAGLE-3's trainer's length, SpecForge's ttt_length
STEP_WEIGHT = 0.8  # step i (from 0) weighs 0.8^i, as both trainers weigh it
DRAFT_VOCAB_SIZE = 1024  # a quarter of the 4,096 ids, as LLaMA-3.1 8B's drafts keep 32,000 of 128,256


def training_vocabulary(train_tokens, n_vocab, size):  # -> the size ids most frequent in the training tokens, sorted
    return draft_vocabulary(np.bincount(train_tokens, minlength=n_vocab), size)


def token_loss(logits, target_logits, vocabulary, inside):  # [depth, n, size], [n, n_vocab] -> [depth, n]
    """-sum over the draft vocabulary of the target's restricted p times the draft's log p; 0 where the target's
    argmax is outside (inside: [n_vocab] booleans, the reference's t2d)."""
    target_p = jax.nn.softmax(target_logits[:, vocabulary])  # [n, size]
    kept = jnp.asarray(inside)[jnp.argmax(target_logits, axis=-1)]  # [n]
    return -jnp.sum(target_p * jax.nn.log_softmax(logits), axis=-1) * kept


class Eagle3(Eagle):
    """EAGLE-3's draft: fc over the target's streams after default_layers, the midlayer (EAGLE's head, unrolled as the
    chain drafts), norm and lm_head over the training vocabulary."""

    name, default_out, eval_depth = "eagle3", "teach-eagle3", 4  # agreement is reported for draft steps 1..4

    def __init__(self, hparams, vocabulary):
        super().__init__(hparams, unroll=TTT_STEPS)
        self.layers = eagle3.default_layers(hparams["n_layer"])
        self.vocabulary = np.asarray(vocabulary, np.int64)
        self.inside = np.isin(np.arange(hparams["n_vocab"]), self.vocabulary)

    def init(self, hparams, rng, target_params):
        return eagle3.init_head(hparams, rng, len(self.vocabulary), len(self.layers))

    def logits(self, head, target_params, window, depth):  # -> draft's [depth, seq-1, size], target's [seq-1, n_vocab]
        *residuals, features = target_features(target_params, self.n_head, window, self.layers)
        hidden = self.predicted(head["midlayer"], target_params["wte"], eagle3.fuse(residuals, head), window, depth)
        return eagle3.draft_logits(hidden, head), features[1:] @ target_params["wte"].T

    def step_losses(self, head, target_params, window, depth):  # -> each draft step's mean token loss [depth]
        logits, target_logits = self.logits(head, target_params, window, depth)
        return mean_by_step(token_loss(logits, target_logits, self.vocabulary, self.inside))

    def loss(self, head, target_params, window, key):  # one window -> scalar; key unused: no noise
        weights = STEP_WEIGHT ** np.arange(self.unroll)
        return jnp.sum(weights * self.step_losses(head, target_params, window, self.unroll))

    def metrics(self, head, target_params, window):  # the greedy chain's agreement with the target, step by step
        logits, target_logits = self.logits(head, target_params, window, self.eval_depth)
        drafted = jnp.asarray(self.vocabulary)[jnp.argmax(logits, axis=-1)]  # target ids [depth, seq-1]
        by_step = mean_by_step(drafted == jnp.argmax(target_logits, axis=-1))
        losses = mean_by_step(token_loss(logits, target_logits, self.vocabulary, self.inside))
        return {"token_loss": losses[0], "top1_agreement": by_step[0],
                **{f"top1_agreement_step{d + 1}": by_step[d] for d in range(1, self.eval_depth)}}

    def info(self, head, target_params, validation):  # what Eagle3Draft needs beside the arrays
        return {"d2t": eagle3.vocabulary_d2t(self.vocabulary).tolist(), "layers": list(self.layers)}
