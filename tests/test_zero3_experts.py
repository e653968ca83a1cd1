"""ZeRO-3 on MoE models: expert weights are gathered and their gradients reduce-scattered over the
expert-data-parallel group, as the memory model shards them."""
import dataclasses

import pytest

from simulator.scenario.config import ClusterConfig, ModelConfig, ParallelConfig, Scenario, TrainingConfig
from simulator.studies.bound import step_lower_bound
from simulator.engine.engine import SimOptions, simulate
from simulator.engine.inputs import step_inputs
from simulator.program.builder import Launch, build_program
from simulator.studies import planner
from simulator.workload.memory import memory_report

MOE = ModelConfig(hidden_size=1024, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8,
                  intermediate_size=2048, vocab_size=32000, num_experts=8, num_experts_per_tok=2)


def scenario(ep=2, zero=3, nodes=2):
    return Scenario(name="t", model=MOE, cluster=ClusterConfig(topology="dgx-h100", num_nodes=nodes),
                    training=TrainingConfig(seq_length=1024, global_batch_size=32),
                    parallelism=ParallelConfig(dp=16, ep=ep, zero_stage=zero))


def test_experts_are_gathered_and_reduce_scattered_over_the_expert_data_parallel_group():
    s = scenario(ep=2)
    w = step_inputs(s).workload
    ops = build_program(s, w, 0)
    moe_layers = [layer for layer, n in w.layer_expert_params.items() if n > 0]
    assert moe_layers
    m = s.num_microbatches
    for op_name, nbytes in (("all_gather", 2), ("reduce_scatter", 4)):  # bf16 weights, fp32 gradients
        expert = [op for op in ops if isinstance(op, Launch) and op.group == "edp" and op.op == op_name]
        dense = [op for op in ops if isinstance(op, Launch) and op.group == "dpcp" and op.op == op_name]
        assert len(expert) == len(dense) // len(w.layer_dense_params) * len(moe_layers)
        assert sorted({op.nbytes for op in expert}) == [pytest.approx(w.layer_expert_params[moe_layers[0]] * nbytes)]
    # per micro-batch: gathered for the forward and again for the backward, reduced once
    gathers = [op for op in ops if isinstance(op, Launch) and op.group == "edp" and op.op == "all_gather"]
    assert len(gathers) == 2 * m * len(moe_layers)
    # the memory model holds 1 / (dp / ep) of the experts: what the gathers bring back
    assert memory_report(s)["assumptions"]["expert_shard_group"] == 8


def test_zero3_moe_costs_time_folds_exactly_and_stays_above_the_bound():
    s = scenario(ep=2)
    folded, unfolded = simulate(s, SimOptions(fold=True)), simulate(s, SimOptions(fold=False))
    assert folded.step_time_s == unfolded.step_time_s
    zero1 = simulate(dataclasses.replace(s, parallelism=dataclasses.replace(s.parallelism, zero_stage=1)))
    assert folded.step_time_s > zero1.step_time_s  # the expert gathers are not free
    w = step_inputs(s).workload
    assert step_lower_bound(s, w, planner.node_collective_time(s)) <= folded.step_time_s
