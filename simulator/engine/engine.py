"""The engine: walks each rank's program (``program.py``) with simpy, against the network model.

It decides nothing: the programs say what runs in which order; the engine gives each op its time
(compute from the workload's costs through the host's kernel-issue clock, collectives and pipeline
transfers from the network) and records a trace.

Folding (``SimOptions.fold``): all ranks of a pipeline stage run the same program on the same link
loads, so the folded engine runs one process per stage and, at each communication, starts the
flows of *every* group of the stage (link loads exactly those of the full run; with ``merge`` the
identical groups of one collective become one coupled transfer). Tests compare folded, merged and
unfolded runs on small clusters.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Generator

import simpy

from simulator.scenario.config import Scenario
from simulator.network.collectives import Collectives
from simulator.network.nccl import kernel_sms
from simulator.network.flows import Network
from simulator.network.cluster import Cluster
from simulator.program import builder as P
from simulator.engine.inputs import StepInputs, scaled_gpu, scenario_cluster, step_inputs
from simulator.engine.records import CommCalls, Row, SimOptions, SimResult, Trace
from simulator.engine.variability import StepVariability

__all__ = ["SimOptions", "SimResult", "Row", "Trace", "Snapshot", "StepEngine", "simulate", "scenario_cluster",
           "scaled_gpu"]

@dataclass(frozen=True)
class Snapshot:
    """Where a simulation in progress is at ``now_s``: ``at``: rank -> (index of the op it is at,
    when it began); ``posted``: mailbox key -> when that pipeline send was posted; ``ended``: rank ->
    end of its finished program; ``streams``: rank -> (whether its data-parallel stream is running a
    collective, the (group, op, bytes) queued behind it)."""

    now_s: float
    at: dict
    posted: dict
    ended: dict
    streams: dict


class StepEngine:
    def __init__(self, inputs: StepInputs):
        self.s, self.opt, self.gpu = inputs.scenario, inputs.options, inputs.gpu
        self.cluster, self.plan, self.work = inputs.cluster, inputs.plan, inputs.workload
        self.programs = inputs.programs
        self.env = simpy.Environment()
        self.net = Network(self.env, self.cluster.link_bw, record=self.opt.record_flows)
        self.coll = Collectives(self.env, self.net, self.cluster, self.opt.algorithm)
        self.trace = Trace()
        self.var = StepVariability(self.s, self.plan, self.opt.fold)
        self.varies = self.var.active
        self.host_issue_s = self.work.software.host_issue_s
        self._mail, self._rendezvous, self._groups = {}, {}, {}
        self._seq: dict = defaultdict(int)
        self.stage_end: dict[int, float] = {}
        self.comm_calls = CommCalls(spans=self.opt.record_flows)
        # SMs held by communication kernels in flight, per rank, and the rank processes inside a
        # GPU interval (``gpu_time``), which a change of the SMs left interrupts
        self.held: dict[int, int] = defaultdict(int)
        self.procs: dict[int, simpy.Process] = {}
        self.computing: set[int] = set()
        self.interrupting: set[int] = set()  # one interrupt at a time re-rates for every change
        self.at: dict[int, tuple[int, float]] = {}  # rank -> (op index it waits in, when it began)
        self.streams: dict[int, list] = {}  # rank -> [its data-parallel stream busy, its queue]
        self.copy_free: dict[tuple[int, str], float] = {}  # (rank, d2h | h2d) -> when that copy stream is free
        self.ranks: list[int] = []  # the simulated ranks (``start``)

    # communication ---------------------------------------------------------------------------

    def _done(self) -> simpy.Event:
        ev = self.env.event()
        ev.succeed()
        return ev

    def launch(self, rank: int, group: str, op: str, size: float, axis: str, here: tuple | None = None) -> simpy.Event:
        """Start this rank's part of a collective; the event fires when its group is done. Its
        ``origin`` is the (rank, stream, time) that started it (the last rank to arrive), which
        the critical path follows back."""
        if not self.opt.communication or size <= 0:
            return self._done()
        if self.opt.fold:
            key = (self.plan.stage_of(rank), group)
            if key not in self._groups:
                self._groups[key] = self.plan.groups_on_stage(*key)
            groups = self._groups[key]
            if len(groups[0]) < 2:
                return self._done()
            proc = self.coll.start(op, groups, size, self.opt.merge, axis)
            proc.origin = here or (rank, "compute", self.env.now)
            self.comm_calls.count(self.env, rank, axis, op, size, proc)
            self.hold(rank, op, axis, proc)
            return proc
        members = self.plan.group_of(rank, group)
        if len(members) < 2:
            return self._done()
        seq_key = (rank, group, members)
        key = (group, members, self._seq[seq_key])
        self._seq[seq_key] += 1
        arrived, event = self._rendezvous.setdefault(key, (set(), self.env.event()))
        arrived.add(rank)
        if len(arrived) == len(members):
            del self._rendezvous[key]
            event.origin = here or (rank, "compute", self.env.now)
            proc = self.coll.start(op, [members], size, False, axis)
            proc.callbacks.append(lambda _e, ev=event: ev.succeed())
        self.comm_calls.count(self.env, rank, axis, op, size, event)
        self.hold(rank, op, axis, event)
        return event

    def hold(self, rank: int, op: str, axis: str, event: simpy.Event) -> None:
        """The communication kernel of this call takes its SMs on ``rank`` from now until
        ``event`` (``nccl.kernel_sms``); compute running meanwhile gets the rest
        (``gpu_time``). Off with ``SimOptions.contention``."""
        if not self.opt.contention or event.triggered:
            return
        sms = kernel_sms(op, axis, self.s.moe.token_dispatcher)
        self._held(rank, sms)
        event.callbacks.append(lambda _e: self._held(rank, -sms))

    def _held(self, rank: int, delta: int) -> None:
        self.held[rank] += delta
        if rank in self.computing and rank not in self.interrupting:
            self.interrupting.add(rank)
            self.procs[rank].interrupt()

    def gpu_time(self, rank: int, work_s: float) -> Generator:
        """Run ``work_s`` seconds of GPU work (its time on the whole GPU) on the SMs that the
        rank's communication kernels leave: compute-bound kernels scale with their SMs, so the
        work advances at (SMs - held) / SMs of its full rate, re-rated whenever a kernel starts
        or ends. Returns the time this added to ``work_s``."""
        remaining, sms, start = work_s, self.gpu.num_sms, self.env.now
        while True:
            rate = max(sms - self.held[rank], 1) / sms
            begun = self.env.now
            self.computing.add(rank)
            try:
                yield self.env.timeout(remaining / rate)
                return self.env.now - start - work_s
            except simpy.Interrupt:
                self.interrupting.discard(rank)
                remaining -= (self.env.now - begun) * rate
                if remaining <= work_s * 1e-12:
                    return self.env.now - start - work_s
            finally:
                self.computing.discard(rank)

    def _stamp(self, event: simpy.Event) -> simpy.Event:
        """Remember when ``event`` fires, so a wait on several events knows which released it."""
        event.callbacks.append(lambda e: setattr(e, "fired", self.env.now))
        return event

    def wait(self, rank: int, events: list, op: P.Wait) -> Generator:
        start = self.env.now
        yield events[0] if len(events) == 1 else self.env.all_of(events)
        event = events[0] if len(events) == 1 else max(reversed(events), key=lambda e: getattr(e, "fired", 0.0))
        self.trace.add(Row(rank, self.plan.stage_of(rank), "compute", "wait", op.axis, start, self.env.now,
                           op.microbatch, op.chunk, op.layer, op.label, dep=getattr(event, "origin", None)))

    def _mailbox(self, key) -> list:  # [arrival event, time the transfer started or None]
        return self._mail.setdefault(key, [self.env.event(), None])

    def send(self, rank: int, op: P.Send) -> None:
        """Post activations or gradients; folded, the representative also starts the transfers of
        every other rank of its stage."""
        box = self._mailbox((self.plan.pp_peer(rank, op.dst_stage), op.vstage, op.microbatch, op.kind))
        box[1] = self.env.now
        box[0].origin = (rank, "compute", self.env.now)
        box[0].drift = self.var.drift_of(rank) if self.varies else None
        pairs = self.plan.pp_pairs(rank, op.dst_stage, self.opt.fold)
        if not self.opt.communication or all(a == b for a, b in pairs):
            box[0].succeed()
            return
        proc = self.coll.start("send_recv", pairs, self.work.pp_bytes, self.opt.merge, "pp")
        self.comm_calls.count(self.env, rank, "pp", "send_recv", self.work.pp_bytes, proc)
        self.hold(rank, "send_recv", "pp", proc)
        proc.callbacks.append(lambda _e, ev=box[0]: ev.succeed())

    def recv(self, rank: int, op: P.Recv) -> Generator:
        box = self._mailbox((rank, op.vstage, op.microbatch, op.kind))
        start = self.env.now
        yield box[0]
        posted = box[1] if box[1] is not None else start
        stage = self.plan.stage_of(rank)
        split = min(max(posted, start), self.env.now)
        origin = getattr(box[0], "origin", None)
        if self.env.now > start and self.varies:
            self.var.inherit(rank, box[0].drift)
        label = f"recv {op.kind}"
        self.trace.add(Row(rank, stage, "compute", "idle", "", start, split, op.microbatch, op.chunk, label=label,
                           dep=origin))
        self.trace.add(Row(rank, stage, "compute", "wait", "pp", split, self.env.now, op.microbatch, op.chunk,
                           label=label, nbytes=self.work.pp_bytes, dep=origin))
        return origin

    def dp_stream(self, rank: int, queue: simpy.Store) -> Generator:
        """Gradient and parameter collectives, one after another on their own stream."""
        free = None  # where this stream last became free, (rank, stream, time)
        state = self.streams[rank] = [False, queue]
        while True:
            state[0] = False
            item = yield queue.get()
            if item is None:
                return
            state[0] = True
            group, op, size, axis, done = item
            start = self.env.now
            lag = self.var.replica_lag(rank) if self.varies and group in ("dpcp", "edp") else 0.0
            if lag > 0:  # the slowest data-parallel replica arrives later (jitter, folded)
                yield self.env.timeout(lag)
            here = free if free is not None and free[2] == start and done.queued[2] < start else done.queued
            ev = self.launch(rank, group, op, size, axis, here)
            yield ev
            self.trace.add(Row(rank, self.plan.stage_of(rank), "dp", "comm", axis, start, self.env.now,
                               label=op, nbytes=size, dep=getattr(ev, "origin", None)))
            free = (rank, "dp", self.env.now) if self.env.now > start else here
            done.origin = free
            done.succeed()

    def copy(self, rank: int, op: P.Copy, ends: dict) -> simpy.Event:
        """A copy between the GPU and host memory (CPU offloading) on the rank's copy stream for its
        direction: copies of a stream run one after another, each at the GPU's host-link rate
        (``Workload.host_link_Bps``), not before the copy it follows (``op.after``). Copy engines
        hold no SMs. The event fires when it ends; its ``origin`` is where the compute issued it."""
        key = (rank, op.direction)
        start = max(self.env.now, self.copy_free.get(key, 0.0), ends.get(op.after, 0.0))
        end = start + op.nbytes / self.work.host_link_Bps
        self.copy_free[key] = ends[op.handle] = end
        event = self.env.timeout(end - self.env.now)
        event.origin = (rank, "compute", self.env.now)
        self.trace.add(Row(rank, self.plan.stage_of(rank), op.direction, "comm", "offload", start, end, op.microbatch,
                           op.chunk, op.layer, op.direction, nbytes=op.nbytes))
        return event

    # compute -----------------------------------------------------------------------------------

    def compute(self, rank: int, host: list, op: P.Compute, index: int) -> Generator:
        """Run a block on the rank's compute stream. The host issues its kernels one after another
        (``host_issue_s`` each, from the framework profile) and runs ahead of the GPU until it is
        the slower of the two (a queue: the block cannot end before its last kernel is issued);
        the GPU time lost to it is a row labelled ``host_dispatch``. Stragglers and jitter change
        the GPU time (``variability.StepVariability``)."""
        block, stage = op.block, self.plan.stage_of(rank)
        gpu_s = self.var.block_time(rank, op, index) if self.varies else block.time_s
        if self.host_issue_s:
            host[0] += (1 if op.graphed else block.kernels) * self.host_issue_s
            stall = host[0] - (self.env.now + gpu_s)
            if stall > 0:
                start = self.env.now
                yield self.env.timeout(stall)
                self.trace.add(Row(rank, stage, "compute", op.kind, "", start, self.env.now, op.microbatch,
                                   op.chunk, op.layer, "host_dispatch", host_s=self.env.now - start))
        start, slowed = self.env.now, 0.0
        if self.opt.contention:
            slowed = yield from self.gpu_time(rank, gpu_s)
        else:
            yield self.env.timeout(gpu_s)
        self.trace.add(Row(rank, stage, "compute", op.kind, "", start, self.env.now, op.microbatch, op.chunk,
                           op.layer, op.label, flops=block.flops, contention_s=max(0.0, slowed),
                           host_s=block.host_wait_s))

    # the rank ------------------------------------------------------------------------------------

    def rank_process(self, rank: int) -> Generator:
        """Walk the rank's program."""
        stage = self.plan.stage_of(rank)
        queue = simpy.Store(self.env)
        dp_proc = self.env.process(self.dp_stream(rank, queue))
        events: dict[int, simpy.Event] = {}
        host = [0.0]  # when the rank's CPU has issued every kernel so far
        sender, begun = None, 0.0
        at = self.at
        copy_ends: dict[int, float] = {}  # handle -> when the copy ends
        for index, op in enumerate(self.programs[stage]):
            if isinstance(op, P.Compute):
                at[rank] = (index, self.env.now)
                yield from self.compute(rank, host, op, index)
            elif isinstance(op, P.Launch):
                ev = self.launch(rank, op.group, op.op, op.nbytes, op.axis)
                events[op.handle] = self._stamp(ev) if op.stamp else ev
            elif isinstance(op, P.Wait):
                at[rank] = (index, self.env.now)
                yield from self.wait(rank, [events[h] for h in op.handles], op)
            elif isinstance(op, P.Copy):
                events[op.handle] = self.copy(rank, op, copy_ends)
            elif isinstance(op, P.Enqueue):
                done = self.env.event()
                done.queued = (rank, "compute", self.env.now)
                queue.put((op.group, op.op, op.nbytes, op.axis, done))
                events[op.handle] = self._stamp(done)
            elif isinstance(op, P.Recv):
                at[rank] = (index, self.env.now)
                sender = yield from self.recv(rank, op)
            elif isinstance(op, P.StepBegin):
                begun = self.env.now
            elif isinstance(op, P.StepEnd):
                self.trace.add(Row(rank, stage, "step", op.kind, "", begun, self.env.now, op.microbatch, op.chunk,
                                   dep=sender))
                sender = None
            elif isinstance(op, P.Send):
                self.send(rank, op)
            elif isinstance(op, P.HostStart):
                host[0] = op.time_s
            elif isinstance(op, P.CloseStream):
                queue.put(None)
            elif isinstance(op, P.JoinStream):
                at[rank] = (index, self.env.now)
                yield dp_proc
        self.stage_end[rank] = self.env.now

    def start(self) -> list[int]:
        """Start one process per simulated rank (one per stage folded, every rank unfolded); the ranks."""
        plan = self.plan
        ranks = [int(plan.grid[st, 0, 0, 0]) for st in range(plan.pp)] if self.opt.fold else list(range(plan.world))
        for r in ranks:
            self.procs[r] = self.env.process(self.rank_process(r))
        self.ranks = ranks
        return ranks

    def run_until(self, t: float) -> int:
        """Run every event up to simulated time ``t``; the number run."""
        events = 0
        while self.env.peek() <= t:
            self.env.step()
            events += 1
        return events

    def next_event_s(self) -> float:
        """When the next event happens (inf: none is left)."""
        return self.env.peek()

    @property
    def finished(self) -> bool:
        """Whether every simulated rank has walked its whole program."""
        return len(self.stage_end) == len(self.ranks)

    def snapshot(self) -> Snapshot:
        """Where each rank is now (``Snapshot``), for a caller that bounds the step in progress."""
        posted = {k: box[1] for k, box in self._mail.items() if box[1] is not None}
        streams = {r: (busy, [item[:3] for item in queue.items if item is not None])
                   for r, (busy, queue) in self.streams.items()}
        return Snapshot(self.env.now, dict(self.at), posted, dict(self.stage_end), streams)

    def finish(self, events: int = 0) -> SimResult:
        """Run to the end (after ``events`` already run) and return the result."""
        plan, ranks = self.plan, self.ranks
        while True:
            try:
                self.env.step()
            except simpy.core.EmptySchedule:
                break
            events += 1
        if len(self.stage_end) != len(ranks):
            stuck = sorted(set(ranks) - set(self.stage_end))
            raise RuntimeError(f"simulation deadlocked: ranks {stuck[:8]} did not finish")
        stage_end = [0.0] * plan.pp
        for r, t in self.stage_end.items():
            stage_end[plan.stage_of(r)] = max(stage_end[plan.stage_of(r)], t)
        return SimResult(
            scenario=self.s, options=self.opt, plan=plan, cluster=self.cluster, workload=self.work,
            trace=tuple(self.trace.rows), step_time_s=max(self.stage_end.values()), stage_end_s=tuple(stage_end),
            simulated_ranks=tuple(ranks), events=events, link_bytes=self.net.stats.bytes_carried,
            transfers=self.net.stats.transfers, flows=tuple(self.net.flows),
            comm_calls=self.comm_calls.rows(), comm_spans=self.comm_calls.span_rows())

    def run(self) -> SimResult:
        self.start()
        return self.finish()


def simulate(s: Scenario, options: SimOptions = SimOptions(), cluster: Cluster | None = None) -> SimResult:
    return StepEngine(step_inputs(s, options, cluster)).run()
