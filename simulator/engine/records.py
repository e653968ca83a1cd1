"""What a simulated step produces: the options it ran with, the rows of its trace, the result.

These are plain records, so the reports, the critical path, the comm map and the Perfetto export
read them without importing the simpy engine that fills them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from simulator.scenario.config import Scenario
from simulator.network.cluster import Cluster
from simulator.layout.grid import Plan
from simulator.workload.workload import Workload


@dataclass(frozen=True)
class SimOptions:
    communication: bool = True  # False: every transfer takes no time (for closed-form checks)
    extras: bool = True  # embedding, LM head, loss and optimizer step
    fold: bool = True
    merge: bool = True
    algorithm: str = "auto"
    record_flows: bool = False  # keep every transfer's rate history (for link use and the comm map)
    compute_scale: float = 1.0  # what-if: GPU peak FLOP/s and HBM bandwidth multiplied by this
    contention: bool = True  # compute runs on the SMs that in-flight communication kernels leave


class Row(NamedTuple):
    """One interval on one rank's stream. ``kind``: F, B, W (weight gradient of a split backward), R (recompute), embed, head, opt, wait,
    idle (waiting on a pipeline dependency), comm. ``axis``: tp, pp, dp, cp, ep, fsdp, offload (CPU activation
    offloading's copies, on streams d2h and h2d) or ''.

    A named tuple, immutable as a frozen dataclass is, because an unfolded step makes millions of
    them: one is built in a fifth of a frozen dataclass's time and weighs less."""

    rank: int
    stage: int
    stream: str
    kind: str
    axis: str
    start: float
    end: float
    microbatch: int = -1
    chunk: int = -1
    layer: int = -1
    label: str = ""
    nbytes: float = 0.0
    flops: float = 0.0
    dep: tuple | None = None  # (rank, stream, time) whose end released this row, if not its predecessor
    contention_s: float = 0.0  # of a compute row's time, what communication kernels' SMs cost it
    host_s: float = 0.0  # of a compute row's time, the GPU waiting on the host (kernel issue, MoE token-count sync)


def kept(kind: str, start: float, end: float) -> bool:
    """Whether the trace keeps a row: every row that takes time, and every compute pass."""
    return end > start or kind in ("F", "B", "W")


@dataclass
class Trace:
    rows: list[Row] = field(default_factory=list)

    def add(self, row: Row) -> None:
        if kept(row.kind, row.start, row.end):
            self.rows.append(row)


@dataclass(frozen=True)
class SimResult:
    scenario: Scenario
    options: SimOptions
    plan: Plan
    cluster: Cluster
    workload: Workload
    trace: tuple[Row, ...]
    step_time_s: float
    stage_end_s: tuple[float, ...]
    simulated_ranks: tuple[int, ...]
    events: int
    link_bytes: object
    transfers: int
    flows: tuple = ()  # network.FlowRecord per transfer, when SimOptions.record_flows
    comm_calls: tuple = ()  # (rank, axis, op, calls, bytes, seconds from launch to done), sorted
    comm_spans: tuple = ()  # (rank, axis, op, bytes, launch, done) per call, sorted, when SimOptions.record_flows


class CommCalls:
    """Per (rank, axis, op): calls, bytes, and seconds from launch to done (``SimResult.comm_calls``);
    with ``spans`` also each call's launch and done (``SimResult.comm_spans``, for kernel traces)."""

    def __init__(self, spans: bool = False):
        self.calls: dict = {}
        self.spans: list | None = [] if spans else None

    def record(self, rank: int, axis: str, op: str) -> list:
        """The [calls, bytes, seconds] of (rank, axis, op), which the caller updates."""
        rec = self.calls.get((rank, axis, op))
        if rec is None:
            rec = self.calls[(rank, axis, op)] = [0, 0.0, 0.0]
        return rec

    def count(self, env, rank: int, axis: str, op: str, size: float, event) -> None:
        """Count one call of ``rank`` and, when ``event`` fires, the time it took."""
        rec = self.calls.setdefault((rank, axis, op), [0, 0.0, 0.0])
        rec[0] += 1
        rec[1] += size
        t0 = env.now

        spans = self.spans

        def done(_e):
            rec[2] += env.now - t0
            if spans is not None:
                spans.append((rank, axis, op, size, t0, env.now))
        event.callbacks.append(done)

    def rows(self) -> tuple:
        return tuple(sorted((*k, *v) for k, v in self.calls.items()))

    def span_rows(self) -> tuple:
        return tuple(sorted(self.spans)) if self.spans is not None else ()
