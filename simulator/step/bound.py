"""A lower bound on the simulated step time: compute only, no communication, a pipeline fill and drain.

The engine (``engine.StepEngine.rank_process``) runs each rank as one simpy process that does
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
3. Its last step is a backward on some ``vs >= s``; the same micro-batch's backward must then
   run on ``vs-1 .. 0`` in turn, which include ``s-1 .. 0``, and stage 0 ends with ``O_0`` after
   that: the step is at least ``sum_{j<s} F(j) + W_s + sum_{j<s} B(j) + O_0``.

The same holds with ``F`` and ``B`` counting, besides compute, the TP collectives the compute
stream waits on as soon as it starts them (``engine.StepEngine.collective``: launch, then wait),
which nothing overlaps. Per layer and micro-batch (``blocking_tp_s``): forward, the all-reduce after
attention and after a dense MLP, or with sequence parallelism the all-gather before and the
reduce-scatter after each; backward, with sequence parallelism, the all-gathers before the dense
MLP's and the attention's backward; full recompute repeats the forward's. (MoE layers' expert
collectives, the overlapped backward TP collectives and all CP, EP, PP and DP traffic are left
out.) Each takes at least its time alone on an idle node (``collectives.time_collective``): under
max-min fair sharing a flow never runs faster than its bottleneck link alone lets it, and a ring
waits for its slowest edge. TP groups wider than a node are not counted.

Hence ``step >= max_s [sum_{j<s} F(j) + W_s + max(O_s, sum_{j<s} B(j) + O_0)]`` for every
schedule (each one's last step on every stage is a backward). For uniform stages without
communication this is the PipeDream-Flush closed form (m + p - 1)(f + b) (Narayanan et al. 2021);
with ``pp = 1`` it is the single stage's compute, which the engine reproduces exactly when
communication is switched off (``tests/test_planner.py``). The bound uses the very ``BlockCost``
values the engine times (``workload.build_workload``), summed in another order, so it is scaled by
``1 - 1e-9`` to stay below the simulated step whatever the float rounding.
"""

from __future__ import annotations

from collections.abc import Callable

from simulator.config import Scenario
from simulator.workload.workload import Workload

ROUNDING_MARGIN = 1e-9

CollectiveTime = Callable[[str, int, float], float]  # (op, ranks, bytes) -> seconds alone on one node


def blocking_tp_s(s: Scenario, w: Workload, collective_time: CollectiveTime | None
                  ) -> dict[bool, tuple[float, float]]:
    """Seconds per layer and micro-batch of TP collectives the compute stream waits on at once,
    {is MoE layer: (forward, backward)}; the backward includes full recompute's forward ones."""
    tp = s.parallelism.tp
    if collective_time is None or tp < 2 or tp > s.cluster.gpus_per_node:
        return {False: (0.0, 0.0), True: (0.0, 0.0)}
    if s.parallelism.sequence_parallel:
        gather = collective_time("all_gather", tp, w.tp_bytes)
        per_block_fwd = gather + collective_time("reduce_scatter", tp, w.tp_bytes)
        per_block_bwd = gather
    else:
        per_block_fwd, per_block_bwd = collective_time("all_reduce", tp, w.tp_bytes), 0.0
    out = {}
    for moe, blocks in ((False, 2), (True, 1)):  # attention and a dense MLP; MoE: attention only
        fwd = blocks * per_block_fwd
        bwd = blocks * per_block_bwd + (fwd if s.training.recompute == "full" else 0.0)
        out[moe] = (fwd, bwd)
    return out


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
        if vs == 0:
            f += w.embedding[0].time_s
            b += w.embedding[1].time_s
        if vs == nvs - 1:
            f += w.head[0].time_s
            b += w.head[1].time_s
        fwd.append(f)
        bwd.append(b)
    return fwd, bwd


def step_lower_bound(s: Scenario, w: Workload, collective_time: CollectiveTime | None = None) -> float:
    """Seconds the simulated step of ``s`` (default ``SimOptions``) cannot beat (module docstring);
    without ``collective_time`` compute only."""
    p, v = s.parallelism.pp, s.parallelism.vp
    m = s.num_microbatches
    fwd, bwd = stage_compute(w, blocking_tp_s(s, w, collective_time))
    opt = [w.optimizer[stage].time_s for stage in range(p)]
    best = 0.0
    head = tail = 0.0
    for stage in range(p):
        work = m * sum(fwd[c * p + stage] + bwd[c * p + stage] for c in range(v))
        after = opt[stage] if stage == 0 else max(opt[stage], tail + opt[0])
        best = max(best, head + work + after)
        head += fwd[stage]
        tail += bwd[stage]
    return best * (1 - ROUNDING_MARGIN)
