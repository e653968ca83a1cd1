"""A child process that runs one call at a time within a wall-time and a memory budget.

The property tests hand it thousands of generated inputs: a hang is caught by the parent (the
child is killed and started again), and the peak memory of each call is measured in the child
(Linux: the resident high-water mark, reset before the call through /proc/self/clear_refs). The
child's address space is also capped, so a runaway input fails the test instead of the machine.
The child serves until its pipe closes, so it ends with the test process that started it
(``close``, also run at exit, kills it if it is still busy).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import multiprocessing
import os
import re
import resource
import traceback
from dataclasses import dataclass

MiB = 2**20


@dataclass
class Outcome:
    kind: str  # "ok", "raised" (value: the exception's type name and text), "hang", "died"
    value: object = None
    peak_bytes: int = 0  # above the resident size before the call
    trace: str = ""


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.M).group(1)) * 1024


def _serve(conn, headroom_bytes: int, cwd: str | None) -> None:
    if cwd is not None:
        os.chdir(cwd)  # files a call writes by a relative name land here
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import simulator.cli  # noqa: F401  (imported before the address space is capped)

    limit = _status("VmSize") + headroom_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    while True:
        try:
            fn, args = conn.recv()
        except EOFError:
            return
        before = _status("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current resident size
        try:
            out = Outcome("ok", fn(*args))
        except BaseException as err:  # noqa: BLE001 (every escape is an outcome to report)
            out = Outcome("raised", (type(err).__name__, str(err)[:2000]), trace=traceback.format_exc()[-4000:])
        out.peak_bytes = max(0, _status("VmHWM") - before)
        conn.send(out)


class Sandbox:
    """``call(fn, *args, timeout_s=...)``: ``fn(*args)`` in the child; ``fn`` must be importable."""

    def __init__(self, headroom_bytes: int = 2048 * MiB, cwd: str | None = None):
        self.headroom_bytes = headroom_bytes
        self.cwd = cwd
        self._proc = None

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        # not a daemon: a daemon may not start the process pools of sweep, plan and validate
        self._proc = ctx.Process(target=_serve, args=(child, self.headroom_bytes, self.cwd))
        self._proc.start()
        child.close()
        atexit.register(self.close)

    def call(self, fn, *args, timeout_s: float) -> Outcome:
        if self._proc is None:
            self._start()
        self._conn.send((fn, args))
        if not self._conn.poll(timeout_s):
            self.close()
            return Outcome("hang", f"no answer within {timeout_s} s")
        try:
            return self._conn.recv()
        except EOFError:
            code = self._proc.exitcode
            self.close()
            return Outcome("died", f"the child exited with {code}")

    def close(self) -> None:
        if self._proc is not None:
            self._conn.close()
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join()
            self._proc = None


def cli(argv: list[str]) -> tuple[int, str, str]:
    """``stepsim ARGV`` in this process: (status, stdout, stderr)."""
    from simulator import cli as stepsim

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = stepsim.main(argv)
        except SystemExit as stop:  # argparse: --help, --version, usage errors
            status = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 2)
    return status, out.getvalue(), err.getvalue()


def expanded_size(value, budget: int) -> int:
    """Values and keys in ``value`` with every shared reference counted again (as a copy or a JSON
    dump would visit them), counting at most ``budget + 1``."""
    stack, seen = [value], 0
    while stack and seen <= budget:
        v = stack.pop()
        seen += 1
        if isinstance(v, dict):
            stack.extend(v)
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return seen


def load_text(text: str, budget: int) -> tuple[str, object]:
    """``load_yaml_text`` of ``text``: ("value", expanded size) or ("error", the one-line message)."""
    from simulator.common.errors import ConfigError
    from simulator.common.yamlfile import load_yaml_text

    try:
        value = load_yaml_text(text, "scenario", "fuzz.yaml")
    except ConfigError as err:
        return "error", str(err)
    return "value", expanded_size(value, budget)


def load_file(path: str, budget: int) -> tuple[str, object]:
    """``load_yaml_file`` of ``path``, as ``load_text``."""
    from simulator.common.errors import ConfigError
    from simulator.common.yamlfile import load_yaml_file

    try:
        value = load_yaml_file(path, "scenario")
    except ConfigError as err:
        return "error", str(err)
    return "value", expanded_size(value, budget)
