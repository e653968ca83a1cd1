"""The step as a Gantt chart's data: per pipeline stage, coloured intervals and micro-batch labels.

One row per pipeline stage (its representative rank, dp = cp = tp = 0), the compute stream cut
into intervals of one category: ``forward``, ``backward``, ``recompute``, ``optimizer``,
communication by axis (the compute stream waiting on it) and ``idle``. Consecutive rows of the
same category are merged, so a forward step drawn at step scale is one bar with thin slivers of
exposed TP communication. Labels are the schedule steps (``F``/``B`` rows), placed by the drawing
code only where they fit.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, replace

from simulator.common.errors import ConfigError
from simulator.engine.records import SimResult
from simulator.reports.report import step_report

CATEGORIES = ("forward", "backward", "weight_grad", "recompute", "optimizer", "tp", "pp", "dp", "fsdp", "ep", "cp", "offload",
              "idle")


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
    """``stage_ids`` are the pipeline stages drawn, one row each in this order (all when None);
    ``window_s`` the (start, end) drawn, in seconds of the step (the whole step when None)."""

    title: str
    step_time_s: float
    stages: int
    bars: tuple[Bar, ...]
    labels: tuple[Label, ...]
    stage_ids: tuple[int, ...] | None = None
    window_s: tuple[float, float] | None = None

    @property
    def rows(self) -> tuple[int, ...]:
        return self.stage_ids if self.stage_ids is not None else tuple(range(self.stages))

    @property
    def span_s(self) -> tuple[float, float]:
        return self.window_s if self.window_s is not None else (0.0, self.step_time_s)


def parse_stages(text: str, stages: int) -> tuple[int, ...]:
    """``"0,3,7"`` or ``"0-3,12"`` as sorted stage numbers, each below ``stages``."""
    chosen: set[int] = set()
    for part in str(text).split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        try:
            first = int(lo)
            last = int(hi) if sep else first
        except ValueError:
            raise ConfigError("--stages", text, "expected stage numbers and ranges, e.g. 0,3,7 or 0-3,12") from None
        if first < 0 or last < first or last >= stages:
            raise ConfigError("--stages", text, f"stages run from 0 to {stages - 1}; a range is low-high")
        chosen.update(range(first, last + 1))
    return tuple(sorted(chosen))


def parse_window(text: str, step_time_s: float | None = None) -> tuple[float, float]:
    """``"t0:t1"`` in seconds (either side may be left out) as (start, end) inside the step. Before
    the step is simulated (``step_time_s`` None) only the form and the order are checked; a
    window past the step's end is refused once its length is known."""
    lo, sep, hi = str(text).partition(":")
    try:
        start = float(lo) if lo.strip() else 0.0
        end = float(hi) if hi.strip() else math.inf
    except ValueError:
        start = end = math.nan
    if not sep or not math.isfinite(start) or math.isnan(end) or (hi.strip() and math.isinf(end)):
        raise ConfigError("--window", text, "expected t0:t1 in seconds, e.g. 0.5:1.25 (either side may be left out)")
    if start < 0:
        raise ConfigError("--window", text, "t0 must be at least 0 (seconds from the start of the step)")
    if not start < end:
        raise ConfigError("--window", text, "t0 must be below t1")
    if step_time_s is None:
        return start, end
    if start >= step_time_s:
        raise ConfigError("--window", text, f"starts at or past the end of the step, {step_time_s:.6g} s: t0 must be "
                                            "below it")
    return start, min(end, step_time_s)


def select(tl: Timeline, stages: tuple[int, ...] | None = None, window_s: tuple[float, float] | None = None) -> Timeline:
    """The part of ``tl`` on ``stages`` and inside ``window_s``; bars and labels are clipped to it."""
    rows = set(stages) if stages is not None else set(range(tl.stages))
    t0, t1 = window_s if window_s is not None else (0.0, tl.step_time_s)

    def keep(x) -> bool:
        return x.stage in rows and x.end > t0 and x.start < t1

    bars = tuple(replace(b, start=max(b.start, t0), end=min(b.end, t1)) for b in tl.bars if keep(b))
    labels = tuple(replace(lab, start=max(lab.start, t0), end=min(lab.end, t1)) for lab in tl.labels if keep(lab))
    return replace(tl, bars=bars, labels=labels, stage_ids=tuple(sorted(rows)) if stages is not None else tl.stage_ids,
                   window_s=window_s if window_s is not None else tl.window_s)


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
    if row.kind == "W":
        return "weight_grad"
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
