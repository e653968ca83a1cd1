"""A simulation asked to stop above a cutoff (``bound.simulate_below``, the planner's): the bound
it stops on (``bound.ProgressBound``) never exceeds the step it would have simulated, a cutoff at
or above that step changes nothing, and a cutoff well below it does stop the run."""

import pytest

import simulator.studies.bound as bound_module
from simulator.engine.engine import simulate
from simulator.reports.report import step_report
from simulator.scenario.load import load_scenario
from simulator.studies.bound import StepAbove, simulate_below

CASES = {
    "pp2-1f1b-zero1": ["parallelism.pp=2", "parallelism.dp=8", "parallelism.zero_stage=1"],
    "pp2-interleaved-zero0": ["parallelism.pp=2", "parallelism.vp=2", "parallelism.dp=8", "schedule=interleaved"],
    "pp2-zero3-cp2": ["parallelism.pp=2", "parallelism.dp=4", "parallelism.cp=2", "parallelism.zero_stage=3"],
    "pp4-slow-network": ["parallelism.pp=4", "parallelism.dp=4", "parallelism.zero_stage=1",
                         "cluster.network_bandwidth_Gbps=25"],
}


def _scenario(key: str):
    return load_scenario("scenarios/tiny.yaml", ["cluster.num_nodes=4", "training.global_batch_size=32",
                                                 *CASES[key]])


@pytest.mark.parametrize("key", list(CASES))
def test_the_bound_never_exceeds_the_step_at_any_moment(key, monkeypatch):
    s = _scenario(key)
    step = simulate(s).step_time_s
    seen = []
    walk = bound_module.ProgressBound.__call__

    def spy(self, now, *args):
        value = walk(self, now, *args)
        seen.append((now, value))
        return value

    monkeypatch.setattr(bound_module.ProgressBound, "__call__", spy)
    monkeypatch.setattr(bound_module, "STOP_CHECKS", tuple(k / 40 for k in range(1, 41)))
    monkeypatch.setattr(bound_module, "SKIP_AHEAD", False)
    r = simulate_below(s, cutoff_s=step)
    assert r.step_time_s == step
    assert len(seen) >= 30
    assert all(now <= value <= step for now, value in seen)
    # the walk knows more as the step goes on, and at the start it is no worse than compute alone
    assert seen[-1][1] >= 0.9 * step


@pytest.mark.parametrize("key", list(CASES))
def test_a_cutoff_at_the_step_changes_nothing_and_one_below_it_stops_with_a_sound_bound(key):
    s = _scenario(key)
    full = simulate(s)
    same = simulate_below(s, cutoff_s=full.step_time_s)
    assert step_report(same) == step_report(full)
    assert same.events == full.events
    stops = 0
    for fraction in (0.5, 0.8, 0.95, 0.999):
        cutoff = fraction * full.step_time_s
        try:
            r = simulate_below(s, cutoff_s=cutoff)
        except StepAbove as stop:
            stops += 1
            assert cutoff < stop.bound_s <= full.step_time_s
            assert stop.at_s <= cutoff and stop.events < full.events
        else:
            pytest.fail(f"finished at {r.step_time_s} s with a cutoff of {cutoff} s below it")
    assert stops == 4


def test_jitter_turns_the_stop_off():
    """With variability a block may run shorter than its cost, so the walk would not be a bound:
    the engine then runs to the end whatever the cutoff."""
    s = load_scenario("scenarios/tiny.yaml", ["faults.compute_jitter_cv=0.05"])
    full = simulate(s)
    assert simulate_below(s, cutoff_s=0.5 * full.step_time_s).step_time_s == full.step_time_s


def test_a_pipeline_transfer_alone_is_at_least_its_route_latency_and_its_bytes_at_the_slowest_link():
    """``least_pp``'s closed form (what the walk adds to a send) against the network simulating
    that transfer alone, inside a node and across nodes."""
    from simulator.network.collectives import time_collective
    from simulator.engine.engine import scenario_cluster

    s = _scenario("pp4-slow-network")
    cluster = scenario_cluster(s)
    size = 64e6
    for src, dst in ((0, 1), (0, 8), (3, 27)):
        links = cluster.route_links([src], [dst])
        closed = cluster.route_latency(src, dst) + size / float(cluster.link_bw[links].min())
        alone = time_collective(cluster, "send_recv", [src, dst], size)[0]
        assert closed == pytest.approx(alone, rel=1e-9)
