r"""Per-sample KL estimators (Schulman 2020, "Approximating KL Divergence") and the full KL.

With ``w = pi(a) / pi_old(a)`` for ``a ~ pi_old`` (so ``E_{pi_old}[w] = 1``):

* ``k1 = -log w``              unbiased for ``KL(pi_old || pi)``, signed, high variance
* ``k2 = (log w)^2 / 2``        biased, low variance, non-negative
* ``k3 = w - 1 - log w``        unbiased, non-negative (``k1`` plus the control variate ``w - 1``)
* ``is_k3 = 1 - w + w log w``   ``= w * k3(1/w)``, unbiased for the reverse ``KL(pi || pi_old)``

Each function takes the log-ratio ``y = log w`` **or** the ratio ``w`` (``kl3(w)`` in the public API,
as in the paper's Eq. 6) and works on numpy arrays and torch tensors alike. The ``*_from_log_ratio``
forms are the numerically preferred ones: ``k3`` from ``y`` is ``expm1(y) - y`` with no
``log(0)`` and, for torch, a Taylor branch for small ``|y|``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

__all__ = [
    "kl1",
    "kl2",
    "kl3",
    "is_kl3",
    "kl1_from_log_ratio",
    "kl2_from_log_ratio",
    "kl3_from_log_ratio",
    "is_kl3_from_log_ratio",
    "entropy_from_log_probs",
    "full_kl",
]

# numpy: below |y| < 0.5 the estimators are summed as Taylor series (no cancellation in e^y - 1 - y)
_SERIES_CUTOFF = 0.5
_SERIES_TERMS = 24  # 0.5**24 / 24! ~ 1e-31: far below double precision


def _series(y: np.ndarray, coeff) -> np.ndarray:
    """sum_{n=2}^{N} coeff(n) * y**n, evaluated by Horner's rule."""
    acc = np.zeros_like(y)
    for n in range(_SERIES_TERMS, 1, -1):
        acc = (acc + coeff(n)) * y
    return acc * y


def _numpy_with_series(y: Any, direct, coeff) -> np.ndarray:
    """``direct(y)``, replaced by ``sum_{n>=2} coeff(n) y^n`` where ``|y| < 0.5``."""
    y = np.asarray(y, dtype=float)
    small = np.abs(y) < _SERIES_CUTOFF
    out = direct(y)
    if np.any(small):
        out = np.where(small, _series(np.where(small, y, 0.0), coeff), out)
    return out


def _torch_with_taylor(y: torch.Tensor, direct, c3: float, c4_divisor: float) -> torch.Tensor:
    """``direct(y)``, replaced by ``y^2 (1/2 + c3 y + y^2 / c4_divisor)`` where ``|y| < 1e-3`` (gradients flow
    through both branches)."""
    small = y.abs() < 1e-3
    ys = torch.where(small, y, torch.zeros_like(y))
    series = ys * ys * (0.5 + ys * (c3 + ys / c4_divisor))
    return torch.where(small, series, direct(torch.where(small, torch.ones_like(y), y)))


def _is_torch(x: Any) -> bool:
    return isinstance(x, torch.Tensor)


def kl1_from_log_ratio(y: Any) -> Any:
    """``k1 = -y``."""
    return -y if _is_torch(y) else -np.asarray(y, dtype=float)


def kl2_from_log_ratio(y: Any) -> Any:
    """``k2 = y^2 / 2``."""
    return 0.5 * y * y if _is_torch(y) else 0.5 * np.square(np.asarray(y, dtype=float))


def kl3_from_log_ratio(y: Any) -> Any:
    r"""``k3 = e^y - 1 - y`` (paper Eq. 6 in ``y = log w``), computed without cancellation for small ``|y|``.

    numpy: the series ``sum_{n>=2} y^n / n!`` for ``|y| < 0.5`` (exact to the last digit);
    torch: ``expm1(y) - y`` for ``|y| >= 1e-3`` (error < 1e-13 relative in float64) and
    ``y^2/2 + y^3/6 + y^4/24`` below; gradients flow through both branches.

    >>> float(kl3_from_log_ratio(1e-8))  # y^2 / 2, exact to the last digit
    5.000000016666667e-17
    """
    if _is_torch(y):
        return _torch_with_taylor(y, lambda t: torch.expm1(t) - t, 1.0 / 6.0, 24.0)
    return _numpy_with_series(y, lambda t: np.expm1(t) - t, lambda n: 1.0 / math.factorial(n))


def is_kl3_from_log_ratio(y: Any) -> Any:
    r"""``w log w - w + 1 = e^y (y - 1) + 1 = sum_{n>=2} (n-1) y^n / n!`` (IS-weighted KL3, paper Table 3).

    numpy: the series for ``|y| < 0.5``; torch: Taylor ``y^2/2 + y^3/3 + y^4/8`` for ``|y| < 1e-3``.
    """
    if _is_torch(y):
        return _torch_with_taylor(y, lambda t: torch.exp(t) * (t - 1.0) + 1.0, 1.0 / 3.0, 8.0)
    return _numpy_with_series(y, lambda t: np.exp(t) * (t - 1.0) + 1.0, lambda n: (n - 1) / math.factorial(n))


def _log(w: Any) -> Any:
    if _is_torch(w):
        return torch.log(w)
    w = np.asarray(w, dtype=float)
    if np.any(w <= 0):
        raise ValueError(f"ratio w must be > 0, got min {w.min()!r}")
    return np.log(w)


def kl1(w: Any) -> Any:
    """``k1(w) = -log w`` (elementwise, numpy or torch)."""
    return kl1_from_log_ratio(_log(w))


def kl2(w: Any) -> Any:
    """``k2(w) = (log w)^2 / 2``."""
    return kl2_from_log_ratio(_log(w))


def kl3(w: Any) -> Any:
    r"""``k3(w) = w - 1 - log w`` (paper Eq. 6), elementwise on numpy arrays or torch tensors.

    >>> round(float(kl3(1.4222167362759164)), 12)
    0.07
    """
    return kl3_from_log_ratio(_log(w))


def is_kl3(w: Any) -> Any:
    """``w k3(1/w) = 1 - w + w log w``: importance-weighted KL3, estimates ``KL(pi || pi_old)``."""
    return is_kl3_from_log_ratio(_log(w))


def entropy_from_log_probs(log_probs: torch.Tensor, dim: int = -1) -> torch.Tensor:
    r"""Shannon entropy ``H = -sum_a pi(a) log pi(a)`` of normalised log-probabilities along ``dim``.

    ``log_probs`` is a log-softmax output (torch). Entries with ``pi(a) = 0`` (``-inf``) contribute 0,
    never ``0 * -inf = NaN``.

    >>> round(float(entropy_from_log_probs(torch.log(torch.tensor([0.5, 0.5, 0.0])))), 6)  # log 2
    0.693147
    """
    p_log_p = torch.where(torch.isneginf(log_probs), torch.zeros_like(log_probs), log_probs.exp() * log_probs)
    return -p_log_p.sum(dim)


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """float16/bfloat16 -> float32; float32/float64 unchanged."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def full_kl(old_full_logp: torch.Tensor, full_logp: torch.Tensor, *, chunk_size: int | None = None) -> torch.Tensor:
    r"""``KL(pi_old(.|s) || pi(.|s)) = sum_a pi_old(a) (log pi_old(a) - log pi(a))`` per position.

    Inputs are (..., V) log-probabilities (normalised log-softmax outputs, or raw logits: both are
    re-normalised with ``log_softmax`` here, which is idempotent on log-probs). Computed in log space:
    ``exp(old) * (old - new)`` is ``0 * finite = 0`` where ``pi_old`` underflows, never ``0 * -inf``.
    With ``chunk_size`` the leading positions are processed in chunks so the (chunk, V) temporaries
    bound the extra memory (the V = 151,936 case).

    Returns a tensor of shape ``(...)``; it is differentiable w.r.t. ``full_logp``.
    """
    if old_full_logp.shape != full_logp.shape:
        raise ValueError(
            f"old_full_logp and full_logp must have the same shape, got {tuple(old_full_logp.shape)} "
            f"and {tuple(full_logp.shape)}"
        )
    lead = full_logp.shape[:-1]
    v = full_logp.shape[-1]
    old2 = old_full_logp.reshape(-1, v)
    new2 = full_logp.reshape(-1, v)
    n = old2.shape[0]
    step = n if not chunk_size or chunk_size >= n else int(chunk_size)
    parts = []
    for start in range(0, max(n, 1), step):
        o = torch.log_softmax(_upcast(old2[start : start + step]), dim=-1)
        q = torch.log_softmax(_upcast(new2[start : start + step]), dim=-1)
        # where pi_old == 0 exactly, the term is 0 whatever log pi is (even -inf)
        diff = torch.where(torch.isneginf(o), torch.zeros_like(o), o - q)
        parts.append((o.exp() * diff).sum(-1))
    out = torch.cat(parts) if parts else full_logp.new_zeros(0)
    return out.reshape(lead)
