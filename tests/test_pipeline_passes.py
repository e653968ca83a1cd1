"""training.pipeline_passes: a step that runs the pipeline schedule several times (a gradient
accumulation loop around torch pipelining's schedule.step, as NeMo AutoModel runs it)."""

import dataclasses

import pytest

from simulator.scenario.config import ClusterConfig, ModelConfig, ParallelConfig, Scenario, TrainingConfig
from simulator.common.errors import ConfigError
from simulator.scenario.load import scenario_from_dict
from simulator.layout.rules import validate_plan
from simulator.engine.engine import simulate
from simulator.program.builder import build_program, schedule_steps
from simulator.studies.cases import case_to_scenario_dict
from simulator.workload.memory import memory_report

MODEL = ModelConfig(hidden_size=1024, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8,
                    intermediate_size=4096, vocab_size=64, hidden_act="gelu")


def scen(m, passes=1, pp=2, zero=0, framework="megatron-core"):
    """One pipeline (dp 1, tp 1) of ``pp`` stages on one node, ``m`` micro-batches per step."""
    return Scenario(name="t", model=MODEL, cluster=ClusterConfig(num_nodes=1, gpus_per_node=pp),
                    training=TrainingConfig(seq_length=1024, micro_batch_size=1, global_batch_size=m,
                                            pipeline_passes=passes),
                    parallelism=ParallelConfig(pp=pp, dp=1, zero_stage=zero), framework=framework)


def test_the_schedule_repeats_once_per_pass_on_fresh_micro_batches():
    one = schedule_steps(scen(2), 0)
    two = schedule_steps(scen(4, passes=2), 0)
    assert len(two) == 2 * len(one)
    assert [(st.kind, st.microbatch) for st in two[:len(one)]] == [(st.kind, st.microbatch) for st in one]
    assert [(st.kind, st.microbatch - 2) for st in two[len(one):]] == [(st.kind, st.microbatch) for st in one]


def test_two_passes_take_two_single_passes_less_the_shared_optimizer_step():
    """In 1F1B the first stage ends a pass (its last backward), so the second pass starts from
    idle stages and repeats the first, shifted by its length: T(2 passes of m/2) = T(m/2) +
    (T(m/2) - optimizer). One schedule over m micro-batches fills and drains once and is shorter."""
    half = simulate(scen(4))
    passes = simulate(scen(8, passes=2))
    whole = simulate(scen(8))
    opt = half.workload.optimizer[0].time_s
    assert passes.step_time_s == pytest.approx(2 * half.step_time_s - opt, rel=1e-4)
    # near-uniform stages: the bubble is (p - 1) forward-backward pairs per fill-drain, one more with
    # two passes (the last stage also launches the loss's eight kernels per micro-batch: 8%, not 5%)
    pair = (whole.step_time_s - half.step_time_s) / 4  # four more micro-batches' forward and backward
    assert passes.step_time_s - whole.step_time_s == pytest.approx(pair * (2 - 1), rel=0.08)


def test_passes_must_divide_the_micro_batches():
    with pytest.raises(ConfigError) as err:
        validate_plan(scen(8, passes=3))
    assert err.value.field == "training.pipeline_passes"
    d = {"name": "t", "model": {"hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8,
                                "intermediate_size": 4096, "vocab_size": 64},
         "cluster": {"num_nodes": 1, "gpus_per_node": 2},
         "training": {"global_batch_size": 8, "pipeline_passes": 0}, "parallelism": {"pp": 2, "dp": 1}}
    with pytest.raises(ConfigError) as err:
        scenario_from_dict(d)
    assert err.value.field == "training.pipeline_passes"


def test_activations_in_flight_are_those_of_one_pass():
    """1F1B holds min(p - s, m) micro-batches on stage s (Narayanan et al. 2021): per pass."""
    per_pass = memory_report(scen(2, pp=4))["stages"][0]["activations_gib"]
    passes = memory_report(scen(8, passes=4, pp=4))["stages"][0]["activations_gib"]
    whole = memory_report(scen(8, pp=4))["stages"][0]["activations_gib"]
    assert passes == pytest.approx(per_pass) and whole > passes


def test_fsdp_under_torch_pipelining_gathers_and_reduces_once_per_pass():
    """torch pipelining keeps FSDP units gathered through a schedule step and runs their
    post-backward (reduce-scatter) at its last backward: two passes, twice the collectives."""
    def fsdp_rows(s):
        ops = [op for op in build_program(s, simulate(s).workload, 0) if getattr(op, "axis", "") == "fsdp"]
        ops = [getattr(op, "op", "") for op in ops]
        return ops.count("all_gather"), ops.count("reduce_scatter")

    s = dataclasses.replace(scen(4, zero=3, framework="torchtitan"),
                            cluster=ClusterConfig(num_nodes=1, gpus_per_node=4),
                            parallelism=ParallelConfig(pp=2, dp=2, zero_stage=3))
    s = dataclasses.replace(s, training=dataclasses.replace(s.training, global_batch_size=8))
    gathers, reduces = fsdp_rows(s)
    assert gathers > 0 and reduces > 0
    twice = dataclasses.replace(s, training=dataclasses.replace(s.training, pipeline_passes=2))
    assert fsdp_rows(twice) == (2 * gathers, 2 * reduces)


def test_validate_reads_pipeline_passes_from_framework_options():
    import yaml
    from pathlib import Path

    cases = yaml.safe_load((Path(__file__).parent / "data" / "moe-runs.yaml").read_text())["cases"]
    kimi = next(c for c in cases if c["id"] == "automodel-h100-kimi-k2-bf16-256")
    d = case_to_scenario_dict(kimi)
    assert d["training"]["pipeline_passes"] == 2
    s = scenario_from_dict(d)
    assert s.microbatches_per_pass == s.num_microbatches // 2
