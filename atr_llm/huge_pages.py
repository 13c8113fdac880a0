"""Transparent huge pages for PyTorch's large CPU tensors: a process setting the command-line entry points make
(never an import), with what it buys."""

from __future__ import annotations

import os

HUGE_PAGES_VARIABLE = "THP_MEM_ALLOC_ENABLE"


def enable_huge_pages_for_large_cpu_tensors() -> bool:
    """Ask PyTorch's CPU allocator to back tensors of 2 MiB and more with transparent huge pages
    (``THP_MEM_ALLOC_ENABLE=1``), unless the variable is already set (``THP_MEM_ALLOC_ENABLE=0`` opts out).

    PyTorch reads the variable once, at its first such allocation, so an entry point calls this before it builds a
    model. At Qwen3's 151,936-row vocabulary a CPU step otherwise spends most of its time in page faults: a
    log-softmax + backward over (32, 30, 151936) took 4.0 s without and 1.6 s with it on a 2-core machine.
    Allocation only: the numbers are the same. Returns whether the setting is on after the call.

    Called by ``python -m atr_llm.train``, ``python -m atr_llm.evaluate`` and the experiment driver; child processes
    inherit it. ``import atr_llm`` does not call it.
    """
    os.environ.setdefault(HUGE_PAGES_VARIABLE, "1")
    return os.environ[HUGE_PAGES_VARIABLE] == "1"
