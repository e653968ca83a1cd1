"""Collective algorithms as phases of coupled flows on the network model, and their closed forms.

Size conventions follow nccl-tests: ``size`` is the per-rank buffer for all_reduce and broadcast,
the full (gathered) buffer for all_gather and reduce_scatter (each rank owns ``size / n``), and
the per-rank send buffer for all_to_all (``size / n`` to each peer).

Algorithms (what is modelled, and what is not):
- Ring (Patarasuk and Yuan 2009), NCCL's default and ``auto``: all_reduce is 2(n-1) steps of
  size/n per rank; reduce_scatter and all_gather n-1 steps. A ring is one coupled transfer whose
  members are its edges, so it runs at its most contended edge's fair share, in the NCCL
  protocol (LL, LL128, Simple) fastest for its size: the protocol's efficiency inflates the
  bytes, its base latency plus per-step latency (NVLink or network) is added once
  (:mod:`simulator.network.nccl`). A group spanning nodes with k ranks in each uses k rings (NCCL channels),
  each carrying size/k: ring c enters every node at the node's c-th rank and leaves from the
  one before it, so every NIC carries one ring in and one out and the inter-node traffic per
  node is 2(n-1)/n x size, as NCCL's ring measures (validation/collectives.yaml: 24 A100 over
  3 nodes with 4 HDR NICs each, busbw 85-96 GB/s; this model gives about 99).
- Hierarchical (``algorithm: hierarchical``), for groups with the same number k of ranks on each
  of m nodes: reduce-scatter inside each node over NVLink, all-reduce of size/k across nodes
  among the ranks with the same position (one ring per rail), all-gather inside the node, the
  phases one after another. It moves 2(m-1)/m x size per node across the fabric instead of the
  ring's 2(n-1)/n, so it beats the ring when NICs are shared by GPUs, but it does not pipeline
  its phases as NCCL does, so it loses when NVLink time is comparable to network time.
- all_to_all: every pair exchanges size/n at once, as one coupled transfer (NCCL runs it as one
  grouped kernel that ends with its slowest pair; pairs that could finish early on faster
  links are held to the slowest pair's rate, which leaves the completion time unchanged when
  each pair's bottleneck is its own rank's link).
- broadcast: a pipelined chain from the root (each rank forwards size to the next).
- NVLS (``algorithm: nvls``, and in ``auto`` where NCCL's cost model prefers it): all_reduce,
  reduce_scatter and all_gather of a group inside one NVSwitch domain whose topology says
  ``nvls: true`` and whose GPUs have NVLink 4 or later, reduced and multicast in the switch
  (:mod:`simulator.network.nccl`, NCCL's NVLS terms). It is one coupled transfer over the
  group's ring edges, each member carrying the bytes NCCL's model charges one GPU's NVLink per
  direction (all_reduce: S (n-1)(c+1) / (n(c-1)), c = min(n, 32)), at NCCL's NVLS efficiency,
  plus 25 us. ``auto`` takes NVLS when its modelled time alone beats the ring's in its best
  protocol, as NCCL's tuner picks the smallest latency + bytes / bandwidth: an 8-GPU H100
  all_reduce takes the ring (LL) up to about 1 MiB and NVLS above, about 487-490 GB/s busbw at
  1-8 GiB against 466-480 measured. Groups spanning nodes keep the ring (NCCL's NVLS across
  nodes needs SHARP; NVLS-Tree is not modelled).
- NVLS + SHARP (``algorithm: sharp``): an all_reduce spanning nodes with the same k ranks on
  each, on a topology with ``nvls: true`` and ``sharp: true`` (InfiniBand switches reducing in
  the network, NCCL's NVLS algorithm with the CollNet/SHARP plugin): NVLS inside every node and,
  at the same time, each GPU's slice through its own NIC on its rail, NCCL's per-GPU bytes
  (:func:`simulator.network.nccl.sharp_wire_bytes`), plus 25 + 18 us. NCCL uses it only with
  CollNet enabled, so ``auto`` keeps the ring; other ops and layouts fall back to it too.
"""

from __future__ import annotations

import weakref

from dataclasses import dataclass
from typing import Generator, Sequence

import numpy as np
import simpy

from simulator.network import nccl
from simulator.network.flows import Network
from simulator.network.cluster import Cluster

OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "send_recv")
ALGORITHMS = ("auto", "ring", "hierarchical", "nvls", "sharp")


def bus_factor(op: str, n: int) -> float:
    """nccl-tests busbw / algbw factor (NVIDIA/nccl-tests doc/PERFORMANCE.md)."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("reduce_scatter", "all_gather", "all_to_all"):
        return (n - 1) / n
    return 1.0


def _link_counts(links: np.ndarray, num_links: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(links, return_counts=True)`` for link ids in [0, num_links): a bincount when
    the array is long enough for one pass over the ids to beat sorting it (same result)."""
    if len(links) * 8 < num_links:
        return np.unique(links, return_counts=True)
    counts = np.bincount(links, minlength=num_links)
    ids = np.flatnonzero(counts)
    return ids, counts[ids]


class _LazyPhases:
    """Per-group phases built on first use (truthy: there is at least one moving pair; only the
    unmerged fallback iterates them)."""

    def __init__(self, build):
        self._build, self._items = build, None

    def _get(self) -> list:
        if self._items is None:
            self._items = self._build()
        return self._items

    def __bool__(self) -> bool:
        return True

    def __iter__(self):
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


@dataclass(frozen=True)
class Spec:
    """One transfer of a phase: member flows along ``edges`` (src, dst GPU pairs), each moving
    ``size`` bytes, plus ``latency`` seconds once."""

    edges: tuple[tuple[int, int], ...]
    size: float
    latency: float


Phase = list[Spec]


_CLUSTER_CACHES: "weakref.WeakKeyDictionary[Cluster, dict]" = weakref.WeakKeyDictionary()


def cluster_cache(cluster: Cluster) -> dict:
    """A dict that lives as long as ``cluster`` (clusters are cached per scenario, so every
    simulation of a plan or sweep on one cluster shares it) for what depends on the cluster's
    routes and bandwidths alone. A cluster with scaled bandwidths is another object."""
    return _CLUSTER_CACHES.setdefault(cluster, {})


class Collectives:
    """Runs collectives over GPU ids of one cluster, on one network, as simpy generators.

    Each op is first planned as phases (lists of :class:`Spec`) and then executed; phases of
    several groups can run together, and with ``merge`` the specs at the same position of every
    group become one coupled transfer: exact when the groups are symmetric (they then progress
    at the same rate anyway) and much cheaper to simulate.
    """

    def __init__(self, env: simpy.Environment, net: Network, cluster: Cluster, algorithm: str = "auto"):
        self.env = env
        self.net = net
        self.cluster = cluster
        self.algorithm = algorithm
        self._prepared: dict = {}
        self._by_id: dict = {}
        self._alone: dict = {}  # id(one group's phases) -> (the phases, ``_merged`` of that group alone)
        # what depends on the cluster alone, shared by every simulation on it (``cluster_cache``):
        # a plan's or a sweep's layouts route the same rings again otherwise
        shared = cluster_cache(cluster)
        self._geometry: dict = shared.setdefault("ring_geometry", {})
        self._specs: dict = shared.setdefault("ring_specs", {})
        # id(edges tuple) -> (the tuple, src, dst), for rings; the tuples live in ``_geometry``
        self._edge_arrays: dict = shared.setdefault("ring_edges", {})
        self._channel_rings: dict = shared.setdefault("channel_rings", {})  # sorted ranks -> rings
        # ring -> (slowest link inside a node, slowest between nodes) on its edges' routes
        self._split_bw: dict = shared.setdefault("ring_split_bw", {})

    def ring_spec(self, op: str, ring: Sequence[int], per_step: float, steps: int, channels: int = 1) -> Spec:
        """``steps`` ring steps of ``per_step`` bytes per rank, as one coupled transfer, in the NCCL
        protocol (:mod:`simulator.network.nccl`) that is fastest alone for one of the ``channels``
        rings of the collective: its efficiency inflates the bytes on the wire, its base and
        per-step latencies give the transfer's latency."""
        edges, inter, link_bw = self._geometry.get(tuple(ring)) or self._ring_geometry([ring])[0]
        # Every ring of a multi-node collective passes through every GPU of every node, so each
        # GPU's links inside the node carry all ``channels`` rings while a NIC carries one: NCCL's
        # tuner likewise prices a channel at its share (``busBw = nChannels * bw``, bw per channel)
        shared_bw = link_bw
        if channels > 1 and inter > 0:
            bw_in, bw_out = self._split_bw[tuple(ring)]
            shared_bw = min(bw_out, bw_in / channels)
        key = (op, per_step, steps, inter, link_bw, channels, shared_bw)
        hit = self._specs.get(key)
        if hit is None:  # the same for every ring of the same shape
            nbytes = per_step * steps
            proto, eff = nccl.choose(op, nbytes, steps, link_bw, inter, channels, shared_bw)
            hit = self._specs[key] = (nbytes / eff, proto.base_s + steps * nccl.step_latency(proto, inter))
        return Spec(edges, *hit)

    def nvls_spec(self, op: str, ranks: Sequence[int], size: float) -> Spec | None:
        """``op`` over ``ranks`` as one NVLS transfer, if the algorithm allows NVLS here and (under
        ``auto``) NCCL's cost model prefers it to the ring; else None."""
        c = self.cluster
        if (self.algorithm not in ("auto", "nvls", "sharp") or not c.spec.nvls
                or c.nvlink_generation not in nccl.NVLS_EFFICIENCY
                or c.node_of(min(ranks)) != c.node_of(max(ranks))):
            return None
        n = len(ranks)
        edges, _, link_bw = self._geometry.get(tuple(ranks)) or self._ring_geometry([ranks])[0]
        key = ("nvls", op, n, size, link_bw)
        if key not in self._specs:
            t = nccl.nvls_time(op, n, size, link_bw, c.nvlink_generation)
            if t is None or (self.algorithm == "auto" and t >= nccl.ring_time(op, n, size, link_bw)):
                self._specs[key] = None
            else:
                wire = nccl.nvls_wire_bytes(op, n, size)
                self._specs[key] = (wire / nccl.NVLS_EFFICIENCY[c.nvlink_generation], nccl.NVLS_LATENCY_S)
        hit = self._specs[key]
        return None if hit is None else Spec(edges, *hit)

    def sharp_phase(self, ranks: Sequence[int], size: float) -> Phase | None:
        """An all_reduce over ``ranks`` as NVLS + SHARP (:mod:`simulator.network.nccl`): one phase of
        concurrent transfers, NVLS inside each node (its ring edges, the NVLink bytes NCCL's model
        charges) beside the inter-node part on the rails (rank j of every node, each GPU's own NIC
        carrying the NIC bytes), so the slower of the two sets the time, as NCCL's model takes the
        smaller bandwidth. None where it cannot run: no NVLS or no SHARP in the topology, NVLink
        before generation 4, one node, unequal ranks per node, or GPUs sharing a NIC."""
        c = self.cluster
        if (not c.spec.nvls or not getattr(c.spec, "sharp", False)
                or c.nvlink_generation not in nccl.NVLS_EFFICIENCY):
            return None
        nodes = self._node_groups(ranks)
        if nodes is None or len(nodes) < 2 or len(nodes[0]) < 2:
            return None
        k = len(nodes[0])
        if len({c.nic_of(r) for r in nodes[0]}) != k:
            return None
        intra_bytes, nic_bytes = nccl.sharp_wire_bytes(len(ranks), k, size)
        latency = nccl.NVLS_LATENCY_S + nccl.SHARP_NET_LATENCY_S
        rails = [[node[j] for node in nodes] for j in range(k)]
        geometry = self._ring_geometry(nodes + rails)
        wire = intra_bytes / nccl.NVLS_EFFICIENCY[c.nvlink_generation]
        return ([Spec(edges, wire, latency) for edges, _, _ in geometry[:len(nodes)]]
                + [Spec(edges, nic_bytes, latency) for edges, _, _ in geometry[len(nodes):]])

    def _ring_geometry(self, rings: Sequence[Sequence[int]]) -> list[tuple]:
        """(edges, fraction of edges between nodes, slowest link on any edge's route) of each ring
        (rank i sends to rank i + 1, the last to the first); cached, and computed for all the
        rings not yet seen in one vectorized routing call."""
        keys = [tuple(r) for r in rings]
        missing = [k for k in dict.fromkeys(keys) if k not in self._geometry]
        if missing:
            c = self.cluster
            lengths = np.array([len(k) for k in missing])
            starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
            src = np.concatenate([np.asarray(k, dtype=np.int64) for k in missing])
            succ = np.arange(len(src)) + 1
            succ[starts + lengths - 1] = starts
            dst = src[succ]
            table = c.route_table(src, dst)
            edge_bw = np.where(table >= 0, c.link_bw[table], np.inf).min(axis=1)
            ring_bw = np.minimum.reduceat(edge_bw, starts).tolist()
            nodes = src // c.spec.gpus_per_node
            crossing = nodes != nodes[succ]
            inter = np.add.reduceat(crossing.astype(np.int64), starts).tolist()
            intra_bw = np.minimum.reduceat(np.where(crossing, np.inf, edge_bw), starts).tolist()
            inter_bw = np.minimum.reduceat(np.where(crossing, edge_bw, np.inf), starts).tolist()
            src_l, dst_l = src.tolist(), dst.tolist()
            for k, a, n, cross, bw, bw_in, bw_out in zip(missing, starts.tolist(), lengths.tolist(), inter, ring_bw,
                                                         intra_bw, inter_bw):
                edges = tuple(zip(src_l[a:a + n], dst_l[a:a + n]))
                self._geometry[k] = (edges, cross / n, bw)
                self._split_bw[k] = (bw_in, bw_out)
                self._edge_arrays[id(edges)] = (edges, src[a:a + n], dst[a:a + n])
        return [self._geometry[k] for k in keys]

    def _prefetch(self, op: str, groups) -> None:
        """Route, in one call, every ring the groups' ring collectives will use."""
        if op not in ("all_reduce", "reduce_scatter", "all_gather"):
            return
        rings = []
        for g in groups:
            ranks = sorted(g)
            if len(ranks) < 2:
                continue
            if self.cluster.node_of(ranks[0]) == self.cluster.node_of(ranks[-1]):
                rings.append(ranks)
                continue
            h = self._hierarchy(ranks)
            rings += [ranks] + (self.channel_rings(ranks) if h is None else h[0] + h[1])
        self._ring_geometry([r for r in rings if len(r) > 1])

    def _node_groups(self, ranks: Sequence[int]) -> list[list[int]] | None:
        """Ranks per node (nodes in order) if every node holds the same count, else None."""
        arr = np.sort(np.asarray(ranks, dtype=np.int64))
        if not len(arr):
            return None
        nodes = arr // self.cluster.spec.gpus_per_node
        cuts = np.flatnonzero(nodes[1:] != nodes[:-1]) + 1
        counts = np.diff(np.concatenate([[0], cuts, [len(arr)]]))
        if len(counts) and (counts != counts[0]).any():
            return None
        return [part.tolist() for part in np.split(arr, cuts)]

    def _hierarchy(self, ranks: Sequence[int]):
        """(intra-node groups, inter-node rail groups) for the hierarchical form, or None for rings."""
        if self.algorithm != "hierarchical":
            return None
        nodes = self._node_groups(ranks)
        if nodes is None or len(nodes) < 2:
            return None
        k = len(nodes[0])
        rails = [[node[j] for node in nodes] for j in range(k)]
        return nodes, rails

    def channel_rings(self, ranks: Sequence[int]) -> list[list[int]]:
        """NCCL-style rings: one per rank position when every node holds the same count k > 1.
        Memoised by the group (a folded stage plans the same groups again for every bucket size):
        callers read the rings and never change them."""
        key = tuple(sorted(ranks))
        hit = self._channel_rings.get(key)
        if hit is None:
            hit = self._channel_rings[key] = self._channel_rings_of(list(key))
        return hit

    def _channel_rings_of(self, ranks: list[int]) -> list[list[int]]:
        """Ring c enters the first node at its c-th GPU and leaves it from the one before, and
        every hop between nodes joins GPUs of the same local index, so each goes out of its own
        NIC into the same rail on the next node: NCCL keeps a ring on one NIC rail between nodes
        unless it cannot (``NCCL_CROSS_NIC``, NCCL's environment-variable docs), so the next node is
        walked backwards, from that GPU down to the c-th. With an odd node count the last hop back
        to the first node cannot match, and crosses rails as any other mismatched pair routes."""
        nodes = self._node_groups(ranks)
        if nodes is None or len(nodes) < 2 or len(nodes[0]) < 2:
            return [ranks]
        k = len(nodes[0])
        grid = np.array(nodes, dtype=np.int64)
        backwards = grid[:, ::-1]
        rings = []
        for c in range(k):
            rows = np.where((np.arange(len(nodes)) % 2 == 1)[:, None],
                            np.roll(backwards, -(k - c) % k, axis=1), np.roll(grid, -c, axis=1))
            rings.append(rows.ravel().tolist())
        return rings

    def _rings_phase(self, op: str, rings: list[list[int]], per_step: float, steps: int) -> Phase:
        rings = [r for r in rings if len(r) > 1]
        return [self.ring_spec(op, r, per_step, steps, len(rings)) for r in rings if steps > 0]

    def phases(self, op: str, ranks: Sequence[int], size: float) -> list[Phase]:
        """The phases of ``op`` over one group (see the module docstring for the algorithms)."""
        return self.algorithm_and_phases(op, ranks, size)[1]

    def algorithm_and_phases(self, op: str, ranks: Sequence[int], size: float) -> tuple[str, list[Phase]]:
        """(the algorithm that runs: direct, nvls, sharp, ring or hierarchical; its phases) for
        ``op`` over one group: the asked algorithm where it can run, else the ring."""
        if op == "send_recv":
            a, b = ranks[0], ranks[-1]
            return "direct", [] if a == b else [[Spec(((a, b),), size, self.cluster.route_latency(a, b))]]
        ranks = sorted(ranks)
        n = len(ranks)
        if n < 2:
            return "direct", []
        if op == "all_to_all":
            pairs = tuple((a, b) for a in ranks for b in ranks if a != b)
            return "direct", [[Spec(pairs, size / n, max(self._latencies(pairs)))]]
        if op == "broadcast":
            pairs = tuple(zip(ranks, ranks[1:]))
            return "direct", [[Spec(pairs, size, sum(self._latencies(pairs)))]]
        steps = {"all_reduce": 2 * (n - 1), "reduce_scatter": n - 1, "all_gather": n - 1}[op]
        nvls = self.nvls_spec(op, ranks, size)
        if nvls is not None:
            return "nvls", [[nvls]]
        if op == "all_reduce" and self.algorithm == "sharp":
            sharp = self.sharp_phase(ranks, size)
            if sharp is not None:
                return "sharp", [sharp]
        if self.cluster.node_of(ranks[0]) == self.cluster.node_of(ranks[-1]):  # one node: one ring
            return "ring", [[self.ring_spec(op, ranks, size / 1 / n, steps)]]
        h = self._hierarchy(ranks)
        if h is None:
            rings = self.channel_rings(ranks)
            return "ring", [self._rings_phase(op, rings, size / len(rings) / n, steps)]
        nodes, rails = h
        k, m = len(nodes[0]), len(nodes)
        intra = self._rings_phase("reduce_scatter", nodes, size / k, k - 1)
        if op == "all_reduce":
            return "hierarchical", [intra, self._rings_phase(op, rails, size / k / m, 2 * (m - 1)), intra]
        inter = self._rings_phase(op, rails, size / k / m, m - 1)
        return "hierarchical", [intra, inter] if op == "reduce_scatter" else [inter, intra]

    def _latencies(self, pairs) -> list[float]:
        """``route_latency`` of each (src, dst) pair, computed for all of them at once."""
        flat = np.fromiter((r for pair in pairs for r in pair), dtype=np.int64, count=2 * len(pairs))
        return self.cluster.route_latencies(flat[0::2], flat[1::2]).tolist()

    def _send_recv_phases(self, groups, size: float) -> list[list[Phase]]:
        """``phases("send_recv", g, size)`` of many pairs at once (a folded stage sends thousands)."""
        ends = [(g[0], g[-1]) for g in groups]
        moving = [e for e in ends if e[0] != e[1]]
        lat = iter(self._latencies(moving)) if moving else iter(())
        return [[] if a == b else [[Spec(((a, b),), size, next(lat))]] for a, b in ends]

    def _prepare_send_recv(self, groups, size: float):
        """``prepare("send_recv", groups, size, merge=True)`` straight from arrays: every moving
        pair is one member of a single merged transfer (what ``_merged`` makes of the per-pair
        specs, without building one Spec per pair: a folded stage of a 100K-GPU job sends
        thousands). The per-group phases are built only if someone iterates them."""
        ends = np.array([(g[0], g[-1]) for g in groups], dtype=np.int64).reshape(-1, 2)
        moving = ends[ends[:, 0] != ends[:, 1]]
        if not len(moving):
            return [], []
        src, dst = moving[:, 0], moving[:, 1]
        latency = max(self.cluster.route_latencies(src, dst).tolist())
        links, mult = _link_counts(self.cluster.route_links(src, dst), self.cluster.num_links)
        merged = [[(self.net.template(links, mult.astype(float)), size, latency, len(src))]]
        return merged, _LazyPhases(lambda: [ph for ph in self._send_recv_phases(groups, size) if ph])

    def _edge_src_dst(self, specs: list[Spec]) -> tuple[np.ndarray, np.ndarray]:
        """The (src, dst) arrays of all the specs' edges; rings reuse the arrays they were routed with."""
        parts, loose = [], []
        for s in specs:
            hit = self._edge_arrays.get(id(s.edges))
            if hit is not None and hit[0] is s.edges:
                if loose:
                    parts.append(self._pairs_array(loose))
                    loose = []
                parts.append((hit[1], hit[2]))
            else:
                loose.extend(s.edges)
        if loose or not parts:
            parts.append(self._pairs_array(loose))
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    @staticmethod
    def _pairs_array(pairs) -> tuple[np.ndarray, np.ndarray]:
        flat = np.fromiter((r for pair in pairs for r in pair), dtype=np.int64, count=2 * len(pairs))
        return flat[0::2], flat[1::2]

    def _merged(self, per_group: list[list[Phase]], merge: bool) -> list[list[tuple]] | None:
        """Phases as lists of (network template, size, latency, members), one entry per transfer.

        With ``merge`` the specs at the same position of every group become one transfer, if all
        groups have the same shape and sizes (else None: run the groups separately)."""
        shapes = {tuple(len(ph) for ph in g) for g in per_group}
        if len(per_group) > 1 and not (merge and len(shapes) == 1):
            return None
        out = []
        for i in range(len(per_group[0])):
            transfers = []
            for j in range(len(per_group[0][i])):
                specs = [g[i][j] for g in per_group]
                if len({s.size for s in specs}) > 1:
                    return None
                src, dst = self._edge_src_dst(specs)
                count = len(src)
                links, mult = _link_counts(self.cluster.route_links(src, dst), self.cluster.num_links)
                transfers.append((self.net.template(links, mult.astype(float)), specs[0].size,
                                  max(s.latency for s in specs), count))
            out.append(transfers)
        return out

    def prepare(self, op: str, groups: Sequence[Sequence[int]], size: float, merge: bool, calls: float = 1.0):
        """The planned transfers of ``op`` over ``groups`` (cached: steps repeat the same collectives).

        ``calls`` > 1: the collective is that many calls of ``size / calls`` back to back on one
        stream (a stack that fetches each module's parameters with its own call, DeepSpeed ZeRO-3):
        each call in the protocol fastest for its own size, so the transfer carries ``calls`` times
        one call's bytes and latency."""
        fast = (op, id(groups), size, merge, calls)  # the engine passes the same tuple object every time
        hit = self._by_id.get(fast)
        if hit is not None and hit[0] is groups:
            return hit[1]
        key = (op, groups if isinstance(groups, tuple) else tuple(tuple(g) for g in groups), size, merge, calls)
        hit = self._prepared.get(key)
        if hit is None:
            if op == "send_recv" and merge and calls == 1:
                hit = self._prepare_send_recv(groups, size)
                self._prepared[key] = hit
                self._by_id[fast] = (groups, hit)
                return hit
            if op == "send_recv":
                per_group = [ph for ph in self._send_recv_phases(groups, size / calls) if ph]
            else:
                self._prefetch(op, groups)
                per_group = [ph for ph in (self.phases(op, list(g), size / calls) for g in groups) if ph]
            if calls != 1:
                per_group = [[[Spec(sp.edges, sp.size * calls, sp.latency * calls) for sp in ph] for ph in g]
                             for g in per_group]
            merged = self._merged(per_group, merge) if per_group else []
            hit = (merged, per_group)
            self._prepared[key] = hit
        self._by_id[fast] = (groups, hit)  # holds ``groups``, so its id is not reused
        return hit

    def execute(self, per_group: list[list[Phase]], merge: bool = False, label=None) -> Generator:
        """Run the phases of several groups together; each phase waits for all of its transfers."""
        per_group = [g for g in per_group if g]
        if not per_group:
            return
        if len(per_group) == 1:
            # one group of several run apart (``_run_merged`` without a merge): its transfers' routes
            # and templates, found once per group rather than at every call (a prepared collective's
            # phases are the same list objects at every call, held here so their ids stay theirs)
            g = per_group[0]
            hit = self._alone.get(id(g))
            if hit is None or hit[0] is not g:
                hit = self._alone[id(g)] = (g, self._merged(per_group, merge))
            merged = hit[1]
        else:
            merged = self._merged(per_group, merge)
        yield from self._run_merged(merged, per_group, label)

    def _run_merged(self, merged, per_group, label) -> Generator:
        if merged is None:
            yield self.env.all_of([self.env.process(self.execute([g], False, label)) for g in per_group])
            return
        for transfers in merged:
            events = [self.net.transfer_template(tpl, size, lat, label, members)
                      for tpl, size, lat, members in transfers]
            if events:
                yield self.env.all_of(events)

    def run_groups(self, op: str, groups: Sequence[Sequence[int]], size: float, merge: bool = False,
                   label=None, calls: float = 1.0) -> Generator:
        """One op over several groups at once (for example every TP group of a pipeline stage)."""
        merged, per_group = self.prepare(op, groups, size, merge, calls)
        if per_group:
            yield from self._run_merged(merged, per_group, label)

    def start(self, op: str, groups: Sequence[Sequence[int]], size: float, merge: bool = False,
              label=None, done: simpy.Event | None = None, calls: float = 1.0) -> simpy.Event:
        """Start ``op`` over ``groups``; the event fires when every group is done. A one-phase op
        of one transfer returns the network's own event, with no process around it (most
        collectives of a step). ``done``: the event to fire (the network fires it itself when it
        can), for a caller that handed it out before the collective could start; ``calls``: see
        ``prepare``."""
        merged, per_group = self.prepare(op, groups, size, merge, calls)
        if not per_group:
            done = done or self.env.event()
            done.succeed()
            return done
        if merged is not None and len(merged) == 1:
            if len(merged[0]) == 1:
                tpl, sz, lat, members = merged[0][0]
                return self.net.transfer_template(tpl, sz, lat, label, members, done)
            events = [self.net.transfer_template(tpl, sz, lat, label, members)
                      for tpl, sz, lat, members in merged[0]]
            ev = self.env.all_of(events)
        else:
            ev = self.env.process(self._run_merged(merged, per_group, label))
        if done is None:
            return ev
        ev.callbacks.append(lambda _e: done.succeed())
        return done

    def run(self, op: str, ranks: Sequence[int], size: float, label=None, calls: float = 1.0) -> Generator:
        yield from self.run_groups(op, [ranks], size, False, label, calls)

    def all_reduce(self, ranks: Sequence[int], size: float, label=None) -> Generator:
        return self.run("all_reduce", ranks, size, label)

    def reduce_scatter(self, ranks: Sequence[int], size: float, label=None) -> Generator:
        return self.run("reduce_scatter", ranks, size, label)

    def all_gather(self, ranks: Sequence[int], size: float, label=None) -> Generator:
        return self.run("all_gather", ranks, size, label)

    def all_to_all(self, ranks: Sequence[int], size: float, label=None) -> Generator:
        return self.run("all_to_all", ranks, size, label)

    def broadcast(self, ranks: Sequence[int], size: float, label=None) -> Generator:
        """Pipelined chain from the lowest rank."""
        return self.run("broadcast", ranks, size, label)

    def send_recv(self, src: int, dst: int, size: float, label=None) -> Generator:
        return self.run("send_recv", [src, dst], size, label)


# Closed forms (alpha-beta), the test oracles. alpha: latency per step; bw: bytes/s per rank link.

def ring_all_reduce_time(n: int, size: float, bw: float, alpha: float) -> float:
    """2(n-1) alpha + 2(n-1)/n size / bw (Patarasuk and Yuan 2009)."""
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * size / bw


def ring_gather_time(n: int, size: float, bw: float, alpha: float) -> float:
    """reduce_scatter or all_gather of a full buffer ``size``: (n-1) alpha + (n-1)/n size / bw."""
    return (n - 1) * alpha + (n - 1) / n * size / bw


def nccl_ring_time(op: str, n: int, size: float, bw: float, inter_fraction: float = 0.0) -> float:
    """A ring ``op`` (all_reduce, reduce_scatter, all_gather) of ``size`` over ``n`` ranks on
    links of ``bw`` in the NCCL protocol :func:`simulator.network.nccl.choose` picks: base latency plus
    the alpha-beta ring with the protocol's per-step latency and efficiency."""
    steps = 2 * (n - 1) if op == "all_reduce" else n - 1
    proto, eff = nccl.choose(op, steps / n * size, steps, bw, inter_fraction)
    alpha = nccl.step_latency(proto, inter_fraction)
    ring = ring_all_reduce_time if op == "all_reduce" else ring_gather_time
    return proto.base_s + ring(n, size / eff, bw, alpha)


def nvls_time(op: str, n: int, size: float, bw: float, generation: int) -> float:
    """An uncontended NVLS ``op`` inside one NVSwitch domain: 25 us + the bytes NCCL's model charges
    each GPU's NVLink (:func:`simulator.network.nccl.nvls_wire_bytes`) at its NVLS efficiency."""
    return nccl.nvls_time(op, n, size, bw, generation)


def hierarchical_all_reduce_time(k: int, m: int, size: float, bw_intra: float, bw_inter: float) -> float:
    """Intra-node reduce-scatter + inter-node ring all-reduce of size/k + intra-node all-gather,
    each an NCCL ring call (:func:`nccl_ring_time`)."""
    intra = nccl_ring_time("reduce_scatter", k, size, bw_intra) if k > 1 else 0.0
    inter = nccl_ring_time("all_reduce", m, size / k, bw_inter, 1.0) if m > 1 else 0.0
    return 2 * intra + inter


def all_to_all_time(n: int, size: float, bw: float, alpha: float) -> float:
    """Every rank sends (n-1)/n of its buffer through its own link: alpha + (n-1)/n size / bw."""
    return alpha + (n - 1) / n * size / bw


def broadcast_time(n: int, size: float, bw: float, alpha: float) -> float:
    """Pipelined chain: (n-1) alpha + size / bw."""
    return (n - 1) * alpha + size / bw


def algorithm_used(cluster: Cluster, op: str, ranks: Sequence[int], size: float, algorithm: str = "auto") -> str:
    """What ``algorithm`` runs for one ``op`` over ``ranks`` (``Collectives.algorithm_and_phases``)."""
    env = simpy.Environment()
    coll = Collectives(env, Network(env, cluster.link_bw), cluster, algorithm)
    return coll.algorithm_and_phases(op, list(ranks), size)[0]


def time_collective(cluster: Cluster, op: str, ranks: Sequence[int], size: float,
                    algorithm: str = "auto", calls: float = 1.0) -> tuple[float, Network]:
    """Simulate one collective alone on an idle cluster (as ``calls`` calls back to back,
    ``Collectives.prepare``): (time in s, the network after it)."""
    env = simpy.Environment()
    net = Network(env, cluster.link_bw)
    coll = Collectives(env, net, cluster, algorithm)
    env.process(coll.run(op, list(ranks), size, calls=calls))
    env.run()
    return env.now, net
