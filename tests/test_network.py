"""The fair-share flow model: exact timelines on tiny worlds."""

import numpy as np
import pytest
import simpy
from hypothesis import given, settings, strategies as st

from simulator.network.flows import Network, max_min_rates


def run_transfers(capacity, specs):
    """specs: (start_s, [route, ...], size_bytes, latency_s). Returns finish times."""
    env = simpy.Environment()
    net = Network(env, np.array(capacity, dtype=float))
    finish = {}

    def one(i, start, routes, size, lat):
        yield env.timeout(start)
        yield net.transfer([np.array(r) for r in routes], size, lat)
        finish[i] = env.now

    for i, spec in enumerate(specs):
        env.process(one(i, *spec))
    env.run()
    return [finish[i] for i in range(len(specs))], net


def run_template_plan(capacity, plan, **network_options):
    """plan: (start_s, (links, mult), size_bytes, latency_s) per transfer, over ``transfer_links``.
    Returns the finish times in finishing order and the network."""
    env = simpy.Environment()
    net = Network(env, capacity, **network_options)
    done = []

    def go(at, tpl, size, lat):
        yield env.timeout(at)
        yield net.transfer_links(tpl[0], tpl[1], size, lat)
        done.append(env.now)

    for item in plan:
        env.process(go(*item))
    env.run()
    return done, net


def test_one_transfer_alone_takes_size_over_bandwidth_plus_latency():
    times, _ = run_transfers([100.0], [(0, [[0]], 1000, 0.5)])
    assert times == [pytest.approx(10.5, rel=1e-12)]


def test_two_equal_transfers_on_one_link_each_take_twice_as_long():
    alone, _ = run_transfers([100.0], [(0, [[0]], 1000, 0)])
    both, _ = run_transfers([100.0], [(0, [[0]], 1000, 0), (0, [[0]], 1000, 0)])
    assert both == [pytest.approx(2 * alone[0], rel=1e-12)] * 2


def test_a_transfer_joined_at_its_start_keeps_one_rate_record_and_one_update():
    """A transfer that starts alone gets its rate at once; one that joins it at the same instant
    makes the flush's shared rate its first (records and update count as one flush sets them),
    while one that joins later adds a second rate to the first's record."""
    env = simpy.Environment()
    net = Network(env, np.array([100.0]), record=True)

    def one(start):
        yield env.timeout(start)
        yield net.transfer([np.array([0])], 1000, 0)

    for start in (0.0, 0.0, 5.0):
        env.process(one(start))
    env.run()
    first, second, third = net.flows
    assert first.times[:1] == [0.0] and first.rates[:1] == [pytest.approx(50.0)]
    assert second.times[:1] == [0.0] and second.rates[:1] == [pytest.approx(50.0)]
    assert first.times[1] == pytest.approx(5.0) and first.rates[1] == pytest.approx(100.0 / 3)
    assert third.times[0] == pytest.approx(5.0)
    # one update at 0 (the pair), one at 5 (the three), one at 27.5 when the pair ends together
    assert net.stats.rate_updates == 3


def test_transfer_on_disjoint_path_is_unaffected():
    times, _ = run_transfers([100.0, 100.0, 100.0],
                             [(0, [[0, 1]], 1000, 0), (0, [[0, 1]], 1000, 0), (0, [[2]], 1000, 0)])
    assert times[2] == pytest.approx(10.0, rel=1e-12)
    assert times[0] == pytest.approx(20.0, rel=1e-12)


def test_three_transfers_with_different_bottlenecks_get_max_min_rates():
    # links: A (cap 10), B (cap 4). f1 uses A and B, f2 uses B only, f3 uses A only.
    # Progressive filling: B fills first at rate 2 (f1, f2 frozen at 2); f3 takes A's rest, 8.
    rates = max_min_rates(np.array([10.0, 4.0]), np.array([0, 0, 1, 2]), np.array([0, 1, 1, 0]),
                          np.ones(4), 3)
    assert rates.tolist() == pytest.approx([2.0, 2.0, 8.0])
    # As a timeline: 16 bytes each. f1, f2 end at 8 s; then f3 alone on A at 10 B/s.
    times, _ = run_transfers([10.0, 4.0], [(0, [[0, 1]], 16, 0), (0, [[1]], 16, 0), (0, [[0]], 80, 0)])
    assert times[0] == pytest.approx(8.0) and times[1] == pytest.approx(8.0)
    # f3 moved 8*8 = 64 bytes by t=8, then 16 bytes at 10 B/s: ends at 9.6 s.
    assert times[2] == pytest.approx(9.6)


def test_a_late_arrival_slows_the_flow_already_running():
    # 1000 bytes on cap 100: alone 10 s. A second identical flow joins at 5 s: each then gets 50.
    # First has 500 left -> 10 s more: ends at 15; second has 500 left at 15, alone -> ends at 20.
    times, _ = run_transfers([100.0], [(0, [[0]], 1000, 0), (5, [[0]], 1000, 0)])
    assert times == [pytest.approx(15.0), pytest.approx(20.0)]


def test_coupled_members_move_at_the_slowest_members_share():
    # One transfer with members on links 0 and 1; another flow shares link 1.
    # Link 1 (cap 100) is split 50/50, so the coupled pair runs at 50 on both of its links.
    times, net = run_transfers([100.0, 100.0], [(0, [[0], [1]], 500, 0), (0, [[1]], 500, 0)])
    assert times == [pytest.approx(10.0), pytest.approx(10.0)]
    assert net.stats.bytes_carried.tolist() == [500.0, 1000.0]


def test_a_member_crossing_one_link_twice_counts_twice():
    rates = max_min_rates(np.array([90.0]), np.array([0]), np.array([0]), np.array([3.0]), 1)
    assert rates[0] == pytest.approx(30.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 4), min_size=1, max_size=3, unique=True),
                          st.floats(1, 1000)), min_size=1, max_size=8),
       st.lists(st.floats(1, 100), min_size=5, max_size=5))
def test_max_min_allocation_is_feasible_and_every_flow_has_a_bottleneck(flows, caps):
    cap = np.array(caps)
    eg = np.concatenate([[i] * len(r) for i, (r, _) in enumerate(flows)]).astype(int)
    el = np.concatenate([r for r, _ in flows]).astype(int)
    rates = max_min_rates(cap, eg, el, np.ones(len(el)), len(flows))
    load = np.bincount(el, weights=rates[eg], minlength=5)
    assert np.all(load <= cap * (1 + 1e-9))
    for i, (route, _) in enumerate(flows):
        # max-min: some link of the flow is full and no flow on it has a higher rate
        ok = False
        for link in route:
            on_link = [j for j, (r, _) in enumerate(flows) if link in r]
            if load[link] >= cap[link] * (1 - 1e-9) and rates[i] >= max(rates[on_link]) * (1 - 1e-9):
                ok = True
        assert ok


@pytest.mark.parametrize("seed", range(6))
def test_link_classes_give_exactly_the_rates_of_links_one_by_one(seed):
    """Random transfers (shared templates, overlapping link sets, two capacities) run on link
    classes and on one class per link: the same completion times and bytes, bit for bit."""
    rng = np.random.default_rng(seed)
    capacity = rng.choice([50.0, 120.0], size=60)
    templates = []
    for _ in range(12):
        links = np.unique(rng.choice(60, size=rng.integers(1, 40)))
        mult = rng.choice([1.0, 2.0, 3.0], size=len(links)) if rng.random() < 0.3 else np.ones(len(links))
        templates.append((links, mult))
    plan = [(float(rng.uniform(0, 20)), templates[rng.integers(len(templates))], float(rng.uniform(10, 900)),
             float(rng.choice([0.0, 0.5]))) for _ in range(40)]

    def run(classes):
        done, net = run_template_plan(capacity, plan, classes=classes)
        return done, net.stats.bytes_carried.tolist(), len(net._cap)

    fine, fine_bytes, _ = run(False)
    coarse, coarse_bytes, n_classes = run(True)
    assert coarse == fine and coarse_bytes == fine_bytes
    assert n_classes <= 60


@pytest.mark.parametrize("seed", range(4))
def test_per_class_counters_on_lists_keep_every_byte_while_classes_split(seed):
    """The per-class counters (bytes, owners, users) are Python lists that a transfer updates entry
    by entry; random transfers whose templates split classes while in flight: every link carries
    exactly the bytes of the transfers over it, and no class is still in use at the end."""
    rng = np.random.default_rng(100 + seed)
    capacity = rng.choice([50.0, 120.0], size=40)
    templates = []
    for _ in range(14):
        links = np.unique(rng.choice(40, size=rng.integers(1, 4 if rng.random() < 0.6 else 25)))
        mult = rng.choice([1.0, 2.0], size=len(links)) if rng.random() < 0.3 else np.ones(len(links))
        templates.append((links, mult))
    plan = [(float(rng.uniform(0, 15)), templates[rng.integers(len(templates))], float(rng.uniform(10, 900)),
             float(rng.choice([0.0, 0.3]))) for _ in range(50)]
    done, net = run_template_plan(capacity, plan)
    expected = np.zeros(len(capacity))
    for _, (links, mult), size, _ in plan:
        expected[links] += mult * size
    assert len(done) == len(plan) and all(np.isfinite(t) for t in done)
    assert net.stats.bytes_carried == pytest.approx(expected, rel=1e-12)
    assert len(set(net._cls.tolist())) > 1 and not any(net._users)


def test_networks_on_one_cluster_share_its_link_classes_but_not_their_refinements():
    """Network keeps np.unique of a capacity array per array (``_capacity_classes``: a planner's
    bounds build hundreds of networks on one cluster); each network must still get its own class
    arrays, since a transfer splits classes in place. The same collective twice on one cluster,
    and once on a copy of its capacities (a fresh unique), takes the same time and carries the
    same bytes per link."""
    from simulator.network.collectives import time_collective
    from simulator.network.cluster import build_cluster
    from simulator.parts.topology import load_topology

    cluster = build_cluster(load_topology("dgx-h100"), 4)
    first, net1 = time_collective(cluster, "all_reduce", range(32), 2**30)
    again, net2 = time_collective(cluster, "all_reduce", range(32), 2**30)
    fresh = build_cluster(load_topology("dgx-h100"), 4)
    fresh_t, net3 = time_collective(fresh, "all_reduce", range(32), 2**30)
    assert net1._cls is not net2._cls and net1._cap is not net2._cap
    assert first == again == fresh_t
    assert np.array_equal(net1.stats.bytes_carried, net2.stats.bytes_carried)
    assert np.array_equal(net2.stats.bytes_carried, net3.stats.bytes_carried)
    assert len(net1._cap) > len(np.unique(cluster.link_bw))  # the collective did split classes
