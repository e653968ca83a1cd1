"""Fused attention as it runs: the measured kernel curves, their use in the layer cost, and CP."""

import dataclasses

import pytest

from simulator.scenario.config import ModelConfig, ParallelConfig, TrainingConfig
from simulator.parts.gpus import get_gpu
from simulator.workload import attention
from simulator.workload.attention import AttentionKernel, cp_attention_calls, h100_tflops, peak_fraction
from simulator.workload.compute import layer_cost

H100 = get_gpu("H100-SXM5-80GB")
A100 = get_gpu("A100-SXM4-80GB")
LLAMA8B = ModelConfig(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                      intermediate_size=14336, vocab_size=128256, hidden_act="silu")


@pytest.mark.parametrize("backend,direction,causal,d,seq,tflops", [
    # FlashAttention-3 paper (Shah et al. 2024) Fig. 5 and 6, H100 SXM5 BF16, read off the bars
    ("fa2", "fwd", True, 128, 8192, 333), ("fa2", "fwd", False, 128, 8192, 370),
    ("fa2", "bwd", False, 128, 8192, 318), ("fa3", "fwd", True, 128, 8192, 602),
    ("fa3", "fwd", True, 128, 512, 292), ("fa3", "bwd", False, 128, 16384, 561),
    ("fa2", "fwd", True, 64, 2048, 262), ("fa3", "fwd", False, 64, 4096, 476),
    ("fa3", "fwd", False, 128, 512, 467),  # the purple bar; 497 is cuDNN's (red) beside it
])
def test_measured_points_are_reproduced(backend, direction, causal, d, seq, tflops):
    assert h100_tflops(AttentionKernel(backend, direction, causal, d, seq)) == pytest.approx(tflops)


def test_8k_vs_128k_long_keys_take_the_plateau():
    """The curves are flat from 8k to 16k (FA2 causal 333 -> 335, FA3 602 -> 616): 128k keys
    run at the 16k rate, not faster, and 8k within 3% of it."""
    for backend in ("fa2", "fa3"):
        at_8k = h100_tflops(AttentionKernel(backend, "fwd", True, 128, 8192))
        at_128k = h100_tflops(AttentionKernel(backend, "fwd", True, 128, 131072))
        assert at_128k == h100_tflops(AttentionKernel(backend, "fwd", True, 128, 16384))
        assert 0.97 < at_8k / at_128k <= 1.0


def test_causal_backward_is_the_non_causal_backward_times_the_forward_causal_ratio():
    k = AttentionKernel("fa2", "bwd", True, 128, 4096)
    assert h100_tflops(k) == pytest.approx(310 * 319 / 368)


def test_head_dims_between_64_and_128_interpolate_and_others_clamp():
    mid = h100_tflops(AttentionKernel("fa3", "fwd", True, 96, 8192))
    assert mid == pytest.approx((460 + 602) / 2)
    assert h100_tflops(AttentionKernel("fa3", "fwd", True, 192, 8192)) == 602
    assert h100_tflops(AttentionKernel("fa3", "fwd", True, 32, 8192)) == 460


def test_kernel_choice_by_architecture():
    assert attention.resolve_backend("flash", "A100-SXM4-80GB") == "fa2"
    assert attention.resolve_backend("fa3", "A100-SXM4-80GB") == "fa2"  # FA3 needs Hopper
    assert attention.resolve_backend("flash", "H100-SXM5-80GB") == "cudnn"
    assert attention.resolve_backend("fa2", "H100-SXM5-80GB") == "fa2"
    assert attention.resolve_backend("fa3", "B200-SXM-180GB") == "cudnn"


@pytest.mark.parametrize("direction,ratio", [("fwd", 0.85), ("bwd", 0.76)])
@pytest.mark.parametrize("causal,d,seq", [(True, 64, 4096), (False, 128, 16384), (True, 128, 512)])
def test_flex_attention_is_its_authors_share_of_fa3_on_h100(direction, ratio, causal, d, seq):
    # GTC 2025 FlexAttention session abstract (PyTorch blog "PyTorch at GTC 2025"): on H100 the
    # forward averages 85% and the backward 76% of FlashAttention-3
    flex = h100_tflops(AttentionKernel("flex", direction, causal, d, seq))
    assert flex == pytest.approx(ratio * h100_tflops(AttentionKernel("fa3", direction, causal, d, seq)))


@pytest.mark.parametrize("direction,ratio", [("fwd", 0.90), ("bwd", 0.85)])
def test_flex_attention_on_a100_is_its_share_of_flashattention2(direction, ratio):
    # same source, and the PyTorch FlexAttention blog (2024-08-07): 90% / 85% of FA2 on A100
    assert attention.resolve_backend("flex", "A100-SXM4-80GB") == "flex"
    k = AttentionKernel("flex", direction, True, 128, 4096)
    fa2 = peak_fraction(dataclasses.replace(k, backend="fa2"), "A100-SXM4-80GB")
    assert peak_fraction(k, "A100-SXM4-80GB") == pytest.approx(ratio * fa2)


@pytest.mark.parametrize("gpu", ["H100-SXM5-80GB", "A100-SXM4-80GB"])
@pytest.mark.parametrize("direction,causal,d,seq", [("fwd", True, 128, 65536), ("bwd", False, 64, 2048),
                                                    ("fwd", False, 128, 8192)])
def test_llm_foundry_triton_kernel_runs_at_the_fa2_papers_share_of_flashattention2(gpu, direction, causal, d, seq):
    # the FlashAttention-2 paper (Sec. 4.1): FA2 is 1.3-1.5x faster than FlashAttention in Triton
    # forward (1.4 taken) and about 2x backward; the same share on every architecture and length
    assert attention.resolve_backend("triton", gpu) == "triton"
    k = AttentionKernel("triton", direction, causal, d, seq)
    fa2 = peak_fraction(dataclasses.replace(k, backend="fa2"), gpu)
    assert peak_fraction(k, gpu) == pytest.approx(fa2 / {"fwd": 1.4, "bwd": 2.0}[direction])


@pytest.mark.parametrize("gpu", ["H100-SXM5-80GB", "A100-SXM4-80GB"])
@pytest.mark.parametrize("direction,causal,d,seq", [("fwd", True, 64, 2048), ("bwd", False, 128, 8192)])
def test_flashattention_1_runs_at_half_of_flashattention2_on_every_gpu(gpu, direction, causal, d, seq):
    # the FlashAttention-2 paper (Sec. 4.1): FA2 is "around 2x faster" than FlashAttention
    assert attention.resolve_backend("fa1", gpu) == "fa1"
    k = AttentionKernel("fa1", direction, causal, d, seq)
    fa2 = peak_fraction(dataclasses.replace(k, backend="fa2"), gpu)
    assert peak_fraction(k, gpu) == pytest.approx(fa2 / 2)


def test_triton_attention_takes_1_4x_the_fa2_forward_and_2x_its_backward_in_a_layer():
    train = TrainingConfig(seq_length=65536, attention="fa2")
    for backward, slower in ((False, 1.4), (True, 2.0)):
        fa2 = _core(LLAMA8B, train, ParallelConfig(), H100, backward).time_s - H100.launch_overhead_s
        tri = _core(LLAMA8B, dataclasses.replace(train, attention="triton"), ParallelConfig(), H100,
                    backward).time_s - H100.launch_overhead_s
        assert tri == pytest.approx(slower * fa2)


def test_a100_plateaus_are_flashattention2s_73_and_63_percent_shape():
    fwd = peak_fraction(AttentionKernel("fa2", "fwd", False, 128, 16384), "A100-SXM4-80GB")
    bwd = peak_fraction(AttentionKernel("fa2", "bwd", False, 128, 16384), "A100-SXM4-80GB")
    assert fwd == pytest.approx(0.70)
    assert bwd == pytest.approx(0.70 * 63 / 73)


def _core(model, train, par, gpu, backward=False):
    cost = layer_cost(model, train, par, gpu, 0)
    ops = cost.attn_bwd.ops if backward else cost.attn_fwd.ops
    return next(op for op in ops if op.name == ("attn_core_bwd" if backward else "attn_core"))


def test_layer_attention_time_is_flops_over_the_measured_rate():
    """Llama 3 8B, 8k tokens, one GPU, FA2: forward = causal FLOPs / (335-ish TFLOP/s x sustained)."""
    train = TrainingConfig(seq_length=8192, attention="fa2")
    op = _core(LLAMA8B, train, ParallelConfig(), H100)
    flops = 4 * 8192 * 8192 * 4096 / 2
    assert op.flops == flops
    rate = 333e12 * H100.sustained_fraction
    assert op.time_s - H100.launch_overhead_s == pytest.approx(flops / rate, rel=0.02)


def test_fa2_is_about_half_as_fast_as_the_fused_hopper_kernel_at_long_context():
    train = TrainingConfig(seq_length=32768)
    fused = _core(LLAMA8B, train, ParallelConfig(), H100).time_s
    fa2 = _core(LLAMA8B, dataclasses.replace(train, attention="fa2"), ParallelConfig(), H100).time_s
    assert fa2 / fused == pytest.approx(616 / 335, rel=0.02)


@pytest.mark.parametrize("direction,causal,d,seq,tflops", [
    # FlashAttention-3 paper Fig. 5 and 6, H100 SXM5 BF16: the cuDNN (9.1) bars beside FA3's
    ("fwd", False, 128, 16384, 595), ("fwd", True, 128, 16384, 539), ("bwd", False, 128, 16384, 516),
    ("fwd", False, 128, 512, 497), ("fwd", False, 64, 2048, 395), ("fwd", True, 64, 8192, 379),
    ("bwd", False, 64, 512, 266),
])
def test_early_2024_cudnn_is_its_measured_bars(direction, causal, d, seq, tflops):
    assert h100_tflops(AttentionKernel("cudnn91", direction, causal, d, seq)) == pytest.approx(tflops)


def test_early_2024_cudnn_holds_its_16k_rate_at_long_keys_below_fa3():
    """At 128k keys the 16k bars: causal backward 516 x 539 / 595 (the non-causal backward times
    the forward's causal ratio), against FA3's 561 x 616 / 648 that ``cudnn`` runs."""
    old = h100_tflops(AttentionKernel("cudnn91", "bwd", True, 128, 131072))
    assert old == pytest.approx(516 * 539 / 595)
    now = h100_tflops(AttentionKernel("cudnn", "bwd", True, 128, 131072))
    assert now == pytest.approx(561 * 616 / 648)
    assert h100_tflops(AttentionKernel("cudnn91", "fwd", False, 128, 65536)) == 595


def test_early_2024_cudnn_by_architecture():
    assert attention.resolve_backend("cudnn91", "H100-SXM5-80GB") == "cudnn91"
    assert attention.resolve_backend("cudnn91", "A100-SXM4-80GB") == "fa2"  # TE on sm80 runs FA2
    assert attention.resolve_backend("cudnn91", "B200-SXM-180GB") == "cudnn"  # no 2024 cuDNN ran Blackwell


def test_layer_attention_with_early_2024_cudnn_costs_its_measured_ratio_more():
    """Llama 3 8B at 32k tokens on one GPU: the causal core takes 616 / 539 of the current
    kernel's time forward and (561 x 616 / 648) / (516 x 539 / 595) backward (launch gaps aside)."""
    train = TrainingConfig(seq_length=32768)
    old = dataclasses.replace(train, attention="cudnn91")
    for backward, ratio in ((False, 616 / 539), (True, (561 * 616 / 648) / (516 * 539 / 595))):
        new_t = _core(LLAMA8B, train, ParallelConfig(), H100, backward).time_s - H100.launch_overhead_s
        old_t = _core(LLAMA8B, old, ParallelConfig(), H100, backward).time_s - H100.launch_overhead_s
        assert old_t / new_t == pytest.approx(ratio)


def test_cp_calls_add_up_to_the_causal_work_and_balance():
    s = 131072
    for cp in (1, 2, 4, 8, 16):
        calls = cp_attention_calls(s, cp)
        assert len(calls) == cp
        work = sum(q * k / (2 if causal else 1) for q, k, causal in calls)
        assert work == pytest.approx(s * s / 2 / cp)


def test_cp_attention_flops_are_the_unsharded_flops_over_cp_and_merges_cost_bytes():
    train = TrainingConfig(seq_length=131072)
    one = _core(LLAMA8B, train, ParallelConfig(), H100)
    cost = layer_cost(LLAMA8B, train, ParallelConfig(cp=8), H100, 0)
    core = next(op for op in cost.attn_fwd.ops if op.name == "attn_core")
    merge = next(op for op in cost.attn_fwd.ops if op.name == "attn_cp_merge")
    ring = next(op for op in cost.attn_fwd.ops if op.name == "attn_core_cp")
    assert core.flops + ring.flops == pytest.approx(one.flops / 8)
    assert core.flops == pytest.approx(one.flops / 64)  # the local causal call: (s/cp)^2 / 2
    # 7 later calls: 3 with all 16k local query rows, 4 with 8k; 10 bytes per query element
    assert merge.bytes == pytest.approx(10 * (3 * 16384 + 4 * 8192) * 4096)
    assert not [op for op in layer_cost(LLAMA8B, train, ParallelConfig(), H100, 0).attn_fwd.ops
                if op.name == "attn_cp_merge"]


def _cp_step(cp_comm_type, nodes=4):
    from simulator.scenario.config import ClusterConfig, Scenario
    from simulator.reports.report import step_report
    from simulator.engine.engine import simulate

    s = Scenario(name="cp", model=dataclasses.replace(LLAMA8B, num_hidden_layers=2, num_key_value_heads=32),
                 cluster=ClusterConfig(topology="dgx-h100", num_nodes=nodes, gpus_per_node=8, gpu="H100-SXM5-80GB"),
                 training=TrainingConfig(seq_length=32768, micro_batch_size=1, global_batch_size=1),
                 parallelism=ParallelConfig(tp=8, cp=nodes, dp=1, sequence_parallel=True, cp_comm_type=cp_comm_type))
    return step_report(simulate(s))


def test_all_gather_cp_waits_where_the_p2p_ring_hides_under_the_core():
    """MHA K/V of 32k tokens over four nodes (48 MiB to gather per rank per layer): the ring
    overlaps the whole attention core, the gather only the local causal call (a quarter of the
    work, 1/16 of the causal square), so all_gather exposes more CP time; both run the same kernels
    (the same compute less the time communication kernels' SMs cost it, which differs as the
    exchanges overlap differently)."""
    p2p, gather = _cp_step("p2p"), _cp_step("all_gather")

    def kernels(r):
        return r["time_breakdown_s"]["compute_s"] - r["time_breakdown_s"]["contention_s"]
    assert kernels(gather) == pytest.approx(kernels(p2p), rel=1e-9)
    assert gather["time_breakdown_s"]["exposed_comm_s"]["cp"] > p2p["time_breakdown_s"]["exposed_comm_s"]["cp"]
    assert gather["step_time_s"] > p2p["step_time_s"]


def test_cp_overlap_off_exposes_at_least_what_the_ring_hides():
    from simulator.scenario.config import ClusterConfig, OverlapConfig, Scenario
    from simulator.reports.report import step_report
    from simulator.engine.engine import simulate

    def step(**overlap):
        s = Scenario(name="cp", model=dataclasses.replace(LLAMA8B, num_hidden_layers=2, num_key_value_heads=32),
                     cluster=ClusterConfig(topology="dgx-h100", num_nodes=4, gpus_per_node=8, gpu="H100-SXM5-80GB"),
                     training=TrainingConfig(seq_length=32768, micro_batch_size=1, global_batch_size=1),
                     parallelism=ParallelConfig(tp=8, cp=4, dp=1, sequence_parallel=True),
                     overlap=OverlapConfig(**overlap))
        return step_report(simulate(s))

    hidden, exposed = step(), step(cp_comm=False)
    assert exposed["time_breakdown_s"]["exposed_comm_s"]["cp"] > hidden["time_breakdown_s"]["exposed_comm_s"]["cp"]
    assert exposed["step_time_s"] > hidden["step_time_s"]


def test_blackwell_ultra_doubled_exponentials_speed_up_the_forward_only():
    """Closed form (m + 1/16) / (m + 1/32), m = 2 (d_qk + d_v) / 8192 matmul clocks per pair:
    4/3 at head dim 128, (640/8192 + 1/16) / (640/8192 + 1/32) = 1.2857 for MLA's 192/128."""
    fs = attention.clock_speedup
    assert fs("B200-SXM-180GB", 16, 128, 128) == 1.0 and fs("H100-SXM5-80GB", 16, 128, 128) == 1.0
    assert fs("GB300", 32, 128, 128) == pytest.approx(4 / 3)
    assert fs("GB300", 32, 192, 128) == pytest.approx((640 / 8192 + 1 / 16) / (640 / 8192 + 1 / 32))
    assert fs("A100-SXM4-80GB", 16, 128, 128, fp8=True) == 1.0
    assert get_gpu("GB300").sfu_ex2_per_clk_sm == 2 * get_gpu("GB200").sfu_ex2_per_clk_sm
    assert get_gpu("B300").sfu_ex2_per_clk_sm == 2 * get_gpu("B200").sfu_ex2_per_clk_sm
    # the layer's forward moves by the closed form (occupancy aside); the backward does not
    train = TrainingConfig(seq_length=8192)
    gb300 = get_gpu("GB300")
    no_sfu = dataclasses.replace(gb300, sfu_ex2_per_clk_sm=16)
    fwd = _core(LLAMA8B, train, ParallelConfig(), no_sfu).time_s / _core(LLAMA8B, train, ParallelConfig(), gb300).time_s
    assert fwd == pytest.approx(4 / 3, rel=0.01)
    assert _core(LLAMA8B, train, ParallelConfig(), no_sfu, backward=True).time_s == \
        _core(LLAMA8B, train, ParallelConfig(), gb300, backward=True).time_s
    assert _core(LLAMA8B, train, ParallelConfig(), H100).time_s == \
        _core(LLAMA8B, train, ParallelConfig(), dataclasses.replace(H100, sfu_ex2_per_clk_sm=16)).time_s


def test_held_back_tensor_cores_reach_more_of_their_peak_as_measured_on_the_h20():
    """The H20's tensor cores run at a quarter of the Hopper rate per SM and clock; the exponentials
    do not, so its forward reaches (m + 1/16) / m x 4m / (4m + 1/16) more of its own peak than the
    H100 curve: 4/3 at head dim 128. Against Dao-AILab/flash-attention issue 1310 (H20, BF16,
    forward, seqlen 2048, TFLOP/s of 148) the FA2 and FA3 curves so scaled fall 1-14% short, never
    over; the backward, five matmuls per pair to the forward's two, gains less."""
    h20 = get_gpu("H20")
    fs = attention.clock_speedup
    m = 512 / 4096
    held = 512 / h20.mma16_per_clk_sm
    assert fs("H20", 16, 128, 128, mma16_per_clk_sm=h20.mma16_per_clk_sm) == pytest.approx(
        (m + 1 / 16) / m * held / (held + 1 / 16))
    assert fs("H20", 16, 128, 128, mma16_per_clk_sm=h20.mma16_per_clk_sm) == pytest.approx(4 / 3, rel=0.01)
    measured = {("fa3", True, 128): 107.8, ("fa3", False, 128): 126.2, ("fa2", True, 128): 65.9,
                ("fa2", False, 128): 83.7, ("fa3", True, 64): 100.3, ("fa3", False, 64): 120.1,
                ("fa2", True, 64): 71.0, ("fa2", False, 64): 81.8}
    for (kernel, causal, d), tflops in measured.items():
        scaled = attention.peak_fraction(attention.AttentionKernel(kernel, "fwd", causal, d, 2048), "H20") \
            * fs("H20", 16, d, d, mma16_per_clk_sm=h20.mma16_per_clk_sm) * 148
        assert 0.86 * tflops < scaled < tflops, (kernel, causal, d, scaled)
    bwd = fs("H20", 16, 128, 128, mma16_per_clk_sm=h20.mma16_per_clk_sm, backward=True)
    assert 1.0 < bwd < fs("H20", 16, 128, 128, mma16_per_clk_sm=h20.mma16_per_clk_sm)
    # a part at its architecture's rate is unchanged, and the whole layer runs faster on the H20
    assert fs("H100-SXM5-80GB", 16, 128, 128, mma16_per_clk_sm=4096, backward=True) == 1.0
    train = TrainingConfig(seq_length=8192)
    full_rate = dataclasses.replace(h20, mma16_per_clk_sm=None)
    for backward in (False, True):
        assert _core(LLAMA8B, train, ParallelConfig(), h20, backward=backward).time_s < \
            _core(LLAMA8B, train, ParallelConfig(), full_rate, backward=backward).time_s


def test_fp8_attention_halves_the_forward_matmul_clocks():
    """FP8 matmuls at twice the 16-bit rate: Hopper (1/16 + 1/16) / (1/32 + 1/16) = 1.5 at head dim
    128 (FlashAttention-3's FP8 forward ran about 1.5x BF16); GB200 4/3; GB300 2; backward unchanged."""
    fs = attention.clock_speedup
    assert fs("H100-SXM5-80GB", 16, 128, 128, fp8=True) == pytest.approx(1.5)
    assert fs("GB200", 16, 128, 128, fp8=True) == pytest.approx(4 / 3)
    assert fs("GB300", 32, 128, 128, fp8=True) == pytest.approx(2.0)
    # NVIDIA's GB300-over-GB200 FP8 MLA forward (about 1.35x measured): 1.44 here
    assert fs("GB300", 32, 192, 128, fp8=True) / fs("GB200", 16, 192, 128, fp8=True) == pytest.approx(1.44, abs=0.01)
    bf16 = TrainingConfig(seq_length=8192, precision="fp8")
    fp8 = dataclasses.replace(bf16, fp8_attention=True)
    gpu = get_gpu("GB300")
    # on GB300 FP8 over its own 16-bit forward: 2 / (4/3)
    assert _core(LLAMA8B, bf16, ParallelConfig(), gpu).time_s / _core(LLAMA8B, fp8, ParallelConfig(), gpu).time_s \
        == pytest.approx(1.5, rel=0.01)
    assert _core(LLAMA8B, bf16, ParallelConfig(), gpu, backward=True).time_s == \
        _core(LLAMA8B, fp8, ParallelConfig(), gpu, backward=True).time_s


def test_fp8_attention_needs_an_fp8_recipe_and_the_fused_kernel():
    import subprocess
    import sys
    from pathlib import Path

    from simulator.common.errors import ConfigError
    from simulator.scenario.load import load_scenario
    from simulator.layout.rules import validate_plan

    tiny = str(Path(__file__).resolve().parents[1] / "scenarios" / "tiny.yaml")
    with pytest.raises(ConfigError, match="training.fp8_attention"):
        validate_plan(load_scenario(tiny, ["training.fp8_attention=true"]))  # BF16 run
    validate_plan(load_scenario(tiny, ["training.fp8_attention=true", "training.precision=fp8"]))
    r = subprocess.run([sys.executable, "-m", "simulator", "run", tiny, "--quiet", "--set", "training.fp8_attention=true"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "training.fp8_attention" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def _cores(model, train, par, gpu, backward=False):
    """The attention-core ops of one layer (local call, CP calls), by name."""
    cost = layer_cost(model, train, par, gpu, 0)
    ops = cost.attn_bwd.ops if backward else cost.attn_fwd.ops
    return {op.name: op for op in ops if op.name.startswith("attn_core")}


@pytest.mark.parametrize("backend", ["fa2", "fa3", "cudnn", "flex"])
def test_packed_documents_keep_d_over_s_of_the_causal_pairs_at_the_document_length_speed(backend):
    """8 documents of 1,024 tokens in an 8k sequence: s d / 2 of the s^2 / 2 pairs, so the FLOPs fall to
    d / s, and the time to d / s of the full call over the kernel's speed at 1,024 keys (not 8,192)."""
    full = TrainingConfig(seq_length=8192, attention=backend)
    docs = dataclasses.replace(full, document_tokens=1024)
    for backward in (False, True):
        a, b = _core(LLAMA8B, full, ParallelConfig(), H100, backward), _core(LLAMA8B, docs, ParallelConfig(), H100, backward)
        assert b.flops == pytest.approx(a.flops * 1024 / 8192)
        direction = "bwd" if backward else "fwd"
        speed = (peak_fraction(AttentionKernel(attention.resolve_backend(backend, H100.name), direction, True, 128, 1024),
                               H100.name)
                 / peak_fraction(AttentionKernel(attention.resolve_backend(backend, H100.name), direction, True, 128, 8192),
                                 H100.name))
        compute_a, compute_b = a.time_s - H100.launch_overhead_s, b.time_s - H100.launch_overhead_s
        assert compute_b == pytest.approx(compute_a * 1024 / 8192 / speed, rel=1e-9)
        assert speed < 1  # a short document runs the kernel below its long-sequence speed
    # one document as long as the sequence is the default, to the bit
    same = dataclasses.replace(full, document_tokens=8192)
    assert layer_cost(LLAMA8B, same, ParallelConfig(), H100, 0) == layer_cost(LLAMA8B, full, ParallelConfig(), H100, 0)


def test_packed_documents_under_context_parallelism_and_sliding_windows():
    """CP 4: every call keeps d / s of its pairs; a window shorter than the documents sets the pairs,
    documents shorter than the window do."""
    full = TrainingConfig(seq_length=32768, attention="fa3")
    docs = dataclasses.replace(full, document_tokens=2048)
    par = ParallelConfig(cp=4)
    a, b = _cores(LLAMA8B, full, par, H100), _cores(LLAMA8B, docs, par, H100)
    assert set(a) == set(b) == {"attn_core", "attn_core_cp"}
    for name in a:
        assert b[name].flops == pytest.approx(a[name].flops * 2048 / 32768)
        assert b[name].time_s < a[name].time_s
    windowed = dataclasses.replace(LLAMA8B, sliding_window=1024, layer_types=("sliding_attention",) * 32)
    w = _core(windowed, full, ParallelConfig(), H100)
    assert _core(windowed, docs, ParallelConfig(), H100) == w  # 1,024-key window inside 2,048-token documents
    short = dataclasses.replace(full, document_tokens=512)
    assert _core(windowed, short, ParallelConfig(), H100).flops == pytest.approx(
        _core(LLAMA8B, full, ParallelConfig(), H100).flops * 512 / 32768)


@pytest.mark.parametrize("backend", ["sdpa", "triton", "unfused"])
def test_kernels_that_take_a_dense_mask_pay_for_every_pair_and_the_scenario_says_so(backend):
    from simulator.simulation import run
    full = TrainingConfig(seq_length=8192, attention=backend)
    docs = dataclasses.replace(full, document_tokens=1024)
    assert layer_cost(LLAMA8B, docs, ParallelConfig(), H100, 0) == layer_cost(LLAMA8B, full, ParallelConfig(), H100, 0)
    r = run("simulator/data/scenarios/tiny.yaml", [f"training.attention={backend}", "training.document_tokens=64"])
    assert any(w.startswith("training.document_tokens: got 64; attention " + backend) for w in r.warnings)
    assert not run("simulator/data/scenarios/tiny.yaml", ["training.document_tokens=64"]).warnings


def test_a_framework_whose_flash_kernel_takes_a_dense_mask_says_so_too():
    """attention flash runs the framework's kernel: torchtitan's is SDPA, which computes every pair,
    so its layer costs as without documents and the scenario warns, naming the kernel."""
    from simulator.simulation import run
    from simulator.engine.inputs import gpu_of
    from simulator.workload.workload import build_workload
    base = ["framework=torchtitan"]
    docs = run("simulator/data/scenarios/tiny.yaml", base + ["training.document_tokens=64"])
    assert any("attention sdpa (the torchtitan profile's kernel" in w for w in docs.warnings)
    plain = run("simulator/data/scenarios/tiny.yaml", base)
    cost = lambda s: build_workload(s, gpu_of(s.cluster, s.training.precision)).layer_costs[0]
    assert cost(docs.scenario) == cost(plain.scenario)


@pytest.mark.parametrize("value, says", [(0, "training.document_tokens"), (-5, "training.document_tokens"),
                                         ("many", "training.document_tokens"), (10**9, "training.document_tokens")])
def test_bad_document_lengths_are_one_line_errors_with_exit_2(value, says, capsys):
    from simulator.cli import main
    code = main(["run", "simulator/data/scenarios/tiny.yaml", "--set", f"training.document_tokens={value}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and says in err and "Traceback" not in err
