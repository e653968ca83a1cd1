"""`stepsim audit`: seed 004's plan against its simulation; claims that hold; bad input; the page in
headless Chromium. Also the pieces the memo stands on: placement, checkpoint arithmetic, fallback."""

from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path

import pytest
import yaml

from cli_json import cli_json
from simulator.cli import main

ROOT = Path(__file__).resolve().parents[1]
PLAN = str(ROOT / "scenarios" / "seed004-plan-audit.yaml")
SEED_SCENARIO = str(ROOT / "scenarios" / "seed004-moe-ep64-tp2-128gpu.yaml")


@pytest.fixture(scope="module")
def seed_audit(tmp_path_factory):
    out = tmp_path_factory.mktemp("audit") / "audit.html"
    result = cli_json(["audit", PLAN, "--json", "--out", str(out)])
    return result, out


def test_seed004_memory_utilization_and_throughput_claims_fail_with_simulated_values(seed_audit):
    result, _ = seed_audit
    claims = {c["name"]: c for c in result["claims"]}
    assert all(set(c) == {"name", "stated", "simulated", "verdict", "why"} for c in result["claims"])
    run = cli_json(["run", PLAN, "--json"])
    memory = cli_json(["memory", PLAN, "--json"])
    assert claims["memory_gib_per_gpu"]["stated"] == 0.015625
    assert claims["memory_gib_per_gpu"]["simulated"] == memory["peak_gib"]
    assert claims["memory_gib_per_gpu"]["simulated"] > 1.0  # 16 MB counts one expert's weights only
    assert claims["mfu"]["simulated"] == run["mfu"] and run["mfu"] < 0.5
    assert claims["tokens_per_s"]["simulated"] == run["tokens_per_s"]
    assert claims["tokens_per_s"]["stated"] == 10240
    for name in ("memory_gib_per_gpu", "mfu", "compute_busy_fraction", "tokens_per_s", "exposed_comm_fraction",
                 "gpus_used"):
        assert claims[name]["verdict"] == "fails", name
    assert claims["gpus_used"]["simulated"] == 128
    assert "tolerance" in claims["mfu"]["why"]
    assert result["fails"] == len(result["claims"]) - result["holds"]


def test_claims_that_match_the_simulation_hold(tmp_path, seed_audit):
    result, _ = seed_audit
    sim = {c["name"]: c["simulated"] for c in result["claims"]}
    raw = yaml.safe_load(Path(PLAN).read_text())
    raw["claims"] = {"step_time_s": sim["step_time_s"] * 1.10, "gpus_used": 128,
                     "memory_gib_per_gpu": {"at_most": sim["memory_gib_per_gpu"] * 0.9},
                     "exposed_comm_fraction": {"at_least": sim["exposed_comm_fraction"] + 0.04},
                     "mfu": {"at_least": sim["mfu"] * 1.2}}
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump(raw))
    verdicts = {c["name"]: c["verdict"] for c in cli_json(["audit", str(plan), "--json"])["claims"]}
    assert verdicts == {"step_time_s": "holds", "gpus_used": "holds", "memory_gib_per_gpu": "holds",
                        "exposed_comm_fraction": "holds", "mfu": "fails"}


def test_audit_file_runs_as_a_scenario_and_the_page_is_deterministic(tmp_path, seed_audit):
    _, page = seed_audit
    assert main(["run", PLAN]) == 0
    again = tmp_path / "again.html"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["audit", PLAN, "--out", str(again)]) == 0
    assert again.read_bytes() == page.read_bytes()


def test_audit_page_renders_in_headless_chromium(seed_audit):
    from browser import find_chromium, ink_fraction, inspect_page, require_browser

    from simulator.reports.auditpage import SECTION_IDS

    if find_chromium() is None:
        if require_browser():
            pytest.fail("STEPSIM_REQUIRE_BROWSER=1 but no Chromium found (apt-get install chromium)")
        pytest.skip("Chromium is not installed (.ci/run installs it; apt-get install chromium)")
    page = inspect_page(seed_audit[1])
    assert page["errors"] == []
    assert [sid for sid, _ in page["dom"]["sections"]] == list(SECTION_IDS)
    assert ink_fraction(page["png"]) > 0.02


def test_browser_check_sees_console_errors_and_failed_loads(tmp_path):
    """The negative control: the check above can fail."""
    from browser import find_chromium, inspect_page

    if find_chromium() is None:
        pytest.skip("Chromium is not installed")
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><body><script>console.error("broken")</script>'
                   '<img src="missing.png"></body></html>')
    errors = inspect_page(bad)["errors"]
    assert any("broken" in e for e in errors) and any("missing.png" in e for e in errors)


# --- bad input ----------------------------------------------------------------------------------

def _one_line_exit_2(args, capsys) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("stepsim: error: ")
    return err[0]


@pytest.fixture
def no_simulation(monkeypatch):
    import simulator.studies.audit as audit

    def boom(*args, **kwargs):
        raise AssertionError("simulated before checking the input")

    monkeypatch.setattr(audit, "audit", boom)


def test_audit_without_claims_section(capsys, no_simulation):
    line = _one_line_exit_2(["audit", SEED_SCENARIO], capsys)
    assert "claims: left out; required" in line and "memory_gib_per_gpu" in line


def test_audit_unknown_claim(tmp_path, capsys, no_simulation):
    raw = yaml.safe_load(Path(PLAN).read_text())
    raw["claims"] = {"mfu": 0.5, "latency_ms": 12.5}
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump(raw))
    line = _one_line_exit_2(["audit", str(plan)], capsys)
    assert "claims.latency_ms: got 12.5; unknown claim; valid:" in line


def test_audit_bad_claim_value(tmp_path, capsys, no_simulation):
    raw = yaml.safe_load(Path(PLAN).read_text())
    raw["claims"] = {"mfu": {"about": 0.5}}
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump(raw))
    assert "claims.mfu" in _one_line_exit_2(["audit", str(plan)], capsys)


@pytest.mark.parametrize("claims, field, says", [
    ({"step_time_s": -1}, "claims.step_time_s", "above 0"),
    ({"tokens_per_s": 0}, "claims.tokens_per_s", "above 0"),
    ({"mfu": 1.5}, "claims.mfu", "at most 1"),
    ({"mfu": {"at_least": 0}}, "claims.mfu.at_least", "above 0"),
    ({"exposed_comm_fraction": {"at_most": -0.1}}, "claims.exposed_comm_fraction.at_most", "from 0 to 1"),
    ({"compute_busy_fraction": 1.2}, "claims.compute_busy_fraction", "from 0 to 1"),
    ({"gpus_used": 127.5}, "claims.gpus_used", "whole number"),
])
def test_audit_a_claim_the_quantity_cannot_take_is_bad_input(tmp_path, capsys, no_simulation, claims, field, says):
    """A stated value no layout could have (a negative step, an MFU above 1, half a GPU) is a typo
    in the plan, not a claim that fails: one line, exit 2, before simulating (they were audited)."""
    raw = yaml.safe_load(Path(PLAN).read_text())
    raw["claims"] = claims
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump(raw))
    line = _one_line_exit_2(["audit", str(plan)], capsys)
    assert line.startswith(f"stepsim: error: {field}: got") and says in line


def test_audit_unwritable_output(tmp_path, capsys, no_simulation):
    line = _one_line_exit_2(["audit", PLAN, "--out", str(tmp_path / "nope" / "a.html")], capsys)
    assert line.startswith("stepsim: error: --out:") and "does not exist" in line


# --- what the memo stands on --------------------------------------------------------------------

@pytest.mark.parametrize("scenario", ["tiny.yaml", "seed004-moe-ep64-tp2-128gpu.yaml"])
def test_placement_from_the_rank_grid_matches_the_simulated_flows(scenario):
    from simulator.trace.commmap import comm_map
    from simulator.reports.placement import placement
    from simulator.scenario.load import load_scenario
    from simulator.engine.engine import SimOptions, simulate

    s = load_scenario(str(ROOT / "scenarios" / scenario))
    result = simulate(s, SimOptions(record_flows=True))
    pl = placement(s, result.plan, result.cluster)
    kinds = comm_map(result)["kinds"]
    checked = 0
    for axis, kind in (("tp", "tp"), ("tp", "sp"), ("pp", "pp"), ("ep", "ep"), ("cp", "cp")):
        if kind in kinds and kinds[kind]["crosses"]:
            assert pl[axis]["crosses"] == kinds[kind]["crosses"], (axis, kind)
            checked += 1
    assert checked >= 2


def test_checkpoint_arithmetic():
    from simulator.scenario.load import load_scenario
    from simulator.workload.checkpoint import DEFAULT_STORAGE_GBPS, checkpoint_plan, mtbf_s

    s = load_scenario(str(ROOT / "scenarios" / "llama3-70b-64xh100.yaml"), ["cluster.storage_bandwidth_GBps=10"])
    c = checkpoint_plan(s, 70e9, 2.0, every_steps=(100,))
    assert c["checkpoint_bytes"] == 70e9 * 14
    assert c["full_write_s"] == pytest.approx(70e9 * 14 / 10e9)
    assert c["sharded_write_s"] == pytest.approx(c["full_write_s"] / 8)
    assert c["every"][0]["sharded_overhead"] == pytest.approx(c["sharded_write_s"] / 200)
    assert c["young_interval_s"] == pytest.approx(math.sqrt(2 * c["sharded_write_s"] * mtbf_s(64)))
    assert mtbf_s(16384) == pytest.approx(54 * 86400 / 419)
    default = checkpoint_plan(load_scenario(str(ROOT / "scenarios" / "tiny.yaml")), 1e9, 1.0)
    assert default["storage_default"] and default["storage_bandwidth_GBps_per_node"] == DEFAULT_STORAGE_GBPS


def test_storage_bandwidth_key_is_checked(capsys):
    line = _one_line_exit_2(["memory", str(ROOT / "scenarios" / "tiny.yaml"), "--set",
                             "cluster.storage_bandwidth_GBps=0"], capsys)
    assert "cluster.storage_bandwidth_GBps: got 0" in line


def test_fallback_design_picks_the_fastest_valid_neighbour():
    from simulator.studies.designdoc import fallback_design

    fb = fallback_design(str(ROOT / "scenarios" / "tiny.yaml"), workers=1)
    valid = [c for c in fb["candidates"] if c["dropped"] is None]
    assert valid and len(fb["candidates"]) >= 4
    assert fb["best"]["step_time_s"] == min(c["step_time_s"] for c in valid)
    assert all(c["change"] == pytest.approx(c["step_time_s"] / fb["baseline_step_time_s"] - 1) for c in valid)
