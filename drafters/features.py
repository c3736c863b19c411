"""The target's features, as the drafters read them: its state after ln_f at each position, the vector its
unembedding turns into the next token's logits (EAGLE's f_i, Medusa's last hidden state); and, for a target told to
tap them, the residual stream after chosen blocks (EAGLE-3's lower layers).

A cached gpt2.GPT2Model keeps them beside its KV cache (`features`, one row per cache slot, valid where its
`cached_tokens` is), written by the very forward pass that verifies the drafts: reading them costs no second forward.
jax_backend's JaxGPT2Model keeps them the same way on its device; the drafters run on the host and copy the rows.
"""

import numpy as np

import gpt2
from kvcache.contract import common_prefix_length


def host_embeddings(target, drafter):  # -> wte [n_vocab, n_embd], unembedding [n_embd, n_vocab], float32 NumPy
    """The target's token embedding and unembedding as a drafter on the host reads them: a NumPy model's own arrays
    (the unembedding in the layout engine.fast_model chose), a JAX model's copied from its device once. A target
    that keeps no features (a table, a batched model) is refused, naming `drafter`."""
    if isinstance(target, gpt2.GPT2Model):
        wte = target.params["wte"]
        return wte, wte.T if target.unembedding is None else target.unembedding
    if getattr(target, "features", None) is None:
        raise ValueError(f"{drafter} reads the target's features: the target must be a gpt2.GPT2Model or a "
                         "jax_backend JaxGPT2Model")
    wte = np.asarray(target.params["wte"], dtype=np.float32)
    return wte, wte.T


def true_features(target, x, start=0):  # [n] -> [n - start, n_embd] float32, a copy
    """The target's (a gpt2.GPT2Model's or a JaxGPT2Model's) features at x's positions from `start` on (a drafter
    reads only the rows it has not read yet: copying them all at every proposal would cost a drafter's step more than
    it needs).

    A cached target's rows for x are read from its `features`. What its cache lacks of x (a prompt it has not read
    yet) is fed through the cache first, as logits(x) feeds it: the next verification, reading x and the drafts,
    then resumes after x, so nothing is computed twice. Ask for the positions a verification has fed: after one, the
    target holds the sequence but its newest token, which no call has fed yet (asking for that one feeds it, and the
    next verification, which needs its logits, feeds it again). A target without a cache keeps no features: they are
    computed by a separate forward, as that target recomputes everything at every call anyway.
    """
    return true_states(target, x, start, layers=())[0]


def tap_also(target, layers):  # the target keeps the residual streams after `layers` too, from its next call on
    """Several drafters may share one target (the API allows it): each adds the blocks it reads to the target's taps
    and none replaces another's, so that each reads its own (true_states' layers). Tapping forgets the cache: a drafter
    does it when it is built."""
    wanted = tuple(sorted(set(target.taps) | {int(layer) for layer in layers}))
    if wanted != tuple(target.taps):
        target.tap(wanted)


def true_states(target, x, start=0, layers=None):  # [n] -> [len(layers) + 1, n - start, n_embd] float32, a copy
    """true_features, after the residual stream after each block of `layers` (default: every block the target taps,
    its `tap`; each must be one of them, tap_also), row by row."""
    x = np.asarray(x, dtype=np.int64)
    rows = list(range(len(target.taps) + 1)) if layers is None else [
        *(target.taps.index(layer) for layer in layers), len(target.taps)]
    if not target.use_cache:
        states, _ = gpt2.hidden_states(x, **target.params, n_head=target.hparams["n_head"], cache=None, start=0,
                                       taps=target.taps)
        return np.stack(states)[rows, start:]
    if common_prefix_length(target.cached_tokens, x) < len(x):
        target.logits(x, n_last=1)  # fills the cache and the features up to x; the logits are not needed here
    return np.array(target.states[rows, start:len(x)], dtype=np.float32)  # a copy: later calls overwrite the states
