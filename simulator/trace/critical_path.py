"""The critical path of a simulated step: the chain of ops and transfers that sets the step time.

Every trace row either follows its predecessor on its own stream or records in ``Row.dep`` the
(rank, stream, time) whose end released it: the rank that started the collective it waited on
(the last to arrive), the stage that sent the activations it received, the point where a
data-parallel bucket became ready. Walking back from the row that ends the step, each row
contributes the interval from what released it to its end, so the intervals tile [0, step] and
their sum is the step time.

Categories: ``compute`` (kernels, including recompute, embedding, head, optimizer), one per
communication axis (time from the start of the collective or send the chain waited on to its
end) and ``waiting`` (a wait whose cause is not recorded; zero when the trace is complete).

Slack of a row is how much later it could end without delaying the step: latest finish from a
backward pass over the same dependencies (waits are elastic, kernels and transfers are not) minus
its actual end. A category's slack is the smallest over its rows: zero for every category on the
path, and for a hidden one (say dp overlapped with the last backward) how much slower it could be
before it shows.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict

from simulator.engine.records import Row, SimResult

CATEGORIES = ("compute", "tp", "pp", "dp", "fsdp", "ep", "cp", "offload", "waiting")
COMPUTE_KINDS = ("F", "B", "W", "R", "embed", "head", "opt")
PASS_NAMES = {"F": "forward", "B": "backward", "W": "weight-gradient", "R": "recompute"}
DEFAULT_OPS = {"tp": "all_reduce", "pp": "send_recv", "dp": "all_reduce", "fsdp": "all_gather",
               "ep": "all_to_all", "cp": "all_gather", "offload": "h2d"}
STREAMS = ("compute", "dp")


def category(row: Row) -> str:
    if row.kind in COMPUTE_KINDS:
        return "compute"
    if row.kind in ("wait", "comm") and row.axis:
        return row.axis
    return "waiting"


def op_name(row: Row) -> str:
    """What a row did, without where: 'attention forward', 'tp all_reduce', 'pp send_recv'."""
    if row.kind in PASS_NAMES:
        return f"{row.label} {PASS_NAMES[row.kind]}".strip()
    if row.kind in COMPUTE_KINDS:
        return row.label or row.kind
    if row.kind in ("wait", "comm") and row.axis:
        op = row.label if row.label and not row.label.startswith("recv") else DEFAULT_OPS.get(row.axis, "")
        return f"{row.axis} {op}".strip()
    return "waiting"


def _index(trace) -> dict:
    """(rank, stream, end) -> row index, for the compute and dp streams (rows there never share an end)."""
    return {(r.rank, r.stream, r.end): i for i, r in enumerate(trace) if r.stream in STREAMS}


def _walk(result: SimResult, index: dict) -> list[tuple[int, float, float, str]]:
    """(row index or -1, start, end, category) from the end of the step back to 0."""
    trace = result.trace
    ends: dict = {}
    finish: dict = {}
    for r in trace:
        if r.stream == "compute" and r.end > finish.get(r.rank, -1.0):
            finish[r.rank] = r.end
    last = max(sorted(finish), key=lambda k: finish[k])
    point = (last, "compute", finish[last])
    segments = []
    while point[2] > 0:
        i = index.get(point)
        if i is None:
            key = point[:2]
            if key not in ends:
                rows = sorted((r.end, j) for j, r in enumerate(trace) if (r.rank, r.stream) == key)
                ends[key] = ([e for e, _ in rows], [j for _, j in rows])
            times, ids = ends[key]
            k = bisect_right(times, point[2]) - 1
            before = times[k] if k >= 0 else 0.0
            segments.append((-1, before, point[2], "waiting"))
            if k < 0:
                break
            point = (point[0], point[1], before)
            continue
        row = trace[i]
        nxt = row.dep if row.dep is not None and row.dep != point else (row.rank, row.stream, row.start)
        segments.append((i, nxt[2], row.end, category(row)))
        point = nxt
    segments.reverse()
    return segments


def row_slack(result: SimResult, index: dict | None = None) -> list[float]:
    """Per trace row, how much later it could end without delaying the step (inf off the streams)."""
    trace = result.trace
    index = _index(trace) if index is None else index
    step = result.step_time_s
    latest = [step] * len(trace)
    prev: dict = {}
    pred = [-1] * len(trace)
    for i, r in enumerate(trace):
        if r.stream in STREAMS:
            key = (r.rank, r.stream)
            pred[i] = prev.get(key, -1)
            prev[key] = i
    for j, r in zip(range(len(trace) - 1, -1, -1), reversed(trace)):
        if r.stream not in STREAMS:
            continue
        elastic = r.kind == "idle"
        fixed = 0.0 if elastic else r.end - (r.dep[2] if r.dep is not None else r.start)
        d = index.get(r.dep) if r.dep is not None else None
        if d is not None:
            latest[d] = min(latest[d], latest[j] - fixed)
        p = pred[j]
        if p >= 0:
            own = r.dep is None or d == p or r.stream == "dp"
            latest[p] = min(latest[p], latest[j] - (fixed if own and not elastic else 0.0))
    return [latest[i] - r.end if r.stream in STREAMS else float("inf") for i, r in enumerate(trace)]


def _pass_of(result: SimResult):
    """rank -> (starts, rows) of its schedule steps (stream 'step'), to name the step a row belongs to."""
    steps = defaultdict(list)
    for r in result.trace:
        if r.stream == "step":
            steps[r.rank].append(r)
    return {rank: ([s.start for s in rows], rows) for rank, rows in steps.items()}


def critical_path(result: SimResult, top: int = 10) -> dict:
    """The critical path as plain data: ``total_s`` (= the step time), ``by_category`` seconds,
    ``ops`` (ordered, consecutive rows of one schedule step or collective merged), ``top_ops``
    (by contribution) and ``slack_s`` per category."""
    trace = result.trace
    index = _index(trace)
    segments = _walk(result, index)
    by_cat = {c: 0.0 for c in CATEGORIES}
    by_op: dict = defaultdict(lambda: [0.0, 0])
    steps = _pass_of(result)
    ops: list[dict] = []
    for i, a, b, cat in segments:
        dur = b - a
        by_cat[cat] += dur
        row = trace[i] if i >= 0 else None
        name = op_name(row) if row is not None else "waiting"
        acc = by_op[(cat, name)]
        acc[0] += dur
        acc[1] += 1
        if dur <= 0:
            continue
        if row is None:
            key, title = ("gap", a), "waiting"
        elif row.stream == "compute" and row.kind != "idle" and not (row.kind == "wait" and row.axis == "pp"):
            starts, srows = steps.get(row.rank, ([], []))
            k = bisect_right(starts, row.start) - 1
            st = srows[k] if k >= 0 and srows[k].start <= row.start < srows[k].end + 1e-15 else None
            if st is not None and row.start < st.end:
                key = (row.rank, "step", st.start)
                title = f"{PASS_NAMES[st.kind]} mb {st.microbatch} chunk {st.chunk}"
            else:
                key, title = (row.rank, name), name
        elif row.axis == "pp":
            key = (row.rank, "recv", row.microbatch, row.chunk, row.label)
            title = f"pp {row.label} mb {row.microbatch} chunk {row.chunk}"
        else:
            key, title = (row.rank, "comm", name), name
        if ops and ops[-1]["_key"] == key:
            op = ops[-1]
        else:
            op = {"_key": key, "rank": row.rank if row else -1, "stage": row.stage if row else -1, "op": title,
                  "microbatch": row.microbatch if row else -1, "chunk": row.chunk if row else -1,
                  "start_s": a, "end_s": b, "by_category": {}}
            ops.append(op)
        op["end_s"] = b
        op["by_category"][cat] = op["by_category"].get(cat, 0.0) + dur
    for op in ops:
        del op["_key"]
        op["duration_s"] = op["end_s"] - op["start_s"]
    slack = row_slack(result, index)
    cat_slack: dict = {}
    for i, r in enumerate(trace):
        if r.stream in STREAMS and r.kind != "idle":
            c = category(r)
            cat_slack[c] = min(cat_slack.get(c, float("inf")), max(slack[i], 0.0))
    total = sum(b - a for _, a, b, _ in segments)
    ranked = sorted(by_op.items(), key=lambda kv: (-kv[1][0], kv[0]))
    return {
        "total_s": total,
        "step_time_s": result.step_time_s,
        "by_category": by_cat,
        "top_ops": [{"category": c, "op": name, "total_s": t, "count": n,
                     "share": t / total if total > 0 else 0.0} for (c, name), (t, n) in ranked[:top]],
        "slack_s": {c: cat_slack.get(c) for c in CATEGORIES if c != "waiting"},
        "ops": ops,
    }
