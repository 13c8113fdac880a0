"""The CPU table's pilot check: does GRPO lower the reward in the CPU table's setting because of the setting, or because of
our trainer? Three arms from one SFT model, one seed, one batch schedule, side by side:

* ``ours``: ``ATRGRPOTrainer`` with ``--method clip`` (PPO-clip, eps 0.2, the same rule stock TRL applies);
* ``stock``: ``trl.GRPOTrainer`` itself, given the same ``GRPOConfig`` fields (its own loss; the ATR-only fields of
  the config are not read by it);
* ``lr0``: ours with learning rate 0 (the reward the SFT policy gets when nothing moves: the noise floor).

Each arm is ``python -m atr_llm.train --config atr_llm/configs/cpu-table.yaml`` with the arguments below; the training
reward of every logging step is written to ``--out`` with first- and last-quarter means and a least-squares trend
(per 100 steps, with its standard error).

    python -m experiments.pilots.grpo_stock_pilot --model runs/pilot15/sft-steps600 [--steps 100] [--out figures/experiments/pilots/grpo_stock_pilot.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def trend(steps: list[float], values: list[float]) -> tuple[float, float]:
    """Least-squares slope of ``values`` on ``steps`` and its standard error (scipy.stats.linregress)."""
    from scipy.stats import linregress

    fit = linregress(steps, values)
    return fit.slope, fit.stderr


def run_arm(arm: str, args) -> dict:
    import trl

    import atr_llm.trainer as trainer_module
    from atr_llm import train

    out = Path(args.runs) / arm
    argv = [
        "--config", "atr_llm/configs/cpu-table.yaml",
        "--model_name_or_path", args.model,
        "--dataset_name", args.dataset,
        "--max_completion_length", str(args.max_completion_length),
        "--per_device_train_batch_size", str(args.batch),
        "--max_steps", str(args.steps),
        "--logging_steps", "5",
        "--save_strategy", "no",
        "--seed", str(args.seed),
        "--method", "clip",
        "--output_dir", str(out),
        "--learning_rate", "0" if arm == "lr0" else str(args.lr),
    ]  # fmt: skip
    ours = trainer_module.ATRGRPOTrainer
    if arm == "stock":  # train.main imports ATRGRPOTrainer from atr_llm.trainer when it runs
        trainer_module.ATRGRPOTrainer = trl.GRPOTrainer
    try:
        train.main(argv)
    finally:
        trainer_module.ATRGRPOTrainer = ours
    history = json.loads((out / "log_history.json").read_text())
    rows = [(h["step"], h["reward"]) for h in history if "reward" in h]
    steps, rewards = [s for s, _ in rows], [r for _, r in rows]
    q = max(1, len(rewards) // 4)
    slope, se = trend(steps, rewards)
    return {
        "steps": steps,
        "reward": rewards,
        "first_quarter_mean": statistics.fmean(rewards[:q]),
        "last_quarter_mean": statistics.fmean(rewards[-q:]),
        "trend_per_100_steps": 100 * slope,
        "trend_se_per_100_steps": 100 * se,
    }


def main(argv: list[str] | None = None):
    from atr_llm.cli_types import SEED, Integer, ReadDir, Real, Text, WriteDir, WriteFile
    from atr_llm.command_line import Parser

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model",
        type=ReadDir(holding="config.json", what="a saved model folder"),
        required=True,
        help="the SFT model (a directory written by atr_llm.train / run_sft)",
    )
    ap.add_argument("--dataset", type=Text(), default="arithmetic-3step-steps")
    ap.add_argument("--max-completion-length", type=Integer(1), default=32)
    ap.add_argument("--batch", type=Integer(1), default=128)
    ap.add_argument("--steps", type=Integer(1), default=100)
    ap.add_argument("--lr", type=Real(0), default=1e-4)
    ap.add_argument("--seed", type=SEED, default=0)
    ap.add_argument("--arms", nargs="+", choices=["ours", "stock", "lr0"], default=["ours", "stock", "lr0"])
    ap.add_argument("--runs", type=WriteDir(), default="runs/grpo_stock_pilot")
    ap.add_argument("--out", type=WriteFile(), default="figures/experiments/pilots/grpo_stock_pilot.json")
    args = ap.parse_args(argv)
    result = {"settings": {k: v for k, v in vars(args).items() if k not in ("out", "runs")}, "arms": {}}
    for arm in args.arms:
        result["arms"][arm] = run_arm(arm, args)
        a = result["arms"][arm]
        print(
            f"{arm:6s} reward {a['first_quarter_mean']:.3f} -> {a['last_quarter_mean']:.3f}, trend "
            f"{a['trend_per_100_steps']:+.3f} +- {a['trend_se_per_100_steps']:.3f} per 100 steps",
            flush=True,
        )
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
