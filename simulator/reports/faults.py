"""What a scenario's faults touch: straggling ranks, degraded and failed links, and the collective
groups whose routes cross them. A pure function of the scenario, the plan and the (faulted)
cluster, read from the rank grid and ``Cluster.route`` as ``placement`` does, not from a run.

A group crosses a degraded link when the route of one of its transfers uses a link whose
bandwidth a fault multiplied by a fraction in (0, 1). A group is rerouted when the default
route of one of its transfers (``topology.path_nodes``) crossed a failed link, so it now takes a
detour (``topology.detour_nodes``). Transfers are as in ``placement``: ring neighbours in rank
order for TP, CP, DP, expert DP and the ZeRO shards (DP x CP), every ordered pair for EP, and
both directions between a rank and its peer on the next stage for PP; every pipeline stage is
counted (a fault sits on particular nodes, so stages differ).
"""

from __future__ import annotations

import numpy as np

from simulator.scenario.config import Scenario
from simulator.network.faults import fault_links
from simulator.network.cluster import Cluster, path_nodes
from simulator.layout.grid import Plan
from simulator.engine.variability import rank_slowdowns

EXAMPLES = 4  # groups listed by their ranks per axis; the rest are counted


def _ring(group: tuple[int, ...]) -> list[tuple[int, int]]:
    n = len(group)
    return [(group[i], group[(i + 1) % n]) for i in range(n)] if n > 1 else []


def _all_pairs(group: tuple[int, ...]) -> list[tuple[int, int]]:
    return [(a, b) for a in group for b in group if a != b]


def _groups(s: Scenario, plan: Plan) -> dict[str, list[tuple[tuple[int, ...], list[tuple[int, int]]]]]:
    """Per axis with degree > 1: each group (its ranks) with the transfers it makes."""
    out: dict[str, list] = {}
    kinds = {"tp": ("tp", _ring), "cp": ("cp", _ring), "dp": ("dp", _ring)}
    if s.parallelism.zero_stage:
        kinds["zero"] = ("dpcp", _ring)
    if s.parallelism.dp_replicate > 1:
        kinds["dp_replicate"] = ("dprep", _ring)
    if s.model.is_moe:
        kinds |= {"ep": ("ep", _all_pairs), "edp": ("edp", _ring)}
    for axis, (kind, pairs) in kinds.items():
        groups = [g for st in range(plan.pp) for g in plan.groups_on_stage(st, kind) if len(g) > 1]
        if groups:
            out[axis] = [(g, pairs(g)) for g in groups]
    if plan.pp > 1:
        out["pp"] = [((int(r), plan.pp_peer(int(r), st + 1)),
                      [(int(r), plan.pp_peer(int(r), st + 1)), (plan.pp_peer(int(r), st + 1), int(r))])
                     for st in range(plan.pp - 1) for r in plan.stage_ranks(st)]
    return out


def fault_report(s: Scenario, plan: Plan, cluster: Cluster, simulated: int | None = None) -> dict:
    """Stragglers, link faults (each with the links it touched) and, per axis, the groups crossing
    a degraded link or rerouted around a failed one (counts and the first few groups' ranks)."""
    f = s.faults
    slow = rank_slowdowns(s)
    links = []
    degraded = np.zeros(cluster.num_links, dtype=bool)
    for i, fault in enumerate(f.links):
        touched = fault_links(cluster.spec, cluster.num_nodes, fault)
        if 0 < fault.bandwidth_fraction < 1:
            for a, b in touched:
                degraded[[cluster._edge_id[(a, b)], cluster._edge_id[(b, a)]]] = True
        state = "failed" if fault.bandwidth_fraction == 0 else "healthy" if fault.bandwidth_fraction == 1 else "degraded"
        links.append({"fault": f"faults.links[{i}]", "node": fault.node, "link_class": fault.link_class,
                      "index": fault.index, "bandwidth_fraction": fault.bandwidth_fraction, "state": state,
                      "links": [f"{a}<->{b}" for a, b in touched]})
    down = cluster.down
    replicas = len({plan.coords(r)[1:3] for r in slow})
    groups = {}
    for axis, entries in _groups(s, plan).items():
        crossing, rerouted = [], []
        for ranks, pairs in entries:
            if any(degraded[cluster.route(a, b)].any() for a, b in pairs):
                crossing.append(list(ranks))
            if down and any(_crosses_down(cluster, a, b) for a, b in pairs):
                rerouted.append(list(ranks))
        groups[axis] = {"groups": len(entries), "crossing_degraded": len(crossing),
                        "rerouted": len(rerouted), "examples_crossing": crossing[:EXAMPLES],
                        "examples_rerouted": rerouted[:EXAMPLES]}
    return {
        "stragglers": [{"rank": r, "node": cluster.node_of(r), "compute_slowdown": x} for r, x in slow.items()],
        # data-parallel replicas (dp, cp coordinates) holding a straggler. A folded run simulates
        # one rank per lane of ranks that stay alike (``layout.lanes``), exact; with jitter or a
        # GPU speed spread it runs every stage's slowest rank in one replica, an upper bound
        "straggler_replicas": replicas,
        # whether the step is exact for its stragglers: one replica, every rank simulated, or more
        # ranks than stages (lanes); else every stage ran at its slowest rank, an upper bound
        "stragglers_exact": replicas <= 1 or simulated is None or simulated > plan.pp,
        "links": links,
        "groups": groups,
        "compute_jitter_cv": f.compute_jitter_cv,
        "gpu_speed_cv": f.gpu_speed_cv,
        "seed": f.seed,
    }


def _crosses_down(cluster: Cluster, a: int, b: int) -> bool:
    names = path_nodes(cluster, a, b)
    return any(cluster._edge_id[e] in cluster.down for e in zip(names, names[1:]))


def format_faults(report: dict) -> list[str]:
    """Lines of the text summary for a report's ``faults`` section."""
    lines = ["  faults:"]
    slow = report["stragglers"]
    if slow:
        by = sorted({x["compute_slowdown"] for x in slow})
        lines.append(f"    stragglers       {len(slow)} rank{'s' if len(slow) != 1 else ''} ({_ranks([x['rank'] for x in slow])}) at "
                     + ", ".join(f"{b:g}x" for b in by) + " compute time")
        if not report.get("stragglers_exact", True):
            lines.append(f"    note             stragglers in {report['straggler_replicas']} replicas: this folded run "
                         "puts each stage's slowest rank in one replica (an upper bound; --no-fold is exact)")
    for x in report["links"]:
        which = "all" if x["index"] is None else f"index {x['index']}"
        lines.append(f"    {x['fault']:<16} node {x['node']} {x['link_class']} ({which}, {len(x['links'])} link{'s' if len(x['links']) != 1 else ''}) "
                     f"{x['state']} at {x['bandwidth_fraction']:g}")
    for axis, g in report["groups"].items():
        if g["crossing_degraded"] or g["rerouted"]:
            first = g["examples_crossing"] or g["examples_rerouted"]
            lines.append(f"    {axis:<16} {g['crossing_degraded']} of {g['groups']} groups cross a degraded link, "
                         f"{g['rerouted']} rerouted (first: ranks {_ranks(first[0])})")
    if report["compute_jitter_cv"] > 0:
        lines.append(f"    jitter           per-kernel cv {report['compute_jitter_cv']:g}, seed {report['seed']}")
    return lines


def _ranks(ranks: list[int]) -> str:
    """``0-7, 16`` for a sorted or unsorted rank list (runs of consecutive ranks collapsed)."""
    out, run = [], []
    for r in ranks:
        if run and r == run[-1] + 1:
            run.append(r)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [r]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(out)
