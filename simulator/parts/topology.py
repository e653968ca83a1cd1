"""Topology files: one node type and one fabric, as data (``simulator/data/topologies/*.yaml``, or a
file of the user's), and which links of such a fabric belong to which node.

``load_topology`` reads and checks a file; ``simulator.network.cluster.build_cluster`` scales it to
a scenario's node count. Fabric structure (fat tree, Leiserson 1985; NVIDIA DGX SuperPOD reference
architectures):
- A leaf switch serves ``nodes_per_leaf`` nodes. Rail-optimized: one leaf per rail, NIC ``j`` of
  each of those nodes on leaf/rail ``j``; otherwise all NICs of those nodes on one leaf.
- A leaf with D down ports has ``U = ceil(D / oversubscription)`` uplinks, one to each of the U
  spines of its pod. A pod has ``leaves_per_pod`` leaves.
- With more than one pod (three tiers) spine ``j`` of every pod connects to the core group ``j``
  of ``C = ceil(leaves_per_pod / core_oversubscription)`` core switches.

Which links a link-fault entry ``{node: N, link_class: C, index: i}`` means, in the order ``index``
counts them (every one of them when ``index`` is left out; each physical link is both of its
directed edges), ``node_links``:

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
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, fields, replace
from pathlib import Path

from simulator.common import limits, resources
from simulator.common.errors import ConfigError, key_text
from simulator.common.yamlfile import load_yaml_text, read_text_file
from simulator.parts.gpus import get_gpu


LINK_CLASSES = ("nvlink", "pcie", "nic", "leaf-spine", "spine-core")



@dataclass(frozen=True)
class TopologySpec:
    """One node type and one fabric, in the units of the topology file."""

    name: str
    gpus_per_node: int = 8
    gpu: str = "H100-SXM5-80GB"
    nvlink_bandwidth_GBps: float = 450.0
    nvlink_latency_us: float = 0.8
    nics_per_node: int = 8
    network_bandwidth_Gbps: float = 400.0
    pcie_bandwidth_GBps: float = 64.0
    pcie_latency_us: float = 0.5
    nic_latency_us: float = 1.0
    switch_latency_us: float = 0.6
    fabric_link_bandwidth_Gbps: float | None = None  # switch-to-switch links; default: the NIC rate
    rail_optimized: bool = True
    nodes_per_leaf: int = 32
    leaves_per_pod: int = 64
    oversubscription: float = 1.0
    core_oversubscription: float = 1.0
    nvls: bool = False  # NVSwitch gen 3+ in the node: NVLink SHARP (NCCL's NVLS algorithm) inside the node
    sharp: bool = False  # SHARP-capable fabric switches: NCCL's NVLS+SHARP all_reduce (algorithm: sharp)
    description: str = ""
    source: str = ""



_POSITIVE_FIELDS = (
    "gpus_per_node", "nvlink_bandwidth_GBps", "nics_per_node", "network_bandwidth_Gbps",
    "pcie_bandwidth_GBps", "nodes_per_leaf", "leaves_per_pod",
)



_NONNEGATIVE_FIELDS = ("nvlink_latency_us", "pcie_latency_us", "nic_latency_us", "switch_latency_us")
# the bounds of the scenario keys that override these fields, and of the cluster a node count can
# reach: past them a topology file built graphs of 10^12 links or ran without end
_MAXIMA = {"gpus_per_node": limits.GPUS_PER_NODE, "nics_per_node": limits.GPUS_PER_NODE,
           "nodes_per_leaf": limits.FABRIC_FANOUT, "leaves_per_pod": limits.FABRIC_FANOUT,
           "nvlink_bandwidth_GBps": limits.NVLINK_GBPS, "pcie_bandwidth_GBps": limits.NVLINK_GBPS,
           "network_bandwidth_Gbps": limits.NETWORK_GBPS, "fabric_link_bandwidth_Gbps": limits.NETWORK_GBPS,
           "oversubscription": limits.OVERSUBSCRIPTION, "core_oversubscription": limits.OVERSUBSCRIPTION}



def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_spec(spec: TopologySpec, where: str) -> TopologySpec:
    for name in _POSITIVE_FIELDS:
        value = getattr(spec, name)
        if not _finite(value) or value <= 0:
            raise ConfigError(f"{where}{name}", value, "must be a positive number")
    for name in _NONNEGATIVE_FIELDS:
        value = getattr(spec, name)
        if not _finite(value) or value < 0:
            raise ConfigError(f"{where}{name}", value, "must be a number >= 0")
    for name in ("oversubscription", "core_oversubscription"):
        value = getattr(spec, name)
        if not _finite(value) or value < 1:
            raise ConfigError(f"{where}{name}", value, "must be a ratio >= 1 (1 = full bisection)")
    for name in ("nvls", "sharp", "rail_optimized"):
        if not isinstance(getattr(spec, name), bool):
            raise ConfigError(f"{where}{name}", getattr(spec, name), "must be true or false")
    fab = spec.fabric_link_bandwidth_Gbps
    if fab is not None and (not _finite(fab) or fab <= 0):
        raise ConfigError(f"{where}fabric_link_bandwidth_Gbps", fab, "must be a positive number or null")
    for name in ("gpus_per_node", "nics_per_node", "nodes_per_leaf", "leaves_per_pod"):
        if int(getattr(spec, name)) != getattr(spec, name):
            raise ConfigError(f"{where}{name}", getattr(spec, name), "must be a whole number")
    for name, limit in _MAXIMA.items():
        value = getattr(spec, name)
        if value is not None and value > limit.maximum:
            raise ConfigError(f"{where}{name}", value, f"must be {limit.describe()}")
    if spec.gpus_per_node % spec.nics_per_node:
        raise ConfigError(f"{where}nics_per_node", spec.nics_per_node,
                          f"must divide gpus_per_node ({spec.gpus_per_node})")
    return spec



def load_topology(name_or_path: str) -> TopologySpec:
    """A shipped topology by name (``dgx-h100``) or a YAML file by path."""
    path = Path(name_or_path)
    if name_or_path in resources.names("topologies"):
        shipped = resources.entry("topologies", name_or_path)
        return _spec_from_text(shipped.read_text(), str(shipped), name_or_path)
    if not os.path.lexists(path):
        raise ConfigError("cluster.topology", name_or_path,
                          f"valid: a topology file path or one of {', '.join(resources.names('topologies'))}")
    # a FIFO, device or folder is named by the reader rather than taken for a missing name
    return _spec_from_text(read_text_file(path, "cluster.topology"), str(path), path.name.rsplit(".", 1)[0])



@functools.lru_cache(maxsize=32)
def _spec_from_text(text: str, where: str, stem: str) -> TopologySpec:
    """The checked spec of a topology file's text; cached because the planner validates
    thousands of layouts of one scenario and each ``validate_plan`` loads the topology (the
    spec is frozen, and an edited file has new text, so the cache never serves stale data)."""
    raw = load_yaml_text(text, "cluster.topology", where)
    if not isinstance(raw, dict):
        raise ConfigError("cluster.topology", where, "must be a YAML mapping of topology fields")
    known = {f.name for f in fields(TopologySpec)}
    for key in raw:
        if key not in known:
            raise ConfigError(f"topology.{key_text(key)}", raw[key], f"unknown field; valid: {', '.join(sorted(known))}")
    raw.setdefault("name", stem)
    return check_spec(TopologySpec(**raw), "topology.")



def pod_geometry(spec: TopologySpec, num_nodes: int):
    rails = spec.nics_per_node if spec.rail_optimized else 1
    groups = math.ceil(num_nodes / spec.nodes_per_leaf)
    down = spec.nodes_per_leaf * (1 if spec.rail_optimized else spec.nics_per_node)
    uplinks = max(1, math.ceil(down / spec.oversubscription - 1e-9))
    groups_per_pod = max(1, spec.leaves_per_pod // rails)
    pods = math.ceil(groups / groups_per_pod)
    leaves_in_pod = groups_per_pod * rails
    cores = max(1, math.ceil(leaves_in_pod / spec.core_oversubscription - 1e-9))
    return rails, groups, uplinks, groups_per_pod, pods, cores



def nvlink_efficiency(gpu: str) -> float:
    try:
        return get_gpu(gpu).nvlink_efficiency
    except ConfigError:
        return 1.0



def nvlink_generation(gpu: str) -> int:
    try:
        return get_gpu(gpu).nvlink_generation
    except ConfigError:
        return 0



def nvlink_GBps(spec: TopologySpec, gpu: str | None = None, override: float | None = None) -> float:
    """The nominal NVLink rate (GB/s per direction) of a node of ``spec`` holding ``gpu``: the
    scenario's ``override``, else the GPU's own rate when it is not the GPU the topology was built
    for, else the topology's. NVLink ports belong to the GPU, so an H800 or A800 in a DGX-H100 or
    DGX-A100 node runs at its own 400 GB/s bidirectional (``hardware.GPU_CATALOG``), not the
    topology's H100 / A100 rate; the topology's rate stands for its own GPU, a GPU the catalog
    lacks, or a topology whose NVLink rate is not its GPU's (a file that sets its own links)."""
    if override is not None:
        return override
    try:
        own, built_for = get_gpu(gpu), get_gpu(spec.gpu)
    except ConfigError:
        return spec.nvlink_bandwidth_GBps
    if own is built_for or not math.isclose(spec.nvlink_bandwidth_GBps * 1e9, built_for.nvlink_bandwidth_Bps):
        return spec.nvlink_bandwidth_GBps
    return own.nvlink_bandwidth_Bps / 1e9


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
    rails, _, _, groups_per_pod, _, _ = pod_geometry(spec, num_nodes)
    group = node // spec.nodes_per_leaf
    pod = group // groups_per_pod
    return [(pod, (group % groups_per_pod) * rails + r) for r in range(rails)]



def node_links(spec: TopologySpec, num_nodes: int, node: int, link_class: str) -> list[tuple[str, str]]:
    """The physical links of ``link_class`` that belong to ``node``, in ``index`` order (module
    docstring), each as one direction's (from, to) names; empty when the cluster has none."""
    g, nics = spec.gpus_per_node, spec.nics_per_node
    rails, groups, uplinks, groups_per_pod, pods, cores = pod_geometry(spec, num_nodes)
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
