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
- EP: all-to-all dispatch and combine of b*s/cp/tp*topk*h*2 bytes per rank per MoE layer
  (token dispatch after the sequence-parallel split), twice more in backward.
- DP: gradients in buckets of max(40e6, 1e6*dp) parameters (Megatron DDP default), 4 bytes per
  gradient (Megatron-LM sets accumulate_allreduce_grads_in_fp32 for bf16); all-reduce over DP x CP (ZeRO 0), reduce-scatter (ZeRO 1/2, distributed optimizer),
  parameter all-gather at the start of the step overlapped with the forward (steady state of
  Megatron's overlap_param_gather). ZeRO 3 (FSDP): per-layer all-gather of the weights before
  each forward and backward (prefetched one layer ahead) and reduce-scatter of the gradients
  after each backward, every micro-batch (PyTorch FSDP default, no ``no_sync``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simulator.workload.compute import BlockCost, LayerCost, embedding_cost, head_cost, layer_cost, param_counts
from simulator.config import Scenario
from simulator.physical.hardware import GPUSpec
from simulator.step.plan import vstage_layers
from simulator.workload.frameworks import Software, resolve
from simulator.workload.software import head_with_software, layer_with_software, optimizer_block

GRAD_BYTES = 4  # Megatron-LM keeps and reduces fp32 main gradients in bf16 training
PARAM_BYTES = 2


@dataclass(frozen=True)
class Bucket:
    """Gradients of consecutive layers of one virtual stage, reduced together."""

    layers: tuple[int, ...]
    dense_params: float  # per GPU (after TP), reduced over DP x CP
    expert_params: float  # per GPU (after TP and EP), reduced over the expert-DP group


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

    def layers(self, vstage: int) -> range:
        return self.vstages[vstage]


def build_workload(s: Scenario, gpu: GPUSpec) -> Workload:
    m, t, par = s.model, s.training, s.parallelism
    p, v = par.pp, par.vp
    nvs = p * v
    sw = resolve(s)
    if t.attention == "flash":  # the framework's fused kernel (frameworks/*.yaml attention.kernel)
        t = replace(t, attention=sw.attention_kernel)
    vstages = vstage_layers(m.num_hidden_layers, p, v, par.first_pipeline_num_layers, par.last_pipeline_num_layers)
    costs: dict[bool, LayerCost] = {}
    layer_costs = {}
    counts = param_counts(m)
    dense_layer = counts["per_layer_dense"]
    moe_layer = counts["per_layer_moe"]
    dense_part_of_moe = _moe_dense_part(m, counts)
    dense_params, expert_params = {}, {}
    for layer in range(m.num_hidden_layers):
        moe = m.is_moe_layer(layer)
        if moe not in costs:
            costs[moe] = layer_with_software(layer_cost(m, t, par, gpu, layer), m, t, par, gpu, layer, sw)
        layer_costs[layer] = costs[moe]
        if moe:
            dense_params[layer] = dense_part_of_moe / par.tp
            expert_params[layer] = (moe_layer - dense_part_of_moe) / par.expert_tp / par.ep
        else:
            dense_params[layer] = dense_layer / par.tp
            expert_params[layer] = 0.0

    dp = s.dp
    bucket_limit = max(40e6, 1e6 * dp)
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
                out.append(Bucket(tuple(cur), cur_d, cur_e))
                cur, cur_d, cur_e = [], 0.0, 0.0
        extra = (emb_params if vs == 0 else 0.0) + (head_params if vs == nvs - 1 else 0.0)
        if cur or extra:
            out.append(Bucket(tuple(cur), cur_d + extra, cur_e))
        buckets[vs] = tuple(out)

    optimizer = {}
    for stage in range(p):
        mine = [c * p + stage for c in range(v)]
        dense = sum(b.dense_params for vs in mine for b in buckets[vs])
        expert = sum(b.expert_params for vs in mine for b in buckets[vs])
        if par.zero_stage >= 1:
            local = dense / (dp * par.cp) + expert / max(1, s.expert_dp)
        else:
            local = dense + expert
        optimizer[stage] = optimizer_block(local, dense + expert, gpu, sw)

    b, seq, h = t.micro_batch_size, t.seq_length, m.hidden_size
    act = b * seq / par.cp * h * 2
    kv = 2 * b * (seq / par.cp) * max(m.num_key_value_heads, par.tp) * m.head_dim / par.tp * 2
    topk = max(1, m.num_experts_per_tok)
    return Workload(
        scenario=s, vstages=vstages, layer_costs=layer_costs,
        embedding=embedding_cost(m, t, par, gpu), head=head_with_software(head_cost(m, t, par, gpu), gpu, sw),
        optimizer=optimizer, buckets=buckets, layer_dense_params=dense_params,
        layer_expert_params=expert_params, tp_bytes=act, pp_bytes=act / par.tp, cp_bytes=kv,
        ep_bytes=act / par.tp * topk, software=sw)


def _moe_dense_part(m, counts) -> float:
    """Parameters of an MoE layer that are not routed experts (attention, norms, router, shared)."""
    if not m.is_moe:
        return counts["per_layer_dense"]
    h = m.hidden_size
    expert = m.mlp_matrices * h * m.expert_intermediate_size
    return counts["per_layer_moe"] - m.num_experts * expert
