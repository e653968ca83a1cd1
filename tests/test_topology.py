"""Topology files, graph construction, validation and deterministic routing."""

import networkx as nx
import pytest

from simulator.common.errors import ConfigError
from simulator.common import resources
from simulator.network.cluster import build_cluster, route_nodes
from simulator.parts.topology import load_topology

SHIPPED = list(resources.names("topologies"))


def test_the_four_named_topologies_ship():
    assert {"dgx-a100", "dgx-h100", "omnipath-a100", "llama3-roce"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
@pytest.mark.parametrize("nodes", [1, 2, 5, 40])
def test_every_topology_scales_and_every_gpu_reaches_every_other(name, nodes):
    spec = load_topology(name)
    assert spec.source, "each topology cites where its numbers come from"
    c = build_cluster(spec, nodes)
    assert c.num_gpus == nodes * spec.gpus_per_node
    assert nx.is_strongly_connected(c.graph)
    assert (c.link_bw > 0).all() and (c.link_lat >= 0).all()
    last = c.num_gpus - 1
    for a, b in [(0, last), (last, 0), (0, 1)]:
        if a != b:
            route = c.route(a, b)
            assert len(route) >= 2
            names = route_nodes(c, a, b)
            assert names[0] == c.gpu_name(a) and names[-1] == c.gpu_name(b)


def test_worked_routing_example_from_the_docstring():
    c = build_cluster(load_topology("dgx-h100"), 64)
    assert route_nodes(c, 3, 323) == ["n0.g3", "n0.nic3", "pod0.leaf3", "pod0.spine8",
                                      "pod0.leaf11", "n40.nic3", "n40.g3"]


def test_intra_node_route_goes_through_the_nvswitch_at_nvlink_rate():
    c = build_cluster(load_topology("dgx-a100"), 2)
    route = c.route(0, 5)
    assert [c.link_cls[e] for e in route] == ["nvlink", "nvlink"]
    assert c.link_bw[route].tolist() == [240e9, 240e9]  # nominal 300 x the A100's NVLink efficiency 0.8
    h = build_cluster(load_topology("dgx-a100"), 1, gpu="H100-SXM5-80GB", nvlink_bandwidth_GBps=300)
    assert h.link_bw[h.route(0, 5)].tolist() == pytest.approx([300e9 * 20.6 / 25] * 2)  # NCCL's rating of an NVLink4 link


@pytest.mark.parametrize("topology, gpu, per_direction_GBps", [
    ("dgx-h100", "H800", 200), ("dgx-a100", "A800", 200), ("dgx-h100", "H200", 450), ("dgx-h100", "H100", 450)])
def test_a_gpu_brings_its_own_nvlink_rate_into_the_topologys_node(topology, gpu, per_direction_GBps):
    """NVLink ports are the GPU's: an H800 (or A800) in a DGX-H100 (DGX-A100) node runs at its 400 GB/s
    bidirectional, not the H100's 900 (A100's 600); an explicit override or a topology file that sets
    its own rate wins."""
    from simulator.parts.gpus import get_gpu

    eff = get_gpu(gpu).nvlink_efficiency
    c = build_cluster(load_topology(topology), 1, gpu=gpu)
    assert c.link_bw[c.route(0, 5)].tolist() == [per_direction_GBps * 1e9 * eff] * 2
    o = build_cluster(load_topology(topology), 1, gpu=gpu, nvlink_bandwidth_GBps=100)
    assert o.link_bw[o.route(0, 5)].tolist() == [100e9 * eff] * 2


def test_a_topology_file_with_its_own_nvlink_rate_keeps_it_for_any_gpu(tmp_path):
    path = tmp_path / "custom.yaml"
    path.write_text("gpu: H100-SXM5-80GB\nnvlink_bandwidth_GBps: 600\n")
    from simulator.parts.gpus import get_gpu

    c = build_cluster(load_topology(str(path)), 1, gpu="H800")
    assert c.link_bw[c.route(0, 5)].tolist() == [600e9 * get_gpu("H800").nvlink_efficiency] * 2


def test_nic_line_rate_and_shared_nics():
    c = build_cluster(load_topology("omnipath-a100"), 2)
    assert c.nic_of(0) == c.nic_of(1) == 0 and c.nic_of(7) == 3
    route = c.route(1, 9)
    nic_links = [e for e in route if c.link_cls[e] == "nic"]
    assert c.link_bw[nic_links].tolist() == [100e9 / 8] * 2


def test_llama3_crosses_the_oversubscribed_core_between_pods():
    c = build_cluster(load_topology("llama3-roce"), 2 * 384)  # two pods of 3,072 GPUs
    route = c.route(0, 384 * 8)
    classes = [c.link_cls[e] for e in route]
    assert classes.count("spine-core") == 2
    spines = {n for n in c.graph if n.startswith("pod0.spine")}
    cores_per_spine = {n for n in c.graph.successors("pod0.spine0") if n.startswith("core")}
    assert len(spines) == 16 and len(cores_per_spine) == 28  # ceil(192 / 7) uplinks to the core


def test_oversubscription_reduces_leaf_uplinks():
    full = build_cluster(load_topology("dgx-h100"), 64)
    half = build_cluster(load_topology("dgx-h100"), 64, oversubscription=2)
    up = lambda c: sum(1 for n in c.graph.successors("pod0.leaf0") if "spine" in n)
    assert (up(full), up(half)) == (32, 16)


def test_routes_are_deterministic_and_cached():
    a = build_cluster(load_topology("dgx-h100"), 16)
    b = build_cluster(load_topology("dgx-h100"), 16)
    assert a.route(3, 100).tolist() == b.route(3, 100).tolist()
    assert a.route(3, 100) is a.route(3, 100)


def test_unknown_topology_name_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="cluster.topology: got 'dgx-z900'; valid: .*dgx-h100"):
        load_topology("dgx-z900")


@pytest.mark.parametrize("text, field", [
    ("nvlink_bandwidth_GBps: -5\n", "topology.nvlink_bandwidth_GBps"),
    ("network_bandwidth_Gbps: 0\n", "topology.network_bandwidth_Gbps"),
    ("oversubscription: 0.5\n", "topology.oversubscription"),
    ("nics_per_node: 3\n", "topology.nics_per_node"),
    ("nvlink_latency_us: -1\n", "topology.nvlink_latency_us"),
    ("bandwith: 4\n", "topology.bandwith"),
    ("[1, 2]\n", "cluster.topology"),
])
def test_bad_topology_file_gets_a_one_line_error_naming_the_field(tmp_path, text, field):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_topology(str(path))
    assert str(err.value).startswith(field) and "\n" not in str(err.value)


def test_the_rails_of_one_node_spread_over_spines_and_cores():
    """Eight rails to one destination node must not share a spine uplink (D is per NIC)."""
    c = build_cluster(load_topology("dgx-a100"), 128)
    paths = [route_nodes(c, 99 * 8 + j, 100 * 8 + j) for j in range(8)]
    uplinks = {(p[2], p[3]) for p in paths}
    core_links = {(p[3], p[4]) for p in paths}
    assert len(uplinks) == 8 and len(core_links) == 8


def test_a_stage_to_stage_shift_uses_every_spine_once():
    """Pipeline sends from the 32 nodes of one leaf to the next leaf group: no two share a link."""
    c = build_cluster(load_topology("dgx-h100"), 64)
    links = [e for n in range(32) for e in c.route(n * 8 + 2, (n + 32) * 8 + 2)]
    assert len(links) == len(set(links))


def test_cross_rail_transfers_cross_nvlink_first_then_stay_on_the_destination_rail():
    from simulator.network.cluster import path_nodes
    c = build_cluster(load_topology("dgx-h100"), 64)
    assert path_nodes(c, 4, 40 * 8) == ["n0.g4", "n0.nvs", "n0.g0", "n0.nic0", "pod0.leaf0", "pod0.spine8",
                                        "pod0.leaf8", "n40.nic0", "n40.g0"]
    assert [c.link_cls[e] for e in c.route(4, 40 * 8)][:3] == ["nvlink", "nvlink", "pcie"]
