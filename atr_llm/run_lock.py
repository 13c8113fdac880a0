"""One training run per output folder at a time.

A run holds an exclusive ``flock`` on ``<output_dir>/.atr_grpo.lock`` from before it writes anything until it ends; a
second run into the same folder is refused before any model loads, naming the folder and the pid that holds it. The
kernel releases the lock when its holder exits, however it exits, so the lock of a killed run is recovered by the next
run without anyone deleting a file. Only the main process of a distributed launch (``RANK`` 0) takes it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_NAME = ".atr_grpo.lock"


def holds_the_lock() -> bool:
    """Whether this process takes the folder's lock: the main process of a launch (``RANK`` unset or 0)."""
    return int(os.environ.get("RANK", "0") or 0) == 0


@contextmanager
def output_dir_lock(out: Path) -> Iterator[Path]:
    """Hold ``out``'s run lock for the ``with`` block (``out`` must exist); a held lock raises
    :class:`atr_llm.command_line.UsageError` for ``--output_dir``."""
    import fcntl

    from .command_line import refuse

    if not holds_the_lock():
        yield out
        return
    path = Path(out) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:  # a folder or an unreadable file in the lock's place
        raise refuse(
            "--output_dir", str(out), f"its run lock {LOCK_NAME} cannot be opened ({e.strerror}); remove {path}"
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise refuse(
                "--output_dir",
                str(out),
                f"another training (pid {holder}) is writing into it; wait for it to end or choose another folder",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield out
    finally:
        os.close(fd)  # closing the descriptor releases the lock
