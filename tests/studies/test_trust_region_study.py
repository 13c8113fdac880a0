"""The trust-region study's page says what its committed data say: the pilot's numbers on
docs/experiments/trust-region.md are recomputed from ``figures/experiments/pilots/trust_region_pilot.json``, and the
pre-registration names the setting the pilot chose and runs the driver can run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PILOT = ROOT / "figures" / "experiments" / "pilots" / "trust_region_pilot.json"
PAGE = ROOT / "docs" / "experiments" / "trust-region.md"
PREREG = ROOT / "docs" / "experiments" / "trust-region-preregistration.md"


@pytest.fixture(scope="module")
def arms() -> dict[str, dict]:
    return {row["arm"]: row for row in json.loads(PILOT.read_text())["arms"]}


def test_the_pilot_numbers_on_the_page_are_the_files(arms):
    page = PAGE.read_text()
    rising = [r for r in arms.values() if r["reward_rises"]]
    best = max(rising, key=lambda r: r["acted_pct_mean"])
    flat = " ".join(page.split())
    assert f"Over {len(arms)} arms" in flat
    assert f"at most **{best['acted_pct_mean']:.1f}%**" in flat
    assert f"own setting it is {arms['iter2']['acted_pct_mean']:.2f}%" in flat
    collapsing = [r for r in arms.values() if r["acted_pct_mean"] > 2]
    assert collapsing and all(r["learning_rate"] == 1e-3 and not r["reward_rises"] for r in collapsing)
    worst = min(collapsing, key=lambda r: r["reward_last_fifth"])
    assert len(collapsing) == 1 and f"one arm above 2% ({worst['acted_pct_mean']:.1f}%" in flat
    assert f"({worst['reward_first_fifth']:.2f} -> {worst['reward_last_fifth']:.2f})" in flat
    low_sft = [r for r in arms.values() if r["sft_steps"] < 600]
    assert max(r["reward_last_fifth"] for r in low_sft) <= 0.06 and max(r["acted_pct_mean"] for r in low_sft) < 1.45
    assert not any(r["in_band"] for r in arms.values())  # "cannot be made to bind on 5% of tokens"


def test_the_preregistered_setting_is_the_pilots_choice_and_the_driver_knows_its_runs(arms):
    from experiments import cpu_table

    text = PREREG.read_text()
    chosen = arms["lr3e-4-spg16-iter2"]
    assert chosen["reward_rises"] and chosen["acted_pct_mean"] >= 1.0  # the pre-registered regime check
    assert "learning rate **3e-4**, `num_iterations` **2**, `steps_per_generation` **16**" in text
    commands = [line for line in text.splitlines() if line.startswith("python -m experiments.cpu_table")]
    assert len(commands) == 5
    for line in commands:
        runs = re.search(r"--runs (.*?) --seeds", line).group(1).split()
        assert set(runs) <= set(cpu_table.CPU_RUNS), runs


def test_the_landed_parts_on_the_page_are_the_table():
    import csv

    table = ROOT / "figures" / "experiments" / "trust_region" / "table" / "cpu_llm_table.csv"
    with table.open() as f:
        rows = [r for r in csv.DictReader(f) if r["benchmark"] == "steps-test-T1"]
    clip = sorted((int(r["seed"]), float(r["acted_frac_masked"])) for r in rows if r["method"] == "clip")
    flat = " ".join(PAGE.read_text().split())
    low, high = min(frac for _, frac in clip), max(frac for _, frac in clip)
    assert f"gradient of between {100 * low:.1f}% and {100 * high:.1f}% of tokens" in flat
    assert low >= 0.01  # the pre-registered regime check, per run so far
    seeds = [seed for seed, _ in clip]
    assert seeds == list(range(200, max(seeds) + 1)) and f"on seeds 200-{max(seeds)}" in flat


ANALYSIS = ROOT / "figures" / "experiments" / "trust_region" / "analysis.json"
TABLE = ROOT / "figures" / "experiments" / "trust_region" / "table" / "cpu_llm_table.csv"


def test_the_committed_analysis_is_what_the_table_gives_now():
    from experiments import trust_region_analysis as tra

    again = tra.analyse(tra.read_table(TABLE), TABLE.with_name("cpu_llm_curves.csv"))
    assert json.loads(json.dumps(again)) == json.loads(ANALYSIS.read_text())  # same code, same table: same floats


def test_the_primary_test_is_scipys_paired_t_and_statsmodels_holm_on_the_raw_table():
    """An oracle we did not write: scipy's ttest_rel on the table's Mean@8 of atr and clip per seed, statsmodels'
    Holm over the two temperatures."""
    import csv

    from scipy import stats
    from statsmodels.stats.multitest import multipletests

    with TABLE.open() as f:
        rows = list(csv.DictReader(f))
    result = json.loads(ANALYSIS.read_text())["primary"]
    ps = []
    for t, bench in (("T0.3", "steps-test-T0.3"), ("T1", "steps-test-T1")):
        by = {(r["method"], int(r["seed"])): float(r["mean_at_8"]) for r in rows if r["benchmark"] == bench}
        seeds = [s for s in range(200, 210) if ("atr", s) in by and ("clip", s) in by]
        atr, clip = [by[("atr", s)] for s in seeds], [by[("clip", s)] for s in seeds]
        test = stats.ttest_rel(atr, clip)
        ci = test.confidence_interval(0.95)
        assert result[t]["n"] == len(seeds) == 10
        assert result[t]["p"] == pytest.approx(test.pvalue, rel=1e-9)
        assert (result[t]["low"], result[t]["high"]) == pytest.approx((ci.low, ci.high), rel=1e-9)
        ps.append(test.pvalue)
    holm = multipletests(ps, method="holm")[1]
    assert [result["T0.3"]["p_holm"], result["T1"]["p_holm"]] == pytest.approx(list(holm), rel=1e-9)


def test_the_answer_rule_is_the_preregistered_one():
    from experiments.trust_region_analysis import verdict

    d = {"mean": -1.0, "low": -2.5, "high": 0.5, "n": 10}
    assert verdict(d, 0.2, 10) == "no difference as large as 3 points"
    assert verdict({**d, "low": -3.5}, 0.2, 10) == "inconclusive at this n"
    assert verdict({**d, "mean": -5.0, "low": -8.0, "high": -2.0}, 0.01, 10) == "atr worse than clip"
    assert verdict({**d, "mean": 5.0, "low": 2.0, "high": 8.0}, 0.049, 10) == "atr better than clip"
    assert verdict({**d, "mean": 5.0, "low": 2.0, "high": 8.0}, 0.051, 10) == "inconclusive at this n"
    assert verdict({**d, "n": 9}, 0.01, 10).startswith("pending: 9 of 10")
    assert verdict(None, None, 10).startswith("pending: 0 of 10")


def test_the_page_states_the_analysis_numbers():
    a = json.loads(ANALYSIS.read_text())
    flat = " ".join(PAGE.read_text().split())
    first_screen = flat[: flat.index("## The pilot's lesson")]
    for t, label in (("T0.3", "T = 0.3"), ("T1", "T = 1")):
        d = a["primary"][t]
        assert d["answer"] == "atr worse than clip"
        assert f"{d['mean']:.1f}" in first_screen and f"{d['low']:.1f}, {d['high']:.1f}]" in first_screen, label
    p_holm = [a["primary"][t]["p_holm"] for t in ("T0.3", "T1")]
    assert f"p = {p_holm[0]:.1e} and {p_holm[1]:.1e}".replace("e-09", "e-9") in first_screen
    described = a["described"]
    for rule in ("atr", "clip", "sft"):
        pair = f"{described[rule]['mean_at_8_T0.3']['mean']:.1f} / {described[rule]['mean_at_8_T1']['mean']:.1f}"
        assert pair in first_screen, rule
    reg = a["regime"]
    assert (
        reg["passes"]
        and f"{100 * reg['mean']:.2f}% of tokens on average ({100 * reg['min']:.2f}-{100 * reg['max']:.2f}%"
        in first_screen
    )
    atr = described["atr"]["acted_frac_masked"]
    assert f"ATR acted on {100 * atr['mean']:.1f}% ({100 * atr['min']:.1f}-{100 * atr['max']:.1f}%)" in first_screen
    curves = a["reward_curves"]
    assert f"from {curves['atr']['10']:.3f} at step 10 to {curves['atr']['40']:.3f} by step 40" in first_screen
    assert f"({curves['atr']['390']:.3f} at step 390)" in first_screen
    assert f"clip's rose from {curves['clip']['10']:.3f} to {curves['clip']['390']:.3f}" in first_screen
    p05 = described["atr"]["acted_ratio_p05"]["mean"], described["clip"]["acted_ratio_p05"]["mean"]
    assert f"{p05[0]:.2f}, against clip's {p05[1]:.2f}" in first_screen
    e = a["entropy"]
    assert (
        f"+{e['mean']:.2f} nats [{e['low']:.2f}, {e['high']:.2f}]" in first_screen
        and f"p = {e['p']:.1e}".replace("e-04", "e-4") in first_screen
    )
    ent = described["atr"]["acted_entropy_last_fifth"]["mean"], described["clip"]["acted_entropy_last_fifth"]["mean"]
    assert f"{ent[0]:.2f} against {ent[1]:.2f}" in first_screen


def test_the_readme_quotes_the_primary_result_and_the_regime():
    a = json.loads(ANALYSIS.read_text())
    readme = " ".join((ROOT / "README.md").read_text().split())
    t03, t1 = a["primary"]["T0.3"], a["primary"]["T1"]
    assert f"{t03['mean']:.1f} points [{t03['low']:.1f}, {t03['high']:.1f}] at T = 0.3" in readme
    assert f"{t1['mean']:.1f} [{t1['low']:.1f}, {t1['high']:.1f}] at T = 1 over ten paired seeds" in readme
    assert f"clip acting on {100 * a['regime']['mean']:.1f}% of tokens" in readme


def test_the_page_states_the_secondary_numbers():
    a = json.loads(ANALYSIS.read_text())
    flat = " ".join(PAGE.read_text().split())
    first_screen = flat[: flat.index("## The pilot's lesson")]
    assert a["secondary"]["complete"] and "family of twelve is incomplete" not in first_screen
    common = a["mean_at_8_on_seeds_200_204"]
    for rule in ("atr-min", "atr", "clip", "atr-seq", "reinforce-tis"):
        assert f"{common[rule]['T0.3']:.1f} / {common[rule]['T1']:.1f}" in first_screen, rule
    tests = a["secondary"]["tests"]

    def interval(d):
        return f"{d['mean']:.1f} [{d['low']:.1f}, {d['high']:+.1f}]"

    for rule in ("atr-seq", "dppo-kl", "cispo", "clip-higher", "reinforce-tis"):
        t03, t1 = tests[rule]["T0.3"], tests[rule]["T1"]
        assert f"{interval(t03)} / {interval(t1)}" in first_screen, rule
    m = tests["atr-min"]
    assert f"`atr-min - clip` is {interval(m['T0.3'])} at T = 0.3 and {interval(m['T1'])} at T = 1" in first_screen
    assert f"(Holm p = {m['T0.3']['p_holm']:.2g} and {m['T1']['p_holm']:.2g})" in first_screen
    assert m["T0.3"]["p_holm"] > 0.05 and m["T1"]["p_holm"] > 0.05  # "not distinguished from zero"
    for rule in ("atr-seq", "dppo-kl", "cispo", "reinforce-tis"):  # the rules the page reads as worse than clip
        assert all(tests[rule][t]["p_holm"] < 0.01 and tests[rule][t]["high"] < 0 for t in ("T0.3", "T1")), rule
    assert all(tests["clip-higher"][t]["p_holm"] > 0.05 for t in ("T0.3", "T1"))
    dppo, clip = a["described"]["dppo-kl"], a["described"]["clip"]
    assert f"as many tokens as clip ({100 * dppo['acted_frac_masked']['mean']:.2f}%)" in first_screen
    assert (
        f"(5th percentile {dppo['acted_ratio_p05']['mean']:.2f} against {clip['acted_ratio_p05']['mean']:.2f})"
        in first_screen
    )
