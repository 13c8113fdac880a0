"""verl 0.9.1's own policy losses (``verl.trainer.ppo.core_algos``) as the oracle of ``atr_theory.policy_loss``.

Runs where verl is importable: ``make test-verl`` builds a virtualenv with ``pip install --no-deps verl==0.9.1``
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

import json
import math
import sys
import types

import pytest
import torch

import atr_theory as at


def _import_verl():
    """``verl.trainer.ppo.core_algos`` and ``ActorConfig``, with a stub for ray (imported by verl's
    ``__init__`` through ``protocol.py``, never called by the loss functions)."""
    if "ray" not in sys.modules:

        class _Anything:
            def __init__(self, *a, **k):
                pass

            def __call__(self, *a, **k):
                return a[0] if len(a) == 1 and callable(a[0]) and not k else _Anything()

            def __getattr__(self, name):
                return _Anything()

            def __getitem__(self, item):
                return _Anything()

            def __mro_entries__(self, bases):
                return (object,)

            def __or__(self, other):
                return _Anything()

            __ror__ = __or__

        class _StubModule(types.ModuleType):
            def __getattr__(self, name):
                if name.startswith("__"):
                    raise AttributeError(name)
                return _Anything()

        for name in ("ray", "ray.util", "ray.util.placement_group", "ray.util.scheduling_strategies", "ray.actor"):
            sys.modules[name] = _StubModule(name)
    from verl.trainer.ppo import core_algos
    from verl.workers.config import ActorConfig

    return core_algos, ActorConfig


try:
    core_algos, ActorConfig = _import_verl()
except ImportError:  # pragma: no cover - the main environment has no verl: `make test-verl` runs this file
    pytest.skip("verl is not installed (make test-verl)", allow_module_level=True)

AGGREGATIONS = {  # ours -> verl's loss_agg_mode (dr_grpo: seq-mean-token-sum-norm with the horizon T)
    "dr_grpo": "seq-mean-token-sum-norm",
    "token_mean": "token-mean",
    "seq_mean_token_mean": "seq-mean-token-mean",
    "seq_mean_token_sum": "seq-mean-token-sum",
    "token_sum": "token-sum",
}
SEEDS = range(12)


def _batch(seed: int, per_token: bool, B: int = 6, T: int = 9, scale: float = 0.5):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 0.05
    logp = old + scale * torch.randn(B, T, generator=g, dtype=torch.float64)
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    adv = (
        torch.randn(B, T, generator=g, dtype=torch.float64)
        if per_token
        else torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T)
    )
    return logp, old, adv.contiguous(), mask


def _config(loss_mode: str, **kw) -> ActorConfig:
    from verl.workers.config.actor import PolicyLossConfig

    policy_keys = {"clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef", "dro_beta"}
    policy = PolicyLossConfig(loss_mode=loss_mode, **{k: v for k, v in kw.items() if k in policy_keys})
    actor = {k: v for k, v in kw.items() if k not in policy_keys}
    return ActorConfig(strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=1, policy_loss=policy, **actor)


def _ours(logp, old, adv, mask, method, aggregation, **params):
    """Our loss and gradient; ``params`` are the method's and ``atr_theory.policy_loss``'s keywords."""
    lp = logp.clone().requires_grad_(True)
    out = at.policy_loss(lp, old, adv, mask, method=method, aggregation=aggregation, **params)
    (grad,) = torch.autograd.grad(out.loss, lp)
    return out.loss.detach(), grad


def _verl(logp, old, adv, mask, loss_mode, agg_mode, batch_info=None, **cfg):
    """verl's loss and gradient; ``batch_info`` goes into the config's ``global_batch_info`` (e.g. loss_scale_factor)."""
    lp = logp.clone().requires_grad_(True)
    fn = core_algos.get_policy_loss_fn(loss_mode)
    config = _config(loss_mode, **cfg)
    config.global_batch_info.update(batch_info or {})
    loss, metrics = fn(old, lp, adv, mask.to(torch.float64), agg_mode, config)
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad, metrics


def _close(a, b, aggregation=None):
    """Equal to float64 rounding; verl's seq-mean-token-mean divides by ``n_tokens + 1e-8``, which moves each
    O(1) per-sequence term by up to 1e-8 (absolute; the total can be much smaller than its terms)."""
    if aggregation == "seq_mean_token_mean":
        return torch.allclose(a, b, rtol=0.0, atol=2e-8)
    return torch.allclose(a, b, rtol=1e-12, atol=1e-14)


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
        batch = _batch(seed, per_token, scale=1.0)
        lo, go = _ours(*batch, ours[0], aggregation, **ours[1])
        lv, gv, metrics = _verl(*batch, theirs[0], AGGREGATIONS[aggregation], **theirs[1])
        assert _close(lo, lv, aggregation) and _close(go, gv, aggregation), (seed, float(lo), float(lv))
        acted += metrics["actor/pg_clipfrac"] > 0
    assert acted > 0  # clipping acted on some batches


@pytest.mark.parametrize("aggregation", list(AGGREGATIONS))
def test_gspo_with_per_sequence_advantages_equals_verls_gspo(aggregation):
    acted = 0
    for seed in SEEDS:
        batch = _batch(seed, per_token=False, scale=5e-4)  # GSPO's ranges are 3e-4 / 4e-4 wide
        lo, go = _ours(*batch, "gspo", aggregation, epsilon_low=3e-4, epsilon_high=4e-4)
        lv, gv, metrics = _verl(*batch, "gspo", AGGREGATIONS[aggregation], clip_ratio_low=3e-4, clip_ratio_high=4e-4)
        assert _close(lo, lv, aggregation) and _close(go, gv, aggregation), seed
        acted += metrics["actor/pg_clipfrac"] > 0
    assert 0 < acted < len(SEEDS)


@pytest.mark.parametrize("aggregation", list(AGGREGATIONS))
def test_gspo_with_per_token_advantages_equals_verls_gspo_token(aggregation):
    """verl implements GSPO-token (``s_t = sg[s] pi_t / sg[pi_t]``): token t's gradient carries its own advantage,
    ``-A_t s / n`` per sequence; ours is GSPO-token too, so loss and gradient agree, clipping included."""
    for seed in SEEDS:
        logp, old, adv, mask = _batch(seed, per_token=True, scale=0.05)
        lo, go = _ours(logp, old, adv, mask, "gspo", aggregation, epsilon_low=0.02, epsilon_high=0.03)
        lv, gv, _ = _verl(
            logp, old, adv, mask, "gspo", AGGREGATIONS[aggregation], clip_ratio_low=0.02, clip_ratio_high=0.03
        )
        assert _close(lo, lv, aggregation) and _close(go, gv, aggregation), seed
    logp, old, adv, mask = _batch(0, per_token=True, scale=1e-5)  # ratios ~1: nothing clipped
    _, go = _ours(logp, old, adv, mask, "gspo", "seq_mean_token_mean", epsilon_low=0.2, epsilon_high=0.2)
    m = mask.to(torch.float64)
    n = m.sum(-1, keepdim=True)
    s = torch.exp(((logp - old) * m).sum(-1, keepdim=True) / n)
    assert torch.allclose(go, -adv * s / n / logp.shape[0] * m, rtol=1e-9)  # each token its own advantage


@pytest.mark.parametrize("per_token", [False, True])
def test_sapo_equals_verls_sapo(per_token):
    for seed in SEEDS:
        batch = _batch(seed, per_token, scale=1.0)
        lo, go = _ours(*batch, "sapo", "seq_mean_token_mean", tau_pos=1.0, tau_neg=1.05)
        lv, gv, _ = _verl(*batch, "sapo", "token-mean", tau_pos=1.0, tau_neg=1.05)  # verl ignores the mode
        assert _close(lo, lv, "seq_mean_token_mean") and _close(go, gv, "seq_mean_token_mean"), seed


@pytest.mark.parametrize("aggregation", list(AGGREGATIONS))
@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("eps", [(0.2, 0.28), (1.0, 2.0)])
def test_cispo_equals_verls_cispo(aggregation, per_token, eps):
    """verl's CISPO (its weight clipped to [1 - clip_ratio_low, 1 + clip_ratio_high], detached, times A log pi);
    (1, 2) is TRL's form, no lower bound and the cap 3. The weights really were clipped on both sides."""
    for seed in SEEDS:
        batch = _batch(seed, per_token, scale=1.0)
        lo, go = _ours(*batch, "cispo", aggregation, epsilon_low=eps[0], epsilon_high=eps[1])
        lv, gv, metrics = _verl(
            *batch, "cispo", AGGREGATIONS[aggregation], clip_ratio_low=eps[0], clip_ratio_high=eps[1]
        )
        assert _close(lo, lv, aggregation) and _close(go, gv, aggregation), seed
        assert metrics["actor/pg_clipfrac"] > 0 or eps[0] == 1.0


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("eps", [(0.4, 0.4), (0.1, 0.3)])
def test_gmpo_equals_verls_geo_mean(per_token, eps):
    """verl's ``geo_mean`` (GMPO) ignores its ``loss_agg_mode`` and averages over sequences: our per-token form
    under ``seq_mean_token_mean`` is the same loss and gradient, per-token advantages (their sequence mean, each
    token clipped by its own sign) included. Both sides' clipping acted."""
    low = high = 0
    for seed in SEEDS:
        batch = _batch(seed, per_token, scale=0.5)
        lo, go = _ours(*batch, "gmpo", "seq_mean_token_mean", epsilon_low=eps[0], epsilon_high=eps[1])
        lv, gv, metrics = _verl(*batch, "geo_mean", "token-mean", clip_ratio_low=eps[0], clip_ratio_high=eps[1])
        assert _close(lo, lv, "seq_mean_token_mean") and _close(go, gv, "seq_mean_token_mean"), seed
        high += metrics["actor/pg_clipfrac"] > 0
        low += metrics["actor/pg_clipfrac_lower"] > 0
    assert low > 0 and high > 0
    lo, go = _ours(*batch, "geo_mean", "seq_mean_token_mean", epsilon_low=eps[0], epsilon_high=eps[1])  # the alias
    assert _close(lo, lv, "seq_mean_token_mean") and _close(go, gv, "seq_mean_token_mean")


def _probability_batch(seed: int, per_token: bool):
    """``_batch`` with every log-probability <= -1e-6 (DPPO reads ``p = exp(log p)`` as a probability)."""
    logp, old, adv, mask = _batch(seed, per_token, scale=1.0)
    return logp.clamp(max=-1e-6), old, adv, mask


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
        batch = _probability_batch(seed, per_token)
        params = dict(delta_low=bounds[0], delta_high=bounds[1], is_cap=cap)
        lo, go = _ours(*batch, rule, aggregation, **params)
        lv, gv, metrics = _verl(
            *batch,
            rule,
            AGGREGATIONS[aggregation],
            clip_ratio_low=bounds[0],
            clip_ratio_high=bounds[1],
            clip_ratio_c=cap,
        )
        assert _close(lo, lv, aggregation) and _close(go, gv, aggregation), seed
        masked += metrics["actor/pg_clipfrac"] > 0
        truncated += metrics["actor/pg_clipfrac_lower"] > 0
    assert masked > 0 and (truncated > 0 or cap == 20.0)


@pytest.mark.parametrize("aggregation", list(AGGREGATIONS))
def test_dro_equals_verls_dro(aggregation):
    for seed in SEEDS:
        batch = _batch(seed, per_token=seed % 2 == 1, scale=1.0)
        lo, go = _ours(*batch, "dro", aggregation, dro_beta=0.3)
        lv, gv, _ = _verl(*batch, "dro", AGGREGATIONS[aggregation], dro_beta=0.3)
        assert _close(lo, lv, aggregation) and _close(go, gv, aggregation), seed


@pytest.mark.parametrize("aggregation", list(AGGREGATIONS))
@pytest.mark.parametrize("name", ["reinforce", "gpg"])
def test_reinforce_equals_verls_gpg(name, aggregation):
    for seed in SEEDS:
        batch = _batch(seed, per_token=True, scale=1.0)
        lo, go = _ours(*batch, name, aggregation)
        lv, gv, _ = _verl(*batch, "gpg", AGGREGATIONS[aggregation])
        assert _close(lo, lv, aggregation) and _close(go, gv, aggregation), seed


@pytest.mark.parametrize("aggregation", list(AGGREGATIONS))
def test_clip_cov_drops_the_same_tokens_as_verl(aggregation):
    """Same candidates, same random draw (verl uses torch's global generator, ours a generator seeded alike):
    the same gradients. Loss values differ by design (verl zeroes the dropped tokens' value)."""
    dropped = 0
    for seed in SEEDS:
        batch = _batch(seed, per_token=True, B=8, T=12, scale=0.4)
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
        lv, gv, metrics = _verl(
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
        assert _close(go, gv, aggregation), seed
        dropped += metrics["actor/pg_clipfrac"] > 0
    assert dropped > 0


@pytest.mark.parametrize("aggregation", list(AGGREGATIONS))
def test_kl_cov_equals_verls_kl_cov(aggregation):
    for seed in SEEDS:
        batch = _batch(seed, per_token=True, B=8, T=12, scale=0.4)  # continuous advantages: no covariance ties
        lo, go = _ours(*batch, "kl_cov", aggregation, cov_ratio=0.05, kl_coef=2.0)
        lv, gv, _ = _verl(*batch, "kl_cov", AGGREGATIONS[aggregation], kl_cov_ratio=0.05, ppo_kl_coef=2.0)
        assert _close(lo, lv, aggregation) and _close(go, gv, aggregation), seed


def test_a_wrong_formula_fails_the_oracle():
    """The oracle has teeth: clip_higher with its two epsilons swapped disagrees with verl."""
    batch = _batch(1, per_token=False, scale=1.0)
    lo, go = _ours(*batch, "clip_higher", "token_mean", epsilon_low=0.28, epsilon_high=0.2)
    lv, gv, _ = _verl(*batch, "vanilla", "token-mean", clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=1e12)
    assert not (_close(lo, lv) and _close(go, gv))


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
    loss, metrics = fn(old, lp, adv, mask.to(torch.float64), agg_mode, _config("vanilla", **cfg), weights)
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
        logp, old, adv, mask = _batch(seed, per_token=seed % 2 == 1)
        if method in ("gspo", "atr_seq"):  # sequence-level rules: per-sequence advantages, as GRPO's
            adv = adv[:, :1].expand_as(adv).contiguous()
        choice = verl_plugin.method_params(method, _config("vanilla", **cfg), extra={})
        torch.manual_seed(seed)  # clip_cov draws from torch's global generator on both sides
        lv, gv, metrics = _plugin(logp, old, adv, mask, method, AGGREGATIONS[aggregation], **cfg)
        torch.manual_seed(seed)
        lo, go = _ours(logp, old, adv, mask, method, aggregation, form=choice.form, **choice.params)
        assert _close(lo, lv, aggregation) and _close(go, gv, aggregation), (seed, float(lo), float(lv))
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
        batch = _batch(seed, per_token=True)
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
            _config("vanilla", **cfg),
            weights,
        )
        (gv,) = torch.autograd.grad(lv, lp)
        assert _close(lp_, lv.detach(), aggregation) and _close(gp, gv, aggregation), seed
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
            batch = _probability_batch(seed, per_token=seed % 2 == 1 and method != "gspo")
            kw = {"generator": torch.Generator().manual_seed(seed)} if method == "clip_cov" else {}
            lo, go = _ours(*batch, method, "seq_mean_token_mean", **kw, **params)
            torch.manual_seed(seed)  # clip_cov draws from torch's global generator in verl and in the plugin
            lv, gv, _ = _verl(*batch, spec.verl_loss_mode, agg, **cfg)
            torch.manual_seed(seed)
            lp_, gp, _ = _plugin(*batch, method, agg, **cfg)
            assert _close(go, gv, "seq_mean_token_mean") and _close(gp, gv, "seq_mean_token_mean"), (scale, seed)
            if method != "clip_cov":
                assert _close(lo, lv, "seq_mean_token_mean") and _close(lp_, lv, "seq_mean_token_mean"), (scale, seed)


def test_verls_global_batch_info_sets_the_normalisation():
    """Data-parallel normalisation is verl's: with dp_size and a global token count, the plugin's loss is verl's."""
    logp, old, adv, mask = _batch(0, per_token=False)
    cfg = _config("vanilla", clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=1e12)
    cfg.global_batch_info.update(dp_size=2, batch_num_tokens=100, global_batch_size=12)
    for agg in ("token-mean", "seq-mean-token-sum"):
        ours, _ = core_algos.get_policy_loss_fn("atr_grpo_clip")(old, logp, adv, mask.double(), agg, cfg)
        theirs, _ = core_algos.get_policy_loss_fn("vanilla")(old, logp, adv, mask.double(), agg, cfg)
        assert torch.allclose(ours, theirs, rtol=1e-12, atol=1e-14), agg


def test_params_from_the_environment_are_honoured_and_checked(monkeypatch):
    from atr_llm.verl import plugin as verl_plugin

    logp, old, adv, mask = _batch(1, per_token=False)
    monkeypatch.setenv(verl_plugin.PARAMS_ENV, '{"delta": 0.02}')
    lv, _, _ = _plugin(logp, old, adv, mask, "atr", "token-mean")
    lo, _ = _ours(logp, old, adv, mask, "atr", "token_mean", delta=0.02)
    ld, _ = _ours(logp, old, adv, mask, "atr", "token_mean")
    assert _close(lo, lv) and not _close(ld, lv)
    for raw, match in (('{"tau_pos": 2}', "does not take"), ("delta=0.1", "JSON object"), ('{"delta": -1}', "delta")):
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
        batch = _batch(seed, per_token, scale=1.0)
        L = batch[0].shape[1] + extra
        lo, go = _ours(*batch, "clip", "dr_grpo", epsilon=0.2, max_length=L)
        lv, gv, _ = _verl(*batch, "vanilla", "seq-mean-token-sum-norm", batch_info=dict(loss_scale_factor=L), **cfg)
        assert _close(lo, lv) and _close(go, gv), (seed, L)


def test_an_all_padding_row_counts_in_our_batch_size_but_not_in_verls():
    """A documented difference: verl's seq-mean-token-sum(-norm) divides by the number of sequences with at least
    one valid token, ours (Dr. GRPO's B * max_length, the paper's Eq. 2) by B; with one of B = 6 rows all padding
    the two differ by exactly the factor 6 / 5 and agree otherwise."""
    logp, old, adv, mask = _batch(0, per_token=False, scale=1.0)
    mask[2] = False
    for ours_agg, verl_agg in [("dr_grpo", "seq-mean-token-sum-norm"), ("seq_mean_token_sum", "seq-mean-token-sum")]:
        lo, _ = _ours(logp, old, adv, mask, "clip", ours_agg, epsilon=0.2)
        lv, _, _ = _verl(
            logp, old, adv, mask, "vanilla", verl_agg, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=1e12
        )
        assert not _close(lo, lv)
        assert _close(lo * 6 / 5, lv), ours_agg


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
        logp, old, adv, mask = _batch(seed, per_token=False, scale=0.4)
        lv, gv, _ = _verl_bypass(logp, old, adv, mask, AGGREGATIONS[aggregation], option, delta)
        lo, go = _ours(
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
        assert _close(lo, lv, aggregation) == (scale is None) and _close(
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
        logp, old, adv, mask = _batch(seed, per_token=True, scale=0.4)
        _, gv, _ = _verl_bypass(logp, old, adv, mask, AGGREGATIONS[aggregation], option, delta, 1e6)
        _, go = _ours(logp, old, adv, mask, rule, aggregation, form="mask", delta=delta)
        scale = _kept_token_rescaling(logp, old, mask, option, delta, aggregation)
        assert _close(go * (1.0 if scale is None else scale), gv, aggregation), seed


def test_decoupled_mode_weights_multiply_the_rule():
    """verl's decoupled mode: a rule's loss times the IS weights of ``pi_old / pi_rollout`` (computed by verl's
    helper) equals ours with ``behaviour_logp`` and ``RolloutCorrection``, sequence level, IcePop."""
    for seed in SEEDS:
        logp, old, adv, mask = _batch(seed, per_token=False, scale=0.4)
        rollout = old + 0.05 * torch.randn(old.shape, generator=torch.Generator().manual_seed(seed), dtype=old.dtype)
        weights, _ = rollout_corr_helper.compute_rollout_correction_weights(
            old - rollout, mask.to(torch.float64), "sequence", "0.5_2.0"
        )
        lp = logp.clone().requires_grad_(True)
        config = _config("vanilla", clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=1e12)
        loss, _ = core_algos.get_policy_loss_fn("vanilla")(
            old, lp, adv, mask.to(torch.float64), "token-mean", config, weights
        )
        (gv,) = torch.autograd.grad(loss, lp)
        lo, go = _ours(
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
        assert _close(lo, loss.detach()) and _close(go, gv), seed


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
        logp, old, adv, mask = _batch(seed, per_token=False, scale=0.4)
        lv, gv, _ = _verl_bypass(logp, old, adv, mask, "token-mean", "token_k3", 0.07)
        lp_, gp, _ = _plugin(logp, old, adv, mask, "reinforce", "token-mean")
        assert _close(lp_, lv) and _close(gp, gv), seed
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
import importlib.util
import torch
import atr_theory as at
spec = importlib.util.spec_from_file_location("verl_oracle", "tests/test_verl_oracle.py")  # imports verl, ray stubbed
oracle = importlib.util.module_from_spec(spec)
spec.loader.exec_module(oracle)
_batch, _config, core_algos = oracle._batch, oracle._config, oracle.core_algos
assert "atr_grpo_zz_written_rule" in core_algos.POLICY_LOSS_REGISTRY
logp, old, adv, mask = _batch(0, per_token=True)
lp = logp.clone().requires_grad_(True)
config = _config("vanilla", clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0)
loss, _ = core_algos.get_policy_loss_fn("atr_grpo_zz_written_rule")(
    old, lp, adv, mask.to(torch.float64), "token-mean", config, None
)
want = at.policy_loss(logp, old, adv, mask, method="zz_written_rule", zz_sharpness=4.0, aggregation="token_mean")
assert torch.allclose(loss, want.loss, rtol=1e-12, atol=0), (float(loss), float(want.loss))
print("OK")
"""
    env = {**os.environ, "ATR_GRPO_PARAMS": '{"zz_sharpness": 4.0}'}
    root = Path(__file__).resolve().parents[1]
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=root, env=env, timeout=300)
    assert res.returncode == 0 and "OK" in res.stdout, res.stderr[-3000:]


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
