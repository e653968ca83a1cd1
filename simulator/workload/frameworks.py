"""A scenario's framework behaviour, resolved: its profile (``simulator.parts.frameworks``) with
the scenario's overrides, as one :class:`Software` value.

The engine and the cost models read the resolved :class:`Software` value only; nothing branches
on a framework's name.

Resolution: the profile's defaults, then the scenario's ``framework_options`` and ``overlap``
keys (each overrides the profile's value).
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.parts.frameworks import load_profile


def routing_graphed(scope: tuple[str, ...]) -> bool:
    """Whether an MoE layer's router and EP preprocess replay from a CUDA graph: captured with the
    whole layer (``moe``) or as ``moe_router`` with ``moe_preprocess``."""
    return "moe" in scope or {"moe_router", "moe_preprocess"} <= set(scope)


@dataclass(frozen=True)
class Software:
    """The resolved behaviour of one framework for one scenario (SI units)."""

    framework: str
    tp_comm: bool
    grad_reduce: bool
    param_gather: bool
    param_prefetch_depth: int
    async_tp: bool
    cp_comm: bool
    fused_norm: bool
    fused_rope: bool
    fused_activation: bool
    compile: bool
    cuda_graphs: bool
    graph_scope: tuple[str, ...]  # modules replayed from CUDA graphs when not the whole iteration
    host_issue_s: float  # CPU time to issue one kernel (0 when replayed from a CUDA graph)
    fp8_recipe: str
    fp8_casts_fused: bool  # casts of norm / activation outputs fused into those kernels (TE)
    fp8_weight_cast_once: bool  # FP8 weights cached over the step's micro-batches (TE is_first_microbatch)
    adam_bytes_per_param: float
    clip_bytes_per_param: float
    zero_grad_bytes_per_param: float
    # HBM bytes a weight-gradient GEMM's output moves per weight element and micro-batch: 2 writes a
    # fresh 16-bit gradient; 8 reads and writes an fp32 main_grad in the GEMM (fused accumulation)
    wgrad_bytes_per_param: float = 2.0
    # HBM bytes per weight element and micro-batch of the passes outside the GEMMs
    # (software.weight_passes): the forward's cast of each weight (autocast over fp32 weights), the
    # backward's pass over each fresh gradient (a cast to the parameter's dtype, an add into a
    # zeroed accumulator), and the in-place accumulation into the existing gradient on every
    # micro-batch but the first
    weight_cast_bytes_per_param: float = 0.0
    grad_cast_bytes_per_param: float = 0.0
    grad_accumulate_bytes_per_param: float = 0.0
    # FP8 GEMMs keep their quantized input for the backward (1 byte per element, memory.layer_activation_bytes)
    fp8_saves_quantized_inputs: bool = False
    # the LM head's GEMMs quantized like the layers' (False: they run 16-bit, ``compute.head_cost``)
    fp8_lm_head_quantized: bool = False
    selective_recompute: str = "attention_core"  # what training.recompute: selective re-runs (SELECTIVE_POLICIES)
    attention_kernel: str = "cudnn"  # the fused kernel training.attention: flash runs (simulator.workload.attention)
    cp_comm_type: str = "p2p"  # how K/V cross the CP group: ring (p2p) or gathered first (all_gather)
    kv_heads_expanded: bool = False  # K/V repeated to the query heads before the attention call (GQA not native)
    cp_merge: str = "te"  # how the CP partial outputs and gradients are combined (software.cp_merge_bytes)
    # ZeRO-3 with pipeline parallelism: parameters gathered once per step and kept unsharded over the
    # micro-batches, gradients reduce-scattered after each chunk's last backward (torch pipelining)
    fsdp_pipeline_unsharded: bool = False
    # hybrid sharding: the cross-copy gradient all-reduces combined into groups of up to this many
    # bytes per GPU, each launched when its last gradient exists (0: one all-reduce per FSDP unit)
    fsdp_replica_combine_bytes: float = 0.0
    # ZeRO-3 with full recompute: after its recompute forward a module's gathered parameters are
    # released unless they are used again within this many parameters, and gathered again for its
    # backward (DeepSpeed's stage3_max_reuse_distance); 0: the unit stays gathered from the gather
    # before its recompute through its backward (FSDP)
    fsdp_release_reuse_distance: float = 0.0
    # ZeRO-3 parameters fetched module by module, the upcoming ones prefetched in all-gather calls of
    # at least this many parameters (DeepSpeed's stage3_prefetch_bucket_size); 0: one all-gather
    # per unit (FSDP, Megatron-FSDP) (``compute.module_gather_calls``)
    fsdp_gather_bucket_params: float = 0.0
    # ZeRO-3 gradients reduce-scattered in buckets of at most this many parameters (DeepSpeed's
    # reduce_bucket_size); 0: one reduce-scatter per unit (``compute.bucket_reduce_calls``)
    fsdp_reduce_bucket_params: float = 0.0
    megatron_layers: bool = True  # the layers are Megatron-core's (profile model.code)
    te_op_fuser: bool = False  # framework_options.te_op_fuser: the experts as one TE fused op
    # framework_options.moe_router_fusion / moe_permute_fusion (Megatron-core's, off by default)
    moe_router_fusion: bool = False
    moe_permute_fusion: bool = False
    enable_experimental: bool = False  # framework_options.enable_experimental (Megatron-core's, off by default)
    cross_entropy: str = "megatron"  # the loss implementation (CROSS_ENTROPY_IMPLS)
    grad_collective: str = "reduce_scatter"  # ZeRO-1/2's gradient collective (GRAD_COLLECTIVES)
    # ZeRO-2 reduces the gradients in every micro-batch's backward, not only in the last one's
    zero2_reduce_every_microbatch: bool = False
    gelu_new: str = "kernel"  # how model.hidden_act gelu_new runs (GELU_NEW_IMPLS); torch.compile fuses it
    # parameters per data-parallel gradient bucket (torch DDP's bucket_cap_mb over the gradients'
    # dtype); 0: Megatron-core's sizing (``memory.ddp_bucket_params``)
    ddp_bucket_params: float = 0.0
    unfused_softmax: str = "fused"  # how training.attention: unfused normalises the scores (UNFUSED_SOFTMAX)
    nccl_ub: bool = False  # data-parallel buffers registered with NCCL (FrameworkOptions.nccl_ub)


def _pick(override, default):
    return default if override is None else override


def resolve(s) -> Software:
    """The scenario's framework profile with its ``framework_options`` and ``overlap`` overrides."""
    prof = load_profile(s.framework)
    ov, opt = s.overlap, s.framework_options
    po, ex = prof["overlap"], prof["execution"]
    compile_ = bool(_pick(opt.compile, ex["compile"]))
    graphs = bool(_pick(opt.cuda_graphs, ex["cuda_graphs"]))
    issue_us = 0.0 if graphs else float(ex["compiled_host_issue_us"] if compile_ else ex["host_issue_us"])
    fu, f8, op = prof["fusion"], prof["fp8"], prof["optimizer"]
    return Software(
        framework=s.framework,
        tp_comm=bool(_pick(ov.tp_comm, po["tp_comm"])),
        grad_reduce=bool(_pick(ov.grad_reduce, po["grad_reduce"])),
        param_gather=bool(_pick(ov.param_gather, po["param_gather"])),
        param_prefetch_depth=int(_pick(ov.param_prefetch_depth, po["param_prefetch_depth"])),
        async_tp=bool(_pick(ov.async_tp, po["async_tp"])),
        cp_comm=bool(_pick(ov.cp_comm, po["cp_comm"])),
        fused_norm=bool(fu["norm"]) or compile_,
        fused_rope=bool(fu["rope"]) or compile_,
        fused_activation=bool(fu["activation"]) or compile_,
        compile=compile_,
        cuda_graphs=graphs,
        graph_scope=() if graphs else tuple(opt.cuda_graph_scope or ()),
        host_issue_s=issue_us * 1e-6,
        fp8_recipe=str(_pick(opt.fp8_recipe, f8["recipe"])),
        fp8_casts_fused=bool(f8["casts_fused_into_producers"]),
        fp8_weight_cast_once=bool(f8["weight_cast_once_per_step"]),
        fp8_saves_quantized_inputs=bool(f8["saves_quantized_inputs"]),
        fp8_lm_head_quantized=bool(f8["lm_head_quantized"]),
        adam_bytes_per_param=float(op["adam_bytes_per_param"]),
        clip_bytes_per_param=float(op["clip_bytes_per_param"]),
        zero_grad_bytes_per_param=float(op["zero_grad_bytes_per_param"]),
        wgrad_bytes_per_param=float(op["wgrad_bytes_per_param"]),
        weight_cast_bytes_per_param=float(op["weight_cast_bytes_per_param"]),
        grad_cast_bytes_per_param=float(op["grad_cast_bytes_per_param"]),
        grad_accumulate_bytes_per_param=float(op["grad_accumulate_bytes_per_param"]),
        selective_recompute=str(_pick(opt.selective_recompute, prof["recompute"]["selective"])),
        attention_kernel=prof["attention"]["kernel"],
        cp_comm_type=s.parallelism.cp_comm_type or prof["attention"]["cp_comm_type"],
        kv_heads_expanded=bool(prof["attention"]["kv_heads_expanded"]),
        cp_merge=prof["attention"]["cp_merge"],
        fsdp_pipeline_unsharded=bool(prof["fsdp"]["pipeline_unsharded"]),
        fsdp_replica_combine_bytes=float(_pick(opt.replica_combine_bytes, prof["fsdp"]["replica_combine_bytes"])),
        fsdp_release_reuse_distance=float(prof["fsdp"]["release_reuse_distance"]),
        fsdp_gather_bucket_params=float(prof["fsdp"]["gather_bucket_params"]),
        fsdp_reduce_bucket_params=float(prof["fsdp"]["reduce_bucket_params"]),
        megatron_layers=prof["model"]["code"] == "megatron-core",
        te_op_fuser=bool(opt.te_op_fuser),
        moe_router_fusion=bool(opt.moe_router_fusion),
        moe_permute_fusion=bool(opt.moe_permute_fusion),
        enable_experimental=bool(opt.enable_experimental),
        cross_entropy=str(_pick(opt.cross_entropy, fu["cross_entropy_compiled"] if compile_ else fu["cross_entropy"])),
        grad_collective=str(_pick(opt.grad_collective, prof["data_parallel"]["grad_collective"])),
        zero2_reduce_every_microbatch=bool(prof["data_parallel"]["zero2_reduce_every_microbatch"]),
        gelu_new="kernel" if compile_ else str(fu["gelu_new"]),
        ddp_bucket_params=float(prof["data_parallel"]["ddp_bucket_params"]),
        unfused_softmax="fused" if compile_ else str(prof["attention"]["unfused_softmax"]),
        nccl_ub=bool(opt.nccl_ub),
    )


def fsdp_gathered_once(s, sw: Software | None = None) -> bool:
    """Whether ZeRO-3 keeps each layer gathered over a pipeline's micro-batches: zero_stage 3, pp > 1
    and a framework whose profile says so (``fsdp.pipeline_unsharded``; ``sw`` is the resolved
    profile when the caller has it, else it is resolved here, only when the layout can need it)."""
    par = s.parallelism
    if par.zero_stage != 3 or par.pp == 1:
        return False
    return (sw or resolve(s)).fsdp_pipeline_unsharded


def moe_fusions(sw: Software) -> tuple[bool, bool, bool] | None:
    """(moe_router_fusion, moe_permute_fusion, fused multihot) when Megatron-core runs the layers,
    whose MoE code ``simulator.workload.moe`` counts; None for another framework's. The third: the
    DeepEP path's fused_indices_to_multihot, which Megatron-core takes only with both
    --enable-experimental and moe_permute_fusion (token_dispatcher.py, 402bc50 and d0b3b775)."""
    if not sw.megatron_layers:
        return None
    return sw.moe_router_fusion, sw.moe_permute_fusion, sw.enable_experimental and sw.moe_permute_fusion
