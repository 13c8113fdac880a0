"""How far each update really moves the policy: the full-vocabulary ``KL(pi_old || pi)`` (and the reverse) at every
completion position, beside the sampled token's k1 / k3 estimates (``ATRGRPOConfig.measure_true_kl``).

The paper's premise is that ``KL3 <= delta`` per sampled token keeps an update inside an *approximate* trust region.
On a model whose vocabulary is small enough, the true divergence is cheap to measure at every position; the trainer
then logs, per optimizer step, the summary ``true_kl_summary`` computes. Measuring changes nothing in training: one
extra no-grad forward at generation (the old policy's hidden states) and one per loss call (the current ones).
"""

from __future__ import annotations

import torch

import atr_theory as at

__all__ = ["rank_correlation", "true_kl_summary"]


def rank_correlation(x: torch.Tensor, y: torch.Tensor) -> float:
    r"""Spearman's rank correlation of two 1-D tensors: Pearson's correlation of their ranks (ties broken by order,
    which float inputs rarely have); NaN with fewer than two values or a constant input."""
    if x.numel() < 2:
        return float("nan")
    rx = torch.argsort(torch.argsort(x)).to(torch.float64)
    ry = torch.argsort(torch.argsort(y)).to(torch.float64)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denominator = torch.sqrt((rx * rx).sum() * (ry * ry).sum())
    return float((rx * ry).sum() / denominator) if denominator > 0 else float("nan")


def mean_over(values: torch.Tensor, selected: torch.Tensor) -> float:
    """The mean of ``values`` where ``selected`` holds; NaN where it holds nowhere."""
    return float(values[selected].mean()) if bool(selected.any()) else float("nan")


def true_kl_summary(
    kl: torch.Tensor,
    reverse_kl: torch.Tensor,
    log_ratio: torch.Tensor,
    kept: torch.Tensor,
    mask: torch.Tensor,
    delta: float,
    against: torch.Tensor | None = None,
) -> dict[str, float]:
    r"""One loss call's summary of the true divergences at its valid positions (``mask``), each (B, T):

    ``true_kl/mean``, ``true_kl/p95`` of ``KL(pi_old || pi)``; ``true_kl/reverse_mean``, ``true_kl/reverse_p95`` of
    ``KL(pi || pi_old)``; ``true_kl/frac_above_delta`` (positions with ``KL(pi_old || pi) > delta``), and that
    fraction among the tokens the rule kept (``kept``) and among those it dropped; ``true_kl/k3_rank_corr``, the rank
    correlation between the sampled token's ``k3(w) = w - 1 - log w`` (``log_ratio = log w``) and its position's true
    KL; ``true_kl/k1_mean`` / ``true_kl/k3_mean``, the sampled-token estimates (``k1 = -log w``), averaged the same way;
    with ``against`` (the tokens outside the rule's range against their advantage, ``atr_theory.outside_by_advantage``),
    ``true_kl/mean_against_advantage``, the mean KL at those positions. A fraction or mean over an empty set is NaN
    (the trainer logs only finite values)."""
    m = mask.bool()
    forward, reverse = kl.detach()[m].to(torch.float64), reverse_kl.detach()[m].to(torch.float64)
    y = log_ratio.detach()[m].to(torch.float64)
    keep = kept.detach()[m]
    if forward.numel() == 0:
        return {}
    above = forward > delta
    k3 = at.kl3_from_log_ratio(y)

    def fraction(selected: torch.Tensor) -> float:
        return mean_over(above.double(), selected)

    out = {} if against is None else {"true_kl/mean_against_advantage": mean_over(forward, against.detach()[m])}
    return out | {
        "true_kl/mean": float(forward.mean()),
        "true_kl/p95": float(torch.quantile(forward, 0.95)),
        "true_kl/reverse_mean": float(reverse.mean()),
        "true_kl/reverse_p95": float(torch.quantile(reverse, 0.95)),
        "true_kl/frac_above_delta": float(above.double().mean()),
        "true_kl/frac_above_delta_kept": fraction(keep),
        "true_kl/frac_above_delta_dropped": fraction(~keep),
        "true_kl/k3_rank_corr": rank_correlation(k3, forward),
        "true_kl/k1_mean": float((-y).mean()),
        "true_kl/k3_mean": float(k3.mean()),
    }
