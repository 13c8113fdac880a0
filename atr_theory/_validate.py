"""Input checks shared by the public functions: one clear ValueError per bad value (a TypeError for a value that
is no number at all, such as the text ``'0.07'``, which numpy would otherwise read as a number)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def _numbers(name: str, value: Any) -> np.ndarray:
    """``value`` as a float array when it holds numbers only (ints, floats, numpy or torch numbers, lists of them);
    a text, a bool, ``None`` or another object raises TypeError naming ``name`` (``np.asarray('0.07', dtype=float)``
    reads the text as a number, and ``True`` as 1)."""
    kind = np.asarray(value).dtype.kind if not isinstance(value, (str, bytes)) else "U"
    if kind not in "iuf":
        what = type(value).__name__ if kind in "USO" or np.ndim(value) == 0 else f"array of {np.asarray(value).dtype}"
        raise TypeError(f"{name} must be a number or an array of numbers, got a {what} ({value!r})")
    return np.asarray(value, dtype=float)


def check_positive(name: str, value: Any, *, allow_array: bool = True) -> np.ndarray | float:
    """Return ``value`` if every entry is a finite number > 0, else raise ValueError naming it.

    A Python int/float is checked with ``math`` alone (no numpy), so the check can be traced by
    ``torch.compile`` without a graph break."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        return float(value)
    arr = _numbers(name, value)
    if arr.ndim > 0 and not allow_array:
        raise ValueError(f"{name} must be a scalar, got an array of shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(arr) if arr.ndim == 0 else arr


def check_nonnegative(name: str, value: float) -> float:
    """Return float(value) if it is finite and >= 0."""
    v = float(_numbers(name, value)) if not isinstance(value, (int, float)) or isinstance(value, bool) else value
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return v


def check_probability(name: str, value: Any) -> np.ndarray:
    """Return value as an array if every entry lies in (0, 1]."""
    arr = _numbers(name, value)
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0) or np.any(arr > 1):
        raise ValueError(f"{name} must lie in (0, 1], got {value!r}")
    return arr
