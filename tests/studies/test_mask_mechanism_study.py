"""The mask-mechanism study (docs/experiments/mask-mechanism-preregistration.md): pre-registered before its outputs,
and its commands name the driver's runs with the reuse depths its table gives."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from preregistration import assert_preregistered_before

pytest.importorskip("trl")

from experiments import cpu_table  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PREREG = "docs/experiments/mask-mechanism-preregistration.md"
OUTPUTS = ("figures/paper/contextual_bandit.json", "figures/experiments/mask_mechanism")


def test_the_preregistration_was_committed_before_any_output_of_the_study():
    assert_preregistered_before(PREREG, OUTPUTS)


def test_the_dose_response_commands_are_the_depths_of_the_table():
    text = (ROOT / PREREG).read_text()
    table = {int(d): (int(s), int(n)) for d, s, n in re.findall(r"^\| (\d+) \| (\d+) \| (\d+) \|", text, re.M)}
    assert sorted(table) == [1, 4, 8, 16, 32] and all(s * n == d for d, (s, n) in table.items())
    commands = [
        line for line in text.splitlines() if line.startswith("python -m experiments.cpu_table --runs clip clip")
    ]
    assert len(commands) == 5
    for line in commands:
        runs = re.search(r"--runs (.*?) \$S", line).group(1).split()
        assert set(runs) == {"clip", "clip-mask"} and set(runs) <= set(cpu_table.CPU_RUNS)
        s, n = (
            int(re.search(rf"--{flag} (\d+)", line).group(1)) for flag in ("steps-per-generation", "num-iterations")
        )
        depth = int(re.search(r"/D(\d+)$", line).group(1))
        assert table[depth] == (s, n), line


def test_by_step_reads_every_logged_row_of_the_study_runs_only(tmp_path):
    from experiments import mask_mechanism_analysis as mma

    history = [{"step": 10, "reward": 0.5, "clip/frac_outside_against_advantage": 0.1}, {"train_runtime": 1.0}]
    for name in ("clip-s7", "clip-mask-s7", "atr-s7", "sft-s7"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "log_history.json").write_text(json.dumps(history))
    rows = mma.by_step({4: tmp_path})
    assert sorted((r["run"], r["seed"], r["step"]) for r in rows) == [("clip", 7, 10), ("clip-mask", 7, 10)]
    assert all(r["reward"] == 0.5 and r["clip/frac_outside_against_advantage"] == 0.1 for r in rows)
    assert all(r["true_kl/mean"] is None and r["depth"] == 4 for r in rows)


def test_the_committed_by_step_file_ends_where_each_depths_table_says():
    """figures/experiments/mask_mechanism/by_step.csv (python -m experiments.mask_mechanism_analysis): for every run
    of every depth with a table, the last logged reward is the table's ``train_reward_last``."""
    import csv

    out = ROOT / "figures" / "experiments" / "mask_mechanism"
    rows = list(csv.DictReader((out / "by_step.csv").open()))
    tables = sorted(out.glob("D*/cpu_llm_table.csv"))
    assert tables
    for table in tables:
        depth = table.parent.name[1:]
        for r in csv.DictReader(table.open()):
            if r["method"] not in ("clip", "clip-mask"):
                continue
            logged = [
                x for x in rows if (x["depth"], x["run"], x["seed"]) == (depth, r["method"], r["seed"]) and x["reward"]
            ]
            assert logged, (depth, r["method"], r["seed"])
            assert float(logged[-1]["reward"]) == float(r["train_reward_last"])


def test_the_collapse_and_the_rise_are_the_first_steps_past_their_preregistered_thresholds():
    from experiments import mask_mechanism_analysis as mma

    # r*: below half the mean of the first two rewards (0.5, 0.25 -> 0.1875, exact in binary); 0.1875 is not below
    assert mma.first_collapse([(10, 0.5), (20, 0.25), (30, 0.1875), (40, 0.187), (50, 0.01)]) == 40
    assert mma.first_collapse([(10, 0.4), (20, 0.4), (30, 0.21)]) is None
    assert mma.first_collapse([(10, 0.4)]) is None
    # a*: at least 0.01 and at least twice the median of the first three (0.002, 0.004, 0.006 -> 0.008 -> 0.01)
    assert mma.first_rise([(10, 0.002), (20, 0.006), (30, 0.004), (40, 0.0099), (50, 0.01)]) == 50
    # ... and twice the median where that is above the floor (0.0625 x 2 = 0.125)
    assert mma.first_rise([(10, 0.0625), (20, 0.0625), (30, 0.0), (40, 0.124), (50, 0.125)]) == 50
    # a high start: twice its median (0.05 -> 0.1) is never reached, whatever the floor
    assert mma.first_rise([(10, 0.05), (20, 0.07), (30, 0.05), (40, 0.09)]) is None
    # the first rows count too: a first row above the floor and twice the median is a* at once
    assert mma.first_rise([(10, 0.03), (20, 0.001), (30, 0.001)]) == 10
    # ... unless a* is read as a rise after the three rows that set its start
    assert mma.first_rise([(10, 0.03), (20, 0.001), (30, 0.001)], after_start=True) is None
    assert mma.first_rise([(10, 0.03), (20, 0.001), (30, 0.001), (40, 0.002), (50, 0.011)], after_start=True) == 50


def _rows(depth, run, seed, rewards, fractions):
    keys = dict.fromkeys(__import__("experiments.mask_mechanism_analysis", fromlist=["KEYS"]).KEYS)
    out = []
    for i, (r, f) in enumerate(zip(rewards, fractions)):
        out.append(
            {"depth": depth, "run": run, "seed": seed, "step": 10 * (i + 1)}
            | keys
            | {"reward": r, "clip/frac_outside_against_advantage": f}
        )
    return out


def test_timing_counts_each_collapsing_mask_run_once_by_where_a_star_falls():
    from experiments import mask_mechanism_analysis as mma

    rows = (
        _rows(8, "clip-mask", 1, [0.4, 0.4, 0.4, 0.1], [0.001, 0.001, 0.001, 0.05])  # a* = r* = 40
        + _rows(8, "clip-mask", 2, [0.4, 0.4, 0.3, 0.1], [0.001, 0.001, 0.001, 0.05])  # same
        + _rows(8, "clip-mask", 3, [0.4, 0.4, 0.1, 0.1], [0.001, 0.001, 0.001, 0.05])  # r* 30 < a* 40: after
        + _rows(16, "clip-mask", 1, [0.4, 0.4, 0.4, 0.1], [0.001, 0.001, 0.05, 0.05])  # a* 30 < r* 40: before
        + _rows(16, "clip-mask", 2, [0.4, 0.4, 0.1, 0.1], [0.05, 0.05, 0.05, 0.05])  # a* never
        + _rows(16, "clip-mask", 3, [0.4, 0.4, 0.4, 0.4], [0.001, 0.001, 0.001, 0.05])  # no collapse: not counted
        + _rows(16, "clip", 1, [0.4, 0.4, 0.1, 0.1], [0.001, 0.001, 0.001, 0.05])  # min form: not counted
    )
    t = mma.timing(rows)
    assert t["counts"] == {"before": 1, "same": 2, "after": 1, "never": 1}
    assert (t["collapsing_mask_runs"], t["mask_runs"], t["collapsing_min_runs"]) == (5, 6, 1)
    assert t["answer"] == "mixed: see counts"
    assert mma.timing(_rows(4, "clip-mask", 1, [0.4, 0.4, 0.4, 0.1], [0.001, 0.001, 0.05, 0.05]))["answer"] == "yes"


def test_the_forms_part_at_the_smallest_depth_whose_interval_is_above_zero():
    from experiments import mask_mechanism_analysis as mma

    def gap(low):
        return {"mean": low + 1, "low": low, "high": low + 2}

    assert mma.where_forms_part({"D1": gap(-1), "D4": gap(0.5), "D8": gap(1), "D32": gap(3)}) == {
        "depth": 4, "parted": [4, 8, 32], "ordered": True, "depths": [1, 4, 8, 32]
    }  # fmt: skip
    unordered = mma.where_forms_part({"D1": gap(-1), "D4": gap(0.5), "D8": gap(-0.5), "D32": gap(3)})
    assert unordered["depth"] == 4 and not unordered["ordered"]
    assert mma.where_forms_part({"D1": None, "D4": gap(0.0)})["depth"] is None  # an interval touching 0 is not above


OUT = ROOT / "figures" / "experiments" / "mask_mechanism"


def test_the_form_gaps_are_scipys_paired_t_intervals_of_the_committed_tables():
    import numpy as np
    from scipy import stats

    a = json.loads((OUT / "analysis.json").read_text())
    tables = sorted(OUT.glob("D*/cpu_llm_table.csv"))
    assert sorted(int(t.parent.name[1:]) for t in tables) == a["depths_run"]
    import csv

    for table in tables:
        rows = list(csv.DictReader(table.open()))
        for t, bench in (("T0.3", "steps-test-T0.3"), ("T1", "steps-test-T1")):
            value = {(r["method"], int(r["seed"])): float(r["mean_at_8"]) for r in rows if r["benchmark"] == bench}
            d = np.array([value["clip", s] - value["clip-mask", s] for s in (200, 201, 202)])
            gap = a["form_gap"][t][table.parent.name]
            assert gap["n"] == 3 and gap["mean"] == pytest.approx(d.mean())
            if d.std() == 0:
                assert gap["low"] == gap["high"] == pytest.approx(d.mean())
                continue
            low, high = stats.t.interval(0.95, 2, loc=d.mean(), scale=stats.sem(d))
            assert (gap["low"], gap["high"]) == pytest.approx((low, high))


def test_the_committed_analysis_is_what_the_code_computes_from_the_committed_files(tmp_path):
    from experiments import mask_mechanism_analysis as mma

    committed = json.loads((OUT / "analysis.json").read_text())
    fresh = mma.analyse(mma.read_tables(OUT), mma.read_by_step(OUT / "by_step.csv"))
    assert json.loads(json.dumps(fresh)) == committed
    assert (OUT / "analysis.md").read_text() == mma.markdown(committed)
    assert committed["depth_one_check"] == {
        "seeds": [200, 201, 202],
        "logged_rows_identical": True,
        "mean_at_8_identical": True,
    }
    import csv

    dose = list(csv.DictReader((OUT / "dose_response.csv").open()))
    assert len(dose) == 2 * 3 * len(committed["depths_run"])
    assert {"acted_frac_outside_against_advantage", "acted_frac_outside_with_advantage"} <= set(dose[0])


def test_the_depth_32_check_counts_rows_equal_bit_for_bit_to_an_earlier_table(tmp_path):
    import csv

    from experiments import mask_mechanism_analysis as mma

    cols = ["method", "seed", "benchmark", "sft_model", "sft_machine", "mean_at_8", "train_reward_last"]
    now = [
        {
            "method": "clip",
            "seed": 200,
            "benchmark": "b",
            "sft_model": "m",
            "sft_machine": "x",
            "mean_at_8": 61.812,
            "train_reward_last": 0.375,
        },
        {
            "method": "clip",
            "seed": 201,
            "benchmark": "b",
            "sft_model": "m",
            "sft_machine": "x",
            "mean_at_8": 67.812,
            "train_reward_last": 0.4,
        },
        {
            "method": "atr",
            "seed": 200,
            "benchmark": "b",
            "sft_model": "m",
            "sft_machine": "x",
            "mean_at_8": 1.0,
            "train_reward_last": 0.1,
        },
    ]
    then = [dict(now[0]), dict(now[1], mean_at_8=67.813, sft_model="other"), dict(now[2])]
    path = tmp_path / "t.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=cols)
        writer.writeheader()
        writer.writerows(then)
    got = mma.depth_32_check({32: now}, {"earlier": path})["earlier"]
    assert (got["rows"], got["same_sft_model"], got["same_mean_at_8"], got["same_train_reward_last"]) == (2, 1, 1, 2)
    assert got["runs"] == ["clip-s200", "clip-s201"]  # atr is not a run of this study
    assert mma.depth_32_check({4: now}) is None


MECHANISM_PAGE = ROOT / "docs" / "experiments" / "mask-mechanism.md"


def mechanism_numbers(a: dict, bandit: dict) -> dict[str, str]:
    """What the mechanism page's first screen states, formatted from analysis.json and contextual_bandit.json."""

    def ci(d):
        return f"{d['mean']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}]"

    gaps, part = a["form_gap"]["T0.3"], a["forms_part"]["T0.3"]
    out = {"DEPTH_ONE": "identical bit for bit" if a["depth_one_check"]["logged_rows_identical"] else "NOT IDENTICAL"}
    assert a["depth_one_check"]["mean_at_8_identical"]
    out["GAPS"] = ", ".join(f"{ci(gaps[f'D{d}'])} at D = {d}" for d in a["depths_run"] if d != 1)
    out["PART"] = f"the smallest D whose interval lies above 0 is D = {part['depth']}"
    out["ORDERED"] = (
        "but the intervals are not ordered in D" if not part["ordered"] else "and the intervals are ordered"
    )
    t, c = a["timing"], a["timing"]["counts"]
    out["TIMING"] = (
        f"{t['collapsing_mask_runs']} of {t['mask_runs']} mask-form runs collapse (none of the min form's): `a*` comes before "
        f"`r*` in {c['before']}, in the same row in {c['same']}, after it in {c['after']}, and never in {c['never']}"
    )
    assert t["collapsing_min_runs"] == 0 and t["answer"] == "mixed: see counts"
    strict = a["timing_a_star_after_its_start_rows"]
    assert strict["answer"] == "no" and strict["counts"]["never"] == strict["collapsing_mask_runs"]
    out["STRICT"] = f"in 0 of {strict['collapsing_mask_runs']} runs before `r*`, and the answer is *no*"
    before = [x for x in t["runs"] if x["r_star"] and x["a_star"] and x["a_star"] < x["r_star"]]
    assert {x["depth"] for x in before} == {8} and all(x["a_star"] == 10 for x in before)  # "the first logged row"
    first = a["first_rows"]
    out["FIRST"] = ", ".join(
        f"{first[f'D{d}']['mask']['first_row_mean']:.2%} against {first[f'D{d}']['min']['first_row_mean']:.2%} at D = {d}"
        for d in a["depths_run"]
        if d != 1
    )
    d32 = first["D32"]
    out["PEAK"] = f"from {d32['mask']['first_row_mean']:.2%} to a peak of {d32['mask']['first_batch_peak']:.2%}"
    out["PEAK_MIN"] = f"the min form's peak: {d32['min']['first_batch_peak']:.2%}"
    sft, desc = a["sft"], a["described"]
    assert sft["same_at_every_depth"]
    out["SFT_START"] = f"an SFT model at {sft['mean_at_8_T0.3']:.1f} / {sft['mean_at_8_T1']:.1f}"
    lo, hi = a["depths_run"][0], a["depths_run"][-1]
    out["ENDS"] = (
        f"the min form ends higher ({desc[f'D{lo}']['min']['mean_at_8_T0.3']:.1f} at D = {lo}, "
        f"{desc[f'D{hi}']['min']['mean_at_8_T0.3']:.1f} at D = {hi}) and the mask form lower "
        f"({desc[f'D{lo}']['mask']['mean_at_8_T0.3']:.1f} at D = {lo}, {desc[f'D{hi}']['mask']['mean_at_8_T0.3']:.1f} at D = {hi})"
    )
    out["KL_AGAINST"] = ", ".join(
        f"{desc[f'D{d}']['mask']['acted_true_kl_mean_against_advantage']:.3g} against "
        f"{desc[f'D{d}']['min']['acted_true_kl_mean_against_advantage']:.3g} at D = {d}"
        for d in a["depths_run"]
        if d != 1
    )
    cells = bandit["cells"]
    by = {(str(c["sharing"]), c["step_size"], c["inner_steps"], c["rule"], c["form"]): c for c in cells}
    shared = [k for k in by if k[0] != "one-hot"]
    assert (
        sum(c["collapsed_seeds"] for c in cells) == 0
        and not bandit["answer"]["shared_parameters_alone_collapse_the_mask_form"]
    )
    out["BANDIT"] = f"0 of {len(shared)} shared cells x {cells[0]['seeds']} seeds"
    deficit = max(by[k[:4] + ("min",)]["change_mean"] - by[k]["change_mean"] for k in shared if k[4] == "mask")
    out["DEFICIT"] = f"the mask form ends at most {deficit:.4f} below the min form"
    out["CONTROL"] = f"coincide bit for bit in {bandit['answer']['one_hot_control_cells_identical']} cells"
    tr = a["depth_32_check"]["trust_region"]
    assert tr["same_sft_model"] == tr["same_mean_at_8"] == tr["same_train_reward_last"] == tr["rows"]
    out["CHECK32"] = f"{tr['same_mean_at_8']} of {tr['rows']} rows"
    return out


def test_the_mechanism_page_states_the_analysis_numbers_on_its_first_screen():
    a = json.loads((OUT / "analysis.json").read_text())
    bandit = json.loads((ROOT / "figures" / "paper" / "contextual_bandit.json").read_text())
    flat = " ".join(MECHANISM_PAGE.read_text().split())
    first_screen = flat[: flat.index("![")]  # the answer, before the figure
    for key, text in mechanism_numbers(a, bandit).items():
        assert text in first_screen, (key, text)
        assert not re.search(rf"\b{key}\b", flat), f"placeholder {key} left on the page"


def test_the_readme_quotes_the_form_gaps_at_four_and_thirty_two_steps_per_batch():
    a = json.loads((OUT / "analysis.json").read_text())
    readme = " ".join((ROOT / "README.md").read_text().split())

    def ci(d):
        return f"{d['mean']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}]"

    gaps = a["form_gap"]["T0.3"]
    assert a["forms_part"]["T0.3"]["depth"] == 4
    assert f"{ci(gaps['D4'])} at 4 steps per batch, {ci(gaps['D32'])} at 32" in readme


def test_the_mechanism_pages_claims_about_single_runs_hold_in_the_committed_rows():
    """The prose claims the page makes run by run: every GRPO run ends below its seed's SFT model at T = 0.3; at
    D = 4 and 8 the mask form's first-row reward is already below the min form's; at D = 32 seed 202 misses r* at
    step 40 by 0.0005; at D = 4 the mask form's first-row reward is 0.73 to 0.81 of the min form's."""
    import csv

    from experiments import mask_mechanism_analysis as mma

    page = " ".join(MECHANISM_PAGE.read_text().split())
    for table in sorted(OUT.glob("D*/cpu_llm_table.csv")):
        rows = [r for r in csv.DictReader(table.open()) if r["benchmark"] == "steps-test-T0.3"]
        sft = {r["seed"]: float(r["mean_at_8"]) for r in rows if r["method"] == "sft"}
        assert all(float(r["mean_at_8"]) < sft[r["seed"]] for r in rows if r["method"] != "sft"), table
    steps = mma.read_by_step(OUT / "by_step.csv")

    def first_reward(depth, run, seed):
        return mma.series(steps, depth, run, seed, "reward")[0][1]

    for depth in (4, 8):
        assert all(first_reward(depth, "clip-mask", s) < first_reward(depth, "clip", s) for s in (200, 201, 202))
    ratios = [first_reward(4, "clip-mask", s) / first_reward(4, "clip", s) for s in (200, 201, 202)]
    assert f"{min(ratios):.2f} to {max(ratios):.2f} of the min form's" in page
    rewards = mma.series(steps, 32, "clip-mask", 202, "reward")
    floor = mma.REWARD_FALL * (rewards[0][1] + rewards[1][1]) / 2
    assert rewards[1][0] == 40 and f"by {rewards[1][1] - floor:.4f} ({rewards[1][1]:.4f} against {floor:.4f})" in page
