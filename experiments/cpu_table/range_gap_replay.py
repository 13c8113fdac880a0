"""Replay one cpu-table GRPO run and list the tokens on which its ratio range and another constant range disagree.

Two ratio-range rules in PPO's min form (``min(w A, clip(w, l, u) A)``) give the same gradient on a batch unless some
token has ``A > 0`` and ``w`` between the two upper bounds, or ``A < 0`` and ``w`` between the two lower bounds (their
loss values also differ on tokens clipped by both -- clamped to different constants -- but those carry no gradient in
either, and the optimizer sees only gradients). Training here is deterministic on one machine kind, so two such runs from the same SFT model stay equal bit
for bit until the first such token (README, "Two declarations of one rule"). This script re-trains the first
``--steps`` steps of ``--run`` exactly as ``python -m experiments.cpu_table`` did (same config, arguments, seed and SFT
model, one thread as its workers), with an observer on the rule's registry entry (``rule_observed``) that records,
per loss call, every valid token in those slivers; it then checks that the replay's logged windows equal the
original run's ``log_history.json`` (every value but the wall-clock ones), so the tokens found are the run's own.

    python -m experiments.cpu_table.range_gap_replay --run clip-higher-0.329-0.422 --seeds 7 4 0 --steps 12 130 130 \
        --runs-dir runs/cpu_table_forms [--other kl3:0.07] [--out figures/experiments/cpu_table/readouts/range_gap_replay.json]

``--other`` is ``kl3:DELTA`` (ATR's range, ``atr_theory.ranges.kl3_clip_range``) or ``LOWER,UPPER``.
Prints and writes JSON: a list, per seed ``{"run", "seed", "steps", "calls", "other_range", "gap_tokens": [{"call",
"side", "w", "A"}], "first_call", "windows_compared", "windows_equal"}``.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from pathlib import Path

import torch

WALL_CLOCK = {"step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second"}


def other_range(spec: str) -> tuple[float, float]:
    """``kl3:0.07`` -> ATR's range at delta 0.07; ``0.671,1.422`` -> that range."""
    from atr_llm.command_line import refuse
    from atr_theory import ranges

    expected = "expected kl3:DELTA (a number > 0) or LOWER,UPPER (two numbers, 0 < LOWER < 1 < UPPER)"
    try:
        numbers = [float(x) for x in (spec[4:] if spec.startswith("kl3:") else spec).split(",")]
    except ValueError:
        raise refuse("--other", spec, expected) from None
    if spec.startswith("kl3:"):
        if len(numbers) != 1 or not 0 < numbers[0] < float("inf"):
            raise refuse("--other", spec, expected)
        return ranges.kl3_clip_range(numbers[0])
    if len(numbers) != 2 or not 0 < numbers[0] < 1 < numbers[1] < float("inf"):
        raise refuse("--other", spec, expected)
    return numbers[0], numbers[1]


def gap_tokens(batch, lower: float, upper: float, other: tuple[float, float]) -> list[dict]:
    """Valid tokens where ``[lower, upper]`` and ``other`` give PPO's min form different gradients: ``A > 0`` with
    ``w`` between the upper bounds, or ``A < 0`` with ``w`` between the lower bounds (each in the batch's dtype)."""
    with torch.no_grad():
        w, adv, valid = torch.exp(batch.log_ratio), batch.advantages, batch.mask.bool()
        as_t = lambda x: torch.tensor(x, dtype=w.dtype)  # noqa: E731
        hi_a, hi_b = sorted((as_t(upper), as_t(other[1])))
        lo_a, lo_b = sorted((as_t(lower), as_t(other[0])))
        high = valid & (adv > 0) & (w > hi_a) & (w <= hi_b)
        low = valid & (adv < 0) & (w >= lo_a) & (w < lo_b)
        found = []
        for side, where in (("high", high), ("low", low)):
            for wi, ai in zip(w[where].tolist(), adv[where].tolist()):
                found.append({"side": side, "w": wi, "A": ai})
        return found


def constant_range_in_min_form(choice) -> tuple[float, float] | None:
    """The one constant ratio range ``(lower, upper)`` a resolved method applies in PPO's min form: its registered
    ``ratio_range`` at its parameters (``tests/test_registry.py`` checks each declaration against PPO's min written
    out). Then two such rules differ exactly on ``gap_tokens``. None in the mask form and for a rule that declares no
    range (a dual-clip floor, per-token bounds, a soft gate, sequence ratios): there other tokens differ too."""
    if choice.form != "min" or choice.spec.ratio_range is None:
        return None
    lower, upper = choice.spec.ratio_range(**choice.params)
    return float(lower), float(upper)


def check_replayable(run: str) -> tuple[float, float]:
    """``run`` must be a cpu-table run whose rule is one constant ratio range in PPO's min form
    (``constant_range_in_min_form``), whose range it returns: in the mask form, with per-token bounds, a dual-clip
    floor or a soft gate other tokens differ too, and ``gap_tokens`` would miss them."""
    from atr_theory import methods
    from experiments import cpu_table

    if run not in cpu_table.CPU_RUNS:
        raise ValueError(f"--run: {run!r} is not a run of experiments.cpu_table.CPU_RUNS")
    spec = dict(cpu_table.CPU_RUNS[run])
    choice = methods.resolve(spec.pop("method"), spec.pop("form", None), **spec)
    found = constant_range_in_min_form(choice)
    if found is None:
        raise ValueError(
            f"--run {run}: {choice.name} in the {choice.form} form is not one constant ratio range in the min form"
            " (the sliver test holds only there)"
        )
    return found


@contextlib.contextmanager
def rule_observed(name: str, observe):
    """Within the block, the registry entry of rule ``name`` (and its aliases) calls ``observe(batch)`` before the
    rule itself on every loss call; the entry is restored after. The registry is where every caller looks a rule up
    (``atr_theory.resolve``), so nothing else is replaced."""
    import dataclasses

    from atr_theory import methods

    spec = methods.get_method(name)

    def observed(batch, **params):
        observe(batch)
        return spec.fn(batch, **params)

    keys = (spec.name, *spec.aliases)
    for key in keys:
        methods.METHODS[key] = dataclasses.replace(spec, fn=observed)
    try:
        yield
    finally:
        for key in keys:
            methods.METHODS[key] = spec


def replay(run: str, seed: int, steps: int, runs_dir: Path, other: tuple[float, float]) -> dict:
    from atr_llm import train
    from experiments import cpu_table

    lower, upper = check_replayable(run)

    cpu_table.worker_init()  # one thread, as the driver's workers: the same floating-point reductions
    found: list[dict] = []
    calls = [0]

    def observe(batch):
        calls[0] += 1
        found.extend({"call": calls[0], **t} for t in gap_tokens(batch, lower, upper, other))

    run_dir = cpu_table.run_directory(runs_dir, run, seed)
    job = {"run": run, "seed": seed, "sft_dir": cpu_table.run_directory(runs_dir, "sft", seed)}
    job["learning_rate"] = json.loads((run_dir / "result.json").read_text()).get("learning_rate")  # the run's own
    with tempfile.TemporaryDirectory() as tmp:
        argv = cpu_table.train_argv(job, tmp, steps, 10**6)
        with rule_observed(cpu_table.CPU_RUNS[run]["method"], observe):
            train.main(argv)
        mine = json.loads((Path(tmp) / "log_history.json").read_text())
    theirs = json.loads((run_dir / "log_history.json").read_text())
    by_step = {h["step"]: _without_wall_clock(h) for h in theirs if "loss" in h}
    windows = [_without_wall_clock(h) for h in mine if "loss" in h]
    equal = [h == by_step.get(h["step"]) for h in windows]
    return {
        "run": run,
        "seed": seed,
        "steps": steps,
        "calls": calls[0],
        "other_range": list(other),
        "gap_tokens": found,
        "first_call": found[0]["call"] if found else None,
        "windows_compared": len(windows),
        "windows_equal": sum(equal),
    }


def _without_wall_clock(logged: dict) -> dict:
    return {k: v for k, v in logged.items() if k not in WALL_CLOCK}


def main(argv=None) -> list[dict]:
    from atr_llm.cli_types import SEED, Integer, ReadDir, Text, WriteFile
    from atr_llm.command_line import Parser
    from experiments.cpu_table import CPU_RUNS

    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--run",
        choices=sorted(CPU_RUNS),
        required=True,
        help="a run of experiments.cpu_table.CPU_RUNS with a constant range",
    )
    p.add_argument("--seeds", type=SEED, nargs="+", required=True)
    p.add_argument("--steps", type=Integer(1), nargs="+", required=True, help="optimizer steps to replay, one per seed")
    p.add_argument("--runs-dir", type=ReadDir(as_path=True), default=Path("runs/cpu_table_forms"))
    p.add_argument("--other", type=Text(), default="kl3:0.07", help="kl3:DELTA or LOWER,UPPER (default: ATR's range)")
    p.add_argument("--out", type=WriteFile(as_path=True), default=None)
    a = p.parse_args(argv)
    if len(a.steps) != len(a.seeds):
        raise ValueError(f"--steps: expected one count >= 1 per seed ({len(a.seeds)}), got {a.steps}")
    other = other_range(a.other)
    result = [replay(a.run, seed, steps, a.runs_dir, other) for seed, steps in zip(a.seeds, a.steps)]
    text = json.dumps(result, indent=1)
    print(text, file=sys.__stdout__)
    if a.out:
        a.out.write_text(text + "\n")
    return result


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
