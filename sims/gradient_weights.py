"""Soft and hard trust regions side by side: each rule's gradient weight as a function of the ratio.

For one token with old probability ``P_OLD`` and ratio ``w = pi / pi_old``, the weight is the gradient of the rule's
per-token objective in ``log pi`` divided by the advantage, ``(d J / d log pi) / A``, computed by autograd through
``atr_theory.policy_loss`` itself (token sum), once with ``A = +1`` and once with ``A = -1``. The unclipped ratio
objective ``w A`` has the weight ``w`` (the diagonal); a hard clip sets it to 0 outside its range; REINFORCE's is 1; a
soft rule bends it instead. Every rule here is per token and its weight does not depend on ``P_OLD`` (the
probability-dependent ranges, trgppo and the DPPO rules, are in ``sims.trust_regions``).

    python -m sims.gradient_weights [--quick] [--out figures/paper]
"""

from __future__ import annotations

if not __package__:  # run by its path (`python sims/<name>.py`): run as `python -m sims.<name>`, sims is not installed
    __import__("_run_as_module").rerun_as_module(__file__)

import math

import numpy as np
import torch

import atr_theory as at
from sims._common import figure_form, legend_below, method_color, parse_args, plt, save_figure, write_csv

HARD_RULES = ("clip_higher", "dual_clip", "atr", "cispo", "reinforce")
SOFT_RULES = ("pspo", "cfpo", "up_grpo", "ce_gppo", "aspo", "sapo", "topr")
W_RANGE = (0.2, 5.0)
P_OLD = 0.1  # pi_old of the token: every ratio of W_RANGE is a probability (p_old w <= 0.5)


def gradient_weight(rule: str, sign: float, w: np.ndarray) -> np.ndarray:
    """``(d J / d log pi) / A`` of ``rule`` (default parameters and form) at each ratio of ``w``, one token per
    ratio with ``pi_old = P_OLD`` and advantage ``sign``."""
    old = torch.full((len(w), 1), math.log(P_OLD), dtype=torch.float64)
    logp = (old + torch.tensor(np.log(w), dtype=torch.float64)[:, None]).requires_grad_(True)
    adv = torch.full((len(w),), sign, dtype=torch.float64)
    out = at.policy_loss(
        logp, old, adv, torch.ones_like(old, dtype=torch.bool), method=rule, form=figure_form(rule),
        aggregation="token_sum",
    )
    (grad,) = torch.autograd.grad(-out.loss, logp)
    return (grad[:, 0] / sign).numpy()


def weight_rows(rules, w: np.ndarray) -> list[dict]:
    """One row per (rule, sign, ratio): the gradient weight."""
    rows = []
    for rule in rules:
        for sign, side in ((1.0, "positive"), (-1.0, "negative")):
            for ratio, weight in zip(w, gradient_weight(rule, sign, w)):
                rows.append({"rule": rule, "family": "soft" if rule in SOFT_RULES else "hard",
                             "form": figure_form(rule), "advantage": side, "ratio": float(ratio),
                             "gradient_weight": float(weight)})
    return rows


def main(argv=None):
    args = parse_args(__doc__, argv, seed=False)  # exact gradients on a grid: nothing is drawn
    w = np.logspace(math.log10(W_RANGE[0]), math.log10(W_RANGE[1]), 120 if args.quick else 801)
    rows = weight_rows(HARD_RULES + SOFT_RULES, w)
    write_csv(args.out / "gradient_weights.csv", rows)

    fig, axes = plt.subplots(2, 2, figsize=(12, 10.5), sharex=True, sharey="row")
    for col, (family, rules) in enumerate((("hard", HARD_RULES), ("soft", SOFT_RULES))):
        for row, side in enumerate(("positive", "negative")):
            ax = axes[row, col]
            ax.plot(w, w, color="0.6", lw=1.0, ls=":", label="w A (no clip)")
            for i, rule in enumerate(rules):
                sel = [r for r in rows if r["rule"] == rule and r["advantage"] == side]
                ax.plot([r["ratio"] for r in sel], [r["gradient_weight"] for r in sel], color=method_color(rule),
                        lw=1.6, ls=("-", "--", "-.")[i % 3], label=rule)
            ax.axvline(1.0, color="k", lw=0.5)
            ax.set(xscale="log", ylim=(-2.0, 5.0))
            ax.set_title(f"{family} rules, A {'> 0' if side == 'positive' else '< 0'}")
            ax.set_xticks([0.2, 0.5, 1, 2, 5])
            ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda x, _: f"{x:g}"))
            ax.xaxis.set_minor_formatter(plt.NullFormatter())
        legend_below(axes[1, col], ncol=3)
    for ax in axes[-1]:
        ax.set_xlabel("ratio w = pi / pi_old")
    for ax in axes[:, 0]:
        ax.set_ylabel("gradient weight (dJ / d log pi) / A")
    paths = save_figure(fig, args.out, "gradient_weights")
    print(f"wrote {paths[0]} and {args.out / 'gradient_weights.csv'}")
    return rows


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
