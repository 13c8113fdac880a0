"""Which checkpoints a run can resume from: only complete ones, so a run killed while writing one loses nothing.

transformers writes ``checkpoint-N/`` in place, its ``trainer_state.json`` after the weights, optimizer, scheduler
and RNG states; a process killed during the write leaves a folder without that file or with a cut one. A checkpoint
is complete when its ``trainer_state.json`` parses (``is_complete_checkpoint``); resuming from "latest" takes
the newest complete one, and an incomplete one named explicitly is refused.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

STATE_FILE = "trainer_state.json"
LATEST = ("latest", "true", "True")
"""``--resume_from_checkpoint`` values that mean the newest complete checkpoint of ``--output_dir``."""


def checkpoint_step(path: Path) -> int | None:
    """N of a ``checkpoint-N`` folder name, else None."""
    m = re.fullmatch(r"checkpoint-(\d+)", Path(path).name)
    return int(m.group(1)) if m else None


def is_complete_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` holds a checkpoint written to its end (its ``trainer_state.json`` parses as a JSON object)."""
    state = Path(path) / STATE_FILE
    try:
        return isinstance(json.loads(state.read_text()), dict)
    except (OSError, ValueError):
        return False


def complete_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every complete ``checkpoint-N`` in ``run_dir``, by step."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = [(checkpoint_step(p), p) for p in run_dir.iterdir() if p.is_dir() and checkpoint_step(p) is not None]
    return sorted((step, p) for step, p in found if is_complete_checkpoint(p))


def latest_complete_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of ``run_dir`` (None when there is none)."""
    found = complete_checkpoints(run_dir)
    return found[-1][1] if found else None
