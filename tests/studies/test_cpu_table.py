"""The CPU analog of Tables 2-3 (experiments.cpu_table): every run parses, --quick runs, the table accumulates and pairs
its rows (its statistics: tests/studies/test_cpu_table_statistics.py)."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("math_verify")

import torch  # noqa: E402

from atr_llm import train
from atr_llm.data import OFFLINE_TASKS, arithmetic_dataset, is_held_out  # noqa: E402
from experiments import cpu_table  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


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
    # except grad_norm: transformers logs it at a logging or saving step, not in the final row it writes at the end of
    # training, which is where the 2-step run's only point comes from (off the logging interval)
    assert short_curve[0]["grad_norm"] == "" and float(at_curve[0]["grad_norm"]) > 0
    for curve in (short_curve, at_curve):
        curve[0].pop("grad_norm")
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


def test_the_learning_regime_knobs_reach_the_trainer_and_make_protocols_of_their_own(tmp_path):
    """--prompts-per-step P trains P x 8 completions per step, --warmup-steps W a linear warmup then a constant rate
    (each parsed by python -m atr_llm.train into the config the trainer gets), a long run keeps every evaluated
    checkpoint, and a finished run of another regime is refused by name."""
    from atr_llm import train

    job = {"run": "shuffled", "seed": 3, "sft_dir": "x", "prompts_per_step": 64, "warmup_steps": 50}
    argv = cpu_table.train_argv(job, tmp_path / "out", 2000, 250)
    argv[argv.index("--model_name_or_path") : argv.index("--model_name_or_path") + 2] = ["--tiny", "true"]
    config = train.parse(argv)
    t = config.training
    scheduler = str(getattr(t.lr_scheduler_type, "value", t.lr_scheduler_type))
    assert (t.per_device_train_batch_size, t.warmup_steps, scheduler) == (512, 50, "constant_with_warmup")
    assert t.save_total_limit == 2000 // 250 + 1
    assert config.script.reward_control == "shuffled" and t.resolved_method.name == "clip"
    assert cpu_table.regime_knob("prompts_per_step", 32) is None  # cpu-table.yaml's own: the old protocol
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="--prompts-per-step must be an integer >= 1"):
            cpu_table.regime_knob("prompts_per_step", bad)
    finished = {"run": "clip", "seed": 3, "evals": {"250": {}}, "learning_rate": None, "max_steps": 250}
    finished.update(save_steps=250, num_iterations=None, steps_per_generation=None, prompts_per_step=64)
    with pytest.raises(ValueError, match="trained with prompts_per_step = 64"):
        cpu_table.refuse_other_protocol(dict(finished), {"max_steps": 250, "save_steps": 250}, tmp_path)


def _validity_rows(clip_gain, shuffled_gain):
    rows = []
    for i, seed in enumerate(range(5)):
        for bench in cpu_table.BENCHMARKS:
            base = {"seed": seed, "sft_model": f"m{seed}", "benchmark": bench}
            rows.append({**base, "method": "sft", "mean_at_8": 40.0 + i})
            rows.append({**base, "method": "clip", "mean_at_8": 40.0 + i + clip_gain + (-1) ** i})
            if shuffled_gain is not None:
                rows.append({**base, "method": "shuffled", "mean_at_8": 40.0 + i + shuffled_gain})
    return rows


def test_a_comparison_counts_only_where_clip_beats_its_sft_model_and_the_shuffled_arm():
    from scipy import stats

    validity = cpu_table.comparison_validity(_validity_rows(5, -10), 8)
    v = validity["steps-test-T0.3"]
    gains = [5 + (-1) ** i for i in range(5)]
    low = stats.t.interval(0.95, 4, loc=sum(gains) / 5, scale=stats.sem(gains))[0]
    assert v["reference_minus_sft"]["low"] == pytest.approx(low) and v["counts"] is True
    assert cpu_table.comparison_validity(_validity_rows(-5, -10), 8)["steps-test-T0.3"]["counts"] is False
    # clip above SFT, but the control gains as much: no signal needed, no count
    assert cpu_table.comparison_validity(_validity_rows(5, 5), 8)["steps-test-T0.3"]["beats_control"] is False
    missing = cpu_table.comparison_validity(_validity_rows(5, None), 8)["steps-test-T0.3"]
    assert missing["beats_control"] is None and missing["counts"] is False
    text = cpu_table.markdown_comparison_validity(cpu_table.comparison_validity(_validity_rows(5, None), 8), 8)
    assert "does not count: clip does not beat the shuffled arm (not run)" in text
    assert cpu_table.comparison_validity([r for r in _validity_rows(5, -10) if r["method"] != "clip"], 8) == {}
