"""Link faults: a degraded or failed link is a change of the cluster, nothing else.

Which links a fault entry means, and in what order ``index`` counts them, is
``simulator.parts.topology.node_links``.

A ``bandwidth_fraction`` below 1 multiplies those links' bandwidth; 0 fails them: they keep
their place in the link arrays (link ids stay stable) but enter ``Cluster.down`` and no route
crosses them (``topology.detour_nodes``). A fault that leaves two GPUs no route is a
ConfigError naming the entry; ``check_reachable`` finds it before a simulation for the
pairs of the fault's own node, and ``Cluster.route`` for any other pair the moment a collective
asks for it.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from simulator.scenario.config import Faults, LinkFault
from simulator.network.cluster import Cluster
from simulator.parts.topology import TopologySpec, node_links

CHECK_ALL_NODES = 256  # beyond, check_reachable checks a node against one node per leaf group


def fault_links(spec: TopologySpec, num_nodes: int, fault: LinkFault) -> list[tuple[str, str]]:
    """The physical links one fault entry touches (one direction named; both are affected)."""
    links = node_links(spec, num_nodes, fault.node, fault.link_class)
    return links if fault.index is None else links[fault.index:fault.index + 1]


def apply_link_faults(cluster: Cluster, faults: Faults) -> Cluster:
    """``cluster`` with every link fault applied: bandwidths multiplied by their fraction, links at
    0 failed (``Cluster.down``). No link faults: ``cluster`` itself. A faulted cluster gets its own
    route cache, so routes computed around a failed link never reach the healthy cluster."""
    if not faults.links:
        return cluster
    bw = cluster.link_bw.copy()
    down: dict[int, str] = dict(cluster.down)
    for i, fault in enumerate(faults.links):
        where = f"faults.links[{i}]"
        for a, b in fault_links(cluster.spec, cluster.num_nodes, fault):
            for e in (cluster._edge_id[(a, b)], cluster._edge_id[(b, a)]):
                bw[e] *= fault.bandwidth_fraction
                if fault.bandwidth_fraction == 0:
                    down.setdefault(e, where)
    bw = np.where(bw > 0, bw, cluster.link_bw)  # a failed link keeps its rate on paper; no route uses it
    faulted = replace(cluster, link_bw=bw, down=down, _route_cache={})
    for node in sorted({fault.node for fault in faults.links if fault.bandwidth_fraction == 0}):
        check_reachable(faulted, node)
    return faulted


def check_reachable(cluster: Cluster, node: int) -> None:
    """Every GPU of ``node`` has a route to every other GPU of its node and to the GPU of the same
    local index on the other nodes, both ways (a ConfigError naming the fault otherwise). Past
    ``CHECK_ALL_NODES`` nodes, the other nodes are those of ``node``'s leaf group and the first
    node of every other group.

    This catches a node cut off from its peers or from the fabric (all its NICs, all its PCIe
    links, its leaves' uplinks failed) before any simulation; a pair cut off elsewhere is a
    ConfigError from ``Cluster.route`` when a collective first asks for it."""
    spec = cluster.spec
    g = spec.gpus_per_node
    others = range(cluster.num_nodes)
    if cluster.num_nodes > CHECK_ALL_NODES:  # the nodes of N's leaf group and the first of every other group
        group = node // spec.nodes_per_leaf * spec.nodes_per_leaf
        others = sorted({*range(group, min(group + spec.nodes_per_leaf, cluster.num_nodes)),
                         *range(0, cluster.num_nodes, spec.nodes_per_leaf)})
    mine = range(node * g, (node + 1) * g)
    for a in mine:
        for b in mine:
            if a != b:
                cluster.route(a, b)
        for other in others:
            if other != node:
                peer = other * g + a % g
                cluster.route(a, peer)
                cluster.route(peer, a)
