"""Hybrid sharding (``parallelism.dp_replicate``): groups, bytes, memory and bad input."""
import dataclasses
import subprocess
import sys

import pytest

from simulator.scenario.config import ClusterConfig, FrameworkOptions, ModelConfig, ParallelConfig, Scenario, TrainingConfig
from simulator.common.errors import ConfigError
from simulator.layout.rules import validate_plan
from simulator.engine.engine import SimOptions, simulate
from simulator.layout.grid import Plan
from simulator.program.builder import Enqueue, build_program
from simulator.engine.inputs import step_inputs
from simulator.workload.memory import memory_report

DENSE = ModelConfig(hidden_size=1024, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8,
                    intermediate_size=4096, vocab_size=32000)


def scenario(dp=16, replicate=4, zero=3, nodes=2, model=DENSE):
    return Scenario(name="t", model=model, cluster=ClusterConfig(topology="dgx-h100", num_nodes=nodes),
                    training=TrainingConfig(seq_length=1024, global_batch_size=2 * dp),
                    parallelism=ParallelConfig(dp=dp, zero_stage=zero, dp_replicate=replicate))


def test_shard_groups_are_consecutive_and_replica_groups_strided():
    plan = Plan.build(tp=2, pp=1, dp=8, cp=1, dp_replicate=2)
    # rank = dp * tp + t; the shard group of rank 0 is DP ranks 0-3 at TP position 0
    assert plan.dp_cp_group(0) == (0, 2, 4, 6)
    assert plan.dp_cp_group(9) == (9, 11, 13, 15)
    assert plan.dp_replicate_group(0) == (0, 8)
    assert plan.dp_replicate_group(11) == (3, 11)
    on_stage = plan.groups_on_stage(0, "dpcp")
    assert sorted(r for g in on_stage for r in g) == list(range(16)) and all(len(g) == 4 for g in on_stage)
    assert on_stage == tuple(sorted({plan.dp_cp_group(r) for r in range(16)}))
    assert plan.groups_on_stage(0, "dprep") == tuple(sorted({plan.dp_replicate_group(r) for r in range(16)}))
    # one copy: the whole DP x CP group, as before
    assert Plan.build(tp=2, pp=1, dp=8).dp_cp_group(0) == tuple(range(0, 16, 2))


def test_gradients_reduce_scatter_in_the_copy_then_all_reduce_a_slice_across_copies():
    s = scenario(dp=16, replicate=4)
    inputs = step_inputs(s)
    ops = build_program(s, inputs.workload, 0)
    rs = [op for op in ops if isinstance(op, Enqueue) and op.op == "reduce_scatter"]
    ar = [op for op in ops if isinstance(op, Enqueue) and op.op == "all_reduce"]
    assert rs and len(rs) == len(ar)
    for a, b in zip(rs, ar):
        assert (a.group, b.group) == ("dpcp", "dprep")
        assert b.nbytes == pytest.approx(a.nbytes / 4)  # shard group dp 16 / 4 copies
    assert not [op for op in build_program(scenario(replicate=1), inputs.workload, 0)
                if getattr(op, "group", None) == "dprep"]


def test_memory_shards_over_one_copy():
    full, hybrid = memory_report(scenario(replicate=1)), memory_report(scenario(replicate=4))
    assert hybrid["assumptions"]["dense_shard_group"] == 4 and full["assumptions"]["dense_shard_group"] == 16
    f, h = full["stages"][0], hybrid["stages"][0]
    # optimizer states and ZeRO-3 weights/gradients are 4x larger per rank with 4x smaller shards
    # (the report rounds to 1e-4 GiB)
    assert h["optimizer_gib"] == pytest.approx(4 * f["optimizer_gib"], abs=5e-4)
    assert h["weights_gib"] == pytest.approx(4 * f["weights_gib"], abs=5e-4)


def test_copies_across_nodes_put_the_all_reduce_on_the_network():
    # 2 nodes x 8 GPUs, shard group = one node: the reduce-scatter stays on NVLink, only the 1/8
    # slice crosses the network. On a network far slower than NVLink (100 Gb/s per NIC) that makes
    # the step faster than sharding over both nodes; on 400 Gb/s NICs the 16-rank rings' eight
    # channels carry about as much as one node's NVLink (370 GB/s per GPU at NCCL's rating), so
    # the two are within a few percent and the copies' extra all-reduce can tip it either way.
    def on(gbps, replicate):
        s = scenario(dp=16, replicate=replicate)
        return simulate(dataclasses.replace(s, cluster=dataclasses.replace(s.cluster, network_bandwidth_Gbps=gbps)))
    assert on(100, 2).step_time_s < on(100, 1).step_time_s
    assert on(400, 2).step_time_s == pytest.approx(on(400, 1).step_time_s, rel=0.03)


@pytest.mark.parametrize("kw, needle", [
    (dict(dp=16, replicate=3), "must divide dp (16)"),
    (dict(dp=16, replicate=2, zero=0), "needs zero_stage 1, 2 or 3"),
])
def test_bad_dp_replicate_is_a_one_line_error(kw, needle):
    with pytest.raises(ConfigError) as e:
        validate_plan(scenario(**kw))
    assert "parallelism.dp_replicate" in str(e.value) and needle in str(e.value)


def test_cli_rejects_bad_dp_replicate_with_exit_2(tmp_path):
    y = tmp_path / "s.yaml"
    y.write_text("model: meta-llama/Llama-3.1-8B\ncluster: {topology: dgx-h100, num_nodes: 2}\n"
                 "training: {seq_length: 4096, global_batch_size: 32}\n"
                 "parallelism: {dp: 16, zero_stage: 3, dp_replicate: 0}\n")
    r = subprocess.run([sys.executable, "-m", "simulator", "run", str(y)], capture_output=True, text=True)
    assert r.returncode == 2 and "parallelism.dp_replicate" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_maxtext_combines_the_cross_copy_all_reduces_into_groups_of_at_most_the_threshold():
    """XLA's all-reduce combiner (``framework_options.replica_combine_bytes`` = 1 GiB, MaxText with
    unscanned layers): the same bytes cross the copies in fewer, larger all-reduces, each launched
    after the reduce-scatter of its last layer; MaxText's default (scanned layers) and torchtitan
    keep one per layer."""
    base = scenario(dp=16, replicate=4)
    per_layer = dataclasses.replace(base, framework="torchtitan")
    combined = dataclasses.replace(base, framework="maxtext",
                                   framework_options=FrameworkOptions(replica_combine_bytes=2 ** 30))
    scanned = dataclasses.replace(base, framework="maxtext")
    assert [op.nbytes for op in build_program(scanned, step_inputs(scanned).workload, 0)
            if isinstance(op, Enqueue) and op.group == "dprep"] == \
        [op.nbytes for op in build_program(per_layer, step_inputs(per_layer).workload, 0)
         if isinstance(op, Enqueue) and op.group == "dprep"]
    ars = {}
    for name, s in (("per_layer", per_layer), ("combined", combined)):
        ops = build_program(s, step_inputs(s).workload, 0)
        ars[name] = [op.nbytes for op in ops if isinstance(op, Enqueue) and op.group == "dprep"]
    layer, m = ars["per_layer"][0], base.num_microbatches
    assert m == 2 and len(ars["per_layer"]) == DENSE.num_hidden_layers * m  # ZeRO-3 reduces every micro-batch
    assert sum(ars["combined"]) == pytest.approx(sum(ars["per_layer"]))
    # 8 layers of 12.6 MB fit far under 1 GiB: one all-reduce after each backward pass
    assert ars["combined"] == [pytest.approx(8 * layer)] * m
    # a 2.5-layer threshold: groups of two layers (a third would not fit), the remainder at the end
    sw = step_inputs(combined).workload
    small = dataclasses.replace(sw, software=dataclasses.replace(sw.software, fsdp_replica_combine_bytes=2.5 * layer))
    ops = build_program(combined, small, 0)
    assert [op.nbytes for op in ops if isinstance(op, Enqueue) and op.group == "dprep"] == \
        [pytest.approx(2 * layer)] * 4 * m


def test_combined_cross_copy_all_reduces_fold_exactly():
    s = dataclasses.replace(scenario(dp=16, replicate=4), framework="maxtext",
                            framework_options=FrameworkOptions(replica_combine_bytes=2 ** 30))
    folded = simulate(s, SimOptions(fold=True))
    unfolded = simulate(s, SimOptions(fold=False))
    assert folded.step_time_s == unfolded.step_time_s


@pytest.mark.parametrize("value", [-1, "1GiB", True])
def test_bad_replica_combine_bytes_is_a_one_line_error(tmp_path, value):
    import yaml
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"model": "meta-llama/Llama-3.1-8B", "cluster": {"topology": "dgx-h100", "num_nodes": 2},
                                    "training": {"seq_length": 1024, "global_batch_size": 32},
                                    "parallelism": {"dp": 16, "zero_stage": 3, "dp_replicate": 2},
                                    "framework": "maxtext", "framework_options": {"replica_combine_bytes": value}}))
    out = subprocess.run([sys.executable, "-m", "simulator", "run", str(path)], capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "framework_options.replica_combine_bytes" in lines[0] and ">= 0" in lines[0]
