"""Compute cost model: hand-counted FLOPs on tiny models, published FLOP conventions, properties."""

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.workload.compute import (embedding_cost, gemm_efficiency, head_cost, layer_cost, model_flops_per_token, param_counts)
from simulator.workload.kernels import BlockCost
from simulator.scenario.config import ModelConfig, ParallelConfig, TrainingConfig
from simulator.common.errors import ConfigError
from simulator.parts.gpus import get_gpu, peak

H100 = get_gpu("H100")
A100 = get_gpu("A100")

TINY = ModelConfig(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
    intermediate_size=256, vocab_size=100,
)
TINY_TRAIN = TrainingConfig(seq_length=32, micro_batch_size=2)
MOE = ModelConfig(
    hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=256, vocab_size=100, hidden_act="silu", num_experts=8, num_experts_per_tok=2,
    moe_intermediate_size=32, num_shared_experts=1, first_k_dense_replace=1,
)
GPT3 = ModelConfig(
    hidden_size=12288, num_hidden_layers=96, num_attention_heads=96, num_key_value_heads=96,
    intermediate_size=49152, vocab_size=51200,
)
LLAMA31_8B = ModelConfig(
    hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
    intermediate_size=14336, vocab_size=128256, hidden_act="silu",
)
KORTHIKANTI_22B = ModelConfig(
    hidden_size=6144, num_hidden_layers=48, num_attention_heads=64, num_key_value_heads=64,
    intermediate_size=24576, vocab_size=51200,
)


def flops_by_name(block: BlockCost) -> dict:
    return {op.name: op.flops for op in block.ops}


def test_tiny_dense_layer_flops_by_hand():
    b, s, h, f = 2, 32, 64, 256
    tokens = b * s
    cost = layer_cost(TINY, TINY_TRAIN, ParallelConfig(), H100, 0)
    attn = flops_by_name(cost.attn_fwd)
    assert attn["qkv_proj"] == 2 * tokens * h * 3 * h
    assert attn["attn_core"] == 4 * b * s * s * h / 2
    assert attn["out_proj"] == 2 * tokens * h * h
    assert attn["input_norm"] == 0
    assert cost.mlp_fwd.flops == 2 * tokens * h * f * 2
    assert [op.name for op in cost.attn_fwd.ops] == [
        "input_norm", "qkv_proj", "rope", "attn_core", "out_proj", "attn_residual"
    ]


def test_swiglu_uses_three_matrices():
    silu = dataclasses.replace(TINY, hidden_act="silu")
    cost = layer_cost(silu, TINY_TRAIN, ParallelConfig(), H100, 0)
    assert cost.mlp_fwd.flops == 2 * 64 * 64 * 256 * 3


def test_backward_gemms_are_twice_forward_and_flash_attention_two_and_a_half():
    cost = layer_cost(TINY, TINY_TRAIN, ParallelConfig(), H100, 0)
    fwd = flops_by_name(cost.attn_fwd) | flops_by_name(cost.mlp_fwd)
    bwd = flops_by_name(cost.attn_bwd) | flops_by_name(cost.mlp_bwd)
    for gemm in ("qkv_proj", "out_proj", "mlp_up", "mlp_down"):
        assert bwd[f"{gemm}_dgrad"] == fwd[gemm]
        assert bwd[f"{gemm}_wgrad"] == fwd[gemm]
    assert bwd["attn_core_bwd"] == 2.5 * fwd["attn_core"]


def test_backward_runs_in_reverse_order():
    cost = layer_cost(TINY, TINY_TRAIN, ParallelConfig(), H100, 0)
    assert [op.name for op in cost.attn_bwd.ops] == [
        "attn_residual_bwd", "out_proj_dgrad", "out_proj_wgrad", "attn_core_bwd", "rope_bwd",
        "qkv_proj_dgrad", "qkv_proj_wgrad", "input_norm_bwd",
    ]


def test_tensor_parallel_halves_gemm_and_attention_flops():
    one = layer_cost(TINY, TINY_TRAIN, ParallelConfig(tp=1), H100, 0)
    two = layer_cost(TINY, TINY_TRAIN, ParallelConfig(tp=2), H100, 0)
    for block in ("attn_fwd", "mlp_fwd", "attn_bwd", "mlp_bwd"):
        assert getattr(two, block).flops == getattr(one, block).flops / 2


def test_context_parallel_halves_tokens_and_attention():
    one = layer_cost(TINY, TINY_TRAIN, ParallelConfig(cp=1), H100, 0)
    two = layer_cost(TINY, TINY_TRAIN, ParallelConfig(cp=2), H100, 0)
    assert two.attn_fwd.flops == one.attn_fwd.flops / 2
    core = flops_by_name(two.attn_fwd)
    assert core["attn_core"] + core["attn_core_cp"] == flops_by_name(one.attn_fwd)["attn_core"] / 2


def test_sequence_parallel_divides_norm_and_residual_bytes_by_tp():
    plain = layer_cost(TINY, TINY_TRAIN, ParallelConfig(tp=4), H100, 0)
    sp = layer_cost(TINY, TINY_TRAIN, ParallelConfig(tp=4, sequence_parallel=True), H100, 0)
    by_name = lambda block: {op.name: op.bytes for op in block.ops}  # noqa: E731
    for name in ("input_norm", "attn_residual"):
        assert by_name(sp.attn_fwd)[name] == by_name(plain.attn_fwd)[name] / 4
    assert by_name(sp.attn_fwd)["qkv_proj"] == by_name(plain.attn_fwd)["qkv_proj"]


def test_gqa_reduces_qkv_flops():
    gqa = dataclasses.replace(TINY, num_key_value_heads=1)
    head_dim, tokens, h = 16, 64, 64
    qkv = flops_by_name(layer_cost(gqa, TINY_TRAIN, ParallelConfig(), H100, 0).attn_fwd)["qkv_proj"]
    assert qkv == 2 * tokens * h * (4 + 2 * 1) * head_dim
    mha = flops_by_name(layer_cost(TINY, TINY_TRAIN, ParallelConfig(), H100, 0).attn_fwd)["qkv_proj"]
    assert qkv < mha


@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_recompute_contents(mode):
    cost = layer_cost(TINY, dataclasses.replace(TINY_TRAIN, recompute=mode), ParallelConfig(), H100, 0)
    if mode == "none":
        assert cost.attn_recompute.ops == () and cost.mlp_recompute.ops == ()
    elif mode == "selective":
        assert [op.name for op in cost.attn_recompute.ops] == ["attn_core"]
        assert cost.attn_recompute.ops[0] in cost.attn_fwd.ops
        assert cost.mlp_recompute.ops == ()
    else:
        assert cost.attn_recompute == cost.attn_fwd
        assert cost.mlp_recompute == cost.mlp_fwd


def test_unknown_recompute_and_fp8_on_a100_are_config_errors():
    with pytest.raises(ConfigError) as err:
        layer_cost(TINY, dataclasses.replace(TINY_TRAIN, recompute="some"), ParallelConfig(), H100, 0)
    assert err.value.field == "training.recompute"
    with pytest.raises(ConfigError) as err:
        layer_cost(TINY, dataclasses.replace(TINY_TRAIN, precision="fp8"), ParallelConfig(), A100, 0)
    assert err.value.field == "training.precision"


def test_moe_param_counts_by_hand():
    h, hd, mm = 64, 16, 3
    attn = h * (4 + 2 * 2) * hd + 4 * hd * h
    expert = mm * h * 32
    counts = param_counts(MOE)
    assert counts["per_layer_dense"] == attn + mm * h * 256
    assert counts["per_layer_moe"] == attn + h * 8 + 8 * expert + 1 * expert
    assert counts["per_layer_moe_active"] == attn + h * 8 + 2 * expert + 1 * expert
    embed = 100 * h
    assert counts["total"] == 2 * embed + counts["per_layer_dense"] + 2 * counts["per_layer_moe"]
    assert counts["active"] == 2 * embed + counts["per_layer_dense"] + 2 * counts["per_layer_moe_active"]
    assert counts["active"] < counts["total"]


def test_tied_embeddings_have_no_lm_head_params():
    assert param_counts(dataclasses.replace(TINY, tie_word_embeddings=True))["lm_head"] == 0


@pytest.mark.parametrize("ep", [1, 2, 8])
def test_moe_layer_flops_follow_active_experts_and_not_ep(ep):
    tokens, h, mm, ffe = 64, 64, 3, 32
    cost = layer_cost(MOE, TINY_TRAIN, ParallelConfig(ep=ep), H100, 1)
    flops = flops_by_name(cost.mlp_fwd)
    assert flops["router"] == 2 * tokens * h * 8
    assert flops["expert_up"] + flops["expert_down"] == tokens * 2 * 2 * mm * h * ffe
    assert flops["shared_up"] + flops["shared_down"] == tokens * 2 * mm * h * ffe
    dense = flops_by_name(layer_cost(MOE, TINY_TRAIN, ParallelConfig(ep=ep), H100, 0).mlp_fwd)
    assert "mlp_up" in dense and "router" not in dense


def test_gpt3_175b_model_flops_match_nemo():
    per_sample = model_flops_per_token(GPT3, 2048) * 2048
    assert per_sample == pytest.approx(2.20e15, rel=0.01)


def test_llama31_8b_model_flops_match_nemo():
    per_sample = model_flops_per_token(LLAMA31_8B, 8192) * 8192
    assert per_sample == pytest.approx(4.74e14, rel=0.02)


def test_model_flops_do_not_halve_attention():
    counts = param_counts(TINY)
    n = counts["active"] - counts["embedding"]
    assert model_flops_per_token(TINY, 32) == 6 * n + 12 * 2 * 64 * 32


dims = st.integers(min_value=1, max_value=64).map(lambda x: 256 * x)


@given(m=dims, n=dims, k=dims, scale=st.integers(min_value=2, max_value=8))
def test_gemm_efficiency_is_monotone_in_each_dimension(m, n, k, scale):
    for precision in ("bf16", "fp8"):
        base = gemm_efficiency(m, n, k, H100, precision)
        assert 0 < base <= H100.gemm_efficiency[precision]
        assert gemm_efficiency(m * scale, n, k, H100, precision) >= base
        assert gemm_efficiency(m, n * scale, k, H100, precision) >= base
        assert gemm_efficiency(m, n, k * scale, H100, precision) >= base


def test_small_gemms_lose_efficiency():
    big = gemm_efficiency(8192, 8192, 8192, A100, "bf16")
    assert big > 0.95 * A100.gemm_efficiency["bf16"] * A100.sustained_fraction
    # a 256 x 256 output is 2 x 2 tiles of 128 x 128 on 108 SMs: split along k it fills more SMs but
    # stays well below a full GEMM; with a short k there is nothing to split
    assert 0.2 * big < gemm_efficiency(256, 256, 8192, A100, "bf16") < 0.5 * big
    assert gemm_efficiency(256, 256, 1024, A100, "bf16") < 0.1 * big
    assert gemm_efficiency(8192, 8192, 64, A100, "bf16") < 0.6 * big


@given(factor=st.floats(min_value=1.0, max_value=8.0))
def test_more_bandwidth_or_flops_never_slows_a_layer(factor):
    train, par = TrainingConfig(seq_length=2048, micro_batch_size=1), ParallelConfig(tp=4)
    base = layer_cost(GPT3, train, par, H100, 0)
    faster = dataclasses.replace(
        H100,
        hbm_bandwidth_Bps=H100.hbm_bandwidth_Bps * factor,
        peak_flops={p: v * factor for p, v in H100.peak_flops.items()},
    )
    quick = layer_cost(GPT3, train, par, faster, 0)
    assert quick.fwd_time_s <= base.fwd_time_s
    assert quick.bwd_time_s <= base.bwd_time_s


def test_memory_bound_op_follows_the_roofline():
    from simulator.workload.compute import mem_op
    adam = mem_op("adam", 30e9, H100)
    assert adam.bytes == 30e9
    assert adam.time_s == pytest.approx(30e9 / (3.35e12 * H100.memory_efficiency) + H100.launch_overhead_s)


def test_gemm_time_respects_peak():
    cost = layer_cost(GPT3, TrainingConfig(seq_length=2048), ParallelConfig(tp=4), H100, 0)
    for op in cost.mlp_fwd.ops:
        assert op.time_s > op.flops / peak(H100, "bf16")


def test_fp8_speeds_up_gemms_only():
    par = ParallelConfig(tp=4)
    bf16 = layer_cost(GPT3, TrainingConfig(seq_length=2048), par, H100, 0)
    fp8 = layer_cost(GPT3, TrainingConfig(seq_length=2048, precision="fp8"), par, H100, 0)
    t16 = {op.name: op.time_s for op in bf16.attn_fwd.ops}
    t8 = {op.name: op.time_s for op in fp8.attn_fwd.ops}
    assert t8["qkv_proj"] < 0.75 * t16["qkv_proj"]
    assert t8["attn_core"] == t16["attn_core"]
    assert t8["input_norm"] == t16["input_norm"]


def test_head_and_embedding_costs():
    train, par = TrainingConfig(seq_length=32, micro_batch_size=2), ParallelConfig(tp=2)
    fwd, bwd = head_cost(TINY, train, par, H100)
    head = flops_by_name(fwd)
    assert head["lm_head"] == 2 * 64 * 64 * 100 / 2
    assert bwd.flops == 2 * fwd.flops
    e_fwd, e_bwd = embedding_cost(TINY, train, par, H100)
    assert e_fwd.flops == 0 and e_bwd.time_s > e_fwd.time_s


def test_the_lm_head_stays_16_bit_under_low_precision_unless_the_profile_quantizes_it():
    """Megatron-core's output layer is a PyTorch ColumnParallelLinear outside Transformer Engine and
    torchtitan filters ``output`` from float8: under fp8, mxfp8 and nvfp4 the head's GEMMs take the
    bf16 time and no quantize kernel; a profile with ``fp8.lm_head_quantized`` runs them like the
    layers' (at the low-precision rate, after a quantize)."""
    par = ParallelConfig(tp=1)
    bf16 = head_cost(LLAMA31_8B, TrainingConfig(seq_length=8192), par, H100)
    for precision in ("fp8", "mxfp8", "nvfp4"):
        gpu = H100 if precision == "fp8" else get_gpu("B200")
        train = TrainingConfig(seq_length=8192, precision=precision)
        ref = head_cost(LLAMA31_8B, TrainingConfig(seq_length=8192), par, gpu)
        plain = head_cost(LLAMA31_8B, train, par, gpu)
        quant = head_cost(LLAMA31_8B, train, par, gpu, quantized=True)
        for got, want in ((plain[0], ref[0]), (plain[1], ref[1])):
            assert [(op.name, op.time_s) for op in got.ops] == [(op.name, op.time_s) for op in want.ops]
        # the output gradient's quantize (the forward's is fused into the final norm, but for NVFP4)
        assert "lm_head_quantize_bwd" in [op.name for op in quant[1].ops]
        assert not [op.name for op in plain[0].ops + plain[1].ops if "quantize" in op.name]
        lm = {op.name: op.time_s for op in quant[0].ops}["lm_head"]
        assert lm < 0.8 * {op.name: op.time_s for op in plain[0].ops}["lm_head"]
    assert {op.name: op.time_s for op in bf16[0].ops}["lm_head"] > 0


def test_the_moe_router_gemm_runs_16_bit_under_fp8():
    """The router's gating GEMM runs in plain PyTorch (Megatron-core TopKRouter): under fp8 it takes
    the bf16 time, while the experts' GEMMs take the FP8 rate."""
    train16 = TrainingConfig(seq_length=4096, micro_batch_size=1)
    train8 = TrainingConfig(seq_length=4096, micro_batch_size=1, precision="fp8")
    par = ParallelConfig(tp=1)
    t16 = {op.name: op.time_s for op in layer_cost(MOE, train16, par, H100, 2).mlp_fwd.ops}
    t8 = {op.name: op.time_s for op in layer_cost(MOE, train8, par, H100, 2).mlp_fwd.ops}
    assert t8["router"] == t16["router"]
    assert t8["expert_up"] < t16["expert_up"]


def test_korthikanti_22b_layer_in_range():
    """Table 4 measured 7.7 / 11.9 ms including ~1.0-1.5 ms of TP all-reduce per direction,
    with unfused softmax attention and dropout 0.1; this model uses flash attention and no
    dropout, so it should come in below the compute part of the measurement, not above it."""
    train = TrainingConfig(seq_length=2048, micro_batch_size=4)
    cost = layer_cost(KORTHIKANTI_22B, train, ParallelConfig(tp=8), A100, 0)
    assert 4.0e-3 < cost.fwd_time_s < 7.0e-3
    assert 8.0e-3 < cost.bwd_time_s < 11.0e-3
    full_train = dataclasses.replace(train, recompute="full")
    full = layer_cost(KORTHIKANTI_22B, full_train, ParallelConfig(tp=8), A100, 0)
    assert full.bwd_time_s == pytest.approx(cost.bwd_time_s + cost.fwd_time_s)


def test_h100_large_gemms_sustain_mamf_times_the_sustained_fraction():
    cost = layer_cost(GPT3, TrainingConfig(seq_length=2048), ParallelConfig(tp=4), H100, 0)
    mlp_up = next(op for op in cost.mlp_fwd.ops if op.name == "mlp_up")
    ceiling = H100.gemm_efficiency["bf16"] * H100.sustained_fraction
    assert 0.9 * ceiling < mlp_up.flops / mlp_up.time_s / 989e12 <= ceiling




# Operand quantization for low-precision GEMMs (Transformer Engine): a memory-bound kernel per GEMM
# input (unless a norm writes it quantized) and per output gradient, both usages written.

@pytest.mark.parametrize("precision, operand", [("fp8", 1.0), ("mxfp8", 1 + 1 / 32)])
def test_low_precision_gemms_pay_their_quantize_kernels(precision, operand):
    gpu = get_gpu("GB200")
    train = TrainingConfig(seq_length=4096, micro_batch_size=1, precision=precision)
    cost = layer_cost(LLAMA31_8B, train, ParallelConfig(), gpu, 0)
    t, h, ff = 4096, 4096, 14336
    bw = gpu.hbm_bandwidth_Bps * gpu.memory_efficiency
    fwd = {op.name: op for op in cost.attn_fwd.ops + cost.mlp_fwd.ops}
    # qkv_proj and mlp_up read what the fused norm + quantize wrote: no kernel of their own
    assert "qkv_proj_quantize" not in fwd and "mlp_up_quantize" not in fwd
    assert fwd["out_proj_quantize"].bytes == pytest.approx(t * h * (2 + 2 * operand))
    assert fwd["mlp_down_quantize"].bytes == pytest.approx(t * ff * (2 + 2 * operand))
    assert fwd["mlp_down_quantize"].time_s == pytest.approx(t * ff * (2 + 2 * operand) / bw + gpu.launch_overhead_s)
    bwd = {op.name: op for op in cost.attn_bwd.ops + cost.mlp_bwd.ops}
    qkv_out = (32 + 2 * 8) * 128
    assert bwd["qkv_proj_quantize_bwd"].bytes == pytest.approx(t * qkv_out * (2 + 2 * operand))
    assert bwd["mlp_up_quantize_bwd"].bytes == pytest.approx(t * 2 * ff * (2 + 2 * operand))
    assert sum(name.endswith("_quantize_bwd") for name in bwd) == 4
    bf16 = layer_cost(LLAMA31_8B, TrainingConfig(seq_length=4096, micro_batch_size=1), ParallelConfig(), gpu, 0)
    assert not any("quantize" in op.name for b in (bf16.attn_fwd, bf16.mlp_fwd, bf16.attn_bwd, bf16.mlp_bwd)
                   for op in b.ops)


def test_nvfp4_quantize_reads_twice_and_norm_fed_gemms_pay_it():
    """TE NVFP4Quantizer: one kernel reads the 16-bit tensor for its amax and its Hadamard-rotated
    amax, one reads it again and writes both 4-bit usages (0.5 + 1/16 bytes each): 2 + 2 + 2 x 0.5625
    bytes per element in 2 kernels, for every GEMM input (a norm cannot emit NVFP4) and output gradient."""
    gpu = get_gpu("GB300")
    train = TrainingConfig(seq_length=4096, micro_batch_size=1, precision="nvfp4")
    cost = layer_cost(LLAMA31_8B, train, ParallelConfig(), gpu, 0)
    t, h, ff = 4096, 4096, 14336
    per = 2 + 2 + 2 * (0.5 + 1 / 16)
    bw = gpu.hbm_bandwidth_Bps * gpu.memory_efficiency
    fwd = {op.name: op for op in cost.attn_fwd.ops + cost.mlp_fwd.ops}
    assert fwd["qkv_proj_quantize"].bytes == pytest.approx(t * h * per)
    assert fwd["mlp_up_quantize"].bytes == pytest.approx(t * h * per)
    assert fwd["mlp_down_quantize"].kernels == 2
    assert fwd["mlp_down_quantize"].time_s == pytest.approx(t * ff * per / bw + 2 * gpu.launch_overhead_s)
    bwd = {op.name: op for op in cost.attn_bwd.ops + cost.mlp_bwd.ops}
    assert bwd["mlp_up_quantize_bwd"].bytes == pytest.approx(t * 2 * ff * per)


def test_router_stays_16_bit_and_fp8_experts_keep_their_own_cast():
    train = TrainingConfig(seq_length=32, micro_batch_size=2, precision="fp8")
    cost = layer_cost(MOE, train, ParallelConfig(), H100, 1)
    names = [op.name for op in cost.mlp_fwd.ops + cost.mlp_bwd.ops]
    assert "router_quantize" not in names and "router_quantize_bwd" not in names
    assert "expert_fp8_cast" in names and not any(n.startswith("expert_") and "quantize" in n for n in names)
    assert "shared_down_quantize" in names
