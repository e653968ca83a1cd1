"""Worker processes that die with the process that started them, and a pool that outlives any one of them.

A ``kill -9`` of a sweep's main process gives it no chance to stop its pool, and plain pool
workers would run on as orphans, burning CPU for results nobody collects. Every worker here
is started with :func:`die_with_parent` as its initializer: on Linux the kernel sends it SIGKILL
when its parent dies (``prctl(PR_SET_PDEATHSIG)``, prctl(2)); elsewhere a daemon thread polls
the parent id once a second and exits when it changes (the worker was re-parented). Workers
stay in their parent's process group (nothing here calls ``setsid``), so ``kill -- -PGID`` or a
terminal's Ctrl-C reaches all of them.

The other way round, a worker killed under a running study (the out-of-memory killer's SIGKILL
on the one simulation that outgrew the machine) must cost that one task only. A
``concurrent.futures`` process pool breaks whole on the first dead worker: every pending task
fails with ``BrokenProcessPool`` and nothing says which one the dead worker held. :class:`Pool`
is Pebble's process pool instead, which knows which worker took which task, fails that task's
future alone with ``ProcessExpired`` (its exit code) and starts a new worker for the rest;
:func:`outcome` turns that into a :class:`Lost` the studies report by name.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from pebble import ProcessExpired, ProcessPool

from simulator.common.errors import ConfigError
from simulator.common.limits import WORKERS_PER_CPU, cpu_count, default_workers, local_limit

PR_SET_PDEATHSIG = 1  # linux/prctl.h
POLL_S = 1.0


def _exit_when_orphaned(parent: int) -> None:
    while True:
        threading.Event().wait(POLL_S)
        if os.getppid() != parent:
            os._exit(1)


def die_with_parent(parent: int) -> None:
    """Pool initializer: arrange for this worker to die when process ``parent`` does."""
    armed = False
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)
    if not armed:
        threading.Thread(target=_exit_when_orphaned, args=(parent,), name="orphan-watch", daemon=True).start()


def check_local_workers(workers: int | None, executor: str = "process", address: str | None = None) -> int:
    """``workers`` if it is a whole number >= 1 and the workers are not local (Ray with an
    ``address``: a cluster) or this machine can hold that many processes (a process pool or a local
    Ray), else a one-line error: with fork every process starts at once, and a thousand of them
    would exhaust the memory. The one check of ``--workers`` for the CLI, sweep, validate and plan;
    None is the default, ``default_workers()``."""
    if workers is None:
        workers = default_workers()
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ConfigError("--workers", workers, "must be a whole number >= 1 (or left out: the default)")
    limit = local_limit()
    if workers > limit and not (executor == "ray" and address):
        raise ConfigError("--workers", workers, f"at most {limit} local processes on this {cpu_count()}-CPU "
                          f"machine ({WORKERS_PER_CPU} per CPU, with a process pool or a local Ray); to use more "
                          "machines, --executor ray --address a Ray cluster")
    return workers


@dataclass(frozen=True)
class Lost:
    """A task whose worker process died before returning: ``exitcode`` as ``multiprocessing``
    gives it (minus the signal number for a signal)."""

    exitcode: int | None

    @property
    def cause(self) -> str:
        """How the worker ended, in words."""
        code = self.exitcode
        if code is None:
            return "its worker process ended without a result"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            oom = " (as the out-of-memory killer does)" if -code == signal.SIGKILL else ""
            return f"its worker process was killed by {name}{oom}"
        return f"its worker process exited with status {code} before returning a result"


def outcome(future: Future):
    """The future's result, or a :class:`Lost` if its worker process died (an error the task raised
    is raised here, as ``Future.result`` does)."""
    try:
        return future.result()
    except ProcessExpired as err:
        return Lost(err.exitcode)


class Pool:
    """A process pool whose workers die with this process and in which a dead worker loses its own
    task alone (module docstring). ``submit`` gives a ``concurrent.futures.Future``
    (``as_completed`` takes it); leaving the ``with`` block on an exception stops the workers at
    once instead of waiting for their tasks."""

    def __init__(self, workers: int):
        self._pool = ProcessPool(max_workers=workers, initializer=die_with_parent, initargs=(os.getpid(),))

    def submit(self, fn: Callable, arg) -> Future:
        return self._pool.schedule(fn, args=(arg,))

    def map(self, fn: Callable, items: Sequence) -> list:
        """``fn`` of each item, in order; a :class:`Lost` in the place of an item whose worker died."""
        futures = [self.submit(fn, x) for x in items]
        return [outcome(f) for f in futures]

    def close(self, cancel: bool = False) -> None:
        """Wait for the submitted tasks, or (``cancel``) drop them and stop the workers now."""
        if cancel:
            self._pool.stop()
        else:
            self._pool.close()
        self._pool.join()

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(cancel=exc_type is not None)


def process_pool(workers: int) -> Pool:
    """A process pool whose workers die with this process (see the module docstring)."""
    return Pool(workers)
