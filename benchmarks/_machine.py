"""Where a benchmark writes its numbers: ``figures/bench/<machine>/<name>``, one folder per kind of machine."""

from __future__ import annotations

import re
from pathlib import Path


def machine_name(device: str = "cpu") -> str:
    """A short name of the machine a benchmark measures: ``"cpu"`` for the CPU, else the CUDA card's model in lower
    case (``"NVIDIA H100 80GB HBM3"`` -> ``"h100"``, ``"NVIDIA H200"`` -> ``"h200"``).

    >>> machine_name("cpu")
    'cpu'
    """
    if not str(device).startswith("cuda"):
        return "cpu"
    import torch

    name = torch.cuda.get_device_name(torch.device(device))
    found = re.search(r"\b([A-Z]\d{2,4}[A-Z]?)\b", name.replace("NVIDIA", ""))
    return (found.group(1) if found else re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")).lower()


def default_output(name: str, device: str = "cpu") -> Path:
    """``figures/bench/<machine_name(device)>/<name>``: the benchmark's default ``--out``."""
    return Path("figures") / "bench" / machine_name(device) / name
