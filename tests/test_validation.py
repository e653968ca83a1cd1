"""Predictions against published, measured runs (shared/validation). Nothing here is fitted per case."""

import copy
from pathlib import Path

import pytest
import yaml

from simulator.collectives import bus_factor, time_collective
from simulator.topology import build_cluster, load_topology
from simulator.validate import case_to_scenario_dict, predict, validate_file

VALIDATION = Path(__file__).resolve().parents[2] / "shared" / "validation"


@pytest.fixture(scope="module")
def result():
    return validate_file(str(VALIDATION / "public-runs.yaml"), workers=2)


def test_every_published_case_is_simulated(result):
    assert result["summary"]["cases"] == result["summary"]["scored"] == 29


def test_step_time_within_20pct_for_at_least_80pct_of_cases(result):
    assert result["summary"]["within_20pct"] >= 0.80


def test_mape_at_most_10pct_and_no_case_worse_than_25pct(result):
    assert result["summary"]["mape"] <= 0.10
    assert result["summary"]["worst"] <= 0.25


def test_gpt3_h100_weak_scaling_follows_the_measured_ratios_within_3pct(result):
    rows = {r["id"]: r for r in result["rows"]}
    ids = [f"dgxc-gpt3-175b-bf16-{n}" for n in (128, 256, 512, 1024, 2048)]
    base = rows[ids[0]]
    for i in ids[1:]:
        measured = rows[i]["measured"]["step_time_s"] / base["measured"]["step_time_s"]
        predicted = rows[i]["predicted"]["step_time_s"] / base["predicted"]["step_time_s"]
        assert predicted == pytest.approx(measured, rel=0.03)


def test_predictions_do_not_read_the_measured_values():
    cases = yaml.safe_load((VALIDATION / "public-runs.yaml").read_text())["cases"]
    case = next(c for c in cases if c["id"] == "dgxc-llama31-8b-bf16-8")
    blind = copy.deepcopy(case)
    blind.pop("measured"), blind.pop("derived", None)
    assert case_to_scenario_dict(blind) == case_to_scenario_dict(case)
    assert predict(blind)["predicted"] == {k: v for k, v in predict(case)["predicted"].items()
                                           if k != "tflops_per_gpu"}


def test_h100_8gpu_all_reduce_curve_within_15pct_above_128MiB():
    data = yaml.safe_load((VALIDATION / "collectives.yaml").read_text())
    case = next(c for c in data["cases"] if c["id"] == "dgx-h100-8gpu-allreduce")
    cluster = build_cluster(load_topology("dgx-h100"), 1)
    points = [p for p in case["points"] if p["size_bytes"] >= 128 * 2**20]
    assert len(points) == 4
    for p in points:
        t, _ = time_collective(cluster, "all_reduce", range(8), p["size_bytes"])
        busbw = p["size_bytes"] / t / 1e9 * bus_factor("all_reduce", 8)
        assert busbw == pytest.approx(p["busbw_GBps"], rel=0.15)


def test_layer_times_of_korthikanti_table_4_within_15pct():
    """One 22B layer at TP8 on A100 (2022 Megatron: unfused attention), forward and backward."""
    import dataclasses

    from simulator.config import ClusterConfig, ModelConfig, ParallelConfig, Scenario, TrainingConfig
    from simulator.engine import SimOptions, simulate

    data = yaml.safe_load((VALIDATION / "layer-times.yaml").read_text())
    layer = data["layer"]
    model = ModelConfig(hidden_size=layer["hidden_size"], num_hidden_layers=1,
                        num_attention_heads=layer["num_attention_heads"],
                        num_key_value_heads=layer["num_attention_heads"],
                        intermediate_size=4 * layer["hidden_size"], vocab_size=51200)
    base = Scenario(name="layer", model=model,
                    cluster=ClusterConfig(topology="dgx-a100", num_nodes=1, gpu=layer["gpu"]),
                    training=TrainingConfig(seq_length=layer["seq_length"], micro_batch_size=layer["micro_batch_size"],
                                            global_batch_size=layer["micro_batch_size"], attention="unfused"),
                    parallelism=ParallelConfig(tp=layer["tp"], dp=1))
    settings = {"baseline (no recompute)": ("none", False), "sequence parallel only": ("none", True),
                "full recompute": ("full", False), "selective recompute": ("selective", False),
                "selective recompute + sequence parallel": ("selective", True)}
    for row in data["rows"]:
        recompute, sp = settings[row["experiment"]]
        s = dataclasses.replace(base, training=dataclasses.replace(base.training, recompute=recompute),
                                parallelism=dataclasses.replace(base.parallelism, sequence_parallel=sp))
        trace = simulate(s, SimOptions(extras=False)).trace
        fwd = sum(r.end - r.start for r in trace if r.stream == "step" and r.kind == "F")
        bwd = sum(r.end - r.start for r in trace if r.stream == "step" and r.kind == "B")
        assert fwd * 1e3 == pytest.approx(row["forward_ms"], rel=0.15), row["experiment"]
        assert bwd * 1e3 == pytest.approx(row["backward_ms"], rel=0.15), row["experiment"]
