"""The classroom in a browser: one self-contained HTML file that replays a speculative run loop by loop, draws its
calls on one time axis and lets a class explore Leviathan et al.'s formula (main.py --html, docs/run.html).

`page_data` gathers what the page shows (the loops that trace.py replays from the run's recordings, the text token
by token, the calls' times, this run's measured alpha, c and v, and the decoder's own source); `render` inlines
page/page.html, page.css, the SCRIPTS (plain JavaScript) and that data as JSON into one file: no network request, no
build step, nothing to install. `write_page` writes it atomically.
"""

import inspect
import json
from pathlib import Path

import sampling
from checkpoints.atomic import write_atomically
from verifiers import block

PAGE_DIR = Path(__file__).with_name("page")
SCRIPTS = ("common.js", "replay.js", "timeline.js", "explorer.js")  # in page/, inlined in this order
# each verifier's source on the page: its functions, from the first to the last, and the lines the replay
# highlights, found by their text so that the page follows the code
SOURCES = {
    "token": ([sampling.speculative_sampling], {
        "draft": "drafts, p = draw_drafts(", "verify": "q = timed_probs(target_model", "r": "r = rng.random()",
        "test": "if accepts(r,", "accept": "x = np.append(x, token)", "reject": "sample(max_fn(",
        "bonus": "sample(q[K_n], rng)"}),
    "block": ([block.block_speculative_sampling, block.verify_block], {
        "draft": "drafts, p = draw_drafts(", "verify": "q = timed_probs(target_model",
        "weights": "b, h = block_weights(", "eta": "eta = [rng.random()", "tau": "tau = max(",
        "bonus": "return tau, q[K]", "reject": "return tau, max_fn(", "sample": "sample(next_token_probs, rng)"}),
}
SIGNIFICANT_DIGITS = 6  # of every probability and uniform in the page's JSON: it keeps the file small


def page_data(recording, loops, n_prompt, decode, describe_run, measured, machine, verifier="token"):
    """What the page shows, as plain JSON types. recording and loops: trace.record_run's and trace.replay_loops';
    decode: token ids -> text; describe_run: the run in words; measured: this run's alpha, c, v, K and speedups;
    machine: bench.machine.machine_line(); verifier: token or block, the rule the loops were decided by."""
    new_tokens = recording["x"][n_prompt:].tolist()
    origins = [token["origin"] for loop in loops for token in loop["tokens"]]
    pieces = text_pieces(new_tokens, decode)
    start = recording["calls"][0].start  # each run's times count from its own first call: one axis for both
    autoregressive_start = recording["autoregressive_calls"][0].start
    return rounded({
        "run": describe_run, "machine": machine, "prompt": decode(recording["x"][:n_prompt].tolist()),
        "text": "".join(pieces), "tokens": [{"id": token, "piece": piece, "origin": origin}
                                            for token, piece, origin in zip(new_tokens, pieces, origins)],
        "loops": [{**loop, "times": shifted(loop["times"], start)} for loop in loops],
        "autoregressive": [[1e3 * (call.start - autoregressive_start), 1e3 * (call.end - autoregressive_start)]
                           for call in recording["autoregressive_calls"]],
        "measured": measured, "verifier": verifier, "source": source_listing(*SOURCES[verifier])})


def text_pieces(tokens, decode):
    """Each token's share of the text: the text of the tokens so far, less the text before it. A character split
    across tokens shows with the token that completes it, so the pieces join to exactly decode(tokens)."""
    pieces, shown = [], ""
    for end in range(1, len(tokens) + 1):
        text = decode(tokens[:end])
        if end < len(tokens):
            text = text.rstrip("\ufffd")  # an unfinished character: it waits for its next byte
        pieces.append(text[len(shown):] if len(text) > len(shown) else "")
        shown = text if len(text) > len(shown) else shown
    return pieces


def shifted(times, start):  # a loop's perf_counter seconds -> milliseconds since the run's first call
    def ms(interval):
        return [1e3 * (interval[0] - start), 1e3 * (interval[1] - start)]
    return {"draft": [ms(call) for call in times["draft"]], "target": ms(times["target"])}


def source_listing(functions, marks):
    """The source of one file from the first function's first line to the last function's last line: its lines, the
    file's number of its first line, and the index of the one line holding each mark's text."""
    file_lines, _ = inspect.findsource(functions[0])
    first = inspect.getsourcelines(functions[0])[1]
    last_lines, last_start = inspect.getsourcelines(functions[-1])
    lines = [line.rstrip("\n") for line in file_lines[first - 1:last_start - 1 + len(last_lines)]]
    found = {name: [i for i, line in enumerate(lines) if text in line] for name, text in marks.items()}
    for name, indices in found.items():
        if len(indices) != 1:
            raise ValueError(f"the page's source has {len(indices)} lines with {marks[name]!r}, it needs one")
    return {"lines": lines, "first_line": first, "marks": {name: indices[0] for name, indices in found.items()},
            "title": f"{Path(inspect.getsourcefile(functions[0])).name}: "
                     + ", ".join(function.__name__ for function in functions)}


def rounded(value):
    """value with every float kept to SIGNIFICANT_DIGITS, lists and dicts walked."""
    if isinstance(value, float):
        return float(f"{value:.{SIGNIFICANT_DIGITS}g}")
    if isinstance(value, dict):
        return {key: rounded(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(item) for item in value]
    return value


def render(data):
    """The page: page.html with page.css, the SCRIPTS and the data inlined. In the JSON every "<" is escaped, so no
    text of the run (a "</script>" in a prompt) can end its script element."""
    html = (PAGE_DIR / "page.html").read_text()
    trace = json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")
    for marker, text in (("/*PAGE_CSS*/", (PAGE_DIR / "page.css").read_text()),
                         ("/*PAGE_JS*/", "\n".join((PAGE_DIR / name).read_text() for name in SCRIPTS)),
                         ("/*TRACE_JSON*/", trace)):
        html = html.replace(marker, text, 1)
    return html


def write_page(path, data):
    write_atomically(path, render(data).encode("utf-8"))
