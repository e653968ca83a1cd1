"""The ``faults:`` section: stragglers, degraded links and compute jitter (``config.Faults``;
which links a node owns is :func:`simulator.parts.topology.node_links`)."""

from __future__ import annotations

from dataclasses import asdict

from simulator.common.errors import ConfigError, LeftOut, key_text
from simulator.parts.topology import effective_spec, load_topology, node_links
from simulator.scenario.config import LINK_CLASSES, ClusterConfig, Faults, LinkFault, Straggler
from simulator.common.schema import keys_of, whole


FAULTS = "faults"
FAULT_KEYS = tuple(keys_of(Faults))
STRAGGLER_KEYS = tuple(sorted(keys_of(Straggler)))
LINK_FAULT_KEYS = tuple(sorted(keys_of(LinkFault)))


def _entries(field: str, value: object, shape: str) -> list:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ConfigError(field, value, f"must be a list of mappings {shape}")
    return value


def _keys(field: str, entry: dict, valid: tuple[str, ...]) -> None:
    for key in entry:
        if key not in valid:
            raise ConfigError(f"{field}.{key_text(key)}", entry[key], f"unknown key; valid: {', '.join(valid)}")


def faults_section(raw: object, cluster: ClusterConfig) -> Faults:
    """The checked ``faults:`` section; ranks, nodes and links must exist in ``cluster``."""
    if raw is None:
        return Faults()
    if not isinstance(raw, dict):
        raise ConfigError(FAULTS, raw, f"must be a mapping; valid keys: {', '.join(FAULT_KEYS)}")
    _keys(FAULTS, raw, FAULT_KEYS)
    gpus, nodes = cluster.num_gpus, cluster.num_nodes
    stragglers = []
    for i, entry in enumerate(_entries("faults.stragglers", raw.get("stragglers"),
                                       "{rank: R} or {node: N}, each with compute_slowdown")):
        f = f"faults.stragglers[{i}]"
        _keys(f, entry, STRAGGLER_KEYS)
        if ("rank" in entry) == ("node" in entry):
            raise ConfigError(f, entry, "give exactly one of rank or node")
        rank = node = None
        if "rank" in entry:
            rank = whole(f"{f}.rank", entry["rank"], 0)
            if rank >= gpus:
                raise ConfigError(f"{f}.rank", rank, f"must be a rank from 0 to {gpus - 1} (the cluster has {gpus} GPUs)")
        else:
            node = whole(f"{f}.node", entry["node"], 0)
            if node >= nodes:
                raise ConfigError(f"{f}.node", node, f"must be a node from 0 to {nodes - 1} (the cluster has {_nodes(nodes)})")
        slowdown = _kind(Straggler, "compute_slowdown").check(f"{f}.compute_slowdown", entry.get("compute_slowdown"))
        stragglers.append(Straggler(compute_slowdown=slowdown, rank=rank, node=node))
    links = []
    raw_links = _entries("faults.links", raw.get("links"),
                         "{node: N, link_class: C, bandwidth_fraction: f} (optional index)")
    spec = effective_spec(load_topology(cluster.topology), cluster.gpus_per_node, cluster.oversubscription) \
        if raw_links else None
    for i, entry in enumerate(raw_links):
        f = f"faults.links[{i}]"
        _keys(f, entry, LINK_FAULT_KEYS)
        for key in ("node", "link_class", "bandwidth_fraction"):
            if key not in entry:
                raise ConfigError(f"{f}.{key}", LeftOut(), "required")
        node = whole(f"{f}.node", entry["node"], 0)
        if node >= nodes:
            raise ConfigError(f"{f}.node", node, f"must be a node from 0 to {nodes - 1} (the cluster has {_nodes(nodes)})")
        cls = _kind(LinkFault, "link_class").check(f"{f}.link_class", entry["link_class"])
        owned = node_links(spec, nodes, node, cls)
        if not owned:
            present = [c for c in LINK_CLASSES if node_links(spec, nodes, node, c)]
            raise ConfigError(f"{f}.link_class", cls, f"this cluster ({spec.name}, {_nodes(nodes)}) has no {cls} "
                              f"links; valid here: {', '.join(present)}")
        index = entry.get("index")
        if index is not None:
            index = whole(f"{f}.index", index, 0)
            if index >= len(owned):
                raise ConfigError(f"{f}.index", index, f"node {node} has {len(owned)} {cls} links: "
                                  f"give 0 to {len(owned) - 1}, or leave index out for all of them")
        fraction = _kind(LinkFault, "bandwidth_fraction").check(f"{f}.bandwidth_fraction", entry["bandwidth_fraction"])
        links.append(LinkFault(node=node, link_class=cls, bandwidth_fraction=fraction, index=index))
    cv = _kind(Faults, "compute_jitter_cv").check("faults.compute_jitter_cv", raw.get("compute_jitter_cv", 0.0))
    seed = whole("faults.seed", raw.get("seed", 0), 0)
    if seed >= 2**64:
        raise ConfigError("faults.seed", seed, "must be a whole number from 0 to 2**64 - 1")
    spread = _kind(Faults, "gpu_speed_cv").check("faults.gpu_speed_cv", raw.get("gpu_speed_cv", 0.0))
    return Faults(stragglers=tuple(stragglers), links=tuple(links), compute_jitter_cv=cv, gpu_speed_cv=spread,
                  seed=seed)


def _kind(cls: type, name: str):
    return keys_of(cls)[name].kind


def _nodes(n: int) -> str:
    return f"{n} node" if n == 1 else f"{n} nodes"


def faults_to_dict(f: Faults) -> dict:
    """``f`` as the YAML mapping it was read from (left-out keys stay out)."""
    return {
        "stragglers": [{k: v for k, v in asdict(x).items() if v is not None} for x in f.stragglers],
        "links": [{k: v for k, v in asdict(x).items() if v is not None} for x in f.links],
        "compute_jitter_cv": f.compute_jitter_cv,
        **({"gpu_speed_cv": f.gpu_speed_cv} if f.gpu_speed_cv else {}),  # older files stay as they were
        "seed": f.seed,
    }
