r"""Layers that compose with every rule of the registry: they act on what a rule sees or on what it returns.

* ``ratio_level="sequence"`` (``sequence_log_ratio``): every token of a sequence sees the sequence's ratio
  ``s = exp(mean_t log w_t)``, its gradient flowing through the mean (TRL ``importance_sampling_level="sequence"``,
  GSPO's sequence-level ratio). Any rule then decides per sequence.
* ``SequenceMask``: drop whole sequences whose divergence from the behaviour policy exceeds a threshold,
  ``reduce_t k(w_t) > threshold`` with ``k`` one of k1 / k2 / k3 and ``reduce`` mean, sum or max; optionally only
  sequences with negative advantage (DeepSeek-V3.2's off-policy sequence masking, TRL ``off_policy_mask_threshold``:
  k1, mean, negative advantages).
* ``RolloutCorrection`` (``rollout_correction_weights``): importance weights ``pi_proximal / pi_behaviour``
  for the mismatch between the policy that sampled (vLLM, an older checkpoint) and the one trained, truncated (TIS)
  or masked outside a band (IcePop / MIS), per token, per sequence (product) or per sequence geometrically (verl
  ``rollout_is``; OpenRLHF / NeMo-RL / slime TIS).
* ``high_entropy_mask``: keep only the tokens whose entropy is in the top ``rho`` quantile of the batch
  (Wang et al. 2025, "Beyond the 80/20 rule"; TRL ``top_entropy_quantile``).

A dropped token's objective is 0 (value and gradient), as in TRL: unlike Eq. 5's frozen ``A`` these layers remove the
token from the loss. ``atr_theory.policy_loss`` applies them; they are plain functions usable on their own.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from .divergence import kl1_from_log_ratio, kl2_from_log_ratio, kl3_from_log_ratio

__all__ = [
    "RATIO_LEVELS",
    "RolloutCorrection",
    "SequenceMask",
    "check_top_entropy_quantile",
    "high_entropy_mask",
    "rollout_correction_weights",
    "sequence_log_ratio",
    "sequence_mask_keep",
]

RATIO_LEVELS = ("token", "sequence")

_ESTIMATORS = {"k1": kl1_from_log_ratio, "k2": kl2_from_log_ratio, "k3": kl3_from_log_ratio}
_NON_NEGATIVE = ("k2", "k3")  # estimators >= 0 on every token: a negative threshold keeps nothing
_REDUCTIONS = ("mean", "sum", "max", "token")
_WHICH = ("negative", "all")


def _check_choice(owner: str, name: str, value, choices: tuple[str, ...]) -> None:
    """ValueError naming ``owner``'s field ``name`` when ``value`` is not one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{owner} {name} must be one of {choices}, got {value!r}")


def sequence_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    r"""(B, T): each position holds its sequence's ``(1/|y|) sum_t log w_t`` over valid tokens, with gradient
    through the mean (TRL ``importance_sampling_level="sequence"``; Zheng et al. 2025, GSPO's ``s_i``).
    ``log_ratio`` must be zero on padding."""
    m = mask.to(log_ratio.dtype)
    seq = log_ratio.sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0)
    return seq.expand_as(log_ratio)


@dataclass(frozen=True)
class SequenceMask:
    r"""Drop a sequence when ``reduction_t estimator(w_t)`` is above ``threshold`` (or below ``lower``), ``w_t = pi /
    pi_behaviour`` of its valid tokens (``advantages="negative"``: only sequences whose advantage is < 0; the others
    are always kept). ``reduction="token"`` decides token by token instead (verl ``rollout_rs="token_k*"``).

    verl's ``rollout_rs`` options are these masks with ``advantages="all"``: ``seq_mean_k3`` with threshold ``d`` is
    ``SequenceMask("k3", "mean", d, "all")``; its k1 options take ``"lo_hi"`` and keep ``log lo <= k1 <= log hi``,
    i.e. ``SequenceMask("k1", ..., threshold=log(hi), lower=log(lo), advantages="all")``. Note that verl applies
    those bounds to ``k1 = -log w``: they bound ``1/w``, not ``w`` (``"0.8_1.5"`` keeps ``w`` in ``[1/1.5, 1/0.8]``).

    ``SequenceMask("k1", "mean", delta, "negative")`` is DeepSeek-V3.2's off-policy sequence masking (TRL
    ``off_policy_mask_threshold=delta``): keep where ``A >= 0`` or ``mean_t (log pi_behaviour - log pi) <= delta``.
    ``SequenceMask("k3", "mean", delta, "all")`` is the keep-test of ``atr_theory.methods.sequence.atr_seq`` (which
    freezes instead of dropping)."""

    estimator: str = "k1"
    reduction: str = "mean"
    threshold: float = 0.0
    advantages: str = "negative"
    lower: float = -math.inf

    def __post_init__(self):
        _check_choice("SequenceMask", "estimator", self.estimator, tuple(sorted(_ESTIMATORS)))
        _check_choice("SequenceMask", "reduction", self.reduction, _REDUCTIONS)
        _check_choice("SequenceMask", "advantages", self.advantages, _WHICH)
        for name in ("threshold", "lower"):
            t = getattr(self, name)
            if isinstance(t, bool) or not isinstance(t, (int, float)) or t != t:
                raise ValueError(f"SequenceMask {name} must be a real number, got {t!r}")
        if self.lower > self.threshold:
            raise ValueError(f"SequenceMask lower {self.lower!r} must be <= threshold {self.threshold!r}")
        if self.estimator in _NON_NEGATIVE and self.threshold < 0:
            raise ValueError(
                f"SequenceMask threshold {self.threshold!r} is below 0, but {self.estimator} is >= 0 on every token: "
                "the mask would drop every sequence it tests; a threshold is >= 0 for k2 and k3"
            )


def sequence_mask_keep(
    log_ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, spec: SequenceMask
) -> torch.Tensor:
    r"""Which tokens ``SequenceMask`` ``spec`` keeps: (B, 1) bool per sequence, or (B, T) for
    ``reduction="token"`` or when ``spec.advantages == "negative"`` and ``advantages`` is (B, T) (a token with ``A_t >= 0`` is kept, as in TRL).
    ``log_ratio`` = ``log pi - log pi_behaviour`` per token (NaN counts as 0: a token the behaviour policy could not
    score gives no evidence, as in TRL; ``policy_loss`` refuses NaN in ``behaviour_logp`` before it gets here unless
    ``validate=False``). No gradient."""
    with torch.no_grad():
        m = mask.bool()
        y = torch.where(m, torch.nan_to_num(log_ratio.detach(), nan=0.0), 0.0)
        k = _ESTIMATORS[spec.estimator](y)
        if spec.reduction == "token":
            seq = k
        elif spec.reduction == "max":
            seq = torch.where(m, k, -torch.inf).amax(-1, keepdim=True)
        else:
            seq = k.sum(-1, keepdim=True)
            if spec.reduction == "mean":
                seq = seq / m.sum(-1, keepdim=True).clamp(min=1)
        keep = (seq <= spec.threshold) & (seq >= spec.lower)
        if spec.advantages == "negative":
            keep = keep | (advantages >= 0)
        return keep


def check_top_entropy_quantile(value) -> float:
    """``value`` if it is a real number in [0, 1] (not a bool: ``True`` would read as 1), else ValueError naming
    ``top_entropy_quantile`` and the value."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value <= 1.0:
        raise ValueError(f"top_entropy_quantile must be in [0, 1], got {value!r} (a real number, not a bool)")
    return value


def high_entropy_mask(entropies: torch.Tensor, mask: torch.Tensor, top_quantile: float) -> torch.Tensor:
    r"""(B, T) bool: valid tokens whose entropy is ``>=`` the ``1 - top_quantile`` quantile (linear interpolation,
    ``torch.quantile``) of the valid tokens' entropies (Wang et al. 2025; TRL ``top_entropy_quantile``, one
    process). ``top_quantile = 1`` keeps every valid token; ``0`` keeps the highest (and its ties).
    A NaN among the valid entropies makes the threshold NaN and drops every token, as in TRL: ``policy_loss``
    refuses it first (``validate=True``)."""
    check_top_entropy_quantile(top_quantile)
    m = mask.bool()
    valid = entropies.detach()[m]
    # the quantile in float32 (TRL's), or float64 for float64 entropies: a float32 quantile of float64 values can round
    # above the largest and keep no token at all
    valid = valid if valid.dtype == torch.float64 else valid.float()
    if valid.numel() == 0:
        return torch.zeros_like(m)
    threshold = torch.quantile(valid, 1.0 - top_quantile)
    return (entropies.detach() * m >= threshold) & m


_IS_LEVELS = ("token", "sequence", "geometric")
_IS_MODES = ("truncate", "mask")


@dataclass(frozen=True)
class RolloutCorrection:
    r"""Importance weights for the rollout-training mismatch, ``rho = pi_proximal / pi_behaviour`` (detached), that
    multiply every token's objective.

    ``level``: ``"token"`` (``rho_t``), ``"sequence"`` (``prod_t rho_t``, verl ``rollout_is="sequence"``) or
    ``"geometric"`` (``exp(mean_t log rho_t)``, the geometric mean per token). ``mode``: ``"truncate"``
    (``min(rho, upper)``: truncated IS, Ionides 2008; Yao et al. 2025's TIS; verl ``rollout_is_threshold=upper``) or
    ``"mask"`` (``rho`` inside ``[lower, upper]``, else 0: IcePop / masked IS; verl ``rollout_is_threshold=
    "lower_upper"``; ``lower`` defaults to ``1 / upper``). ``batch_normalize``: divide by the mean weight over valid
    tokens (token level) or over sequences (verl ``rollout_is_batch_normalize``).

    Which ratio: with ``behaviour_logp`` given to ``atr_theory.policy_loss``, ``rho = pi_old / pi_behaviour``
    (verl's decoupled mode: the rule's own ratio ``pi / pi_old`` does the trust region); without it, ``old_logp``
    *is* the behaviour policy and ``rho = sg[pi] / pi_old`` (verl's bypass mode)."""

    level: str = "token"
    mode: str = "truncate"
    upper: float = 2.0
    lower: float | None = None
    batch_normalize: bool = False

    def __post_init__(self):
        _check_choice("RolloutCorrection", "level", self.level, _IS_LEVELS)
        _check_choice("RolloutCorrection", "mode", self.mode, _IS_MODES)
        for name in ("upper", "lower"):
            v = getattr(self, name)
            if v is None and name == "lower":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 < v < math.inf):
                raise ValueError(f"RolloutCorrection {name} must be a finite number > 0, got {v!r}")
        if self.lower is not None and self.mode == "truncate":
            raise ValueError("RolloutCorrection lower is used by mode='mask' only (truncation has no lower bound)")
        if self.lower is not None and self.lower > self.upper:
            raise ValueError(f"RolloutCorrection lower {self.lower!r} must be <= upper {self.upper!r}")


def rollout_correction_weights(log_rho: torch.Tensor, mask: torch.Tensor, spec: RolloutCorrection) -> torch.Tensor:
    r"""(B, T) detached weights of ``RolloutCorrection`` ``spec`` from ``log_rho = log pi_proximal - log
    pi_behaviour`` per token, 0 on padding. Bounds are compared in log space (no overflow for any ``log_rho``).
    A NaN ``log_rho`` counts as 0, as in ``sequence_mask_keep``; ``policy_loss`` refuses NaN in ``behaviour_logp``
    before it gets here unless ``validate=False``."""
    with torch.no_grad():
        m = mask.bool()
        y = torch.where(m, torch.nan_to_num(log_rho.detach(), nan=0.0), 0.0)  # NaN: no evidence, as in SequenceMask
        if spec.level == "token":
            log_w = y
        else:
            log_w = y.sum(-1, keepdim=True)
            if spec.level == "geometric":
                log_w = log_w / m.sum(-1, keepdim=True).clamp(min=1)
            log_w = log_w.expand_as(y)
        log_upper = math.log(spec.upper)
        if spec.mode == "truncate":
            weights = torch.exp(torch.clamp(log_w, max=log_upper))
        else:
            log_lower = -log_upper if spec.lower is None else math.log(spec.lower)
            inside = (log_w >= log_lower) & (log_w <= log_upper)
            weights = torch.where(inside, torch.exp(torch.clamp(log_w, max=log_upper)), 0.0)
        weights = torch.where(m, weights, 0.0)
        if spec.batch_normalize:
            if spec.level == "token":
                mean = weights.sum() / m.sum().clamp(min=1)
            else:
                rows = m.any(-1)
                per_sequence = weights.sum(-1) / m.sum(-1).clamp(min=1)
                mean = per_sequence[rows].sum() / rows.sum().clamp(min=1)
            weights = torch.where(mean > 1e-8, weights / mean, weights)
        return weights
