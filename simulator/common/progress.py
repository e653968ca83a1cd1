"""Progress on stderr for every command that can take more than a few seconds; never on stdout
(JSON and tables stay clean), and never in the result.

On a terminal one status line is redrawn in place, cut to the terminal's width: the command, the
stage, a bar with the fraction done and an estimate of the time left when the number of steps is
known (points of a sweep, cases of a validation, what-if simulations), else a spinner and the
elapsed time. Off a terminal (CI logs, pipes, files) each stage and each finished step is one
plain line, ``what: 3/10 12.3 s (ETA 28 s) note``, so a log shows where a long command is. ``--quiet``
silences it; ``--progress`` asks for it explicitly (it is the default).

A command adds the flags with :func:`add_progress_flags` and opens a reporter with
:func:`progress_from_args`; a study takes whatever its caller passes through :func:`as_progress`
(None: silent; a stream; or a :class:`Progress` to share one line between studies)::

    with progress_from_args(args, "whatif") as bar:
        bar.phase("simulating each resource faster and slower", total=len(tasks))
        for ... in work:
            bar.advance("nvlink:faster")
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

SPINNER = "|/-\\"
DEFAULT_COLUMNS = 80
# the fewest columns a status line is drawn in: narrower terminals get this and wrap
MIN_COLUMNS = 20


def add_progress_flags(parser: argparse.ArgumentParser) -> None:
    """``--progress`` / ``--quiet`` on a subcommand."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--progress", action="store_true",
                       help="progress on stderr (the default): a status line on a terminal, else a line per stage "
                            "or point")
    group.add_argument("--quiet", action="store_true", help="no progress on stderr (errors and warnings still show)")


def progress_enabled(args: argparse.Namespace) -> bool:
    return not getattr(args, "quiet", False)


def progress_from_args(args: argparse.Namespace, what: str, total: int | None = None, stream=None) -> "Progress":
    stream = stream if stream is not None else sys.stderr
    return Progress(what, total, enabled=progress_enabled(args), stream=stream)


def as_progress(progress, what: str) -> "Progress":
    """A study's reporter from what its caller passed: a :class:`Progress` (shared, used as it is),
    a stream (plain lines on it, even on a terminal: a status line redrawn in place needs an owner
    to clear it at the end, as the commands' ``with`` blocks do) or None (a silent one)."""
    if isinstance(progress, Progress):
        return progress
    if progress is None:
        return Progress(what, enabled=False)
    return Progress(what, stream=progress, live=False)


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def columns(stream) -> int:
    """The width of the terminal ``stream`` writes to: ``COLUMNS`` when set (as shells and
    ``shutil.get_terminal_size`` honour it), else the terminal's own, else ``DEFAULT_COLUMNS``.
    Asked of ``stream`` itself, not of stdout, which is often a pipe when stderr is a terminal."""
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return max(MIN_COLUMNS, int(env))
    try:
        width = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        width = 0
    return max(MIN_COLUMNS, width or DEFAULT_COLUMNS)


def duration(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``2 h 07 min``: an estimate needs no more digits."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class Progress:
    """One command's progress (module docstring).

    ``phase(text, total)`` starts a stage (of ``total`` steps when known), ``advance(note)``
    counts one step of it, ``resume(done)`` counts steps a previous run finished (kept out of the
    time estimate), ``status(text)`` updates the terminal line only, ``note(text)`` is a line of
    its own everywhere (a resumed log, a dead worker). A disabled reporter does nothing; one that
    is not ``live`` writes plain lines even to a terminal.
    """

    def __init__(self, what: str, total: int | None = None, *, enabled: bool = True, stream=None,
                 interval_s: float = 0.25, live: bool = True):
        self.what, self.enabled = what, enabled
        self.stream = stream if stream is not None else sys.stderr
        self.tty = enabled and live and _isatty(self.stream)
        self.interval_s = interval_s
        self.start = time.monotonic()
        self.text = ""
        self.total = total
        self.done = 0
        self._resumed = 0
        self._stage_start = self.start
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._drawn = False

    def __enter__(self) -> "Progress":
        if self.tty and self._thread is None:
            self._thread = threading.Thread(target=self._tick, name="stepsim-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- what callers say ---------------------------------------------------------------------

    def phase(self, text: str, total: int | None = None) -> None:
        """A stage begins: ``text`` says what runs (empty: no line of its own off a terminal),
        ``total`` how many steps it has (if known)."""
        with self._lock:
            self.text, self.total, self.done, self._resumed = text, total, 0, 0
            self._stage_start = time.monotonic()
            if self.tty:
                self._draw()
            elif self.enabled and text:
                self._line(f"{self._elapsed()} {text}")

    def resume(self, done: int) -> None:
        """``done`` steps of this stage were finished by an earlier run (a resumed log)."""
        with self._lock:
            self.done += done
            self._resumed += done

    def advance(self, note: str = "", total: int | None = None) -> None:
        """One step of the stage finished; ``total`` may be given here when only the worker knows it."""
        with self._lock:
            if total is not None:
                self.total = total
            self.done += 1
            if note:
                self.text = note
            if self.tty:
                self._draw()
            elif self.enabled:
                eta = self._eta()
                self._line(f"{self._count()} {self._elapsed()}{f' (ETA {eta})' if eta else ''} {note}".rstrip())

    def status(self, text: str) -> None:
        """Detail of the running stage, shown on a terminal only (too frequent for a log)."""
        with self._lock:
            self.text = text
            if self.tty:
                self._draw()

    def note(self, text: str) -> None:
        """A line of its own, on a terminal too (the status line is redrawn below it)."""
        with self._lock:
            if not self.enabled:
                return
            if self.tty:
                self._clear()
            self._line(text)
            if self.tty:
                self._draw()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            if self.tty:
                self._clear()

    # --- drawing ------------------------------------------------------------------------------

    def _elapsed(self) -> str:
        return f"{time.monotonic() - self.start:.1f} s"

    def _count(self) -> str:
        return f"{self.done}/{self.total}" if self.total else f"#{self.done}"

    def _eta(self) -> str | None:
        """Time left at the pace of the steps this run finished; None until one has, or without a total."""
        ran = self.done - self._resumed
        if not self.total or ran < 1 or self.done >= self.total:
            return None
        pace = (time.monotonic() - self._stage_start) / ran
        return duration(pace * (self.total - self.done))

    def _tick(self) -> None:
        while not self._stop.wait(self.interval_s):
            with self._lock:
                self._draw()

    def _line(self, text: str) -> None:
        try:
            print(f"{self.what}: {text}", file=self.stream, flush=True)
        except (BrokenPipeError, ValueError):
            self.enabled = self.tty = False

    def _clear(self) -> None:
        if self._drawn:
            self._write("\r\x1b[K")
            self._drawn = False

    def _draw(self) -> None:
        width = columns(self.stream) - 1  # the last column would wrap on some terminals
        elapsed = time.monotonic() - self.start
        if self.total:
            cells = max(8, min(24, width // 6))
            filled = cells * min(self.done, self.total) // self.total
            eta = self._eta()
            head = (f"{self.what} [{'#' * filled}{'.' * (cells - filled)}] {self._count()} "
                    f"{min(self.done, self.total) / self.total:.0%} {elapsed:.1f} s"
                    + (f", ETA {eta}" if eta else ""))
        else:
            spin = SPINNER[int(elapsed / self.interval_s) % len(SPINNER)]
            head = f"{self.what} {spin} {elapsed:.1f} s"
        line = f"{head}  {self.text}" if self.text else head
        if len(line) > width:
            line = line[:max(0, width - 3)] + "..."
        self._write("\r" + line + "\x1b[K")
        self._drawn = True

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (BrokenPipeError, ValueError):
            self.enabled = self.tty = False
