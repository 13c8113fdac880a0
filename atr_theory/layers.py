r"""Layers that compose with every rule of the registry: they act on what a rule sees or on what it returns.

* ``ratio_level="sequence"`` (:func:`sequence_log_ratio`): every token of a sequence sees the sequence's ratio
  ``s = exp(mean_t log w_t)``, its gradient flowing through the mean (TRL ``importance_sampling_level="sequence"``,
  GSPO's sequence-level ratio). Any rule then decides per sequence.
* :class:`SequenceMask`: drop whole sequences whose divergence from the behaviour policy exceeds a threshold,
  ``reduce_t k(w_t) > threshold`` with ``k`` one of k1 / k2 / k3 and ``reduce`` mean, sum or max; optionally only
  sequences with negative advantage (DeepSeek-V3.2's off-policy sequence masking, TRL ``off_policy_mask_threshold``:
  k1, mean, negative advantages).
* :func:`high_entropy_mask`: keep only the tokens whose entropy is in the top ``rho`` quantile of the batch
  (Wang et al. 2025, "Beyond the 80/20 rule"; TRL ``top_entropy_quantile``).

A dropped token's objective is 0 (value and gradient), as in TRL: unlike Eq. 5's frozen ``A`` these layers remove the
token from the loss. :func:`atr_theory.policy_loss` applies them; they are plain functions usable on their own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .divergence import kl1_from_log_ratio, kl2_from_log_ratio, kl3_from_log_ratio

__all__ = ["RATIO_LEVELS", "SequenceMask", "high_entropy_mask", "sequence_log_ratio", "sequence_mask_keep"]

RATIO_LEVELS = ("token", "sequence")

_ESTIMATORS = {"k1": kl1_from_log_ratio, "k2": kl2_from_log_ratio, "k3": kl3_from_log_ratio}
_REDUCTIONS = ("mean", "sum", "max")
_WHICH = ("negative", "all")


def sequence_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    r"""(B, T): each position holds its sequence's ``(1/|y|) sum_t log w_t`` over valid tokens, with gradient
    through the mean (TRL ``importance_sampling_level="sequence"``; Zheng et al. 2025, GSPO's ``s_i``).
    ``log_ratio`` must be zero on padding."""
    m = mask.to(log_ratio.dtype)
    seq = log_ratio.sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0)
    return seq.expand_as(log_ratio)


@dataclass(frozen=True)
class SequenceMask:
    r"""Drop a sequence when ``reduction_t estimator(w_t) > threshold``, ``w_t = pi / pi_behaviour`` of its valid
    tokens (``advantages="negative"``: only sequences whose advantage is < 0; the others are always kept).

    ``SequenceMask("k1", "mean", delta, "negative")`` is DeepSeek-V3.2's off-policy sequence masking (TRL
    ``off_policy_mask_threshold=delta``): keep where ``A >= 0`` or ``mean_t (log pi_behaviour - log pi) <= delta``.
    ``SequenceMask("k3", "mean", delta, "all")`` is the keep-test of :func:`atr_theory.methods.atr_seq` (which
    freezes instead of dropping)."""

    estimator: str = "k1"
    reduction: str = "mean"
    threshold: float = 0.0
    advantages: str = "negative"

    def __post_init__(self):
        if self.estimator not in _ESTIMATORS:
            raise ValueError(f"SequenceMask estimator must be one of {sorted(_ESTIMATORS)}, got {self.estimator!r}")
        if self.reduction not in _REDUCTIONS:
            raise ValueError(f"SequenceMask reduction must be one of {_REDUCTIONS}, got {self.reduction!r}")
        if self.advantages not in _WHICH:
            raise ValueError(f"SequenceMask advantages must be one of {_WHICH}, got {self.advantages!r}")
        t = self.threshold
        if isinstance(t, bool) or not isinstance(t, (int, float)) or t != t:
            raise ValueError(f"SequenceMask threshold must be a real number, got {t!r}")


def sequence_mask_keep(
    log_ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, spec: SequenceMask
) -> torch.Tensor:
    r"""Which tokens :class:`SequenceMask` ``spec`` keeps: (B, 1) bool per sequence, or (B, T) when
    ``spec.advantages == "negative"`` and ``advantages`` is (B, T) (a token with ``A_t >= 0`` is kept, as in TRL).
    ``log_ratio`` = ``log pi - log pi_behaviour`` per token (NaN counts as 0: a token the behaviour policy could not
    score gives no evidence, as in TRL). No gradient."""
    with torch.no_grad():
        m = mask.bool()
        y = torch.where(m, torch.nan_to_num(log_ratio.detach(), nan=0.0), 0.0)
        k = _ESTIMATORS[spec.estimator](y)
        if spec.reduction == "max":
            seq = torch.where(m, k, -torch.inf).amax(-1, keepdim=True)
        else:
            seq = k.sum(-1, keepdim=True)
            if spec.reduction == "mean":
                seq = seq / m.sum(-1, keepdim=True).clamp(min=1)
        keep = seq <= spec.threshold
        if spec.advantages == "negative":
            keep = keep | (advantages >= 0)
        return keep


def high_entropy_mask(entropies: torch.Tensor, mask: torch.Tensor, top_quantile: float) -> torch.Tensor:
    r"""(B, T) bool: valid tokens whose entropy is ``>=`` the ``1 - top_quantile`` quantile (linear interpolation,
    ``torch.quantile``) of the valid tokens' entropies (Wang et al. 2025; TRL ``top_entropy_quantile``, one
    process). ``top_quantile = 1`` keeps every valid token; ``0`` keeps the highest (and its ties)."""
    if not 0.0 <= top_quantile <= 1.0:
        raise ValueError(f"top_entropy_quantile must be in [0, 1], got {top_quantile!r}")
    m = mask.bool()
    valid = entropies.detach()[m]
    # the quantile in float32 (TRL's), or float64 for float64 entropies: a float32 quantile of float64 values can round
    # above the largest and keep no token at all
    valid = valid if valid.dtype == torch.float64 else valid.float()
    if valid.numel() == 0:
        return torch.zeros_like(m)
    threshold = torch.quantile(valid, 1.0 - top_quantile)
    return (entropies.detach() * m >= threshold) & m
