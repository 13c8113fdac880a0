"""verl 0.9.1's own policy losses (``verl.trainer.ppo.core_algos``) as the oracle of ``atr_theory.policy_loss``.

Runs where verl is importable (the shared oracle code: ``tests/verl_oracle_support.py``): ``make test-verl`` builds a virtualenv with ``pip install --no-deps verl==0.9.1``
and its few pure-Python needs (verl's package ``__init__`` imports ray, which the loss code never uses: a stub
module stands in for it, see ``_import_verl``). Batches are float64, padded, with per-sequence or
per-token advantages and log-ratios within verl's +-20 clamp.

Where the two differ by design, a test says so and pins the difference:
* Clip-Cov: the same tokens lose their gradient, but verl also zeroes their loss *value*; ours keeps the value
  (detached), so only gradients are compared.
* SAPO: verl always aggregates seq-mean-token-mean; ours honours the requested aggregation.
* verl's ``seq-mean-*`` modes leave fully padded sequences out of the batch size; ours counts them (the batches
  here have none).
"""

from __future__ import annotations

import pytest
import torch

import atr_theory as at

pytest.importorskip("verl_oracle_support", reason="verl is not installed (make test-verl)")
from verl_oracle_support import (  # noqa: E402
    AGGREGATIONS,
    SEEDS,
    agree,
    core_algos,
    oracle_batch,
    our_loss,
    probability_batch,
    verl_loss,
)

# (our method and parameters, verl loss_mode and config)
RATIO_RULES = [
    (
        ("clip", {"epsilon": 0.2}),
        ("vanilla", {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 1e12}),
    ),
    (
        ("clip_higher", {"epsilon_low": 0.2, "epsilon_high": 0.28}),
        ("vanilla", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 1e12}),
    ),
    (
        ("dual_clip", {"epsilon": 0.2, "dual_clip_c": 3.0}),
        ("vanilla", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0}),
    ),
    (
        ("dual_clip", {"epsilon": 0.1, "dual_clip_c": 1.5}),
        ("vanilla", {"clip_ratio_low": 0.1, "clip_ratio_high": 0.1, "clip_ratio_c": 1.5}),
    ),
    (
        ("dual_clip_higher", {"epsilon_low": 0.2, "epsilon_high": 0.28, "dual_clip_c": 3.0}),
        ("vanilla", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}),
    ),
]


@pytest.mark.parametrize("aggregation", list(AGGREGATIONS))
@pytest.mark.parametrize("ours,theirs", RATIO_RULES, ids=lambda x: x[0] if isinstance(x[0], str) else None)
@pytest.mark.parametrize("per_token", [False, True])
def test_ratio_clipping_rules_equal_verls_vanilla_loss(ours, theirs, aggregation, per_token):
    acted = 0
    for seed in SEEDS:
        batch = oracle_batch(seed, per_token, scale=1.0)
        lo, go = our_loss(*batch, ours[0], aggregation, **ours[1])
        lv, gv, metrics = verl_loss(*batch, theirs[0], AGGREGATIONS[aggregation], **theirs[1])
        assert agree(lo, lv, aggregation) and agree(go, gv, aggregation), (seed, float(lo), float(lv))
        acted += metrics["actor/pg_clipfrac"] > 0
    assert acted > 0  # clipping acted on some batches


@pytest.mark.parametrize("aggregation", list(AGGREGATIONS))
def test_gspo_with_per_sequence_advantages_equals_verls_gspo(aggregation):
    acted = 0
    for seed in SEEDS:
        batch = oracle_batch(seed, per_token=False, scale=5e-4)  # GSPO's ranges are 3e-4 / 4e-4 wide
        lo, go = our_loss(*batch, "gspo", aggregation, epsilon_low=3e-4, epsilon_high=4e-4)
        lv, gv, metrics = verl_loss(*batch, "gspo", AGGREGATIONS[aggregation], clip_ratio_low=3e-4, clip_ratio_high=4e-4)
        assert agree(lo, lv, aggregation) and agree(go, gv, aggregation), seed
        acted += metrics["actor/pg_clipfrac"] > 0
    assert 0 < acted < len(SEEDS)


@pytest.mark.parametrize("aggregation", list(AGGREGATIONS))
def test_gspo_with_per_token_advantages_equals_verls_gspo_token(aggregation):
    """verl implements GSPO-token (``s_t = sg[s] pi_t / sg[pi_t]``): token t's gradient carries its own advantage,
    ``-A_t s / n`` per sequence; ours is GSPO-token too, so loss and gradient agree, clipping included."""
    for seed in SEEDS:
        logp, old, adv, mask = oracle_batch(seed, per_token=True, scale=0.05)
        lo, go = our_loss(logp, old, adv, mask, "gspo", aggregation, epsilon_low=0.02, epsilon_high=0.03)
        lv, gv, _ = verl_loss(
            logp, old, adv, mask, "gspo", AGGREGATIONS[aggregation], clip_ratio_low=0.02, clip_ratio_high=0.03
        )
        assert agree(lo, lv, aggregation) and agree(go, gv, aggregation), seed
    logp, old, adv, mask = oracle_batch(0, per_token=True, scale=1e-5)  # ratios ~1: nothing clipped
    _, go = our_loss(logp, old, adv, mask, "gspo", "seq_mean_token_mean", epsilon_low=0.2, epsilon_high=0.2)
    m = mask.to(torch.float64)
    n = m.sum(-1, keepdim=True)
    s = torch.exp(((logp - old) * m).sum(-1, keepdim=True) / n)
    assert torch.allclose(go, -adv * s / n / logp.shape[0] * m, rtol=1e-9)  # each token its own advantage


@pytest.mark.parametrize("per_token", [False, True])
def test_sapo_equals_verls_sapo(per_token):
    for seed in SEEDS:
        batch = oracle_batch(seed, per_token, scale=1.0)
        lo, go = our_loss(*batch, "sapo", "seq_mean_token_mean", tau_pos=1.0, tau_neg=1.05)
        lv, gv, _ = verl_loss(*batch, "sapo", "token-mean", tau_pos=1.0, tau_neg=1.05)  # verl ignores the mode
        assert agree(lo, lv, "seq_mean_token_mean") and agree(go, gv, "seq_mean_token_mean"), seed


@pytest.mark.parametrize("aggregation", list(AGGREGATIONS))
@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("eps", [(0.2, 0.28), (1.0, 2.0)])
def test_cispo_equals_verls_cispo(aggregation, per_token, eps):
    """verl's CISPO (its weight clipped to [1 - clip_ratio_low, 1 + clip_ratio_high], detached, times A log pi);
    (1, 2) is TRL's form, no lower bound and the cap 3. The weights really were clipped on both sides."""
    for seed in SEEDS:
        batch = oracle_batch(seed, per_token, scale=1.0)
        lo, go = our_loss(*batch, "cispo", aggregation, epsilon_low=eps[0], epsilon_high=eps[1])
        lv, gv, metrics = verl_loss(
            *batch, "cispo", AGGREGATIONS[aggregation], clip_ratio_low=eps[0], clip_ratio_high=eps[1]
        )
        assert agree(lo, lv, aggregation) and agree(go, gv, aggregation), seed
        assert metrics["actor/pg_clipfrac"] > 0 or eps[0] == 1.0


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("eps", [(0.4, 0.4), (0.1, 0.3)])
def test_gmpo_equals_verls_geo_mean(per_token, eps):
    """verl's ``geo_mean`` (GMPO) ignores its ``loss_agg_mode`` and averages over sequences: our per-token form
    under ``seq_mean_token_mean`` is the same loss and gradient, per-token advantages (their sequence mean, each
    token clipped by its own sign) included. Both sides' clipping acted."""
    low = high = 0
    for seed in SEEDS:
        batch = oracle_batch(seed, per_token, scale=0.5)
        lo, go = our_loss(*batch, "gmpo", "seq_mean_token_mean", epsilon_low=eps[0], epsilon_high=eps[1])
        lv, gv, metrics = verl_loss(*batch, "geo_mean", "token-mean", clip_ratio_low=eps[0], clip_ratio_high=eps[1])
        assert agree(lo, lv, "seq_mean_token_mean") and agree(go, gv, "seq_mean_token_mean"), seed
        high += metrics["actor/pg_clipfrac"] > 0
        low += metrics["actor/pg_clipfrac_lower"] > 0
    assert low > 0 and high > 0
    lo, go = our_loss(*batch, "geo_mean", "seq_mean_token_mean", epsilon_low=eps[0], epsilon_high=eps[1])  # the alias
    assert agree(lo, lv, "seq_mean_token_mean") and agree(go, gv, "seq_mean_token_mean")


@pytest.mark.parametrize("aggregation", list(AGGREGATIONS))
@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize(
    "rule,bounds,cap", [("dppo_tv", (0.05, 0.08), 3.0), ("dppo_tv", (0.2, 0.2), 20.0), ("dppo_kl", (0.02, 0.05), 3.0)]
)
def test_dppo_equals_verls_dppo(rule, bounds, cap, aggregation, per_token):
    """verl's ``dppo_tv`` / ``dppo_kl``: the same tokens masked on the side their advantage pushes, the same
    truncated weight ``min(w, clip_ratio_c)``, the same loss and gradient. Masks and truncation both acted."""
    masked = truncated = 0
    for seed in SEEDS:
        batch = probability_batch(seed, per_token)
        params = dict(delta_low=bounds[0], delta_high=bounds[1], is_cap=cap)
        lo, go = our_loss(*batch, rule, aggregation, **params)
        lv, gv, metrics = verl_loss(
            *batch,
            rule,
            AGGREGATIONS[aggregation],
            clip_ratio_low=bounds[0],
            clip_ratio_high=bounds[1],
            clip_ratio_c=cap,
        )
        assert agree(lo, lv, aggregation) and agree(go, gv, aggregation), seed
        masked += metrics["actor/pg_clipfrac"] > 0
        truncated += metrics["actor/pg_clipfrac_lower"] > 0
    assert masked > 0 and (truncated > 0 or cap == 20.0)


@pytest.mark.parametrize("aggregation", list(AGGREGATIONS))
def test_dro_equals_verls_dro(aggregation):
    for seed in SEEDS:
        batch = oracle_batch(seed, per_token=seed % 2 == 1, scale=1.0)
        lo, go = our_loss(*batch, "dro", aggregation, dro_beta=0.3)
        lv, gv, _ = verl_loss(*batch, "dro", AGGREGATIONS[aggregation], dro_beta=0.3)
        assert agree(lo, lv, aggregation) and agree(go, gv, aggregation), seed


@pytest.mark.parametrize("aggregation", list(AGGREGATIONS))
@pytest.mark.parametrize("name", ["reinforce", "gpg"])
def test_reinforce_equals_verls_gpg(name, aggregation):
    for seed in SEEDS:
        batch = oracle_batch(seed, per_token=True, scale=1.0)
        lo, go = our_loss(*batch, name, aggregation)
        lv, gv, _ = verl_loss(*batch, "gpg", AGGREGATIONS[aggregation])
        assert agree(lo, lv, aggregation) and agree(go, gv, aggregation), seed


@pytest.mark.parametrize("aggregation", list(AGGREGATIONS))
def test_clip_cov_drops_the_same_tokens_as_verl(aggregation):
    """Same candidates, same random draw (verl uses torch's global generator, ours a generator seeded alike):
    the same gradients. Loss values differ by design (verl zeroes the dropped tokens' value)."""
    dropped = 0
    for seed in SEEDS:
        batch = oracle_batch(seed, per_token=True, B=8, T=12, scale=0.4)
        params = dict(epsilon=0.2, cov_ratio=0.05, cov_lb=0.0, cov_ub=2.0)
        lp = batch[0].clone().requires_grad_(True)
        out = at.policy_loss(
            lp,
            *batch[1:],
            method="clip_cov",
            aggregation=aggregation,
            generator=torch.Generator().manual_seed(seed),
            **params,
        )
        (go,) = torch.autograd.grad(out.loss, lp)
        torch.manual_seed(seed)
        lv, gv, metrics = verl_loss(
            *batch,
            "clip_cov",
            AGGREGATIONS[aggregation],
            clip_ratio=0.2,
            clip_ratio_low=0.2,
            clip_ratio_high=0.2,
            clip_cov_ratio=0.05,
            clip_cov_lb=0.0,
            clip_cov_ub=2.0,
        )
        assert agree(go, gv, aggregation), seed
        dropped += metrics["actor/pg_clipfrac"] > 0
    assert dropped > 0


@pytest.mark.parametrize("aggregation", list(AGGREGATIONS))
def test_kl_cov_equals_verls_kl_cov(aggregation):
    for seed in SEEDS:
        batch = oracle_batch(seed, per_token=True, B=8, T=12, scale=0.4)  # continuous advantages: no covariance ties
        lo, go = our_loss(*batch, "kl_cov", aggregation, cov_ratio=0.05, kl_coef=2.0)
        lv, gv, _ = verl_loss(*batch, "kl_cov", AGGREGATIONS[aggregation], kl_cov_ratio=0.05, ppo_kl_coef=2.0)
        assert agree(lo, lv, aggregation) and agree(go, gv, aggregation), seed


def test_a_wrong_formula_fails_the_oracle():
    """The oracle has teeth: clip_higher with its two epsilons swapped disagrees with verl."""
    batch = oracle_batch(1, per_token=False, scale=1.0)
    lo, go = our_loss(*batch, "clip_higher", "token_mean", epsilon_low=0.28, epsilon_high=0.2)
    lv, gv, _ = verl_loss(*batch, "vanilla", "token-mean", clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=1e12)
    assert not (agree(lo, lv) and agree(go, gv))






VERL_KL_NAMES = [name for name in at.REFERENCE_KL_ESTIMATORS if name != "trl_k3"]


@pytest.mark.parametrize("name", VERL_KL_NAMES)
@pytest.mark.parametrize("scale", [0.5, 30.0])
def test_every_reference_kl_estimator_is_verls_kl_penalty(name, scale):
    """``atr_theory.reference_kl`` with each of verl 0.9.1's ``kl_penalty`` names: verl's values and gradients on the
    same batch, including log-ratios beyond verl's clamps (scale 30: ``low_var_kl`` clamps d at +-20 and the estimate
    at +-10), and the straight-through ``+`` variants (k2's gradient). verl's ``full`` raises NotImplementedError in
    0.9.1 and is not offered."""
    g = torch.Generator().manual_seed(7)
    ref = -torch.rand(5, 7, generator=g, dtype=torch.float64) * 3 - 0.05
    logp = ref + scale * torch.randn(5, 7, generator=g, dtype=torch.float64)
    ours_lp, theirs_lp = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
    ours = at.reference_kl(ours_lp, ref, name)
    theirs = core_algos.kl_penalty(theirs_lp, ref, name)
    assert torch.equal(ours, theirs)
    weights = torch.randn(5, 7, generator=g, dtype=torch.float64)
    (ours * weights).sum().backward()
    (theirs * weights).sum().backward()
    assert torch.equal(ours_lp.grad, theirs_lp.grad)
    with pytest.raises(NotImplementedError):
        core_algos.kl_penalty(theirs_lp, ref, "full")


@pytest.mark.parametrize("seed", range(40))
def test_the_rollout_mismatch_metrics_are_verls_offpolicy_metrics(seed):
    """``atr_llm.rollout_mismatch.rollout_mismatch_metrics`` against verl 0.9.1's own
    ``rollout_corr_helper.compute_offpolicy_metrics`` on the same batch: every key verl has, to float64 rounding and
    verl's 1e-8 in its masked means (batches with at least one valid token per sequence, engine errors up to a
    log-ratio of +-25 so verl's +-20 clamp of chi-squared acts on some)."""
    from verl.trainer.ppo.rollout_corr_helper import compute_offpolicy_metrics

    from atr_llm.rollout_mismatch import rollout_mismatch_metrics

    g = torch.Generator().manual_seed(seed)
    B, T = 6, 9
    train = torch.log_softmax(torch.randn(B, T, 13, generator=g, dtype=torch.float64), -1)[..., 0]
    scale = (0.05, 0.5, 3.0, 25.0)[seed % 4]
    rollout = (train + scale * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=0.0)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    theirs = compute_offpolicy_metrics(train, rollout, mask.double())
    ours = rollout_mismatch_metrics(train, rollout, mask)
    shared = set(theirs) & set(ours)
    assert shared == set(theirs), sorted(set(theirs) - set(ours))  # verl's every key is ours too
    for name in shared:
        assert ours[name] == pytest.approx(theirs[name], rel=1e-6, abs=1e-9), name
