"""main.py --html's page in a real browser (Debian's chromium, driven by playwright): opened from a file it requests
nothing and logs no error, its replay ends on exactly the run's text, a chosen loop shows the trace's r, min(1, q/p)
and verdicts, the formula explorer shows speedup/stats.py's and costs.py's numbers, and it fits a phone's width.
The committed docs/run.html (the bundled pair's greedy default run) and a freshly written sampled run are tested."""

import json
import shutil

import pytest
from PIL import Image

from conftest import REPO
from helpers import run_main
from speedup.costs import MeasuredCosts
from speedup.stats import expected_speedup, expected_tokens_per_loop
from test_page import EMBEDDED
from tools import screenshot_page

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install -r requirements-dev.txt")
    if not shutil.which(CHROMIUM):
        pytest.skip(f"no browser at {CHROMIUM}: apt-get install chromium")
    with sync_api.sync_playwright() as playwright:
        # the system's chromium, never a downloaded one; no sandbox, which needs a user namespace root lacks here
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """{name: (path, the run embedded in it)}: the committed greedy page, and a sampled run written now."""
    folder = tmp_path_factory.mktemp("page")
    paths = {"greedy": REPO / "docs" / "run.html", "sampled": folder / "sampled.html", "block": folder / "block.html"}
    for name, flags in (("sampled", []), ("block", ["--verifier", "block"])):
        result = run_main("--temperature", "1", "--n_tokens_to_generate", "32", "--repeats", "1", *flags,
                          "--html", str(paths[name]))
        assert result.returncode == 0, result.stderr
    return {name: (path, json.loads(EMBEDDED.search(path.read_text()).group(1))) for name, path in paths.items()}


def open_page(browser, path, width=1280):
    """-> (the page, the URLs it requested, the errors it logged)."""
    page = browser.new_page(viewport={"width": width, "height": 900})
    requests, errors = [], []
    page.on("request", lambda request: requests.append(request.url))
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(path.as_uri())
    return page, requests, errors


def step_count(run):  # the start, then per loop: its drafts, the target's call, each judged draft, its last token
    if run["verifier"] == "block":  # the block judged in one step, where there are drafts
        return 1 + sum(4 if loop["drafts"] else 3 for loop in run["loops"])
    return 1 + sum(3 + sum(draft.get("judged") is not False for draft in loop["drafts"]) for loop in run["loops"])


def show_loop(page, number):
    page.evaluate(f"""const loop = document.getElementById('loop');
                      loop.value = {number}; loop.dispatchEvent(new Event('input'));""")


@pytest.mark.parametrize("name", ["greedy", "sampled", "block"])
def test_stepping_through_every_loop_ends_on_the_runs_text_with_no_request_and_no_error(browser, pages, name):
    path, run = pages[name]
    page, requests, errors = open_page(browser, path)
    assert page.text_content("#generated") == ""
    for _ in range(step_count(run) - 1):
        page.keyboard.press("ArrowRight")
    assert page.text_content("#generated") == run["text"]
    assert page.text_content("#prompt-text") == run["prompt"]
    assert page.text_content("#loop-number").startswith(f"{len(run['loops'])} of {len(run['loops'])}")
    # every token in the report's colours, by where it came from
    origins = page.eval_on_selector_all("#generated .token", "spans => spans.map(span => span.classList[1])")
    assert origins == [token["origin"] for token in run["tokens"]]
    page.keyboard.press("ArrowRight")  # the end stays the end
    assert page.text_content("#generated") == run["text"]
    page.keyboard.press("ArrowLeft")  # back before the last loop's last token
    assert page.text_content("#generated") == "".join(token["piece"] for token in run["tokens"][:-1])
    assert requests == [path.as_uri()] and errors == []
    page.close()


@pytest.mark.parametrize("name", ["greedy", "sampled", "block"])
def test_a_chosen_loop_shows_the_traces_r_ratio_and_verdicts(browser, pages, name):
    path, run = pages[name]
    page, _, errors = open_page(browser, path)
    rejected = next(i for i, loop in enumerate(run["loops"]) if loop["ending"]["kind"] == "corrected")
    kept_all = next(i for i, loop in enumerate(run["loops"]) if loop["ending"]["kind"] == "bonus")
    for index in (rejected, kept_all):
        show_loop(page, index + 1)
        rows = page.eval_on_selector_all("#drafts tbody tr", """rows => rows.map(row => Object.fromEntries(
            [...row.cells].slice(2).map(cell => [cell.classList[0], cell.textContent])))""")
        drafts = run["loops"][index]["drafts"]
        assert len(rows) == len(drafts)
        for row, draft in zip(rows, drafts):
            assert row["p"] == f"{draft['p']:.4f}" and row["q"] == f"{draft['q']:.4f}"
            if run["verifier"] == "block":
                assert (row["b"], row["h"], row["eta"]) == (f"{draft['b']:.4f}", f"{draft['h']:.3f}",
                                                            f"{draft['eta']:.3f}")
                assert row["verdict"] == ("kept" if draft["accepted"] else "dropped")
                continue
            if draft.get("judged") is False:
                assert row["verdict"] == "never judged" and row["r"] == ""
            else:
                assert row["r"] == f"{draft['r']:.3f}" and row["ratio"] == f"{draft['ratio']:.3f}"
                assert row["verdict"] == ("accepted" if draft["accepted"] else "rejected")
        ending = run["loops"][index]["ending"]
        drawn = page.text_content("#bars .bar-row.drawn .label")
        assert drawn.startswith(ending["text"].replace(" ", "\u2423").replace("\n", "\u21b5"))
        assert page.eval_on_selector_all("#bars .bar-row", "rows => rows.length") == len(ending["bars"])
    assert errors == []
    page.close()


SETTINGS = [(0.72, 4, 0.121, 1.69), (0.3, 1, 0.5, 1.0), (0.95, 12, 0.056, 1.0), (0.5, 8, 1.0, 2.5),
            (1.0, 4, 0.128, 1.0), (0.0, 2, 0.0, 0.5)]


def test_the_explorer_shows_the_formulas_values(browser, pages):
    path, run = pages["greedy"]
    page, _, errors = open_page(browser, path)
    for alpha, K, c, v in SETTINGS:
        page.evaluate(f"""for (const [id, value] of Object.entries({json.dumps(dict(alpha=alpha, K=K, c=c, v=v))})) {{
                              const slider = document.getElementById(id);
                              slider.value = value; slider.dispatchEvent(new Event('input')); }}""")
        shown = page.evaluate("""Object.fromEntries(['alpha', 'K', 'c', 'v', 'out-tokens', 'out-speedup',
            'out-break-even', 'out-best-K'].map(id => { const el = document.getElementById(id);
            return [id, el.tagName === 'INPUT' ? Number(el.value) : el.dataset.value]; }))""")
        assert (shown["alpha"], shown["K"], shown["c"], shown["v"]) == (alpha, K, c, v)
        costs = MeasuredCosts(1.0, c, (1.0,) + (v,) * 15)  # a decode step of 1: c in decode steps, v(m) = v past m = 1
        assert float(shown["out-tokens"]) == pytest.approx(expected_tokens_per_loop(alpha, K), rel=1e-12)
        assert float(shown["out-speedup"]) == pytest.approx(expected_speedup(alpha, c, K, v), rel=1e-12)
        assert int(shown["out-best-K"]) == costs.best_K(alpha, 12)
        break_even = costs.break_even_alpha(K)
        assert shown["out-break-even"] == "none" if break_even is None else (
            float(shown["out-break-even"]) == pytest.approx(break_even, rel=1e-12))
    # the run's preset puts the sliders on this run's measured alpha and K, and its measured point on the chart
    page.click("[data-preset=run]")
    assert float(page.input_value("#alpha")) == pytest.approx(run["measured"]["alpha"], abs=0.005)
    assert int(page.input_value("#K")) == run["measured"]["K"]
    assert page.query_selector("#measured-point") is not None
    assert errors == []
    page.close()


def test_the_buttons_and_play_and_speed_from_the_keyboard(browser, pages):
    path, run = pages["greedy"]
    page, _, errors = open_page(browser, path)
    page.click("#forward")
    page.click("#forward")
    page.click("#back")
    assert "(step 1 of" in page.text_content("#loop-number")
    page.click("#last")
    assert page.text_content("#generated") == run["text"]
    page.click("#first")
    assert page.text_content("#generated") == "" and "(step 0 of" in page.text_content("#loop-number")
    page.locator("body").click(position={"x": 5, "y": 5})  # the keys below go to the page, not a button
    for _ in range(3):
        page.keyboard.press("+")  # the fastest speed
    assert page.input_value("#speed") == "8"
    page.keyboard.press(" ")
    page.wait_for_timeout(700)
    page.keyboard.press(" ")
    position = page.text_content("#loop-number")
    assert "step 0 " not in position and page.text_content("#play") == "play"
    page.wait_for_timeout(300)
    assert page.text_content("#loop-number") == position  # paused
    assert errors == []
    page.close()


def test_a_phones_width_and_the_screenshots(browser, pages, tmp_path):
    path, run = pages["sampled"]
    for width in (390, 1280):
        page, _, errors = open_page(browser, path, width)
        screenshot_page.show_first_rejection(page)  # the widest step: the table, the bars and the caches
        assert "rejected" in page.text_content("#drafts")
        assert page.evaluate("document.documentElement.scrollWidth") <= width  # no sideways scrolling
        assert errors == []
        page.close()
        # the README's screenshot, by the tool that made it
        png = tmp_path / f"page-{width}.png"
        screenshot_page.screenshot(path, png, width, whole_page=width < 500, browser=browser)
        with Image.open(png) as image:
            assert image.width >= min(width, 1000) and image.height > 300
