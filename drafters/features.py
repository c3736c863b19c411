"""The target's features, as the drafters read them: its state after ln_f at each position, the vector its
unembedding turns into the next token's logits (EAGLE's f_i, Medusa's last hidden state).

A cached gpt2.GPT2Model keeps them beside its KV cache (`features`, one row per cache slot, valid where its
`cached_tokens` is), written by the very forward pass that verifies the drafts: reading them costs no second forward.
"""

import numpy as np

import gpt2
from kvcache.contract import common_prefix_length


def true_features(target, x, start=0):  # [n] -> [n - start, n_embd], a copy
    """The target's (a NumPy gpt2.GPT2Model's) features at x's positions from `start` on (a drafter reads only the
    rows it has not read yet: copying them all at every proposal would cost a drafter's step more than it needs).

    A cached target's rows for x are read from its `features`. What its cache lacks of x (a prompt it has not read
    yet) is fed through the cache first, as logits(x) feeds it: the next verification, reading x and the drafts,
    then resumes after x, so nothing is computed twice. Ask for the positions a verification has fed: after one, the
    target holds the sequence but its newest token, which no call has fed yet (asking for that one feeds it, and the
    next verification, which needs its logits, feeds it again). A target without a cache keeps no features: they are
    computed by a separate forward, as that target recomputes everything at every call anyway.
    """
    x = np.asarray(x, dtype=np.int64)
    if not target.use_cache:
        states, _ = gpt2.hidden_states(x, **target.params, n_head=target.hparams["n_head"], cache=None, start=0)
        return states[-1][start:]
    if common_prefix_length(target.cached_tokens, x) < len(x):
        target.logits(x, n_last=1)  # fills the cache and the features up to x; the logits are not needed here
    return target.features[start:len(x)].copy()  # a copy: the target's later calls overwrite its rows
