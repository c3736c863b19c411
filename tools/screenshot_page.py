"""A PNG of main.py --html's page, as the README shows it: the replay at the first loop that ends in a rejection
(the drafts judged, the bars of p, q and (q - p)+, the source line), in Debian's chromium driven by playwright
(requirements-dev.txt; never a downloaded browser).

    python tools/screenshot_page.py docs/run.html docs/run.png
    python tools/screenshot_page.py docs/run.html phone.png --width 390 --whole_page
"""

import argparse
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"


def show_first_rejection(page):
    """Move the replay to the end of the first loop whose last token is a correction (the last loop if none is)."""
    page.evaluate("""() => {
        const trace = JSON.parse(document.getElementById('trace').textContent);
        const index = trace.loops.findIndex(loop => loop.ending.kind === 'corrected');
        const loop = document.getElementById('loop');
        loop.value = index < 0 ? trace.loops.length : index + 1;
        loop.dispatchEvent(new Event('input'));
    }""")


def few_colours(png_path, colours=64):
    """The PNG in a palette of a few colours: a third of its size, the text as sharp (Pillow comes with
    matplotlib)."""
    from PIL import Image

    with Image.open(png_path) as image:
        image.convert("RGB").quantize(colors=colours, method=Image.Quantize.MEDIANCUT).save(png_path, optimize=True)


def screenshot(page_path, png_path, width=1100, whole_page=False, browser=None):
    """Write png_path: the page's replay section at width pixels (the whole page with whole_page)."""
    from playwright.sync_api import sync_playwright  # a test-only dependency: imported where it is used

    def shoot(launched):
        page = launched.new_page(viewport={"width": width, "height": 900})
        page.goto(Path(page_path).resolve().as_uri())
        show_first_rejection(page)
        if whole_page:
            page.screenshot(path=str(png_path), full_page=True)
        else:  # the replay with a margin
            box = page.locator("#replay-section").bounding_box()
            page.screenshot(path=str(png_path), full_page=True, clip={
                "x": max(0, box["x"] - 8), "y": box["y"] - 8, "width": box["width"] + 16, "height": box["height"] + 16})
        page.close()
        few_colours(png_path)

    if browser is not None:
        return shoot(browser)
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        shoot(launched)
        launched.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("page", help="the page main.py --html wrote")
    parser.add_argument("png", help="the PNG to write")
    parser.add_argument("--width", type=int, default=1100, help="the browser window's width in pixels")
    parser.add_argument("--whole_page", action="store_true", help="the whole page, not only the replay")
    arguments = parser.parse_args()
    screenshot(arguments.page, arguments.png, arguments.width, arguments.whole_page)
