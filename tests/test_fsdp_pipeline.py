"""ZeRO-3 under pipeline parallelism: per micro-batch (stepsim's reference) or gathered once per
step as torch pipelining runs FSDP2 (``fsdp.pipeline_unsharded``, torchtitan)."""
import dataclasses

import pytest
from collections import Counter


from simulator.scenario.config import ClusterConfig, ModelConfig, ParallelConfig, Scenario, TrainingConfig
from simulator.engine.inputs import step_inputs
from simulator.program.builder import Enqueue, Launch, StepEnd, build_program
from simulator.workload.memory import memory_report

MODEL = ModelConfig(hidden_size=1024, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8,
                    intermediate_size=4096, vocab_size=32000)
M = 4  # micro-batches


def scenario(framework, pp=2, vp=1):
    return Scenario(name="t", model=MODEL, cluster=ClusterConfig(topology="dgx-h100", num_nodes=2),
                    training=TrainingConfig(seq_length=1024, global_batch_size=M * 8),
                    parallelism=ParallelConfig(tp=1, pp=pp, dp=8, vp=vp, zero_stage=3),
                    schedule="interleaved" if vp > 1 else "1f1b", framework=framework)


def fsdp_ops(s, stage=0):
    ops = build_program(s, step_inputs(s).workload, stage)
    gathers = [op for op in ops if isinstance(op, Launch) and op.axis == "fsdp" and op.op == "all_gather"]
    scatters = [op for op in ops if isinstance(op, (Launch, Enqueue)) and op.op == "reduce_scatter"]
    return ops, gathers, scatters


def test_torch_pipelining_gathers_each_layer_once_and_reduce_scatters_after_the_last_backward():
    s = scenario("torchtitan")
    layers = 8 // 2
    ops, gathers, scatters = fsdp_ops(s)
    assert len(gathers) == layers and len(scatters) == layers
    # every reduce-scatter comes after the last backward step of the chunk
    last_b = max(i for i, op in enumerate(ops) if isinstance(op, StepEnd) and op.kind == "B")
    first_rs = min(ops.index(op) for op in scatters)
    assert first_rs > max(i for i, op in enumerate(ops) if isinstance(op, StepEnd) and op.kind == "F")
    assert first_rs < last_b + 3  # issued right at the end of that backward, before its send
    assert all(isinstance(op, Enqueue) for op in scatters)  # FSDP's reduce stream, one after another


def test_reference_zero3_gathers_per_micro_batch_in_forward_and_backward():
    _, gathers, scatters = fsdp_ops(scenario("megatron-core"))
    layers = 8 // 2
    assert len(gathers) == 2 * M * layers and len(scatters) == M * layers


def test_interleaved_chunks_each_keep_their_layers_gathered():
    _, gathers, scatters = fsdp_ops(scenario("torchtitan", pp=2, vp=2))
    assert len(gathers) == 4 and len(scatters) == 4  # 8 layers / 2 stages, both chunks
    assert Counter(op.nbytes for op in gathers) == Counter(op.nbytes for op in gathers[:1] * 4)


def test_without_a_pipeline_torchtitan_keeps_per_micro_batch_fsdp():
    s = dataclasses.replace(scenario("torchtitan", pp=1), parallelism=ParallelConfig(dp=16, zero_stage=3))
    _, gathers, _ = fsdp_ops(s)
    assert len(gathers) == 2 * (M * 8 // 16) * 8


def test_gathered_once_holds_the_stage_unsharded():
    tt, ref = scenario("torchtitan"), scenario("megatron-core")
    a, b = memory_report(tt), memory_report(ref)
    # the stage's layers (and their unsharded gradients) stay on the GPU: more than two units in flight
    assert a["stages"][0]["other_gib"] > b["stages"][0]["other_gib"]
    assert "under a pipeline" in a["assumptions"]["comm_buffers"]


def test_deepspeed_releases_modules_whose_backward_is_further_than_the_reuse_distance():
    """DeepSpeed ZeRO-3 (stage3_max_reuse_distance 1e9): between module i's recompute and its
    backward run the recompute and backward of every later module of the layer, 2 x their
    parameters. GPT-3 175B's layer (qkv 453M, proj 151M, fc1 604M, fc2 604M): only fc2 stays; a
    Llama-70B layer (qkv 84M, o 67M, gate/up 470M, down 235M): the two attention projections go."""
    from simulator.workload.compute import regathered_params
    assert regathered_params((453e6, 151e6, 604e6, 604e6), 1e9) == 453e6 + 151e6 + 604e6
    assert regathered_params((84e6, 67e6, 470e6, 235e6), 1e9) == 84e6 + 67e6
    assert regathered_params((50e6, 17e6, 117e6, 59e6), 1e9) == 0  # an 8B layer: nothing is far enough
    assert regathered_params((453e6, 151e6, 604e6, 604e6), 0) == 0  # FSDP: the unit stays gathered
    assert regathered_params((100.0, 100.0), 200.0) == 100.0  # at the distance exactly, released


def test_under_full_recompute_a_deepspeed_backward_gathers_the_released_modules_again():
    """The backward gather of a ZeRO-3 layer carries the re-gathered modules under DeepSpeed with
    full recompute, and only then: not without recompute, not under an FSDP stack."""
    from simulator.workload.compute import forward_weights, regathered_params

    big = dataclasses.replace(MODEL, hidden_size=12288, num_attention_heads=96, num_key_value_heads=96,
                              intermediate_size=4 * 12288, hidden_act="gelu", num_hidden_layers=2)

    def gathers(framework, recompute):
        s = dataclasses.replace(scenario(framework, pp=1), model=big,
                                training=TrainingConfig(seq_length=1024, global_batch_size=8, recompute=recompute))
        work = step_inputs(s).workload
        ops = build_program(s, work, 0)
        return [op.nbytes for op in ops if isinstance(op, Launch) and op.axis == "fsdp" and op.op == "all_gather"], work

    (plain, work), (ds, _) = gathers("torchtitan", "full"), gathers("deepspeed", "full")
    again = regathered_params(forward_weights(work.layer_costs[0], False), 1e9)
    assert again == pytest.approx(3 * 12288 ** 2 + 12288 ** 2 + 4 * 12288 ** 2)  # qkv, proj, fc1
    forward, backward = plain[:2], plain[2:]
    assert ds[:2] == forward and ds[2:] == [b + 2 * again for b in backward]  # 16-bit parameters
    assert gathers("deepspeed", "none")[0] == gathers("torchtitan", "none")[0]


def test_deepspeed_prefetch_and_reduce_buckets_count_the_calls_of_a_layer():
    """DeepSpeed ZeRO-3 prefetches the next parameters in one all-gather until the call holds at
    least 5e7 elements, and reduce-scatters a gradient bucket when the next gradient would take it
    past 5e8: GPT-3 175B's weights (453M, 151M, 604M, 604M) each go in a call of their own, four
    per pass; an 8B Llama layer (50M, 17M, 117M, 59M) in three; tiny layers share calls across
    layers, counted as one per layer (the unit gather every other stack makes)."""
    from simulator.workload.compute import bucket_reduce_calls, module_gather_calls, released_weights
    gpt3 = (453e6, 151e6, 604e6, 604e6)
    assert module_gather_calls(gpt3, 5e7) == 4
    assert module_gather_calls((50e6, 17e6, 117e6, 59e6), 5e7) == 3  # 50 | 17+117 | 59
    assert module_gather_calls((1e6, 2e6), 5e7) == 1.0
    assert module_gather_calls(gpt3, 0) == 1.0  # FSDP: one call per unit
    assert bucket_reduce_calls(tuple(reversed(gpt3)), 5e8) == 4  # 604 | 604 | 151 | 453 (+ the next layer's 604 > 500)
    assert bucket_reduce_calls((100e6,) * 4, 5e8) == 1.0  # 400M per layer: a bucket spans layers
    assert bucket_reduce_calls(gpt3, 0) == 1.0
    assert released_weights(gpt3, 1e9) == (453e6, 151e6, 604e6)  # in forward order
    assert released_weights(gpt3, 0) == ()


def test_a_call_count_is_that_many_calls_of_the_share_back_to_back():
    """A collective of ``calls`` calls takes ``calls`` times one call of ``size / calls`` alone."""
    from simulator.network.cluster import build_cluster
    from simulator.network.collectives import time_collective
    from simulator.parts.topology import load_topology
    cluster = build_cluster(load_topology("dgx-a100"), 4)
    for op in ("all_gather", "reduce_scatter"):
        one, _ = time_collective(cluster, op, range(32), 2**28 / 4)
        four, _ = time_collective(cluster, op, range(32), 2**28, calls=4)
        assert four == pytest.approx(4 * one, rel=1e-9)
        assert time_collective(cluster, op, range(32), 2**28, calls=1.0)[0] == time_collective(cluster, op, range(32), 2**28)[0]


def test_deepspeed_zero3_pays_a_call_latency_per_module_that_grows_with_the_ranks(tmp_path):
    """The same GPT-3-shaped ZeRO-3 layer under DeepSpeed gathers in four calls per forward and
    seven per backward under full recompute (qkv, proj and fc1 again), and reduces in four, where
    torchtitan's FSDP2 gathers and reduces once. Against the same profile with one call per unit
    the step is longer, and more so on more ranks: each ring call waits n - 1 steps."""
    import yaml
    from simulator import run
    from simulator.common import resources

    big = dataclasses.replace(MODEL, hidden_size=12288, num_attention_heads=96, num_key_value_heads=96,
                              intermediate_size=4 * 12288, hidden_act="gelu", num_hidden_layers=2)

    def case(framework, nodes):
        return Scenario(name="t", model=big, cluster=ClusterConfig(topology="dgx-a100", num_nodes=nodes),
                        training=TrainingConfig(seq_length=1024, global_batch_size=8 * nodes, recompute="full"),
                        parallelism=ParallelConfig(tp=1, pp=1, dp=8 * nodes, zero_stage=3), framework=framework)

    ops = build_program(case("deepspeed", 2), step_inputs(case("deepspeed", 2)).workload, 0)
    calls = [op.calls for op in ops if isinstance(op, Launch) and op.axis == "fsdp" and op.op == "all_gather"]
    assert calls == [4, 4, 7, 7]
    scatters = [op.calls for op in ops if isinstance(op, (Launch, Enqueue)) and op.op == "reduce_scatter"]
    assert scatters == [4, 4]
    plain = build_program(case("torchtitan", 2), step_inputs(case("torchtitan", 2)).workload, 0)
    assert {op.calls for op in plain if isinstance(op, (Launch, Enqueue))} == {1.0}

    prof = yaml.safe_load(resources.entry("frameworks", "deepspeed").read_text())
    prof["fsdp"]["gather_bucket_params"]["value"] = 0
    prof["fsdp"]["reduce_bucket_params"]["value"] = 0
    unit = tmp_path / "deepspeed-unit-calls.yaml"
    unit.write_text(yaml.safe_dump(prof))
    extra = {n: run(case("deepspeed", n)).step_time_s - run(case(str(unit), n)).step_time_s for n in (2, 16)}
    assert 0 < extra[2] < extra[16]

    # the communication map counts the calls, not the collectives that carry them: 4 + 4 + 7 + 7 gathers
    # and 4 + 4 reduce-scatters per rank over the two layers
    counts = {(axis, op): calls for rank, axis, op, calls, _, _ in run(case("deepspeed", 2)).result.comm_calls
              if rank == 0 and axis == "fsdp"}
    assert counts == {("fsdp", "all_gather"): 22, ("fsdp", "reduce_scatter"): 8}
