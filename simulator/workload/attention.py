"""Fused attention kernels as they run: efficiency by kernel, direction, masking, head dim and length.

A fused attention kernel's throughput is not one number. It depends on which kernel runs
(FlashAttention-2, FlashAttention-3, cuDNN's fused SDPA), on the direction (the backward runs
five matmuls with more synchronisation than the forward's two), on causal masking (the blocks on
the diagonal do half their work, and short sequences have few blocks), on the head dimension, and
on the key length each query tile streams over. The measured curves below are those of Shah et
al. 2024, "FlashAttention-3" (arXiv 2407.08608), Figures 5 and 6: H100 80GB SXM5, BF16, batch x
sequence = 16k tokens and 16 x 128 (or 32 x 64) of head width, so every kernel has thousands of
CTAs and occupancy is not what limits it. TFLOP/s there count 4 s^2 d h per forward (halved
for causal) and 2.5x that for the backward, the convention of ``simulator.workload.compute``.

What runs where (each framework's default; a scenario picks another with ``training.attention``):
- ``fa2``: FlashAttention-2 (Dao 2023) as the ``flash_attn`` package of llm-foundry / Composer
  and Megatron-DeepSpeed ships it (PyTorch's SDPA vendors the same kernels: ``sdpa`` below). Written for Ampere: on H100 it uses no wgmma/TMA and reaches about 35% of
  peak (FlashAttention-3 abstract).
- ``sdpa``: PyTorch's ``scaled_dot_product_attention`` flash backend, the FlashAttention-2 kernels
  vendored into ATen (aten/src/ATen/native/transformers/cuda/flash_attn), which torchtitan calls.
  Measured apart from the flash_attn package: pytorch/benchmark#2296 (tritonbench
  ``flash_attention`` op, 2024-06, Meta H100, BF16, batch 128 x 8 heads of 128, non-causal
  forward) ran SDPA at 287, 293, 298, 288, 304 TFLOP/s at 1k, 2k, 4k, 8k, 16k: 0.78-0.82 of the
  FA2 curve below at the same lengths, flat where FA2 still climbs. The GPU was one of Meta's
  H100 hosts (tritonbench#141 traced other low numbers of that series to its "devgpu H100"
  against a GCP H100), whose default power limit is 500 W (torchtitan's Grand Teton benchmark
  file), so the measured ratio is divided by what that limit costs any compute-bound kernel
  (``hardware.power_factor(500, 700)``, 0.894): the curve is FA2's times the remaining ratio at
  the key length (``SDPA_FA2_RATIO``, 0.87-0.92; below 1k the 1k ratio), and a scenario on a
  power-limited part pays the limit through its sustained fraction, like every GEMM. The source
  measured the non-causal forward only, so causal and backward take the same ratio (same kernel
  templates). As ``power_factor`` says, the cube law errs fast for attention, so part of the
  remaining ratio may still be the hosts' power limit: on a 700 W H100 ``sdpa`` errs slow.
- ``fa3``: FlashAttention-3, Hopper only (wgmma, TMA, warp specialisation).
- ``flex``: PyTorch's FlexAttention (``torch.nn.attention.flex_attention``, a Triton kernel that
  torch.compile generates from the score/mask modification; NeMo AutoModel's ``attn: flex``
  backend, which it needs for GPT-OSS's attention sinks and sliding windows). Measured by its
  authors (D. Guessous, Meta, "FlexAttention: The Flexibility of PyTorch With the Performance of
  FlashAttention", GTC 2025 session abstract, PyTorch blog "PyTorch at GTC 2025"): on H100 the
  forward averages 85% and the backward 76% of FlashAttention-3; on A100 90% and 85% of
  FlashAttention-2 (also the PyTorch blog "FlexAttention", 2024-08-07). So ``flex`` is the FA3
  curve times ``FLEX_FA3_RATIO`` on Hopper and newer, the FA2 curve times ``FLEX_FA2_RATIO`` on
  Ampere, at every length and mask (the sources give averages only); a sliding window is a
  block mask, so it is priced like the fused kernels' windowed call.
- ``cudnn``: cuDNN's fused flash attention, which Transformer Engine prefers on Hopper and newer
  (TE ``get_attention_backend`` disables FlashAttention in favour of FusedAttention on sm90+ "for
  performance reasons"), so Megatron-core, NeMo and MaxText's ``cudnn_flash_te`` run it. The
  FlashAttention-3 paper measured cuDNN 9.1 at 86-100% of FA3 on these shapes; cuDNN releases
  since have closed the gap, and stepsim's Megatron-core calibration (hardware.py) was fitted
  with the FA3 curve, so ``cudnn`` uses the FA3 curve and says so rather than mixing a 2024 cuDNN
  version into a 2025 recipe.
- ``cudnn91``: cuDNN's fused attention of early 2024 as it was measured: the cuDNN bars of the
  same FlashAttention-3 figures (cuDNN 9.1 beside FA3 on the same H100 and shapes; every mask,
  head dim and direction the figures give is in ``_H100_TFLOPS[("cudnn91", ...)]``; the forward
  figure is also the repository's assets/flash3_fp16_fwd.png). Up to 2k keys it is within 14% of
  FA3 either way, from 8k on 7-18% below it (head dim 128 at 16k: forward
  595 against 648 TFLOP/s, causal 539 against 616, backward 516 against 561; head dim 64 17-18%
  below in the forward). Its non-causal forward falls past 2k keys, so holding the 16k value
  beyond 16k (below) errs fast. It is the kernel Transformer Engine 1.3-1.5 (Feb-Apr 2024, the
  NeMo 24.0x containers) ran on Hopper: they already chose FusedAttention over flash-attn on
  sm90 whenever cuDNN's arbitrary-seqlen backend took the shape, context parallelism included
  (transformer_engine/pytorch/attention.py at v1.4, 0fbc76af3: "Select FusedAttention on sm90
  ... for performance"), with the cuDNN 9 of those months, of which 9.1 is the release measured.
  A scenario (or a published run's ``framework_options.attention``) names it for a run of that
  era; ``cudnn`` stays the current kernel. On Ampere it is FA2 like every TE kernel, on
  Blackwell (which no 2024 cuDNN ran) ``cudnn``.
- ``triton``: llm-foundry's FlashAttention in Triton (``attn_config.attn_impl: triton``,
  llmfoundry/models/layers/flash_attn_triton.py), a copy of the flash-attention repository's
  flash_attn/flash_attn_triton.py of late 2022, built on triton-pre-mlir. The FlashAttention-2 paper
  measured "FlashAttention in Triton" beside FA2 (Dao 2023, Sec. 4.1 and Fig. 4, A100, lengths 512
  to 16k, head dims 64 and 128, with and without the causal mask): FA2 is "around 1.3-1.5x faster
  than FlashAttention in Triton in the forward pass and around 2x faster in the backward pass". So
  the curve is FA2's times ``TRITON_FA2_RATIO``: 1 / 1.4 forward (the middle of the range; the text
  gives no length dependence) and 1 / 2 backward, on every GPU (Ampere-style code without
  wgmma/TMA, like FA2 on Hopper; no published Hopper measurement of it was found). Beyond 16k the
  ratio is held, as the curves are.
- ``fa1``: FlashAttention (v1), the flash_attn 0.x/1.x CUDA kernels of 2022 to mid-2023. The
  FlashAttention-2 paper (Dao 2023, arXiv 2307.08691, Sec. 1 and 4.1, A100) measured it at 25-40%
  of peak forward and 25-35% backward, with FlashAttention-2 "around 2x faster" at 50-73%
  forward: the curve is FA2's times ``FA1_FA2_RATIO``, one half in both directions, on every GPU
  (its Ampere code runs unchanged on Hopper, like FA2's).
- ``flash``: the framework's default fused kernel: ``cudnn`` on Hopper and Blackwell (FA3 does not
  run on Blackwell; cuDNN and FlashAttention-4 do, at a similar fraction of the new peak), ``fa2``
  on Ampere.
On Ampere every fused kernel but ``flex``, ``triton`` and ``fa1`` is FlashAttention-2 (FA3 needs Hopper; TE on sm80 uses FA2), whose
A100 curve (FlashAttention-2 paper, Fig. 5: up to 73% of peak forward, 63% backward) is given by
``A100_*`` below in the same form.

Beyond 16k the measured curves are flat (both kernels plateau by 8k: the key loop is long enough
to hide its prologue), so longer keys take the 16k value. Head dims between 64 and 128
interpolate; above 128 take the 128 curve (the 256 curves are higher, so this errs slow); below
64 the 64 curve. The causal backward is the non-causal backward times the forward's causal /
non-causal ratio at the same length (the paper measured the backward without a mask only; the
diagonal blocks cost the backward the same share).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from simulator.parts.gpus import power_factor

H100_PEAK_TFLOPS = 989.0
SEQ_POINTS = (512, 1024, 2048, 4096, 8192, 16384)

# llm-foundry's Triton FlashAttention over FlashAttention-2, by direction (module docstring,
# ``triton``): FA2 is 1.3-1.5x faster forward and about 2x backward (Dao 2023, Sec. 4.1).
TRITON_FA2_RATIO = {"fwd": 1 / 1.4, "bwd": 1 / 2}
# FlashAttention (v1) over FlashAttention-2 (module docstring, ``fa1``): FA2 "around 2x faster" (Dao 2023, Sec. 4.1)
FA1_FA2_RATIO = {"fwd": 1 / 2, "bwd": 1 / 2}
# Kernels priced as FA2's curve times a ratio, by direction, on every architecture
FA2_RATIOS = {"triton": TRITON_FA2_RATIO, "fa1": FA1_FA2_RATIO}

# PyTorch SDPA flash backend / flash_attn FA2, non-causal forward, head dim 128, at SEQ_POINTS:
# pytorch/benchmark#2296 (287.457, 293.208, 298.428, 287.696, 304.199 TFLOP/s at 1k..16k) over the
# FA2 curve of _H100_TFLOPS (350, 362, 368, 370, 370); 512 takes the 1k ratio (not measured).
SDPA_TFLOPS = (287.457, 293.208, 298.428, 287.696, 304.199)  # at SEQ_POINTS[1:]
SDPA_HOST_POWER = power_factor(500.0, 700.0)  # the measuring host's 500 W limit (docstring)
SDPA_FA2_RATIO = tuple(r / SDPA_HOST_POWER for r in
                       (SDPA_TFLOPS[0] / 350, *(m / f for m, f in zip(SDPA_TFLOPS, (350, 362, 368, 370, 370)))))

# FlexAttention over the hand-written kernels, by direction (module docstring): H100 vs FA3, A100 vs FA2.
FLEX_FA3_RATIO = {"fwd": 0.85, "bwd": 0.76}
FLEX_FA2_RATIO = {"fwd": 0.90, "bwd": 0.85}
# On Ampere, the kernels that are not FA2 itself, as shares of FA2's curve (``peak_fraction``)
AMPERE_FA2_RATIOS = {"flex": FLEX_FA2_RATIO, **FA2_RATIOS}

# FlashAttention-3 paper, Fig. 5 (forward) and Fig. 6 (backward), H100 SXM5 BF16, TFLOP/s at
# SEQ_POINTS. Keys: (kernel, direction, causal, head_dim). Fig. 5c at 512 (Dao-AILab/flash-attention
# assets/flash3_fp16_fwd.png): FA3 467, cuDNN 497 beside it.
_H100_TFLOPS: dict[tuple[str, str, bool, int], tuple[float, ...]] = {
    ("fa2", "fwd", False, 128): (309, 350, 362, 368, 370, 370),
    ("fa2", "fwd", True, 128): (191, 260, 298, 319, 333, 335),
    ("fa2", "bwd", False, 128): (214, 260, 291, 310, 318, 322),
    ("fa2", "fwd", False, 64): (282, 306, 318, 321, 322, 324),
    ("fa2", "fwd", True, 64): (180, 229, 262, 284, 295, 299),
    ("fa2", "bwd", False, 64): (198, 238, 264, 276, 284, 289),
    ("fa3", "fwd", False, 128): (467, 565, 625, 638, 646, 648),
    ("fa3", "fwd", True, 128): (292, 423, 521, 579, 602, 616),
    ("fa3", "bwd", False, 128): (316, 424, 501, 542, 559, 561),
    ("fa3", "fwd", False, 64): (333, 392, 460, 476, 496, 497),
    ("fa3", "fwd", True, 64): (197, 265, 371, 420, 460, 473),
    ("fa3", "bwd", False, 64): (272, 363, 422, 452, 471, 475),
    # cuDNN 9.1, the cuDNN bars of the same figures (see ``cudnn91`` in the module docstring)
    ("cudnn91", "fwd", False, 128): (497, 574, 617, 609, 600, 595),
    ("cudnn91", "fwd", True, 128): (315, 410, 484, 518, 529, 539),
    ("cudnn91", "bwd", False, 128): (305, 408, 465, 499, 518, 516),
    ("cudnn91", "fwd", False, 64): (335, 373, 395, 408, 412, 413),
    ("cudnn91", "fwd", True, 64): (225, 288, 334, 363, 379, 388),
    ("cudnn91", "bwd", False, 64): (266, 348, 395, 417, 432, 433),
}

# A100 (FlashAttention-2 paper, Dao 2023, Sec. 4.1 and Fig. 5): forward up to 73% of the 312
# TFLOP/s peak, backward up to 63%; the curve's rise with length is that of the H100 FA2 curve
# (same kernel design), scaled to these plateaus. The forward plateau used is 0.70, as before.
A100_FWD_PLATEAU = 0.70
A100_BWD_PLATEAU = 0.70 * 63 / 73


@dataclass(frozen=True)
class AttentionKernel:
    """One fused attention call on one GPU, after sharding."""

    backend: str        # fa2 | fa3 | cudnn
    direction: str      # fwd | bwd
    causal: bool
    head_dim: int
    kv_len: float       # keys each query tile streams over


def architecture(gpu_name: str) -> str:
    """``ampere``, ``hopper`` or ``blackwell`` from a catalog name (A100, H100/H800/H200/H20, B200/GB200...)."""
    name = gpu_name.upper()
    if name.startswith("A100") or name.startswith("A800"):
        return "ampere"
    if name.startswith(("B", "GB")):
        return "blackwell"
    return "hopper"


def resolve_backend(attention: str, gpu_name: str, framework_default: str = "cudnn") -> str:
    """The kernel that runs for ``training.attention`` on this GPU (see the module docstring)."""
    arch = architecture(gpu_name)
    if arch == "ampere":
        return attention if attention in ("flex", "triton", "fa1") else "fa2"
    kernel = framework_default if attention == "flash" else attention
    if arch == "blackwell" and kernel in ("fa3", "cudnn91"):
        return "cudnn"
    return kernel


def _interp_log2(points: tuple[float, ...], values: tuple[float, ...], x: float) -> float:
    """Piecewise-linear in log2(x) between measured points; flat outside them."""
    if x <= points[0]:
        return values[0]
    if x >= points[-1]:
        return values[-1]
    i = bisect.bisect_right(points, x) - 1
    t = (math.log2(x) - math.log2(points[i])) / (math.log2(points[i + 1]) - math.log2(points[i]))
    return values[i] + t * (values[i + 1] - values[i])


def _curve(kernel: str, direction: str, causal: bool, head_dim: int, kv_len: float) -> float:
    """H100 TFLOP/s of ``kernel`` at one of the measured head dims (64 or 128)."""
    if direction == "fwd":
        return _interp_log2(SEQ_POINTS, _H100_TFLOPS[(kernel, "fwd", causal, head_dim)], kv_len)
    bwd = _interp_log2(SEQ_POINTS, _H100_TFLOPS[(kernel, "bwd", False, head_dim)], kv_len)
    if not causal:
        return bwd
    ratio = (_interp_log2(SEQ_POINTS, _H100_TFLOPS[(kernel, "fwd", True, head_dim)], kv_len)
             / _interp_log2(SEQ_POINTS, _H100_TFLOPS[(kernel, "fwd", False, head_dim)], kv_len))
    return bwd * ratio


def h100_tflops(k: AttentionKernel) -> float:
    """Measured-curve TFLOP/s of kernel ``k`` on an H100 (``cudnn`` uses the FA3 curve and
    ``cudnn91`` its own measured bars, see above)."""
    if k.backend == "sdpa":
        ratio = _interp_log2(SEQ_POINTS, SDPA_FA2_RATIO, k.kv_len)
        return ratio * h100_tflops(AttentionKernel("fa2", k.direction, k.causal, k.head_dim, k.kv_len))
    if k.backend in FA2_RATIOS:
        return FA2_RATIOS[k.backend][k.direction] * h100_tflops(AttentionKernel("fa2", k.direction, k.causal, k.head_dim,
                                                                           k.kv_len))
    if k.backend == "flex":
        return FLEX_FA3_RATIO[k.direction] * h100_tflops(AttentionKernel("fa3", k.direction, k.causal, k.head_dim,
                                                                         k.kv_len))
    kernel = "fa3" if k.backend == "cudnn" else k.backend
    d = min(max(k.head_dim, 64), 128)
    if d in (64, 128):
        return _curve(kernel, k.direction, k.causal, d, k.kv_len)
    t = (d - 64) / 64
    return (1 - t) * _curve(kernel, k.direction, k.causal, 64, k.kv_len) + t * _curve(kernel, k.direction, k.causal, 128, k.kv_len)


def peak_fraction(k: AttentionKernel, gpu_name: str) -> float:
    """Fraction of the GPU's 16-bit dense peak that attention kernel ``k`` reaches at full occupancy.

    Hopper and Blackwell: the H100 curve / 989 TFLOP/s. Ampere: FlashAttention-2's A100
    plateaus with the length dependence of its H100 curve (same kernel).
    """
    if architecture(gpu_name) == "ampere":
        shape = h100_tflops(AttentionKernel("fa2", k.direction, k.causal, k.head_dim, k.kv_len))
        top = h100_tflops(AttentionKernel("fa2", k.direction, False, k.head_dim, SEQ_POINTS[-1]))
        plateau = A100_FWD_PLATEAU if k.direction == "fwd" else A100_BWD_PLATEAU
        kernel = AMPERE_FA2_RATIOS.get(k.backend, {}).get(k.direction, 1.0)
        return kernel * plateau * shape / top
    return h100_tflops(k) / H100_PEAK_TFLOPS


# Softmax exponentials (FlashAttention-4, Zadouri et al. 2026, "feeds and speeds" of B200): per SM
# and clock the tensor cores do 8192 dense 16-bit FLOPs on Blackwell (4096 on Hopper: 989 TFLOP/s
# over 132 SMs at 1.83 GHz) and the special function units 16 exponentials (MUFU.EX2), so for one
# (query, key) pair of one head the forward's two matmuls (QK^T over the query/key width, PV over
# the value width) take 2 (d_qk + d_v) / 8192 clocks and its exponential 1 / 16: at head dim 128
# as long as the matmuls. FA4 and NVIDIA ("Making Softmax More Efficient with NVIDIA Blackwell
# Ultra") find the forward SFU-bound: the second matmul waits for the softmax of the first, so
# the exponentials add to the matmul time.
MMA16_PER_CLK_SM = {"hopper": 4096, "blackwell": 8192}
EX2_PER_CLK_SM = 16
FP8_MMA_SPEEDUP = 2  # FP8 tensor-core rate over 16-bit, per SM and clock (the datasheets' dense peaks)
FA_BWD_FLOP_RATIO = 2.5  # backward matmul FLOPs over the forward's (FlashAttention-2: five matmuls to two)


def clock_speedup(gpu_name: str, ex2_per_clk_sm: float, qk_dim: float, v_dim: float, fp8: bool = False,
                  mma16_per_clk_sm: float | None = None, backward: bool = False) -> float:
    """Attention speed relative to the measured 16-bit curve, as a factor on its fraction of the
    part's 16-bit peak: exponentials at ``ex2_per_clk_sm`` per SM clock (16 on every part up to
    Blackwell, the curves' own), the matmuls in FP8 when ``fp8`` (Transformer Engine's
    fp8_dot_product_attention, cuDNN), and tensor cores held below the architecture's rate
    (``mma16_per_clk_sm``, the H20's: ``gpus.H20_MMA16_PER_CLK_SM``).

    Time per pair is matmul plus exponential clocks, m + 1/16 with m = 2 (d_qk + d_v) / mma
    (module constants above), against m + 1/16 for the curve: 1.0 on Hopper and Blackwell in
    16-bit. Blackwell Ultra (B300, GB300: 32 per clock, hardware.py) halves the exponential part,
    (m + 1/16) / (m + 1/32): 4/3 at head dim 128, 1.29 for MLA's 192/128 heads. FP8 halves m:
    on Hopper 1.5x at head dim 128 (FlashAttention-3's FP8 forward ran about 1.5x its BF16 one,
    Shah et al. 2024), on GB300 2x. NVIDIA measured about 1.35x on the DeepSeek-V3 FP8 attention
    forward, GB300 over GB200 (same blog), where this gives 1.44. The backward recomputes the
    exponentials too but is bound by shared-memory traffic (FA4), so it keeps the 16-bit curve in
    either precision and at either SFU rate (no public FP8 backward measurement).
    Ampere: 1.0 (FlashAttention-2; no FP8).

    A part whose tensor cores run at ``mma16_per_clk_sm`` below the architecture's ``R`` spends
    m R / mma16 clocks in them per pair, the exponentials (and everything else outside them) as
    before, so its fraction of its own peak grows by (m + 1/16) / m x m' / (m' + 1/16), m' = m R /
    mma16: on the H20 (a quarter of the rate) 1.33x at head dim 128, within -1% to -14% of the
    FA2 / FA3 forward measurements on that part (``gpus.H20_MMA16_PER_CLK_SM``); the rest of a
    kernel's time outside the tensor cores does not shrink here, so this errs slow. The backward
    takes the same factor with its 2.5x matmul clocks per pair (FA_BWD_FLOP_RATIO: five matmuls
    to the forward's two) and its one exponential: shared-memory traffic, the backward's other
    bound, does not slow down with the tensor cores either (no backward measurement on the part).
    """
    arch = architecture(gpu_name)
    if arch not in MMA16_PER_CLK_SM:
        return 1.0
    full = MMA16_PER_CLK_SM[arch]
    part = mma16_per_clk_sm or full
    exp = 1.0 / EX2_PER_CLK_SM
    if part == full:  # the curve's own tensor-core rate
        if backward:
            return 1.0
        pair = 2.0 * (qk_dim + v_dim)
        return (pair / full + exp) / (pair / (full * (FP8_MMA_SPEEDUP if fp8 else 1)) + 1.0 / ex2_per_clk_sm)
    if backward:
        m, held = FA_BWD_FLOP_RATIO * 2.0 * (qk_dim + v_dim) / full, FA_BWD_FLOP_RATIO * 2.0 * (qk_dim + v_dim) / part
        return (m + exp) / m * held / (held + exp)
    pair = 2.0 * (qk_dim + v_dim)
    m = pair / full
    held = pair / part  # the part's own tensor-core clocks per pair in 16-bit
    this = held / (FP8_MMA_SPEEDUP if fp8 else 1) + 1.0 / ex2_per_clk_sm
    return (m + exp) / m * held / this


# The measured curves ran 16k tokens x 16 heads of 128: 2048 query tiles of 128 rows, many waves
# over 132 SMs. A call with fewer tiles (few local heads, short sequences) also loses occupancy.
REFERENCE_CTAS = 16384 // 128 * 16


def cp_attention_calls(seq_len: float, cp: int) -> list[tuple[float, float, bool]]:
    """(query length, key length, causal) of the attention calls one rank makes for one
    micro-batch under context parallelism, load-balanced for causal masking (Megatron-core /
    Transformer Engine ``AttnFuncWithCPAndKVP2P``): the sequence is cut into 2 x cp chunks and
    rank r holds chunks r and 2cp-1-r. Ring step 0 is causal attention of the local 2 chunks on
    themselves; each of the cp - 1 later steps is one non-causal call of half a step's work:
    either both local query chunks on the first chunk of the arriving keys, or the second query
    chunk on both arriving key chunks. FLOPs add up to s^2 / (2 cp) per rank, as without CP.
    Ranks differ only in how many later steps are of each kind (rank r: r of the first, cp-1-r
    of the second); the calls returned are those of the mean rank, the first kind for the first
    (cp - 1) // 2 steps.
    """
    local = seq_len / cp
    if cp == 1:
        return [(seq_len, seq_len, True)]
    later = cp - 1
    first = later // 2
    return [(local, local, True)] + [(local, local / 2, False)] * first + [(local / 2, local, False)] * (later - first)
