"""Views of a step: critical path, Perfetto trace, link use, communication map, timeline."""

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from simulator.trace.commmap import comm_map
from simulator.trace.critical_path import CATEGORIES, critical_path
from simulator.engine.engine import SimOptions, simulate
from simulator.trace.linkuse import link_use, peak_load
from simulator.trace.perfetto import trace_events
from simulator.scenario.load import load_scenario
from simulator.reports.timeline import timeline

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))


@pytest.fixture(scope="module")
def tiny():
    return simulate(load_scenario(str(ROOT / "scenarios/tiny.yaml")), SimOptions(record_flows=True))


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_critical_path_and_link_use_on_every_shipped_scenario(path, shipped_result):
    result = shipped_result(path)
    step = result.step_time_s
    cp = critical_path(result)
    assert abs(cp["total_s"] - step) / step < 1e-9
    assert abs(sum(cp["by_category"].values()) - step) / step < 1e-9
    assert set(cp["by_category"]) == set(CATEGORIES)
    assert cp["by_category"]["waiting"] == pytest.approx(0.0, abs=1e-12 * step)
    ops = cp["ops"]
    assert ops[0]["start_s"] == 0 and abs(ops[-1]["end_s"] - step) <= 1e-12 * step
    for a, b in zip(ops, ops[1:]):
        assert a["end_s"] == pytest.approx(b["start_s"], abs=1e-12 * step)
    assert all(v is None or v >= 0 for v in cp["slack_s"].values())
    assert cp["slack_s"]["compute"] == 0.0

    cap = result.cluster.link_bw
    assert np.all(peak_load(result) <= cap * (1 + 1e-9))
    carried = np.zeros(result.cluster.num_links)
    for f in result.flows:
        t = np.asarray(f.times + [f.end])
        moved = float(np.dot(np.diff(t), f.rates))
        assert moved == pytest.approx(f.size, rel=1e-6)
        np.add.at(carried, f.links, f.mult * moved)
    assert np.allclose(carried, result.link_bytes, rtol=1e-6)
    use = link_use(result)
    assert sum(c["bytes"] for c in use["classes"].values()) == pytest.approx(float(np.sum(result.link_bytes)))
    assert all(0 <= c["peak_utilisation"] <= 1 + 1e-9 for c in use["classes"].values())
    cmap = comm_map(result)
    wire = sum(r["wire_bytes"] for r in cmap["kinds"].values())
    assert wire == pytest.approx(float(np.sum(result.link_bytes)), rel=1e-9)


def test_critical_path_is_the_same_folded_and_unfolded(tiny):
    full = simulate(tiny.scenario, SimOptions(fold=False))
    a, b = critical_path(tiny), critical_path(full)
    assert b["total_s"] == pytest.approx(full.step_time_s, rel=1e-12)
    for c in CATEGORIES:
        assert a["by_category"][c] == pytest.approx(b["by_category"][c], rel=1e-9, abs=1e-15)


def _check_trace(doc):
    events = doc["traceEvents"]
    lanes = defaultdict(list)
    flows = defaultdict(list)
    for e in events:
        assert {"ph", "name", "pid", "tid"} <= set(e)
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "M":
            assert "args" in e
            continue
        assert isinstance(e["ts"], float) and e["ts"] >= 0
        if e["ph"] == "X":
            assert e["dur"] >= 0 and "cat" in e
            assert {"microbatch", "layer", "bytes", "flops"} <= set(e["args"])
            lanes[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
        else:
            assert e["ph"] in ("s", "f") and "id" in e
            flows[e["id"]].append(e)
    for spans in lanes.values():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert start >= end - 1e-6
    for pair in flows.values():
        assert sorted(e["ph"] for e in pair) == ["f", "s"] and pair[0]["ts"] <= pair[1]["ts"]
    return events


def test_trace_has_the_required_fields_and_no_overlap(tiny):
    events = _check_trace(json.loads(json.dumps(trace_events(tiny))))
    assert any(e["ph"] == "s" for e in events)
    ranks = {e["args"]["name"].split()[1] for e in events if e["name"] == "thread_name"}
    assert len(ranks) == tiny.plan.pp


def test_trace_of_all_ranks_and_of_a_large_run():
    s = load_scenario(str(ROOT / "scenarios/tiny.yaml"))
    full = simulate(s, SimOptions(fold=False))
    events = _check_trace(trace_events(full))
    assert len({e["args"]["name"].split()[1] for e in events if e["name"] == "thread_name"}) == 8
    moe = simulate(load_scenario(str(ROOT / "scenarios/mixtral-8x7b-64xh100.yaml")))
    _check_trace(trace_events(moe))


def test_timeline_bars_tile_every_stage(tiny):
    tl = timeline(tiny)
    for stage in range(tl.stages):
        bars = sorted((b for b in tl.bars if b.stage == stage), key=lambda b: b.start)
        assert bars[0].start == 0 and bars[-1].end == pytest.approx(tl.step_time_s, rel=1e-12)
        for a, b in zip(bars, bars[1:]):
            assert a.end == pytest.approx(b.start, abs=1e-15)
    assert "tiny" in tl.title and "bubble" in tl.title and "MFU" in tl.title


def test_comm_map_counts_the_tiny_collectives(tiny):
    cmap = comm_map(tiny)["kinds"]
    layers, m = 4 // 2, tiny.scenario.num_microbatches
    # two all-reduces forward and two backward per layer, and per micro-batch the embedding's sum
    # (first stage) or the LM head's input-gradient all-reduce (last stage)
    assert cmap["tp"]["calls"] == 4 * layers * m + m
    assert cmap["tp"]["bytes_per_call"] == pytest.approx(tiny.workload.tp_bytes)
    assert cmap["tp"]["link_classes"].keys() == {"nvlink"}
    assert cmap["pp"]["calls"] == m
    # forward all-reduces wait in full; backward ones run under the weight-gradient GEMMs (Megatron's
    # async grad all-reduce), so part of their time is hidden
    assert cmap["tp"]["time_s"] / 2 * (1 - 1e-9) <= cmap["tp"]["exposed_s"] < cmap["tp"]["time_s"]


def test_run_writes_trace_timeline_and_json_views(tmp_path):
    out = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-m", "simulator", "run", "scenarios/tiny.yaml", "--json",
                               "--trace", str(tmp_path / "step.json"), "--timeline", str(tmp_path / "step.png")],
                              capture_output=True, text=True, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout)
        report.pop("sim_wall_s")
        out.append((json.dumps(report), (tmp_path / "step.json").read_bytes()))
    assert out[0] == out[1]
    assert {"total_s", "by_category", "ops"} <= set(report["critical_path"])
    assert report["link_use"]["classes"]["nvlink"]["bytes"] > 0 and "tp" in report["comm_map"]["kinds"]
    assert (tmp_path / "step.png").stat().st_size > 1000
    _check_trace(json.loads(out[0][1]))
