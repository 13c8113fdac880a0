"""The soft trust regions (``atr_theory.methods.weighted_trust_regions``) against the code that proposes each, run on
the same batches (``tests/soft_region_peers.py``: TRL PRs #4548 and #5027, OpenRLHF PR #1184, verl PR #7022,
Kwai-Klear/CE-GPPO, Archer2.0), loss and gradient; cases worked by hand; and the parameter values at which a rule is
another rule of the registry.

Where a copied function aggregates, its stand-in ``agg_loss`` is the token sum (verl's forks) and OpenRLHF's own
``masked_mean`` its token mean: the rule is compared under the same aggregation."""

from __future__ import annotations

import math
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from soft_region_peers import (
    ActorConfig,
    PolicyLoss,
    _TRLCFPOBranch,
    _TRLPSPOBranch,
    compute_gppo_loss,
    compute_gppo_loss_general_beta,
    compute_policy_loss_archer,
    compute_policy_loss_bapo,
    compute_policy_loss_up,
)

import atr_theory as at

SOFT_RULES = ("pspo", "cfpo", "up_grpo", "ce_gppo", "aspo")
BAPO_SETTINGS = [
    (0.6, 0.8, 0.05, 1.2, 2.0, 0.05, 1.0, 3.0),  # its recipe's bapo_trainer.yaml
    (0.8, 0.95, 0.05, 1.2, 2.0, 0.1, 0.5, 3.0),  # its run_bapo_example.sh
    (0.6, 0.9, 0.1, 1.2, 3.0, 0.3, 2.0, 10.0),
]
BAPO_NAMES = ("bapo_lower_start", "bapo_lower_max", "bapo_lower_step", "bapo_upper_start", "bapo_upper_max",
              "bapo_upper_step", "bapo_target", "dual_clip_c")


@st.composite
def batches(draw, per_token_advantages=None):
    """Padded float64 batches whose ratios reach beyond every rule's range and caps (w from e^-3 to e^3), with
    zero advantages among them."""
    B, T = draw(st.integers(1, 6)), draw(st.integers(1, 12))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 0.01
    scale = draw(st.sampled_from([0.05, 0.3, 1.0]))
    logp = (old + scale * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-6)
    per_token = draw(st.booleans()) if per_token_advantages is None else per_token_advantages
    adv = torch.randn((B, T) if per_token else (B,), generator=g, dtype=torch.float64)
    adv = torch.where(torch.rand(adv.shape, generator=g) < 0.1, 0.0, adv)
    mask = torch.rand(B, T, generator=g) > draw(st.sampled_from([0.0, 0.3]))
    mask[0, 0] = True
    return logp, old, adv, mask


def _grid(adv: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return adv[:, None].expand_as(like) if adv.dim() == 1 else adv


def _loss_and_grad(fn, logp):
    leaf = logp.clone().requires_grad_(True)
    loss = fn(leaf)
    (grad,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), grad


def _ours(method, old, adv, mask, aggregation="token_sum", **params):
    return lambda lp: at.policy_loss(lp, old, adv, mask, method=method, aggregation=aggregation, **params).loss


def _assert_same(ours, theirs, logp):
    (l_ours, g_ours), (l_theirs, g_theirs) = _loss_and_grad(ours, logp), _loss_and_grad(theirs, logp)
    torch.testing.assert_close(l_ours, l_theirs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-12, atol=1e-12)


def _masked_sum(per_token, mask):
    return torch.where(mask, per_token, 0.0).sum()


# ---------------------------------------------------------------------------------------------------------------
# each rule against its proposing code
# ---------------------------------------------------------------------------------------------------------------
@settings(max_examples=50, deadline=None)
@given(batches(), st.sampled_from([0.0, 0.1, 0.5, 1.0]))
def test_pspo_is_trl_pr_4548(batch, alpha):
    logp, old, adv, mask = batch
    branch = _TRLPSPOBranch(smoothing_alpha=alpha)

    def theirs(lp):
        return _masked_sum(branch.per_token_loss(torch.exp(lp - old), _grid(adv, lp)), mask)

    _assert_same(_ours("pspo", old, adv, mask, pspo_alpha=alpha), theirs, logp)


@settings(max_examples=50, deadline=None)
@given(batches(), st.sampled_from([0.05, 0.2, 0.5, 2.0]))
def test_cfpo_is_openrlhf_pr_1184_and_trl_pr_5027(batch, epsilon):
    logp, old, adv, mask = batch
    openrlhf = PolicyLoss(clip_eps_low=epsilon, clip_eps_high=0.9, policy_loss_type="cfpo")  # high is not read
    trl = _TRLCFPOBranch(epsilon_high=epsilon)

    def theirs_openrlhf(lp):
        return openrlhf(lp, old, _grid(adv, lp), action_mask=mask)[0]

    def theirs_trl(lp):
        return _masked_sum(trl.per_token_loss(torch.exp(lp - old), _grid(adv, lp)), mask)

    _assert_same(_ours("cfpo", old, adv, mask, "token_mean", cfpo_epsilon=epsilon), theirs_openrlhf, logp)
    _assert_same(_ours("cfpo", old, adv, mask, cfpo_epsilon=epsilon), theirs_trl, logp)


@settings(max_examples=50, deadline=None)
@given(batches(), st.sampled_from([(0.2, 0.2, 3.0), (0.1, 0.28, 1.5), (0.3, 0.05, 10.0)]))
def test_up_grpo_is_verl_pr_7022(batch, clip):
    logp, old, adv, mask = batch
    low, high, c = clip
    config = ActorConfig(clip_ratio=0.2, clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=c)

    def theirs(lp):
        return compute_policy_loss_up(old, lp, _grid(adv, lp), mask.double(), config=config)[0]

    _assert_same(_ours("up_grpo", old, adv, mask, epsilon_low=low, epsilon_high=high, dual_clip_c=c), theirs, logp)


CE_GPPO_SETTINGS = [(0.2, 0.2, 3.0, 0.25, 1.0), (0.2, 0.28, 10.0, 0.5, 1.0), (0.1, 0.3, 1.5, 0.75, 0.5)]


@settings(max_examples=50, deadline=None)
@given(batches(), st.sampled_from(CE_GPPO_SETTINGS))
def test_ce_gppo_is_its_authors_compute_gppo_loss_general_beta(batch, setting):
    logp, old, adv, mask = batch
    low, high, c, beta1, beta2 = setting

    def theirs(lp):
        return compute_gppo_loss_general_beta(
            old, lp, _grid(adv, lp), mask.double(), cliprange_low=low, cliprange_high=high, clip_ratio_c=c,
            gppo_loss_beta1=beta1, gppo_loss_beta2=beta2,
        )[0]

    params = dict(epsilon_low=low, epsilon_high=high, dual_clip_c=c, gppo_beta1=beta1, gppo_beta2=beta2)
    _assert_same(_ours("ce_gppo", old, adv, mask, **params), theirs, logp)


@settings(max_examples=50, deadline=None)
@given(batches(), st.sampled_from([(0.2, 0.2, 3.0), (0.1, 0.28, 10.0)]))
def test_ce_gppo_at_beta_one_is_gppo(batch, clip):
    """GPPO (Klear-Reasoner; ``compute_gppo_loss`` at defde20) is CE-GPPO with ``beta_1 = beta_2 = 1``: its
    stop-gradient clamp ``clamp(w, (1 - eps) w / sg(w), (1 + eps) w / sg(w))`` inside PPO's max."""
    logp, old, adv, mask = batch
    low, high, c = clip

    def theirs(lp):
        return compute_gppo_loss(old, lp, _grid(adv, lp), mask.double(), cliprange_low=low, cliprange_high=high,
                                 clip_ratio_c=c)[0]

    params = dict(epsilon_low=low, epsilon_high=high, dual_clip_c=c, gppo_beta1=1.0, gppo_beta2=1.0)
    _assert_same(_ours("ce_gppo", old, adv, mask, **params), theirs, logp)


@settings(max_examples=50, deadline=None)
@given(batches(), st.sampled_from([(0.2, 0.2, 3.0, 3.0), (0.2, 0.4, 3.0, 2.0), (0.1, 0.1, 1.5, 5.0)]))
def test_aspo_is_archer2s_compute_policy_loss_archer(batch, setting):
    """Archer2.0 with every token in its ``high_entropy_mask`` (which, as its comment says, holds the low-entropy
    tokens: those take its first clip ranges), so one range applies."""
    logp, old, adv, mask = batch
    low, high, c, c_pos = setting

    def theirs(lp):
        return compute_policy_loss_archer(
            old, lp, _grid(adv, lp), mask, torch.ones_like(mask),
            negative_low_entropy_clip_ratio_low=low, negative_high_entropy_clip_ratio_low=0.9,
            positive_low_entropy_clip_ratio_high=high, positive_high_entropy_clip_ratio_high=0.9,
            negative_clip_ratio_c=c, positive_clip_ratio_c=c_pos,
        )[0]

    params = dict(epsilon_low=low, epsilon_high=high, dual_clip_c=c, aspo_positive_c=c_pos)
    _assert_same(_ours("aspo", old, adv, mask, **params), theirs, logp)


def _bapo_config(setting):
    lo, lo_max, lo_step, hi, hi_max, hi_step, target, c = setting
    policy_loss = SimpleNamespace(ratio_lower_start=lo, ratio_lower_max=lo_max, ratio_lower_step=lo_step,
                                  ratio_upper_start=hi, ratio_upper_max=hi_max, ratio_upper_step=hi_step,
                                  adv_ratio_target=target, eps=1e-8)
    return ActorConfig(clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=c,
                       policy_loss=policy_loss)


@settings(max_examples=60, deadline=None)
@given(batches(), st.sampled_from(BAPO_SETTINGS))
def test_bapo_is_its_authors_compute_policy_loss_bapo(batch, setting):
    """The authors' verl recipe chooses its bounds by the same search and trains dual-clip PPO on them: the same
    loss and gradient on the same batch (the bounds it chose are in the metrics it leaves on its config)."""
    logp, old, adv, mask = batch
    config = _bapo_config(setting)

    def theirs(lp):
        return compute_policy_loss_bapo(old, lp, _grid(adv, lp), mask.double(), config=config)[0]

    _assert_same(_ours("bapo", old, adv, mask, **dict(zip(BAPO_NAMES, setting))), theirs, logp)


@settings(max_examples=60, deadline=None)
@given(batches(), st.sampled_from(BAPO_SETTINGS))
def test_bapo_picks_the_same_bounds_with_and_without_host_reads(batch, setting):
    """Eagerly on a CPU the pairs are tried one at a time; while compiling (or on a device) all are evaluated and the
    first meeting the target is indexed: the same pair."""
    from atr_theory.methods.weighted_trust_regions import _bapo_schedule, bapo_bounds

    logp, old, adv, mask = batch
    lo, lo_max, lo_step, hi, hi_max, hi_step, target, _ = setting
    args = (logp - old, _grid(adv, logp), mask, _bapo_schedule(lo, lo_max, lo_step),
            _bapo_schedule(hi, hi_max, hi_step), target)
    eager = bapo_bounds(*args)
    with mock.patch.object(torch.compiler, "is_compiling", lambda: True):
        indexed = bapo_bounds(*args)
    assert (float(indexed[0]), float(indexed[1])) == pytest.approx(eager, abs=0)


def test_bapo_bounds_by_hand():
    """Two tokens, A = +1 at w = 3 and A = -1 at w = 0.5. Start [0.6, 1.2]: P = min(3, 1.2) = 1.2, N = max(0.5,
    0.6) = 0.6, P / N = 2 >= 1: the start stays. Target 2.2: the lower bound rises to 0.8 (P / N = 1.5, further from
    it), then the upper one to 1.8 (P / N = 2.25; 1.75 gives 2.19). Target 3 would need u = 2.4 > 2: the last pair
    (0.8, 2.0)."""
    from atr_theory.methods.weighted_trust_regions import _bapo_schedule, bapo_bounds

    y = torch.log(torch.tensor([[3.0, 0.5]], dtype=torch.float64))
    adv, mask = torch.tensor([[1.0, -1.0]], dtype=torch.float64), torch.ones(1, 2, dtype=torch.bool)
    lower, upper = _bapo_schedule(0.6, 0.8, 0.05), _bapo_schedule(1.2, 2.0, 0.05)
    assert lower == pytest.approx([0.6, 0.65, 0.7, 0.75, 0.8]) and len(upper) == 17
    assert bapo_bounds(y, adv, mask, lower, upper, 1.0) == (0.6, 1.2)
    lo, hi = bapo_bounds(y, adv, mask, lower, upper, 3.0)
    assert lo == pytest.approx(0.8) and hi == pytest.approx(2.0)
    assert bapo_bounds(y, adv, mask, lower, upper, 2.2) == (lower[-1], upper[12]) and upper[12] == pytest.approx(1.8)


@settings(max_examples=60, deadline=None)
@given(batches(), st.sampled_from([0.6, 0.7, 0.8]), st.sampled_from([0.05, 0.1]))
def test_bapo_raising_the_lower_bound_never_raises_its_share(batch, lower, step):
    """A finding about the authors' code: it measures a negative token's contribution by its clipped loss value
    ``max(w, l) |A|``, which grows with ``l``, so its first phase (raise ``l`` while ``P / N`` is below the target) can
    only lower ``P / N``: where the start misses the target, the search always ends with ``l`` at its maximum and only
    ``u`` decides. (Counting a clipped token's gradient instead, 0, raising ``l`` would lower ``N``.)"""
    logp, old, adv, mask = batch
    w = torch.exp(logp - old)[mask]
    a = _grid(adv, logp)[mask]
    n = [float((torch.maximum(w, torch.tensor(lo, dtype=w.dtype)) * (-a).clamp(min=0)).sum())
         for lo in (lower, lower + step)]
    assert n[1] >= n[0]


# ---------------------------------------------------------------------------------------------------------------
# by hand
# ---------------------------------------------------------------------------------------------------------------
def _one_token(method, w, adv, **params):
    """Objective and its gradient in log pi for one token with ratio ``w`` (pi_old = 0.1) and advantage ``adv``."""
    old = torch.tensor([[math.log(0.1)]], dtype=torch.float64)
    leaf = (old + math.log(w)).requires_grad_(True)
    out = at.policy_loss(leaf, old, torch.tensor([adv], dtype=torch.float64), torch.ones(1, 1, dtype=torch.bool),
                         method=method, aggregation="token_sum", **params)
    (grad,) = torch.autograd.grad(-out.loss, leaf)
    return float(-out.loss.detach()), float(grad), out.result


@pytest.mark.parametrize(
    ("method", "w", "adv", "params", "value", "gradient"),
    [
        # PSPO, alpha 0.1: (0.9 w + 0.1) A; gradient 0.9 w A
        ("pspo", 1.5, 2.0, {}, (0.9 * 1.5 + 0.1) * 2.0, 0.9 * 1.5 * 2.0),
        # CFPO, eps 0.2: w A - |A| (w - 1)^2 / 0.4; gradient w (A - |A| (w - 1) / 0.2), 0 at w = 1.2 for A > 0
        ("cfpo", 1.2, 1.0, {}, 1.2 - 0.04 / 0.4, 0.0),
        ("cfpo", 1.5, 1.0, {}, 1.5 - 0.25 / 0.4, 1.5 * (1 - 2.5)),
        ("cfpo", 0.7, -2.0, {}, -1.4 - 2 * 0.09 / 0.4, 0.7 * (-2 - 2 * (-0.3) / 0.2)),
        # UP-GRPO: A > 0 at any ratio: value A, gradient A; A < 0 beyond the dual clip c = 3: c A, no gradient
        ("up_grpo", 5.0, 2.0, {}, 2.0, 2.0),
        ("up_grpo", 0.5, -1.0, {}, -0.8, 0.0),
        ("up_grpo", 4.0, -1.0, {}, -3.0, 0.0),
        ("up_grpo", 1.1, -1.0, {}, -1.1, -1.1),
        # CE-GPPO, beta1 0.25, beta2 1: below the range with A < 0: 0.25 * 0.8 A in value and gradient
        ("ce_gppo", 0.5, -2.0, {}, 0.25 * 0.8 * -2.0, 0.25 * 0.8 * -2.0),
        ("ce_gppo", 1.5, 2.0, {}, 1.2 * 2.0, 1.2 * 2.0),
        ("ce_gppo", 1.5, -2.0, {}, -3.0, -3.0),
        ("ce_gppo", 3.5, -1.0, {}, -3.0, 0.0),
        # ASPO: A > 0: value A / min(w, 1.2), gradient A / w below 1.2, 0 above; 1 / w > 3: 3 A log pi
        ("aspo", 0.5, 1.0, {}, 2.0, 2.0),
        ("aspo", 1.5, 1.0, {}, 1 / 1.2, 0.0),
        ("aspo", 0.25, 1.0, {}, 3.0 * math.log(0.025), 3.0),
        # A < 0: max(w, 0.8) A; w > 3: 3 A log pi (its gradient 3 A stays)
        ("aspo", 0.5, -1.0, {}, -0.8, 0.0),
        ("aspo", 4.0, -1.0, {}, -3.0 * math.log(0.4), -3.0),
    ],
)
def test_a_token_by_hand(method, w, adv, params, value, gradient):
    got_value, got_gradient, _ = _one_token(method, w, adv, **params)
    assert got_value == pytest.approx(value, rel=1e-12, abs=1e-12)
    assert got_gradient == pytest.approx(gradient, rel=1e-12, abs=1e-12)


def test_the_flags_say_where_the_gradient_is_not_the_ratios():
    assert _one_token("ce_gppo", 0.5, -1.0)[2].clipped_low.item()
    assert _one_token("ce_gppo", 1.5, 1.0)[2].clipped_high.item()
    assert _one_token("ce_gppo", 1.1, 1.0)[2].kept.item()
    assert _one_token("up_grpo", 9.0, 1.0)[2].kept.item()
    assert _one_token("up_grpo", 0.5, -1.0)[2].clipped_low.item()
    assert _one_token("aspo", 4.0, -1.0)[2].clipped_high.item()
    assert _one_token("aspo", 0.25, 1.0)[2].clipped_low.item()
    assert _one_token("cfpo", 3.0, 1.0)[2].kept.item()


# ---------------------------------------------------------------------------------------------------------------
# where a soft rule is another rule of the registry
# ---------------------------------------------------------------------------------------------------------------
def _gradient(method, batch, **params):
    logp, old, adv, mask = batch
    return _loss_and_grad(_ours(method, old, adv, mask, **params), logp)[1]


@settings(max_examples=40, deadline=None)
@given(batches(), st.sampled_from([(0.2, 0.2, 3.0), (0.1, 0.28, 10.0)]))
def test_ce_gppo_at_beta_zero_has_dual_clip_ppos_gradient(batch, clip):
    low, high, c = clip
    common = dict(epsilon_low=low, epsilon_high=high, dual_clip_c=c)
    torch.testing.assert_close(
        _gradient("ce_gppo", batch, gppo_beta1=0.0, gppo_beta2=0.0, **common),
        _gradient("dual_clip_higher", batch, **common),
        rtol=1e-12, atol=1e-12,
    )


@settings(max_examples=40, deadline=None)
@given(batches(per_token_advantages=True))
def test_up_grpo_is_reinforce_where_a_is_positive_and_dual_clip_ppo_elsewhere(batch):
    logp, old, adv, mask = batch
    positive = (adv > 0) & mask
    up = _gradient("up_grpo", batch)
    torch.testing.assert_close(up[positive], _gradient("reinforce", batch)[positive], rtol=1e-12, atol=1e-12)
    dual = _gradient("dual_clip_higher", batch, epsilon_low=0.2, epsilon_high=0.2, dual_clip_c=3.0)
    torch.testing.assert_close(up[~positive], dual[~positive], rtol=1e-12, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(batches(), st.sampled_from([0.0, 0.3, 1.0]))
def test_pspo_gradient_is_the_unclipped_ratios_times_one_minus_alpha(batch, alpha):
    """At ``alpha = 0`` PSPO is the unclipped ratio objective ``w A`` (CFPO as its epsilon grows, PPO without a
    clip); at ``alpha = 1`` it has no gradient."""
    unclipped = _gradient("pspo", batch, pspo_alpha=0.0)
    torch.testing.assert_close(_gradient("pspo", batch, pspo_alpha=alpha), (1 - alpha) * unclipped,
                               rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(_gradient("cfpo", batch, cfpo_epsilon=1e12), unclipped, rtol=1e-9, atol=1e-9)


def test_the_soft_rules_are_registered_with_their_peers():
    for name in SOFT_RULES:
        spec = at.get_method(name)
        assert spec.forms == ("soft",) and spec.peers and spec.reference_form is not None, name
        assert all(peer.oracle == "tests/test_weighted_trust_regions.py" for peer in spec.peers), name
