"""A chain drafter's proposal, written once: K tokens drawn one by one, each fed back for the next.

The chain drafters (EAGLE's head and the heads built on it, drafters/eagle.py; the early exit and Kangaroo's adapter
on it, drafters/early_exit.py) differ only in their step: what they feed to get the next draft's logits. Each writes
that step as a generator, `chain_logits(x)`: it yields the logits [n_vocab] of the next draft and is sent the token
drawn from them, which it feeds before yielding again. It may stop early by returning (Kangaroo's confidence stop), or
yield nothing at all (a prompt with no feature yet). The draft drawn last is never sent, so never fed by the chain; a
drafter whose work the verification reuses takes it with `feed_last` (the early exit: Kangaroo's order).

Exactness is Algorithm 2's: each token is drawn (sampling.sample) from exactly the p that is returned and enters
q/p, made by sampling.logits_to_probs with the run's settings.
"""

import time

import numpy as np

import sampling


def propose_chain(chain_logits, x, K, settings, rng, stats, n_vocab, feed_last=None):  # -> drafts [<= K], p [<= K, V]
    """sampling.draw_drafts' contract for a drafter whose step is chain_logits (see the module's docstring); the
    call, feed_last(the last draft) included, is timed as one draft call of len(drafts) steps."""
    started = time.perf_counter()
    x = np.array(x, dtype=np.int64)  # a copy: a drafter may remember it, the caller may change its array
    drafts, p = [], []
    if K > 0:
        chain = chain_logits(x)  # a generator: nothing runs until the first logits are asked for
        logits = next(chain, None)
        while logits is not None:
            p.append(sampling.logits_to_probs(logits, settings))
            drafts.append(sampling.sample(p[-1], rng))  # drawn from exactly the p that enters q/p
            logits = fed_back(chain, drafts[-1]) if len(drafts) < K else None
    if feed_last is not None and drafts:
        feed_last(drafts[-1])
    stats.record_call("draft", time.perf_counter() - started, steps=len(drafts))
    return np.array(drafts, dtype=np.int64), np.array(p, dtype=np.float32).reshape(len(drafts), n_vocab)


def fed_back(chain, token):  # -> the next draft's logits after the chain feeds token, or None where it stopped
    try:
        return chain.send(token)
    except StopIteration:
        return None
