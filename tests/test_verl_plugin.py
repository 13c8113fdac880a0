"""The verl plugin (``atr_llm.verl.plugin``) with verl 0.9.1: every rule through verl's policy-loss interface equals
``policy_loss``, the declared verl peers are verl's own loss modes, parameters from verl's config and from
``$ATR_GRPO_PARAMS``, and verl's rollout correction (bypass and decoupled modes, rejection sampling) against our layers.
Runs where verl is importable (``make test-verl``; the shared oracle code: ``tests/verl_oracle_support.py``)."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch

import atr_theory as at

pytest.importorskip("verl_oracle_support", reason="verl is not installed (make test-verl)")
from verl_oracle_support import (  # noqa: E402
    AGGREGATIONS,
    SEEDS,
    ActorConfig,
    agree,
    core_algos,
    oracle_batch,
    our_loss,
    probability_batch,
    verl_config,
    verl_loss,
)

# --------------------------------------------------------------------------------------------
# atr_llm.verl.plugin: every method as a verl policy loss, loaded through verl's own plugin mechanism
# --------------------------------------------------------------------------------------------
PLUGIN_METHODS = [n for n in at.method_names(aliases=False) if at.METHODS[n].sampled_tokens_only]


def test_the_plugin_is_loaded_by_verls_entry_points():
    """`import verl` loaded the package's "verl.plugins" entry point: every per-token method is registered."""
    for name in PLUGIN_METHODS + ["kl3"]:
        assert f"atr_grpo_{name}" in core_algos.POLICY_LOSS_REGISTRY, name
    assert "atr_grpo_tr_ppo" not in core_algos.POLICY_LOSS_REGISTRY  # needs the LM head: refused, documented


def _plugin(logp, old, adv, mask, method, agg_mode, weights=None, **cfg):
    lp = logp.clone().requires_grad_(True)
    fn = core_algos.get_policy_loss_fn(f"atr_grpo_{method}")
    loss, metrics = fn(old, lp, adv, mask.to(torch.float64), agg_mode, verl_config("vanilla", **cfg), weights)
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad, metrics


@pytest.mark.parametrize("method", PLUGIN_METHODS)
@pytest.mark.parametrize("aggregation", list(AGGREGATIONS))
def test_every_method_through_verl_equals_policy_loss(method, aggregation, monkeypatch):
    """verl's get_policy_loss_fn("atr_grpo_<m>") with verl's config and aggregation = atr_theory.policy_loss with the
    mapped parameters and aggregation (the same batch, loss and gradient)."""
    from atr_llm.verl import plugin as verl_plugin

    monkeypatch.delenv(verl_plugin.PARAMS_ENV, raising=False)
    cfg = dict(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0)
    for seed in range(4):
        logp, old, adv, mask = oracle_batch(seed, per_token=seed % 2 == 1)
        if method in ("gspo", "atr_seq"):  # sequence-level rules: per-sequence advantages, as GRPO's
            adv = adv[:, :1].expand_as(adv).contiguous()
        choice = verl_plugin.method_params(method, verl_config("vanilla", **cfg), extra={})
        torch.manual_seed(seed)  # clip_cov draws from torch's global generator on both sides
        lv, gv, metrics = _plugin(logp, old, adv, mask, method, AGGREGATIONS[aggregation], **cfg)
        torch.manual_seed(seed)
        lo, go = our_loss(logp, old, adv, mask, method, aggregation, form=choice.form, **choice.params)
        assert agree(lo, lv, aggregation) and agree(go, gv, aggregation), (seed, float(lo), float(lv))
        assert 0.0 <= metrics["actor/pg_clipfrac"] <= 1.0 and "actor/atr_mean_k3" in metrics


@pytest.mark.parametrize(
    "method, cfg",
    [
        ("clip", dict(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=1e12)),
        ("clip_higher", dict(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=1e12)),
        ("dual_clip", dict(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0)),
    ],
)
@pytest.mark.parametrize("aggregation", list(AGGREGATIONS))
def test_clip_through_the_plugin_equals_verls_vanilla(method, cfg, aggregation):
    for seed in range(6):
        batch = oracle_batch(seed, per_token=True)
        weights = torch.rand(batch[0].shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        lp_, gp, mp_ = _plugin(*batch, method, AGGREGATIONS[aggregation], weights, **cfg)
        lp = batch[0].clone().requires_grad_(True)
        fn = core_algos.get_policy_loss_fn("vanilla")
        lv, mv = fn(
            batch[1],
            lp,
            batch[2],
            batch[3].to(torch.float64),
            AGGREGATIONS[aggregation],
            verl_config("vanilla", **cfg),
            weights,
        )
        (gv,) = torch.autograd.grad(lv, lp)
        assert agree(lp_, lv.detach(), aggregation) and agree(gp, gv, aggregation), seed
        assert mp_["actor/ppo_kl"] == pytest.approx(mv["actor/ppo_kl"], rel=1e-9, abs=1e-12)


def _verl_peers():
    """The rules that declare verl's own loss mode (``MethodSpec.verl_loss_mode``)."""
    return [n for n in at.method_names(aliases=False) if at.METHODS[n].verl_loss_mode is not None]


def _verl_fields(method: str, scale: float = 1.0) -> dict:
    """verl's config fields for ``method``'s parameters at ``scale`` times their defaults (``Param.verl``)."""
    return {
        field: p.default * scale for p in at.METHODS[method].params.values() for _section, field in p.verl
    }


@pytest.mark.parametrize("method", _verl_peers())
def test_every_declared_verl_peer_is_verls_own_loss_mode(method):
    """Each rule that declares ``verl_loss_mode``, with its parameters set only through verl's config fields (at the
    defaults and at 1.5 times them): ``atr_grpo_<rule>`` through the plugin and verl's own mode give the same
    gradient and loss as ``policy_loss`` on the same batches (seq-mean-token-mean, which geo_mean and sapo use
    whatever the mode; clip_cov's loss value differs by design, its gradient does not:
    ``test_clip_cov_drops_the_same_tokens_as_verl``)."""
    spec = at.METHODS[method]
    assert spec.verl_loss_mode in core_algos.POLICY_LOSS_REGISTRY
    agg = "seq-mean-token-mean"
    for scale in (1.0, 1.5):
        cfg = _verl_fields(method, scale)
        params = {k: p.default * scale for k, p in spec.params.items()}
        for seed in range(6):
            batch = probability_batch(seed, per_token=seed % 2 == 1 and method != "gspo")
            kw = {"generator": torch.Generator().manual_seed(seed)} if method == "clip_cov" else {}
            lo, go = our_loss(*batch, method, "seq_mean_token_mean", **kw, **params)
            torch.manual_seed(seed)  # clip_cov draws from torch's global generator in verl and in the plugin
            lv, gv, _ = verl_loss(*batch, spec.verl_loss_mode, agg, **cfg)
            torch.manual_seed(seed)
            lp_, gp, _ = _plugin(*batch, method, agg, **cfg)
            assert agree(go, gv, "seq_mean_token_mean") and agree(gp, gv, "seq_mean_token_mean"), (scale, seed)
            if method != "clip_cov":
                assert agree(lo, lv, "seq_mean_token_mean") and agree(lp_, lv, "seq_mean_token_mean"), (scale, seed)


def test_verls_global_batch_info_sets_the_normalisation():
    """Data-parallel normalisation is verl's: with dp_size and a global token count, the plugin's loss is verl's."""
    logp, old, adv, mask = oracle_batch(0, per_token=False)
    cfg = verl_config("vanilla", clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=1e12)
    cfg.global_batch_info.update(dp_size=2, batch_num_tokens=100, global_batch_size=12)
    for agg in ("token-mean", "seq-mean-token-sum"):
        ours, _ = core_algos.get_policy_loss_fn("atr_grpo_clip")(old, logp, adv, mask.double(), agg, cfg)
        theirs, _ = core_algos.get_policy_loss_fn("vanilla")(old, logp, adv, mask.double(), agg, cfg)
        assert torch.allclose(ours, theirs, rtol=1e-12, atol=1e-14), agg


def test_params_from_the_environment_are_honoured_and_checked(monkeypatch):
    from atr_llm.verl import plugin as verl_plugin

    logp, old, adv, mask = oracle_batch(1, per_token=False)
    monkeypatch.setenv(verl_plugin.PARAMS_ENV, '{"delta": 0.02}')
    lv, _, _ = _plugin(logp, old, adv, mask, "atr", "token-mean")
    lo, _ = our_loss(logp, old, adv, mask, "atr", "token_mean", delta=0.02)
    ld, _ = our_loss(logp, old, adv, mask, "atr", "token_mean")
    assert agree(lo, lv) and not agree(ld, lv)
    deep = "[" * 50_000 + "]" * 50_000  # json reads nesting by recursion: RecursionError, naming nothing
    for raw, match in (
        ('{"tau_pos": 2}', "does not take"),
        ("delta=0.1", "JSON object"),
        ('{"delta": -1}', "delta"),
        (deep, r"^ATR_GRPO_PARAMS nests too deeply to read \(100000 characters\)"),
    ):
        monkeypatch.setenv(verl_plugin.PARAMS_ENV, raw)
        with pytest.raises(ValueError, match=match):
            _plugin(logp, old, adv, mask, "atr", "token-mean")
    monkeypatch.delenv(verl_plugin.PARAMS_ENV)
    with pytest.raises(ValueError, match="clip_ratio_low=0.2 and clip_ratio_high=0.28 differ"):
        _plugin(logp, old, adv, mask, "clip", "token-mean", clip_ratio_low=0.2, clip_ratio_high=0.28)


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("extra", [0, 3, 4087])
def test_dr_grpo_max_length_is_verls_loss_scale_factor(per_token, extra):
    """Dr. GRPO's divisor B * max_length (Liu et al. 2025): ours with ``max_length = L`` equals verl's
    ``seq-mean-token-sum-norm`` with ``global_batch_info['loss_scale_factor'] = L``, loss and gradient."""
    cfg = dict(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=1e12)
    for seed in SEEDS:
        batch = oracle_batch(seed, per_token, scale=1.0)
        L = batch[0].shape[1] + extra
        lo, go = our_loss(*batch, "clip", "dr_grpo", epsilon=0.2, max_length=L)
        lv, gv, _ = verl_loss(*batch, "vanilla", "seq-mean-token-sum-norm", batch_info=dict(loss_scale_factor=L), **cfg)
        assert agree(lo, lv) and agree(go, gv), (seed, L)


def test_an_all_padding_row_counts_in_our_batch_size_but_not_in_verls():
    """A documented difference: verl's seq-mean-token-sum(-norm) divides by the number of sequences with at least
    one valid token, ours (Dr. GRPO's B * max_length, the paper's Eq. 2) by B; with one of B = 6 rows all padding
    the two differ by exactly the factor 6 / 5 and agree otherwise."""
    logp, old, adv, mask = oracle_batch(0, per_token=False, scale=1.0)
    mask[2] = False
    for ours_agg, verl_agg in [("dr_grpo", "seq-mean-token-sum-norm"), ("seq_mean_token_sum", "seq-mean-token-sum")]:
        lo, _ = our_loss(logp, old, adv, mask, "clip", ours_agg, epsilon=0.2)
        lv, _, _ = verl_loss(
            logp, old, adv, mask, "vanilla", verl_agg, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=1e12
        )
        assert not agree(lo, lv)
        assert agree(lo * 6 / 5, lv), ours_agg


# --------------------------------------------------------------------------------------------
# Rollout correction: verl's IS weights and rejection masks (rollout_corr_helper) against atr_theory.layers
# --------------------------------------------------------------------------------------------
from verl.trainer.ppo import rollout_corr_helper  # noqa: E402

RS_OPTIONS = sorted(rollout_corr_helper.SUPPORTED_ROLLOUT_RS_OPTIONS)


def _mismatch_batch(seed: int, B: int = 8, T: int = 10, scale: float = 0.3):
    """log pi_old - log pi_behaviour per token (a small mismatch) and a padded mask."""
    g = torch.Generator().manual_seed(seed)
    log_rho = scale * torch.randn(B, T, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    return log_rho, torch.arange(T)[None, :] < lengths[:, None]


def _our_mask(option: str, threshold) -> at.SequenceMask:
    """verl's ``rollout_rs`` option and threshold as our ``SequenceMask`` (advantages: all)."""
    level, estimator = option.rsplit("_", 1)
    reduction = "token" if level == "token" else level.split("_")[1]
    if estimator == "k1":
        lo, hi = (float(x) for x in str(threshold).split("_"))
        return at.SequenceMask(estimator, reduction, math.log(hi), "all", lower=math.log(lo))
    return at.SequenceMask(estimator, reduction, float(threshold), "all")


@pytest.mark.parametrize("option", RS_OPTIONS)
def test_rejection_masks_equal_verls_rollout_rs(option):
    """Every ``rollout_rs`` option is a ``SequenceMask``; the same tokens are rejected, and some were."""
    threshold = "0.7_1.2" if option.endswith("k1") else ("0.02" if option.startswith("token") else "0.2")
    if option.startswith("seq_sum") and not option.endswith("k1"):
        threshold = "0.3"
    rejected = 0
    for seed in SEEDS:
        log_rho, mask = _mismatch_batch(seed)
        theirs, _ = rollout_corr_helper.compute_rollout_rejection_mask(
            log_rho, mask.to(torch.float64), rollout_rs=option, rollout_rs_threshold=threshold
        )
        keep = at.layers.sequence_mask_keep(log_rho, torch.ones(log_rho.shape[0]), mask, _our_mask(option, threshold))
        ours = (keep.expand_as(mask) & mask).to(torch.float64)
        assert torch.equal(ours, theirs), (option, seed)
        rejected += bool((theirs < mask.to(torch.float64)).any())
    assert rejected > 0


def test_verls_k1_bounds_bound_the_inverse_ratio():
    """verl's k1 thresholds ``"lo_hi"`` are documented as ratio bounds, but they bound ``-log r``: ``"0.8_1.5"`` keeps
    ``r`` in ``[1/1.5, 1/0.8] = [0.667, 1.25]``, not ``[0.8, 1.5]``. A token with ``r = 1.4`` is rejected, one with
    ``r = 0.7`` kept."""
    log_rho = torch.log(torch.tensor([[1.4, 0.7, 1.24, 0.68]], dtype=torch.float64))
    mask = torch.ones(1, 4, dtype=torch.float64)
    theirs, _ = rollout_corr_helper.compute_rollout_rejection_mask(log_rho, mask, "token_k1", "0.8_1.5")
    assert theirs.tolist() == [[0.0, 1.0, 1.0, 1.0]]


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("threshold", [2.0, "0.5_1.5"])
@pytest.mark.parametrize("normalize", [False, True])
def test_is_weights_equal_verls_rollout_is(level, threshold, normalize):
    """``rollout_is`` token / sequence, TIS (one bound) and IcePop (``"lower_upper"``), with and without batch
    normalisation: the same weights as ``atr_theory.layers.rollout_correction_weights``."""
    if isinstance(threshold, str):
        lo, hi = (float(x) for x in threshold.split("_"))
        spec = at.RolloutCorrection(level, "mask", hi, lo, normalize)
    else:
        spec = at.RolloutCorrection(level, "truncate", threshold, None, normalize)
    acted = 0
    for seed in SEEDS:
        log_rho, mask = _mismatch_batch(seed, scale=0.4 if level == "token" else 0.15)
        theirs, _ = rollout_corr_helper.compute_rollout_correction_weights(
            log_rho, mask.to(torch.float64), level, threshold, normalize
        )
        ours = at.layers.rollout_correction_weights(log_rho, mask, spec)
        # verl's masked mean divides by n + 1e-8: the normalised weights differ by ~1e-8 / n relative
        assert torch.allclose(ours, theirs, rtol=1e-8 if normalize else 1e-12, atol=0.0), (seed, level, threshold)
        raw = torch.exp(log_rho if level == "token" else (log_rho * mask).sum(-1, keepdim=True).expand_as(log_rho))
        acted += bool(((raw > spec.upper) & mask).any())
    assert acted > 0


def _bypass_config(rollout_is, is_threshold, rollout_rs, rs_threshold):
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.workers.config.actor import PolicyLossConfig

    correction = RolloutCorrectionConfig(
        rollout_is=rollout_is,
        rollout_is_threshold=is_threshold,
        rollout_rs=rollout_rs,
        rollout_rs_threshold=rs_threshold,
        bypass_mode=True,
        loss_type="reinforce",
    )
    policy = PolicyLossConfig(loss_mode="bypass_mode", rollout_correction=correction)
    return ActorConfig(strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=1, policy_loss=policy)


def _verl_bypass(logp, old, adv, mask, agg_mode, rollout_rs, rs_threshold, is_threshold=2.0):
    """verl's bypass mode, REINFORCE with token TIS and the rejection ``rollout_rs``; the batch sizes in
    ``global_batch_info`` are those of the batch before rejection, as verl's trainer sets them before the loss."""
    lp = logp.clone().requires_grad_(True)
    config = _bypass_config("token", is_threshold, rollout_rs, rs_threshold)
    config.global_batch_info.update(batch_num_tokens=int(mask.sum()), global_batch_size=mask.shape[0])
    loss, metrics = core_algos.get_policy_loss_fn("bypass_mode")(old, lp, adv, mask.to(torch.float64), agg_mode, config)
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad, metrics


BYPASS = [("token_k3", "token", "atr"), ("seq_mean_k3", "mean", "atr_seq")]


def _kept_token_rescaling(logp, old, mask, option, delta, aggregation):
    """Where verl and we differ by design: its bypass mode removes rejected tokens from the mask it aggregates with,
    so under ``seq-mean-token-mean`` a sequence's mean runs over its *kept* tokens; ours (like Eq. 5's frozen tokens)
    over all of them. Per sequence the gradients then differ by ``n / n_kept``: returned as a (B, 1) factor, None
    where the two agree (other aggregations fix the denominators from the batch before rejection; sequence-level
    rejection removes whole sequences)."""
    if aggregation != "seq_mean_token_mean" or not option.startswith("token"):
        return None
    kept, _ = rollout_corr_helper.compute_rollout_rejection_mask(logp - old, mask.to(torch.float64), option, delta)
    factor = mask.sum(-1, keepdim=True) / kept.sum(-1, keepdim=True).clamp(min=1)
    return None if bool((factor == 1).all()) else factor.to(torch.float64)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"])
@pytest.mark.parametrize("option,reduction,rule", BYPASS)
def test_bypass_reinforce_with_k3_rejection_is_reinforce_with_our_layers(option, reduction, rule, aggregation):
    """verl's bypass mode (REINFORCE, token TIS at 2, ``rollout_rs`` k3 at delta) is our ``reinforce`` with
    ``RolloutCorrection`` and ``SequenceMask``: the same loss and gradient."""
    delta = 0.07
    for seed in SEEDS:
        logp, old, adv, mask = oracle_batch(seed, per_token=False, scale=0.4)
        lv, gv, _ = _verl_bypass(logp, old, adv, mask, AGGREGATIONS[aggregation], option, delta)
        lo, go = our_loss(
            logp,
            old,
            adv,
            mask,
            "reinforce",
            aggregation,
            rollout_correction=at.RolloutCorrection("token", "truncate", 2.0),
            sequence_mask=at.SequenceMask("k3", reduction, delta, "all"),
        )
        scale = _kept_token_rescaling(logp, old, mask, option, delta, aggregation)
        assert agree(lo, lv, aggregation) == (scale is None) and agree(
            go * (1.0 if scale is None else scale), gv, aggregation
        ), seed


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"])
@pytest.mark.parametrize("option,reduction,rule", BYPASS)
def test_bypass_reinforce_with_k3_rejection_has_atrs_gradient(option, reduction, rule, aggregation):
    """A second, independent implementation of the paper's rule: verl's bypass REINFORCE with ``token_k3``
    rejection has ATR's gradient in its mask form (the Section 4 pure-clip objective: ``form="mask"``; ``atr``'s
    default is the min form), and with ``seq_mean_k3`` that of ``atr_seq``, when its IS cap
    lies above every kept ratio (token_k3: above ATR's upper bound 1.422; seq_mean_k3: a mean bound lets single
    ratios go further, so the cap is 1e6 here). Loss values differ (``A log pi`` against ``w A``)."""
    delta = 0.07
    for seed in SEEDS:
        logp, old, adv, mask = oracle_batch(seed, per_token=True, scale=0.4)
        _, gv, _ = _verl_bypass(logp, old, adv, mask, AGGREGATIONS[aggregation], option, delta, 1e6)
        _, go = our_loss(logp, old, adv, mask, rule, aggregation, form="mask", delta=delta)
        scale = _kept_token_rescaling(logp, old, mask, option, delta, aggregation)
        assert agree(go * (1.0 if scale is None else scale), gv, aggregation), seed


def test_decoupled_mode_weights_multiply_the_rule():
    """verl's decoupled mode: a rule's loss times the IS weights of ``pi_old / pi_rollout`` (computed by verl's
    helper) equals ours with ``behaviour_logp`` and ``RolloutCorrection``, sequence level, IcePop."""
    for seed in SEEDS:
        logp, old, adv, mask = oracle_batch(seed, per_token=False, scale=0.4)
        rollout = old + 0.05 * torch.randn(old.shape, generator=torch.Generator().manual_seed(seed), dtype=old.dtype)
        weights, _ = rollout_corr_helper.compute_rollout_correction_weights(
            old - rollout, mask.to(torch.float64), "sequence", "0.5_2.0"
        )
        lp = logp.clone().requires_grad_(True)
        config = verl_config("vanilla", clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=1e12)
        loss, _ = core_algos.get_policy_loss_fn("vanilla")(
            old, lp, adv, mask.to(torch.float64), "token-mean", config, weights
        )
        (gv,) = torch.autograd.grad(loss, lp)
        lo, go = our_loss(
            logp,
            old,
            adv,
            mask,
            "clip_higher",
            "token_mean",
            epsilon_low=0.2,
            epsilon_high=0.28,
            behaviour_logp=rollout,
            rollout_correction=at.RolloutCorrection("sequence", "mask", 2.0, 0.5),
        )
        assert agree(lo, loss.detach()) and agree(go, gv), seed


def test_the_plugin_applies_our_layers_as_verls_bypass_mode(monkeypatch):
    """``$ATR_GRPO_PARAMS`` layers: ``atr_grpo_reinforce`` with our rollout correction and token-k3 mask, given
    verl's bypass batch (old = rollout log-probs), is verl's own ``bypass_mode`` (REINFORCE, token TIS at 2,
    ``rollout_rs="token_k3"``): the same loss and gradient."""
    from atr_llm.verl import plugin as verl_plugin

    layers = {
        "rollout_correction": {"level": "token", "mode": "truncate", "upper": 2.0},
        "sequence_mask": {"estimator": "k3", "reduction": "token", "threshold": 0.07, "advantages": "all"},
    }
    monkeypatch.setenv(verl_plugin.PARAMS_ENV, json.dumps(layers))
    for seed in range(6):
        logp, old, adv, mask = oracle_batch(seed, per_token=False, scale=0.4)
        lv, gv, _ = _verl_bypass(logp, old, adv, mask, "token-mean", "token_k3", 0.07)
        lp_, gp, _ = _plugin(logp, old, adv, mask, "reinforce", "token-mean")
        assert agree(lp_, lv) and agree(gp, gv), seed
    with pytest.raises(ValueError, match="applied twice"):
        _plugin(logp, old, adv, mask, "reinforce", "token-mean", torch.ones_like(logp))


@pytest.mark.parametrize(
    "value, message",
    [
        ({"rollout_correction": {"level": "tokens"}}, "level must be one of"),
        ({"rollout_correction": [2.0]}, "must be a JSON object of RolloutCorrection fields"),
        ({"sequence_mask": {"estimator": "k3", "cap": 1}}, "key 'sequence_mask'.*unexpected keyword argument 'cap'"),
    ],
)
def test_bad_layers_in_the_environment_are_refused_by_name(value, message, monkeypatch):
    from atr_llm.verl import plugin as verl_plugin

    monkeypatch.setenv(verl_plugin.PARAMS_ENV, json.dumps(value))
    with pytest.raises(ValueError, match=message):
        verl_plugin.layers_from_params(verl_plugin.env_params())


def test_verls_k3_cancels_near_a_small_bound_ours_is_exact():
    """verl evaluates k3 as ``exp(y) - 1 - y``, which cancels for small ``y``: at ``delta = 1e-8`` (bound near
    ``y = 1.41e-4``) it decides 391 of 2,001 log-ratios spaced 1e-15 around the bound (within 1e-12 of it) otherwise
    than exact arithmetic (mpmath, 50 digits); ``SequenceMask`` (the k3 series near 0) decides every one as
    mpmath does. At realistic bounds (0.01 and up) the band is ~1e-15 wide: no random batch shows it."""
    import mpmath as mp

    delta = 1e-8
    with mp.workdps(50):
        bound = float(mp.findroot(lambda y: mp.expm1(y) - y - delta, 1.4e-4))
        ys = [bound + i * 1e-15 for i in range(-1000, 1001)]
        exact = [bool(mp.expm1(mp.mpf(y)) - mp.mpf(y) <= delta) for y in ys]
    log_ratio = torch.tensor([ys], dtype=torch.float64)
    mask = torch.ones_like(log_ratio)
    theirs, _ = rollout_corr_helper.compute_rollout_rejection_mask(log_ratio, mask, "token_k3", delta)
    ours = at.layers.sequence_mask_keep(log_ratio, torch.ones(1), mask, at.SequenceMask("k3", "token", delta, "all"))
    assert ours[0].tolist() == exact
    wrong = sum(bool(t) != e for t, e in zip(theirs[0].tolist(), exact))
    assert wrong > 0, "verl's k3 now agrees with exact arithmetic here: update the docs"


def test_parameters_in_verls_config_reach_the_loss_and_show_in_its_metrics(monkeypatch):
    """``policy_loss._target_=atr_llm.verl.config.PolicyLossConfig`` with ``atr_params``: verl builds the config
    from its Hydra dict (``omega_conf_to_dataclass``), the loss runs with the parameters (equal to
    ``atr_theory.policy_loss`` with them), and reports each as ``actor/atr_param_<name>``."""
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    from atr_llm.verl.config import PolicyLossConfig

    monkeypatch.delenv("ATR_GRPO_PARAMS", raising=False)
    built = omega_conf_to_dataclass(
        OmegaConf.create(
            {
                "_target_": "atr_llm.verl.config.PolicyLossConfig",
                "loss_mode": "atr_grpo_atr",
                "atr_params": {"delta": 0.03},
            }
        )
    )
    assert isinstance(built, PolicyLossConfig) and dict(built.atr_params) == {"delta": 0.03}
    config = ActorConfig(strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=1, policy_loss=built)
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(3, 6, generator=g, dtype=torch.float64) - 0.1
    logp = old + 0.4 * torch.randn(3, 6, generator=g, dtype=torch.float64)
    adv, mask = torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64), torch.ones(3, 6, dtype=torch.bool)
    loss, metrics = core_algos.get_policy_loss_fn("atr_grpo_atr")(old, logp, adv, mask.double(), "token-mean", config)
    assert metrics["actor/atr_param_delta"] == 0.03
    want = at.policy_loss(logp, old, adv, mask, method="atr", delta=0.03).loss
    other = at.policy_loss(logp, old, adv, mask, method="atr", delta=0.07).loss
    assert torch.allclose(loss, want, rtol=1e-12) and not torch.allclose(want, other)


def test_a_rule_written_as_one_new_module_is_registered_in_verl(written_rule_module):
    """One new module in atr_theory/methods/, nothing else edited: in a fresh process, importing verl registers
    ``atr_grpo_zz_written_rule``, and verl's call of it (its parameter from $ATR_GRPO_PARAMS) is policy_loss's."""
    import os
    import subprocess
    from pathlib import Path

    script = """
import torch
import atr_theory as at
from verl_oracle_support import core_algos, oracle_batch, verl_config  # verl, ray stubbed
assert "atr_grpo_zz_written_rule" in core_algos.POLICY_LOSS_REGISTRY
logp, old, adv, mask = oracle_batch(0, per_token=True)
lp = logp.clone().requires_grad_(True)
config = verl_config("vanilla", clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0)
loss, _ = core_algos.get_policy_loss_fn("atr_grpo_zz_written_rule")(
    old, lp, adv, mask.to(torch.float64), "token-mean", config, None
)
want = at.policy_loss(logp, old, adv, mask, method="zz_written_rule", zz_sharpness=4.0, aggregation="token_mean")
assert torch.allclose(loss, want.loss, rtol=1e-12, atol=0), (float(loss), float(want.loss))
print("OK")
"""
    tests = os.pathsep.join(p for p in (str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "ATR_GRPO_PARAMS": '{"zz_sharpness": 4.0}', "PYTHONPATH": tests}  # verl_oracle_support
    root = Path(__file__).resolve().parents[1]
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=root, env=env, timeout=300)
    assert res.returncode == 0 and "OK" in res.stdout, res.stderr[-3000:]


def test_the_plugin_resolves_its_rule_once_per_process(monkeypatch):
    """verl calls the loss every micro-batch with the same actor config: the rule is resolved on the first call and
    handed to ``policy_loss`` resolved, so five calls resolve once (``atr_theory.resolve``, wherever it is called)."""
    import atr_theory
    import atr_theory.loss as loss_module
    from atr_llm.verl import plugin as verl_plugin

    monkeypatch.delenv(verl_plugin.PARAMS_ENV, raising=False)
    monkeypatch.setattr(verl_plugin, "_CHOICES", {})
    calls = []
    real = atr_theory.resolve

    def counting(*args, **kwargs):
        calls.append(args[0] if args else kwargs.get("method"))
        return real(*args, **kwargs)

    monkeypatch.setattr(atr_theory, "resolve", counting)
    monkeypatch.setattr(loss_module, "resolve", counting)
    logp, old, adv, mask = oracle_batch(0, per_token=False)
    cfg = verl_config("vanilla", clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0)
    fn = core_algos.get_policy_loss_fn("atr_grpo_clip")
    losses = [fn(old, logp, adv, mask.to(torch.float64), "token-mean", cfg, None)[0] for _ in range(5)]
    assert calls == ["clip"] and len({float(loss) for loss in losses}) == 1
