"""Collectives on the network model against their closed forms and measured nccl-tests numbers."""

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from simulator.network import collectives as C
from simulator.network.cluster import build_cluster
from simulator.parts.topology import load_topology

VALIDATION = Path(__file__).resolve().parents[2] / "shared" / "validation"
GiB = 2**30
NV_ALPHA = 2 * 0.8e-6  # GPU -> NVSwitch -> GPU, two NVLink hops of dgx-h100
NV = 450e9 * 20.6 / 25  # an H100 NVLink4 link at NCCL's rating of it (GPUSpec.nvlink_efficiency)
NV5 = 900e9 * 40.1 / 50  # a Blackwell NVLink5 link at NCCL's rating of it


@pytest.fixture(scope="module")
def h100_node():
    return build_cluster(load_topology("dgx-h100"), 1)


@pytest.mark.parametrize("size", [2**20, 64 * 2**20, GiB])
def test_uncontended_ring_all_reduce_equals_closed_form(h100_node, size):
    t, _ = C.time_collective(h100_node, "all_reduce", range(8), size, algorithm="ring")
    assert t == pytest.approx(C.nccl_ring_time("all_reduce", 8, size, NV), rel=1e-9)


@pytest.mark.parametrize("op", ["reduce_scatter", "all_gather"])
def test_ring_reduce_scatter_and_all_gather_equal_closed_form(h100_node, op):
    t, _ = C.time_collective(h100_node, op, range(8), GiB)
    assert t == pytest.approx(C.nccl_ring_time(op, 8, GiB, NV), rel=1e-9)
    # a GiB goes in the Simple protocol: full link rate, 8.4 us + 7 x 3.4 us of latency
    assert t == pytest.approx(8.4e-6 + C.ring_gather_time(8, GiB, NV, 3.4e-6), rel=1e-9)


def test_all_to_all_and_broadcast_equal_closed_form(h100_node):
    t, _ = C.time_collective(h100_node, "all_to_all", range(8), GiB)
    assert t == pytest.approx(C.all_to_all_time(8, GiB, NV, NV_ALPHA), rel=1e-9)
    t, _ = C.time_collective(h100_node, "broadcast", range(8), GiB)
    assert t == pytest.approx(C.broadcast_time(8, GiB, NV, NV_ALPHA), rel=1e-9)


def test_ring_bytes_carried_equal_what_the_algorithm_moves(h100_node):
    _, net = C.time_collective(h100_node, "all_reduce", range(8), GiB, algorithm="ring")
    # each GPU sends 2(n-1)/n * S on its NVLink up-link and receives as much on its down-link
    assert net.stats.bytes_carried.sum() == pytest.approx(8 * 2 * 2 * 7 / 8 * GiB)


def _two_nodes(network_Gbps=None):
    return build_cluster(load_topology("dgx-h100"), 2, network_bandwidth_Gbps=network_Gbps)


def test_multi_node_ring_uses_one_channel_per_rank_position_and_matches_closed_form():
    cluster = _two_nodes()
    coll = C.Collectives(None, None, cluster)
    rings = coll.channel_rings(range(16))
    assert len(rings) == 8 and rings[1] == [1, 2, 3, 4, 5, 6, 7, 0, 8, 15, 14, 13, 12, 11, 10, 9]
    for ring in rings:  # every hop between nodes joins GPUs of one local index: one NIC rail
        hops = [(a, b) for a, b in zip(ring, ring[1:] + ring[:1]) if a // 8 != b // 8]
        assert len(hops) == 2 and all(a % 8 == b % 8 for a, b in hops)
    assert len({ring[7] % 8 for ring in rings}) == 8  # and the 8 rings leave the first node on 8 NICs
    t, _ = C.time_collective(cluster, "all_reduce", range(16), 8 * GiB)
    # each of the 8 channel rings carries 1 GiB; 2 of its 16 edges cross nodes over 50 GB/s NICs
    assert t == pytest.approx(C.nccl_ring_time("all_reduce", 16, 8 * GiB / 8, 50e9, 2 / 16), rel=1e-9)


def test_channel_rings_are_planned_once_per_group_whatever_the_rank_order():
    coll = C.Collectives(None, None, _two_nodes())
    first = coll.channel_rings(range(16))
    again = coll.channel_rings(list(reversed(range(16))))
    assert again is first  # memoised by the sorted group: a folded stage asks again for every bucket
    assert again == C.Collectives(None, None, _two_nodes()).channel_rings(range(16))
    assert coll.channel_rings([3, 1]) == [[1, 3]]  # inside one node: the group itself, sorted


def test_halving_inter_node_bandwidth_doubles_the_inter_node_bound_part():
    fast, slow = _two_nodes(400), _two_nodes(200)
    lat = 8.4e-6 + 2 * 15 * (14 / 16 * 3.4e-6 + 2 / 16 * 14e-6)  # Simple protocol, 2 of 16 steps inter-node
    t_fast, _ = C.time_collective(fast, "all_reduce", range(16), 8 * GiB)
    t_slow, _ = C.time_collective(slow, "all_reduce", range(16), 8 * GiB)
    assert (t_slow - lat) == pytest.approx(2 * (t_fast - lat), rel=1e-9)


def test_hierarchical_all_reduce_equals_its_phases_closed_form():
    cluster = _two_nodes()
    t, _ = C.time_collective(cluster, "all_reduce", range(16), GiB, algorithm="hierarchical")
    expected = C.hierarchical_all_reduce_time(8, 2, GiB, NV, 50e9)
    assert t == pytest.approx(expected, rel=1e-9)
    # halving the network slows only the inter-node phase
    slow = _two_nodes(200)
    t_slow, _ = C.time_collective(slow, "all_reduce", range(16), GiB, algorithm="hierarchical")
    inter = C.ring_all_reduce_time(2, GiB / 8, 50e9, 0.0)
    assert t_slow - t == pytest.approx(inter, rel=1e-9)


def test_contention_between_collectives_of_two_groups_on_shared_links():
    """Two 8-GPU all-reduces on the same node share NVLink: each takes about twice as long."""
    import simpy
    from simulator.network.flows import Network
    cluster = build_cluster(load_topology("dgx-h100"), 1)
    env = simpy.Environment()
    coll = C.Collectives(env, Network(env, cluster.link_bw), cluster, "ring")
    env.process(coll.all_reduce(range(8), GiB))
    env.process(coll.all_reduce(range(8), GiB))
    env.run()
    alone = C.ring_all_reduce_time(8, GiB, NV, 0)
    assert env.now == pytest.approx(2 * alone + 8.4e-6 + 14 * 3.4e-6, rel=1e-9)


def _measured(case_id):
    data = yaml.safe_load((VALIDATION / "collectives.yaml").read_text())
    return next(c for c in data["cases"] if c["id"] == case_id)


@pytest.mark.parametrize("size", [GiB, 8 * GiB])
def test_h100_8gpu_all_reduce_busbw_within_10pct_of_nccl_tests(h100_node, size):
    """auto takes NVLS at these sizes: 487 and 490 GB/s against measured 466 and 480; the ring
    alone cannot pass the 450 GB/s link rate (444 and 449)."""
    point = next(p for p in _measured("dgx-h100-8gpu-allreduce")["points"] if p["size_bytes"] == size)
    t, _ = C.time_collective(h100_node, "all_reduce", range(8), size)
    busbw = size / t / 1e9 * C.bus_factor("all_reduce", 8)
    assert busbw == pytest.approx(point["busbw_GBps"], rel=0.10)
    t_ring, _ = C.time_collective(h100_node, "all_reduce", range(8), size, algorithm="ring")
    assert size / t_ring / 1e9 * C.bus_factor("all_reduce", 8) < 450 < busbw


def test_a100_three_nodes_four_hdr_all_reduce_within_15pct_of_measured_band():
    case = _measured("a100-3node-4hdr-allreduce")
    point = case["points"][0]
    spec = replace(load_topology("dgx-a100"), nics_per_node=4)
    cluster = build_cluster(spec, 3)
    t, _ = C.time_collective(cluster, "all_reduce", range(24), point["size_bytes"])
    busbw = point["size_bytes"] / t / 1e9 * C.bus_factor("all_reduce", 24)
    low, high = point["busbw_GBps"], 96.0  # average and peak reported in the issue
    assert 0.85 * low <= busbw <= 1.15 * high


def test_h100_8gpu_all_reduce_within_15pct_of_nccl_tests_at_every_size_but_16_mib(h100_node):
    """NCCL's choice (``auto``), latency-bound to bandwidth-bound: the ring in LL at 8 B (+10%),
    NVLS from 1 MiB (+5%), 128 MiB (-14%) and 1-16 GiB (-2 to -4%). At 16 MiB NCCL's tuning model,
    which ``auto`` follows, prefers NVLS (85 us), but the measured 124 us is the ring's time in
    LL128 (127 us, +2%): a choice the tuner's model gets wrong there, left visible."""
    for p in _measured("dgx-h100-8gpu-allreduce")["points"]:
        algorithm = "ring" if p["size_bytes"] == 16 * 2**20 else "auto"
        t, _ = C.time_collective(h100_node, "all_reduce", range(8), p["size_bytes"], algorithm=algorithm)
        assert t * 1e6 == pytest.approx(p["time_us"], rel=0.15), p["size_bytes"]


def test_a100_8gpu_all_reduce_near_the_reported_200_GBps():
    """NVLink3 at NCCL's 20 of 25 GB/s per link: 238 GB/s busbw at 1 GiB, a user reports about 200."""
    point = _measured("hgx-a100-8gpu-allreduce")["points"][0]
    cluster = build_cluster(load_topology("dgx-a100"), 1)
    t, _ = C.time_collective(cluster, "all_reduce", range(8), point["size_bytes"])
    busbw = point["size_bytes"] / t / 1e9 * C.bus_factor("all_reduce", 8)
    assert busbw == pytest.approx(point["busbw_GBps"], rel=0.20)
    assert busbw < 240  # never above what NCCL's own model allows the A100


# NVLS (NVLink SHARP): closed forms from NCCL's tuning model, choice, and NVLink 5 domains.

@pytest.mark.parametrize("op, size", [("all_reduce", GiB), ("all_reduce", 64 * 2**20), ("all_reduce", 8 * GiB)])
def test_nvls_equals_its_closed_form(h100_node, op, size):
    t, _ = C.time_collective(h100_node, op, range(8), size, algorithm="nvls")
    # NCCL's model: 25 us + S (n+1)/n per GPU link direction at 0.85 x 20.6/25 of 450 GB/s
    assert t == pytest.approx(25e-6 + size * 9 / 8 / (450e9 * 0.85 * 20.6 / 25), rel=1e-9)
    assert t == pytest.approx(C.nvls_time(op, 8, size, NV, 4), rel=1e-9)


def test_nvls_bytes_carried_are_what_the_switch_reduction_moves(h100_node):
    _, net = C.time_collective(h100_node, "all_reduce", range(8), GiB, algorithm="nvls")
    eff = 0.85  # of the links' rate, which is NCCL's rating of them
    # every GPU's up-link and down-link carry S (n+1)/n, inflated by the NVLS efficiency
    assert net.stats.bytes_carried.sum() == pytest.approx(8 * 2 * 9 / 8 * GiB / eff)


def test_auto_takes_ring_ll_for_small_and_nvls_for_large_all_reduce(h100_node):
    for size, expect in ((64 * 2**10, "ring"), (8 * GiB, "nvls")):
        auto, _ = C.time_collective(h100_node, "all_reduce", range(8), size)
        forced, _ = C.time_collective(h100_node, "all_reduce", range(8), size, algorithm=expect)
        assert auto == forced, size
    # NCCL never prefers NVLS for a large 8-GPU all_gather (its model charges (n/(n-1))^2 more)
    auto, _ = C.time_collective(h100_node, "all_gather", range(8), GiB)
    ring, _ = C.time_collective(h100_node, "all_gather", range(8), GiB, algorithm="ring")
    assert auto == ring


def test_nvls_needs_an_nvswitch_generation_3_domain():
    a100 = build_cluster(replace(load_topology("dgx-a100"), nvls=True), 1)  # A100: NVLink 3, no NVLS
    t, _ = C.time_collective(a100, "all_reduce", range(8), GiB, algorithm="nvls")
    ring, _ = C.time_collective(a100, "all_reduce", range(8), GiB, algorithm="ring")
    assert t == ring
    two = build_cluster(load_topology("dgx-h100"), 2)  # across nodes NVLS needs SHARP: ring
    t, _ = C.time_collective(two, "all_reduce", range(16), GiB, algorithm="nvls")
    ring, _ = C.time_collective(two, "all_reduce", range(16), GiB, algorithm="ring")
    assert t == ring


def test_gb200_nvl72_all_reduce_over_72_gpus_is_nvlink5_bound():
    """72 GPUs in one NVLink 5 domain (900 GB/s per direction): NVLS at NCCL's 32 channels,
    2 x 0.74 x 40.1/50 x 900 x 31/33 = 1003 GB/s busbw at 8 GiB; the ring stays under the links'
    722 GB/s (NCCL's rating, 40.1 of 50 GB/s per link)."""
    nvl72 = build_cluster(load_topology("gb200-nvl72"), 1)
    size = 8 * GiB
    t, _ = C.time_collective(nvl72, "all_reduce", range(72), size)
    busbw = size / t / 1e9 * C.bus_factor("all_reduce", 72)
    assert busbw == pytest.approx(2 * 0.74 * 40.1 / 50 * 900 * 31 / 33, rel=0.01)
    ring, _ = C.time_collective(nvl72, "all_reduce", range(72), size, algorithm="ring")
    assert 680 < size / ring / 1e9 * C.bus_factor("all_reduce", 72) < NV5 / 1e9


# NVLS + SHARP (NCCL's NVLS algorithm across nodes with CollNet): closed forms from its tuning model.

@pytest.fixture(scope="module")
def two_b200():
    return build_cluster(load_topology("dgx-b200"), 2)  # nvls and sharp, 8 x 400 Gb/s NICs per node


@pytest.mark.parametrize("size", [2**20, 64 * 2**20, GiB])
def test_sharp_all_reduce_equals_its_closed_form(two_b200, size):
    from simulator.network import nccl

    t, _ = C.time_collective(two_b200, "all_reduce", range(16), size, algorithm="sharp")
    eff = 0.74 * 40.1 / 50
    nvlink = size * 15 * 9 / (16 * 7) / (900e9 * eff)  # NVLS over 8 local GPUs: c = 8 channels
    nic = size * 2 * 15 / 16 / 8 / 50e9                 # each GPU's 400 Gb/s NIC: 2(n-1)/n x S / k
    assert t == pytest.approx(25e-6 + 18e-6 + max(nvlink, nic), rel=1e-9)
    assert t == pytest.approx(nccl.sharp_time(16, 8, size, NV5, 50e9, 5), rel=1e-9)


def test_sharp_bus_bandwidth_is_the_nodes_nic_rate_and_beats_the_ring_at_small_sizes(two_b200):
    size = 4 * GiB
    t, _ = C.time_collective(two_b200, "all_reduce", range(16), size, algorithm="sharp")
    assert size / t / 1e9 * C.bus_factor("all_reduce", 16) == pytest.approx(8 * 50, rel=0.01)
    four = build_cluster(load_topology("dgx-b200"), 4)
    small = 2**20  # latency-bound: 43 us once against the ring's 2(n-1) network steps
    sharp, _ = C.time_collective(four, "all_reduce", range(32), small, algorithm="sharp")
    ring, _ = C.time_collective(four, "all_reduce", range(32), small, algorithm="ring")
    assert sharp < ring


def test_sharp_needs_sharp_switches_and_is_never_nccls_default(two_b200):
    no_sharp = build_cluster(replace(load_topology("dgx-b200"), sharp=False), 2)
    t, _ = C.time_collective(no_sharp, "all_reduce", range(16), GiB, algorithm="sharp")
    ring, _ = C.time_collective(no_sharp, "all_reduce", range(16), GiB, algorithm="ring")
    assert t == ring
    # NCCL runs NVLS across nodes only with CollNet enabled: auto keeps the ring
    auto, _ = C.time_collective(two_b200, "all_reduce", range(16), 2**20)
    ring, _ = C.time_collective(two_b200, "all_reduce", range(16), 2**20, algorithm="ring")
    sharp, _ = C.time_collective(two_b200, "all_reduce", range(16), 2**20, algorithm="sharp")
    assert auto == ring != sharp
    # inside one node it is NVLS
    one, _ = C.time_collective(two_b200, "all_reduce", range(8), GiB, algorithm="sharp")
    nvls, _ = C.time_collective(two_b200, "all_reduce", range(8), GiB, algorithm="nvls")
    assert one == nvls


def test_collective_cli_says_when_the_asked_algorithm_cannot_run():
    """``--algorithm sharp`` for an all_gather or ``nvls`` on A100 fall back to the ring: the header says so."""
    import subprocess
    import sys

    def header(*args):
        r = subprocess.run([sys.executable, "-m", "simulator", "collective", *args, "--sizes", "1GiB"],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return r.stdout.splitlines()[0]

    assert header("--op", "all_gather", "--algorithm", "sharp", "--cluster", "dgx-h100", "--gpus", "16").endswith(
        "algorithm sharp (not available for all_gather here: ran ring)")
    assert "ran ring" in header("--op", "all_reduce", "--algorithm", "nvls", "--cluster", "dgx-a100", "--gpus", "8")
    assert header("--op", "all_reduce", "--algorithm", "nvls", "--cluster", "dgx-h100", "--gpus", "8").endswith(
        "algorithm nvls")


@pytest.mark.parametrize("topology, nodes", [("gb200-nvl72", 2), ("gb200-nvl72", 4), ("gb200-nvl72", 20),
                                             ("dgx-h100", 4), ("dgx-a100", 2)])
def test_a_bigger_all_reduce_never_takes_less_time(topology, nodes):
    """Across nodes a collective runs as one ring per rank position (NCCL channels). LL's throughput
    cap is the whole collective's (NCCL ``ncclTopoTuneModel``: busBw = nChannels x bw, then
    min(llMaxBw, ...)), and every ring shares each GPU's NVLink with the others: priced per ring at
    the whole link, LL looked fast at mid sizes and a 4 GiB all-reduce over 1,440 GB200 took 37 ms
    against 28 ms for 8 GiB. At NCCL's protocol switch a step of a few percent remains (its tuner
    estimates alone, the simulation shares links)."""
    from simulator.network.cluster import build_cluster
    from simulator.network.collectives import time_collective
    from simulator.parts.topology import load_topology
    cluster = build_cluster(load_topology(topology), nodes)
    ranks = list(range(nodes * cluster.spec.gpus_per_node))
    times = [time_collective(cluster, "all_reduce", ranks, 2 ** k)[0] for k in range(16, 35)]
    for (small, big) in zip(times, times[1:]):
        assert big >= small * 0.95


def test_the_ll_cap_across_nodes_is_the_whole_collectives():
    from simulator.network import nccl
    one = nccl.efficiency(nccl.LL, "all_reduce", 200e9, True, channels=1)
    eight = nccl.efficiency(nccl.LL, "all_reduce", 200e9, True, channels=8)
    assert one * 200e9 == pytest.approx(nccl.LL_MAX_BUSBW_INTER_Bps)
    assert eight * 200e9 * 8 == pytest.approx(nccl.LL_MAX_BUSBW_INTER_Bps)
    assert nccl.efficiency(nccl.LL, "all_reduce", 200e9, False, channels=8) == 0.25  # inside a node: no cap
