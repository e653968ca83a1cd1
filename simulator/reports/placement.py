"""Where each parallel axis's groups sit: the link classes their traffic crosses.

Read from the rank grid (``Plan``, Megatron order: TP fastest, then CP, DP, PP; expert groups
folded out of a stage's ranks) and the cluster's deterministic routes (``Cluster.route``,
with NCCL's PXN on rail-optimized fabrics), not from a simulation. Ring collectives (TP, CP,
DP, ZeRO, expert DP) use the route from each member to the next one in rank order; EP's
all-to-all every ordered pair; PP the route from a stage's rank to the same position on the
next stage. Groups of the first pipeline stage stand for all stages (stages are translates of
each other on node-aligned layouts).
"""

from __future__ import annotations

from simulator.scenario.config import Scenario
from simulator.network.cluster import Cluster
from simulator.parts.topology import LINK_CLASSES
from simulator.layout.grid import Plan

AXES = ("tp", "cp", "dp", "zero", "ep", "edp", "pp")


def _pairs(group: tuple[int, ...], all_pairs: bool) -> list[tuple[int, int]]:
    n = len(group)
    if n < 2:
        return []
    if all_pairs:
        return [(a, b) for a in group for b in group if a != b]
    return [(group[i], group[(i + 1) % n]) for i in range(n)]


def _classes(cluster: Cluster, pairs) -> list[str]:
    seen = set()
    for a, b in pairs:
        seen.update(cluster.link_cls[i] for i in cluster.route(a, b))
    return [c for c in LINK_CLASSES if c in seen] + sorted(seen - set(LINK_CLASSES))


def _row(cluster: Cluster, degree: int, groups, all_pairs: bool = False) -> dict:
    pairs = [p for g in groups for p in _pairs(tuple(g), all_pairs)]
    classes = _classes(cluster, pairs)
    nodes = max((len({cluster.node_of(r) for r in g}) for g in groups), default=1)
    return {
        "degree": degree,
        "groups": len(groups),
        "nodes_per_group": nodes,
        "link_classes": classes,
        "crosses": classes[-1] if classes else None,
        "intra_node": nodes <= 1,
    }


def placement(s: Scenario, plan: Plan, cluster: Cluster) -> dict:
    """Per axis: degree, groups on one stage, nodes a group spans, link classes crossed, the outermost."""
    p = s.parallelism
    out = {
        "tp": _row(cluster, p.tp, plan.groups_on_stage(0, "tp")),
        "cp": _row(cluster, p.cp, plan.groups_on_stage(0, "cp")),
        "dp": _row(cluster, plan.dp, plan.groups_on_stage(0, "dp")),
        "zero": _row(cluster, p.shard_group(plan.dp) if p.zero_stage else 1,
                     plan.groups_on_stage(0, "dpcp") if p.zero_stage else ()),
    }
    if p.dp_replicate > 1:
        out["dp_replicate"] = _row(cluster, p.dp_replicate, plan.groups_on_stage(0, "dprep"))
    if s.model.is_moe:
        out["ep"] = _row(cluster, p.ep, plan.groups_on_stage(0, "ep"), all_pairs=True)
        out["edp"] = _row(cluster, s.expert_dp, plan.groups_on_stage(0, "edp"))
    else:
        out["ep"] = _row(cluster, 1, ())
        out["edp"] = _row(cluster, 1, ())
    stage_pairs = [((int(r),), plan.pp_peer(int(r), st + 1)) for st in range(plan.pp - 1)
                   for r in plan.stage_ranks(st)]
    pp = _row(cluster, p.pp, ())
    if stage_pairs:
        classes = _classes(cluster, [(a[0], b) for a, b in stage_pairs])
        pp.update(groups=len(plan.stage_ranks(0)), link_classes=classes, crosses=classes[-1],
                  nodes_per_group=len({cluster.node_of(x) for st in range(plan.pp)
                                       for x in [int(plan.stage_ranks(st)[0])]}),
                  intra_node=all(cluster.node_of(a[0]) == cluster.node_of(b) for a, b in stage_pairs))
    out["pp"] = pp
    return out
