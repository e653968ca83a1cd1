"""Output paths, checked before any work starts: a bad path is a one-line error, not a traceback
after a long simulation.

What is accepted (the same for every command):
- A file output (``run --trace``, ``run --timeline``, ``validate --plot``) must end in one of the
  extensions its writer produces, must not be an existing directory, and its folder must already
  exist and be writable (a typo in a folder name is an error, not a new folder).
- An existing file at that path is overwritten (re-running a command to refresh its result is the
  normal case). Writes go through ``files.atomic_write``: a new file is renamed over the old one,
  so the old result stays whole until the new one is complete. A read-only file, or a path that
  exists but is not a regular file (a socket, a device), is refused: overwriting those is never
  what was meant.
- A folder output (``sweep --out``, ``whatif --out``) may exist (a sweep resumes there) or not (it
  is created, with its missing parents); it must not be a file, and the nearest folder that exists
  above it must be writable.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from simulator.common.errors import ConfigError

FIGURE_SUFFIXES = (".png", ".svg", ".pdf")
JSON_SUFFIXES = (".json",)


def _text(path: object, field: str) -> Path:
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip() or "\0" in str(path):
        raise ConfigError(field, path, "must be a file path")
    return Path(path)


def _guarded(check):
    """An OS refusal while looking at the path (name too long, a loop of links) is a ConfigError too."""
    def run(path, field, *rest):
        try:
            return check(path, field, *rest)
        except OSError as err:
            raise ConfigError(field, str(path), f"cannot be used ({err.strerror or err.__class__.__name__})") from None
    run.__doc__, run.__name__ = check.__doc__, check.__name__
    return run


@_guarded
def check_output_path(path: str | os.PathLike, field: str, allowed_suffixes: Iterable[str]) -> Path:
    """``path`` as a Path if a file of one of ``allowed_suffixes`` can be written there, else ConfigError.

    ``allowed_suffixes`` are lower-case with the dot (``(".png", ".svg", ".pdf")``); the check
    ignores case (``STEP.PNG`` is a PNG).
    """
    allowed = tuple(allowed_suffixes)
    p = _text(path, field)
    shown = str(path)
    if p.is_dir() or shown.endswith(("/", os.sep)):
        raise ConfigError(field, shown, f"is a directory; give a file name ending in {_listing(allowed)}")
    if p.suffix.lower() not in allowed:
        raise ConfigError(field, shown, f"unsupported extension {p.suffix or '(none)'!r}; valid: {_listing(allowed)}")
    parent = p.parent
    if not parent.is_dir():
        what = "is not a folder" if parent.exists() else "does not exist"
        raise ConfigError(field, shown, f"folder {str(parent)!r} {what}; create it first")
    _probe(parent, field, shown)
    if p.exists() or p.is_symlink():
        if not p.is_file():
            raise ConfigError(field, shown, "exists and is not a regular file; give another name")
        if not os.access(p, os.W_OK):
            raise ConfigError(field, shown, "exists and is read-only; remove it or give another name")
    return p


@_guarded
def check_output_folder(path: str | os.PathLike, field: str) -> Path:
    """``path`` as a Path if it is, or can be created as, a writable folder; else ConfigError."""
    p = _text(path, field)
    shown = str(path)
    if p.exists() and not p.is_dir():
        raise ConfigError(field, shown, "is a file, not a folder; give a folder name")
    ancestor = p
    while not ancestor.exists():
        if ancestor.is_symlink():
            raise ConfigError(field, shown, f"{str(ancestor)!r} is a broken link")
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigError(field, shown, f"{str(ancestor)!r} is a file, so the folder cannot be created")
    _probe(ancestor, field, shown)
    return p


def _probe(folder: Path, field: str, shown: str) -> None:
    """Create and remove a temporary file in ``folder``: the only test of writability that also
    holds for root (to whom ``os.access`` says yes everywhere) and for read-only mounts."""
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".stepsim-check-", suffix=".tmp")
    except OSError as err:
        raise ConfigError(field, shown, f"folder {str(folder)!r} is not writable ({err.strerror})") from None
    os.close(fd)
    os.unlink(tmp)


def _listing(suffixes: tuple[str, ...]) -> str:
    return ", ".join(suffixes)
