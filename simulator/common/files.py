"""Atomic file writes: results are never lost and never half-written.

A file is written to a hidden temporary next to its target (``.NAME.XXXX.tmp``), flushed to disk,
given the permissions a plain ``open`` would give, and renamed over the target in one step. A
process killed mid-write leaves at most a stale temporary, which :func:`remove_stale` clears.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable


def atomic_write(path: str | Path, write: Callable[[object], None], binary: bool = False) -> None:
    """Call ``write(file)`` on a temporary and rename it over ``path``."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"newline": ""})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text))


def remove_stale(folder: str | Path) -> None:
    """Delete temporaries left by a killed writer (call only while no other writer runs)."""
    for stale in Path(folder).glob(".*.tmp"):
        stale.unlink(missing_ok=True)
