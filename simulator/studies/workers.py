"""Worker processes that die with the process that started them.

A ``kill -9`` of a sweep's main process gives it no chance to stop its pool, and plain pool
workers would run on as orphans, burning CPU for results nobody collects. Every worker here
is started with :func:`die_with_parent` as its initializer: on Linux the kernel sends it SIGKILL
when its parent dies (``prctl(PR_SET_PDEATHSIG)``, prctl(2)); elsewhere a daemon thread polls
the parent id once a second and exits when it changes (the worker was re-parented). Workers
stay in their parent's process group (nothing here calls ``setsid``), so ``kill -- -PGID`` or a
terminal's Ctrl-C reaches all of them.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from concurrent.futures import ProcessPoolExecutor

from simulator.common.errors import ConfigError

PR_SET_PDEATHSIG = 1  # linux/prctl.h
POLL_S = 1.0
# Local pool processes per CPU: the simulator is CPU-bound, so more only queue for the cores while
# each holds its own simulation in memory (about 0.1-1 GiB on a 16K-GPU cluster).
WORKERS_PER_CPU = 4


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


def local_limit() -> int:
    """The most pool processes this machine runs: ``WORKERS_PER_CPU`` per CPU."""
    return WORKERS_PER_CPU * (os.cpu_count() or 1)


def check_local_workers(workers: int, executor: str = "process", address: str | None = None) -> int:
    """``workers`` if it is a whole number >= 1 and the workers are not local (Ray with an
    ``address``: a cluster) or this machine can hold that many processes (a process pool or a local
    Ray), else a one-line error: with fork every process starts at once, and a thousand of them
    would exhaust the memory. The one check of ``--workers`` for the CLI, sweep, validate and plan."""
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ConfigError("--workers", workers, "must be a whole number >= 1 (or left out: the default)")
    limit = local_limit()
    if workers > limit and not (executor == "ray" and address):
        raise ConfigError("--workers", workers, f"at most {limit} local processes on this {os.cpu_count() or 1}-CPU "
                          f"machine ({WORKERS_PER_CPU} per CPU, with a process pool or a local Ray); to use more "
                          "machines, --executor ray --address a Ray cluster")
    return workers


def process_pool(workers: int) -> ProcessPoolExecutor:
    """A process pool whose workers die with this process (see the module docstring)."""
    return ProcessPoolExecutor(workers, initializer=die_with_parent, initargs=(os.getpid(),))
