"""The trace of a step as Chrome Trace Event Format JSON, which ui.perfetto.dev and chrome://tracing open.

Layout: one process per pipeline stage; per simulated rank one thread per stream: ``schedule``
(one slice per forward or backward step of a micro-batch), ``compute`` (kernels, waits on
collectives and pipeline idle, one after another) and ``dp`` (the gradient / parameter stream).
Complete events (``ph: X``) carry micro-batch, chunk, layer, bytes and FLOPs in ``args`` (a kernel slowed
by communication kernels beside it also ``beside_comm_us``, the time that cost it); pipeline
sends are flow arrows (``ph: s`` / ``f``) from the sender's step to the receiver's. A folded run
holds one representative rank per stage; run unfolded (``SimOptions(fold=False)``) for all ranks.

Times are microseconds rounded to the nanosecond, so a slice's end and its successor's start are
the same number and slices on one thread never overlap.
"""

from __future__ import annotations

import json

from simulator.trace.critical_path import category, op_name
from simulator.engine.records import Row, SimResult
from simulator.common.files import atomic_write

THREADS = ("schedule", "compute", "dp")
COPY_THREADS = ("d2h", "h2d")  # CPU activation offloading's copy streams, when the run has them
_STREAMS = {"step": "schedule", "compute": "compute", "dp": "dp", "d2h": "d2h", "h2d": "h2d"}  # trace stream -> thread


def _us(t: float) -> float:
    return round(t * 1e6, 3)


def _tid(rank: int, stream: str, threads: tuple[str, ...] = THREADS) -> int:
    return rank * len(threads) + threads.index(_STREAMS.get(stream, stream)) + 1


def _name(row: Row) -> str:
    if row.stream == "step":
        return f"{row.kind}{row.microbatch}" + (f".{row.chunk}" if row.chunk > 0 else "")
    if row.kind == "wait":
        return f"wait {op_name(row)}"
    if row.kind == "idle":
        return "idle"
    name = op_name(row)
    return f"{name} L{row.layer}" if row.layer >= 0 else name


def _args(row: Row) -> dict:
    args = {"microbatch": row.microbatch, "chunk": row.chunk, "layer": row.layer, "bytes": row.nbytes,
            "flops": row.flops, "label": row.label}
    if row.contention_s > 0:  # time the kernels lost to communication kernels' SMs
        args["beside_comm_us"] = round(row.contention_s * 1e6, 3)
    if row.host_s > 0:  # time the GPU waited on the host (kernel issue, MoE sync)
        args["host_wait_us"] = round(row.host_s * 1e6, 3)
    return args


def trace_events(result: SimResult) -> dict:
    """The Trace Event Format document of a run, as a dict ready for ``json.dump``."""
    plan = result.plan
    events: list[dict] = []
    ranks = sorted(result.simulated_ranks)
    stages = sorted({plan.stage_of(r) for r in ranks})
    for stage in stages:
        events.append({"ph": "M", "name": "process_name", "pid": stage + 1, "tid": 0,
                       "args": {"name": f"stage {stage}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": stage + 1, "tid": 0,
                       "args": {"sort_index": stage}})
    copies = {row.stream for row in result.trace if row.stream in COPY_THREADS}
    threads = THREADS + tuple(t for t in COPY_THREADS if t in copies)
    for rank in ranks:
        pid = plan.stage_of(rank) + 1
        for stream in threads:
            tid = _tid(rank, stream, threads)
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                           "args": {"name": f"rank {rank} {stream}"}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    steps: dict = {}
    for row in result.trace:
        if row.stream not in _STREAMS:
            continue
        ts, end = _us(row.start), _us(row.end)
        cat = "step" if row.stream == "step" else category(row)
        events.append({"ph": "X", "name": _name(row), "cat": cat, "pid": row.stage + 1,
                       "tid": _tid(row.rank, row.stream, threads), "ts": ts, "dur": round(end - ts, 3), "args": _args(row)})
        if row.stream == "step":
            steps[(row.rank, end)] = row
    flow = 0
    for row in result.trace:
        if row.stream != "step" or row.dep is None:
            continue
        sender, _, posted = row.dep
        src = steps.get((sender, _us(posted)))
        if src is None:
            continue
        flow += 1
        s_end, r_start = _us(src.end), _us(row.start)
        s_ts = round(s_end - min(0.001, (s_end - _us(src.start)) / 2), 3)
        r_ts = round(r_start + min(0.001, (_us(row.end) - r_start) / 2), 3)
        name = f"pp send {'activations' if row.kind == 'F' else 'gradients'}"
        events.append({"ph": "s", "name": name, "cat": "pp", "id": flow, "pid": src.stage + 1,
                       "tid": _tid(sender, "step", threads), "ts": s_ts})
        events.append({"ph": "f", "bp": "e", "name": name, "cat": "pp", "id": flow, "pid": row.stage + 1,
                       "tid": _tid(row.rank, "step", threads), "ts": r_ts})
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"scenario": result.scenario.name, "step_time_s": result.step_time_s,
                      "folded": result.options.fold, "ranks": len(ranks)},
    }


def write_trace(result: SimResult, path: str) -> None:
    """Write the trace JSON atomically: a half-written file never replaces a good one."""
    events = trace_events(result)
    atomic_write(path, lambda f: json.dump(events, f, separators=(",", ":")))
