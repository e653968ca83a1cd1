"""GPU catalog: datasheet peaks plus the few measured efficiencies the compute model needs.

Peaks are dense (no 2:4 sparsity) FLOP/s. HBM and NVLink bandwidths are decimal bytes/s
(NVLink per direction: NVIDIA quotes the bidirectional sum). Capacities are the marketed
size read as GiB, the convention in ``simulator.common.units``.

Besides the datasheet numbers each ``GPUSpec`` carries the handful of achieved-performance
constants used by ``simulator.workload.compute`` (same for every scenario, never per case):

- ``gemm_efficiency[precision]``: largest fraction of peak a dense GEMM reaches at its best
  shape (the "maximum achievable matmul FLOPS", MAMF). Shape losses are applied on top.
- ``memory_efficiency``: fraction of HBM bandwidth an elementwise/normalisation kernel sustains.
- ``launch_overhead_s``: per-kernel idle gap (launch, ramp-up and tail) between dependent kernels.
- ``nvlink_efficiency``: fraction of the nominal per-direction NVLink rate that NCCL transfers
  sustain; the cluster's NVLink links carry nominal x this.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from simulator.common import limits
from simulator.common.errors import ConfigError
from simulator.common.schema import Choice, Number, PerName, Text, Whole, check_section, key
from simulator.common.units import GiB, TERA, GBps
from simulator.common.yamlfile import load_yaml_file

PRECISIONS = ("bf16", "fp16", "fp8", "tf32", "mxfp8", "nvfp4")


@dataclass(frozen=True)
class GPUSpec:
    """One GPU model. All fields SI: FLOP/s, bytes/s, bytes, seconds."""

    name: str
    peak_flops: dict[str, float]
    hbm_bandwidth_Bps: float
    hbm_capacity_bytes: float
    nvlink_bandwidth_Bps: float
    source: str
    num_sms: int = 132
    gemm_efficiency: dict[str, float] = field(default_factory=dict)
    memory_efficiency: float = 0.8
    launch_overhead_s: float = 3e-6
    sustained_fraction: float = 1.0
    nvlink_efficiency: float = 1.0
    nvlink_generation: int = 0  # 3 Ampere, 4 Hopper (NVSwitch gen 3: NVLS), 5 Blackwell
    sfu_ex2_per_clk_sm: int = 16  # MUFU.EX2 results per clock per SM (softmax exponentials; attention.clock_speedup)
    # 16-bit dense tensor-core FLOPs per SM per clock when the part's tensor cores run below its
    # architecture's rate (``H20_MMA16_PER_CLK_SM``); None: the architecture's (attention.MMA16_PER_CLK_SM)
    mma16_per_clk_sm: float | None = None
    tdp_w: float | None = None  # board power the sustained fraction was fitted at; None: not catalogued
    power_limit_w: float | None = None  # the part's default power limit when below its TDP (``gpu_of`` applies it)
    host_overhead: float = 1.0  # host CPU time per framework op against an x86 DGX host's (``GRACE_HOST_OVERHEAD``)
    host_link_Bps: float = 64e9  # GPU <-> host memory per direction (``HOST_LINK``): PCIe Gen5 x16 unless set

    def __hash__(self) -> int:
        return hash(self.name)


# MAMF (maximum achievable matmul FLOPS, BF16, best shape found by brute force), from
# S. Bekman, "Machine Learning Engineering", compute/accelerator/README.md, MAMF table:
# A100 SXM 267.9/312 = 0.859 (CUDA 12.1); H100 SXM 792.1/989 = 0.801 (CUDA 12.1).
# H800 and H200 share the H100 die and 700 W limit, so they take the H100 value. FP8 (e4m3) on
# H100 SXM: 1402.6 / 1979 = 0.709 (same table, torch 2.7.0+cu126): the matmul alone; the kernels
# that quantize its operands are priced apart (compute.py ``quantize_bytes``, software.py casts).
_A100_GEMM = {"bf16": 0.859, "fp16": 0.859, "tf32": 0.859}
_HOPPER_GEMM = {"bf16": 0.801, "fp16": 0.801, "tf32": 0.801, "fp8": 1402.6 / 1979}

# Fused attention kernels are not one constant per GPU: simulator.workload.attention holds their
# measured curves (kernel, direction, causal mask, head dim, key length).

# Sustained fraction: the share of the short-benchmark MAMF and attention throughput that GEMM
# and attention kernels keep over a real training step (minutes of power-capped load: SM clocks
# fall below the boost clock). The SMs that communication kernels hold while compute runs beside
# them are not in it: the engine prices those (``engine.StepEngine.gpu_time``,
# ``nccl.kernel_sms``). These are the only constants calibrated on measured runs: one per GPU
# family, on shared/validation/public-runs.yaml (A100: Megatron-LM SC21 Table 1 and Korthikanti et
# al. 2022 Table 5, 18 cases; Hopper: NVIDIA dgxc-benchmarking NeMo 24.11 GPT-3 175B and Llama 3.1
# 8B, 10 cases), as the value minimising the mean absolute step-time error, on a 0.01 grid, with
# the communication kernels' SMs priced (A100: MAPE 3.02 / 2.90 / 2.87 / 3.03% at 0.88 / 0.89 /
# 0.90 / 0.91). On Hopper the two recipes pull apart (GPT-3 175B about -5%, Llama 3.1 8B about
# +5%) and the MAPE is flat (5.20 / 5.15 / 5.10% at 0.81 / 0.82 / 0.83), so the value is where the
# mean error is nearest zero: +1.2 / +0.1 / -1.0% at 0.81 / 0.82 / 0.83 (checked again in 0.5.7,
# once the GPT-3 rows ran NeMo's TP overlap as their recipe sets it: ``studies.cases.framework_of``;
# before, they read as -2% and the mean at 0.82 as +1.5%). (Before the SMs were
# priced the same procedure gave 0.88 and 0.81: those values carried the average contention of
# these Megatron runs, which overlap little, into every run.) The 700 W Hopper parts lose more
# than the 400 W A100, as their power-capped clocks are known to. B200 is unmeasured and takes
# the Hopper value.
_A100_SUSTAINED = 0.90
_HOPPER_SUSTAINED = 0.82


def power_factor(limit_w: float, tdp_w: float) -> float:
    """Share of its compute-bound throughput a GPU keeps at power limit ``limit_w`` below its TDP.

    A power-capped GPU lowers its SM clock until its draw fits. Dynamic power is C V^2 f and over
    the DVFS range the supply voltage rises with the clock (V ~ f), so power goes as f^3 and the
    clock, hence the throughput of compute-bound kernels (GEMM, fused attention), as the cube root
    of the power allowed (Weste & Harris, CMOS VLSI Design, Sec. 5.1 dynamic power; the standard
    DVFS cube law). The sustained fractions above were fitted on parts at their TDP, so a part
    held at a lower limit keeps (limit / TDP)^(1/3) of them; memory-bound kernels are left alone
    (HBM runs on its own clock). The law errs fast for the most power-hungry kernels, where the
    voltage floor makes power closer to linear in the clock: on Meta's 500 W H100 hosts FA3 ran
    465 TFLOP/s at (8, 16, 8192, 128) (meta-pytorch/tritonbench#141) against 638 on a 700 W H100
    (FlashAttention-3 paper, Fig. 5), 0.73, where the law gives 0.894; torchtitan's benchmark file
    bounds the 500 W part's peak between the H100 SXM's and the H100 NVL's (835 / 989 = 0.84).
    """
    if not 0 < limit_w <= tdp_w:
        raise ValueError(f"power limit {limit_w!r} W must be in (0, {tdp_w}] W")
    return (limit_w / tdp_w) ** (1 / 3)

# Elementwise and normalisation kernels sustain ~80% of HBM peak; a STREAM-style copy reaches
# ~90% (A100 ~1.8 of 2.04 TB/s, H100 ~3.0 of 3.35 TB/s, nvbandwidth / BabelStream figures).
_MEM_EFF = 0.80

# Idle gap per dependent kernel: CUDA launch latency is ~3-5 us but mostly hidden by asynchronous
# launch; what remains is ramp-up and tail, an estimate of ~3 us per kernel.
_LAUNCH_S = 3e-6

# NVLink achievable by NCCL. A100: NCCL's topology model rates an NVLink3 link at 20 of its
# nominal 25 GB/s (SM80_NVLINK_BW in src/graph/topo.h), 240 of 300 GB/s per GPU, and its 2.7-2.8
# tuning capped sm80 bus bandwidth at 235 GB/s; nccl-tests users report about 200-235 GB/s busbw
# for 8-GPU all_reduce (validation/collectives.yaml: about 200 at 1 GiB). 0.80 used.
# Hopper: NCCL rates an NVLink4 link at 20.6 of its nominal 25 GB/s (SM90_NVLINK_BW, src/graph/topo.h),
# 371 of 450 GB/s per GPU, and its author puts the protocol overhead at about 20%: "NCCL can get an
# effective NVLink bandwidth of 370GB/s, which you can observe as BusBw when running non-allreduce
# operations" (S. Jeaugey, NVIDIA/nccl-tests issue 212, DGX H100). Measured ring reduce_scatter and
# all_gather on 8 H100 plateau at 362 and 360 GB/s busbw (tests/data/nccl-scale.yaml). 20.6 / 25 used.
# Only NVLS all-reduce, whose in-switch reduction halves the bytes, shows more bus bandwidth: it is
# priced on these links with NCCL's own nvlsEfficiency (network.nccl.NVLS_EFFICIENCY).
# Blackwell: NCCL rates an NVLink5 link at 40.1 of 50 GB/s (SM100_NVLINK_BW, same file): 40.1 / 50.
_A100_NVLINK = 0.80
_HOPPER_NVLINK = 20.6 / 25.0
_BLACKWELL_NVLINK = 40.1 / 50.0

# Blackwell (B200, B300, GB200, GB300). MAMF measured per part (S. Bekman, "Machine Learning
# Engineering", compute/accelerator/README.md, MAMF table, mean of 100 iterations at the best
# shape found, BF16 / FP8 e4m3): B200 SXM 1745.0 / 2250 = 0.776 and 3432.5 / 4500 = 0.763 (torch
# 2.7.1+cu128); B300 SXM 1769.0 / 2250 = 0.786 and 3353.3 / 4500 = 0.745 (2.9.1+cu130); GB200
# 1822.0 / 2500 = 0.729 and 3615.6 / 5000 = 0.723 (2.10.0.dev+cu130). GB300 is not in the table:
# it takes B300's fractions (the same Blackwell Ultra die and tensor cores). The sustained
# fraction has no public Blackwell measurement and stays Hopper's; the NVLink efficiency is NCCL's
# own rating of an NVLink5 link (below).
# The block-scaled formats are GEMM precisions only:
# MXFP8 (OCP Microscaling: FP8 E4M3 elements with one E8M0 scale per 32) runs on Blackwell's
# tensor cores at the FP8 rate and NVFP4 (E2M1 elements, one E4M3 scale per 16) at the FP4 rate
# (NVIDIA Blackwell architecture technical brief; Transformer Engine docs, "Using FP8 and FP4
# with Transformer Engine": MXFP8BlockScaling and NVFP4BlockScaling recipes quantize Linear
# layers only, attention stays BF16 unless fp8_dot_product_attention). Their GEMM ceiling is the
# part's measured FP8 MAMF times the kernel-time ratio NVIDIA measured on one part at the same
# shapes (Transformer Engine docs, "GEMM Profiling Tutorial", docs/examples/gemm_profiling, 2026-06,
# B300 SXM6, the 12 GEMMs of a hidden-4096 / FFN-16384 layer at 15,872 tokens, operands
# pre-quantized so only the GEMM kernels are timed): per layer FP8 current scaling 6.812 ms,
# MXFP8 7.161 ms, NVFP4 3.764 ms. MXFP8 runs at the FP8 peak, so its ceiling is FP8's x
# 6.812 / 7.161 = 0.951 (the per-32 scales cost the MMA pipeline); NVFP4 ran 1.81x FP8 against a
# 3x peak (13.5 / 4.5 PF), so its fraction of its own peak is FP8's x 1.81 / 3 = 0.603. The same
# ratios are taken on every Blackwell part (one measurement, no per-part data).
_TE_GEMM_MS = {"fp8": 6.812, "mxfp8": 7.161, "nvfp4": 3.764}  # per layer, B300, pre-quantized
_B300_FP4_OVER_FP8_PEAK = 13.5 / 4.5
MXFP8_OVER_FP8 = _TE_GEMM_MS["fp8"] / _TE_GEMM_MS["mxfp8"]
NVFP4_OVER_FP8 = _TE_GEMM_MS["fp8"] / _TE_GEMM_MS["nvfp4"] / _B300_FP4_OVER_FP8_PEAK
# Special function units: every SM up to Blackwell returns 16 MUFU.EX2 (exp2) results per clock
# (CUDA C++ Programming Guide, arithmetic instruction throughput table; FlashAttention-4, Zadouri
# et al. 2026: "the exponential unit remains at 16 operations per clock per SM" on B200);
# Blackwell Ultra (B300, GB300) doubles it (NVIDIA Technical Blog, "Inside NVIDIA Blackwell Ultra"
# and "Making Softmax More Efficient with NVIDIA Blackwell Ultra": 2x SFU throughput for MUFU.EX2).
_BLACKWELL_ULTRA_EX2 = 32


def _blackwell_gemm(bf16: float, fp8: float) -> dict[str, float]:
    return {"bf16": bf16, "fp16": bf16, "tf32": bf16, "fp8": fp8, "mxfp8": fp8 * MXFP8_OVER_FP8,
            "nvfp4": fp8 * NVFP4_OVER_FP8}


# Host CPU. A PyTorch training step issues its kernels from Python on one CPU core per GPU, and the
# framework's per-op host time (profile execution.host_issue_us, moe.HOST_OP_S) was taken on x86
# hosts. The Grace-Blackwell superchips (GB200, GB300) host each GPU on an Arm Neoverse V2 Grace
# CPU, on which the same ops take longer: NVIDIA/TransformerEngine issue #2053 (2025-08-11) timed
# one BF16 torch.nn.Linear forward (hidden 2048, 8,192 tokens, averaged over runs) at 37.08 us of
# CPU on GB200 and 13.48 us on a DGX H100 (Xeon Platinum 8480C), 2.75x (GH200's Grace 33.17 us,
# 2.46x; TE's own Linear 99.66 us on GB200). The NVIDIA DeepSeek-V3 GB200 optimization guide
# (Megatron-LM docs/discussions/deepseek-v3-gb200-optimization) found its baseline host-bound for
# the same reason. Parts on x86 hosts (B200, B300 in DGX/HGX systems) keep 1.0.
# The GPU's link to host memory, per direction, which CPU activation offloading copies over
# (simulator.workload.offload). Transformer Engine's CPU-offloading guide (docs/features/
# other_optimizations/cpu_offloading/cpu_offloading.rst): PCIe Gen5 x16 128 GB/s bidirectional,
# NVLink-C2C 900 GB/s bidirectional. A100 (PCIe Gen4 x16): 64 GB/s bidirectional (A100 datasheet).
# GH200: one Grace per GPU, the whole C2C link. GB200 / GB300: one Grace and its C2C link per two
# GPUs (GB200 NVL72 datasheet: "two Blackwell GPUs and a Grace CPU ... NVLink-C2C 900 GB/s"), and
# both GPUs of a superchip run the same program, so each has half of it. Link rates, not measured
# copy rates: pinned-memory copies come near them.
HOST_LINK = {"pcie4": 32e9, "pcie5": 64e9, "c2c": 450e9, "c2c_shared": 225e9}

GRACE_HOST_OVERHEAD = 37.08 / 13.48
GH200_HOST_OVERHEAD = 33.17 / 13.48  # the same benchmark on GH200's Grace

# H20: the GH100 die with 78 SMs whose tensor cores are held to 148 TF 16-bit dense, a quarter of
# the full Hopper rate per SM: 148e12 / (78 SMs x 1.83 GHz, the clock the H100 SXM datasheet's
# 989 TF assumes; the H20's own boost clock is not published) = 1,037 FLOPs per SM per clock,
# against 4,096 (attention.MMA16_PER_CLK_SM). Memory, shared memory and the special function
# units are not held back, so what a kernel spends outside the tensor cores costs relatively less
# and its kernels reach a larger share of their peak. Measured (zzc0721/torch-performance-test-data
# issue 77, 2025-10-17, torch 2.7.0+cu128, square torch.matmul): BF16 138.60 TF at 8192^3 and
# 142.25 at 10240^3, FP16 142.09, TF32 71.80 of 74: 0.961 of peak against the H100's 0.801. FP8 is
# not measured on this part: its fraction takes the H100's FP8 / BF16 ratio (0.709 / 0.801).
# Fused attention (Dao-AILab/flash-attention issue 1310, H20, BF16, forward, seqlen 2048): FA3 and
# cuDNN reach 0.73 (causal) and 0.85 (non-causal) of 148 TF at head dim 128; the H100 curves reach
# 0.53 and 0.63 at that length, and ``attention.clock_speedup`` with this MMA rate gives 0.70
# and 0.84 (FA2: 0.40 and 0.49 against 0.45 and 0.57 measured).
H20_MMA16_PER_CLK_SM = 148e12 / (78 * 1.83e9)
_H20_BF16_MAMF = 142.25 / 148
_H20_GEMM = {"bf16": _H20_BF16_MAMF, "fp16": 142.09 / 148, "tf32": 71.80 / 74,
             "fp8": _H20_BF16_MAMF * _HOPPER_GEMM["fp8"] / _HOPPER_GEMM["bf16"]}

_B200_GEMM = _blackwell_gemm(1745.0 / 2250, 3432.5 / 4500)
_B300_GEMM = _blackwell_gemm(1769.0 / 2250, 3353.3 / 4500)
_GB200_GEMM = _blackwell_gemm(1822.0 / 2500, 3615.6 / 5000)

_AMPERE = dict(gemm_efficiency=_A100_GEMM, sustained_fraction=_A100_SUSTAINED, tdp_w=400.0, host_link_Bps=HOST_LINK["pcie4"],
               memory_efficiency=_MEM_EFF, launch_overhead_s=_LAUNCH_S, nvlink_efficiency=_A100_NVLINK,
               nvlink_generation=3)
_HOPPER = dict(gemm_efficiency=_HOPPER_GEMM, sustained_fraction=_HOPPER_SUSTAINED, tdp_w=700.0,
               memory_efficiency=_MEM_EFF, launch_overhead_s=_LAUNCH_S, nvlink_efficiency=_HOPPER_NVLINK,
               nvlink_generation=4)

_BLACKWELL = {**{k: v for k, v in _HOPPER.items() if k != "gemm_efficiency"}, "nvlink_generation": 5, "tdp_w": None,
              "nvlink_efficiency": _BLACKWELL_NVLINK}  # sustained: Hopper's constant, see above

# Dense peaks shared by the parts of one die: both A100 memory sizes and the A800, and H100 / H800 / H200
# (the same GH100 compute at the same clocks; H800 differs in NVLink, H200 in memory).
_A100_PEAK = {"bf16": 312 * TERA, "fp16": 312 * TERA, "tf32": 156 * TERA}
_H100_PEAK = {"bf16": 989 * TERA, "fp16": 989 * TERA, "fp8": 1979 * TERA, "tf32": 494.7 * TERA}

GPU_CATALOG: dict[str, GPUSpec] = {
    "A100-SXM4-80GB": GPUSpec(
        name="A100-SXM4-80GB",
        peak_flops=_A100_PEAK,
        hbm_bandwidth_Bps=GBps(2039),
        hbm_capacity_bytes=80 * GiB,
        nvlink_bandwidth_Bps=GBps(300),
        source="NVIDIA A100 Tensor Core GPU datasheet (2021): 312 TF BF16 dense, HBM2e 2039 GB/s, "
        "NVLink3 600 GB/s bidirectional; A100 whitepaper: 108 SMs",
        num_sms=108,
        **_AMPERE,
    ),
    "A100-SXM4-40GB": GPUSpec(
        name="A100-SXM4-40GB",
        peak_flops=_A100_PEAK,
        hbm_bandwidth_Bps=GBps(1555),
        hbm_capacity_bytes=40 * GiB,
        nvlink_bandwidth_Bps=GBps(300),
        source="NVIDIA A100 Tensor Core GPU datasheet (2021): 312 TF BF16 dense, HBM2 1555 GB/s, "
        "NVLink3 600 GB/s bidirectional; 108 SMs",
        num_sms=108,
        **_AMPERE,
    ),
    "H100-SXM5-80GB": GPUSpec(
        name="H100-SXM5-80GB",
        peak_flops=_H100_PEAK,
        hbm_bandwidth_Bps=GBps(3350),
        hbm_capacity_bytes=80 * GiB,
        nvlink_bandwidth_Bps=GBps(450),
        source="NVIDIA H100 Tensor Core GPU datasheet (SXM5): 989 TF BF16 / 1979 TF FP8 dense, "
        "HBM3 3.35 TB/s, NVLink4 900 GB/s bidirectional; Hopper whitepaper: 132 SMs",
        num_sms=132,
        **_HOPPER,
    ),
    "H100-SXM5-96GB": GPUSpec(
        name="H100-SXM5-96GB",
        peak_flops=_H100_PEAK,
        hbm_bandwidth_Bps=GBps(2400),
        hbm_capacity_bytes=96 * GiB,
        nvlink_bandwidth_Bps=GBps(450),
        source="Meta Grand Teton H100 as torchtitan's benchmarks describe it (benchmarks/"
        "llama3_h100_202412_torchtitan.md): the H100 SXM die (132 SMs, same boost clock, so the "
        "SXM5 datasheet peaks) with 96 GB at 2.4 TB/s, 900 GB/s NVLink; run at the hosts' default "
        "500 W power limit ('tuning it up to 700W TDP can potentially provide further speedups'), "
        "priced by power_factor",
        num_sms=132,
        **{**_HOPPER, "power_limit_w": 500.0},
    ),
    "H800-80GB": GPUSpec(
        name="H800-80GB",
        peak_flops=_H100_PEAK,
        hbm_bandwidth_Bps=GBps(3350),
        hbm_capacity_bytes=80 * GiB,
        nvlink_bandwidth_Bps=GBps(200),
        source="NVIDIA H800 SXM5 product brief: H100 compute and HBM3 3.35 TB/s, NVLink 400 GB/s "
        "bidirectional (DeepSeek-V3 report, Sec. 3.1); 132 SMs",
        num_sms=132,
        **_HOPPER,
    ),
    "H200-SXM-141GB": GPUSpec(
        name="H200-SXM-141GB",
        peak_flops=_H100_PEAK,
        hbm_bandwidth_Bps=GBps(4800),
        hbm_capacity_bytes=141 * GiB,
        nvlink_bandwidth_Bps=GBps(450),
        source="NVIDIA H200 Tensor Core GPU datasheet (SXM): 989 TF BF16 / 1979 TF FP8 dense, "
        "141 GB HBM3e at 4.8 TB/s, NVLink4 900 GB/s bidirectional; 132 SMs",
        num_sms=132,
        **_HOPPER,
    ),
    # Grace Hopper superchips: the H100 die (same compute, NVLink 4) beside a Grace CPU that hosts
    # it, so the H100 peaks, Hopper's constants and the Grace host's per-op time
    # (GH200_HOST_OVERHEAD). The module's power (450-1000 W, CPU and memory included) is
    # programmable; the GPU is priced at Hopper's 700 W fractions.
    "GH200-96GB": GPUSpec(
        name="GH200-96GB",
        peak_flops=_H100_PEAK,
        hbm_bandwidth_Bps=GBps(4000),
        hbm_capacity_bytes=96 * GiB,
        nvlink_bandwidth_Bps=GBps(450),
        source="NVIDIA GH200 Grace Hopper Superchip datasheet: H100 GPU (989 TF BF16 / 1979 TF FP8 "
        "dense), 96 GB HBM3 at 4 TB/s, NVLink4 900 GB/s bidirectional, Grace CPU over NVLink-C2C; "
        "132 SMs",
        num_sms=132,
        host_overhead=GH200_HOST_OVERHEAD,
        host_link_Bps=HOST_LINK["c2c"],
        **_HOPPER,
    ),
    "GH200-144GB": GPUSpec(
        name="GH200-144GB",
        peak_flops=_H100_PEAK,
        hbm_bandwidth_Bps=GBps(4900),
        hbm_capacity_bytes=144 * GiB,
        nvlink_bandwidth_Bps=GBps(450),
        source="NVIDIA GH200 Grace Hopper Superchip datasheet, HBM3e version: H100 GPU, 144 GB HBM3e "
        "at 4.9 TB/s, NVLink4 900 GB/s bidirectional, Grace CPU over NVLink-C2C; 132 SMs",
        num_sms=132,
        host_overhead=GH200_HOST_OVERHEAD,
        host_link_Bps=HOST_LINK["c2c"],
        **_HOPPER,
    ),
    "B200-SXM-180GB": GPUSpec(
        name="B200-SXM-180GB",
        peak_flops={"bf16": 2250 * TERA, "fp16": 2250 * TERA, "fp8": 4500 * TERA, "tf32": 1125 * TERA,
                    "mxfp8": 4500 * TERA, "nvfp4": 9000 * TERA},
        hbm_bandwidth_Bps=GBps(8000),
        hbm_capacity_bytes=180 * GiB,
        nvlink_bandwidth_Bps=GBps(900),
        source="NVIDIA HGX/DGX B200 datasheet, per GPU (sparse figures halved): 2.25 PF BF16, "
        "4.5 PF FP8 dense, 180 GB HBM3e at 8 TB/s, NVLink5 1.8 TB/s bidirectional; 148 SMs; "
        "MXFP8 at the FP8 rate, NVFP4 9 PF dense (DGX B200: 144 PF FP4 sparse over 8 GPUs)",
        num_sms=148,
        gemm_efficiency=_B200_GEMM,
        **_BLACKWELL,
    ),
    # Blackwell parts with the block-scaled precisions (dense = the datasheets' sparse figures halved).
    "B300": GPUSpec(
        name="B300",
        peak_flops={"bf16": 2250 * TERA, "fp16": 2250 * TERA, "fp8": 4500 * TERA, "mxfp8": 4500 * TERA,
                    "nvfp4": 13500 * TERA, "tf32": 1125 * TERA},
        hbm_bandwidth_Bps=GBps(8000),
        hbm_capacity_bytes=288 * GiB,
        nvlink_bandwidth_Bps=GBps(900),
        source="NVIDIA HGX B300 datasheet (8 GPUs: 36 PF BF16, 72 PF FP8 sparse; 108 PF FP4 dense; "
        "2.3 TB HBM3e), per GPU and dense: 2.25 PF BF16, 4.5 PF FP8/MXFP8, 13.5 PF NVFP4, 288 GB HBM3e "
        "at 8 TB/s; NVLink5 1.8 TB/s bidirectional; Blackwell Ultra: 160 SMs",
        num_sms=160,
        gemm_efficiency=_B300_GEMM,
        sfu_ex2_per_clk_sm=_BLACKWELL_ULTRA_EX2,
        **_BLACKWELL,
    ),
    "GB200": GPUSpec(
        name="GB200",
        peak_flops={"bf16": 2500 * TERA, "fp16": 2500 * TERA, "fp8": 5000 * TERA, "mxfp8": 5000 * TERA,
                    "nvfp4": 10000 * TERA, "tf32": 1250 * TERA},
        hbm_bandwidth_Bps=GBps(8000),
        hbm_capacity_bytes=186 * GiB,
        nvlink_bandwidth_Bps=GBps(900),
        source="NVIDIA GB200 NVL72 datasheet (72 GPUs: 360 PF BF16, 720 PF FP8, 1,440 PF FP4 sparse; "
        "13.4 TB HBM3e at 576 TB/s; 130 TB/s NVLink), per GPU and dense: 2.5 PF BF16, 5 PF FP8/MXFP8, "
        "10 PF NVFP4, 186 GB at 8 TB/s, NVLink5 1.8 TB/s bidirectional; 148 SMs",
        num_sms=148,
        gemm_efficiency=_GB200_GEMM,
        host_overhead=GRACE_HOST_OVERHEAD,
        host_link_Bps=HOST_LINK["c2c_shared"],
        **_BLACKWELL,
    ),
    "GB300": GPUSpec(
        name="GB300",
        peak_flops={"bf16": 2500 * TERA, "fp16": 2500 * TERA, "fp8": 5000 * TERA, "mxfp8": 5000 * TERA,
                    "nvfp4": 15000 * TERA, "tf32": 1250 * TERA},
        hbm_bandwidth_Bps=GBps(8000),
        hbm_capacity_bytes=288 * GiB,
        nvlink_bandwidth_Bps=GBps(900),
        source="NVIDIA GB300 NVL72 datasheet (72 GPUs: 360 PF FP8 and 1,080 PF FP4 dense, 20 TB HBM3e at "
        "576 TB/s, 130 TB/s NVLink), per GPU and dense: 2.5 PF BF16, 5 PF FP8/MXFP8, 15 PF NVFP4, "
        "288 GB HBM3e at 8 TB/s, NVLink5 1.8 TB/s bidirectional; Blackwell Ultra: 160 SMs",
        num_sms=160,
        gemm_efficiency=_B300_GEMM,
        sfu_ex2_per_clk_sm=_BLACKWELL_ULTRA_EX2,
        host_overhead=GRACE_HOST_OVERHEAD,
        host_link_Bps=HOST_LINK["c2c_shared"],
        **_BLACKWELL,
    ),
    "H20": GPUSpec(
        name="H20",
        peak_flops={"bf16": 148 * TERA, "fp16": 148 * TERA, "fp8": 296 * TERA, "tf32": 74 * TERA},
        hbm_bandwidth_Bps=GBps(4000),
        hbm_capacity_bytes=96 * GiB,
        nvlink_bandwidth_Bps=GBps(450),
        source="NVIDIA H20 product brief (HGX H20): 148 TF BF16 / 296 TF FP8 dense, 96 GB HBM3 at "
        "4.0 TB/s, NVLink4 900 GB/s bidirectional, 400 W TDP; 78 SMs",
        num_sms=78,
        **{**_HOPPER, "tdp_w": 400.0, "gemm_efficiency": _H20_GEMM, "mma16_per_clk_sm": H20_MMA16_PER_CLK_SM},
    ),
}
# NVIDIA's export-compliant A100 for China: the A100 SXM4 80GB with less NVLink, nothing else changed.
GPU_CATALOG["A800-SXM4-80GB"] = replace(
    GPU_CATALOG["A100-SXM4-80GB"], name="A800-SXM4-80GB", nvlink_bandwidth_Bps=GBps(200),
    source="NVIDIA statement of 2022-11-07 (Reuters, 2022-11-08): the A100 SXM4 80GB (GA100, same compute, "
    "HBM2e and 400 W SXM TDP) with NVLink limited to 400 GB/s bidirectional instead of 600")

_ALIASES = {
    "a100": "A100-SXM4-80GB",
    "a100-80gb": "A100-SXM4-80GB",
    "a100-sxm4": "A100-SXM4-80GB",
    "a100-40gb": "A100-SXM4-40GB",
    "h100": "H100-SXM5-80GB",
    "h100-sxm": "H100-SXM5-80GB",
    "h100-sxm5": "H100-SXM5-80GB",
    "h100-80gb": "H100-SXM5-80GB",
    "h100-96gb": "H100-SXM5-96GB",
    "h100-sxm5-96gb": "H100-SXM5-96GB",
    "a800": "A800-SXM4-80GB",
    "a800-80gb": "A800-SXM4-80GB",
    "a800-sxm4": "A800-SXM4-80GB",
    "h800": "H800-80GB",
    "h800-sxm5-80gb": "H800-80GB",
    "h200": "H200-SXM-141GB",
    "h200-141gb": "H200-SXM-141GB",
    "b200": "B200-SXM-180GB",
    "b200-180gb": "B200-SXM-180GB",
    "b200-sxm": "B200-SXM-180GB",
    "dgx-b200": "B200-SXM-180GB",
    "hgx-b200": "B200-SXM-180GB",
    "b300-sxm": "B300",
    "b300-288gb": "B300",
    "hgx-b300": "B300",
    "dgx-b300": "B300",
    "gb200-nvl72": "GB200",
    "gb200-186gb": "GB200",
    "gb300-nvl72": "GB300",
    "gb300-288gb": "GB300",
    "h20-96gb": "H20",
    "gh200": "GH200-96GB",
    "gh200-96gb": "GH200-96GB",
    "gh200-480gb": "GH200-96GB",
    "gh200-144gb": "GH200-144GB",
    "gh200-624gb": "GH200-144GB",
}
_LOOKUP = {**{k.lower(): k for k in GPU_CATALOG}, **_ALIASES}


_FAMILIES = (("a100", "40gb", "A100-SXM4-40GB"), ("a100", "", "A100-SXM4-80GB"), ("a800", "80gb", "A800-SXM4-80GB"), ("h100", "96gb", "H100-SXM5-96GB"),
             ("h100", "", "H100-SXM5-80GB"),
             ("h800", "", "H800-80GB"), ("h200", "", "H200-SXM-141GB"), ("b200", "", "B200-SXM-180GB"))
# Grace-Blackwell superchips first: "gb200" contains "b200", and their rack name contains "nvl".
_SUPERCHIPS = (("gb300", "GB300"), ("gb200", "GB200"), ("b300", "B300"))


def _lookup(name: str) -> str | None:
    """Catalog key for a GPU name as people write it: exact, alias, or family (``NVIDIA A100 80GB
    SXM`` is the A100-SXM4-80GB); PCIe and NVL parts have other clocks and links, so no family match."""
    text = str(name).strip().lower()
    if text in _LOOKUP:
        return _LOOKUP[text]
    text = re.sub(r"[\s_]+", "-", text.replace("nvidia", "")).strip("-")
    if text in _LOOKUP:
        return _LOOKUP[text]
    if "gh200" in text and "pcie" not in text:  # before the families: "gh200" contains "h200"
        return "GH200-144GB" if "144" in text or "hbm3e" in text else "GH200-96GB"
    for family, catalog_key in _SUPERCHIPS:
        if family in text and "pcie" not in text:
            return catalog_key
    if "pcie" in text or "nvl" in text or "94gb" in text or "gh200" in text:
        return None
    for family, detail, catalog_key in _FAMILIES:
        if family in text and detail in text:
            return catalog_key
    return None


def lookup_name(name: str) -> str | None:
    """The catalog GPU a name as people or tools write it stands for (``NVIDIA H100 80GB HBM3`` is
    the H100-SXM5-80GB), None when it is none of them."""
    return _lookup(name)


@dataclass(frozen=True)
class GPUFile:
    """A GPU the catalog does not hold, described by its datasheet (``cluster.gpu`` inline or as a
    YAML file). The measured efficiencies the compute model needs (best GEMM fraction of peak per
    precision, sustained fraction under load, HBM and NVLink efficiencies, launch gap, host speed)
    are borrowed from ``like``, a catalog GPU of the same kind: say which one; a new GPU's own
    efficiencies are only known once measured (docs/extending.md)."""

    name: str = key(kind=Text(), help="the GPU's name in reports")
    peak_tflops: tuple = key(kind=PerName(PRECISIONS, 0, ("bf16",), limits.GPU_PEAK_TFLOPS),
                             help="dense peak per precision (no 2:4 sparsity); bf16 required", unit="TFLOP/s")
    hbm_gib: float = key(kind=Number(0, False, limits.GPU_MEMORY_GIB, required="must be a number > 0"),
                         help="HBM capacity", unit="GiB")
    hbm_bandwidth_GBps: float = key(kind=Number(0, False, required="must be a number > 0"), help="HBM bandwidth",
                                    unit="GB/s")
    nvlink_bandwidth_GBps: float = key(kind=Number(0, False, limits.NVLINK_GBPS, required="must be a number > 0"),
                                       help="NVLink (or other scale-up link) rate per GPU", unit="GB/s per direction")
    like: str = key("H100-SXM5-80GB", Text(), help="the catalog GPU whose measured efficiencies this one borrows")
    nvlink_generation: int | None = key(None, Choice((3, 4, 5), optional=True),
                                        help="NVLink generation (4+: NVLink SHARP in the switch); null: like's")
    num_sms: int | None = key(None, Whole(1, limits.Limit(4096, "SMs per GPU"), optional=True),
                              help="streaming multiprocessors (wave quantization of GEMMs); null: like's")
    tdp_W: float | None = key(None, Number(0, False, limits.GPU_POWER_W), help="board power (TDP); null: like's", unit="W")
    host_link_GBps: float | None = key(None, Number(0, False, limits.HOST_LINK_GBPS),
                                       help="link to host memory per direction; null: like's", unit="GB/s")
    source: str | None = key(None, Text(optional=True), help="where the figures come from")

    def __str__(self) -> str:
        return self.name

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        out["peak_tflops"] = dict(self.peak_tflops)
        return out


def read_gpu_file(value: object, base: Path | None = None, field: str = "cluster.gpu") -> GPUFile:
    """A ``GPUFile`` from a mapping or from the path of a YAML file (relative to ``base``)."""
    if isinstance(value, str):
        path = Path(value)
        if not path.is_absolute() and base is not None:
            path = base / path
        value = load_yaml_file(path, field)
        if not isinstance(value, dict):
            raise ConfigError(field, str(path), "must be a YAML mapping of GPU fields (docs/extending.md)")
    if not isinstance(value, dict):
        raise ConfigError(field, value, "must be a catalog GPU name, a GPU YAML file or a mapping of GPU fields")
    gpu = check_section(field, value, GPUFile)
    if _lookup(gpu.like) is None:
        raise ConfigError(f"{field}.like", gpu.like, f"must be a catalog GPU; valid: {', '.join(sorted(GPU_CATALOG))}")
    return gpu


@functools.lru_cache(maxsize=64)
def _from_file(f: GPUFile) -> GPUSpec:
    """The GPUSpec of a described GPU: its datasheet figures, ``like``'s measured efficiencies."""
    base = get_gpu(f.like)
    peaks = {k: v * TERA for k, v in f.peak_tflops}
    if "fp16" not in peaks:
        peaks["fp16"] = peaks["bf16"]
    changes = dict(name=f.name, peak_flops=peaks, hbm_bandwidth_Bps=GBps(f.hbm_bandwidth_GBps),
                   hbm_capacity_bytes=f.hbm_gib * GiB, nvlink_bandwidth_Bps=GBps(f.nvlink_bandwidth_GBps),
                   source=f.source or f"described in the scenario; efficiencies of {base.name}", power_limit_w=None)
    for name, value in (("nvlink_generation", f.nvlink_generation), ("num_sms", f.num_sms), ("tdp_w", f.tdp_W),
                        ("host_link_Bps", GBps(f.host_link_GBps) if f.host_link_GBps else None)):
        if value is not None:
            changes[name] = value
    return replace(base, **changes)


def get_gpu(name: str | GPUFile) -> GPUSpec:
    """The catalog entry for ``name`` or one of its aliases, case-insensitively; a described GPU
    (``GPUFile``) with the efficiencies of the catalog GPU it names as ``like``."""
    if isinstance(name, GPUFile):
        return _from_file(name)
    key = _lookup(name)
    if key is None:
        valid = sorted(set(GPU_CATALOG) | set(_ALIASES))
        raise ConfigError("cluster.gpu", name, f"valid: {', '.join(valid)}")
    return GPU_CATALOG[key]


def peak(gpu: GPUSpec, precision: str) -> float:
    """Dense peak FLOP/s of ``gpu`` at ``precision``; ConfigError if the GPU lacks it (A100 FP8)."""
    if precision not in gpu.peak_flops:
        raise ConfigError(
            "training.precision", precision, f"{gpu.name} supports: {', '.join(sorted(gpu.peak_flops))}"
        )
    return gpu.peak_flops[precision]


def gemm_ceiling(gpu: GPUSpec, precision: str) -> float:
    """Largest dense-GEMM fraction of peak at ``precision`` sustained in training (MAMF / peak x sustained)."""
    peak(gpu, precision)
    return gpu.gemm_efficiency.get(precision, gpu.gemm_efficiency.get("bf16", 0.8)) * gpu.sustained_fraction


def gpu_of(cluster, precision: str) -> GPUSpec:
    """The scenario's GPU: the catalog entry with the optional ``cluster.gpu_memory_gib`` and
    ``cluster.gpu_peak_tflops`` overrides (dense peak at the run's precision; the other
    precisions scale with it), for GPUs the catalog does not list and for what-ifs."""
    gpu = get_gpu(cluster.gpu)
    changes = {}
    if getattr(cluster, "gpu_memory_gib", None) is not None:
        changes["hbm_capacity_bytes"] = cluster.gpu_memory_gib * 2**30
    if getattr(cluster, "gpu_peak_tflops", None) is not None:
        scale = cluster.gpu_peak_tflops * TERA / peak(gpu, precision)
        changes["peak_flops"] = {k: v * scale for k, v in gpu.peak_flops.items()}
    # the power limit: ``cluster.gpu_power_limit_W`` or the part's default; the catalogue's
    # sustained fraction is the one at TDP (``power_factor``)
    limit = getattr(cluster, "gpu_power_limit_W", None) or gpu.power_limit_w
    if limit is not None:
        if gpu.tdp_w is None:
            raise ValueError(f"{gpu.name} has no catalogued TDP")
        changes["sustained_fraction"] = gpu.sustained_fraction * power_factor(limit, gpu.tdp_w)
        changes["power_limit_w"] = float(limit) if limit < gpu.tdp_w else None
    return replace(gpu, **changes) if changes else gpu
