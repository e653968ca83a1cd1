"""What a simulated step produces: the options it ran with, the rows of its trace, the result.

These are plain records, so the reports, the critical path, the comm map and the Perfetto export
read them without importing the simpy engine that fills them.
"""

from __future__ import annotations

import gc
from array import array
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

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


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block. A simulation allocates millions of
    small objects (events, rows, transfers) that die by reference counting or live to the end;
    each generation-2 pass rescans all of them and frees nothing (the peak memory is the same
    without it), which cost a third of an unfolded run's time and a fifth of a folded one's."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _Names(dict):
    """str -> code; ``names`` the strings by code."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def codes(self, column: tuple) -> array:
        """The codes of a column of strings, new strings given the next codes."""
        for name in sorted(set(column).difference(self)):
            self[name] = len(self.names)
            self.names.append(name)
        return array("H", map(self.__getitem__, column))


_INTS = (0, 1, 7, 8, 9)  # rank, stage, microbatch, chunk, layer
_STRS = (2, 3, 4, 10)  # stream, kind, axis, label
_FLOATS = (5, 6, 11, 12, 14, 15)  # start, end, nbytes, flops, contention_s, host_s
_DEP = 13
_make = Row._make


class _Block:
    """``Trace.BLOCK`` rows stored by column: numbers in typed arrays, strings as codes into the
    trace's names, ``dep`` as the rows that have one and its three parts. About 90 bytes a row,
    against about 250 as named tuples with their own floats."""

    __slots__ = ("cols", "dep_rows", "dep_rank", "dep_stream", "dep_time")

    def __init__(self, rows: list, names: _Names):
        cols = list(zip(*rows))
        packed: list = [None] * len(Row._fields)
        for i in _INTS:
            packed[i] = array("i", cols[i])
        for i in _STRS:
            packed[i] = names.codes(cols[i])
        for i in _FLOATS:
            packed[i] = array("d", cols[i])
        deps = cols[_DEP]
        self.dep_rows = array("i", [i for i, d in enumerate(deps) if d is not None])
        rank, stream, time = zip(*[deps[i] for i in self.dep_rows]) if self.dep_rows else ((), (), ())
        self.dep_rank, self.dep_stream, self.dep_time = array("i", rank), names.codes(stream), array("d", time)
        self.cols = packed

    def ranks(self) -> np.ndarray:
        return np.frombuffer(self.cols[0], dtype=np.int32)

    def rows(self, names: tuple, where: np.ndarray | None = None) -> list[Row]:
        """The block's rows as ``Row``s; with ``where``, only the rows at those (sorted) positions."""
        deps: list = [None] * len(self.cols[0])
        for i, dep in zip(self.dep_rows, zip(self.dep_rank, map(names.__getitem__, self.dep_stream), self.dep_time)):
            deps[i] = dep
        c = self.cols
        if where is not None:
            c = [None if col is None else np.frombuffer(col, dtype=col.typecode)[where].tolist() for col in c]
            deps = [deps[i] for i in where.tolist()]
        name = names.__getitem__
        with cyclic_gc_paused():  # a block's rows are all alive at once: nothing to collect
            return list(map(_make, zip(c[0], c[1], map(name, c[2]), map(name, c[3]), map(name, c[4]), c[5], c[6],
                                       c[7], c[8], c[9], map(name, c[10]), c[11], c[12], deps, c[14], c[15])))

    def row(self, j: int, names: tuple) -> Row:
        c = self.cols
        k = bisect_left(self.dep_rows, j)
        dep = None
        if k < len(self.dep_rows) and self.dep_rows[k] == j:
            dep = (self.dep_rank[k], names[self.dep_stream[k]], self.dep_time[k])
        return _make(names[c[i][j]] if i in _STRS else dep if i == _DEP else c[i][j] for i in range(len(c)))


class Trace:
    """The rows of a step as the engine makes them. The engine appends ``Row``s to ``rows``;
    once ``WAITING`` of them wait there, ``compact`` stores every full block by column. An
    unfolded step makes millions of rows, which so stored take about a third of the memory; a
    folded one makes fewer than ``WAITING`` and keeps its rows as they are. ``freeze`` gives the
    ``TraceRows`` a result carries."""

    BLOCK = 1 << 16
    WAITING = 1 << 18

    def __init__(self):
        self.rows: list[Row] = []
        self.blocks: list[_Block] = []
        self.names = _Names()

    def add(self, row: Row) -> None:
        if kept(row.kind, row.start, row.end):
            self.rows.append(row)

    def compact(self) -> None:
        """With ``WAITING`` rows or more appended since, store every full block of them by column."""
        rows, size = self.rows, self.BLOCK
        if len(rows) < max(self.WAITING, size):
            return
        while len(rows) >= size:
            self.blocks.append(_Block(rows[:size], self.names))
            del rows[:size]

    def freeze(self) -> TraceRows:
        self.compact()
        return TraceRows(tuple(self.blocks), tuple(self.rows), tuple(self.names.names), self.BLOCK)


class TraceRows(Sequence):
    """A step's trace rows in the order the engine made them, read as ``Row``s: a sequence that
    iterates, indexes and compares as a tuple of rows would. Rows stored by column are built
    as they are read, so an analysis that needs only some ranks' rows reads ``of_ranks``."""

    __slots__ = ("_blocks", "_tail", "_names", "_size")

    def __init__(self, blocks: tuple = (), tail: tuple = (), names: tuple = (), size: int = Trace.BLOCK):
        self._blocks, self._tail, self._names, self._size = blocks, tail, names, size

    @property
    def _packed(self) -> int:
        return len(self._blocks) * self._size

    def __len__(self) -> int:
        return self._packed + len(self._tail)

    def __iter__(self) -> Iterator[Row]:
        for block in self._blocks:
            yield from block.rows(self._names)
        yield from self._tail

    def __reversed__(self) -> Iterator[Row]:
        yield from reversed(self._tail)
        for block in reversed(self._blocks):
            yield from reversed(block.rows(self._names))

    def of_ranks(self, ranks) -> Iterator[Row]:
        """The rows of ``ranks`` only, in order: building a row costs more than skipping one."""
        wanted = np.fromiter(sorted(set(ranks)), dtype=np.int64)
        for block in self._blocks:
            where = np.flatnonzero(np.isin(block.ranks(), wanted))
            if len(where):
                yield from block.rows(self._names, where)
        keep = set(wanted.tolist())
        yield from (row for row in self._tail if row.rank in keep)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("trace row index out of range")
        b, j = divmod(index, self._size)
        return self._blocks[b].row(j, self._names) if b < len(self._blocks) else self._tail[index - self._packed]

    def __eq__(self, other) -> bool:
        if not isinstance(other, (TraceRows, tuple, list)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None

    def __repr__(self) -> str:
        return f"TraceRows({len(self)} rows)"


@dataclass(frozen=True)
class SimResult:
    scenario: Scenario
    options: SimOptions
    plan: Plan
    cluster: Cluster
    workload: Workload
    trace: TraceRows  # a sequence of Row
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
