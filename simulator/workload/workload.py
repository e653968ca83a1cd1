"""What each pipeline stage computes and communicates: costs and message sizes, as plain values.

Built once per scenario from the compute model; the engine only walks it. Message sizes (bytes,
16-bit activations and gradients):
- TP (Megatron, Shoeybi et al. 2019): an all-reduce of the block output, b*s/cp*h*2 bytes, after
  attention and after the MLP in the forward, and at both block inputs in the backward. With
  sequence parallelism (Korthikanti et al. 2022) each becomes all-gather + reduce-scatter of the
  same full buffer.
- PP: b*s/cp*h*2 / tp bytes per rank per micro-batch and virtual-stage boundary (Megatron's
  scatter/gather split of the activation over the TP ranks), activations forward, gradients back.
- CP (ring attention, Megatron-core): cp-1 ring steps of the local K and V,
  2*b*(s/cp)*kv_heads*head_dim/tp*2 bytes, overlapped with the attention core; twice in backward.
- EP: all-to-all dispatch and combine per rank per MoE layer, twice more in backward:
  ``moe.dispatch_bytes`` (b*s/cp*etp/tp*topk*h*2 bytes with the alltoall dispatcher, deduplicated
  per destination with DeepEP, x imbalance for the busiest rank), divided by the dispatcher's
  achieved link efficiency (``moe.a2a_efficiency``) so the network model's time is the measured one.
- MTP (DeepSeek-V3): each of the num_nextn_predict_layers modules runs on the last stage after
  the LM head: two norms, the 2h -> h projection, one transformer layer (its EP all-to-alls are
  not simulated), and its own LM head and cross-entropy.
- DP: gradients in buckets of whole layers up to max(40e6, 1e6 x dp x cp) parameters (Megatron DDP
  default, ``memory.ddp_bucket_params``), or the framework's torch DDP cap
  (``Software.ddp_bucket_params``: a bucket past it is reduced in as many equal parts), 4 bytes per
  gradient (Megatron-LM sets accumulate_allreduce_grads_in_fp32 for bf16); all-reduce over DP x CP (ZeRO 0), reduce-scatter (ZeRO 1/2, distributed optimizer),
  parameter all-gather at the start of the step overlapped with the forward (steady state of
  Megatron's overlap_param_gather). ZeRO 3 (FSDP): per-layer all-gather of the weights before
  each forward and backward (prefetched one layer ahead) and reduce-scatter of the gradients
  after each backward, every micro-batch (PyTorch FSDP default, no ``no_sync``).
"""

from __future__ import annotations

import math

from dataclasses import dataclass, replace

from simulator.workload import moe as moe_model
from simulator.scenario.config import Scenario, TrainingConfig
from simulator.parts.gpus import GPUSpec
from simulator.layout.grid import scenario_split
from simulator.layout.schedules import placement
from simulator.workload.frameworks import Software, moe_fusions, resolve
from simulator.workload.software import CROSS_ENTROPY, head_with_software, layer_with_software, optimizer_block
from simulator.workload.compute import (gemm_op, gemm_bwd_ops, mem_op, embedding_cost, head_cost, joined, layer_cost, param_counts)
from simulator.workload.kernels import ACT_BYTES, BlockCost, LayerCost, Op
from simulator.workload.classes import calibrated_block, calibrated_layer
from simulator.parts.calibration import Calibration
from simulator.workload.memory import ddp_bucket_params, offload_bytes_per_layer
from simulator.workload.offload import host_link_Bps

GRAD_BYTES = 4  # Megatron-LM keeps and reduces fp32 main gradients in bf16 training
PARAM_BYTES = 2


@dataclass(frozen=True)
class Bucket:
    """Gradients of consecutive layers of one virtual stage, reduced together."""

    layers: tuple[int, ...]
    dense_params: float  # per GPU (after TP), reduced over DP x CP
    expert_params: float  # per GPU (after TP and EP), reduced over the expert-DP group
    # collectives it is reduced in: a layer larger than torch DDP's bucket cap fills several
    # buckets (``Software.ddp_bucket_params``), each an equal part here
    parts: int = 1


@dataclass(frozen=True)
class Workload:
    scenario: Scenario
    vstages: tuple[range, ...]  # layers of each virtual stage
    layer_costs: dict[int, LayerCost]  # by layer index
    embedding: tuple[BlockCost, BlockCost]
    head: tuple[BlockCost, BlockCost]
    optimizer: dict[int, BlockCost]  # by pipeline stage
    buckets: dict[int, tuple[Bucket, ...]]  # by virtual stage, in backward order
    layer_dense_params: dict[int, float]  # per GPU
    layer_expert_params: dict[int, float]
    tp_bytes: float
    pp_bytes: float
    cp_bytes: float
    ep_bytes: float
    software: Software | None = None  # the resolved framework profile (overlaps, host issue cost)
    ep_payload_bytes: float = 0.0  # dispatch payload before the efficiency division
    # CPU activation offloading (``offload``): bytes per micro-batch each layer copies to the host
    # and back (empty: off), and the GPU's host-link rate per direction
    offload_bytes: dict[int, float] | None = None
    host_link_Bps: float = 0.0

    def layers(self, vstage: int) -> range:
        return self.vstages[vstage]


def build_workload(s: Scenario, gpu: GPUSpec) -> Workload:
    m, t, par = s.model, s.training, s.parallelism
    p, v = par.pp, par.vp
    nvs = p * v
    sw = resolve(s)
    if gpu.host_overhead != 1.0:  # a slower host CPU issues every kernel later (hardware.GRACE_HOST_OVERHEAD)
        sw = replace(sw, host_issue_s=sw.host_issue_s * gpu.host_overhead)
    if t.attention == "flash":  # the framework's fused kernel (simulator/data/frameworks/*.yaml attention.kernel)
        t = replace(t, attention=sw.attention_kernel)
    place = placement(s.pipeline_schedule, p, v)
    vstages = scenario_split(s)
    costs: dict[tuple, LayerCost] = {}
    layer_costs = {}
    counts = param_counts(m)
    dense_layer = counts["per_layer_dense"]
    moe_layer = counts["per_layer_moe"]
    dense_part_of_moe = _moe_dense_part(m, counts)
    dense_params, expert_params = {}, {}
    # ZeRO partitions dense state over the DP x CP shard group and experts' over expert-DP: the
    # optimizer state from ZeRO-1, the gradient kept over the micro-batches from ZeRO-2
    shard, expert_dp = par.shard_group(s.dp), max(1, s.expert_dp)
    grad_shard, expert_shard = (shard, expert_dp) if par.zero_stage >= 2 else (1, 1)
    for layer in range(m.num_hidden_layers):
        moe = m.is_moe_layer(layer)
        kind = (moe, m.attention_window(layer))
        if kind not in costs:
            cost = layer_cost(m, t, par, gpu, layer, s.moe, sw.cuda_graphs, sw.graph_scope, glu_sync(m, sw),
                              sw.wgrad_bytes_per_param, moe_fusions(sw))
            costs[kind] = layer_with_software(cost, m, t, par, gpu, layer, sw, s.num_microbatches, grad_shard,
                                              expert_shard)
        layer_costs[layer] = costs[kind]
        if moe:
            dense_params[layer] = dense_part_of_moe / par.tp
            expert_params[layer] = (moe_layer - dense_part_of_moe) / par.expert_tp / par.ep
        else:
            dense_params[layer] = dense_layer / par.tp
            expert_params[layer] = 0.0

    bucket_limit = sw.ddp_bucket_params or ddp_bucket_params(s.dp * par.cp)

    def parts_of(params: float) -> int:
        """torch DDP cuts its buckets at tensors up to its cap, so a layer (or the embedding and
        head) past the cap fills several: reduced here as that many equal collectives. Megatron-core
        buckets whole layers: one collective."""
        return max(1, math.ceil(params / bucket_limit)) if sw.ddp_bucket_params else 1
    emb_params = counts["embedding"] / par.tp
    head_params = counts["lm_head"] / par.tp
    buckets = {}
    for vs in range(nvs):
        out, cur, cur_d, cur_e = [], [], 0.0, 0.0
        for layer in reversed(vstages[vs]):
            cur.append(layer)
            cur_d += dense_params[layer]
            cur_e += expert_params[layer]
            if cur_d + cur_e >= bucket_limit:
                out.append(Bucket(tuple(cur), cur_d, cur_e, parts_of(cur_d + cur_e)))
                cur, cur_d, cur_e = [], 0.0, 0.0
        extra = (emb_params if vs == 0 else 0.0) + (head_params if vs == nvs - 1 else 0.0)
        if cur or extra:
            out.append(Bucket(tuple(cur), cur_d + extra, cur_e, parts_of(cur_d + extra + cur_e)))
        buckets[vs] = tuple(out)

    optimizer = {}
    for stage in range(p):
        mine = [place.vstage(stage, c) for c in range(place.chunks)]
        dense = sum(b.dense_params for vs in mine for b in buckets[vs])
        expert = sum(b.expert_params for vs in mine for b in buckets[vs])
        if par.zero_stage >= 1:
            local = dense / shard + expert / expert_dp
        else:
            local = dense + expert
        optimizer[stage] = optimizer_block(local, dense + expert, gpu, sw, t.optimizer_state_dtype)

    b, seq, h = t.micro_batch_size, t.seq_length, m.hidden_size
    act = b * seq / par.cp * h * 2
    # K and V of the local tokens, bf16, the heads the attention call receives: the KV heads (at
    # least one per TP rank), or all query heads when the framework repeats K/V before the call
    # (profile attention.kv_heads_expanded, torchtitan's repeat_kv): its CP exchange moves those.
    kv_heads = m.num_attention_heads if sw.kv_heads_expanded else max(m.num_key_value_heads, par.tp)
    kv = 2 * b * (seq / par.cp) * kv_heads * m.head_dim / par.tp * 2
    tokens = b * seq / par.cp
    if m.is_moe:
        nodes = moe_model.ep_nodes(par, s.cluster.gpus_per_node)
        payload = moe_model.dispatch_bytes(m, tokens, par, s.moe, nodes)
        ep_bytes = payload / moe_model.a2a_efficiency(s.moe, nodes, gpu.nvlink_efficiency, gpu.nvlink_generation,
                                                      par.ep * par.expert_tp)
    else:
        payload = ep_bytes = 0.0
    work = Workload(
        scenario=s, vstages=vstages, layer_costs=layer_costs,
        embedding=embedding_cost(m, t, par, gpu),
        head=head_with_software(_head_with_mtp(s, t, gpu, sw), gpu, sw, m.vocab_size * h / par.tp,
                                s.num_microbatches, grad_shard),
        optimizer=optimizer, buckets=buckets, layer_dense_params=dense_params,
        layer_expert_params=expert_params, tp_bytes=act, pp_bytes=act / par.tp, cp_bytes=kv,
        ep_bytes=ep_bytes, ep_payload_bytes=payload, software=sw, **_offload(s))
    return work if s.calibration is None else calibrated_workload(work, s.calibration)


def calibrated_workload(work: Workload, cal: Calibration) -> Workload:
    """``work`` with every op of a calibrated kernel class at its time / factor
    (``classes.calibrated_block``); layers that shared one cost still share one."""
    layers: dict[int, LayerCost] = {}
    done: dict[int, LayerCost] = {}
    for layer, cost in work.layer_costs.items():
        if id(cost) not in done:
            done[id(cost)] = calibrated_layer(cost, cal)
        layers[layer] = done[id(cost)]
    embedding = tuple(calibrated_block(b, cal) for b in work.embedding)
    head = tuple(calibrated_block(b, cal) for b in work.head)
    return replace(work, layer_costs=layers, embedding=embedding, head=head,
                   optimizer={stage: calibrated_block(b, cal) for stage, b in work.optimizer.items()})


def _offload(s: Scenario) -> dict:
    """The ``Workload`` fields of CPU activation offloading (``offload``), none when it is off."""
    if not (s.training.activation_offload_layers or s.training.activation_offload_modules):
        return {}
    return {"offload_bytes": offload_bytes_per_layer(s), "host_link_Bps": host_link_Bps(s)}


def glu_sync(model, sw) -> bool:
    """Whether the MoE layers sync on Megatron-core's GLU offset copy (``moe.GLU_PRE_SYNC_OPS``):
    a clamped GLU in Megatron-core's expert code, not folded into the TE op-fuser experts."""
    return model.swiglu_limit is not None and model.mlp_matrices == 3 and sw.megatron_layers and not sw.te_op_fuser


def _head_with_mtp(s: Scenario, t: TrainingConfig, gpu: GPUSpec, sw: Software) -> tuple[BlockCost, BlockCost]:
    """LM head and the framework's loss (``software.CROSS_ENTROPY``), followed by the MTP modules
    (see the module docstring); ``t`` is the training section with the framework's attention
    kernel resolved."""
    m, par = s.model, s.parallelism
    loss = CROSS_ENTROPY[sw.cross_entropy]
    fwd, bwd = head_cost(m, t, par, gpu, loss, sw.wgrad_bytes_per_param, sw.fp8_lm_head_quantized)
    if not m.num_nextn_predict_layers:
        return fwd, bwd
    tokens = t.micro_batch_size * t.seq_length / par.cp
    h = m.hidden_size
    last = m.num_hidden_layers - 1
    layer = layer_cost(m, t, par, gpu, last, s.moe, sw.cuda_graphs, sw.graph_scope, glu_sync(m, sw),
                       sw.wgrad_bytes_per_param, moe_fusions(sw))
    for _ in range(m.num_nextn_predict_layers):
        norms = 2 * 2 * ACT_BYTES * tokens * h
        proj_f = BlockCost((mem_op("mtp_norms", norms, gpu), gemm_op("mtp_proj", tokens, h / par.tp, 2 * h, gpu, t.precision)))
        proj_b = BlockCost((*gemm_bwd_ops("mtp_proj", tokens, h / par.tp, 2 * h, gpu, t.precision,
                                      wgrad_bytes=sw.wgrad_bytes_per_param),
                            mem_op("mtp_norms_bwd", 2 * norms, gpu)))
        layer_f = BlockCost(tuple(Op(f"mtp_{op.name}", op.flops, op.bytes, op.time_s)
                                  for op in layer.attn_fwd.ops + layer.mlp_fwd.ops))
        layer_b = BlockCost(tuple(Op(f"mtp_{op.name}", op.flops, op.bytes, op.time_s)
                                  for blk in (layer.mlp_recompute, layer.attn_recompute, layer.mlp_bwd, layer.attn_bwd)
                                  for op in blk.ops))
        head_f, head_b = head_cost(m, t, par, gpu, loss, sw.wgrad_bytes_per_param, sw.fp8_lm_head_quantized)
        fwd = joined(joined(joined(fwd, proj_f), layer_f), head_f)
        bwd = joined(joined(joined(head_b, layer_b), proj_b), bwd)
    return fwd, bwd


def _moe_dense_part(m, counts) -> float:
    """Parameters of an MoE layer that are not routed experts (attention, norms, router, shared)."""
    if not m.is_moe:
        return counts["per_layer_dense"]
    h = m.hidden_size
    expert = m.mlp_matrices * h * m.expert_intermediate_size
    return counts["per_layer_moe"] - m.num_experts * expert
