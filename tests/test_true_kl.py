"""The true KL of an update (``ATRGRPOConfig.measure_true_kl``, ``atr_llm.true_kl``): the full-vocabulary divergences
against torch.distributions' own KL, the per-step summary against numpy / scipy on a tiny batch, and training that is
the same bit for bit with the measurement on and off."""

import warnings

import numpy as np
import pytest
import torch
from scipy import stats

import atr_theory as at

torch.set_default_dtype(torch.float64)


def _heads(seed=0, B=3, T=5, H=7, V=11):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=g)
    old_hidden = hidden + 0.4 * torch.randn(B, T, H, generator=g)
    weight = torch.randn(V, H, generator=g)
    old_weight = weight + 0.2 * torch.randn(V, H, generator=g)
    bias = torch.randn(V, generator=g)
    return hidden, old_hidden, weight, old_weight, bias


@pytest.mark.parametrize("chunk_size", [1, 4, 64])
def test_both_directions_equal_torch_distributions_kl_over_the_whole_vocabulary(chunk_size):
    hidden, old_hidden, weight, old_weight, bias = _heads()
    kl, reverse = at.head_kl_both_ways(
        hidden, old_hidden, weight, bias=bias, old_weight=old_weight, temperature=0.7, chunk_size=chunk_size
    )
    new = torch.distributions.Categorical(logits=(hidden @ weight.T + bias) / 0.7)
    old = torch.distributions.Categorical(logits=(old_hidden @ old_weight.T + bias) / 0.7)
    torch.testing.assert_close(kl, torch.distributions.kl_divergence(old, new), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(reverse, torch.distributions.kl_divergence(new, old), rtol=1e-12, atol=1e-14)
    assert float(kl.min()) > 0 and not torch.allclose(kl, reverse)  # the two directions differ


def test_the_summary_equals_numpy_and_scipy_on_a_tiny_batch():
    from atr_llm.true_kl import true_kl_summary

    g = torch.Generator().manual_seed(3)
    kl = torch.rand(4, 6, generator=g) * 0.15
    reverse = torch.rand(4, 6, generator=g) * 0.15
    log_ratio = 0.4 * torch.randn(4, 6, generator=g)
    kept = torch.rand(4, 6, generator=g) > 0.3
    mask = torch.rand(4, 6, generator=g) > 0.2
    got = true_kl_summary(kl, reverse, log_ratio, kept, mask, 0.07)
    m = mask.numpy()
    f, r, y, k = kl.numpy()[m], reverse.numpy()[m], log_ratio.numpy()[m], kept.numpy()[m]
    k3 = np.expm1(y) - y
    assert got["true_kl/mean"] == pytest.approx(f.mean(), rel=1e-12)
    assert got["true_kl/p95"] == pytest.approx(np.quantile(f, 0.95), rel=1e-12)
    assert got["true_kl/reverse_p95"] == pytest.approx(np.quantile(r, 0.95), rel=1e-12)
    assert got["true_kl/frac_above_delta"] == pytest.approx((f > 0.07).mean())
    assert got["true_kl/frac_above_delta_kept"] == pytest.approx((f[k] > 0.07).mean())
    assert got["true_kl/frac_above_delta_dropped"] == pytest.approx((f[~k] > 0.07).mean())
    assert got["true_kl/k3_rank_corr"] == pytest.approx(stats.spearmanr(k3, f).statistic, rel=1e-12)
    assert got["true_kl/k1_mean"] == pytest.approx((-y).mean(), rel=1e-12)
    assert got["true_kl/k3_mean"] == pytest.approx(k3.mean(), rel=1e-12)
    assert "true_kl/mean_against_advantage" not in got
    against = torch.rand(4, 6, generator=g) > 0.6
    with_against = true_kl_summary(kl, reverse, log_ratio, kept, mask, 0.07, against=against)
    assert with_against["true_kl/mean_against_advantage"] == pytest.approx(f[against.numpy()[m]].mean(), rel=1e-12)
    none = true_kl_summary(kl, reverse, log_ratio, kept, mask, 0.07, against=torch.zeros(4, 6, dtype=torch.bool))
    assert np.isnan(none["true_kl/mean_against_advantage"])


def test_training_is_the_same_bit_for_bit_with_the_measurement_on_and_off(tmp_path):
    pytest.importorskip("trl")
    from grpo_helpers import grpo_config_kwargs, tiny_trainer

    from atr_llm import tiny
    from atr_llm.trainer import ATRGRPOConfig

    torch.set_default_dtype(torch.float32)
    tok = tiny.build_tiny_tokenizer()
    weights, logs = {}, {}
    for measure in (False, True):
        cfg = ATRGRPOConfig(
            method="atr",
            measure_true_kl=measure,
            seed=5,
            **grpo_config_kwargs(tmp_path / str(measure), max_steps=3, learning_rate=3e-3),
        )
        torch.manual_seed(0)
        trainer = tiny_trainer(tok, cfg)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.train()
        weights[measure] = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        logs[measure] = trainer.state.log_history
    torch.set_default_dtype(torch.float64)
    start = tiny.build_tiny_model(tok).state_dict()
    assert any(not torch.equal(weights[False][k], start[k]) for k in start)  # it trained
    assert all(torch.equal(weights[True][k], weights[False][k]) for k in start)
    measured = [row for row in logs[True] if "true_kl/mean" in row]
    assert measured and not any("true_kl/mean" in row for row in logs[False])
    assert all(row["true_kl/mean"] >= 0 and row["true_kl/reverse_mean"] >= 0 for row in measured)
    assert max(row["true_kl/mean"] for row in measured) > 0  # the second pass over a batch sees a moved policy
    for a, b in zip(logs[True], logs[False]):  # every other number the run logged is the same
        for key in b:
            if key not in ("train_runtime", "train_samples_per_second", "train_steps_per_second", "step_time"):
                assert a[key] == b[key] or (a[key] != a[key] and b[key] != b[key]), key


def test_a_bad_threshold_is_refused_by_name(tmp_path):
    pytest.importorskip("trl")
    from atr_llm.trainer import ATRGRPOConfig

    with pytest.raises(ValueError, match="true_kl_delta=0: expected a finite number > 0"):
        ATRGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", true_kl_delta=0)


def test_a_measured_runs_summary_has_true_kl_columns_and_an_unmeasured_one_none():
    from experiments.cpu_table.protocol import acted_summary, train_argv
    from experiments.cpu_table.statistics import acted_columns

    base = {"step": 1, "clip/frac_masked": 0.01}
    history = [{**base, "true_kl/mean": m, "true_kl/p95": 2 * m} for m in (0.01, 0.05, 0.09, 0.2)]
    acted = acted_summary(history, true_kl_delta=0.07)
    assert acted["true_kl/mean"] == pytest.approx(0.0875)
    assert acted["true_kl/frac_rows_above_delta"] == 0.5
    columns = acted_columns(acted)
    assert columns["acted_true_kl_mean"] == pytest.approx(0.0875) and "acted_true_kl_p95" in columns
    assert "true_kl/mean" not in acted_summary([base])
    job = {"run": "atr", "seed": 0, "sft_dir": "x"}
    assert "--measure_true_kl" in train_argv({**job, "measure_true_kl": True}, "out", 4, 2)
    assert "--measure_true_kl" not in train_argv(job, "out", 4, 2)
