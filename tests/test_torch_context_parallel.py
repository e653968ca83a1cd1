"""PyTorch's attention as torchtitan runs it: the SDPA flash kernel's measured curve, K/V repeated
to the query heads before the CP exchange, and context_parallel's fp32 merges (closed forms)."""


import pytest

from simulator.scenario.config import (ClusterConfig, FrameworkOptions, ModelConfig, ParallelConfig, Scenario,
                              TrainingConfig)
from simulator.parts.gpus import get_gpu, power_factor
from simulator.workload import attention
from simulator.workload.attention import AttentionKernel, h100_tflops
from simulator.workload.compute import layer_cost
from simulator.workload.frameworks import resolve
from simulator.parts.frameworks import load_profile
from simulator.workload.software import cp_merge_bytes, layer_with_software
from simulator.workload.workload import build_workload

H100 = get_gpu("H100")
GQA = ModelConfig(hidden_size=1024, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                  intermediate_size=4096, vocab_size=32000, hidden_act="silu")


def scen(framework, cp=4, compile_=True, seq=8192, model=GQA):
    return Scenario(name="t", model=model, cluster=ClusterConfig(),
                    training=TrainingConfig(seq_length=seq, micro_batch_size=1, global_batch_size=2),
                    parallelism=ParallelConfig(dp=2, cp=cp), framework=framework,
                    framework_options=FrameworkOptions(compile=compile_))


# pytorch/benchmark#2296: SDPA (flash backend), one of Meta's H100 hosts (500 W limit), batch 128 x 8
# heads x 128, non-causal forward: the 700 W curve times the host's power factor is the measurement.
@pytest.mark.parametrize("seq, tflops", [(1024, 287.457), (2048, 293.208), (4096, 298.428), (8192, 287.696),
                                         (16384, 304.199), (262144, 304.199)])
def test_sdpa_forward_on_the_measuring_host_is_the_measured_benchmark(seq, tflops):
    host = power_factor(500, 700)
    assert host == pytest.approx((500 / 700) ** (1 / 3)) and 0.89 < host < 0.90
    assert host * h100_tflops(AttentionKernel("sdpa", "fwd", False, 128, seq)) == pytest.approx(tflops)


@pytest.mark.parametrize("direction, causal, d, seq", [("fwd", True, 128, 4096), ("bwd", False, 128, 16384),
                                                       ("bwd", True, 64, 2048), ("fwd", False, 96, 512)])
def test_sdpa_is_fa2_times_the_measured_ratio_at_the_key_length(direction, causal, d, seq):
    ratio = {512: 287.457 / 350, 2048: 293.208 / 362, 4096: 298.428 / 368, 16384: 304.199 / 370}[seq]
    ratio /= power_factor(500, 700)
    fa2 = h100_tflops(AttentionKernel("fa2", direction, causal, d, seq))
    assert h100_tflops(AttentionKernel("sdpa", direction, causal, d, seq)) == pytest.approx(ratio * fa2)


def test_sdpa_on_ampere_is_fa2():
    assert attention.resolve_backend("sdpa", "A100-SXM4-80GB") == "fa2"
    assert attention.resolve_backend("flash", "H100-SXM5-80GB", "sdpa") == "sdpa"


def test_torchtitan_profile_says_sdpa_repeated_kv_and_torch_merges():
    prof = load_profile("torchtitan")["attention"]
    assert prof == {"kernel": "sdpa", "cp_comm_type": "all_gather", "kv_heads_expanded": True, "cp_merge": "torch",
                    "unfused_softmax": "fused"}
    for name in ("megatron-core", "nemo", "maxtext", "composer", "deepspeed", "automodel"):
        other = load_profile(name)["attention"]
        assert other["kv_heads_expanded"] is False and other["cp_merge"] == "te"


def test_repeated_kv_moves_query_heads_over_the_cp_group():
    """cp_bytes = K and V (2) x local tokens x heads x head_dim x 2 bytes: 8 query heads with
    repeat_kv (torchtitan), the 2 KV heads otherwise."""
    tt, mc = build_workload(scen("torchtitan"), H100), build_workload(scen("megatron-core"), H100)
    head_dim, local = 1024 // 8, 8192 / 4
    assert tt.cp_bytes == pytest.approx(2 * local * 8 * head_dim * 2)
    assert mc.cp_bytes == pytest.approx(2 * local * 2 * head_dim * 2)


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_cp_merge_bytes_closed_forms(cp):
    q, kv, n = 1000.0, 250.0, cp - 1
    fe, be, _, _ = cp_merge_bytes(q, kv, cp, compiled=False)
    # forward: contiguous 8 KV, cat 8 KV per later step, upcast + final cast 12 Q,
    # merges 38 per merged element on Q (i <= rank) or Q / 2 plus an 8 Q cat (partial), half each
    assert fe == pytest.approx(8 * kv + 12 * q + n * (8 * kv + (38 * q + 38 * q / 2 + 8 * q) / 2))
    # backward: zeros 4 Q + 8 KV, contiguous 8 KV, step-0 adds 20 KV, casts 6 Q + 12 KV, step-0 dQ 10 Q;
    # per later step: cat 8 KV, dK/dV (2 x 10 KV or 2 x (5 + 8) KV) / 2, dQ (10 Q or 5 Q + 8 Q) / 2;
    # the fp32 dK/dV send buffer 16 KV at every step
    per_step = 8 * kv + (20 * kv + 26 * kv) / 2 + (10 * q + 13 * q) / 2
    assert be == pytest.approx(4 * q + 8 * kv + 8 * kv + 20 * kv + 6 * q + 12 * kv + 10 * q + n * per_step
                               + 16 * kv * cp)
    fc, bc, _, _ = cp_merge_bytes(q, kv, cp, compiled=True)
    # compiled: one K/V cat, fused merges 10 per merged element, partial steps copy the other half (4 Q)
    assert fc == pytest.approx(8 * kv + n * (10 * q + 10 * q / 2 + 4 * q) / 2)
    assert bc == pytest.approx(8 * kv + 10 * q + cp * (20 * kv + 18 * kv) / 2 + n * (10 * q + 9 * q) / 2)
    assert fc < fe and bc < be


@pytest.mark.parametrize("compile_", [False, True])
def test_torchtitan_layer_carries_the_torch_merge_in_the_reference_merge_op(compile_):
    s = scen("torchtitan", compile_=compile_)
    base = layer_cost(s.model, s.training, s.parallelism, H100, 0)
    layer = layer_with_software(base, s.model, s.training, s.parallelism, H100, 0, resolve(s))
    local, heads, d = 8192 / 4, 8, 128
    fwd, bwd, fk, bk = cp_merge_bytes(local * heads * d, local * heads * d, 4, compile_)
    [f] = [op for op in layer.attn_fwd.ops if op.name == "attn_cp_merge"]
    [b] = [op for op in layer.attn_bwd.ops if op.name == "attn_cp_merge_bwd"]
    assert (f.bytes, f.kernels, b.bytes, b.kernels) == (pytest.approx(fwd), fk, pytest.approx(bwd), bk)
    names = [op.name for op in layer.attn_fwd.ops]
    assert names.index("attn_cp_merge") == names.index("attn_core_cp") + 1  # still after the arriving-key calls


def test_reference_merge_unchanged_for_te_frameworks_and_without_cp():
    for framework, cp in (("megatron-core", 4), ("torchtitan", 1)):
        s = scen(framework, cp=cp)
        base = layer_cost(s.model, s.training, s.parallelism, H100, 0)
        layer = layer_with_software(base, s.model, s.training, s.parallelism, H100, 0, resolve(s))
        merges = lambda block: [op for op in block.ops if op.name.startswith("attn_cp_merge")]
        assert merges(layer.attn_fwd) == merges(base.attn_fwd)
        assert merges(layer.attn_bwd) == merges(base.attn_bwd)
