"""FR-Spec's frequency-ranked draft vocabulary: EAGLE's head read out through the target's unembedding sliced to the
most frequent token ids, under EAGLE-2's tree.

Put the paper beside this file: FR-Spec (Zhao et al. 2025, arXiv 2502.14856), on drafters/eagle.py's head (EAGLE,
arXiv 2401.15077) and drafters/eagle2.py's tree (EAGLE-2, arXiv 2406.16858). Every draft step ends in a readout, the
predicted feature [n_embd] times an unembedding [n_embd, n_vocab]; where the head is small beside that matrix, the
readout is much of the step. FR-Spec keeps the draft model as it is and slices its LM head, here the target's own
unembedding, to the ids most frequent in a corpus, once; nothing is trained:

    p(x) = logits_to_probs(f^ @ wte.T[:, vocabulary])   for x in the vocabulary,   p(x) = 0 outside

EAGLE-3 (Li et al. 2025, arXiv 2503.01840) also drafts over a reduced vocabulary, but through an lm_head of its own
trained on it (drafters/eagle3.py); this file is the untrained slice.

`draft_vocabulary(token_counts, size)` picks the size most frequent ids of a training split's counts
(tools/draft_vocabulary.py writes them to models/teach-eagle-vocabulary.json, `load_vocabulary` reads them back).

Exactness is Algorithm 2's, unchanged: the readout's logits are -inf outside the vocabulary, so the p returned is
zero there at every setting, and each draft is drawn from exactly that p; the verifier's ratio q/p and its residual
(q - p)+ see the whole row, so a target token outside the vocabulary still comes out, from the residual, after a
rejection. What the vocabulary costs is acceptance: the draft can never propose a token outside it. In a tree
(EAGLE-2's ranking, by the head's raw log-softmax) a node gets at most `size` children: a token outside the
vocabulary has log-probability -inf and is never chosen.

Cost: the readout multiplies n_embd x size weights instead of n_embd x n_vocab; the logits are then spread into a row
of n_vocab (-inf elsewhere), element-wise work that the sampler does over n_vocab anyway.
"""

import json
from pathlib import Path

import numpy as np

from drafters.eagle2 import EagleTree
from sampling import is_integer


def draft_vocabulary(token_counts, size):  # [n_vocab] -> [size] ids, sorted
    """The size ids of highest count (ties to the lowest id), sorted: FR-Spec's frequency-ranked draft vocabulary."""
    token_counts = np.asarray(token_counts)
    if token_counts.ndim != 1 or not len(token_counts) or not np.issubdtype(token_counts.dtype, np.number) \
            or (token_counts < 0).any():
        raise ValueError("token_counts must be a non-empty 1-D array of counts >= 0, one per token id")
    if not is_integer(size) or not 1 <= size <= len(token_counts):
        raise ValueError(f"the draft vocabulary's size must be an integer in 1..{len(token_counts)}, got {size!r}")
    return np.sort(np.argsort(-token_counts, kind="stable")[:size]).astype(np.int64)


def coverage(token_counts, vocabulary):  # -> the share of the counted tokens that lie in the vocabulary
    token_counts = np.asarray(token_counts)
    return float(token_counts[vocabulary].sum() / token_counts.sum())


def check_vocabulary(vocabulary, n_vocab):  # -> the ids as a sorted int64 array, or a ValueError
    ids = np.asarray(vocabulary)
    if ids.ndim != 1 or not len(ids) or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"a draft vocabulary must be a non-empty list of token ids, got {ids.tolist()!r:.80}")
    ids = ids.astype(np.int64)
    if ids.min() < 0 or ids.max() >= n_vocab:
        raise ValueError(f"a draft vocabulary's ids must lie in 0..{n_vocab - 1}, got {int(ids.min())}.."
                         f"{int(ids.max())}")
    unique, times = np.unique(ids, return_counts=True)
    if (times > 1).any():
        repeated = np.flatnonzero(times > 1)[0]
        raise ValueError(f"a draft vocabulary must list each id once: id {unique[repeated]} is listed "
                         f"{times[repeated]} times")
    return unique


def load_vocabulary(path):  # -> the ids tools/draft_vocabulary.py wrote
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no draft vocabulary at {path}: write it with python tools/draft_vocabulary.py")
    try:
        return np.asarray(json.loads(path.read_text())["ids"], dtype=np.int64)
    except (ValueError, KeyError, TypeError):  # not JSON, no "ids", or ids that are not integers
        raise ValueError(f"{path} is not a draft vocabulary: a JSON object whose \"ids\" lists token ids") from None


def spread_logits(vocabulary_logits, vocabulary, n_vocab):  # [m, size] -> [m, n_vocab], -inf outside the vocabulary
    logits = np.full((len(vocabulary_logits), n_vocab), -np.inf, dtype=np.float32)
    logits[:, vocabulary] = vocabulary_logits
    return logits


class ReducedVocabularyEagle(EagleTree):
    """EAGLE's head (a chain by `propose`, EAGLE-2's tree by `draft_tree`) reading out over `vocabulary` only:
    p over the full vocabulary, zero outside it."""

    def __init__(self, target, head, n_nodes, vocabulary):
        super().__init__(target, head, n_nodes)
        self.vocabulary = check_vocabulary(vocabulary, self.n_vocab)  # [size]
        # the plain wte.T's columns, copied once: whatever layout the target reads wte.T in
        self.vocabulary_unembedding = np.ascontiguousarray(self.wte.T[:, self.vocabulary])  # [n_embd, size]

    def readout(self, predicted):  # [m, n_embd] -> logits [m, n_vocab], -inf outside the vocabulary
        return spread_logits(predicted @ self.vocabulary_unembedding, self.vocabulary, self.n_vocab)

    def draft_tree(self, x, K, n_drafts, settings, stats):  # -> TokenTree: EagleTree's, no child outside
        return super().draft_tree(x, K, min(n_drafts, len(self.vocabulary)), settings, stats)
