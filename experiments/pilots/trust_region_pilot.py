"""The trust-region study's pilot: at which off-policy setting does PPO-clip act on 5-20% of tokens while GRPO
still raises the reward? (the regime the pre-registered study runs in; docs/experiments/trust-region.md)

The CPU table's runs sit where the rules barely act (PPO-clip removed the gradient of 0.002-0.96% of tokens per
run). Three knobs move a run off-policy, alone or together: ``num_iterations`` (updates per generated batch),
``steps_per_generation`` (a generated batch split over that many optimizer steps, so its later parts are used by a
policy several updates newer), and the lag of asynchronous RL (rollouts from a policy some updates old), which TRL
1.16 cannot express and this pilot does not try. Each arm trains ``clip`` (epsilon 0.2) from one SFT model (seed
0 of the CPU table's protocol: 600 SFT steps) with ``atr_llm/configs/cpu-table.yaml`` and the arm's knobs, logging
every step; the pilot writes, per arm, the mean fraction of completion tokens whose gradient the rule removed
(``clip/frac_masked``), its 10th-90th percentiles over steps, the reward in the first and the last fifth of the
run, the least-squares reward trend (per 100 steps, with its standard error) and seconds per optimizer step.

    python -m experiments.pilots.trust_region_pilot [--steps 200] [--arms iter2 iter4 ...] [--workers 2]

writes ``figures/experiments/pilots/trust_region_pilot.{json,md}``; the runs go to ``runs/trust_region_pilot``.
A pilot, reported as such: one seed, one rule, short runs; it chooses the setting, it tests nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

ARMS: dict[str, dict[str, int]] = {
    "iter2": {"num_iterations": 2, "steps_per_generation": 1},  # the CPU table's setting
    "iter4": {"num_iterations": 4, "steps_per_generation": 1},
    "iter8": {"num_iterations": 8, "steps_per_generation": 1},
    "spg4": {"num_iterations": 1, "steps_per_generation": 4},
    "spg4-iter2": {"num_iterations": 2, "steps_per_generation": 4},
    "spg8-iter2": {"num_iterations": 2, "steps_per_generation": 8},
}
"""Arm -> knobs (TRL's ``num_iterations`` and ``steps_per_generation``; ``gradient_accumulation_steps`` stays 1)."""

OUT = Path("figures/experiments/pilots/trust_region_pilot")
BAND = (5.0, 20.0)  # percent of tokens acted on: the regime the study asks for


def trend(steps: list[float], values: list[float]) -> tuple[float, float]:
    """Least-squares slope of ``values`` on ``steps`` and its standard error (scipy.stats.linregress)."""
    from scipy.stats import linregress

    fit = linregress(steps, values)
    return float(fit.slope), float(fit.stderr)


def run_arm(job: dict) -> dict:
    """Train one arm with ``python -m atr_llm.train``'s entry point (resumed from its last checkpoint if killed)
    and summarise its log."""
    from atr_llm import train
    from atr_llm.evaluate import _checkpoints

    out = Path(job["runs"]) / job["arm"]
    knobs = ARMS[job["arm"]]
    argv = [
        "--config", "atr_llm/configs/cpu-table.yaml",
        "--model_name_or_path", job["sft_dir"],
        "--seed", "0",
        "--method", "clip",
        "--max_steps", str(job["steps"]),
        "--logging_steps", "1",
        "--save_steps", str(max(1, job["steps"] // 4)),
        "--num_iterations", str(knobs["num_iterations"]),
        "--steps_per_generation", str(knobs["steps_per_generation"]),
        "--output_dir", str(out),
    ]  # fmt: skip
    if not (out / "log_history.json").exists():
        ckpts = _checkpoints(out, 1) if out.exists() else []
        if ckpts:
            argv += ["--resume_from_checkpoint", str(ckpts[-1][1])]
        start = time.perf_counter()
        train.main(argv)
        (out / "wall_seconds.txt").write_text(f"{time.perf_counter() - start:.1f}\n")
    history = json.loads((out / "log_history.json").read_text())
    return summarise(job["arm"], history, float((out / "wall_seconds.txt").read_text()), job["steps"])


def summarise(arm: str, history: list[dict], seconds: float, steps: int) -> dict:
    """The arm's row: tokens acted on (% per optimizer step, every step), reward at the start and the end of the
    run (logged at the steps that generate), its trend, entropy, seconds per step."""
    steps_logged = [h for h in history if "clip/frac_masked" in h and "step" in h]
    generated = [h for h in history if "reward" in h and "step" in h]
    acted = [100 * h["clip/frac_masked"] for h in steps_logged]
    rewards = [h["reward"] for h in generated]
    fifth = max(1, len(generated) // 5)
    slope, stderr = trend([h["step"] for h in generated], rewards) if len(generated) > 2 else (float("nan"),) * 2
    history = generated
    deciles = statistics.quantiles(acted, n=10, method="inclusive") if len(acted) > 1 else [acted[0]] * 9
    return {
        "arm": arm,
        **ARMS[arm],
        "steps": steps,
        "acted_pct_mean": statistics.fmean(acted),
        "acted_pct_p10": deciles[0],
        "acted_pct_p90": deciles[-1],
        "reward_first_fifth": statistics.fmean(rewards[:fifth]),
        "reward_last_fifth": statistics.fmean(rewards[-fifth:]),
        "reward_trend_per_100_steps": 100 * slope,
        "reward_trend_stderr": 100 * stderr,
        "entropy_first_fifth": statistics.fmean(h.get("entropy", float("nan")) for h in history[:fifth]),
        "entropy_last_fifth": statistics.fmean(h.get("entropy", float("nan")) for h in history[-fifth:]),
        "seconds_per_step": seconds / steps,
        "in_band": bool(BAND[0] <= statistics.fmean(acted) <= BAND[1]),
        "reward_rises": bool(slope - 2 * stderr > 0),
    }


def write(rows: list[dict], out: Path, command: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"command": command, "band_pct": BAND, "arms": rows}, indent=1))
    lines = [
        "# Trust-region study pilot: PPO-clip (eps 0.2), seed 0, one SFT model",
        "",
        f"`{command}`",
        "",
        "| arm | num_iterations | steps_per_generation | tokens acted on, % (mean; p10-p90 over steps) | reward first / last fifth | reward trend per 100 steps | entropy first / last fifth | s / step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['arm']} | {r['num_iterations']} | {r['steps_per_generation']} | {r['acted_pct_mean']:.2f} "
            f"({r['acted_pct_p10']:.2f}-{r['acted_pct_p90']:.2f}) | {r['reward_first_fifth']:.3f} / "
            f"{r['reward_last_fifth']:.3f} | {r['reward_trend_per_100_steps']:+.3f} +- {r['reward_trend_stderr']:.3f} | "
            f"{r['entropy_first_fifth']:.3f} / {r['entropy_last_fifth']:.3f} | {r['seconds_per_step']:.2f} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> list[dict]:
    import multiprocessing as mp
    import sys
    from concurrent.futures import ProcessPoolExecutor

    from atr_llm.cli import Parser, positive_int, refuse
    from experiments.cpu_table.driver import train_sft, worker_init

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200, help="optimizer steps per arm")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--runs", default="runs/trust_region_pilot")
    ap.add_argument("--out", default=str(OUT), help="where the .json and .md go (without suffix)")
    args = ap.parse_args(argv)
    positive_int("--steps", args.steps)
    positive_int("--workers", args.workers)
    if Path(args.runs).exists() and not Path(args.runs).is_dir():
        raise refuse("--runs", args.runs, "not a directory")
    command = "python -m experiments.pilots.trust_region_pilot " + " ".join(sys.argv[1:] if argv is None else argv)
    sft_dir = train_sft(0, 600, Path(args.runs))
    jobs = [{"arm": a, "runs": args.runs, "sft_dir": str(sft_dir), "steps": args.steps} for a in args.arms]
    with ProcessPoolExecutor(args.workers, mp_context=mp.get_context("spawn"), initializer=worker_init) as pool:
        rows = list(pool.map(run_arm, jobs))
    write(rows, Path(args.out), command.strip())
    print(Path(args.out).with_suffix(".md").read_text())
    return rows


if __name__ == "__main__":
    from atr_llm.cli import run_command

    run_command(main)
