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

from typing import Any

import numpy as np
import torch

from .ranges import expm1_minus_x, is_kl3_of_log_ratio

__all__ = [
    "kl1",
    "kl2",
    "kl3",
    "is_kl3",
    "kl1_from_log_ratio",
    "kl2_from_log_ratio",
    "kl3_from_log_ratio",
    "is_kl3_from_log_ratio",
    "full_kl",
]


def _is_torch(x: Any) -> bool:
    return isinstance(x, torch.Tensor)


def kl1_from_log_ratio(y: Any) -> Any:
    """``k1 = -y``."""
    return -y if _is_torch(y) else -np.asarray(y, dtype=float)


def kl2_from_log_ratio(y: Any) -> Any:
    """``k2 = y^2 / 2``."""
    return 0.5 * y * y if _is_torch(y) else 0.5 * np.square(np.asarray(y, dtype=float))


def kl3_from_log_ratio(y: Any) -> Any:
    r"""``k3 = e^y - 1 - y``, computed without cancellation for small ``|y|``.

    torch: ``expm1(y) - y`` for ``|y| >= 1e-3`` (error < 1e-13 relative in float64) and the Taylor
    polynomial ``y^2/2 + y^3/6 + y^4/24`` below; gradients flow through both branches.
    """
    if not _is_torch(y):
        return expm1_minus_x(y)
    small = y.abs() < 1e-3
    ys = torch.where(small, y, torch.zeros_like(y))
    series = ys * ys * (0.5 + ys * (1.0 / 6.0 + ys / 24.0))
    yl = torch.where(small, torch.ones_like(y), y)
    return torch.where(small, series, torch.expm1(yl) - yl)


def is_kl3_from_log_ratio(y: Any) -> Any:
    r"""``w log w - w + 1 = e^y (y - 1) + 1``; Taylor ``y^2/2 + y^3/3 + y^4/8`` for small ``|y|`` in torch."""
    if not _is_torch(y):
        return is_kl3_of_log_ratio(y)
    small = y.abs() < 1e-3
    ys = torch.where(small, y, torch.zeros_like(y))
    series = ys * ys * (0.5 + ys * (1.0 / 3.0 + ys / 8.0))
    yl = torch.where(small, torch.ones_like(y), y)
    return torch.where(small, series, torch.exp(yl) * (yl - 1.0) + 1.0)


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
