"""Run a sims script started by its path (``python sims/delta_sweep.py``) as the module it is.

Standard library only, so that it works before anything of the repository is importable: a script started by its
path has its own folder, not the repository root, first on ``sys.path``, and the package may not be installed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def rerun_as_module(script: str) -> None:
    """Run ``script`` again as ``python -m sims.<name>``, in the same working folder with the same arguments, the
    repository root first on ``PYTHONPATH`` (the lab's packages are not installed with the product, and nothing here
    edits ``sys.path``). Does not return (the process is replaced)."""
    path = Path(script).resolve()
    root = path.parents[1]
    module = ".".join(path.relative_to(root).with_suffix("").parts)
    pythonpath = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    os.execve(sys.executable, [sys.executable, "-m", module, *sys.argv[1:]], {**os.environ, "PYTHONPATH": pythonpath})
