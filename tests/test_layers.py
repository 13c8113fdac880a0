"""The loss layers (atr_theory.layers) against brute force: sequence masks by plain Python loops over each
sequence, the entropy mask by numpy's quantile, the sequence-level ratio by GSPO's gradient identity."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import atr_theory as at
from atr_theory.layers import SequenceMask, high_entropy_mask, sequence_mask_keep
from tests.loss_batches import loss_batch


def _batch(seed, B, T, per_token=False):
    return loss_batch(seed, B, T, per_token=per_token)


def _brute_force_keep(logp, behaviour, adv, mask, spec):
    """Per sequence, in Python floats: the divergence of each valid token, reduced, against the threshold."""
    estimators = {"k1": lambda y: -y, "k2": lambda y: y * y / 2, "k3": lambda y: math.expm1(y) - y}
    rows = []
    for b in range(logp.shape[0]):
        ks = [
            estimators[spec.estimator](float(logp[b, t] - behaviour[b, t])) for t in range(logp.shape[1]) if mask[b, t]
        ]
        value = {"mean": sum(ks) / max(len(ks), 1), "sum": sum(ks), "max": max(ks, default=-math.inf)}[spec.reduction]
        ok = value <= spec.threshold
        a = adv[b] if adv.ndim == 1 else adv[b]
        if spec.advantages == "negative":
            rows.append([ok or float(x) >= 0 for x in (a.reshape(-1) if adv.ndim == 2 else [a] * logp.shape[1])])
        else:
            rows.append([ok] * logp.shape[1])
    return torch.tensor(rows)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    estimator=st.sampled_from(["k1", "k2", "k3"]),
    reduction=st.sampled_from(["mean", "sum", "max"]),
    which=st.sampled_from(["negative", "all"]),
    threshold=st.floats(-0.2, 0.5),
    per_token=st.booleans(),
)
def test_sequence_masks_equal_a_loop_over_each_sequence(seed, estimator, reduction, which, threshold, per_token):
    if estimator != "k1":  # k2 and k3 are >= 0: a threshold below 0 is refused (test_loss_refusals)
        threshold = abs(threshold)
    logp, behaviour, adv, mask = _batch(seed, 5, 7, per_token)
    adv[0] = 0.0  # A = 0 counts as non-negative
    spec = SequenceMask(estimator, reduction, threshold, which)
    a = adv if per_token else adv.unsqueeze(-1)
    got = sequence_mask_keep(torch.where(mask, logp - behaviour, 0.0), a, mask, spec).expand(mask.shape)
    want = _brute_force_keep(logp, behaviour, adv, mask, spec)
    assert torch.equal(got & mask, want & mask)


def test_a_dropped_sequence_contributes_nothing_to_the_loss_and_its_gradient():
    logp, old, adv, mask = _batch(3, 6, 9)
    adv = -adv.abs()  # every sequence negative: the threshold decides
    spec = SequenceMask("k3", "mean", 0.05, "negative")
    out = at.policy_loss(logp, old, adv, mask, method="clip", sequence_mask=spec)
    dropped = out.dropped["sequence_mask"].expand(mask.shape) & mask
    assert 0 < int(dropped.any(-1).sum()) < 6
    lp = logp.clone().requires_grad_()
    at.policy_loss(lp, old, adv, mask, method="clip", sequence_mask=spec).loss.backward()
    assert torch.all(out.per_token[dropped] == 0) and torch.all(lp.grad[dropped] == 0)
    assert torch.any(lp.grad[~dropped] != 0)
    assert out.metrics["frac_dropped_sequence_mask"] == pytest.approx(float(mask[dropped].sum()) / float(mask.sum()))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), rho=st.floats(0.0, 1.0), dtype=st.sampled_from([torch.float32, torch.float64]))
def test_the_entropy_mask_keeps_the_valid_tokens_at_or_above_numpys_quantile(seed, rho, dtype):
    g = torch.Generator().manual_seed(seed)
    entropies = torch.rand(4, 6, generator=g, dtype=dtype) * 3
    mask = torch.rand(4, 6, generator=g) > 0.3
    mask[0, 0] = True
    threshold = np.quantile(entropies[mask].numpy().astype(np.float64), 1 - rho)  # linear, as torch.quantile
    got = high_entropy_mask(entropies, mask, rho)
    want = torch.from_numpy(entropies.numpy() >= threshold.astype(entropies.numpy().dtype)) & mask
    # a value within float32 rounding of the threshold may fall either way: compare everywhere else
    near = torch.from_numpy(np.isclose(entropies.numpy(), threshold, rtol=1e-6, atol=1e-7))
    assert torch.equal(got & ~near, want & ~near)
    assert bool(got[mask].any())  # the top token always stays


def test_the_sequence_level_ratio_has_gspos_loss_and_gradient():
    """Zheng et al. (GSPO, Eq. 11) show that GSPO-token with per-sequence advantages has GSPO's sequence-level
    gradient; here the sequence-level layer on Clip-Higher (the ratio exp(mean log w) carried by every token, its
    gradient through the mean) must equal the registry's gspo rule (pinned against verl) under token_mean."""
    logp, old, adv, mask = _batch(5, 6, 10)
    old = logp.detach() + 0.002 * torch.randn(
        logp.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )
    results = []
    for kwargs in ({"method": "clip_higher", "ratio_level": "sequence"}, {"method": "gspo"}):
        lp = logp.clone().requires_grad_()
        out = at.policy_loss(
            lp, old, adv, mask, aggregation="token_mean", epsilon_low=3e-4, epsilon_high=4e-4, **kwargs
        )
        out.loss.backward()
        results.append((out.loss.detach(), lp.grad, out.metrics["frac_masked"]))
    (la, ga, fa), (lb, gb, fb) = results
    assert 0 < fa < 1 and fa == fb  # the sequences' clipping acted, the same way
    torch.testing.assert_close(la, lb, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(ga, gb, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"ratio_level": "sentence"}, "ratio_level"),
        ({"sequence_mask": 0.1}, "SequenceMask"),
        ({"top_entropy_quantile": 1.5}, "top_entropy_quantile"),
        ({"top_entropy_quantile": 0.5}, "needs the per-token entropies"),
    ],
)
def test_bad_layer_options_are_refused_by_name(kwargs, match):
    logp, old, adv, mask = _batch(0, 2, 3)
    with pytest.raises(ValueError, match=match):
        at.policy_loss(logp, old, adv, mask, **kwargs)


def test_a_bad_sequence_mask_is_refused_by_name():
    for kwargs, match in (
        ({"estimator": "k4"}, "estimator"),
        ({"reduction": "median"}, "reduction"),
        ({"advantages": "positive"}, "advantages"),
        ({"threshold": float("nan")}, "threshold"),
    ):
        with pytest.raises(ValueError, match=match):
            SequenceMask(**kwargs)


@pytest.mark.parametrize("value", [True, False, math.nan, -0.1, 1.5, "0.5", torch.tensor(0.5)])
def test_the_entropy_mask_refuses_a_quantile_outside_0_1_or_not_a_real_number(value):
    """A bool would read as 1 or 0: refused as policy_loss refuses it (one check, ``check_top_entropy_quantile``)."""
    with pytest.raises(ValueError, match=r"^top_entropy_quantile must be in \[0, 1\], got "):
        high_entropy_mask(torch.ones(1, 2), torch.ones(1, 2, dtype=torch.bool), value)


def test_direct_callers_of_the_layers_still_read_a_nan_log_ratio_as_no_evidence():
    """``sequence_mask_keep`` and ``rollout_correction_weights`` count a NaN log-ratio as 0 (TRL's reading of a token
    the behaviour policy could not score); ``policy_loss`` refuses NaN in ``behaviour_logp`` before either is reached
    (``validate=True``) and hands it on as they read it with ``validate=False``."""
    mask = torch.tensor([[True, True, True, False]])
    log_ratio = torch.tensor([[0.5, math.nan, -0.2, math.nan]])
    zeroed = torch.nan_to_num(log_ratio, nan=0.0)
    spec = SequenceMask("k3", "mean", 0.01, "all")
    adv = -torch.ones(1)
    assert torch.equal(sequence_mask_keep(log_ratio, adv, mask, spec), sequence_mask_keep(zeroed, adv, mask, spec))
    correction = at.RolloutCorrection("geometric", "truncate", 1.5)
    assert torch.equal(
        at.layers.rollout_correction_weights(log_ratio, mask, correction),
        at.layers.rollout_correction_weights(zeroed, mask, correction),
    )
    old = torch.log(torch.tensor([[0.5, 0.4, 0.3, 0.2]]))
    behaviour = old - log_ratio  # NaN at (0, 1): refused
    with pytest.raises(ValueError, match=r"^behaviour_logp has NaN at valid position \(0, 1\); "):
        at.policy_loss(old, old, adv, mask, behaviour_logp=behaviour, rollout_correction=correction)
    loose = at.policy_loss(old, old, adv, mask, behaviour_logp=behaviour, rollout_correction=correction, validate=False)
    finite = at.policy_loss(old, old, adv, mask, behaviour_logp=old - zeroed, rollout_correction=correction)
    assert torch.equal(loose.loss, finite.loss)
