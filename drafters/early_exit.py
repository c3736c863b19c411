"""An early exit as the draft: the target's first L layers, then its final norm and unembedding (self-speculation).

Put the papers beside this file. LayerSkip (Elhoushi et al. 2024, arXiv 2404.16710) drafts with the target's first
L layers read out through the model's own head, verifies with all of them, and reuses the draft's work in the
verification; Kangaroo (Liu et al. 2024, arXiv 2404.18911) does the same with a trained adapter on the exit
(drafters/kangaroo.py). Draft & Verify (Zhang et al. 2023, arXiv 2309.08168) is not an early exit: its draft skips
intermediate layers chosen by Bayesian optimisation and still runs the last ones, so no state of the draft is a state
the verification needs. This is LayerSkip's self-speculation, untrained: the draft's distribution after x is

    p = logits_to_probs(layer_norm(h_L(x)) @ wte.T)     h_L: the residual stream after the target's first L blocks

which is gpt2.gpt2 itself with blocks[:L] and the target's cache[:L]. There is no second copy of anything: the draft
reads and writes the target's own KV buffers for layers < L. Keys and values at a position depend only on the tokens
up to it, so what the draft writes there is what the target would write. The draft feeds from where the target's
next call will (both resume after the longest cached prefix of x, cache_resume with n_last=1 for the draft and K+1
for the target), cuts the target's record of what its cache holds (`cached_tokens`) back to that position, and leaves
beside it an ExitDraft (target.exit_draft): the tokens it fed from there and their h_L.

The verification reuses them (LayerSkip's and Kangaroo's saving). The chain ends by feeding its last draft through the
exit's blocks too, without the readout, as Kangaroo's code does (its drafting loop runs the shallow layers for the last
token before it stops, skipping adapter and head). The target then scores x's last token and the K drafts from block L,
from their h_L (gpt2.hidden_states' first_layer and x), their keys and values of layers < L kept as the draft wrote
them: its verification runs the layers after the exit alone. After a rejection the next x ends before the rejected
draft: the draft's next call resumes before it and rewrites its slots, and the ExitDraft the target reads is always the
one made since its last call, for the slots it feeds from exactly there (any other call of the target, a tree's or one
from elsewhere, reuses nothing and forgets it). A rejected draft's states are never read.

Exactness is Algorithm 2's: each drafted token is drawn (sampling.sample) from exactly the p that is returned and
enters q/p, made by sampling.logits_to_probs with the run's settings, and the reused verification computes the
target's own logits (to float32 rounding: rows fed in other batches round differently). Only speed depends on L. A
draft step runs L of the target's n_layer blocks and the whole unembedding, so its cost c is about L / n_layer plus
the unembedding's share of a decode step, and a chain pays L blocks more for its last draft; the verification saves
L blocks for all its rows; the acceptance of an untrained exit is low (docs/DRAFTERS.md).
"""

import numpy as np

import gpt2
import sampling
from drafters.chain import propose_chain
from drafters.features import host_embeddings
from kvcache.contract import cache_resume, common_prefix_length

EARLY_EXIT = "early-exit"  # the draft's name where a model's would go (main.py --draft_model_size)


def default_exit_layer(n_layer):
    """A quarter of the layers: untrained, the exit accepts more the later it reads, but costs L / n_layer of a
    decode step more (docs/DRAFTERS.md has the measurements)."""
    return max(1, n_layer // 4)


class EarlyExit:
    """The first exit_layer blocks (None: default_exit_layer) of a cached gpt2.GPT2Model, read out through its ln_f and
    unembedding.

    `propose` is sampling.draw_drafts' contract; `logits(x, n_last)` the model contract, so that
    speedup/costs.measure_costs times a draft step and the tree verifier can rank candidates with it.
    """

    def __init__(self, target, exit_layer=None):
        if not isinstance(target, gpt2.GPT2Model) or not target.use_cache:
            raise ValueError("an early exit shares a NumPy gpt2.GPT2Model's KV cache: the target must be one, with "
                             "use_cache=True")
        n_layer = target.hparams["n_layer"]
        exit_layer = default_exit_layer(n_layer) if exit_layer is None else exit_layer
        if not (sampling.is_integer(exit_layer) and 1 <= exit_layer <= n_layer - 1):
            raise ValueError(f"--exit_layer must be an integer in [1, {n_layer - 1}] (the target has {n_layer} "
                             f"layers), got {exit_layer!r}")
        self.target, self.exit_layer = target, int(exit_layer)
        self.n_vocab, self.n_ctx = target.n_vocab, target.n_ctx
        self.params = {**target.params, "blocks": target.params["blocks"][:self.exit_layer]}  # views, not copies
        self.n_head = target.hparams["n_head"]
        _, self.unembedding = host_embeddings(target, "an early exit")

    def exit_states(self, tokens, start):  # [n] fed at positions start.. -> h_L, ln_f(h_L): 2 x [n, n_embd]
        """The residual stream after the first exit_layer blocks, and the target's ln_f of it, for tokens fed after
        the first `start` cached positions; their keys and values go to the target's cache slots start.. of layers
        < exit_layer."""
        gpt2.check_inputs(tokens, start, self.n_vocab, self.n_ctx, cached=True)
        states, _ = gpt2.hidden_states(tokens, **self.params, n_head=self.n_head,
                                       cache=self.target.cache[:self.exit_layer], start=start, taps=(self.exit_layer,))
        return states

    def drafted_states(self, tokens, start):  # exit_states, kept for the target's next call (ExitDraft.add)
        states = self.exit_states(tokens, start)
        drafted = self.target.exit_draft
        if drafted is not None and drafted.drafter is self and start == drafted.end:
            drafted.add(tokens, states[0])
        else:  # fed out of turn (not after resume): the target reuses nothing
            self.target.exit_draft = None
        return states

    def exit_logits(self, tokens, start):  # [n] fed at positions start.. -> [n, n_vocab]
        return self.drafted_states(tokens, start)[-1] @ self.unembedding  # gpt2.gpt2's read-out, cut after L blocks

    def resume(self, x, n_last):  # -> (the cache position to feed from, the tokens of x to feed there)
        """Resume at resume_position, cut the target's record back there (the draft rewrites its layers < L from
        there on) and start there the ExitDraft the target's next call reuses."""
        start = self.resume_position(x, n_last)
        self.target.cached_tokens = self.target.cached_tokens[:start]
        self.target.exit_draft = ExitDraft(self, start)
        return start, x[start:]

    def resume_position(self, x, n_last):
        """After the target's cached prefix of x, as the target's next call resumes (Kangaroo's adapter adds its own
        record: drafters/kangaroo.py)."""
        return cache_resume(self.target.cached_tokens, x, n_last)[0]

    def logits(self, x, n_last=1):  # [n_seq] -> [n_last, n_vocab]
        x = np.array(x, dtype=np.int64)
        if not 1 <= n_last <= len(x) <= self.n_ctx:
            raise ValueError(f"n_last={n_last} must lie in [1, {len(x)}] for a sequence of {len(x)} tokens within "
                             f"the context of {self.n_ctx}")
        start, new_tokens = self.resume(x, n_last)
        return self.exit_logits(new_tokens, start)[-n_last:]

    def propose(self, x, K, settings, rng, stats):  # -> drafts [<= K], p [<= K, n_vocab]
        """Up to K tokens drawn one by one from the exit's p (drafters/chain.propose_chain, stepping by
        chain_logits)."""
        return propose_chain(self.chain_logits, x, K, settings, rng, stats, self.n_vocab, feed_last=self.feed_last)

    def feed_last(self, token):
        """Kangaroo's order: the chain's last draft through the exit's blocks (no readout), kept for the target's next
        call, which then starts every row after the exit."""
        drafted = self.target.exit_draft
        if drafted is not None and drafted.drafter is self:
            self.drafted_states(np.array([token], dtype=np.int64), drafted.end)

    def chain_logits(self, x):  # yields each draft's logits [n_vocab]; is sent the token drawn from them
        """The exit's chain: x's tokens the target's cache lacks, then each draft fed back for the next (the last by
        feed_last). The chain stops early where keeps_drafting says so."""
        start, new_tokens = self.resume(x, n_last=1)
        while True:
            logits = self.exit_logits(new_tokens, start)[-1]
            drafted = yield logits
            if not self.keeps_drafting(logits):
                return
            start, new_tokens = start + len(new_tokens), np.array([drafted], dtype=np.int64)

    def keeps_drafting(self, logits):
        """Whether to draft after the token these logits gave: always, for the untrained exit (Kangaroo stops a chain
        whose confidence falls: drafters/kangaroo.py)."""
        return True

    def reset(self):
        """Nothing of its own to forget: the cache and its record are the target's (reset with the target)."""


class ExitDraft:
    """What an early exit's draft wrote into the target's cache past the target's record, for the target's next call to
    reuse: from slot `start` (where the draft cut the target's cached_tokens back to), the keys and values of the
    first exit_layer blocks of `tokens`, and `h` [len(tokens), n_embd], their residual stream after those blocks. It
    lives in target.exit_draft until the target's next forward pass, which rewrites the slots it describes."""

    def __init__(self, drafter, start):
        self.drafter, self.start = drafter, start
        self.tokens = np.zeros(0, dtype=np.int64)
        self.h = np.zeros((0, drafter.target.hparams["n_embd"]), dtype=np.float32)

    @property
    def end(self):  # the slot after the last the draft fed
        return self.start + len(self.tokens)

    def add(self, tokens, h):  # the draft fed tokens [n] at slots end.., h [n, n_embd] their states after the exit
        self.tokens, self.h = np.concatenate([self.tokens, tokens]), np.concatenate([self.h, h])

    def reuse(self, tokens, start):  # -> gpt2.GPT2Model.forward's {first_layer, x}, or {} where nothing is reusable
        """For tokens the target feeds at slots start..: the leading ones the draft fed there enter block exit_layer
        from their h (the blocks before it ran in the draft, their keys and values are cached); the rest (tokens the
        draft did not feed there) first run the exit's blocks through the cache. Nothing is reused
        when the target feeds from another slot, or keeps the residual stream of a block the reuse would skip."""
        exit_layer = self.drafter.exit_layer
        n = common_prefix_length(self.tokens, tokens) if start == self.start else 0
        if n == 0 or any(tap <= exit_layer for tap in self.drafter.target.taps):
            return {}
        rest = self.drafter.exit_states(tokens[n:], start + n)[0] if n < len(tokens) else self.h[:0]
        return {"first_layer": exit_layer, "x": np.concatenate([self.h[:n], rest])}
