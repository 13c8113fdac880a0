"""Ratio ranges against independent high-precision computations (mpmath at 50 digits, scipy brentq)."""

import math
import warnings

import mpmath as mp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from mp_reference import binary_kl_log_roots_80_digits, bisect_log
from scipy.optimize import brentq

import atr_theory as at
from atr_theory.ranges import bernoulli_kl_of_log_ratio

mp.mp.dps = 50
log_delta = st.floats(min_value=math.log(1e-12), max_value=math.log(50.0))


def mp_lambert_range(delta: float):
    z = -mp.exp(-1 - mp.mpf(delta))
    return -mp.lambertw(z, 0).real, -mp.lambertw(z, -1).real


def mp_k3(y):
    y = mp.mpf(y)
    return mp.exp(y) - 1 - y


@pytest.mark.parametrize("delta", [1e-12, 1e-9, 1e-6, 1e-3, 0.01, 0.07, 0.2, 1.0, 5.0, 20.0, 50.0])
def test_kl3_range_matches_mpmath_lambert_w(delta):
    lo, hi = at.kl3_clip_range(delta)
    L, U = mp_lambert_range(delta)
    assert abs((lo - L) / L) < 1e-14
    assert abs((hi - U) / U) < 1e-14
    # the log-range carries the excursions 1 - l and u - 1 to full relative precision
    ylo, yhi = at.kl3_clip_log_range(delta)
    assert abs((ylo - mp.log(L)) / mp.log(L)) < 1e-13
    assert abs((yhi - mp.log(U)) / mp.log(U)) < 1e-13


def test_kl3_range_paper_numbers():
    lo, hi = at.kl3_clip_range(0.07)
    assert (round(lo, 3), round(hi, 3)) == (0.671, 1.422)
    assert (round(1 - lo, 3), round(hi - 1, 3)) == (0.329, 0.422)  # the eps of the paper's Table 3


@settings(max_examples=300, deadline=None)
@given(log_delta)
def test_kl3_range_is_asymmetric_for_every_delta(ld):
    delta = math.exp(ld)
    ylo, yhi = at.kl3_clip_log_range(delta)
    lo, hi = at.kl3_clip_range(delta)
    assert 0 < lo < 1 < hi
    assert 1 - lo < hi - 1
    # in log w the asymmetry is the other way round: the range reaches further below 0 than above
    # (k3(e^y) = e^y - 1 - y grows exponentially for y > 0, linearly for y < 0)
    assert -ylo > yhi
    for y in (ylo, yhi):  # k3 at the bounds is delta, evaluated at 50 digits
        assert abs(mp_k3(y) / delta - 1) < 1e-12


@settings(max_examples=100, deadline=None)
@given(log_delta, log_delta)
def test_kl3_range_is_monotone_in_delta(a, b):
    d1, d2 = sorted((math.exp(a), math.exp(b)))
    if d1 == d2:
        return
    l1, u1 = at.kl3_clip_range(d1)
    l2, u2 = at.kl3_clip_range(d2)
    assert l2 <= l1 and u1 <= u2


def test_kl3_range_vectorised_equals_scalar():
    deltas = np.array([1e-10, 0.07, 3.0])
    lo, hi = at.kl3_clip_range(deltas)
    for d, a, b in zip(deltas, lo, hi):
        assert (a, b) == pytest.approx(at.kl3_clip_range(float(d)), rel=1e-15)


@settings(max_examples=200, deadline=None)
@given(log_delta)
def test_kl3_delta_from_bound_inverts_the_range(ld):
    delta = math.exp(ld)
    lo, hi = at.kl3_clip_range(delta)
    for b in (lo, hi):
        if b != 1.0:
            assert at.kl3_delta_from_bound(b) == pytest.approx(delta, rel=1e-9 if delta < 1e-6 else 1e-12)


def test_kl1_and_kl2_ranges_bound_their_estimators():
    for delta in (1e-6, 0.07, 2.0):
        lo, hi = at.kl1_clip_range(delta)
        assert hi == math.inf and float(-mp.log(lo)) == pytest.approx(delta, rel=1e-14)
        lo, hi = at.kl2_clip_range(delta)
        assert float(mp.log(lo) ** 2 / 2) == pytest.approx(delta, rel=1e-13)
        assert float(mp.log(hi) ** 2 / 2) == pytest.approx(delta, rel=1e-13)
        assert lo * hi == pytest.approx(1.0, rel=1e-15)  # symmetric in log w


@pytest.mark.parametrize("delta", [1e-10, 1e-4, 0.07, 0.5, 0.999, 1.0, 3.0, 40.0])
def test_is_kl3_range_bounds_its_estimator(delta):
    lo, hi = at.is_kl3_clip_range(delta)
    f = lambda w: 1 - mp.mpf(w) + mp.mpf(w) * mp.log(w)
    assert float(f(hi)) == pytest.approx(delta, rel=1e-12)
    if delta < 1:
        assert 0 < lo < 1 and float(f(lo)) == pytest.approx(delta, rel=1e-9)
    else:
        assert lo == 0.0  # 1 - w + w log w < 1 for every w in (0, 1): no lower bound
    # compared with KL3 the whole range shifts down: lower l and lower u
    l3, u3 = at.kl3_clip_range(delta)
    assert lo < l3 and hi < u3


@settings(max_examples=60, deadline=None)
@given(st.floats(1e-6, 1.0), st.floats(1e-4, 1.0))
def test_trgppo_roots_solve_binary_kl_and_match_brentq(p, delta):
    ylo, yhi = at.ranges.trgppo_kl_log_range(p, delta)
    ylo, yhi = float(ylo[0]), float(yhi[0])
    lo, hi = math.exp(ylo), math.exp(yhi)
    f = lambda y: float(bernoulli_kl_of_log_ratio(y, p)) - delta
    a = ((1 - p) * math.log1p(-p) - delta) / p - 1.0 if p < 1 else -delta - 1.0
    ref_lo = brentq(f, a, 0.0, xtol=1e-300, rtol=1e-15, maxiter=500)
    assert ylo == pytest.approx(ref_lo, rel=1e-9, abs=1e-12)
    if p < 1:
        b = -math.log(p) * (1 - 1e-12)
        if f(b) > 0:  # else the root lies within rounding of w = 1/p, where the KL diverges
            ref_hi = brentq(f, 0.0, b, xtol=1e-300, rtol=1e-15, maxiter=500)
            assert yhi == pytest.approx(ref_hi, rel=1e-9, abs=1e-12)
        assert lo < 1 <= hi <= 1 / p * (1 + 1e-15)
    # independent check at 50 digits: binary KL(p || p w) at the lower root equals delta
    w = mp.exp(ylo)
    kl = p * mp.log(1 / w) + (1 - mp.mpf(p)) * mp.log((1 - mp.mpf(p)) / (1 - p * w)) if p < 1 else -mp.log(w)
    assert float(kl) == pytest.approx(delta, rel=1e-6)


def test_trgppo_range_only_widens_ppo_range():
    p = np.logspace(-6, 0, 50)
    lo, hi = at.trgppo_clip_range(p, 0.07, 0.2)
    assert np.all(lo <= 0.8) and np.all(hi >= 1.2)
    # low-probability tokens get the widest range (Wang et al. 2019's point)
    assert hi[0] > hi[-1]


@settings(max_examples=200, deadline=None)
@given(st.floats(1e-4, 1.0), st.floats(0.01, 0.3), st.floats(0.01, 0.3))
def test_dcpo_bounds_solve_their_quadratics(p, el, eh):
    lo, hi = at.dcpo_clip_range(np.array([p]), el, eh, ratio_cap=1e9)
    lo, hi = float(lo[0]), float(hi[0])
    # DCPO bounds the change of the probability itself: pi_new * |pi_new - p| / p = eps
    assert p * hi * (hi - 1) == pytest.approx(eh, rel=1e-9)
    if 1 - 4 * el / p >= 0:
        assert p * lo * (1 - lo) == pytest.approx(el, rel=1e-9)
    else:
        assert lo == 0.5


@settings(max_examples=200, deadline=None)
@given(st.floats(-800.0, 0.0), st.sampled_from([0.0, 0.01, 0.16, 0.3]), st.sampled_from([0.0, 0.2, 0.3]))
def test_dcpo_range_from_log_p_is_the_range_of_p(log_p, el, eh):
    """The torch path of the dcpo method (``1/p = exp(-log p)``) against the numpy bounds of ``p`` itself (which
    solve their quadratics, above): float64 to a few ulps, also where ``p`` underflows and at ``epsilon = 0``."""
    lo, hi = at.ranges.dcpo_clip_range_from_log(torch.tensor([log_p], dtype=torch.float64), el, eh, ratio_cap=10.0)
    ref_lo, ref_hi = at.dcpo_clip_range(np.exp(np.array([log_p])), el, eh, ratio_cap=10.0)
    assert float(lo[0]) == pytest.approx(float(ref_lo[0]), rel=4e-16, abs=0)
    assert float(hi[0]) == pytest.approx(float(ref_hi[0]), rel=4e-16, abs=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dcpo_range_of_a_tensor_is_the_numpy_range_and_the_defaults_are_dcpos(dtype):
    """``dcpo_clip_range`` given a torch tensor (its own branch) against the numpy bounds of the same ``p`` (which solve
    their quadratics, above), to the tensor's precision; called without parameters, it and its log / by-sign siblings
    use DCPO's published defaults eps_l = 0.16, eps_u = 0.2 and lime-RL/DCPO's cap 10 (Yang et al. 2025)."""
    p64 = np.concatenate([np.logspace(-12, 0, 97), [0.64, 0.5, 1e-300, 0.0]])
    p = torch.tensor(p64, dtype=dtype)
    ref_lo, ref_hi = at.dcpo_clip_range(p.double().numpy(), 0.16, 0.2, 10.0)
    lo, hi = at.dcpo_clip_range(p)
    assert lo.dtype == hi.dtype == dtype
    tol = dict(rtol=4 * torch.finfo(dtype).eps, atol=0)
    torch.testing.assert_close(lo, torch.as_tensor(ref_lo, dtype=dtype), **tol)
    torch.testing.assert_close(hi, torch.as_tensor(ref_hi, dtype=dtype), **tol)
    assert bool((hi == 10.0).any()) and bool((lo > 0.5).any()) and bool((lo == 0.5).any())  # every branch reached
    np.testing.assert_array_equal(at.dcpo_clip_range(p64), at.dcpo_clip_range(p64, 0.16, 0.2, 10.0))
    log_p = torch.log(torch.tensor(p64[:-2]))
    for got, want in zip(
        at.ranges.dcpo_clip_range_from_log(log_p), at.ranges.dcpo_clip_range_from_log(log_p, 0.16, 0.2, 10.0)
    ):
        assert torch.equal(got, want)
    adv = torch.where(torch.arange(log_p.numel()) % 2 == 0, -1.0, 1.0).double()  # both bounds at every scale of p
    by_sign = at.token_bounds.dcpo_bound_by_sign(log_p, adv, 0.16, 0.2, 10.0)
    assert torch.equal(at.token_bounds.dcpo_bound_by_sign(log_p, adv), by_sign)
    assert bool((by_sign > 0.5).logical_and(by_sign < 1).any())  # a lower bound above 1/2: eps_l is read


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: at.kl3_clip_range(0.0), "delta must be a finite number > 0, got 0.0"),
        (lambda: at.kl3_clip_log_range(-1.0), "delta must be a finite number > 0, got -1.0"),
        (lambda: at.kl1_clip_range(float("nan")), "delta must be a finite number > 0, got nan"),
        (lambda: at.kl2_clip_range(float("inf")), "delta must be a finite number > 0, got inf"),
        (lambda: at.is_kl3_clip_range(0.0), "delta must be a finite number > 0, got 0.0"),
        (lambda: at.kl3_delta_from_bound(-0.5), "bound must be a finite number > 0, got -0.5"),
        (lambda: at.trgppo_kl_range([0.5], 0.0), "delta must be a finite number > 0, got 0.0"),
        (lambda: at.trgppo_kl_range([0.0, 0.5], 0.07), r"p_old must lie in \(0, 1\], got \[0.0, 0.5\]"),
        (lambda: at.trgppo_clip_range([0.5], 0.07, -0.2), "epsilon must be a finite number >= 0, got -0.2"),
        (
            lambda: at.ranges.trgppo_kl_log_range_torch(torch.tensor([0.5]), 0.0),
            "delta must be a finite number > 0, got 0.0",
        ),
        (
            lambda: at.token_bounds.trgppo_kl_range_table(torch.tensor([-0.5]), -1.0),
            "delta must be a finite number > 0, got -1.0",
        ),
    ],
)
def test_every_range_names_its_bad_argument_exactly(call, message):
    """The whole message, anchored: a substring search (``match="delta"``) also accepts a garbled name."""
    with pytest.raises(ValueError, match=f"^{message}$"):
        call()


def test_ranges_reject_bad_delta():
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        for fn in (at.kl3_clip_range, at.kl1_clip_range, at.kl2_clip_range, at.is_kl3_clip_range):
            with pytest.raises(ValueError, match="delta"):
                fn(bad)
    with pytest.raises(ValueError, match="p_old"):
        at.trgppo_kl_range([0.0, 0.5], 0.07)
    with pytest.raises(ValueError, match="bound"):
        at.kl3_delta_from_bound(1.0)


@pytest.mark.parametrize("bad", ["0.07", b"0.07", True, None, [0.05, "0.07"], np.array(["0.07"])])
def test_a_delta_that_is_no_number_is_refused_as_numpy_would_read_it(bad):
    """numpy reads the text '0.07' (and True) as a number: ``np.asarray('0.07', dtype=float)`` is 0.07. The ranges
    take numbers only, and say what they got."""
    assert float(np.asarray(["0.07"], dtype=float)[0]) == 0.07  # what the check stands between
    for fn in (at.kl3_clip_range, at.kl1_clip_range, at.kl2_clip_range, at.is_kl3_clip_range):
        with pytest.raises(TypeError, match=r"^delta must be a number or an array of numbers, got a "):
            fn(bad)


def test_numbers_of_every_numeric_kind_give_the_float_ranges_value():
    import torch

    expected = at.kl3_clip_range(0.5)
    for same in (np.float64(0.5), torch.tensor(0.5, dtype=torch.float64), np.array(0.5), 0.5):
        assert at.kl3_clip_range(same) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(epsilon_low=-0.1), "epsilon_low must be a finite number >= 0, got -0.1"),
        (dict(epsilon_high=float("nan")), "epsilon_high must be a finite number >= 0, got nan"),
        (dict(ratio_cap=0.0), "ratio_cap must be a finite number > 0, got 0.0"),
        (dict(ratio_cap=np.array([5.0, 10.0])), r"ratio_cap must be a scalar, got an array of shape \(2,\)"),
    ],
)
def test_dcpo_ranges_name_a_bad_argument_exactly(kwargs, message):
    """Both DCPO entry points (of p_old, numpy; of log p_old, torch): the whole message, anchored."""
    with pytest.raises(ValueError, match=f"^{message}$"):
        at.dcpo_clip_range(np.array([0.5]), **kwargs)
    with pytest.raises(ValueError, match=f"^{message}$"):
        at.ranges.dcpo_clip_range_from_log(torch.tensor([-0.7]), **kwargs)


@pytest.mark.parametrize("delta", [1e-6, 0.07, 1.0, 5.0])
def test_trgppo_torch_newton_matches_the_bisection(delta):
    import torch

    p = np.concatenate([np.logspace(-12, 0, 300), [1.0, 0.5, 0.999]])
    a_lo, a_hi = at.ranges.trgppo_kl_log_range(p, delta)
    b_lo, b_hi = at.ranges.trgppo_kl_log_range_torch(torch.tensor(p), delta)
    np.testing.assert_allclose(b_lo.numpy(), a_lo, rtol=1e-9, atol=1e-300)
    np.testing.assert_allclose(b_hi.numpy(), a_hi, rtol=1e-8, atol=1e-15)  # both lose digits where the root is ~0


@pytest.mark.parametrize("delta", [1e-12, 1e-8, 1e-4, 0.07, 2.0, 20.0])
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_trgppo_roots_against_mpmath_from_tiny_to_unit_p_old(backend, delta):
    """Both solvers to a few ulp: |dy| <= 4e-15 max(1, |y|) (measured <= 8.6e-16), i.e. the ratio bounds
    l_KL = e^y, u_KL to a few ulp, for p_old from 1e-200 to 1 and delta from 1e-12 to 20. The roots are well
    conditioned (dy/d delta = 1/f', a relative change of delta moves y relatively); the textbook KL
    -p y + q [log q - log(1 - p e^y)] was not: it cancels terms ~p|y| to get ~p y^2 / 2q, and the solvers built on
    it were off by up to 1e-10 at delta = 1e-12 and 4e-13 at 1e-8 (both backends) until the KL was evaluated as
    p k3(y) + q k3(y'). Before that the torch solver also took log(1 - x) of a rounded 1 - x: 2.3e-7 relative in
    l_KL at delta = 1e-8, p_old = 1.4e-10."""
    import torch

    p = np.array([1e-200, 1e-100, 1e-30, 1e-12, 1.430722989193791e-10, 1e-6, 1e-3, 0.1, 0.5, 0.8, 0.99])
    p = np.concatenate([p, 1 - np.array([1e-3, 1e-6, 1e-8, 6.3e-9, 1e-9, 1e-12, 1e-15]), [1.0]])
    if backend == "numpy":
        lo, hi = at.ranges.trgppo_kl_log_range(p, delta)
    else:
        lo, hi = (t.numpy() for t in at.ranges.trgppo_kl_log_range_torch(torch.tensor(p), delta))
    for i, pi in enumerate(p):
        for got, want in zip((lo[i], hi[i]), binary_kl_log_roots_80_digits(float(pi), delta)):
            assert abs(mp.mpf(float(got)) - want) <= 4e-15 * max(1.0, abs(float(want))), (pi, got, want)


def _kl3_log_roots_mpmath(delta: float) -> tuple:
    """Both roots of ``e^y - 1 - y = delta`` at 700 digits, solved in ``t = y / sqrt(2 delta)`` (relative accuracy
    for any delta down to 1e-300, where ``y`` itself is ~1e-150 and an absolute tolerance would accept anything)."""
    with mp.workdps(700):
        d = mp.mpf(delta)
        s = mp.sqrt(2 * d)
        lo = -s * mp.findroot(lambda t: (mp.expm1(-s * t) + s * t) / d - 1, 1 + s / 3)
        if d < 1:
            hi = s * mp.findroot(lambda t: (mp.expm1(s * t) - s * t) / d - 1, 1 + s / 3)
        else:
            hi = mp.findroot(lambda y: (mp.expm1(y) - y) / d - 1, mp.log(d + 1) + 1)
        return lo, hi


def test_kl3_log_range_against_mpmath_from_tiny_to_large_delta():
    """log l and log u to 1e-14 relative for delta from 1e-300 to 20. Until this test the series start was taken
    as log of a rounded 1 - sqrt(2 delta): for delta < ~6e-33 it was log(1.0) = 0, Newton cannot leave y = 0
    (f'(0) = 0), and log l came back as 0 instead of -sqrt(2 delta) (100% relative error; l = e^y rounds to 1.0
    there either way, so the ratio bounds were right)."""
    deltas = np.concatenate([10.0 ** np.arange(-300, -2, 7.0), [1e-3, 0.01, 0.07, 0.5, 1.0, 5.0, 20.0]])
    y_lo, y_hi = at.kl3_clip_log_range(deltas)
    for d, a, b in zip(deltas, y_lo, y_hi):
        lo, hi = _kl3_log_roots_mpmath(float(d))
        assert abs(a - lo) <= 1e-14 * abs(lo) and abs(b - hi) <= 1e-14 * abs(hi), (d, a, float(lo), b, float(hi))
    assert at.kl3_clip_log_range(1e-200)[0] < 0.0  # scalar path too


_DIVERGENCES_AND_DEFINITIONS = [  # each estimator of y = log w and its definition, evaluated by mpmath
    (at.kl3_from_log_ratio, lambda t: mp.expm1(t) - t),
    (at.divergence.is_kl3_from_log_ratio, lambda t: mp.exp(t) * (t - 1) + 1),
]


@pytest.mark.parametrize("dtype, rtol", [("float64", 4e-15), ("float32", 5e-6)])
def test_torch_divergences_against_mpmath_across_the_series_cutoff(dtype, rtol):
    """torch's k3 = e^y - 1 - y and IS-k3 = e^y (y - 1) + 1 to a few ulp of the dtype, relative, from |y| = 1e-8 to
    2 (each value against mpmath of the same, exactly representable, input). The torch path switched to a 4-term
    Taylor only below |y| = 1e-3 until this test: 1.6e-11 relative in float64 (the truncation at 1e-3), 1e-4 in
    float32 (the direct form's cancellation just above it)."""
    import torch

    mags = np.geomspace(1e-8, 2.0, 600)
    y = torch.tensor(np.concatenate([-mags, mags]), dtype=getattr(torch, dtype))
    for fn, exact in _DIVERGENCES_AND_DEFINITIONS:
        got = fn(y).double().numpy()
        with mp.workdps(50):
            want = np.array([float(exact(mp.mpf(float(t)))) for t in y.double()])
        np.testing.assert_allclose(got, want, rtol=rtol, atol=0, err_msg=fn.__name__)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_torch_divergences_in_half_precision_are_the_rounded_exact_value(dtype):
    """k3 and IS-k3 of a half-precision y: within one unit in the last place of the exactly rounded value (mpmath,
    then rounded to the dtype), for |y| from 1e-4 to 8. Computed in the dtype itself they were off by up to 14% / 28%
    (bfloat16) and IS-k3 overflowed float16 at y = 8.9 (inf for a representable 5.9e4)."""
    dt = getattr(torch, dtype)
    mags = np.geomspace(1e-4, 8.0, 400)
    y = torch.tensor(np.concatenate([-mags, mags])).to(dt)
    info = torch.finfo(dt)
    for fn, exact in _DIVERGENCES_AND_DEFINITIONS:
        got = fn(y)
        assert got.dtype == dt
        with mp.workdps(50):
            want = torch.tensor([float(exact(mp.mpf(float(t)))) for t in y.double()], dtype=torch.float64).to(dt)
        err = (got.double() - want.double()).abs()
        ulp = want.double().abs() * info.eps  # one unit in the last place of want, at most
        assert bool(((err <= ulp) | (err <= info.smallest_normal * info.eps)).all()), (fn.__name__, float(err.max()))


@pytest.mark.parametrize("dtype", [np.int8, np.int64, np.float16, np.float32])
def test_numpy_divergences_of_small_or_integer_dtypes_are_computed_in_float64(dtype):
    # numpy evaluates expm1 of an int8 or float16 array in float16 (3 digits): the numpy backend promises float64
    y = np.array([1, 2, -3], dtype=dtype)
    for fn, exact in _DIVERGENCES_AND_DEFINITIONS:
        got = fn(y)
        assert got.dtype == np.float64
        want = [float(exact(mp.mpf(float(t)))) for t in y]
        np.testing.assert_allclose(got, want, rtol=1e-15)


@pytest.mark.parametrize(
    "y",
    [np.array([-128, 127, 100], dtype=np.int8), np.array([300.0, -300.0, 0.5], dtype=np.float16), [0.5, -0.25, 3]],
    ids=["int8", "float16", "list"],
)
def test_numpy_k1_k2_of_small_dtypes_and_lists_are_float64(y):
    """k1 = -y and k2 = y^2 / 2 of a numpy array of any real dtype, or of a list, are float64 values of the exact
    numbers (Python floats as the oracle): in int8 -(-128) wraps to -128 and in float16 300^2 overflows to inf."""
    exact = [float(t) for t in y]
    k1, k2 = at.divergence.kl1_from_log_ratio(y), at.divergence.kl2_from_log_ratio(y)
    assert k1.dtype == k2.dtype == np.float64
    assert k1.tolist() == [-t for t in exact] and k2.tolist() == [t * t / 2 for t in exact]


@pytest.mark.parametrize("delta", [700.0, 744.0, 745.0, 1e3, 1e6])
def test_kl3_range_stays_finite_for_huge_delta(delta):
    """Lambert W's argument -e^{-1-delta} underflows beyond delta ~ 708; the upper bound must not become inf/nan."""
    import warnings

    import mpmath as mp

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y_lo, y_hi = at.kl3_clip_log_range(delta)
        lo, hi = at.kl3_clip_range(delta)
    root = float(mp.findroot(lambda y: mp.expm1(y) - y - delta, mp.log(delta + 1) + 1))
    assert y_hi == pytest.approx(root, rel=1e-14) and hi == pytest.approx(math.exp(root), rel=1e-13)
    assert y_lo == pytest.approx(-(1 + delta), rel=1e-14) and 0.0 <= lo < 1e-300


# ----------------------------------------------------------------------------------------------
# found by mutation testing (make mutation): messages that name the argument, the scalar / array contract
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: at.ranges.trgppo_kl_log_range(0.5, -1.0), "delta"),
        (lambda: at.ranges.trgppo_kl_log_range(0.5, [0.1, 0.2]), "delta"),  # one delta for all tokens
        (lambda: at.ranges.trgppo_kl_log_range(1.5, 0.1), "p_old"),
        (lambda: at.ranges.trgppo_clip_range(0.5, 0.1, -0.2), "epsilon"),
        (lambda: at.ranges.kl3_delta_from_bound(-1.4), "bound"),
        (lambda: at.ranges.kl3_delta_from_bound(1.0), "bound"),
    ],
)
def test_range_functions_name_the_bad_argument(call, name):
    with pytest.raises(ValueError, match=rf"^{name} "):
        call()


@pytest.mark.parametrize(
    "name", ["kl1_clip_range", "kl2_clip_range", "kl3_clip_range", "kl3_clip_log_range", "is_kl3_clip_range"]
)
def test_constant_ranges_give_floats_for_a_scalar_and_arrays_equal_to_the_scalar_calls_for_an_array(name):
    fn = getattr(at.ranges, name)
    deltas = np.array([0.02, 0.07, 0.5])
    lo, hi = fn(deltas)
    assert isinstance(lo, np.ndarray) and isinstance(hi, np.ndarray) and lo.shape == hi.shape == (3,)
    for d, a, b in zip(deltas, lo, hi):
        scalar = fn(float(d))
        assert all(type(v) is float for v in scalar)
        assert (a, b) == pytest.approx(scalar, rel=1e-15, abs=0)
    if name == "kl2_clip_range":  # k2 = y^2 / 2 <= delta: the closed form, by mpmath
        assert hi == pytest.approx([float(mp.exp(mp.sqrt(2 * mp.mpf(float(d))))) for d in deltas], rel=1e-15)


def test_kl3_delta_from_bound_returns_a_float_for_a_scalar_and_an_array_for_an_array():
    scalar = at.ranges.kl3_delta_from_bound(1.4)
    assert type(scalar) is float
    assert scalar == pytest.approx(float(1.4 - 1 - mp.log(1.4)), rel=1e-15)  # k3(1.4) by mpmath
    arr = at.ranges.kl3_delta_from_bound(np.array([0.5, 1.4]))
    assert isinstance(arr, np.ndarray) and arr.shape == (2,)


def test_trgppo_lower_root_at_p_old_one_is_finite():
    # p_old = 1: (1 - p) log(1 - p) is 0 * -inf; the bracket must still be finite. Binary KL(1 || w) = -log w, so
    # the lower root is exactly log l = -delta (and the upper root is 0: the token cannot become more likely)
    y_lo, y_hi = at.ranges.trgppo_kl_log_range(np.array([1.0, 0.5]), 0.1)
    assert y_lo[0] == pytest.approx(-0.1, rel=1e-12) and y_hi[0] == 0.0


def test_the_range_functions_are_quiet_over_their_whole_delta_domain():
    """No RuntimeWarning reaches the user for any delta (a training loop that logs warnings would log one per call):
    IS-k3's Newton iteration for the lower root, which does not exist for delta >= 1 (l = 0), overflowed ``f / f'``
    at delta = 269.153... (found by a mutant of its start point); the values are checked elsewhere."""
    deltas = np.logspace(-300, 6, 3001)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for fn in (at.kl3_clip_range, at.ranges.kl3_clip_log_range, at.is_kl3_clip_range, at.kl2_clip_range):
            lo, hi = fn(deltas)
            assert not np.any(np.isnan(lo)) and not np.any(np.isnan(hi)) and np.all(hi > 0)
        assert at.is_kl3_clip_range(269.1534803926958)[0] == 0.0
        # k2's u = e^sqrt(2 delta) exceeds float64 beyond delta ~ 2.5e5: inf (every finite ratio passes), also for a
        # scalar delta (math.exp raised OverflowError there)
        assert at.kl2_clip_range(1e6) == (0.0, math.inf)
        assert at.kl2_clip_range(2.5e5)[1] == pytest.approx(math.exp(math.sqrt(5e5)), rel=1e-13)


def _is_kl3_roots_mpmath(delta: float) -> tuple[float, float]:
    """The roots of ``IS-k3 = y e^y - (e^y - 1) = delta`` (y = log w) by a log-scale bisection of the definition in
    ``|y|`` at 250 digits (relative precision also for ``|y| ~ 1e-150``): ``(l, u)``, ``l = 0`` for delta >= 1."""

    def root(sign, hi):
        excess = lambda m: sign * m * mp.exp(sign * m) - mp.expm1(sign * m) - delta  # noqa: E731  (> 0 beyond the root)
        return float(mp.exp(sign * bisect_log(excess, "1e-200", hi, dps=250, steps=500)))

    return (root(-1, 800) if delta < 1 else 0.0), root(+1, 50)


@pytest.mark.parametrize(
    "delta",
    [1e-300, 1e-100, 1e-20, 1e-3, 0.07, 0.5, 0.999, 1 - 1e-9, float(np.nextafter(1.0, 0.0)), 1.0, 2.0, 1e6],
)
def test_is_kl3_range_against_mpmath_from_tiny_delta_to_the_end_of_its_lower_root(delta):
    """Both ends of the IS-k3 range against an mpmath bisection of the definition, to 4e-15 relative: from delta =
    1e-300 (where ``u - 1 ~ 1.4e-150``) to delta -> 1-, where the lower root runs off to ``l -> 0`` (l = 2.7e-18 at
    the largest float below 1) and Newton's start matters (a start from ``W_{-1}`` at the wrong point gave l 10% off
    there: a survivor of the full mutmut run); l = 0 for delta >= 1."""
    lo, hi = at.is_kl3_clip_range(delta)
    ref_lo, ref_hi = _is_kl3_roots_mpmath(delta)
    assert hi == pytest.approx(ref_hi, rel=4e-15, abs=0)
    assert lo == pytest.approx(ref_lo, rel=4e-15, abs=0)
    lo_a, hi_a = at.is_kl3_clip_range(np.array([delta, 0.07]))  # the array path gives the scalar's values
    assert (lo_a[0], hi_a[0]) == (lo, hi)


def test_binary_kl_and_trgppo_roots_are_quiet_at_p_old_one():
    # p_old = 1 makes log1p(-p) = -inf and 0 * inf in the branch np.where discards: no RuntimeWarning may reach
    # the user (a training loop that logs warnings would log one per step); values against mpmath
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kl = bernoulli_kl_of_log_ratio(np.array([-0.1, 0.2]), np.array([1.0, 0.5]))
        y_lo, y_hi = at.ranges.trgppo_kl_log_range(np.array([1.0, 0.5]), 0.1)
    p, w = mp.mpf(0.5), mp.exp(mp.mpf(0.2))
    assert kl[0] == pytest.approx(0.1, rel=1e-15)  # KL(1 || w) = -log w
    assert kl[1] == pytest.approx(float(p * mp.log(1 / w) + (1 - p) * mp.log((1 - p) / (1 - p * w))), rel=1e-14)
    assert np.all(np.isfinite(y_lo)) and np.all(np.isfinite(y_hi))


def test_binary_kl_of_small_dtypes_is_float64_and_quiet_beyond_its_domain():
    """Half-precision / integer inputs are evaluated in float64 (numpy would compute float16 with float16 inputs:
    3 digits), against mpmath of the definition at the same numbers; a ratio beyond the domain ``w < 1/p`` (here
    e^800) gives NaN without a RuntimeWarning (the overflow of e^y is expected there)."""
    y16, p16 = np.array([0.2, -1.5, 3.0], dtype=np.float16), np.array([0.3, 0.7, 0.01], dtype=np.float16)
    y8 = np.array([0, -2, 1], dtype=np.int8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for y, p in ((y16, p16), (y8, p16)):
            kl = bernoulli_kl_of_log_ratio(y, p)
            assert kl.dtype == np.float64
            for k, t, q in zip(kl, y.tolist(), p.tolist()):
                pm, w = mp.mpf(q), mp.exp(mp.mpf(t))
                assert k == pytest.approx(
                    float(pm * mp.log(1 / w) + (1 - pm) * mp.log((1 - pm) / (1 - pm * w))), rel=1e-14, abs=1e-300
                )
        assert np.isnan(bernoulli_kl_of_log_ratio(np.array([800.0]), np.array([0.5]))[0])


def test_trgppo_clip_range_defaults_are_the_methods_and_its_upper_floor_is_ppos():
    p = np.array([0.95, 0.99, 0.5, 1e-3])
    params = at.resolve("trgppo").params  # the registered method's defaults (delta, epsilon)
    for got, want in zip(at.trgppo_clip_range(p), at.trgppo_clip_range(p, params["delta"], params["epsilon"])):
        np.testing.assert_array_equal(got, want)
    # u_KL <= 1/p_old (the token's probability cannot pass 1): below 1 + eps for p_old >= 1/1.2, so there the
    # upper bound is PPO's own 1 + eps exactly; for a rare token the KL bound is wider
    _, hi = at.trgppo_clip_range(p, 0.07, 0.2)
    assert hi[0] == hi[1] == 1.2 and hi[3] > 1.2


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_the_four_estimators_of_a_ratio_against_mpmath(backend):
    # k1 = -log w, k2 = (log w)^2 / 2, k3 = w - 1 - log w (Eq. 6), IS-k3 = w log w - w + 1, at 50 digits; the
    # ratios reach the small-|log w| series branches and far tails (1e-6, 1e4)
    import torch

    # exp(+-9e-4): inside torch's Taylor branch (|log w| < 1e-3), where its y^4 term is still ~1e-7 of the value
    w = np.array([1e-6, 0.3, 0.671, math.exp(-9e-4), 1.0 - 1e-9, 1.0, 1.0 + 1e-9, math.exp(9e-4), 1.422, 3.0, 1e4])
    oracle = {
        "kl1": lambda v: -mp.log(v),
        "kl2": lambda v: mp.log(v) ** 2 / 2,
        "kl3": lambda v: v - 1 - mp.log(v),
        "is_kl3": lambda v: v * mp.log(v) - v + 1,
    }
    for name, exact in oracle.items():
        got = getattr(at, name)(torch.tensor(w, dtype=torch.float64) if backend == "torch" else w)
        got = got.numpy() if backend == "torch" else np.asarray(got)
        want = np.array([float(exact(mp.mpf(float(v)))) for v in w])
        # torch's branch for |log w| < 1e-3 is a Taylor polynomial to y^4: its truncation error there is up to
        # ~y^3 / 60 ~ 1.7e-11 relative (numpy sums its series to convergence)
        rtol = 5e-11 if backend == "torch" else 1e-12
        np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-300, err_msg=name)
    for bad, shown in ((np.array([1.0, -0.5]), r"-0\.5"), (0.0, r"0\.0"), (np.array([2.0, np.nan]), "nan")):
        with pytest.raises(ValueError, match=rf"ratio w must be a number > 0, got {shown}"):
            at.kl3(bad)
    with pytest.raises(TypeError, match=r"ratio w must be a real number or array of them, got dtype <U1 \('2'\)"):
        at.kl3("2")
    assert at.kl2([1, 2]) == pytest.approx([0.0, math.log(2) ** 2 / 2], rel=1e-15)  # integers are numbers


def test_trgppo_torch_bounds_refuse_a_p_old_outside_its_domain_naming_it():
    import torch

    for bad, shown in ((0.0, r"0\.0"), (1.5, r"1\.5"), (float("nan"), "nan"), (-0.1, r"-0\.1")):
        with pytest.raises(ValueError, match=rf"p_old must lie in \(0, 1\], got {shown}"):
            at.ranges.trgppo_kl_log_range_torch(torch.tensor([0.5, bad], dtype=torch.float64), 0.07)


def test_trgppo_torch_bounds_need_a_scalar_delta_and_solve_in_float64():
    # one delta for the batch (an array of positive deltas was accepted by mutants 7 and 10 of the 2026-11-24 run);
    # the roots are float64 whatever p_old's dtype ("float64 inside": a float32 p_old gave float32 roots in mutant 12)
    import numpy as np
    import torch

    p = torch.tensor([1e-3, 0.5, 0.9])
    for delta in (np.array([0.1, 0.2]), [0.1, 0.2], torch.tensor([0.1, 0.2])):
        with pytest.raises(ValueError, match=r"^delta must be a scalar"):
            at.ranges.trgppo_kl_log_range_torch(p, delta)
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        y_lo, y_hi = at.ranges.trgppo_kl_log_range_torch(p.to(dtype), 0.07)
        assert y_lo.dtype == y_hi.dtype == torch.float64
        ref_lo, ref_hi = at.ranges.trgppo_kl_log_range(p.to(dtype).double().numpy(), 0.07)  # bisection, float64
        assert np.allclose(y_lo.numpy(), ref_lo, rtol=1e-14) and np.allclose(y_hi.numpy(), ref_hi, rtol=1e-14)
