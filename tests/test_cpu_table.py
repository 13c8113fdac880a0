"""The CPU analog of Tables 2-3 (experiments.cpu_table): every run parses, the statistics match scipy, --quick runs."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("trl")
pytest.importorskip("math_verify")

import torch  # noqa: E402

from atr_llm import train
from atr_llm.data import OFFLINE_TASKS, arithmetic_dataset, is_held_out  # noqa: E402
from experiments import cpu_table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("run", sorted(cpu_table.CPU_RUNS))
def test_every_run_parses_into_its_method_and_parameters(run):
    argv = ["--config", str(cpu_table.BASE_CONFIG), "--output_dir", "/tmp/unused", "--tiny", "true"]
    argv += cpu_table.run_args(run)  # the driver gives each run its seed's SFT model; the tiny one stands in here
    args = train.parse(argv).training
    spec = cpu_table.CPU_RUNS[run]
    method = args.resolved_method
    assert method.name == spec["method"]
    assert method.form == spec.get("form", method.spec.default_form)
    assert {k: v for k, v in method.params.items() if k in spec} == {
        k: v for k, v in spec.items() if k not in ("method", "form")
    }
    assert set(spec) - {"method", "form"} <= set(method.params)  # no parameter of the run is dropped


def test_train_and_test_splits_never_share_a_problem():
    spec = {k: v for k, v in OFFLINE_TASKS[cpu_table.TASK].items() if k != "split"}
    train_rows = {r["problem"] for s in range(3) for r in arithmetic_dataset(2000, seed=s, split="train", **spec)}
    test_rows = {r["problem"] for r in arithmetic_dataset(200, seed=12345, split="test", **spec)}
    assert train_rows and test_rows and not train_rows & test_rows
    assert all(is_held_out(p) for p in test_rows) and not any(is_held_out(p) for p in train_rows)


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


@pytest.mark.slow
def test_masked_fraction_is_a_dash_only_for_runs_that_mask_nothing_by_construction():
    row = {"mean_at_8": 50.0, "pass_at_8": 80.0, "best_mean_at_8": 55.0, "frac_masked_mean": 0.0}
    rows = [{**row, "method": m, "seed": 0} for m in ("sft", "sapo", "clip", "atr")]
    rows[2]["frac_masked_mean"] = 0.0011
    cells = {
        line.split("|")[1].strip(): line.split("|")[-2].strip()
        for line in cpu_table.markdown_table(rows, ["sapo", "clip", "atr"], 8).splitlines()[2:]
        if line.startswith("|")  # the table's lines, not its legend
    }
    assert cells == {"sft": "-", "sapo": "-", "clip": "0.11%", "atr": "0.00%"}  # atr masked none here: a measured 0
    # soft rules weight tokens instead of masking them (cispo, and reinforce-tis = cispo with no lower bound)
    assert [r for r in cpu_table.CPU_RUNS if not cpu_table.masks_tokens(r)] == ["sapo", "cispo", "reinforce-tis"]


@pytest.mark.slow
def test_quick_table_runs_end_to_end_and_writes_every_output(tmp_path):
    cpu_table.main(["--quick", "--runs-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "fig")])
    with (tmp_path / "fig" / "cpu_llm_table.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {(r["method"], r["seed"]) for r in rows} == {("sft", "0"), ("clip", "0"), ("atr", "0")}
    assert sorted(r["benchmark"] for r in rows) == sorted(list(cpu_table.BENCHMARKS) * 3)  # one row per sampling
    for key in ("method", "seed", "benchmark", "mean_at_8", "pass_at_8", "best_mean_at_8"):
        assert all(r[key] != "" for r in rows)
    assert all(0 <= float(r["mean_at_8"]) <= float(r["pass_at_8"]) <= 100 for r in rows)
    assert all(r["problems"] == "16" for r in rows)
    summary = json.loads((tmp_path / "fig" / "cpu_llm_table.json").read_text())
    assert summary["settings"]["runs"] == ["clip", "atr"] and "torch" in summary["versions"]
    assert (tmp_path / "fig" / "cpu_llm_curves.png").stat().st_size > 0
    md = (tmp_path / "fig" / "cpu_llm_table.md").read_text()
    assert all(f"### {b} " in md for b in cpu_table.BENCHMARKS)
    with (tmp_path / "fig" / "cpu_llm_curves.csv").open() as f:
        logged = [point["method"] for point in csv.DictReader(f)]
    # a 4-step run lies within its last 100 steps: every logged point is in its tail
    assert [(t["method"], t["points"]) for t in summary["curve_tails"]["rows"]] == [
        ("atr", logged.count("atr")),
        ("clip", logged.count("clip")),
    ]
    # each Mean@8 table labels atr by the form it trained; the curves' table by name only
    assert "### Where the runs end" in md and md.count("| atr | mask | 1 |") == len(cpu_table.BENCHMARKS)
    assert md.count("| atr | 1 |") == 1 and md.count("| clip | min | 1 |") == len(cpu_table.BENCHMARKS)
    again = cpu_table.main(["--quick", "--runs-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "fig2")])
    sft_model = cpu_table.weights_id(tmp_path / "runs" / "sft-s0")
    assert {r["sft_model"] for r in summary["rows"]} == {sft_model} and all(r["invocation"] for r in summary["rows"])
    recorded = json.loads((tmp_path / "runs" / "sft-s0" / cpu_table.MACHINE_FILE).read_text())["machine"]
    assert recorded == cpu_table.machine_kind() and f"torch {torch.__version__}" in recorded
    assert {r["sft_machine"] for r in summary["rows"]} == {recorded}  # every row: the machine its SFT model came from

    def without_invocation(rows):
        return [{k: v for k, v in r.items() if k != "invocation"} for r in rows]

    # finished runs are read back, not trained again (only the invocation's time stamp differs)
    assert without_invocation(again["rows"]) == without_invocation(summary["rows"])

    # --rewrite writes the same table from the table alone (its runs gone), keeping the training's versions
    fig = tmp_path / "fig"
    files = {name: (fig / name).read_text() for name in ("cpu_llm_table.csv", "cpu_llm_table.md", "cpu_llm_curves.csv")}
    (fig / "cpu_llm_table.md").unlink()
    summary["versions"]["torch"] = "the training's torch"
    (fig / "cpu_llm_table.json").write_text(json.dumps(summary))
    with pytest.raises(ValueError, match=r"--runs"):  # nothing of a training run is taken silently
        cpu_table.main(["--rewrite", "--runs", "clip", "--out", str(fig)])
    with pytest.raises(ValueError, match="--rewrite without --out"):
        cpu_table.main(["--rewrite"])
    rewritten = cpu_table.main(["--rewrite", f"--out={fig}"])
    assert {name: (fig / name).read_text() for name in files} == files
    assert rewritten["rows"] == summary["rows"] and rewritten["versions"]["torch"] == "the training's torch"
    assert rewritten["settings"] == summary["settings"]


@pytest.mark.slow
def test_a_checkpoint_holds_the_shorter_runs_weights_and_at_step_writes_that_runs_table(tmp_path):
    """--at-step S reads a longer run's checkpoint at S as the S-step run: true only if nothing of the first S steps
    depends on max_steps (the learning-rate schedule above all), so train both and compare weights and rows. (On the
    real protocol, clip seed 0's 250-step run and its 1,000-step run's checkpoint-250 agreed in weights, held-out
    numbers and all 25 logged points.)"""
    import shutil

    long_runs, short_runs = tmp_path / "long", tmp_path / "short"
    quick = ["--quick", "--runs", "clip"]
    with pytest.raises(ValueError, match="--at-step 3: the runs save checkpoints every 2 steps up to 4"):
        cpu_table.main([*quick, "--at-step", "3", "--runs-dir", str(long_runs)])  # refused before any training
    assert not (long_runs / "sft-s0").exists()
    long = cpu_table.main([*quick, "--runs-dir", str(long_runs), "--out", str(tmp_path / "long_table")])
    assert long["settings"]["max_steps"] == 4
    shutil.copytree(long_runs / "sft-s0", short_runs / "sft-s0")  # the same SFT model, not trained again
    short = cpu_table.main([*quick, "--max-steps", "2", "--runs-dir", str(short_runs), "--out", str(tmp_path / "s")])
    two_step_weights = cpu_table.weights_id(short_runs / "clip-s0" / "final")
    assert two_step_weights == cpu_table.weights_id(long_runs / "clip-s0" / "checkpoint-2")
    assert two_step_weights != cpu_table.weights_id(long_runs / "clip-s0" / "final")  # the run went on
    at = cpu_table.main([*quick, "--at-step", "2", "--runs-dir", str(long_runs), "--out", str(tmp_path / "at")])

    def evaluations(rows):  # the rows without the invocation and the values of the last logged training step
        curve_fields = {"invocation", "train_reward_last", "entropy_last", "length_last", "frac_masked_mean"}
        return [{k: v for k, v in r.items() if k not in curve_fields and not k.startswith("acted_")} for r in rows]

    assert at["settings"]["max_steps"] == 2 and evaluations(at["rows"]) == evaluations(short["rows"])
    assert not any(k.startswith("acted_") for r in at["rows"] for k in r)  # the longer run's summary is not S steps
    # the curves agree point for point: a run logs its last step even off the logging interval (10 steps in
    # cpu-table.yaml), and the longer run logged step 2 too, because it saved a checkpoint there
    # (atr_llm.checkpoints.LogAtEveryCheckpoint; before it, the longer run's curve lacked that point)
    with (tmp_path / "s" / "cpu_llm_curves.csv").open() as f:
        short_curve = list(csv.DictReader(f))
    with (tmp_path / "at" / "cpu_llm_curves.csv").open() as f:
        at_curve = list(csv.DictReader(f))
    assert [p["step"] for p in short_curve] == ["2"] and at_curve == short_curve
    with pytest.raises(ValueError, match="clip seed 0 has no evaluated checkpoint at step 3 \\(it has \\[2, 4\\]\\)"):
        cpu_table.result_at_step(json.loads((long_runs / "clip-s0" / "result.json").read_text()), 3)


def _fake_result(run: str, seed: int, score: float) -> dict:
    evals = {b: {"mean@8": score, "pass@8": min(100.0, score + 10), "problems": 4} for b in cpu_table.BENCHMARKS}
    curves = [
        {"step": s, **{k: (score / 100 if k != "step" else s) for k in cpu_table.CURVE_KEYS[1:]}} for s in (10, 20)
    ]
    return {"run": run, "seed": seed, "evals": {"0": evals}, "curves": curves if run != "sft" else []}


def test_table_accumulates_over_invocations_and_a_rerun_pair_replaces_its_rows(tmp_path):
    settings = {**cpu_table.FULL, "task": cpu_table.TASK, "base_config": "cpu-table.yaml"}
    settings.update(benchmarks=cpu_table.BENCHMARKS, device="cpu")
    first = [_fake_result(run, s, 40.0 + s) for run in ("sft", "clip", "atr") for s in (0, 1)]
    cpu_table.write_outputs(first, {**settings, "runs": ["clip", "atr"], "seeds": [0, 1]}, tmp_path)
    # a later invocation (its runs directory gone) adds clip-cov and re-runs atr seed 1 with a new score
    second = [_fake_result("clip-cov", s, 30.0 + s) for s in (0, 1)] + [_fake_result("atr", 1, 70.0)]
    summary = cpu_table.write_outputs(second, {**settings, "runs": ["clip-cov", "atr"], "seeds": [0, 1]}, tmp_path)
    got = {(r["method"], r["seed"], r["benchmark"]): r["mean_at_8"] for r in summary["rows"]}
    assert len(got) == len(summary["rows"]) == 4 * 2 * len(cpu_table.BENCHMARKS)  # no pair twice
    assert got[("atr", 1, "steps-test-T1")] == 70.0 and got[("atr", 0, "steps-test-T1")] == 40.0
    assert got[("clip-cov", 1, "steps-test-T0.3")] == 31.0 and got[("clip", 1, "steps-test-T0.3")] == 41.0
    assert summary["settings"]["runs"] == ["clip", "clip-cov", "atr"]  # Table 2's order
    # paired differences use the merged rows: clip-cov - clip = -10 on both seeds
    d = summary["paired_mean_at_k"]["steps-test-T1"]["clip-cov"]["clip"]
    assert d["mean"] == pytest.approx(-10.0) and d["n"] == 2
    with (tmp_path / "cpu_llm_curves.csv").open() as f:
        points = list(csv.DictReader(f))
    assert {(p["method"], p["seed"]) for p in points} == {
        (r, str(s)) for r in ("clip", "atr", "clip-cov") for s in (0, 1)
    }
    assert [float(p["reward"]) for p in points if (p["method"], p["seed"]) == ("atr", "1")] == [0.7, 0.7]
    assert "| clip-cov | min | 2 |" in (tmp_path / "cpu_llm_table.md").read_text()
    # another protocol (here: fewer training steps) never mixes into the table; --replace-table starts over
    other = cpu_table.write_outputs(
        [_fake_result("kl1", 0, 50.0)], {**settings, "max_steps": 10, "runs": ["kl1"], "seeds": [0]}, tmp_path
    )
    assert {r["method"] for r in other["rows"]} == {"kl1"}
    again = cpu_table.write_outputs(
        [_fake_result("kl2", 0, 50.0)],
        {**settings, "max_steps": 10, "runs": ["kl2"], "seeds": [0]},
        tmp_path,
        keep_previous=False,
    )
    assert {r["method"] for r in again["rows"]} == {"kl2"}


def test_weights_id_is_the_weights_not_the_file(tmp_path):
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    weights = {"a.weight": torch.randn(4, 3, generator=g), "b.bias": torch.randn(5, generator=g).to(torch.bfloat16)}
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "sharded").mkdir()  # the same weights in two shards, other metadata
    save_file({"b.bias": weights["b.bias"]}, str(tmp_path / "sharded" / "model-00001-of-00002.safetensors"))
    save_file({"a.weight": weights["a.weight"]}, str(tmp_path / "sharded" / "model-00002-of-00002.safetensors"))
    reference = cpu_table.weights_id(tmp_path)
    assert cpu_table.weights_id(tmp_path / "sharded") == reference and len(reference) == 16
    for name in weights:  # one bit of one element, in a float32 and in a bfloat16 tensor
        changed = {k: v.clone() for k, v in weights.items()}
        bits = changed[name].view(torch.int16 if changed[name].dtype == torch.bfloat16 else torch.int32)
        bits.view(-1)[2] ^= 1
        (tmp_path / name).mkdir()
        save_file(changed, str(tmp_path / name / "model.safetensors"), metadata={"format": "pt"})
        assert cpu_table.weights_id(tmp_path / name) != reference
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        cpu_table.weights_id(tmp_path / "a.weight" / "missing")


def test_a_finished_run_from_another_sft_model_is_refused(tmp_path):
    done = tmp_path / "result.json"
    job = {"sft_model": "b0", "sft_dir": "runs/sft-s0", "learning_rate": None, "max_steps": 1000, "save_steps": 250}
    evals = {"evals": {"250": {}, "500": {}, "750": {}, "1000": {}}}  # a result as written before its protocol was
    assert cpu_table._started_from({"run": "atr", "sft_model": "b0", **evals}, job, done)["sft_model"] == "b0"
    assert cpu_table._started_from({"run": "atr", **evals}, job, done)["sft_model"] == "b0"  # nor its SFT model
    with pytest.raises(ValueError, match="started from SFT model a0, but runs/sft-s0 now holds b0"):
        cpu_table._started_from({"run": "atr", "sft_model": "a0", **evals}, job, done)


def test_rows_from_other_sft_models_are_kept_beside_and_never_paired(tmp_path):
    settings = {**cpu_table.FULL, "task": cpu_table.TASK, "base_config": "cpu-table.yaml"}
    settings.update(benchmarks=cpu_table.BENCHMARKS, device="cpu", runs=["clip", "atr"], seeds=[0, 1, 2])

    def on(start, invocation, results):
        return [{**r, "sft_model": f"{start}{r['seed']}", "invocation": invocation} for r in results]

    # machine 1: SFT models a0..a2, clip and atr; machine 2 trains other SFT models b0..b2 from the same command
    first = on(
        "a", "2026-11-23T10:00:00Z", [_fake_result(m, s, 40.0 + s) for m in ("sft", "clip", "atr") for s in range(3)]
    )
    cpu_table.write_outputs(first, settings, tmp_path)
    second = [_fake_result("sft", s, 30.0 + 2 * s) for s in range(3)] + [_fake_result("atr", s, 50.0) for s in range(3)]
    second += [_fake_result("atr-delta0.15", s, 50.0 + s * s) for s in range(3)]
    summary = cpu_table.write_outputs(on("b", "2026-11-24T10:00:00Z", second), settings, tmp_path)
    rows = [r for r in summary["rows"] if r["benchmark"] == "steps-test-T1"]
    assert sorted((r["method"], r["sft_model"]) for r in rows if r["seed"] == 0) == sorted(
        [("sft", "a0"), ("clip", "a0"), ("atr", "a0"), ("sft", "b0"), ("atr", "b0"), ("atr-delta0.15", "b0")]
    )  # the second invocation's sft and atr rows did not replace the first's
    assert cpu_table.start_labels(rows) == {"a0": "A", "a1": "A", "a2": "A", "b0": "B", "b1": "B", "b2": "B"}
    paired = summary["paired_mean_at_k"]["steps-test-T1"]
    assert paired["atr-delta0.15 [B]"]["clip"] is None  # clip never ran from b0..b2
    assert paired["atr-delta0.15 [B]"]["atr"]["mean"] == pytest.approx((0 + 1 + 4) / 3)  # against atr [B] only
    assert paired["atr [A]"]["clip"]["mean"] == pytest.approx(0.0) and paired["atr [B]"]["clip"] is None
    md = (tmp_path / "cpu_llm_table.md").read_text()
    benchmark_tables = md.split("### Where the runs end")[0]  # the Mean@8 tables, not the training curves' one
    table = {
        line.split("|")[1].strip(): line.split("|")[2:-1]
        for line in benchmark_tables.splitlines()
        if line.startswith("| ")
    }
    assert table["sft [A]"][2].startswith(" 41.0 ±") and table["sft [B]"][2].startswith(" 32.0 ±")
    assert table["atr-delta0.15 [B]"][4].strip() == "other start" and table["atr-delta0.15 [B]"][5].strip() != "-"
    assert table["atr-delta0.15 [B]"][0].strip() == "mask" and table["sft [A]"][0].strip() == "-"
    assert "- **B**: seed 0: b0, seed 1: b1, seed 2: b2 (written by: 2026-11-24T10:00:00Z)" in md
    # the delta ablation is read within start B only (atr [A] has no other delta beside it)
    ablation = [p for p in summary["delta_ablation"] if p["benchmark"] == "steps-test-T1"]
    assert [(p["start"], p["delta"], p["seeds"]) for p in ablation] == [("B", 0.07, 3), ("B", 0.15, 3)]
    assert ablation[1]["mean_at_8"] == pytest.approx(50 + 5 / 3) and ablation[1]["minus_delta0.07"] == pytest.approx(
        5 / 3
    )
    assert ablation[1]["ci_low"] < 5 / 3 < ablation[1]["ci_high"] and ablation[0]["minus_delta0.07"] is None
    with (tmp_path / "cpu_llm_delta_ablation.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 2 * len(cpu_table.BENCHMARKS)
    assert (tmp_path / "cpu_llm_delta_ablation.png").stat().st_size > 0
    # a later invocation on machine 2 with one seed joins start B through its SFT model b1
    third = on("b", "2026-11-25T10:00:00Z", [_fake_result("clip", 1, 45.0)])
    again = cpu_table.write_outputs(third, settings, tmp_path)
    assert set(cpu_table.start_labels(again["rows"]).values()) == {"A", "B"}
    assert "clip [B]" in again["paired_mean_at_k"]["steps-test-T1"]


def test_seeds_added_later_on_the_same_machine_kind_join_its_start(tmp_path):
    settings = {**cpu_table.FULL, "task": cpu_table.TASK, "base_config": "cpu-table.yaml"}
    settings.update(benchmarks=cpu_table.BENCHMARKS, device="cpu", runs=["clip", "atr"], seeds=[0, 1, 2])

    def on(machine, invocation, results, prefix="c"):
        return [
            {**r, "sft_model": f"{prefix}{r['seed']}", "sft_machine": machine, "invocation": invocation}
            for r in results
        ]

    def of(seeds, score=40.0):
        return [_fake_result(m, s, score + s) for m in ("sft", "clip", "atr") for s in seeds]

    epyc, xeon = "AMD EPYC | cpu AVX2 | torch 2.13.0+cpu", "Intel Xeon | cpu AVX512 | torch 2.13.0+cpu"
    cpu_table.write_outputs(on(epyc, "2026-11-25T08:00:00Z", of([0, 1, 2])), settings, tmp_path)
    summary = cpu_table.write_outputs(on(epyc, "2026-11-25T10:00:00Z", of([3])), settings, tmp_path)
    labels = cpu_table.start_labels(summary["rows"])
    assert labels == {f"c{s}": "" for s in range(4)}  # one start: no row is named with a letter
    paired = summary["paired_mean_at_k"]["steps-test-T1"]
    assert paired["atr"]["clip"]["n"] == 4  # seed 3 pairs with seeds 0-2's rows
    # another machine kind is another start, in the same invocation or not
    summary = cpu_table.write_outputs(on(xeon, "2026-11-25T10:00:00Z", of([0]), "x"), settings, tmp_path)
    assert cpu_table.start_labels(summary["rows"]) == {"c0": "A", "c1": "A", "c2": "A", "c3": "A", "x0": "B"}
    md = (tmp_path / "cpu_llm_table.md").read_text()
    assert f"- **B**: seed 0: x0 (trained on: {xeon}; written by: 2026-11-25T10:00:00Z)" in md
    # rows written before the machine was recorded still group by invocation; one that shares a model joins it
    legacy = [{**r, "sft_machine": None} for r in on(None, "2026-11-20T08:00:00Z", of([0]), "l")]
    legacy += [{**r, "sft_machine": None} for r in on(None, "2026-11-21T08:00:00Z", of([1]), "l")]
    legacy += [{**r, "sft_machine": None} for r in on(None, "2026-11-21T08:00:00Z", of([2]), "c")]
    rows = cpu_table.table_rows(legacy, 8) + summary["rows"]
    assert cpu_table.start_labels(rows) == {
        "l0": "A",
        "l1": "B",
        "c2": "B",
        "c0": "B",
        "c1": "B",
        "c3": "B",
        "x0": "C",
    }  # l1 and c2 were written together; c2 is start EPYC's, so l1 is too


def test_a_table_written_before_sft_machine_existed_takes_rows_that_have_it(tmp_path):
    settings = {**cpu_table.FULL, "task": cpu_table.TASK, "base_config": "cpu-table.yaml"}
    settings.update(benchmarks=cpu_table.BENCHMARKS, device="cpu", runs=["clip"], seeds=[0])
    old = [
        {**_fake_result(m, 0, 40.0), "sft_model": "a0", "invocation": "2026-11-20T08:00:00Z"} for m in ("sft", "clip")
    ]
    cpu_table.write_outputs(old, settings, tmp_path)
    summary = json.loads((tmp_path / "cpu_llm_table.json").read_text())
    for r in summary["rows"]:
        del r["sft_machine"]  # as the table's JSON was written before the column existed
    (tmp_path / "cpu_llm_table.json").write_text(json.dumps(summary))
    new = [{**r, "sft_model": "a1", "sft_machine": "m", "invocation": "2026-11-25T08:00:00Z"} for r in old]
    cpu_table.write_outputs([{**r, "seed": 1} for r in new], settings, tmp_path)
    with (tmp_path / "cpu_llm_table.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert sorted((r["seed"], r["sft_machine"]) for r in rows) == [("0", "")] * 4 + [("1", "m")] * 4


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


def test_a_table_with_the_four_forms_writes_their_2x2(tmp_path):
    rows = [
        {"method": run, "seed": s, "benchmark": b, "mean_at_8": 50.0 + 3 * s + i * (s % 3), "pass_at_8": 90.0}
        | {"best_mean_at_8": 70.0, "frac_masked_mean": 0.001}
        for i, run in enumerate(["clip", "clip-mask", "atr-min", "atr"])
        for s in range(4)
        for b in cpu_table.BENCHMARKS
    ]
    (tmp_path / "cpu_llm_table.json").write_text(json.dumps({"settings": {"samples": 8}, "rows": rows}))
    summary = cpu_table.rewrite_outputs(tmp_path)
    assert summary["forms_factorial"] == cpu_table.forms_factorial(rows, 8)
    md = (tmp_path / "cpu_llm_table.md").read_text()
    interaction = summary["forms_factorial"]["steps-test-T1"]["interaction"]
    assert f"| steps-test-T1 | interaction | 4 | {interaction['mean']:+.1f} [" in md
    two_only = [r for r in rows if r["method"] in ("clip", "atr")]
    (tmp_path / "cpu_llm_table.json").write_text(json.dumps({"settings": {"samples": 8}, "rows": two_only}))
    assert cpu_table.rewrite_outputs(tmp_path)["forms_factorial"] is None
    assert "2 x 2" not in (tmp_path / "cpu_llm_table.md").read_text()


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


@pytest.mark.slow
def test_learning_rate_option_reaches_the_trainer_and_makes_a_protocol_of_its_own(tmp_path):
    """--learning-rate: the optimizer really steps at it (its saved state says so), the table records it, and a runs
    directory or table of another rate, step count or checkpoint interval is refused or kept apart, never mixed in."""
    import torch

    runs, fig = tmp_path / "runs", tmp_path / "fig"
    quick = ["--quick", "--runs", "clip", "--runs-dir", str(runs), "--out", str(fig)]
    summary = cpu_table.main([*quick, "--learning-rate", "5e-4", "--save-steps", "1"])
    assert summary["settings"]["learning_rate"] == 5e-4 and summary["settings"]["save_steps"] == 1
    for step in (1, 4):  # the rate the optimizer itself stepped with (constant schedule in cpu-table.yaml)
        state = torch.load(runs / "clip-s0" / f"checkpoint-{step}" / "optimizer.pt", weights_only=False)
        assert {group["lr"] for group in state["param_groups"]} == {5e-4}
    assert sorted(int(s) for s in json.loads((runs / "clip-s0" / "result.json").read_text())["evals"]) == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="trained with learning_rate = 0.0005, this invocation asks for None"):
        cpu_table.main(quick)  # cpu-table.yaml's own rate over the same runs directory
    with pytest.raises(ValueError, match="trained with max_steps = 4, this invocation asks for 2"):
        cpu_table.main([*quick, "--learning-rate", "5e-4", "--max-steps", "2"])
    with pytest.raises(ValueError, match="trained with save_steps = 1, this invocation asks for 2"):
        cpu_table.main([*quick, "--learning-rate", "5e-4"])  # its best-of-checkpoints would not be the one asked
    legacy = json.loads((runs / "clip-s0" / "result.json").read_text())
    for key in ("learning_rate", "max_steps", "save_steps"):  # as written before the protocol was recorded
        del legacy[key]
    (runs / "clip-s0" / "result.json").write_text(json.dumps(legacy))
    with pytest.raises(ValueError, match="trained with learning_rate = None, this invocation asks for 0.0005"):
        cpu_table.main([*quick, "--learning-rate", "5e-4", "--save-steps", "1"])  # an old result: cpu-table.yaml's
    cpu_table.refuse_other_protocol(legacy, {"learning_rate": None, "max_steps": 4, "save_steps": 1}, runs)
    assert (legacy["max_steps"], legacy["save_steps"]) == (4, 1)  # inferred from its evaluated checkpoints
    # the base config's own rate is the default protocol (None), so older tables keep their rows
    assert cpu_table.grpo_learning_rate(1e-4) is None and cpu_table.grpo_learning_rate(None) is None
    for bad in (0.0, -1e-4, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="--learning-rate must be a finite number > 0"):
            cpu_table.grpo_learning_rate(bad)
    rows, _, why = cpu_table.previous_outputs(fig, {**summary["settings"], "learning_rate": None}, set())
    assert rows == [] and "settings differ in ['learning_rate']" in why


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

    out = Path(__file__).resolve().parents[1] / "figures" / "experiments" / "cpu_table" / "startC"
    _, sets, _ = cpu_table.previous_outputs(
        out, json.loads((out / "cpu_llm_table.json").read_text())["settings"], set()
    )
    runs = sorted({s["run"] for s in sets})
    assert {"clip", "dual-clip"} <= set(runs)  # committed: 10 seeds of each
    ours = {s["seed"]: s["parts_at"] for s in cpu_table.where_curves_part(sets, runs)["dual-clip"]}
    frame = pd.read_csv(out / "cpu_llm_curves.csv")
    expected = {}
    for seed, both in frame[frame.method.isin(["clip", "dual-clip"])].groupby("seed"):
        a, b = (both[both.method == m].set_index("step")[list(cpu_table.CURVE_KEYS[1:])] for m in ("clip", "dual-clip"))
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


_FAULTS_SCRIPT = """
import resource, sys, torch
if sys.argv[1] == "keep":
    from experiments.cpu_table import keep_freed_memory
    assert keep_freed_memory()
torch.ones(10_020_000).add_(1.0)  # warm-up: the largest block, written once and freed
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for i in range(20):
    x = torch.ones(10_020_000 - 1000 * i)  # ~40 MiB, above glibc's adaptive mmap threshold (at most 32 MiB)
    x.add_(1.0)
    del x
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and the kernel's fault counter")
def test_keep_freed_memory_stops_freed_tensors_faulting_their_pages_in_again():
    """The kernel's count of minor page faults (an oracle we did not write): after one warm-up block, 20 tensors of
    ~40 MiB (none larger) allocated, written and freed one after the other fault every page in each time by default
    (~10,000 per tensor), and hardly at all after ``keep_freed_memory`` (the freed block is re-used)."""
    # torch's own huge-page path (THP_MEM_ALLOC_ENABLE, which the entry points and the tests' conftest turn on) off in both: with it the
    # kernel's counts vary 6x between identical runs; the speed-up was measured with it on
    env = {**os.environ, "THP_MEM_ALLOC_ENABLE": "0"}
    counts = {}
    for mode in ("default", "keep"):
        out = subprocess.run(
            [sys.executable, "-c", _FAULTS_SCRIPT, mode], capture_output=True, text=True, check=True, cwd=ROOT, env=env
        )
        counts[mode] = int(out.stdout.split()[-1])
    # with it, a small object allocated into the freed block can push one tensor past it (measured: 0 or ~9,800 in
    # repeated runs, one block's pages): allowed up to ~4 blocks, still 5x fewer than without
    assert counts["default"] > 19 * 9_000 and counts["keep"] < counts["default"] / 5, counts


def test_keep_freed_memory_changes_nothing_without_mallopt(monkeypatch):
    """A C library without ``mallopt`` (or none found): False, nothing raised."""
    import ctypes

    def no_libc(*args, **kwargs):
        raise OSError("no C library here")

    monkeypatch.setattr(ctypes, "CDLL", no_libc)
    assert cpu_table.keep_freed_memory() is False


@pytest.mark.slow
def test_off_policy_knobs_reach_the_trainer_and_make_a_protocol_of_their_own(tmp_path):
    """--num-iterations / --steps-per-generation: the trainer runs with them (its saved TrainingArguments say so),
    the run records them and how much its rule acted over its logged rows, and a runs directory of another value is
    refused, never mixed in."""
    runs, fig = tmp_path / "runs", tmp_path / "fig"
    quick = ["--quick", "--runs", "clip", "--runs-dir", str(runs), "--out", str(fig)]
    summary = cpu_table.main([*quick, "--num-iterations", "4", "--steps-per-generation", "2"])
    assert (summary["settings"]["num_iterations"], summary["settings"]["steps_per_generation"]) == (4, 2)
    trained = torch.load(runs / "clip-s0" / "checkpoint-4" / "training_args.bin", weights_only=False)
    assert (trained.num_iterations, trained.steps_per_generation) == (4, 2)
    result = json.loads((runs / "clip-s0" / "result.json").read_text())
    assert (result["num_iterations"], result["steps_per_generation"]) == (4, 2)
    history = json.loads((runs / "clip-s0" / "log_history.json").read_text())
    assert result["acted"]["logged_steps"] == sum("clip/frac_masked" in h for h in history) >= 1
    with (fig / "cpu_llm_table.csv").open() as f:  # the table carries it: its data, not only the runs folder
        row = next(r for r in csv.DictReader(f) if r["method"] == "clip")
    assert float(row["acted_frac_masked"]) == pytest.approx(result["acted"]["clip/frac_masked"])
    assert 0 <= result["acted"]["clip/frac_masked"] <= 1
    with pytest.raises(ValueError, match="trained with num_iterations = 4, this invocation asks for None"):
        cpu_table.main(quick)
    # cpu-table.yaml's own values are the default protocol (None), so older tables keep their rows
    assert cpu_table.off_policy_knob("num_iterations", 2) is None
    assert cpu_table.off_policy_knob("steps_per_generation", 1) is None
    assert cpu_table.off_policy_knob("num_iterations", 8) == 8
    with pytest.raises(ValueError, match="--num-iterations must be an integer >= 1, got 0"):
        cpu_table.off_policy_knob("num_iterations", 0)
    argv = cpu_table.train_argv({"run": "atr", "seed": 0, "sft_dir": "m", "num_iterations": 8}, "out", 10, 5)
    assert argv[argv.index("--num_iterations") + 1] == "8" and "--steps_per_generation" not in argv


def test_acted_summary_averages_every_logged_step_and_the_entropys_first_and_last_fifth():
    history = [
        {"step": s, "clip/frac_masked": 0.1 * (s % 2), "entropy": float(s), **({"reward": 0.5} if s % 4 == 1 else {})}
        for s in range(1, 11)
    ] + [{"step": 10, "train_runtime": 1.0}]
    got = cpu_table.acted_summary(history)
    assert got["logged_steps"] == 10 and got["clip/frac_masked"] == pytest.approx(0.05)
    assert got["entropy_first_fifth"] == pytest.approx(1.5) and got["entropy_last_fifth"] == pytest.approx(9.5)
    assert got["clip/frac_clipped_low"] is None  # not logged: not invented


def test_reinforce_tis_is_bypass_reinforce_with_token_tis_at_cap_2():
    """The study's no-trust-region control: cispo with no lower bound and the cap 2 has the gradient of REINFORCE
    with a token-level truncated IS weight sg[min(w, 2)] (atr_theory's RolloutCorrection in verl's bypass mode), by
    autograd on batches with ratios on both sides of the cap."""
    import atr_theory as at

    spec = cpu_table.CPU_RUNS["reinforce-tis"]
    params = {k: v for k, v in spec.items() if k != "method"}
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        old = -torch.rand(4, 7, generator=g, dtype=torch.float64) * 2 - 0.05
        logp = (old + torch.randn(4, 7, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
        adv = torch.randn(4, generator=g, dtype=torch.float64)
        mask = torch.rand(4, 7, generator=g) < 0.85
        mask[:, 0] = True
        grads = []
        for method, kw in ((spec["method"], params), ("reinforce", {"rollout_correction": at.RolloutCorrection()})):
            lp = logp.clone().requires_grad_(True)
            (grad,) = torch.autograd.grad(at.policy_loss(lp, old, adv, mask, method=method, **kw).loss, lp)
            grads.append(grad)
        assert torch.allclose(grads[0], grads[1], rtol=1e-12, atol=1e-15)
    assert (torch.exp(logp - old)[mask] > 2).any()  # the cap acted in these batches


@pytest.mark.slow
def test_sft_steps_option_trains_its_own_start_and_never_reuses_another_lengths(tmp_path):
    """--sft-steps: the seed's SFT model is trained for that many steps and records them; the same runs directory
    asked for another length is refused instead of silently handing over the other model."""
    runs, fig = tmp_path / "runs", tmp_path / "fig"
    quick = ["--quick", "--runs", "clip", "--runs-dir", str(runs), "--out", str(fig)]
    summary = cpu_table.main([*quick, "--sft-steps", "7"])
    assert summary["settings"]["sft_steps"] == 7
    assert json.loads((runs / "sft-s0" / cpu_table.MACHINE_FILE).read_text())["sft_steps"] == 7
    trained = torch.load(runs / "sft-s0" / "training_args.bin", weights_only=False)
    assert trained.max_steps == 7
    with pytest.raises(ValueError, match="an SFT model of 7 steps, this invocation asks for 20"):
        cpu_table.main(quick)  # QUICK's own 20 steps
