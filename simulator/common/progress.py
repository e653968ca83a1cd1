"""Progress on stderr for commands that take more than a moment; never on stdout (JSON stays clean).

Shown when stderr is a terminal, or when asked with ``--progress``; silent with ``--quiet`` or
when stderr is not a terminal (CI logs, pipes). On a terminal the line redraws in place (a bar
when the number of steps is known, an elapsed-time ticker while one long simulation runs); with
``--progress`` on a non-terminal each phase and each finished step is one line.

A command adds the flags with :func:`add_progress_flags` and opens a reporter with
:func:`progress_from_args`::

    with progress_from_args(args, "whatif", total=len(tasks)) as bar:
        for ... in work:
            bar.advance("nvlink:faster")
"""

from __future__ import annotations

import argparse
import sys
import threading
import time


def add_progress_flags(parser: argparse.ArgumentParser) -> None:
    """``--progress`` / ``--quiet`` on a subcommand."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--progress", action="store_true", help="show progress on stderr even when it is not a terminal")
    group.add_argument("--quiet", action="store_true", help="no progress on stderr")


def progress_enabled(args: argparse.Namespace, stream=None) -> bool:
    stream = stream if stream is not None else sys.stderr
    if getattr(args, "quiet", False):
        return False
    if getattr(args, "progress", False):
        return True
    return _isatty(stream)


def progress_from_args(args: argparse.Namespace, what: str, total: int | None = None, stream=None) -> "Progress":
    stream = stream if stream is not None else sys.stderr
    return Progress(what, total, enabled=progress_enabled(args, stream), stream=stream)


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class Progress:
    """One command's progress: ``phase(text)`` names what runs now, ``advance(note)`` counts a step."""

    def __init__(self, what: str, total: int | None = None, *, enabled: bool = True, stream=None,
                 interval_s: float = 0.25, width: int = 24):
        self.what, self.total, self.enabled = what, total, enabled
        self.stream = stream if stream is not None else sys.stderr
        self.tty = _isatty(self.stream)
        self.interval_s, self.width = interval_s, width
        self.done = 0
        self.text = ""
        self.start = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._drawn = 0

    def __enter__(self) -> "Progress":
        if self.enabled and self.tty:
            self._thread = threading.Thread(target=self._tick, name="stepsim-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def phase(self, text: str) -> None:
        """What runs now (``simulating``, ``writing step.png``)."""
        with self._lock:
            self.text = text
            if self.enabled and not self.tty:
                self._line(text)
            elif self.enabled:
                self._draw()

    def advance(self, note: str = "", total: int | None = None) -> None:
        """One step of ``total`` finished (``total`` may be given here when only the worker knows it)."""
        with self._lock:
            if total is not None:
                self.total = total
            self.done += 1
            if note:
                self.text = note
            if self.enabled and not self.tty:
                count = f"{self.done}/{self.total}" if self.total else f"{self.done}"
                self._line(f"{count} {note}".rstrip())
            elif self.enabled:
                self._draw()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            if self.enabled and self.tty and self._drawn:
                self.stream.write("\r" + " " * self._drawn + "\r")
                self.stream.flush()
                self._drawn = 0

    def _tick(self) -> None:
        while not self._stop.wait(self.interval_s):
            with self._lock:
                self._draw()

    def _line(self, text: str) -> None:
        print(f"{self.what}: {time.monotonic() - self.start:.1f} s {text}", file=self.stream, flush=True)

    def _draw(self) -> None:
        elapsed = time.monotonic() - self.start
        if self.total:
            filled = self.width * min(self.done, self.total) // self.total
            head = f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total}"
        else:
            head = "|/-\\"[int(elapsed / self.interval_s) % 4]
        line = f"{self.what} {head} {elapsed:6.1f} s  {self.text[:50]}"
        pad = max(0, self._drawn - len(line))
        self.stream.write("\r" + line + " " * pad)
        self.stream.flush()
        self._drawn = len(line)
