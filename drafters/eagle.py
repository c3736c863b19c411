"""EAGLE's draft head as a chain drafter: one transformer block that predicts the target's next feature.

Put the paper beside this file: EAGLE (Li et al. 2024, arXiv 2401.15077). The target's feature f_i is its state
after ln_f at position i, the vector the unembedding reads. The head reads f_i beside the embedding of the token
that follows it, x_{i+1} (the target's own wte, frozen), and predicts f_{i+1}:

    f^_{i+1} = block(concat(f_i, wte[x_{i+1}]) @ fc.w + fc.b)        [2*n_embd] -> [n_embd] -> [n_embd]
    p(x_{i+2}) = logits_to_probs(f^_{i+1} @ wte.T)                      read out as the target reads f_{i+1}

The predicted feature is post-ln_f already, so it goes to the target's unembedding with no norm before it. The
block is GPT-2's (gpt2.transformer_block) with parameters of its own and a KV cache of its own; it has no
position embedding, because the target's features carry their positions.

EAGLE-3 (Li et al. 2025, arXiv 2503.01840) lets the draft read lower layers too (drafters/eagle3.py is its draft as
the paper builds it); this head borrows the fusion alone, keeping EAGLE-1's feature. A head with "fuse" arrays reads, at
the true positions only, f_i + sum over tapped blocks l of ln_1 of block l+1 (residual after block l) @ fuse[l].w
(fused_features); its own predictions, from the second draft step on, it reads as they are. The target keeps the
tapped streams beside its features (gpt2.GPT2Model.tap, asked for by this drafter), so they cost no forward either.

Drafting after x (n tokens): the target's true features exist for x[:-1] only (the call that produced x's last
token scored the positions before it), so head slot j holds the pair (f_j, x_{j+1}), j = 0..n-2, and its output
at slot n-2 drafts x_n. Each further step feeds the head's own prediction beside the token just drafted. After a
verification the slots of true pairs that x still starts with are kept (cache_resume), and the rest are rebuilt
from the target's true features: the drafted pairs are never kept.

Exactness is Algorithm 2's: each drafted token is drawn (sampling.sample) from exactly the p that is returned,
made by sampling.logits_to_probs with the run's settings. How the head is wired, trained or initialised changes
acceptance only (tests/test_drafters_eagle.py plants an off-by-one pairing, f_i beside x_i, and the oracle still
passes it). init_head gives a random head (the tests use one); the committed head is trained by tools/train_heads.py
(models/README.md).

Cost, honestly: EAGLE reuses the features the verification call computes anyway, and so does this drafter. The target
(gpt2.GPT2Model) keeps the state after ln_f of every cache slot it feeds, beside its keys and values; after a
verification its cache holds x[:-1] (the accepted drafts were fed in that call), so the drafter reads those rows
(drafters/features.true_features) and runs no forward of the target at all. The one exception is the first proposal
after a prompt: the target has not read the prompt yet, so true_features feeds x[:-1] through the target's cache
(timed as the draft's, since propose runs it), and the first verification resumes after it: the prompt is still read
once. What a proposal costs beyond that is the head's: refeeding its rolled-back slots, then K steps of one block and
the unembedding each. (A target built with use_cache=False keeps no features: true_features then runs a separate
forward at every proposal, as that target recomputes everything at every call anyway.)
"""

import numpy as np

import gpt2
from drafters.chain import propose_chain
from drafters.features import host_embeddings, tap_also, true_states
from drafters.heads import check_shapes
from kvcache.contract import cache_resume

def init_head(hparams, rng):
    """A random head for a target of hparams' n_embd: fc [2*n_embd, n_embd] with a bias, and one GPT-2 block,
    initialised as GPT-2 initialises its weights (normal, std 0.02; gains 1, biases 0)."""
    n_embd = hparams["n_embd"]
    one_block = gpt2.init_params({"n_vocab": 1, "n_ctx": 1, "n_embd": n_embd, "n_layer": 1}, rng)["blocks"][0]
    fc = {"w": (0.02 * rng.standard_normal((2 * n_embd, n_embd))).astype(np.float32),
          "b": np.zeros(n_embd, np.float32)}
    return {"fc": fc, "block": one_block}


def head_taps(head):  # -> the target's blocks whose residual streams the head fuses (EAGLE-3), increasing
    return tuple(sorted(int(layer) for layer in head.get("fuse", {})))


def tap_norms(target_params, taps):  # -> each tapped stream's norm: the ln_1 of the block that reads it next
    return [target_params["blocks"][layer]["ln_1"] for layer in taps]


def fused_features(features, residuals, head, norms):  # [n, n_embd], taps x [n, n_embd] -> [n, n_embd]
    """What the head reads at a true position: f_i, plus (a head with "fuse") EAGLE-3's fusion of lower layers (Li et
    al. 2025, arXiv 2503.01840): fuse[l].w over the residual stream after block l, normed as block l+1 norms it, for
    each tapped l. The matrices start at zero (init_fuse): a head given taps starts as the head it was."""
    taps = head_taps(head)
    for layer, residual, norm in zip(taps, residuals, norms):
        features = features + gpt2.layer_norm(residual, **norm) @ head["fuse"][str(layer)]["w"]  # [n, n_embd]
    return features


def init_fuse(head, taps):  # -> the head with a zero fuse[l].w [n_embd, n_embd] for each block l in taps it lacks
    n_embd, fuse = np.shape(head["fc"]["b"])[0], dict(head.get("fuse", {}))
    for layer in taps:
        fuse.setdefault(str(layer), {"w": np.zeros((n_embd, n_embd), np.float32)})
    return {**head, "fuse": fuse} if fuse else head


def head_forward(features, tokens, head, wte, n_head, cache, start, mask=None):  # [n, n_embd], [n] -> [n, n_embd]
    """The head's predicted features f^_{j+1} for the pairs (features[j], tokens[j]) at head slots start..; their keys
    and values go to the head's cache (one (keys, values) pair of [n_head, n_ctx, head_dim]) at those slots. A chain
    is causal; a token tree brings its own mask (kvcache/tree.tree_mask, drafters/eagle2.py)."""
    xp = gpt2.array_module(features)  # NumPy here; jax.numpy in tools/train_heads.py
    x = xp.concatenate([features, wte[tokens]], axis=-1)  # [n, 2*n_embd]
    x = gpt2.linear(x, **head["fc"])  # [n, 2*n_embd] -> [n, n_embd]
    predicted, _ = gpt2.transformer_block(x, **head["block"], n_head=n_head, kv_cache=cache, start=start, mask=mask)
    return predicted  # [n, n_embd]


class EagleDraft:
    """EAGLE's head (init_head's nesting) drafting a chain for a gpt2.GPT2Model or JaxGPT2Model target, whose features
    and unembedding it reads (feeding the target's cache only what it lacks of x, as the next verification would).
    `propose` is sampling.draw_drafts' contract."""

    def __init__(self, target, head):
        self.wte, self.unembedding = host_embeddings(target, "EAGLE's head")
        n_embd = target.hparams["n_embd"]
        check_shapes(head, {"fc/w": (2 * n_embd, n_embd)}, "the head", f"a target of n_embd {n_embd}")
        self.target, self.head, self.n_head = target, head, target.hparams["n_head"]
        self.n_vocab, self.n_ctx, self.taps = target.n_vocab, target.n_ctx, head_taps(head)
        if self.taps and not 1 <= self.taps[0] <= self.taps[-1] < target.hparams["n_layer"]:
            raise ValueError(f"the head fuses the residual streams after blocks {list(self.taps)}; this target has "
                             f"blocks 1..{target.hparams['n_layer']}, and the last one's stream is f itself")
        tap_also(target, self.taps)  # the verifications from now on keep what the head reads
        self.norms = [{name: np.asarray(array, np.float32) for name, array in norm.items()}  # on the host
                      for norm in tap_norms(target.params, self.taps)]
        self.cache = gpt2.empty_cache({**target.hparams, "n_layer": 1})[0]  # ([n_head, n_ctx, head_dim], same)
        self.reset()

    def reset(self):
        """Forget the head's cache: `fed` is the sequence whose true pairs fill slots 0..len(fed)-2."""
        self.fed = np.zeros(0, dtype=np.int64)

    def paired_tokens(self, x):  # [n] -> [n-1]: the token beside each feature of x[:-1]
        return x[1:]  # f_j predicts x_{j+1}, and the head reads f_j with x_{j+1}: the pairing EAGLE trains

    def true_reads(self, x, start):  # [n] -> what the head reads at x's positions from start on [n - start, n_embd]
        *residuals, features = true_states(self.target, x, start, self.taps)
        return fused_features(features, residuals, self.head, self.norms)

    def readout(self, predicted):  # [m, n_embd] -> logits [m, n_vocab]: the target's unembedding reads the head
        return predicted @ self.unembedding  # 2-D: a faster layout multiplies rows only

    def head_logits(self, features, tokens, start):  # -> the predicted features [n, n_embd], their logits [n_vocab]
        predicted = head_forward(features, tokens, self.head, self.wte, self.n_head, self.cache, start)
        return predicted, self.readout(predicted[-1:])[0]

    def resume(self, x):  # -> the first head slot to refeed: slot j holds a true pair while x[:j+2] is what was fed
        start = max(cache_resume(self.fed, x, n_last=1)[0] - 1, 0)
        self.fed = x
        return start

    def propose(self, x, K, settings, rng, stats):  # -> drafts [K or 0], p [K or 0, n_vocab]
        """K tokens drawn one by one from the head's p (drafters/chain.propose_chain, stepping by chain_logits)."""
        return propose_chain(self.chain_logits, x, K, settings, rng, stats, self.n_vocab)

    def chain_logits(self, x):  # yields each draft's logits [n_vocab]; is sent the token drawn from them
        """EAGLE's chain: the head reads the true pairs it lacks, then each drafted token beside its own predicted
        feature; the last draft is never fed. A prompt of one token has no feature yet: no drafts."""
        if len(x) < 2:
            return
        start = self.resume(x)
        features, tokens = self.true_reads(x[:-1], start), self.paired_tokens(x)[start:]
        while True:
            features, logits = self.head_logits(features, tokens, start)
            drafted = yield logits
            start += len(tokens)  # the next free slot, where the head's own pair goes
            features, tokens = features[-1:], np.array([drafted], dtype=np.int64)
