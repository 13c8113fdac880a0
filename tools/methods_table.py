"""Rewrite the methods table of ``docs/methods.md`` from the registry (``atr_theory.docs``; a test fails when the
page is stale).

    python -m tools.methods_table            # docs/methods.md
    python -m tools.methods_table PAGE       # another page with the table's markers
"""

from __future__ import annotations

import argparse
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "methods.md"


def main(argv: list[str] | None = None) -> None:
    from atr_llm.cli_types import ReadFile
    from atr_llm.command_line import Parser
    from atr_theory.docs import readme_with_table

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "page",
        nargs="?",
        type=ReadFile(as_path=True),
        default=None,
        help="the page to rewrite (default: docs/methods.md)",
    )
    path = ap.parse_args(argv).page or PAGE
    path.write_text(readme_with_table(path.read_text()))
    print(f"wrote the methods table into {path}")


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
