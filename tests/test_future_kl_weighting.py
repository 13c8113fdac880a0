"""FIPO (``atr_theory.methods.weighting_by_future_kl``) against the code that proposes it for TRL (PR #5434 at
20463989, copied in ``tests/soft_region_peers.py``), run on the same batches, loss and gradient; its Future KL
against a Python-float brute force over long rows; cases worked by hand; and the parameter values at which it is
dual-clip PPO."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from soft_region_peers import _TRLFIPO

import atr_theory as at
from atr_theory.methods.weighting_by_future_kl import future_kl

# (epsilon, epsilon_high, fipo_clip_ratio_c, fipo_decay_rate, influence_clip_ratio, influence_clip_high_only,
# safety_threshold): the PR's defaults first
PR_SETTINGS = [
    (0.2, 0.2, 10.0, 32.0, 0.2, True, 10.0),
    (0.2, 0.28, 1.5, 2.0, 0.2, False, 1.2),
    (0.1, 0.3, 2.0, 4.0, 0.0, True, 3.0),
    (0.2, 0.2, 1.3, 0.5, 0.5, False, 100.0),
]


def _ours_params(setting):
    """The rule's parameters for one of the PR's settings (``PR_SETTINGS``)."""
    low, high, c, decay, ratio, high_only, safety = setting
    floor, ceiling = (0.0, 10.0) if ratio == 0.0 else ((1.0 if high_only else 1.0 - ratio), 1.0 + ratio)
    return dict(epsilon_low=low, epsilon_high=high, dual_clip_c=c, fipo_decay_rate=decay, fipo_influence_low=floor,
                fipo_influence_high=ceiling, fipo_safety_threshold=safety)


def _pr(setting):
    low, high, c, decay, ratio, high_only, safety = setting
    args = type("Args", (), dict(fipo_clip_ratio_c=c, fipo_decay_rate=decay, fipo_chunk_size=5,
                                 fipo_influence_clip_ratio=ratio, fipo_influence_clip_high_only=high_only,
                                 fipo_safety_threshold=safety))()
    return _TRLFIPO(args, low, high)


@st.composite
def batches(draw):
    """Padded float64 batches (holes inside a row too) whose ratios reach beyond the dual clip and the safety
    threshold (``log w`` up to about +-4, inside the PR's +-20 clamp), rows longer than the PR's chunk (5 here),
    per-sequence advantages with zeros among them."""
    B, T = draw(st.integers(1, 5)), draw(st.integers(1, 14))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 4 - 0.01
    scale = draw(st.sampled_from([0.05, 0.3, 1.0]))
    logp = (old + scale * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-6)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    adv = torch.where(torch.rand(B, generator=g) < 0.15, 0.0, adv)
    mask = torch.rand(B, T, generator=g) > draw(st.sampled_from([0.0, 0.3]))
    mask[0, 0] = True
    return logp, old, adv, mask


def _loss_and_grad(fn, logp):
    leaf = logp.clone().requires_grad_(True)
    loss = fn(leaf)
    (grad,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), grad


@settings(max_examples=60, deadline=None)
@given(batches(), st.sampled_from(PR_SETTINGS))
def test_fipo_is_trl_pr_5434(batch, setting):
    """The PR's loss is its token sum over the kept sequences divided by their token count: our token sum divided by
    the same count (read from the PR's ``loss_mask``) is that loss, value and gradient; the per-token losses agree
    everywhere (0 on a dropped sequence here, left out by the PR's mask)."""
    logp, old, adv, mask = batch
    pr, params = _pr(setting), _ours_params(setting)
    _, _, kept_by_pr = pr.loss(logp, old, adv[:, None], mask.double())
    kept_tokens = kept_by_pr.sum().clamp(min=1.0)

    def ours(lp):
        return at.policy_loss(lp, old, adv, mask, method="fipo", aggregation="token_sum", **params).loss / kept_tokens

    def theirs(lp):
        return pr.loss(lp, old, adv[:, None], mask.double())[0]

    (l_ours, g_ours), (l_theirs, g_theirs) = _loss_and_grad(ours, logp), _loss_and_grad(theirs, logp)
    torch.testing.assert_close(l_ours, l_theirs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-12, atol=1e-12)
    out = at.policy_loss(logp, old, adv, mask, method="fipo", aggregation="token_sum", **params)
    per_token_pr = pr.loss(logp, old, adv[:, None], mask.double())[1] * kept_by_pr
    torch.testing.assert_close(-out.per_token, per_token_pr, rtol=1e-12, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(batches(), st.sampled_from(PR_SETTINGS), st.sampled_from(["min", "mask"]))
def test_fipo_is_its_reference_form(batch, setting, form):
    """Both forms against the reference form: a Python-float Future KL token by token, no shared helper."""
    logp, old, adv, mask = batch
    params = _ours_params(setting)
    reference = at.get_method("fipo").reference_form

    def ours(lp):
        return at.policy_loss(lp, old, adv, mask, method="fipo", form=form, aggregation="token_sum", **params).loss

    def theirs(lp):
        objective = reference(lp, old, adv, mask, form=form, **params)
        return -torch.where(mask, objective, 0.0).sum()

    (l_ours, g_ours), (l_theirs, g_theirs) = _loss_and_grad(ours, logp), _loss_and_grad(theirs, logp)
    torch.testing.assert_close(l_ours, l_theirs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("length", [1, 127, 128, 129, 300])
def test_the_future_kl_over_many_chunks_is_the_sum_by_hand(length):
    """``future_kl`` over rows longer than its 128-column chunk, against ``sum_{k >= t} gamma^(k - t) x_k`` in
    Python floats (``math.fsum``), float64."""
    g = torch.Generator().manual_seed(length)
    x = torch.randn(2, length, generator=g, dtype=torch.float64)
    counted = torch.rand(2, length, generator=g) > 0.2
    decay_rate = 7.0
    got = future_kl(x, counted, decay_rate)
    gamma = 2.0 ** (-1.0 / decay_rate)
    for b in range(2):
        for t in range(length):
            want = math.fsum(gamma ** (k - t) * float(x[b, k]) for k in range(t, length) if counted[b, k])
            assert abs(float(got[b, t]) - want) <= 1e-12 * max(1.0, abs(want))


def test_fipo_by_hand():
    """One row of three tokens, ``A = 1``, decay rate 1 (``gamma = 1/2``), the PR's defaults otherwise: ``log w = (0.1,
    0.05, 0.2)`` gives ``F = (0.1 + 0.025 + 0.05, 0.05 + 0.1, 0.2) = (0.175, 0.15, 0.2)``, ``f = clamp(e^F, 1, 1.2) =
    (1.1912, 1.1618, 1.2)`` (e^0.2 = 1.2214 is capped); each token's objective is ``f min(w, 1.2)``."""
    old = torch.zeros(1, 3, dtype=torch.float64) - 1.0
    y = torch.tensor([[0.1, 0.05, 0.2]], dtype=torch.float64)
    out = at.policy_loss(old + y, old, torch.ones(1, dtype=torch.float64), torch.ones(1, 3, dtype=torch.bool),
                         method="fipo", aggregation="token_sum", fipo_decay_rate=1.0)
    f = [math.exp(0.175), math.exp(0.15), 1.2]
    w = [min(math.exp(0.1), 1.2), min(math.exp(0.05), 1.2), 1.2]
    for t in range(3):
        assert float(out.per_token[0, t]) == pytest.approx(f[t] * w[t], rel=1e-14)


def test_a_sequence_with_two_negative_tokens_above_c_is_dropped_and_one_is_not():
    """``A = -1``, ``c = 10``: a row with one ratio above 10 keeps every token (that one capped at ``c A``); a row
    with two loses all of them (objective 0, no gradient), flagged clipped high."""
    old = torch.full((2, 4), -3.0, dtype=torch.float64)
    y = torch.tensor([[0.0, 2.5, 0.1, 0.0], [2.5, 0.0, 2.6, 0.1]], dtype=torch.float64)
    logp = (old + y).requires_grad_(True)
    adv = -torch.ones(2, dtype=torch.float64)
    out = at.policy_loss(logp, old, adv, torch.ones(2, 4, dtype=torch.bool), method="fipo", aggregation="token_sum")
    out.loss.backward()
    assert torch.all(out.per_token[1] == 0) and torch.all(logp.grad[1] == 0)
    assert float(out.per_token[0, 1]) == pytest.approx(-10.0 * 1.0, rel=1e-14)  # capped at c A (f = 1: F <= 0 is
    # clamped to 1, and e^2.5 > safety 10 clamps f into [0.8, 1])
    assert torch.count_nonzero(logp.grad[0]) == 3
    assert bool(out.result.clipped_high[1].all()) and not bool(out.result.kept[1].any())


@settings(max_examples=30, deadline=None)
@given(batches())
def test_fipo_with_weights_held_at_one_and_no_drop_is_dual_clip_ppo(batch):
    """``f_low = f_high = 1`` and a sequence never dropped (``c`` above every ratio here) make FIPO dual-clip PPO
    (``dual_clip_higher`` at the same range and ``c``), value and gradient."""
    logp, old, adv, mask = batch
    c = 1e3
    params = dict(epsilon_low=0.2, epsilon_high=0.28, dual_clip_c=c)

    def fipo(lp):
        return at.policy_loss(lp, old, adv, mask, method="fipo", aggregation="token_sum", fipo_influence_low=1.0,
                              fipo_influence_high=1.0, **params).loss

    def dual(lp):
        return at.policy_loss(lp, old, adv, mask, method="dual_clip_higher", aggregation="token_sum", **params).loss

    (l_f, g_f), (l_d, g_d) = _loss_and_grad(fipo, logp), _loss_and_grad(dual, logp)
    torch.testing.assert_close(l_f, l_d, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(g_f, g_d, rtol=1e-14, atol=1e-14)

