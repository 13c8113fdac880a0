"""DPPO's divergences (atr_theory.methods.divergence_masks) against mpmath, and the rollout-correction layer
(atr_theory.layers.RolloutCorrection) against a loop over each sequence; the bad inputs each refuses.

verl 0.9.1 pins the rules and the layer on random batches (tests/test_verl_oracle.py); here: exactness where verl's
own numerics leave it (its ``+ 1e-8`` in the binary KL), the limit that relates DPPO-KL to ATR, the geometric level
verl does not have."""

import math

import mpmath as mp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import atr_theory as at
from atr_theory.layers import RolloutCorrection, SequenceMask, high_entropy_mask, rollout_correction_weights
from atr_theory.methods.divergence_masks import binary_kl, binary_kl_fast, binary_kl_fast_error_bound, binary_tv
from atr_theory.ranges import trgppo_kl_log_range
from tests.mp_reference import binary_kl as mp_binary_kl
from tests.mp_reference import float32_log_p_grid

mp.mp.dps = 50
D = torch.float64


def _verl_binary_kl(p_old: float, p: float) -> float:
    """verl 0.9.1's ``dppo_kl`` expression, in float64 as verl evaluates it."""
    return p_old * (math.log(p_old) - math.log(p)) + (1 - p_old) * math.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))


@settings(max_examples=200, deadline=None)
@given(
    log_p_old=st.floats(-30.0, -1e-12),
    u=st.floats(0.001, 0.999),
)
def test_binary_kl_equals_mpmath(log_p_old, u):
    """Relative error <= 1e-12 for every p_old in [1e-13, 1 - 1e-12] and every w with p_old w < 1 (w drawn in log
    space between p_old / 100 and 1 / p_old)."""
    p_old = mp.exp(mp.mpf(log_p_old))
    log_w_max = -mp.mpf(log_p_old)
    log_w = float(-4.6 + u * (float(log_w_max) + 4.6))  # w in [e^-4.6, 1 / p_old)
    if log_w >= float(log_w_max):
        return
    got = float(binary_kl(torch.tensor(log_w, dtype=torch.float64), torch.tensor(log_p_old, dtype=torch.float64)))
    want = mp_binary_kl(p_old, mp.exp(mp.mpf(log_w)))
    assert abs(got - float(want)) <= 1e-12 * float(want) + 1e-300, (log_p_old, log_w, got, float(want))


def test_verls_binary_kl_is_off_where_one_minus_p_is_tiny():
    """verl's ``log((1 - p_old + 1e-8) / (1 - p + 1e-8))`` where the new probability is within ~1e-8 of 1: at
    ``p_old = 1 - 1e-6``, ``p = 1 - 1e-9`` its KL is ~40% low; ours is exact to 1e-12. (Decisions differ only at
    bounds this small, so verl's masks on realistic batches are the same: tests/test_verl_oracle.py.)"""
    p_old, p = 1 - 1e-6, 1 - 1e-9
    want = float(mp_binary_kl(mp.mpf(p_old), mp.mpf(p) / mp.mpf(p_old)))
    ours = float(
        binary_kl(torch.tensor(math.log(p) - math.log(p_old), dtype=D), torch.tensor(math.log(p_old), dtype=D))
    )
    theirs = _verl_binary_kl(p_old, p)
    assert abs(ours - want) <= 1e-9 * want  # the inputs' own rounding (log of 1 - 1e-9) bounds this
    assert abs(theirs - want) > 0.3 * want


@pytest.mark.parametrize("w", [0.5, 0.8, 1.3, 2.0, 5.0])
def test_binary_kl_per_unit_probability_tends_to_k3(w):
    """``KL(Ber(p) || Ber(p w)) / p -> k3(w) = w - 1 - log w`` as ``p -> 0``: for rare tokens DPPO-KL at bound
    ``delta`` is ATR at ``delta / p``. The gap shrinks like ``p`` (checked at 1e-4 and 1e-8)."""
    k3 = w - 1 - math.log(w)
    gaps = []
    for p in (1e-4, 1e-8):
        kl = float(
            binary_kl(torch.tensor(math.log(w), dtype=torch.float64), torch.tensor(math.log(p), dtype=torch.float64))
        )
        gaps.append(abs(kl / p - k3) / k3)
    assert gaps[1] < 1e-6 and gaps[1] < gaps[0] * 1e-3


def _exact_binary_kl(y: float, old_logp: float) -> float:
    """KL(Ber(p) || Ber(p e^y)) of the given floats, at 50 digits; ``+inf`` where ``p e^y >= 1``."""
    p, w = mp.exp(mp.mpf(old_logp)), mp.exp(mp.mpf(y))
    if p == 1 and y <= 0:
        return -y
    return math.inf if p * w >= 1 else float(mp_binary_kl(p, w))


@settings(max_examples=300, deadline=None)
@given(
    dtype=st.sampled_from([torch.float32, torch.float64]),
    log_q=st.floats(-40.0, 0.0),
    u=st.floats(-1.0, 1.0),
    scale=st.sampled_from([1e-6, 1e-3, 0.1, 1.0, 5.0]),
)
def test_binary_kl_fast_is_within_its_bound_of_mpmath(dtype, log_q, u, scale):
    """``binary_kl_fast`` is within ``binary_kl_fast_error_bound`` of the 50-digit KL of the very floats it was given,
    in float32 and float64, for every ``p_old`` from ``1 - 1e-17`` down to ``e^-40``... (drawn through ``q = 1 - p``,
    so ``p`` near 1 is as likely as ``p`` near 0) and ratios from ``w ~ 1`` to far beyond ``1 / p`` (infinite KL)."""
    q = math.exp(log_q)
    old = math.log1p(-q) if q < 1 else -40.0
    y = scale * u if u < 0 else scale * u - old * min(1.0, scale)  # up to past p w = 1
    y_t, old_t = torch.tensor(y, dtype=dtype), torch.tensor(old, dtype=dtype)
    got = float(binary_kl_fast(y_t, old_t))
    want = _exact_binary_kl(float(y_t), float(old_t))
    if math.isinf(want):
        assert got == math.inf
        return
    bound = float(binary_kl_fast_error_bound(y_t, old_t))
    assert abs(got - want) <= bound, (dtype, float(old_t), float(y_t), got, want, bound)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_binary_kl_fast_is_exact_at_its_special_points(dtype):
    """``y = 0``: exactly 0 (a token that did not move is never past any bound); ``p = 1``: ``-y``; new probability
    exactly 1 (``logp = 0`` with ``p < 1``) or above it: ``+inf``; the padding (``old_logp = logp = 0``): 0."""
    old = torch.tensor([-3.0, -1e-7, 0.0, 0.0, -0.0166, -0.5, 0.0], dtype=dtype)
    logp = torch.tensor([-3.0, -1e-7, -0.25, 0.0, 0.0, 0.1, 0.0], dtype=dtype)
    got = binary_kl_fast(logp - old, old)
    assert got[0] == 0 and got[1] == 0
    assert got[2] == 0.25 and got[3] == 0 and got[6] == 0
    assert torch.isinf(got[4]) and torch.isinf(got[5])


@pytest.mark.parametrize("delta", [1e-4, 0.07, 0.2, 1.0])
def test_dppo_kl_decisions_differ_from_exact_ones_only_within_the_bound(delta):
    """Tokens placed at TRGPPO's roots (where ``KL = delta``, the hardest place to decide) and 0.1% either side of
    them in ``log w``, on the float32 grid of ``p_old``: DPPO-KL's float32 decision (``binary_kl_fast > delta``)
    equals the one from the float64 KL (``binary_kl``) on every nudged token, and on the tokens at the roots differs
    only where the KL is within ``binary_kl_fast_error_bound`` of ``delta`` (there the float32 rounding of ``y``
    alone decides: about a third of them differ)."""
    old = float32_log_p_grid()[1:]
    roots = [torch.as_tensor(r, dtype=torch.float64) for r in trgppo_kl_log_range(old.double().exp().numpy(), delta)]
    for nudge in (0.999, 1.0, 1.001):
        y = torch.cat([(r * nudge).float() for r in roots])
        olds = old.repeat(len(roots))
        finite = torch.isfinite(y)  # the lower root underflows to w = 0 for p_old below ~e^-100
        y, olds = y[finite], olds[finite]
        exact = binary_kl(y.double(), olds.double())
        differ = (binary_kl_fast(y, olds) > delta) != (exact > delta)
        if nudge != 1.0:
            assert not bool(differ.any()), (nudge, int(differ.sum()))
        else:
            bound = binary_kl_fast_error_bound(y, olds)
            assert bool(((exact[differ] - delta).abs() <= bound[differ]).all())


def test_binary_tv_is_a_per_token_ratio_range():
    """DPPO-TV keeps ``p (w - 1)`` in ``[-d_low, d_high]``, i.e. ``w`` in ``[1 - d_low / p, 1 + d_high / p]``: the
    registry's flags (mask form) equal that range on a grid of ratios and old probabilities."""
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(64, 32, generator=g, dtype=torch.float64) * 4
    logp = (old + torch.randn(64, 32, generator=g, dtype=torch.float64)).clamp(max=-1e-9)
    mask = torch.ones_like(old, dtype=torch.bool)
    out = at.policy_loss(logp, old, torch.ones(64), mask, method="dppo_tv", form="mask", delta_low=0.1, delta_high=0.2)
    p, w = old.exp(), (logp - old).exp()
    inside = (w >= 1 - 0.1 / p) & (w <= 1 + 0.2 / p)
    assert torch.equal(out.result.kept, inside) and 0 < int(inside.sum()) < inside.numel()
    assert torch.allclose(binary_tv(logp - old, old), logp.exp() - old.exp(), rtol=1e-12, atol=1e-15)


def test_dppo_min_form_masks_one_side_and_the_mask_form_both():
    """A token whose probability fell far: kept by the min form when A > 0 (the update would raise it), dropped when
    A < 0; dropped by the mask form either way. Its gradient is then exactly 0."""
    old = torch.log(torch.tensor([[0.5, 0.5]], dtype=torch.float64))
    logp = torch.log(torch.tensor([[0.1, 0.1]], dtype=torch.float64)).requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    for rule in ("dppo_tv", "dppo_kl"):
        minimal = at.policy_loss(logp, old, adv, mask, method=rule, form="min", delta_low=0.05)
        assert minimal.result.kept.tolist() == [[True, False]]
        both = at.policy_loss(logp, old, adv, mask, method=rule, form="mask", delta_low=0.05)
        assert both.result.kept.tolist() == [[False, False]]
        (grad,) = torch.autograd.grad(both.loss, logp)
        assert grad.abs().sum() == 0


# --------------------------------------------------------------------------------------------
# RolloutCorrection
# --------------------------------------------------------------------------------------------
def _loop_weights(log_rho, mask, spec):
    """Each sequence in Python floats: its token, product or geometric-mean ratio, truncated or masked."""
    out = np.zeros(tuple(mask.shape))
    for b in range(mask.shape[0]):
        ys = [float(log_rho[b, t]) for t in range(mask.shape[1]) if mask[b, t]]
        for t in range(mask.shape[1]):
            if not mask[b, t]:
                continue
            y = {"token": float(log_rho[b, t]), "sequence": sum(ys), "geometric": sum(ys) / len(ys)}[spec.level]
            r = math.exp(y)
            if spec.mode == "truncate":
                out[b, t] = min(r, spec.upper)
            else:
                lower = 1 / spec.upper if spec.lower is None else spec.lower
                out[b, t] = r if lower <= r <= spec.upper else 0.0
    return out


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    level=st.sampled_from(["token", "sequence", "geometric"]),
    mode=st.sampled_from(["truncate", "mask"]),
    upper=st.floats(1.05, 3.0),
    lower=st.one_of(st.none(), st.floats(0.3, 0.95)),
)
def test_rollout_correction_weights_equal_a_loop(seed, level, mode, upper, lower):
    g = torch.Generator().manual_seed(seed)
    log_rho = 0.3 * torch.randn(4, 6, generator=g, dtype=torch.float64)
    mask = torch.arange(6)[None, :] < torch.randint(1, 7, (4, 1), generator=g)
    spec = RolloutCorrection(level, mode, upper, lower if mode == "mask" else None)
    got = rollout_correction_weights(log_rho, mask, spec).numpy()
    np.testing.assert_allclose(got, _loop_weights(log_rho, mask, spec), rtol=1e-12, atol=0.0)


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
def test_batch_normalised_weights_average_one(level):
    """verl's ``rollout_is_batch_normalize``: the mean weight over valid tokens (token level) or over sequences (the
    other levels) becomes 1, from a mean below 1 and from one above; all-zero weights stay 0 (no division)."""
    mask = torch.tensor([[True, True, True], [True, False, False]])
    for shift in (-0.4, 0.3):
        log_rho = torch.tensor([[0.1, -0.2, 0.05], [0.3, 9.0, 9.0]], dtype=torch.float64) + shift
        raw = rollout_correction_weights(log_rho, mask, RolloutCorrection(level, "truncate", 5.0))
        w = rollout_correction_weights(log_rho, mask, RolloutCorrection(level, "truncate", 5.0, None, True))
        if level == "token":
            mean = w[mask].mean()
        else:
            mean = torch.stack([w[b][mask[b]].mean() for b in range(2)]).mean()
        ratio = (w / raw)[mask]  # one common factor
        assert float(mean) == pytest.approx(1.0, rel=1e-12) and torch.allclose(ratio, ratio[0].expand_as(ratio))
    single = rollout_correction_weights(  # one valid token: its weight is the mean, normalised to 1
        torch.tensor([[0.3, 0.0]], dtype=torch.float64),
        torch.tensor([[True, False]]),
        RolloutCorrection("token", "truncate", 5.0, None, True),
    )
    assert single.tolist() == [[1.0, 0.0]]
    zeros = rollout_correction_weights(
        torch.full((2, 3), 5.0, dtype=torch.float64), mask, RolloutCorrection(level, "mask", 2.0, None, True)
    )
    assert torch.equal(zeros, torch.zeros(2, 3, dtype=torch.float64))


def test_dppo_flags_a_truncated_weight_as_clipped_high_and_kept():
    """A kept token whose weight hit ``is_cap`` is reported (verl's ``pg_clipfrac_lower`` counts it); a token inside
    and below the cap is not."""
    old = torch.log(torch.tensor([[0.01, 0.01, 0.01]], dtype=torch.float64))
    logp = torch.log(torch.tensor([[0.03, 0.011, 0.009]], dtype=torch.float64))
    mask = torch.ones(1, 3, dtype=torch.bool)
    out = at.policy_loss(logp, old, torch.ones(1), mask, method="dppo_tv", is_cap=2.0)
    assert out.result.kept.tolist() == [[True, True, True]]
    assert out.result.clipped_high.tolist() == [[True, False, False]]
    assert out.result.clipped_low.tolist() == [[False, False, False]]  # a kept token whose ratio fell is not clipped


def test_vespo_clamps_each_token_log_ratio_before_the_sum():
    """TRL's VESPO clamps every token's log-ratio to [-20, 20] before summing: tokens at +25 and -10 give log W =
    20 - 10 = 10, not 15 (and at -25 and +10, -10, not -15)."""
    from atr_theory.methods.soft_weights import vespo_log_weight

    y = torch.tensor([[25.0, -10.0]], dtype=torch.float64)
    one = torch.ones(1, 1, dtype=torch.float64)
    got = vespo_log_weight(y, torch.ones(1, 2, dtype=torch.float64), one, 2.0, 3.0, 3.0, 2.0)
    assert float(got) == pytest.approx(3.0 + 2.0 * 10.0 - 3.0 * math.exp(10.0), rel=1e-12)
    low = vespo_log_weight(-y, torch.ones(1, 2, dtype=torch.float64), one, 2.0, 3.0, 3.0, 2.0)  # -20 + 10 = -10
    assert float(low) == pytest.approx(3.0 + 2.0 * -10.0 - 3.0 * math.exp(-10.0), rel=1e-12)
    total = torch.tensor([[15.0, 10.0]], dtype=torch.float64)  # each inside, the sum 25 clamped to 20
    high = vespo_log_weight(total, torch.ones(1, 2, dtype=torch.float64), one, 2.0, 3.0, 3.0, 2.0)
    assert float(high) == pytest.approx(3.0 + 2.0 * 20.0 - 3.0 * math.exp(20.0), rel=1e-12)
    floor = vespo_log_weight(-total, torch.ones(1, 2, dtype=torch.float64), one, 2.0, 3.0, 3.0, 2.0)  # -25 -> log 1e-8
    assert float(floor) == pytest.approx(3.0 + 2.0 * math.log(1e-8) - 3.0 * 1e-8, rel=1e-12)


def test_bypass_and_decoupled_read_different_ratios():
    """Without ``behaviour_logp`` the weight is ``sg[pi] / pi_old`` (bypass); with it, ``pi_old / pi_behaviour``."""
    logp = torch.log(torch.tensor([[0.6]], dtype=torch.float64))
    old = torch.log(torch.tensor([[0.4]], dtype=torch.float64))
    behaviour = torch.log(torch.tensor([[0.5]], dtype=torch.float64))
    mask = torch.ones(1, 1, dtype=torch.bool)
    spec = RolloutCorrection("token", "truncate", 10.0)
    bypass = at.policy_loss(logp, old, torch.ones(1), mask, method="reinforce", rollout_correction=spec)
    decoupled = at.policy_loss(
        logp, old, torch.ones(1), mask, method="reinforce", rollout_correction=spec, behaviour_logp=behaviour
    )
    assert float(bypass.per_token) == pytest.approx(1.5 * math.log(0.6), rel=1e-12)
    assert float(decoupled.per_token) == pytest.approx(0.8 * math.log(0.6), rel=1e-12)


def test_masked_tokens_are_reported_as_dropped():
    logp = torch.log(torch.tensor([[0.9, 0.5]], dtype=torch.float64))
    old = torch.log(torch.tensor([[0.3, 0.5]], dtype=torch.float64))
    out = at.policy_loss(
        logp,
        old,
        torch.ones(1),
        torch.ones(1, 2, dtype=torch.bool),
        method="reinforce",
        rollout_correction=RolloutCorrection("token", "mask", 2.0),
    )
    assert out.metrics["frac_dropped_rollout_correction"] == 0.5 and float(out.per_token[0, 0]) == 0.0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(level="tokens"), "level must be one of"),
        (dict(mode="clip"), "mode must be one of"),
        (dict(upper=0.0), "upper must be a finite number > 0"),
        (dict(upper=math.inf), "upper must be a finite number > 0"),
        (dict(upper=True), "upper must be a finite number > 0"),
        (dict(mode="truncate", lower=0.5), "^RolloutCorrection lower is used by mode='mask' only"),
        (dict(mode="mask", lower=3.0, upper=2.0), "lower 3.0 must be <= upper 2.0"),
        (dict(mode="mask", lower=-1.0), "lower must be a finite number > 0"),
    ],
)
def test_rollout_correction_refuses_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RolloutCorrection(**kwargs)


def test_sequence_mask_bounds_are_inclusive():
    """A statistic equal to ``threshold`` or to ``lower`` is kept (verl keeps ``lower <= k <= upper``)."""
    y = torch.tensor([[-0.25, 0.5, 0.51, -0.26]], dtype=torch.float64)  # k1 = -y: 0.25, -0.5, -0.51, 0.26
    spec = SequenceMask("k1", "token", 0.25, "all", lower=-0.5)
    keep = at.layers.sequence_mask_keep(y, torch.ones(1), torch.ones(1, 4, dtype=torch.bool), spec)
    assert keep.tolist() == [[True, True, False, False]]


def test_the_bounds_of_the_layers_are_inclusive():
    """IcePop keeps a weight equal to either bound (verl: ``lower <= r <= upper``); a SequenceMask whose lower bound
    equals its threshold is allowed (it keeps exactly that value)."""
    log_rho = torch.tensor([[math.log(2.0), math.log(0.5), math.log(2.0) + 1e-12]], dtype=torch.float64)
    w = rollout_correction_weights(log_rho, torch.ones(1, 3, dtype=torch.bool), RolloutCorrection("token", "mask", 2.0))
    assert w[0, :2].tolist() == pytest.approx([2.0, 0.5], rel=1e-12) and float(w[0, 2]) == 0.0
    spec = SequenceMask("k1", "token", 0.25, "all", lower=0.25)
    keep = at.layers.sequence_mask_keep(torch.tensor([[-0.25, -0.3]]), torch.ones(1), torch.ones(1, 2), spec)
    assert keep.tolist() == [[True, False]]


def test_the_entropy_mask_takes_half_precision_entropies():
    """bfloat16 entropies (a bf16 model's) are ranked in float32: the same tokens as the float32 entropies keep
    (``torch.quantile`` refuses bfloat16)."""
    g = torch.Generator().manual_seed(0)
    entropies = torch.rand(4, 9, generator=g).to(torch.bfloat16)
    mask = torch.rand(4, 9, generator=g) > 0.2
    half = high_entropy_mask(entropies, mask, 0.3)
    assert torch.equal(half, high_entropy_mask(entropies.float(), mask, 0.3)) and 0 < int(half.sum()) < int(mask.sum())


def test_bad_layers_are_refused_by_name():
    with pytest.raises(ValueError, match="rollout_correction must be a RolloutCorrection, got dict"):
        at.policy_loss(
            torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1), torch.ones(1, 2), rollout_correction={"upper": 2}
        )
    with pytest.raises(ValueError, match="lower 0.5 must be <= threshold 0.1"):
        SequenceMask("k1", "token", 0.1, "all", lower=0.5)
    with pytest.raises(ValueError, match="reduction must be one of"):
        SequenceMask("k3", "median", 0.1, "all")
    with pytest.raises(ValueError, match=r"top_entropy_quantile must be in \[0, 1\], got 1.5"):
        high_entropy_mask(torch.ones(1, 2), torch.ones(1, 2, dtype=torch.bool), 1.5)
