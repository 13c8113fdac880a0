"""What the pre-registered studies' tests share: the check that a pre-registration was committed before the first
commit of any of its outputs (tests/studies/test_mask_mechanism_study.py, test_learning_regime_study.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def first_commit(path: str) -> str | None:
    """The first commit that touched ``path`` (a file or a folder), or None."""
    out = subprocess.run(
        ["git", "log", "--reverse", "--format=%H", "--", path], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0] if out else None


def assert_preregistered_before(prereg: str, outputs: tuple[str, ...]) -> None:
    """``prereg``'s first commit is a strict ancestor of the first commit of every output that exists in the history;
    skipped without git or in a shallow clone (no history to order)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git history")
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True)
    if shallow.stdout.strip() == "true":
        pytest.skip("a shallow clone holds no history to order")
    registered = first_commit(prereg)
    assert registered is not None, f"{prereg} was never committed"
    for output in outputs:
        first = first_commit(output)
        if first is None:
            continue  # not run yet
        ancestor = subprocess.run(["git", "merge-base", "--is-ancestor", registered, first], cwd=ROOT)
        assert ancestor.returncode == 0 and first != registered, output
