"""Pack a ``python -m experiments.cpu_table`` runs directory small enough to move between machines, keeping all that
the driver needs to resume and to write its table (for a GPU machine whose calls are time-limited).

    python -m tools.pack_runs runs/gpu_table OUT/runs.tar.gz [--part-mib 15]   # on the machine that ran it
    cat OUT/runs.tar.gz.part* | tar -xz                                              # where it continues

Kept: every ``result.json`` (a finished run: evaluations and curves, all the table reads), the SFT models whole
(every run of a seed starts from them), and of an unfinished run its logs, every checkpoint's weights (each is
evaluated when the run ends) and the latest checkpoint whole (optimizer, scheduler, RNG state: training resumes
from it). Dropped: the checkpoints and sample files of finished runs, earlier checkpoints' optimizer states.
The archive is split into parts of ``--part-mib`` MiB (the transfer limit per file).
"""

from __future__ import annotations

import argparse
import io
import re
import tarfile
from pathlib import Path

CHECKPOINT = re.compile(r"checkpoint-(\d+)$")
RESUME_ONLY = {"optimizer.pt", "scheduler.pt", "rng_state.pth"}


def files_to_keep(runs_dir: Path) -> list[Path]:
    """The files of ``runs_dir`` that ``experiments.cpu_table`` needs to resume and to write its outputs."""
    keep: list[Path] = []
    for run in sorted(p for p in runs_dir.iterdir() if p.is_dir()):
        if run.name.startswith("sft-"):
            keep += [f for f in run.rglob("*") if f.is_file()]
        elif (run / "result.json").exists():
            keep.append(run / "result.json")
        else:
            ckpts = sorted((int(m.group(1)), p) for p in run.iterdir() if (m := CHECKPOINT.search(p.name)))
            latest = ckpts[-1][1] if ckpts else None
            for f in run.rglob("*"):
                if not f.is_file() or "eval" in f.relative_to(run).parts:
                    continue
                inside = next((p for _, p in ckpts if p in f.parents), None)
                if inside is not None and inside != latest and f.name in RESUME_ONLY:
                    continue
                keep.append(f)
    keep += [f for f in runs_dir.glob("*.log") if f.is_file()]
    return keep


def pack(runs_dir: Path, out: Path, part_mib: float) -> list[Path]:
    """Write the kept files as a gzip tar (paths as given, relative to the working directory), split into parts."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for f in files_to_keep(runs_dir):
            tar.add(f)
    data, size = buf.getvalue(), int(part_mib * 2**20)
    parts = []
    for i in range(0, max(len(data), 1), size):
        part = out.with_name(f"{out.name}.part{i // size:02d}")
        part.write_bytes(data[i : i + size])
        parts.append(part)
    return parts


def main(argv=None) -> None:
    from atr_llm.cli_types import ReadDir, Real, WriteFile
    from atr_llm.command_line import Parser

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs_dir", type=ReadDir(as_path=True), help="the runs folder to pack (e.g. runs/trust_region)")
    ap.add_argument(
        "out", type=WriteFile(as_path=True), help="the archive's name; parts are written as OUT.part00, OUT.part01, ..."
    )
    # at least one byte per part: 2^-20 MiB
    ap.add_argument("--part-mib", type=Real(2**-20, 2**20), default=15.0, help="the largest part, in MiB (> 0)")
    args = ap.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for p in pack(args.runs_dir, args.out, args.part_mib):
        print(p, p.stat().st_size)


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
