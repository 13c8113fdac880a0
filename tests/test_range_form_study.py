"""The range x form study's analysis (experiments.range_form_analysis) against oracles we did not write: scipy's
paired and one-sample t tests and statsmodels' Holm, on a synthetic table of the study's shape and on the committed
one."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from experiments import range_form_analysis as rfa
from experiments.trust_region_analysis import read_table

ROOT = Path(__file__).resolve().parents[1]


def synthetic_rows(seed: int = 0) -> list[dict]:
    """Ten seeds x four cells x two temperatures, with a range effect in the mask form only (an interaction)."""
    rng = np.random.default_rng(seed)
    effect = {"clip": 0.0, "atr-min": -1.0, "clip-mask": 2.0, "atr": -20.0}
    rows = []
    for s in rfa.SEEDS:
        start = rng.normal(50, 5)
        for run, shift in effect.items():
            kl = {"clip": 0.006, "atr-min": 0.012, "clip-mask": 0.007, "atr": 0.03}[run] * (1 + 0.1 * rng.normal())
            for benchmark in rfa.TEMPERATURES.values():
                rows.append(
                    {
                        "method": run,
                        "seed": s,
                        "benchmark": benchmark,
                        "sft_model": f"m{s}",
                        "mean_at_8": start + shift + rng.normal(0, 2),
                        "acted_true_kl_p95": kl * 4,
                        "acted_true_kl_frac_rows_above_delta": kl,
                        "acted_frac_masked": 0.02,
                    }
                )
    return rows


def test_the_family_is_scipys_t_tests_and_statsmodels_holm_over_ten():
    from scipy import stats
    from statsmodels.stats.multitest import multipletests

    rows = synthetic_rows()
    result = rfa.analyse(rows)["family"]
    assert result["complete"] and result["family_size"] == 10
    p_raw, ours = [], []
    for name, weights in rfa.FAMILY.items():
        for t, benchmark in rfa.TEMPERATURES.items():
            value = {(r["method"], r["seed"]): r["mean_at_8"] for r in rows if r["benchmark"] == benchmark}
            contrast = [sum(w * value[(run, s)] for run, w in weights.items()) for s in rfa.SEEDS]
            test = stats.ttest_1samp(contrast, 0.0)
            got = result["tests"][name][t]
            assert got["mean"] == pytest.approx(np.mean(contrast), rel=1e-12)
            assert got["p"] == pytest.approx(test.pvalue, rel=1e-9)
            p_raw.append(test.pvalue)
            ours.append(got["p_holm"])
    assert ours == pytest.approx(list(multipletests(p_raw, method="holm")[1]), rel=1e-9)
    # the planted interaction and mask-form range effect are found; the min-form range effect (1 point) is not
    assert result["tests"]["range within mask (atr - clip-mask)"]["T1"]["answer"] == "negative"
    assert result["tests"]["interaction ((atr - clip-mask) - (atr-min - clip))"]["T1"]["answer"] == "negative"
    assert result["tests"]["range within min (atr-min - clip)"]["T1"]["answer"] != "negative"


def test_the_trust_region_tests_are_paired_t_with_holm_over_four_and_no_points_margin():
    from scipy import stats
    from statsmodels.stats.multitest import multipletests

    rows = synthetic_rows(1)
    result = rfa.analyse(rows)["trust_region"]
    assert result["family_size"] == 4
    p_raw, ours = [], []
    t1 = [r for r in rows if r["benchmark"] == rfa.TEMPERATURES["T1"]]
    for outcome, column in rfa.TRUST_REGION.items():
        for form, weights in rfa.TRUST_CONTRASTS.items():
            (atr, _), (clip, _) = sorted(weights.items(), key=lambda kv: -kv[1])
            a = [next(r[column] for r in t1 if r["method"] == atr and r["seed"] == s) for s in rfa.SEEDS]
            c = [next(r[column] for r in t1 if r["method"] == clip and r["seed"] == s) for s in rfa.SEEDS]
            p_raw.append(stats.ttest_rel(a, c).pvalue)
            ours.append(result["tests"][outcome][form]["p_holm"])
            assert result["tests"][outcome][form]["answer"] in ("positive", "no significant difference at this n")
    assert ours == pytest.approx(list(multipletests(p_raw, method="holm")[1]), rel=1e-9)


def test_an_incomplete_study_is_pending_and_unadjusted():
    rows = [r for r in synthetic_rows() if not (r["method"] == "atr" and r["seed"] >= 205)]
    result = rfa.analyse(rows)["family"]
    assert not result["complete"]
    assert result["tests"]["range within mask (atr - clip-mask)"]["T1"]["answer"] == "pending: 5 of 10 paired seeds"
    assert all(d["p_holm"] is None for by in result["tests"].values() for d in by.values())


def test_the_committed_table_has_the_true_kl_columns_and_its_analysis_runs(tmp_path):
    table = ROOT / "figures" / "experiments" / "range_form" / "table" / "cpu_llm_table.csv"
    with table.open() as f:
        header = next(csv.reader(f))
    assert {c for c in header if "true_kl" in c} >= set(rfa.TRUST_REGION.values())
    result = rfa.analyse(read_table(table))
    assert result["regime"]["passes"]
    rfa.main(["--table", str(table), "--out", str(tmp_path)])
    assert (tmp_path / "analysis.json").is_file() and (tmp_path / "analysis.md").read_text().startswith(
        "# Range x form"
    )
