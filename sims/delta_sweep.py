"""A delta sweep in which delta acts continuously (the paper's Fig. 4 at the scale of a CPU).

The sweep of bandit_training.py is a staircase: plain gradient steps of a fixed size put the rewarded arms'
ratios at a few discrete values, so delta only matters where one of them crosses u(delta). Here the same Zipf
bandit (16 seeds x 8 states x 1,000 arms, 5 rewarded arms per state, sampled groups of 16, Dr.GRPO advantages)
is trained with Adam, whose per-coordinate steps spread the ratios continuously, at several learning rates and
inner-step counts, for delta on a log grid; for each setting: final expected return (mean and 95% CI over the 16
seeds), the fraction of tokens masked and the pooled ratio quantiles, and whether the best delta is interior
(strictly inside the grid, and better than both ends by more than the CI half-widths).

    python -m sims.delta_sweep [--quick] [--seed 0] [--out figures]

Writes figures/delta_sweep.{png,pdf}, delta_sweep.csv (one row per setting x delta) and delta_sweep.json.
"""

from __future__ import annotations

if not __package__:  # run by its path (`python sims/<name>.py`): run as `python -m sims.<name>`, sims is not installed
    __import__("_run_as_module").rerun_as_module(__file__)

import numpy as np
from tqdm.auto import tqdm

from sims._common import (
    figure_form,
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

DELTAS = [0.005, 0.01, 0.02, 0.035, 0.05, 0.07, 0.1, 0.15, 0.25, 0.5]
SETTINGS = [  # (Adam learning rate, inner steps per batch): from ratios that hardly move to ones well past u(delta)
    (0.03, 4),
    (0.1, 4),
    (0.3, 4),
    (0.3, 8),
    (1.0, 4),
    (1.0, 8),
]


def run(theta0, r, base, delta, lr, inner, seed):
    h = train_adam_zipf(theta0, r, base, "atr", lr, inner, seed, delta=delta, form=figure_form("atr"))
    ret = h.as_tensors()["return"]
    q = np.array(h.ratio_quantiles)
    m, lo, hi = mean_ci(ret[-1].numpy())
    auc = ret.mean(0).numpy()  # area under the return curve, per seed
    am, alo, ahi = mean_ci(auc)
    return {
        "final_return_mean": float(m),
        "final_return_lo": float(lo),
        "final_return_hi": float(hi),
        "auc_return_mean": float(am),
        "auc_return_lo": float(alo),
        "auc_return_hi": float(ahi),
        "mean_frac_masked": float(np.mean(h.frac_masked)),
        "ratio_p05": float(np.mean(q[:, 0])),
        "ratio_p50": float(np.mean(q[:, 1])),
        "ratio_p95": float(np.mean(q[:, 2])),
    }


def interior_optimum(rows, key="final_return"):
    """The best delta, and whether it is interior: strictly inside the grid and its mean above both ends' upper
    95% bounds (so the ends are worse beyond seed noise)."""
    means = [r[f"{key}_mean"] for r in rows]
    best = int(np.argmax(means))
    interior = 0 < best < len(rows) - 1 and all(means[best] > rows[i][f"{key}_hi"] for i in (0, len(rows) - 1))
    return {"best_delta": rows[best]["delta"], "best_mean": means[best], "interior": bool(interior)}


def main(argv=None):
    args = parse_args(__doc__, argv)
    theta0, r, base = zipf_bandit_task(args.quick, args.seed)
    deltas = DELTAS[::3] if args.quick else DELTAS
    settings = SETTINGS[:2] if args.quick else SETTINGS
    if args.quick:
        base = {**base, "iterations": 10}
    else:
        base = {**base, "iterations": 150}
    rows, verdicts = [], {}
    for lr, inner in tqdm(settings, desc="settings"):
        here = []
        for d in tqdm(deltas, desc=f"lr={lr} inner={inner}", leave=False):
            here.append(
                {
                    "lr": lr,
                    "inner_steps": inner,
                    "delta": d,
                    "form": figure_form("atr"),
                    **run(theta0, r, base, d, lr, inner, args.seed),
                }
            )
        rows += here
        verdicts[f"lr={lr},inner={inner}"] = {
            "final": interior_optimum(here, "final_return"),
            "auc": interior_optimum(here, "auc_return"),
        }
    out = args.out
    write_csv(out / "delta_sweep.csv", rows)
    write_json(
        out / "delta_sweep.json",
        {"settings": {**base, "N_seeds": int(theta0.shape[0]), "optimizer": "adam"}, "verdicts": verdicts},
    )

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for lr, inner in settings:
        sel = [x for x in rows if x["lr"] == lr and x["inner_steps"] == inner]
        xs = [x["delta"] for x in sel]
        (line,) = axes[0].plot(
            xs, [x["final_return_mean"] for x in sel], marker="o", label=f"Adam lr {lr}, {inner} steps"
        )
        axes[0].fill_between(
            xs,
            [x["final_return_lo"] for x in sel],
            [x["final_return_hi"] for x in sel],
            color=line.get_color(),
            alpha=0.2,
        )
        axes[1].plot(xs, [x["mean_frac_masked"] for x in sel], marker="o", color=line.get_color())
        axes[2].fill_between(
            xs, [x["ratio_p05"] for x in sel], [x["ratio_p95"] for x in sel], color=line.get_color(), alpha=0.25
        )
        axes[2].plot(xs, [x["ratio_p50"] for x in sel], color=line.get_color())
    axes[0].set(
        xscale="log",
        xlabel="delta",
        ylabel="final expected return (95% CI, 16 seeds)",
        title=f"ATR ({figure_form('atr')} form) delta sweep",
    )
    axes[0].axvline(0.07, color="grey", lw=0.8, ls="--")
    legend_below(axes[0])
    axes[1].set(xscale="log", xlabel="delta", ylabel="fraction of tokens masked", title="masking")
    axes[2].set(xscale="log", xlabel="delta", ylabel="ratio w (p05-p95 band, p50)", title="ratio distribution")
    fig.tight_layout()
    paths = save_figure(fig, out, "delta_sweep")
    for k, v in verdicts.items():
        print(k, v)
    print("wrote", *paths, out / "delta_sweep.csv", out / "delta_sweep.json")


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
