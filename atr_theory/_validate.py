"""Input checks shared by the public functions: one clear ValueError per bad value."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def check_positive(name: str, value: Any, *, allow_array: bool = True) -> np.ndarray | float:
    """Return ``value`` if every entry is a finite number > 0, else raise ValueError naming it.

    A Python int/float is checked with ``math`` alone (no numpy), so the check can be traced by
    ``torch.compile`` without a graph break."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        return float(value)
    arr = np.asarray(value, dtype=float)
    if arr.ndim > 0 and not allow_array:
        raise ValueError(f"{name} must be a scalar, got an array of shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(arr) if arr.ndim == 0 else arr


def check_nonnegative(name: str, value: float) -> float:
    """Return float(value) if it is finite and >= 0."""
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return v


def check_probability(name: str, value: Any) -> np.ndarray:
    """Return value as an array if every entry lies in (0, 1]."""
    arr = np.asarray(value, dtype=float)
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0) or np.any(arr > 1):
        raise ValueError(f"{name} must lie in (0, 1], got {value!r}")
    return arr
