"""The step as a Gantt chart's data: per pipeline stage, coloured intervals and micro-batch labels.

One row per pipeline stage (its representative rank, dp = cp = tp = 0), the compute stream cut
into intervals of one category: ``forward``, ``backward``, ``recompute``, ``optimizer``,
communication by axis (the compute stream waiting on it) and ``idle``. Consecutive rows of the
same category are merged, so a forward step drawn at step scale is one bar with thin slivers of
exposed TP communication. Labels are the schedule steps (``F``/``B`` rows), placed by the drawing
code only where they fit.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from simulator.step.engine import SimResult
from simulator.reports.report import step_report

CATEGORIES = ("forward", "backward", "recompute", "optimizer", "tp", "pp", "dp", "fsdp", "ep", "cp", "idle")


@dataclass(frozen=True)
class Bar:
    stage: int
    start: float
    end: float
    category: str


@dataclass(frozen=True)
class Label:
    stage: int
    start: float
    end: float
    kind: str  # F or B
    microbatch: int
    chunk: int


@dataclass(frozen=True)
class Timeline:
    title: str
    step_time_s: float
    stages: int
    bars: tuple[Bar, ...]
    labels: tuple[Label, ...]


def _representatives(result: SimResult) -> dict[int, int]:
    reps = {}
    for r in sorted(result.simulated_ranks, reverse=True):
        reps[result.plan.stage_of(r)] = r
    return reps


def timeline(result: SimResult, report: dict | None = None) -> Timeline:
    report = report or step_report(result)
    reps = _representatives(result)
    wanted = set(reps.values())
    steps: dict = {r: [] for r in wanted}
    rows: dict = {r: [] for r in wanted}
    for row in result.trace:
        if row.rank in wanted:
            if row.stream == "step":
                steps[row.rank].append(row)
            elif row.stream == "compute":
                rows[row.rank].append(row)
    bars: list[Bar] = []
    labels: list[Label] = []
    step = result.step_time_s
    for stage, rank in sorted(reps.items()):
        srows = steps[rank]
        starts = [s.start for s in srows]
        labels.extend(Label(stage, s.start, s.end, s.kind, s.microbatch, s.chunk) for s in srows)
        cur = None
        for row in rows[rank]:
            cat = _category(row, srows, starts)
            if cur is not None and cur[2] == cat and abs(cur[1] - row.start) <= 1e-12 * max(1.0, step):
                cur[1] = row.end
                continue
            if cur is not None:
                bars.append(Bar(stage, cur[0], cur[1], cur[2]))
            cur = [row.start, row.end, cat]
        if cur is not None:
            bars.append(Bar(stage, cur[0], cur[1], cur[2]))
            if cur[1] < step:
                bars.append(Bar(stage, cur[1], step, "idle"))
    s = result.scenario
    title = (f"{s.name}: step {step:.3f} s, bubble {report['bubble_fraction']:.1%}, MFU {report['mfu']:.1%} "
             f"(TP{s.parallelism.tp} PP{s.parallelism.pp} DP{s.dp}, {s.schedule}, {s.num_microbatches} micro-batches)")
    return Timeline(title, step, result.plan.pp, tuple(bars), tuple(labels))


def _category(row, srows, starts) -> str:
    if row.kind == "F":
        return "forward"
    if row.kind == "B":
        return "backward"
    if row.kind == "R":
        return "recompute"
    if row.kind == "opt":
        return "optimizer"
    if row.kind in ("embed", "head"):
        k = bisect_right(starts, row.start) - 1
        return "backward" if k >= 0 and srows[k].kind == "B" and row.start < srows[k].end else "forward"
    if row.kind == "wait" and row.axis:
        return row.axis
    return "idle"
