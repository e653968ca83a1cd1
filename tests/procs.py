"""Live processes from Linux /proc, for the tests that kill a study and check its pool workers."""

import os
import signal
import time
from pathlib import Path


def live_children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` and that are not zombies."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            kids.append(int(stat.parent.name))
    return kids


def alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] != "Z"


def wait_for_lines(proc, path: Path, lines: int, timeout_s: float) -> None:
    """Poll until ``path`` holds ``lines`` lines, ``proc`` has exited or ``timeout_s`` has passed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists() and path.read_bytes().count(b"\n") >= lines:
            return
        time.sleep(0.005)


def kill_9(proc, workers: list[int]) -> list[int]:
    """SIGKILL ``proc`` and reap it; the ``workers`` still alive 5 s later."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(alive(w) for w in workers):
        time.sleep(0.02)
    return [w for w in workers if alive(w)]


def kill_all(pids: list[int]) -> None:
    """SIGKILL each process still there: no stray process is left behind, even by a failed test."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def cpu_ticks(pid: int) -> int:
    """User plus system CPU time of ``pid`` so far, in clock ticks (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0
    return int(fields[11]) + int(fields[12])


def busy_child(pid: int, timeout_s: float, window_s: float = 0.5) -> int | None:
    """A child of ``pid`` that is computing (its CPU time grew by a tenth of ``window_s`` or more
    within ``window_s``): a pool worker in the middle of a task, not one waiting for one. None if
    there is none within ``timeout_s``."""
    hz = os.sysconf("SC_CLK_TCK")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        before = {k: cpu_ticks(k) for k in live_children(pid)}
        time.sleep(window_s)
        for kid, ticks in before.items():
            if alive(kid) and cpu_ticks(kid) - ticks >= 0.1 * window_s * hz:
                return kid
    return None
