"""Drafts that are not models: prompt lookup, which proposes what followed the text's current ending before.

Speculative sampling needs from its draft only tokens and the distribution p each was drawn from. Code,
documents being edited and answers that quote their question repeat what came before them, and a draft can
find those repetitions without a second model: Saxena's prompt-lookup-decoding and Hugging Face's
`prompt_lookup_num_tokens` match the last few tokens (an n-gram, n from 3 down to 1) against the prompt
and the text generated so far, and propose the tokens that followed the match.

Such a draft is deterministic: its p is one-hot at the proposed token. Algorithm 2 then accepts a drafted
token t with probability min(1, q(t) / 1) = q(t), and after a rejection samples from (q - p)+, which is q
with t removed and renormalised. That is exact at any temperature and with top-k and top-p, because the
drafted token is drawn from exactly the p that enters q/p (sampling.py's module docstring); only the
acceptance rate depends on how often the text really repeats.
"""

import time

import numpy as np

import sampling

PROMPT_LOOKUP = "prompt-lookup"  # the draft's name where a model's would go (main.py --draft_model_size, bench/)


class PromptLookup:
    """Propose up to K tokens that followed the latest earlier occurrence of the text's last n tokens.

    n goes from max_ngram down to min_ngram, the first that matches wins; no match, no drafts (the loop
    is then one plain step of the target). `sampling.draw_drafts` calls `propose`; `n_vocab` says how
    wide the one-hot p must be (the target's vocabulary).
    """

    def __init__(self, n_vocab, max_ngram=3, min_ngram=1):
        if not (sampling.is_integer(n_vocab) and n_vocab > 0):
            raise ValueError(f"n_vocab must be a positive integer, got {n_vocab!r}")
        if not (sampling.is_integer(min_ngram) and sampling.is_integer(max_ngram) and 1 <= min_ngram <= max_ngram):
            raise ValueError(f"need integers 1 <= min_ngram <= max_ngram, got {min_ngram!r} and {max_ngram!r}")
        self.n_vocab, self.max_ngram, self.min_ngram = n_vocab, max_ngram, min_ngram

    def lookup(self, x, K):  # [n] -> the tokens that followed the latest match of x's last n-gram, at most K
        x = np.asarray(x)
        starts = continuation_starts(x, self.max_ngram, self.min_ngram)
        # the latest match: the nearest context is the likeliest to repeat
        return x[starts[0]:starts[0] + K] if len(starts) else x[:0]

    def propose(self, x, K, settings, rng, stats):  # -> drafts [K_n <= K], p [K_n, n_vocab] one-hot
        """sampling.draw_drafts' contract for a draft with propose; a lookup needs no random numbers."""
        start = time.perf_counter()
        drafts = self.lookup(x, K).astype(np.int64)
        p = sampling.one_hot(drafts, self.n_vocab)  # each token "drawn" from the distribution that is sure of it
        stats.record_call("draft", time.perf_counter() - start, steps=len(drafts))
        return drafts, p

    def reset(self):
        """Nothing to forget: the lookup reads the whole sequence every time."""


def continuation_starts(x, max_ngram, min_ngram):  # [n] -> positions in x, the latest match's first
    """Where x went on after each earlier occurrence of its last n tokens: n goes from max_ngram down to
    min_ngram and the first n that matches wins; none matches, none is returned."""
    x = np.asarray(x)
    for n in range(min(max_ngram, len(x) - 1), min_ngram - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(x[:-1], n)  # every n-gram that has a successor
        matches = np.flatnonzero((windows == x[-n:]).all(axis=1))
        if len(matches):
            return matches[::-1] + n
    return np.zeros(0, dtype=np.int64)


def copied_fraction(prompt, continuation, n=4):
    """How much of a continuation repeats the prompt: the fraction of its n-grams that occur in the prompt.

    Beside every prompt-lookup figure, so that a continuation looping on itself (its n-grams repeat, but
    not the prompt's) is never mistaken for one that copies its context."""
    grams = lambda tokens: [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    continuation_grams = grams(list(continuation))
    if not continuation_grams:
        return 0.0
    prompt_grams = set(grams(list(prompt)))
    return sum(gram in prompt_grams for gram in continuation_grams) / len(continuation_grams)
