"""Memory per GPU: the ZeRO paper's example, Korthikanti et al.'s formulas, schedules, properties."""

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.workload.compute import param_counts
from simulator.scenario.config import ClusterConfig, ModelConfig, ParallelConfig, Scenario, TrainingConfig
from simulator.common.errors import ConfigError
from simulator.workload.memory import (HEADROOM_FRACTION, korthikanti_activation_bytes, layer_activation_bytes, memory_report, microbatches_in_flight, model_state_bytes, stage_layers, stage_memory)
from simulator.reports.memory import format_memory_table, headroom_note
from simulator.layout.schedules import SCHEDULES
from simulator.common.units import GiB

GPT3 = ModelConfig(
    hidden_size=12288, num_hidden_layers=96, num_attention_heads=96, num_key_value_heads=96,
    intermediate_size=4 * 12288, vocab_size=51200,
)
TINY = ModelConfig(
    hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
    intermediate_size=256, vocab_size=100,
)
MOE = ModelConfig(
    hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=256, vocab_size=100, hidden_act="silu", num_experts=8, num_experts_per_tok=2,
    moe_intermediate_size=32, num_shared_experts=1, first_k_dense_replace=1,
)
A100_1024 = ClusterConfig(topology="dgx-a100", num_nodes=128, gpus_per_node=8, gpu="A100-SXM4-80GB")


def gpt3_scenario(**parallel) -> Scenario:
    """GPT-3 175B on 1024 A100-80GB, Megatron-LM's recipe (Narayanan et al. 2021, Korthikanti et al. 2022)."""
    par = dict(tp=8, pp=8, sequence_parallel=True, zero_stage=1)
    par.update(parallel)
    return Scenario(
        name="gpt3-175b",
        model=GPT3,
        cluster=A100_1024,
        training=TrainingConfig(seq_length=2048, micro_batch_size=1, global_batch_size=1536, recompute="selective"),
        parallelism=ParallelConfig(**par),
    )


def tiny_scenario(model=TINY, schedule="1f1b", gpus=8, gbs=16, recompute="none", **parallel) -> Scenario:
    return Scenario(
        name="tiny",
        model=model,
        cluster=ClusterConfig(num_nodes=1, gpus_per_node=gpus, gpu="H100"),
        training=TrainingConfig(seq_length=32, micro_batch_size=1, global_batch_size=gbs, recompute=recompute),
        parallelism=ParallelConfig(**parallel),
        schedule=schedule,
    )


# --- ZeRO (Rajbhandari et al. 2020, Fig. 1) ------------------------------------------------------


@pytest.mark.parametrize("zero_stage, expected_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_example(zero_stage, expected_gb):
    assert round(model_state_bytes(7.5e9, 64, zero_stage) / 1e9, 1) == expected_gb


def test_model_state_bytes_configurable():
    assert model_state_bytes(1e9, 8, 0, weight_bytes=2, grad_bytes=4, optimizer_bytes=12) == 18e9
    assert model_state_bytes(1e9, 8, 3, weight_bytes=2, grad_bytes=4, optimizer_bytes=12) == 18e9 / 8
    with pytest.raises(ConfigError, match="zero_stage"):
        model_state_bytes(1e9, 8, 4)


# --- Activations (Korthikanti et al. 2022, Table 2) ----------------------------------------------

# (s, b, h, a, t): the paper's 22B, 175B, 530B and 1T models (Table 3) and small odd values.
SHAPES = [
    (2048, 4, 6144, 64, 8),
    (2048, 1, 12288, 96, 8),
    (2048, 1, 20480, 128, 8),
    (2048, 1, 25600, 160, 8),
    (512, 3, 1024, 16, 2),
    (128, 2, 64, 4, 1),
]


def table2(s, b, h, a, t):
    """Table 2, row by row, written out independently of simulator.workload.memory."""
    return {
        ("none", False): s * b * h * (10 + 24 / t + 5 * a * s / (h * t)),
        ("none", True): s * b * h / t * (34 + 5 * a * s / h),
        ("selective", False): s * b * h * (10 + 24 / t),
        ("selective", True): 34 * s * b * h / t,
        ("full", False): 2 * s * b * h,
    }


@pytest.mark.parametrize("s, b, h, a, t", SHAPES)
def test_korthikanti_table2_exact(s, b, h, a, t):
    for (recompute, sp), expected in table2(s, b, h, a, t).items():
        assert korthikanti_activation_bytes(s, b, h, a, t, sp, recompute) == pytest.approx(expected, rel=1e-12)
    no_parallelism = s * b * h * (34 + 5 * a * s / h)
    assert korthikanti_activation_bytes(s, b, h, a, 1, False, "none") == pytest.approx(no_parallelism, rel=1e-12)
    assert korthikanti_activation_bytes(s, b, h, a, t, True, "full") == 2 * s * b * h / t


def test_korthikanti_175b_by_hand():
    """34 sbh / t for s = 2048, b = 1, h = 12288, t = 8: 106,954,752 bytes (~102 MiB) per layer."""
    assert korthikanti_activation_bytes(2048, 1, 12288, 96, 8, True, "selective") == 106_954_752


@pytest.mark.parametrize("s, b, h, a, t", SHAPES)
def test_layer_accounting_equals_table2_on_gpt_layers(s, b, h, a, t):
    model = ModelConfig(hidden_size=h, num_hidden_layers=1, num_attention_heads=a, num_key_value_heads=a,
                        intermediate_size=4 * h, vocab_size=1000)
    for recompute in ("none", "selective", "full"):
        for sp in (False, True):
            expected = korthikanti_activation_bytes(s, b, h, a, t, sp, recompute)
            assert layer_activation_bytes(model, 0, s, b, t, sp, recompute) == pytest.approx(expected, rel=1e-12)


def test_gqa_swiglu_layer_by_hand():
    """Llama-style layer: K/V shrink with GQA, the MLP stores gate, up and down inputs (6 sbf / t)."""
    h, a, kv, f, s, b, t = 64, 4, 2, 256, 32, 1, 2
    model = ModelConfig(hidden_size=h, num_hidden_layers=1, num_attention_heads=a, num_key_value_heads=kv,
                        intermediate_size=f, vocab_size=100, hidden_act="silu")
    d = h // a
    replicated = (4 + 1 + 4 + 1) * s * b * h
    split = 2 * s * b * (2 * a * d + 2 * kv * d) / t + 6 * s * b * f / t
    assert layer_activation_bytes(model, 0, s, b, t, False, "selective") == replicated + split


def test_moe_layer_stores_routed_copies():
    dense = layer_activation_bytes(MOE, 0, 32, 1, 1, False, "selective")
    moe = layer_activation_bytes(MOE, 1, 32, 1, 1, False, "selective")
    assert dense != moe
    k, fe, h, tokens, a, kv, d, experts = 2, 32, 64, 32, 4, 2, 16, 8
    ffn = 2 * tokens * k * h + 6 * tokens * k * fe + 6 * tokens * fe  # routed copies + shared expert
    non_ffn = (4 + 1 + 4 + 1) * tokens * h + 2 * tokens * (2 * a * d + 2 * kv * d) + 4 * tokens * experts
    assert moe == non_ffn + ffn


# --- Micro-batches in flight ---------------------------------------------------------------------


def peak_in_flight(steps):
    """Walk a schedule: most chunk activations held at once (forwards minus backwards)."""
    held = peak = 0
    for step in steps:
        held += 1 if step.kind == "F" else -1 if step.kind == "W" or not step.split else 0
        peak = max(peak, held)
    return peak


def test_in_flight_closed_forms():
    assert [microbatches_in_flight("1f1b", s, 4, 8) for s in range(4)] == [4, 3, 2, 1]
    assert [microbatches_in_flight("1f1b", s, 4, 2) for s in range(4)] == [2, 2, 2, 1]
    assert [microbatches_in_flight("gpipe", s, 4, 8) for s in range(4)] == [8, 8, 8, 8]
    # 2 (p - s - 1) + (v - 1) p + 1 with p = 4, v = 2
    assert [microbatches_in_flight("interleaved", s, 4, 8, 2) for s in range(4)] == [11, 9, 7, 5]
    assert microbatches_in_flight("interleaved", 0, 4, 4, 3) == 12  # capped at m v
    assert microbatches_in_flight("interleaved", 0, 4, 8, 1) == 4  # one chunk: plain 1F1B


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("stages, microbatches", [(1, 1), (2, 4), (4, 4), (4, 8), (8, 16), (3, 9)])
def test_in_flight_matches_schedule_walk(name, stages, microbatches):
    if name == "dualpipe" and stages % 2 or name.startswith("dualpipe") and microbatches < 2 * stages:
        return
    chunks_of = {"interleaved": (1, 2, 3), "zb-v": (2,), "dualpipev": (2,)}
    for chunks in chunks_of.get(name, (1,)):
        for stage in range(stages):
            steps = SCHEDULES[name](stage, stages, microbatches, chunks)
            expected = peak_in_flight(steps)
            assert microbatches_in_flight(name, stage, stages, microbatches, chunks) == expected


def test_first_stage_of_1f1b_holds_most_activations():
    stages = memory_report(gpt3_scenario())["stages"]
    acts = [r["activations_gib"] for r in stages]
    assert acts[0] == max(acts)
    assert acts == sorted(acts, reverse=True)


def test_dualpipe_doubles_model_states_only():
    """DualPipe holds a second model copy: 2x weights, gradients and optimizer states."""
    base = tiny_scenario(pp=4, gbs=16)
    one = memory_report(base, 80 * GiB)["stages"]
    dual = memory_report(dataclasses.replace(base, schedule="dualpipe"), 80 * GiB)["stages"]
    for o, d in zip(one, dual):
        for part in ("weights_gib", "gradients_gib", "optimizer_gib"):
            assert d[part] == pytest.approx(2 * o[part], abs=2e-4)
    zb = memory_report(dataclasses.replace(base, schedule="zb-h1"), 80 * GiB)["stages"]
    assert [r["weights_gib"] for r in zb] == [r["weights_gib"] for r in one]


def test_gpipe_holds_more_than_1f1b():
    base = tiny_scenario(pp=4, gbs=16)
    one_f = memory_report(base, 80 * GiB)["stages"]
    gp = memory_report(dataclasses.replace(base, schedule="gpipe"), 80 * GiB)["stages"]
    assert all(g["activations_gib"] >= o["activations_gib"] for g, o in zip(gp, one_f))
    assert gp[-1]["activations_gib"] > one_f[-1]["activations_gib"]


# --- Model states on stages ----------------------------------------------------------------------


def test_stage_layers_megatron_interleaved_assignment():
    assert stage_layers(TINY, 1, 2) == [2, 3]
    assert stage_layers(TINY, 1, 2, vp=2) == [1, 3]


def test_parameters_per_gpu_add_up_to_the_model():
    """Weights at 1 byte per parameter, ZeRO-0: the stages hold the model plus norm gains (2h per layer + h)."""
    for model in (TINY, dataclasses.replace(TINY, tie_word_embeddings=True), MOE):
        s = tiny_scenario(model=model, pp=2, gpus=2, gbs=4)
        held = sum(stage_memory(s, st, 1, 0, 0).weights for st in range(2))
        norms = 2 * model.hidden_size * model.num_hidden_layers + model.hidden_size
        tied_copy = model.vocab_size * model.hidden_size if model.tie_word_embeddings else 0
        assert held == pytest.approx(param_counts(model)["total"] + norms + tied_copy)


def test_tied_embeddings_single_stage_keep_one_copy():
    model = dataclasses.replace(TINY, tie_word_embeddings=True)
    s = tiny_scenario(model=model, gpus=1, gbs=1)
    norms = 2 * model.hidden_size * model.num_hidden_layers + model.hidden_size
    assert stage_memory(s, 0, 1, 0, 0).weights == param_counts(model)["total"] + norms


def test_expert_weights_split_over_ep():
    ep1 = tiny_scenario(model=MOE, gpus=4, gbs=4)
    ep4 = dataclasses.replace(ep1, parallelism=ParallelConfig(ep=4))
    experts_per_layer = 8 * 3 * 64 * 32
    moe_layers = 3
    diff = stage_memory(ep1, 0, 1, 0, 0).weights - stage_memory(ep4, 0, 1, 0, 0).weights
    assert diff == pytest.approx(moe_layers * experts_per_layer * (1 - 1 / 4))


def test_expert_optimizer_states_shard_over_expert_data_parallel_group():
    """dp 4, ep 4: dense states shard 4 ways, expert states 4 / 4 = 1 way (not at all)."""
    s = dataclasses.replace(tiny_scenario(model=MOE, gpus=4, gbs=4), parallelism=ParallelConfig(ep=4, zero_stage=1))
    optim = stage_memory(s, 0, 0, 0, 1).optimizer
    weights = stage_memory(s, 0, 1, 0, 0).weights
    experts = 3 * 2 * 3 * 64 * 32
    assert optim == pytest.approx((weights - experts) / 4 + experts)


def test_zero3_less_than_zero1():
    z1 = memory_report(gpt3_scenario(zero_stage=1))
    z3 = memory_report(gpt3_scenario(zero_stage=3))
    for a, b in zip(z3["stages"], z1["stages"]):
        assert a["total_gib"] < b["total_gib"]
    assert z3["peak_gib"] < z1["peak_gib"]


def test_more_tp_less_memory_per_gpu():
    peaks = []
    for tp in (1, 2, 4, 8):
        s = tiny_scenario(tp=tp, pp=1, dp=1, gpus=tp, gbs=4, sequence_parallel=True)
        peaks.append(memory_report(s, 80 * GiB)["peak_gib"])
    assert peaks == sorted(peaks, reverse=True) and len(set(peaks)) == 4


def test_context_parallel_halves_sequence_activations():
    one = gpt3_scenario()
    two = dataclasses.replace(one, parallelism=dataclasses.replace(one.parallelism, cp=2))
    a1 = stage_memory(one, 3).activations
    a2 = stage_memory(two, 3).activations
    assert a2 / a1 == pytest.approx(0.5, rel=0.05)


# --- Report contract -----------------------------------------------------------------------------

STAGE_KEYS = ["stage", "weights_gib", "gradients_gib", "optimizer_gib", "activations_gib", "other_gib",
              "total_gib", "capacity_gib", "fits", "biggest"]


def test_json_field_names():
    report = memory_report(gpt3_scenario())
    assert list(report) == ["stages", "peak_gib", "fits", "assumptions", "model_params"]
    assert [list(r) for r in report["stages"]] == [STAGE_KEYS] * 8
    assert [r["stage"] for r in report["stages"]] == list(range(8))
    assert json.loads(json.dumps(report)) == report
    row = report["stages"][0]
    parts = sum(row[k] for k in ("weights_gib", "gradients_gib", "optimizer_gib", "activations_gib", "other_gib"))
    assert row["total_gib"] == pytest.approx(parts, abs=1e-3)
    assert row["biggest"] in ("weights", "gradients", "optimizer", "activations", "other")
    assert report["peak_gib"] == max(r["total_gib"] for r in report["stages"])


def test_gpt3_175b_tp8_pp8_fits_on_a100_80gb():
    report = memory_report(gpt3_scenario())
    assert report["fits"]
    assert all(r["capacity_gib"] == 80.0 for r in report["stages"])
    assert 20 < report["peak_gib"] < 40
    assert report["stages"][0]["biggest"] == "activations"


def test_gpt3_175b_without_model_parallelism_does_not_fit():
    report = memory_report(gpt3_scenario(tp=1, pp=1, sequence_parallel=False))
    assert not report["fits"]
    assert report["stages"][0]["biggest"] == "weights"
    assert report["peak_gib"] > 350e9 / GiB


def test_fits_against_given_capacity():
    s = gpt3_scenario()
    peak = memory_report(s)["peak_gib"]
    assert memory_report(s, (peak + 0.01) * GiB)["fits"]
    assert not memory_report(s, (peak - 0.01) * GiB)["fits"]


def test_same_report_twice():
    assert json.dumps(memory_report(gpt3_scenario())) == json.dumps(memory_report(gpt3_scenario()))


def test_format_memory_table():
    text = format_memory_table(memory_report(gpt3_scenario()))
    lines = text.splitlines()
    assert lines[0].split()[:7] == ["stage", "weights", "gradients", "optimizer", "activations", "buffers", "total"]
    assert len(lines) == 1 + 8 + 2
    assert lines[9].startswith("peak") and "fits" in lines[9]
    # the column the JSON calls other_gib, said in words with the margins it holds
    assert lines[10].startswith("GiB per GPU; buffers: one DDP bucket") and "CUDA context (1 GiB)" in lines[10]
    assert "headroom" not in text


def test_headroom_warning_when_a_peak_that_fits_is_close_to_the_capacity():
    s = gpt3_scenario()
    peak = memory_report(s)["peak_gib"]
    tight = memory_report(s, peak / (1 - HEADROOM_FRACTION / 2) * GiB)  # half the headroom left
    roomy = memory_report(s, peak / (1 - 2 * HEADROOM_FRACTION) * GiB)
    over = memory_report(s, (peak - 0.01) * GiB)
    note = headroom_note(tight)
    assert tight["fits"] and note is not None
    cap = tight["stages"][0]["capacity_gib"]
    assert f"{peak:.1f} of {cap:.0f} GiB" in note and f"{HEADROOM_FRACTION:.0%}" in note
    assert f"leaving {cap - peak:.1f} GiB" in note
    assert "headroom warning: " + note in format_memory_table(tight)
    assert headroom_note(roomy) is None and "headroom" not in format_memory_table(roomy)
    assert headroom_note(over) is None  # not fitting is an error elsewhere, not a warning


# --- Bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize("change, field", [
    (dict(pp=3), "parallelism.pp"),
    (dict(zero_stage=5), "parallelism.zero_stage"),
    (dict(tp=0), "parallelism.tp"),
    (dict(tp=16, pp=1, dp=None), "parallelism.dp"),
])
def test_bad_plans_raise_config_error(change, field):
    s = tiny_scenario(gpus=8, gbs=16)
    s = dataclasses.replace(s, parallelism=dataclasses.replace(s.parallelism, **change))
    with pytest.raises(ConfigError) as err:
        memory_report(s, 80 * GiB)
    assert err.value.field == field


def test_bad_recompute_and_ep():
    s = dataclasses.replace(tiny_scenario(), training=TrainingConfig(recompute="some"))
    with pytest.raises(ConfigError, match="training.recompute"):
        memory_report(s, 80 * GiB)
    s = dataclasses.replace(tiny_scenario(model=MOE), parallelism=ParallelConfig(ep=3))
    with pytest.raises(ConfigError, match="parallelism.ep"):
        memory_report(s, 80 * GiB)


@settings(max_examples=1000, deadline=None)
@given(
    tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 3, 4]), cp=st.sampled_from([1, 2]),
    ep=st.sampled_from([1, 2, 4, 8]), vp=st.sampled_from([1, 2]), nodes=st.integers(1, 4),
    gbs=st.integers(1, 64), zero=st.integers(0, 3), sp=st.booleans(),
    recompute=st.sampled_from(["none", "selective", "full"]),
    schedule=st.sampled_from(["gpipe", "1f1b", "interleaved"]), moe=st.booleans(),
)
def test_random_plans_report_or_config_error(tp, pp, cp, ep, vp, nodes, gbs, zero, sp, recompute, schedule, moe):
    s = Scenario(
        name="random",
        model=MOE if moe else TINY,
        cluster=ClusterConfig(num_nodes=nodes, gpus_per_node=8, gpu="H100"),
        training=TrainingConfig(seq_length=64, micro_batch_size=1, global_batch_size=gbs, recompute=recompute),
        parallelism=ParallelConfig(tp=tp, pp=pp, cp=cp, ep=ep, vp=vp, sequence_parallel=sp, zero_stage=zero),
        schedule=schedule,
    )
    try:
        report = memory_report(s)
    except ConfigError:
        return
    assert len(report["stages"]) == pp
    for row in report["stages"]:
        assert row["total_gib"] > 0 and all(row[k] >= 0 for k in STAGE_KEYS if k.endswith("_gib"))


# --- framework selective-recompute policies (profile recompute.selective) -------------------------

LLAMA8B = ModelConfig(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                      intermediate_size=14336, vocab_size=128256, hidden_act="silu")


def _sac_kept_bytes(model, s, b, t, sp):
    """torchtitan's per-op SAC replayed over a Llama block's forward ops in order (torchtitan
    activation_checkpoint.py: save mm, SDPA, reduce-scatter outputs except every 2nd mm), plus the
    block's input that the checkpoint keeps; each op's output as (op, elements per rank)."""
    h, a, d = model.hidden_size, model.num_attention_heads, model.head_dim
    T = s * b
    q, kv, f = a * d, max(model.num_key_value_heads, t) * d, model.intermediate_size
    seq_local = T / t if sp else T
    ops = [("rms_norm", seq_local * h), ("mm", T * q / t), ("mm", T * kv / t), ("mm", T * kv / t),
           ("rope", T * (q + kv) / t), ("sdpa", T * q / t), ("mm", T * h)]
    if sp and t > 1:
        ops.append(("reduce_scatter", T * h / t))
    ops += [("add", seq_local * h), ("rms_norm", seq_local * h), ("mm", T * f / t), ("silu", T * f / t),
            ("mm", T * f / t), ("mul", T * f / t), ("mm", T * h)]
    if sp and t > 1:
        ops.append(("reduce_scatter", T * h / t))
    ops.append(("add", seq_local * h))
    kept, mms = 2 * seq_local * h, 0
    for op, elements in ops:
        if op == "mm":
            mms += 1
            if mms % 2 == 0:
                continue
        if op in ("mm", "sdpa", "reduce_scatter"):
            kept += 2 * elements + (4 * a * T / t if op == "sdpa" else 0)  # SDPA also returns fp32 LSE
    return kept


@pytest.mark.parametrize("t,sp", [(1, False), (2, True), (4, True), (8, True)])
def test_torchtitan_selective_keeps_what_its_sac_policy_saves(t, sp):
    from simulator.workload.memory import saved_op_activation_bytes

    s, b = 8192, 2
    assert saved_op_activation_bytes(LLAMA8B, s, b, t, sp, "every_second_matmul") == pytest.approx(
        _sac_kept_bytes(LLAMA8B, s, b, t, sp), rel=1e-12)


def test_framework_selective_between_full_and_none_and_used_by_the_report():
    """torchtitan's SAC and MaxText's minimal_flash keep more than full recompute and less than no
    recompute; the report uses them for a scenario of that framework (the 8B on 8 GPUs the
    torchtitan 2024-12 benchmark ran at mbs 2 with FSDP: 68 GiB of Korthikanti activations, about
    half under the SAC policy), and Megatron's selective stays Korthikanti's."""
    from simulator.workload.memory import saved_op_activation_bytes

    s, b = 8192, 2
    for t, sp in ((1, False), (4, True)):
        full = layer_activation_bytes(LLAMA8B, 0, s, b, t, sp, "full", flash_attention=True, dropout=False)
        none = layer_activation_bytes(LLAMA8B, 0, s, b, t, sp, "none", flash_attention=True, dropout=False)
        for policy in ("every_second_matmul", "elementwise"):
            kept = saved_op_activation_bytes(LLAMA8B, s, b, t, sp, policy)
            assert full < kept < none
    assert saved_op_activation_bytes(LLAMA8B, s, b, 1, False, "attention_core") is None
    base = Scenario(name="8b", model=LLAMA8B, cluster=ClusterConfig(num_nodes=1, gpus_per_node=8, gpu="H100"),
                    training=TrainingConfig(seq_length=s, micro_batch_size=b, global_batch_size=16,
                                            recompute="selective"),
                    parallelism=ParallelConfig(zero_stage=3))
    megatron = stage_memory(base, 0)
    titan = stage_memory(dataclasses.replace(base, framework="torchtitan"), 0)
    layers = LLAMA8B.num_hidden_layers
    saved = layers * (layer_activation_bytes(LLAMA8B, 0, s, b, 1, False, "selective", flash_attention=True,
                                             dropout=False)
                      - saved_op_activation_bytes(LLAMA8B, s, b, 1, False, "every_second_matmul"))
    # fewer kept bytes per layer, a larger recompute working set of one layer
    working = (layer_activation_bytes(LLAMA8B, 0, s, b, 1, False, "selective", flash_attention=True, dropout=False)
               - saved_op_activation_bytes(LLAMA8B, s, b, 1, False, "every_second_matmul"))
    assert megatron.activations - titan.activations == pytest.approx(saved - working, rel=1e-9)
    assert titan.weights == megatron.weights and titan.optimizer == megatron.optimizer


def test_bf16_adam_moments_hold_8_bytes_per_parameter_and_move_8_fewer_in_adam():
    """training.optimizer_state_dtype bf16 (Megatron-core precision-aware optimizer, DeepSeek-V3):
    the fp32 master weight (4) and two bf16 moments (2 + 2), against 4 + 4 + 4; the fused Adam reads
    and writes each moment once, 8 bytes fewer per parameter of its shard."""
    from simulator.scenario.config import optimizer_state_bytes
    from simulator.scenario.load import load_scenario
    from simulator.workload.memory import stage_memory
    from simulator.workload.software import BF16_MOMENTS_SAVED_BYTES

    assert optimizer_state_bytes("fp32") == 12 and optimizer_state_bytes("bf16") == 8
    s = load_scenario("scenarios/llama3-70b-64xh100.yaml")
    b = load_scenario("scenarios/llama3-70b-64xh100.yaml", ["training.optimizer_state_dtype=bf16"])
    assert stage_memory(b, 0).optimizer == pytest.approx(stage_memory(s, 0).optimizer * 8 / 12)
    assert stage_memory(b, 0).weights == stage_memory(s, 0).weights
    from simulator.parts.gpus import gpu_of
    from simulator.workload.workload import build_workload

    gpu = gpu_of(s.cluster, s.training.precision)
    adam = {x.training.optimizer_state_dtype: next(op for op in build_workload(x, gpu).optimizer[0].ops
                                                   if op.name == "adam") for x in (s, b)}
    assert BF16_MOMENTS_SAVED_BYTES == 8
    assert adam["fp32"].bytes - adam["bf16"].bytes == pytest.approx(8 * adam["fp32"].bytes / 30)
    with pytest.raises(ConfigError, match="training.optimizer_state_dtype"):
        load_scenario("scenarios/llama3-70b-64xh100.yaml", ["training.optimizer_state_dtype=fp16"])


def test_one_f_one_b_gpipe_and_interleaved_in_flight_are_read_without_building_the_program():
    """1F1B, GPipe and interleaved 1F1B take their closed forms (min(p - s, m), m and
    min(2 (p - s - 1) + (v - 1) p + 1, m v)) instead of walking the built program; each equals
    the walk for every stage of every valid layout of a grid (fewer micro-batches than stages
    included), and a stage outside the pipeline is still refused."""
    from simulator.layout.schedules import check_schedule_args

    checked = 0
    for name in ("1f1b", "gpipe", "interleaved"):
        for stages in (1, 2, 3, 4, 5, 8, 12):
            for microbatches in (1, 2, 3, 4, 7, 8, 16, 24, 36):
                for chunks in ((1, 2, 3, 4, 6) if name == "interleaved" else (1,)):
                    try:
                        check_schedule_args(name, stages, microbatches, chunks)
                    except ValueError:
                        continue
                    for stage in range(stages):
                        walk = peak_in_flight(SCHEDULES[name](stage, stages, microbatches, chunks))
                        assert microbatches_in_flight(name, stage, stages, microbatches, chunks) == walk
                        checked += 1
        with pytest.raises(ValueError, match="outside"):
            microbatches_in_flight(name, 4, 4, 8, 2 if name == "interleaved" else 1)
    assert checked > 500


# --- FP8 recipes that keep the quantized GEMM inputs (profile fp8.saves_quantized_inputs) --------

def test_quantized_inputs_save_one_byte_per_gemm_input_element_by_hand():
    """Transformer Engine's Linear keeps its FP8 input for the weight gradient: on a SwiGLU layer
    the QKV, output-projection, FC1 and FC2 inputs drop from 2 bytes to 1, and nothing else does
    (norm inputs, Q, K, V and the FC1 outputs stay 16-bit)."""
    h, a, kv, f, s, b, t = 64, 4, 2, 256, 32, 1, 2
    model = ModelConfig(hidden_size=h, num_hidden_layers=1, num_attention_heads=a, num_key_value_heads=kv,
                        intermediate_size=f, vocab_size=100, hidden_act="silu")
    d = h // a
    for sp in (False, True):
        rep = 1 / t if sp else 1
        bf16 = layer_activation_bytes(model, 0, s, b, t, sp, "none", flash_attention=True, dropout=False)
        fp8 = layer_activation_bytes(model, 0, s, b, t, sp, "none", flash_attention=True, dropout=False,
                                     quantized_inputs=True)
        gemm_inputs = s * b * (h * rep + a * d / t + h * rep + f / t)  # QKV, proj, FC1, FC2: one element each
        assert bf16 - fp8 == pytest.approx(gemm_inputs * (2 - 1), rel=1e-12)
        # full recompute keeps the layer input only, 16-bit either way
        assert layer_activation_bytes(model, 0, s, b, t, sp, "full", quantized_inputs=True) == \
            layer_activation_bytes(model, 0, s, b, t, sp, "full")


def test_quantized_inputs_on_an_moe_layer_count_each_routed_copy_once():
    """MoE: each routed copy's expert input and FC2 input, and the shared expert's FC2 input, drop
    to 1 byte; the router (a 16-bit GEMM) still keeps the 16-bit norm output, so the shared expert's
    FP8 copy of it is one byte more, not one less."""
    k, fe, h, tokens, a, d = 2, 32, 64, 32, 4, 16
    bf16 = layer_activation_bytes(MOE, 1, 32, 1, 1, False, "selective")
    fp8 = layer_activation_bytes(MOE, 1, 32, 1, 1, False, "selective", quantized_inputs=True)
    attention = tokens * (h + a * d)  # QKV and output-projection inputs: 2 -> 1 byte
    routed = tokens * k * (h + fe)  # each copy's expert input and down-projection input: 2 -> 1
    shared = tokens * fe  # the shared expert's down-projection input: 2 -> 1
    shared_input_copy = tokens * h  # the shared expert's FP8 copy of the norm output: + 1
    assert bf16 - fp8 == pytest.approx(attention + routed + shared - shared_input_copy, rel=1e-12)


def test_fp8_memory_follows_the_framework_that_saves_quantized_inputs():
    """The same FP8 layout: a Transformer Engine stack (megatron-core) holds fewer activation bytes
    than in BF16; torchtitan (torchao's rowwise path keeps the 16-bit input) holds the same."""
    from simulator.scenario.load import load_scenario
    from simulator.parts.frameworks import load_profile

    assert load_profile("megatron-core")["fp8"]["saves_quantized_inputs"] is True
    assert load_profile("torchtitan")["fp8"]["saves_quantized_inputs"] is False

    def activations(framework, precision):
        s = load_scenario("scenarios/llama3-70b-64xh100.yaml", [f"framework={framework}",
                                                               f"training.precision={precision}"])
        return memory_report(s)["stages"][0]["activations_gib"]

    assert activations("megatron-core", "fp8") < activations("megatron-core", "bf16")
    assert activations("torchtitan", "fp8") == activations("torchtitan", "bf16")


@pytest.mark.parametrize("t,sp", [(1, False), (4, True)])
def test_maxtext_custom_policy_keeps_the_layer_input_qkv_and_the_output_projection(t, sp):
    """attention_projections (MaxText custom, DGX Cloud 70B recipe): the layer input 2sbh, Q, K, V
    2sb(q + 2kv)/t and out_proj's result 2sbh (/t with SP each); no context, log-sum-exp or MLP
    tensor. It keeps less than minimal_flash's elementwise policy, more than full recompute."""
    from simulator.workload.memory import saved_op_activation_bytes

    s, b = 8192, 2
    h, q, kv = LLAMA8B.hidden_size, LLAMA8B.num_attention_heads * LLAMA8B.head_dim, max(
        LLAMA8B.num_key_value_heads, t) * LLAMA8B.head_dim
    rep = 1 / t if sp else 1
    kept = saved_op_activation_bytes(LLAMA8B, s, b, t, sp, "attention_projections")
    assert kept == pytest.approx(2 * s * b * (2 * h * rep + (q + 2 * kv) / t), rel=1e-12)
    full = layer_activation_bytes(LLAMA8B, 0, s, b, t, sp, "full", flash_attention=True, dropout=False)
    assert full < kept < saved_op_activation_bytes(LLAMA8B, s, b, t, sp, "elementwise")


def _dsv3():
    from simulator.scenario.load import scenario_from_dict

    return scenario_from_dict({"model": "deepseek-ai/DeepSeek-V3"}).model


def test_megatron_recompute_modules_free_the_outputs_they_recompute():
    """recompute_modules (CheckpointWithoutOutput): mla_up_proj frees Q, K, V (2sb(q + 2kv)/t as
    counted), moe_act the experts' activation output (copies x f / etp at the GEMM's saved-input
    bytes), layernorm the two norms' 16-bit outputs (with FP8-quantized GEMM inputs only the
    router's, a 16-bit GEMM), each a closed form on DeepSeek-V3's layers."""
    from simulator.workload.memory import recompute_module_savings

    m = _dsv3()
    s, b, t, h = 4096, 1, 1, m.hidden_size
    moe_layer, dense_layer = 10, 0
    assert m.is_moe_layer(moe_layer) and not m.is_moe_layer(dense_layer) and m.is_mla
    q = kv = m.num_attention_heads * m.head_dim
    assert recompute_module_savings(m, moe_layer, s, b, t, False, ("mla_up_proj",)) == pytest.approx(
        2 * (q + 2 * kv) * s * b)
    copies = s * b * m.num_experts_per_tok
    assert recompute_module_savings(m, moe_layer, s, b, t, False, ("moe_act",), quantized_inputs=True) == pytest.approx(
        1 * copies * m.expert_intermediate_size)
    assert recompute_module_savings(m, moe_layer, s, b, t, False, ("moe_act",)) == pytest.approx(
        2 * copies * m.expert_intermediate_size)
    assert recompute_module_savings(m, dense_layer, s, b, t, False, ("moe_act",)) == 0
    assert recompute_module_savings(m, dense_layer, s, b, t, False, ("layernorm",)) == pytest.approx(2 * 2 * s * b * h)
    assert recompute_module_savings(m, dense_layer, s, b, t, False, ("layernorm",), quantized_inputs=True) == 0
    assert recompute_module_savings(m, moe_layer, s, b, t, False, ("layernorm",), quantized_inputs=True) == \
        pytest.approx(2 * s * b * h)
    # none frees more than the layer keeps
    for layer in (dense_layer, moe_layer):
        kept = layer_activation_bytes(m, layer, s, b, t, False, "selective", flash_attention=True, dropout=False,
                                      quantized_inputs=True)
        every = recompute_module_savings(m, layer, s, b, t, False, ("layernorm", "mla_up_proj", "moe_act",
                                                                     "shared_experts"), quantized_inputs=True)
        assert 0 < every < kept


def test_deepseek_v3s_report_layout_fits_its_h800s_with_the_modules_it_recomputes():
    """The report's layout (PP16 DualPipe, EP64, ZeRO-1, FP8, BF16 moments) recomputes RMSNorm, the
    MLA up-projections and the MoE SwiGLU (Sec. 3.2.3, 3.3.3): with those modules the memory model
    keeps it within the H800's 80 GiB; with the attention core recomputed instead it does not."""
    from pathlib import Path

    import yaml

    from simulator.scenario.load import scenario_from_dict
    from simulator.studies.cases import case_to_scenario_dict

    cases = yaml.safe_load((Path(__file__).parent / "data" / "moe-runs.yaml").read_text())["cases"]
    case = next(c for c in cases if c["id"] == "deepseek-v3-report-2048xh800")
    d = case_to_scenario_dict(case)
    assert d["training"]["recompute_modules"] == ["layernorm", "mla_up_proj", "moe_act"]
    with_modules = scenario_from_dict(d)
    d["training"]["recompute_modules"] = None
    core_attn = scenario_from_dict(d)
    peak = max(stage_memory(with_modules, st).total for st in range(16))
    assert peak < 80 * GiB < max(stage_memory(core_attn, st).total for st in range(16))


def test_moe_recompute_module_frees_the_moe_layer_but_its_input():
    """Megatron-core's "moe" module checkpoints the whole MoE layer: it keeps the layer's input (the
    norm output) and frees the rest of what the layer saved, so a MoE layer then keeps its attention
    part, the norm input and that norm output; moe_act and shared_experts add nothing beside it, and
    a dense layer frees nothing."""
    from simulator.workload.memory import layer_activation_bytes, recompute_module_savings

    m = _dsv3()
    s, b, t, h = 4096, 1, 1, m.hidden_size
    moe_layer, dense_layer = 10, 0
    kept = layer_activation_bytes(m, moe_layer, s, b, t, False, "selective", flash_attention=True, dropout=False)
    dense_kept = layer_activation_bytes(m, dense_layer, s, b, t, False, "selective", flash_attention=True,
                                        dropout=False)
    dense_mlp = dense_kept - (2 + 2) * s * b * h - 2 * s * b * m.intermediate_size * 3
    moe = recompute_module_savings(m, moe_layer, s, b, t, False, ("moe",))
    # what is left of the MoE layer's MLP part: its attention part (the dense layer's minus its MLP) plus 2 x 2sbh
    assert kept - moe == pytest.approx(dense_mlp + 2 * 2 * s * b * h)
    assert moe > recompute_module_savings(m, moe_layer, s, b, t, False, ("moe_act", "shared_experts"))
    assert recompute_module_savings(m, moe_layer, s, b, t, False, ("moe", "moe_act", "shared_experts")) == moe
    assert recompute_module_savings(m, dense_layer, s, b, t, False, ("moe",)) == 0
