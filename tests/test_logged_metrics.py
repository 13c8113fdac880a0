"""The trainer page's metrics table (``atr_llm.logged_metrics.LOGGED_METRICS``) against the code that logs: every
key a tiny run logs, and every key the logging functions return for every rule, form, layer and TRL loss type, has
exactly one entry; every entry is logged by one of them, or says why no CPU test can log it."""

from __future__ import annotations

import types
import warnings

import pytest
import torch
from grpo_helpers import grpo_config_kwargs, tiny_moe, tiny_trainer

import atr_theory as at
from atr_llm import tiny
from atr_llm.logged_metrics import LOGGED_METRICS, metric_for_key
from atr_llm.rewards import STATUSES, CorrectnessReward
from atr_llm.rollout_mismatch import MISMATCH_PREFIX, rollout_mismatch_metrics
from atr_llm.trl_options import trl_metrics
from atr_llm.true_kl import true_kl_summary
from tests.rule_inputs import rule_inputs

NOT_A_METRIC = {"step"}  # transformers' step counter in every log entry


def _batch(B: int = 4, T: int = 6):
    g = torch.Generator().manual_seed(0)
    old = torch.log_softmax(torch.randn(B, T, 5, generator=g), -1)[..., 0]
    logp = (old + 0.6 * torch.randn(B, T, generator=g)).clamp(max=0.0)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])[:B]
    return logp, old, adv, torch.ones(B, T, dtype=torch.bool)


def _rule_keys() -> set[str]:
    """``clip/*`` of every rule in every form, and with each layer; TRL's loss metrics for every TRL loss type and
    for a registry rule; the true-KL summary (with the tokens against their advantage), the train-rollout mismatch
    and the reward's grading."""
    from atr_llm.trainer import ATRGRPOConfig

    logp, old, adv, mask = _batch()
    keys: set[str] = set()
    layers = [
        {},
        {"sequence_mask": at.SequenceMask("k1", "mean", 0.0, "negative")},
        {"entropies": torch.rand(logp.shape, dtype=logp.dtype), "top_entropy_quantile": 0.5},
        {"rollout_correction": at.RolloutCorrection(mode="mask", upper=1.05), "behaviour_logp": old - 0.3},
    ]
    for name in at.method_names(aliases=False):
        extra = rule_inputs(name, *logp.shape, logp.dtype)
        for form in at.get_method(name).forms:
            for layer in layers:
                out = at.policy_loss(logp, old, adv, mask, method=name, form=form, **extra, **layer)
                keys |= {f"clip/{k}" for k in out.metrics if k != "n_tokens"}
    for loss_type in ("grpo", "dapo", "cispo", "sapo", "vespo"):
        for method in ("trl", "atr"):
            if method == "atr" and loss_type != "grpo":
                continue
            config = ATRGRPOConfig(output_dir="unused", loss_type=loss_type, method=method, use_cpu=True)
            out = at.policy_loss(logp, old, adv, mask, method=config.resolved_method)
            keys |= set(trl_metrics(out, adv, logp - old, config))
    out = at.policy_loss(logp, old, adv, mask, method="atr")
    kl = torch.rand(logp.shape, dtype=logp.dtype)
    keys |= set(true_kl_summary(kl, kl, out.log_ratio, out.result.kept, mask, 0.01, against=out.outside[0]))
    keys |= {MISMATCH_PREFIX + k for k in rollout_mismatch_metrics(old, logp, mask)}  # an engine's log-probs
    reward = CorrectnessReward(truncated_reward=0.0, eos_token_ids=[1])
    reward.stats.update(STATUSES)
    keys |= set(reward.pop_stats())
    return keys


def _run_keys(tmp_path) -> set[str]:
    """The keys of two tiny runs' log histories: ATR with the true KL, a reference KL (the reference loaded from the
    saved policy, as TRL does) and an entropy bonus; TRL's
    CISPO loss type on a Mixture-of-Experts model (its router's auxiliary loss)."""
    from atr_llm.trainer import ATRGRPOConfig

    torch.set_default_dtype(torch.float32)
    tok = tiny.build_tiny_tokenizer()
    base = tmp_path / "base"  # a saved model: TRL loads the reference model (beta > 0) from the policy's path
    tiny.build_tiny_model(tok).save_pretrained(base)
    runs = [
        (dict(method="atr", measure_true_kl=True, beta=0.04, entropy_coef=0.01), lambda tok: str(base)),
        (dict(loss_type="cispo", method="trl"), tiny_moe),
    ]
    keys: set[str] = set()
    try:
        for i, (options, model) in enumerate(runs):
            config = ATRGRPOConfig(**grpo_config_kwargs(tmp_path / str(i), **options))
            trainer = tiny_trainer(tok, config, model=model(tok))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                trainer.train()
            for row in trainer.state.log_history:
                keys |= set(row)
    finally:
        torch.set_default_dtype(torch.float64)
    return keys - NOT_A_METRIC


@pytest.fixture(scope="module")
def logged(tmp_path_factory) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        rules=_rule_keys(), runs=_run_keys(tmp_path_factory.mktemp("logged_metrics"))
    )


def test_every_logged_key_has_exactly_one_entry(logged):
    for key in sorted(logged.rules | logged.runs):
        matching = [m.key for m in LOGGED_METRICS if m.pattern.match(key)]
        assert len(matching) == 1, f"{key!r} is matched by {matching} (expected exactly one entry)"


def test_every_entry_is_logged_or_says_why_not(logged):
    seen = logged.rules | logged.runs
    for metric in LOGGED_METRICS:
        found = any(metric.pattern.match(key) for key in seen)
        if metric.cpu_absent:
            assert not found, f"{metric.key} was logged on the CPU: drop its cpu_absent ({metric.cpu_absent!r})"
        else:
            assert found, f"{metric.key} is in the table and no tiny run or logging function logs it"


def test_a_run_logs_the_library_keys_the_table_says_every_step_holds(logged):
    """The keys of TRL and transformers that every step logs are in the runs (not only in the functions)."""
    every_step = [m for m in LOGGED_METRICS if m.when == "every logging step" and "{" not in m.key]
    assert {m.key for m in every_step} <= logged.runs, sorted({m.key for m in every_step} - logged.runs)


def test_a_key_matches_its_pattern_and_nothing_wider():
    assert metric_for_key("clip/frac_dropped_sequence_mask").key == "clip/frac_dropped_{layer}"
    assert metric_for_key("rewards/correctness/mean").key == "rewards/{reward}/mean"
    assert metric_for_key("rewards/a/b/mean") is None  # a placeholder is one path segment
    assert metric_for_key("clip/frac_kept_extra") is None
    assert metric_for_key("bogus") is None
