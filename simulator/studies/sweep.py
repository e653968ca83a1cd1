"""Sweeps: the cartesian product of scenario overrides, one simulation per point, in parallel.

A sweep is a base scenario (parsed YAML plus ``--set`` overrides) and varied keys, each with a
list of values, ``--vary parallelism.tp=4,8``; every point is the base with one value of each
key applied exactly as ``--set`` would. A point is evaluated by :func:`evaluate`, a pure
function of a picklable :class:`Task`, so any executor can run it: in-process (1 worker), a
local process pool (the default) or Ray (``--executor ray``, the ``stepsim[ray]`` extra). A
point whose plan is invalid is a row whose ``error`` says why; a plan that does not fit in
memory is still simulated, with ``fits`` false.

Files in the output folder, safe against ``kill -9`` at any moment:
- ``results.jsonl``: the log, one line per finished point, appended, flushed and fsynced
  before the next is reported. A point is identified by ``point_id``, a hash of its varied
  values (canonical JSON, keys sorted) and of the base scenario, so a rerun of the same
  command (or one that adds values) skips what is done. A line cut short by a kill is dropped
  when the log is next opened and that point is computed again.
- ``results.csv``: the table, rewritten from the log through a temporary file and
  ``os.replace``, so it is always a complete table of the points finished so far, in the
  order of the cartesian product.
- plots (``plots.plot_sweep``), drawn when the sweep is complete.
- ``.lock``: the pid of the sweep writing there (see ``_Lock``); a lock left by a killed sweep is
  taken over by the next one. Pool workers die with the sweep (``workers.process_pool``), so a
  ``kill -9`` of the main process leaves nothing running.
"""

from __future__ import annotations

import csv
from functools import partial
import fcntl
import hashlib
import io
import itertools
import json
import math
import os
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from simulator.scenario.config import Scenario
from simulator.common import limits
from simulator.common.errors import ConfigError, LeftOut, WorkerDied
from simulator.common.yamlfile import yaml_value
from simulator.reports.report import AXES
from simulator.scenario.load import apply_overrides, read_scenario_file, scenario_to_dict
from simulator.common.files import atomic_write_text, remove_stale
from simulator.engine.engine import scenario_cluster, simulate
from simulator.engine.records import SimOptions
from simulator.scenario.load import scenario_from_dict
from simulator.simulation import checked, run
from simulator.studies.bound import StepAbove, simulate_below
from simulator.common.progress import as_progress
from simulator.studies.workers import Lost, check_local_workers, outcome, process_pool
from concurrent.futures import as_completed
from simulator.reports.plots import plot_sweep
from simulator.scenario.load import scenario_path

# Appended columns keep their place at the end, so a table read by position stays readable:
# contention_s and host_wait_s (parts of compute_s: SMs held by communication kernels; the GPU
# waiting on the host) came after the first release.
METRICS = ("step_time_s", "tokens_per_s_per_gpu", "mfu", "bubble_fraction", "compute_s",
           *(f"exposed_{a}_s" for a in AXES), "idle_s", "peak_memory_gib", "fits", "warnings", "error",
           "contention_s", "host_wait_s")
EXECUTORS = ("process", "ray")
JSONL = "results.jsonl"
CSV = "results.csv"

Vary = tuple[tuple[str, tuple], ...]


@dataclass(frozen=True)
class Task:
    """One simulation: a parsed scenario mapping, the overrides of the point, optional what-ifs.

    ``link_scale`` multiplies the bandwidth of link classes (``topology.LINK_CLASSES``);
    ``compute_scale`` multiplies the GPU's peak FLOP/s and HBM bandwidth.
    """

    raw: dict
    base_dir: str
    name: str
    overrides: tuple[str, ...] = ()
    link_scale: tuple[tuple[str, float], ...] = ()
    compute_scale: float = 1.0
    # the planner's cutoff: stop once the step provably exceeds it (``SimOptions.stop_above_s``);
    # the row then has no step, ``stopped_above_s`` (this cutoff) and ``step_at_least_s``
    stop_above_s: float | None = None


def evaluate(task: Task) -> dict:
    """The metrics of one point (``METRICS``); a ConfigError becomes the row's ``error``. A plan
    that does not fit in memory is simulated all the same, with ``fits`` false."""
    row: dict = dict.fromkeys(METRICS)
    try:
        c = checked(scenario_from_dict(task.raw, task.overrides, base_dir=task.base_dir, default_name=task.name))
        row.update(warnings="; ".join(c.warnings) or None, peak_memory_gib=c.memory.peak_gib, fits=c.memory.fits)
        cluster = scenario_cluster(c.scenario)
        if task.link_scale:
            cluster = cluster.with_bandwidth_scaled(dict(task.link_scale))
        engine = simulate if task.stop_above_s is None else partial(simulate_below, cutoff_s=task.stop_above_s)
        r = run(c, allow_oom=True, options=SimOptions(compute_scale=task.compute_scale), cluster=cluster, engine=engine)
    except ConfigError as err:
        row["error"] = str(err)
        return row
    except StepAbove as stop:
        row.update(stopped_above_s=stop.cutoff_s, step_at_least_s=stop.bound_s)
        return row
    report = r.report.to_dict()
    b = report["time_breakdown_s"]
    row.update(step_time_s=report["step_time_s"], tokens_per_s_per_gpu=report["tokens_per_s_per_gpu"],
               mfu=report["mfu"], bubble_fraction=report["bubble_fraction"], compute_s=b["compute_s"],
               idle_s=b["idle_s"], **{f"exposed_{a}_s": b["exposed_comm_s"].get(a, 0.0) for a in AXES},
               contention_s=b["contention_s"], host_wait_s=b["host_wait_s"])
    return row


# --- points ------------------------------------------------------------------------------------

def parse_vary(items: Sequence[str] | Mapping[str, Iterable]) -> Vary:
    """``["parallelism.tp=4,8", ...]`` (or ``{"parallelism.tp": [4, 8]}``) as ((key, values), ...).

    Values are YAML values, as in ``--set``, separated by the commas outside brackets (a value may
    be a list: ``parallelism.pipeline_layers=[1,3],[2,2]``). A key or a value given twice is an error.
    """
    if isinstance(items, Mapping):
        pairs = [(str(k), tuple(v)) for k, v in items.items()]
    else:
        pairs = []
        for item in items:
            key, sep, text = str(item).partition("=")
            if not sep or not key.strip() or not text.strip():
                raise ConfigError("--vary", item, "expected key.path=v1,v2,..., e.g. parallelism.tp=4,8")
            parts = _top_level(text)
            if any(not part.strip() for part in parts):
                raise ConfigError(f"--vary {key.strip()}", text, "a value between commas is empty: write null for "
                                  "the default, or drop the extra comma")
            pairs.append((key.strip(), tuple(yaml_value(t.strip(), f"--vary {key.strip()}") for t in parts)))
    if not pairs:
        raise ConfigError("--vary", LeftOut(), "give at least one key.path=v1,v2,...")
    seen = set()
    for key, values in pairs:
        if key in seen:
            raise ConfigError("--vary", key, "varied twice: give all its values in one --vary")
        seen.add(key)
        if not values:
            raise ConfigError(f"--vary {key}", values, "needs at least one value")
        given: set[str] = set()
        for v in values:
            if _canonical(v) in given:
                raise ConfigError(f"--vary {key}", v, "value given twice")
            given.add(_canonical(v))
    count = math.prod(len(values) for _, values in pairs)
    if count > limits.SWEEP_POINTS.maximum:
        shape = " x ".join(f"{len(values)} {key}" for key, values in pairs)
        raise ConfigError("--vary", f"{count:,} points ({shape})", f"a sweep may have {limits.SWEEP_POINTS.describe()}")
    return tuple(pairs)


def _top_level(text: str) -> list[str]:
    """``text`` split at the commas outside brackets and braces, so a value may be a YAML list or
    mapping (``parallelism.pipeline_layers=[1,3],[2,2]``)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True)


def points(vary: Vary) -> list[dict]:
    """The cartesian product, first key slowest, each point a {key: value} mapping."""
    keys = [k for k, _ in vary]
    return [dict(zip(keys, combo)) for combo in itertools.product(*(v for _, v in vary))]


def point_overrides(point: Mapping) -> tuple[str, ...]:
    return tuple(f"{k}={_canonical(v)}" for k, v in point.items())


def scenario_hash(raw: dict) -> str:
    """Hash of the base scenario mapping (after ``--set``): results of another base never match."""
    return hashlib.sha256(json.dumps(raw, sort_keys=True, default=str).encode()).hexdigest()[:16]


def point_id(base_hash: str, point: Mapping) -> str:
    canon = json.dumps([base_hash, sorted(point.items())], sort_keys=True, default=str)
    return hashlib.sha256(canon.encode()).hexdigest()[:16]


def base_of(scenario: str | Path | Scenario | dict, sets: Sequence[str] = ()) -> tuple[dict, str, str]:
    """(parsed mapping with ``sets`` applied, folder for relative paths, default name)."""
    if isinstance(scenario, Scenario):
        return apply_overrides(scenario_to_dict(scenario), sets), os.getcwd(), scenario.name
    if isinstance(scenario, dict):
        return apply_overrides(scenario, sets), os.getcwd(), "scenario"
    p = scenario_path(scenario)
    return apply_overrides(read_scenario_file(p), sets), str(p.resolve().parent), p.stem


# --- executors ---------------------------------------------------------------------------------

def run_tasks(tasks: Sequence[tuple[str, Task]], executor: str = "process", workers: int | None = None,
              address: str | None = None) -> Iterator[tuple[str, dict | Lost]]:
    """Evaluate ``(id, task)`` pairs; yield ``(id, row)`` as each finishes (any order). A task whose
    worker process died (``workers.Lost``) yields that in place of its row, and the others go on."""
    if executor not in EXECUTORS:
        raise ConfigError("--executor", executor, f"valid: {', '.join(EXECUTORS)}")
    workers = check_local_workers(workers, executor, address)
    if not tasks:
        return
    if executor == "ray":
        yield from _ray(tasks, workers, address)
    elif workers == 1 or len(tasks) == 1:
        for pid, task in tasks:
            yield pid, evaluate(task)
    else:
        with process_pool(min(workers, len(tasks))) as pool:
            futures = {pool.submit(evaluate, task): pid for pid, task in tasks}
            for fut in as_completed(futures):
                yield futures[fut], outcome(fut)


def rows_of(tasks: Sequence[tuple[str, Task]], what, executor: str = "process", workers: int | None = None,
            address: str | None = None, progress=None) -> dict[str, dict]:
    """Every task's row by id, for a study that needs them all: ``progress.advance`` hears each
    one finish; a task whose worker died is named by ``what(id)`` in a ``WorkerDied`` raised once
    the rest have finished."""
    rows: dict[str, dict] = {}
    lost: list[tuple[str, Lost]] = []
    for tid, row in run_tasks(tasks, executor, workers, address):
        if isinstance(row, Lost):
            lost.append((tid, row))
            if progress is not None:
                progress.note(f"{what(tid)}: {row.cause}; the other simulations go on")
            continue
        rows[tid] = row
        if progress is not None:
            progress.advance(what(tid))
    if lost:
        tid, first = lost[0]
        more = f" (and {len(lost) - 1} more)" if len(lost) > 1 else ""
        raise WorkerDied(what(tid), first.cause + more,
                         f"the other {len(rows)} simulations finished; nothing is saved, a rerun starts over")
    return rows


def _ray(tasks: Sequence[tuple[str, Task]], workers: int, address: str | None) -> Iterator[tuple[str, dict]]:
    try:
        import ray
    except ImportError:
        raise ConfigError("--executor", "ray", "Ray is not installed: pip install 'stepsim[ray]'") from None
    started = not ray.is_initialized()
    if started:
        try:
            if address:
                ray.init(address=address, log_to_driver=False, logging_level="warning")
            else:
                ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, logging_level="warning")
        except ConnectionError as err:
            raise ConfigError("--address", address, f"cannot join the Ray cluster ({err})") from None
    try:
        remote = ray.remote(num_cpus=1)(evaluate)
        pending = {remote.remote(task): pid for pid, task in tasks}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                yield pending.pop(ref), ray.get(ref)
    finally:
        if started:
            ray.shutdown()


# --- files -------------------------------------------------------------------------------------

def read_log(path: Path) -> tuple[dict[str, dict], bool]:
    """Rows of a results.jsonl by point_id, and whether any line was unreadable (cut short)."""
    rows: dict[str, dict] = {}
    damaged = False
    if not path.exists():
        return rows, damaged
    data = path.read_bytes()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    elif lines:
        damaged = True  # no final newline: the last write was cut short
        lines.pop()
    for line in lines:
        try:
            row = json.loads(line)
            rows[row["point_id"]] = row
        except (ValueError, KeyError, TypeError):
            damaged = True
    return rows, damaged


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value)


def table_csv(rows: Sequence[dict], keys: Sequence[str]) -> str:
    """The CSV text of sweep rows: the varied keys, then ``METRICS``."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([*keys, *METRICS])
    for r in rows:
        w.writerow([_cell(r["point"][k]) for k in keys] + [_cell(r.get(m)) for m in METRICS])
    return buf.getvalue()


class _Lock:
    """An exclusive lock on the output folder that holds the owner's pid, released by the kernel
    even on kill -9.

    A POSIX record lock (``lockf``, fcntl(2) F_SETLK) belongs to the process that took it: unlike
    ``flock``, forked pool workers do not inherit it, so a worker that outlives a killed sweep
    cannot keep the folder locked. The file holds the owner's pid while the sweep runs and is
    emptied on release; a pid still there when the lock is free means its owner died without
    releasing it, and the new sweep takes the lock over with a note on stderr. In one process the
    lock is per process, so folders locked by this process are also kept in ``_HELD``.
    """

    _HELD: set[str] = set()

    def __init__(self, folder: Path, notes=None):
        self.key = str(folder.resolve())
        if self.key in _Lock._HELD:
            raise ConfigError("--out", str(folder), "another sweep in this process is writing there; use another folder")
        self.file = os.fdopen(os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o644), "r+")
        try:
            fcntl.lockf(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            owner = self._recorded()
            self.file.close()
            who = f" (pid {owner})" if owner else ""
            raise ConfigError("--out", str(folder), f"another sweep{who} is writing there; wait or use another "
                              "folder") from None
        previous = self._recorded()
        if previous and previous != os.getpid() and notes is not None:
            notes.note(f"taking over the lock of {folder}: its owner, pid {previous}, ended without releasing it "
                       "(killed?); resuming")
        self._write(f"{os.getpid()}\n")
        _Lock._HELD.add(self.key)

    def _recorded(self) -> int | None:
        self.file.seek(0)
        text = self.file.read(64).strip()
        return int(text) if text.isdigit() else None

    def _write(self, text: str) -> None:
        self.file.seek(0)
        self.file.truncate()
        self.file.write(text)
        self.file.flush()
        os.fsync(self.file.fileno())

    def release(self) -> None:
        try:
            self._write("")
        finally:
            _Lock._HELD.discard(self.key)
            self.file.close()


def _label(point: Mapping, row: dict) -> str:
    values = " ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in point.items())
    outcome = "invalid" if row.get("error") else f"{row['step_time_s']:.4g} s"
    return f"{values}: {outcome}"


def run_sweep(scenario: str | Path | Scenario | dict, vary: Sequence[str] | Mapping[str, Iterable],
              out: str | Path | None = None, *, sets: Sequence[str] = (), workers: int | None = None,
              executor: str = "process", address: str | None = None, progress=sys.stderr,
              plots: bool = True, csv_every_s: float = 1.0) -> list[dict]:
    """Run a sweep; return its rows in cartesian order, each ``{"point_id", "point", *METRICS}``.

    With ``out`` the rows go to ``results.jsonl`` / ``results.csv`` there (finished points are
    skipped on a rerun) and, with ``plots``, the figures of ``plots.plot_sweep``. ``progress``:
    a stream, a ``progress.Progress`` or None (``progress.as_progress``). A point whose worker
    process died is not logged (a rerun computes it); once the other points are done, a
    ``WorkerDied`` names it, with the rows of the finished points as ``rows``.
    """
    vary = parse_vary(vary)
    raw, base_dir, name = base_of(scenario, sets)
    for key, values in vary:
        apply_overrides(raw, [f"{key}={_canonical(values[0])}"])  # an unknown key fails once, here
    keys = [k for k, _ in vary]
    base = scenario_hash(raw)
    plan = [(point_id(base, p), p) for p in points(vary)]
    folder = Path(out) if out is not None else None
    bar = as_progress(progress, "sweep")
    lock = None
    done: dict[str, dict] = {}
    log = None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        lock = _Lock(folder, notes=bar)
        remove_stale(folder)
    try:
        if folder is not None:
            done, damaged = read_log(folder / JSONL)
            if damaged:
                atomic_write_text(folder / JSONL, "".join(json.dumps(r, sort_keys=True) + "\n" for r in done.values()))
            log = open(folder / JSONL, "a")
        todo = [(pid, Task(raw, base_dir, name, point_overrides(p))) for pid, p in plan if pid not in done]
        points_by_id = dict(plan)
        bar.phase("", total=len(plan))
        already = len(plan) - len(todo)
        if already:
            bar.resume(already)
            bar.note(f"{already} of {len(plan)} points already done")
        last_csv = 0.0
        lost: list[tuple[dict, Lost]] = []

        def finished() -> list[dict]:
            return [done[pid] for pid, _ in plan if pid in done]

        for pid, metrics in run_tasks(todo, executor, workers, address):
            if isinstance(metrics, Lost):
                lost.append((points_by_id[pid], metrics))
                bar.note(f"point {_point_text(points_by_id[pid])}: {metrics.cause}; the other points go on")
                continue
            row = {"point_id": pid, "point": points_by_id[pid], **metrics}
            done[pid] = row
            if log is not None:
                log.write(json.dumps(row, sort_keys=True) + "\n")
                log.flush()
                os.fsync(log.fileno())
                if time.monotonic() - last_csv >= csv_every_s:
                    atomic_write_text(folder / CSV, table_csv(finished(), keys))
                    last_csv = time.monotonic()
            bar.advance(_label(row["point"], row))
        rows = finished()
        if folder is not None:
            atomic_write_text(folder / CSV, table_csv(rows, keys))
        if lost:
            raise _died(lost, rows, len(plan), folder)
        if folder is not None and plots:
            plot_sweep(rows, keys, str(folder), name)
        return rows
    finally:
        if log is not None:
            log.close()
        if lock is not None:
            lock.release()


def _point_text(point: Mapping) -> str:
    return " ".join(f"{k}={v}" for k, v in point.items())


def _died(lost: list[tuple[dict, Lost]], rows: list[dict], total: int, folder: Path | None) -> WorkerDied:
    """The one-line error of a sweep that lost points to dead workers (``run_sweep``), with the
    finished rows as ``rows``."""
    point, first = lost[0]
    more = f" (and {len(lost) - 1} more point{'s' if len(lost) > 2 else ''})" if len(lost) > 1 else ""
    if folder is not None:
        after = (f"the other {len(rows)} of {total} points are in {folder / JSONL}; rerun the same command to "
                 "resume: it simulates only the missing points")
    else:
        after = f"the other {len(rows)} of {total} points finished (no --out folder: nothing to resume)"
    err = WorkerDied(f"sweep point {_point_text(point)}", first.cause + more, after)
    err.rows = rows
    return err


def format_table(rows: Sequence[dict], keys: Sequence[str]) -> str:
    """A short text table: varied values, step time, tokens/s/GPU, MFU, bubble, memory, fits."""
    short = [k.rsplit(".", 1)[-1] for k in keys]
    widths = [max(len(s), 8) for s in short]
    head = " ".join(f"{s:>{w}}" for s, w in zip(short, widths))
    lines = [f"{head} {'step_s':>10} {'tok/s/GPU':>10} {'MFU':>6} {'bubble':>7} {'mem_GiB':>8}  fits"]
    for r in rows:
        vals = " ".join(f"{str(r['point'][k]):>{w}}" for k, w in zip(keys, widths))
        if r.get("error"):
            lines.append(f"{vals} invalid: {r['error']}")
            continue
        fits = "yes" if r["fits"] else "NO"
        lines.append(f"{vals} {r['step_time_s']:>10.4f} {r['tokens_per_s_per_gpu']:>10.1f} {r['mfu']:>6.1%} "
                     f"{r['bubble_fraction']:>7.1%} {r['peak_memory_gib']:>8.1f}  {fits}")
    return "\n".join(lines)

