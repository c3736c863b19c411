"""classroom/timeline.py: the recording models change nothing, and their records tell each loop's story
(the calls of Algorithm 2, the tokens kept, the KV cache rolling back) in step with SpeculativeStats."""

import matplotlib
import numpy as np
import pytest

import gpt2
import sampling
from classroom import timeline
from speedup.stats import SpeculativeStats

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TINY = {"n_vocab": 12, "n_ctx": 96, "n_embd": 16, "n_head": 2, "n_layer": 1}
PROMPT, N, K = [1, 2, 3], 60, 3


def tiny_model(seed):
    return gpt2.GPT2Model(gpt2.init_params(TINY, np.random.default_rng(seed)), TINY)


def recorded_run(seed=0):
    calls = []
    draft = timeline.RecordingModel(tiny_model(1), "draft", calls)
    target = timeline.RecordingModel(tiny_model(2), "target", calls)
    stats = SpeculativeStats()
    out = sampling.speculative_sampling(PROMPT, draft, target, N, K, seed, stats=stats)
    return out, stats, calls


def test_recording_models_give_the_same_tokens_and_one_call_per_forward_pass():
    out, stats, calls = recorded_run()
    bare = sampling.speculative_sampling(PROMPT, tiny_model(1), tiny_model(2), N, K, 0)
    assert np.array_equal(out, bare)
    assert sum(call.role == "draft" for call in calls) == stats.draft_calls
    assert sum(call.role == "target" for call in calls) == stats.target_calls
    assert all(call.end >= call.start for call in calls)


def test_split_loops_gives_each_loop_its_draft_steps_its_verification_and_its_tokens():
    _, stats, calls = recorded_run()
    loops = timeline.split_loops(calls, stats.origins)
    assert len(loops) == stats.loops and sum(len(loop.origins) for loop in loops) == N
    assert {"corrected", "bonus"} <= {loop.origins[-1] for loop in loops}  # both endings occur in this run
    for loop in loops:
        assert loop.origins[-1] in timeline.LOOP_ENDS and loop.target_call.n_last == len(loop.draft_calls) + 1
        assert loop.origins[:-1] == ["accepted"] * (len(loop.origins) - 1)
    with pytest.raises(ValueError, match="disagree"):
        timeline.split_loops(calls, stats.origins[:-1])


def test_cache_rows_show_the_rollback_and_the_drafts_catch_up():
    _, stats, calls = recorded_run()
    rows = timeline.cache_rows(timeline.split_loops(calls, stats.origins))
    for before, row in zip(rows, rows[1:]):
        assert row["n"] == before["n"] + before["accepted"] + 1
        # the target keeps the accepted prefix of what it verified and feeds the new token and the drafts
        assert row["target_cached"] == before["target_after"] == before["n"] + before["K"]
        assert row["target_kept"] == row["n"] - 1 and row["target_fed"] == row["K"] + 1
        if row["K"]:  # the draft never scored its last draft: after a bonus it feeds two tokens, else one
            assert row["draft_fed"] == (2 if before["ends"] == "bonus" else 1)
            assert row["draft_kept"] == row["n"] - row["draft_fed"]
    assert len(timeline.format_cache_table(rows).splitlines()) == len(rows) + 1


def test_runs_and_conditional_rates_on_a_hand_made_sequence():
    origins = ["accepted", "accepted", "corrected", "corrected", "accepted", "accepted", "accepted", "bonus",
               "accepted", "corrected", "accepted"]
    assert timeline.judged(origins) == [True, True, False, False, True, True, True, True, False, True]
    assert timeline.acceptance_runs(origins) == [2, 0, 4]  # the run continues across the bonus token
    pattern = timeline.acceptance_pattern(origins)
    assert pattern["alpha"] == pytest.approx(7 / 10) and pattern["geometric_mean"] == pytest.approx(10 / 3)
    assert pattern["judged_per_rejection"] == pytest.approx(3)  # runs 2, 0 and 4, each with its rejection
    assert pattern["after_accepted"] == pytest.approx(4 / 6) and pattern["after_rejected"] == pytest.approx(2 / 3)
    assert pattern["difference_se"] == pytest.approx(np.sqrt(0.7 * 0.3 * (1 / 6 + 1 / 3)))
    with pytest.raises(ValueError, match="accepted and rejected"):
        timeline.acceptance_pattern(["accepted", "accepted", "bonus"])


def test_pictures_draw_one_box_per_call_and_token():
    out, stats, calls = recorded_run()
    loops = timeline.split_loops(calls, stats.origins)[:5]
    fig, (top, bottom) = plt.subplots(2)
    timeline.plot_timeline(top, loops, timeline.median_seconds(calls, "target"), out[len(PROMPT):])
    boxes = sum(len(loop.draft_calls) + 1 + len(loop.origins) for loop in loops)
    assert len(top.patches) == boxes and len(top.texts) == sum(len(loop.origins) for loop in loops)
    timeline.plot_acceptance_strip(bottom, stats.origins, width=16)
    assert len(bottom.patches) == N
    plt.close(fig)
