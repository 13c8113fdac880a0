r"""One bound per token, as the fast path reads it: PPO's min objective reads only the bound on the side the
advantage's sign selects (``bound_by_sign``), so DCPO and TRGPPO compute that one bound per token
(``dcpo_bound_by_sign``, ``trgppo_bound_by_sign``) with integer selects on the sign bit (``_sign_mask``,
``_select_by_sign``), and TRGPPO's per-token KL roots come from a float32 table interpolated on the bits of
``-log p_old`` (``trgppo_kl_range_table``). The ranges themselves, exact, are in ``atr_theory.ranges``; tests pin
these against them bit for bit or within the table's stated error."""

from __future__ import annotations

import math
import struct
from typing import Any

import torch

from ._validate import check_nonnegative, check_positive
from .ranges import check_dcpo_parameters, dcpo_half_root, dcpo_inverse_p, trgppo_kl_log_range_torch

__all__ = ["bound_by_sign", "dcpo_bound_by_sign", "trgppo_bound_by_sign", "trgppo_kl_range_table"]


def dcpo_bound_by_sign(
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    epsilon_low: float = 0.16,
    epsilon_high: float = 0.2,
    ratio_cap: float = 10.0,
) -> torch.Tensor:
    """The one bound of ``dcpo_clip_range_from_log`` that PPO's min objective reads at each token
    (``bound_by_sign``): ``u`` where ``advantages`` is positive, ``l`` where its sign bit is set. Bit for bit
    the same values, at about half the work (``1/4 + e / p`` with ``e = eps_u`` or ``-eps_l`` per token)."""
    eps_l, eps_u = check_dcpo_parameters(epsilon_low, epsilon_high, ratio_cap)
    with torch.no_grad():
        negative = _sign_mask(advantages)
        scaled = dcpo_inverse_p(old_logp).mul_(_select_by_sign(negative, -eps_l, eps_u, old_logp.dtype))
        cap = _select_by_sign(negative, math.inf, float(ratio_cap), old_logp.dtype)
        return dcpo_half_root(scaled).clamp_(max=cap)


# The float32 table of TRGPPO's KL bounds. Rows are indexed by the *bit pattern* of a = -log p_old as a
# float32: within each binade [2^k, 2^(k+1)) the bits are linear in a, so the grid is uniform there
# (2^(23 - _TABLE_SHIFT) cells per binade) and geometric across binades -- fine near p_old = 1, where
# the bounds depend on q log q (q = 1 - p_old ~ a), and coarse where they are nearly linear in a.
# Index and interpolation weight are exact integer operations on the input's bits.
_TABLE_SHIFT = 12
_TABLE_A_MIN = 2.0**-30  # p_old within 1e-9 of 1: bounds equal their p_old -> 1 limits to < 1 float32 ulp
_TABLE_A_MAX = 128.0  # p_old < e^-128: l_KL underflows to 0 and u_KL overflows to inf, as they would exactly


def _float32_bits(x: float) -> int:
    return int(torch.tensor(x, dtype=torch.float32).view(torch.int32))


_TABLE_LO_BITS, _TABLE_HI_BITS = _float32_bits(_TABLE_A_MIN), _float32_bits(_TABLE_A_MAX)


_TABLES: dict[tuple[float, str], Any] = {}
_TABLE_ROWS = ((_TABLE_HI_BITS - _TABLE_LO_BITS) >> _TABLE_SHIFT) + 1  # cells per bound: 75,776
_LOG_L_FLOOR = -200.0  # log l_KL for p_old -> 0 runs to -delta / p_old; exp of anything below -104 is 0 in float32


@torch.compiler.assume_constant_result
def _trgppo_table(delta: float, device: str):
    """(2, 2 R) float32: row 0 holds ``log u_KL`` at the R grid points (columns [0, R)) then ``log l_KL`` (columns
    [R, 2 R), floored at -200), row 1 each one's difference to the next grid point. One 1-D gather per row reads a
    cell: ~6x faster on CPU than gathering the cell's values as one row of a (R, 4) table. Cached per (delta, device);
    a constant to ``torch.compile``."""
    key = (delta, device)
    if key not in _TABLES:
        _TABLES[key] = _build_trgppo_table(delta, device)
    return _TABLES[key]


def _build_trgppo_table(delta: float, device: str):
    bits = torch.arange(_TABLE_ROWS + 1, dtype=torch.int64) * (1 << _TABLE_SHIFT) + _TABLE_LO_BITS
    a = bits.to(torch.int32).view(torch.float32).to(torch.float64)
    y_lo, y_hi = trgppo_kl_log_range_torch(torch.exp(-a).clamp_min(1e-300), delta)
    y = torch.cat([y_hi, y_lo.clamp(min=_LOG_L_FLOOR)]).view(2, -1)
    table = torch.stack([y[:, :-1].reshape(-1), (y[:, 1:] - y[:, :-1]).reshape(-1)])
    return table.to(device=device, dtype=torch.float32).contiguous()


def _trgppo_cells(old_logp: torch.Tensor, delta: float):
    """The table of ``delta``, and for each ``a = -log p_old`` (float32, clamped to the table's range) its cell (int32,
    an index into the ``log u_KL`` half) and its position in the cell in [0, 1): exact integer operations on the
    bits of ``a``."""
    table = _trgppo_table(check_positive("delta", delta, allow_array=False), str(old_logp.device))
    a = old_logp.detach().to(torch.float32).clamp(min=-_TABLE_A_MAX, max=-_TABLE_A_MIN).neg_()
    offset = a.view(torch.int32).sub_(_TABLE_LO_BITS)
    frac = (offset & ((1 << _TABLE_SHIFT) - 1)).to(torch.float32).mul_(2.0**-_TABLE_SHIFT)
    return table, offset.bitwise_right_shift_(_TABLE_SHIFT), frac


def _trgppo_read(table: torch.Tensor, cells: torch.Tensor, frac: torch.Tensor) -> torch.Tensor:
    """``exp`` of the linear interpolation in ``cells`` at ``frac``: the bound itself."""
    flat = cells.reshape(-1)
    value = table[0].index_select(0, flat).view(cells.shape)
    return table[1].index_select(0, flat).view(cells.shape).mul_(frac).add_(value).exp_()


def trgppo_kl_range_table(old_logp: torch.Tensor, delta: float) -> tuple[torch.Tensor, torch.Tensor]:
    r"""TRGPPO's ``(l_KL, u_KL)`` for float32 ``old_logp = log p_old`` (any shape) by table lookup: no
    root finding, no host synchronisation, compilable.

    The table holds the float64 roots of ``trgppo_kl_log_range_torch`` (``log l_KL`` and ``log u_KL``) on
    a grid in ``a = -log p_old`` that is uniform within each binade of ``a`` (2,048 cells) and is read by
    linear interpolation; cell and weight come exactly from the float32 bits of ``a``. Accuracy against
    the float64 roots (tests, mpmath): ``|l - l_KL| < 1e-7`` and ``|log u - log u_KL| <= 2^-23 (1 + |log
    u_KL|) + 3e-8``, i.e. float32 rounding of ``log u_KL`` and of ``u`` itself, for every float32
    ``log p_old <= 0``; ``u = inf`` where ``u_KL`` exceeds float32 (no ratio can reach it), ``l = 0`` where
    ``l_KL`` is below float32's smallest subnormal. Built once per (delta, device) in ~0.1 s and cached (1.2 MB).
    """
    table, cells, frac = _trgppo_cells(old_logp, delta)
    upper = _trgppo_read(table, cells, frac)
    return _trgppo_read(table, cells.add_(_TABLE_ROWS), frac), upper


def trgppo_bound_by_sign(
    old_logp: torch.Tensor, advantages: torch.Tensor, delta: float = 0.07, epsilon: float = 0.2
) -> torch.Tensor:
    """The one bound of TRGPPO's range ``[min(l_KL, 1 - eps), max(u_KL, 1 + eps)]`` that PPO's min objective reads
    at each token (``bound_by_sign``), from the table of ``trgppo_kl_range_table`` (same accuracy): one
    interpolation per token instead of two (the sign of the advantage picks the table's half). Finite: where
    ``u_KL`` exceeds float32, float32's largest value."""
    negative = _sign_mask(advantages.detach().to(torch.float32))
    lo, hi = _trgppo_sided_bounds(old_logp, negative, delta, epsilon)
    return _select_by_sign(negative, lo, hi.clamp_(max=torch.finfo(torch.float32).max), torch.float32)


@torch.no_grad()
def _trgppo_sided_bounds(old_logp: torch.Tensor, negative: torch.Tensor, delta: float, epsilon: float):
    """``(lo, hi) = (min(l_KL, 1 - eps), inf)`` where ``negative`` (of ``_sign_mask``) is -1 and
    ``(-inf, max(u_KL, 1 + eps))`` where it is 0: the clamp of PPO's min objective under TRGPPO's range
    (``atr_theory.methods.ratio_objective``), one table interpolation per token."""
    eps = check_nonnegative("epsilon", epsilon)
    table, cells, frac = _trgppo_cells(old_logp, delta)
    bound = _trgppo_read(table, cells.add_(negative & _TABLE_ROWS), frac)
    lo = _select_by_sign(negative, bound, -math.inf, torch.float32).clamp_(max=1.0 - eps)
    return lo, _select_by_sign(negative, math.inf, bound, torch.float32).clamp_(min=1.0 + eps)


# --------------------------------------------------------------------------------------------
# One bound per token, chosen by the sign of the advantage
# --------------------------------------------------------------------------------------------
_INT_OF_FLOAT = {torch.float32: torch.int32, torch.float64: torch.int64}
_STRUCT_OF_FLOAT = {torch.float32: ("<f", "<i"), torch.float64: ("<d", "<q")}


def bound_by_sign(lower: torch.Tensor, upper: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    r"""``u`` where ``A > 0``, ``l`` where ``A < 0`` (and where ``A`` is -0.0; +0.0 takes ``u``): the only bound
    PPO's min objective reads. For ``A > 0``, ``min(w A, clip(w, l, u) A) = min(w, u) A``; for ``A < 0`` it is
    ``max(w, l) A``; at ``A = 0`` it is 0 whichever. Hence ``min(w A, b A)`` with this ``b`` equals PPO's
    objective in value and gradient: ``atr_theory.ratio_objective`` given ``b`` as both bounds reads ``b`` where it
    should. ``dcpo_bound_by_sign`` and ``trgppo_bound_by_sign`` compute it without the other bound; this
    reference takes both (float32 or float64, broadcastable)."""
    return torch.where(torch.signbit(advantages.detach()), lower, upper)


def _sign_mask(x: torch.Tensor) -> torch.Tensor:
    """-1 (all bits set) where the sign bit of float32/float64 ``x`` is set (``x < 0`` or ``-0.0``), else 0, as the
    integer type of the same width: an arithmetic shift of the bits, no boolean tensor."""
    if x.dtype not in _INT_OF_FLOAT:
        raise TypeError(f"a sign mask needs a float32 or float64 tensor, got {x.dtype}")
    return x.view(_INT_OF_FLOAT[x.dtype]) >> (8 * x.element_size() - 1)


@torch.compiler.assume_constant_result
def _float_bits(value: float, dtype: torch.dtype) -> int:
    """The bit pattern of ``value`` rounded to ``dtype`` (float32 or float64), as a signed integer."""
    float_format, int_format = _STRUCT_OF_FLOAT[dtype]
    return struct.unpack(int_format, struct.pack(float_format, value))[0]


def _select_by_sign(
    mask: torch.Tensor, negative: float | torch.Tensor, positive: float | torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """``negative`` where ``mask`` (of ``_sign_mask``) is -1, ``positive`` where it is 0, exactly, as ``dtype``
    (float32 or float64); each a number or a tensor (cast to ``dtype``, broadcast to ``mask``): the bit select
    ``((n ^ p) & mask) ^ p`` (two or three integer passes; ``torch.where`` on a boolean is ~5x a multiply here)."""
    n, p = _bits_of(negative, dtype), _bits_of(positive, dtype)
    n_xor_p = n ^ p
    if isinstance(n_xor_p, torch.Tensor) and n_xor_p.shape == torch.broadcast_shapes(n_xor_p.shape, mask.shape):
        selected = n_xor_p.bitwise_and_(mask)  # a fresh tensor of the result's shape: no second buffer
    else:
        selected = torch.bitwise_and(mask, n_xor_p)
    return selected.bitwise_xor_(p).view(dtype)


def _bits_of(x: float | torch.Tensor, dtype: torch.dtype) -> int | torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().to(dtype).view(_INT_OF_FLOAT[dtype])
    return _float_bits(x, dtype)
