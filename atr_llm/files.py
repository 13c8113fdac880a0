"""Files written whole or not at all: a reader, or a process killed meanwhile, sees the old file or folder or the
whole new one, never a part. Used where a command writes its results (``python -m atr_llm.train``'s final model,
the experiment driver's tables)."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename: a reader (or a process killed meanwhile)
    sees the old file or the whole new one, never a part."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_text(text)
    os.replace(tmp, path)


@contextlib.contextmanager
def directory_written_whole(final: Path) -> Iterator[Path]:
    """Yield ``final.partial`` to write into; on leaving the block it replaces ``final`` (an earlier one is removed)
    by a rename, so a process killed meanwhile leaves no ``final`` that looks finished. On an error the partial
    folder stays for inspection and ``final`` is untouched."""
    final = Path(final)
    partial = final.with_name(final.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    yield partial
    if final.exists():
        shutil.rmtree(final)
    os.replace(partial, final)
