"""Screenshots of every page of a built site, for review by eye (``make docs-shots``; not run in CI).

    python -m tools.docs_shots SITE_DIR OUT_DIR [--width 1500] [--height 2400]

Needs Chromium (Debian: ``apt-get install chromium``); each page is rendered headless with 8 s of virtual time for
MathJax, one PNG per page named after its path.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess


def browser() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return name
    raise SystemExit("no Chromium found: apt-get install chromium (Debian) and run again")


def main(argv: list[str] | None = None) -> None:
    from atr_llm.cli_types import Integer, ReadDir, WriteDir
    from atr_llm.command_line import Parser

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "site",
        type=ReadDir(holding="index.html", what="a built site (run make docs first)", as_path=True),
        help="the built site",
    )
    ap.add_argument("out", type=WriteDir(as_path=True), help="folder for the screenshots")
    ap.add_argument("--width", type=Integer(100, 10_000), default=1500)
    ap.add_argument("--height", type=Integer(100, 100_000), default=2400)
    args = ap.parse_args(argv)
    exe = browser()
    args.out.mkdir(parents=True, exist_ok=True)
    pages = sorted(args.site.rglob("index.html"))
    for page in pages:
        name = page.parent.relative_to(args.site).as_posix().replace("/", "_") or "home"
        shot = args.out / f"{name}.png"
        cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--virtual-time-budget=8000"]
        cmd += [f"--window-size={args.width},{args.height}", f"--screenshot={shot}", page.resolve().as_uri()]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)
        print(shot)
    print(f"{len(pages)} pages -> {args.out}")


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
