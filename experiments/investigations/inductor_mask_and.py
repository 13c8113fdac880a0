"""Inductor's CPU code for ``&`` / ``|`` of two comparison masks, against the same logic written with ``torch.where``.

The reason ``atr_theory.methods._ratio.mask_and`` / ``_or`` / ``mask_and_not`` use ``torch.where`` while compiling (2026-11-26):
on this CPU with torch 2.13, the C++ kernel of ``where((x >= a) & (x <= b), y, 0)`` on float64 converts both
16-lane double masks to int32 one lane at a time (seen in ``perf annotate`` of the generated kernel: ``vpextrd``
/ ``vmovq`` per lane), ~10x slower than ``where(where(x >= a, x <= b, False), y, 0)``; float32 is fast either way.
Each form is compiled alone (``fullgraph=True``) and timed on a (rows, cols) tensor, median of repeats after a
warm-up; every compiled form is checked equal to its eager value first. Re-run it after a torch upgrade: where the
two forms cost the same, the helpers can go back to the operators.

    python -m experiments.investigations.inductor_mask_and [--quick] [--device cuda] [--out figures/experiments/investigations/inductor_mask_and.json]

On a GPU the same forms go through Triton: it checks that the ``where`` forms the helpers use while compiling cost
no more there than the operators.
"""

from __future__ import annotations

import argparse
import inspect
import json
from pathlib import Path

import torch

from benchmarks._timing import timeit

LO, HI = -0.39, 0.35

FORMS = {
    "and": lambda x, y: torch.where((x >= LO) & (x <= HI), y, 0.0),
    "where_and": lambda x, y: torch.where(torch.where(x >= LO, x <= HI, False), y, 0.0),
    "or": lambda x, y: torch.where((x < LO) | (y > HI), y, 0.0),
    "where_or": lambda x, y: torch.where(torch.where(x < LO, True, y > HI), y, 0.0),
    "and_not": lambda x, y: torch.where((y > 0) & ~(x >= LO), y, 0.0),
    "where_and_not": lambda x, y: torch.where(torch.where(x >= LO, False, y > 0), y, 0.0),
    "one_comparison": lambda x, y: torch.where(x <= HI, y, 0.0),
}


def measure(dtype: torch.dtype, rows: int, cols: int, repeats: int, device: str = "cpu") -> dict:
    """M elements/s of every form compiled, and of the eager ``and`` / ``where_and`` for reference."""
    g = torch.Generator().manual_seed(0)
    x = (0.3 * torch.randn(rows, cols, generator=g, dtype=torch.float64)).to(device, dtype)
    y = torch.randn(rows, cols, generator=g, dtype=torch.float64).to(device, dtype)
    out = {}
    for name, fn in FORMS.items():
        torch._dynamo.reset()
        compiled = torch.compile(fn, fullgraph=True, dynamic=False)
        if not torch.equal(compiled(x, y), fn(x, y)):
            raise AssertionError(f"compiled {name} differs from eager on {dtype}")
        out[name] = rows * cols / timeit(compiled, x, y, repeats=repeats, device=device) / 1e6
    for name in ("and", "where_and"):
        out[f"eager_{name}"] = rows * cols / timeit(FORMS[name], x, y, repeats=repeats, device=device) / 1e6
    return out


def main(argv: list[str] | None = None) -> None:
    from atr_llm.cli_types import Device, Integer, WriteFile
    from atr_llm.command_line import Parser

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", type=Device(), default="cpu")
    ap.add_argument("--out", type=WriteFile(), default="figures/experiments/investigations/inductor_mask_and.json")
    ap.add_argument("--rows", type=Integer(1), default=None, help="rows of 1,000 (default 1,024 CPU, 16,384 GPU)")
    ap.add_argument("--repeats", type=Integer(1), default=None, help="timed calls per form (default 25)")
    args = ap.parse_args(argv)
    cuda = torch.device(args.device).type == "cuda"
    rows, cols, repeats = (64, 1000, 3) if args.quick else ((16384 if cuda else 1024), 1000, 25)
    rows, repeats = args.rows or rows, args.repeats or repeats
    result = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "shape": [rows, cols],
        "unit": "M elements/s, compiled (fullgraph) unless named eager_",
        "forms": {name: inspect.getsource(fn).strip().rstrip(",") for name, fn in FORMS.items()},
    }
    for dtype in (torch.float64, torch.float32):
        rates = measure(dtype, rows, cols, repeats, args.device)
        result[str(dtype).removeprefix("torch.")] = rates
        print(str(dtype), "  ".join(f"{k} {v:,.0f}" for k, v in rates.items()), flush=True)
    f64 = result["float64"]
    result["float64_where_over_operator"] = {
        "and": f64["where_and"] / f64["and"],
        "or": f64["where_or"] / f64["or"],
        "and_not": f64["where_and_not"] / f64["and_not"],
    }
    print("float64 compiled, where / operator:", result["float64_where_over_operator"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
