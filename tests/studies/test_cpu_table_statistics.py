"""The CPU study's statistics (experiments.cpu_table): paired intervals, power and sample size, Holm, the 2 x 2 ANOVA, OLS,
the intersection-union test and Pass@k, each against scipy, statsmodels, pandas or a brute force."""

import json
import math
import statistics
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

pytest.importorskip("trl")
pytest.importorskip("math_verify")


from experiments import cpu_table  # noqa: E402


def test_paired_difference_is_scipys_paired_t_interval():
    from scipy import stats

    a, b = [40.0, 47.5, 44.0, 51.0], [38.0, 47.0, 40.5, 45.0]
    rows = [{"method": "x", "seed": s, "m": v} for s, v in enumerate(a)]
    rows += [{"method": "clip", "seed": s, "m": v} for s, v in enumerate(b)]
    d = cpu_table.paired_difference(rows, "x", "clip", "m")
    ci = stats.ttest_rel(a, b).confidence_interval(0.95)
    assert d["mean"] == pytest.approx(sum(a) / 4 - sum(b) / 4)
    assert (d["low"], d["high"]) == pytest.approx((ci.low, ci.high), rel=1e-12)
    assert d["significant"] == (ci.low > 0 or ci.high < 0)
    assert d["p"] == pytest.approx(stats.ttest_rel(a, b).pvalue, rel=1e-10)
    assert cpu_table.paired_difference(rows[:1] + rows[4:5], "x", "clip", "m") is None  # one seed: no interval
    mixed = [{**r, "benchmark": b} for r in rows for b in ("T0.3", "T1")]
    with pytest.raises(ValueError, match="one benchmark"):  # (method, seed) pairs of two benchmarks never mix
        cpu_table.paired_difference(mixed, "x", "clip", "m")


@pytest.mark.parametrize("n", [2, 3, 5, 10, 16])
def test_detectable_difference_is_statsmodels_solved_effect_size_times_sd(n):
    from statsmodels.stats.power import TTestPower

    effect = TTestPower().solve_power(nobs=n, alpha=0.05, power=0.8, alternative="two-sided")
    assert cpu_table.detectable_difference(7.3, n) == pytest.approx(7.3 * effect, rel=1e-5)
    for d in (0.0, 0.5, 1.5):  # the power function itself (statsmodels' own is NaN at d = 3, n = 10: scipy's nct.cdf)
        assert cpu_table.paired_t_power(d * 7.3, 7.3, n) == pytest.approx(TTestPower().power(d, n, 0.05), abs=1e-9)
    assert cpu_table.detectable_difference(0.0, n) == 0.0  # identical differences: any nonzero mean is certain


@pytest.mark.parametrize("sd", [2.0, 5.0, 9.3])
def test_seeds_needed_is_statsmodels_sample_size_rounded_up(sd):
    import math

    from statsmodels.stats.power import TTestPower

    for difference in (2.0, 5.0, 10.0):
        exact = TTestPower().solve_power(effect_size=difference / sd, alpha=0.05, power=0.8, nobs=None)
        assert cpu_table.seeds_needed(sd, difference) == max(2, math.ceil(exact))
        assert cpu_table.seeds_needed(sd, -difference) == cpu_table.seeds_needed(sd, difference)
    with pytest.raises(ValueError, match="difference = 0"):
        cpu_table.seeds_needed(sd, 0)


def test_between_rule_noise_pools_the_rules_differences_and_leaves_the_sft_line_out():
    import numpy as np

    values = {"clip": [50, 61, 40, 55], "atr": [47, 63, 35, 52], "sapo": [52, 58, 41, 49], "sft": [80, 20, 90, 10]}
    rows = [
        {
            "method": m,
            "seed": s,
            "mean_at_8": float(v[s]),
            "pass_at_8": 90.0,
            "best_mean_at_8": 0.0,
            "frac_masked_mean": 0.0,
        }
        for m, v in values.items()
        for s in range(4)
    ]
    a = {m: np.array(v, dtype=float) for m, v in values.items()}
    # the table's differences: every line against clip and atr (its references), not against itself
    diffs = [a["clip"] - a["atr"], a["atr"] - a["clip"], a["sapo"] - a["clip"], a["sapo"] - a["atr"]]
    sd = np.sqrt(sum(d.var(ddof=1) for d in diffs) / len(diffs))  # equal n: the mean of the variances
    noise = cpu_table.between_rule_noise(rows, ["clip", "atr", "sapo"], 8)
    assert noise["sd"] == pytest.approx(float(sd), rel=1e-12) and noise["df"] == 4 * 3
    assert noise["seeds_needed_80"]["5"] == cpu_table.seeds_needed(float(sd), 5)
    assert cpu_table.between_rule_noise(rows, ["sft", "clip", "atr", "sapo"], 8) == noise  # the SFT line is not a rule
    md = cpu_table.markdown_table(rows, ["clip", "atr", "sapo"], 8)
    assert f"a paired difference has sd {sd:.1f}" in md and f"5 points: {noise['seeds_needed_80']['5']}" in md


def test_detectable_difference_is_detected_in_80_percent_of_simulated_experiments():
    import numpy as np
    from scipy import stats

    n, sd = 5, 6.0
    d = cpu_table.detectable_difference(sd, n)
    diffs = np.random.default_rng(0).normal(d, sd, size=(40_000, n))
    rejected = stats.ttest_1samp(diffs, 0.0, axis=1).pvalue < 0.05
    assert rejected.mean() == pytest.approx(0.8, abs=0.01)  # binomial SE 0.002
    assert cpu_table.paired_difference(  # the table's differences carry it, from their own sd and n
        [{"method": m, "seed": s, "k": v} for s in range(4) for m, v in (("x", s * s), ("clip", 0.0))],
        "x",
        "clip",
        "k",
    )["detectable_80"] == pytest.approx(cpu_table.detectable_difference(float(np.std([0, 1, 4, 9], ddof=1)), 4))
    rows = [  # the Markdown table shows it per line and reference ("-" where there is no pair)
        {"method": m, "seed": s, "mean_at_8": v, "pass_at_8": 90.0, "best_mean_at_8": v, "frac_masked_mean": 0.01}
        for s in range(3)
        for m, v in (("clip", 50.0 + s), ("atr", 50.0 + s * s), ("sft", 70.0))
    ]
    line = next(x for x in cpu_table.markdown_table(rows, ["clip", "atr"], 8).splitlines() if x.startswith("| atr "))
    expected = cpu_table.detectable_difference(float(np.std([0, 0, 2], ddof=1)), 3)
    assert line.split("|")[-3].strip() == f"{expected:.1f} / -"
    with pytest.raises(ValueError, match="n >= 2"):
        cpu_table.detectable_difference(1.0, 1)
    with pytest.raises(ValueError, match="power = 0.01"):
        cpu_table.detectable_difference(1.0, 5, power=0.01)


def test_grpo_minus_own_sft_subtracts_the_sft_row_of_the_same_seed_and_model():
    def row(method, seed, model, score, benchmark="steps-test-T1"):
        return {
            "method": method,
            "seed": seed,
            "sft_model": model,
            "invocation": "i" + model[0],
            "benchmark": benchmark,
            "mean_at_8": score,
        }

    rows = [row("sft", 0, "a0", 40.0), row("sft", 1, "a1", 30.0), row("sft", 0, "b0", 70.0)]
    rows += [row("clip", 0, "a0", 45.5), row("clip", 1, "a1", 29.0), row("atr", 0, "a0", 40.0)]
    rows += [row("atr", 0, "b0", 71.0), row("atr", 1, "b1", 10.0)]  # b1 has no sft row: unmatched
    rows += [row("sft", 0, "a0", 1.0, "steps-test-T0.3"), row("clip", 0, "a0", 0.0, "steps-test-T0.3")]
    got = cpu_table.grpo_minus_own_sft(rows, 8)
    t1 = got["steps-test-T1"]
    assert (t1["runs"], t1["raised"], t1["lowered"], t1["unchanged"], t1["unmatched"]) == (4, 2, 1, 1, 1)
    assert [(c["run"], c["seed"], c["change"]) for c in t1["changes"]] == [
        ("clip [A]", 1, -1.0),
        ("atr [A]", 0, 0.0),
        ("atr [B]", 0, 1.0),
        ("clip [A]", 0, 5.5),
    ]  # atr [B] seed 0 against sft b0 (70), not sft a0 (40)
    assert t1["mean_change"] == pytest.approx((5.5 - 1.0 + 0.0 + 1.0) / 4)
    t03 = got["steps-test-T0.3"]
    assert (t03["runs"], t03["lowered"], t03["mean_change"]) == (1, 1, -1.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_forms_2x2_effects_are_a_repeated_measures_anovas(seed):
    """Each effect's t^2 and p are statsmodels' AnovaRM F and p for the 2 x 2 within-seed design (range x form);
    a wrong sign on any cell's weight changes some F. A seed missing one cell is left out of every effect."""
    import numpy as np
    import pandas as pd
    from statsmodels.stats.anova import AnovaRM

    rng = np.random.default_rng(seed)
    cells = {"clip": ("clip", "min"), "clip-mask": ("clip", "mask"), "atr-min": ("atr", "min"), "atr": ("atr", "mask")}
    shift = {"clip": 0.0, "clip-mask": -2.0, "atr-min": -6.0, "atr": -4.0}
    values = {
        (run, s): 60 + 10 * rng.standard_normal() + shift[run] + 3 * rng.standard_normal()
        for run in cells
        for s in range(7)
    }
    rows = [
        {"method": run, "seed": s, "benchmark": "steps-test-T0.3", "mean_at_8": v} for (run, s), v in values.items()
    ]
    rows.append({"method": "atr", "seed": 7, "benchmark": "steps-test-T0.3", "mean_at_8": 99.0})  # one cell only
    effects = cpu_table.forms_factorial(rows, 8)["steps-test-T0.3"]
    frame = pd.DataFrame(
        [{"seed": s, "range": cells[run][0], "form": cells[run][1], "y": v} for (run, s), v in values.items()]
    )
    anova = AnovaRM(frame, "y", "seed", within=["range", "form"]).fit().anova_table
    for effect, term in [("range", "range"), ("form", "form"), ("interaction", "range:form")]:
        e = effects[effect]
        assert e["n"] == 7
        assert (e["mean"] / (e["sd"] / 7**0.5)) ** 2 == pytest.approx(anova.loc[term, "F Value"], rel=1e-9)
        assert e["p"] == pytest.approx(anova.loc[term, "Pr > F"], rel=1e-9)
    means = frame.groupby(["range", "form"])["y"].mean()
    assert effects["range"]["mean"] == pytest.approx(means["atr"].mean() - means["clip"].mean())
    assert effects["interaction"]["mean"] == pytest.approx(
        (means["atr", "mask"] - means["atr", "min"]) - (means["clip", "mask"] - means["clip", "min"])
    )
    assert cpu_table.forms_factorial([r for r in rows if r["method"] != "clip-mask"], 8) is None


def test_curve_tails_average_the_last_100_steps_and_pair_like_the_table():
    from scipy import stats

    def curves(offset, last_step=1000):  # logged every 10 steps, reward = step / 1000 + offset
        steps = [*range(10, last_step + 1 - last_step % 10, 10)] + ([last_step] if last_step % 10 else [])
        return [{"step": t, "reward": t / 1000 + offset, "entropy": offset} for t in steps]

    offsets = {("clip", 0): 0.0, ("clip", 1): 0.1, ("clip", 2): 0.3, ("atr", 0): 0.05, ("atr", 1): 0.1, ("atr", 2): 0.4}
    sets = [{"run": run, "seed": s, "sft_model": f"m{s}", "curves": curves(o)} for (run, s), o in offsets.items()]
    sets.append({"run": "atr", "seed": 3, "sft_model": "m3", "curves": curves(0.0, last_step=997)})
    rows = [{"method": run, "seed": s, "sft_model": f"m{s}", "benchmark": "b"} for run, s in offsets]
    rows += [{"method": "atr", "seed": 3, "sft_model": "m3", "benchmark": "b"}]
    rows += [{"method": "clip", "seed": 4, "sft_model": "m4", "benchmark": "b"}]  # a row without curves: no tail
    tails = {(t["method"], t["seed"]): t for t in cpu_table.curve_tails(rows, sets)}
    assert set(tails) == set(offsets) | {("atr", 3)}
    # steps 910, ..., 1000: mean step 955; a run ending off the interval (997) averages 900, ..., 990 and 997
    assert tails["clip", 1]["reward_tail"] == pytest.approx(0.955 + 0.1) and tails["clip", 1]["points"] == 10
    assert tails["atr", 3]["reward_tail"] == pytest.approx((sum(range(900, 991, 10)) + 997) / 11 / 1000)
    paired = cpu_table.paired_against_references(list(tails.values()), ["clip", "atr"], "entropy_tail")
    expected = stats.ttest_rel([0.05, 0.1, 0.4], [0.0, 0.1, 0.3])  # seed 3 has no clip run to pair with
    assert paired["atr"]["clip"]["p"] == pytest.approx(expected.pvalue, rel=1e-10)
    assert paired["atr"]["clip"]["mean"] == pytest.approx(0.05)
    # a run whose curves did not log entropy has no entropy tail, and its seed drops out of that pairing only
    no_entropy = [{**t, "entropy_tail": None} if (t["method"], t["seed"]) == ("atr", 2) else t for t in tails.values()]
    fewer = cpu_table.paired_against_references(no_entropy, ["clip", "atr"], "entropy_tail")["atr"]["clip"]
    assert fewer["n"] == 2 and fewer["mean"] == pytest.approx((0.05 + 0.0) / 2)
    md = cpu_table.markdown_curve_tails(list(tails.values()), ["clip", "atr"])
    assert "| atr | 4 | 1.091 | 0.1375 | - |" in md  # reward (3 x 0.955 + 0.55 + 0.94973) / 4; no length logged


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=40))
def test_holm_adjusted_is_statsmodels_holm(p_values):
    from unittest import mock

    from statsmodels.stats.multitest import multipletests

    # statsmodels calls gc.collect() on every call, which in a test process holding models takes ~0.6 s: the oracle's
    # numbers do not depend on it
    with mock.patch("gc.collect", return_value=0):
        expected = multipletests(p_values, alpha=0.05, method="holm")[1]
    assert cpu_table.holm_adjusted(p_values) == pytest.approx(list(expected), abs=1e-12)


def test_table_marks_a_difference_that_survives_holm_over_the_whole_table():
    from statsmodels.stats.multitest import multipletests

    shift = {"sft": -30.0, "clip": 0.0, "atr": 0.0, "sapo": 0.0, "kl1": 6.0}
    noise = {"sft": [0.1, -0.2, 0.1, 0.0], "clip": [0, 0, 0, 0], "atr": [3.0, -4.0, 5.0, -2.0]}
    noise |= {"sapo": [-6.0, 4.0, 1.0, 7.0], "kl1": [0.2, 1.5, -0.4, 0.9]}
    rows = [
        {
            "method": m,
            "seed": s,
            "mean_at_8": 50.0 + shift[m] + noise[m][s],
            "pass_at_8": 90.0,
            "best_mean_at_8": 60.0,
            "frac_masked_mean": 0.0,
        }
        for m in shift
        for s in range(4)
    ]
    runs = ["clip", "atr", "sapo", "kl1"]
    paired = cpu_table.paired_against_references(rows, ["sft", *runs], "mean_at_8")
    tested = [(name, ref, d) for name, by in paired.items() for ref, d in by.items() if d is not None]
    assert len(tested) == 8  # sft, sapo, kl1 against both; atr against clip and clip against atr
    holm = multipletests([d["p"] for _, _, d in tested], method="holm")[1]
    assert [d["p_holm"] for _, _, d in tested] == pytest.approx(list(holm), abs=1e-12)
    md = cpu_table.markdown_table(rows, runs, 8)
    cells = {line.split("|")[1].strip(): line.split("|")[6:8] for line in md.splitlines() if line.startswith("| ")}
    survives = {(name, ref) for name, ref, d in tested if d["p_holm"] < 0.05}
    assert ("sft", "clip") in survives and ("sapo", "clip") not in survives
    for name, ref, _ in tested:
        assert ("†" in cells[name][0 if ref == "clip" else 1]) == ((name, ref) in survives)
    assert "8 paired differences in this table" in md


def test_where_curves_part_finds_the_first_logged_step_where_any_curve_value_differs():
    def curves():  # fresh dicts every time: equality must be of values, not of objects
        return [
            {"step": t, "reward": t / 1000, "entropy": 0.2, "clip/ratio_max": 1.2, "clip/frac_masked": float("nan")}
            for t in range(10, 101, 10)
        ]

    sets = [{"run": "clip", "seed": s, "sft_model": f"m{s}", "curves": curves()} for s in range(4)]
    for seed in range(4):
        sets.append({"run": "dual-clip", "seed": seed, "sft_model": f"m{seed}", "curves": curves()})
    sets[5]["curves"][2]["clip/ratio_max"] = 1.2000000000000002  # seed 1: one ulp, in a key other than reward
    sets[6]["curves"][6]["entropy"] = 0.21  # seed 2: from step 70
    del sets[7]["curves"][-1]  # seed 3: stops one logged point early
    sets.append({"run": "dual-clip", "seed": 4, "sft_model": "m4", "curves": curves()})  # no clip run: left out
    sets.append({"run": "atr", "seed": 0, "sft_model": "m0", "curves": curves()})
    sets[-1]["curves"][0]["reward"] = 0.0
    parted = cpu_table.where_curves_part(sets, ["clip", "dual-clip", "atr"])
    assert {s["seed"]: s["parts_at"] for s in parted["dual-clip"]} == {0: None, 1: 30, 2: 70, 3: 100}
    assert parted["atr"] == [{"seed": 0, "sft_model": "m0", "parts_at": 10}]
    md = cpu_table.markdown_curves_equal(parted)
    assert "- dual-clip: every logged value equals clip's on 1 of 4 starts (seed 0)" in md
    assert "part at step 30 (seed 1); step 70 (seed 2); step 100 (seed 3)" in md
    assert "atr" not in md.split("\n\n", 1)[1]  # atr equals clip nowhere: no line
    assert cpu_table.markdown_curves_equal({"atr": parted["atr"]}) == ""


def test_where_curves_part_on_the_committed_start_c_table_agrees_with_pandas():
    """The committed curves of dual-clip and clip from start C, compared by pandas (an implementation we did not
    write): per seed, the first logged step whose row differs in any column, or none."""
    import pandas as pd

    out = Path(__file__).resolve().parents[2] / "figures" / "experiments" / "cpu_table" / "startC"
    _, sets, _ = cpu_table.previous_outputs(
        out, json.loads((out / "cpu_llm_table.json").read_text())["settings"], set()
    )
    runs = sorted({s["run"] for s in sets})
    assert {"clip", "dual-clip"} <= set(runs)  # committed: 10 seeds of each
    ours = {s["seed"]: s["parts_at"] for s in cpu_table.where_curves_part(sets, runs)["dual-clip"]}
    frame = pd.read_csv(out / "cpu_llm_curves.csv")
    expected = {}
    for seed, both in frame[frame.method.isin(["clip", "dual-clip"])].groupby("seed"):
        logged = [k for k in cpu_table.CURVE_KEYS[1:] if k in frame.columns]  # a table older than the newest keys
        a, b = (both[both.method == m].set_index("step")[logged] for m in ("clip", "dual-clip"))
        differs = ~((a == b) | (a.isna() & b.isna())).all(axis=1)
        expected[seed] = int(differs[differs].index.min()) if differs.any() else None
    assert ours == expected
    assert sum(step is None for step in ours.values()) >= 1  # the dual clip's floor never acted on some seed


@pytest.mark.parametrize("seed", [0, 1])
def test_outcome_association_is_an_ols_with_one_indicator_per_start(seed):
    """Slope, 95% interval and p of `outcome_association` against statsmodels' OLS of Mean@8 on the tail plus
    C(start); r^2 = t^2 / (t^2 + df). Two starts share a seed but not an SFT model (two starts, not one); a start
    with one run and a run without the tail drop out; a run equal to another on its start (the same tail and Mean@8)
    counts once, so the fit is statsmodels' on the distinct runs; a wrong centring (by seed, or none) changes the
    slope."""
    import numpy as np
    import pandas as pd
    import statsmodels.formula.api as smf

    rng = np.random.default_rng(seed)
    runs, starts = ["clip", "atr", "sapo", "kl1"], [(s, f"m{s}") for s in range(5)] + [(0, "other")]
    rows, tails, frame = [], [], []
    for s, model in starts:
        level = 20 * rng.standard_normal()  # a start's own level: pooled without indicators it hides the slope
        for run in runs:
            x = 1.2 + 0.05 * rng.standard_normal() + 0.01 * level
            y = 60 + level - 50 * (x - 1.2) + 2 * rng.standard_normal()
            rows.append({"method": run, "seed": s, "sft_model": model, "benchmark": "b", "mean_at_8": y})
            tails.append({"method": run, "seed": s, "sft_model": model, "ratio_max_tail": x})
            frame.append({"start": f"{s}/{model}", "x": x, "y": y})
    for run in ("clip", "dual-clip"):  # alone on its start (its copy is no second run): left out, copy uncounted
        rows.append({"method": run, "seed": 9, "sft_model": "m9", "benchmark": "b", "mean_at_8": 0.0})
        tails.append({"method": run, "seed": 9, "sft_model": "m9", "ratio_max_tail": 9.0})
    rows.append({"method": "dcpo", "seed": 1, "sft_model": "m1", "benchmark": "b", "mean_at_8": 99.0})  # no tail
    tails.append({"method": "dcpo", "seed": 1, "sft_model": "m1", "ratio_max_tail": None})
    for s, model in starts[:3]:  # a rule that never acted on three starts: clip's run under another name
        clip_row = next(r for r in rows if (r["method"], r["seed"], r["sft_model"]) == ("clip", s, model))
        clip_tail = next(t for t in tails if (t["method"], t["seed"], t["sft_model"]) == ("clip", s, model))
        rows.append({**clip_row, "method": "dual-clip"})
        tails.append({**clip_tail, "method": "dual-clip"})
    got = cpu_table.outcome_association(rows, tails, 8, names=("ratio_max",))["b"]["ratio_max"]
    fit = smf.ols("y ~ x + C(start)", data=pd.DataFrame(frame)).fit()
    assert (got["n"], got["copies"], got["starts"], got["df"]) == (24, 3, 6, int(fit.df_resid))
    assert got["slope"] == pytest.approx(fit.params["x"], rel=1e-9)
    low, high = fit.conf_int().loc["x"]
    assert (got["low"], got["high"]) == (pytest.approx(low, rel=1e-9), pytest.approx(high, rel=1e-9))
    assert got["p"] == pytest.approx(fit.pvalues["x"], rel=1e-9, abs=1e-300)
    t = fit.tvalues["x"]
    assert got["r"] ** 2 == pytest.approx(t**2 / (t**2 + fit.df_resid), rel=1e-9) and got["r"] < 0
    # too few degrees of freedom: None, not a number
    two = [r for r in rows if r["seed"] in (0, 1) and r["sft_model"] != "other" and r["method"] in ("clip", "atr")]
    assert cpu_table.outcome_association(two, tails, 8, names=("ratio_max",))["b"]["ratio_max"] is None


def test_delta_optimum_is_an_intersection_union_of_scipys_one_sided_paired_t_tests():
    from scipy import stats
    from statsmodels.stats.multitest import multipletests

    # delta 0.07 above 0.03 and 0.15 clearly, not above 0.05: "above every delta" must not hold
    scores = {
        "atr": [60.0, 52.0, 70.0, 58.0, 66.0, 49.0],
        "atr-delta0.03": [55.0, 49.0, 64.0, 52.0, 63.0, 45.0],
        "atr-delta0.05": [62.0, 51.0, 72.0, 55.0, 67.0, 50.0],
        "atr-delta0.15": [50.0, 47.0, 61.0, 51.0, 60.0, 40.0],
    }
    rows = [
        {"method": m, "seed": s, "sft_model": f"m{s}", "benchmark": "steps-test-T1", "mean_at_8": v}
        for m, vs in scores.items()
        for s, v in enumerate(vs)
    ]
    rows += [{**r, "method": "atr-delta0.1", "seed": 9, "sft_model": "m9"} for r in rows[:1]]  # one seed: no pair
    (optimum,) = cpu_table.delta_optimum(rows, 8)
    assert optimum["benchmark"] == "steps-test-T1" and optimum["start"] == ""
    others = ["atr-delta0.03", "atr-delta0.05", "atr-delta0.15"]
    assert [c["run"] for c in optimum["comparisons"]] == others
    one_sided = [stats.ttest_rel(scores["atr"], scores[o], alternative="greater").pvalue for o in others]
    two_sided = [stats.ttest_rel(scores["atr"], scores[o]).pvalue for o in others]
    got = optimum["comparisons"]
    assert [c["p_one_sided"] for c in got] == pytest.approx(one_sided, rel=1e-9)
    assert [c["p_holm"] for c in got] == pytest.approx(list(multipletests(two_sided, method="holm")[1]), rel=1e-9)
    assert optimum["iut_p"] == pytest.approx(max(one_sided), rel=1e-9) and optimum["iut_p"] > 0.05
    assert max(one_sided[0], one_sided[2]) < 0.05  # the ends alone would have passed: the max is what decides
    ends = [a - (lo + hi) / 2 for a, lo, hi in zip(scores["atr"], scores["atr-delta0.03"], scores["atr-delta0.15"])]
    peak = optimum["peak"]
    assert (peak["low_delta"], peak["high_delta"]) == (0.03, 0.15)
    assert peak["p"] == pytest.approx(stats.ttest_1samp(ends, 0.0).pvalue, rel=1e-9)
    assert optimum["best_delta"] == 0.05  # highest mean over seeds
    md = cpu_table.markdown_delta_optimum([optimum], 8)
    assert "T = 1:" in md and "T = 1.0" not in md and f"intersection-union p {cpu_table._p_value(max(one_sided))}" in md
    # one other delta only: no question of an optimum to ask
    assert cpu_table.delta_optimum([r for r in rows if r["method"] in ("atr", "atr-delta0.03")], 8) == []


def _write_evaluated_run(runs_dir, run, seed, step, correct_by_problem, sft_model="m"):
    """A run directory as experiments.cpu_table leaves it: result.json with the recorded Pass@8 and, per benchmark, the
    samples.jsonl of that evaluation (8 samples per problem, ``correct_by_problem[i]`` of them correct)."""
    import json

    from experiments import cpu_table
    from experiments.cpu_table import pass_at_k_curves

    evals = {}
    for benchmark in cpu_table.BENCHMARKS:
        d = pass_at_k_curves.evaluation_directory(runs_dir, run, seed, step) / benchmark
        d.mkdir(parents=True)
        with (d / "samples.jsonl").open("w") as f:
            for i, c in enumerate(correct_by_problem):
                for j in range(8):
                    f.write(json.dumps({"benchmark": "test", "problem_id": i, "correct": j < c, "status": "x"}) + "\n")
        solved = sum(c > 0 for c in correct_by_problem)
        evals[benchmark] = {"pass@8": 100 * solved / len(correct_by_problem)}
    result = {
        "run": run,
        "seed": seed,
        "sft_model": f"{sft_model}{seed}",
        "evals": {"0" if run == "sft" else str(step): evals},
    }
    (cpu_table.run_directory(runs_dir, run, seed) / "result.json").write_text(json.dumps(result))


def _pass_at_k_argv(runs_dir, runs: str, ks: str, out: str) -> list[str]:
    """``python -m experiments.cpu_table.pass_at_k_curves`` arguments for seeds 0 and 1 of ``runs_dir``, paired against sft."""
    return [
        "--runs-dir", str(runs_dir), "--runs", *runs.split(), "--seeds", "0", "1", "--ks", *ks.split(),
        "--references", "sft", "--out", str(runs_dir / out),
    ]  # fmt: skip


def test_pass_at_k_curves_equal_brute_force_over_subsets_and_refuse_other_samples(tmp_path):
    """Pass@K of each run and seed against enumeration of every K-subset of its 8 samples (itertools), Mean@K equal
    at every K, the paired Pass@K difference against numpy over seeds; a result.json whose Pass@8 disagrees with
    the samples is refused."""
    import itertools
    import json

    import numpy as np

    from experiments.cpu_table import pass_at_k_curves

    counts_atr = {0: [3, 3, 3, 3], 1: [0, 8, 8, 0]}
    counts = {("sft", 0): [0, 1, 3, 8], ("sft", 1): [2, 0, 5, 7], ("clip", 0): [0, 4, 6, 8], ("clip", 1): [1, 1, 8, 6]}
    for (run, seed), correct in counts.items():
        _write_evaluated_run(tmp_path, run, seed, 1000, correct)
    summary = pass_at_k_curves.main(_pass_at_k_argv(tmp_path, "sft clip", "1 2 3 8", "out"))

    def brute(correct, k):
        per_problem = []
        for c in correct:
            flags = [j < c for j in range(8)]
            subsets = list(itertools.combinations(flags, k))
            per_problem.append(sum(any(s) for s in subsets) / len(subsets))
        return 100 * float(np.mean(per_problem))

    for r in summary["rows"]:
        correct = counts[r["run"], r["seed"]]
        assert r["pass_at_k"] == pytest.approx(brute(correct, r["k"]), abs=1e-9)
        assert r["mean_at_k"] == pytest.approx(100 * float(np.mean(correct)) / 8, abs=1e-9)
    d = summary["paired_pass_at_k"]["sft"]["steps-test-T1"]["2"]["clip"]
    expected = [brute(counts["clip", s], 2) - brute(counts["sft", s], 2) for s in (0, 1)]
    assert d["mean"] == pytest.approx(float(np.mean(expected))) and d["n"] == 2
    for seed, correct in counts_atr.items():
        _write_evaluated_run(tmp_path, "atr", seed, 1000, correct)
    summary = pass_at_k_curves.main(_pass_at_k_argv(tmp_path, "sft clip atr", "2", "out3"))
    pooled = summary["paired_pass_at_k"]["sft"]["steps-test-T1"]["2"]["mean of runs"]
    per_seed = [
        (brute(counts["clip", s], 2) + brute(counts_atr[s], 2)) / 2 - brute(counts["sft", s], 2) for s in (0, 1)
    ]
    assert pooled["mean"] == pytest.approx(float(np.mean(per_seed))) and pooled["n"] == 2
    from statsmodels.stats.multitest import multipletests

    family = [by_k["mean of runs"] for b in summary["paired_pass_at_k"]["sft"].values() for by_k in b.values()]
    assert len(family) == 2
    expected_holm = multipletests([d["p"] for d in family], method="holm")[1]
    assert [d["p_holm"] for d in family] == pytest.approx(list(expected_holm))
    assert (tmp_path / "out" / "cpu_pass_at_k.png").exists()
    result_path = tmp_path / "clip-s1" / "result.json"
    result = json.loads(result_path.read_text())
    result["evals"]["1000"]["steps-test-T1"]["pass@8"] = 50.0
    result_path.write_text(json.dumps(result))
    with pytest.raises(ValueError, match="not the samples that were evaluated"):
        pass_at_k_curves.curve_of_run(tmp_path, "clip", 1, 1000, [1, 8])
    with pytest.raises(SystemExit):  # a reference that is not a run is refused, not dropped
        pass_at_k_curves.main(_pass_at_k_argv(tmp_path, "clip atr", "2", "out4"))
    assert not (tmp_path / "out4").exists()
    with pytest.raises(ValueError, match="no evaluation at step 750"):
        pass_at_k_curves.curve_of_run(tmp_path, "clip", 0, 750, [1, 8])


def test_acted_summary_averages_every_logged_step_and_the_entropys_first_and_last_fifth():
    history = [
        {"step": s, "clip/frac_masked": 0.1 * (s % 2), "entropy": float(s), **({"reward": 0.5} if s % 4 == 1 else {})}
        for s in range(1, 11)
    ] + [{"step": 10, "train_runtime": 1.0}]
    got = cpu_table.acted_summary(history)
    assert got["logged_steps"] == 10 and got["clip/frac_masked"] == pytest.approx(0.05)
    assert got["entropy_first_fifth"] == pytest.approx(1.5) and got["entropy_last_fifth"] == pytest.approx(9.5)
    assert got["clip/frac_clipped_low"] is None  # not logged: not invented


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(-20, 20, allow_nan=False), min_size=2, max_size=40),
    st.sampled_from([0.5, 3.0, 10.0]),
)
def test_paired_equivalence_is_statsmodels_ttost_paired(differences, margin):
    """The oracle: statsmodels' TOST of paired samples, given the differences against zeros."""
    import numpy as np
    from statsmodels.stats.weightstats import ttost_paired

    assume(statistics.stdev(differences) > 1e-6)
    got = cpu_table.paired_equivalence(differences, margin)
    p, lower, upper = ttost_paired(np.array(differences), np.zeros(len(differences)), -margin, margin)
    assert got["p"] == pytest.approx(float(p), rel=1e-9, abs=1e-300)
    assert got["p_lower"] == pytest.approx(float(lower[1]), rel=1e-9, abs=1e-300)
    assert got["p_upper"] == pytest.approx(float(upper[1]), rel=1e-9, abs=1e-300)
    assert got["equivalent"] == (-margin < got["low90"] and got["high90"] < margin)


@pytest.mark.parametrize("sd,n,difference", [(8.47, 40, 0.0), (4.17, 40, 0.0), (4.17, 10, 1.0), (2.0, 6, -2.5)])
def test_equivalence_power_is_the_rejection_rate_of_simulated_studies(sd, n, difference):
    """Exact power against 4,000 simulated studies (n normal differences each, statsmodels' TOST on each): within
    four Monte Carlo standard errors."""
    import numpy as np
    from statsmodels.stats.weightstats import ttost_paired

    rng = np.random.default_rng(7)
    draws = rng.normal(difference, sd, size=(4000, n))
    zeros = np.zeros(n)
    rate = float(np.mean([ttost_paired(d, zeros, -3.0, 3.0)[0] < 0.05 for d in draws]))
    power = cpu_table.equivalence_power(sd, n, 3.0, difference)
    assert abs(power - rate) < 4 * math.sqrt(max(power * (1 - power), 1e-4) / 4000) + 1e-3
