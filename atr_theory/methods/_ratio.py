r"""The fast path's building blocks for rules with a ratio range: the range of ``log w`` where a divergence bound
holds (``within_divergence_bound``, decided once per delta and dtype), ``ratio_objective`` (PPO's min or Eq. 5's
mask over a range), the dual clip, and the boolean helpers that ``torch.compile`` can trace. Not a family module:
it registers no rule (``atr_theory.methods`` imports only the modules whose names do not start with ``_``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import torch

from .. import ranges, token_bounds
from ..registry import MethodResult, TokenBatch

_RANGES = {
    "kl3": ranges.kl3_clip_range,
    "kl1": ranges.kl1_clip_range,
    "kl2": ranges.kl2_clip_range,
    "is_kl3": ranges.is_kl3_clip_range,
}


def mask_and(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a & b`` of two bool tensors; under ``torch.compile`` as ``torch.where(a, b, False)`` (the same values).

    Why: Inductor's CPU code (torch 2.13) combines two masks of float64 comparisons with ``&`` / ``|`` by converting
    each 16-lane double mask to int32 lane by lane: ~10x slower than the comparisons themselves (1,024 x 1,000
    float64: ``where(x >= a & x <= b, y, 0)`` 510 M elem/s, ``where(where(x >= a, x <= b, False), y, 0)``
    4,500 M elem/s; float32 12,000 either way; ``python -m experiments.investigations.inductor_mask_and`` measures it again, e.g.
    after a torch upgrade). Eager keeps ``&``, which is faster there than ``where``."""
    return torch.where(a, b, False) if torch.compiler.is_compiling() else a & b


def _or(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a | b`` of two bool tensors; under ``torch.compile`` as ``torch.where(a, True, b)`` (see ``mask_and``)."""
    return torch.where(a, True, b) if torch.compiler.is_compiling() else a | b


def mask_and_not(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a & ~b`` of two bool tensors; under ``torch.compile`` as ``torch.where(b, False, a)`` (see ``mask_and``)."""
    return torch.where(b, False, a) if torch.compiler.is_compiling() else a & ~b


@torch.compiler.assume_constant_result
def _constant_range(kind: str, delta: float) -> tuple[float, float]:
    """``ranges.<kind>_clip_range(delta)`` for a Python float, once per (kind, delta) (cached: an eager training
    step does no Lambert-W or root finding); a constant to ``torch.compile`` (it runs at trace time, not traced)."""
    return _constant_range_cached(kind, float(delta))


@lru_cache(maxsize=256)
def _constant_range_cached(kind: str, delta: float) -> tuple[float, float]:
    return _RANGES[kind](delta)


@torch.compiler.assume_constant_result
def _log_range_for(kind: str, delta: float, dtype: torch.dtype) -> tuple[float, float]:
    """``atr_theory.ranges.log_range_of_dtype``, once per (kind, delta, dtype) (cached); a constant to
    ``torch.compile``, like ``_constant_range``."""
    return _log_range_cached(kind, float(delta), dtype)


@lru_cache(maxsize=256)
def _log_range_cached(kind: str, delta: float, dtype: torch.dtype) -> tuple[float, float]:
    return ranges.log_range_of_dtype(kind, delta, dtype)


def within_divergence_bound(log_ratio: torch.Tensor, kind: str, delta: float) -> torch.Tensor:
    """``divergence_kind(log w) <= delta`` per token, for a per-token divergence whose constraint is an interval of
    ``log w`` (``atr_theory.ranges.LOG_RANGE_KINDS``: kl1, kl2, kl3, is_kl3), decided as ``lo <= log w <= hi``
    with the extreme values of ``log w``'s dtype that satisfy it exactly (``atr_theory.ranges.log_range_of_dtype``;
    half precision is compared in float32, which holds it exactly): the decision of exact arithmetic for every
    representable ``log w`` (``tests/test_ranges.py``, against mpmath), in two comparisons, without gradient.

    Evaluating the divergence per token instead (this package until 2026-11-26; the paper's Sec. 3.2 remark that
    the ranges need not be computed) left tokens within its rounding of the bound to that rounding (kl3 in float32:
    ~2 ulp, one token in 158,971 in ``benchmarks/loss_overhead.py``'s batch decided differently by a CPU and a
    GPU) and cost an ``expm1`` (and, in float64, a 17-term series) per token for kl3 and is_kl3."""
    with torch.no_grad():
        y = log_ratio if log_ratio.dtype in (torch.float32, torch.float64) else log_ratio.float()
        lo, hi = _log_range_for(kind, delta, y.dtype)
        return mask_and(y >= lo, y <= hi)


def divergence_range_rule(batch: TokenBatch, kind: str, delta: float) -> MethodResult:
    """A per-token divergence rule (``kind`` of ``atr_theory.ranges.LOG_RANGE_KINDS``): in the mask form ``w A``
    where ``within_divergence_bound`` holds, in the min form PPO's min with the equivalent ratio range."""
    lower, upper = _constant_range(kind, delta)
    if batch.form == "mask":
        return ratio_objective(batch, lower, upper, within_divergence_bound(batch.log_ratio, kind, delta))
    return ratio_objective(
        batch, lower, upper, mask_form_kept=lambda: within_divergence_bound(batch.log_ratio, kind, delta)
    )


def _bound_tensor(bound: float | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(bound, dtype=like.dtype, device=like.device)


def ratio_objective(
    batch: TokenBatch,
    lower: float | torch.Tensor,
    upper: float | torch.Tensor,
    constraint: torch.Tensor | None = None,
    negative_cap: float = math.inf,
    mask_form_kept: Callable[[], torch.Tensor] | None = None,
) -> MethodResult:
    r"""Objective of a ratio-range rule ``[lower, upper]`` in ``batch.form``.

    * ``"min"`` (PPO, Schulman 2017): ``min(w A, clip(w, l, u) A)``, computed as ``A clamp(w, lo, hi)`` with
      ``(lo, hi) = (-inf, u)`` where ``A > 0`` and ``(l, negative_cap)`` where ``A < 0`` (the sign bit decides; at
      ``A = 0`` the objective is 0 either way): for ``A > 0`` PPO's min is ``min(w, u) A``, for ``A < 0`` it is
      ``max(w, l) A``. The same values bit for bit and the same gradient, ties ``w = l`` or ``u`` included (clamp
      passes the gradient at its ends as PPO's clip does), in one clamp instead of a clamp, two products and a
      minimum (~0.6x the time on CPU). ``negative_cap = c`` is the dual clip (Ye et al. 2020; verl
      ``clip_ratio_c``): for ``A < 0`` the objective is at least ``c A``; needs ``c >= l``.
    * ``"mask"`` (the Section 4 pure-clip objective: Eq. 5's operator alone): ``w A`` where ``constraint`` holds
      (default ``l <= w <= u``), else the constant ``w_old A = A``: zero gradient, finite value. (``negative_cap`` is
      not read: see ``apply_dual_clip``.)

    ``lower``/``upper`` are floats or (B, T) tensors (per-token ranges: DCPO, TRGPPO); since a token's sign picks
    one of them, a per-token bound computed only for that sign (``atr_theory.token_bounds.dcpo_bound_by_sign``) can be
    passed as both; such a caller passes ``mask_form_kept`` too (the min form's result says, when asked, which
    tokens the mask form would keep: by default ``mask_form_keep`` of these bounds, the dual clip included).
    """
    y, adv = batch.log_ratio, batch.advantages
    # log w is clamped to +-LOG_RATIO_CLAMP upstream, so w = exp(y) is finite in float32 and a masked
    # token's zero gradient stays 0 (never 0 * inf)
    w = torch.exp(y)
    if batch.form == "mask":
        if constraint is None:
            with torch.no_grad():
                constraint = mask_and(w >= lower, w <= upper)
        keep = constraint
        objective = torch.where(keep, w * adv, adv)
        return MethodResult(objective, lambda: range_flags(w, y, adv, lower, upper, "mask", keep), lambda: keep)
    if mask_form_kept is None:

        def mask_form_kept() -> torch.Tensor:
            return mask_form_keep(w, adv, lower, upper, constraint, negative_cap)

    bounds = bounds_by_sign(adv, lower, upper, negative_cap, y.dtype)
    return clamp_objective(batch, w, *bounds, negative_cap, mask_form_kept)


def mask_form_keep(
    w: torch.Tensor,
    adv: torch.Tensor,
    lower: float | torch.Tensor,
    upper: float | torch.Tensor,
    constraint: torch.Tensor | None = None,
    negative_cap: float = math.inf,
) -> torch.Tensor:
    """The tokens ``ratio_objective``'s mask form keeps: ``constraint`` (default ``lower <= w <= upper``), less
    those the dual clip with ``negative_cap`` caps (``apply_dual_clip``), computed as that form computes them, from
    the same tensors. No gradient."""
    with torch.no_grad():
        w = w.detach()
        keep = constraint if constraint is not None else mask_and(w >= lower, w <= upper)
        if negative_cap == math.inf:
            return keep
        return mask_and_not(keep, dual_clip_capped(torch.where(keep, w * adv, adv), adv, negative_cap)[0])


def clamp_objective(
    batch: TokenBatch,
    w,
    lo: torch.Tensor,
    hi: torch.Tensor,
    negative_cap: float = math.inf,
    mask_form_kept: Callable[[], torch.Tensor] | None = None,
):
    """``A clamp(w, lo, hi)``: ``ratio_objective``'s min form once its per-token bounds are chosen by sign;
    ``mask_form_kept`` is passed on to the result (``MethodResult.mask_form_kept``)."""
    objective = torch.clamp(w, lo, hi) * batch.advantages

    def flags():
        return range_flags(w, batch.log_ratio, batch.advantages, lo, hi, "min", negative_cap=negative_cap)

    return MethodResult(objective, flags, mask_form_kept)


def bounds_by_sign(adv: torch.Tensor, lower, upper, negative_cap: float, dtype: torch.dtype):
    """``(lo, hi)`` of ``ratio_objective``'s min form: ``(lower, negative_cap)`` where the sign bit of ``adv`` is
    set, ``(-inf, upper)`` elsewhere, as ``dtype`` tensors (bit selects for float32/float64, else ``torch.where``)."""
    if adv.dtype == dtype and dtype in (torch.float32, torch.float64):
        negative = token_bounds._sign_mask(adv.detach())
        lo = token_bounds._select_by_sign(negative, lower, -math.inf, dtype)
        return lo, token_bounds._select_by_sign(negative, negative_cap, upper, dtype)
    negative = torch.signbit(adv.detach())
    inf = _bound_tensor(math.inf, adv.to(dtype))
    lo = torch.where(negative, _bound_tensor(lower, inf), -inf)
    return lo, torch.where(negative, _bound_tensor(negative_cap, inf), _bound_tensor(upper, inf))


def range_flags(w, y, adv, lower, upper, form: str, constraint=None, negative_cap: float = math.inf):
    """``(kept, clipped_low, clipped_high)`` of the range ``[lower, upper]`` in ``form``: in the mask form a token is
    kept where ``constraint`` (default ``lower <= w <= upper``) holds, clipped low or high by the sign of ``log w``;
    in the min form it is clipped low where ``w < lower`` and ``A < 0``, high where ``w > upper`` and ``A > 0`` or
    ``w > negative_cap`` and ``A < 0`` (the objective is then a constant)."""
    if form == "mask":
        keep = constraint if constraint is not None else mask_and(w >= lower, w <= upper)
        return keep, mask_and_not(y < 0, keep), mask_and_not(y > 0, keep)
    low = mask_and(w < lower, adv < 0)
    high = mask_and(w > upper, adv > 0)
    if negative_cap != math.inf:
        high = _or(high, mask_and(w > negative_cap, adv < 0))
    return ~_or(low, high), low, high


def apply_dual_clip(result: MethodResult, adv: torch.Tensor, c: float) -> MethodResult:
    """Dual clip (Ye et al. 2020; verl ``clip_ratio_c``) of a mask-form objective: for ``A < 0`` it is at least
    ``c A`` (the min form takes it inside its clamp: ``ratio_objective(..., negative_cap=c)``).

    The floor is ``c min(A, 0)``: where ``A >= 0`` it is 0, and a ratio-range objective is ``>= 0`` there (``w``,
    ``l``, ``u`` are), so one comparison finds the capped tokens (no ``A < 0`` mask; ``torch.maximum`` would be
    simpler but its backward costs more than ``where``'s on CPU)."""
    capped, floor = dual_clip_capped(result.objective, adv, c)
    objective = torch.where(capped, floor, result.objective)

    def flags():  # from result.flags(), not its cached .kept, whose lock torch.compile cannot trace
        kept, low, high = result.flags()
        return mask_and_not(kept, capped), low, _or(high, capped)

    def mask_form_kept() -> torch.Tensor:
        return mask_and_not(result.mask_form_kept(), capped)

    return MethodResult(objective, flags, mask_form_kept if result.mask_form_kept is not None else None)


def dual_clip_capped(objective: torch.Tensor, adv: torch.Tensor, c: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(capped, floor)`` of the dual clip (Ye et al. 2020) on a mask-form ``objective``: ``floor = c min(A, 0)``
    and ``capped = objective < floor`` (both without gradient)."""
    floor = adv.detach().clamp(max=0.0).mul_(c)
    return objective.detach() < floor, floor
