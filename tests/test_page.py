"""main.py --html's page without a browser (test_page_browser.py opens it in one): the run's trace, decided again
from its recordings (classroom/trace.py), the page's data and file (classroom/page.py), and --html's errors."""

import json
import re

import numpy as np
import pytest

import sampling
from classroom import page, trace
from verifiers import block
from conftest import bundled_pair_after
from helpers import PAIR, assert_short_error, run_main

PROMPT = 'def flatten(items):\n    """Return a flat list of the items in nested lists."""'
EMBEDDED = re.compile(r'<script id="trace" type="application/json">(.*?)</script>', re.S)


@pytest.fixture(scope="module")
def pair():
    return bundled_pair_after(PROMPT)


def record(pair, temperature, N=16, K=4, seed=123, verifier="token"):
    ids, draft, target = pair
    settings = sampling.SamplingSettings(temperature)
    return ids, settings, trace.record_run(ids, draft, target, N, K, settings, seed, verifier)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_replayed_loops_are_the_runs(pair, temperature):
    ids, settings, recording = record(pair, temperature)
    _, draft, target = pair
    draft.reset(), target.reset()
    x = sampling.speculative_sampling(ids, draft, target, 16, 4, rng=123, temperature=temperature)
    np.testing.assert_array_equal(recording["x"], x)  # recording changes nothing
    assert all(logits.dtype == np.float32 for _, logits in recording["inputs"])
    loops, n = trace.replay_loops(recording, len(ids), settings, str), len(ids)
    assert [token["origin"] for loop in loops for token in loop["tokens"]] == recording["origins"]
    assert [token["id"] for loop in loops for token in loop["tokens"]] == x[len(ids):].tolist()
    for loop in loops:
        judged = [draft for draft in loop["drafts"] if draft.get("judged") is not False]
        assert all(draft["accepted"] == (draft["r"] < draft["ratio"]) for draft in judged)
        assert all(draft["ratio"] == min(1.0, draft["q"] / draft["p"]) for draft in judged)
        assert all(draft["accepted"] for draft in judged[:-1])  # a loop stops at its first rejection
        ending = loop["ending"]
        if ending["kind"] == "corrected":
            assert not judged[-1]["accepted"] and ending["at"] == len(judged) - 1
            residual = {bar["token"]: bar["residual"] for bar in ending["bars"]}
            assert residual[ending["token"]] > 0  # drawn where q exceeds p
        # the target's cache ends holding the text so far and the drafts it scored; it kept at most the text so far
        cache = loop["cache"]["target"]
        assert cache["after"] == n + len(loop["drafts"]) and cache["kept"] <= n
        n += len(loop["tokens"])


def test_block_verification_replayed(pair):
    ids, settings, recording = record(pair, 1.0, N=24, verifier="block")
    _, draft, target = pair
    draft.reset(), target.reset()
    x = block.block_speculative_sampling(ids, draft, target, 24, 4, rng=123, temperature=1.0)
    np.testing.assert_array_equal(recording["x"], x)
    loops = trace.replay_loops(recording, len(ids), settings, str, verifier="block")
    assert [token["origin"] for loop in loops for token in loop["tokens"]] == recording["origins"]
    for loop in loops:
        drafts = loop["drafts"]
        tau = max((t for t, draft in enumerate(drafts, 1) if draft["eta"] < draft["h"]), default=0)  # the paper's tau
        assert [draft["accepted"] for draft in drafts] == [t <= tau for t in range(1, len(drafts) + 1)]
        assert loop["ending"]["kind"] == (("bonus" if drafts else "target") if tau == len(drafts) else "corrected")
        weights = [1.0] + [draft["b"] for draft in drafts]
        assert all(b == pytest.approx(min(1.0, before * draft["q"] / draft["p"]), rel=1e-5)
                   for before, b, draft in zip(weights, weights[1:], drafts))
    with pytest.raises(trace.TraceMismatch):  # the same recording decided by the other rule
        trace.replay_loops(recording, len(ids), settings, str, verifier="token")


def test_a_recording_of_another_run_is_refused(pair):
    ids, settings, recording = record(pair, 1.0)
    recording["uniforms"][0] = 1 - recording["uniforms"][0]  # the first draft drawn from another uniform
    with pytest.raises(trace.TraceMismatch):
        trace.replay_loops(recording, len(ids), settings, str)
    _, _, recording = record(pair, 1.0)
    recording["x"] = recording["x"][:-1]
    with pytest.raises(trace.TraceMismatch):
        trace.replay_loops(recording, len(ids), settings, str)


def test_the_page_is_one_small_file_with_the_run_inside(pair, tmp_path):
    from encoder import get_encoder_from_dir
    from conftest import REPO

    encoder = get_encoder_from_dir(REPO / "models" / "teach-target")
    ids, settings, recording = record(pair, 1.0)
    loops = trace.replay_loops(recording, len(ids), settings, lambda token: encoder.decode([token]))
    measured = {"alpha": 0.7, "c": 0.1, "v": 1.5, "K": 4, "speedup": 1.3, "expected_speedup": 1.2,
                "decode_step_ms": 3.0}
    data = page.page_data(recording, loops, len(ids), encoder.decode, "the run", measured, "machine: here")
    assert data["text"] == encoder.decode(recording["x"][len(ids):].tolist())
    assert "".join(token["piece"] for token in data["tokens"]) == data["text"]
    assert data["prompt"] == PROMPT
    marks = data["source"]["marks"]
    lines = data["source"]["lines"]
    assert "rng.random()" in lines[marks["r"]] and "accepts(" in lines[marks["test"]]
    path = tmp_path / "run.html"
    page.write_page(path, data)
    html = path.read_text()
    assert json.loads(EMBEDDED.search(html).group(1)) == data
    assert not re.search(r"\b(src|href)\s*=|url\(|@import|https?://(?!www\.w3\.org/2000/svg)", EMBEDDED.sub("", html))
    assert [p.name for p in tmp_path.iterdir()] == ["run.html"]  # nothing half-written beside it


def test_text_pieces_keep_a_split_character_whole():
    decode = lambda tokens: bytes(tokens).decode("utf-8", errors="replace")  # noqa: E731 (bytes as tokens)
    tokens = list("né".encode())  # "é" is two bytes, two tokens
    assert page.text_pieces(tokens, decode) == ["n", "", "é"]


@pytest.mark.parametrize("flags, message", [
    (["--html", "/no/such/folder/run.html"], "--html cannot write /no/such/folder/run.html"),
    (["--html", "."], "--html needs the path of a file to write"),
    (["--html", "run.html", "--verifier", "tree"], "it cannot show --verifier tree"),
    (["--html", "run.html", "--K", "auto"], "it cannot show --K auto"),
    (["--html", "run.html", "--decoder", "autoregressive"], "it cannot show --decoder without speculative"),
    (["--html", "run.html", "--batch_size", "2"], "it cannot show a batch"),
    (["--html", "run.html", "--backend", "jax"], "it cannot show --backend jax"),
    (["--html", "run.html", "--draft_model_size", "prompt-lookup"], "it cannot show --draft_model_size prompt-lookup"),
])
def test_html_errors_come_before_any_model_loads(flags, message, tmp_path):
    # a models folder that does not exist: an error about the page proves the check came first
    result = run_main(*PAIR, *flags, models_dir=tmp_path / "missing", cwd=tmp_path)
    assert_short_error(result, message)
    assert list(tmp_path.iterdir()) == []


def test_html_writes_the_page_of_the_run(models_dir, tmp_path):
    result = run_main(*PAIR, "--n_tokens_to_generate", "12", "--K", "3", "--temperature", "1", "--repeats", "1",
                      "--json", "--html", str(tmp_path / "run.html"), models_dir=models_dir)
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout.strip().splitlines()[-1])
    data = json.loads(EMBEDDED.search((tmp_path / "run.html").read_text()).group(1))
    assert data["text"] == output["speculative"]["text"]
    assert data["measured"]["alpha"] == pytest.approx(output["speculative"]["acceptance_rate"], rel=1e-5)
    assert sum(len(loop["tokens"]) for loop in data["loops"]) == 12
    assert len(data["autoregressive"]) == 12



def test_the_committed_page_is_the_bundled_pairs_default_run():
    from conftest import REPO
    import main

    html = (REPO / "docs" / "run.html").read_text()
    assert len(html.encode()) < 500_000
    data = json.loads(EMBEDDED.search(html).group(1))
    assert data["prompt"] == main.DEFAULT_PROMPT and len(data["tokens"]) == 64
    assert data["run"] == "teach-draft drafting for teach-target, K 4, temperature 0.0"
    assert html == page.render(data)  # the page's code is the one in classroom/page/: regenerate docs/run.html
