"""An MoE layer as Megatron-core runs it on one GPU: its kernels, and its all-to-all payloads.

Pure functions of the model, the parallel layout and the ``moe:`` scenario section
(:class:`simulator.config.MoEConfig`). ``moe_steps`` returns the layer's kernels in forward order;
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
  idles for the sync round trip and for the CPU run-ahead the sync throws away: until the next
  sync the host must issue every op of a layer forward at ``HOST_OP_S`` each, and whatever of
  that issue time the GPU work of the layer does not cover stalls the stream. With
  ``capacity_factor`` (drop and pad to capacity, static shapes) there is no sync.
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

All-to-all payload (``dispatch_bytes``), per rank per MoE layer, direction-independent: routed
copies x h x 2 bytes (tokens x top-k x hidden x bytes) with the alltoall dispatcher; the flex
(DeepEP) dispatcher sends a token once per destination rank inside a node and once per
destination node across nodes (forwarding over NVLink there), which with node-limited routing
(``max_nodes_per_token``, DeepSeek-V3: 4) is at most that many nodes; the allgather dispatcher
gathers every token of the EP group. The busiest rank's payload scales with ``imbalance``.
"""

from __future__ import annotations

import math

from simulator.config import ModelConfig, MoEConfig, ParallelConfig

ACT_BYTES = 2
SCORE_BYTES = 4
ROUTER_PASSES = 4
# CPU time to issue one PyTorch op (Python, autograd, ATen dispatch and the kernel launch):
# "~5-25 us of CPU-side work per op" (J. Lin, "From PyTorch op to kernel launch", lesson 18 of
# GPU kernels for serving); 10 us, the low-middle of that range, for a C++-heavy training loop.
HOST_OP_S = 10e-6
# A device-to-host copy of the token counts and the stream synchronisation that waits for it:
# one more host round trip of the same order as an op's issue time.
HOST_SYNC_S = 10e-6
# Host ops per local expert and forward GEMM that Transformer Engine's GroupedLinear issues (the
# per-expert split of the input by the host-side token counts, and its quantisation under fp8).
HOST_OPS_PER_EXPERT = 1
# Concurrent compute streams Transformer Engine's multi_stream_cublas_gemm spreads per-expert GEMMs
# over (transformer_engine/common/util/multi_stream.cpp get_num_compute_streams: 4).
TE_GEMM_STREAMS = 4
# Achieved fraction of the nominal per-direction link rate in an EP all-to-all:
# DeepEP (docs/legacy.md, H800 with ~160 GB/s usable NVLink and CX7 400 Gb/s): intranode EP8
# dispatch 153 / combine 158 GB/s on H800's 200 GB/s per direction -> 0.78; internode EP16
# 43 GB/s of ~50 GB/s -> 0.86, EP32/64 50-58 GB/s (the NIC's rate) -> 1.0.
# NCCL all-to-all across nodes: "CX-7 NICs at NDR rate should achieve up to 48-49 GB/s per NIC"
# (NVIDIA/nccl-tests issue 267, NVIDIA) -> 0.97. Within a node: "450GB/s is the line rate. With
# the protocol overhead (~20%) NCCL can get an effective NVLink bandwidth of 370GB/s, which you
# can observe as BusBw when running non-allreduce operations" (S. Jeaugey, NCCL, NVIDIA/nccl-tests
# issue 212, DGX H100) -> 370 / 450 of the nominal rate. Only NVLS all-reduce gets above it, which
# is why the cluster's Hopper NVLink links carry the nominal rate (hardware._HOPPER_NVLINK); the
# all-to-all is charged the difference (a GPU whose links already carry less, A100's 0.80, pays
# nothing more). Measured on NVLink 4; taken as the same protocol share on NVLink 5.
DEEPEP_NVLINK_EFFICIENCY = 155.5 / 200
DEEPEP_RDMA_EFFICIENCY = {2: 43 / 50}  # by nodes in the EP group; 1.0 from 4 nodes on
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


def host_sync_needed(moe: MoEConfig) -> bool:
    """Dropless routing syncs the token counts to the host; padding to capacity does not."""
    return moe.capacity_factor is None


def moe_steps(model: ModelConfig, tokens: float, tokens_norm: float, par: ParallelConfig, moe: MoEConfig,
              precision: str) -> list:
    """The MoE layer's kernels after the pre-MLP norm, in forward order (see the module docstring).

    The host sync is priced afterwards by ``price_host_sync`` once the layer's GPU time is known;
    here it is a zero-time placeholder holding its place in the order.
    """
    from simulator.workload.compute import _Gemm, _Latency, _Mem

    h, tp, mm = model.hidden_size, par.tp, model.mlp_matrices
    experts, etp = model.num_experts, par.expert_tp
    ffe = model.expert_intermediate_size
    nloc = local_experts(model, par)
    copies = routed_copies(model, tokens, par, moe)
    per_expert = copies / nloc
    router_passes = ROUTER_PASSES + (1 if model.norm_topk_prob else 0)
    score_bytes = SCORE_BYTES if moe.router_dtype == "fp32" else ACT_BYTES
    plan: list = [
        _Gemm("router", tokens_norm, experts, h),
        _Mem("router_topk", router_passes * score_bytes * tokens_norm * experts),
    ]
    flex = moe.token_dispatcher == "flex"
    gathered = tokens * par.ep if moe.token_dispatcher == "allgather" else tokens
    if not flex:
        plan.append(_Mem("moe_permute", ACT_BYTES * (gathered + copies) * h))
    if host_sync_needed(moe):
        plan.append(_Latency("moe_host_sync", 0.0))
    sort = flex or (moe.token_dispatcher == "alltoall" and nloc > 1)
    if sort:
        plan.append(_Mem("moe_sort_chunks", 2 * ACT_BYTES * copies * h))
    if precision == "fp8":
        plan.append(_Mem("expert_fp8_cast", 3 * copies * (h + ffe / etp)))
    if moe.grouped_gemm:
        streams = moe.grouped_gemm_streams
        plan += [
            _Gemm("expert_up", per_expert, (mm - 1) * ffe / etp, h, nloc, streams),
            _Mem("expert_act", mm * ACT_BYTES * copies * ffe / etp),
            _Gemm("expert_down", per_expert, h, ffe / etp, nloc, streams),
        ]
    else:
        for e in range(nloc):
            plan.append(_Gemm(f"expert_up_{e}", per_expert, (mm - 1) * ffe / etp, h))
        plan.append(_Mem("expert_act", mm * ACT_BYTES * copies * ffe / etp))
        for e in range(nloc):
            plan.append(_Gemm(f"expert_down_{e}", per_expert, h, ffe / etp))
    if sort:
        plan.append(_Mem("moe_unsort_chunks", 2 * ACT_BYTES * copies * h))
    plan.append(_Mem("moe_unpermute", ACT_BYTES * (2 * copies + gathered) * h))
    if model.num_shared_experts:
        ffs = model.num_shared_experts * ffe
        plan += [
            _Gemm("shared_up", tokens, (mm - 1) * ffs / tp, h),
            _Mem("shared_act", mm * ACT_BYTES * tokens * ffs / tp),
            _Gemm("shared_down", tokens, h, ffs / tp),
        ]
    return plan


EXPERT_OPS = ("moe_sort_chunks", "expert_fp8_cast", "expert_up", "expert_act", "expert_down", "moe_unsort_chunks")


def is_expert_op(name: str) -> bool:
    """True for the kernels that run between dispatch and combine (any direction)."""
    return any(name == e or name.startswith(e + "_") for e in EXPERT_OPS)


def host_ops_per_layer(model: ModelConfig, par: ParallelConfig, moe: MoEConfig, precision: str, kernels: int) -> int:
    """Host ops one layer forward issues: one per kernel, the all-to-alls, and the per-expert
    splits (and casts under fp8) of Transformer Engine's grouped linear layers."""
    per_expert = HOST_OPS_PER_EXPERT * (2 if precision == "fp8" else 1)
    return kernels + 2 + 2 * local_experts(model, par) * per_expert


def host_sync_time(gpu_time_s: float, host_ops: int) -> float:
    """Stall of one dropless host sync: the round trip, plus the issue time of a layer's host ops
    that its GPU time does not cover (the run-ahead the sync discarded)."""
    return HOST_SYNC_S + max(0.0, host_ops * HOST_OP_S - gpu_time_s)


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


def a2a_efficiency(moe: MoEConfig, ep_nodes: int, nvlink_efficiency: float = 1.0) -> float:
    """Achieved fraction of the modelled link rate for the EP all-to-all (constants above); the
    NCCL NVLink figure is a fraction of the nominal rate, so it is divided by the share of it the
    cluster's NVLink links already carry (``GPUSpec.nvlink_efficiency``), and never above 1."""
    if moe.token_dispatcher == "flex":
        if ep_nodes <= 1:
            return DEEPEP_NVLINK_EFFICIENCY
        return DEEPEP_RDMA_EFFICIENCY.get(ep_nodes, 1.0)
    if ep_nodes > 1:
        return NCCL_A2A_NET_EFFICIENCY
    return min(1.0, NCCL_A2A_NVLINK_EFFICIENCY / nvlink_efficiency)


def ep_nodes(par: ParallelConfig, gpus_per_node: int) -> int:
    """Nodes one EP group spans: ep x etp consecutive ranks (Megatron-core MoE parallel folding)."""
    return max(1, math.ceil(par.ep * par.expert_tp / gpus_per_node))


def split_moe_block(block):
    """An MoE block (forward or backward) as (before dispatch, experts, after combine)."""
    from simulator.workload.compute import BlockCost

    names = [op.name for op in block.ops]
    idx = [i for i, n in enumerate(names) if is_expert_op(n.removesuffix("_bwd").removesuffix("_dgrad")
                                                         .removesuffix("_wgrad"))]
    if not idx:
        return block, BlockCost(), BlockCost()
    a, b = idx[0], idx[-1] + 1
    return BlockCost(block.ops[:a]), BlockCost(block.ops[a:b]), BlockCost(block.ops[b:])


def price_host_sync(attn_fwd, mlp_fwd, model: ModelConfig, par: ParallelConfig, moe: MoEConfig, precision: str):
    """``mlp_fwd`` with its zero-time ``moe_host_sync`` placeholder priced by ``host_sync_time``
    over one layer forward (attention and MoE block)."""
    from simulator.workload.compute import BlockCost, Op

    names = [op.name for op in mlp_fwd.ops]
    if "moe_host_sync" not in names:
        return mlp_fwd
    kernels = len(attn_fwd.ops) + len(mlp_fwd.ops) - 1
    ops = host_ops_per_layer(model, par, moe, precision, kernels)
    t = host_sync_time(attn_fwd.time_s + mlp_fwd.time_s, ops)
    i = names.index("moe_host_sync")
    return BlockCost(mlp_fwd.ops[:i] + (Op("moe_host_sync", 0.0, 0.0, t),) + mlp_fwd.ops[i + 1:])
