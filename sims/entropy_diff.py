"""Entropy: Thm 4.2 against the exact entropy difference, and entropy / return over training.

(a) For random instances under X- and X+ (both objectives in the Section 4 pure-clip reading, one exact gradient step of
    size eta from the same theta^k), the entropy difference H(ATR) - H(ratio) that Thm 4.2 predicts,
    and the corrected first-order term, against the exact one (scatter with the identity line).
(b) Training on a many-armed bandit: Zipf (long-tailed) initial policy, reward 1 on a few random arms
    per state -- a caricature of an LLM's next-token distribution -- sampled mode (G draws per state,
    Dr.GRPO advantages), several inner steps per batch so clipping acts; every token-level method,
    several seeds, mean and 95% band.

    python -m sims.entropy_diff [--quick] [--seed 0] [--out figures]
"""

from __future__ import annotations

if not __package__:  # run by its path (`python sims/<name>.py`): run as `python -m sims.<name>`, sims is not installed
    __import__("_run_as_module").rerun_as_module(__file__)

import numpy as np
import torch
from tqdm.auto import tqdm

import atr_theory as at
from atr_theory import theorems as T
from sims._common import (
    figure_form,
    legend_below,
    mean_ci,
    method_color,
    parse_args,
    plt,
    run_label,
    run_zipf_bandit,
    save_figure,
    write_csv,
    write_json,
    zipf_bandit_task,
)

SEQUENCE_LEVEL = ("gspo", "atr_seq")  # trained in sims/bandit_training.py's episodic task instead


def token_level_methods() -> list[str]:
    return [m for m in at.method_names(aliases=False) if m not in SEQUENCE_LEVEL]


def scatter_part(args, axes):
    n = 300 if args.quick else 3000
    eta, delta = 1e-3, 0.07
    rows = []
    gen = torch.Generator().manual_seed(args.seed)
    for ax, event in zip(axes, ("X-", "X+")):
        pts = {"paper": ([], []), "corrected": ([], [])}
        for K in (3, 5, 10, 30):
            th, tho, A = T.random_instances(n * 4, K, generator=gen)
            ind = T.event_indicator(T.ratio(th, tho), delta, event).any(-1)[:, 0]
            th, tho, A = th[ind][:n], tho[ind][:n], A[ind][:n]
            c = T.check_entropy_difference(th, tho, A, delta, event, "pure-vs-pure", eta)
            ex, pa, co = (x[:, 0].numpy() / eta for x in (c.exact, c.predicted, c.corrected))
            pts["paper"][0].extend(ex), pts["paper"][1].extend(pa)
            pts["corrected"][0].extend(ex), pts["corrected"][1].extend(co)
            rows += [
                {
                    "event": event,
                    "K": K,
                    "exact_over_eta": float(e),
                    "paper_over_eta": float(p),
                    "corrected_over_eta": float(q),
                }
                for e, p, q in zip(ex, pa, co)
            ]
        ex = np.array(pts["paper"][0])
        lim = np.quantile(np.abs(np.concatenate([ex, pts["paper"][1]])), 0.995)
        ax.plot([-lim, lim], [-lim, lim], color="k", lw=0.8, label="identity")
        ax.scatter(ex, pts["paper"][1], s=4, alpha=0.4, color="C1", label="paper Thm 4.2: Cov(A 1_X, log pi)")
        ax.scatter(
            ex, pts["corrected"][1], s=4, alpha=0.4, color="C0", label="corrected: Cov(pi (A 1_X - E A 1_X), log pi)"
        )
        agree = np.mean(np.sign(pts["paper"][1]) == np.sign(ex))
        ax.set(
            xlim=(-lim, lim),
            ylim=(-lim, lim),
            xlabel=r"exact $\Delta H / \eta$ (nats per unit step)",
            ylabel=r"predicted $\Delta H / \eta$",
            title=f"(a) Thm 4.2 under {event}: paper's sign right in {100 * agree:.0f}%",
        )
        if event == "X-":  # the two scatter panels share their legend
            legend_below(ax, ncol=1)
    return rows


def training_part(args, ax_h, ax_r, ax_legend):
    theta0, r, setting = zipf_bandit_task(args.quick, args.seed)
    N, K, iters = setting["N"], setting["K"], setting["iterations"]
    methods = token_level_methods()
    rows, summary = [], {}
    for m in tqdm(methods, desc="methods"):
        _, h = run_zipf_bandit(theta0, r, setting, m, args.seed)
        t = {k: v.numpy() for k, v in h.as_tensors().items()}
        he, hl, hh = mean_ci(t["entropy"], axis=1)
        re, rl, rh = mean_ci(t["return"], axis=1)
        main = m in ("clip", "clip_higher", "atr")
        style = dict(
            color=method_color(m),
            lw=2.0 if main else 0.9,
            alpha=1.0 if main else 0.7,
            label=run_label(m),
            ls="--" if m == "clip_higher" else "-",
        )
        x = np.arange(iters + 1)
        ax_h.plot(x, he, **style)
        ax_r.plot(x, re, **style)
        if main:
            ax_h.fill_between(x, hl, hh, color=style["color"], alpha=0.15)
            ax_r.fill_between(x, rl, rh, color=style["color"], alpha=0.15)
        for i in range(iters + 1):
            rows.append(
                {
                    "method": m,
                    "form": figure_form(m),
                    "iteration": i,
                    "entropy_mean": he[i],
                    "entropy_lo": hl[i],
                    "entropy_hi": hh[i],
                    "return_mean": re[i],
                    "return_lo": rl[i],
                    "return_hi": rh[i],
                    "frac_masked": h.frac_masked[i - 1] if i else 0.0,
                }
            )
        summary[m] = {
            "final_entropy": t["entropy"][-1].tolist(),
            "final_return": t["return"][-1].tolist(),
            "mean_frac_masked": float(np.mean(h.frac_masked)),
        }
    ax_h.set(
        xlabel="outer iteration (one sampled batch, 4 inner steps)",
        ylabel="mean policy entropy (nats)",
        title=f"(b) entropy: Zipf bandit, K={K}, {N} seeds",
    )
    ax_r.set(xlabel="outer iteration", ylabel="expected return", title="(c) return (reward 1 on 5 arms per state)")
    ax_legend.axis("off")  # the methods' legend in its own row, under both training panels: it covers no curve
    ax_legend.legend(*ax_r.get_legend_handles_labels(), loc="center", ncol=4, frameon=False)
    setting = {**setting, "methods": "default parameters of each method"}
    return rows, summary, setting


def paired_difference(summary, a, b, key):
    """Mean and 95% band of the per-seed difference a - b of a final quantity (same seeds, same batches)."""
    d = np.array(summary[a][key]) - np.array(summary[b][key])
    m, lo, hi = mean_ci(d, axis=0)
    return {"mean": float(m), "lo": float(lo), "hi": float(hi)}


def main(argv=None):
    args = parse_args(__doc__, argv)
    torch.set_default_dtype(torch.float64)
    fig = plt.figure(figsize=(12, 12.5))
    grid = fig.add_gridspec(3, 2, height_ratios=[1, 1, 0.45])
    axes = [fig.add_subplot(grid[row, col]) for row in (0, 1) for col in (0, 1)]
    scatter_rows = scatter_part(args, axes[:2])
    rows, summary, setting = training_part(args, axes[2], axes[3], fig.add_subplot(grid[2, :]))
    paths = save_figure(fig, args.out, "entropy_diff")
    c1 = write_csv(args.out / "entropy_diff_scatter.csv", scatter_rows)
    c2 = write_csv(args.out / "entropy_diff_training.csv", rows)
    comparisons = {
        f"{a}_minus_{b}_{k}": paired_difference(summary, a, b, k)
        for a, b in (("atr", "clip"), ("atr", "clip_higher"))
        for k in ("final_entropy", "final_return")
    }
    j = write_json(
        args.out / "entropy_diff_summary.json", {"setting": setting, "final": summary, "paired": comparisons}
    )
    for k, v in comparisons.items():
        print(f"{k:38s} {v['mean']:+.4f}  [{v['lo']:+.4f}, {v['hi']:+.4f}]")
    print("wrote", *paths, c1, c2, j)


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
