"""Checks over the built documentation site: what a reader would see broken.

    python -m mkdocs build --strict --site-dir SITE && python -m tools.check_site SITE   # (make test runs both)

Fails (exit 1, one line per finding) on: a doctest shown as nested quotes, a raw Sphinx role (``:func:`` and kin) or an escaped pipe (``\\|``) shown
as text; Markdown left unrendered in a paragraph (a list item or a heading that lost its blank line); RST double
backticks shown as text; a page that writes TeX without the site's own MathJax (``javascripts/mathjax/tex-svg.js``);
a PNG under ``docs/`` that no page shows; a figure that does not open at full size on click (an image outside a
glightbox link, ``mkdocs-glightbox``); an API page without ATRGRPOConfig's fields.
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from pathlib import Path

ROLE = re.compile(r":(?:func|class|mod|meth|data|attr|obj|exc):(?:<code>|`)")
UNRENDERED_LIST = re.compile(r"<p>[^<]*(?:<[^/p][^>]*>[^<]*</[^>]+>[^<]*)*\n(?:\* |- |\d+\. )\*\*")
CONFIG_FIELDS = ("divergence_delta", "epsilon_low", "method_seed", "fast_generation")
FIGURE = re.compile(r'<img\b[^>]*\bsrc="[^"]+\.(?:png|jpg|jpeg|svg)"')
ENLARGED_FIGURE = re.compile(r'<a class="glightbox"[^>]*>\s*<img\b')


def _visible_text(page: str) -> str:
    """The page's text outside ``<pre>`` blocks and scripts, tags removed, entities decoded."""
    page = re.sub(r"<(pre|script|style)\b.*?</\1>", " ", page, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


def page_findings(name: str, page: str) -> list[str]:
    """What is wrong on one built page (its HTML)."""
    found = []
    body = re.sub(r"<(pre|script|style)\b.*?</\1>", " ", page, flags=re.S)
    if ROLE.search(body):
        found.append(f"{name}: a raw Sphinx role is shown ({ROLE.search(body).group(0)!r})")
    text = _visible_text(page)
    if "\\|" in text:
        found.append(f"{name}: an escaped pipe '\\|' is shown")
    if "``" in text:
        found.append(f"{name}: RST double backticks are shown")
    if re.search(r"<blockquote>\s*<blockquote>", body):
        found.append(f"{name}: nested quotes (a >>> example outside an Examples section)")
    if UNRENDERED_LIST.search(body):
        found.append(f"{name}: a list was left inside a paragraph (no blank line before it)")
    figures, enlarged = len(FIGURE.findall(body)), len(ENLARGED_FIGURE.findall(body))
    if figures > enlarged:
        found.append(f"{name}: {figures - enlarged} of its {figures} figures do not open at full size on click")
    if 'class="arithmatex"' in page and "javascripts/mathjax/tex-svg.js" not in page:
        found.append(f"{name}: TeX on the page but no MathJax loaded")
    return found


def site_findings(site: Path, docs: Path = Path("docs")) -> list[str]:
    """Every finding of :func:`page_findings` over ``site``, and the site-wide checks."""
    pages = {p.relative_to(site).as_posix(): p.read_text(errors="replace") for p in sorted(site.rglob("*.html"))}
    found = [f for name, page in pages.items() for f in page_findings(name, page)]
    if not (site / "javascripts" / "mathjax" / "tex-svg.js").is_file():
        found.append("the site has no javascripts/mathjax/tex-svg.js (docs/hooks/mathjax.py did not run)")
    if not any('class="arithmatex"' in page for page in pages.values()):
        found.append("no page typesets math")
    shown = "\n".join(pages.values())
    for png in sorted(docs.rglob("*.png")):
        rel = png.relative_to(docs).as_posix()
        if rel not in shown:
            found.append(f"{rel}: a figure under docs/ that no page shows")
    api = pages.get("api/index.html", "")
    for f in CONFIG_FIELDS:
        if f"atr_llm.config.ATRGRPOConfig.{f}" not in api:
            found.append(f"api/index.html: ATRGRPOConfig's field {f} is not documented")
    return found


def main(argv: list[str] | None = None) -> int:
    from atr_llm.cli_types import ReadDir
    from atr_llm.command_line import Parser

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "site_dir", metavar="SITE_DIR", type=ReadDir(holding="index.html", what="a built site"), help="a built site"
    )
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    found = site_findings(Path(args.site_dir))
    for line in found:
        print(line, file=sys.stderr)
    print(f"check_site: {len(found)} finding(s) in {args.site_dir}")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
