"""The mask-mechanism study (docs/experiments/mask-mechanism-preregistration.md): pre-registered before its outputs,
and its commands name the driver's runs with the reuse depths its table gives."""

from __future__ import annotations

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
