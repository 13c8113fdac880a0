"""The mask-mechanism study (docs/experiments/mask-mechanism-preregistration.md): pre-registered before its outputs,
and its commands name the driver's runs with the reuse depths its table gives."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("trl")

from experiments import cpu_table  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PREREG = "docs/experiments/mask-mechanism-preregistration.md"
OUTPUTS = ("figures/paper/contextual_bandit.json", "figures/experiments/mask_mechanism")


def _first_commit(path: str) -> str | None:
    out = subprocess.run(
        ["git", "log", "--reverse", "--format=%H", "--", path], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0] if out else None


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs the git history")
def test_the_preregistration_was_committed_before_any_output_of_the_study():
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True)
    if shallow.stdout.strip() == "true":
        pytest.skip("a shallow clone holds no history to order")
    prereg = _first_commit(PREREG)
    assert prereg is not None
    for output in OUTPUTS:
        first = _first_commit(output)
        if first is None:
            continue  # not run yet
        ancestor = subprocess.run(["git", "merge-base", "--is-ancestor", prereg, first], cwd=ROOT)
        assert ancestor.returncode == 0 and first != prereg, output


def test_the_dose_response_commands_are_the_depths_of_the_table():
    text = (ROOT / PREREG).read_text()
    table = {int(d): (int(s), int(n)) for d, s, n in re.findall(r"^\| (\d+) \| (\d+) \| (\d+) \|", text, re.M)}
    assert sorted(table) == [1, 4, 8, 16, 32] and all(s * n == d for d, (s, n) in table.items())
    commands = [line for line in text.splitlines() if line.startswith("python -m experiments.cpu_table --runs clip clip")]
    assert len(commands) == 5
    for line in commands:
        runs = re.search(r"--runs (.*?) \$S", line).group(1).split()
        assert set(runs) == {"clip", "clip-mask"} and set(runs) <= set(cpu_table.CPU_RUNS)
        s, n = (int(re.search(rf"--{flag} (\d+)", line).group(1)) for flag in ("steps-per-generation", "num-iterations"))
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
            logged = [x for x in rows if (x["depth"], x["run"], x["seed"]) == (depth, r["method"], r["seed"]) and x["reward"]]
            assert logged, (depth, r["method"], r["seed"])
            assert float(logged[-1]["reward"]) == float(r["train_reward_last"])
