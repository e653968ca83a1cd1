"""The step as a Gantt chart's data: per pipeline stage, coloured intervals and micro-batch labels.

One row per pipeline stage (its representative rank, dp = cp = tp = 0), the compute stream cut
into intervals of one category: ``forward``, ``backward``, ``recompute``, ``optimizer``,
communication by axis (the compute stream waiting on it) and ``idle``. Consecutive rows of the
same category are merged, so a forward step drawn at step scale is one bar with thin slivers of
exposed TP communication. Labels are the schedule steps (``F``/``B`` rows), placed by the drawing
code only where they fit.

A step of many micro-batches drawn whole is a barcode: ``view`` picks what a picture shows by
default, a steady-state window (``steady_window``: a few micro-batches around the middle of the
step, cut at schedule-step boundaries) with the whole step beside it as an overview.
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
    chunks: int = 1  # model chunks per stage: labels name the chunk when there are several

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


# A steady-state window holds about this many schedule steps (F, B, W) per row: at the default
# figure width each step is then wide enough for its micro-batch number.
WINDOW_STEPS = 32
WINDOW_MICROBATCHES = (2, 6)  # at least two micro-batches (one shows no rhythm), at most a few
WHOLE_STEP_RATIO = 1.5  # a step barely longer than the window is drawn whole


def steady_window(tl: Timeline) -> tuple[float, float] | None:
    """A window of a few micro-batches around the middle of the step, or None when the whole step
    is short enough to draw whole.

    Read from the schedule as the trace ran it: on the row with the most schedule steps, the steps
    one micro-batch takes (F and B per model chunk, W when split) give how many micro-batches fill
    about ``WINDOW_STEPS`` steps (within ``WINDOW_MICROBATCHES``); the window is that many
    consecutive steps of the row, centred on the middle of its schedule and cut at step
    boundaries, so it starts and ends on whole steps of that row."""
    rows = tl.rows
    by_stage: dict[int, list[Label]] = {}
    for lab in tl.labels:
        if lab.stage in rows:
            by_stage.setdefault(lab.stage, []).append(lab)
    if not by_stage:
        return None
    stage = max(rows, key=lambda st: (len(by_stage.get(st, ())), -st))
    steps = sorted(by_stage[stage], key=lambda lab: (lab.start, lab.end))
    per_mb = len(steps) / len({lab.microbatch for lab in steps})
    lo, hi = WINDOW_MICROBATCHES
    want = int(per_mb * min(hi, max(lo, round(WINDOW_STEPS / per_mb))))
    if len(steps) <= WHOLE_STEP_RATIO * want:
        return None
    middle = (steps[0].start + steps[-1].end) / 2
    centre = min(range(len(steps)), key=lambda i: (abs((steps[i].start + steps[i].end) / 2 - middle), i))
    first = min(max(0, centre - want // 2), len(steps) - want)
    t0, t1 = steps[first].start, steps[first + want - 1].end
    return (t0, t1) if t1 > t0 else None


def view(tl: Timeline, stages: tuple[int, ...] | None = None,
         window_s: tuple[float, float] | None = None) -> tuple[Timeline, Timeline | None]:
    """What a timeline picture draws: (the main chart, the whole-step overview or None).

    ``stages`` and ``window_s`` (``--stages``, ``--window``) override the defaults: every stage,
    and the ``steady_window`` of those stages. The overview is the whole step on the same rows,
    drawn when the main chart is a window of it."""
    rows = select(tl, stages) if stages is not None else tl
    if window_s is None:
        window_s = steady_window(rows)
    if window_s is None or (window_s[0] <= 0 and window_s[1] >= tl.step_time_s):
        return rows, None
    return select(rows, stages, window_s), rows


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
    shown = f"{step * 1e3:.3f} ms" if step < 1 else f"{step:.3f} s"
    title = (f"{s.name}: step {shown}, bubble {report['bubble_fraction']:.1%}, MFU {report['mfu']:.1%} "
             f"(TP{s.parallelism.tp} PP{s.parallelism.pp} DP{s.dp}, {s.pipeline_schedule}, "
             f"{s.num_microbatches} micro-batch{'es' if s.num_microbatches != 1 else ''})")
    chunks = max((lab.chunk for lab in labels), default=0) + 1
    return Timeline(title, step, result.plan.pp, tuple(bars), tuple(labels), chunks=chunks)


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
