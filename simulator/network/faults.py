"""Link faults: a degraded or failed link is a change of the cluster, nothing else.

Which links a fault entry ``{node: N, link_class: C, index: i}`` means, in the order ``index``
counts them (every one of them when ``index`` is left out; each physical link is both of its
directed edges):

- ``nvlink``: the NVLink of each GPU of node N to its NVSwitch, GPU 0 first;
- ``pcie``: each GPU's PCIe link to its NIC, GPU 0 first;
- ``nic``: each NIC's link to its leaf switch, NIC 0 first;
- ``leaf-spine``: the uplinks of the leaf switches node N's NICs attach to: the leaf of NIC 0
  (its rail) to spine 0, 1, ..., U-1, then the leaf of NIC 1, ... (one leaf when the fabric is
  not rail-optimized). These leaves serve the other nodes of N's leaf group too.
  ``index: 0`` is one link: node N's first leaf to spine 0, which D-mod-K routing uses for
  traffic to nodes at leaf position 0 (node N itself when it is first under its leaf) and
  from them to other leaves;
- ``spine-core``: the links of the spines of node N's pod to their cores, spine 0 to core 0,
  1, ..., C-1, then spine 1, ...

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
from simulator.common.errors import ConfigError
from simulator.network.cluster import Cluster, TopologySpec, _pod_geometry

CHECK_ALL_NODES = 256  # beyond, check_reachable checks a node against one node per leaf group


def effective_spec(spec: TopologySpec, gpus_per_node: int | None = None,
                   oversubscription: float | None = None) -> TopologySpec:
    """``spec`` with the scenario's overrides that change the fabric's shape (as ``build_cluster``)."""
    out = spec
    if gpus_per_node is not None:
        out = replace(out, gpus_per_node=gpus_per_node, nics_per_node=min(spec.nics_per_node, gpus_per_node))
    if oversubscription is not None:
        out = replace(out, oversubscription=oversubscription)
    return out


def _leaves_of_node(spec: TopologySpec, num_nodes: int, node: int) -> list[tuple[int, int]]:
    rails, _, _, groups_per_pod, _, _ = _pod_geometry(spec, num_nodes)
    group = node // spec.nodes_per_leaf
    pod = group // groups_per_pod
    return [(pod, (group % groups_per_pod) * rails + r) for r in range(rails)]


def node_links(spec: TopologySpec, num_nodes: int, node: int, link_class: str) -> list[tuple[str, str]]:
    """The physical links of ``link_class`` that belong to ``node``, in ``index`` order (module
    docstring), each as one direction's (from, to) names; empty when the cluster has none."""
    g, nics = spec.gpus_per_node, spec.nics_per_node
    rails, groups, uplinks, groups_per_pod, pods, cores = _pod_geometry(spec, num_nodes)
    if link_class == "nvlink":
        return [(f"n{node}.g{i}", f"n{node}.nvs") for i in range(g)]
    if link_class == "pcie":
        return [(f"n{node}.g{i}", f"n{node}.nic{i // (g // nics)}") for i in range(g)]
    if num_nodes == 1:
        return []
    if link_class == "nic":
        leaves = _leaves_of_node(spec, num_nodes, node)
        return [(f"n{node}.nic{j}", "pod{}.leaf{}".format(*leaves[j if rails > 1 else 0])) for j in range(nics)]
    if link_class == "leaf-spine":
        if rails * groups <= 1:
            return []
        return [(f"pod{pod}.leaf{leaf}", f"pod{pod}.spine{s}")
                for pod, leaf in _leaves_of_node(spec, num_nodes, node) for s in range(uplinks)]
    if link_class == "spine-core":
        if pods <= 1:
            return []
        pod = node // spec.nodes_per_leaf // groups_per_pod
        return [(f"pod{pod}.spine{s}", f"core{s}.{c}") for s in range(uplinks) for c in range(cores)]
    raise ValueError(f"unknown link class {link_class!r}")


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
