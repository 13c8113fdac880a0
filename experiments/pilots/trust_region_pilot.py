"""The trust-region study's pilot: at which setting does PPO-clip act on 5-20% of tokens while GRPO still raises the
reward? (the regime the pre-registered study runs in; docs/experiments/trust-region.md)

The CPU table's runs sit where the rules barely act (PPO-clip removed the gradient of 0.002-0.96% of tokens per
run). Three knobs move a run off-policy, alone or together: ``num_iterations`` (updates per generated batch),
``steps_per_generation`` (a generated batch split over that many optimizer steps, so its later parts are used by a
policy several updates newer: the staleness of asynchronous RL's rollouts, which TRL 1.16 has no other way to
express), and the size of each update (the learning rate). A fourth lever came from the pilot itself: the start's
entropy (fewer SFT steps). Each arm trains ``clip`` (epsilon 0.2) from one SFT model of seed 0 (the CPU table's
protocol: 600 SFT steps, unless the arm says otherwise) with ``atr_llm/configs/cpu-table.yaml`` and the arm's knobs,
logging every step; the pilot writes, per arm, the mean fraction of completion tokens whose gradient the rule removed
(``clip/frac_masked``), its 10th-90th percentiles over steps, the reward in the first and the last fifth of the
run, the least-squares reward trend (per 100 steps, with its standard error), entropy and seconds per step.

    python -m experiments.pilots.trust_region_pilot [--steps 200] [--arms iter2 iter4 ...] [--workers 2]

writes ``figures/experiments/pilots/trust_region_pilot.{json,md}``; the runs go to ``runs/trust_region_pilot``
(an arm already trained there is read, not trained again). A pilot, reported as such: one seed, one rule, short
runs; it chooses the setting, it tests nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from experiments.pilots.grpo_stock_pilot import trend  # least-squares slope and its standard error

ARMS: dict[str, dict[str, int]] = {
    "iter2": {"num_iterations": 2, "steps_per_generation": 1},  # the CPU table's setting
    "iter4": {"num_iterations": 4, "steps_per_generation": 1},
    "iter8": {"num_iterations": 8, "steps_per_generation": 1},
    "spg4": {"num_iterations": 1, "steps_per_generation": 4},
    "spg4-iter2": {"num_iterations": 2, "steps_per_generation": 4},
    "spg8-iter2": {"num_iterations": 2, "steps_per_generation": 8},
    "spg16": {"num_iterations": 1, "steps_per_generation": 16},
    "spg16-iter2": {"num_iterations": 2, "steps_per_generation": 16},
    "spg16-iter4": {"num_iterations": 4, "steps_per_generation": 16},
    "spg32": {"num_iterations": 1, "steps_per_generation": 32},
    "spg32-iter2": {"num_iterations": 2, "steps_per_generation": 32},
    # the knobs alone leave clip under 1% at cpu-table.yaml's learning rate (1e-4): the update size is the other lever
    "lr3e-4-spg16-iter2": {"num_iterations": 2, "steps_per_generation": 16, "learning_rate": 3e-4},
    "lr3e-4-spg32-iter2": {"num_iterations": 2, "steps_per_generation": 32, "learning_rate": 3e-4},
    "lr1e-3-spg4-iter2": {"num_iterations": 2, "steps_per_generation": 4, "learning_rate": 1e-3},
    "lr1e-3-spg16-iter2": {"num_iterations": 2, "steps_per_generation": 16, "learning_rate": 1e-3},
    # at 600 SFT steps the policy is nearly deterministic (entropy ~0.18 nats a token): few tokens can move at all;
    # a less trained start leaves more of them in play
    "sft150-spg16-iter2": {"num_iterations": 2, "steps_per_generation": 16, "sft_steps": 150},
    "sft150-lr3e-4-spg16-iter2": {
        "num_iterations": 2,
        "steps_per_generation": 16,
        "learning_rate": 3e-4,
        "sft_steps": 150,
    },
    "sft150-lr3e-4-iter8": {"num_iterations": 8, "steps_per_generation": 1, "learning_rate": 3e-4, "sft_steps": 150},
    "sft60-lr3e-4-spg16-iter2": {
        "num_iterations": 2,
        "steps_per_generation": 16,
        "learning_rate": 3e-4,
        "sft_steps": 60,
    },
}
"""Arm -> knobs (TRL's ``num_iterations`` and ``steps_per_generation``; ``gradient_accumulation_steps`` stays 1;
``learning_rate`` when not cpu-table.yaml's 1e-4; ``sft_steps`` when the start is not the CPU table's 600-step SFT
model)."""

OUT = Path("figures/experiments/pilots/trust_region_pilot")
BAND = (5.0, 20.0)  # percent of tokens acted on: the regime the study asks for


def run_arm(job: dict) -> dict:
    """Train one arm with ``python -m atr_llm.train``'s entry point (resumed from its last checkpoint if killed)
    and summarise its log."""
    from atr_llm import train
    from atr_llm.evaluate import checkpoints_every

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
    if "learning_rate" in knobs:
        argv += ["--learning_rate", repr(knobs["learning_rate"])]
    if not (out / "log_history.json").exists():
        ckpts = checkpoints_every(out, 1) if out.exists() else []
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
        "learning_rate": 1e-4,
        "sft_steps": 600,
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
        "| arm | SFT steps | learning rate | num_iterations | steps_per_generation | tokens acted on, % (mean; p10-p90 over steps) | reward first / last fifth | reward trend per 100 steps | entropy first / last fifth | s / step |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['arm']} | {r['sft_steps']} | {r['learning_rate']:g} | {r['num_iterations']} | {r['steps_per_generation']} | {r['acted_pct_mean']:.2f} "
            f"({r['acted_pct_p10']:.2f}-{r['acted_pct_p90']:.2f}) | {r['reward_first_fifth']:.3f} / "
            f"{r['reward_last_fifth']:.3f} | {r['reward_trend_per_100_steps']:+.3f} +- {r['reward_trend_stderr']:.3f} | "
            f"{r['entropy_first_fifth']:.3f} / {r['entropy_last_fifth']:.3f} | {r['seconds_per_step']:.2f} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> list[dict]:
    import multiprocessing as mp
    import sys
    from concurrent.futures import ProcessPoolExecutor

    from atr_llm.cli_types import Integer, WriteDir, WriteFile
    from atr_llm.command_line import Parser
    from experiments.cpu_table.driver import train_sft, worker_init

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=Integer(1), default=200, help="optimizer steps per arm")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--workers", type=Integer(1, 256), default=2)
    ap.add_argument("--runs", type=WriteDir(), default="runs/trust_region_pilot")
    ap.add_argument("--out", type=WriteFile(), default=str(OUT), help="where the .json and .md go (without suffix)")
    args = ap.parse_args(argv)
    command = "python -m experiments.pilots.trust_region_pilot " + " ".join(sys.argv[1:] if argv is None else argv)
    sft_dirs = {}
    for steps in sorted({ARMS[a].get("sft_steps", 600) for a in args.arms}):
        where = Path(args.runs) if steps == 600 else Path(args.runs) / f"sft{steps}"
        sft_dirs[steps] = str(train_sft(0, steps, where))
    jobs = [
        {"arm": a, "runs": args.runs, "sft_dir": sft_dirs[ARMS[a].get("sft_steps", 600)], "steps": args.steps}
        for a in args.arms
    ]
    with ProcessPoolExecutor(args.workers, mp_context=mp.get_context("spawn"), initializer=worker_init) as pool:
        rows = list(pool.map(run_arm, jobs))
    write(rows, Path(args.out), command.strip())
    print(Path(args.out).with_suffix(".md").read_text())
    return rows


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
