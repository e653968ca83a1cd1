"""The cluster as a directed graph: GPUs in NVSwitch nodes, NICs, and a fat-tree fabric.

A topology file (YAML, in ``simulator/data/topologies/``) describes one node type and the fabric; ``build_cluster``
scales it to the node count a scenario asks for. Every physical link is two directed edges, each
with ``bandwidth`` (bytes/s), ``latency`` (s) and ``cls`` (link class: nvlink, pcie, nic,
leaf-spine, spine-core). The graph is a networkx DiGraph for inspection and validation; the
network model works on the numbered link arrays of :class:`Cluster`.

Node names: ``n{node}.g{i}`` GPU, ``n{node}.nvs`` NVSwitch domain, ``n{node}.nic{j}`` NIC,
``pod{p}.leaf{k}``, ``pod{p}.spine{j}``, ``core{j}.{c}``.

The fabric structure (fat tree, rails, pods) is described in :mod:`simulator.parts.topology`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import networkx as nx
import numpy as np

from simulator.common import units
from simulator.common.errors import ConfigError
from simulator.parts.topology import (TopologySpec, check_spec, nvlink_efficiency, nvlink_GBps, nvlink_generation,
                                      pod_geometry)


@dataclass(frozen=True, eq=False)
class Cluster:
    """A built cluster: the graph plus numbered link arrays and a deterministic router.

    ``link_bw[e]``, ``link_lat[e]``, ``link_cls[e]`` describe directed link ``e``;
    ``link_ends[e]`` its (from, to) node names.
    """

    spec: TopologySpec
    num_nodes: int
    link_bw: np.ndarray
    link_lat: np.ndarray
    link_cls: tuple[str, ...]
    _names: "_LinkNames"  # node names of every link, the networkx graph, built on first use
    _route_cache: dict
    _ix: "_LinkIndex"  # arithmetic of the link numbering, for routes without node names
    nvlink_generation: int = 0  # of the GPU the cluster was built for (NVLS needs 4+)
    down: dict = field(default_factory=dict)  # failed link id -> the fault that failed it; routes avoid them

    @property
    def graph(self) -> nx.DiGraph:
        """The cluster as a networkx DiGraph (built on first use: 1.3 M links at 129K GPUs)."""
        return self._names.graph()

    @property
    def link_ends(self) -> tuple[tuple[str, str], ...]:
        return self._names.ends()

    @property
    def _edge_id(self) -> dict:
        return self._names.edge_id()

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.spec.gpus_per_node

    @property
    def num_links(self) -> int:
        return len(self.link_cls)

    def node_of(self, gpu: int) -> int:
        return gpu // self.spec.gpus_per_node

    def local_of(self, gpu: int) -> int:
        return gpu % self.spec.gpus_per_node

    def gpu_name(self, gpu: int) -> str:
        return f"n{self.node_of(gpu)}.g{self.local_of(gpu)}"

    def nic_of(self, gpu: int) -> int:
        """NIC index inside the node: GPUs share NICs in consecutive groups when NICs < GPUs."""
        return self.local_of(gpu) // (self.spec.gpus_per_node // self.spec.nics_per_node)

    def route(self, src: int, dst: int) -> np.ndarray:
        """Link ids from GPU ``src`` to GPU ``dst`` (cached). See :func:`path_nodes` for the rule."""
        key = (src, dst)
        hit = self._route_cache.get(key)
        if hit is None:
            if src == dst:
                raise ValueError("a transfer needs two different GPUs")
            if self.down:
                names = path_nodes(self, src, dst)
                if any(self._edge_id[e] in self.down for e in zip(names, names[1:])):
                    names = detour_nodes(self, src, dst, names)
                hit = np.fromiter((self._edge_id[(a, b)] for a, b in zip(names, names[1:])),
                                  dtype=np.int64, count=len(names) - 1)
            else:
                table = self._ix.routes(self, np.array([src]), np.array([dst]))
                hit = table[0][table[0] >= 0]
            self._route_cache[key] = hit
        return hit

    def route_table(self, src, dst) -> np.ndarray:
        """The routes of many pairs at once: row i holds :meth:`route` (``src[i]``, ``dst[i]``), in
        order, padded with -1. Vectorized (no node names) unless links are down."""
        src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        if not self.down:
            if (src == dst).any():
                raise ValueError("a transfer needs two different GPUs")
            return self._ix.routes(self, src, dst)
        rows = [self.route(int(a), int(b)) for a, b in zip(src.tolist(), dst.tolist())]
        out = np.full((len(rows), max((len(r) for r in rows), default=0)), -1, dtype=np.int64)
        for i, r in enumerate(rows):
            out[i, :len(r)] = r
        return out

    def route_links(self, src, dst) -> np.ndarray:
        """The links of many routes, concatenated (route order within each)."""
        table = self.route_table(src, dst)
        return table[table >= 0]

    def route_latencies(self, src, dst) -> np.ndarray:
        """:meth:`route_latency` of many pairs, each the same float sum over its route."""
        table = self.route_table(src, dst)
        out = np.empty(len(table))
        lengths = (table >= 0).sum(axis=1)
        for n in np.unique(lengths).tolist():
            rows = np.flatnonzero(lengths == n)
            # Row sums of a C-contiguous array run numpy's per-row summation loop, the same float
            # additions as route_latency's 1-D .sum() of each route.
            out[rows] = np.ascontiguousarray(self.link_lat[table[rows, :n]]).sum(axis=1)
        return out

    def route_latency(self, src: int, dst: int) -> float:
        key = (src, dst, "latency")
        hit = self._route_cache.get(key)
        if hit is None:
            hit = self._route_cache[key] = float(self.link_lat[self.route(src, dst)].sum())
        return hit

    def links_of_class(self, cls: str) -> np.ndarray:
        return np.array([i for i, c in enumerate(self.link_cls) if c == cls], dtype=np.int64)

    def with_bandwidth_scaled(self, factors: dict[str, float]) -> "Cluster":
        """The same cluster with each link class's bandwidth multiplied (what-if on links only)."""
        bw = self.link_bw.copy()
        for cls, factor in factors.items():
            bw[self.links_of_class(cls)] *= factor
        return replace(self, link_bw=bw, _route_cache=self._route_cache)


_CLS_CODES = ("nvlink", "pcie", "nic", "leaf-spine", "spine-core")


@dataclass(frozen=True)
class _LinkIndex:
    """Where each kind of link sits in the numbering :func:`build_cluster` gives them (every
    physical link is two consecutive ids, the direction named first, then its reverse):

    - GPU ``g``: ``4g`` GPU->NVSwitch, ``4g+1`` back, ``4g+2`` GPU->NIC (PCIe), ``4g+3`` back;
    - NIC ``j`` of node ``n``: ``nic0 + 2(n nics + j)`` NIC->leaf, ``+1`` back;
    - leaf ``li`` (its place among the used leaves, sorted by (pod, leaf)), uplink ``s``:
      ``spine0 + 2(li U + s)`` leaf->spine, ``+1`` back;
    - pod ``p``, spine ``s``, core ``c``: ``core0 + 2((p U + s) C + c)`` spine->core, ``+1`` back.

    :meth:`routes` computes :func:`path_nodes` in this numbering, for arrays of pairs."""

    nic0: int
    spine0: int
    core0: int
    leaf_slot: np.ndarray  # pod * leaves per pod + leaf -> li (-1: unused)

    def routes(self, c: "Cluster", src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        spec = c.spec
        gpn, nics = spec.gpus_per_node, spec.nics_per_node
        per_nic = gpn // nics
        rails, _, uplinks, groups_per_pod, _, cores = pod_geometry(spec, c.num_nodes)
        k = len(src)
        out = np.full((k, 10), -1, dtype=np.int64)
        pos = np.zeros(k, dtype=np.int64)
        rows = np.arange(k)

        def push(vals, mask=None):
            r = rows if mask is None else rows[mask]
            v = vals if mask is None else vals[mask]
            out[r, pos[r]] = v
            pos[r] += 1

        s_node, d_node = src // gpn, dst // gpn
        s_nic, d_nic = (src % gpn) // per_nic, (dst % gpn) // per_nic
        same = s_node == d_node
        pxn = ~same & (s_nic != d_nic) if spec.rail_optimized else np.zeros(k, dtype=bool)
        proxy = s_node * gpn + d_nic * per_nic
        # inside a node (and the PXN hop): GPU -> NVSwitch -> GPU
        via = np.where(same, dst, proxy)
        hop = same | pxn
        push(4 * src, hop)
        push(4 * via + 1, hop)
        a = np.where(pxn, proxy, src)  # the network part starts here
        a_nic = np.where(pxn, d_nic, s_nic)
        cross = ~same

        def leaf(node, nic):
            group = node // spec.nodes_per_leaf
            return group // groups_per_pod, (group % groups_per_pod) * rails + (nic if spec.rail_optimized else 0)

        s_pod, s_leaf = leaf(s_node, a_nic)
        d_pod, d_leaf = leaf(d_node, d_nic)
        push(4 * a + 2, cross)
        push(self.nic0 + 2 * (s_node * nics + a_nic), cross)
        up = cross & ((s_pod != d_pod) | (s_leaf != d_leaf))
        if up.any():
            leaves_in_pod = groups_per_pod * rails
            place = d_node % spec.nodes_per_leaf
            spine = (place if spec.rail_optimized else place * nics + d_nic) % uplinks
            s_li = self.leaf_slot[np.where(up, s_pod * leaves_in_pod + s_leaf, 0)]
            d_li = self.leaf_slot[np.where(up, d_pod * leaves_in_pod + d_leaf, 0)]
            push(self.spine0 + 2 * (s_li * uplinks + spine), up)
            far = up & (s_pod != d_pod)
            if far.any():
                core = d_leaf % cores
                push(self.core0 + 2 * ((s_pod * uplinks + spine) * cores + core), far)
                push(self.core0 + 2 * ((d_pod * uplinks + spine) * cores + core) + 1, far)
            push(self.spine0 + 2 * (d_li * uplinks + spine) + 1, up)
        push(self.nic0 + 2 * (d_node * nics + d_nic) + 1, cross)
        push(4 * dst + 3, cross)
        return out


class _LinkNames:
    """Node names of the links and the networkx graph of a cluster, made when first asked for
    (tests, reports, link faults): a 129K-GPU cluster has 1.3 M links, and a simulation needs
    only the numbered arrays."""

    def __init__(self, spec: TopologySpec, num_nodes: int, link_bw: np.ndarray, link_lat: np.ndarray,
                 link_cls: tuple[str, ...]):
        self._args = (spec, num_nodes, link_bw, link_lat, link_cls)
        self._ends = self._ids = self._graph = None

    def ends(self) -> tuple[tuple[str, str], ...]:
        if self._ends is None:
            self._ends = tuple(_named_links(*self._args[:2]))
            if len(self._ends) != len(self._args[2]):
                raise AssertionError("link names and link arrays disagree")
        return self._ends

    def edge_id(self) -> dict:
        if self._ids is None:
            self._ids = {e: i for i, e in enumerate(self.ends())}
        return self._ids

    def graph(self) -> nx.DiGraph:
        if self._graph is None:
            spec, num_nodes, bw, lat, cls = self._args
            g = nx.DiGraph()
            for n in range(num_nodes):
                g.add_node(f"n{n}.nvs", kind="nvswitch")
                for i in range(spec.gpus_per_node):
                    g.add_node(f"n{n}.g{i}", kind="gpu", gpu=n * spec.gpus_per_node + i)
                for j in range(spec.nics_per_node):
                    g.add_node(f"n{n}.nic{j}", kind="nic")
            for (a, b), w, t, k in zip(self.ends(), bw.tolist(), lat.tolist(), cls):
                g.add_edge(a, b, bandwidth=w, latency=t, cls=k)
            self._graph = g
        return self._graph


def leaf_of(cluster: Cluster, gpu: int) -> tuple[int, int]:
    """(pod, leaf index inside the pod) of the NIC serving ``gpu``."""
    rails, _, _, groups_per_pod, _, _ = pod_geometry(cluster.spec, cluster.num_nodes)
    group = cluster.node_of(gpu) // cluster.spec.nodes_per_leaf
    rail = cluster.nic_of(gpu) if cluster.spec.rail_optimized else 0
    return group // groups_per_pod, (group % groups_per_pod) * rails + rail


def leaf_position(cluster: Cluster, gpu: int) -> int:
    """Which down port of its leaf serves ``gpu``'s NIC: the node's place in its leaf group
    (times the NIC count, plus the NIC, when the leaf is not per rail)."""
    spec = cluster.spec
    place = cluster.node_of(gpu) % spec.nodes_per_leaf
    return place if spec.rail_optimized else place * spec.nics_per_node + cluster.nic_of(gpu)


def route_nodes(cluster: Cluster, src: int, dst: int) -> list[str]:
    """Node names on the deterministic up/down route from GPU ``src`` to GPU ``dst``.

    Inside a node: GPU -> NVSwitch -> GPU. Across nodes: GPU -> NIC -> leaf, then up only as far
    as needed, then down. The up ports are chosen by destination (D-mod-K, the InfiniBand fat-tree
    routing of Zahavi et al. 2010 and OpenSM's ftree): spine ``j = P mod U``, P the destination's
    :func:`leaf_position` and U the uplinks per leaf, and core ``c = L mod C``, L the destination
    leaf's index in its pod and C the cores per spine group. Flows to different destinations
    under one leaf take different spines, and flows through one spine to different leaves take
    different cores, so shift patterns (rings, pipeline sends) are collision-free on a
    full-bisection tree.

    Worked example (dgx-h100 on 64 nodes: rail-optimized, 32 nodes per leaf, U = 32 spines):
    GPU 3 (node 0, rail 3) to GPU 8*40+3 = 323 (node 40, rail 3) leaves through
    ``n0.nic3 -> pod0.leaf3``; node 40 is in leaf group 1, so the route climbs to spine
    P mod U = (40 mod 32) mod 32 = 8 and comes down to ``pod0.leaf11`` (group 1, rail 3):
    ``route(3, 323) = [n0.g3, n0.nic3, pod0.leaf3, pod0.spine8, pod0.leaf11, n40.nic3, n40.g3]``.
    """
    if src == dst:
        raise ValueError("a transfer needs two different GPUs")
    s_node, d_node = cluster.node_of(src), cluster.node_of(dst)
    s_name, d_name = cluster.gpu_name(src), cluster.gpu_name(dst)
    if s_node == d_node:
        return [s_name, f"n{s_node}.nvs", d_name]
    s_nic, d_nic = f"n{s_node}.nic{cluster.nic_of(src)}", f"n{d_node}.nic{cluster.nic_of(dst)}"
    (s_pod, s_leaf), (d_pod, d_leaf) = leaf_of(cluster, src), leaf_of(cluster, dst)
    path = [s_name, s_nic, f"pod{s_pod}.leaf{s_leaf}"]
    if (s_pod, s_leaf) != (d_pod, d_leaf):
        _, _, uplinks, _, _, cores = pod_geometry(cluster.spec, cluster.num_nodes)
        spine = leaf_position(cluster, dst) % uplinks
        path.append(f"pod{s_pod}.spine{spine}")
        if s_pod != d_pod:
            path += [f"core{spine}.{d_leaf % cores}", f"pod{d_pod}.spine{spine}"]
        path.append(f"pod{d_pod}.leaf{d_leaf}")
    return path + [d_nic, d_name]


def path_nodes(cluster: Cluster, src: int, dst: int) -> list[str]:
    """The path a GPU-to-GPU transfer takes, :func:`route_nodes` plus NCCL's PXN on rail-optimized
    fabrics: a transfer to a GPU on another rail first crosses NVLink to the GPU of its own node
    that sits on the destination's rail, so the network part stays on one rail (NCCL 2.12+,
    ``NCCL_PXN_DISABLE=0``)."""
    spec = cluster.spec
    if (spec.rail_optimized and cluster.node_of(src) != cluster.node_of(dst)
            and cluster.nic_of(src) != cluster.nic_of(dst)):
        proxy = cluster.node_of(src) * spec.gpus_per_node + cluster.nic_of(dst) * (spec.gpus_per_node // spec.nics_per_node)
        return route_nodes(cluster, src, proxy) + route_nodes(cluster, proxy, dst)[1:]
    return route_nodes(cluster, src, dst)


def detour_nodes(cluster: Cluster, src: int, dst: int, default: list[str]) -> list[str]:
    """The route from ``src`` to ``dst`` when the default one crosses a failed link (``cluster.down``).

    Between nodes, the first path without a failed link among: the default rail with the next
    spines (D-mod-K's spine + 1, + 2, ... mod U) and, inside each, the next cores; then the next
    rails (NIC j + 1, ... mod the NICs; on a rail-optimized fabric both ends move to that rail,
    crossing NVLink to the GPU that owns its NIC, as PXN does). This is what a subnet manager's
    re-route or adaptive routing does: the flows of a failed link move to the neighbouring link,
    the others keep their paths. If none exists, and always inside one node, the shortest path
    that forwards through no third node's GPUs, switches and NICs being free to use. No path: a
    ConfigError naming the fault entries on the default route.
    """
    down = cluster.down
    ids = cluster._edge_id

    def clear(names: list[str]) -> bool:
        return all(ids.get(e, -1) not in down and e in ids for e in zip(names, names[1:]))

    if cluster.node_of(src) != cluster.node_of(dst):
        for names in _alternatives(cluster, src, dst):
            if clear(names):
                return names
    ends = {cluster.node_of(src), cluster.node_of(dst)}

    def allowed(name: str) -> bool:
        return not name.startswith("n") or int(name[1:name.index(".")]) in ends

    view = nx.subgraph_view(cluster.graph, filter_node=allowed,
                            filter_edge=lambda a, b: ids[(a, b)] not in down)
    try:
        return nx.shortest_path(view, cluster.gpu_name(src), cluster.gpu_name(dst))
    except nx.NetworkXNoPath:
        causes = sorted({down[ids[e]] for e in zip(default, default[1:]) if ids[e] in down})
        raise ConfigError(", ".join(causes), f"{cluster.gpu_name(src)} -> {cluster.gpu_name(dst)}",
                          "leaves these GPUs no route: fail fewer links or give bandwidth_fraction > 0") from None


def _alternatives(cluster: Cluster, src: int, dst: int):
    """Node paths between GPUs of two nodes, over every rail (or NIC pair), spine and core,
    the default choices first (see :func:`detour_nodes`)."""
    spec = cluster.spec
    per_nic = spec.gpus_per_node // spec.nics_per_node
    nics = spec.nics_per_node
    s_node, d_node = cluster.node_of(src), cluster.node_of(dst)
    if spec.rail_optimized:
        first = cluster.nic_of(dst)
        nic_pairs = [((first + r) % nics,) * 2 for r in range(nics)]
    else:
        a0, b0 = cluster.nic_of(src), cluster.nic_of(dst)
        nic_pairs = [((a0 + a) % nics, (b0 + b) % nics) for a in range(nics) for b in range(nics)]
    _, _, uplinks, _, _, cores = pod_geometry(spec, cluster.num_nodes)
    for a, b in nic_pairs:
        via_s, via_d = s_node * spec.gpus_per_node + a * per_nic, d_node * spec.gpus_per_node + b * per_nic
        head = [cluster.gpu_name(src)]
        if cluster.nic_of(src) != a:
            head += [f"n{s_node}.nvs", cluster.gpu_name(via_s)]
        tail = [cluster.gpu_name(dst)]
        if cluster.nic_of(dst) != b:
            tail = [cluster.gpu_name(via_d), f"n{d_node}.nvs"] + tail
        (s_pod, s_leaf), (d_pod, d_leaf) = leaf_of(cluster, via_s), leaf_of(cluster, via_d)
        head += [f"n{s_node}.nic{a}", f"pod{s_pod}.leaf{s_leaf}"]
        tail = [f"pod{d_pod}.leaf{d_leaf}", f"n{d_node}.nic{b}"] + tail
        if (s_pod, s_leaf) == (d_pod, d_leaf):
            yield head + tail[1:]
            continue
        spine0 = leaf_position(cluster, via_d) % uplinks
        for k in range(uplinks):
            spine = (spine0 + k) % uplinks
            if s_pod == d_pod:
                yield head + [f"pod{s_pod}.spine{spine}"] + tail
                continue
            for m in range(cores):
                core = f"core{spine}.{(d_leaf + m) % cores}"
                yield head + [f"pod{s_pod}.spine{spine}", core, f"pod{d_pod}.spine{spine}"] + tail


def build_cluster(spec: TopologySpec, num_nodes: int, *, gpus_per_node: int | None = None,
                  nvlink_bandwidth_GBps: float | None = None, network_bandwidth_Gbps: float | None = None,
                  oversubscription: float | None = None, gpu: str | None = None) -> Cluster:
    """Scale ``spec`` to ``num_nodes`` nodes, applying the scenario's optional overrides.

    NVLink links carry the nominal rate (``nvlink_bandwidth_GBps``, else that of ``gpu`` when it is
    not the topology's GPU, else the topology's) times the GPU's ``nvlink_efficiency`` (the GPU is
    ``gpu``, else the topology's; ``simulator.parts.gpus``), what NCCL transfers sustain."""
    if not isinstance(num_nodes, int) or isinstance(num_nodes, bool) or num_nodes < 1:
        raise ConfigError("cluster.num_nodes", num_nodes, "must be a whole number >= 1")
    nvlink_bandwidth_GBps = nvlink_GBps(spec, gpu, nvlink_bandwidth_GBps)
    overrides = {k: v for k, v in dict(
        gpus_per_node=gpus_per_node, nvlink_bandwidth_GBps=nvlink_bandwidth_GBps,
        network_bandwidth_Gbps=network_bandwidth_Gbps, oversubscription=oversubscription).items()
        if v is not None}
    if "gpus_per_node" in overrides and spec.nics_per_node > overrides["gpus_per_node"]:
        overrides["nics_per_node"] = overrides["gpus_per_node"]
    spec = check_spec(replace(spec, **overrides), "cluster.")

    nv_bw = units.GBps(spec.nvlink_bandwidth_GBps) * nvlink_efficiency(gpu or spec.gpu)
    nv_lat = units.us(spec.nvlink_latency_us)
    nic_bw = units.Gbps(spec.network_bandwidth_Gbps)
    fab_bw = units.Gbps(spec.fabric_link_bandwidth_Gbps or spec.network_bandwidth_Gbps)
    pcie_bw, pcie_lat = units.GBps(spec.pcie_bandwidth_GBps), units.us(spec.pcie_latency_us)
    nic_lat, sw_lat = units.us(spec.nic_latency_us), units.us(spec.switch_latency_us)

    # links in the order _named_links names them (see _LinkIndex), as whole blocks
    gpus = num_nodes * spec.gpus_per_node
    rails, groups, uplinks, groups_per_pod, pods, cores = pod_geometry(spec, num_nodes)
    blocks = [(4 * gpus, [nv_bw, nv_bw, pcie_bw, pcie_bw], [nv_lat, nv_lat, pcie_lat, pcie_lat], [0, 0, 1, 1])]
    leaves_in_pod = groups_per_pod * rails
    slots = np.zeros(0, dtype=np.int64)
    nic_links = leaf_links = core_links = 0
    if num_nodes > 1:
        nic_links = 2 * num_nodes * spec.nics_per_node
        blocks.append((nic_links, [nic_bw], [nic_lat], [2]))
        group = np.arange(num_nodes) // spec.nodes_per_leaf
        j = np.arange(spec.nics_per_node) if spec.rail_optimized else np.zeros(1, dtype=np.int64)
        slots = np.unique(((group // groups_per_pod) * leaves_in_pod + (group % groups_per_pod) * rails)[:, None]
                          + j[None, :])
        if len(slots) > 1:
            leaf_links = 2 * len(slots) * uplinks
            blocks.append((leaf_links, [fab_bw], [sw_lat], [3]))
            if pods > 1:
                core_links = 2 * pods * uplinks * cores
                blocks.append((core_links, [fab_bw], [sw_lat], [4]))
    link_bw = np.concatenate([np.tile(np.array(bw, dtype=float), n // len(bw)) for n, bw, _, _ in blocks])
    link_lat = np.concatenate([np.tile(np.array(lat, dtype=float), n // len(lat)) for n, _, lat, _ in blocks])
    codes = np.concatenate([np.tile(np.array(k), n // len(k)) for n, _, _, k in blocks])
    link_cls = tuple(np.array(_CLS_CODES, dtype=object)[codes].tolist())
    leaf_slot = np.full(max(pods * leaves_in_pod, 1), -1, dtype=np.int64)
    leaf_slot[slots] = np.arange(len(slots))
    ix = _LinkIndex(nic0=4 * gpus, spine0=4 * gpus + nic_links, core0=4 * gpus + nic_links + leaf_links,
                    leaf_slot=leaf_slot)
    names = _LinkNames(spec, num_nodes, link_bw, link_lat, link_cls)
    cluster = Cluster(spec=spec, num_nodes=num_nodes, link_bw=link_bw, link_lat=link_lat, link_cls=link_cls,
                      _names=names, _route_cache={}, _ix=ix, nvlink_generation=nvlink_generation(gpu or spec.gpu))
    _check_links(cluster)
    return cluster


def _named_links(spec: TopologySpec, num_nodes: int) -> list[tuple[str, str]]:
    """(from, to) node names of every directed link, in link-id order."""
    ends: list[tuple[str, str]] = []

    def link(a: str, b: str) -> None:
        ends.append((a, b))
        ends.append((b, a))

    per_nic = spec.gpus_per_node // spec.nics_per_node
    for n in range(num_nodes):
        for i in range(spec.gpus_per_node):
            link(f"n{n}.g{i}", f"n{n}.nvs")
            link(f"n{n}.g{i}", f"n{n}.nic{i // per_nic}")

    rails, groups, uplinks, groups_per_pod, pods, cores = pod_geometry(spec, num_nodes)
    if num_nodes > 1:
        leaves_used = set()
        for n in range(num_nodes):
            group = n // spec.nodes_per_leaf
            pod = group // groups_per_pod
            for j in range(spec.nics_per_node):
                leaf = (group % groups_per_pod) * rails + (j if spec.rail_optimized else 0)
                leaves_used.add((pod, leaf))
                link(f"n{n}.nic{j}", f"pod{pod}.leaf{leaf}")
        if len(leaves_used) > 1:
            for pod, leaf in sorted(leaves_used):
                for s in range(uplinks):
                    link(f"pod{pod}.leaf{leaf}", f"pod{pod}.spine{s}")
            if pods > 1:
                for pod in range(pods):
                    for s in range(uplinks):
                        for c in range(cores):
                            link(f"pod{pod}.spine{s}", f"core{s}.{c}")
    return ends


def _check_links(cluster: Cluster) -> None:
    """Positive bandwidths and non-negative latencies, on the link arrays. Connectivity holds by
    construction (every NIC on a leaf, every leaf on all spines of its pod, spine j of every pod
    on core group j); :func:`validate_cluster` checks it on the graph."""
    for values, ok, need in ((cluster.link_bw, cluster.link_bw > 0, "must be > 0"),
                             (cluster.link_lat, cluster.link_lat >= 0, "must be >= 0")):
        if not ok.all():
            i = int(np.flatnonzero(~ok)[0])
            a, b = cluster.link_ends[i]
            raise ConfigError(f"link {a}->{b}.{'bandwidth' if values is cluster.link_bw else 'latency'}",
                              float(values[i]), need)


def validate_cluster(cluster: Cluster) -> None:
    """Connected, positive bandwidths, non-negative latencies, every GPU reaches every other."""
    g = cluster.graph
    for a, b, data in g.edges(data=True):
        if not data["bandwidth"] > 0:
            raise ConfigError(f"link {a}->{b}.bandwidth", data["bandwidth"], "must be > 0")
        if not data["latency"] >= 0:
            raise ConfigError(f"link {a}->{b}.latency", data["latency"], "must be >= 0")
    if g.number_of_nodes() > 1 and not nx.is_strongly_connected(g):
        raise ConfigError("topology", cluster.spec.name, "the built graph is not connected")
