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
from simulator.network.nccl import REGISTERED_AXES, kernel_sms, registered_domain
from simulator.network.flows import Network
from simulator.network.cluster import Cluster
from simulator.program import builder as P
from simulator.engine.inputs import StepInputs, scaled_gpu, scenario_cluster, step_inputs
from simulator.engine.records import CommCalls, Row, SimOptions, SimResult, Trace, cyclic_gc_paused
from simulator.engine.variability import StepVariability, straggler_lanes

__all__ = ["SimOptions", "SimResult", "Row", "Trace", "Snapshot", "StepEngine", "simulate", "scenario_cluster",
           "scaled_gpu"]

@dataclass(frozen=True)
class Snapshot:
    """Where a simulation in progress is at ``now_s``: ``at``: rank -> (index of the op it is at,
    when it began); ``posted``: mailbox key -> when that pipeline send was posted; ``ended``: rank ->
    end of its finished program; ``streams``: rank -> (whether its data-parallel stream is running a
    collective, the (group, op, bytes, calls) queued behind it)."""

    now_s: float
    at: dict
    posted: dict
    ended: dict
    streams: dict


Compute, Launch, Wait, Send, Recv, Copy, Enqueue = P.Compute, P.Launch, P.Wait, P.Send, P.Recv, P.Copy, P.Enqueue
StepBegin, StepEnd, HostStart, CloseStream, JoinStream = P.StepBegin, P.StepEnd, P.HostStart, P.CloseStream, P.JoinStream
_row = tuple.__new__  # a Row from a tuple of all its fields, without the keyword handling of Row(...)
_COMPACT_EVERY = (1 << 15) - 1  # events between stores of the trace rows by column (``Trace.compact``)
_PASSES = ("F", "B", "W")  # compute kinds the trace keeps even when they take no time (``records.kept``)


def _rewaited(program: tuple) -> dict[int, frozenset]:
    """Wait op index -> the handles it waits on that a later op waits on again. The others are
    dropped from the rank's events once waited: an unfolded step holds a rank's events only while
    they can still be waited on, not every one of its programme."""
    later: set = set()
    out: dict[int, frozenset] = {}
    for index in range(len(program) - 1, -1, -1):
        op = program[index]
        if type(op) is Wait:
            again = later.intersection(op.handles)
            if again:
                out[index] = frozenset(again)
            later.update(op.handles)
    return out


def _fired(event: simpy.Event) -> float:
    return getattr(event, "fired", 0.0)


class _KernelSMs(dict):
    """(op, axis) -> SMs its communication kernel holds (``nccl.kernel_sms``), filled on first use."""

    def __init__(self, token_dispatcher: str):
        super().__init__()
        self.token_dispatcher = token_dispatcher

    def __missing__(self, key: tuple) -> int:
        sms = self[key] = kernel_sms(key[0], key[1], self.token_dispatcher)
        return sms


class StepEngine:
    def __init__(self, inputs: StepInputs):
        self.s, self.opt, self.gpu = inputs.scenario, inputs.options, inputs.gpu
        self.cluster, self.plan, self.work = inputs.cluster, inputs.plan, inputs.workload
        self.programs = inputs.programs
        self.stage_of = self.plan.stage_of
        self.env = simpy.Environment(0.0)  # a float clock: times read back from the trace store are floats
        self.net = Network(self.env, self.cluster.link_bw, record=self.opt.record_flows)
        self.coll = Collectives(self.env, self.net, self.cluster, self.opt.algorithm)
        self.trace = Trace()
        # stragglers without noise: one simulated rank per lane of ranks that stay alike (exact)
        self.lanes = straggler_lanes(self.s, self.plan) if self.opt.fold else None
        self.rep_of: dict[int, int] = {}
        self._lane_of: dict[int, tuple] = {}
        if self.lanes is not None:
            for lane in self.lanes:
                self._lane_of[lane[0]] = lane
                for r in lane:
                    self.rep_of[r] = lane[0]
        self.var = StepVariability(self.s, self.plan, self.opt.fold and self.lanes is None)
        self.varies = self.var.active
        self.host_issue_s = self.work.software.host_issue_s
        self._mail, self._rendezvous, self._groups, self._group_of, self._pairs = {}, {}, {}, {}, {}
        self._seq: dict = defaultdict(int)
        self._kernel_sms = _KernelSMs(self.s.moe.token_dispatcher)
        self._registered = self.work.software.nccl_ub
        self._registered_sms: dict[tuple, int] = {}
        self.stage_end: dict[int, float] = {}
        self._rewaited: dict[int, dict] = {}  # stage -> ``_rewaited`` of its program
        self.comm_calls = CommCalls(spans=self.opt.record_flows)
        # SMs held by communication kernels in flight, per rank, and the ranks whose compute runs
        # on what they leave (``gpu_time``): rank -> [work left, rate, since, the event its
        # process waits on, the whole work]
        self.held: dict[int, int] = defaultdict(int)
        self.procs: dict[int, simpy.Process] = {}
        self.computing: dict[int, list] = {}
        self.at: dict[int, tuple[int, float]] = {}  # rank -> (op index it waits in, when it began)
        self.streams: dict[int, list] = {}  # rank -> [its data-parallel stream busy, its queue]
        self.copy_free: dict[tuple[int, str], float] = {}  # (rank, d2h | h2d) -> when that copy stream is free
        self.ranks: list[int] = []  # the simulated ranks (``start``)

    # communication ---------------------------------------------------------------------------

    def _done(self) -> simpy.Event:
        """An event already processed (a collective with nothing to move): a process that yields it
        goes on at once, without an event in the queue."""
        ev = simpy.Event(self.env)
        ev._ok, ev._value, ev.callbacks = True, None, None
        ev.fired = self.env.now
        return ev

    def _stage_groups(self, stage: int, group: str) -> tuple:
        key = (stage, group)
        groups = self._groups.get(key)
        if groups is None:
            groups = self._groups[key] = self.plan.groups_on_stage(stage, group)
        return groups

    def _members(self, rank: int, group: str) -> tuple:
        """(the members of ``rank``'s ``group``, a one-group tuple of them): the same objects for
        every member at every call, which ``Collectives.prepare`` finds by identity."""
        key = (rank, group)
        hit = self._group_of.get(key)
        if hit is None:
            members = self.plan.group_of(rank, group)
            hit = self._group_of[key] = self._group_of.setdefault(members, (members, (members,)))
        return hit

    def launch(self, rank: int, group: str, op: str, size: float, axis: str, here: tuple | None = None,
               calls: float = 1.0) -> simpy.Event:
        """Start this rank's part of a collective (as ``calls`` calls back to back,
        ``Collectives.prepare``); the event fires when its group is done. Its ``origin`` is the
        (rank, stream, time) that started it (the last rank to arrive), which the critical path
        follows back."""
        if not self.opt.communication or size <= 0:
            return self._done()
        if self.lanes is not None:
            # a lane's representative: the collective starts, over every group its lanes touch,
            # when the last of those lanes arrives
            groups, lanes, name, width = self._lane_class(rank, group)
            if width < 2:
                return self._done()
            return self._rendezvous_start(rank, group, name, lanes, op, groups, size, self.opt.merge, axis, here,
                                          calls)
        if self.opt.fold:
            groups = self._stage_groups(self.stage_of(rank), group)
            if len(groups[0]) < 2:
                return self._done()
            proc = self.coll.start(op, groups, size, self.opt.merge, axis, calls=calls)
            proc.origin = here or (rank, "compute", self.env.now)
            self.called(rank, op, axis, size, proc, calls, group)
            return proc
        members, groups = self._members(rank, group)
        if len(members) < 2:
            return self._done()
        return self._rendezvous_start(rank, group, (group, members), len(members), op, groups, size, False, axis,
                                      here, calls)

    def _rendezvous_start(self, rank: int, group: str, name: tuple, parties: int, op: str, groups: tuple,
                          size: float, merge: bool, axis: str, here: tuple | None, calls: float = 1.0) -> simpy.Event:
        """This rank's arrival at its ``group`` collective, met by the ``parties`` simulated ranks
        named ``name`` (the members of an unfolded group, or the lanes of folded stragglers): the
        last to arrive starts the flows of ``groups``; each arrival gets the event they share."""
        seq_key = (rank, group)
        seq = self._seq[seq_key]
        self._seq[seq_key] = seq + 1
        key = (name, seq)
        entry = self._rendezvous.get(key)
        if entry is None:
            entry = self._rendezvous[key] = [0, self.env.event()]
        entry[0] += 1
        event = entry[1]
        if entry[0] == parties:
            del self._rendezvous[key]
            event.origin = here or (rank, "compute", self.env.now)
            self.coll.start(op, groups, size, merge, axis, done=event, calls=calls)
        self.called(rank, op, axis, size, event, calls, group)
        return event

    def _lane_class(self, rank: int, group: str) -> tuple:
        """(the groups of ``group``'s kind that the lanes meeting ``rank``'s lane at it touch, how
        many lanes meet there, a key naming them): at the lanes' fixed point (``layout.lanes``)
        every such group holds the same lanes, so they all start together."""
        key = (rank, group)
        hit = self._group_of.get(key)
        if hit is None:
            groups = self._stage_groups(self.stage_of(rank), group)
            rep_of = self.rep_of
            mine = set(self._lane_of[rank])
            met = {rep_of[m] for g in groups if mine.intersection(g) for m in g}
            touched = tuple(g for g in groups if any(rep_of[m] in met for m in g))
            hit = self._group_of[key] = (touched, len(met), (group, min(met)), len(groups[0]) if groups else 0)
        return hit

    def _registered_kernel_sms(self, rank: int, op: str, axis: str, group: str | None) -> int:
        """SMs of a data-parallel call on registered buffers (``nccl.REGISTERED_KERNEL_SMS``), by the
        NVLink domains ``rank``'s ``group`` spans."""
        key = (rank, op, axis, group)
        sms = self._registered_sms.get(key)
        if sms is None:
            domain = (registered_domain(self.plan.group_of(rank, group), self.cluster.spec.gpus_per_node)
                      if group is not None else None)
            sms = self._registered_sms[key] = kernel_sms(op, axis, self.s.moe.token_dispatcher, domain)
        return sms

    def called(self, rank: int, op: str, axis: str, size: float, event: simpy.Event, calls: float = 1.0,
               group: str | None = None) -> None:
        """Count the call (``CommCalls``; a collective of ``calls`` back-to-back calls counts that
        many) and, with ``SimOptions.contention``, hold the SMs of its communication kernel on
        ``rank`` from now until ``event`` (``nccl.kernel_sms``; on registered data-parallel buffers,
        by the domains its ``group`` spans); compute running meanwhile gets the rest (``gpu_time``).
        One callback does both."""
        rec = self.comm_calls.record(rank, axis, op)
        rec[0] += 1 if calls == 1 else calls
        rec[1] += size
        now = self.env.now
        sms = 0
        if self.opt.contention and not event.triggered:
            sms = (self._registered_kernel_sms(rank, op, axis, group) if self._registered and axis in REGISTERED_AXES
                   else self._kernel_sms[(op, axis)])
        if sms:
            self._held(rank, sms)

        spans = self.comm_calls.spans

        def done(_e, env=self.env):
            rec[2] += env.now - now
            if spans is not None:
                spans.append((rank, axis, op, size, now, env.now))
            if sms:
                self._held(rank, -sms)
        event.callbacks.append(done)

    def _held(self, rank: int, delta: int) -> None:
        self.held[rank] += delta
        state = self.computing.get(rank)
        if state is not None:
            self._rerate(rank, state)

    def gpu_time(self, rank: int, work_s: float) -> simpy.Event:
        """Start ``work_s`` seconds of GPU work (its time on the whole GPU) on the SMs that the
        rank's communication kernels leave: compute-bound kernels scale with their SMs, so the
        work advances at (SMs - held) / SMs of its full rate, re-rated whenever a kernel starts
        or ends (``_rerate``). The rank's process waits on the returned event, and the re-rating
        moves that wait to a new event; ``gpu_done`` says what the SMs cost."""
        sms = self.gpu.num_sms
        rate = max(sms - self.held[rank], 1) / sms
        event = self.env.timeout(work_s / rate)
        self.computing[rank] = [work_s, rate, self.env.now, event, work_s]
        return event

    def gpu_done(self, rank: int, start: float, work_s: float) -> float:
        """The work of ``gpu_time`` ended: the time the SMs held beside it added to ``work_s``."""
        del self.computing[rank]
        return self.env.now - start - work_s

    def _rerate(self, rank: int, state: list) -> None:
        """The SMs left to ``rank``'s compute changed: bring its remaining work up to now and move
        its process's wait to when the work ends at the new rate. Several changes at one instant
        re-rate with the last count (each later one subtracts nothing). Work left within rounding
        of nothing ends at once, at the priority an interrupt would have had."""
        env = self.env
        now = env.now
        remaining, rate, begun, event, work_s = state
        remaining -= (now - begun) * rate
        proc = self.procs[rank]
        event.callbacks.remove(proc._resume)
        if remaining <= work_s * 1e-12:
            new = simpy.Event(env)
            new._ok, new._value = True, None
            env.schedule(new, simpy.events.URGENT)
            state[0], state[2] = remaining, now
        else:
            sms = self.gpu.num_sms
            rate = max(sms - self.held[rank], 1) / sms
            new = env.timeout(remaining / rate)
            state[0], state[1], state[2] = remaining, rate, now
        new.callbacks.append(proc._resume)
        proc._target = new
        state[3] = new

    def _stamp(self, event: simpy.Event) -> simpy.Event:
        """Remember when ``event`` fires, so a wait on several events knows which released it."""
        if event.callbacks is not None:
            event.callbacks.append(lambda e: setattr(e, "fired", self.env.now))
        return event

    def _mailbox(self, key) -> list:  # [arrival event, time the transfer started or None]
        box = self._mail.get(key)
        if box is None:
            box = self._mail[key] = [self.env.event(), None]
        return box

    def send(self, rank: int, op: P.Send) -> None:
        """Post activations or gradients; folded, the representative also starts the transfers of
        every other rank of its stage."""
        peer = self.plan.pp_peer(rank, op.dst_stage)
        box = self._mailbox((self.rep_of[peer] if self.lanes is not None else peer, op.vstage, op.microbatch, op.kind))
        box[1] = self.env.now
        box[0].origin = (rank, "compute", self.env.now)
        box[0].drift = self.var.drift_of(rank) if self.varies else None
        pairs = self._pairs.get((rank, op.dst_stage))
        if pairs is None:  # kept here: every rank sends to two stages, past the plan's cache unfolded
            pairs = self._pairs[(rank, op.dst_stage)] = (
                tuple((r, self.plan.pp_peer(r, op.dst_stage)) for r in self._lane_of[rank]) if self.lanes is not None
                else self.plan.pp_pairs(rank, op.dst_stage, self.opt.fold))
        if not self.opt.communication or all(a == b for a, b in pairs):
            box[0].succeed()
            return
        proc = self.coll.start("send_recv", pairs, self.work.pp_bytes, self.opt.merge, "pp")
        self.called(rank, "send_recv", "pp", self.work.pp_bytes, proc)
        proc.callbacks.append(lambda _e, ev=box[0]: ev.succeed())

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
            group, op, size, axis, calls, done = item
            start = self.env.now
            lag = self.var.replica_lag(rank) if self.varies and group in ("dpcp", "edp") else 0.0
            if lag > 0:  # the slowest data-parallel replica arrives later (jitter, folded)
                yield self.env.timeout(lag)
            here = free if free is not None and free[2] == start and done.queued[2] < start else done.queued
            ev = self.launch(rank, group, op, size, axis, here, calls)
            yield ev
            self.trace.add(Row(rank, self.stage_of(rank), "dp", "comm", axis, start, self.env.now,
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
        self.trace.add(Row(rank, self.stage_of(rank), op.direction, "comm", "offload", start, end, op.microbatch,
                           op.chunk, op.layer, op.direction, nbytes=op.nbytes))
        return event

    # the rank ------------------------------------------------------------------------------------

    def rank_process(self, rank: int) -> Generator:
        """Walk the rank's program. Each op in the order of its frequency in a program, with what
        the loop reads bound to local names: an unfolded step walks millions of ops.

        Compute runs a block on the rank's compute stream. The host issues its kernels one after
        another (``host_issue_s`` each, from the framework profile) and runs ahead of the GPU until
        it is the slower of the two (a queue: the block cannot end before its last kernel is
        issued); the GPU time lost to it is a row labelled ``host_dispatch``. Stragglers and jitter
        change the GPU time (``variability.StepVariability``)."""
        env, var, varies = self.env, self.var, self.varies
        stage = self.stage_of(rank)
        queue = simpy.Store(env)
        dp_proc = env.process(self.dp_stream(rank, queue))
        events: dict[int, simpy.Event] = {}
        host_issue_s, contention = self.host_issue_s, self.opt.contention
        host = 0.0  # when the rank's CPU has issued every kernel so far
        sender, begun = None, 0.0
        at, rows, launch, stamp = self.at, self.trace.rows, self.launch, self._stamp
        timeout, all_of = env.timeout, env.all_of
        pp_bytes = self.work.pp_bytes
        copy_ends: dict[int, float] = {}  # handle -> when the copy ends
        program = self.programs[stage]
        rewaited = self._rewaited.get(stage)
        if rewaited is None:
            rewaited = self._rewaited[stage] = _rewaited(program)
        for index, op in enumerate(program):
            kind = type(op)
            if kind is Compute:
                now = env.now
                at[rank] = (index, now)
                block = op.block
                gpu_s = var.block_time(rank, op, index) if varies else block.time_s
                if host_issue_s:
                    host += (1 if op.graphed else block.kernels) * host_issue_s
                    stall = host - (now + gpu_s)
                    if stall > 0:
                        yield timeout(stall)
                        if env.now > now or op.kind in _PASSES:
                            rows.append(_row(Row, (rank, stage, "compute", op.kind, "", now, env.now, op.microbatch,
                                                   op.chunk, op.layer, "host_dispatch", 0.0, 0.0, None, 0.0,
                                                   env.now - now)))
                        now = env.now
                if contention:
                    yield self.gpu_time(rank, gpu_s)
                    slowed = self.gpu_done(rank, now, gpu_s)
                else:
                    yield timeout(gpu_s)
                    slowed = 0.0
                if env.now > now or op.kind in _PASSES:
                    rows.append(_row(Row, (rank, stage, "compute", op.kind, "", now, env.now, op.microbatch,
                                           op.chunk, op.layer, op.label, 0.0, block.flops, None, max(0.0, slowed),
                                           block.host_wait_s)))
            elif kind is Launch:
                ev = launch(rank, op.group, op.op, op.nbytes, op.axis, None, op.calls)
                events[op.handle] = stamp(ev) if op.stamp else ev
            elif kind is Wait:
                now = env.now
                at[rank] = (index, now)
                handles = op.handles
                if len(handles) == 1:
                    event = events[handles[0]] if index in rewaited else events.pop(handles[0])
                    yield event
                else:
                    waited = [events[h] for h in handles]
                    again = rewaited.get(index, ())
                    for h in handles:
                        if h not in again:
                            del events[h]
                    yield all_of(waited)
                    event = max(reversed(waited), key=_fired)
                if env.now > now:
                    rows.append(_row(Row, (rank, stage, "compute", "wait", op.axis, now, env.now, op.microbatch,
                                           op.chunk, op.layer, op.label, 0.0, 0.0, getattr(event, "origin", None),
                                           0.0, 0.0)))
            elif kind is Send:
                self.send(rank, op)
            elif kind is Recv:
                now = env.now
                at[rank] = (index, now)
                key = (rank, op.vstage, op.microbatch, op.kind)
                box = self._mailbox(key)
                yield box[0]
                del self._mail[key]
                posted = box[1] if box[1] is not None else now
                split = min(max(posted, now), env.now)
                sender = getattr(box[0], "origin", None)
                if env.now > now and varies:
                    var.inherit(rank, box[0].drift)
                label = f"recv {op.kind}"
                if split > now:
                    rows.append(_row(Row, (rank, stage, "compute", "idle", "", now, split, op.microbatch, op.chunk,
                                           -1, label, 0.0, 0.0, sender, 0.0, 0.0)))
                if env.now > split:
                    rows.append(_row(Row, (rank, stage, "compute", "wait", "pp", split, env.now, op.microbatch,
                                           op.chunk, -1, label, pp_bytes, 0.0, sender, 0.0, 0.0)))
            elif kind is StepBegin:
                begun = env.now
            elif kind is StepEnd:
                if env.now > begun or op.kind in _PASSES:
                    rows.append(_row(Row, (rank, stage, "step", op.kind, "", begun, env.now, op.microbatch, op.chunk,
                                           -1, "", 0.0, 0.0, sender, 0.0, 0.0)))
                sender = None
            elif kind is Copy:
                events[op.handle] = self.copy(rank, op, copy_ends)
            elif kind is Enqueue:
                done = env.event()
                done.queued = (rank, "compute", env.now)
                queue.put((op.group, op.op, op.nbytes, op.axis, op.calls, done))
                events[op.handle] = stamp(done)
            elif kind is HostStart:
                host = op.time_s
            elif kind is CloseStream:
                queue.put(None)
            elif kind is JoinStream:
                at[rank] = (index, env.now)
                yield dp_proc
            else:
                raise TypeError(f"unknown op {op!r}")
        self.stage_end[rank] = env.now

    def start(self) -> list[int]:
        """Start one process per simulated rank (one per stage folded, every rank unfolded); the ranks."""
        plan = self.plan
        if self.lanes is not None:
            ranks = [lane[0] for lane in self.lanes]
        else:
            ranks = [int(plan.grid[st, 0, 0, 0]) for st in range(plan.pp)] if self.opt.fold else list(range(plan.world))
        for r in ranks:
            self.procs[r] = self.env.process(self.rank_process(r))
        self.ranks = ranks
        return ranks

    def run_until(self, t: float) -> int:
        """Run every event up to simulated time ``t``; the number run."""
        events = 0
        with cyclic_gc_paused():
            while self.env.peek() <= t:
                self.env.step()
                events += 1
                if not events & _COMPACT_EVERY:
                    self.trace.compact()
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
        streams = {r: (busy, [item[:3] + (item[4],) for item in queue.items if item is not None])
                   for r, (busy, queue) in self.streams.items()}
        return Snapshot(self.env.now, dict(self.at), posted, dict(self.stage_end), streams)

    def finish(self, events: int = 0) -> SimResult:
        """Run to the end (after ``events`` already run) and return the result."""
        plan, ranks = self.plan, self.ranks
        with cyclic_gc_paused():
            while True:
                try:
                    self.env.step()
                except simpy.core.EmptySchedule:
                    break
                events += 1
                if not events & _COMPACT_EVERY:
                    self.trace.compact()
        if len(self.stage_end) != len(ranks):
            stuck = sorted(set(ranks) - set(self.stage_end))
            raise RuntimeError(f"simulation deadlocked: ranks {stuck[:8]} did not finish")
        stage_end = [0.0] * plan.pp
        for r, t in self.stage_end.items():
            stage_end[plan.stage_of(r)] = max(stage_end[plan.stage_of(r)], t)
        return SimResult(
            scenario=self.s, options=self.opt, plan=plan, cluster=self.cluster, workload=self.work,
            trace=self.trace.freeze(), step_time_s=max(self.stage_end.values()), stage_end_s=tuple(stage_end),
            simulated_ranks=tuple(ranks), events=events, link_bytes=self.net.stats.bytes_carried,
            transfers=self.net.stats.transfers, flows=tuple(self.net.flows),
            comm_calls=self.comm_calls.rows(), comm_spans=self.comm_calls.span_rows())

    def run(self) -> SimResult:
        self.start()
        return self.finish()


def simulate(s: Scenario, options: SimOptions = SimOptions(), cluster: Cluster | None = None) -> SimResult:
    with cyclic_gc_paused():
        inputs = step_inputs(s, options, cluster)
    return StepEngine(inputs).run()
