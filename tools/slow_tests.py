"""Which tests ``make test`` leaves to ``make test-slow``: every test that took at least ``--seconds`` in a measured run,
written to ``tests/slow_tests.txt`` (``tests/conftest.py`` marks each one ``slow`` when it is collected).

    python -m pytest atr_theory tests -m "not slow" --junitxml=/tmp/times.xml   # measure
    python -m tools.slow_tests /tmp/times.xml --seconds 7                        # rewrite the list

The list is a measurement: each line is a test's node id and the seconds it took in that run. Tests already marked
``slow`` in their file are not in the measured run and stay marked.
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIST = ROOT / "tests" / "slow_tests.txt"


def node_id(classname: str, name: str, root: Path = ROOT) -> str:
    """The pytest node id of a JUnit test case: the longest prefix of its dotted ``classname`` that is a file under
    ``root`` (``tests.studies.test_x`` -> ``tests/studies/test_x.py``), then any class, then the test's name."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        path = Path(*parts[:cut]).with_suffix(".py")
        if (root / path).is_file():
            return "::".join([path.as_posix(), *parts[cut:], name])
    raise ValueError(f"{classname}: no test file under {root} for this JUnit class name")


def measured(junit: Path) -> list[tuple[float, str]]:
    """``(seconds, node id)`` of every test case in a JUnit XML file that ran (skipped ones left out)."""
    cases = []
    for case in ET.parse(junit).iter("testcase"):
        if case.find("skipped") is not None or not case.get("classname"):
            continue
        cases.append((float(case.get("time", 0.0)), node_id(case.get("classname"), case.get("name"))))
    return cases


def main(argv: list[str] | None = None) -> list[str]:
    from atr_llm.cli_types import ReadFile, Real
    from atr_llm.command_line import Parser, refuse

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("junit", type=ReadFile(as_path=True), help="a JUnit XML file of a `pytest -m 'not slow'` run")
    ap.add_argument(
        "--seconds", type=Real(0, open_low=True), default=7.0, help="tests at least this slow go to make test-slow (> 0)"
    )
    args = ap.parse_args(argv)
    try:
        cases = measured(args.junit)
    except (ET.ParseError, ValueError) as e:
        raise refuse("junit", str(args.junit), f"not a JUnit XML file of this repository's tests ({e})") from None
    slow = sorted((node, seconds) for seconds, node in cases if seconds >= args.seconds)
    kept = [line for line in LIST.read_text().splitlines() if line and not line.startswith("#")] if LIST.exists() else []
    old = {line.split("  # ")[0].strip(): line for line in kept}
    new = {node: f"{node}  # {seconds:.1f} s" for node, seconds in slow}
    lines = [new.get(n, old.get(n)) for n in sorted(old | new)]
    header = (
        f"# Tests make test leaves to make test-slow (tests/conftest.py marks them slow): each took >= {args.seconds:g} s\n"
        "# in a measured `pytest -m 'not slow'` run; `python -m tools.slow_tests JUNIT.xml --seconds S` adds to it.\n"
    )
    LIST.write_text(header + "\n".join(lines) + "\n")
    print(f"{len(new)} tests at >= {args.seconds:g} s; {len(lines)} in {LIST.relative_to(ROOT)}")
    return lines


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
