"""The training step as simpy processes: each rank walks its pipeline schedule.

Every rank (or, folded, one representative per pipeline stage) is a generator that computes
with the compute model and communicates through the network model, so TP, PP, DP, CP and EP
traffic all contend for the same links. The engine only appends rows to a trace; analysis lives
in ``simulator.reports.report``.

Folding (``SimOptions.fold``): in a regular layout all ranks of one pipeline stage run the same
program on the same link loads (every TP rank, DP replica, CP rank and EP rank of the stage).
The folded engine runs one process per stage and, at each communication, starts the flows of
*every* group of the stage, so link loads are exactly those of the full run; with ``merge`` the
identical groups of one collective become one coupled transfer. Tests compare folded, merged and
unfolded runs on small clusters.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Generator

import simpy

from simulator.physical.collectives import Collectives
from simulator.workload.compute import CP_CORE_OPS, CP_LOCAL_OPS, BlockCost, joined, split_at_gemm, split_around
from simulator.config import Scenario
from simulator.physical.hardware import GPUSpec, gpu_of
from simulator.physical.network import Network
from simulator.step.plan import Plan
from simulator.step.schedules import SCHEDULES, virtual_stage
from simulator.workload.moe import split_moe_block
from simulator.physical.topology import Cluster, build_cluster, load_topology
from simulator.workload.workload import GRAD_BYTES, PARAM_BYTES, Workload, build_workload


@dataclass(frozen=True)
class SimOptions:
    communication: bool = True  # False: every transfer takes no time (for closed-form checks)
    extras: bool = True  # embedding, LM head, loss and optimizer step
    fold: bool = True
    merge: bool = True
    algorithm: str = "auto"
    record_flows: bool = False  # keep every transfer's rate history (for link use and the comm map)
    compute_scale: float = 1.0  # what-if: GPU peak FLOP/s and HBM bandwidth multiplied by this


@dataclass(frozen=True)
class Row:
    """One interval on one rank's stream. ``kind``: F, B, R (recompute), embed, head, opt, wait,
    idle (waiting on a pipeline dependency), comm. ``axis``: tp, pp, dp, cp, ep, fsdp or ''."""

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


@dataclass
class Trace:
    rows: list[Row] = field(default_factory=list)

    def add(self, row: Row) -> None:
        if row.end > row.start or row.kind in ("F", "B"):
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


class StepEngine:
    def __init__(self, s: Scenario, options: SimOptions, cluster: Cluster | None = None):
        self.s = s
        self.opt = options
        par = s.parallelism
        self.gpu = gpu_of(s.cluster, s.training.precision)
        if options.compute_scale != 1.0:
            self.gpu = scaled_gpu(self.gpu, options.compute_scale)
        self.cluster = cluster or scenario_cluster(s)
        self.plan = Plan.build(par.tp, par.pp, s.dp, par.cp, par.ep, par.expert_tp)
        self.work = build_workload(s, self.gpu)
        self.m = s.num_microbatches
        self.env = simpy.Environment()
        self.net = Network(self.env, self.cluster.link_bw, record=options.record_flows)
        self.coll = Collectives(self.env, self.net, self.cluster, options.algorithm)
        self.trace = Trace()
        self._mail: dict = {}
        self._rendezvous: dict = {}
        self._seq: dict = defaultdict(int)
        self._groups: dict = {}
        self._pairs: dict = {}
        self.stage_end: dict[int, float] = {}
        self.comm_calls: dict = {}
        self.sw = self.work.software
        self.host_issue_s = self.sw.host_issue_s
        self.host: dict[int, float] = {}  # per rank: when its CPU has issued every kernel so far

    # communication -------------------------------------------------------------------------

    def _stage_groups(self, stage: int, kind: str):
        key = (stage, kind)
        if key not in self._groups:
            self._groups[key] = self.plan.groups_on_stage(stage, kind)
        return self._groups[key]

    def _group_of(self, rank: int, kind: str):
        return {"tp": self.plan.tp_group, "cp": self.plan.cp_group, "dpcp": self.plan.dp_cp_group,
                "ep": self.plan.ep_group, "edp": self.plan.expert_dp_group, "etp": self.plan.expert_tp_group}[kind](rank)

    def _account(self, rank: int, axis: str, op: str, size: float, event: simpy.Event) -> None:
        """Count one call of this rank and, when ``event`` fires, the time it took."""
        rec = self.comm_calls.setdefault((rank, axis, op), [0, 0.0, 0.0])
        rec[0] += 1
        rec[1] += size
        t0 = self.env.now

        def done(_e):
            rec[2] += self.env.now - t0
        event.callbacks.append(done)

    def _done(self) -> simpy.Event:
        ev = self.env.event()
        ev.succeed()
        return ev

    def launch(self, rank: int, kind: str, op: str, size: float, axis: str, here: tuple | None = None) -> simpy.Event:
        """Start this rank's part of a collective; the event fires when its group is done.

        The event's ``origin`` is the (rank, stream, time) that started the collective (the last
        rank to arrive), which the critical path follows back."""
        if not self.opt.communication or size <= 0:
            return self._done()
        if self.opt.fold:
            groups = self._stage_groups(self.plan.stage_of(rank), kind)
            if len(groups[0]) < 2:
                return self._done()
            proc = self.coll.start(op, groups, size, self.opt.merge, axis)
            proc.origin = here or (rank, "compute", self.env.now)
            self._account(rank, axis, op, size, proc)
            return proc
        group = self._group_of(rank, kind)
        if len(group) < 2:
            return self._done()
        seq_key = (rank, kind, group)
        key = (kind, group, self._seq[seq_key])
        self._seq[seq_key] += 1
        arrived, event = self._rendezvous.setdefault(key, (set(), self.env.event()))
        arrived.add(rank)
        if len(arrived) == len(group):
            del self._rendezvous[key]
            event.origin = here or (rank, "compute", self.env.now)
            proc = self.coll.start(op, [group], size, False, axis)
            proc.callbacks.append(lambda _e, ev=event: ev.succeed())
        self._account(rank, axis, op, size, event)
        return event

    def wait(self, rank: int, event: simpy.Event, axis: str, **where) -> Generator:
        start = self.env.now
        yield event
        parts = getattr(event, "parts", None)
        if parts:
            event = max(reversed(parts), key=lambda e: getattr(e, "fired", 0.0))
        self.trace.add(Row(rank, self.plan.stage_of(rank), "compute", "wait", axis, start, self.env.now, **where,
                           dep=getattr(event, "origin", None)))

    def _stamp(self, event: simpy.Event) -> simpy.Event:
        """Remember when ``event`` fires, so a wait on several events knows which released it."""
        event.callbacks.append(lambda e: setattr(e, "fired", self.env.now))
        return event

    def collective(self, rank: int, kind: str, op: str, size: float, axis: str, **where) -> Generator:
        yield from self.wait(rank, self.launch(rank, kind, op, size, axis), axis, label=op, **where)

    def _mailbox(self, key) -> list:
        """[arrival event, time the transfer started or None]."""
        return self._mail.setdefault(key, [self.env.event(), None])

    def _pp_pairs(self, rank: int, dst_stage: int) -> tuple[tuple[int, int], ...]:
        """(source, destination) of the pipeline transfers ``rank`` starts (all of its stage's, folded)."""
        key = (rank, dst_stage)
        if key not in self._pairs:
            sources = self.plan.stage_ranks(self.plan.stage_of(rank)) if self.opt.fold else [rank]
            self._pairs[key] = tuple((int(a), self.plan.pp_peer(int(a), dst_stage)) for a in sources)
        return self._pairs[key]

    def send(self, rank: int, dst_stage: int, vstage: int, mb: int, kind: str) -> None:
        """Post activations (kind F) or gradients (B) for ``vstage`` of micro-batch ``mb``.

        Folded, the representative also starts the transfers of every other rank of its stage."""
        box = self._mailbox((self.plan.pp_peer(rank, dst_stage), vstage, mb, kind))
        box[1] = self.env.now
        box[0].origin = (rank, "compute", self.env.now)
        pairs = self._pp_pairs(rank, dst_stage)
        if not self.opt.communication or all(a == b for a, b in pairs):
            box[0].succeed()
            return
        proc = self.coll.start("send_recv", pairs, self.work.pp_bytes, self.opt.merge, "pp")
        self._account(rank, "pp", "send_recv", self.work.pp_bytes, proc)
        proc.callbacks.append(lambda _e, ev=box[0]: ev.succeed())

    def recv(self, rank: int, vstage: int, mb: int, kind: str, chunk: int) -> Generator:
        box = self._mailbox((rank, vstage, mb, kind))
        start = self.env.now
        yield box[0]
        posted = box[1] if box[1] is not None else start
        stage = self.plan.stage_of(rank)
        split = min(max(posted, start), self.env.now)
        origin = getattr(box[0], "origin", None)
        self.trace.add(Row(rank, stage, "compute", "idle", "", start, split, mb, chunk, label=f"recv {kind}", dep=origin))
        self.trace.add(Row(rank, stage, "compute", "wait", "pp", split, self.env.now, mb, chunk, label=f"recv {kind}",
                           nbytes=self.work.pp_bytes, dep=origin))
        return origin

    # compute ----------------------------------------------------------------------------------

    def compute(self, rank: int, kind: str, block, label: str, microbatch=-1, chunk=-1, layer=-1) -> Generator:
        """Run ``block`` on the rank's compute stream. The host issues its kernels one after another
        (``host_issue_s`` each, from the framework profile) and runs ahead of the GPU until it is
        the slower of the two (a queue: the block cannot end before its last kernel is issued);
        the GPU time lost to it is a row labelled ``host_dispatch``."""
        if block.time_s <= 0:
            return
        if self.host_issue_s:
            issued = self.host.get(rank, 0.0) + block.kernels * self.host_issue_s
            self.host[rank] = issued
            stall = issued - (self.env.now + block.time_s)
            if stall > 0:
                start = self.env.now
                yield self.env.timeout(stall)
                self.trace.add(Row(rank, self.plan.stage_of(rank), "compute", kind, "", start, self.env.now,
                                   microbatch, chunk, layer, "host_dispatch"))
        start = self.env.now
        yield self.env.timeout(block.time_s)
        self.trace.add(Row(rank, self.plan.stage_of(rank), "compute", kind, "", start, self.env.now,
                           microbatch, chunk, layer, label, flops=block.flops))

    def layer_forward(self, rank: int, layer: int, mb: int, chunk: int, kind: str = "F") -> Generator:
        s, w = self.s, self.work
        cost = w.layer_costs[layer]
        sp = s.parallelism.sequence_parallel and s.parallelism.tp > 1
        at = dict(microbatch=mb, chunk=chunk, layer=layer)
        if sp and self.sw.async_tp:
            cp_ev = self.launch(rank, "cp", "all_gather", w.cp_bytes * s.parallelism.cp, "cp")
            yield from self.async_tp_forward(rank, kind, cost.attn_fwd, "qkv_proj", "out_proj", "attention", at)
            yield from self.wait(rank, cp_ev, "cp", **at)
            if not s.model.is_moe_layer(layer):
                yield from self.async_tp_forward(rank, kind, cost.mlp_fwd, "mlp_up", "mlp_down", "mlp", at)
                return
            yield from self.mlp_forward(rank, layer, kind, at, sp=True)
            return
        if sp:
            yield from self.collective(rank, "tp", "all_gather", w.tp_bytes, "tp", **at)
        if s.parallelism.cp > 1:
            yield from self.context_parallel_attention(rank, kind, cost.attn_fwd, w.cp_bytes, at)
        else:
            cp_ev = self.launch(rank, "cp", "all_gather", w.cp_bytes * s.parallelism.cp, "cp")
            yield from self.compute(rank, kind, cost.attn_fwd, "attention", mb, chunk, layer)
            yield from self.wait(rank, cp_ev, "cp", **at)
        yield from self.collective(rank, "tp", "reduce_scatter" if sp else "all_reduce", w.tp_bytes, "tp", **at)
        yield from self.mlp_forward(rank, layer, kind, at, sp)

    def async_tp_forward(self, rank: int, kind: str, block, first: str, last: str, label: str, at: dict) -> Generator:
        """A sequence-parallel block with async TP (torch micro-pipelined collective matmuls, TE
        userbuffers): the input all-gather runs under the first GEMM and the output reduce-scatter
        under the last, as the chunked GEMMs hide them (torchtitan async-TP post; Wang et al. 2022,
        'Overlap communication with dependent computation via decomposition')."""
        w = self.work
        mb, chunk, layer = at["microbatch"], at["chunk"], at["layer"]
        before, head, rest = split_around(block, (first,))
        middle, tail, after = split_around(rest, (last,))
        yield from self.compute(rank, kind, before, label, mb, chunk, layer)
        gather = self.launch(rank, "tp", "all_gather", w.tp_bytes, "tp")
        yield from self.compute(rank, kind, head, label, mb, chunk, layer)
        yield from self.wait(rank, gather, "tp", label="all_gather", **at)
        yield from self.compute(rank, kind, middle, label, mb, chunk, layer)
        scatter = self.launch(rank, "tp", "reduce_scatter", w.tp_bytes, "tp")
        yield from self.compute(rank, kind, tail, label, mb, chunk, layer)
        yield from self.wait(rank, scatter, "tp", label="reduce_scatter", **at)
        yield from self.compute(rank, kind, after, label, mb, chunk, layer)

    def mlp_forward(self, rank: int, layer: int, kind: str, at: dict, sp: bool) -> Generator:
        s, w = self.s, self.work
        cost = w.layer_costs[layer]
        mb, chunk = at["microbatch"], at["chunk"]
        moe = s.model.is_moe_layer(layer)
        if sp:
            yield from self.mlp_tp_collective(rank, moe, "all_gather", at)
        if moe:
            yield from self.moe_block(rank, kind, cost.mlp_fwd, at)
        else:
            yield from self.compute(rank, kind, cost.mlp_fwd, "mlp", mb, chunk, layer)
        yield from self.mlp_tp_collective(rank, moe, "reduce_scatter" if sp else "all_reduce", at)

    def moe_block(self, rank: int, kind: str, block, at: dict) -> Generator:
        """Router and permutation, the dispatch all-to-all, the local experts, the combine
        all-to-all, unpermutation and shared experts (``moe.split_moe_block``); in backward the
        same order reversed. With ``moe.overlap_a2a`` the all-to-alls run while the rank computes
        and are waited for at the end of the block (the framework hides them behind other work)."""
        w = self.work
        mb, chunk, layer = at["microbatch"], at["chunk"], at["layer"]
        before, experts, after = split_moe_block(block)
        overlap = self.s.moe.overlap_a2a
        yield from self.compute(rank, kind, before, "moe", mb, chunk, layer)
        if overlap:
            first = self.launch(rank, "ep", "all_to_all", w.ep_bytes, "ep")
        else:
            yield from self.collective(rank, "ep", "all_to_all", w.ep_bytes, "ep", **at)
        yield from self.compute(rank, kind, experts, "moe", mb, chunk, layer)
        if overlap:
            second = self.launch(rank, "ep", "all_to_all", w.ep_bytes, "ep")
        else:
            yield from self.collective(rank, "ep", "all_to_all", w.ep_bytes, "ep", **at)
        yield from self.compute(rank, kind, after, "moe", mb, chunk, layer)
        if overlap:
            yield from self.wait(rank, first, "ep", label="all_to_all", **at)
            yield from self.wait(rank, second, "ep", label="all_to_all", **at)

    def mlp_tp_collective(self, rank: int, moe: bool, op: str, at: dict) -> Generator:
        """The TP collective around an MLP. An MoE layer with expert TP (etp) below tp gathers and
        scatters over its etp group only, etp / tp of the bytes; with etp = 1 there is none."""
        par, w = self.s.parallelism, self.work
        if moe and par.expert_tp < par.tp:
            if par.expert_tp > 1:
                yield from self.collective(rank, "etp", op, w.tp_bytes * par.expert_tp / par.tp, "tp", **at)
            return
        yield from self.collective(rank, "tp", op, w.tp_bytes, "tp", **at)

    def layer_backward(self, rank: int, layer: int, mb: int, chunk: int) -> Generator:
        s, w = self.s, self.work
        cost = w.layer_costs[layer]
        sp = s.parallelism.sequence_parallel and s.parallelism.tp > 1
        at = dict(microbatch=mb, chunk=chunk, layer=layer)
        if s.training.recompute == "full":
            yield from self.layer_forward(rank, layer, mb, chunk, kind="R")
        moe = s.model.is_moe_layer(layer)
        if sp:
            yield from self.mlp_tp_collective(rank, moe, "all_gather", at)
        if moe:
            yield from self.moe_block(rank, "B", cost.mlp_bwd, at)
            yield from self.mlp_tp_collective(rank, moe, "reduce_scatter" if sp else "all_reduce", at)
        else:
            yield from self.column_parallel_backward(rank, cost.mlp_bwd, "mlp_up", "mlp", sp, at)
        if sp:
            yield from self.collective(rank, "tp", "all_gather", w.tp_bytes, "tp", **at)
        if s.training.recompute == "selective":
            yield from self.compute(rank, "R", cost.attn_recompute, "attention", mb, chunk, layer)
        if s.parallelism.cp > 1:
            rest = yield from self.context_parallel_attention(rank, "B", cost.attn_bwd, 2 * w.cp_bytes, at)
            yield from self.column_parallel_backward(rank, rest, "qkv_proj", "attention", sp, at)
        else:
            cp_ev = self.launch(rank, "cp", "all_gather", 2 * w.cp_bytes * s.parallelism.cp, "cp")
            yield from self.column_parallel_backward(rank, cost.attn_bwd, "qkv_proj", "attention", sp, at, cp_ev)

    def context_parallel_attention(self, rank: int, kind: str, block, chunk_bytes: float, at: dict) -> Generator:
        """The attention block under context parallelism. The ops before the attention core
        compute first; the exchange of the other ranks' K and V (backward: also carrying dK and
        dV on) starts with the core. With ``cp_comm_type: p2p`` (Megatron-core / Transformer
        Engine ``AttnFuncWithCPAndKVP2P``) its cp - 1 ring steps overlap the whole core; with
        ``all_gather`` (Llama 3, Sec. 3.3.2; PyTorch's context_parallel ``allgather`` rotater)
        K and V are gathered while only the local causal call computes, and the calls on the
        other ranks' keys wait for the gather. Whatever the core cannot hide is exposed; with
        ``overlap.cp_comm: false`` the whole exchange is.
        Forward, the rest of the block computes here; backward, it is returned for the
        column-parallel backward to run with its TP overlap."""
        mb, chunk, layer = at["microbatch"], at["chunk"], at["layer"]
        before, core, after = split_around(block, CP_CORE_OPS)
        yield from self.compute(rank, kind, before, "attention", mb, chunk, layer)
        cp_ev = self.launch(rank, "cp", "all_gather", chunk_bytes * self.s.parallelism.cp, "cp")
        if not self.sw.cp_comm:  # overlap.cp_comm false: the exchange completes before the core starts
            yield from self.wait(rank, cp_ev, "cp", **at)
            yield from self.compute(rank, kind, core, "attention", mb, chunk, layer)
        elif self.sw.cp_comm_type == "all_gather":
            _, local, remote = split_around(core, CP_LOCAL_OPS)
            yield from self.compute(rank, kind, local, "attention", mb, chunk, layer)
            yield from self.wait(rank, cp_ev, "cp", **at)
            yield from self.compute(rank, kind, remote, "attention", mb, chunk, layer)
        else:
            yield from self.compute(rank, kind, core, "attention", mb, chunk, layer)
            yield from self.wait(rank, cp_ev, "cp", **at)
        if kind == "B":
            return after
        yield from self.compute(rank, kind, after, "attention", mb, chunk, layer)
        return None

    def column_parallel_backward(self, rank: int, block, gemm: str, label: str, sp: bool, at: dict,
                                 cp_ev: simpy.Event | None = None) -> Generator:
        if not (self.sw.tp_comm or (sp and self.sw.async_tp)):
            yield from self.column_parallel_backward_exposed(rank, block, gemm, label, sp, at, cp_ev)
            return
        yield from self.column_parallel_backward_overlapped(rank, block, gemm, label, sp, at, cp_ev)

    def column_parallel_backward_exposed(self, rank: int, block, gemm: str, label: str, sp: bool, at: dict,
                                         cp_ev: simpy.Event | None = None) -> Generator:
        """The same backward without TP communication overlap (``overlap.tp_comm: false``, e.g.
        DTensor TP in eager PyTorch): the input re-gather before the input-gradient GEMM and the
        gradient all-reduce or reduce-scatter after the weight-gradient GEMM, both exposed."""
        w = self.work
        before, dgrad, wgrad, after = split_at_gemm(block, gemm)
        mb, chunk, layer = at["microbatch"], at["chunk"], at["layer"]
        yield from self.compute(rank, "B", before, label, mb, chunk, layer)
        if sp:
            yield from self.collective(rank, "tp", "all_gather", w.tp_bytes, "tp", **at)
        yield from self.compute(rank, "B", joined(dgrad, wgrad), label, mb, chunk, layer)
        if cp_ev is not None:
            yield from self.wait(rank, cp_ev, "cp", **at)
        yield from self.collective(rank, "tp", "reduce_scatter" if sp else "all_reduce", w.tp_bytes, "tp", **at)
        yield from self.compute(rank, "B", after, label, mb, chunk, layer)

    def column_parallel_backward_overlapped(self, rank: int, block, gemm: str, label: str, sp: bool, at: dict,
                                            cp_ev: simpy.Event | None = None) -> Generator:
        """Backward of a block that ends in a column-parallel GEMM, with Megatron-LM's overlap of
        its TP communication (``LinearWithGradAccumulationAndAsyncCommunication``, also Transformer
        Engine's Linear): the input-gradient all-reduce (or, with sequence parallelism, its
        reduce-scatter) runs while the weight-gradient GEMM computes; with sequence parallelism the
        saved sequence-sharded input is all-gathered again while the input-gradient GEMM computes."""
        w = self.work
        before, dgrad, wgrad, after = split_at_gemm(block, gemm)
        mb, chunk, layer = at["microbatch"], at["chunk"], at["layer"]
        if sp:
            yield from self.compute(rank, "B", before, label, mb, chunk, layer)
            gather = self.launch(rank, "tp", "all_gather", w.tp_bytes, "tp")
            yield from self.compute(rank, "B", dgrad, label, mb, chunk, layer)
            yield from self.wait(rank, gather, "tp", label="all_gather", **at)
        else:
            yield from self.compute(rank, "B", joined(before, dgrad), label, mb, chunk, layer)
        if cp_ev is not None:
            yield from self.wait(rank, cp_ev, "cp", **at)
        grad = self.launch(rank, "tp", "reduce_scatter" if sp else "all_reduce", w.tp_bytes, "tp")
        yield from self.compute(rank, "B", wgrad, label, mb, chunk, layer)
        yield from self.wait(rank, grad, "tp", label="reduce_scatter" if sp else "all_reduce", **at)
        yield from self.compute(rank, "B", after, label, mb, chunk, layer)

    # data-parallel stream -----------------------------------------------------------------------

    def dp_stream(self, rank: int, queue: simpy.Store) -> Generator:
        """Gradient and parameter collectives, one after another on their own stream."""
        free = None  # where this stream last became free, (rank, stream, time)
        while True:
            item = yield queue.get()
            if item is None:
                return
            kind, op, size, axis, done = item
            start = self.env.now
            here = free if free is not None and free[2] == start and done.queued[2] < start else done.queued
            ev = self.launch(rank, kind, op, size, axis, here)
            yield ev
            self.trace.add(Row(rank, self.plan.stage_of(rank), "dp", "comm", axis, start, self.env.now,
                               label=op, nbytes=size, dep=getattr(ev, "origin", None)))
            free = (rank, "dp", self.env.now) if self.env.now > start else here
            done.origin = free
            done.succeed()

    def _grad_ops(self, bucket, zero: int):
        op = "all_reduce" if zero == 0 else "reduce_scatter"
        out = []
        if bucket.dense_params:
            out.append(("dpcp", op, bucket.dense_params * GRAD_BYTES))
        if bucket.expert_params:
            out.append(("edp", op, bucket.expert_params * GRAD_BYTES))
        return out

    def _param_ops(self, bucket):
        out = []
        if bucket.dense_params:
            out.append(("dpcp", "all_gather", bucket.dense_params * PARAM_BYTES))
        if bucket.expert_params:
            out.append(("edp", "all_gather", bucket.expert_params * PARAM_BYTES))
        return out

    # the rank -----------------------------------------------------------------------------------

    def rank_process(self, rank: int) -> Generator:
        s, w, plan = self.s, self.work, self.plan
        par = s.parallelism
        p, v = par.pp, par.vp
        stage = plan.stage_of(rank)
        nvs = p * v
        zero = par.zero_stage
        steps = SCHEDULES[s.pipeline_schedule](stage, p, self.m, v)
        last_b = {}
        for i, st in enumerate(steps):
            if st.kind == "B":
                last_b[st.chunk] = i
        queue = simpy.Store(self.env)
        dp_proc = self.env.process(self.dp_stream(rank, queue))
        pending: list[simpy.Event] = []

        def enqueue(kind, op, size, axis):
            done = self.env.event()
            done.queued = (rank, "compute", self.env.now)
            queue.put((kind, op, size, axis, done))
            pending.append(self._stamp(done))
            return done

        sw = self.sw
        deferred: list[tuple] = []  # gradient collectives held until the backward ends (overlap.grad_reduce off)
        if self.host_issue_s and self.opt.extras:
            # The host issued this step's first kernels while the previous step's optimizer ran on the
            # GPU (it synchronised for the gradient norm before issuing the optimizer's kernels).
            opt = w.optimizer[stage]
            self.host[rank] = min(0.0, opt.kernels * self.host_issue_s - opt.time_s)
        param_ready: dict[int, simpy.Event] = {}
        if zero in (1, 2):
            for chunk in range(v):
                vs = virtual_stage(stage, p, chunk)
                for bucket in reversed(w.buckets[vs]):
                    ev = None
                    for kind, op, size in self._param_ops(bucket):
                        ev = enqueue(kind, op, size, "dp")
                    for layer in bucket.layers:
                        if ev is not None:
                            param_ready[layer] = ev
        if param_ready and not sw.param_gather:
            # No overlap (DeepSpeed ZeRO-1/2 gathers right after the optimizer step): every
            # parameter all-gather is exposed before the first forward.
            gathers = list(dict.fromkeys(param_ready.values()))
            everything = self.env.all_of(gathers)
            everything.parts = gathers
            yield from self.wait(rank, everything, "dp")
            param_ready.clear()
        depth = sw.param_prefetch_depth if sw.param_gather else 0
        fsdp_ready: dict = {}

        def fsdp_gather(layer, key):
            if zero != 3 or key in fsdp_ready:
                return
            size = (w.layer_dense_params[layer]) * PARAM_BYTES
            fsdp_ready[key] = self.launch(rank, "dpcp", "all_gather", size, "fsdp")

        for i, st in enumerate(steps):
            vs = virtual_stage(stage, p, st.chunk)
            layers = w.layers(vs)
            at = dict(microbatch=st.microbatch, chunk=st.chunk)
            if st.kind == "F":
                sender = None
                if vs > 0:
                    sender = yield from self.recv(rank, vs, st.microbatch, "F", st.chunk)
                start = self.env.now
                if vs == 0 and self.opt.extras:
                    yield from self.compute(rank, "embed", w.embedding[0], "embedding", **at)
                for layer in layers:
                    if layer in param_ready:
                        yield from self.wait(rank, param_ready.pop(layer), "dp", layer=layer, **at)
                    fsdp_gather(layer, ("F", st.microbatch, layer))
                    for ahead in range(layer + 1, layer + 1 + depth):
                        if zero == 3 and ahead in layers:
                            fsdp_gather(ahead, ("F", st.microbatch, ahead))
                    if zero == 3:
                        yield from self.wait(rank, fsdp_ready.pop(("F", st.microbatch, layer)), "fsdp", layer=layer, **at)
                    yield from self.layer_forward(rank, layer, st.microbatch, st.chunk)
                if vs == nvs - 1 and self.opt.extras:
                    yield from self.compute(rank, "head", w.head[0], "lm_head+loss", **at)
                self.trace.add(Row(rank, stage, "step", "F", "", start, self.env.now, st.microbatch, st.chunk, dep=sender))
                if vs < nvs - 1:
                    self.send(rank, (stage + 1) % p, vs + 1, st.microbatch, "F")
            else:
                sender = None
                if vs < nvs - 1:
                    sender = yield from self.recv(rank, vs, st.microbatch, "B", st.chunk)
                start = self.env.now
                if vs == nvs - 1 and self.opt.extras:
                    yield from self.compute(rank, "head", w.head[1], "lm_head+loss", **at)
                final = last_b[st.chunk] == i
                grads_of = {layer: b for b in w.buckets[vs] for layer in b.layers}
                for layer in reversed(layers):
                    if zero == 3:
                        fsdp_gather(layer, ("B", st.microbatch, layer))
                        for ahead in range(layer - 1, layer - 1 - depth, -1):
                            if ahead in layers:
                                fsdp_gather(ahead, ("B", st.microbatch, ahead))
                        yield from self.wait(rank, fsdp_ready.pop(("B", st.microbatch, layer)), "fsdp", layer=layer, **at)
                    yield from self.layer_backward(rank, layer, st.microbatch, st.chunk)
                    if zero == 3 and not sw.grad_reduce:
                        deferred.append(("dpcp", "reduce_scatter", w.layer_dense_params[layer] * GRAD_BYTES, "fsdp"))
                    elif zero == 3:
                        ev = self.launch(rank, "dpcp", "reduce_scatter", w.layer_dense_params[layer] * GRAD_BYTES, "fsdp")
                        pending.append(self._stamp(ev))
                    elif final and grads_of[layer].layers[-1] == layer:
                        for kind, op, size in self._grad_ops(grads_of[layer], zero):
                            if sw.grad_reduce:
                                enqueue(kind, op, size, "dp")
                            else:
                                deferred.append((kind, op, size, "dp"))
                if vs == 0 and self.opt.extras:
                    yield from self.compute(rank, "embed", w.embedding[1], "embedding", **at)
                if final and zero != 3:
                    for bucket in w.buckets[vs]:
                        if not bucket.layers:
                            for kind, op, size in self._grad_ops(bucket, zero):
                                if sw.grad_reduce:
                                    enqueue(kind, op, size, "dp")
                                else:
                                    deferred.append((kind, op, size, "dp"))
                self.trace.add(Row(rank, stage, "step", "B", "", start, self.env.now, st.microbatch, st.chunk, dep=sender))
                if vs > 0:
                    self.send(rank, (stage - 1) % p, vs - 1, st.microbatch, "B")
        for item in deferred:
            enqueue(*item)
        queue.put(None)
        if pending:
            everything = self.env.all_of(pending)
            everything.parts = pending
            yield from self.wait(rank, everything, "fsdp" if zero == 3 else "dp")
        yield dp_proc
        if self.opt.extras:
            yield from self.compute(rank, "opt", w.optimizer[stage], "optimizer")
        self.stage_end[rank] = self.env.now

    def run(self) -> SimResult:
        plan = self.plan
        ranks = ([int(plan.grid[st, 0, 0, 0]) for st in range(plan.pp)] if self.opt.fold
                 else list(range(plan.world)))
        for r in ranks:
            self.env.process(self.rank_process(r))
        events = 0
        while True:
            try:
                self.env.step()
            except simpy.core.EmptySchedule:
                break
            events += 1
        if len(self.stage_end) != len(ranks):
            stuck = sorted(set(ranks) - set(self.stage_end))
            raise RuntimeError(f"simulation deadlocked: ranks {stuck[:8]} did not finish")
        step = max(self.stage_end.values())
        stage_end = [0.0] * plan.pp
        for r, t in self.stage_end.items():
            st = plan.stage_of(r)
            stage_end[st] = max(stage_end[st], t)
        return SimResult(
            scenario=self.s, options=self.opt, plan=plan, cluster=self.cluster, workload=self.work,
            trace=tuple(self.trace.rows), step_time_s=step, stage_end_s=tuple(stage_end),
            simulated_ranks=tuple(ranks), events=events, link_bytes=self.net.stats.bytes_carried,
            transfers=self.net.stats.transfers, flows=tuple(self.net.flows),
            comm_calls=tuple(sorted((*k, *v) for k, v in self.comm_calls.items())))


@functools.lru_cache(maxsize=64)
def scenario_cluster(s: Scenario) -> Cluster:
    """The cluster a scenario runs on: its topology scaled to its nodes, with its link overrides
    and its link faults (``simulator.physical.faults``)."""
    from simulator.physical.faults import apply_link_faults

    c = s.cluster
    return apply_link_faults(build_cluster(load_topology(c.topology), c.num_nodes, gpus_per_node=c.gpus_per_node,
                                           nvlink_bandwidth_GBps=c.nvlink_bandwidth_GBps,
                                           network_bandwidth_Gbps=c.network_bandwidth_Gbps,
                                           oversubscription=c.oversubscription, gpu=c.gpu), s.faults)


def scaled_gpu(gpu: GPUSpec, factor: float) -> GPUSpec:
    """``gpu`` with every peak FLOP/s and the HBM bandwidth multiplied by ``factor`` (compute what-if)."""
    return replace(gpu, peak_flops={k: v * factor for k, v in gpu.peak_flops.items()},
                   hbm_bandwidth_Bps=gpu.hbm_bandwidth_Bps * factor)


def simulate(s: Scenario, options: SimOptions = SimOptions(), cluster: Cluster | None = None) -> SimResult:
    return StepEngine(s, options, cluster).run()
