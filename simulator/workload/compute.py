"""Compute cost of one transformer layer on one GPU: a roofline per kernel, pure functions.

Each kernel (``Op``) takes ``max(flops / (peak * eff), bytes / (hbm_bw * mem_eff)) + launch``
(Williams, Waterman and Patterson 2009, "Roofline"), where ``eff`` depends on the GEMM shape
(``gemm_efficiency``) and the per-GPU constants live in ``simulator.parts.gpus``.

Conventions:
- ``Op.flops`` counts matrix-multiply FLOPs only (GEMMs and the attention matmuls actually
  executed, causal half included); elementwise kernels count 0 FLOPs and are priced by bytes.
- Sharding per GPU: ``T = micro_batch_size * seq_length / cp`` tokens. GEMMs are split by tp
  (Megatron column/row parallel, Shoeybi et al. 2019). Norms and residual adds are replicated
  across TP, or divided by tp with sequence parallelism (Korthikanti et al. 2022).
- Activations are 16-bit; with ``precision="fp8"`` GEMMs use the FP8 peak and 1-byte operands
  (Transformer Engine), ``mxfp8`` / ``nvfp4`` the block-scaled peaks and operand sizes
  (``GEMM_OPERAND_BYTES``); elementwise kernels stay 16-bit, attention too unless
  ``training.fp8_attention`` (its forward's matmuls at the FP8 rate, ``_attn_core``). Low-precision GEMMs
  also pay the kernels that quantize their operands (``QUANTIZED_PRECISIONS``, ``quantize_bytes``).
  The MoE router and, unless the profile says otherwise, the LM head stay 16-bit
  (``SIXTEEN_BIT_GEMMS``, ``head_cost``).
- Backward: a GEMM Y = X W becomes dgrad dX = dY W^T and wgrad dW = X^T dY, each with the
  forward's FLOPs; flash-attention backward is 2.5x its forward FLOPs (5 matmuls vs 2,
  FlashAttention-2, Dao 2023) at 63/73 of the forward's efficiency; memory-bound kernels move 2x
  their forward bytes.
- No dropout kernels: current recipes (Llama, NeMo GPT) train with dropout 0.
"""

from __future__ import annotations

import functools
import math

from simulator.scenario.config import (ATTENTION_BACKENDS, DOCUMENT_MASKED_BACKENDS, QUANTIZED_PRECISIONS, RECOMPUTE,
                                       ModelConfig, MoEConfig, ParallelConfig, TrainingConfig)
from simulator.common.errors import ConfigError
from simulator.parts.gpus import GPUSpec, gemm_ceiling, peak
from simulator.workload import attention
from simulator.workload.kernels import ACT_BYTES, AttnCore, BlockCost, Gemm, Latency, LayerCost, Mem, Op, Step
from simulator.workload.mla import attention_params, mla_gemms, mla_norm_width, window_fraction
from simulator.workload.moe import moe_steps, price_host_sync, recompute_glu_sync, with_glu_sync

TILE_M, TILE_N = 128, 256
K_HALF = 64
FA_BWD_FLOP_RATIO = attention.FA_BWD_FLOP_RATIO


def _occupancy(ctas: float, num_sms: int) -> float:
    """Busy fraction of the SMs over a kernel's waves, smoothed wave quantization.

    With x = CTAs / SMs, one partial wave gives x (x <= 1); beyond that the last wave is on
    average half full, x / (x + 0.5) (NVIDIA "Matrix Multiplication Background" guide, Sec. 3.2).
    The two branches meet at x = 0.5, so the function is continuous and increasing.
    """
    x = ctas / num_sms
    return min(x, x / (x + 0.5))


# Split-K: the shortest slice of the reduction dimension a split-K CTA takes, four of the 64-deep
# k-steps each tile's pipeline charges (``K_HALF``), so that a split still amortises its fill.
SPLIT_K_MIN = 4 * K_HALF
SPLIT_K_PARTIAL_BYTES = 8  # an fp32 partial sum written by its split and read by the reduction


def gemm_efficiency(
    m: float, n: float, k: float, gpu: GPUSpec, precision: str, groups: int = 1
) -> float:
    """Achieved fraction of peak for ``groups`` GEMMs (m x k) @ (k x n) run as one (grouped) kernel."""
    return gemm_plan(m, n, k, gpu, precision, groups)[0]


def gemm_plan(m: float, n: float, k: float, gpu: GPUSpec, precision: str, groups: int = 1) -> tuple[float, int]:
    """(achieved fraction of peak, split-K factor) of ``groups`` GEMMs (m x k) @ (k x n) run as one
    (grouped) kernel.

    eff = MAMF * tile_fill * occupancy * k_s / (k_s + K_HALF), maximised over 128x256 and 256x128
    output tiles (the cuBLAS large tiles, NVIDIA "Matrix Multiplication Background" Sec. 2.3):
    tile_fill is the useful fraction of padded tiles (tile quantization, Sec. 3.1), occupancy
    the smoothed wave quantization over the SMs (Sec. 3.2), and k_s / (k_s + 64) charges each
    CTA one 64-deep K step for filling its pipeline and writing back its output.

    A single GEMM whose output tiles leave SMs idle but whose reduction is long (a weight gradient,
    whose k is the tokens of a micro-batch) is split along k over ``s`` CTAs per tile, each
    reducing k_s = k / s, whose fp32 partial sums are then added (split-K: CUTLASS's split-K
    GEMMs and cuBLAS's split-K heuristics; Osama et al., "Stream-K", PPoPP 2023, Sec. 2: the
    data-parallel tiling of a GEMM with fewer output tiles than SMs leaves the rest idle):
    s = min(ceil(SMs / tiles), k // SPLIT_K_MIN), so the CTAs fill at least one wave. Grouped kernels
    (MoE experts) are not split.
    """
    ceiling = gemm_ceiling(gpu, precision)
    best, best_split = 0.0, 1
    for tm, tn in ((TILE_M, TILE_N), (TILE_N, TILE_M)):
        mt, nt = math.ceil(m / tm), math.ceil(n / tn)
        fill = (m / (mt * tm)) * (n / (nt * tn))
        tiles = groups * mt * nt
        split = max(1, min(-(-gpu.num_sms // tiles), int(k // SPLIT_K_MIN))) if groups == 1 and tiles < gpu.num_sms else 1
        ks = k / split
        eff = fill * _occupancy(tiles * split, gpu.num_sms) * ks / (ks + K_HALF)
        if eff > best:
            best, best_split = eff, split
    return ceiling * best, best_split


def _roofline(flops: float, nbytes: float, gpu: GPUSpec, flop_rate: float) -> float:
    compute = flops / flop_rate if flops else 0.0
    memory = nbytes / (gpu.hbm_bandwidth_Bps * gpu.memory_efficiency)
    return max(compute, memory) + gpu.launch_overhead_s


# Bytes per GEMM operand element read from HBM: FP8 1; MXFP8 1 plus one E8M0 scale per 32 elements;
# NVFP4 half a byte plus one E4M3 scale per 16 (OCP Microscaling spec v1.0; NVIDIA NVFP4 format,
# Transformer Engine docs). Outputs stay 16-bit.
GEMM_OPERAND_BYTES = {"fp8": 1.0, "mxfp8": 1.0 + 1 / 32, "nvfp4": 0.5 + 1 / 16}


def gemm_op(
    name: str, m: float, n: float, k: float, gpu: GPUSpec, precision: str, groups: int = 1,
    streams: int | None = None, out_bytes: float = ACT_BYTES,
) -> Op:
    """``groups`` equal GEMMs: one grouped kernel over all their tiles (``streams`` None), or one
    kernel per GEMM issued round-robin onto ``streams`` concurrent streams (Transformer Engine's
    ``multi_stream_cublas_gemm``), so only min(streams, groups) GEMMs share the SMs at a time:
    the wave occupancy is that of min(streams, groups) GEMMs' tiles. The per-GEMM launches come
    from one C++ loop in a single host op, so the op counts as one host-issued kernel.
    ``out_bytes``: HBM bytes per output element (a 16-bit write; a weight gradient accumulated
    into an fp32 buffer reads and writes 4 + 4, ``gemm_bwd_ops``)."""
    in_bytes = GEMM_OPERAND_BYTES.get(precision, ACT_BYTES)
    flops = 2.0 * groups * m * n * k
    together = groups if streams is None else min(streams, groups)
    eff, split = gemm_plan(m, n, k, gpu, precision, together)
    # a split-K GEMM writes and reads back its fp32 partial sums once per split (SPLIT_K_PARTIAL_BYTES)
    partials = SPLIT_K_PARTIAL_BYTES * split * m * n if split > 1 else 0.0
    nbytes = groups * (in_bytes * (m * k + k * n) + out_bytes * m * n) + partials
    rate = peak(gpu, precision) * eff
    return Op(name, flops, nbytes, _roofline(flops, nbytes, gpu, rate), shape=(m, n, k, groups))


def gemm_bwd_ops(
    name: str, m: float, n: float, k: float, gpu: GPUSpec, precision: str, groups: int = 1,
    streams: int | None = None, wgrad_bytes: float = ACT_BYTES,
) -> tuple[Op, Op]:
    """dgrad (m x n)(n x k) and wgrad (k x m)(m x n) of the forward GEMM (m x k)(k x n).

    ``wgrad_bytes``: what the wgrad's k x n output moves per element (the framework profile's
    ``optimizer.wgrad_bytes_per_param``): 2 when it writes a fresh 16-bit gradient; 8 when it
    accumulates into an fp32 main_grad (Megatron-core's gradient_accumulation_fusion: read 4,
    write 4). The output is the size of the weight whatever the tokens m, so with few tokens
    (an MoE expert's share of a micro-batch) those bytes, not the FLOPs, set the wgrad's time:
    2 m FLOPs against 8 bytes per element is memory-bound below m of about a thousand on an H100."""
    return (
        gemm_op(f"{name}_dgrad", m, k, n, gpu, precision, groups, streams),
        gemm_op(f"{name}_wgrad", k, n, m, gpu, precision, groups, streams, wgrad_bytes),
    )


def mem_op(name: str, nbytes: float, gpu: GPUSpec) -> Op:
    return Op(name, 0.0, nbytes, _roofline(0.0, nbytes, gpu, 1.0))


def _sixteen_bit(precision: str) -> str:
    """The 16-bit type a run of ``precision`` computes in outside its low-precision GEMMs."""
    return "fp16" if precision == "fp16" else "bf16"


def _attn_core(
    model: ModelConfig, training: TrainingConfig, par: ParallelConfig, gpu: GPUSpec, backward: bool,
    window: int | None = None,
) -> list[Op]:
    """Fused causal attention on this GPU's heads (nq / tp) and queries (s / cp).

    Forward FLOPs 2 * b * q * k * heads * (qk + v) per call (QK^T over the query/key width qk,
    PV over the value width v: 192 and 128 under MLA, ``simulator.workload.mla``, both head_dim
    otherwise; halved on the causal diagonal; heads = nq / tp), over the calls ``attention.cp_attention_calls`` lists: one
    causal call without CP; with load-balanced causal CP one causal call on the local chunks and
    cp - 1 non-causal calls of half its size, s^2 / (2 cp) per rank in all. Each call runs at the
    measured efficiency of the kernel that runs (``attention.peak_fraction``: kernel, direction,
    causal mask, head dim, key length) times the GPU's sustained fraction, times the occupancy
    of its query tiles relative to the measured runs'. Backward: 2.5x the forward FLOPs
    (FlashAttention-2) at the measured backward efficiency. The forward's time per pair is matmul
    plus softmax-exponential clocks: Blackwell Ultra's doubled SFU rate and FP8 matmuls
    (``training.fp8_attention``) speed the forward up, and tensor cores held below their
    architecture's rate (the H20) raise both directions' share of the part's peak, by
    ``attention.clock_speedup`` (1 otherwise).

    Under CP every call after the first merges its partial output into the running one with the
    log-sum-exp correction (Transformer Engine keeps the running output in fp32: read the call's
    16-bit output and the fp32 accumulator, write the accumulator, 10 bytes per query element it
    touched), and the backward accumulates dQ and dK/dV the same way (2x): op ``attn_cp_merge``.
    Ops: ``attn_core`` (the local causal call; the only one without CP), ``attn_core_cp`` (the
    cp - 1 calls on arriving keys, which need the exchange), ``attn_cp_merge``; ``_bwd`` backward.
    Attention is compute-bound at these sizes; its HBM bytes are split 1/cp to the local call.
    A sliding-window layer (``window``) is one causal call computing ``mla.window_fraction`` of the
    causal pairs, with key length min(window, s / cp).

    Packed documents (``training.document_tokens`` d < s, attention masked to each document):
    a kernel that skips the masked pairs (``DOCUMENT_MASKED_BACKENDS``: FlashAttention's
    variable-length calls, cuDNN through Transformer Engine's THD format, FlexAttention's block
    mask) computes the s / d documents' causal pairs, s d / 2 of the s^2 / 2, with no query tile
    streaming more than d keys (Dao et al., FlashAttention-2, Sec. 3.1: a tile's work is its
    unmasked blocks; ``flash_attn_varlen_func`` treats each document as its own sequence). For
    documents of several lengths the pairs are sum(d^2) / 2 = s x (sum(d^2) / sum(d)) / 2, so d is
    that token-weighted mean. Under CP each call keeps the same share (Transformer Engine splits
    every document over the CP ranks in its THD format). SDPA, the Triton kernel and unfused
    attention take a dense mask and compute every pair. A window shorter than the documents sets
    the pairs; documents shorter than the window do.
    """
    b, s = training.micro_batch_size, training.seq_length
    tp, cp = par.tp, par.cp
    tokens = b * s / cp
    heads = model.num_attention_heads / tp
    kv_heads = max(model.num_key_value_heads, tp) / tp
    width = model.qk_head_dim + model.v_dim
    nbytes = ACT_BYTES * (tokens * heads * width + b * s * kv_heads * width) * (2.0 if backward else 1.0)
    backend = attention.resolve_backend(training.attention, gpu.name)
    direction = "bwd" if backward else "fwd"
    flop_rate_16 = peak(gpu, _sixteen_bit(training.precision)) * gpu.sustained_fraction
    reference = _occupancy(attention.REFERENCE_CTAS, gpu.num_sms)
    exp_speedup = attention.clock_speedup(gpu.name, gpu.sfu_ex2_per_clk_sm, model.qk_head_dim, model.v_dim,
                                          training.fp8_attention and not backward, gpu.mma16_per_clk_sm, backward)
    doc = training.document_tokens if backend in DOCUMENT_MASKED_BACKENDS else None
    if doc is not None and (doc >= s or (window and window < doc)):
        doc = None  # one document per sequence, or a window shorter than the documents sets the pairs
    if doc is not None:
        window = None  # documents shorter than the window set the pairs
    if window:
        seq = min(s / cp, window)
        shape = [(s / cp, seq, True)]
        scale = [window_fraction(s, window) * s / seq]  # the window's pairs over a causal square of seq keys
    else:
        shape = attention.cp_attention_calls(s, cp)
        scale = [1.0] * len(shape)
    keys = [kv_len for _, kv_len, _ in shape]  # keys a query tile streams, which the kernel's speed follows
    if doc is not None:
        # s / d documents of d tokens keep s d / 2 of the s^2 / 2 causal pairs; under CP each call
        # keeps that share (each document is split over the ranks as the sequence is) and no
        # query tile streams more than a document's keys
        scale = [k * doc / s for k in scale]
        keys = [min(kv_len, doc) for kv_len in keys]
    calls = []  # (flops, seconds) per call
    for (q_len, kv_len, causal), k, streamed in zip(shape, scale, keys):
        call = 2.0 * b * q_len * kv_len * heads * width / (2.0 if causal else 1.0) * k
        if backward:
            call *= FA_BWD_FLOP_RATIO
        ctas = b * heads * math.ceil(q_len / TILE_M)
        kernel = attention.AttentionKernel(backend, direction, causal, model.qk_head_dim, streamed)
        eff = attention.peak_fraction(kernel, gpu.name) * _occupancy(ctas, gpu.num_sms) / reference * exp_speedup
        calls.append((call, call / (flop_rate_16 * eff)))
    suffix = "_bwd" if backward else ""
    # The first (local, causal) call reads this rank's Q, K, V; the later calls the arriving K, V.
    local_bytes = nbytes / cp if cp > 1 and not window else nbytes
    first_flops, first_s = calls[0]
    ops = [Op(f"attn_core{suffix}", first_flops, local_bytes,
              max(first_s, local_bytes / (gpu.hbm_bandwidth_Bps * gpu.memory_efficiency)) + gpu.launch_overhead_s)]
    if len(calls) > 1:
        ring_flops = sum(f for f, _ in calls[1:])
        ring_s = sum(t for _, t in calls[1:])
        ring_bytes = nbytes - local_bytes
        ops.append(Op(f"attn_core_cp{suffix}", ring_flops, ring_bytes,
                      max(ring_s, ring_bytes / (gpu.hbm_bandwidth_Bps * gpu.memory_efficiency))
                      + gpu.launch_overhead_s * (len(calls) - 1)))
        merged_rows = sum(b * q_len for q_len, _, _ in shape[1:])
        merge = CP_MERGE_BYTES * merged_rows * heads * model.v_dim * (2.0 if backward else 1.0)
        ops.append(mem_op(f"attn_cp_merge{suffix}", merge, gpu))
    return ops


CP_MERGE_BYTES = 10.0


UNFUSED_ATTENTION_OPS = ("attn_scores", "attn_softmax", "attn_dropout", "attn_values")


def unfused_scores(model: ModelConfig, training: TrainingConfig, par: ParallelConfig) -> float:
    """Attention scores one GPU materialises per micro-batch with unfused attention: b x local
    heads x local queries x keys (causal masking skips none)."""
    heads = training.micro_batch_size * model.num_attention_heads / par.tp
    return heads * (training.seq_length / par.cp) * training.seq_length


def _attn_core_unfused(
    model: ModelConfig, training: TrainingConfig, par: ParallelConfig, gpu: GPUSpec, backward: bool
) -> list[Op]:
    """Attention before FlashAttention (Megatron-LM 2021-22, ``CoreAttention``): Q K^T and P V as
    batched GEMMs over the full s x s scores of each local head (causal masking skips no work),
    a fused scale-mask-softmax kernel (read 2, write 2 bytes per score) and attention dropout
    (read 2, write 2, mask 1 byte per score). Backward: both GEMMs twice (dgrad and wgrad
    shapes), softmax backward (read probabilities and gradient, write gradient: 6 bytes per score)
    and dropout backward (5 bytes per score).
    """
    b, s, cp = training.micro_batch_size, training.seq_length, par.cp
    heads = b * model.num_attention_heads / par.tp
    groups = max(1, round(heads))
    q = s / cp
    d = model.head_dim
    scores = unfused_scores(model, training, par)
    prec = _sixteen_bit(training.precision)
    if not backward:
        return [
            gemm_op("attn_scores", q, s, d, gpu, prec, groups),
            mem_op("attn_softmax", 4.0 * scores, gpu),
            mem_op("attn_dropout", 5.0 * scores, gpu),
            gemm_op("attn_values", q, d, s, gpu, prec, groups),
        ]
    return [
        *gemm_bwd_ops("attn_values", q, d, s, gpu, prec, groups),
        mem_op("attn_dropout_bwd", 5.0 * scores, gpu),
        mem_op("attn_softmax_bwd", 6.0 * scores, gpu),
        *gemm_bwd_ops("attn_scores", q, s, d, gpu, prec, groups),
    ]


# Between the QKV projection and the attention core (non-MLA attention; MLA's are in mla.py):
# - ``rope`` (a rotary model's, ``model.position_embedding``): the fused rotary embedding, one
#   kernel on q and one on k (Megatron-core apply_rotary_pos_emb with apply_rope_fusion, its
#   default, calling Transformer Engine's fused_apply_rotary_pos_emb; TE pytorch/attention/rope.py
#   FusedRoPEFunc, whose backward is the same kernel on the gradient): read and write 2 bytes per
#   element of q and k, both ways.
# - ``qk_norm`` (``ModelConfig.qk_norm``, Qwen3): an RMSNorm over each query and key head (Megatron-
#   core q_layernorm / k_layernorm, TENorm): forward one kernel each for q and k, reading and
#   writing 2 bytes per element; backward reads x and dy and writes dx (6 bytes, QK_NORM_BWD_FACTOR
#   of the forward's 4) in TE's rmsnorm_bwd plus its dgamma reduction kernel, for q and k.
QK_NORM_BWD_FACTOR = 1.5


def attention_steps(model: ModelConfig, tokens: float, tokens_norm: float, tp: int,
               window: int | None = None) -> list[Step]:
    h, hd = model.hidden_size, model.head_dim
    if model.is_mla:
        return [
            Mem("input_norm", 2 * ACT_BYTES * tokens_norm * h),
            *(Gemm(name, tokens, n, k) for name, n, k in mla_gemms(model, tp)),
            Mem("latent_norm", 2 * ACT_BYTES * tokens * mla_norm_width(model)),
            AttnCore(window),
            Gemm("out_proj", tokens, h, model.num_attention_heads * model.v_dim / tp),
            Mem("attn_residual", 3 * ACT_BYTES * tokens_norm * h),
        ]
    q_dim = model.num_attention_heads * hd
    kv_dim = max(model.num_key_value_heads, tp) * hd
    qk = tokens * (q_dim + kv_dim) / tp  # elements of q and k on this GPU
    plan: list[Step] = [
        Mem("input_norm", 2 * ACT_BYTES * tokens_norm * h),
        Gemm("qkv_proj", tokens, (q_dim + 2 * kv_dim) / tp, h),
    ]
    if model.qk_norm:
        plan.append(Mem("qk_norm", 2 * ACT_BYTES * qk, 2, QK_NORM_BWD_FACTOR, 4))
    if model.rotary_qk:
        plan.append(Mem("rope", 2 * ACT_BYTES * qk, 2, 1.0, 2))
    return plan + [
        AttnCore(window),
        Gemm("out_proj", tokens, h, q_dim / tp),
        Mem("attn_residual", 3 * ACT_BYTES * tokens_norm * h),
    ]


def mlp_steps(
    model: ModelConfig, layer: int, tokens: float, tokens_norm: float, par: ParallelConfig,
    moe: MoEConfig | None = None, precision: str = "bf16", moe_fusions: tuple[bool, bool, bool] | None = None,
) -> list[Step]:
    """Dense MLP, or an MoE layer as it runs (``simulator.workload.moe.moe_steps``; ``moe_fusions``
    as its ``fusions``)."""
    h, tp, mm = model.hidden_size, par.tp, model.mlp_matrices
    plan: list[Step] = [Mem("post_attn_norm", 2 * ACT_BYTES * tokens_norm * h)]
    if model.is_moe_layer(layer):
        plan += moe_steps(model, tokens, tokens_norm, par, moe or MoEConfig(), precision, moe_fusions)
    else:
        ff = model.intermediate_size
        plan += [
            Gemm("mlp_up", tokens, (mm - 1) * ff / tp, h),
            Mem("mlp_act", mm * ACT_BYTES * tokens * ff / tp),
            Gemm("mlp_down", tokens, h, ff / tp),
        ]
    plan.append(Mem("mlp_residual", 3 * ACT_BYTES * tokens_norm * h))
    return plan


# Low-precision GEMMs need their operands quantized first (Transformer Engine, "Using FP8 and FP4 with
# Transformer Engine"; transformer_engine/pytorch/module/linear.py and base.py
# ``grad_output_preprocess``): a memory-bound kernel reads the 16-bit tensor and writes it in both
# usages the GEMMs need, rowwise for the forward / dgrad and columnwise for the wgrad (FP8:
# cast + transpose; MXFP8 / NVFP4: the 1-D block scales run along K, so each usage is quantized
# apart, with its scales, GEMM_OPERAND_BYTES). Forward: each GEMM's input, except where a
# LayerNorm/RMSNorm writes it quantized (TE LayerNormLinear fuses the norm and the cast). Backward:
# each GEMM's output gradient. The router stays 16-bit (Megatron-core runs it outside TE), and
# under FP8 the experts' casts are moe.py's ``expert_fp8_cast``. Weights are quantized once per
# step (TE caches them across micro-batches) and left out.
# NVFP4 (TE NVFP4BlockScaling with its defaults, docs/features/low_precision_training/nvfp4) scales
# in two levels, the E4M3 block scales under one FP32 scale per tensor, and that needs the tensor's
# amax before any block is quantized; the wgrad (columnwise) usage is first rotated by a 16-point
# random Hadamard transform, whose amax is its own. NVFP4Quantizer::quantize_impl
# (transformer_engine/pytorch/csrc/quantizer.cpp) runs one kernel that reads the tensor for both
# amaxes (nvte_hadamard_transform_amax), then one that reads it again and writes the rowwise and the
# rotated columnwise usage (nvte_quantize_with_hadamard_transform): one extra 16-bit read and
# kernel (``QUANTIZE_AMAX_PASSES``). A norm cannot hand NVFP4 over fused: it writes its 16-bit
# output and the quantizer takes the amax from there (csrc/extensions/normalization.cpp), so the
# GEMMs a norm feeds pay their quantize too.
QUANTIZE_USAGES = 2
QUANTIZE_AMAX_PASSES = {"nvfp4": 1}


def quantize_bytes(elements: float, precision: str) -> float:
    """HBM bytes of quantizing ``elements`` 16-bit values for low-precision GEMMs (read once, both
    usages written; NVFP4 reads once more for its amaxes)."""
    reads = 1 + QUANTIZE_AMAX_PASSES.get(precision, 0)
    return elements * (reads * ACT_BYTES + QUANTIZE_USAGES * GEMM_OPERAND_BYTES[precision])


def _quantize_op(name: str, elements: float, precision: str, gpu: GPUSpec) -> Op:
    """The quantize kernels of ``elements`` values: bytes by ``quantize_bytes``, one launch gap per kernel."""
    kernels = 1 + QUANTIZE_AMAX_PASSES.get(precision, 0)
    op = mem_op(name, quantize_bytes(elements, precision), gpu)
    return Op(name, 0.0, op.bytes, op.time_s + (kernels - 1) * gpu.launch_overhead_s, kernels)


# GEMMs that stay 16-bit under a low-precision recipe, at the 16-bit rate with no quantize: the MoE
# router (Megatron-core's TopKRouter runs its gating GEMM in plain PyTorch, outside Transformer Engine,
# megatron/core/transformer/moe/router.py) and, unless the profile quantizes it
# (``fp8.lm_head_quantized``), the LM head (``head_cost`` adds ``lm_head``).
SIXTEEN_BIT_GEMMS = ("router",)


def _quantized(step: Gemm, precision: str, sixteen_bit: tuple[str, ...]) -> bool:
    if precision not in QUANTIZED_PRECISIONS or step.name in sixteen_bit:
        return False
    return not (precision == "fp8" and step.name.startswith("expert_"))


def _gemm_precision(step: Gemm, precision: str, sixteen_bit: tuple[str, ...]) -> str:
    """The precision ``step`` runs at: 16-bit for the ``sixteen_bit`` GEMMs, else the training's."""
    return _sixteen_bit(precision) if step.name in sixteen_bit else precision


def _run(
    plan: list[Step],
    model: ModelConfig,
    training: TrainingConfig,
    par: ParallelConfig,
    gpu: GPUSpec,
    backward: bool,
    wgrad_bytes: float = ACT_BYTES,
    sixteen_bit: tuple[str, ...] = SIXTEEN_BIT_GEMMS,
) -> BlockCost:
    ops: list[Op] = []
    steps = reversed(plan) if backward else plan
    precision = training.precision
    previous = None
    for step in steps:
        if isinstance(step, Gemm):
            quantize = _quantized(step, precision, sixteen_bit)
            if backward:
                if quantize:
                    ops.append(_quantize_op(f"{step.name}_quantize_bwd", step.groups * step.m * step.n, precision, gpu))
                ops.extend(gemm_bwd_ops(step.name, step.m, step.n, step.k, gpu, _gemm_precision(step, precision, sixteen_bit),
                                        step.groups, step.streams, wgrad_bytes))
            else:
                fused = (isinstance(previous, Mem) and previous.name.endswith("norm")
                         and precision not in QUANTIZE_AMAX_PASSES)
                if quantize and not fused:
                    ops.append(_quantize_op(f"{step.name}_quantize", step.groups * step.m * step.k, precision, gpu))
                ops.append(gemm_op(step.name, step.m, step.n, step.k, gpu, _gemm_precision(step, precision, sixteen_bit),
                                   step.groups, step.streams))
        elif isinstance(step, Latency):
            if not backward:
                ops.append(Op(step.name, 0.0, 0.0, step.time_s))
        elif isinstance(step, AttnCore):
            if training.attention == "unfused":
                ops.extend(_attn_core_unfused(model, training, par, gpu, backward))
            else:
                ops.extend(_attn_core(model, training, par, gpu, backward, step.window))
        elif backward:
            kernels = step.kernels if step.bwd_kernels is None else step.bwd_kernels
            ops.append(mem_chain(f"{step.name}_bwd", step.bwd_factor * step.nbytes, kernels, gpu))
        else:
            ops.append(mem_chain(step.name, step.nbytes, step.kernels, gpu))
        previous = step
    return BlockCost(tuple(ops))


def local_tokens(training: TrainingConfig, par: ParallelConfig) -> tuple[float, float]:
    tokens = training.micro_batch_size * training.seq_length / par.cp
    return tokens, tokens / par.tp if par.sequence_parallel else tokens


def layer_cost(
    model: ModelConfig, training: TrainingConfig, par: ParallelConfig, gpu: GPUSpec, layer: int,
    moe: MoEConfig | None = None, graphed: bool = False, graph_scope: tuple[str, ...] = (),
    glu_sync: bool = False, wgrad_bytes: float = ACT_BYTES, moe_fusions: tuple[bool, bool, bool] | None = None,
) -> LayerCost:
    """Forward, backward and recompute cost of transformer layer ``layer`` on one GPU.

    Recompute (Korthikanti et al. 2022): "selective" re-runs the attention core forward before
    the attention backward; "full" re-runs the whole attention and MLP forwards; "none" nothing.
    "selective" with ``training.recompute_modules`` re-runs what those Megatron-core modules
    checkpoint instead (``recompute_blocks``). ``graphed``: the whole iteration is one CUDA graph,
    which cannot hold a device-to-host sync, so an MoE layer has none (``moe.price_host_sync``);
    ``graph_scope``: the modules replayed from CUDA graphs otherwise, whose host ops before the sync
    cost one launch. ``glu_sync``: the experts' activation starts with a blocking host-to-device
    copy (Megatron-core's clamped GLU, ``moe.GLU_PRE_SYNC_OPS``), a second sync in the layer.
    ``wgrad_bytes``: HBM bytes per weight element of each weight-gradient GEMM's output (``gemm_bwd_ops``).
    ``moe_fusions``: Megatron-core's (moe_router_fusion, moe_permute_fusion, fused multihot) when
    Megatron-core runs the MoE layer (``moe.moe_steps``, ``frameworks.moe_fusions``).
    """
    if training.recompute not in RECOMPUTE:
        raise ConfigError("training.recompute", training.recompute, f"valid: {', '.join(RECOMPUTE)}")
    if training.attention not in ATTENTION_BACKENDS:
        raise ConfigError("training.attention", training.attention, f"valid: {', '.join(ATTENTION_BACKENDS)}")
    tokens, tokens_norm = local_tokens(training, par)
    attn = attention_steps(model, tokens, tokens_norm, par.tp, model.attention_window(layer))
    mlp = mlp_steps(model, layer, tokens, tokens_norm, par, moe, training.precision, moe_fusions)
    attn_fwd = _run(attn, model, training, par, gpu, backward=False)
    mlp_fwd = _run(mlp, model, training, par, gpu, backward=False)
    if model.is_moe_layer(layer) and not graphed:
        if glu_sync:
            mlp_fwd = with_glu_sync(mlp_fwd)
        mlp_fwd = price_host_sync(attn_fwd, mlp_fwd, model, par, moe or MoEConfig(), training.precision,
                                  gpu.host_overhead, graph_scope, moe_fusions)
    if training.recompute == "full":
        attn_re, mlp_re = attn_fwd, mlp_fwd
    elif training.recompute == "selective":
        attn_re, mlp_re = recompute_blocks(attn_fwd, mlp_fwd, training.recompute_modules or ("core_attn",),
                                           model.is_moe_layer(layer))
        if glu_sync:
            mlp_re = recompute_glu_sync(mlp_re, gpu.host_overhead)
    else:
        attn_re, mlp_re = BlockCost(), BlockCost()
    return LayerCost(
        attn_fwd=attn_fwd,
        mlp_fwd=mlp_fwd,
        attn_bwd=_run(attn, model, training, par, gpu, backward=True, wgrad_bytes=wgrad_bytes),
        mlp_bwd=_run(mlp, model, training, par, gpu, backward=True, wgrad_bytes=wgrad_bytes),
        attn_recompute=attn_re,
        mlp_recompute=mlp_re,
    )


# Megatron-core --recompute-modules (megatron/core/transformer/transformer_config.py
# recompute_modules, transformer_layer.py): the forward ops each re-runs before the backward.
# core_attn: the attention core (the default, Korthikanti et al.'s selective recompute);
# layernorm: input_layernorm and pre_mlp_layernorm; mla_up_proj: the MLA query and key/value up
# projections (with the RoPE application fused into them here); moe_act: the experts' activation
# (TEGroupedMLP's bias_act_func); shared_experts: the shared-expert MLP; mlp: the whole dense MLP,
# on dense layers only ("mlp" leaves MoE layers alone). Their FP8 input casts re-run with them.
# "moe" (the whole MoE layer, all-to-alls included) is not modelled.
RECOMPUTE_MODULE_OPS = {
    "core_attn": ("attn_core", "attn_core_cp", "attn_cp_merge") + UNFUSED_ATTENTION_OPS,
    "layernorm": ("input_norm", "post_attn_norm"),
    "mla_up_proj": ("q_up_proj", "kv_up_proj"),
    "moe_act": ("moe_glu_sync", "expert_act"),
    "shared_experts": ("shared_up", "shared_act", "shared_down"),
    "mlp": (),
    "moe": (),
}


def recompute_blocks(attn_fwd: BlockCost, mlp_fwd: BlockCost, modules: tuple[str, ...],
                     moe_layer: bool) -> tuple[BlockCost, BlockCost]:
    """(attention, MLP) ops selective recompute re-runs for Megatron-core ``modules``
    (``RECOMPUTE_MODULE_OPS``), in forward order: the attention part before the attention
    backward, the MLP part before the MLP backward."""
    names = {n for m in modules for n in RECOMPUTE_MODULE_OPS[m]}
    names |= {f"{n}_quantize" for n in set(names)}

    def pick(block):
        return BlockCost(tuple(op for op in block.ops if op.name in names))

    if "mlp" in modules and not moe_layer:
        return pick(attn_fwd), mlp_fwd
    if "moe" in modules and moe_layer:
        # the MoE layer under one checkpoint (moe_layer.py): router, dispatch, experts, combine and
        # shared experts re-run from its input; the norm before it and the residual after are not
        # in it (``layernorm`` re-runs the norm)
        names |= {op.name for op in mlp_fwd.ops if op.name not in ("post_attn_norm", "mlp_residual")}
    return pick(attn_fwd), pick(mlp_fwd)


@functools.lru_cache(maxsize=64)
def split_at_gemm(block: BlockCost, gemm: str) -> tuple[BlockCost, BlockCost, BlockCost, BlockCost]:
    """A backward block as (before, ``gemm``'s dgrad, its wgrad, after): the pieces between which
    a column-parallel GEMM's TP communication starts and ends. A block without that GEMM is all
    ``before``."""
    names = [op.name for op in block.ops]
    if f"{gemm}_dgrad" not in names or f"{gemm}_wgrad" not in names:
        return block, BlockCost(), BlockCost(), BlockCost()
    d, g = names.index(f"{gemm}_dgrad"), names.index(f"{gemm}_wgrad")
    ops = block.ops
    return (BlockCost(ops[:d]), BlockCost(ops[d:d + 1]), BlockCost(ops[g:g + 1]),
            BlockCost(tuple(op for i, op in enumerate(ops) if i > d and i != g)))


@functools.lru_cache(maxsize=256)
def split_weight_grad(block: BlockCost) -> tuple[BlockCost, BlockCost]:
    """A backward block as (everything but the weight-gradient GEMMs, those GEMMs): the B and W
    passes of zero-bubble pipeline schedules (Qi et al. 2024, Sec. 2: dW = X^T dY needs only the
    saved input and the output gradient, so it can run later than dX)."""
    wgrad = tuple(op for op in block.ops if op.name.endswith("_wgrad"))
    if not wgrad:
        return block, BlockCost()
    return BlockCost(tuple(op for op in block.ops if not op.name.endswith("_wgrad"))), BlockCost(wgrad)


def forward_weights(cost: LayerCost, moe_layer: bool) -> tuple[float, ...]:
    """Parameters per GPU of each weight GEMM of a layer's forward, in the order they run (the
    attention projections, then the dense MLP's; an MoE layer's experts are left out)."""
    blocks = (cost.attn_fwd,) if moe_layer else (cost.attn_fwd, cost.mlp_fwd)
    return tuple(op.shape[1] * op.shape[2] * op.shape[3] for b in blocks for op in b.ops if op.shape is not None)


def regathered_params(weights: tuple[float, ...], reuse_distance: float) -> float:
    """Parameters per GPU gathered a second time in a ZeRO-3 layer's backward under full recompute.

    DeepSpeed's ZeRO-3 gathers each module's parameters before it runs and, after it runs,
    releases those it will not use again within ``stage3_max_reuse_distance`` parameters (default
    1e9) of the modules that come next in the step's recorded module order
    (deepspeed/runtime/zero/partitioned_param_coordinator.py ``__params_to_release``; the default in
    deepspeed/runtime/zero/config.py). Under full recompute the layer's modules re-run forward
    inside its backward, then run backward in reverse order, so between module i's recompute and
    its backward come the recompute and the backward of every later module: 2 x (their
    parameters). Module i is released and gathered again when that reaches the distance. 0: no
    module is released there (an FSDP unit stays gathered through its recompute and backward)."""
    return sum(released_weights(weights, reuse_distance))


def released_weights(weights: tuple[float, ...], reuse_distance: float) -> tuple[float, ...]:
    """The weights of ``regathered_params``, in the order the layer's forward runs them."""
    if reuse_distance <= 0:
        return ()
    again, later = [], 0.0
    for p in reversed(weights):
        if 2 * later >= reuse_distance:
            again.append(p)
        later += p
    return tuple(reversed(again))


# Layers over which the per-layer call counts below are averaged: the grouping of a stack of equal
# layers into calls repeats with a period of at most this many layers for the bucket sizes in use.
_CALL_LAYERS = 64


def module_gather_calls(weights: tuple[float, ...], bucket: float) -> float:
    """All-gather calls per pass over a ZeRO-3 layer whose modules each fetch their own
    parameters: DeepSpeed's parameter coordinator, after a module's parameters are in, prefetches
    the next parameters of the recorded module order in one call, adding them until the call holds
    at least ``stage3_prefetch_bucket_size`` elements (5e7 by default;
    deepspeed/runtime/zero/partitioned_param_coordinator.py ``fetch_sub_module``, ``__all_gather_params``
    issues one coalesced all-gather per set; deepspeed/runtime/zero/config.py). In a stack of equal
    layers every weight above the bucket is a call of its own (GPT-3 175B: qkv, proj, fc1 and fc2,
    four per pass), and smaller weights share calls, across layers if need be. Biases and norms
    (a few thousand elements) travel inside these calls and are left out. At least one call per
    layer, the unit gather every other stack makes (so a bound priced at one call stays below)."""
    if bucket <= 0 or not weights:
        return 1.0
    calls, held = 0, 0.0
    for _ in range(_CALL_LAYERS):
        for p in weights:
            held += p
            if held >= bucket:
                calls, held = calls + 1, 0.0
    return max(1.0, calls / _CALL_LAYERS)


def bucket_reduce_calls(weights: tuple[float, ...], bucket: float) -> float:
    """Reduce-scatter calls per ZeRO-3 layer whose gradients are reduced in buckets, in the order
    the backward produces them: DeepSpeed adds each gradient to its bucket and first reduces the
    bucket when the gradient would take it past ``reduce_bucket_size`` elements (5e8 by default;
    deepspeed/runtime/zero/stage3.py ``reduce_independent_p_g_buckets_and_remove_grads``: 'if
    bucket.elements + param.ds_numel > self.reduce_bucket_size and bucket.elements > 0'), one
    reduce-scatter per bucket. At least one call per layer, as for ``module_gather_calls``."""
    if bucket <= 0 or not weights:
        return 1.0
    calls, held = 0, 0.0
    for _ in range(_CALL_LAYERS):
        for p in weights:
            if held > 0 and held + p > bucket:
                calls, held = calls + 1, 0.0
            held += p
    calls += held > 0  # the last bucket, reduced when the backward ends
    return max(1.0, calls / _CALL_LAYERS)


CP_CORE_OPS = ("attn_core", "attn_core_cp", "attn_cp_merge", "attn_core_bwd", "attn_core_cp_bwd", "attn_cp_merge_bwd")
CP_LOCAL_OPS = ("attn_core", "attn_core_bwd")


@functools.lru_cache(maxsize=64)
def split_around(block: BlockCost, names: tuple[str, ...]) -> tuple[BlockCost, BlockCost, BlockCost]:
    """A block as (ops before the first op named in ``names``, those ops, the ops after them):
    the pieces around which the attention core's context-parallel exchange runs."""
    ops = block.ops
    inside = [i for i, op in enumerate(ops) if op.name in names]
    if not inside:
        return block, BlockCost(), BlockCost()
    first, last = inside[0], inside[-1] + 1
    return BlockCost(ops[:first]), BlockCost(ops[first:last]), BlockCost(ops[last:])


@functools.lru_cache(maxsize=64)
def joined(a: BlockCost, b: BlockCost) -> BlockCost:
    """``a`` then ``b`` as one block."""
    return BlockCost(a.ops + b.ops)


def embedding_cost(
    model: ModelConfig, training: TrainingConfig, par: ParallelConfig, gpu: GPUSpec
) -> tuple[BlockCost, BlockCost]:
    """Vocab-parallel embedding lookup on the first stage: forward, backward.

    Forward gathers T rows of h and writes a T x h output. Backward scatter-adds the T x h
    gradient into a dense (V / tp) x h bf16 weight gradient (PyTorch embedding_dense_backward:
    zero-fill, write) that is then added into the fp32 main gradient (read 2 + 4, write 4):
    12 bytes per local embedding weight per micro-batch, plus 2x the forward bytes. A learned
    position table (``model.position_embedding: learned``) adds its gather and add
    (``POSITION_GATHER_ADD_BYTES``) and, backward, the same scatter-add into its seq x h table;
    its seq x h parameters are left out of parameter counts and memory (1.3% of a 125M model's at
    2K tokens, 0.01% of a 175B model's).
    """
    tokens, _ = local_tokens(training, par)
    h = model.hidden_size
    fwd_bytes = 2 * ACT_BYTES * tokens * h
    weight_grad_bytes = 12.0 * model.vocab_size / par.tp * h
    fwd = BlockCost((mem_op("embedding", fwd_bytes, gpu),))
    bwd = BlockCost((mem_op("embedding_bwd", 2.0 * fwd_bytes + weight_grad_bytes, gpu),))
    if model.position_embedding == "learned":
        # the position rows gathered (r2 w2) and added to the token rows (r2 r2 w2), two kernels;
        # backward the same dense scatter-add into the (seq x h) table and its fp32 main gradient
        table = training.seq_length * h
        pos = POSITION_GATHER_ADD_BYTES * tokens * h
        fwd = BlockCost(fwd.ops + (mem_chain("position_embedding", pos, 2, gpu),))
        bwd = BlockCost(bwd.ops + (mem_op("position_embedding_bwd", 2 * ACT_BYTES * tokens * h + 12.0 * table, gpu),))
    return fwd, bwd


# A learned position table's forward per element of the T x h output: the gather (read 2, write 2)
# and the add into the token embeddings (read 2 + 2, write 2): Megatron-LM LanguageModelEmbedding,
# transformers GPT2Model (``inputs_embeds + position_embeds``).
POSITION_GATHER_ADD_BYTES = 10.0


# Megatron-core's vocab_parallel_cross_entropy, unfused (megatron/core/tensor_parallel/cross_entropy.py,
# identical at Megatron-LM 1e057005 and d7288711), per logit of the T x V / tp bf16 logits: forward
# .float() r2 w4, max r4, in-place subtract r4 w4, exp r4 w4, sum r4, div_ r4 w4 = 38 bytes in 6
# kernels; backward mul_ by the per-token gradient r4 w4 and autograd's cast of the fp32 gradient to
# the bf16 input (engine validate_outputs) r4 w2 = 14 bytes in 2 kernels; the fp32 softmax (4 bytes)
# is kept for the backward. (forward bytes, forward kernels, backward bytes, backward kernels, kept
# bytes); the other implementations are in software.CROSS_ENTROPY.
MEGATRON_CROSS_ENTROPY = (38.0, 6, 14.0, 2, 4.0)


def mem_chain(name: str, nbytes: float, kernels: int, gpu: GPUSpec) -> Op:
    """A chain of ``kernels`` memory-bound kernels moving ``nbytes``: roofline plus one launch gap each."""
    time = _roofline(0.0, nbytes, gpu, 1.0) + (kernels - 1) * gpu.launch_overhead_s
    return Op(name, 0.0, nbytes, time, kernels)


def head_cost(
    model: ModelConfig, training: TrainingConfig, par: ParallelConfig, gpu: GPUSpec,
    loss: tuple[float, int, float, int, float] = MEGATRON_CROSS_ENTROPY, wgrad_bytes: float = ACT_BYTES,
    quantized: bool = False,
) -> tuple[BlockCost, BlockCost]:
    """Final norm, LM head GEMM (T x h) @ (h x V / tp) and the vocab-parallel cross-entropy
    (``wgrad_bytes``: the LM head's weight-gradient output, ``gemm_bwd_ops``).

    Under a low-precision recipe the LM head runs 16-bit unless ``quantized`` (the profile's
    ``fp8.lm_head_quantized``): Megatron-core builds its output layer as
    ``tensor_parallel.ColumnParallelLinear`` (megatron/core/models/gpt/gpt_model.py), a PyTorch
    matmul that Transformer Engine's FP8 autocast does not touch, and torchtitan's float8 and MX
    converters skip the module named ``output`` (its configs' ``filter_fqns = ["output"]``; the MX
    converter's default), so the head's GEMMs take the 16-bit rate and no quantize kernel.

    The cross-entropy is memory-bound over the T x V / tp logits, ``loss`` bytes and kernels per
    logit forward and backward (``MEGATRON_CROSS_ENTROPY`` by default; a framework's implementation
    from ``software.CROSS_ENTROPY``), as ``cross_entropy`` / ``cross_entropy_bwd`` ops.
    """
    tokens, tokens_norm = local_tokens(training, par)
    h, vocab = model.hidden_size, model.vocab_size / par.tp
    plan = [
        Mem("final_norm", 2 * ACT_BYTES * tokens_norm * h),
        Gemm("lm_head", tokens, vocab, h),
    ]
    fwd_bytes, fwd_kernels, bwd_bytes, bwd_kernels, _kept = loss
    logits = tokens * vocab
    sixteen_bit = SIXTEEN_BIT_GEMMS if quantized else SIXTEEN_BIT_GEMMS + ("lm_head",)
    fwd = _run(plan, model, training, par, gpu, backward=False, sixteen_bit=sixteen_bit)
    bwd = _run(plan, model, training, par, gpu, backward=True, wgrad_bytes=wgrad_bytes, sixteen_bit=sixteen_bit)
    return (
        BlockCost(fwd.ops + (mem_chain("cross_entropy", fwd_bytes * logits, fwd_kernels, gpu),)),
        BlockCost((mem_chain("cross_entropy_bwd", bwd_bytes * logits, bwd_kernels, gpu),) + bwd.ops),
    )


def param_counts(model: ModelConfig) -> dict:
    """Weight-matrix parameter counts (biases and norm gains, < 0.1%, are left out).

    Keys: 'embedding', 'lm_head' (0 if tied), 'per_layer_dense', 'per_layer_moe' (all routed
    experts), 'per_layer_moe_active' (top-k routed + shared + router), 'total', 'active', and
    'mtp' (the num_nextn_predict_layers multi-token-prediction modules, left out of 'total' and
    'active' as DeepSeek-V3's 671B / 37B leave them out: each is one MoE layer plus its 2h x h
    projection, sharing the embedding and head). Attention: ``mla.attention_params`` (GQA:
    h (nq + 2 nkv) head_dim + nq head_dim h, Ainslie et al. 2023; MLA: its five projections).
    """
    h, mm = model.hidden_size, model.mlp_matrices
    attn = attention_params(model)
    dense = attn + mm * h * model.intermediate_size
    expert = mm * h * model.expert_intermediate_size
    shared = model.num_shared_experts * expert
    router = h * model.num_experts
    moe = attn + router + model.num_experts * expert + shared if model.is_moe else 0
    moe_active = attn + router + model.num_experts_per_tok * expert + shared if model.is_moe else 0
    embedding = model.vocab_size * h
    lm_head = 0 if model.tie_word_embeddings else model.vocab_size * h
    n_moe = sum(1 for layer in range(model.num_hidden_layers) if model.is_moe_layer(layer))
    n_dense = model.num_hidden_layers - n_moe
    return {
        "embedding": embedding,
        "lm_head": lm_head,
        "per_layer_dense": dense,
        "per_layer_moe": moe,
        "per_layer_moe_active": moe_active,
        "total": embedding + lm_head + n_dense * dense + n_moe * moe,
        "active": embedding + lm_head + n_dense * dense + n_moe * moe_active,
        "mtp": model.num_nextn_predict_layers * ((moe if model.is_moe else dense) + 2 * h * h),
    }


def model_flops_per_token(model: ModelConfig, seq_length: int, causal: bool = False) -> float:
    """Training model FLOPs per token: 6 * N + 12 * L * h_attn * s (PaLM, Chowdhery et al. 2022, App. B).

    N = active non-embedding weight parameters plus the LM head matrix (V * h, counted even when
    tied, since the head GEMM runs). The attention term is NOT halved for causal masking, the
    convention of Megatron-LM (Narayanan et al. 2021, Eq. 3) and NeMo's published MFU: GPT-3
    175B at s = 2048 gives 2.20e15 FLOPs per sample, Llama-3.1-8B at s = 8192 gives 4.74e14.
    Recompute is not counted (model FLOPs, not hardware FLOPs).

    Attention per layer in general: 6 * nq * (qk_head_dim + v_dim) * s * f, which is
    12 * h_attn * s when both widths are head_dim; f = ``mla.window_fraction`` on sliding-window
    layers, 1 otherwise. MTP modules are not counted (DeepSeek-V3 quotes 37B active without them).

    ``causal``: the attention term halved, the convention of the TFLOP/s Megatron-LM has logged
    since 8873b55d (2025-03-06, megatron/training/training.py ``num_floating_point_operations``:
    "Only half of the attention matrix is non-zero"; its MLA formula the same since d4f9a6f7),
    for reading such a figure as a step time (``studies.validate``), never for stepsim's own.
    """
    counts = param_counts(model)
    n = counts["active"] - counts["embedding"] - counts["lm_head"] + model.vocab_size * model.hidden_size
    width = model.num_attention_heads * (model.qk_head_dim + model.v_dim)
    layers = sum(window_fraction(seq_length, model.attention_window(layer)) for layer in range(model.num_hidden_layers))
    return 6.0 * n + (3.0 if causal else 6.0) * layers * width * seq_length


def recompute_flops_per_token(model: ModelConfig, seq_length: int, recompute: str) -> float:
    """FLOPs per token that activation recompute adds, in ``model_flops_per_token``'s convention
    (full s^2 attention over the query/key and value widths, sliding windows as their share of
    pairs, weights counted by their active parameters).

    "full" re-runs every layer's forward: 2 N_layers + 2 L_eff (qk + v) heads s per token
    (Megatron-LM's Eq. 3, Narayanan et al. 2021, counts this fourth pass: 96 B s l h^2 (1 + s/6h +
    ...) = 4 x 24 B s l h^2 (1 + s/6h); the LM head is not recomputed). "selective" re-runs the
    attention core, Q K^T and P V (Korthikanti et al. 2022, Sec. 5). "none" adds nothing.
    """
    if recompute not in RECOMPUTE:
        raise ConfigError("training.recompute", recompute, f"valid: {', '.join(RECOMPUTE)}")
    if recompute == "none":
        return 0.0

    width = model.num_attention_heads * (model.qk_head_dim + model.v_dim)
    layers = sum(window_fraction(seq_length, model.attention_window(layer)) for layer in range(model.num_hidden_layers))
    attention = 2.0 * layers * width * seq_length
    if recompute == "selective":
        return attention
    counts = param_counts(model)
    layer_params = counts["active"] - counts["embedding"] - counts["lm_head"]
    return 2.0 * layer_params + attention


def hardware_flops_per_token(model: ModelConfig, seq_length: int, recompute: str) -> float:
    """Model FLOPs plus recompute FLOPs per token, both in the full-attention convention, so that
    hardware FLOP utilisation (HFU) is never below model FLOP utilisation (MFU)."""
    return model_flops_per_token(model, seq_length) + recompute_flops_per_token(model, seq_length, recompute)
