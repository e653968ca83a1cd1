"""The vectorized routes (``Cluster.route_table``, no node names) against the named paths."""

import numpy as np
import pytest

from simulator.common import resources
from simulator.network.cluster import build_cluster, path_nodes
from simulator.parts.topology import load_topology

SHIPPED = list(resources.names("topologies"))


def _named(c, a, b):
    names = path_nodes(c, a, b)
    return [c._edge_id[e] for e in zip(names, names[1:])]


@pytest.mark.parametrize("name", SHIPPED)
@pytest.mark.parametrize("nodes", [1, 3, 40, 300])
def test_route_table_is_the_named_path(name, nodes):
    spec = load_topology(name)
    if nodes * spec.gpus_per_node > 20000:
        nodes = 20000 // spec.gpus_per_node
    c = build_cluster(spec, nodes)
    rng = np.random.default_rng(nodes)
    n = c.num_gpus
    src = rng.integers(0, n, 3000)
    dst = rng.integers(0, n, 3000)
    # and pairs on the same node, same leaf group, same local index
    src = np.concatenate([src, np.arange(min(n, 200))])
    dst = np.concatenate([dst, (np.arange(min(n, 200)) * 7 + 1) % n])
    keep = src != dst
    src, dst = src[keep], dst[keep]
    table = c.route_table(src, dst)
    for a, b, row in zip(src.tolist(), dst.tolist(), table):
        assert row[row >= 0].tolist() == _named(c, a, b)
    lat = c.route_latencies(src, dst)
    assert lat.tolist() == [float(c.link_lat[_named(c, a, b)].sum()) for a, b in zip(src.tolist(), dst.tolist())]


@pytest.mark.parametrize("name", SHIPPED)
def test_link_arrays_match_the_named_graph(name):
    c = build_cluster(load_topology(name), 70)
    g = c.graph
    assert g.number_of_edges() == c.num_links
    def kind(a, b):  # the class the names say, independently of the arrays
        ends = {x.split(".")[-1].rstrip("0123456789") if not x.startswith("core") else "core" for x in (a, b)}
        return {frozenset({"g", "nvs"}): "nvlink", frozenset({"g", "nic"}): "pcie", frozenset({"nic", "leaf"}): "nic",
                frozenset({"leaf", "spine"}): "leaf-spine", frozenset({"spine", "core"}): "spine-core"}[frozenset(ends)]

    spec = c.spec
    for i, (a, b) in enumerate(c.link_ends):
        k = kind(a, b)
        assert c.link_cls[i] == g[a][b]["cls"] == k
        lat = {"nvlink": spec.nvlink_latency_us, "pcie": spec.pcie_latency_us, "nic": spec.nic_latency_us}
        assert c.link_lat[i] == pytest.approx(lat.get(k, spec.switch_latency_us) * 1e-6, rel=1e-12)
