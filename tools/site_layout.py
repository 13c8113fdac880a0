"""Which code blocks and tables of a built site are wider than their column, as a reader's browser draws them
(``make test`` runs it on the pages a user reads first, ``FIRST_PAGES``; ``tests/test_site_layout.py`` checks the
measurement itself).

    python -m tools.site_layout SITE_DIR [--width 1280] [--height 800] [--page index.html ...] [--if-browser]
        [--figures] [--figure-text-px 9]

Each page is copied with a small script added that, once the page (and MathJax) has rendered, measures every
``pre`` and ``table`` of the article and writes what overflows into the page; headless Chromium (``--dump-dom``)
prints the page after it ran, and this reads the finding back. A block overflows when its content is wider than its
box (``scrollWidth > clientWidth``: a horizontal scroll bar, the code element for a code block, Material's scroll
wrapper for a table). Each figure's smallest text on screen is measured from the width the page shows it at and the
text size its PNG records (``figure_text_px``); ``--figures`` lists them. Needs
Chromium (Debian: ``apt-get install chromium``).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from tools.docs_shots import browser

FIRST_PAGES = (
    "index.html",
    "getting-started/index.html",
    "trainer/index.html",
    "methods/index.html",
    "api/index.html",
    "experiments/index.html",
    "experiments/learning-regime/index.html",
    "experiments/cpu-table/index.html",
    "experiments/trust-region/index.html",
    "experiments/range-form/index.html",
    "experiments/mask-mechanism/index.html",
)
"""The pages a user reads first: the home, getting started, the trainer, the methods, the API, and the studies."""

_MEASURE = """
<script>
window.addEventListener("load", () => setTimeout(() => {
  const article = document.querySelector("article.md-content__inner") || document.body;
  const column = article.clientWidth;
  const found = [];
  article.querySelectorAll("pre, table").forEach((el, i) => {
    // a code block scrolls in its code element, a table in Material's scroll wrapper
    const scroller = el.tagName === "PRE" ? (el.querySelector("code") || el)
      : (el.closest(".md-typeset__scrollwrap") || el.parentElement);
    if (scroller.scrollWidth > scroller.clientWidth + 1) {
      const text = (el.innerText || "").trim().split("\\n")[0].slice(0, 80);
      found.push({kind: el.tagName.toLowerCase(), index: i, content: scroller.scrollWidth,
                  box: scroller.clientWidth, column: column, first_line: text});
    }
  });
  const images = [];
  article.querySelectorAll("img").forEach((img) => {
    images.push({src: img.getAttribute("src") || "", natural: img.naturalWidth, shown: img.clientWidth});
  });
  const out = document.createElement("script");
  out.type = "application/json"; out.id = "layout-findings";
  out.textContent = JSON.stringify({column: column, overflowing: found, images: images});
  document.body.appendChild(out);
}, 1500));
</script>
"""


def page_layout(site: Path, page: str, width: int = 1280, height: int = 800, exe: str | None = None) -> dict:
    """``{"column": px, "overflowing": [{kind, content, box, column, first_line}, ...]}`` of ``site/page`` drawn at
    ``width`` x ``height``."""
    exe = exe or browser()
    html = (site / page).read_text(encoding="utf-8")
    with tempfile.NamedTemporaryFile("w", suffix=".html", dir=(site / page).parent, delete=False) as handle:
        handle.write(html.replace("</body>", _MEASURE + "</body>", 1))
        probe = Path(handle.name)
    try:
        dom = subprocess.run(
            [
                exe,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                f"--window-size={width},{height}",
                "--virtual-time-budget=10000",
                "--dump-dom",
                probe.as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        ).stdout
    finally:
        probe.unlink()
    found = re.search(r'<script type="application/json" id="layout-findings">(.*?)</script>', dom, re.S)
    if found is None:
        raise RuntimeError(f"{page}: the measuring script left no finding (did the page load?)")
    return json.loads(found.group(1))


def figure_text_px(site: Path, page: str, image: dict) -> float | None:
    """The height on screen, in pixels, of the smallest text of a figure ``image`` (``{src, natural, shown}`` as the
    page drew it): ``pt * dpi / 72`` pixels in the PNG (the entries ``sims._common.png_text_metadata`` writes),
    scaled by the width shown over the PNG's own; None for an image that records no text size (not a PNG, or
    saved before the entries were written)."""
    from PIL import Image

    from sims._common import DPI_KEY, SMALLEST_TEXT_KEY

    path = ((site / page).parent / image["src"]).resolve()
    if path.suffix.lower() != ".png" or not path.is_file() or not image.get("natural"):
        return None
    with Image.open(path) as png:
        entries = getattr(png, "text", {}) or {}
    if SMALLEST_TEXT_KEY not in entries or DPI_KEY not in entries:
        return None
    in_file = float(entries[SMALLEST_TEXT_KEY]) * float(entries[DPI_KEY]) / 72
    return in_file * image["shown"] / image["natural"]


def main(argv: list[str] | None = None) -> int:
    from atr_llm.cli_types import Integer, ReadDir, Real, Text
    from atr_llm.command_line import Parser

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "site",
        type=ReadDir(holding="index.html", what="a built site (run make docs first)", as_path=True),
        help="the built site",
    )
    ap.add_argument("--width", type=Integer(320, 10_000), default=1280)
    ap.add_argument("--height", type=Integer(200, 100_000), default=800)
    ap.add_argument(
        "--page", type=Text(), nargs="+", default=list(FIRST_PAGES), help="pages, relative to the site"
    )
    ap.add_argument("--figures", action="store_true", help="list every figure with its smallest text on screen")
    ap.add_argument(
        "--figure-text-px",
        type=Real(0, 100),
        default=0.0,
        help="name each figure whose smallest text is below this many pixels on screen (0: none); not a failure",
    )
    ap.add_argument(
        "--if-browser",
        action="store_true",
        help="without Chromium, say so and exit 0 (make test on a machine without a browser) instead of failing",
    )
    args = ap.parse_args(argv)
    if args.if_browser and not any(shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")):
        print("site layout NOT measured: no Chromium on PATH (apt-get install chromium)")
        return 0
    exe, bad = browser(), 0
    for page in args.page:
        if not (args.site / page).is_file():
            ap.error(f"--page {page}: no such page in {args.site}")
        result = page_layout(args.site, page, args.width, args.height, exe)
        for f in result["overflowing"]:
            bad += 1
            print(f"{page}: {f['kind']} {f['content']} px in {f['box']} px (column {f['column']}): {f['first_line']}")
        print(f"{page}: column {result['column']} px, {len(result['overflowing'])} overflowing")
        for image in result.get("images", []):
            px = figure_text_px(args.site, page, image)
            shown = "no text size recorded" if px is None else f"smallest text {px:.1f} px"
            small = px is not None and px < args.figure_text_px
            if args.figures or small:
                print(f"{page}: figure {image['src']} shown {image['shown']} px: {shown}{' (small)' if small else ''}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
