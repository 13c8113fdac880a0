"""Held-out Mean@8 / Pass@8 of the CPU table's pilot models on the step-by-step task (``arithmetic-3step-steps``, test
split, the 200 problems of ``atr_llm.cpu_table``'s seed; through ``cpu_table.evaluate_model``), 8 samples at T = 0.3 (the paper's evaluation sampling) and
at T = 1 (the training temperature), top-p 0.95, 32 new tokens.

    python -m experiments.pilots.grpo_pilot_eval NAME=MODEL_DIR ... --tokenizer SFT_DIR [--out figures/experiments/pilots/grpo_pilot_eval.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TASK = "arithmetic-3step-steps"


def main(argv: list[str] | None = None):
    from atr_llm.cli_types import Integer, ReadDir, Text, WriteFile
    from atr_llm.command_line import Parser

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", type=Text(), nargs="+", help="NAME=MODEL_DIR")
    ap.add_argument("--tokenizer", type=ReadDir(), required=True)
    ap.add_argument("--problems", type=Integer(1), default=200)
    ap.add_argument("--out", type=WriteFile(), default="figures/experiments/pilots/grpo_pilot_eval.json")
    args = ap.parse_args(argv)
    from experiments.cpu_table import evaluate_model

    result = {}
    for item in args.models:
        name, model_dir = item.split("=", 1)
        for temperature in (0.3, 1.0):
            result[f"{name} T={temperature}"] = evaluate_model(
                Path(model_dir), Path(args.tokenizer), args.problems, 8,
                Path("runs/grpo_pilot_eval") / f"{name}-T{temperature}",
                task=TASK, max_tokens=32, sampling={"temperature": temperature, "top_p": 0.95},
            )  # fmt: skip
            print(name, temperature, result[f"{name} T={temperature}"], flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
