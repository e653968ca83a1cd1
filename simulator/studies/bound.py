"""A lower bound on the simulated step time: compute only, no communication, a pipeline fill and drain.

The engine runs each rank's program (``program.build_program``) as one simpy process that does
its compute one block after another; communication and waits only ever add time. So for pipeline
stage ``s`` of ``p`` (virtual stage ``vs = c p + s`` for chunk ``c``), with ``F(vs)`` and ``B(vs)``
the compute of one micro-batch's forward and backward step on a virtual stage (its layers'
kernels, plus the embedding on ``vs = 0`` and the LM head and loss on the last; the backward
includes whatever recompute re-runs) and ``O_s`` the optimizer step:

1. Stage ``s`` starts computing no earlier than ``sum_{j<s} F(j)``: its first step is a forward
   on some ``vs >= s``, which needs the same micro-batch's forward on virtual stages
   ``0 .. vs-1`` in turn, and those include ``0 .. s-1`` (chunk 0 of stages ``0 .. s-1``).
2. It then computes ``W_s = m sum_c (F(c p + s) + B(c p + s))`` serially, so its last step ends
   no earlier than ``sum_{j<s} F(j) + W_s``, and the stage ends ``O_s`` later at the soonest.
3. Its last backward is on some ``vs >= s``; the same micro-batch's backward must then run on
   ``vs-1 .. 0`` in turn, which include ``s-1 .. 0``, and stage 0 ends with ``O_0`` after that:
   the step is at least ``sum_{j<s} F(j) + W_s + sum_{j<s} B(j) + O_0`` (with a split backward
   the stage's W steps may come after its last B: then W_s counts only F and the input-gradient
   B here, and the full W_s bounds the stage's own end with ``O_s``).

The same holds with ``F`` and ``B`` counting, besides compute, the TP collectives the compute
stream waits on as soon as it starts them (``program._Builder.collective``: launch, then wait),
which nothing overlaps. Per layer and micro-batch (``blocking_tp_s``): forward, the all-reduce after
attention and after a dense MLP, or with sequence parallelism the all-gather before and the
reduce-scatter after each; backward, with sequence parallelism, the all-gathers before the dense
MLP's and the attention's backward; full recompute repeats the forward's. On MoE layers, unless
``moe.overlap_a2a``, also the EP dispatch and combine all-to-alls of each (``blocking_ep_s``),
and in both passes the TP (or expert-TP) collectives around the MoE block, which nothing overlaps.
(The overlapped backward TP collectives and all CP, PP and DP traffic are left out.) Each takes at least its time alone on an idle node (``collectives.time_collective``): under
max-min fair sharing a flow never runs faster than its bottleneck link alone lets it, and a ring
waits for its slowest edge. TP and EP groups wider than a node are not counted.

With ZeRO-3 (FSDP, ``program.build_program``) the compute stream also waits, before
every layer's forward and backward, for that layer's parameter all-gather over DP x CP, which is
launched (prefetch depth ``d``, 0 without ``overlap.param_gather``) when the loop reaches the layer
``d`` places earlier in the same step (the first ``d + 1`` layers when the step's loop starts): so
layer ``j`` cannot start before the end of layer ``j - d - 1`` (the step's start for ``j <= d``)
plus its all-gather alone on the idle cluster (``fsdp_chain``). One step's ``F`` or ``B`` is then
the longest path of that chain rather than the plain sum of its layers.

The backward's overlapped TP collectives are not free either: each holds its kernel's SMs for at
least its time alone while the GEMM launched after it runs on the rest, so with the GPU's SM count
each layer's ``B`` also carries ``overlap_contention_s``: the collective's exposed remainder or the
GEMM's slowdown, whichever is larger (zero for split backwards). With async TP the forward's
all-gather and reduce-scatter run beside its first and last GEMMs in the same way, so each layer's
``F`` carries ``async_tp_forward_s`` (and, under full recompute, its ``B`` again).

The same collectives also bound the step from the links' side: every all-gather (one per layer
in each forward and backward) and gradient reduce-scatter (one per layer in each backward) of
the stage's DP x CP group puts the same bytes on the same links whatever else runs (the routes
are fixed), and a link carries at most its capacity, so the stage cannot end before its busiest
link has carried them all, plus the optimizer step (``fsdp_link_bound``). Those collectives
cost SMs too: whenever a byte of one is on a link, the collective has started, so every rank of the
group has launched it and holds its kernel's ``k`` SMs (``engine.hold``, until the collective ends),
and compute beside it advances at no more than ``(SMs - k) / SMs`` of its rate (``engine.gpu_time``).
Split a stage's time ``E`` into compute alone ``t1``, compute beside a communication kernel ``t2`` and
no compute ``t3``: its compute work ``C`` is at most ``t1 + t2 (SMs - k) / SMs``, and its FSDP
collectives are active for at least the busiest link's busy time ``L``, all within ``t2 + t3``, so
``E = t1 + t2 + t3 >= C + (k / SMs) t2 + t3 >= C + (k / SMs) L + (1 - k / SMs) t3``; ``t3`` is at
least the blocking TP collectives' time ``T`` (the compute stream waits on them, computing nothing)
plus the fill ``H`` before the stage's first forward (item 1), so
``E >= C + (k / SMs) L + (1 - k / SMs) (T + H)`` (``fsdp_contention_bound``).

Without ZeRO-3 the stage's gradient reductions and ZeRO-1/2 parameter all-gathers run one after
another on a stream of their own, which the optimizer step waits for; walking the schedule at
least compute bounds when each reduction can be enqueued, and the stream's end plus the optimizer
step bounds the step. Both walks, the schedule's steps across stages with the pipeline transfers and that stream,
are ``schedule_walk_bound``'s (layouts with a large DP x CP group and many parameters per GPU,
whose reductions queue up in the pipeline's drain).

Hence ``step >= max_s [sum_{j<s} F(j) + W_s + max(O_s, sum_{j<s} B(j) + O_0)]`` for every
schedule (each one's last backward on a stage is followed by the backwards of the virtual stages
before it, down to the first). The schedule's placement (``schedules.Placement``) says which
virtual stages a rank holds: its work W_s is m / copies micro-batches through each of its chunks,
and with DualPipe's two model copies the fill and drain terms take the cheaper copy (either may
feed the rank first or finish last, ending on its own first stage). When a schedule splits the
backward (zero-bubble, DualPipe), the drain chain needs only the input-gradient part of B(j): the
weight-gradient GEMMs may run after it. For uniform stages without
communication this is the PipeDream-Flush closed form (m + p - 1)(f + b) (Narayanan et al. 2021);
with ``pp = 1`` it is the single stage's compute, which the engine reproduces exactly when
communication is switched off (``tests/test_planner.py``). The bound uses the very ``BlockCost``
values the engine times (``workload.build_workload``), summed in another order, so it is scaled by
``1 - 1e-9`` to stay below the simulated step whatever the float rounding.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import numpy as np

from simulator.scenario.config import Scenario
from simulator.layout.grid import Plan
from simulator.layout.schedules import placement, schedule
from simulator.network.nccl import kernel_sms, least_kernel_sms
from simulator.program import builder as P
from simulator.program.builder import grad_reduce_op, schedule_steps
from simulator.workload.compute import CP_CORE_OPS, CP_LOCAL_OPS, split_around, split_at_gemm, split_weight_grad
from simulator.workload.frameworks import fsdp_gathered_once
from simulator.workload.workload import GRAD_BYTES, PARAM_BYTES, Workload
from simulator.engine.engine import StepEngine
from simulator.engine.inputs import step_inputs
from simulator.engine.records import SimOptions, SimResult
from simulator.network.cluster import Cluster
from simulator.network.collectives import cluster_cache, time_collective

ROUNDING_MARGIN = 1e-9


class LinkSeconds:
    """Seconds each link of a cluster is busy, kept for the links that carry anything: a collective
    over a few hundred ranks touches a few thousand of a 16,384-GPU cluster's links, and the
    planner keeps one of these per collective it bounds (as dense arrays, 1.2 MB each, they held
    1.3 GB on Llama 3 405B / 16K). Sums and scalings act link by link as on the dense array, in
    the same order, so every figure is the same to the last bit; ``max`` is the busiest link's
    seconds (0 when no link is busy)."""

    __slots__ = ("links", "seconds")

    def __init__(self, links: np.ndarray, seconds: np.ndarray):
        self.links, self.seconds = links, seconds

    @classmethod
    def of(cls, dense: np.ndarray) -> "LinkSeconds":
        links = np.flatnonzero(dense)
        return cls(links, dense[links])

    def __mul__(self, k: float) -> "LinkSeconds":
        return LinkSeconds(self.links, k * self.seconds)

    __rmul__ = __mul__

    def __add__(self, other) -> "LinkSeconds":
        if isinstance(other, (int, float)) and other == 0:
            return self
        if np.array_equal(self.links, other.links):
            return LinkSeconds(self.links, self.seconds + other.seconds)
        links = np.union1d(self.links, other.links)
        seconds = np.zeros(len(links))
        seconds[np.searchsorted(links, self.links)] = self.seconds
        seconds[np.searchsorted(links, other.links)] += other.seconds
        return LinkSeconds(links, seconds)

    __radd__ = __add__

    def max(self) -> float:
        return float(self.seconds.max()) if len(self.seconds) else 0.0

CollectiveTime = Callable[[str, "int | tuple[int, ...]", float], float]  # (op, n or local ranks, bytes) -> seconds alone on one node
# (op, global ranks, bytes) -> (seconds alone on the idle cluster, ``LinkSeconds`` each link is busy carrying its bytes)
GroupTime = Callable[[str, tuple, float], tuple]


def blocking_tp_s(s: Scenario, w: Workload, collective_time: CollectiveTime | None
                  ) -> dict[bool, tuple[float, float]]:
    """Seconds per layer and micro-batch of TP collectives the compute stream waits on at once,
    {is MoE layer: (forward, backward)}, and on MoE layers the EP all-to-alls (``blocking_ep_s``);
    the backward includes full recompute's forward ones."""
    out = _blocking_tp(s, w, collective_time)
    fwd, bwd = blocking_ep_s(s, w, collective_time)
    out[True] = (out[True][0] + fwd, out[True][1] + bwd)
    return out


def blocking_ep_s(s: Scenario, w: Workload, collective_time: CollectiveTime | None) -> tuple[float, float]:
    """Seconds per MoE layer and micro-batch of the EP all-to-alls the compute stream waits on,
    (forward, backward): without ``moe.overlap_a2a`` the program's MoE block launches the dispatch
    and the combine and waits for each at once (``program._Builder.moe_block``), in the forward,
    in the backward and in full recompute's forward again. Each takes at least its time alone on
    an idle node (the argument of the TP collectives in the module docstring; the engine moves
    the same ``ep_bytes`` over the same op). EP groups wider than a node are not counted."""
    par = s.parallelism
    if (collective_time is None or not s.model.is_moe or par.ep < 2 or s.moe.overlap_a2a
            or par.ep * par.expert_tp > s.cluster.gpus_per_node or w.ep_bytes <= 0):
        return 0.0, 0.0
    pair = 2 * collective_time("all_to_all", par.ep, w.ep_bytes)  # dispatch and combine
    return pair, pair + (pair if s.training.recompute == "full" else 0.0)


def _blocking_tp(s: Scenario, w: Workload, collective_time: CollectiveTime | None) -> dict[bool, tuple[float, float]]:
    tp = s.parallelism.tp
    if collective_time is None or tp < 2 or tp > s.cluster.gpus_per_node:
        return {False: (0.0, 0.0), True: (0.0, 0.0)}
    if s.parallelism.sequence_parallel:
        gather = collective_time("all_gather", tp, w.tp_bytes)
        # With async TP the forward's all-gather and reduce-scatter run under the GEMMs
        # (``program._Builder.async_tp_forward``): none is counted.
        async_tp = w.software is not None and w.software.async_tp
        per_block_fwd = 0.0 if async_tp else gather + collective_time("reduce_scatter", tp, w.tp_bytes)
        per_block_bwd = gather
    else:
        per_block_fwd, per_block_bwd = collective_time("all_reduce", tp, w.tp_bytes), 0.0
    out = {}
    mlp = _moe_mlp_tp(s, w, collective_time)
    for moe, blocks in ((False, 2), (True, 1)):  # attention and a dense MLP; MoE: attention, its MLP's own
        fwd = blocks * per_block_fwd + (mlp if moe else 0.0)
        bwd = blocks * per_block_bwd + (mlp if moe else 0.0) + (fwd if s.training.recompute == "full" else 0.0)
        out[moe] = (fwd, bwd)
    return out


def _moe_mlp_tp(s: Scenario, w: Workload, collective_time: CollectiveTime) -> float:
    """Seconds of the TP collectives around an MoE block, per pass (the forward's and the
    backward's are alike): ``program._Builder.mlp_forward`` and ``layer_backward`` wait at once on
    an all-gather before and a reduce-scatter after the block with sequence parallelism (async TP
    or not: the MoE MLP is not micro-pipelined), an all-reduce after it without; over the TP group,
    or with expert TP below tp over the etp group with etp / tp of the bytes, none at etp 1
    (``mlp_tp_collective``)."""
    par = s.parallelism
    if not s.model.is_moe or par.expert_tp < 2:
        return 0.0
    n, size = par.expert_tp, w.tp_bytes * par.expert_tp / par.tp
    if par.sequence_parallel:
        return collective_time("all_gather", n, size) + collective_time("reduce_scatter", n, size)
    return collective_time("all_reduce", n, size)


def split_backward(s: Scenario) -> bool:
    """Whether the scenario's schedule splits the backward (a W step takes the weight gradients)."""
    par = s.parallelism
    return any(st.split for st in schedule(s.pipeline_schedule, 0, par.pp, s.num_microbatches, par.vp))


def beside_s(g: float, a: float, held: int, num_sms: int | None) -> float:
    """Least seconds a block of ``g`` seconds, launched right after a collective of at least ``a``
    seconds alone whose kernel holds ``held`` of the GPU's ``num_sms`` SMs, adds from the launch to
    the end of the wait on it: ``max(a - g, a (1 - r))`` with ``r`` the share of the SMs the block
    keeps (``overlap_contention_s`` has the argument); ``max(a - g, 0)`` without ``num_sms``."""
    if a <= 0:
        return 0.0
    if not num_sms:
        return max(a - g, 0.0)
    r = max(num_sms - held, 1) / num_sms
    return max(a - g, a * (1 - r))


def _least_per_kind(s: Scenario, w: Workload, per_layer) -> dict[bool, float]:
    """{is MoE layer: the least ``per_layer(cost, is_moe)`` over the layers of that kind}, 0 for a
    kind with no layer. Layers of one kind share one LayerCost (``workload.build_workload``), so
    each distinct cost is evaluated once."""
    out = {False: 0.0, True: 0.0}
    for moe in (False, True):
        costs = {id(c): c for x, c in w.layer_costs.items() if s.model.is_moe_layer(x) == moe}
        if costs:
            out[moe] = min(per_layer(c, moe) for c in costs.values())
    return out


def overlap_contention_s(s: Scenario, w: Workload, collective_time: CollectiveTime | None,
                         num_sms: int | None) -> dict[bool, float]:
    """Least seconds per layer and micro-batch that the backward's overlapped TP collectives add to
    the GEMMs under them, {is MoE layer: seconds} (``program._Builder.column_parallel_backward``).

    With Megatron-LM's TP overlap the compute stream launches the reduce-scatter (all-reduce without
    sequence parallelism), runs the weight-gradient GEMM and then waits for the collective; with
    sequence parallelism it does the same with the input's re-gather around the input-gradient GEMM.
    The collective's kernel holds ``nccl.kernel_sms`` SMs from its launch until it ends, at least
    ``a`` later (its time alone on the idle node), and the engine runs the GEMM meanwhile at
    ``r = (SMs - held) / SMs`` of its rate (``engine.StepEngine.gpu_time``). For a GEMM of ``g``
    seconds, launch to end of wait then takes at least ``a`` if ``a r >= g`` (the GEMM ends under the
    collective), else ``g + a (1 - r)`` (``a r`` of its work done under it, the rest after): at least
    ``g + max(a - g, a (1 - r))``. A host stall before the GEMM or more SMs held only add. Zero for a
    layer without these GEMMs (MoE MLPs), for split backwards (their W step takes the weight-gradient
    GEMMs out of the overlap) and without ``num_sms``."""
    par, sw = s.parallelism, w.software
    tp = par.tp
    zero = {False: 0.0, True: 0.0}
    if collective_time is None or num_sms is None or tp < 2 or tp > s.cluster.gpus_per_node:
        return zero
    sp = par.sequence_parallel
    if sw is None or not (sw.tp_comm or (sp and sw.async_tp)):
        return zero
    if split_backward(s):
        return zero
    reduce = "reduce_scatter" if sp else "all_reduce"
    a_reduce = collective_time(reduce, tp, w.tp_bytes)
    a_gather = collective_time("all_gather", tp, w.tp_bytes) if sp else 0.0
    held = kernel_sms(reduce, "tp", s.moe.token_dispatcher)

    def block_s(block, gemm: str) -> float:
        _, dgrad, wgrad, _ = split_at_gemm(block, gemm)
        return beside_s(wgrad.time_s, a_reduce, held, num_sms) + beside_s(dgrad.time_s, a_gather, held, num_sms)

    return _least_per_kind(s, w, lambda c, moe: block_s(c.attn_bwd, "qkv_proj")
                           + (0.0 if moe else block_s(c.mlp_bwd, "mlp_up")))


def async_tp_forward_s(s: Scenario, w: Workload, collective_time: CollectiveTime | None,
                       num_sms: int | None) -> dict[bool, float]:
    """Least seconds per layer and forward pass that async TP's overlapped collectives add to the
    GEMMs under them, {is MoE layer: seconds} (``program._Builder.async_tp_forward``).

    The forward launches the input's all-gather, runs the block's first GEMM (QKV, the MLP's up
    projection) and waits for the gather; later it launches the output's reduce-scatter, runs the
    last GEMM (the output projection, the MLP's down projection) and waits for it: each GEMM beside
    its collective, as in ``overlap_contention_s`` (``beside_s``). The attention block of every
    layer and the dense MLP run so (an MoE MLP waits at once, which ``blocking_tp_s`` counts); zero
    without async TP and sequence parallelism, for TP groups wider than a node and without
    ``collective_time``. Full recompute runs the forward again in the
    backward: the caller adds it there."""
    par, sw = s.parallelism, w.software
    tp = par.tp
    zero = {False: 0.0, True: 0.0}
    if (collective_time is None or tp < 2 or tp > s.cluster.gpus_per_node or not par.sequence_parallel
            or sw is None or not sw.async_tp):
        return zero
    a_gather = collective_time("all_gather", tp, w.tp_bytes)
    a_scatter = collective_time("reduce_scatter", tp, w.tp_bytes)
    held_gather = kernel_sms("all_gather", "tp", s.moe.token_dispatcher)
    held_scatter = kernel_sms("reduce_scatter", "tp", s.moe.token_dispatcher)

    def block_s(block, first: str, last: str) -> float:
        _, head, rest = split_around(block, (first,))
        _, tail, _ = split_around(rest, (last,))
        return (beside_s(head.time_s, a_gather, held_gather, num_sms)
                + beside_s(tail.time_s, a_scatter, held_scatter, num_sms))

    return _least_per_kind(s, w, lambda c, moe: block_s(c.attn_fwd, "qkv_proj", "out_proj")
                           + (0.0 if moe else block_s(c.mlp_fwd, "mlp_up", "mlp_down")))


def cp_exchange_s(s: Scenario, w: Workload, collective_time: CollectiveTime | None,
                  num_sms: int | None) -> tuple[float, float]:
    """Least seconds per layer and micro-batch that the context-parallel exchange of K and V adds
    to the attention core it runs beside, (forward, backward) (``program._Builder.context_parallel_attention``).

    The program launches the exchange (an all-gather over the CP group of ``cp_bytes x cp``, twice
    that in the backward), runs the core (with ``cp_comm_type: all_gather`` only the local causal
    call; with ``overlap.cp_comm: false`` nothing) and waits for it: the core beside the exchange,
    as in ``overlap_contention_s`` (``beside_s``). Counted when every CP group lies inside one node
    (the rank grid puts a CP group on ``tp x cp`` consecutive ranks, every ``tp``-th), where ``a``
    is the exchange alone over such ranks of an idle node, as for the TP collectives; wider groups,
    whose time on the idle cluster would cost a simulation per group, are not counted. The forward
    under async TP waits for the exchange after the whole attention block, beside the TP
    collectives, and is not counted either; zero without context parallelism or ``collective_time``;
    ZeRO-3 with per-micro-batch gathers takes its own path (``fsdp_stage_compute``), without it."""
    par, sw = s.parallelism, w.software
    span, node = par.tp * par.cp, s.cluster.gpus_per_node
    if collective_time is None or par.cp < 2 or w.cp_bytes <= 0 or sw is None or span > node or node % span:
        return 0.0, 0.0
    held = kernel_sms("all_gather", "cp", s.moe.token_dispatcher)

    def core_s(block) -> float:
        if not sw.cp_comm:
            return 0.0
        _, core, _ = split_around(block, CP_CORE_OPS)
        if sw.cp_comm_type == "all_gather":
            _, core, _ = split_around(core, CP_LOCAL_OPS)
        return core.time_s

    costs = {id(c): c for c in w.layer_costs.values()}
    out = []
    for chunk, forward in ((w.cp_bytes, True), (2 * w.cp_bytes, False)):
        if forward and sw.async_tp and par.sequence_parallel and par.tp > 1:
            out.append(0.0)
            continue
        a = collective_time("all_gather", tuple(range(0, span, par.tp)), chunk * par.cp)
        out.append(min(beside_s(core_s(c.attn_fwd if forward else c.attn_bwd), a, held, num_sms)
                       for c in costs.values()))
    return out[0], out[1]


def _with_ends(w: Workload, vs: int, f: float, b: float) -> tuple[float, float]:
    """``f`` and ``b`` plus the embedding's seconds on the first virtual stage and the LM head's and
    loss's on the last, per micro-batch (forward, backward)."""
    if vs == 0:
        f, b = f + w.embedding[0].time_s, b + w.embedding[1].time_s
    if vs == len(w.vstages) - 1:
        f, b = f + w.head[0].time_s, b + w.head[1].time_s
    return f, b


def stage_compute(w: Workload, blocking: dict[bool, tuple[float, float]] | None = None
                  ) -> tuple[list[float], list[float]]:
    """(F(vs), B(vs)) for every virtual stage: one micro-batch's compute (and blocking TP) seconds."""
    nvs = len(w.vstages)
    moe_layer = w.scenario.model.is_moe_layer
    blocking = blocking or {False: (0.0, 0.0), True: (0.0, 0.0)}
    fwd, bwd = [], []
    for vs in range(nvs):
        f = sum(w.layer_costs[layer].fwd_time_s + blocking[moe_layer(layer)][0] for layer in w.layers(vs))
        b = sum(w.layer_costs[layer].bwd_time_s + blocking[moe_layer(layer)][1] for layer in w.layers(vs))
        f, b = _with_ends(w, vs, f, b)
        fwd.append(f)
        bwd.append(b)
    return fwd, bwd


def fsdp_chain(times: list[float], gathers: list[float], depth: int) -> float:
    """Least seconds from a step's loop start to the end of its last layer: layer ``j`` (in loop
    order, ``times[j]`` seconds) starts after layer ``j - 1`` ends and ``gathers[j]`` after the loop
    reached layer ``max(0, j - depth)`` (module docstring)."""
    end: list[float] = []
    for j, (f, g) in enumerate(zip(times, gathers)):
        i = max(0, j - depth)
        launched = end[i - 1] if i > 0 else 0.0
        start = max(end[j - 1] if j > 0 else 0.0, launched + g)
        end.append(start + f)
    return end[-1] if end else 0.0


def fsdp_stage_compute(s: Scenario, w: Workload, blocking: dict[bool, tuple[float, float]],
                       group_time: GroupTime) -> tuple[list[float], list[float]]:
    """(F(vs), B(vs)) under ZeRO-3: each virtual stage's layers as an ``fsdp_chain`` of their
    compute (and blocking TP) behind their parameter all-gathers."""
    par = s.parallelism
    plan = Plan.build(par.tp, par.pp, s.dp, par.cp, par.ep, par.expert_tp, par.dp_replicate)
    place = placement(s.pipeline_schedule, par.pp, par.vp)
    sw = w.software
    depth = sw.param_prefetch_depth if sw is not None and sw.param_gather else 0
    moe_layer = s.model.is_moe_layer
    nvs = len(w.vstages)
    fwd, bwd = [], []
    groups: dict[int, tuple] = {}  # stage -> its DP x CP group
    seconds: dict[tuple, float] = {}  # (stage, bytes) -> all-gather seconds (one look-up of the long group each)
    for vs in range(nvs):
        stage = place.locate(vs)[0]
        if stage not in groups:
            groups[stage] = plan.dp_cp_group(int(plan.grid[stage, 0, 0, 0]))
        group = groups[stage]
        layers = list(w.layers(vs))

        def gather(layer: int) -> float:
            size = w.layer_dense_params[layer] * PARAM_BYTES
            if len(group) < 2 or size <= 0:
                return 0.0
            if (stage, size) not in seconds:
                seconds[stage, size] = group_time("all_gather", group, size)[0]
            return seconds[stage, size]

        f_times = [w.layer_costs[x].fwd_time_s + blocking[moe_layer(x)][0] for x in layers]
        b_times = [w.layer_costs[x].bwd_time_s + blocking[moe_layer(x)][1] for x in reversed(layers)]
        f = fsdp_chain(f_times, [gather(x) for x in layers], depth)
        b = fsdp_chain(b_times, [gather(x) for x in reversed(layers)], depth)
        f, b = _with_ends(w, vs, f, b)
        fwd.append(f)
        bwd.append(b)
    return fwd, bwd


def fsdp_link_busy(s: Scenario, w: Workload, group_time: GroupTime) -> dict[int, float]:
    """Seconds the busiest link of each ZeRO-3 stage's DP x CP group is busy with that group's FSDP
    traffic alone, by pipeline stage (stages whose group is one rank are left out): per layer and
    micro-batch two parameter all-gathers and one gradient reduce-scatter (module docstring)."""
    par = s.parallelism
    plan = Plan.build(par.tp, par.pp, s.dp, par.cp, par.ep, par.expert_tp, par.dp_replicate)
    place = placement(s.pipeline_schedule, par.pp, par.vp)
    m = s.num_microbatches // place.copies  # micro-batches through each chunk
    out: dict[int, float] = {}
    for stage in range(par.pp):
        group = plan.dp_cp_group(int(plan.grid[stage, 0, 0, 0]))
        if len(group) < 2:
            continue
        params = [w.layer_dense_params[layer] for c in range(place.chunks) for layer in w.layers(place.vstage(stage, c))]
        busy = stage_fsdp_busy(group, params, m, group_time)
        if busy is not None:
            out[stage] = busy
    return out


def schedule_walk_bound(s: Scenario, w: Workload, fwd: list[float], bwd: list[float],
                        group_time: GroupTime) -> float:
    """Seconds the step cannot beat by the pipeline schedule's own dependencies and the
    data-parallel stream, with one model copy and an unsplit backward (else 0).

    Every rank runs its schedule's steps in order on its compute stream, each at least its compute
    (``fwd``/``bwd`` per virtual stage: ``F(vs)``, ``B(vs)``); a forward on virtual stage ``vs > 0``
    starts only after the same micro-batch's forward on ``vs - 1`` and the activations' transfer
    (``program._Builder``: Send after the step, Recv before the next), a backward on ``vs < last``
    after the backward on ``vs + 1`` and the gradients' transfer. A transfer takes at least one
    rank pair's send alone on the idle cluster (the engine's folded send moves every pair of the
    stage and the receiver waits for all). So the longest path through these steps, walked stage by
    stage, bounds when each step can start and end.

    Without ZeRO-3 (and with ``parallelism.dp_replicate`` 1) the stage's gradient buckets are
    reduced (all-reduce, ZeRO-1/2 reduce-scatter) and with ZeRO-1/2 its parameters all-gathered on a
    stream of their own, one collective after another in the order the program enqueues them
    (``engine.StepEngine.dp_stream``): every all-gather at the step's start, each bucket's reduction
    during the step that ends its chunk's last backward (``program._Builder.layer_grads_ready``),
    no earlier than that step's start in the walk; each takes at least its time alone on the idle
    cluster (the single machine with release dates, ``max_k (r_k + sum_{j >= k} p_j)``). The
    optimizer step waits for the stream and the compute: the stage's end bounds the step.

    Expert buckets over their own group are left out. It walks every step of every stage, so the
    planner adds it only to the layouts it would otherwise simulate (``planner._Bounds.refined``)."""
    par = s.parallelism
    place = placement(s.pipeline_schedule, par.pp, par.vp)
    if place.copies != 1:
        return 0.0
    p, nvs = par.pp, place.virtual_stages
    steps = [schedule_steps(s, stage) for stage in range(p)]
    if any(st.kind == "W" or getattr(st, "split", False) for stage in steps for st in stage):
        return 0.0
    plan = Plan.build(par.tp, par.pp, s.dp, par.cp, par.ep, par.expert_tp, par.dp_replicate)
    first = [int(plan.grid[stage, 0, 0, 0]) for stage in range(p)]

    def hop(a: int, b: int) -> float:  # one pair's transfer from stage a to stage b
        if a == b or w.pp_bytes <= 0:
            return 0.0
        return group_time("send_recv", (first[a], first[b]), w.pp_bytes)[0]

    stage_of = [place.locate(vs)[0] for vs in range(nvs)]
    hop_f = [0.0] + [hop(stage_of[vs - 1], stage_of[vs]) for vs in range(1, nvs)]  # into vs, forward
    hop_b = [hop(stage_of[vs + 1], stage_of[vs]) for vs in range(nvs - 1)] + [0.0]  # into vs, backward
    ends: dict[tuple, float] = {}
    clock, nxt = [0.0] * p, [0] * p
    starts: list[list[float]] = [[] for _ in range(p)]
    remaining = sum(len(x) for x in steps)
    while remaining:
        moved = False
        for stage in range(p):
            mine = steps[stage]
            while nxt[stage] < len(mine):
                st = mine[nxt[stage]]
                vs = place.vstage(stage, st.chunk)
                if st.kind == "F":
                    dep = ends.get(("F", st.microbatch, vs - 1)) if vs > 0 else 0.0
                    ready = None if dep is None else dep + hop_f[vs]
                else:
                    dep = ends.get(("B", st.microbatch, vs + 1)) if vs < nvs - 1 else 0.0
                    ready = None if dep is None else dep + hop_b[vs]
                if ready is None:
                    break
                start = max(clock[stage], ready)
                clock[stage] = start + (fwd[vs] if st.kind == "F" else bwd[vs])
                ends[st.kind, st.microbatch, vs] = clock[stage]
                starts[stage].append(start)
                nxt[stage] += 1
                remaining -= 1
                moved = True
        if not moved:
            return 0.0  # no schedule deadlocks; a walk that cannot move bounds nothing
    stream_on = par.zero_stage != 3 and par.dp_replicate == 1
    reduce = grad_reduce_op(par.zero_stage, *([w.software.grad_collective] if w.software is not None else []))
    best = 0.0
    for stage in range(p):
        end = clock[stage]
        group = plan.dp_cp_group(first[stage]) if stream_on else ()
        if len(group) > 1:
            held = [place.vstage(stage, c) for c in range(place.chunks)]
            stream = 0.0
            if par.zero_stage in (1, 2):
                stream = sum(group_time("all_gather", group, b.dense_params * PARAM_BYTES)[0]
                             for vs in held for b in w.buckets[vs] if b.dense_params > 0)
            last = {st.chunk: i for i, st in enumerate(steps[stage]) if st.kind == "B"}
            for i, st in enumerate(steps[stage]):
                if st.kind == "B" and last[st.chunk] == i:
                    for b in w.buckets[place.vstage(stage, st.chunk)]:
                        if b.dense_params > 0:
                            stream = max(stream, starts[stage][i]) + group_time(reduce, group,
                                                                                 b.dense_params * GRAD_BYTES)[0]
            end = max(end, stream)
        best = max(best, end + w.optimizer[stage].time_s)
    return best * (1 - ROUNDING_MARGIN)


def stage_fsdp_busy(group: tuple, params: list[float], m: int, group_time: GroupTime) -> float | None:
    """Seconds the busiest link of ``group`` carries one stage's FSDP bytes: for each of its layers
    (``params``, dense parameters per GPU, in the stage's order) and each of ``m`` micro-batches,
    two parameter all-gathers and one gradient reduce-scatter; None if no layer has parameters.
    With one parameter count for every layer (a dense model) this is ``m x layers`` times the
    busiest link of one layer's three collectives, which is memoised per group and size."""
    layers: dict[float, int] = {}  # parameters per rank -> layers of the stage with that many
    for x in params:
        if x > 0:
            layers[x] = layers.get(x, 0) + 1
    if len(layers) == 1:
        (x, n), = layers.items()
        peak = _layer_fsdp_peak(group_time, group, x)
        return None if peak is None else m * n * peak
    busy = 0.0
    for x, n in layers.items():
        busy = busy + n * _layer_fsdp_load(group_time, group, x)
    return None if isinstance(busy, float) else m * float(busy.max())


def _layer_fsdp_load(group_time: GroupTime, group: tuple, params: float):
    """Seconds each link is busy with one layer's FSDP collectives for one micro-batch (two
    parameter all-gathers, one gradient reduce-scatter) over ``group``."""
    return 2 * group_time("all_gather", group, params * PARAM_BYTES)[1] + \
        group_time("reduce_scatter", group, params * GRAD_BYTES)[1]


# group_time -> {(group, parameters): the busiest link's seconds}, living as long as its group_time
_PEAKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _layer_fsdp_peak(group_time: GroupTime, group: tuple, params: float) -> float | None:
    peaks = _PEAKS.setdefault(group_time, {})
    if (group, params) not in peaks:
        load = _layer_fsdp_load(group_time, group, params)
        peaks[group, params] = None if isinstance(load, float) else float(load.max())
    return peaks[group, params]


def fsdp_link_bound(w: Workload, busy: dict[int, float]) -> float:
    """Seconds no ZeRO-3 stage can beat for its FSDP traffic alone: over its DP x CP group, the
    busiest link's total busy time (``fsdp_link_busy``), plus the stage's optimizer step (module
    docstring)."""
    return max((b + w.optimizer[stage].time_s for stage, b in busy.items()), default=0.0)


def fsdp_contention_bound(s: Scenario, w: Workload, busy: dict[int, float], num_sms: int,
                          blocking: dict[bool, tuple[float, float]] | None = None,
                          heads: dict[int, float] | None = None) -> float:
    """Seconds no ZeRO-3 stage can beat for its compute slowed by the SMs its FSDP collectives hold
    (module docstring): its compute work ``C`` (every forward and backward of its chunks, and its
    optimizer step, on the whole GPU) plus ``k / SMs`` of ``busy``, the seconds the busiest link of
    its DP x CP group carries that group's FSDP bytes (``fsdp_link_busy``), plus ``(SMs - k) / SMs``
    of what it cannot compute in: the TP collectives its compute stream waits on (``blocking``) and
    the pipeline's fill before its first forward (``heads``, by stage; module docstring)."""
    par = s.parallelism
    place = placement(s.pipeline_schedule, par.pp, par.vp)
    per_chunk = s.num_microbatches // place.copies
    held = min(least_kernel_sms(op, "fsdp", s.moe.token_dispatcher, w.software.nccl_ub)
               for op in ("all_gather", "reduce_scatter"))
    loss = min(held, num_sms - 1) / num_sms  # 1 - the rate compute keeps beside one kernel
    fwd, bwd = stage_compute(w)
    moe_layer = s.model.is_moe_layer
    blocking = blocking or {False: (0.0, 0.0), True: (0.0, 0.0)}
    best = 0.0
    for stage, b in busy.items():
        held = [place.vstage(stage, c) for c in range(place.chunks)]
        work = per_chunk * sum(fwd[vs] + bwd[vs] for vs in held)
        waits = per_chunk * sum(sum(blocking[moe_layer(x)]) for vs in held for x in w.layers(vs))
        idle = waits + (heads or {}).get(stage, 0.0)
        best = max(best, work + w.optimizer[stage].time_s + loss * b + (1 - loss) * idle)
    return best


def weight_grad_s(w: Workload) -> list[float]:
    """Seconds of each virtual stage's weight-gradient GEMMs per micro-batch: what a split backward
    leaves to its W step (``compute.split_weight_grad``)."""
    return [sum(split_weight_grad(w.layer_costs[x].attn_bwd)[1].time_s
                + split_weight_grad(w.layer_costs[x].mlp_bwd)[1].time_s for x in w.layers(vs))
            for vs in range(len(w.vstages))]


def step_compute(s: Scenario, w: Workload, blocking: dict[bool, tuple[float, float]],
                 collective_time: CollectiveTime | None, group_time: GroupTime | None,
                 num_sms: int | None) -> tuple[list[float], list[float]]:
    """(F(vs), B(vs)) as the bound uses them: with per-micro-batch ZeRO-3 gathers each step's
    ``fsdp_chain``, otherwise compute and blocking TP (``stage_compute``) with the backward's
    ``overlap_contention_s``. (ZeRO-3 gathered once per step under a pipeline, torch pipelining's
    ``Software.fsdp_pipeline_unsharded``, has no per-micro-batch gathers to charge.)"""
    if group_time is not None and s.parallelism.zero_stage == 3 and not fsdp_gathered_once(s, w.software):
        return fsdp_stage_compute(s, w, blocking, group_time)
    fwd, bwd = stage_compute(w, blocking)
    moe_layer = s.model.is_moe_layer
    cp_f, cp_b = cp_exchange_s(s, w, collective_time, num_sms)
    if cp_f or cp_b:
        fwd = [f + cp_f * len(w.layers(vs)) for vs, f in enumerate(fwd)]
        bwd = [b + (cp_b + (cp_f if s.training.recompute == "full" else 0.0)) * len(w.layers(vs))
               for vs, b in enumerate(bwd)]
    extra = overlap_contention_s(s, w, collective_time, num_sms)
    forward = async_tp_forward_s(s, w, collective_time, num_sms)
    if forward[False] or forward[True]:
        fwd = [f + sum(forward[moe_layer(x)] for x in w.layers(vs)) for vs, f in enumerate(fwd)]
        if s.training.recompute == "full":
            extra = {moe: extra[moe] + forward[moe] for moe in extra}
    if extra[False] or extra[True]:
        bwd = [b + sum(extra[moe_layer(x)] for x in w.layers(vs)) for vs, b in enumerate(bwd)]
    return fwd, bwd


def step_lower_bound(s: Scenario, w: Workload, collective_time: CollectiveTime | None = None,
                     group_time: GroupTime | None = None, num_sms: int | None = None) -> float:
    """Seconds the simulated step of ``s`` (default ``SimOptions``) cannot beat (module docstring);
    without ``collective_time`` compute only, without ``group_time`` no FSDP all-gathers, with the
    GPU's ``num_sms`` the contention the backward's overlapped TP collectives must cost
    (``overlap_contention_s``)."""
    par = s.parallelism
    p, m = par.pp, s.num_microbatches
    place = placement(s.pipeline_schedule, p, par.vp)
    blocking = blocking_tp_s(s, w, collective_time)
    per_microbatch_fsdp = par.zero_stage == 3 and not fsdp_gathered_once(s, w.software)
    fwd, bwd = step_compute(s, w, blocking, collective_time, group_time, num_sms)
    drain = bwd  # the part of B(j) a later B must wait for
    if split_backward(s):
        drain = [max(0.0, b - wgrad) for b, wgrad in zip(bwd, weight_grad_s(w))]
    opt = [w.optimizer[stage].time_s for stage in range(p)]
    per_chunk = m // place.copies  # micro-batches through each chunk
    best = 0.0
    heads: dict[int, float] = {}
    for stage in range(p):
        held = [(c if place.copies > 1 else 0, place.vstage(stage, c)) for c in range(place.chunks)]
        lowest: dict[int, int] = {}  # model copy -> the lowest virtual stage this rank holds of it
        for copy, vs in held:
            lowest[copy] = min(vs, lowest.get(copy, vs))
        head = heads[stage] = min(sum(fwd[:vs]) for vs in lowest.values())
        # every F and (input-gradient) B of the rank, then the backwards below its last one and
        # the optimizer of the rank holding the copy's first stage; or all its work and its own
        # optimizer step
        before_last_b = per_chunk * sum(fwd[vs] + drain[vs] for _, vs in held)
        drained = min(sum(drain[:vs]) + opt[place.locate(0, copy)[0]] for copy, vs in lowest.items())
        work = per_chunk * sum(fwd[vs] + bwd[vs] for _, vs in held)
        best = max(best, head + max(work + opt[stage], before_last_b + drained))
    if group_time is not None and per_microbatch_fsdp:
        busy = fsdp_link_busy(s, w, group_time)
        best = max(best, fsdp_link_bound(w, busy))
        if num_sms:
            best = max(best, fsdp_contention_bound(s, w, busy, num_sms, blocking, heads))
    return best * (1 - ROUNDING_MARGIN)


# --- a bound during the simulation ------------------------------------------------------------

# The kinds of ``ProgressBound``'s compact program entries.
COMPUTE, RECV, SEND, LAUNCH, WAIT, ENQUEUE, JOIN = range(7)


class ProgressBound:
    """A lower bound on the step of a simulation in progress, from where each rank's program is.

    At a moment ``now`` between two events of the engine, each rank is at an op of its program
    (``program.build_program``): a compute block started at ``t0`` (it ends no earlier than
    ``t0`` plus its block's time, and not before ``now``: ``engine.gpu_time`` only slows a block
    and the host only delays it), or waiting on a transfer, a collective or its data-parallel
    stream (it ends no earlier than ``now``). From there every rank's remaining program is walked:

    - a compute block takes its own time, or longer while a collective the rank launched before
      it (in the walk) may still run: that collective holds ``k`` of the GPU's ``S`` SMs for at
      least its time alone (``engine.hold``), so a block of ``G`` seconds starting ``w`` seconds
      before the collective's least end takes at least ``min(G S / (S - k), G + w k / S)``
      (all of it beside the kernel, or the kernel's remainder at the reduced rate). In the
      simulation the launch and the block start no earlier and the collective lasts no shorter,
      which only lengthens the block (the expression grows with a later start faster than the
      overlap shrinks), so this stays below the block's simulated end;
    - a collective the rank launches ends no earlier than its launch plus the time of the rank's
      own group's collective alone on the idle cluster (``least``: under max-min fair sharing no
      flow beats its bottleneck link alone, and the folded engine's other groups only add load),
      and a wait on it no earlier than that;
    - a pipeline receive ends no earlier than its send was posted in the engine, or than the
      walk's send plus that pair's transfer alone (``least_pp``: the route's latency and the bytes
      at its slowest link's rate);
    - the data-parallel stream runs its collectives one after another, each no earlier than it
      was enqueued (those queued in the engine no earlier than ``now``), each at least its time
      alone, and joining the stream waits for its last.

    Every op of the walk ends no later than the same op of the simulation (by induction along
    the programs, the sends and the stream), so the largest end of the walk is at most the step.
    The engine asks for it at a few moments when a caller (the planner) only needs to know
    whether the step exceeds a cutoff (``simulate_below``), and stops there when it does.
    """

    def __init__(self, programs: dict, ranks: list[int], stage_of, pp_peer, least, least_pp, sms_of,
                 num_sms: int):
        self.programs, self.ranks, self.stage_of, self.pp_peer = programs, ranks, stage_of, pp_peer
        self.least, self.least_pp, self.num_sms = least, least_pp, num_sms
        self.sms_of = sms_of  # (op, axis) -> SMs its kernel holds (0 without contention)
        self.compact: dict = {}  # stage -> (entries, entry of each op, compute after each op in its run)
        self.peer: dict = {}

    def _compact(self, program: list) -> tuple[list, list, list]:
        """The program as (code, ...) entries, consecutive compute blocks as one (the bound of a
        run of blocks beside a collective is that of one block of their summed time: both
        expressions add up), the ops that neither take time nor order ranks left out; per op,
        the entry holding it (or the next one) and, for a block, the time of the blocks after it
        in its run."""
        entries: list = []
        entry_of = [0] * len(program)
        after = [0.0] * len(program)
        run: list[int] = []  # op indices of the current run of blocks

        def close():
            total = 0.0
            for j in reversed(run):
                after[j] = total
                total += program[j].block.time_s
            entries.append((COMPUTE, total))
            run.clear()

        for i, op in enumerate(program):
            kind = type(op)
            if kind is P.Compute:
                run.append(i)
                entry_of[i] = len(entries)
                continue
            if run:
                close()
            entry_of[i] = len(entries)
            if kind is P.Recv:
                entries.append((RECV, (op.vstage, op.microbatch, op.kind)))
            elif kind is P.Send:
                entries.append((SEND, op.dst_stage, (op.vstage, op.microbatch, op.kind)))
            elif kind is P.Launch:
                entries.append((LAUNCH, op.handle, op.group, op.op, op.nbytes, self.sms_of(op.op, op.axis), op.calls))
            elif kind is P.Wait:
                entries.append((WAIT, op.handles))
            elif kind is P.Enqueue:
                entries.append((ENQUEUE, op.handle, op.group, op.op, op.nbytes, op.calls))
            elif kind is P.JoinStream:
                entries.append((JOIN,))
        if run:
            close()
        return entries, entry_of, after

    def __call__(self, now: float, at: dict, posted: dict, ended: dict, streams: dict) -> float:
        """``at``: rank -> (index of the op it is at, time it began); ``posted``: mailbox key ->
        time the engine posted that send; ``ended``: rank -> end of its finished program;
        ``streams``: rank -> (whether its data-parallel stream is running a collective, the
        (group, op, bytes, calls) queued behind it)."""
        least, least_pp, S = self.least, self.least_pp, self.num_sms
        best = max(ended.values(), default=0.0)
        # (receiving rank, vstage, micro-batch, kind) -> least arrival: the sends the engine posted
        # arrive no earlier than posted (the transfer may be under way), the walk's add their time
        arrive = dict(posted)
        state = []  # [rank, entries, entry index, clock, end by handle, stream free, running: handle -> (end, SMs)]
        for r in self.ranks:
            if r in ended:
                continue
            stage = self.stage_of(r)
            if stage not in self.compact:
                self.compact[stage] = self._compact(self.programs[stage])
            ops, entry_of, after = self.compact[stage]
            program = self.programs[stage]
            clock, k = now, 0
            if r in at:
                i, t0 = at[r]
                op = program[i]
                k = entry_of[i]
                if type(op) is P.Compute:  # under way: ends no earlier than its time after it began
                    clock = max(now, t0 + op.block.time_s) + after[i]
                    k += 1
                elif type(op) is not P.Recv:
                    k += 1  # a wait in progress ends no earlier than now
            busy, queued = streams.get(r, (False, ()))
            free = now if busy or queued else 0.0
            for group, op_name, size, calls in queued:
                free += least(r, group, op_name, size, calls)
            state.append([r, ops, k, clock, {}, free, {}])
        while state:
            blocked = []
            moved = False
            for st in state:
                r, ops, i, clock, ends, free, running = st
                n = len(ops)
                while i < n:
                    op = ops[i]
                    code = op[0]
                    if code == COMPUTE:
                        g = op[1]
                        took = g
                        if running:
                            for h, (end, k) in list(running.items()):
                                w = end - clock
                                if w > 0:
                                    took = max(took, min(g * S / max(S - k, 1), g + w * k / S))
                                else:  # over by now in the walk: no block after it overlaps it
                                    del running[h]
                        clock += took
                    elif code == RECV:
                        t = arrive.get((r,) + op[1])
                        if t is None:
                            break
                        if t > clock:
                            clock = t
                    elif code == SEND:
                        peers = self.peer.setdefault(r, {})
                        if op[1] not in peers:
                            peers[op[1]] = self.pp_peer(r, op[1])
                        dst = peers[op[1]]
                        arrive[(dst,) + op[2]] = clock + least_pp(r, dst)
                    elif code == LAUNCH:
                        end = clock + least(r, op[2], op[3], op[4], op[6])
                        ends[op[1]] = end
                        if op[5] and end > clock:
                            running[op[1]] = (end, op[5])
                    elif code == WAIT:
                        for h in op[1]:
                            t = ends.get(h)
                            if t is not None and t > clock:
                                clock = t
                            running.pop(h, None)
                    elif code == ENQUEUE:
                        free = max(free, clock) + least(r, op[2], op[3], op[4], op[5])
                        ends[op[1]] = free
                    else:  # JOIN
                        if free > clock:
                            clock = free
                    i += 1
                moved = moved or i != st[2]
                st[2], st[3], st[5] = i, clock, free
                if i < n:
                    blocked.append(st)
                else:
                    best = max(best, clock)
            if blocked and not moved:
                break  # cannot happen for a program the engine completes; stay a bound
            state = blocked
        return best * (1 - ROUNDING_MARGIN)


# Moments, as fractions of the cutoff, at which a simulation that may stop asks ``ProgressBound``
# whether its step already provably exceeds it (each ask walks every rank's remaining program
# once: a few tens of ms on a 16K-GPU step).
STOP_CHECKS = (0.0, 0.15, 0.3, 0.5, 0.65, 0.75, 0.82, 0.88, 0.93, 0.97, 1.0)
SKIP_AHEAD = True  # skip the moments before the walk could reach the cutoff (``simulate_below``)


class StepAbove(Exception):
    """A simulation stopped by ``simulate_below``: its step is at least ``bound_s``, more than
    ``cutoff_s``; ``at_s`` is the simulated moment it stopped at, ``events`` those run so far."""

    def __init__(self, bound_s: float, cutoff_s: float, at_s: float, events: int):
        super().__init__(f"step >= {bound_s:.6g} s > {cutoff_s:.6g} s (stopped at {at_s:.6g} s)")
        self.bound_s, self.cutoff_s, self.at_s, self.events = bound_s, cutoff_s, at_s, events


def simulate_below(s: Scenario, options: SimOptions = SimOptions(), cluster: Cluster | None = None, *,
                   cutoff_s: float) -> SimResult:
    """Simulate ``s``, or raise ``StepAbove`` as soon as its step provably exceeds ``cutoff_s``
    (what the planner needs of a layout that can only enter its result below it). The result of a
    run that finishes is the one ``simulate`` gives. With variability a block may run shorter than
    its cost, so the walk would not be a bound: such a run goes to the end whatever the cutoff."""
    engine = StepEngine(step_inputs(s, options, cluster))
    ranks = engine.start()
    if engine.varies:
        return engine.finish()
    return engine.finish(_run_checked(engine, ranks, cutoff_s))


def _run_checked(engine: StepEngine, ranks: list[int], cutoff: float) -> int:
    """Run until the last of ``STOP_CHECKS``, asking ``ProgressBound`` at each whether the step
    already exceeds ``cutoff`` (then raise ``StepAbove``); the events run."""
    opt, plan, cluster, work = engine.opt, engine.plan, engine.cluster, engine.work
    times: dict = {}  # (rank, group, op, bytes, calls) -> seconds of that collective alone
    pp_times: dict = {}  # (source, destination) -> seconds of a pipeline transfer alone
    alone_on_cluster = cluster_cache(cluster).setdefault("alone", {})  # shared by a plan's layouts

    def least(rank: int, group: str, op: str, size: float, calls: float = 1.0) -> float:
        if not opt.communication:
            return 0.0
        key = (rank, group, op, size, calls)
        hit = times.get(key)
        if hit is None:
            members = plan.group_of(rank, group)
            alone = (op, size, members, opt.algorithm, calls)
            if alone not in alone_on_cluster:
                alone_on_cluster[alone] = (time_collective(cluster, op, members, size, opt.algorithm, calls)[0]
                                           if size > 0 and len(members) > 1 else 0.0)
            hit = times[key] = alone_on_cluster[alone]
        return hit

    def least_pp(src: int, dst: int) -> float:
        """A pipeline transfer alone: its route's latency and bytes at its slowest link."""
        if not opt.communication or src == dst or work.pp_bytes <= 0:
            return 0.0
        key = (src, dst)
        if key not in pp_times:
            links = cluster.route_links([src], [dst])
            pp_times[key] = cluster.route_latency(src, dst) + work.pp_bytes / float(cluster.link_bw[links].min())
        return pp_times[key]

    registered = work.software.nccl_ub

    def sms_of(op: str, axis: str) -> int:
        return least_kernel_sms(op, axis, engine.s.moe.token_dispatcher, registered) if opt.contention else 0

    walk = ProgressBound(engine.programs, ranks, plan.stage_of, plan.pp_peer, least, least_pp, sms_of,
                         engine.gpu.num_sms)
    events = 0
    ready = 0.0  # the next moment worth a walk
    for check in (cutoff * f for f in STOP_CHECKS):
        if SKIP_AHEAD and check < ready and check < cutoff:
            continue
        events += engine.run_until(check)
        if engine.finished:
            return events
        snap = engine.snapshot()
        bound = walk(check, snap.at, snap.posted, snap.ended, snap.streams)
        if bound > cutoff:
            raise StepAbove(bound, cutoff, check, events)
        # The walk rarely gains more than the time simulated since the last one (each rank's
        # clock starts at the moment asked), so skip the moments before it could reach the
        # cutoff: that only saves walks, never changes when a run that finishes finishes.
        ready = check + (cutoff - bound)
    after = engine.next_event_s()
    if after == float("inf"):
        return events  # nothing left to run with ranks unfinished: finish() reports the deadlock
    # past the cutoff with a rank still running: the step ends at an event after it
    raise StepAbove(after, cutoff, cutoff, events)
