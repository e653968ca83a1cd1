"""Every file in scenarios/ loads, validates, fits, runs, and gives a physically sane report."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.engine.engine import simulate
from simulator.workload.memory import memory_report
from simulator.reports.report import step_report
from simulator.scenario.load import load_scenario
from simulator.layout.rules import validate_plan

SCENARIOS = sorted((Path(__file__).resolve().parents[1] / "scenarios").glob("*.yaml"))
REPORT_FIELDS = {"step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu",
                 "bubble_fraction", "bubble_fraction_per_stage", "time_breakdown_s", "memory_gib_per_gpu",
                 "sim_wall_s", "events", "hfu", "flops_convention"}


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_shipped_scenario_runs_and_is_physically_sane(path, shipped_result):
    s = load_scenario(str(path))
    assert all(isinstance(w, str) for w in validate_plan(s))
    assert memory_report(s)["fits"]
    r = step_report(shipped_result(path))
    assert r["step_time_s"] > 0 and 0 < r["mfu"] < 1 and 0 <= r["bubble_fraction"] < 1
    assert r["mfu"] <= r["hfu"] < 1, "one attention convention: recompute can only add hardware FLOPs"
    assert (r["hfu"] == r["mfu"]) == (s.training.recompute == "none")
    assert r["tokens_per_s"] == pytest.approx(s.training.global_batch_size * s.training.seq_length / r["step_time_s"])
    for st in r["stages"]:
        total = st["compute_s"] + sum(st["exposed_comm_s"].values()) + st["idle_s"]
        assert total == pytest.approx(r["step_time_s"], rel=1e-9)


def test_run_json_has_the_contract_fields():
    proc = subprocess.run([sys.executable, "-m", "simulator", "run", "scenarios/tiny.yaml", "--json"],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert REPORT_FIELDS <= set(report)
    assert set(report["time_breakdown_s"]) == {"compute_s", "exposed_comm_s", "idle_s", "contention_s", "host_wait_s"}
    assert 0 < report["time_breakdown_s"]["contention_s"] < report["time_breakdown_s"]["compute_s"]
    assert 0 <= report["time_breakdown_s"]["host_wait_s"] < report["time_breakdown_s"]["compute_s"]
    assert report["memory_gib_per_gpu"]["stages"][0]["stage"] == 0


def test_set_overrides_reach_the_simulation(capsys):
    from simulator.cli import main
    assert main(["run", "scenarios/tiny.yaml", "--json", "--set", "parallelism.tp=4",
                 "--set", "parallelism.dp=1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["layout"]["tp"] == 4 and report["layout"]["dp"] == 1


@pytest.mark.parametrize("argv, field", [
    (["run", "scenarios/tiny.yaml", "--set", "parallelism.tp=16", "--set", "parallelism.dp=null",
      "--set", "cluster.num_nodes=4"], "parallelism.tp"),
    (["run", "scenarios/tiny.yaml", "--set", "parallelism.tensor=2"], "parallelism.tensor"),
    (["run", "scenarios/no-such-file.yaml"], "scenario"),
    (["run", "scenarios/tiny.yaml", "--set", "parallelism.tp=1", "--set", "parallelism.pp=1",
      "--set", "parallelism.dp=8", "--set", "model.hidden_size=16384", "--set", "model.num_attention_heads=128",
      "--set", "model.num_key_value_heads=128", "--set", "model.num_hidden_layers=64"], "memory"),
    (["memory", "scenarios/tiny.yaml", "--set", "training.precision=fp4"], "training.precision"),
])
def test_bad_scenarios_get_one_line_errors_and_exit_2(argv, field):
    proc = subprocess.run([sys.executable, "-m", "simulator", *argv], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and f"error: {field}" in proc.stderr and "Traceback" not in proc.stderr


def test_memory_json_contract(capsys):
    from simulator.cli import main
    assert main(["memory", "scenarios/gpt3-175b-1024xa100.yaml", "--json"]) == 0
    mem = json.loads(capsys.readouterr().out)
    assert {"stages", "peak_gib", "fits"} <= set(mem)
    assert {"stage", "weights_gib", "gradients_gib", "optimizer_gib", "activations_gib", "other_gib",
            "total_gib", "capacity_gib", "fits"} <= set(mem["stages"][0])


def test_the_seed_004_plan_costs_what_it_really_costs():
    """The plan claims 16 MB per GPU, 12.5 ms per forward pass and 95% utilisation."""
    s = load_scenario(str(Path(__file__).resolve().parents[1] / "scenarios" / "seed004-moe-ep64-tp2-128gpu.yaml"))
    mem = memory_report(s)
    assert mem["peak_gib"] * 2**30 > 50 * 16 * 2**20  # its weights, states and buffers alone
    r = step_report(simulate(s))
    assert r["mfu"] < 0.5  # nowhere near 95%
    assert r["time_breakdown_s"]["exposed_comm_s"]["ep"] > 0.2 * r["step_time_s"]  # all-to-all over 100 Gb/s


def test_tiny_bubble_is_what_its_comment_says():
    """tiny.yaml's comment: 25.0% (stage 0 37.7%, stage 1 12.3%) because stage 1 carries the LM head;
    with the head made negligible the stages are uniform and the bubble is the 1F1B (p-1)/(m+p-1) = 1/5."""
    tiny = Path(__file__).resolve().parents[1] / "scenarios" / "tiny.yaml"
    text = tiny.read_text()
    assert "25.0% (stage 0" in text and "37.7%, stage 1 12.3%" in text and "19.4%" in text
    r = step_report(simulate(load_scenario(str(tiny))))
    assert round(r["bubble_fraction"], 3) == 0.25
    assert [round(b, 3) for b in r["bubble_fraction_per_stage"]] == [0.377, 0.123]
    assert r["stages"][1]["compute_s"] > 1.4 * r["stages"][0]["compute_s"]
    uniform = step_report(simulate(load_scenario(str(tiny), ["model.vocab_size=64"])))
    assert round(uniform["bubble_fraction"], 3) == 0.194
    # the DP all-reduce after the pipeline lengthens the step, not the pipeline's idle time
    b = uniform["time_breakdown_s"]
    assert b["idle_s"] / (uniform["step_time_s"] - b["exposed_comm_s"]["dp"]) == pytest.approx(1 / 5, abs=0.005)
