"""Wall-clock timing shared by the benchmarks that time one call repeatedly (synchronised on CUDA)."""

from __future__ import annotations

import statistics
import time

import torch


def synchronizer(device="cpu"):
    """A no-argument function that waits for ``device``'s queued work: ``torch.cuda.synchronize`` on CUDA, else a
    no-op (a CPU op has finished when it returns)."""
    return torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)


def timeit(fn, *args, repeats=5, device="cpu", reduce=statistics.median):
    """Median (or ``reduce``) of the seconds of ``fn(*args)`` after one warm-up call (synchronised on CUDA)."""
    sync = synchronizer(device)
    fn(*args)
    sync()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(*args)
        sync()
        ts.append(time.perf_counter() - t0)
    return reduce(ts)
