"""How much headroom a shorter formatting SFT leaves GRPO: the SFT model of each seed and SFT length (the CPU table's
``train_sft``: tiny Qwen3, lr 3e-3 decaying linearly to 0, batch 32) scored by the table's own evaluation
(``evaluate_every_benchmark``: the 200 held-out problems, 8 samples at T = 0.3 and at T = 1). Only SFT models: no GRPO
run is looked at, so the learning regime's start is chosen without any rule's result.

    python -m experiments.pilots.sft_headroom --seeds 300 301 --sft-steps 50 100 200 300 400 500 \\
        --runs-dir runs/pilots/sft_headroom --out figures/experiments/pilots/sft_headroom.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> list[dict]:
    from atr_llm.cli_types import SEED, Integer, WriteDir, WriteFile
    from atr_llm.command_line import Parser
    from atr_llm.files import atomic_write_text

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=SEED, nargs="+", default=[300, 301])
    ap.add_argument("--sft-steps", type=Integer(1), nargs="+", default=[50, 100, 200, 300, 400, 500])
    ap.add_argument("--runs-dir", type=WriteDir(), default="runs/pilots/sft_headroom")
    ap.add_argument("--out", type=WriteFile(), default="figures/experiments/pilots/sft_headroom.json")
    args = ap.parse_args(argv)
    from experiments.cpu_table import evaluate_every_benchmark, train_sft, weights_id

    rows = []
    for seed in args.seeds:
        for steps in args.sft_steps:
            start = time.perf_counter()
            model = train_sft(seed, steps, Path(args.runs_dir) / f"sft{steps}")
            scores = evaluate_every_benchmark(model, model, {"test_problems": 200, "samples": 8}, model / "eval")
            rows.append(
                {
                    "seed": seed,
                    "sft_steps": steps,
                    "weights_id": weights_id(model),
                    "seconds": round(time.perf_counter() - start, 1),
                    **{f"{b}/{k}": v[k] for b, v in scores.items() for k in ("mean@8", "pass@8")},
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(args.out), json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
