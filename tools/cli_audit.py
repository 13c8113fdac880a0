"""Run a set of bad command lines as a new user would type them, each in a fresh process and a fresh working folder,
and record whether each was refused cleanly: exit status 2, one line on stderr that names the argument at fault, no
traceback, and nothing written.

    python -m tools.cli_audit                      # the committed set: tools/cli_audit_invocations.txt
    python -m tools.cli_audit --invocations FILE --out figures/tools/cli_audit/cli_audit.json

The set is a text file, one invocation per line: ``ARGUMENT<TAB>COMMAND``, where ARGUMENT is what the refusal must
name and COMMAND starts with ``python``. In COMMAND, ``{repo}`` is this checkout, ``{file}`` a small text file,
``{dir}`` an empty folder, ``{model}`` a saved tiny model (``python -m atr_llm.tiny``), ``{missing}`` a path that
does not exist. Lines starting with ``#`` are comments.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parents[1]
INVOCATIONS = ROOT / "tools" / "cli_audit_invocations.txt"
OUT = ROOT / "figures" / "tools" / "cli_audit" / "cli_audit.json"


def read_invocations(path: Path) -> list[tuple[str, str]]:
    """``(argument, command)`` of each line ``ARGUMENT<TAB>COMMAND`` of ``path``; a malformed line is refused by
    its number."""
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        argument, sep, command = line.partition("\t")
        if not sep or not command.strip().startswith("python"):
            raise ValueError(f"--invocations {path}: line {number} is not ARGUMENT<TAB>python ...")
        rows.append((argument.strip(), command.strip()))
    return rows


def listing(folder: Path) -> set[tuple[str, int]]:
    """Every path below ``folder`` with its size (-1 for a folder): what a run may have written."""
    return {(str(p.relative_to(folder)), p.stat().st_size if p.is_file() else -1) for p in folder.rglob("*")}


def verdict(argument: str, returncode: int, stderr: str, wrote: list[str]) -> str:
    """``clean`` or what is wrong with a refusal, in words."""
    lines = stderr.strip().splitlines()
    if returncode != 2:
        return f"exit {returncode}"
    if "Traceback" in stderr:
        return "a traceback"
    if len(lines) != 1:
        return f"{len(lines)} lines on stderr"
    if argument not in lines[0]:
        return f"does not name {argument}"
    if wrote:
        return f"wrote {wrote[:3]}"
    return "clean"


def audit(rows: list[tuple[str, str]], fixtures: dict[str, str], timeout: float = 300) -> list[dict]:
    """Run each ``(argument, command)`` in a fresh working folder; one record per invocation."""
    results = []
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    fixture_root = Path(fixtures["dir"]).parent
    for argument, command in tqdm(rows, desc="invocations"):
        argv = [a.format(**fixtures) for a in shlex.split(command)]
        argv[0] = sys.executable
        with tempfile.TemporaryDirectory() as work:
            before = listing(fixture_root)
            done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
            wrote = sorted(p for p, _ in (listing(Path(work)) | listing(fixture_root)) - before)
        results.append(
            {
                "argument": argument,
                "command": command,
                "exit": done.returncode,
                "stderr": done.stderr.strip()[-600:],
                "verdict": verdict(argument, done.returncode, done.stderr, wrote),
            }
        )
    return results


def main(argv: list[str] | None = None) -> dict:
    from atr_llm.cli_types import ReadFile, WriteFile
    from atr_llm.command_line import Parser

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--invocations", type=ReadFile(), default=INVOCATIONS, help="the set (default: the committed one)")
    ap.add_argument("--out", type=WriteFile(), default=OUT, help="where the records go (JSON)")
    args = ap.parse_args(argv)
    rows = read_invocations(Path(args.invocations))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        fixtures = {
            "repo": str(ROOT),
            "file": str(tmp / "fixtures" / "notes.txt"),
            "dir": str(tmp / "fixtures" / "empty"),
        }
        fixtures |= {"model": str(tmp / "model"), "missing": str(tmp / "fixtures" / "no-such-thing")}
        Path(fixtures["dir"]).mkdir(parents=True)
        Path(fixtures["file"]).write_text("some notes\n")
        subprocess.run(
            [sys.executable, "-m", "atr_llm.tiny", "--out", fixtures["model"]], check=True, capture_output=True
        )
        results = audit(rows, fixtures)
    clean = sum(r["verdict"] == "clean" for r in results)
    summary = {
        "command": " ".join(["python -m tools.cli_audit", *(sys.argv[1:] if argv is None else argv)]),
        "invocations": len(results),
        "clean": clean,
        "not_clean": [r for r in results if r["verdict"] != "clean"],
        "results": results,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1) + "\n")
    print(f"{clean} of {len(results)} refused cleanly; wrote {out}")
    for r in summary["not_clean"]:
        print(f"  {r['verdict']}: {r['command']}\n    {r['stderr'][-300:]}")
    return summary


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
