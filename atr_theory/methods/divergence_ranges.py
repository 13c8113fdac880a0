r"""Rules that keep ``w`` in a range: PPO's clip and its variants (Clip-Higher, dual clip, DCPO, TRGPPO) and the
divergence bounds of the paper's framework (ATR's ``k3 <= delta``, ``k1``, ``k2``, ``is_kl3``), each in both forms
(``form="min"``: the Section 2 surrogate, PPO's min; ``form="mask"``: the Section 4 pure clip)."""

from __future__ import annotations

import torch

from .. import ranges, token_bounds
from ..registry import MethodResult, TokenBatch, register
from . import _reference as plain
from ._params import DELTA, DUAL_CLIP_C, EPSILON, EPSILON_HIGH, EPSILON_LOW
from ._ratio import apply_dual_clip, clamp_objective, divergence_range_rule, mask_form_keep, ratio_objective


def _clip_range(epsilon: float) -> tuple[float, float]:
    """PPO's ratio range ``[1 - eps, 1 + eps]``."""
    return 1.0 - epsilon, 1.0 + epsilon


def _clip_higher_range(epsilon_low: float, epsilon_high: float) -> tuple[float, float]:
    """Clip-Higher's ratio range ``[1 - eps_low, 1 + eps_high]``."""
    return 1.0 - epsilon_low, 1.0 + epsilon_high


def clip_reference(logp, old_logp, advantages, mask, *, epsilon, form):
    """PPO / GRPO: keep ``w`` in ``[1 - eps, 1 + eps]``."""
    w, adv = plain.ratio_and_advantages(logp, old_logp, advantages, mask)
    if form == "min":
        return plain.ppo_min(w, adv, 1 - epsilon, 1 + epsilon)
    return plain.eq5_mask(w, adv, (w >= 1 - epsilon) & (w <= 1 + epsilon))


@register(
    "clip",
    reference_form=clip_reference,
    params={"epsilon": EPSILON},
    default_form="min",
    forms=("min", "mask"),
    reference="Schulman et al. 2017 (PPO); Shao et al. 2024 (GRPO); TRL loss_type grpo family",
    ratio_mask_gradient=True,
    ratio_range=_clip_range,
)
def clip(batch: TokenBatch, epsilon: float) -> MethodResult:
    r"""Symmetric ratio clipping, ``w in [1 - eps, 1 + eps]``."""
    return ratio_objective(batch, *_clip_range(epsilon))


def clip_higher_reference(logp, old_logp, advantages, mask, *, epsilon_low, epsilon_high, form):
    """DAPO's Clip-Higher: keep ``w`` in ``[1 - eps_low, 1 + eps_high]``."""
    w, adv = plain.ratio_and_advantages(logp, old_logp, advantages, mask)
    if form == "min":
        return plain.ppo_min(w, adv, 1 - epsilon_low, 1 + epsilon_high)
    return plain.eq5_mask(w, adv, (w >= 1 - epsilon_low) & (w <= 1 + epsilon_high))


@register(
    "clip_higher",
    reference_form=clip_higher_reference,
    params={"epsilon_low": EPSILON_LOW, "epsilon_high": EPSILON_HIGH},
    default_form="min",
    forms=("min", "mask"),
    reference="Yu et al. 2025 (DAPO), Clip-Higher; TRL epsilon_high",
    ratio_mask_gradient=True,
    ratio_range=_clip_higher_range,
)
def clip_higher(batch: TokenBatch, epsilon_low: float, epsilon_high: float) -> MethodResult:
    r"""Asymmetric ratio clipping, ``w in [1 - eps_low, 1 + eps_high]``."""
    return ratio_objective(batch, *_clip_higher_range(epsilon_low, epsilon_high))


def dual_clip_reference(logp, old_logp, advantages, mask, *, epsilon, dual_clip_c, form):
    """Dual-clip PPO (Ye et al. 2020): PPO clip, and for ``A < 0`` the objective is at least ``c A``."""
    w, adv = plain.ratio_and_advantages(logp, old_logp, advantages, mask)
    inner = clip_reference(logp, old_logp, advantages, mask, epsilon=epsilon, form=form)
    return torch.where(adv < 0, torch.maximum(inner, dual_clip_c * adv), inner)


@register(
    "dual_clip",
    verl_loss_mode="vanilla",
    reference_form=dual_clip_reference,
    params={"epsilon": EPSILON, "dual_clip_c": DUAL_CLIP_C},
    default_form="min",
    forms=("min", "mask"),
    reference="Ye et al. 2020 (dual-clip PPO); verl 'vanilla' policy loss with clip_ratio_c",
    ratio_mask_gradient=True,
)
def dual_clip(batch: TokenBatch, epsilon: float, dual_clip_c: float) -> MethodResult:
    r"""PPO clip, and for ``A < 0`` the objective ``max(min(wA, clip(w)A), c A)``: the loss is capped at ``-c A``."""
    if batch.form == "min":
        return ratio_objective(batch, 1.0 - epsilon, 1.0 + epsilon, negative_cap=dual_clip_c)
    return apply_dual_clip(ratio_objective(batch, 1.0 - epsilon, 1.0 + epsilon), batch.advantages, dual_clip_c)


def dual_clip_higher_reference(logp, old_logp, advantages, mask, *, epsilon_low, epsilon_high, dual_clip_c, form):
    """Clip-Higher's range with the dual clip: for ``A < 0`` the objective is at least ``c A``."""
    w, adv = plain.ratio_and_advantages(logp, old_logp, advantages, mask)
    inner = clip_higher_reference(
        logp, old_logp, advantages, mask, epsilon_low=epsilon_low, epsilon_high=epsilon_high, form=form
    )
    return torch.where(adv < 0, torch.maximum(inner, dual_clip_c * adv), inner)


@register(
    "dual_clip_higher",
    verl_loss_mode="vanilla",
    reference_form=dual_clip_higher_reference,
    params={"epsilon_low": EPSILON_LOW, "epsilon_high": EPSILON_HIGH, "dual_clip_c": DUAL_CLIP_C},
    default_form="min",
    forms=("min", "mask"),
    reference="Ye et al. 2020 (dual clip) with DAPO's asymmetric range; TRL delta with epsilon_high (INTELLECT-2's "
    "two-sided clipping)",
    ratio_mask_gradient=True,
)
def dual_clip_higher(batch: TokenBatch, epsilon_low: float, epsilon_high: float, dual_clip_c: float) -> MethodResult:
    r"""Clip-Higher's range ``[1 - eps_low, 1 + eps_high]``, and for ``A < 0`` the objective is at least ``c A``.

    TRL's ``delta`` is this rule: ``min(min(w, delta) A, clip(w) A)`` equals it with ``c = delta`` when
    ``delta >= 1 + eps_high`` (and with ``eps_high = delta - 1``, ``c = 1 + eps_high`` below that)."""
    lower, upper = 1.0 - epsilon_low, 1.0 + epsilon_high
    if batch.form == "min":
        return ratio_objective(batch, lower, upper, negative_cap=dual_clip_c)
    return apply_dual_clip(ratio_objective(batch, lower, upper), batch.advantages, dual_clip_c)


@register(
    "dcpo",
    params={
        "epsilon_low": EPSILON_LOW.with_default(0.16),
        "epsilon_high": EPSILON_HIGH.with_default(0.2),
        "dual_clip_c": DUAL_CLIP_C,
    },
    default_form="min",
    forms=("min", "mask"),
    reference="Yang et al. 2025 (DCPO, arXiv 2509.02333); lime-RL/DCPO clip_type='dynamic'",
    ratio_mask_gradient=True,
)
def dcpo(batch: TokenBatch, epsilon_low: float, epsilon_high: float, dual_clip_c: float) -> MethodResult:
    r"""Dynamic clipping: per-token ``[l(p), u(p)]`` of ``atr_theory.ranges.dcpo_clip_range`` with
    ``p = pi_old(token)``, ``u`` capped at ``max(c, 10)``, then the dual clip with ``c`` (as in the source)."""
    cap = max(dual_clip_c, 10.0)

    def full_range() -> tuple[torch.Tensor, torch.Tensor]:
        return ranges.dcpo_clip_range_from_log(batch.old_logp.detach(), epsilon_low, epsilon_high, cap)

    if batch.form == "min":
        bound = token_bounds.dcpo_bound_by_sign(batch.old_logp, batch.advantages, epsilon_low, epsilon_high, cap)

        def mask_form_kept() -> torch.Tensor:
            return mask_form_keep(torch.exp(batch.log_ratio), batch.advantages, *full_range(), None, dual_clip_c)

        return ratio_objective(batch, bound, bound, negative_cap=dual_clip_c, mask_form_kept=mask_form_kept)
    return apply_dual_clip(ratio_objective(batch, *full_range()), batch.advantages, dual_clip_c)


@register(
    "trgppo",
    params={"delta": DELTA, "epsilon": EPSILON},
    default_form="min",
    forms=("min", "mask"),
    reference="Wang et al. 2019 (TRGPPO), wangyuhuix/TRGPPO; paper Table 1 'Full KL-guided clipping'",
    ratio_mask_gradient=True,
)
def trgppo(batch: TokenBatch, delta: float, epsilon: float) -> MethodResult:
    r"""Per-token range ``[min(l_KL(p), 1-eps), max(u_KL(p), 1+eps)]`` where ``l_KL, u_KL`` are the
    extreme ratios with binary ``KL(p || p w) <= delta``, ``p = pi_old(token)``.

    float32 (and lower) batches read the bounds from a table (``atr_theory.token_bounds.trgppo_kl_range_table``, float32
    accurate; in the ``min`` form only the bound the advantage's sign selects, as in
    ``atr_theory.token_bounds.trgppo_bound_by_sign``); float64 batches solve for them by Newton in float64
    (``atr_theory.ranges.trgppo_kl_log_range_torch``)."""
    y = batch.log_ratio
    if y.dtype != torch.float64 and batch.form == "min":
        negative = token_bounds._sign_mask(batch.advantages.detach())
        lo, hi = token_bounds._trgppo_sided_bounds(batch.old_logp, negative, delta, epsilon)
        w = torch.exp(y)
        return clamp_objective(
            batch, w, lo, hi, mask_form_kept=lambda: mask_form_keep(w, batch.advantages, *_trgppo_range(batch, delta, epsilon))
        )
    return ratio_objective(batch, *_trgppo_range(batch, delta, epsilon))


def _trgppo_range(batch: TokenBatch, delta: float, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """TRGPPO's per-token ratio range ``[min(l_KL(p), 1-eps), max(u_KL(p), 1+eps)]`` in the batch's dtype."""
    y = batch.log_ratio
    if y.dtype == torch.float64:
        p_old = torch.exp(batch.old_logp.detach()).clamp(min=1e-300, max=1.0)
        y_lo, y_hi = ranges.trgppo_kl_log_range_torch(p_old, delta)
        lower_kl, upper_kl = torch.exp(y_lo), torch.exp(y_hi)
    else:
        lower_kl, upper_kl = token_bounds.trgppo_kl_range_table(batch.old_logp, delta)
    return torch.clamp(lower_kl, max=1.0 - epsilon).to(y.dtype), torch.clamp(upper_kl, min=1.0 + epsilon).to(y.dtype)


def atr_reference(logp, old_logp, advantages, mask, *, delta, form):
    """ATR-GRPO (this paper): keep ``w A`` while ``k3 = w - 1 - log w <= delta``."""
    return plain.divergence_rule(lambda w: w - 1 - torch.log(w), logp, old_logp, advantages, mask, delta, form)


@register(
    "atr",
    reference_form=atr_reference,
    params={"delta": DELTA},
    default_form="min",
    forms=("min", "mask"),
    reference="this paper: ATR-GRPO, Eq. 5 with C = KL3 <= delta inside PPO's min (Sec. 2; form='mask': Sec. 4's "
    "pure clip); Thm 3.2",
    aliases=("kl3",),
    ratio_mask_gradient=True,
    ratio_range=ranges.kl3_clip_range,
)
def atr(batch: TokenBatch, delta: float) -> MethodResult:
    r"""ATR-based clipping: the general clip operator (paper Eq. 5) with ``C = k3 = w - 1 - log w <= delta``.

    Min form (the default; the Section 2 surrogate, what the paper's TRL experiments ran): the operator inside PPO's
    min, whose gradient is PPO's with the equivalent range ``[l, u] = kl3_clip_range(delta)`` (Thm 3.1 under the
    min-vs-min pairing, Thm 3.2): ``clip_higher`` with ``(1 - l, u - 1)``, the same loss and gradient.
    Mask form (the Section 4 pure-clip objective): ``k3(y) <= delta`` with ``y = log w``; ``k3(y) = e^y - 1 - y`` falls on ``y < 0`` and rises on ``y > 0``,
    so the constraint holds exactly between its two roots (the ``log`` of the Lambert-W range of Thm 3.2): decided
    by ``within_divergence_bound``, exactly for every representable ``y``: ``w A`` there, else the constant ``A``.
    """
    return divergence_range_rule(batch, "kl3", delta)


def kl1_reference(logp, old_logp, advantages, mask, *, delta, form):
    """Keep ``w A`` while ``k1 = -log w <= delta`` (one-sided: no upper limit)."""
    return plain.divergence_rule(lambda w: -torch.log(w), logp, old_logp, advantages, mask, delta, form)


@register(
    "kl1",
    reference_form=kl1_reference,
    params={"delta": DELTA},
    default_form="min",
    forms=("min", "mask"),
    reference="Schulman 2020, 'Approximating KL Divergence' (k1); paper Table 3",
    ratio_mask_gradient=True,
    ratio_range=ranges.kl1_clip_range,
)
def kl1(batch: TokenBatch, delta: float) -> MethodResult:
    r"""Constraint ``k1 = -log w <= delta``: its ratio range inside PPO's min (default), or ``w A`` where it holds.

    Our reading of the paper's loosely defined "KL1": the signed estimator, so the constraint is
    **one-sided** (``w >= e^{-delta}``, no upper limit). A symmetric ``|log w| <= delta`` variant is
    what ``kl2`` gives with ``delta -> delta^2/2``.
    """
    return divergence_range_rule(batch, "kl1", delta)


def kl2_reference(logp, old_logp, advantages, mask, *, delta, form):
    """Keep ``w A`` while ``k2 = (log w)^2 / 2 <= delta``."""
    return plain.divergence_rule(lambda w: torch.log(w) ** 2 / 2, logp, old_logp, advantages, mask, delta, form)


@register(
    "kl2",
    reference_form=kl2_reference,
    params={"delta": DELTA},
    default_form="min",
    forms=("min", "mask"),
    reference="Schulman 2020, 'Approximating KL Divergence' (k2); paper Table 3",
    ratio_mask_gradient=True,
    ratio_range=ranges.kl2_clip_range,
)
def kl2(batch: TokenBatch, delta: float) -> MethodResult:
    r"""Constraint ``k2 = (log w)^2 / 2 <= delta`` (symmetric in ``log w``): its ratio range inside PPO's min
    (default), or ``w A`` where it holds."""
    return divergence_range_rule(batch, "kl2", delta)


def is_kl3_reference(logp, old_logp, advantages, mask, *, delta, form):
    """Keep ``w A`` while the importance-weighted ``w k3(1/w) = 1 - w + w log w <= delta``."""
    return plain.divergence_rule(lambda w: 1 - w + w * torch.log(w), logp, old_logp, advantages, mask, delta, form)


@register(
    "is_kl3",
    reference_form=is_kl3_reference,
    params={"delta": DELTA},
    default_form="min",
    forms=("min", "mask"),
    reference="paper Table 3 'IS-weighted KL3'; derivation in atr_theory.ranges.is_kl3_clip_range",
    ratio_mask_gradient=True,
    ratio_range=ranges.is_kl3_clip_range,
)
def is_kl3(batch: TokenBatch, delta: float) -> MethodResult:
    r"""Constraint ``w k3(1/w) = 1 - w + w log w <= delta``: its ratio range inside PPO's min (default), or ``w A``
    where it holds.

    Our reading: importance-weighting k3 of the *reverse* ratio gives an unbiased, non-negative
    estimate of ``KL(pi || pi_old)`` from ``pi_old`` samples (``E_old[w log w - w + 1] = KL(pi||pi_old)``).
    Compared with KL3 its range is shifted down (lower ``l`` and lower ``u``, e.g. [0.650, 1.397] at
    delta = 0.07 against [0.671, 1.422]): it tolerates larger decreases and fewer increases of pi.
    """
    return divergence_range_rule(batch, "is_kl3", delta)
