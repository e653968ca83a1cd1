"""Which kernel class each op of the workload is, and a workload priced with calibration factors.

The classes are the trace classifier's (``simulator.calibrate.kineto.classify``), so that an op and
the kernel a PyTorch profile records for it land in the same class; ``OP_CLASSES`` is the one
mapping from stepsim's op names to them, and the tests hold that every op name a workload can
produce has a class. Where a name alone would mislead, the class is the kernel the reference stack
(Megatron-core with Transformer Engine, PyTorch's own kernels elsewhere) runs for the op:

- the unfused attention's Q K^T and P V are batched cuBLAS GEMMs (``gemm``), its scale-mask-softmax
  is a softmax kernel, which the classifier files under ``attention``, and its dropout is
  ``elementwise``;
- the context-parallel merge of partial attention outputs is Transformer Engine's correction
  kernels inside the attention call (``attention``);
- residual adds, activations, RoPE, FP8/MXFP8 quantize and cast kernels, MoE permutations and the
  router's top-k are memory-bound pointwise or gather kernels (``elementwise``);
- ``zero_grad`` is the gradient buffer's ``zero_()``, a fill kernel (``elementwise``), not part of
  the fused optimizer; ``grad_norm`` is the multi-tensor L2 norm of clipping (``optimizer``);
- ``expert_gemm_launches`` are the per-expert GEMMs' launch gaps (``gemm``);
- the MoE host syncs (``HOST_WAIT_OPS`` and the multihot conversion's) are the GPU waiting on the
  host, not a kernel: class ``host``, never calibrated.

An op's name is its step's name plus suffixes: ``_quantize``/``_quantize_bwd`` (its FP8 input
cast, ``elementwise``), ``_dgrad``/``_wgrad``/``_bwd`` (backward), ``_part`` (a share re-run by
selective recompute), ``_<e>`` (one expert's GEMM), and ``mtp_`` before it in the MTP modules.

Calibration (``calibrated``) divides each op's time by the factor of its class, or for a GEMM whose
shape the calibration measured, by that shape's factor; the cost models stay as they are and the
factors come in as data, the scenario's ``calibration`` record.
"""

from __future__ import annotations

import re
from dataclasses import replace

from simulator.parts.calibration import Calibration
from simulator.workload.kernels import BlockCost, LayerCost, Op

HOST = "host"  # not a kernel: the GPU waiting on the host

OP_CLASSES: dict[str, str] = {
    # GEMMs: the projections, MLPs, experts, router, LM head, MLA's projections, the unfused attention's
    **dict.fromkeys(("qkv_proj", "out_proj", "mlp_up", "mlp_down", "lm_head", "router", "expert_up", "expert_down",
                     "shared_up", "shared_down", "q_down_proj", "q_up_proj", "q_proj", "kv_down_proj", "kv_up_proj",
                     "mtp_proj", "attn_scores", "attn_values", "expert_gemm_launches"), "gemm"),
    **dict.fromkeys(("attn_core", "attn_core_cp", "attn_cp_merge", "attn_softmax", "eager_softmax"), "attention"),
    **dict.fromkeys(("input_norm", "post_attn_norm", "final_norm", "qk_norm", "latent_norm", "mtp_norms"), "norm"),
    **dict.fromkeys(("rope", "rope_unfused", "mlp_act", "expert_act", "shared_act", "attn_residual", "mlp_residual",
                     "attn_dropout", "fp8_cast", "expert_fp8_cast", "unfused_elementwise", "expert_act_clamp",
                     "expert_down_bias", "router_topk", "moe_permute", "moe_unpermute", "moe_sort_chunks",
                     "moe_unsort_chunks", "moe_route_kernels", "moe_expert_kernels", "zero_grad", "weight_cast",
                     "grad_pass", "grad_accumulate", "eager_gelu"), "elementwise"),
    **dict.fromkeys(("grad_norm", "adam"), "optimizer"),
    "cross_entropy": "loss",
    **dict.fromkeys(("embedding", "position_embedding"), "embedding"),
    **dict.fromkeys(("moe_host_sync", "moe_glu_sync", "moe_multihot_sync"), HOST),
}
_SUFFIXES = ("_part", "_bwd", "_dgrad", "_wgrad")
_EXPERT = re.compile(r"^(expert_(?:up|down))_\d+$")


def op_class(name: str) -> str | None:
    """The kernel class of op ``name`` (``OP_CLASSES``, suffixes and prefixes stripped), or None
    for a name the mapping does not know."""
    base = name
    for _ in range(5):  # at most a prefix, an expert index and two suffixes
        if base in OP_CLASSES:
            return OP_CLASSES[base]
        if base.endswith("_quantize") or base.endswith("_quantize_bwd"):
            return "elementwise"
        for suffix in _SUFFIXES:
            if base.endswith(suffix):
                base = base[:-len(suffix)]
                break
        else:
            m = _EXPERT.match(base)
            if m:
                base = m.group(1)
            elif base.startswith("mtp_"):
                base = base[len("mtp_"):]
            else:
                return None
    return OP_CLASSES.get(base)


def gemm_key(shape: tuple[float, float, float, int] | None) -> tuple[int, int, int, int] | None:
    """A GEMM shape as calibration files key it: (smaller output dimension, larger one, k, batch),
    all whole numbers (a dimension that is not whole, such as an MoE expert's mean tokens, has no
    key); the output either way round, since a weight gradient is the transposed product."""
    if shape is None:
        return None
    m, n, k, batch = shape
    dims = []
    for x in (m, n, k):
        r = round(x)
        if r < 1 or abs(x - r) > 1e-9 * max(1.0, abs(x)):
            return None
        dims.append(int(r))
    m, n, k = dims
    return min(m, n), max(m, n), k, int(batch)


def op_factor(op: Op, cal: Calibration) -> float | None:
    """The factor ``op``'s time is divided by: its shape's when the calibration measured it, else
    its class's; None when neither is calibrated."""
    cls = op_class(op.name)
    if cls is None or cls == HOST:
        return None
    if cls == "gemm" and cal.gemm_shapes:
        by_shape = cal.shape_factors.get(gemm_key(op.shape))
        if by_shape is not None:
            return by_shape
    return cal.factor(cls)


def calibrated_block(block: BlockCost, cal: Calibration) -> BlockCost:
    """``block`` with each op of a calibrated class at its time / factor (the block itself when
    nothing in it is calibrated)."""
    ops = []
    changed = False
    for op in block.ops:
        f = op_factor(op, cal)
        if f is None or f == 1.0:
            ops.append(op)
        else:
            ops.append(replace(op, time_s=op.time_s / f))
            changed = True
    return BlockCost(tuple(ops)) if changed else block


def calibrated_layer(cost: LayerCost, cal: Calibration) -> LayerCost:
    """Each block of a layer calibrated; blocks that were one object stay one (recompute of the
    whole forward re-runs the forward's block)."""
    done: dict[int, BlockCost] = {}

    def one(block: BlockCost) -> BlockCost:
        if id(block) not in done:
            done[id(block)] = calibrated_block(block, cal)
        return done[id(block)]

    return LayerCost(attn_fwd=one(cost.attn_fwd), mlp_fwd=one(cost.mlp_fwd), attn_bwd=one(cost.attn_bwd),
                     mlp_bwd=one(cost.mlp_bwd), attn_recompute=one(cost.attn_recompute),
                     mlp_recompute=one(cost.mlp_recompute))


def blocks_classes(blocks) -> set[str]:
    """The kernel classes of the ops in ``blocks`` (HOST left out)."""
    return {c for b in blocks for op in b.ops if op.time_s > 0 and (c := op_class(op.name)) not in (None, HOST)}
