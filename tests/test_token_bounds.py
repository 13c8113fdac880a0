"""atr_theory.token_bounds: one bound per token, chosen by the sign of the advantage, and the divergence masks' decisions
at every representable log-ratio near their bounds, against mpmath."""

import math

import mpmath as mp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from mp_reference import float32_log_p_grid

import atr_theory as at
from tests.loss_batches import log_prob_pair

mp.mp.dps = 50


# --------------------------------------------------------------------------------------------
# one bound per token, chosen by the sign of the advantage (what PPO's min objective reads)
# --------------------------------------------------------------------------------------------
def _signed_advantages(n: int, seed: int, dtype) -> torch.Tensor:
    """Random signs and sizes, with +0.0 and -0.0 in it (the sign bit decides, not the value)."""
    g = torch.Generator().manual_seed(seed)
    adv = torch.randn(n, generator=g, dtype=torch.float64).to(dtype)
    adv[:4] = torch.tensor([0.0, -0.0, 1e-30, -1e-30], dtype=dtype)
    return adv


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 10_000),
    st.sampled_from([torch.float32, torch.float64]),
    st.sampled_from([0.0, 0.01, 0.16, 0.3]),
    st.sampled_from([0.0, 0.2, 0.28]),
    st.sampled_from([0.5, 1.0, 3.0, 10.0]),
)
def test_dcpo_bound_by_sign_is_the_selected_bound_bit_for_bit(seed, dtype, el, eh, cap):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(200, generator=g, dtype=torch.float64) * torch.tensor(800.0) ** torch.rand(200, generator=g)
    old = old.to(dtype)
    adv = _signed_advantages(200, seed, dtype)
    lo, hi = at.ranges.dcpo_clip_range_from_log(old, el, eh, ratio_cap=cap)
    # the sign bit, read independently: copysign(1, -0.0) = -1
    expected = torch.where(torch.copysign(torch.ones_like(adv), adv) > 0, hi, lo)
    got = at.token_bounds.dcpo_bound_by_sign(old, adv, el, eh, ratio_cap=cap)
    assert got.dtype == dtype and torch.equal(got, expected)
    assert torch.equal(at.token_bounds.bound_by_sign(lo, hi, adv), expected)


@pytest.mark.parametrize("delta, eps", [(0.01, 0.2), (0.07, 0.2), (0.07, 0.0), (2.0, 0.5)])
def test_trgppo_bound_by_sign_is_the_selected_clipped_bound(delta, eps):
    """Against both bounds from the table (same cells, so bit for bit) clipped to ``1 -+ eps`` as TRGPPO's range
    is, and against the float64 roots: ``|b - bound| < 1e-7`` for the lower bound, float32 rounding for the upper."""
    u = float32_log_p_grid()
    adv = _signed_advantages(u.numel(), 0, torch.float32)
    lo, hi = at.token_bounds.trgppo_kl_range_table(u, delta)
    lo, hi = lo.clamp(max=1 - eps), hi.clamp(min=1 + eps)
    positive = torch.copysign(torch.ones_like(adv), adv) > 0
    big = torch.finfo(torch.float32).max
    got = at.token_bounds.trgppo_bound_by_sign(u, adv, delta, eps)
    assert torch.equal(got, torch.where(positive, hi.clamp(max=big), lo))
    assert bool(torch.isfinite(got).all())
    y_lo, y_hi = at.ranges.trgppo_kl_log_range_torch(torch.exp(u.double()).clamp(min=1e-300), delta)
    ref = torch.where(positive, torch.exp(y_hi).clamp(min=1 + eps), torch.exp(y_lo).clamp(max=1 - eps))
    neg = ~positive
    assert float((got.double() - ref)[neg].abs().max()) < 1e-7
    fits = positive & (ref < 1e38)
    assert float(((got.double() - ref) / ref)[fits].abs().max()) < 2.0**-23 * (1 + float(y_hi.abs().max())) + 3e-8
    # advantages of any float dtype select the same bounds (the table is float32; rounding keeps every sign)
    for dtype in (torch.float64, torch.float16, torch.bfloat16):
        assert torch.equal(at.token_bounds.trgppo_bound_by_sign(u, adv.to(dtype), delta, eps), got)
    if (delta, eps) == (0.07, 0.2):  # the defaults: the paper's delta and TRGPPO's (Wang et al. 2019) epsilon
        assert torch.equal(at.token_bounds.trgppo_bound_by_sign(u, adv), got)


def test_trgppo_table_reads_float64_log_probs_as_their_float32_rounding_and_needs_a_scalar_delta():
    """The table is indexed by the float32 bits of ``-log p_old``: a float64 ``old_logp`` (a float64 batch) reads
    the cells of its float32 rounding; an array delta is refused by name (the table is built for one delta)."""
    u64 = -torch.rand(300, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 50
    adv = torch.linspace(-1, 1, 300, dtype=torch.float64)
    for got, want in zip(
        at.token_bounds.trgppo_kl_range_table(u64, 0.07), at.token_bounds.trgppo_kl_range_table(u64.float(), 0.07)
    ):
        assert got.shape == (300,) and torch.equal(got, want)
    assert torch.equal(
        at.token_bounds.trgppo_bound_by_sign(u64, adv), at.token_bounds.trgppo_bound_by_sign(u64.float(), adv)
    )
    for call in (at.token_bounds.trgppo_kl_range_table, lambda u, d: at.token_bounds.trgppo_bound_by_sign(u, adv, d)):
        with pytest.raises(ValueError, match=r"^delta must be a scalar, got an array of shape \(2,\)$"):
            call(u64, np.array([0.07, 0.1]))


def test_a_sign_mask_needs_float32_or_float64():
    with pytest.raises(TypeError, match="^a sign mask needs a float32 or float64 tensor, got torch.bfloat16$"):
        at.token_bounds.dcpo_bound_by_sign(torch.tensor([-0.5]), torch.tensor([1.0], dtype=torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_select_by_sign_casts_a_tensor_of_another_dtype_as_documented(dtype):
    """``_select_by_sign`` takes each side as a number or a tensor, cast to ``dtype``: a float64 tensor beside a
    float32 result (and the reverse) is rounded to ``dtype`` first, not reinterpreted bit by bit (mutation testing:
    every caller in the package passes a tensor already of ``dtype``, which hid a dropped cast)."""
    other = torch.float64 if dtype == torch.float32 else torch.float32
    x = torch.tensor([-0.3, 0.4, -0.0, 2.5], dtype=dtype)
    negative = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=other)
    got = at.token_bounds._select_by_sign(at.token_bounds._sign_mask(x), negative, 7.0, dtype)
    expected = torch.where(torch.signbit(x), negative.to(dtype), torch.tensor(7.0, dtype=dtype))
    assert got.dtype == dtype and torch.equal(got, expected)


_EXACT_DIVERGENCE = {  # y = log w, in mpmath: the definitions as the paper and Table 3 write them (in w)
    "atr": ("kl3", lambda w, y: w - 1 - y),
    "kl1": ("kl1", lambda w, y: -y),
    "kl2": ("kl2", lambda w, y: y * y / 2),
    "is_kl3": ("is_kl3", lambda w, y: 1 - w + w * y),
}


def _exact_at_most(method: str, y: float, delta: float) -> bool:
    """The method's divergence of the float ``y = log w`` is ``<= delta``, in mpmath with digits enough for the
    cancellation at small ``|y|`` (2 |log10 y| extra): exact for these comparisons."""
    if y == 0.0:
        return True
    with mp.workdps(60 + 2 * max(0, -math.floor(math.log10(abs(y))))):
        t = mp.mpf(y)
        return bool(_EXACT_DIVERGENCE[method][1](mp.exp(t), t) <= mp.mpf(delta))


def _representable_neighbours(center: float, dtype: torch.dtype, steps: int) -> torch.Tensor:
    """The ``2 steps + 1`` values of ``dtype`` nearest ``center``, in order (torch.nextafter walks them)."""
    c = torch.tensor([center], dtype=torch.float64).to(dtype)
    values, down, up = [c], c, c
    for _ in range(steps):
        down = torch.nextafter(down, torch.tensor([-math.inf], dtype=dtype))
        up = torch.nextafter(up, torch.tensor([math.inf], dtype=dtype))
        values = [down, *values, up]
    return torch.cat(values)


@pytest.mark.parametrize("method", list(_EXACT_DIVERGENCE))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("delta", [1e-200, 1e-9, 0.07, 0.3, 2.0, 20.0, 50.0])  # roots inside the +-60 log-ratio clamp
def test_divergence_masks_decide_every_representable_log_ratio_near_their_bounds_exactly(method, delta, dtype):
    """ATR, KL1, KL2 and IS-KL3 in the mask form keep a token iff the divergence of its log w is <= delta in exact
    arithmetic (mpmath, the definitions in w), for the 25 representable values of log w on each side of each finite
    root: no decision left to rounding. (The per-token evaluation this replaced fails it: for atr in 12 of 21
    cases, and the next test.)"""
    kind = _EXACT_DIVERGENCE[method][0]
    roots = [r for r in at.ranges._float64_log_range(kind, delta) if math.isfinite(r)]
    y = torch.cat([_representable_neighbours(float(r), dtype, 25) for r in roots])[None, :]
    y = y.clamp(-at.loss.LOG_RATIO_CLAMP, at.loss.LOG_RATIO_CLAMP)
    logp, old = log_prob_pair(y)  # logp - old == y exactly
    mask = torch.ones_like(y, dtype=torch.bool)
    out = at.policy_loss(logp, old, torch.ones(1, dtype=dtype), mask, method=method, delta=delta, form="mask")
    expected = [_exact_at_most(method, float(v), delta) for v in y[0].double()]
    assert out.result.kept[0].tolist() == expected
    assert 0 < sum(expected) < len(expected)  # the window straddles the bounds
    lo, hi = at.ranges.log_range_of_dtype(kind, delta, torch.float64)
    for bound, outward in ((lo, -math.inf), (hi, math.inf)):
        if math.isfinite(bound):
            assert _exact_at_most(method, bound, delta)
            assert not _exact_at_most(method, math.nextafter(bound, outward), delta)


def test_the_former_per_token_k3_test_left_float32_decisions_to_rounding():
    """Why the bounds: ``expm1(y) - y <= delta`` in float32 disagrees with exact arithmetic near the roots."""
    roots = at.kl3_clip_log_range(0.07)
    y = torch.cat([_representable_neighbours(float(r), torch.float32, 25) for r in roots])
    per_token = (at.kl3_from_log_ratio(y) <= 0.07).tolist()
    exact = [_exact_at_most("atr", float(v), 0.07) for v in y.double()]
    assert per_token != exact


def test_log_range_of_dtype_refuses_an_unknown_kind_or_dtype_naming_it():
    with pytest.raises(ValueError, match="'kl9'"):
        at.ranges.log_range_of_dtype("kl9", 0.1)
    with pytest.raises(TypeError, match="float16"):
        at.ranges.log_range_of_dtype("kl3", 0.1, torch.float16)
    assert at.ranges.log_range_of_dtype("is_kl3", 2.0)[0] == -math.inf  # no lower bound for delta >= 1
    assert at.ranges.log_range_of_dtype("kl1", 0.1)[1] == math.inf  # k1 never limits w from above
