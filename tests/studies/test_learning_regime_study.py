"""The learning-regime calibration (docs/experiments/learning-regime-calibration-prereg.md): pre-registered before its
outputs; its verdict follows the four pre-registered criteria, each checked here against scipy's t interval on
synthetic tables built so that exactly one criterion fails; the committed analysis is what the code computes from the
committed table."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from preregistration import assert_preregistered_before
from scipy import stats

pytest.importorskip("trl")

from experiments import learning_regime_analysis as lra  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PREREG = "docs/experiments/learning-regime-calibration-prereg.md"
OUTPUTS = ("figures/experiments/learning_regime",)


def test_the_calibration_was_preregistered_before_any_of_its_outputs():
    assert_preregistered_before(PREREG, OUTPUTS)


def _table(clip_gain, shuffled_gain, clip_rise, shuffled_rise, seeds=(300, 301, 302, 303, 304)):
    """Rows and curves of a synthetic calibration: per seed an SFT score, clip and shuffled scores sft + gain (+ a
    seed-dependent wobble so the intervals have width), and reward curves rising by the given amounts."""
    rows, curve_sets = [], []
    for i, seed in enumerate(seeds):
        wobble = (-1.0, 0.5, 1.5, -0.5, 0.2, 0.9, -1.2)[i]
        for bench in lra.BENCHMARKS:
            sft = 35.0 + i
            rows.append({"method": "sft", "seed": seed, "sft_model": f"m{seed}", "benchmark": bench, "mean_at_8": sft})
            for run, gain in (("clip", clip_gain), ("shuffled", shuffled_gain)):
                rows.append(
                    {
                        "method": run,
                        "seed": seed,
                        "sft_model": f"m{seed}",
                        "benchmark": bench,
                        "mean_at_8": sft + gain + wobble,
                    }
                )
        for run, rise in (("clip", clip_rise), ("shuffled", shuffled_rise)):
            curves = [{"step": s, "reward": 0.3 + (rise + 0.01 * wobble) * (s >= 901)} for s in range(10, 1001, 10)]
            curve_sets.append({"run": run, "seed": seed, "sft_model": f"m{seed}", "curves": curves})
    return rows, curve_sets


def _scipy_low(values) -> float:
    values = np.asarray(values, float)
    return float(stats.t.interval(0.95, len(values) - 1, loc=values.mean(), scale=stats.sem(values))[0])


def test_a_regime_where_clip_learns_and_the_control_does_not_is_accepted():
    rows, curves = _table(clip_gain=8, shuffled_gain=-20, clip_rise=0.2, shuffled_rise=-0.1)
    analysis = lra.analyse(rows, curves)
    assert analysis["acceptance"] == "accepted"
    clip = analysis["by_benchmark"][lra.PRIMARY]["contrasts"]["clip_minus_sft"]
    gains = [8 + w for w in (-1.0, 0.5, 1.5, -0.5, 0.2)]
    assert clip["low"] == pytest.approx(_scipy_low(gains))
    rise = analysis["by_benchmark"][lra.PRIMARY]["contrasts"]["clip_reward_rise"]
    assert rise["mean"] == pytest.approx(0.2 + 0.01 * np.mean([-1.0, 0.5, 1.5, -0.5, 0.2]))


@pytest.mark.parametrize(
    "gains,failed",
    [
        ((-8, -20, 0.2, -0.1), "1_clip_beats_sft"),  # clip ends below its SFT model
        ((8, -20, -0.2, -0.1), "2_clip_reward_rises"),
        ((8, -20, 0.2, 0.2), "3_shuffled_does_neither"),  # the control's reward rises too: no signal needed
        ((8, 8, 0.2, -0.1), "3_shuffled_does_neither"),  # the control beats SFT as much as clip: also criterion 4
    ],
)
def test_each_failed_criterion_rejects_the_regime(gains, failed):
    analysis = lra.analyse(*_table(*gains))
    assert analysis["acceptance"] == "not accepted"
    assert analysis["by_benchmark"][lra.PRIMARY]["met"][failed] is False


def test_the_fallback_is_read_only_when_the_primary_endpoint_fails_and_at_the_training_temperature():
    rows, curves = _table(8, -20, 0.2, -0.1)
    assert lra.analyse(rows, curves)["fallback"] is None  # accepted at T = 0.3: no fallback
    for r in rows:  # clip below its SFT model at T = 0.3 only
        if r["benchmark"] == lra.PRIMARY and r["method"] == "clip":
            r["mean_at_8"] -= 16
    analysis = lra.analyse(rows, curves)
    assert analysis["acceptance"] == "not accepted"
    assert analysis["fallback"] == {"benchmark": lra.FALLBACK, "all_met": True, "endpoint": lra.FALLBACK}
    for r in rows:  # and at T = 1 too: no endpoint left
        if r["benchmark"] == lra.FALLBACK and r["method"] == "clip":
            r["mean_at_8"] -= 16
    assert lra.analyse(rows, curves)["fallback"]["endpoint"] is None


def test_fewer_than_five_complete_seeds_is_pending_whatever_the_numbers():
    rows, curves = _table(8, -20, 0.2, -0.1, seeds=(300, 301, 302, 303))
    assert lra.analyse(rows, curves)["acceptance"] == "pending"
    rows, curves = _table(8, -20, 0.2, -0.1)
    rows = [r for r in rows if not (r["seed"] == 304 and r["method"] == "shuffled")]  # one arm missing on a seed
    assert lra.analyse(rows, curves)["acceptance"] == "pending"


def test_the_reward_rise_uses_the_preregistered_windows():
    curves = [{"step": s, "reward": float(s)} for s in range(10, 1001, 10)]
    early = np.mean([s for s in range(10, 101, 10)])
    late = np.mean([s for s in range(910, 1001, 10)])
    assert lra.reward_rise(curves) == pytest.approx(late - early)
    assert lra.reward_rise([c for c in curves if c["step"] <= 500]) is None  # no late window yet


def test_the_committed_analysis_is_what_the_code_computes_from_the_committed_table():
    table = ROOT / lra.TABLE
    if not (table / "cpu_llm_table.json").exists():
        pytest.skip("the calibration has not run yet")
    summary, rows, curve_sets = lra.read_table(table)
    committed = json.loads((table.parent / "analysis.json").read_text())
    assert json.loads(json.dumps(lra.analyse(rows, curve_sets, summary["settings"]["samples"]))) == committed


def test_the_comparisons_planned_seeds_are_the_smallest_with_the_power_asked():
    """Against brute force over n with the package's power functions, which have their own scipy / Monte Carlo
    oracles (tests/studies/test_cpu_table_statistics.py)."""
    from experiments.cpu_table import equivalence_power, paired_t_power

    plan = lra.comparison_planning({"sd": 4.0})
    sd = 4.0 * 2**0.5
    assert plan["sd_between_rules_assumed"] == pytest.approx(sd)
    n = plan["seeds_to_detect_paper_gap"]
    assert paired_t_power(2.7, sd, n) >= 0.8 > paired_t_power(2.7, sd, n - 1)
    m = plan["seeds_for_equivalence_within_margin"]
    assert equivalence_power(sd, m, 3.0) >= 0.8 > equivalence_power(sd, m - 1, 3.0)
    assert lra.comparison_planning(None) is None and lra.comparison_planning({"sd": 0.0}) is None


def _comparison_rows(effects: dict[str, float], seeds=range(12)) -> list[dict]:
    rows = []
    for i, seed in enumerate(seeds):
        wobble = (-1.0, 0.5, 1.5, -0.5, 0.2, 0.9, -1.2, 0.3, 0.7, -0.8, 1.1, -0.4)[i]
        for bench in lra.BENCHMARKS:
            base = {"seed": seed, "sft_model": f"m{seed}", "benchmark": bench}
            rows.append({**base, "method": "sft", "mean_at_8": 20.0 + i})
            for arm, effect in effects.items():
                rows.append({**base, "method": arm, "mean_at_8": 20.0 + i + effect + wobble * (arm != "clip")})
    return rows


def test_the_comparison_answers_each_contrast_after_holm_and_tests_equivalence_for_the_range():
    from statsmodels.stats.multitest import multipletests
    from statsmodels.stats.weightstats import ttost_paired

    effects = {"clip": 3.0, "atr-min": 3.2, "clip-higher": 9.0, "atr": -15.0, "clip-mask": -16.0, "shuffled": -10.0}
    result = lra.compare(_comparison_rows(effects), lra.FALLBACK)
    tests = result["tests"]
    ps = [tests[name]["p"] for name in lra.FAMILY]
    assert [tests[name]["p_holm"] for name in lra.FAMILY] == pytest.approx(list(multipletests(ps, method="holm")[1]))
    assert result["answers"]["clip-higher - clip"] == "positive"
    assert result["answers"]["form at clip's range (clip-mask - clip)"] == "negative"
    assert result["answers"][lra.EQUIVALENCE] == "within +-3 points"
    atr_min = np.array([r["mean_at_8"] for r in _comparison_rows(effects) if r["method"] == "atr-min"][1::2])
    clip = np.array([r["mean_at_8"] for r in _comparison_rows(effects) if r["method"] == "clip"][1::2])
    assert result["equivalence"]["p"] == pytest.approx(ttost_paired(atr_min, clip, -3.0, 3.0)[0])
    assert result["validity"]["counts"] is True
    short = lra.compare(_comparison_rows(effects, seeds=range(11)), lra.FALLBACK)
    assert set(short["answers"].values()) == {"pending"} and short["seeds_per_arm"] == 11


def test_the_results_page_states_the_committed_verdict_and_numbers():
    table = ROOT / lra.TABLE
    if not (table.parent / "analysis.json").exists():
        pytest.skip("the calibration has not run yet")
    a = json.loads((table.parent / "analysis.json").read_text())
    if a["acceptance"] == "pending":
        pytest.skip("the calibration is not complete")
    page = " ".join((ROOT / "docs" / "experiments" / "learning-regime.md").read_text().split())
    first = page[: page.index("## The four criteria")]
    t03, t1 = (a["by_benchmark"][b]["contrasts"] for b in (lra.PRIMARY, lra.FALLBACK))

    def cell(d, places=1):
        return f"{d['mean']:+.{places}f} [{d['low']:+.{places}f}, {d['high']:+.{places}f}]"

    assert a["acceptance"] == "not accepted" and a["fallback"]["endpoint"] == lra.FALLBACK
    assert "Candidate A is not accepted at T = 0.3" in first and "T = 1 as its primary endpoint" in first
    assert f"({cell(t03['clip_minus_sft'])} points of held-out Mean@8" in first
    assert f"above its SFT model ({cell(t1['clip_minus_sft'])})" in first
    assert f"shuffled-reward control ({cell(t1['clip_minus_shuffled'])})" in first
    assert f"reward rises ({cell(t1['clip_reward_rise'], 3)})" in first
    assert f"control's falls ({cell(t1['shuffled_reward_rise'], 3)})" in first
    assert f"ends {-t1['shuffled_minus_sft']['mean']:.1f} points below its SFT model at T = 1" in first
    assert f"{-t03['shuffled_minus_sft']['mean']:.1f} below at T = 0.3" in first
    plan = a["comparison_planning"][lra.FALLBACK]
    assert f"SD of {plan['sd_clip_minus_sft']:.2f} points" in page
    assert f"about {plan['sd_between_rules_assumed']:.2f}, and {plan['seeds_to_detect_paper_gap']} seeds" in page
    summary, rows, curves = lra.read_table(table)
    sft = [r for r in rows if r["method"] == "sft" and r["benchmark"] == lra.PRIMARY]
    low, high = min(r["mean_at_8"] for r in sft), max(r["mean_at_8"] for r in sft)
    assert f"Mean@8 at T = 0.3 of {low:.1f}-{high:.1f}%" in first
    last = [c["curves"][-1]["reward"] for c in curves if c["run"] == "shuffled"]
    assert f"{min(last):.3f}-{max(last):.3f}" in first


COMPARISON_PREREG = "docs/experiments/learning-regime-comparison-prereg.md"


def test_the_comparison_was_preregistered_after_the_verdict_and_before_its_outputs():
    from preregistration import first_commit

    assert_preregistered_before(COMPARISON_PREREG, ("figures/experiments/learning_regime/comparison",))
    verdict = subprocess.run(  # the commit that made the calibration's analysis say "not accepted" came first
        ["git", "log", "--reverse", "--format=%H", "-S", '"acceptance": "not accepted"', "--", str(lra.TABLE.parent)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert verdict, "the calibration's verdict was never committed"
    ancestor = subprocess.run(
        ["git", "merge-base", "--is-ancestor", verdict[0], first_commit(COMPARISON_PREREG)], cwd=ROOT
    )
    assert ancestor.returncode == 0


def test_the_comparisons_commands_run_its_arms_on_its_seeds():
    import re

    text = (ROOT / COMPARISON_PREREG).read_text()
    runs = set(re.search(r'S="--runs (.*?) --sft-steps', text).group(1).split())
    assert runs == {run for weights in lra.FAMILY.values() for run in weights} | {lra.CONTROL}
    seeds = [int(s) for line in re.findall(r"--seeds ([\d ]+)$", text, re.M) for s in line.split()]
    assert len(seeds) == len(set(seeds)) == lra.COMPARISON_SEEDS and min(seeds) > 304  # fresh, not the calibration's


def test_the_comparisons_secondary_readings_are_means_over_seeds_and_its_page_lists_every_answer():
    """``secondary``: per arm the mean over seeds of each reading (the late reward from the curves' rows in LATE
    only), the family again at the other sampling, and the entropy contrast; ``comparison_markdown`` shows each."""
    effects = {"clip": 3.0, "atr-min": 3.2, "clip-higher": 9.0, "atr": -15.0, "clip-mask": -16.0, "shuffled": -10.0}
    rows = _comparison_rows(effects)
    for r in rows:
        r.update(acted_true_kl_mean=0.001 * (r["seed"] + 1), acted_true_kl_p95=0.01, frac_masked_mean=0.5,
                 acted_entropy_last_fifth=0.4 + (0.01 * r["seed"] if r["method"] == "atr-min" else 0.0))
    curve_sets = [
        {"run": run, "seed": seed, "curves": [{"step": 10, "reward": 9.0}, {"step": 950, "reward": 0.1 * seed},
                                              {"step": 1000, "reward": 0.1 * seed + 0.2}]}
        for run in effects for seed in range(12)
    ]
    more = lra.secondary(rows, curve_sets, lra.FALLBACK)
    assert more["other_sampling"] == lra.PRIMARY
    assert more["per_arm"]["clip"]["acted_true_kl_mean"] == pytest.approx(0.001 * 6.5)
    assert more["per_arm"]["clip"]["late_reward"] == pytest.approx(0.1 * 5.5 + 0.1)  # step 10 is not in LATE
    assert more["per_arm"]["sft"]["late_reward"] is None and more["per_arm"]["sft"]["seeds"] == 12
    assert more["entropy_last_fifth"]["mean"] == pytest.approx(0.055)
    assert more["other_tests"]["clip-higher - clip"]["mean"] == pytest.approx(
        lra.compare(rows, lra.PRIMARY)["tests"]["clip-higher - clip"]["mean"]
    )
    result = {**lra.compare(rows, lra.FALLBACK), "secondary": more}
    text = lra.comparison_markdown(result)
    assert "**A comparison counts here: yes**" in text
    for name, answer in result["answers"].items():
        assert f"| {name} | " in text and f" | {answer} |" in text
    assert "within +-3 points (two one-sided tests)" in text and "| shuffled | 12 |" in text


COMPARISON_PAGE = "docs/experiments/learning-regime-comparison.md"


def test_the_comparison_page_and_the_home_page_state_the_committed_answers():
    """The comparison's first screen, the home page and the README give the numbers its ``analysis.json`` holds."""
    result_path = ROOT / "figures/experiments/learning_regime/comparison/analysis.json"
    a = json.loads(result_path.read_text())
    if "pending" in a["answers"].values():
        pytest.skip("the comparison is not complete")

    def cell(d):
        return f"{d['mean']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}]"

    page = " ".join((ROOT / COMPARISON_PAGE).read_text().split())
    first = page[: page.index("## The five questions")]
    tests, validity, eq = a["tests"], a["validity"], a["equivalence"]
    assert a["endpoint"] == lra.FALLBACK and "Endpoint: held-out Mean@8 at T = 1" in first
    assert f"atr-min - clip is {cell(tests[lra.EQUIVALENCE])} points" in first
    assert f"90% interval [{eq['low90']:+.1f}, {eq['high90']:+.1f}], p {eq['p']:.3f}" in first
    assert a["answers"][lra.EQUIVALENCE] == "within +-3 points" and "within +-3 points of clip" in first
    for name in lra.FAMILY:
        if name != lra.EQUIVALENCE:
            assert a["answers"][name] == "inconclusive" and cell(tests[name]) in first, name
    assert f"own SFT model ({cell(validity['reference_minus_sft'])})" in first
    assert f"control ({cell(validity['reference_minus_control'])})" in first
    budget = a["budget_reading"]["tests"][lra.EQUIVALENCE]
    assert f"atr-min - clip is {cell(budget)}, also within +-3 points" in first
    assert a["budget_reading"]["answers"][lra.EQUIVALENCE] == "within +-3 points"
    for other in ("docs/index.md", "README.md"):
        text = " ".join((ROOT / other).read_text().split())
        assert f"{cell(tests[lra.EQUIVALENCE])} points of held-out" in text, other
        assert f"+{cell(validity['reference_minus_control'])[1:]}" in text, other
