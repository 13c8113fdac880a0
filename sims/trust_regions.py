"""Every rule's trust region in one figure: which ratios keep their gradient, against the old probability.

For each rule that keeps or drops tokens (at its default parameters and form), a grid of tokens with old probability
p_old and ratio w = pi / pi_old is scored by ``atr_theory.policy_loss`` itself, once with A > 0 and once with A < 0;
the figure draws the lowest and highest kept ratio at each p_old (ratios with p_old w > 1 are no probabilities and
are shaded). Rules that reweight instead (cispo, sapo, vespo, reinforce, dro, kl_cov, topr, kimi15), sequence-level
rules, batch-level ones (m2po: its cut on ``|log w|`` depends on the whole batch; bapo: its range is searched per batch) and those needing the full
distribution or a random draw have no per-token region and are left out; so are the top-K DPPO rules (dppo_topk_tv,
dppo_topk_kl), whose region depends on how the other tokens move: where their probabilities all scale by one factor
(the sampled token's complement), it is the binary rule's (dppo_tv, dppo_kl) for every K.

    python -m sims.trust_regions [--quick] [--out figures/paper]
"""

from __future__ import annotations

if not __package__:  # run by its path (`python sims/<name>.py`): run as `python -m sims.<name>`, sims is not installed
    __import__("_run_as_module").rerun_as_module(__file__)

import math

import numpy as np
import torch

import atr_theory as at
from sims._common import figure_form, parse_args, plt, save_figure, write_csv

RULES = ("clip", "clip_higher", "dual_clip", "atr", "kl1", "kl2", "is_kl3", "trgppo", "dcpo", "dppo_tv", "dppo_kl")
W_RANGE = (0.2, 5.0)
P_RANGE = (1e-4, 0.999)


def kept_grid(rule: str, sign: float, p_old: np.ndarray, w: np.ndarray) -> np.ndarray:
    """(len(p_old), len(w)) bool: whether a token with that old probability and ratio keeps its gradient under
    ``rule`` (default parameters and form) with advantage ``sign``; False where ``p_old w > 1``."""
    old = torch.tensor(np.log(p_old), dtype=torch.float64)[:, None].expand(len(p_old), len(w))
    log_w = torch.tensor(np.log(w), dtype=torch.float64)[None, :].expand_as(old)
    feasible = (old + log_w) <= 0
    logp = torch.where(feasible, old + log_w, old)  # an infeasible cell is scored at w = 1, then discarded
    adv = torch.full((len(p_old),), sign, dtype=torch.float64)
    out = at.policy_loss(
        logp, old.contiguous(), adv, torch.ones_like(old, dtype=torch.bool), method=rule, form=figure_form(rule)
    )
    return (out.result.kept & feasible).numpy()


def region_rows(rules, p_old: np.ndarray, w: np.ndarray) -> list[dict]:
    """One row per (rule, sign, p_old): the lowest and highest kept ratio on the grid (empty: none kept), and
    whether the kept set is one interval of the grid."""
    rows = []
    for rule in rules:
        for sign in (1.0, -1.0):
            kept = kept_grid(rule, sign, p_old, w)
            for i, p in enumerate(p_old):
                idx = np.flatnonzero(kept[i])
                rows.append(
                    {
                        "rule": rule,
                        "form": figure_form(rule),
                        "advantage": "positive" if sign > 0 else "negative",
                        "p_old": float(p),
                        "w_low": float(w[idx[0]]) if idx.size else math.nan,
                        "w_high": float(w[idx[-1]]) if idx.size else math.nan,
                        "interval": bool(idx.size == 0 or idx[-1] - idx[0] + 1 == idx.size),
                    }
                )
    return rows


def main(argv=None):
    args = parse_args(__doc__, argv, seed=False)  # a grid scored exactly: nothing is drawn
    n_p, n_w = (40, 200) if args.quick else (200, 1200)
    p_old = np.logspace(math.log10(P_RANGE[0]), math.log10(P_RANGE[1]), n_p)
    w = np.logspace(math.log10(W_RANGE[0]), math.log10(W_RANGE[1]), n_w)
    rows = region_rows(RULES, p_old, w)
    write_csv(args.out / "trust_regions.csv", rows)

    fig, axes = plt.subplots(3, 4, figsize=(13, 9.5), sharex=True, sharey=True)
    for ax, rule in zip(axes.flat, RULES):
        for side, color in (("positive", "C0"), ("negative", "C3")):
            sel = [r for r in rows if r["rule"] == rule and r["advantage"] == side]
            x = np.array([r["p_old"] for r in sel])
            lo, hi = np.array([r["w_low"] for r in sel]), np.array([r["w_high"] for r in sel])
            label = f"kept, A {'> 0' if side == 'positive' else '< 0'}"
            ax.fill_between(x, lo, hi, color=color, alpha=0.28, lw=0, label=label)
            ax.plot(x, hi, color=color, lw=1.0)
            ax.plot(x, lo, color=color, lw=1.0)
        ax.fill_between(p_old, np.minimum(1 / p_old, W_RANGE[1]), W_RANGE[1], color="0.8", label="p_old w > 1")
        ax.axhline(1.0, color="k", lw=0.5)
        spec = at.get_method(rule)
        params = [f"{k}={v:g}" for k, v in spec.defaults.items() if k != "is_cap"]
        lines = [", ".join(params[i : i + 2]) for i in range(0, len(params), 2)]  # two per line: fits the panel
        ax.set_title("\n".join([f"{rule} ({figure_form(rule)} form)", *lines]))
        ax.set(xscale="log", yscale="log", ylim=W_RANGE)
        ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda y, _: f"{y:g}"))  # 0.5, 1, 2 rather than 5 x 10^-1
        ax.yaxis.set_minor_formatter(plt.NullFormatter())
        ax.set_yticks([0.2, 0.5, 1, 2, 4])
    axes.flat[-1].axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    axes.flat[-1].legend(handles, labels, loc="center")
    for ax in axes[-1]:
        ax.set_xlabel("p_old of the sampled token")
    for ax in axes[:, 0]:
        ax.set_ylabel("ratio w = pi / pi_old")
    paths = save_figure(fig, args.out, "trust_regions")
    print(f"wrote {paths[0]} and {args.out / 'trust_regions.csv'}")
    return rows


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
