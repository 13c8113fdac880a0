"""Peak resident memory of one step in a process (Linux), shared by the benchmarks that report memory.

glibc keeps freed blocks below its mmap threshold (up to 32 MiB) in the heap, so a process that frees and
re-allocates many 8 MiB blocks grows its RSS without its live memory growing; children started with
``MMAP_ENV`` mmap every block >= 1 MiB, so their high-water mark is that of live memory.
"""

from __future__ import annotations

import os

MMAP_ENV = {"MALLOC_MMAP_THRESHOLD_": os.environ.get("MALLOC_MMAP_THRESHOLD_", str(1 << 20))}


def rss_mib(field: str = "VmRSS") -> float:
    """``VmRSS`` (now) or ``VmHWM`` (high-water mark) of this process from /proc/self/status, in MiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024


def reset_rss_peak_mib() -> float:
    """Reset the high-water mark to the current RSS (``clear_refs`` 5) and return it, so the next
    ``rss_mib("VmHWM")`` measures only what follows, not a peak an earlier setup left."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return rss_mib("VmRSS")
