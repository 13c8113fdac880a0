r"""Ratio ranges induced by per-sample divergence constraints.

Every constraint ``C(w) <= delta`` on the likelihood ratio ``w = pi / pi_old`` used in the paper is
a convex function of ``w`` (or of ``y = log w``) that vanishes at ``w = 1``; its sub-level set is an
interval ``[l, u]`` that contains 1. This module computes those intervals:

=============  ==========================================  ==========================================
constraint     estimator                                   range
=============  ==========================================  ==========================================
KL3 (ATR)      ``k3 = w - 1 - log w``                      ``[-W0(-e^{-1-d}), -W_{-1}(-e^{-1-d})]``
KL1            ``k1 = -log w``                             ``[e^{-d}, inf)`` (one-sided)
KL2            ``k2 = (log w)^2 / 2``                      ``[e^{-sqrt(2d)}, e^{sqrt(2d)}]``
IS-KL3         ``w * k3(1/w) = 1 - w + w log w``           Lambert W, see ``is_kl3_clip_range``
TRGPPO         binary ``KL(p || p w) <= d``                roots per p_old, union with ``1 -+ eps``
DCPO           --                                          ``0.5 + 0.5 sqrt(1 -+ 4 eps / p_old)``
=============  ==========================================  ==========================================

All roots are computed in ``y = log w`` with Newton's method started from the Lambert-W closed form
(or its branch-point series when ``delta`` is tiny) and with the small-``y`` parts of each function
evaluated by Taylor series, so that ``1 - l`` and ``u - 1`` are accurate to a few ulp even when
``delta`` is 1e-12 (where ``1 - l ~ 1.4e-6`` and a direct Lambert-W evaluation loses half the digits).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from scipy.special import lambertw

from ._validate import check_nonnegative, check_positive, check_probability
from .divergence import bernoulli_kl_and_slope, bernoulli_kl_of_log_ratio, is_kl3_from_log_ratio, kl3_from_log_ratio  # noqa: F401  (bernoulli_kl_of_log_ratio: re-exported)

__all__ = [
    "kl3_clip_range",
    "kl3_clip_log_range",
    "log_range_of_dtype",
    "LOG_RANGE_KINDS",
    "is_kl3_clip_log_range",
    "kl3_delta_from_bound",
    "kl1_clip_range",
    "kl2_clip_range",
    "is_kl3_clip_range",
    "trgppo_kl_range",
    "trgppo_kl_log_range",
    "trgppo_clip_range",
    "dcpo_clip_range",
]


def _newton(f, fprime, y0: np.ndarray, max_iter: int = 100) -> np.ndarray:
    """Vectorised Newton iteration, stopped when every step is below a few ulp of y. A step that is not finite
    (``f' = 0``, or ``f / f'`` overflowing where an entry has no root and wanders off, as IS-k3's lower root does
    for delta >= 1) is taken as 0, quietly."""
    y = np.array(y0, dtype=float, copy=True)
    for _ in range(max_iter):
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            step = f(y) / fprime(y)
        step = np.where(np.isfinite(step), step, 0.0)
        y = y - step
        if np.all(np.abs(step) <= 4 * np.finfo(float).eps * np.maximum(np.abs(y), 1e-300)):
            break
    return y


def _as_output(x: np.ndarray, scalar: bool):
    return float(x[0]) if scalar else x


def kl3_clip_log_range(delta: Any) -> tuple[Any, Any]:
    r"""``(log l, log u)`` of ``kl3_clip_range``: the two roots of ``e^y - 1 - y = delta``."""
    d = check_positive("delta", delta)
    scalar = np.ndim(d) == 0
    d = np.atleast_1d(np.asarray(d, dtype=float))
    # Starting points: the branch-point series (Corless et al. 1996, Eq. 4.22),
    # W = -1 + p - p^2/3 + 11 p^3/72 with p = +-sqrt(2 (1 + e z)) and 1 + e z = -expm1(-delta),
    # for small delta; the principal/lower real branches of Lambert W otherwise.
    p = np.sqrt(2.0 * -np.expm1(-d))
    z = -np.exp(-1.0 - d)
    with np.errstate(all="ignore"):
        w0 = -np.real(lambertw(z, 0))
        wm1 = -np.real(lambertw(z, -1))
    # log of the series by log1p: log(1 - p + ...) of a rounded 1 - p is 0 once p < eps / 2 (delta < ~6e-33), and
    # Newton cannot leave y = 0 (f'(0) = 0): log l was returned as 0 instead of -sqrt(2 delta) there
    small = d < 1e-3
    with np.errstate(all="ignore"):  # the series is used only where small (it can leave log1p's domain elsewhere)
        log_series_lo = np.log1p(-(p - p**2 / 3 + 11 * p**3 / 72))
        log_series_hi = np.log1p(p + p**2 / 3 + 11 * p**3 / 72)
        lo0 = np.where(small, log_series_lo, np.log(w0))
        hi0 = np.where(small, log_series_hi, np.log(wm1))
    # Where Lambert W underflows (z = -e^{-1-delta} below the smallest double, delta > ~708), start where
    # Newton converges monotonically: f = e^y - 1 - y - delta is convex, f(-(1 + delta)) > 0 on the left
    # and f(log(2 (1 + delta))) = 1 + delta - log(2 (1 + delta)) > 0 on the right.
    lo0 = np.where(np.isfinite(lo0), lo0, -(1.0 + d))
    hi0 = np.where(np.isfinite(hi0) & (hi0 > 0), hi0, np.log(2.0 * (1.0 + d)))
    f = lambda y: kl3_from_log_ratio(y) - d  # noqa: E731
    fp = np.expm1
    y_lo = _newton(f, fp, lo0)
    y_hi = _newton(f, fp, hi0)
    return _as_output(y_lo, scalar), _as_output(y_hi, scalar)


def _divergence_exceeds(kind: str, y: float, delta: float) -> bool:
    """Whether the per-token divergence ``kind`` of ``y = log w`` exceeds ``delta``, in exact arithmetic for floats
    ``y`` and ``delta`` (mpmath, with ~2 |log10 y| digits more than 50 where ``kl3`` / ``is_kl3`` cancel at small
    ``|y|``): ``kl1 = -y``, ``kl2 = y^2 / 2``, ``kl3 = e^y - 1 - y``, ``is_kl3 = e^y (y - 1) + 1``."""
    import mpmath as mp

    if math.isinf(y):  # kl1, kl2, kl3 are +inf there; is_kl3 is +inf at +inf and 1 at -inf
        return True if kind != "is_kl3" or y > 0 else 1.0 > delta
    if y == 0.0:
        return False
    digits = 50 + 2 * max(0, -math.floor(math.log10(abs(y))))
    with mp.workdps(digits):
        t, d = mp.mpf(y), mp.mpf(delta)
        value = {
            "kl1": lambda: -t,
            "kl2": lambda: t * t / 2,
            "kl3": lambda: mp.expm1(t) - t,
            "is_kl3": lambda: mp.exp(t) * (t - 1) + 1,
        }[kind]()
        return bool(value > d)


def _float64_log_range(kind: str, delta: float) -> tuple[float, float]:
    """The float64 roots (``log`` of the ratio range) of ``kind <= delta``, before ``log_range_of_dtype``'s
    exact correction; an infinite end where the constraint has none (kl1's upper, is_kl3's lower for delta >= 1)."""
    if kind == "kl1":
        return -delta, math.inf
    if kind == "kl2":
        r = math.sqrt(2.0 * delta)
        return -r, r
    return {"kl3": kl3_clip_log_range, "is_kl3": is_kl3_clip_log_range}[kind](delta)


LOG_RANGE_KINDS = ("kl1", "kl2", "kl3", "is_kl3")
"""The per-token divergences whose constraint ``divergence(log w) <= delta`` is an interval of ``log w``."""


def log_range_of_dtype(kind: str, delta: float, dtype: torch.dtype = torch.float64) -> tuple[float, float]:
    r"""The smallest and the largest ``y`` representable in ``dtype`` (float64 or float32) whose per-token
    divergence ``kind`` (``LOG_RANGE_KINDS``: ``kl1 = -y``, ``kl2 = y^2 / 2``, ``kl3 = e^y - 1 - y``,
    ``is_kl3 = e^y (y - 1) + 1``, with ``y = log w``) is ``<= delta`` in exact arithmetic, as Python floats
    (``-inf`` / ``inf`` where the constraint has no end on that side).

    Each divergence falls on ``y < 0`` and rises on ``y > 0`` (kl1 only falls), so for every ``y`` of that dtype the
    constraint holds exactly when ``lo <= y <= hi``: the rule decided by two comparisons, with no rounding (the bounds
    are representable in ``dtype``). Start: the float64 roots (``kl3_clip_log_range`` etc.) rounded inward to
    ``dtype``; then each finite bound is stepped one representable value at a time while exact arithmetic (mpmath)
    says it is on the wrong side (a step or two: the float64 roots are within a few ulp).

    Examples
    --------
    >>> log_range_of_dtype("kl3", 0.07, torch.float32)
    (-0.3990282416343689, 0.3522167205810547)
    """
    if kind not in LOG_RANGE_KINDS:
        raise ValueError(f"kind must be one of {LOG_RANGE_KINDS}, got {kind!r}")
    d = float(check_positive("delta", delta))
    if dtype == torch.float64:
        up, down, cast = (lambda v: math.nextafter(v, math.inf)), (lambda v: math.nextafter(v, -math.inf)), float
    elif dtype == torch.float32:

        def up(v):
            with np.errstate(over="ignore"):
                return float(np.nextafter(np.float32(v), np.float32(np.inf)))

        def down(v):
            with np.errstate(over="ignore"):
                return float(np.nextafter(np.float32(v), np.float32(-np.inf)))

        def cast(v):  # round to nearest (beyond float32: +-inf); moved inward below
            with np.errstate(over="ignore"):
                return float(np.float32(v))

    else:
        raise TypeError(f"log_range_of_dtype takes torch.float64 or torch.float32, got {dtype}")
    y_lo, y_hi = (float(v) for v in _float64_log_range(kind, d))
    lo, hi = cast(y_lo), cast(y_hi)
    lo = up(lo) if lo < y_lo else lo
    hi = down(hi) if hi > y_hi else hi
    exceeds = lambda v: _divergence_exceeds(kind, v, d)  # noqa: E731
    lo = _settle(lo, inward=up, outward=down, exceeds=exceeds) if math.isfinite(y_lo) else lo
    hi = _settle(hi, inward=down, outward=up, exceeds=exceeds) if math.isfinite(y_hi) else hi
    return lo, hi


def _settle(bound: float, inward, outward, exceeds, max_steps: int = 64) -> float:
    """Step ``bound`` one representable value at a time: inward while it ``exceeds`` the constraint, outward while the
    next value outward does not; stops at the last value that satisfies it."""
    for _ in range(max_steps):
        if exceeds(bound):
            bound = inward(bound)
        elif not exceeds(outward(bound)):
            bound = outward(bound)
        else:
            break
    return bound


def kl3_clip_range(delta: Any) -> tuple[Any, Any]:
    r"""Ratio range ``[l, u]`` equivalent to the ATR constraint ``KL3 = w - 1 - log w <= delta``.

    Paper Thm 3.2 / App. A.1: \(l = -W_0(-e^{-1-\delta})\), \(u = -W_{-1}(-e^{-1-\delta})\), with
    \(0 < l < 1 < u\) and \(1 - l < u - 1\). The Lambert-W values are polished by Newton's method on
    ``k3(e^y) = delta`` so that the result is accurate to ~1e-15 relative for delta in [1e-12, 50]
    (tested against mpmath at 50 digits). ``u`` stays finite for every finite delta (``u ~ delta + log delta``);
    ``l ~ e^{-1-delta}`` underflows to 0 for delta > ~744 (``kl3_clip_log_range`` keeps ``log l``).

    Parameters
    ----------
    delta : float or array_like
        The KL3 bound, > 0.

    Returns
    -------
    tuple
        ``(l, u)``: floats, or arrays of the shape of ``delta``.

    Examples
    --------
    >>> l, u = kl3_clip_range(0.07)
    >>> round(l, 5), round(u, 5)
    (0.67097, 1.42222)
    """
    y_lo, y_hi = kl3_clip_log_range(delta)
    return _exp_pair(y_lo, y_hi)


def _exp_pair(y_lo, y_hi):
    """``(e^y_lo, e^y_hi)``; an end beyond float64 is ``inf``, quietly: the exact bound admits every finite ratio
    (k2's ``u = e^sqrt(2 delta)`` for delta > ~2.5e5; k1's upper end is inf for every delta)."""
    if np.ndim(y_lo) == 0:
        return _exp_or_inf(y_lo), _exp_or_inf(y_hi)
    with np.errstate(over="ignore"):
        return np.exp(y_lo), np.exp(y_hi)


def _exp_or_inf(y: float) -> float:
    try:
        return math.exp(y)
    except OverflowError:
        return math.inf


def kl3_delta_from_bound(bound: Any) -> Any:
    r"""Inverse of ``kl3_clip_range``: the ``delta`` whose range has ``bound`` as ``l`` or ``u``.

    ``delta = k3(bound) = bound - 1 - log(bound)``; a bound below 1 is read as ``l``, above 1 as ``u``.

    Examples
    --------
    >>> round(kl3_delta_from_bound(kl3_clip_range(0.07)[1]), 12)
    0.07
    """
    b = check_positive("bound", bound)
    if np.any(np.asarray(b) == 1.0):
        raise ValueError(f"bound must differ from 1 (1 is the centre of every range), got {bound!r}")
    out = kl3_from_log_ratio(np.log(b))
    return float(out) if np.ndim(out) == 0 else out


def kl1_clip_range(delta: Any) -> tuple[Any, Any]:
    r"""Range of ``k1 = -log w <= delta``: ``[e^{-delta}, +inf)``.

    k1 is signed, so the constraint is **one-sided**: it never limits how far ``w`` grows above 1.
    (Schulman 2020, "Approximating KL Divergence".)
    """
    d = check_positive("delta", delta)
    lo = np.exp(-np.asarray(d))
    hi = np.full_like(lo, np.inf)
    return (float(lo), math.inf) if np.ndim(d) == 0 else (lo, hi)


def kl2_clip_range(delta: Any) -> tuple[Any, Any]:
    r"""Range of ``k2 = (log w)^2 / 2 <= delta``: ``[e^{-sqrt(2 delta)}, e^{sqrt(2 delta)}]`` (symmetric in log w)."""
    d = check_positive("delta", delta)
    r = np.sqrt(2.0 * np.asarray(d))
    return _exp_pair(-r if np.ndim(d) else -float(r), r if np.ndim(d) else float(r))


def is_kl3_clip_log_range(delta: Any) -> tuple[Any, Any]:
    r"""``(log l, log u)`` of ``is_kl3_clip_range``: the roots of ``e^y (y - 1) + 1 = delta``; ``log l = -inf``
    for ``delta >= 1`` (no lower bound)."""
    d = check_positive("delta", delta)
    scalar = np.ndim(d) == 0
    d = np.atleast_1d(np.asarray(d, dtype=float))
    z = (d - 1.0) / math.e
    with np.errstate(all="ignore"):
        w_u = np.real(np.exp(1.0 + lambertw(z, 0)))
        w_l = np.real(np.exp(1.0 + lambertw(np.minimum(z, -1e-300), -1)))
    small = d < 1e-3
    s = np.sqrt(2.0 * d)
    with np.errstate(divide="ignore"):
        hi0 = np.where(small, s, np.log(w_u))
        lo0 = np.where(small | ~np.isfinite(np.log(w_l)), -s, np.log(w_l))
    f = lambda y: is_kl3_from_log_ratio(y) - d  # noqa: E731
    fp = lambda y: y * np.exp(y)  # noqa: E731
    y_hi = _newton(f, fp, hi0)
    y_lo = np.where(d < 1.0, _newton(f, fp, np.where(d < 1.0, lo0, -1.0)), -np.inf)
    return (float(y_lo[0]), float(y_hi[0])) if scalar else (y_lo, y_hi)


def is_kl3_clip_range(delta: Any) -> tuple[Any, Any]:
    r"""Range of the IS-weighted KL3 constraint ``1 - w + w log w <= delta``.

    Derivation: ``KL(pi || pi_old) = E_{pi_old}[w log w]``; adding the zero-mean control variate
    ``-(w - 1)`` gives the non-negative per-sample estimator ``w log w - w + 1 = w k3(1/w)``
    (paper Table 3). With ``y = log w`` the boundary is ``(y - 1) e^{y - 1} = (delta - 1)/e``, so
    ``w = (delta - 1) / W((delta - 1)/e)``: the principal branch gives ``u > 1``, the ``W_{-1}``
    branch ``l < 1``. Since ``1 - w + w log w -> 1`` as ``w -> 0``, for ``delta >= 1`` there is no
    lower bound: ``l = 0``. (``is_kl3_clip_log_range`` gives the logs.)
    """
    y_lo, y_hi = is_kl3_clip_log_range(delta)
    with np.errstate(over="ignore"):
        lo, hi = np.exp(y_lo), np.exp(y_hi)
    return (float(lo), float(hi)) if np.ndim(y_lo) == 0 else (lo, hi)


def trgppo_kl_range(p_old: Any, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """``exp`` of ``trgppo_kl_log_range`` (``l`` underflows to 0 for tiny ``p_old``, which is harmless)."""
    y_lo, y_hi = trgppo_kl_log_range(p_old, delta)
    return np.exp(y_lo), np.exp(y_hi)


def trgppo_kl_log_range(p_old: Any, delta: float) -> tuple[np.ndarray, np.ndarray]:
    r"""``(log l, log u)`` of the extreme ratios ``[l_KL, u_KL]`` with binary ``KL(p || p w) <= delta`` (TRGPPO, Wang 2019).

    Vectorised bisection in ``y = log w`` (80 halvings of a bracket of width < 40, i.e. below one ulp).
    For ``p_old = 1`` the upper root is 1 (the sampled token cannot become more likely).
    """
    d = check_positive("delta", delta, allow_array=False)
    p = np.atleast_1d(check_probability("p_old", p_old)).astype(float)

    def bisect(lo: np.ndarray, hi: np.ndarray, increasing: bool) -> np.ndarray:
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            above = bernoulli_kl_of_log_ratio(mid, p) > d
            if increasing:
                hi, lo = np.where(above, mid, hi), np.where(above, lo, mid)
            else:
                lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
            if np.all(hi - lo <= 2 * np.finfo(float).eps * np.maximum(np.abs(mid), 1e-300)):
                break
        return 0.5 * (lo + hi)

    # lower root: KL >= -p y + (1-p) log(1-p), so y >= ((1-p) log(1-p) - d) / p
    with np.errstate(divide="ignore", invalid="ignore"):
        floor = np.where(p < 1.0, (1.0 - p) * np.log1p(-p), 0.0)
    y_lo = bisect((floor - d) / p - 1.0, np.zeros_like(p), increasing=False)
    y_hi = bisect(np.zeros_like(p), -np.log(p), increasing=True)
    y_hi = np.where(p >= 1.0, 0.0, y_hi)
    return y_lo, y_hi


def trgppo_clip_range(p_old: Any, delta: float = 0.07, epsilon: float = 0.2) -> tuple[np.ndarray, np.ndarray]:
    r"""TRGPPO's range (paper Table 1): ``[min(l_KL, 1 - eps), max(u_KL, 1 + eps)]``.

    The KL-derived bounds only ever *widen* PPO's range, mostly for low-probability tokens.
    """
    eps = check_nonnegative("epsilon", epsilon)
    lo, hi = trgppo_kl_range(p_old, delta)
    return np.minimum(lo, 1.0 - eps), np.maximum(hi, 1.0 + eps)


def dcpo_clip_range(
    p_old: Any, epsilon_low: float = 0.16, epsilon_high: float = 0.2, ratio_cap: float = 10.0
) -> tuple[np.ndarray, np.ndarray]:
    r"""DCPO's dynamic adaptive clipping bounds (Yang et al. 2025, arXiv 2509.02333, Eq. 6):

    ``l = 0.5 + 0.5 sqrt(max(1 - 4 eps_l / p, 0))``, ``u = min(0.5 + 0.5 sqrt(1 + 4 eps_u / p), cap)``
    with ``p = pi_old(token)`` (evaluated as ``0.5 + sqrt(1/4 - eps_l / p)``, one multiplication fewer). They come
    from bounding ``|(w - 1) p|``-style changes of the probability itself; the cap (10 in lime-RL/DCPO,
    ``max(clip_ratio_c, 10)``) keeps ``u`` finite for ``p -> 0``. Works on numpy arrays and torch tensors (there
    as constants: no gradient).
    """
    eps_l, eps_u = check_dcpo_parameters(epsilon_low, epsilon_high, ratio_cap)
    if isinstance(p_old, torch.Tensor):
        p = p_old.clamp_min(torch.finfo(p_old.dtype).tiny)
        return _dcpo_bounds_torch(torch.reciprocal(p), eps_l, eps_u, ratio_cap)  # a fresh tensor: consumed
    inv_p = 1.0 / np.maximum(np.asarray(p_old, dtype=float), np.finfo(float).tiny)
    lo = np.sqrt(np.maximum(0.25 - eps_l * inv_p, 0.0)) + 0.5
    hi = np.minimum(np.sqrt(eps_u * inv_p + 0.25) + 0.5, ratio_cap)
    return lo, hi


def dcpo_clip_range_from_log(
    old_logp: torch.Tensor, epsilon_low: float = 0.16, epsilon_high: float = 0.2, ratio_cap: float = 10.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``dcpo_clip_range`` of ``p_old = exp(old_logp)`` (torch), with ``1 / p_old = exp(-old_logp)`` taken
    directly, capped at the dtype's largest value as ``dcpo_clip_range`` floors ``p_old`` at its smallest
    normal (so ``0 * 1/p`` stays 0 at ``epsilon = 0``)."""
    eps_l, eps_u = check_dcpo_parameters(epsilon_low, epsilon_high, ratio_cap)
    return _dcpo_bounds_torch(dcpo_inverse_p(old_logp), eps_l, eps_u, ratio_cap)


def check_dcpo_parameters(epsilon_low: float, epsilon_high: float, ratio_cap: float) -> tuple[float, float]:
    """``(epsilon_low, epsilon_high)`` as floats after checking them (>= 0) and ``ratio_cap`` (a scalar > 0)."""
    eps_l = check_nonnegative("epsilon_low", epsilon_low)
    eps_u = check_nonnegative("epsilon_high", epsilon_high)
    check_positive("ratio_cap", ratio_cap, allow_array=False)
    return eps_l, eps_u


@torch.no_grad()
def dcpo_inverse_p(old_logp: torch.Tensor) -> torch.Tensor:
    """``1 / p_old = exp(-old_logp)``, a fresh tensor, capped at ``1 / tiny`` (``p_old`` floored at the smallest normal)."""
    return old_logp.neg().exp_().clamp_(max=1.0 / torch.finfo(old_logp.dtype).tiny)


def dcpo_half_root(scaled_inv_p: torch.Tensor) -> torch.Tensor:
    """``0.5 + sqrt(max(1/4 + e / p, tiny))`` in place from ``e / p`` (DCPO Eq. 6 with the factor 1/2 taken inside the
    square root: ``0.5 sqrt(1 + 4x) = sqrt(1/4 + x)``). The floor is the smallest normal, not 0: ``sqrt`` of exact
    zeros takes a slow path on this CPU, and ``sqrt(tiny)`` (1e-19 in float32) vanishes when added to 0.5."""
    tiny = torch.finfo(scaled_inv_p.dtype).tiny
    return scaled_inv_p.add_(0.25).clamp_(min=tiny).sqrt_().add_(0.5)


@torch.no_grad()
def _dcpo_bounds_torch(inv_p: torch.Tensor, eps_l: float, eps_u: float, ratio_cap: float):
    """``l = 0.5 + sqrt(max(1/4 - eps_l / p, 0))``, ``u = min(0.5 + sqrt(1/4 + eps_u / p), cap)`` from ``1 / p``.
    Constants (no gradient), computed in place in ``inv_p`` (which it consumes) and one new tensor: on CPU each fresh
    (B, T) result costs page faults that dominate these element-wise passes (3.6 ms -> 0.5 ms at (64, 4096))."""
    lo = dcpo_half_root(inv_p.mul(-eps_l))
    hi = dcpo_half_root(inv_p.mul_(eps_u)).clamp_(max=ratio_cap)
    return lo, hi


def _newton_nonpositive_torch(value_and_slope, x: torch.Tensor, max_iter: int, tracing: bool) -> torch.Tensor:
    """Newton's method kept at ``x <= 0``, stopped one step after every step fell below ``1e-8 |x|``: quadratic
    convergence then leaves only rounding (a residual test cannot tell that point: near a root at 0 the residual
    is ~x^2, the step ~x). Under ``torch.compile`` (``tracing``) it runs ``max_iter`` steps: no host reads."""
    small_before = False
    for _ in range(max_iter):
        f, fp = value_and_slope(x)
        step = f / fp
        x = torch.minimum(x - step, torch.zeros_like(x))
        if not tracing:
            small = bool((step.abs() <= 1e-8 * x.abs().clamp_min(1e-300)).all())
            if small and small_before:
                break
            small_before = small
    return x


def trgppo_kl_log_range_torch(p_old, delta: float, max_iter: int = 60):
    r"""Torch version of ``trgppo_kl_log_range`` (any device, float64 inside): Newton's method on
    convex monotone parametrisations, started where the function is positive so every step is safe.

    The KL is evaluated as ``p k3(y) + q k3(y')`` (``q = 1 - p``, ``y' = log((1 - p e^y) / q)``: two non-negative
    terms, see ``bernoulli_kl_of_log_ratio``). Lower root, in ``y``: ``f(y) = KL - delta`` is convex and
    decreasing on ``y < 0`` and ``f >= -p y + q log q - delta``, so ``y0 = (q log q - delta)/p - 1`` has ``f > 0``.
    Upper root, in ``z = y'``: ``g(z) = KL - delta`` is convex and decreasing on ``z < 0`` with
    ``g >= p log p + q log q - q (z + log q) - delta``; start where that is > 0. Both iterations converge
    monotonically; each stops one step after all its steps fell below 1e-8 ``|y|``.
    Accuracy (``tests/test_ranges.py``, against 80-digit bisection of the definition): ``|dy| <= 4e-15 max(1, |y|)``
    for p_old from 1e-200 to 1 and delta from 1e-12 to 20, i.e. the ratio bounds to a few ulp. The textbook form
    ``-p y + q [log q - log(1 - p e^y)]`` used until then lost ~``eps / |y|`` to cancellation: 1e-10 at
    delta = 1e-12, 4e-13 at 1e-8 (and, before log1p, 2.3e-7 relative in ``l_KL`` at delta = 1e-8, p_old = 1.4e-10).
    """
    check_positive("delta", delta, allow_array=False)
    p = torch.as_tensor(p_old).to(torch.float64)
    tracing = torch.compiler.is_compiling()  # no host reads then: a fixed number of steps, no input scan
    bad = (p <= 0) | (p > 1) | ~torch.isfinite(p)
    if not tracing and bool(bad.any()):
        raise ValueError(f"p_old must lie in (0, 1], got {float(p[bad].flatten()[0])!r}")
    q = 1.0 - p
    interior = q > 0
    ps = torch.where(interior, p, torch.full_like(p, 0.5)).clamp_min(1e-250)
    qs = 1.0 - ps
    # q log q by log1p: log of a rounded 1 - p loses ~eps / p relative (2.3e-7 in l_KL at p_old = 1.4e-10 once)
    qlogq = qs * torch.log1p(-ps)

    def kl_minus_delta(x: torch.Tensor, weight: torch.Tensor, weight_other: torch.Tensor):  # and its slope in x
        kl, slope = bernoulli_kl_and_slope(x, weight, weight_other)
        return kl - delta, slope

    y = _newton_nonpositive_torch(lambda y: kl_minus_delta(y, ps, qs), (qlogq - delta) / ps - 1.0, max_iter, tracing)
    # upper root in z = y' = log((1 - p e^y) / q) < 0, where the KL is convex and decreasing; start where its lower
    # bound p log p + q log q - q (z + log q) - delta (the textbook form in v = z + log q) is > 0
    z0 = (ps * torch.log(ps) + qlogq - delta) / qs - 1.0 - torch.log1p(-ps)
    z = _newton_nonpositive_torch(lambda z: kl_minus_delta(z, qs, ps), z0, max_iter, tracing)
    y_hi = torch.log1p(-(qs / ps) * torch.expm1(z))  # e^y = (1 - q e^z) / p
    y_lo = torch.where(interior, y, torch.full_like(y, -float(delta)))  # p = 1: k1 = -y <= delta
    y_hi = torch.where(interior, y_hi, torch.zeros_like(y_hi))
    return y_lo, y_hi
