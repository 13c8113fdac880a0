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

ROOT = Path(__file__).resolve().parents[2]


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


def _with_more_seeds(rows: list[dict], seeds, shift: float, sd: float, seed: int = 1) -> list[dict]:
    """``rows`` plus ``clip`` and ``atr-min`` rows on ``seeds`` whose paired difference is ``shift`` +- ``sd``."""
    rng = np.random.default_rng(seed)
    more = []
    for s in seeds:
        start = rng.normal(50, 5)
        for benchmark in rfa.TEMPERATURES.values():
            d = rng.normal(shift, sd)
            for run, value in (("clip", start), ("atr-min", start + d)):
                more.append(
                    {"method": run, "seed": s, "benchmark": benchmark, "sft_model": f"n{s}", "mean_at_8": value}
                )
    return rows + more


def test_the_range_at_n40_is_scipys_t_statsmodels_holm_over_ten_and_statsmodels_tost():
    from scipy import stats
    from statsmodels.stats.multitest import multipletests
    from statsmodels.stats.weightstats import ttost_paired

    rows = _with_more_seeds(synthetic_rows(), range(210, 240), shift=0.0, sd=1.0)
    result = rfa.analyse(rows)
    fam, n40 = result["family"], result["range_within_min_equivalence_n40"]
    assert fam["tests"][rfa.RANGE_CONTRAST]["T0.3"]["n"] == 10  # the family itself stays at n = 10
    p_raw = []
    for t, benchmark in rfa.TEMPERATURES.items():
        value = {(r["method"], r["seed"]): r["mean_at_8"] for r in rows if r["benchmark"] == benchmark}
        atr, clip = (np.array([value[run, s] for s in rfa.RANGE_SEEDS]) for run in ("atr-min", "clip"))
        got = n40["tests"][t]
        assert got["n"] == 40 and got["p"] == pytest.approx(stats.ttest_rel(atr, clip).pvalue, rel=1e-9)
        p_tost = ttost_paired(atr, clip, -rfa.MARGIN, rfa.MARGIN)[0]
        assert got["equivalence"]["p"] == pytest.approx(p_tost, rel=1e-9)
        p_raw.append(got["p"])
    p_raw += [d["p"] for name, by in fam["tests"].items() if name != rfa.RANGE_CONTRAST for d in by.values()]
    holm = multipletests(p_raw, method="holm")[1]
    assert [n40["tests"][t]["p_holm"] for t in rfa.TEMPERATURES] == pytest.approx(list(holm[:2]), rel=1e-9)
    assert n40["family_size"] == 10
    # the planted seeds 210-239 have a difference of 0 +- 1 (seeds 200-209: -1 +- ~3): equivalent within 3 points
    assert all(n40["tests"][t]["answer"] == "within +-3 points" for t in rfa.TEMPERATURES)
    far = rfa.analyse(_with_more_seeds(synthetic_rows(), range(210, 240), shift=-6.0, sd=1.0))
    assert far["range_within_min_equivalence_n40"]["tests"]["T1"]["answer"] == "negative"
    wide = rfa.analyse(_with_more_seeds(synthetic_rows(), range(210, 240), shift=0.0, sd=20.0))
    assert wide["range_within_min_equivalence_n40"]["tests"]["T1"]["answer"] == "inconclusive at n = 40"
    short = rfa.analyse(_with_more_seeds(synthetic_rows(), range(210, 215), shift=0.0, sd=1.0))
    got = short["range_within_min_equivalence_n40"]["tests"]["T0.3"]
    assert got["answer"] == "pending: 15 of 40 paired seeds" and got["p_holm"] is None


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


def test_the_comparison_with_the_trust_region_study_counts_equal_starts_and_is_scipys_t_interval():
    from scipy import stats

    rows = synthetic_rows(1)
    earlier = [dict(r) for r in rows if r["method"] in ("clip", "atr") and r["seed"] < 205]
    for r in earlier:  # atr moved by a per-seed amount on other SFT models; clip identical, same starts
        if r["method"] == "atr":
            r["mean_at_8"] -= 3.0 + 0.5 * (r["seed"] - 200)
            r["sft_model"] = "other"
    again = rfa.against_earlier(rows, earlier)
    assert set(again) == {"clip", "atr"}
    clip = again["clip"]["T1"]
    assert (clip["n"], clip["same_sft_model"], clip["same_mean_at_8"], clip["mean"]) == (5, 5, 5, 0.0)
    atr = again["atr"]["T0.3"]
    diffs = np.array([3.0 + 0.5 * k for k in range(5)])
    low, high = stats.ttest_1samp(diffs, 0.0).confidence_interval(0.95)
    assert (atr["same_sft_model"], atr["same_mean_at_8"]) == (0, 0)
    assert atr["mean"] == pytest.approx(diffs.mean()) and (atr["low"], atr["high"]) == pytest.approx((low, high))
    assert rfa.against_earlier(rows, []) == {}


def test_by_step_averages_each_value_over_the_runs_that_logged_it(tmp_path):
    import json

    logs = {
        "clip-s200": [
            {"step": 10, "reward": 0.2, "true_kl/mean": 0.01},
            {"step": 20, "true_kl/mean": 0.03},
            {"loss": 1},
        ],
        "clip-s201": [{"step": 10, "reward": 0.4, "true_kl/mean": 0.02}],
        "atr-s200": [{"step": 10, "true_kl/mean": 0.5}],
    }
    for name, history in logs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "log_history.json").write_text(json.dumps(history))
    rows = {(r["run"], r["step"]): r for r in rfa.by_step(tmp_path)}
    assert set(rows) == {("clip", 10), ("clip", 20), ("atr", 10)}
    assert rows["clip", 10]["reward"] == pytest.approx(0.3) and rows["clip", 10]["true_kl_mean"] == pytest.approx(0.015)
    assert rows["clip", 10]["runs"] == 2 and rows["clip", 20]["runs"] == 1 and rows["clip", 20]["reward"] is None
    assert rows["atr", 10] == {"run": "atr", "step": 10, "reward": None, "true_kl_mean": 0.5, "runs": 1}


PAGE = ROOT / "docs" / "experiments" / "range-form.md"
ANALYSIS = ROOT / "figures" / "experiments" / "range_form" / "analysis.json"
BY_STEP = ROOT / "figures" / "experiments" / "range_form" / "by_step.csv"


def page_numbers(a: dict, steps: list[dict]) -> dict[str, str]:
    """What the page's first screen states, formatted from analysis.json and by_step.csv."""

    def ci(d, spec=".1f"):
        return f"{d['mean']:+{spec}} [{d['low']:+{spec}}, {d['high']:+{spec}}]"

    fam, tr, cells = a["family"]["tests"], a["trust_region"]["tests"], a["described"]
    short = {
        "RMIN": "range within min (atr-min - clip)",
        "RMASK": "range within mask (atr - clip-mask)",
        "FCLIP": "form at clip's range (clip-mask - clip)",
        "FATR": "form at ATR's range (atr - atr-min)",
        "INT": "interaction ((atr - clip-mask) - (atr-min - clip))",
    }
    out = {}
    for key, name in short.items():
        out[key + "03"] = f"{ci(fam[name]['T0.3'])} (Holm p {fam[name]['T0.3']['p_holm']:.2g})"
        out[key + "1"] = f"{ci(fam[name]['T1'])} (Holm p {fam[name]['T1']['p_holm']:.2g})"
        out["AN_" + key] = f"{fam[name]['T0.3']['answer']} / {fam[name]['T1']['answer']}"
    out["CELLS_LINE"] = ", ".join(
        f"{cells[run]['mean_at_8_T0.3']['mean']:.1f} / {cells[run]['mean_at_8_T1']['mean']:.1f} (`{run}`)"
        for run in ("clip", "atr-min", "clip-mask", "atr")
    )
    sft = a["against_trust_region_study"]["sft"]
    out["SFT_LINE"] = f"{sft['T0.3']['this_study']:.1f} / {sft['T1']['this_study']:.1f}"
    p95 = tr["p95 of the true KL"]
    rows_above = tr["fraction of rows above delta"]
    out["TR_P95_MIN"] = f"{ci(p95['min (atr-min - clip)'], '.3f')}"
    out["HOLM_P95_MIN"] = f"p {p95['min (atr-min - clip)']['p_holm']:.2g}"
    out["ATR_MIN_P95"] = f"{cells['atr-min']['acted_true_kl_p95']['mean']:.3f}"
    out["CLIP_P95"] = f"{cells['clip']['acted_true_kl_p95']['mean']:.3f}"
    out["TR_ROWS_MIN"] = ci(rows_above["min (atr-min - clip)"], ".3f")
    out["ATR_MASK_MEAN"] = f"{cells['atr']['acted_true_kl_mean']['mean']:.2f}"
    out["CLIP_MASK_MEAN"] = f"{cells['clip-mask']['acted_true_kl_mean']['mean']:.2f}"
    frac = [cells[r]["acted_true_kl_frac_rows_above_delta"]["mean"] for r in ("atr", "clip-mask")]
    out["ROWS_MASK"] = f"{100 * min(frac):.0f}-{100 * max(frac):.0f}%"
    out["TR_ROWS_MASK"] = ci(rows_above["mask (atr - clip-mask)"], ".3f")
    out["TR_P95_MASK"] = ci(p95["mask (atr - clip-mask)"], ".2f")
    out["HOLM_ROWS_MASK"] = f"Holm p {rows_above['mask (atr - clip-mask)']['p_holm']:.2g}"
    out["HOLM_P95_MASK"] = f"Holm p {p95['mask (atr - clip-mask)']['p_holm']:.2g}"
    corr = [cells[r]["acted_true_kl_k3_rank_corr"]["mean"] for r in rfa.CELLS]
    out["RANKCORR"] = f"{min(corr):.2f}-{max(corr):.2f}"
    out["DROPPED_CLIP"] = f"{100 * cells['clip']['acted_true_kl_frac_above_delta_dropped']['mean']:.0f}%"
    out["KEPT_CLIP"] = f"{100 * cells['clip']['acted_true_kl_frac_above_delta_kept']['mean']:.1f}%"
    again = a["against_trust_region_study"]
    out["DEVIATION"] = f"{max(abs(d['mean']) for by in again.values() for d in by.values()):.1f} points"
    out["SAME_SFT"] = f"{again['sft']['T0.3']['same_sft_model']} of {again['sft']['T0.3']['n']} seeds"
    out["REGIME"] = f"{100 * a['regime']['mean']:.2f}%"
    reward = {(r["run"], int(r["step"])): float(r["reward"]) for r in steps if r["reward"]}
    assert reward["clip-mask", 10] == reward["atr", 10]  # the first logged row is the SFT model's own batch
    out["R10"] = f"{reward['clip-mask', 10]:.3f} at step 10"
    out["R40"] = f"{reward['clip-mask', 40]:.3f} (`clip-mask`) and {reward['atr', 40]:.3f} (`atr`) at step 40"
    after = max(v for (run, step), v in reward.items() if run in ("clip-mask", "atr") and step >= 40)
    out["R_AFTER"] = f"at or below {after:.3f}"
    kl = [(r["run"], float(r["true_kl_mean"])) for r in steps if r["true_kl_mean"]]
    mask_steps = [v for run, v in kl if run in ("clip-mask", "atr")]
    assert all(v > rfa.DELTA for v in mask_steps) and all(v < rfa.DELTA for run, v in kl if run in ("clip", "atr-min"))
    out["KL_STEPS"] = f"every one of the {len(mask_steps) // 2} logged steps"
    reach = [max(-d["low"], d["high"]) for name in ("RMIN", "RMASK") for d in fam[short[name]].values()]
    form = [abs(d["mean"]) for name in ("FCLIP", "FATR") for d in fam[short[name]].values()]
    out["FORM_SPAN"] = f"the form moves Mean@8 by {min(form):.0f} to {max(form):.0f} points"
    out["REACH"] = f"{min(reach):.1f} to {max(reach):.1f} points"
    order = ("clip", "atr-min", "clip-mask", "atr")
    out["ENTROPY"] = ", ".join(
        f"{cells[r]['acted_entropy_first_fifth']['mean']:.3f} to {cells[r]['acted_entropy_last_fifth']['mean']:.3f} (`{r}`)"
        for r in order
    )
    out["STEP200"] = ", ".join(
        f"{cells[r]['runs_best_at_step_200_T0.3']} / {cells[r]['runs_best_at_step_200_T1']} (`{r}`)" for r in order
    )
    out["BEST"] = ", ".join(
        f"{cells[r]['best_mean_at_8_T0.3']['mean']:.1f} / {cells[r]['best_mean_at_8_T1']['mean']:.1f} (`{r}`)"
        for r in order
    )
    assert all(cells[r]["runs_best_at_step_200_T0.3"] > 5 for r in order)  # "most runs ... in every cell"
    falls = [
        cells[r]["acted_entropy_last_fifth"]["mean"] < cells[r]["acted_entropy_first_fifth"]["mean"] for r in order
    ]
    assert falls == [True, True, False, False]  # "falls in the min form and rises in the mask form"
    out["TR_HEAD"] = (
        f"its 95th percentile is {ci(p95['min (atr-min - clip)'], '.3f')} higher (Holm p {p95['min (atr-min - clip)']['p_holm']:.2g})"
    )
    times = sorted(cells[r]["acted_true_kl_mean"]["mean"] / rfa.DELTA for r in ("atr", "clip-mask"))
    out["TIMES"] = f"{times[0]:.1f} and {times[1]:.1f} times delta"
    return out


def test_the_page_states_the_analysis_numbers():
    import json

    a = json.loads(ANALYSIS.read_text())
    assert a["family"]["complete"] and a["trust_region"]["complete"], "the study has not all its seeds yet"
    with BY_STEP.open() as f:
        steps = list(csv.DictReader(f))
    flat = " ".join(PAGE.read_text().split())
    first_screen = flat[: flat.index("![Each cell")]  # the answer, before the figure
    before_tables = flat[: flat.index("--8<--")]
    for key, text in page_numbers(a, steps).items():
        assert text in (before_tables if key in ("R10", "R40", "R_AFTER", "KL_STEPS") else first_screen), (key, text)
    import re

    left = [key for key in page_numbers(a, steps) if re.search(rf"\b{key}\b", flat)]
    assert not left, f"placeholders left on the page: {left}"


def test_the_readme_quotes_the_form_and_range_effects():
    import json

    a = json.loads(ANALYSIS.read_text())
    fam, cells = a["family"]["tests"], a["described"]
    readme = " ".join((ROOT / "README.md").read_text().split())

    def ci(d):
        return f"{d['mean']:+.1f} [{d['low']:.1f}, {d['high']:+.1f}]"

    assert f"min form: {ci(fam['range within min (atr-min - clip)']['T0.3'])}" in readme
    assert f"mask form: {ci(fam['range within mask (atr - clip-mask)']['T0.3'])}" in readme
    form = fam["form at clip's range (clip-mask - clip)"]["T0.3"]
    assert f"form: {ci(form)} at T = 0.3" in readme
    p95 = cells["atr-min"]["acted_true_kl_p95"]["mean"], cells["clip"]["acted_true_kl_p95"]["mean"]
    assert f"is {p95[0]:.3f} against {p95[1]:.3f} (delta 0.07)" in readme


NOISE = ROOT / "figures" / "experiments" / "range_form" / "evaluation_noise.json"


def test_the_n40_section_states_the_analysis_and_the_noise_check():
    """The page's "range in the min form at n = 40" section against analysis.json and evaluation_noise.json."""
    import json

    a = json.loads(ANALYSIS.read_text())["range_within_min_equivalence_n40"]["tests"]
    noise = json.loads(NOISE.read_text())["noise"]
    page = " ".join(PAGE.read_text().split())
    section = page[page.index("## The range in the min form at n = 40") : page.index("## What the bandit says")]
    n = a["T0.3"]["n"]
    assert a["T1"]["n"] == n
    ci = {t: f"{d['mean']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}]" for t, d in a.items()}
    if n < len(rfa.RANGE_SEEDS):
        assert f"**Pending: {n} of {len(rfa.RANGE_SEEDS)} paired seeds.**" in section
        assert all(d["p_holm"] is None and d["answer"].startswith("pending") for d in a.values())
    else:
        assert "Pending" not in section
        answers = f"{a['T0.3']['answer']} at T = 0.3 and {a['T1']['answer']} at T = 1"
        assert f"**At n = {n}, the answer is: {answers}.**" in section
        holm = f"Holm p {a['T0.3']['p_holm']:.2g} and {a['T1']['p_holm']:.2g}"
        assert holm in section
        eq = {t: d["equivalence"] for t, d in a.items()}
        ninety = [f"[{e['low90']:+.1f}, {e['high90']:+.1f}]" for e in eq.values()]
        assert f"the two one-sided tests use are {ninety[0]} and {ninety[1]}." in section
        sd10 = json.loads(ANALYSIS.read_text())["family"]["tests"][rfa.RANGE_CONTRAST]
        spread = f"(SD of the paired difference {a['T0.3']['sd']:.1f} and {a['T1']['sd']:.1f} points)"
        assert spread in section and f"({sd10['T0.3']['sd']:.1f} and {sd10['T1']['sd']:.1f})" in section
        first_screen = page[: page.index("![Each cell")]
        assert f"is {ci['T0.3']} at T = 0.3 and {ci['T1']} at T = 1: within +-3 points at T = 1" in first_screen
        assert f"(equivalence p {eq['T1']['p']:.2g}), still inconclusive at T = 0.3" in first_screen
        assert [d["answer"] for d in a.values()] == ["inconclusive at n = 40", "within +-3 points"]
        readme = " ".join((ROOT / "README.md").read_text().split())
        assert f"within +-3 points of each other at T = 1 ({ci['T1']}, equivalence p {eq['T1']['p']:.2g})" in readme
        assert f"still inconclusive at T = 0.3 ({ci['T0.3']})" in readme
        if eq["T0.3"]["high90"] < 0:
            assert "The 90% interval at T = 0.3 lies below 0" in section
        reach = f"the interval reaches {-a['T0.3']['low']:.1f} points below 0 and {a['T0.3']['high']:.1f} above"
        assert reach in section
    assert f"is {ci['T0.3']} at T = 0.3 and {ci['T1']} at T = 1" in section
    assert f"seeds 200-{200 + n - 1})" in section
    assert f"within +-3 points is {a['T0.3']['equivalence']['p']:.2g} and {a['T1']['equivalence']['p']:.2g}" in section
    share = {t: f"{100 * d['share']:.1f}%" for t, d in noise.items()}
    assert (
        f"explains {share['T0.3']} of the paired difference's variance at T = 0.3 and {share['T1']} at T = 1" in section
    )
    assert f"`s_e^2` {noise['T0.3']['s_e2']:.2f} and {noise['T1']['s_e2']:.2f} points squared" in section
    assert all(d["outcome"] == "Mean@8" for d in noise.values()) and "the outcome stays Mean@8" in section


def test_the_committed_noise_check_is_the_variance_of_its_rows():
    """evaluation_noise.json: s_e^2 recomputed with numpy from its own rows (ddof 1 per model, mean over models),
    the share against the n = 10 paired sd in analysis.json, and the pre-registered quarter."""
    import json

    data = json.loads(NOISE.read_text())
    sd = json.loads(ANALYSIS.read_text())["family"]["tests"][rfa.RANGE_CONTRAST]
    for t, bench in rfa.TEMPERATURES.items():
        by: dict[tuple, list[float]] = {}
        for r in data["rows"]:
            if r["benchmark"] == bench and r["n"] == 8:
                by.setdefault((r["run"], r["seed"]), []).append(r["mean_at_n"])
        assert len(by) == 10 and all(len(v) == 4 for v in by.values())
        s_e2 = float(np.mean([np.var(v, ddof=1) for v in by.values()]))
        got = data["noise"][t]
        assert got["s_e2"] == pytest.approx(s_e2)
        assert got["share"] == pytest.approx(2 * s_e2 / sd[t]["sd"] ** 2)
        assert got["outcome"] == ("Mean@32" if got["share"] >= 0.25 else "Mean@8")
        assert sum(r["n"] == 32 and r["benchmark"] == bench for r in data["rows"]) == 10


def test_the_first_screen_says_every_run_of_the_n40_contrast_ends_below_its_sft_model_at_t03():
    """'All 80 runs of the n = 40 contrast ... end below their own SFT model in Mean@8 at T = 0.3', from the table."""
    import json

    rows = json.loads((ROOT / "figures" / "experiments" / "range_form" / "table" / "cpu_llm_table.json").read_text())[
        "rows"
    ]
    mine = [r for r in rows if r["benchmark"] == "steps-test-T0.3"]
    sft = {(r["seed"], r["sft_model"]): r["mean_at_8"] for r in mine if r["method"] == "sft"}
    runs = [r for r in mine if r["method"] in ("clip", "atr-min") and 200 <= r["seed"] <= 239]
    below = sum(r["mean_at_8"] < sft[r["seed"], r["sft_model"]] for r in runs)
    assert below == len(runs)
    flat = " ".join(PAGE.read_text().split())
    assert f"All {len(runs)} runs of the n = 40 contrast" in flat[: flat.index("![Each cell")]
