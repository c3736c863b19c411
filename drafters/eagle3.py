"""EAGLE-3's draft: a low, a middle and a high layer of the target fused, one draft layer, a readout of its own over a
reduced vocabulary.

Put the paper beside this file: EAGLE-3 (Li et al. 2025, arXiv 2503.01840), beside drafters/eagle.py's EAGLE-1 head.
EAGLE-3 gives up predicting the target's feature: the draft is trained on tokens alone, so it may read more than the
top layer. At a true position i the target's residual streams after three of its n blocks (l, m, h) are
concatenated and projected:

    g_i = fc([a^l_i; a^m_i; a^h_i])                          [3*n_embd] -> [n_embd], no bias
    h_{i+1} = midlayer(g_i, e_{i+1})                          e_{i+1} = wte[x_{i+1}], the target's own embedding
    p(x_{i+2}) = softmax(lm_head(norm(h_{i+1})))              over the draft vocabulary, mapped by d2t

At the next draft step the midlayer reads its own output h in place of g (with the embedding of the token just
drafted), as EAGLE-1's head reads its predicted feature. The draft vocabulary is the draft_vocab_size ids most
frequent in the training data (FR-Spec's choice, drafters/frspec.draft_vocabulary); d2t maps a draft id to its target
id (stored as an offset, target id = draft id + d2t[draft id]), t2d marks the target ids inside; p is zero outside.

Where the kit departs from the reference code (SafeAILab/EAGLE, eagle/traineagle3), and why:
- The midlayer is one GPT-2 block (gpt2.transformer_block, the target's kind of layer, as eagle.py's head) whose
  input is fc over [g; e] (2*n_embd -> n_embd, with a bias: eagle.head_forward, reused as it is), where the reference's
  LLaMA layer norms g and e apart and projects the 2*n_embd concatenation straight to its queries, keys and values,
  its residual being g alone. Both read the pair and return a vector of n_embd; the concatenation's order
  ([g; e] here, [e; g] there) is a permutation of the fc's rows and changes nothing.
- norm is GPT-2's layer norm, where the reference has LLaMA's RMSNorm: the target's family of norm.
- The taps default to the reference's blocks 2, n/2 and n-3 (after blocks 2, 4 and 5 of the bundled 8); a head keeps
  the ones it was trained on (head.json's "layers"), any increasing blocks 1..n_layer, as many as fc's width holds.
- No position embedding in the draft (eagle.py's reason: the streams carry their positions), where the reference's
  layer applies rotary positions.

K: the draft steps of a chain, and the depth of a tree (drafters/eagle2.py's levels of drafted tokens). The
reference's `depth` counts the expansions after the first readout, so its trees have depth + 1 levels: its depth d
is K = d + 1 here (its default 5 is K 6), and its total_tokens is n_nodes + 1 (the root counted).

Training (tools/train_eagle3.py, run as tools/train_heads.py eagle3) is the reference's: the token loss alone under
the training-time test of 7 steps, the vocabulary the training tokens' most frequent ids.

Exactness is Algorithm 2's, as for every drafter: each draft is drawn from exactly the p returned, made by
sampling.logits_to_probs from logits that are -inf outside the vocabulary, so p is zero there and the verifier's
residual brings those tokens back. What the head is and how it is trained changes acceptance only.

Cost: the target keeps the tapped streams beside its cache (gpt2.GPT2Model.tap, drafters/features.true_states), so
reading them costs no forward; a draft step is the midlayer and a readout over draft_vocab_size ids, not n_vocab.
"""

import numpy as np

import gpt2
from drafters import eagle
from drafters.eagle2 import EagleTree
from drafters.features import tap_also, true_states
from drafters.frspec import spread_logits
from drafters.heads import check_shapes, increasing_blocks, increasing_target_ids


def default_layers(n_layer):  # -> the blocks after which the reference taps the residual stream: 2, n/2, n-3
    layers = (2, n_layer // 2, n_layer - 3)
    if list(layers) != sorted(set(layers)) or layers[0] < 1:
        raise ValueError(f"a target of {n_layer} blocks has no three distinct taps at 2, n/2 and n-3: name them")
    return layers


def init_head(hparams, rng, draft_vocab_size, n_taps=3):
    """A random EAGLE-3 head: fc [n_taps*n_embd, n_embd] (no bias), the midlayer (eagle.init_head: its fc over 2*n_embd
    and one GPT-2 block), norm, lm_head [n_embd, draft_vocab_size] (no bias); GPT-2's init (normal, std 0.02)."""
    n_embd = hparams["n_embd"]
    normal = lambda *shape: (0.02 * rng.standard_normal(shape)).astype(np.float32)
    return {"fc": {"w": normal(n_taps * n_embd, n_embd)}, "midlayer": eagle.init_head(hparams, rng),
            "norm": {"g": np.ones(n_embd, np.float32), "b": np.zeros(n_embd, np.float32)},
            "lm_head": {"w": normal(n_embd, draft_vocab_size)}}


def vocabulary_d2t(vocabulary):  # sorted target ids [size] -> d2t [size]: the offset from each draft id to its id
    return np.asarray(vocabulary, np.int64) - np.arange(len(vocabulary))


def d2t_vocabulary(d2t):  # d2t [size] -> the target id of each draft id [size]
    return np.arange(len(d2t)) + np.asarray(d2t, np.int64)


def fuse(residuals, head):  # taps x [n, n_embd] -> g [n, n_embd]: fc over the streams, low to high, concatenated
    xp = gpt2.array_module(residuals[0])  # NumPy here; jax.numpy in a trainer's jitted step
    return xp.concatenate(list(residuals), axis=-1) @ head["fc"]["w"]


def draft_logits(hidden, head):  # [..., n_embd] -> [..., draft_vocab_size]: lm_head(norm(h))
    return gpt2.layer_norm(hidden, **head["norm"]) @ head["lm_head"]["w"]


class Eagle3Draft(EagleTree):
    """EAGLE-3's head drafting a chain (`propose`) or EAGLE-2's tree (`draft_tree`) for a gpt2.GPT2Model or
    JaxGPT2Model target, whose tapped streams and embedding it reads; d2t: the head's draft vocabulary, as offsets;
    layers: the blocks it fuses (default_layers)."""

    def __init__(self, target, head, n_nodes, d2t, layers=None):
        n_embd, n_layer = target.hparams["n_embd"], target.hparams["n_layer"]
        layers = default_layers(n_layer) if layers is None else tuple(layers)
        if not increasing_blocks(layers, n_layer):  # the rule head.json's "layers" is checked by
            raise ValueError(f"the head's layers must be increasing blocks 1..{n_layer}, got {list(layers)}")
        self.layers = tuple(int(layer) for layer in layers)
        if not increasing_target_ids(d2t, target.n_vocab):  # and its "d2t"
            raise ValueError(f"d2t must map the draft ids to increasing target ids in [0, {target.n_vocab})")
        self.vocabulary = d2t_vocabulary(d2t)  # sorted and unique
        check_shapes(head, {"fc/w": (len(self.layers) * n_embd, n_embd), "lm_head/w": (n_embd, len(d2t))}, "the head",
                     f"{len(self.layers)} taps of a target of n_embd {n_embd} and {len(d2t)} draft ids")
        super().__init__(target, head["midlayer"], n_nodes)  # self.head: the midlayer, as eagle.head_forward reads it
        self.eagle3 = head
        self.t2d = np.isin(np.arange(self.n_vocab), self.vocabulary)  # [n_vocab]: inside the draft vocabulary
        self.tap_streams()

    def tap_streams(self):  # the target's verifications from now on keep the streams fc fuses, after self.layers
        tap_also(self.target, self.layers)

    def true_reads(self, x, start):  # [n] -> g at x's positions from start on [n - start, n_embd]
        *residuals, _ = true_states(self.target, x, start, self.layers)
        return fuse(residuals, self.eagle3)

    def readout(self, predicted):  # [m, n_embd] -> logits [m, n_vocab], -inf outside the draft vocabulary
        return spread_logits(draft_logits(predicted, self.eagle3), self.vocabulary, self.n_vocab)

    def draft_tree(self, x, K, n_drafts, settings, stats):  # -> TokenTree: EagleTree's, no child outside
        return super().draft_tree(x, K, min(n_drafts, len(self.vocabulary)), settings, stats)
