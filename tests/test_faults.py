"""Faults: the faults: section, link faults on the cluster, straggler ranks, jitter draws, the
what-if rows and the report section."""

import json
import math
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from simulator.scenario.config import Faults, LinkFault
from simulator.common.errors import ConfigError
from simulator.network.faults import apply_link_faults
from simulator.parts.topology import node_links
from simulator.network.cluster import build_cluster
from simulator.parts.topology import load_topology
from simulator.reports.report import format_summary, step_report
from simulator.scenario.load import load_scenario, scenario_from_dict, scenario_to_dict
from simulator.engine.engine import scenario_cluster, simulate
from simulator.engine.variability import Jitter, max_normal, rank_slowdowns, uniform
from simulator.studies.whatif import FAULT_TARGETS, format_whatif, whatif

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "scenarios" / "tiny.yaml")
TWO_NODES = ["cluster.num_nodes=2", "parallelism.dp=4", "training.global_batch_size=16"]  # stage 0 on node 0, stage 1 on node 1


def tiny(*sets):
    return load_scenario(TINY, [*TWO_NODES, *sets])


def names(cluster, ids):
    return [cluster.link_ends[i] for i in ids]


# --- the faults: section ----------------------------------------------------------------------

def test_no_faults_section_is_the_default_and_stays_out_of_the_scenario_dict():
    s = load_scenario(TINY)
    assert s.faults == Faults() and not s.faults.active
    assert "faults" not in scenario_to_dict(s)
    assert scenario_from_dict({**scenario_to_dict(s), "faults": {}}) == s


def test_faults_round_trip_and_hash():
    s = tiny("faults.stragglers=[{node: 1, compute_slowdown: 1.25}, {rank: 2, compute_slowdown: 1.5}]",
             "faults.links=[{node: 0, link_class: nic, index: 3, bandwidth_fraction: 0}]",
             "faults.compute_jitter_cv=0.05", "faults.seed=7")
    f = s.faults
    assert f.active and f.seed == 7 and f.compute_jitter_cv == 0.05
    assert f.links == (LinkFault(node=0, link_class="nic", bandwidth_fraction=0.0, index=3),)
    assert scenario_from_dict(scenario_to_dict(s)) == s
    assert hash(s) == hash(scenario_from_dict(scenario_to_dict(s)))


@pytest.mark.parametrize("value, field", [
    ("stragglers=[{node: 2, compute_slowdown: 1.2}]", "faults.stragglers[0].node"),
    ("stragglers=[{rank: 16, compute_slowdown: 1.2}]", "faults.stragglers[0].rank"),
    ("stragglers=[{rank: 1, node: 0, compute_slowdown: 1.2}]", "faults.stragglers[0]"),
    ("stragglers=[{compute_slowdown: 1.2}]", "faults.stragglers[0]"),
    ("stragglers=[{rank: 1, compute_slowdown: 0.9}]", "faults.stragglers[0].compute_slowdown"),
    ("stragglers=[{rank: 1, compute_slowdown: 1000}]", "faults.stragglers[0].compute_slowdown"),
    ("stragglers=[{rank: 1, slowdown: 1.2}]", "faults.stragglers[0].slowdown"),
    ("stragglers={rank: 1}", "faults.stragglers"),
    ("links=[{node: 0, link_class: infiniband, bandwidth_fraction: 0.5}]", "faults.links[0].link_class"),
    ("links=[{node: 0, link_class: spine-core, bandwidth_fraction: 0.5}]", "faults.links[0].link_class"),
    ("links=[{node: 2, link_class: nic, bandwidth_fraction: 0.5}]", "faults.links[0].node"),
    ("links=[{node: 0, link_class: nic, bandwidth_fraction: 1.5}]", "faults.links[0].bandwidth_fraction"),
    ("links=[{node: 0, link_class: nic, bandwidth_fraction: -0.1}]", "faults.links[0].bandwidth_fraction"),
    ("links=[{node: 0, link_class: nic}]", "faults.links[0].bandwidth_fraction"),
    ("links=[{node: 0, link_class: nic, index: 8, bandwidth_fraction: 0.5}]", "faults.links[0].index"),
    ("links=[{node: 0, link_class: nic, bandwidth_fraction: 0.5, rail: 1}]", "faults.links[0].rail"),
    ("compute_jitter_cv=-0.1", "faults.compute_jitter_cv"),
    ("compute_jitter_cv=3", "faults.compute_jitter_cv"),
    ("seed=-1", "faults.seed"),
    ("seed=1.5", "faults.seed"),
    ("jitter=0.1", "faults.jitter"),
])
def test_bad_fault_values_are_one_line_config_errors(value, field):
    with pytest.raises(ConfigError) as err:
        tiny(f"faults.{value}")
    assert err.value.field == field and "\n" not in str(err.value)


def test_unknown_key_inside_the_file_section_and_a_class_one_node_lacks():
    raw = scenario_to_dict(load_scenario(TINY))
    with pytest.raises(ConfigError, match="unknown key") as err:
        scenario_from_dict({**raw, "faults": {"stragglers": [], "flaky": True}})
    assert err.value.field == "faults.flaky"
    with pytest.raises(ConfigError, match="has no nic links; valid here: nvlink, pcie") as err:
        scenario_from_dict({**raw, "faults": {"links": [{"node": 0, "link_class": "nic", "bandwidth_fraction": 0.5}]}})
    assert err.value.field == "faults.links[0].link_class"


def test_cli_fault_error_is_one_line_with_exit_2():
    proc = subprocess.run([sys.executable, "-m", "simulator", "run", TINY, "--set",
                           "faults.links=[{node: 0, link_class: leaf-spine, bandwidth_fraction: 0.5}]"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("stepsim: error: faults.links[0].link_class: got 'leaf-spine'")



def test_setting_the_whole_faults_section_says_to_name_one_key():
    from simulator.common.errors import ConfigError
    from simulator.scenario.load import apply_overrides
    with pytest.raises(ConfigError) as e:
        apply_overrides({}, ["faults={compute_jitter_cv: 0.1}"])
    assert "expected faults.<key>" in str(e.value) and "unknown key" not in str(e.value)
    with pytest.raises(ConfigError) as e:
        apply_overrides({}, ["faults.bogus=1"])
    assert "unknown key" in str(e.value) and "faults.compute_jitter_cv" in str(e.value)


# --- link faults on the cluster ---------------------------------------------------------------

def test_link_degradation_scales_both_directions_of_that_nodes_links_only():
    healthy = scenario_cluster(tiny())
    c = scenario_cluster(tiny("faults.links=[{node: 1, link_class: nic, bandwidth_fraction: 0.25}]"))
    touched = {c._edge_id[(a, b)] for a, b in node_links(c.spec, 2, 1, "nic")}
    touched |= {c._edge_id[(b, a)] for a, b in node_links(c.spec, 2, 1, "nic")}
    assert len(touched) == 16
    for e in range(c.num_links):
        assert c.link_bw[e] == healthy.link_bw[e] * (0.25 if e in touched else 1.0)
    assert c is not healthy and not c.down and c._route_cache is not healthy._route_cache


def test_a_failed_nic_link_reroutes_over_another_rail_and_leaves_the_healthy_cluster_alone():
    spec = load_topology("dgx-h100")
    healthy = build_cluster(spec, 2)
    before = names(healthy, healthy.route(3, 11))
    assert ("n0.nic3", "pod0.leaf3") in before
    faulted = apply_link_faults(healthy, Faults(links=(LinkFault(0, "nic", 0.0, index=3),)))
    detour = names(faulted, faulted.route(3, 11))
    assert detour == [("n0.g3", "n0.nvs"), ("n0.nvs", "n0.g4"), ("n0.g4", "n0.nic4"), ("n0.nic4", "pod0.leaf4"),
                      ("pod0.leaf4", "n1.nic4"), ("n1.nic4", "n1.g4"), ("n1.g4", "n1.nvs"), ("n1.nvs", "n1.g3")]
    assert all(e not in faulted.down for e in faulted.route(11, 3))
    assert names(healthy, healthy.route(3, 11)) == before  # routes are cached per cluster
    assert names(faulted, faulted.route(2, 10)) == names(healthy, healthy.route(2, 10))  # others keep their path
    assert faulted.with_bandwidth_scaled({"nic": 2.0}).down == faulted.down


def test_a_failed_leaf_spine_link_moves_its_flows_to_the_next_spine():
    spec = replace(load_topology("dgx-h100"), nodes_per_leaf=2)  # 4 nodes: two leaf groups, 2 spines per leaf
    healthy = build_cluster(spec, 4)
    assert node_links(spec, 4, 0, "leaf-spine")[0] == ("pod0.leaf0", "pod0.spine0")
    src, dst = 2 * 8, 0  # node 2 to node 0, rail 0: down through spine 0 onto node 0's first leaf
    assert ("pod0.spine0", "pod0.leaf0") in names(healthy, healthy.route(src, dst))
    faulted = apply_link_faults(healthy, Faults(links=(LinkFault(0, "leaf-spine", 0.0, index=0),)))
    assert names(faulted, faulted.route(src, dst)) == [
        ("n2.g0", "n2.nic0"), ("n2.nic0", "pod0.leaf8"), ("pod0.leaf8", "pod0.spine1"),
        ("pod0.spine1", "pod0.leaf0"), ("pod0.leaf0", "n0.nic0"), ("n0.nic0", "n0.g0")]
    quarter = apply_link_faults(healthy, Faults(links=(LinkFault(0, "leaf-spine", 0.25, index=0),)))
    e = healthy._edge_id[("pod0.spine0", "pod0.leaf0")]
    assert quarter.link_bw[e] == healthy.link_bw[e] / 4 and np.sum(quarter.link_bw != healthy.link_bw) == 2


def test_a_node_cut_off_is_a_config_error_naming_the_fault():
    with pytest.raises(ConfigError) as err:
        scenario_cluster(tiny("faults.links=[{node: 0, link_class: nvlink, bandwidth_fraction: 0.5}, "
                              "{node: 1, link_class: nic, bandwidth_fraction: 0}]"))
    assert err.value.field == "faults.links[1]" and "no route" in str(err.value)


def test_a_failed_nvlink_goes_over_pcie_and_the_fabric():
    c = scenario_cluster(tiny("faults.links=[{node: 1, link_class: nvlink, index: 2, bandwidth_fraction: 0}]"))
    route = names(c, c.route(10, 9))
    assert route[0] == ("n1.g2", "n1.nic2") and route[-1] == ("n1.nic1", "n1.g1")
    assert not any(e in c.down for e in c.route(10, 9))


def test_a_node_whose_nics_run_at_a_quarter_never_shortens_the_step():
    base = simulate(tiny()).step_time_s
    slow = simulate(tiny("faults.links=[{node: 0, link_class: nic, bandwidth_fraction: 0.25}]")).step_time_s
    assert slow >= base
    failed = simulate(tiny("faults.links=[{node: 0, link_class: nic, index: 0, bandwidth_fraction: 0}]")).step_time_s
    assert failed >= base


# --- stragglers and jitter --------------------------------------------------------------------

def test_rank_slowdowns_cover_a_nodes_ranks_and_take_the_largest():
    s = tiny("faults.stragglers=[{node: 1, compute_slowdown: 1.25}, {rank: 9, compute_slowdown: 2}, "
             "{rank: 3, compute_slowdown: 1.1}, {rank: 12, compute_slowdown: 1.0}]")
    assert rank_slowdowns(s) == {3: 1.1, 8: 1.25, 9: 2.0, 10: 1.25, 11: 1.25, 12: 1.25, 13: 1.25, 14: 1.25, 15: 1.25}
    assert rank_slowdowns(tiny()) == {}


def test_jitter_off_returns_the_time_exactly():
    assert not Jitter(0.0).enabled
    assert Jitter(0.0, 3).block_time(1.234, 10, (0, 1, 0, 2, "qkv", "F"), group_size=8) == 1.234
    assert Jitter(0.1).block_time(0.0, 10, (0,)) == 0.0


def test_jitter_draws_depend_on_seed_and_key_only():
    keys = [(r, mb, 0, layer, "mlp", "F") for r in range(4) for mb in range(3) for layer in range(2)]
    a = {k: Jitter(0.05, seed=1).block_time(1.0, 4, k, 8) for k in keys}
    j = Jitter(0.05, seed=1)
    b = {k: j.block_time(1.0, 4, k, 8) for k in reversed(keys)}
    assert a == b and len(set(a.values())) == len(keys)
    assert Jitter(0.05, seed=2).block_time(1.0, 4, keys[0], 8) != a[keys[0]]
    out = subprocess.run([sys.executable, "-c", "from simulator.engine.variability import Jitter; "
                          f"print(repr(Jitter(0.05, 1).block_time(1.0, 4, {keys[0]!r}, 8)))"],
                         capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert float(out) == a[keys[0]]  # no per-process hash salt


def test_one_rank_is_the_plain_truncated_normal_draw():
    j = Jitter(0.2, seed=5)
    for i in range(50):
        key = ("k", i)
        z = -max_normal(1 - uniform(5, key))  # Phi^{-1}(u) by symmetry
        assert j.block_time(2.0, 4, key, 1) == pytest.approx(max(0.0, 2.0 + 0.2 * 2.0 / 2 * z), rel=1e-12)
    assert min(Jitter(1.0).block_time(1.0, 1, ("neg", i)) for i in range(200)) == 0.0  # clamped at 0


@pytest.mark.parametrize("n", [1, 4, 64])
def test_max_of_n_matches_brute_force_in_mean_and_quantile(n):
    samples = 20_000
    exact = np.array([max_normal(uniform(0, ("max", n, i)), n) for i in range(samples)])
    rng = random.Random(1234 + n)
    brute = np.array([max(rng.gauss(0, 1) for _ in range(n)) for _ in range(samples)])
    sd = brute.std()
    assert abs(exact.mean() - brute.mean()) < 5 * sd * math.sqrt(2 / samples)
    q = np.quantile(brute, 0.9)  # the fraction of exact draws below it is Binomial(samples, ~0.9)
    assert abs(np.mean(exact <= q) - 0.9) < 5 * math.sqrt(2 * 0.9 * 0.1 / samples)
    if n == 4:
        assert exact.mean() == pytest.approx(1.0294, abs=0.02)  # E[max of 4 standard normals] = 1.0294


def test_max_normal_keeps_precision_for_large_groups():
    z = max_normal(1 - 2**-53, 100_000)
    assert math.isfinite(z) and z > max_normal(0.5, 100_000) > 4.0


# --- what-if rows and the report --------------------------------------------------------------

def test_whatif_fault_rows():
    result = whatif(TINY, sets=TWO_NODES, targets=FAULT_TARGETS, workers=1)
    rows = {r["target"]: r for r in result["fault_rows"]}
    assert list(rows) == list(FAULT_TARGETS) and result["rows"] == []
    assert rows["one straggler node"]["fault"] == {"stragglers": [{"node": 0, "compute_slowdown": 1.25}]}
    link = rows["one degraded leaf-spine link"]
    assert link["present"] and link["fault"]["links"][0]["index"] == 0
    assert all(r["step_time_s"] >= result["baseline_step_time_s"] for r in rows.values())
    assert "one degraded leaf-spine link" in format_whatif(result)
    single = whatif(TINY, targets=FAULT_TARGETS, workers=1)
    skipped = {r["target"]: r for r in single["fault_rows"]}["one degraded leaf-spine link"]
    assert not skipped["present"] and "no leaf-spine links" in skipped["skipped"]
    assert "(skipped: no leaf-spine links" in format_whatif(single)


def test_report_says_what_a_fault_touched_and_is_absent_without_faults():
    plain = step_report(simulate(tiny()))
    assert "faults" not in plain and "faults" not in format_summary(plain)
    assert "faults" not in step_report(simulate(tiny("faults.seed=3")))  # a seed alone faults nothing
    s = tiny("faults.stragglers=[{rank: 2, compute_slowdown: 1.5}]",
             "faults.links=[{node: 1, link_class: nic, bandwidth_fraction: 0.25}, "
             "{node: 0, link_class: nic, index: 3, bandwidth_fraction: 0}]")
    report = step_report(simulate(s))
    f = report["faults"]
    assert f["stragglers"] == [{"rank": 2, "node": 0, "compute_slowdown": 1.5}]
    assert [x["state"] for x in f["links"]] == ["degraded", "failed"]
    assert f["links"][1]["links"] == ["n0.nic3<->pod0.leaf3"] and len(f["links"][0]["links"]) == 8
    pp = f["groups"]["pp"]  # stage 0 on node 0, stage 1 on node 1: every send crosses node 1's NICs
    assert pp["groups"] == 8 and pp["crossing_degraded"] == 8 and pp["rerouted"] == 1
    assert pp["examples_rerouted"] == [[3, 11]]
    assert f["groups"]["tp"]["crossing_degraded"] == 0 and f["groups"]["dp"]["crossing_degraded"] == 0
    json.dumps(report)
    text = format_summary(report)
    assert "faults:" in text and "stragglers       1 rank (2) at 1.5x" in text and "8 of 8 groups" in text
