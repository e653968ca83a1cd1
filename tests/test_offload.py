"""CPU activation offloading: bytes off the GPU, the copies in the program, their time in the engine."""

import pytest

from simulator.common.errors import ConfigError
from simulator.reports.report import step_report
from simulator.scenario.load import scenario_from_dict
from simulator.layout.rules import validate_plan
from simulator.program import builder as P
from simulator.engine.engine import simulate
from simulator.engine.inputs import step_inputs
from simulator.engine.records import SimOptions
from simulator.studies.cases import case_to_scenario_dict
from simulator.workload.memory import layer_activation_bytes, memory_report, offload_bytes_per_layer
from simulator.workload.offload import module_offload_bytes

GiB = 2**30


def dense(**training):
    return scenario_from_dict({
        "model": "meta-llama/Llama-3.1-8B", "cluster": {"topology": "dgx-h100", "num_nodes": 1},
        "parallelism": {"tp": 1, "pp": 1},
        "training": {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 16, **training}})


def moe(**training):
    return scenario_from_dict({
        "model": "Qwen/Qwen3-30B-A3B", "cluster": {"topology": "dgx-h100", "num_nodes": 1},
        "parallelism": {"ep": 8},
        "training": {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 16, **training}})


def activations(s):
    return memory_report(s)["stages"][0]["activations_gib"] * GiB


def test_layer_offload_keeps_the_first_n_layers_activations_off_the_gpu():
    base, off = dense(), dense(activation_offload_layers=12)
    layer = layer_activation_bytes(base.model, 0, 4096, 1, 1, False, "none", flash_attention=True, dropout=False)
    # one micro-batch in flight at pp 1: twelve layers' activations leave (report rounds to 1e-4 GiB)
    assert activations(base) - activations(off) == pytest.approx(12 * layer, abs=2e-4 * GiB)
    assert offload_bytes_per_layer(off) == {x: pytest.approx(layer) for x in range(12)}
    said = memory_report(off)["assumptions"]["activation_offload"]
    assert said["layers"] == 12 and said["host_link_GBps"] == 64  # an H100 on PCIe Gen5 x16
    assert "activation_offload" not in memory_report(base)["assumptions"]


def test_module_bytes_are_the_tensors_each_module_saves():
    m = moe().model
    tokens, k, h, f = 4096, m.num_experts_per_tok, m.hidden_size, m.expert_intermediate_size
    # expert_fc1: each routed copy's expert input; moe_act: the activation's input (SwiGLU: gate and up)
    assert module_offload_bytes(m, 0, 4096, 1, 1, False, ("expert_fc1",)) == 2 * tokens * k * h
    assert module_offload_bytes(m, 0, 4096, 1, 1, False, ("moe_act",)) == 2 * tokens * k * 2 * f
    # FP8 GEMMs keep a 1-byte copy of their input: that is what expert_fc1 moves
    assert module_offload_bytes(m, 0, 4096, 1, 1, False, ("expert_fc1",), quantized_inputs=True) == tokens * k * h
    # a norm output that layernorm recompute already frees is not moved again
    assert module_offload_bytes(m, 0, 4096, 1, 1, False, ("qkv_linear",), recompute_modules=("layernorm",)) == 0
    assert module_offload_bytes(m, 0, 4096, 1, 1, False, ("qkv_linear",)) == 2 * tokens * h


def test_module_offload_frees_every_layer_but_the_margin_and_the_reload():
    mods = ("expert_fc1", "moe_act")
    base, off = moe(), moe(activation_offload_modules=list(mods))
    per_layer = module_offload_bytes(base.model, 0, 4096, 1, 1, False, mods, etp=1)
    layers = base.model.num_hidden_layers
    assert activations(base) - activations(off) == pytest.approx((layers - 2) * per_layer, abs=2e-4 * GiB)


def program(s):
    inputs = step_inputs(s, SimOptions())
    return inputs.programs[0]


def test_layer_offload_program_follows_transformer_engines_window():
    s = dense(activation_offload_layers=30)  # L = 32: at most 2 layers on the GPU
    ops = program(s)
    copies = [op for op in ops if isinstance(op, P.Copy)]
    m = s.num_microbatches
    assert sum(op.direction == "d2h" for op in copies) == 30 * m
    assert sum(op.direction == "h2d" for op in copies) == 30 * m
    waits = [op for op in ops if isinstance(op, P.Wait) and op.axis == "offload"]
    fwd = sorted({op.layer for op in waits if op.label == "d2h"})
    bwd = sorted({op.layer for op in waits if op.label == "h2d"})
    assert fwd == list(range(2, 32))  # layer j waits for layer j - 2's copy out
    assert bwd == list(range(30))  # every offloaded layer's backward waits for its copy back


def test_module_offload_never_stalls_the_forward():
    ops = program(moe(activation_offload_modules=["expert_fc1"]))
    waits = [op for op in ops if isinstance(op, P.Wait) and op.axis == "offload"]
    assert waits and all(op.label == "h2d" for op in waits)


def test_a_slow_host_link_shows_as_exposed_offload_bounded_by_the_copies():
    fast = simulate(dense())
    s = dense(activation_offload_layers=31)
    s = scenario_from_dict({**_dict(s), "cluster": {**_dict(s)["cluster"], "host_link_GBps": 5.0}})
    slow = simulate(s)
    copy_s = offload_bytes_per_layer(s)[0] / 5e9
    m = s.num_microbatches
    # window 1: the forward of layer 31 waits for layer 30's copy out, the copies run one after
    # another, and so do the reloads before the backward: per micro-batch both streams carry 31 copies
    assert slow.step_time_s >= 2 * 31 * m * copy_s
    exposed = step_report(slow)["time_breakdown_s"]["exposed_comm_s"]["offload"]
    assert 0 < exposed <= 2 * 31 * m * copy_s + 1e-9
    assert slow.step_time_s > fast.step_time_s
    # a fast link hides them: the same step as without offloading
    quick = scenario_from_dict({**_dict(s), "training": {**_dict(s)["training"], "activation_offload_layers": 4},
                                "cluster": {**_dict(s)["cluster"], "host_link_GBps": 1000.0}})
    assert simulate(quick).step_time_s == pytest.approx(fast.step_time_s, rel=1e-9)


def _dict(s):
    from simulator.scenario.load import scenario_to_dict

    return scenario_to_dict(s)


@pytest.mark.parametrize("training, parallelism, words", [
    ({"activation_offload_layers": 32}, {}, "below the model's 32 layers"),
    ({"activation_offload_layers": 4}, {"pp": 2}, "without pipeline parallelism"),
    ({"activation_offload_layers": 4, "recompute": "full"}, {}, "without recompute"),
    ({"activation_offload_modules": ["attn_proj"]}, {}, "add core_attn"),
    ({"activation_offload_modules": ["expert_fc1"]}, {}, "no experts"),
    ({"activation_offload_modules": ["core_attn"], "activation_offload_layers": 2}, {}, "not both"),
    ({"activation_offload_modules": ["core_attn"], "recompute": "full"}, {}, "recompute none or selective"),
])
def test_offload_settings_the_framework_refuses_are_one_line_errors(training, parallelism, words):
    d = {"model": "meta-llama/Llama-3.1-8B", "cluster": {"topology": "dgx-h100", "num_nodes": 1},
         "parallelism": parallelism, "training": {"seq_length": 4096, "global_batch_size": 16, **training}}
    with pytest.raises(ConfigError) as err:
        validate_plan(scenario_from_dict(d))
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("key, value", [
    ("activation_offload_layers", -1), ("activation_offload_layers", "20"), ("activation_offload_modules", ["mlp"]),
    ("activation_offload_modules", "expert_fc1"), ("activation_offload_modules", []),
])
def test_bad_offload_values_name_the_field(key, value):
    with pytest.raises(ConfigError) as err:
        scenario_from_dict({"model": "meta-llama/Llama-3.1-8B", "training": {key: value}})
    assert f"training.{key}" in str(err.value)


@pytest.mark.parametrize("value", [0, -5, "fast"])
def test_bad_host_link_names_the_field(value):
    with pytest.raises(ConfigError) as err:
        scenario_from_dict({"model": "meta-llama/Llama-3.1-8B", "cluster": {"host_link_GBps": value}})
    assert "cluster.host_link_GBps" in str(err.value)


def test_validate_reads_megatrons_offload_options():
    case = {"id": "x", "framework": "megatron-core", "precision": "bf16",
            "framework_options": {"cpu_offloading_num_layers": 20},
            "model": {"hf_id": "meta-llama/Meta-Llama-3-70B", "layers": 80, "hidden": 8192, "ffn_hidden": 28672,
                      "heads": 64, "kv_heads": 8, "vocab": 128256, "seq_len": 8192},
            "hardware": {"gpu": "GB300", "count": 64, "gpus_per_node": 64},
            "parallelism": {"tp": 1, "pp": 1, "dp": 64, "zero_stage": 3, "mbs": 2, "gbs": 256}}
    assert case_to_scenario_dict(case)["training"]["activation_offload_layers"] == 20
    case["framework_options"] = {"fine_grained_activation_offloading": ["core_attn", "attn_proj"]}
    assert case_to_scenario_dict(case)["training"]["activation_offload_modules"] == ["core_attn", "attn_proj"]


def test_perfetto_draws_the_copy_streams_one_lane_each():
    from collections import defaultdict

    from simulator.trace.perfetto import trace_events

    doc = trace_events(simulate(dense(activation_offload_layers=8)))
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    names = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert {"rank 0 d2h", "rank 0 h2d"} <= names
    lanes = defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            lanes[e["pid"], e["tid"]].append((e["ts"], e["ts"] + e["dur"], e["name"]))
    copies = [x for lane in lanes.values() for x in lane if x[2].startswith("offload")]
    assert len(copies) == 2 * 8 * dense().num_microbatches
    for lane in lanes.values():
        lane.sort()
        assert all(a[1] <= b[0] + 1e-3 for a, b in zip(lane, lane[1:]))
    # without offloading the threads are the usual three per rank
    plain = trace_events(simulate(dense()))
    plain = plain["traceEvents"] if isinstance(plain, dict) else plain
    assert not any(e.get("name") == "thread_name" and e["args"]["name"].endswith("d2h") for e in plain)


def test_the_planner_runs_layouts_the_offload_cannot_follow_without_it():
    from dataclasses import replace

    from simulator.studies.planner_space import apply_layout as layout_scenario, candidate_scenario, layout_of

    s = dense(activation_offload_layers=8)
    given = layout_of(s)
    assert layout_scenario(s, given).training.activation_offload_layers == 8
    piped = layout_scenario(s, replace(given, pp=2, dp=4))
    assert piped.training.activation_offload_layers == 0
    validate_plan(piped)
    assert layout_scenario(s, replace(given, recompute="full")).training.activation_offload_layers == 0
    mods = moe(activation_offload_modules=["expert_fc1"])
    assert layout_scenario(mods, replace(layout_of(mods), recompute="selective")).training.activation_offload_modules
    assert layout_scenario(mods, replace(layout_of(mods), recompute="full")).training.activation_offload_modules is None
    # the planner's fast path builds the same scenarios
    for base, layout in ((s, given), (s, replace(given, pp=2, dp=4)), (s, replace(given, recompute="selective")),
                         (mods, replace(layout_of(mods), recompute="full"))):
        assert candidate_scenario(base, layout) == layout_scenario(base, layout)


def test_a_plan_of_an_offloading_scenario_searches_pipelines_without_it():
    from simulator.studies.planner_space import enumerate_layouts, parse_space

    s = dense(activation_offload_layers=8)
    enum = enumerate_layouts(s, parse_space(["tp=1", "pp=1,2,4", "cp=1", "vp=1"], s))
    assert {x.pp for x in enum.valid} == {1, 2, 4}
    assert not any("activation_offload" in r for r in enum.pruned_rules)


def test_the_shipped_gb300_recipe_fits_only_with_its_offloading():
    from simulator.scenario.load import load_scenario
    from simulator.workload.memory import memory_peak

    s = load_scenario("scenarios/llama3-70b-64xgb300-offload.yaml")
    peak, capacity = memory_peak(s)
    assert s.training.activation_offload_layers == 20 and peak < capacity
    without, _ = memory_peak(load_scenario("scenarios/llama3-70b-64xgb300-offload.yaml",
                                           ["training.activation_offload_layers=0"]))
    assert without > capacity
