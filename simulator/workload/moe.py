"""An MoE layer as Megatron-core runs it on one GPU: its kernels, and its all-to-all payloads.

Pure functions of the model, the parallel layout and the ``moe:`` scenario section
(:class:`simulator.scenario.config.MoEConfig`). ``moe_steps`` returns the layer's kernels in forward order;
the engine runs the ones before the dispatch, the all-to-all, the expert kernels, the all-to-all,
and the rest (``split_moe_block``). Every cost is its own op in the trace:

- ``router`` GEMM (T x h) @ (h x E) and ``router_topk``: the score function (softmax, or sigmoid
  plus the aux-loss-free bias for DeepSeek-V3), top-k and, with ``norm_topk_prob``, the
  renormalisation, as memory-bound passes over the T x E fp32 scores (Megatron-core
  ``TopKRouter``: logits in ``moe_router_dtype``, probabilities and the routing map written out,
  the load-balancing statistics read back: 4 passes of 4 bytes per score (2 with
  ``router_dtype: bf16``), one more for ``norm_topk_prob``).
- ``moe_permute`` / ``moe_unpermute``: gather the routed copies into expert order (read T x h,
  write the copies) and scatter-add them back with the router weights (Megatron-core
  ``moe_utils.permute`` / ``unpermute``); with several local experts the alltoall dispatcher
  also reorders the received chunks from source-rank to expert order and back
  (``sort_chunks_by_idxs``): ``moe_sort_chunks`` / ``moe_unsort_chunks``. The flex dispatcher
  (DeepEP) fuses the first permutation into its dispatch kernel and keeps the second.
- ``moe_host_sync``: dropless routing needs each expert's token count on the host before the
  grouped GEMM (and the alltoall split sizes): a device-to-host copy and a stream sync, once per
  MoE layer forward (Megatron-core ``MoEAlltoAllTokenDispatcher``; DeepEP's dispatch "involves an
  implicit CPU wait for the GPU received-count signal", DeepEP docs/legacy.md). The GPU then
  idles for the sync round trip and for the CPU run-ahead the sync throws away: after the sync
  the host issues the rest of the MoE layer at ``HOST_OP_S`` per op with the GPU idle, and
  whatever of that issue time the GPU work after the sync does not cover stalls the stream; the
  ops before the next sync (attention, shared expert, router, dispatcher metadata, permutation)
  stall only beyond the GPU time they and the head start cover (``host_sync_time``). The ops are
  counted from Megatron-core's and Transformer Engine's code per component (``moe_host_ops``:
  router, dispatcher pre- and post-processing, permutations, per-expert GroupedLinear work by
  precision, shared expert). With ``capacity_factor`` (drop and pad to capacity, static shapes)
  there is no sync, nor with the whole iteration in one CUDA graph (a graph cannot hold a sync;
  profile ``cuda_graphs``, Megatron-Bridge's ``full_iteration`` recipes). ``HOST_OP_S`` is an x86
  host's; a Grace host (GB200, GB300) takes ``GPUSpec.host_overhead`` times it
  (``hardware.GRACE_HOST_OVERHEAD``).
- ``expert_up`` / ``expert_act`` / ``expert_down``: the local experts as grouped GEMMs
  (``gemm_efficiency`` with ``groups`` = local experts: one kernel over all experts' tiles, as
  CUTLASS grouped GEMM schedules them; small per-expert M fills its 128-row tiles poorly), on the
  tokens the busiest rank receives: mean x ``imbalance`` when dropless, capacity_factor x mean
  (padded) with token dropping. Without ``grouped_gemm`` each expert is its own GEMM launch.
  With ``grouped_gemm_streams`` (Transformer Engine's GroupedLinear, which Megatron-core's
  TEGroupedMLP runs): TE's ``nvte_multi_tensor_gemm`` takes its CUTLASS grouped kernel only on
  Hopper, in BF16/FP16, with ``NVTE_USE_CUTLASS_GROUPED_GEMM=1`` (off by default); otherwise
  ``multi_stream_cublas_gemm`` launches one cuBLAS GEMM per expert, expert i on compute stream
  i mod 4 (``get_num_compute_streams``: 4) (transformer_engine/common/gemm/cublaslt_gemm.cu and
  common/util/multi_stream.cpp, TE d0067d0). So at most 4 experts' tiles share the SMs at a time
  and small per-expert GEMMs fill the waves worse than one grouped kernel would.
- ``expert_fp8_cast``: with fp8, Transformer Engine quantises each expert's input and the
  activation before the second GEMM (read 2, write 1 byte per element).
- Shared experts (DeepSeek-MoE, Llama 4): one dense MLP of num_shared_experts x
  moe_intermediate_size on all local tokens, split by tp.
- ``moe_route_kernels`` / ``moe_expert_kernels`` / ``expert_gemm_launches`` (when Megatron-core runs
  the layer, ``moe_steps(fusions=...)``): the small kernels of Megatron-core's routing, dispatcher
  metadata, permutations and FP8 padding that no priced op stands for (top-k's scatters and casts,
  the count sums, indices_to_multihot, the row-id maps; ``bookkeeping_kernels``, counted from the
  same code as the host ops below, with moe_router_fusion and moe_permute_fusion as the run sets
  them), and the per-expert GEMMs a stream runs after its first (``grouped_gemm_launches``). Each
  costs one launch gap (``GPUSpec.launch_overhead_s``): however little it computes, a kernel
  occupies the stream for its ramp-up and tail. Megatron-Bridge's profile of a Qwen3-30B-A3B step
  on 16 H100 counted 463,348 kernels on one rank (skills/nemo-mbridge-perf-expert-parallel-overlap,
  7ded17da), about 150 per layer and micro-batch, where the priced ops alone are 36.

All-to-all payload (``dispatch_bytes``), per rank per MoE layer, direction-independent: routed
copies x h x 2 bytes (tokens x top-k x hidden x bytes) with the alltoall dispatcher; the flex
(DeepEP) dispatcher sends a token once per destination rank inside a node and once per
destination node across nodes (forwarding over NVLink there), which with node-limited routing
(``max_nodes_per_token``, DeepSeek-V3: 4) is at most that many nodes; the allgather dispatcher
gathers every token of the EP group. The busiest rank's payload scales with ``imbalance``.
"""

from __future__ import annotations

import math

from simulator.scenario.config import QUANTIZED_PRECISIONS, ModelConfig, MoEConfig, ParallelConfig
from simulator.workload.frameworks import routing_graphed
from simulator.workload.kernels import ACT_BYTES, BlockCost, Gemm, Latency, Mem, Op

SCORE_BYTES = 4
ROUTER_PASSES = 4
# CPU time to issue one PyTorch op (Python, autograd, ATen dispatch and the kernel launch):
# "~5-25 us of CPU-side work per op" (J. Lin, "From PyTorch op to kernel launch", lesson 18 of
# GPU kernels for serving); 10 us, the low-middle of that range, for a C++-heavy training loop.
HOST_OP_S = 10e-6
# A device-to-host copy of the token counts and the stream synchronisation that waits for it:
# one more host round trip of the same order as an op's issue time.
HOST_SYNC_S = 10e-6
# --- Host ops of one MoE layer forward, counted from Megatron-core 402bc50 (2025-10-31, the commit of
# NVIDIA's DeepSeek-V3 GB200 guide) and Transformer Engine b9c9deb (2025-10-31): every PyTorch
# dispatcher call (allocation, view, cast, .tolist), autograd Function entry, kernel launch and
# collective call is one op. M = megatron/core/transformer/moe/, TE = transformer_engine/pytorch/.
# Router: RouterGatingLinearFunction (M moe_utils.py:944-974: apply, view, output allocation and GEMM,
# view) and the logits view (M router.py:494).
ROUTER_GATE_OPS = 5 + 1
# Top-k routing (M moe_utils.py:523-621) unfused: softmax after top-k (topk, softmax, type_as), or
# sigmoid with the aux-loss-free expert bias (float, sigmoid, type_as, + bias, topk, gather, type_as,
# sum, + eps, div); then the dense probs and map (zeros_like, scatter; zeros_like, int, scatter, bool).
ROUTER_TOPK_OPS = {"softmax": 3 + 6, "sigmoid": 10 + 6}
# moe_router_fusion (M moe_utils.py:564-574 -> TE router.py:18-36): apply, three output
# allocations (probs, routing map, intermediate) and one kernel, for either score function.
ROUTER_TOPK_FUSED_OPS = 5
# Expert-bias token count (M router.py:473-481: sum, add_), with the sigmoid (DeepSeek-V3) router.
ROUTER_BIAS_OPS = 2
# alltoall dispatcher metadata (M token_dispatcher.py:484-549, EP > 1): sum, long; reshape, sum
# (input_splits); the count all-gather (apply, allocation, all_gather); reshape, transpose; slice,
# contiguous; sum; index; sum; sum; and dispatch_preprocess's view (:581). One more view with several
# local experts (:551).
A2A_PREPROCESS_OPS = 16
A2A_PREPROCESS_MULTI_EXPERT_OPS = 1
# The non-blocking device-to-host copies (M token_dispatcher.py:844-869, moe_utils.py:876-892):
# wait_stream and record_event, and per copied tensor .to(cpu) and record_stream (tokens_per_expert;
# input, output and TP splits, the three with .numpy(); the per-local-expert counts when there are
# several local experts and permute fusion is off).
A2A_DTOH_OPS = 2 + 2 * 4 + 3
A2A_DTOH_PER_TENSOR_OPS = 2
# Permutation by routing map (M moe_utils.py:220-305), unfused: bool, T, contiguous, arange,
# unsqueeze, expand, masked_select; probs T, contiguous, masked_select; index_select (the two
# masked_selects have data-dependent sizes). moe_permute_fusion (TE permutation.py:188-260,
# triton/permutation.py:198-300 and :392-450): apply, make_row_id_map (2 allocations, 3 kernels),
# permute_with_mask_map (2 allocations, 1 kernel).
PERMUTE_OPS = 11
PERMUTE_FUSED_OPS = 1 + 5 + 3
# All-to-all, all-gather or reduce-scatter through Megatron's autograd wrappers: apply, output
# allocation, the NCCL call (M token_dispatcher.py:640-645 dispatches tokens and probs, :782 combines).
COLLECTIVE_OPS = 3
# Reorder by local expert (M token_dispatcher.py:697-703 and :735-740, moe_utils.py:397-428), several
# local experts only: unfused, per tensor split, two .tolist and cat (tokens and probs on the way in,
# tokens on the way out), plus ravel (and T on the way out); fused (TE permutation.py:623-665,
# triton/permutation.py:857-990): apply, make_chunk_sort_map (allocation, kernel), sort_chunks_by_map
# (an allocation per tensor, kernel).
SORT_CHUNKS_OPS = 1 + 2 * 4
SORT_CHUNKS_FUSED_OPS = 1 + 1 + 2 + 3
UNSORT_CHUNKS_OPS = 2 + 4
UNSORT_CHUNKS_FUSED_OPS = 2 + 1 + 2 + 2
# Unpermutation without probs (M token_dispatcher.py:797-807, moe_utils.py:307-395): zeros, unsqueeze,
# expand, scatter_add_, to, and the output view; fused (TE permutation.py:333-370,
# triton/permutation.py:581-625): apply, allocation, kernel, and the view.
UNPERMUTE_OPS = 5 + 1
UNPERMUTE_FUSED_OPS = 3 + 1
# Flex dispatcher (DeepEP), before its dispatch waits for the received counts on the host:
# dispatch_preprocess (M token_dispatcher.py:1391-1415: view; _initialize_metadata :1363-1389 two
# reshape, expand, reshape, contiguous; setup_metadata :1135-1145 two reshapes and topk), and
# FusedDispatch (M fused_a2a.py:72-112: apply, get_dispatch_layout, the dispatch call).
FLEX_PREPROCESS_OPS = 1 + 8 + 3 + 3
# After it: the received-token allocations and dispatch kernel are DeepEP internals (counted as the
# one call), torch.tensor of the counts (fused_a2a.py:134); indices_to_multihot (M
# token_dispatcher.py:1178-1206: two zeros, ne, mask index, sum, arange, repeat_interleave, two
# index_put, probs index, bool; its fused form needs the experimental flag); num_out_tokens' sum and
# .item() (:1280); the permutation by local expert and its reverse (PERMUTE/UNPERMUTE above); the
# combine (fused_a2a.py:166-172: apply, combine call) and the output view (:1507).
FLEX_DISPATCH_OPS = 1 + 1
FLEX_MULTIHOT_OPS = 12
MULTIHOT_SYNCS = 3  # of those, the reads back to the host (``multihot_syncs``)
FLEX_NUM_OUT_OPS = 2
FLEX_COMBINE_OPS = 2 + 1
# TEGroupedMLP (M experts.py:883-1030): counts .tolist and probs unsqueeze; with FP8/FP4 instead
# Transformer Engine's Fp8Padding of tokens and probs and Fp8Unpadding of the output (TE
# module/fp8_padding.py and fp8_unpadding.py forward: apply, allocation, view, kernel, each), and the
# weighted SwiGLU (apply, kernel).
GROUPED_MLP_OPS = 2 + 2
GROUPED_MLP_QUANT_PAD_OPS = 3 * 4
# One GroupedLinear forward (TE module/grouped_linear.py:63-185): apply, reshape, output torch.empty,
# general_grouped_gemm; multi_stream_cublas_gemm's fan-out to and back from its streams (TE
# common/gemm/cublaslt_gemm.cu:944-995, event record and waits, counted as one op each way) and one
# cuBLAS GEMM per local expert (:961-983). BF16 splits the input by the counts (torch.split, :130);
# FP8 split_quantize (csrc/extensions/cast.cpp:697-808): contiguous, then for MXFP8/NVFP4 one bulk
# allocation of rowwise and columnwise data and scales (4) and one quantize kernel per expert
# (:144-148), for per-tensor FP8 three allocations per expert (csrc/quantizer.cpp:113-141) and one
# fused multi_cast_transpose; MXFP8/NVFP4 GEMMs also swizzle both operands' scales (allocation and
# kernel each, csrc/extensions/gemm.cpp te_general_grouped_gemm, csrc/util.cpp:85-190). Weights are
# quantised once per step (cached workspaces after the first micro-batch): not counted.
GROUPED_LINEAR_OPS = 4 + 2
GROUPED_LINEAR_PER_EXPERT_OPS = 1
GROUPED_LINEAR_BF16_OPS = 1
GROUPED_LINEAR_BLOCK_QUANT_OPS = 1 + 4 + 2 * 2  # mxfp8 / nvfp4: contiguous, bulk allocation, swizzles
GROUPED_LINEAR_BLOCK_QUANT_PER_EXPERT_OPS = 1
GROUPED_LINEAR_FP8_OPS = 1 + 1
GROUPED_LINEAR_FP8_PER_EXPERT_OPS = 3
# Shared expert (M moe_layer.py:195-219, computed before the router unless overlapped; Megatron-core
# MLP with two TE Linear: apply, reshape, output allocation, GEMM each, and the fused SwiGLU (apply,
# kernel)); under FP8 each Linear also quantises its input (allocation and kernel); its output added
# to the routed output (moe_layer.py:250).
SHARED_EXPERT_OPS = 2 * 4 + 2
SHARED_EXPERT_QUANT_OPS = 2 * 2
SHARED_ADD_OPS = 1
# Megatron-core's clamped GLU (GPT-OSS, model.swiglu_limit; megatron/core/fusions/fused_bias_geglu.py:424-434
# at Megatron-LM d7288711): chunk, two clamps, cat and view, then torch.tensor(linear_offset,
# device=...) (a CPU tensor and its copy) before the fused activation; the copy from pageable host
# memory is blocking (PyTorch copy_kernel_cuda -> at::cuda::memcpy_and_sync: cudaMemcpyAsync then
# cudaStreamSynchronize), a second stream sync in every MoE forward. After it: the activation's
# autograd Function (apply, compiled kernel, view), fc2 and, with expert biases, the per-expert
# bias loop (experts.py:251-266: two splits, a mul and an add per local expert, cat, view, cast).
GLU_PRE_SYNC_OPS = 1 + 2 + 1 + 1 + 2
GLU_ACT_OPS = 3
EXPERT_BIAS_OPS = 5
EXPERT_BIAS_PER_EXPERT_OPS = 2
# --- GPU kernels of the same code that no priced op stands for (``bookkeeping_kernels``), from the ops
# listed above: each costs the GPU one launch gap (``GPUSpec.launch_overhead_s``: ramp-up, a few
# bytes, tail), whatever it computes. Forward, beyond the op that prices each component (1 kernel):
# router top-k unfused, softmax: topk, softmax, type_as, zeros_like, scatter, zeros_like, int,
# scatter, bool (9); sigmoid: float, sigmoid, type_as, + bias, topk, gather, type_as, sum, + eps,
# div and the same six (16); fused: one kernel. Backward (autograd): the cast's, softmax's or
# sigmoid's, topk's (zeros and scatter) and the scatter's (gather) kernels, 5 / 8; fused 2.
ROUTER_TOPK_KERNELS = {"softmax": 9, "sigmoid": 16}
ROUTER_TOPK_BWD_KERNELS = {"softmax": 5, "sigmoid": 8}
ROUTER_TOPK_FUSED_KERNELS = (1, 2)
ROUTER_BIAS_KERNELS = 2  # sum, add_ (no backward)
# alltoall dispatcher metadata: sum, long, sum, the count all-gather, contiguous, sum, index, sum, sum;
# the probabilities' all-to-all beside the tokens' (forward and backward).
A2A_PREPROCESS_KERNELS = 9
A2A_PROBS_KERNELS = 1
# Permutation: unfused bool, contiguous, arange, masked_select, contiguous, masked_select,
# index_select (7); backward index_select's and the probs masked_select's zeros + scatter (4).
# Fused: make_row_id_map's 3 kernels and the permute (4); backward the unpermute kernel and the probs'.
PERMUTE_KERNELS = {False: (7, 4), True: (4, 2)}
# Reorder by local expert (several local experts): unfused the cat of tokens and of probs (2; split's
# backward cats, 2); fused make_chunk_sort_map and one sort per tensor (3; backward 2 + map).
SORT_CHUNKS_KERNELS = {False: (2, 2), True: (3, 3)}
UNSORT_CHUNKS_KERNELS = {False: (1, 1), True: (2, 2)}
# Unpermutation: unfused zeros, scatter_add_, to (3); backward gather, cast and the probs' mul and sum
# (4); fused one kernel, backward the permute kernel and the probs' (2).
UNPERMUTE_KERNELS = {False: (3, 4), True: (1, 2)}
# Flex (DeepEP): get_dispatch_layout, the notify kernel before the dispatch, the topk of
# setup_metadata (3); indices_to_multihot: two zeros, ne, mask index, sum, arange,
# repeat_interleave, two index_put, probs index, bool (11; backward the probs index's zeros and
# index_put, 2); num_out_tokens' sum (1).
FLEX_PREPROCESS_KERNELS = 3
FLEX_MULTIHOT_KERNELS = (11, 2)
FLEX_NUM_OUT_KERNELS = 1
# FP8 / FP4 experts: Fp8Padding of tokens and probs and Fp8Unpadding of the output, forward and backward.
GROUPED_MLP_QUANT_PAD_KERNELS = 3
# Concurrent compute streams Transformer Engine's multi_stream_cublas_gemm spreads per-expert GEMMs
# over (transformer_engine/common/util/multi_stream.cpp get_num_compute_streams: 4).
TE_GEMM_STREAMS = 4
# Achieved fraction of the nominal per-direction link rate in an EP all-to-all:
# DeepEP's normal kernels (docs/legacy.md: H800, ~160 GB/s usable NVLink, one CX7 400 Gb/s NIC per
# GPU; DeepSeek-V3 shapes): intranode EP8 dispatch 153 / combine 158 GB/s (NVLink); internode
# EP16 43 / 43, EP32 58 / 57, EP64 51 / 50 GB/s (RDMA). Those are logical bandwidths: the bytes
# they count include each rank's (or node's) copies to itself, which cross no link. DeepEP's
# README says so of its tables ("the results are logical bandwidth ... under the EP 8 x 2 case,
# 90 GB/s actually contains local rank traffic"), its maintainer of the test's RDMA figure
# ("algorithm bandwidth", deepseek-ai/DeepEP issue 141), and a user measured the NIC counters at
# N_nodes / (N_nodes - 1) below it (issue 51, 2 and 4 H800 nodes). stepsim's payload counts the
# same copies (``dispatch_bytes``) but its network moves only the ones that leave the rank or the
# node, so the achieved fraction of the link rate is the logical figure times the share that
# crosses it: intranode 155.5 x 7/8 of H800's 200 GB/s -> 0.68; internode, of ~50 GB/s per NIC,
# 2 nodes 43 x 1/2 -> 0.43 (on H800 the NVLink forwarding bound it, issue 285; an H200 pair
# measured the same 41-44 logical, issue 493), 4 nodes 57.5 x 3/4 -> 0.86, 8 nodes 50.5 x 7/8
# -> 0.88, held beyond (``DEEPEP_RDMA_EFFICIENCY``, by nodes; 3 nodes take the 4-node figure).
# On NVLink 5 the kernels do not fill the link: DeepEP on 8 Blackwell GPUs with 24 SMs (Megatron-core
# gives it 20) ran dispatch BF16 / combine at 494 / 420 GB/s (B200) and 513 / 426 (GB200), logical
# (DeepEP hybrid-ep branch, docs/README_Hybrid-EP.md, "Torch API"): 463 x 7/8 of 900 -> 0.45.
# HybridEP (NVIDIA's, Megatron-core --moe-flex-dispatcher-backend hybridep), same file, algorithm
# bandwidth through the Torch API at 16 SMs ("16 SMs can generally achieve good bandwidth",
# Megatron-core transformer_config.py moe_hybridep_num_sms), BF16 dispatch and combine averaged:
# H100 over InfiniBand, 16 ranks 54.5 / 53.4, 32 ranks 47.4 / 52.5, 64 ranks 41.2 / 46.6 GB/s ->
# 2 nodes 53.9 x 1/2, 4 nodes 49.9 x 3/4, 8 nodes 43.9 x 7/8 of 50 GB/s -> 0.54, 0.75, 0.77;
# Blackwell NVLink, 8 ranks 536 / 531 (B200) and 550 / 538 (GB200) -> 539 x 7/8 of 900 -> 0.52,
# GB200 16, 32 and 36 ranks 474, 454 and 444 logical -> 0.49 on average (``HYBRIDEP_*``). No
# Hopper NVLink figure is published for it: within a Hopper node it takes DeepEP's.
# NCCL all-to-all across nodes: "CX-7 NICs at NDR rate should achieve up to 48-49 GB/s per NIC"
# (NVIDIA/nccl-tests issue 267, NVIDIA) -> 0.97. Within a node: "450GB/s is the line rate. With
# the protocol overhead (~20%) NCCL can get an effective NVLink bandwidth of 370GB/s, which you
# can observe as BusBw when running non-allreduce operations" (S. Jeaugey, NCCL, NVIDIA/nccl-tests
# issue 212, DGX H100) -> 370 / 450 of the nominal rate. The cluster's NVLink links already carry
# NCCL's rating of them (``GPUSpec.nvlink_efficiency``: 20.6 / 25 on Hopper, 40.1 / 50 on Blackwell,
# 0.80 on A100); the all-to-all is charged what these figures leave below it, if anything.
# Measured on NVLink 4; taken as the same protocol share on NVLink 5.
DEEPEP_NVLINK_EFFICIENCY = 155.5 * 7 / 8 / 200
DEEPEP_NVLINK5_EFFICIENCY = (494 + 420 + 512.72 + 425.95) / 4 * 7 / 8 / 900
DEEPEP_RDMA_EFFICIENCY = {2: 43 / 2 / 50, 4: 57.5 * 3 / 4 / 50, 8: 50.5 * 7 / 8 / 50}  # by nodes in the EP group
HYBRIDEP_RDMA_EFFICIENCY = {2: (54.47 + 53.35) / 2 / 2 / 50, 4: (47.36 + 52.53) / 2 * 3 / 4 / 50,
                            8: (41.24 + 46.57) / 2 * 7 / 8 / 50}
HYBRIDEP_NVLINK5_EFFICIENCY = {8: (535.94 + 530.86 + 550.10 + 538.44) / 4 * 7 / 8 / 900,  # by ranks: up to 8, more
                               16: ((472.84 + 474.48) / 2 * 15 / 16 + (485.50 + 423.19) / 2 * 31 / 32
                                    + (469.96 + 418.27) / 2 * 35 / 36) / 3 / 900}
NCCL_A2A_NET_EFFICIENCY = 48.5 / 50
NCCL_A2A_NVLINK_EFFICIENCY = 370 / 450


def local_experts(model: ModelConfig, par: ParallelConfig) -> int:
    return max(1, model.num_experts // par.ep)


def routed_copies(model: ModelConfig, tokens: float, par: ParallelConfig, moe: MoEConfig) -> float:
    """Token copies the busiest rank's experts process per micro-batch and layer.

    Balanced, a rank gets T x etp / tp x top-k copies (its expert-TP group's tokens, Megatron-core
    MoE parallel folding); dropless, the busiest rank gets ``imbalance`` times that; with a
    capacity factor every expert is padded to capacity_factor x its mean share (overflow dropped).
    """
    mean = tokens * par.expert_tp / par.tp * model.num_experts_per_tok
    if moe.capacity_factor is not None:
        return mean * moe.capacity_factor
    return mean * moe.imbalance


def multihot_syncs(moe: MoEConfig, fusions: tuple[bool, bool, bool] | None) -> int:
    """Host syncs Megatron-core's DeepEP path makes after the dispatch, converting the received
    top-k indices to a routing map (_DeepepManager._indices_to_multihot, token_dispatcher.py:1178-1206
    at 402bc50, :1261-1289 at d0b3b775): the boolean-mask index ``indices[mask]`` and
    ``probs[mask]`` (a data-dependent size, read back to the host) and ``repeat_interleave`` of the
    per-row counts without an output size (the same), 3; none with the fused converter
    (``--enable-experimental`` with moe_permute_fusion: ``fused_indices_to_multihot``), with the
    HybridEP backend (its kernels permute; _HybridEPManager has no such step) or outside Megatron-core."""
    if fusions is None or moe.token_dispatcher != "flex" or moe.flex_backend != "deepep" or fusions[2]:
        return 0
    return MULTIHOT_SYNCS


def host_sync_needed(moe: MoEConfig) -> bool:
    """Dropless routing syncs the token counts to the host; padding to capacity does not."""
    return moe.capacity_factor is None


def moe_steps(model: ModelConfig, tokens: float, tokens_norm: float, par: ParallelConfig, moe: MoEConfig,
              precision: str, fusions: tuple[bool, bool, bool] | None = None) -> list:
    """The MoE layer's kernels after the pre-MLP norm, in forward order (see the module docstring).

    The host sync is priced afterwards by ``price_host_sync`` once the layer's GPU time is known;
    here it is a zero-time placeholder holding its place in the order, and so is
    ``moe_multihot_sync`` (``multihot_syncs``). ``fusions``: Megatron-core's (moe_router_fusion,
    moe_permute_fusion, fused multihot) when Megatron-core runs the layer, whose small kernels
    (``bookkeeping_kernels``) and per-expert GEMM launches (``grouped_gemm_launches``) then take
    their launch gaps as ops of their own, ``moe_route_kernels`` and ``moe_expert_kernels``, and
    ``expert_gemm_launches``; None leaves them out (another framework's MoE code, not counted).
    """
    h, tp, mm = model.hidden_size, par.tp, model.mlp_matrices
    experts, etp = model.num_experts, par.expert_tp
    ffe = model.expert_intermediate_size
    nloc = local_experts(model, par)
    copies = routed_copies(model, tokens, par, moe)
    per_expert = copies / nloc
    router_passes = ROUTER_PASSES + (1 if model.norm_topk_prob else 0)
    score_bytes = SCORE_BYTES if moe.router_dtype == "fp32" else ACT_BYTES
    plan: list = [
        Gemm("router", tokens_norm, experts, h),
        Mem("router_topk", router_passes * score_bytes * tokens_norm * experts),
    ]
    small = bookkeeping_kernels(model, par, moe, precision, *fusions[:2]) if fusions is not None else None
    if small and any(small["route"]):
        plan.append(Mem("moe_route_kernels", 0.0, small["route"][0], 0.0, small["route"][1]))
    flex = moe.token_dispatcher == "flex"
    gathered = tokens * par.ep if moe.token_dispatcher == "allgather" else tokens
    if not flex:
        plan.append(Mem("moe_permute", ACT_BYTES * (gathered + copies) * h))
    if host_sync_needed(moe):
        plan.append(Latency("moe_host_sync", 0.0))
    sort = flex or (moe.token_dispatcher == "alltoall" and nloc > 1)
    if multihot_syncs(moe, fusions):  # after the dispatch, before the permutation by local expert
        plan.append(Latency("moe_multihot_sync", 0.0))
    if sort:
        plan.append(Mem("moe_sort_chunks", 2 * ACT_BYTES * copies * h))
    if small and any(small["expert"]):
        plan.append(Mem("moe_expert_kernels", 0.0, small["expert"][0], 0.0, small["expert"][1]))
    gaps = grouped_gemm_launches(model, par, moe)[0] if fusions is not None else 0
    if gaps:  # two GroupedLinear calls forward (fc1, fc2), their dgrad and wgrad backward
        plan.append(Mem("expert_gemm_launches", 0.0, 2 * gaps, 0.0, 4 * gaps))
    if precision == "fp8":
        plan.append(Mem("expert_fp8_cast", 3 * copies * (h + ffe / etp)))
    if moe.grouped_gemm:
        streams = moe.grouped_gemm_streams
        plan += [
            Gemm("expert_up", per_expert, (mm - 1) * ffe / etp, h, nloc, streams),
            Mem("expert_act", mm * ACT_BYTES * copies * ffe / etp),
            Gemm("expert_down", per_expert, h, ffe / etp, nloc, streams),
        ]
    else:
        for e in range(nloc):
            plan.append(Gemm(f"expert_up_{e}", per_expert, (mm - 1) * ffe / etp, h))
        plan.append(Mem("expert_act", mm * ACT_BYTES * copies * ffe / etp))
        for e in range(nloc):
            plan.append(Gemm(f"expert_down_{e}", per_expert, h, ffe / etp))
    if sort:
        plan.append(Mem("moe_unsort_chunks", 2 * ACT_BYTES * copies * h))
    plan.append(Mem("moe_unpermute", ACT_BYTES * (2 * copies + gathered) * h))
    if model.num_shared_experts:
        ffs = model.num_shared_experts * ffe
        plan += [
            Gemm("shared_up", tokens, (mm - 1) * ffs / tp, h),
            Mem("shared_act", mm * ACT_BYTES * tokens * ffs / tp),
            Gemm("shared_down", tokens, h, ffs / tp),
        ]
    return plan


EXPERT_OPS = ("moe_multihot_sync", "moe_sort_chunks", "moe_expert_kernels", "expert_gemm_launches",
              "expert_fp8_cast", "expert_up", "expert_act", "expert_down", "moe_unsort_chunks")


def is_expert_op(name: str) -> bool:
    """True for the kernels that run between dispatch and combine (any direction)."""
    return any(name == e or name.startswith(e + "_") for e in EXPERT_OPS)


def grouped_linear_host_ops(nloc: int, precision: str) -> int:
    """Host ops of one Transformer Engine GroupedLinear forward over ``nloc`` local experts
    (multi-stream cuBLAS: one GEMM per expert), by precision (constants above)."""
    ops = GROUPED_LINEAR_OPS + GROUPED_LINEAR_PER_EXPERT_OPS * nloc
    if precision in ("mxfp8", "nvfp4"):
        return ops + GROUPED_LINEAR_BLOCK_QUANT_OPS + GROUPED_LINEAR_BLOCK_QUANT_PER_EXPERT_OPS * nloc
    if precision == "fp8":
        return ops + GROUPED_LINEAR_FP8_OPS + GROUPED_LINEAR_FP8_PER_EXPERT_OPS * nloc
    return ops + GROUPED_LINEAR_BF16_OPS


def bookkeeping_kernels(model: ModelConfig, par: ParallelConfig, moe: MoEConfig, precision: str,
                        router_fusion: bool = False, permute_fusion: bool = False) -> dict[str, tuple[int, int]]:
    """GPU kernels of one Megatron-core MoE layer that its priced ops leave out (constants above), as
    (forward, backward) per part: ``route`` (router, dispatcher metadata and the first permutation,
    before the dispatch) and ``expert`` (between dispatch and combine). Each priced op already
    counts one kernel, so a component priced by an op adds its kernels less one. The per-expert
    GEMM launches are not here (``grouped_gemm_launches``)."""
    nloc = local_experts(model, par)
    if router_fusion:
        fwd, bwd = ROUTER_TOPK_FUSED_KERNELS
    else:
        fwd = ROUTER_TOPK_KERNELS.get(model.scoring_func, ROUTER_TOPK_KERNELS["softmax"])
        bwd = ROUTER_TOPK_BWD_KERNELS.get(model.scoring_func, ROUTER_TOPK_BWD_KERNELS["softmax"])
    route = [fwd - 1, bwd - 1]
    if model.scoring_func == "sigmoid":
        route[0] += ROUTER_BIAS_KERNELS
    pf, pb = PERMUTE_KERNELS[permute_fusion]
    uf, ub = UNPERMUTE_KERNELS[permute_fusion]
    expert = [uf - 1, ub - 1]
    if moe.token_dispatcher == "flex":
        route[0] += FLEX_PREPROCESS_KERNELS
        mf, mb = FLEX_MULTIHOT_KERNELS
        # DeepEP permutes into its buffer; the permutation by local expert is moe_sort_chunks here
        expert[0] += mf + FLEX_NUM_OUT_KERNELS + pf - 1
        expert[1] += mb + pb - 1
    else:
        route[0] += A2A_PREPROCESS_KERNELS + pf - 1
        route[1] += pb - 1
        expert[0] += A2A_PROBS_KERNELS
        expert[1] += A2A_PROBS_KERNELS
        if nloc > 1:
            (sf, sb), (tf, tb) = SORT_CHUNKS_KERNELS[permute_fusion], UNSORT_CHUNKS_KERNELS[permute_fusion]
            expert[0] += sf - 1 + tf - 1
            expert[1] += sb - 1 + tb - 1
    if precision in QUANTIZED_PRECISIONS:
        expert[0] += GROUPED_MLP_QUANT_PAD_KERNELS
        expert[1] += GROUPED_MLP_QUANT_PAD_KERNELS
    return {"route": (route[0], route[1]), "expert": (expert[0], expert[1])}


def grouped_gemm_launches(model: ModelConfig, par: ParallelConfig, moe: MoEConfig) -> tuple[int, int]:
    """What the per-expert GEMMs of one GroupedLinear call add beyond the one kernel its op counts, as
    (launch gaps, kernels): on ``grouped_gemm_streams`` streams each stream runs ceil(nloc / streams)
    GEMMs one after another, so the call waits ceil(nloc / streams) - 1 more gaps and launches
    nloc - 1 more kernels; one grouped kernel (``streams`` None) adds neither. A layer makes two
    calls forward (fc1, fc2) and four backward (their dgrad and wgrad)."""
    nloc, streams = local_experts(model, par), moe.grouped_gemm_streams
    if not moe.grouped_gemm or streams is None or nloc <= 1:
        return 0, 0
    return math.ceil(nloc / streams) - 1, nloc - 1


def moe_host_ops(model: ModelConfig, par: ParallelConfig, moe: MoEConfig, precision: str,
                 router_fusion: bool = False, permute_fusion: bool = False) -> tuple[int, int]:
    """Host ops one MoE layer forward issues (Megatron-core, TEGroupedMLP), as (before, after) the
    token-count sync: the alltoall dispatcher syncs just before its all-to-all
    (``before_ep_alltoall``, token_dispatcher.py:538 and :637), DeepEP inside its dispatch. The
    shared expert runs first (moe_layer.py:261). ``router_fusion`` / ``permute_fusion`` are
    Megatron's ``moe_router_fusion`` / ``moe_permute_fusion`` (off by default there; no scenario key
    yet). The allgather dispatcher is counted as alltoall."""
    nloc = local_experts(model, par)
    multi = nloc > 1
    shared, router = _shared_and_router_ops(model, precision, router_fusion)
    permute = PERMUTE_FUSED_OPS if permute_fusion else PERMUTE_OPS
    unpermute = UNPERMUTE_FUSED_OPS if permute_fusion else UNPERMUTE_OPS
    experts = (GROUPED_MLP_OPS + (GROUPED_MLP_QUANT_PAD_OPS if precision in QUANTIZED_PRECISIONS else 0)
               + 2 * grouped_linear_host_ops(nloc, precision))
    if moe.token_dispatcher == "flex":
        before = shared + router + FLEX_PREPROCESS_OPS
        after = (FLEX_DISPATCH_OPS + FLEX_MULTIHOT_OPS + FLEX_NUM_OUT_OPS + permute + experts
                 + unpermute + FLEX_COMBINE_OPS)
    else:
        dtoh = A2A_DTOH_OPS + (A2A_DTOH_PER_TENSOR_OPS if multi and not permute_fusion else 0)
        before = (shared + router + A2A_PREPROCESS_OPS + (A2A_PREPROCESS_MULTI_EXPERT_OPS if multi else 0)
                  + dtoh + permute)
        # expert-TP all-gathers of tokens and probs (:660-668) and reduce-scatter with its casts (:753-757)
        etp_comm = (2 * COLLECTIVE_OPS + COLLECTIVE_OPS + 2) if par.expert_tp > 1 else 0
        sort = 0
        if multi:
            sort = (SORT_CHUNKS_FUSED_OPS + UNSORT_CHUNKS_FUSED_OPS if permute_fusion
                    else SORT_CHUNKS_OPS + UNSORT_CHUNKS_OPS)
        after = 3 * COLLECTIVE_OPS + etp_comm + sort + experts + unpermute
    if shared:
        after += SHARED_ADD_OPS
    return before, after


def graphed_routing_ops(model: ModelConfig, par: ParallelConfig, moe: MoEConfig, precision: str) -> int:
    """Host ops before the sync that a ``moe_router`` + ``moe_preprocess`` CUDA graph replays in one
    launch: the shared expert (captured with the router), the router and the dispatcher's metadata
    preprocessing (``moe_host_ops``; the alltoall dispatcher's device-to-host copies and permutation
    stay outside, as no graph can hold the sync they feed)."""
    shared, router = _shared_and_router_ops(model, precision)
    if moe.token_dispatcher == "flex":
        return shared + router + FLEX_PREPROCESS_OPS
    return (shared + router + A2A_PREPROCESS_OPS
            + (A2A_PREPROCESS_MULTI_EXPERT_OPS if local_experts(model, par) > 1 else 0))


def _shared_and_router_ops(model: ModelConfig, precision: str, router_fusion: bool = False) -> tuple[int, int]:
    """Host ops of the shared expert and of the router (gate, top-k, expert bias), constants above."""
    shared = 0
    if model.num_shared_experts:
        shared = SHARED_EXPERT_OPS + (SHARED_EXPERT_QUANT_OPS if precision in QUANTIZED_PRECISIONS else 0)
    router = ROUTER_GATE_OPS + (ROUTER_TOPK_FUSED_OPS if router_fusion
                                else ROUTER_TOPK_OPS.get(model.scoring_func, ROUTER_TOPK_OPS["softmax"]))
    if model.scoring_func == "sigmoid":
        router += ROUTER_BIAS_OPS
    return shared, router


def host_sync_time(gpu_before_s: float, gpu_after_s: float, ops_before: int, ops_after: int,
                   host_op_s: float = HOST_OP_S) -> float:
    """Stall of one dropless host sync: the round trip, plus what the GPU waits for the host between
    two syncs. After the sync the GPU is idle, so the ops after it (the rest of the MoE layer) are
    issued with no run-ahead: the GPU waits for whatever of their issue time their GPU time does not
    cover. Any GPU time they leave over is a head start for the ops before the next sync (the next
    layer's attention and routing), which stall only beyond it."""
    late = ops_after * host_op_s - gpu_after_s
    head_start = max(0.0, -late)
    return HOST_SYNC_S + max(0.0, late) + max(0.0, ops_before * host_op_s - gpu_before_s - head_start)


def expected_destinations(slots: int, topk: int) -> float:
    """Distinct destinations hit by top-k choices spread uniformly over ``slots``:
    slots x (1 - (1 - 1/slots)^topk)."""
    if slots <= 1:
        return 1.0
    return slots * (1.0 - (1.0 - 1.0 / slots) ** topk)


def dispatch_bytes(model: ModelConfig, tokens: float, par: ParallelConfig, moe: MoEConfig, ep_nodes: int) -> float:
    """Payload one rank sends (and receives) in one dispatch or combine, per micro-batch and layer.

    alltoall: T' x top-k x h x 2 bytes, T' = T / tp the rank's sequence-parallel shard (Megatron-core
    dispatches after the SP split and all-gathers within the expert-TP group afterwards; tokens x
    top-k x hidden x bytes); allgather: every rank gathers the EP group's tokens, as an
    all-to-all of ep x T' x h x 2 bytes; flex (DeepEP): one copy per destination rank within a
    node, one per destination node across nodes (``expected_destinations`` over min(nodes,
    max_nodes_per_token) nodes). Dropless, the busiest rank moves ``imbalance`` times the mean;
    padded to capacity, capacity_factor times.
    """
    h, topk = model.hidden_size, model.num_experts_per_tok
    t = tokens / par.tp
    if moe.token_dispatcher == "allgather":
        per_token = par.ep
    elif moe.token_dispatcher == "flex":
        if ep_nodes > 1:
            nodes = min(ep_nodes, moe.max_nodes_per_token or ep_nodes)
            per_token = min(topk, expected_destinations(nodes, topk))
        else:
            per_token = expected_destinations(par.ep, topk)
    else:
        per_token = topk
    scale = moe.capacity_factor if moe.capacity_factor is not None else moe.imbalance
    return t * per_token * h * ACT_BYTES * scale


def a2a_efficiency(moe: MoEConfig, ep_nodes: int, nvlink_efficiency: float = 1.0, nvlink_generation: int = 4,
                   ep: int = 8) -> float:
    """Achieved fraction of the modelled link rate for the EP all-to-all (constants above), by
    dispatcher, flex backend, NVLink generation and the nodes (or, in one NVLink domain, the ranks)
    of the EP group. NVLink figures are fractions of the nominal rate, so they are divided by the
    share of it the cluster's NVLink links already carry (``GPUSpec.nvlink_efficiency``), and never
    above 1."""
    if moe.token_dispatcher == "flex":
        hybrid = moe.flex_backend == "hybridep"
        if ep_nodes > 1:
            table = HYBRIDEP_RDMA_EFFICIENCY if hybrid else DEEPEP_RDMA_EFFICIENCY
            return table[2 if ep_nodes <= 2 else 4 if ep_nodes <= 4 else 8]
        if nvlink_generation >= 5:
            link = HYBRIDEP_NVLINK5_EFFICIENCY[8 if ep <= 8 else 16] if hybrid else DEEPEP_NVLINK5_EFFICIENCY
        else:
            link = DEEPEP_NVLINK_EFFICIENCY
        return min(1.0, link / nvlink_efficiency)
    if ep_nodes > 1:
        return NCCL_A2A_NET_EFFICIENCY
    return min(1.0, NCCL_A2A_NVLINK_EFFICIENCY / nvlink_efficiency)


def ep_nodes(par: ParallelConfig, gpus_per_node: int) -> int:
    """Nodes one EP group spans: ep x etp consecutive ranks (Megatron-core MoE parallel folding)."""
    return max(1, math.ceil(par.ep * par.expert_tp / gpus_per_node))


def split_moe_block(block):
    """An MoE block (forward or backward) as (before dispatch, experts, after combine)."""
    names = [op.name for op in block.ops]
    idx = [i for i, n in enumerate(names) if is_expert_op(n.removesuffix("_bwd").removesuffix("_dgrad")
                                                         .removesuffix("_wgrad"))]
    if not idx:
        return block, BlockCost(), BlockCost()
    a, b = idx[0], idx[-1] + 1
    return BlockCost(block.ops[:a]), BlockCost(block.ops[a:b]), BlockCost(block.ops[b:])


def glu_tail_ops(model: ModelConfig, par: ParallelConfig, moe: MoEConfig, precision: str) -> int:
    """Host ops ``moe_host_ops`` counts after the token-count sync that Megatron-core issues after
    its GLU offset copy: fc2, the reorder back, the unpermutation and the combine."""
    nloc = local_experts(model, par)
    ops = grouped_linear_host_ops(nloc, precision) + UNPERMUTE_OPS
    if moe.token_dispatcher == "flex":
        return ops + FLEX_COMBINE_OPS
    return ops + COLLECTIVE_OPS + (UNSORT_CHUNKS_OPS if nloc > 1 else 0) + (COLLECTIVE_OPS + 2 if par.expert_tp > 1 else 0)


def glu_path_ops(model: ModelConfig, par: ParallelConfig) -> tuple[int, int]:
    """Host ops Megatron-core's clamped GLU adds to an MoE forward beyond ``moe_host_ops``, before
    and after its offset copy: the clamps and the copy; the activation and the expert-bias loop."""
    bias = EXPERT_BIAS_OPS + EXPERT_BIAS_PER_EXPERT_OPS * local_experts(model, par) if model.expert_bias else 0
    return GLU_PRE_SYNC_OPS, GLU_ACT_OPS + bias


def with_glu_sync(mlp_fwd):
    """``mlp_fwd`` with a zero-time ``moe_glu_sync`` placeholder before the experts' activation,
    priced by ``price_host_sync``."""
    names = [op.name for op in mlp_fwd.ops]
    if "expert_act" not in names:
        return mlp_fwd
    i = names.index("expert_act")
    return BlockCost(mlp_fwd.ops[:i] + (Op("moe_glu_sync", 0.0, 0.0, 0.0),) + mlp_fwd.ops[i:])


def _priced(block, name: str, time_s: float):
    """``block`` with its zero-time placeholder op ``name`` (a host sync) given ``time_s``."""
    return BlockCost(tuple(Op(name, 0.0, 0.0, time_s) if op.name == name else op for op in block.ops))


def recompute_glu_sync(block, host_overhead: float = 1.0):
    """The GLU sync as ``moe_act`` recompute meets it inside the backward: the round trip and one
    op's issue before the GPU has work again (the backward GEMMs after it outlast their issue)."""
    return _priced(block, "moe_glu_sync", HOST_SYNC_S + HOST_OP_S * host_overhead)


def _price_multihot_syncs(mlp_fwd, host_op: float):
    """``mlp_fwd`` with its ``moe_multihot_sync`` placeholder priced: each of the ``MULTIHOT_SYNCS``
    reads back to the host finds the GPU drained (the dispatch before them has finished), so the
    GPU waits for every round trip and for the host's issue of the conversion's
    ``FLEX_MULTIHOT_OPS`` ops, less what its kernels (in ``moe_expert_kernels``) ran meanwhile."""
    if not any(op.name == "moe_multihot_sync" for op in mlp_fwd.ops):
        return mlp_fwd
    small = next((op for op in mlp_fwd.ops if op.name == "moe_expert_kernels"), None)
    kernel_s = small.time_s / small.kernels if small is not None and small.kernels else 0.0
    t = MULTIHOT_SYNCS * HOST_SYNC_S + max(0.0, FLEX_MULTIHOT_OPS * host_op - FLEX_MULTIHOT_KERNELS[0] * kernel_s)
    return _priced(mlp_fwd, "moe_multihot_sync", t)


def price_host_sync(attn_fwd, mlp_fwd, model: ModelConfig, par: ParallelConfig, moe: MoEConfig, precision: str,
                    host_overhead: float = 1.0, graph_scope: tuple[str, ...] = (),
                    fusions: tuple[bool, bool, bool] | None = None):
    """``mlp_fwd`` with its zero-time ``moe_host_sync`` placeholder priced by ``host_sync_time``
    over one layer forward (attention and MoE block), split at the sync. The shared expert runs
    before the router in Megatron-core (moe_layer.py:261), so its GPU time counts before the sync
    wherever the plan lists it."""
    names = [op.name for op in mlp_fwd.ops]
    priced = _price_multihot_syncs(mlp_fwd, HOST_OP_S * host_overhead)
    if "moe_host_sync" not in names:
        return priced
    i = names.index("moe_host_sync")
    moe_names = {"router", "router_topk", "moe_permute", "moe_unpermute", "moe_route_kernels"}

    def is_moe(name):
        return name in moe_names or is_expert_op(name) or name.startswith("shared_")

    before = list(mlp_fwd.ops[:i]) + [op for op in mlp_fwd.ops[i + 1:] if op.name.startswith("shared_")]
    after = [op for op in mlp_fwd.ops[i + 1:] if not op.name.startswith("shared_")]
    # the attention block's and the layer's other priced ops issue one host op each, beside the
    # MoE layer's counted ops
    moe_before, moe_after = moe_host_ops(model, par, moe, precision, *(fusions or (False, False))[:2])
    if "moe_multihot_sync" in names:  # issued between those syncs, priced there
        moe_after -= FLEX_MULTIHOT_OPS
    if routing_graphed(graph_scope):  # replayed in one graph launch ("moe" has no sync: no placeholder)
        moe_before -= graphed_routing_ops(model, par, moe, precision) - 1
    attn_ops = 1 if "attn" in graph_scope else len(attn_fwd.ops)
    ops_before = attn_ops + sum(1 for op in mlp_fwd.ops[:i] if not is_moe(op.name)) + moe_before
    ops_after = sum(1 for op in after if not is_moe(op.name)) + moe_after
    host_op = HOST_OP_S * host_overhead
    gpu_before = attn_fwd.time_s + sum(op.time_s for op in before)
    glu = [k for k, op in enumerate(after) if op.name == "moe_glu_sync"]
    if not glu:
        t = host_sync_time(gpu_before, sum(op.time_s for op in after), ops_before, ops_after, host_op)
        return _priced(priced, "moe_host_sync", t)
    # a second sync splits the run after the first: the GPU waits for the host's issue of the ops up
    # to the copy (any head start is lost at the sync), then of the rest, whose spare GPU time is
    # the head start for the next layer's ops before the token-count sync
    tail = glu_tail_ops(model, par, moe, precision)
    pre, post = glu_path_ops(model, par)
    plain_late = sum(1 for op in after[glu[0] + 1:] if not is_moe(op.name))
    late_ops = tail + post + plain_late
    early_ops = ops_after - 1 - plain_late - tail + pre  # ops_after counted the placeholder as one
    early_gpu = sum(op.time_s for op in after[:glu[0]])
    t = HOST_SYNC_S + max(0.0, early_ops * host_op - early_gpu)
    t_glu = host_sync_time(gpu_before, sum(op.time_s for op in after[glu[0] + 1:]), ops_before, late_ops, host_op)
    return _priced(_priced(priced, "moe_glu_sync", t_glu), "moe_host_sync", t)
