r"""The registry of clipping methods: one small function per rule, one shared signature.

Every method receives a ``TokenBatch`` (log-ratios, advantages, mask, ... as torch tensors)
and its own parameters, and returns a ``MethodResult``: the per-token objective to *maximise*
and boolean tensors saying which tokens kept their gradient and which were clipped low / high.

The paper can be read two ways (``registry.READINGS``, ``docs/theory.md``), and every rule with a ratio range has
both: ``form="min"``, the Section 2 surrogate (the general clip inside PPO's min, ``min(w A, clip(w, l, u) A)``, the
default of every such rule: what its source trains, and what the paper's TRL experiments ran), and ``form="mask"``,
the Section 4 pure-clip objective (keep ``w A`` where the constraint holds, else the constant ``w_old A = A``).
The constraint in the mask form is the divergence itself (``k3 <= delta`` for atr), decided for kl1, kl2, kl3 and
is_kl3 as the interval of ``log w`` where it holds in exact arithmetic (``within_divergence_bound``: bounds
found from the Lambert-W / closed-form roots and corrected against the definition in mpmath, once per delta and
dtype). Tests check those decisions against mpmath's divergence at the bounds, and Thm 3.2's equivalence of the
constraint and the ratio range separately (``theorems``), rather than assume either.

Adding a rule: write one function decorated with ``register`` (``atr_theory.registry``); nothing else changes.
Each rule's formula on one screen, without the fast path's helpers: ``atr_theory.reference``.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from . import ranges
from .divergence import full_kl
from .registry import (  # noqa: F401  (re-exported: the registry is part of this module's API)
    FORM_DEFAULT_CHANGED,
    FORMER_MASK_DEFAULTS,
    FORMS,
    METHODS,
    READINGS,
    MethodResult,
    MethodSpec,
    Param,
    Relation,
    ResolvedMethod,
    TokenBatch,
    _no_clip,
    get_method,
    method_names,
    register,
    resolve,
    unregister,
)

__all__ = [
    "FORMS",
    "METHODS",
    "READINGS",
    "MethodResult",
    "MethodSpec",
    "Param",
    "Relation",
    "ResolvedMethod",
    "TokenBatch",
    "get_method",
    "method_names",
    "ratio_objective",
    "register",
    "resolve",
    "unregister",
    "within_divergence_bound",
]

# Parameters shared by several methods: declared here once, each method may change the default.
DELTA = Param(0.07, gt=0, help="divergence threshold delta: keep w while the divergence <= delta (paper Eq. 5)")
EPSILON = Param(0.2, ge=0, lt=1, help="PPO clip range: keep w in [1 - epsilon, 1 + epsilon]")
EPSILON_LOW = Param(0.2, ge=0, lt=1, help="lower clip range: keep w >= 1 - epsilon_low")
EPSILON_HIGH = Param(0.28, ge=0, help="upper clip range: keep w <= 1 + epsilon_high")
DUAL_CLIP_C = Param(3.0, gt=1, help="dual clip: for A < 0 the loss is at most -c A")
COV_RATIO = Param(2e-4, gt=0, le=1, help="fraction of valid tokens selected by the covariance rule")


# ----------------------------------------------------------------------------------------------
# Shared building blocks
# ----------------------------------------------------------------------------------------------
_RANGES = {
    "kl3": ranges.kl3_clip_range,
    "kl1": ranges.kl1_clip_range,
    "kl2": ranges.kl2_clip_range,
    "is_kl3": ranges.is_kl3_clip_range,
}


def _and(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a & b`` of two bool tensors; under ``torch.compile`` as ``torch.where(a, b, False)`` (the same values).

    Why: Inductor's CPU code (torch 2.13) combines two masks of float64 comparisons with ``&`` / ``|`` by converting
    each 16-lane double mask to int32 lane by lane: ~10x slower than the comparisons themselves (1,024 x 1,000
    float64: ``where(x >= a & x <= b, y, 0)`` 510 M elem/s, ``where(where(x >= a, x <= b, False), y, 0)``
    4,500 M elem/s; float32 12,000 either way; ``python -m experiments.investigations.inductor_mask_and`` measures it again, e.g.
    after a torch upgrade). Eager keeps ``&``, which is faster there than ``where``."""
    return torch.where(a, b, False) if torch.compiler.is_compiling() else a & b


def _or(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a | b`` of two bool tensors; under ``torch.compile`` as ``torch.where(a, True, b)`` (see ``_and``)."""
    return torch.where(a, True, b) if torch.compiler.is_compiling() else a | b


def _and_not(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a & ~b`` of two bool tensors; under ``torch.compile`` as ``torch.where(b, False, a)`` (see ``_and``)."""
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
        return _and(y >= lo, y <= hi)


def _divergence_rule(batch: TokenBatch, kind: str, delta: float) -> MethodResult:
    """A per-token divergence rule (``kind`` of ``atr_theory.ranges.LOG_RANGE_KINDS``): in the mask form ``w A``
    where ``within_divergence_bound`` holds, in the min form PPO's min with the equivalent ratio range."""
    lower, upper = _constant_range(kind, delta)
    constraint = within_divergence_bound(batch.log_ratio, kind, delta) if batch.form == "mask" else None
    return ratio_objective(batch, lower, upper, constraint)


def _bound_tensor(bound: float | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(bound, dtype=like.dtype, device=like.device)


def ratio_objective(
    batch: TokenBatch,
    lower: float | torch.Tensor,
    upper: float | torch.Tensor,
    constraint: torch.Tensor | None = None,
    negative_cap: float = math.inf,
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
      not read: see ``_dual_clip``.)

    ``lower``/``upper`` are floats or (B, T) tensors (per-token ranges: DCPO, TRGPPO); since a token's sign picks
    one of them, a per-token bound computed only for that sign (``atr_theory.ranges.dcpo_bound_by_sign``) can be
    passed as both.
    """
    y, adv = batch.log_ratio, batch.advantages
    # log w is clamped to +-LOG_RATIO_CLAMP upstream, so w = exp(y) is finite in float32 and a masked
    # token's zero gradient stays 0 (never 0 * inf)
    w = torch.exp(y)
    if batch.form == "mask":
        if constraint is None:
            with torch.no_grad():
                constraint = _and(w >= lower, w <= upper)
        keep = constraint
        objective = torch.where(keep, w * adv, adv)
        return MethodResult(objective, lambda: _range_flags(w, y, adv, lower, upper, "mask", keep))
    return _clamp_objective(batch, w, *_bounds_by_sign(adv, lower, upper, negative_cap, y.dtype), negative_cap)


def _clamp_objective(batch: TokenBatch, w, lo: torch.Tensor, hi: torch.Tensor, negative_cap: float = math.inf):
    """``A clamp(w, lo, hi)``: ``ratio_objective``'s min form once its per-token bounds are chosen by sign."""
    objective = torch.clamp(w, lo, hi) * batch.advantages

    def flags():
        return _range_flags(w, batch.log_ratio, batch.advantages, lo, hi, "min", negative_cap=negative_cap)

    return MethodResult(objective, flags)


def _bounds_by_sign(adv: torch.Tensor, lower, upper, negative_cap: float, dtype: torch.dtype):
    """``(lo, hi)`` of ``ratio_objective``'s min form: ``(lower, negative_cap)`` where the sign bit of ``adv`` is
    set, ``(-inf, upper)`` elsewhere, as ``dtype`` tensors (bit selects for float32/float64, else ``torch.where``)."""
    if adv.dtype == dtype and dtype in (torch.float32, torch.float64):
        negative = ranges._sign_mask(adv.detach())
        lo = ranges._select_by_sign(negative, lower, -math.inf, dtype)
        return lo, ranges._select_by_sign(negative, negative_cap, upper, dtype)
    negative = torch.signbit(adv.detach())
    inf = _bound_tensor(math.inf, adv.to(dtype))
    lo = torch.where(negative, _bound_tensor(lower, inf), -inf)
    return lo, torch.where(negative, _bound_tensor(negative_cap, inf), _bound_tensor(upper, inf))


def _range_flags(w, y, adv, lower, upper, form: str, constraint=None, negative_cap: float = math.inf):
    """``(kept, clipped_low, clipped_high)`` of the range ``[lower, upper]`` in ``form``: in the mask form a token is
    kept where ``constraint`` (default ``lower <= w <= upper``) holds, clipped low or high by the sign of ``log w``;
    in the min form it is clipped low where ``w < lower`` and ``A < 0``, high where ``w > upper`` and ``A > 0`` or
    ``w > negative_cap`` and ``A < 0`` (the objective is then a constant)."""
    if form == "mask":
        keep = constraint if constraint is not None else _and(w >= lower, w <= upper)
        return keep, _and_not(y < 0, keep), _and_not(y > 0, keep)
    low = _and(w < lower, adv < 0)
    high = _and(w > upper, adv > 0)
    if negative_cap != math.inf:
        high = _or(high, _and(w > negative_cap, adv < 0))
    return ~_or(low, high), low, high


def _dual_clip(result: MethodResult, adv: torch.Tensor, c: float) -> MethodResult:
    """Dual clip (Ye et al. 2020; verl ``clip_ratio_c``) of a mask-form objective: for ``A < 0`` it is at least
    ``c A`` (the min form takes it inside its clamp: ``ratio_objective(..., negative_cap=c)``).

    The floor is ``c min(A, 0)``: where ``A >= 0`` it is 0, and a ratio-range objective is ``>= 0`` there (``w``,
    ``l``, ``u`` are), so one comparison finds the capped tokens (no ``A < 0`` mask; ``torch.maximum`` would be
    simpler but its backward costs more than ``where``'s on CPU)."""
    floor = adv.detach().clamp(max=0.0).mul_(c)
    capped = result.objective.detach() < floor
    objective = torch.where(capped, floor, result.objective)

    def flags():  # from result.flags(), not its cached .kept, whose lock torch.compile cannot trace
        kept, low, high = result.flags()
        return _and_not(kept, capped), low, _or(high, capped)

    return MethodResult(objective, flags)


def _centred_cov(batch: TokenBatch, n_valid: torch.Tensor) -> torch.Tensor:
    """Per-token ``(A - mean A)(log pi - mean log pi)`` over valid tokens, detached (Cui et al. 2025). Both are zero
    on padding (``TokenBatch``), so their sums run over the valid tokens without a multiplication by the mask."""
    adv = batch.advantages.detach()
    logp = batch.logp.detach()
    n_valid = n_valid.clamp(min=1)
    return torch.sub(adv, adv.sum() / n_valid).mul_(logp - logp.sum() / n_valid)


def _top_k_indices(values: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` largest entries of the flat ``values``, largest first (``torch.topk``, sorted)."""
    return torch.topk(values, k).indices


# ----------------------------------------------------------------------------------------------
# Ratio-range methods
# ----------------------------------------------------------------------------------------------
@register(
    "clip",
    params={"epsilon": EPSILON},
    default_form="min",
    forms=("min", "mask"),
    reference="Schulman et al. 2017 (PPO); Shao et al. 2024 (GRPO); TRL loss_type grpo family",
    ratio_mask_gradient=True,
)
def clip(batch: TokenBatch, epsilon: float) -> MethodResult:
    r"""Symmetric ratio clipping, ``w in [1 - eps, 1 + eps]``."""
    return ratio_objective(batch, 1.0 - epsilon, 1.0 + epsilon)


@register(
    "clip_higher",
    params={"epsilon_low": EPSILON_LOW, "epsilon_high": EPSILON_HIGH},
    default_form="min",
    forms=("min", "mask"),
    reference="Yu et al. 2025 (DAPO), Clip-Higher; TRL epsilon_high",
    ratio_mask_gradient=True,
)
def clip_higher(batch: TokenBatch, epsilon_low: float, epsilon_high: float) -> MethodResult:
    r"""Asymmetric ratio clipping, ``w in [1 - eps_low, 1 + eps_high]``."""
    return ratio_objective(batch, 1.0 - epsilon_low, 1.0 + epsilon_high)


@register(
    "dual_clip",
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
    return _dual_clip(ratio_objective(batch, 1.0 - epsilon, 1.0 + epsilon), batch.advantages, dual_clip_c)


@register(
    "dual_clip_higher",
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
    return _dual_clip(ratio_objective(batch, lower, upper), batch.advantages, dual_clip_c)


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
    if batch.form == "min":
        bound = ranges.dcpo_bound_by_sign(batch.old_logp, batch.advantages, epsilon_low, epsilon_high, cap)
        return ratio_objective(batch, bound, bound, negative_cap=dual_clip_c)
    lower, upper = ranges.dcpo_clip_range_from_log(batch.old_logp.detach(), epsilon_low, epsilon_high, cap)
    return _dual_clip(ratio_objective(batch, lower, upper), batch.advantages, dual_clip_c)


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

    float32 (and lower) batches read the bounds from a table (``atr_theory.ranges.trgppo_kl_range_table``, float32
    accurate; in the ``min`` form only the bound the advantage's sign selects, as in
    ``atr_theory.ranges.trgppo_bound_by_sign``); float64 batches solve for them by Newton in float64
    (``atr_theory.ranges.trgppo_kl_log_range_torch``)."""
    y = batch.log_ratio
    if y.dtype != torch.float64 and batch.form == "min":
        negative = ranges._sign_mask(batch.advantages.detach())
        lo, hi = ranges._trgppo_sided_bounds(batch.old_logp, negative, delta, epsilon)
        return _clamp_objective(batch, torch.exp(y), lo, hi)
    if y.dtype == torch.float64:
        p_old = torch.exp(batch.old_logp.detach()).clamp(min=1e-300, max=1.0)
        y_lo, y_hi = ranges.trgppo_kl_log_range_torch(p_old, delta)
        lower_kl, upper_kl = torch.exp(y_lo), torch.exp(y_hi)
    else:
        lower_kl, upper_kl = ranges.trgppo_kl_range_table(batch.old_logp, delta)
    lower = torch.clamp(lower_kl, max=1.0 - epsilon).to(y.dtype)
    upper = torch.clamp(upper_kl, min=1.0 + epsilon).to(y.dtype)
    return ratio_objective(batch, lower, upper)


@register(
    "atr",
    params={"delta": DELTA},
    default_form="min",
    forms=("min", "mask"),
    reference="this paper: ATR-GRPO, Eq. 5 with C = KL3 <= delta inside PPO's min (Sec. 2; form='mask': Sec. 4's "
    "pure clip); Thm 3.2",
    aliases=("kl3",),
    ratio_mask_gradient=True,
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
    return _divergence_rule(batch, "kl3", delta)


@register(
    "kl1",
    params={"delta": DELTA},
    default_form="min",
    forms=("min", "mask"),
    reference="Schulman 2020, 'Approximating KL Divergence' (k1); paper Table 3",
    ratio_mask_gradient=True,
)
def kl1(batch: TokenBatch, delta: float) -> MethodResult:
    r"""Constraint ``k1 = -log w <= delta``: its ratio range inside PPO's min (default), or ``w A`` where it holds.

    Our reading of the paper's loosely defined "KL1": the signed estimator, so the constraint is
    **one-sided** (``w >= e^{-delta}``, no upper limit). A symmetric ``|log w| <= delta`` variant is
    what ``kl2`` gives with ``delta -> delta^2/2``.
    """
    return _divergence_rule(batch, "kl1", delta)


@register(
    "kl2",
    params={"delta": DELTA},
    default_form="min",
    forms=("min", "mask"),
    reference="Schulman 2020, 'Approximating KL Divergence' (k2); paper Table 3",
    ratio_mask_gradient=True,
)
def kl2(batch: TokenBatch, delta: float) -> MethodResult:
    r"""Constraint ``k2 = (log w)^2 / 2 <= delta`` (symmetric in ``log w``): its ratio range inside PPO's min
    (default), or ``w A`` where it holds."""
    return _divergence_rule(batch, "kl2", delta)


@register(
    "is_kl3",
    params={"delta": DELTA},
    default_form="min",
    forms=("min", "mask"),
    reference="paper Table 3 'IS-weighted KL3'; derivation in atr_theory.ranges.is_kl3_clip_range",
    ratio_mask_gradient=True,
)
def is_kl3(batch: TokenBatch, delta: float) -> MethodResult:
    r"""Constraint ``w k3(1/w) = 1 - w + w log w <= delta``: its ratio range inside PPO's min (default), or ``w A``
    where it holds.

    Our reading: importance-weighting k3 of the *reverse* ratio gives an unbiased, non-negative
    estimate of ``KL(pi || pi_old)`` from ``pi_old`` samples (``E_old[w log w - w + 1] = KL(pi||pi_old)``).
    Compared with KL3 its range is shifted down (lower ``l`` and lower ``u``, e.g. [0.650, 1.397] at
    delta = 0.07 against [0.671, 1.422]): it tolerates larger decreases and fewer increases of pi.
    """
    return _divergence_rule(batch, "is_kl3", delta)


# ----------------------------------------------------------------------------------------------
# Methods beyond a per-token ratio range
# ----------------------------------------------------------------------------------------------
@register(
    "clip_cov",
    params={
        "epsilon": EPSILON,
        "cov_ratio": COV_RATIO,
        "cov_lb": Param(1.0, help="Clip-Cov: lower bound of the centred cov(A, log pi) of a droppable token"),
        "cov_ub": Param(5.0, help="Clip-Cov: upper bound of the centred cov(A, log pi) of a droppable token"),
    },
    relations=(Relation("cov_lb < cov_ub", lambda p: p["cov_lb"] < p["cov_ub"]),),
    default_form="min",
    forms=("min", "mask"),
    reference="Cui et al. 2025 (arXiv 2505.22617), Clip-Cov; verl 'clip_cov' policy loss",
    ratio_mask_gradient=True,
)
def clip_cov(batch: TokenBatch, epsilon: float, cov_ratio: float, cov_lb: float, cov_ub: float) -> MethodResult:
    r"""PPO clip; then ``max(1, int(cov_ratio * n_valid))`` tokens drawn at random (``batch.generator``)
    among the unclipped valid tokens with centred ``cov(A, log pi)`` in ``(cov_lb, cov_ub)`` lose their
    gradient. (verl zeroes their loss value too; we keep the value and drop the gradient.)

    The covariance test runs on every token, the clip test only on the few tokens that pass it (the same candidates
    in the same order, so the same draw as verl's ``randperm``)."""
    lower, upper = 1.0 - epsilon, 1.0 + epsilon
    base = ratio_objective(batch, lower, upper)
    n_valid = torch.count_nonzero(batch.mask)
    cov = _centred_cov(batch, n_valid).reshape(-1)
    idx = torch.nonzero((cov > cov_lb).logical_and_(cov < cov_ub)).squeeze(-1)
    with torch.no_grad():
        y_few, adv_few = batch.log_ratio.reshape(-1)[idx], batch.advantages.reshape(-1)[idx]
        kept_few = _range_flags(torch.exp(y_few), y_few, adv_few, lower, upper, batch.form)[0]
        idx = idx[batch.mask.reshape(-1)[idx] & kept_few]
    n_pick = min(max(int(cov_ratio * int(n_valid)), 1), idx.numel())
    perm = torch.randperm(idx.numel(), generator=batch.generator, device="cpu")[:n_pick]
    dropped = idx[perm.to(idx.device)]
    # the dropped tokens keep their value and lose their gradient: an out-of-place index_put costs a copy forward and
    # backward, where torch.where(drop, detached, objective) costs two selects over every token
    flat = base.objective.reshape(-1)
    objective = flat.index_put((dropped,), flat.detach()[dropped]).view_as(base.objective)

    def flags():
        drop = torch.zeros_like(batch.mask).reshape(-1).index_fill_(0, dropped, True).view_as(batch.mask)
        return base.kept & ~drop, base.clipped_low, base.clipped_high | drop

    return MethodResult(objective, flags)


@register(
    "kl_cov",
    params={
        "cov_ratio": COV_RATIO.with_default(2e-3),
        "kl_coef": Param(1.0, ge=0, help="KL-Cov: coefficient of the |log w| penalty on the selected tokens"),
    },
    default_form="none",
    forms=("none",),
    reference="Cui et al. 2025 (arXiv 2505.22617), KL-Cov; verl 'kl_cov' policy loss",
)
def kl_cov(batch: TokenBatch, cov_ratio: float, kl_coef: float) -> MethodResult:
    r"""No clipping: ``w A``, and the top ``max(1, int(cov_ratio * n_valid))`` valid tokens by centred
    ``cov(A, log pi)`` get the penalty ``- kl_coef * |log w|``."""
    y = batch.log_ratio
    n_valid = torch.count_nonzero(batch.mask)
    cov = _centred_cov(batch, n_valid)
    cov = cov.masked_fill_(~batch.mask, -math.inf).reshape(-1)  # padding last in the ranking
    # k = max(1, int(cov_ratio * n_valid)) stays on the device: take the top k_max (a size known from the
    # shape, n_valid <= B T) and penalise the first k of them (topk returns them in descending order)
    k_max = min(max(1, int(cov_ratio * y.numel())), y.numel())
    k = torch.clamp(torch.floor(cov_ratio * n_valid.to(torch.float64)), min=1.0)
    top = _top_k_indices(cov, k_max)
    chosen = (torch.arange(k_max, device=y.device) < k) & batch.mask.reshape(-1)[top]
    # the penalty enters at the top k_max positions only (times 0 where not chosen): an index_put, not a select
    # over every token
    flat = (torch.exp(y) * batch.advantages).reshape(-1)
    objective = flat.index_put((top,), flat[top] - kl_coef * y.reshape(-1)[top].abs() * chosen).view_as(y)

    def flags():
        penalised = torch.zeros_like(batch.mask).reshape(-1).index_put((top,), chosen).view_as(batch.mask)
        return torch.ones_like(batch.mask), torch.zeros_like(batch.mask), penalised

    return MethodResult(objective, flags)


def _position_kl(batch: TokenBatch, name: str) -> torch.Tensor:
    """(B, T) ``KL(pi_old(.|s_t) || pi(.|s_t))``: ``batch.position_kl`` when the caller computed it (e.g. chunk by
    chunk from hidden states, ``atr_theory.head_kl_chunked``; ``atr_theory.policy_loss`` checked its
    shape), else from the full distributions."""
    expected = tuple(batch.log_ratio.shape)
    if batch.position_kl is not None:
        return batch.position_kl.to(batch.log_ratio.dtype)
    if batch.old_full_logp is None or batch.full_logp is None:
        raise ValueError(
            f"method {name!r} needs the full distributions: pass old_full_logp and full_logp of shape (B, T, V), "
            "or their per-position KL as position_kl (B, T)"
        )
    for arg, t in (("old_full_logp", batch.old_full_logp), ("full_logp", batch.full_logp)):
        if t.ndim != 3 or tuple(t.shape[:2]) != expected:
            raise ValueError(f"{arg} must have shape (B, T, V) with (B, T) = {expected}, got {tuple(t.shape)}")
    kl = full_kl(batch.old_full_logp, batch.full_logp, chunk_size=batch.kl_chunk_size)
    return kl.to(batch.log_ratio.dtype)


@register(
    "tr_ppo",
    params={"delta": DELTA},
    default_form="min",
    forms=("min", "mask"),
    reference="Wang et al. 2020 (Truly PPO, TR-PPO); paper Eq. 3 (KL-based clipping)",
    needs_full_distributions=True,
    ratio_mask_gradient=True,
)
def tr_ppo(batch: TokenBatch, delta: float) -> MethodResult:
    r"""Min form (the default; the original TR-PPO, Wang et al. 2020, Eq. 8, and the paper's Eq. 3 operator inside
    its Section 2 surrogate): ``min(w A, F A)`` with ``F = 1`` (``w_old``) where ``KL >= delta`` and ``F = w`` below:
    a token outside the trust region loses its gradient only when ``w A > A`` (its ratio moved in the direction its
    advantage favours); moving back stays possible.

    Mask form (the Section 4 pure-clip reading): keep ``w A`` while the full ``KL(pi_old(.|s_t) || pi(.|s_t)) <=
    delta`` at the token's position, else the constant ``A``.

    Note: the paper's Eq. 3 writes the reverse direction ``KL(pi || pi_old)``; we follow Truly PPO and
    METHODS.md (``KL(pi_old || pi)``, the direction TRPO constrains). The KL only gates, so it is
    computed without gradient, chunked over positions (``kl_chunk_size``).
    """
    with torch.no_grad():
        kl = _position_kl(batch, "tr_ppo")
    if batch.form == "mask":
        return ratio_objective(batch, 0.0, math.inf, kl <= delta)
    w = torch.exp(batch.log_ratio)
    adv = batch.advantages
    outside = kl >= delta
    objective = torch.where(outside, torch.minimum(w * adv, adv), w * adv)

    def flags():
        frozen = _and(outside, w * adv > adv)
        return ~frozen, _and(frozen, batch.log_ratio < 0), _and(frozen, batch.log_ratio > 0)

    return MethodResult(objective, flags)


@register(
    "truly_ppo",
    params={"delta": DELTA, "alpha": Param(5.0, ge=0, help="Truly PPO: rollback coefficient")},
    default_form="none",
    forms=("none",),
    reference="Wang et al. 2020 (Truly PPO, TR-PPO-RB), wangyuhuix/TrulyPPO",
    needs_full_distributions=True,
)
def truly_ppo(batch: TokenBatch, delta: float, alpha: float) -> MethodResult:
    r"""Trust-region rollback: where ``KL(pi_old || pi) >= delta`` and ``w A > A`` (the ratio moved
    past 1 in the direction the advantage favours) the objective is ``w A - alpha KL``; else ``w A``.
    The KL carries gradient here (it is the rollback force)."""
    kl = _position_kl(batch, "truly_ppo")
    w = torch.exp(batch.log_ratio)
    adv = batch.advantages
    rollback = _and(kl.detach() >= delta, w * adv > adv)
    objective = torch.where(rollback, w * adv - alpha * kl, w * adv)
    none = torch.zeros_like(batch.mask)
    return MethodResult(objective, lambda: (torch.ones_like(batch.mask), none, rollback))
