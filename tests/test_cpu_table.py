"""The CPU analog of Tables 2-3 (atr_llm.cpu_table): every run parses, the statistics match scipy, --quick runs."""

import csv
import json

import pytest

pytest.importorskip("trl")
pytest.importorskip("math_verify")

from atr_llm import cpu_table, train  # noqa: E402
from atr_llm.data import OFFLINE_TASKS, arithmetic_dataset, is_held_out  # noqa: E402


@pytest.mark.parametrize("run", sorted(cpu_table.CPU_RUNS))
def test_every_run_parses_into_its_method_and_parameters(run):
    argv = ["--config", str(cpu_table.BASE_CONFIG), "--output_dir", "/tmp/unused", *cpu_table.run_args(run)]
    _, args, _ = train.parse(argv)
    spec = cpu_table.CPU_RUNS[run]
    assert args.resolved_method.name == spec["method"]
    assert {k: v for k, v in args.resolved_method.params.items() if k in spec} == {
        k: v for k, v in spec.items() if k != "method"
    }


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
    assert cpu_table.paired_difference(rows[:1] + rows[4:5], "x", "clip", "m") is None  # one seed: no interval
    mixed = [{**r, "benchmark": b} for r in rows for b in ("T0.3", "T1")]
    with pytest.raises(ValueError, match="one benchmark"):  # (method, seed) pairs of two benchmarks never mix
        cpu_table.paired_difference(mixed, "x", "clip", "m")


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
    assert md.count("| atr | 1 |") == len(cpu_table.BENCHMARKS) and all(f"### {b} " in md for b in cpu_table.BENCHMARKS)
    again = cpu_table.main(["--quick", "--runs-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "fig2")])
    assert again["rows"] == summary["rows"]  # finished runs are read back, not trained again
