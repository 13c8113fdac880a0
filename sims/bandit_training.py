"""Bandit experiments the paper ran on LLMs, and one it could not.

(a) delta sweep for atr (0.01 ... 0.2) on the Zipf bandit of entropy_diff.py, mirroring the paper's
    ablation (Fig. 4): final return and entropy against delta.
(b) the matched-range control of the paper's Table 3: atr (mask form) against clip with eps = 1 - l
    and eps = u - 1, and clip_higher with (1 - l, u - 1) (= atr in the min form), to separate the
    effect of the range from the effect of the mask form.
(c) a multi-step episodic task (T token choices from V, reward 1 iff the sum is the target mod V,
    exact success probability by dynamic programming) -- RL with a verifiable terminal reward in
    miniature -- trained with every registered method, sequence-level ones (gspo, atr_seq) included.

    python -m sims.bandit_training [--quick] [--seed 0] [--out figures]
"""

from __future__ import annotations

if not __package__:  # run by its path (`python sims/<name>.py`): run as `python -m sims.<name>`, sims is not installed
    __import__("_run_as_module").rerun_as_module(__file__)

import numpy as np
import torch
from tqdm.auto import tqdm

import atr_theory as at
from atr_theory import bandit
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


def final_stats(h) -> dict:
    t = h.as_tensors()
    out = {}
    for k in ("return", "entropy"):
        m, lo, hi = mean_ci(t[k][-1].numpy())
        out[f"final_{k}_mean"], out[f"final_{k}_lo"], out[f"final_{k}_hi"] = float(m), float(lo), float(hi)
    out["mean_frac_masked"] = float(np.mean(h.frac_masked))
    return out


def delta_sweep(args, ax_r, ax_h, theta0, r, setting):
    deltas = [0.01, 0.03, 0.07, 0.2] if args.quick else [0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2]
    rows = []
    for d in tqdm(deltas, desc="delta sweep"):
        _, h = run_zipf_bandit(theta0, r, setting, "atr", args.seed, delta=d)
        rows.append({"delta": d, "form": figure_form("atr"), **final_stats(h)})
    x = [r_["delta"] for r_ in rows]
    for ax, k, label in ((ax_r, "return", "final expected return"), (ax_h, "entropy", "final entropy (nats)")):
        m = [r_[f"final_{k}_mean"] for r_ in rows]
        ax.errorbar(
            x,
            m,
            yerr=[
                np.subtract(m, [r_[f"final_{k}_lo"] for r_ in rows]),
                np.subtract([r_[f"final_{k}_hi"] for r_ in rows], m),
            ],
            marker="o",
            color="C3",
            capsize=3,
        )
        ax.set(
            xscale="log",
            xlabel=r"$\delta$ (atr, mask form)",
            ylabel=label,
            title=f"(a) atr (mask) delta sweep: {label}",
        )
    return rows


def matched_control(args, ax, theta0, r, setting, delta=0.07):
    lo, hi = at.kl3_clip_range(delta)
    runs = {
        f"atr mask (delta={delta})": ("atr", {"delta": delta, "form": "mask"}),
        f"atr min = clip_higher({1 - lo:.3f}, {hi - 1:.3f})": ("atr", {"delta": delta, "form": "min"}),
        f"clip eps=1-l={1 - lo:.3f}": ("clip", {"epsilon": 1 - lo}),
        f"clip eps=u-1={hi - 1:.3f}": ("clip", {"epsilon": hi - 1}),
        f"clip_higher mask ({1 - lo:.3f}, {hi - 1:.3f})": (
            "clip_higher",
            {"epsilon_low": 1 - lo, "epsilon_high": hi - 1, "form": "mask"},
        ),
        "clip eps=0.2": ("clip", {}),
    }
    rows, curves = [], {}
    for label, (m, params) in tqdm(runs.items(), desc="matched control"):
        _, h = run_zipf_bandit(theta0, r, setting, m, args.seed, **params)
        params = {"form": figure_form(m), **params}
        rows.append({"run": label, "method": m, **{k: v for k, v in params.items()}, **final_stats(h)})
        curves[label] = h.as_tensors()["return"].numpy()
    for i, (label, c) in enumerate(curves.items()):
        m, lo_, hi_ = mean_ci(c, axis=1)
        x = np.arange(len(m))
        ax.plot(x, m, color=f"C{i}", label=label, lw=1.5)
        ax.fill_between(x, lo_, hi_, color=f"C{i}", alpha=0.12)
    ax.set(xlabel="outer iteration", ylabel="expected return", title="(b) matched-range control (Table 3)")
    legend_below(ax, ncol=3)
    return rows


def episodic(args, ax_s, ax_h, ax_legend):
    q = args.quick
    N, T, V = (3, 4, 5) if q else (12, 8, 8)
    iters, inner, G, lr = (15, 4, 16, 30.0) if q else (120, 4, 16, 30.0)
    target = 3
    gen = torch.Generator().manual_seed(args.seed)
    theta0 = 0.5 * torch.randn(N, T, V, generator=gen, dtype=torch.float64)
    methods = at.method_names(aliases=False)
    rows, curves = [], []
    for m in tqdm(methods, desc="episodic"):
        _, h = bandit.train_episodic(
            theta0,
            target,
            m,
            form=figure_form(m),
            iterations=iters,
            inner_steps=inner,
            lr=lr,
            group_size=G,
            generator=torch.Generator().manual_seed(args.seed + 1),
        )
        s, e = h["success"].numpy(), h["entropy"].numpy()
        sm, slo, shi = mean_ci(s, axis=1)
        em, _, _ = mean_ci(e, axis=1)
        main = m in ("clip", "clip_higher", "atr", "atr_seq", "gspo")
        style = dict(
            color=method_color(m),
            lw=2.0 if main else 0.9,
            label=run_label(m),
            ls="--" if m in ("clip_higher", "gspo") else "-",
        )
        ax_s.plot(np.arange(iters + 1), sm, **style)
        ax_h.plot(np.arange(iters + 1), em, **style)
        auc = float(s.mean())
        m_auc, lo_auc, hi_auc = mean_ci(s.mean(0))
        rows.append(
            {
                "method": m,
                "form": figure_form(m),
                "final_success_mean": float(sm[-1]),
                "final_success_lo": float(slo[-1]),
                "final_success_hi": float(shi[-1]),
                "mean_success_over_training": auc,
                "mean_success_lo": float(lo_auc),
                "mean_success_hi": float(hi_auc),
                "final_entropy": float(em[-1]),
                "mean_frac_masked": float(h["frac_masked"].mean()),
            }
        )
        for i in range(iters + 1):
            curves.append({"method": m, "iteration": i, "success_mean": float(sm[i]), "entropy_mean": float(em[i])})
    ax_s.set(
        xlabel="outer iteration",
        ylabel="exact success probability",
        title=f"(c) episodic task: T={T} tokens from V={V}, sum = {target} mod V",
    )
    ax_h.set(xlabel="outer iteration", ylabel="mean per-position entropy (nats)", title="(d) episodic task: entropy")
    ax_legend.axis("off")  # the methods' legend in its own row, under both panels: it covers no curve
    ax_legend.legend(*ax_s.get_legend_handles_labels(), loc="center", ncol=4, frameon=False)
    setting = {
        "N": N,
        "T": T,
        "V": V,
        "iterations": iters,
        "inner_steps": inner,
        "group_size": G,
        "lr": lr,
        "target": target,
        "aggregation": "dr_grpo",
        "advantage": "r - mean_G r",
    }
    return rows, curves, setting


def main(argv=None):
    args = parse_args(__doc__, argv)
    torch.set_default_dtype(torch.float64)
    theta0, r, setting = zipf_bandit_task(args.quick, args.seed)
    fig = plt.figure(figsize=(12, 22))  # one idea per row: the sweep, the control, the episodic task, its ranking
    grid = fig.add_gridspec(5, 2, height_ratios=[1, 1.1, 1.1, 0.5, 1.9])
    sweep = delta_sweep(args, fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]), theta0, r, setting)
    control = matched_control(args, fig.add_subplot(grid[1, :]), theta0, r, setting)
    ep_rows, ep_curves, ep_setting = episodic(
        args, fig.add_subplot(grid[2, 0]), fig.add_subplot(grid[2, 1]), fig.add_subplot(grid[3, :])
    )
    ax = fig.add_subplot(grid[4, :])
    names = [e["method"] for e in ep_rows]
    m = np.array([e["mean_success_over_training"] for e in ep_rows])
    err = np.array(
        [
            [
                e["mean_success_over_training"] - e["mean_success_lo"],
                e["mean_success_hi"] - e["mean_success_over_training"],
            ]
            for e in ep_rows
        ]
    ).T
    ax.barh(names, m, xerr=err, color=[method_color(n) for n in names])
    ax.set(
        xlabel="success probability averaged over training (area under the curve)",
        title="(e) episodic task: sample efficiency",
    )
    paths = save_figure(fig, args.out, "bandit_training")
    files = [
        write_csv(args.out / "bandit_training_delta_sweep.csv", sweep),
        write_csv(args.out / "bandit_training_matched_control.csv", control),
        write_csv(args.out / "bandit_training_episodic.csv", ep_rows),
        write_csv(args.out / "bandit_training_episodic_curves.csv", ep_curves),
        write_json(args.out / "bandit_training_settings.json", {"zipf_bandit": setting, "episodic": ep_setting}),
    ]
    for row in control:
        print(
            f"{row['run']:45s} final return {row['final_return_mean']:.3f} [{row['final_return_lo']:.3f}, {row['final_return_hi']:.3f}]"
            f"  entropy {row['final_entropy_mean']:.3f}"
        )
    for row in sorted(ep_rows, key=lambda e: -e["mean_success_over_training"]):
        print(
            f"{row['method']:12s} episodic success AUC {row['mean_success_over_training']:.3f} final {row['final_success_mean']:.3f}"
            f" masked {row['mean_frac_masked']:.3f}"
        )
    print("wrote", *paths, *files)


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
