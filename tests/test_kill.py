"""A run killed at any moment loses nothing: a killed training run resumed from "latest" ends with the weights and logs
of the uninterrupted run (a checkpoint cut mid-write is never taken as the latest), a killed evaluation resumes
without a torn or duplicated sample, and the experiment driver redoes a half-written run instead of reading it."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from atr_llm.checkpoints import complete_checkpoints, is_complete_checkpoint, latest_complete_checkpoint

ROOT = Path(__file__).resolve().parents[1]
TRAIN = [sys.executable, "-m", "atr_llm.train", "--config", "atr_llm/configs/cpu-tiny.yaml", "--sft_steps", "0"]
SHORT = ["--max_steps", "6", "--save_steps", "2", "--save_total_limit", "10", "--logging_steps", "1"]


def _train(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([*TRAIN, *SHORT, "--output_dir", str(out), *extra], cwd=ROOT, capture_output=True, text=True)


def _kill_when(out: Path, ready, timeout: float = 300) -> None:
    """Start training into ``out`` and SIGKILL it the moment ``ready(out)`` holds (polled every 5 ms)."""
    proc = subprocess.Popen(
        [*TRAIN, *SHORT, "--output_dir", str(out)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    start = time.monotonic()
    try:
        while proc.poll() is None and not ready(out):
            if time.monotonic() - start > timeout:
                raise AssertionError("the run never reached the kill point")
            time.sleep(0.005)
        assert proc.poll() is None, "the run finished before the kill point"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()


def _weights(path: Path) -> str:
    from experiments.cpu_table import weights_id

    return weights_id(path)


def _logged(out: Path) -> list[dict]:
    keys = ("step", "loss", "reward", "clip/frac_masked", "entropy")
    return [{k: h.get(k) for k in keys} for h in json.loads((out / "log_history.json").read_text()) if "reward" in h]


@pytest.mark.slow
def test_a_training_run_killed_at_any_moment_resumes_to_the_uninterrupted_run(tmp_path):
    whole = tmp_path / "whole"
    res = _train(whole)
    assert res.returncode == 0, res.stderr[-3000:]

    kill_points = {
        # the moment a checkpoint folder appears: transformers is writing it (weights, optimizer, state)
        "mid_checkpoint": lambda out: (out / "checkpoint-4").exists(),
        # after the first complete checkpoint, while the next steps generate and step the optimizer
        "mid_training": lambda out: is_complete_checkpoint(out / "checkpoint-2") and not (out / "checkpoint-4").exists(),
    }
    for name, ready in kill_points.items():
        out = tmp_path / name
        _kill_when(out, ready)
        assert not (out / "final").exists()
        latest = latest_complete_checkpoint(out)
        assert latest is not None and is_complete_checkpoint(latest)
        res = _train(out, "--resume_from_checkpoint", "latest")
        assert res.returncode == 0, res.stderr[-3000:]
        assert _weights(out / "final") == _weights(whole / "final"), name
        assert _logged(out) == _logged(whole), name


def test_a_checkpoint_cut_mid_write_is_never_the_latest(tmp_path):
    for step, state in ((2, '{"global_step": 2}'), (4, '{"global_step": 4, "log_hi'), (6, None)):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"x")
        if state is not None:
            (folder / "trainer_state.json").write_text(state)
    assert [s for s, _ in complete_checkpoints(tmp_path)] == [2]
    assert latest_complete_checkpoint(tmp_path) == tmp_path / "checkpoint-2"


def test_a_killed_evaluation_resumes_without_a_torn_or_duplicated_sample(tmp_path):
    from atr_llm.evaluate import evaluate_benchmarks

    problems = [{"problem": f"{i} + 1", "answer": str(i + 1)} for i in range(3)]
    out = tmp_path / "eval"
    out.mkdir()
    done = [
        {"benchmark": "b", "problem_id": 0, "sample_index": s, "completion": "x", "extracted_answer": None}
        | {"correct": False, "status": "wrong"}
        for s in range(2)
    ]
    torn = json.dumps(dict(done[0], sample_index=2))[:25]  # a line cut by the kill
    (out / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in done) + torn)

    def generate(prompts):
        return ["\\boxed{1}" for _ in prompts]

    rows = evaluate_benchmarks(generate, {"b": problems}, out, n=4, workers=1)
    keys = [(r["benchmark"], r["problem_id"], r["sample_index"]) for r in rows]
    assert sorted(keys) == [("b", p, s) for p in range(3) for s in range(4)]
    lines = (out / "samples.jsonl").read_text().splitlines()
    assert len(lines) == 12 and all(json.loads(line) for line in lines)


@pytest.mark.slow
def test_a_real_evaluation_killed_mid_file_completes_every_sample_once(tmp_path):
    from atr_llm import tiny

    model = tiny.save_tiny(tmp_path / "tiny")
    bench = ROOT / "atr_llm" / "data" / "arithmetic_bench.jsonl"
    out = tmp_path / "eval"
    cmd = [sys.executable, "-m", "atr_llm.evaluate", "--tiny-model", str(model), "--benchmarks", "arith"]
    cmd += ["--benchmark_path", f"arith={bench}", "--n", "8", "--max_tokens", "12", "--output_dir", str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples = out / "model" / "samples.jsonl"
    start = time.monotonic()
    while proc.poll() is None and not (samples.exists() and samples.stat().st_size > 0):
        assert time.monotonic() - start < 300
        time.sleep(0.002)
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = samples.read_text().splitlines()
    keys = [(r["benchmark"], r["problem_id"], r["sample_index"]) for r in map(json.loads, lines)]
    n_problems = sum(1 for line in bench.read_text().splitlines() if line.strip())
    assert len(keys) == len(set(keys)) == n_problems * 8


def test_the_driver_redoes_a_half_written_run_instead_of_reading_it(tmp_path):
    from experiments.cpu_table.driver import finished_result

    run = tmp_path / "atr-s0"
    run.mkdir()
    assert finished_result(run / "result.json") is None
    (run / "result.json").write_text('{"run": "atr", "seed": 0, "evals": {"1')  # cut mid-write
    assert finished_result(run / "result.json") is None
    (run / "result.json").write_text('{"run": "atr", "seed": 0}')
    assert finished_result(run / "result.json") == {"run": "atr", "seed": 0}


def _table_rows(out: Path) -> list[dict]:
    import csv

    with (out / "cpu_llm_table.csv").open(newline="") as f:
        return [{k: v for k, v in row.items() if k != "invocation"} for row in csv.DictReader(f)]


@pytest.mark.slow
def test_the_experiment_driver_killed_mid_run_resumes_to_the_same_table(tmp_path):
    """The --quick table (SFT, one GRPO run, its evaluations) killed while the GRPO run trains, then run again: the
    rows equal an uninterrupted invocation's (only the invocation stamp differs); so do those of a run resumed
    from a complete checkpoint that lies between two logs."""
    base = [sys.executable, "-m", "experiments.cpu_table", "--quick", "--runs", "clip", "--workers", "1"]

    def command(name):
        return [*base, "--runs-dir", str(tmp_path / name / "runs"), "--out", str(tmp_path / name / "table")]

    res = subprocess.run(command("whole"), cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    proc = subprocess.Popen(command("killed"), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run_dir = tmp_path / "killed" / "runs" / "clip-s0"
    start = time.monotonic()
    while proc.poll() is None and not (run_dir / "checkpoint-2").exists():
        assert time.monotonic() - start < 600, "the GRPO run never started"
        time.sleep(0.005)
    assert proc.poll() is None, "the invocation finished before the kill point"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(1.0)  # the worker dies with the driver (PR_SET_PDEATHSIG): nothing trains on into the run directory
    assert not (run_dir / "result.json").exists()
    log = run_dir / "train.log"
    size = log.stat().st_size
    time.sleep(2.0)
    assert log.stat().st_size == size, "a worker went on training after the driver was killed"
    res = subprocess.run(command("killed"), cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    assert _table_rows(tmp_path / "killed" / "table") == _table_rows(tmp_path / "whole" / "table")
    # The kill above lands at whatever point of checkpoint-2's write the 5 ms poll catches, mostly before its
    # trainer_state.json (the rerun starts afresh). The other case, fixed: the whole run's state right after a
    # complete checkpoint-2 (everything written later removed), resumed from it. Its step-4 log used to average
    # steps 3-4 only where the uninterrupted run's averaged steps 1-4 (atr_llm.checkpoints.LogAtEveryCheckpoint).
    import shutil

    shutil.copytree(tmp_path / "whole" / "runs", tmp_path / "resumed" / "runs")
    run_dir = tmp_path / "resumed" / "runs" / "clip-s0"
    assert is_complete_checkpoint(run_dir / "checkpoint-2")
    for later in ("result.json", "log_history.json"):
        (run_dir / later).unlink()
    for later in ("checkpoint-4", "final"):
        shutil.rmtree(run_dir / later)
    saved_at = (run_dir / "checkpoint-2" / "trainer_state.json").stat().st_mtime_ns
    res = subprocess.run(command("resumed"), cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    resumed_not_restarted = (run_dir / "checkpoint-2" / "trainer_state.json").stat().st_mtime_ns == saved_at
    assert resumed_not_restarted
    assert _table_rows(tmp_path / "resumed" / "table") == _table_rows(tmp_path / "whole" / "table")
    logged_steps = [h["step"] for h in json.loads((run_dir / "log_history.json").read_text()) if "reward" in h]
    assert logged_steps == [2, 4], logged_steps
