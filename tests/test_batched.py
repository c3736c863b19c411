"""batching/gpt2_batched.py and sampling_batched.py (and sampling_jax's batched loops): several sequences at once,
each row decoded exactly as it would be alone.

- The batched model's logits equal gpt2.py's for every row, whatever each row's length, after feeding in
  steps and rolling rows back; its cache is allocated once and a rollback is a length change.
- Row i of a batch gives the batch-1 decoder's tokens and statistics with row i's Generator, for B in
  1, 3 and 8, prompts and lengths differing per row, greedy and at temperature 1 with top-k and top-p,
  with the NumPy models and with the JAX device loops (on the CPU).
- Exactness: on the table models of tests/helpers.py, each row's exact law (classroom/exact_law.py, the other
  rows' Generators fixed) is the target's, and a batched rule that cuts every row at the batch's first
  rejection moves it.

Logits of a batched product differ from a single row's in the last float32 bits: logits are compared
to rtol 1e-4 (plus 1e-5 of the largest logit for entries near zero), tokens and counts exactly.
"""

import tracemalloc

import numpy as np
import pytest

import gpt2
import sampling
from batching import gpt2_batched, sampling_batched
from classroom import exact_law
from gpt2_cases import random_params
from speedup.stats import SpeculativeStats
from helpers import DRAFT_TABLE, HPARAMS, N_TOKENS, TARGET_TABLE, perturbed, random_target, table_problem

# prompts of seven different lengths, and a different number of new tokens for each row (within n_ctx 64)
PROMPTS = [[50], [1, 2, 3], [7, 7, 7, 7, 80, 1], [9, 4], [3, 1, 4, 1, 5, 9, 2], [60, 61, 62, 63], [8], [20, 30, 40]]
N_ROWS = [30, 17, 26, 5, 21, 12, 1, 28]
SETTINGS = {"greedy": dict(temperature=0.0), "temperature 1, top-k and top-p": dict(temperature=1.0, top_k=20,
                                                                                     top_p=0.9)}
COUNTERS = ("loops", "target_calls", "draft_calls", "drafted", "accepted", "rejected", "generated", "origins")


def assert_close(actual, expected):
    assert actual.dtype == np.float32 and actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max())


@pytest.fixture(scope="module")
def pair():
    """(draft, target) parameters: a draft that agrees with the target often, not always."""
    target = random_target()
    return perturbed(target, 0.1, seed=1), target


# ------------------------------------------------------------------------------------------ the model


@pytest.mark.parametrize("layout", ["plain", "panels", "auto"])
def test_each_rows_logits_equal_gpt2s_at_its_own_length_and_after_rollbacks(layout):
    hparams = dict(n_vocab=64, n_ctx=48, n_embd=32, n_head=4, n_layer=2)
    params = random_params(hparams, seed=10)
    tokens = np.random.default_rng(11).integers(0, hparams["n_vocab"], size=(4, hparams["n_ctx"]))
    model = gpt2_batched.BatchedGPT2Model(params, hparams, batch_size=4, layout=layout)
    reference = lambda x: gpt2.gpt2(x, **params, n_head=hparams["n_head"])

    def check(rows, lengths, n_last):
        xs = [tokens[row, :length] for row, length in zip(rows, lengths)]
        logits = model.logits(xs, n_last, rows=rows)
        assert logits.dtype == np.float32 and logits.shape == (len(rows), max(n_last), hparams["n_vocab"])
        for i, x in enumerate(xs):  # right-aligned: row i's last n_last[i] positions
            assert_close(logits[i, -n_last[i]:], reference(x)[-n_last[i]:])

    check([0, 1, 2, 3], [5, 12, 1, 30], [5, 3, 1, 2])  # prompts of different lengths in one pass
    check([0, 1, 2, 3], [6, 13, 2, 31], [1, 1, 1, 1])  # a decode step for every row
    check([0, 2, 3], [10, 7, 48], [5, 2, 8])  # some rows only, up to the end of the context
    np.testing.assert_array_equal(model.lengths, [10, 13, 7, 48])
    # speculative sampling's pattern: rows continue from corrected, shorter sequences
    for row, keep in ((0, 4), (3, 20), (1, 0)):
        tokens[row, keep] = (tokens[row, keep] + 1) % hparams["n_vocab"]
    check([0, 1, 3], [7, 3, 25], [3, 3, 5])
    np.testing.assert_array_equal(model.lengths, [7, 3, 7, 25])
    check([1], [4], [1])  # one row alone, the others untouched
    check([0, 1, 2, 3], [8, 5, 8, 26], [1, 2, 1, 1])


def test_the_cache_is_allocated_once_and_a_rollback_is_a_length_change(pair):
    draft_params, target_params = pair
    hparams = {**HPARAMS, "n_ctx": 1024}  # a cache (4 MB) much larger than what a decode of 30 tokens needs
    params = {**target_params, "wpe": np.resize(target_params["wpe"], (1024, HPARAMS["n_embd"]))}
    draft = gpt2_batched.BatchedGPT2Model({**draft_params, "wpe": params["wpe"]}, hparams, 4)
    target = gpt2_batched.BatchedGPT2Model(params, hparams, 4)
    buffers = [buffer for layer in target.cache + draft.cache for buffer in layer]
    addresses = [buffer.__array_interface__["data"][0] for buffer in buffers]
    cache_bytes = sum(buffer.nbytes for buffer in buffers)

    tracemalloc.start()
    sampling_batched.speculative_sampling(PROMPTS[:4], draft, target, 30, 4, rngs=[0, 1, 2, 3])
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < cache_bytes / 8, f"{peak} bytes allocated while decoding, against a cache of {cache_bytes}"
    assert [buffer for layer in target.cache + draft.cache for buffer in layer] == buffers  # the same arrays
    assert [buffer.__array_interface__["data"][0] for buffer in buffers] == addresses
    # a rollback: the row's length shrinks, its cached keys stay where they are, unread past the new length
    kept = target.cache[0][0][1, :, :10].copy()
    longest = target.cached_tokens[1]
    target.logits([longest[:10]], rows=[1])
    assert target.lengths[1] == 10 and target.cache[0][0] is buffers[0]
    np.testing.assert_array_equal(target.cache[0][0][1, :, :9], kept[:, :9])  # only position 9 was fed again


def test_bad_input_gets_a_clear_error(pair):
    model = gpt2_batched.BatchedGPT2Model(pair[1], HPARAMS, batch_size=2)
    for batch_size in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="batch_size"):
            gpt2_batched.BatchedGPT2Model(pair[1], HPARAMS, batch_size=batch_size)
    with pytest.raises(ValueError, match="rows"):
        model.logits([[1, 2], [3]], rows=[1, 1])
    with pytest.raises(ValueError, match="rows"):
        model.logits([[1, 2]], rows=[2])
    with pytest.raises(ValueError, match="n_last"):
        model.logits([[1, 2], [3]], n_last=2)
    with pytest.raises(ValueError, match="context"):
        model.logits([np.zeros(HPARAMS["n_ctx"] + 1, int)])
    with pytest.raises(ValueError, match="token ids"):
        model.logits([[1, HPARAMS["n_vocab"]]])
    draft, target = (gpt2_batched.BatchedGPT2Model(params, HPARAMS, 3) for params in pair)
    shared = np.random.default_rng(0)
    with pytest.raises(ValueError, match="its own Generator"):
        sampling_batched.speculative_sampling(PROMPTS[:2], draft, target, 5, 2, rngs=[shared, shared])
    for one_for_all in (shared, 7):
        with pytest.raises(ValueError, match="one Generator or seed per row"):
            sampling_batched.autoregressive_sampling(PROMPTS[:2], target, 5, rngs=one_for_all)
    with pytest.raises(ValueError, match="one N and one Generator"):
        sampling_batched.autoregressive_sampling(PROMPTS[:3], target, [5, 6], rngs=[0, 1, 2])
    with pytest.raises(ValueError, match="exceed the model's batch"):
        sampling_batched.autoregressive_sampling(PROMPTS[:4], target, 5, rngs=[0, 1, 2, 3])
    with pytest.raises(ValueError, match="one per row"):
        sampling_batched.autoregressive_sampling([1, 2, 3], target, 5, rngs=[0, 1, 2])
    with pytest.raises(ValueError, match="context"):
        sampling_batched.autoregressive_sampling(PROMPTS[:2], target, [5, HPARAMS["n_ctx"]], rngs=[0, 1])


# ------------------------------------------------------------------ row i equals the batch-1 decoder


def batch_one_runs(decoder, models, B, K, settings, seed):
    """Each row alone through sampling.py with its own Generator: -> (tokens, stats, the Generator afterwards)."""
    runs = []
    for i in range(B):
        rng, stats = np.random.default_rng([seed, i]), SpeculativeStats()
        extra = {"K": K} if decoder == "speculative_sampling" else {}
        tokens = getattr(sampling, decoder)(PROMPTS[i], *models, N_ROWS[i], rng=rng, **extra, **settings, stats=stats)
        runs.append((tokens, stats, rng))
    return runs


def assert_rows_equal(batch, batch_stats, runs):
    for i, (tokens, stats, _) in enumerate(runs):
        assert batch[i].dtype == np.int64
        np.testing.assert_array_equal(batch[i], tokens, err_msg=f"row {i}")
        for name in COUNTERS:
            assert getattr(batch_stats.rows[i], name) == getattr(stats, name), (i, name)


@pytest.mark.parametrize("B", [1, 3, 8])
@pytest.mark.parametrize("settings", SETTINGS.values(), ids=SETTINGS.keys())
def test_row_i_is_the_batch_one_run_with_row_is_generator(pair, B, settings):
    draft_params, target_params = pair
    single = [gpt2.GPT2Model(params, HPARAMS) for params in pair]
    draft, target = (gpt2_batched.BatchedGPT2Model(params, HPARAMS, B) for params in pair)
    for decoder, models, K in (("autoregressive_sampling", [target], 0), ("speculative_sampling", [draft, target], 3)):
        runs = batch_one_runs(decoder, single[2 - len(models):], B, K, settings, seed=B)
        rngs = [np.random.default_rng([B, i]) for i in range(B)]
        stats = sampling_batched.BatchStats(B)
        extra = {"K": K} if K else {}
        batch = getattr(sampling_batched, decoder)(PROMPTS[:B], *models, N_ROWS[:B], rngs=rngs, **extra, **settings,
                                                   stats=stats)
        assert_rows_equal(batch, stats, runs)
        # every row consumed its Generator exactly as the batch-1 run did
        assert [rng.random() for rng in rngs] == [rng.random() for _, _, rng in runs]
    if B > 1:  # both branches of the rejection rule ran
        assert stats.total("accepted") > 5 and stats.total("rejected") > 5


def test_the_batchs_calls_are_counted_once_and_finished_rows_are_not_fed(pair):
    """Each row's target_calls counts the batched calls it took part in; the batch's, the calls made."""
    B = 8
    draft, target = (gpt2_batched.BatchedGPT2Model(params, HPARAMS, B) for params in pair)
    fed = {"draft": [], "target": []}
    for role, model in (("draft", draft), ("target", target)):
        logits = model.logits
        model.logits = lambda xs, n_last=1, rows=None, role=role, logits=logits: (fed[role].append(list(rows)),
                                                                                  logits(xs, n_last, rows))[1]
    stats = sampling_batched.BatchStats(B)
    out = sampling_batched.speculative_sampling(PROMPTS, draft, target, N_ROWS, 4, rngs=range(B), stats=stats,
                                                temperature=0)
    assert [len(row) - len(prompt) for row, prompt in zip(out, PROMPTS)] == N_ROWS
    assert stats.target_calls == stats.loops == len(fed["target"]) == max(row.loops for row in stats.rows)
    assert stats.draft_calls == len(fed["draft"])
    for i, row_stats in enumerate(stats.rows):  # a row takes part in every call until it is done, then in none
        assert [call for call, rows in enumerate(fed["target"]) if i in rows] == list(range(row_stats.loops))
        assert row_stats.target_calls == row_stats.loops
        assert row_stats.draft_calls == sum(i in rows for rows in fed["draft"])
    assert stats.rows[N_ROWS.index(1)].loops == 1 and len(fed["target"][-1]) < B
    assert stats.generated == sum(N_ROWS) and stats.tokens_per_target_call == sum(N_ROWS) / stats.target_calls
    assert stats.total("accepted") == sum(row.accepted for row in stats.rows)
    assert stats.as_dict()["acceptance_rate"] == stats.total("accepted") / (stats.total("accepted") +
                                                                            stats.total("rejected"))


# ------------------------------------------------------------------ exactness, row by row (exact law)


class BatchedTableModel:
    """helpers.TableModel for a batch: each row's next-token logits depend on its previous token."""

    def __init__(self, table, batch_size):
        self.table = np.asarray(table, dtype=np.float32)
        self.n_vocab, self.n_ctx, self.batch_size = self.table.shape[1], 64, batch_size

    def logits(self, xs, n_last=1, rows=None):  # -> [len(xs), max(n_last), n_vocab], right-aligned
        n_out = int(np.max(n_last))
        return np.stack([self.table[np.asarray(x)[np.maximum(len(x) - n_out + np.arange(n_out), 0)]] for x in xs])


TABLE_PROMPTS = [[2, 0], [1], [3, 3, 2], [0, 1]]  # four rows, each with its own exact distribution
TOP_K_AND_P = dict(temperature=1.7, top_k=3, top_p=0.8)


def row_law(i, **settings):
    """The exact law of row i's N_TOKENS new tokens (classroom/exact_law.py), the other rows' Generators fixed.

    Only row i's random numbers are the oracle's (the rows' paths would multiply); the others, with their own
    seeded Generators, decode one or two tokens more, so row i finishes first and the batch goes on without it.
    Exact for every fixed choice of the others' numbers: row i's law does not depend on theirs.
    """
    B = len(TABLE_PROMPTS)
    draft, target = BatchedTableModel(DRAFT_TABLE, B), BatchedTableModel(TARGET_TABLE, B)
    N = [N_TOKENS if j == i else N_TOKENS + 1 + j % 2 for j in range(B)]

    def run(rng):
        rngs = [rng if j == i else np.random.default_rng([0, j]) for j in range(B)]
        out = sampling_batched.speculative_sampling(TABLE_PROMPTS, draft, target, N, 2, rngs, **settings)
        return tuple(int(token) for token in out[i][len(TABLE_PROMPTS[i]):])

    law = exact_law.enumerate_paths(run)
    problem = table_problem(DRAFT_TABLE, TARGET_TABLE, sampling.SamplingSettings(**settings), prompt=TABLE_PROMPTS[i])
    return law, exact_law.target_law(problem)


@pytest.mark.parametrize("settings", [{}, TOP_K_AND_P], ids=str)
@pytest.mark.parametrize("i", range(len(TABLE_PROMPTS)))
def test_each_row_follows_the_target(i, settings):
    law, target = row_law(i, **settings)
    assert exact_law.total_variation(law.law, target)[0] <= exact_law.TV_TOLERANCE  # its exact law is the target's
    assert law.support <= set(target)  # and it reaches no sequence of probability zero


def cut_at_the_batchs_first_rejection(rows, drafts, p, q, rngs):
    """A wrong batched rule: every row keeps only as many drafts as the row that accepted fewest, then
    draws its next token from q there, as if one rejection rejected every row's drafts."""
    judged = [sampling_batched.judge(drafts[i], p[i], q[i], rngs[i]) for i in rows]
    fewest = min(accepted for _, accepted in judged)
    return [(tokens, accepted) if accepted == fewest else
            ([*drafts[i][:fewest], sampling.sample(q[i][fewest], rngs[i])], fewest)
            for i, (tokens, accepted) in zip(rows, judged)]


def test_a_rule_that_lets_one_rows_rejection_cut_anothers_drafts_is_caught(monkeypatch):
    """At top-k and top-p, where the oracle has fewest paths to run (every row moves by 0.098 to 0.224)."""
    monkeypatch.setattr(sampling_batched, "judge_rows", cut_at_the_batchs_first_rejection)
    for i in range(len(TABLE_PROMPTS)):
        law, target = row_law(i, **TOP_K_AND_P)
        assert law.support <= set(target)  # the wrong rule still only samples possible tokens...
        assert exact_law.total_variation(law.law, target)[0] > 0.05, i  # ...at the wrong frequencies, in every row


# -------------------------------------------------------------------- the JAX device loops, batched


@pytest.fixture(scope="module")
def jax_pair(pair):
    pytest.importorskip("jax")
    from jax_backend import gpt2_jax

    return [gpt2_jax.JaxGPT2Model(params, HPARAMS) for params in pair]


@pytest.mark.slow  # JAX compiles its programs: the slow tier
@pytest.mark.parametrize("B", [1, 3, 8])
@pytest.mark.parametrize("settings", SETTINGS.values(), ids=SETTINGS.keys())
def test_the_device_loops_give_the_numpy_batchs_rows(pair, jax_pair, B, settings):
    from jax_backend import sampling_jax

    draft, target = (gpt2_batched.BatchedGPT2Model(params, HPARAMS, B) for params in pair)
    for decoder, numpy_models, jax_models, K in (
            ("autoregressive_sampling", [target], jax_pair[1:], 0),
            ("speculative_sampling", [draft, target], jax_pair, 3)):
        extra = {"K": K} if K else {}
        runs = []
        for decode, models in ((getattr(sampling_batched, decoder), numpy_models),
                               (getattr(sampling_jax, f"batched_{decoder}"), jax_models)):
            stats = sampling_batched.BatchStats(B)
            rngs = [np.random.default_rng([B, i]) for i in range(B)]
            rows = decode(PROMPTS[:B], *models, N_ROWS[:B], rngs=rngs, **extra, **settings, stats=stats)
            runs.append((rows, stats, rngs))
        (numpy_rows, numpy_stats, _), (device_rows, device_stats, _) = runs
        assert_rows_equal(device_rows, device_stats, [(row, stats, None) for row, stats in
                                                      zip(numpy_rows, numpy_stats.rows)])
        # the batch's calls: the vmapped loop's iterations, as many as the longest-running row needed
        assert device_stats.target_calls == numpy_stats.target_calls
        if K:
            assert device_stats.loops == numpy_stats.loops and device_stats.draft_calls is None  # not counted
