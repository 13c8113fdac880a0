"""The paper's Fig. 1 and the ranges every divergence constraint induces.

(a) k3(w) = w - 1 - log w with the delta level: the ATR range [l, u] against the symmetric range
[1 - eps, 1 + eps] with eps = 1 - l; (b) l and u against delta for KL3, KL1, KL2, IS-KL3;
(c) TRGPPO's range against delta for several p_old; (d) DCPO's and TRGPPO's ranges against p_old.

    python -m sims.clip_ranges [--quick] [--out figures] [--delta 0.07]
"""

from __future__ import annotations

if not __package__:  # run by its path (`python sims/<name>.py`): run as `python -m sims.<name>`, sims is not installed
    __import__("_run_as_module").rerun_as_module(__file__)

import numpy as np

import atr_theory as at
from sims._common import legend_below, parse_args, plt, save_figure, write_csv


def main(argv=None):
    from atr_llm.cli_types import Real

    args = parse_args(
        __doc__,
        argv,
        lambda ap: ap.add_argument("--delta", type=Real(0, open_low=True), default=0.07),
        seed=False,  # nothing here is random
    )
    d = args.delta
    n = 60 if args.quick else 400
    lo, hi = at.kl3_clip_range(d)
    eps = 1 - lo

    fig, axes = plt.subplots(2, 2, figsize=(11, 9.5))  # one idea per panel, each ~5 in wide
    axes = axes.ravel()
    ax = axes[0]
    w = np.linspace(0.4, 1.8, n)
    ax.plot(w, at.kl3(w), color="k", label=r"$k_3(w) = w - 1 - \log w$")
    ax.axhline(d, color="gray", ls="--", lw=0.8, label=rf"$\delta = {d}$")
    ax.axvspan(lo, hi, color="C3", alpha=0.15, label=f"ATR [{lo:.3f}, {hi:.3f}]")
    ax.axvspan(1 - eps, 1 + eps, ymax=0.5, color="C0", alpha=0.25, label=f"symmetric [{1 - eps:.3f}, {1 + eps:.3f}]")
    ax.set(
        xlabel="likelihood ratio w",
        ylabel="k3 (nats)",
        title="(a) KL3 constraint = asymmetric ratio range",
        ylim=(0, 0.25),
    )
    legend_below(ax)

    deltas = np.logspace(-3, np.log10(0.5), n)
    ranges = {
        "kl3 (atr)": at.kl3_clip_range(deltas),
        "kl1": at.kl1_clip_range(deltas),
        "kl2": at.kl2_clip_range(deltas),
        "is_kl3": at.is_kl3_clip_range(deltas),
    }
    ax = axes[1]
    for i, (name, (l, u)) in enumerate(ranges.items()):
        ax.plot(deltas, l, color=f"C{i}", label=f"{name}")
        ax.plot(deltas, np.minimum(u, 3), color=f"C{i}", ls="--")
    ax.axvline(d, color="gray", lw=0.6)
    ax.set(
        xscale="log",
        xlabel=r"$\delta$",
        ylabel="l (solid), u (dashed)",
        title="(b) ranges of the per-sample estimators",
        ylim=(0, 3),
    )
    legend_below(ax)

    ax = axes[2]
    p_list = [1e-4, 1e-2, 0.3, 0.9]
    trg = {}
    for i, p in enumerate(p_list):
        bounds = [at.trgppo_kl_range(p, float(x)) for x in deltas]  # one root pair per delta
        l = np.array([b[0][0] for b in bounds])
        u = np.array([b[1][0] for b in bounds])
        trg[p] = (l, u)
        ax.plot(deltas, l, color=f"C{i}", label=f"p_old = {p:g}")
        ax.plot(deltas, u, color=f"C{i}", ls="--")
    ax.plot(deltas, ranges["kl3 (atr)"][0], color="k", lw=0.8, label="kl3 (atr)")
    ax.plot(deltas, ranges["kl3 (atr)"][1], color="k", lw=0.8, ls="--")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel=r"$\delta$",
        ylabel="l_KL (solid), u_KL (dashed)",
        title="(c) TRGPPO: binary KL(p || p w) <= delta",
        ylim=(1e-3, 1e3),
    )
    legend_below(ax)

    ax = axes[3]
    p = np.logspace(-5, 0, n)
    dl, du = at.dcpo_clip_range(p)
    tl, tu = at.trgppo_clip_range(p, d, 0.2)
    ax.plot(p, dl, color="C4", label="DCPO l")
    ax.plot(p, du, color="C4", ls="--", label="DCPO u (cap 10)")
    ax.plot(p, tl, color="C8", label=f"TRGPPO l (delta={d}, eps=0.2)")
    ax.plot(p, tu, color="C8", ls="--", label="TRGPPO u")
    ax.axhline(lo, color="C3", lw=0.8, label="ATR l, u")
    ax.axhline(hi, color="C3", lw=0.8, ls="--")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel=r"old probability $p_{old}$ of the sampled token",
        ylabel="ratio bound",
        title="(d) probability-dependent ranges",
        ylim=(1e-2, 20),
    )
    legend_below(ax)
    paths = save_figure(fig, args.out, "clip_ranges")

    rows = []
    for i, x in enumerate(deltas):
        row = {"delta": float(x)}
        for name, (l, u) in ranges.items():
            row[f"{name}_l"], row[f"{name}_u"] = float(l[i]), float(u[i])
        for pp, (l, u) in trg.items():
            row[f"trgppo_p{pp:g}_l"], row[f"trgppo_p{pp:g}_u"] = float(l[i]), float(u[i])
        rows.append(row)
    csv1 = write_csv(args.out / "clip_ranges.csv", rows)
    csv2 = write_csv(
        args.out / "clip_ranges_by_p_old.csv",
        [
            {"p_old": float(a), "dcpo_l": float(b), "dcpo_u": float(c), "trgppo_l": float(e), "trgppo_u": float(f)}
            for a, b, c, e, f in zip(p, dl, du, tl, tu)
        ],
    )
    print(
        f"delta = {d}: ATR range [{lo:.5f}, {hi:.5f}], symmetric eps = {eps:.5f} -> u - (1 + eps) = {hi - 1 - eps:.5f}"
    )
    print("wrote", *paths, csv1, csv2)


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
