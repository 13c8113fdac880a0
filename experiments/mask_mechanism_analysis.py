"""The mask-mechanism study's per-step record (docs/experiments/mask-mechanism-preregistration.md, part 1): every logged
row of every run at every reuse depth D, read from the runs' ``log_history.json``, into one committed file, so that
the pre-registered timing question (does the fraction against the advantage rise before the reward falls?) can be
answered from the repository without the runs folders.

    python -m experiments.mask_mechanism_analysis --runs D1=runs/mask_mechanism/D1 --runs D32=runs/mask_mechanism ...

Writes ``figures/experiments/mask_mechanism/by_step.csv``: depth, run, seed, step and the logged keys of ``KEYS``
(empty where a row did not log one).
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "figures" / "experiments" / "mask_mechanism" / "by_step.csv"
RUNS = ("clip", "clip-mask")
KEYS = (
    "reward",
    "clip/frac_outside_against_advantage",
    "clip/frac_outside_with_advantage",
    "clip/frac_masked",
    "true_kl/mean",
    "true_kl/mean_against_advantage",
    "entropy",
)


def by_step(runs_dirs: dict[int, Path]) -> list[dict]:
    """One row per logged step (a row of TRL's ``log_history`` with a ``step`` and one of ``KEYS``) of each run
    ``<runs_dir>/<run>-s<seed>/log_history.json`` (run in ``RUNS``), by depth, run, seed and step."""
    rows = []
    for depth, runs_dir in sorted(runs_dirs.items()):
        for path in sorted(Path(runs_dir).glob("*/log_history.json")):
            m = re.fullmatch(r"(.+)-s(\d+)", path.parent.name)
            if not m or m.group(1) not in RUNS:
                continue
            for h in json.loads(path.read_text()):
                if "step" in h and any(k in h for k in KEYS):
                    row = {"depth": depth, "run": m.group(1), "seed": int(m.group(2)), "step": h["step"]}
                    rows.append(row | {k: h.get(k) for k in KEYS})
    return rows


def write(rows: list[dict], out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["depth", "run", "seed", "step", *KEYS])
        writer.writeheader()
        writer.writerows(rows)
    return out


def main(argv: list[str] | None = None) -> Path:
    from atr_llm.cli_types import Text, WriteFile
    from atr_llm.command_line import Parser, refuse

    ap = Parser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=Text(), action="append", required=True, metavar="D=DIR", help="D<depth>=<runs folder>")
    ap.add_argument("--out", type=WriteFile(), default=str(OUT), help="the CSV to write")
    args = ap.parse_args(argv)
    runs_dirs = {}
    for item in args.runs:
        depth, _, folder = item.partition("=")
        if not (depth.startswith("D") and depth[1:].isdigit() and folder):
            raise refuse("--runs", item, "D<depth>=<runs folder>, e.g. D32=runs/mask_mechanism")
        if not Path(folder).is_dir():
            raise refuse("--runs", item, f"{folder} is not a folder")
        runs_dirs[int(depth[1:])] = Path(folder)
    out = write(by_step(runs_dirs), Path(args.out))
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
