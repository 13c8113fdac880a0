"""Range x form on the bandit, where the true KL and the entropy are exact (the range x form study's item 3).

Four cells: the ratio range of clip (epsilon 0.2: [0.8, 1.2]) or of ATR (delta 0.07: [0.671, 1.422]), each in the
min form (the rule's clip inside PPO's min: the paper's Section 2 surrogate) and in the mask form (pure clip: its
Section 4 objective). The Zipf bandit of delta_sweep.py (16 seeds x 8 states x 1,000 arms, 5 rewarded arms per state,
sampled groups of 16, Dr.GRPO advantages, Adam) at several learning rates and inner-step counts. Per cell and
setting, over the seeds: the final expected return and entropy, and the exact KL(pi_old || pi) of every update (an
outer step: one sampled batch and its inner steps): the fraction of updates above delta = 0.07 and the 95th
percentile. Paired over seeds (the same samples' seed in every cell): the range effect within each form, the form
effect at each range, and their interaction.

    python -m sims.range_form [--quick] [--seed 0] [--out figures/paper]

Writes range_form.{png,pdf}, range_form.csv (one row per setting x cell) and range_form.json (with the contrasts).
"""

from __future__ import annotations

if not __package__:  # run by its path (`python sims/<name>.py`): run as `python -m sims.<name>`, sims is not installed
    __import__("_run_as_module").rerun_as_module(__file__)

import numpy as np
from tqdm.auto import tqdm

from sims._common import (
    legend_below,
    mean_ci,
    parse_args,
    plt,
    save_figure,
    train_adam_zipf,
    write_csv,
    write_json,
    zipf_bandit_task,
)

DELTA = 0.07
CELLS = {  # name -> (method, parameters, form)
    "clip-min": ("clip", {"epsilon": 0.2}, "min"),
    "clip-mask": ("clip", {"epsilon": 0.2}, "mask"),
    "atr-min": ("atr", {"delta": DELTA}, "min"),
    "atr-mask": ("atr", {"delta": DELTA}, "mask"),
}
SETTINGS = [(0.03, 4), (0.1, 4), (0.3, 4), (0.3, 8)]  # (Adam learning rate, inner steps per sampled batch)
CONTRASTS = {  # name -> (+cells, -cells): a difference of per-seed values
    "range within min (atr-min - clip-min)": (["atr-min"], ["clip-min"]),
    "range within mask (atr-mask - clip-mask)": (["atr-mask"], ["clip-mask"]),
    "form at clip's range (clip-mask - clip-min)": (["clip-mask"], ["clip-min"]),
    "form at ATR's range (atr-mask - atr-min)": (["atr-mask"], ["atr-min"]),
    "interaction": (["atr-mask", "clip-min"], ["clip-mask", "atr-min"]),
}


def run_cell(theta0, r, base: dict, cell: str, lr: float, inner: int, seed: int) -> dict[str, np.ndarray]:
    """One cell at one setting: per-seed final return and entropy, and per-seed statistics of the exact
    KL(pi_old || pi) over the run's updates."""
    method, params, form = CELLS[cell]
    h = train_adam_zipf(theta0, r, base, method, lr, inner, seed, form=form, **params)
    t = {k: v.numpy() for k, v in h.as_tensors().items()}
    kl = t["kl"][1:]  # (iterations, N): the KL of each update (index 0 is the start)
    return {
        "final_return": t["return"][-1],
        "final_entropy": t["entropy"][-1],
        "frac_updates_kl_above_delta": (kl > DELTA).mean(0),
        "kl_p95": np.quantile(kl, 0.95, axis=0),
        "kl_mean": kl.mean(0),
    }


def contrast(per_cell: dict[str, dict[str, np.ndarray]], key: str, plus: list[str], minus: list[str]) -> dict:
    """Mean and 95% interval over seeds of ``sum(plus) - sum(minus)`` of ``key`` (paired: the same seeds)."""
    d = sum(per_cell[c][key] for c in plus) - sum(per_cell[c][key] for c in minus)
    m, lo, hi = mean_ci(d)
    return {"mean": float(m), "lo": float(lo), "hi": float(hi)}


def main(argv=None):
    args = parse_args(__doc__, argv)
    theta0, r, base = zipf_bandit_task(args.quick, args.seed)
    settings = SETTINGS[:2] if args.quick else SETTINGS
    base = {**base, "iterations": 10 if args.quick else 150}
    rows, contrasts = [], {}
    keys = ("final_return", "final_entropy", "frac_updates_kl_above_delta", "kl_p95", "kl_mean")
    for lr, inner in tqdm(settings, desc="settings"):
        per_cell = {cell: run_cell(theta0, r, base, cell, lr, inner, args.seed) for cell in CELLS}
        for cell, values in per_cell.items():
            row = {"lr": lr, "inner_steps": inner, "cell": cell, "method": CELLS[cell][0], "form": CELLS[cell][2]}
            for key in keys:
                m, lo, hi = mean_ci(values[key])
                row.update({f"{key}_mean": float(m), f"{key}_lo": float(lo), f"{key}_hi": float(hi)})
            rows.append(row)
        contrasts[f"lr={lr},inner={inner}"] = {
            name: {key: contrast(per_cell, key, *cells) for key in keys} for name, cells in CONTRASTS.items()
        }
    out = args.out
    write_csv(out / "range_form.csv", rows)
    write_json(
        out / "range_form.json",
        {"setting": {**base, "delta": DELTA, "cells": {k: list(v) for k, v in CELLS.items()}}, "contrasts": contrasts},
    )
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    panels = (
        ("final_return", "final expected return"),
        ("frac_updates_kl_above_delta", f"updates with exact KL(pi_old || pi) > {DELTA}"),
        ("kl_p95", "95th percentile of the exact KL per update"),
    )
    labels = [f"lr {lr}, {inner} inner" for lr, inner in settings]
    for ax, (key, title) in zip(axes, panels):
        for i, cell in enumerate(CELLS):
            mine = [row for row in rows if row["cell"] == cell]
            x = np.arange(len(mine)) + (i - 1.5) * 0.15
            m = np.array([row[f"{key}_mean"] for row in mine])
            err = [m - [row[f"{key}_lo"] for row in mine], [row[f"{key}_hi"] for row in mine] - m]
            ax.errorbar(x, m, yerr=err, fmt="o" if CELLS[cell][2] == "min" else "s", capsize=3, label=cell)
        ax.set_xticks(np.arange(len(labels)), labels)
        ax.set_title(title)
    axes[2].axhline(DELTA, color="grey", lw=0.8, ls="--")
    legend_below(axes[0])
    fig.suptitle("Range x form on the Zipf bandit (mean and 95% CI over seeds; min = the clip inside PPO's min, mask = pure clip)")
    fig.tight_layout()
    paths = save_figure(fig, out, "range_form")
    for setting, by_name in contrasts.items():
        for name, by_key in by_name.items():
            d = by_key["final_return"]
            print(f"{setting:18s} {name:45s} return {d['mean']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]")
    print("wrote", *paths, out / "range_form.csv", out / "range_form.json")


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
