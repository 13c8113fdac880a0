"""experiments.evaluation_noise: the pre-registered split of a paired difference's variance into evaluation noise."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("trl")

from experiments import evaluation_noise as en  # noqa: E402


def _rows(values: dict[tuple[str, int], list[float]], benchmark: str, n: int = 8) -> list[dict]:
    return [
        {"run": run, "seed": seed, "benchmark": benchmark, "sampling_seed": s, "n": n, "mean_at_n": v, "pass_at_n": 0.0}
        for (run, seed), vs in values.items()
        for s, v in zip(en.SAMPLING_SEEDS, vs)
    ]


def test_the_evaluation_share_is_twice_the_mean_sampling_variance_over_the_paired_variance():
    rng = np.random.default_rng(0)
    values = {(run, seed): list(rng.normal(40, 3, size=4)) for run in ("clip", "atr-min") for seed in (210, 211)}
    rows = _rows(values, "steps-test-T0.3") + _rows({("clip", 210): [1.0, 2.0, 3.0, 4.0]}, "steps-test-T1")
    rows += _rows({("clip", 210): [50.0]}, "steps-test-T0.3", n=32)  # Mean@32 rows are not part of s_e^2
    got = en.noise(rows, {"T0.3": 8.0, "T1": 1.0})
    s_e2 = np.mean([np.var(v, ddof=1) for v in values.values()])
    assert got["T0.3"]["models"] == 4 and got["T0.3"]["s_e2"] == pytest.approx(s_e2)
    assert got["T0.3"]["share"] == pytest.approx(2 * s_e2 / 64)
    assert got["T1"]["s_e2"] == pytest.approx(np.var([1, 2, 3, 4], ddof=1))  # 5/3: 2 s_e^2 / 1 >= 1/4
    assert got["T1"]["outcome"] == "Mean@32"
    assert (
        en.noise(_rows({("clip", 1): [1.0, 1.0, 1.0, 1.0]}, "steps-test-T1"), {"T0.3": 1, "T1": 1})["T1"]["outcome"]
        == "Mean@8"
    )


def test_a_model_that_was_not_trained_is_refused_before_any_evaluation(tmp_path):
    with pytest.raises(ValueError, match=r"^--seeds 210: .*clip-s210 holds no trained model of clip"):
        en.main(["--runs-dir", str(tmp_path), "--seeds", "210", "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
