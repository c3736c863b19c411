"""drafters/chain.py: the chain drafters' one loop. Each draft is drawn from exactly the p returned, every draft but
the last is fed back (the last goes to feed_last), a chain may stop early or yield nothing, and the call is timed as
one draft call."""

import numpy as np

import sampling
from drafters.chain import propose_chain
from speedup.stats import SpeculativeStats

N_VOCAB = 5


def recording_chain(fed, stop_after=None):  # -> chain_logits: logits that favour the token after the last fed
    def chain_logits(x):
        token = int(x[-1])
        while True:
            drafted = yield np.eye(N_VOCAB, dtype=np.float32)[(token + 1) % N_VOCAB] * 4
            fed.append(drafted)
            if stop_after is not None and len(fed) == stop_after:
                return
            token = drafted
    return chain_logits


def test_k_drafts_each_from_its_p_and_all_but_the_last_fed_back():
    fed, stats, settings = [], SpeculativeStats(), sampling.SamplingSettings(0.5)
    drafts, p = propose_chain(recording_chain(fed), [3], 4, settings, np.random.default_rng(1), stats, N_VOCAB)
    assert drafts.dtype == np.int64 and p.dtype == np.float32 and p.shape == (4, N_VOCAB)
    assert fed == drafts[:-1].tolist()
    expected_p, previous = [], 3
    for token in drafts:  # each row is logits_to_probs of the logits the chain gave after what it was fed
        expected_p.append(sampling.logits_to_probs(np.eye(N_VOCAB, dtype=np.float32)[(previous + 1) % N_VOCAB] * 4,
                                                   settings))
        previous = token
    np.testing.assert_array_equal(p, expected_p)
    rng = np.random.default_rng(1)  # the same draws, token by token from those rows
    assert drafts.tolist() == [sampling.sample(row, rng) for row in expected_p]
    assert stats.draft_calls == 4


def test_a_chain_that_stops_early_or_yields_nothing_gives_fewer_drafts():
    fed, rng = [], np.random.default_rng(0)
    drafts, p = propose_chain(recording_chain(fed, stop_after=2), [0], 5, sampling.GREEDY, rng, SpeculativeStats(),
                              N_VOCAB)
    assert drafts.tolist() == [1, 2] and p.shape == (2, N_VOCAB) and fed == [1, 2]  # the stopping draft is proposed

    def no_feature_yet(x):
        return
        yield

    for chain_logits, K in ((no_feature_yet, 3), (recording_chain([]), 0)):
        drafts, p = propose_chain(chain_logits, [0], K, sampling.GREEDY, rng, SpeculativeStats(), N_VOCAB)
        assert drafts.shape == (0,) and drafts.dtype == np.int64 and p.shape == (0, N_VOCAB) and p.dtype == np.float32


def test_feed_last_gets_the_last_draft_once_inside_the_timed_call():
    """Kangaroo's order: the chain never feeds its last draft; a drafter whose verification reuses the draft's work
    (the early exit) takes it with feed_last, timed as part of the draft call; a chain with no draft feeds nothing."""
    fed, last, stats = [], [], SpeculativeStats()
    drafts, _ = propose_chain(recording_chain(fed), [3], 3, sampling.GREEDY, np.random.default_rng(0), stats, N_VOCAB,
                              feed_last=last.append)
    assert fed == drafts[:-1].tolist() and last == drafts[-1:].tolist() and stats.draft_calls == 3
    drafts, _ = propose_chain(recording_chain(fed, stop_after=len(fed) + 1), [0], 5, sampling.GREEDY,
                              np.random.default_rng(0), SpeculativeStats(), N_VOCAB, feed_last=last.append)
    assert len(drafts) == 1 and last[-1] == drafts[0]  # a chain stopped early: its last (stopping) draft too
    propose_chain(recording_chain([]), [0], 0, sampling.GREEDY, np.random.default_rng(0), SpeculativeStats(), N_VOCAB,
                  feed_last=last.append)
    assert len(last) == 2
