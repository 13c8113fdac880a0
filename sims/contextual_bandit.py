"""Does sharing parameters between arms alone make the mask form collapse? An exact-gradient bandit whose arms share
parameters (the mask-mechanism study's part 2, docs/experiments/mask-mechanism-preregistration.md).

The exact bandit of ``atr_theory.bandit`` (each state a sequence, each arm a token weighted by pi_old, exact
advantages ``A = r - E_{pi_old} r``; the surrogate is ``atr_theory.policy_loss``), with a linear softmax policy
``pi(a|s) = softmax_a(theta . phi(s, a))``: S = 8 states, K = 16 arms, rewards ``r ~ U(0, 1)`` and features
``phi ~ N(0, I / d)`` per feature seed, 20 feature seeds, theta = 0 at the start (every pi uniform). Shared: d = 8
and d = 32; control: one-hot features (d = S K, the tabular softmax). Rules ``clip`` (epsilon 0.2) and ``atr``
(delta 0.07), each in the min and the mask form. Each outer iteration takes pi_old = pi and makes ``I`` plain
gradient steps of size ``eta`` on the exact surrogate; 200 outer iterations; eta in {0.1, 0.3, 1, 3}, I in
{1, 4, 16, 32}.

Per cell and seed: the expected return after the last iteration minus its start (a run collapses when it is below
0), and at every outer iteration the pi_old-weighted fraction of (state, arm) pairs outside the range against their
advantage (``atr_theory.outside_by_advantage``), measured after the iteration's last inner step.

    python -m sims.contextual_bandit [--quick] [--out figures/paper]

Writes contextual_bandit.{png,pdf}, contextual_bandit.csv (one row per cell) and contextual_bandit.json (each cell's
per-seed values, and the answer as pre-registered).
"""

from __future__ import annotations

if not __package__:  # run by its path (`python sims/<name>.py`): run as `python -m sims.<name>`, sims is not installed
    __import__("_run_as_module").rerun_as_module(__file__)

import itertools
import math

import numpy as np
import torch
from scipy import stats
from tqdm.auto import tqdm

import atr_theory as at
from atr_theory import bandit
from sims._common import parse_args, plt, save_figure, write_csv, write_json

STATES, ARMS, SEEDS, ITERATIONS = 8, 16, 20, 200
RULES = {"clip": {"epsilon": 0.2}, "atr": {"delta": 0.07}}
FORMS = ("min", "mask")
SHARING = (8, 32, "one-hot")  # d of the shared features; one-hot: the tabular softmax (no sharing)
STEP_SIZES = (0.1, 0.3, 1.0, 3.0)
INNER_STEPS = (1, 4, 16, 32)
QUICK = {"seeds": 3, "iterations": 5, "sharing": (8, "one-hot"), "step_sizes": (1.0,), "inner_steps": (1, 4)}


def task(sharing: int | str, seeds: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(phi, r)``: features (N, S, K, d) and rewards (N, S, K), float64, feature seed n drawn from
    ``torch.Generator().manual_seed(n)`` (rewards first, then features: the same rewards at every d)."""
    phis, rewards = [], []
    for n in range(seeds):
        g = torch.Generator().manual_seed(n)
        rewards.append(torch.rand(STATES, ARMS, generator=g, dtype=torch.float64))
        if sharing == "one-hot":
            phis.append(torch.eye(STATES * ARMS, dtype=torch.float64).reshape(STATES, ARMS, STATES * ARMS))
        else:
            phis.append(torch.randn(STATES, ARMS, sharing, generator=g, dtype=torch.float64) / math.sqrt(sharing))
    return torch.stack(phis), torch.stack(rewards)


def logits(phi: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """(N, S, K) ``theta_n . phi_n(s, a)`` for (N, S, K, d) features and (N, d) parameters."""
    return torch.einsum("nskd,nd->nsk", phi, theta)


def against_fraction(out: at.LossOutput, old_logits: torch.Tensor) -> torch.Tensor:
    """(N,) the pi_old-weighted fraction of (state, arm) pairs outside the rule's range against their advantage,
    averaged over states, from the ``exact_surrogate`` output ``out``."""
    against, _ = at.outside_by_advantage(out.mask_form_kept(), out.log_ratio, out.advantages, out.mask)
    weights = torch.softmax(old_logits, -1).reshape(against.shape)
    N = old_logits.shape[0]
    return (against * weights).reshape(N, -1).sum(-1) / STATES


def train(phi, r, rule: str, form: str, step_size: float, inner: int, iterations: int) -> dict[str, np.ndarray]:
    """One cell, vectorised over the feature seeds: the final parameters, the expected return at every outer
    iteration (index 0: the start) and the fraction against the advantage after each iteration's inner steps."""
    N, d = phi.shape[0], phi.shape[-1]
    theta = torch.zeros(N, d, dtype=torch.float64)
    returns = [bandit.expected_return(logits(phi, theta), r)]
    against = []
    for _ in range(iterations):
        old = logits(phi, theta).detach()
        adv = bandit.exact_advantages(old, r)
        for _ in range(inner):
            theta = theta.detach().requires_grad_(True)
            loss, _ = bandit.exact_surrogate(logits(phi, theta), old, adv, rule, form=form, **RULES[rule])
            (grad,) = torch.autograd.grad(loss, theta)
            theta = theta.detach() - step_size * grad  # loss = -sum_n J_n: a step up J_n for every seed n
        with torch.no_grad():
            _, out = bandit.exact_surrogate(logits(phi, theta), old, adv, rule, form=form, **RULES[rule])
            against.append(against_fraction(out, old))
            returns.append(bandit.expected_return(logits(phi, theta), r))
    return {
        "theta": theta.numpy(),
        "returns": torch.stack(returns).numpy(),  # (iterations + 1, N)
        "against": torch.stack(against).numpy(),  # (iterations, N)
    }


def t_interval(x: np.ndarray) -> tuple[float, float, float]:
    """Mean and 95% Student-t interval (n - 1 degrees of freedom) of the per-seed values ``x``."""
    m = float(np.mean(x))
    if len(x) < 2 or float(np.std(x, ddof=1)) == 0.0:
        return m, m, m
    half = float(stats.t.ppf(0.975, len(x) - 1)) * float(np.std(x, ddof=1)) / math.sqrt(len(x))
    return m, m - half, m + half


def answer(cells: list[dict]) -> dict:
    """The pre-registered answer: the shared cells (d, eta, I, rule) where the mask form's mean change of the
    expected return has its 95% interval below 0 while the min form's does not; and whether the one-hot control's
    two forms end with the same parameters, bit for bit, in every cell."""
    by = {(c["sharing"], c["step_size"], c["inner_steps"], c["rule"], c["form"]): c for c in cells}
    collapse_mask_only, control_identical = [], []
    for (sharing, eta, inner, rule, form), cell in by.items():
        if form != "mask":
            continue
        other = by[(sharing, eta, inner, rule, "min")]
        if sharing == "one-hot":
            control_identical.append(cell["final_theta_equal_to_min"])
        elif cell["change_high"] < 0 and not other["change_high"] < 0:
            collapse_mask_only.append({"sharing": sharing, "step_size": eta, "inner_steps": inner, "rule": rule})
    return {
        "shared_parameters_alone_collapse_the_mask_form": bool(collapse_mask_only),
        "cells_where_only_the_mask_form_collapses": collapse_mask_only,
        "one_hot_control_forms_identical_in_every_cell": bool(control_identical) and all(control_identical),
        "one_hot_control_cells_identical": f"{sum(control_identical)} of {len(control_identical)}",
    }


def run(quick: bool) -> tuple[list[dict], dict]:
    """Every cell of the grid (``QUICK``'s smaller one with ``quick``): rows with each cell's numbers, and the
    per-cell trajectories (mean over seeds) for the figure."""
    seeds = QUICK["seeds"] if quick else SEEDS
    iterations = QUICK["iterations"] if quick else ITERATIONS
    sharing_grid = QUICK["sharing"] if quick else SHARING
    step_sizes = QUICK["step_sizes"] if quick else STEP_SIZES
    inner_steps = QUICK["inner_steps"] if quick else INNER_STEPS
    grid = list(itertools.product(sharing_grid, step_sizes, inner_steps, RULES))
    cells, curves = [], {}
    for sharing, eta, inner, rule in tqdm(grid, desc="contextual bandit"):
        phi, r = task(sharing, seeds)
        results = {form: train(phi, r, rule, form, eta, inner, iterations) for form in FORMS}
        for form, h in results.items():
            change = h["returns"][-1] - h["returns"][0]
            mean, low, high = t_interval(change)
            cells.append(
                {
                    "sharing": sharing,
                    "step_size": eta,
                    "inner_steps": inner,
                    "rule": rule,
                    "form": form,
                    "seeds": seeds,
                    "start_return": float(np.mean(h["returns"][0])),
                    "change_mean": mean,
                    "change_low": low,
                    "change_high": high,
                    "collapsed_seeds": int((change < 0).sum()),
                    "against_mean": float(h["against"].mean()),
                    "against_max": float(h["against"].mean(1).max()),
                    "final_theta_equal_to_min": bool(np.array_equal(h["theta"], results["min"]["theta"])),
                    "change_per_seed": [float(x) for x in change],
                }
            )
            curves[(sharing, eta, inner, rule, form)] = h["returns"].mean(1) - h["returns"][0].mean()
    return cells, curves


def plot(cells: list[dict], path_out, name: str):
    """Mean change of the expected return against the inner steps, one panel per (sharing, rule), a line per step
    size; min form solid, mask form dashed."""
    sharing_values = list(dict.fromkeys(c["sharing"] for c in cells))
    fig, axes = plt.subplots(len(RULES), len(sharing_values), figsize=(4.2 * len(sharing_values), 7.2), squeeze=False)
    colors = plt.get_cmap("viridis")(np.linspace(0, 0.9, len(STEP_SIZES)))
    for i, rule in enumerate(RULES):
        for j, sharing in enumerate(sharing_values):
            ax = axes[i][j]
            for k, eta in enumerate(STEP_SIZES):
                for form, style in (("min", "-"), ("mask", "--")):
                    rows = [c for c in cells if (c["sharing"], c["step_size"], c["rule"], c["form"]) == (sharing, eta, rule, form)]
                    if rows:
                        rows.sort(key=lambda c: c["inner_steps"])
                        ax.plot(
                            [c["inner_steps"] for c in rows],
                            [c["change_mean"] for c in rows],
                            style,
                            marker="o",
                            color=colors[k],
                            label=f"eta {eta:g} ({form})",
                        )
            ax.axhline(0.0, color="grey", lw=0.8)
            ax.set_xscale("log", base=2)
            title = "one-hot features (tabular)" if sharing == "one-hot" else f"shared: d = {sharing}"
            ax.set(title=f"{rule}, {title}", xlabel="inner steps I", ylabel="final - start expected return")
    axes[0][-1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0))  # beside the panels: covers no curve
    fig.suptitle("Exact-gradient bandit with shared parameters: min form (solid) against mask form (dashed)")
    return save_figure(fig, path_out, name)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(__doc__, argv, seed=False)
    cells, _ = run(args.quick)
    result = {
        "preregistration": "docs/experiments/mask-mechanism-preregistration.md",
        "command": "python -m sims.contextual_bandit" + (" --quick" if args.quick else ""),
        "states": STATES,
        "arms": ARMS,
        "rules": RULES,
        "answer": answer(cells),
        "cells": cells,
    }
    write_csv(args.out / "contextual_bandit.csv", [{k: v for k, v in c.items() if k != "change_per_seed"} for c in cells])
    write_json(args.out / "contextual_bandit.json", result)
    plot(cells, args.out, "contextual_bandit")
    print(result["answer"])
    return result


if __name__ == "__main__":
    main()
