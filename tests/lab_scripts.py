"""The lab's scripts as the tests run them: where each lives and the ``python -m`` command line that runs it."""

import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


SCRIPT_PACKAGES = {
    "loss_overhead": "benchmarks",
    "bandit_throughput": "benchmarks",
    "trainer_step": "benchmarks",
    "real_vocab_step": "benchmarks",
    "gpu_step": "benchmarks",
    "mutant_differential": "tools",
    "mutant_equivalence": "tools",
    "mutation_fresh_process": "tools",
    "gpu_wheels": "tools",
    "decode_attention": "benchmarks",
    "pack_runs": "tools",
    "replication": "experiments.cpu_table",
    "parted_runs": "experiments.cpu_table",
    "range_gap_replay": "experiments.cpu_table",
    "grpo_pilot_eval": "experiments.pilots",
    "grpo_stock_pilot": "experiments.pilots",
    "kl_cov_topk": "experiments.investigations",
    "inductor_mask_and": "experiments.investigations",
    "grading_fast_path": "experiments.investigations",
}
"""Where each script lives: benchmarks/ (speed and memory), tools/, experiments/ (run with ``python -m``)."""


def script_module(name: str):
    """A script of benchmarks/, tools/ or experiments/ imported as the module ``python -m`` runs."""
    return importlib.import_module(f"{SCRIPT_PACKAGES[name]}.{name}")


def script_command(name: str) -> list[str]:
    """The command line that runs a script as ``python -m`` does (from the repository root: ``cwd=ROOT``)."""
    return [sys.executable, "-m", f"{SCRIPT_PACKAGES[name]}.{name}"]
