"""Kangaroo: a small adapter trained on the early exit, and a chain that stops when the exit is unsure.

Put the paper beside this file: Kangaroo (Liu et al. 2024, arXiv 2404.18911). Its self-draft model is the target's
first L layers (the shallow sub-network: drafters/early_exit.py) followed by an adapter and the target's own head.
The adapter is one multi-head attention between two normalisation layers:

    a = h_L + attn(ln_1(h_L))                 h_L: the residual stream after the target's first L blocks
    p = logits_to_probs(ln_f'(a) @ wte.T)     ln_f': the adapter's own final norm, in the place of the target's

(Kangaroo's code: a pre-norm attention layer with its residual, then a norm, then the frozen LM head, with LLaMA's
RMSNorm and rotary attention; here GPT-2's LayerNorm and biased projections, and no position embedding: h_L carries
the target's.) Only the adapter is trained, the target's layers and head stay frozen, and the loss is distillation:
the cross-entropy of the exit's distribution against the target's at each position (tools/train_heads.py).

init_adapter starts the adapter as the untrained exit: c_proj zero (the attention adds nothing, a = h_L) and ln_f'
a copy of the target's ln_f, so training starts from EarlyExit's p exactly.

The caches. The first L blocks read and write the target's own KV cache, and the target's verification starts at block L
for the rows the draft fed, as for EarlyExit (its docstring says why that is safe); the adapter is the draft's alone, so
its h_L is what the verification reuses, not the adapter's output. The adapter's attention needs keys and values of its
own: slot j holds those of position j, made from h_L there, which depends only on the tokens up to j. Only the draft
writes them (verification runs the target's blocks, never the adapter), so the drafter keeps its own record, `fed`, of
the tokens its slots hold. It resumes after the longest prefix of x that both records share (the target's for layers <
L, `fed` for the adapter) and cuts the target's record back there too: from that position on it feeds every token, and
so rewrites every slot, the target's layers < L and the adapter's, before any query reads it; a rejected draft's keys
are never read. The two records differ after a loop that accepted all K drafts: the target scored the last draft (the
draft ran the exit's blocks for it), the adapter never fed it (Kangaroo's code meets the same missing slot), and
resuming by the shorter record refeeds it. As in Kangaroo's code, the chain's last draft runs the shallow layers while
drafting, adapter and head skipped (EarlyExit.feed_last), so the verification runs only the layers after the exit.

Kangaroo's second early exit: the chain stops once the exit's confidence in the token it just drafted, its top
probability, falls below a threshold (CONFIDENCE_THRESHOLD, 0.6 as in Kangaroo's code, unless given: drafters/load.py,
main.py --confidence_threshold, bench/spec_bench.py); that token is still proposed. The confidence is read from the
raw logits (before temperature), so that it means the same at temperature 0, where p is one-hot. A shorter chain
changes speed only: each proposed token is drawn from exactly the p that enters q/p, and whether to go on depends only
on the draft's own prefix.
"""

import numbers

import numpy as np

import gpt2
from drafters.early_exit import EarlyExit
from drafters.heads import check_shapes
from kvcache.contract import common_prefix_length


CONFIDENCE_THRESHOLD = 0.6  # Kangaroo's code's: the chain stops after a draft whose top probability is below it


def is_confidence_threshold(value):  # a number in [0, 1] (not a bool, not NaN)
    return not isinstance(value, bool) and isinstance(value, numbers.Real) and 0 <= value <= 1


def adapter_shapes(n_embd):  # -> the adapter's arrays, named as in a GPT-2 block (flatten's names), and their shapes
    return {"ln_1/g": (n_embd,), "ln_1/b": (n_embd,),
            "attn/c_attn/w": (n_embd, 3 * n_embd), "attn/c_attn/b": (3 * n_embd,),  # [n, n_embd] -> q, k, v
            "attn/c_proj/w": (n_embd, n_embd), "attn/c_proj/b": (n_embd,),  # the heads merged [n, n_embd] -> same
            "ln_f/g": (n_embd,), "ln_f/b": (n_embd,)}


def check_adapter(adapter, n_embd):
    """A one-line ValueError unless the adapter holds adapter_shapes(n_embd)'s arrays with their shapes."""
    check_shapes(adapter, adapter_shapes(n_embd), "the adapter", f"a target of n_embd {n_embd}")


def init_adapter(hparams, rng, ln_f):
    """An adapter for a target of hparams' n_embd that starts as its untrained exit: ln_1 and c_attn as GPT-2
    initialises them (gains 1, biases 0, weights normal with std 0.02), c_proj zero, and ln_f' a copy of the target's
    ln_f (a copy: training the adapter's norm must not move the target's)."""
    n_embd = hparams["n_embd"]
    block = gpt2.init_params({"n_vocab": 1, "n_ctx": 1, "n_embd": n_embd, "n_layer": 1}, rng)["blocks"][0]
    c_proj = {"w": np.zeros((n_embd, n_embd), np.float32), "b": np.zeros(n_embd, np.float32)}
    adapter = {"ln_1": block["ln_1"], "attn": {"c_attn": block["attn"]["c_attn"], "c_proj": c_proj},
               "ln_f": {key: np.array(value, dtype=np.float32) for key, value in ln_f.items()}}
    check_adapter(adapter, n_embd)
    return adapter


def adapter_forward(h, adapter, n_head, kv_cache, start, mask=None):  # h_L [n, n_embd] -> [n, n_embd]
    """The adapted exit's state at positions start.., ready for the target's unembedding (the adapter's ln_f' is
    already applied). kv_cache: the adapter's (keys, values), each [n_head, n_ctx, head_dim], written in place at
    slots start.. (NumPy), or None to attend within h only (training: jax.numpy arrays, under jax.vmap)."""
    attn_out, _ = gpt2.mha(gpt2.layer_norm(h, **adapter["ln_1"]), **adapter["attn"], n_head=n_head,
                           kv_cache=kv_cache, start=start, mask=mask)  # [n, n_embd] -> [n, n_embd]
    return gpt2.layer_norm(h + attn_out, **adapter["ln_f"])  # the residual around attention, then the second norm


class AdaptedEarlyExit(EarlyExit):
    """EarlyExit's first exit_layer blocks (None: its default) through the target's cache, then the adapter
    (init_adapter's nesting) through a cache of its own, then the target's unembedding. confidence_threshold:
    Kangaroo's early stop of the chain (0: never stop). `propose` and `logits(x, n_last)` are EarlyExit's."""

    def __init__(self, target, adapter, exit_layer=None, confidence_threshold=CONFIDENCE_THRESHOLD):
        super().__init__(target, exit_layer)
        check_adapter(adapter, target.hparams["n_embd"])
        if not is_confidence_threshold(confidence_threshold):
            raise ValueError(f"the confidence threshold must be a number in [0, 1], got {confidence_threshold!r}")
        self.adapter, self.confidence_threshold = adapter, float(confidence_threshold)
        self.adapter_cache = gpt2.empty_cache({**target.hparams, "n_layer": 1})[0]  # ([n_head, n_ctx, head_dim], same)
        self.reset()

    def reset(self):
        """Forget the adapter's slots: `fed` holds the tokens whose positions they hold (the target's are its own)."""
        self.fed = np.zeros(0, dtype=np.int64)

    def resume_position(self, x, n_last):
        """After the prefix of x that both the target's layers < L and the adapter hold (module docstring)."""
        return min(super().resume_position(x, n_last), common_prefix_length(self.fed, x))

    def exit_logits(self, tokens, start):  # [n] fed at positions start.. -> [n, n_vocab]
        h = self.drafted_states(tokens, start)[0]  # h_L [n, n_embd], through the target's cache
        adapted = adapter_forward(h, self.adapter, self.n_head, self.adapter_cache, start)
        self.fed = np.concatenate([self.fed[:start], tokens])
        return adapted @ self.unembedding

    def keeps_drafting(self, logits):  # Kangaroo's early stop: go on while the exit is confident
        return self.confidence_threshold == 0 or gpt2.softmax(logits).max() >= self.confidence_threshold
