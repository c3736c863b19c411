"""--html PATH: after the timed runs, one more speculative run recorded call by call (classroom/trace.py) and written
as the page that replays it (classroom/page.py). `check_html` refuses, before any model loads, a path that cannot
be written and the runs the replay cannot show: it replays Algorithm 2 (--verifier token) or block verification
(--verifier block) on one sequence, with a draft model on the NumPy backend (whose calls it records one by one) and
a fixed K.
"""

import os
import tempfile

from bench.machine import machine_line
from classroom import page, trace
from cli.drafter_flags import WITHOUT_A_MODEL

VERIFIERS = tuple(page.SOURCES)  # the rules the page can replay: token and block


def check_html(html, prompts, batch_size, decoders, verifier, backend, K, draft_model_size):
    """-> the page's path, or None without --html; ValueError for what the page cannot be written for."""
    if html is None:
        return None
    if not isinstance(html, str) or not html or os.path.isdir(html):
        raise ValueError(f"--html needs the path of a file to write, got {html!r}")
    unshown = what_the_page_cannot_show(prompts, batch_size, decoders, verifier, backend, K, draft_model_size)
    if unshown:
        raise ValueError(f"--html replays token or block verification on one sequence with a draft model on the "
                         f"NumPy backend: it cannot show {unshown}")
    check_writable(html)
    return html


def what_the_page_cannot_show(prompts, batch_size, decoders, verifier, backend, K, draft_model_size):
    """The first flag that asks for a run the replay cannot show, in words; None if it can show the run."""
    if isinstance(prompts, (list, tuple)) and len(prompts) > 1 or batch_size not in (None, 1):
        return "a batch"
    if "speculative" not in decoders:
        return "--decoder without speculative"
    if verifier not in VERIFIERS:
        return f"--verifier {verifier}"
    if backend != "numpy":  # the JAX model drafts K tokens in one device call: no call to record per token
        return f"--backend {backend}"
    if K == "auto" or draft_model_size in WITHOUT_A_MODEL:  # drafts that are proposed, not drawn from a model's p
        return "--K auto" if K == "auto" else f"--draft_model_size {draft_model_size}"
    return None


def check_writable(path):
    """Create and remove a file beside path, so a folder that is missing or read-only fails now, not after the runs."""
    try:
        with tempfile.NamedTemporaryFile(dir=os.path.dirname(os.path.abspath(path)), prefix=".html-check-"):
            pass
    except OSError as error:
        raise ValueError(f"--html cannot write {path}: {error.strerror or error}") from None


def write_html(run, prompt_ids, draft, target, encoder, result):
    """Record one more speculative run (and an autoregressive one, for the time axis) and write its page."""
    from cli.report import describe_pair  # here: cli.report imports cli.flags, which imports this module

    flags, settings = run.flags, run.settings
    verifier = flags["verifier"]
    recording = trace.record_run(prompt_ids, draft, target, flags["n_tokens"], flags["K"], settings, flags["seed"],
                                 verifier)
    loops = trace.replay_loops(recording, len(prompt_ids), settings, lambda token: encoder.decode([token]), verifier)
    speculative = result["speculative"]
    measured = {"alpha": speculative["acceptance_rate"], "c": speculative["cost_ratio"],
                "v": speculative["verify_steps"], "K": flags["K"], "speedup": speculative["speedup"],
                "expected_speedup": speculative["expected_speedup"],
                "decode_step_ms": 1e3 * speculative["decode_step_seconds"] if speculative["decode_step_seconds"]
                else None}
    words = describe_pair(flags) + ("" if verifier == "token" else ", block verification")
    data = page.page_data(recording, loops, len(prompt_ids), encoder.decode, words, measured, machine_line(), verifier)
    if data["text"] != speculative["text"]:
        raise trace.TraceMismatch("the recorded run wrote another text than the timed runs")
    page.write_page(run.html, data)
