"""Memory per GPU, per pipeline stage: model states, activations, buffers; pure functions.

Model states (Rajbhandari et al. 2020, "ZeRO"): mixed-precision Adam keeps 2 (16-bit weights)
+ 2 (16-bit gradients) + 12 (fp32 master weights, Adam m and v) bytes per parameter. ZeRO-1
shards the 12 over the data-parallel group, ZeRO-2 also the gradients, ZeRO-3 also the weights.
Dense parameters shard over DP x CP (Megatron's distributed optimizer: CP ranks hold the same
weights); expert parameters over the expert-data-parallel group, DP x CP / EP.

Parameters per GPU on a stage: its layers (num_hidden_layers / pp, in vp chunks), matrices
divided by tp (Megatron column/row parallel; GQA K/V heads replicated when tp > kv heads),
norm gains replicated; MoE layers hold num_experts / ep experts, each divided by tp (expert
TP = TP), and a replicated router. The first stage adds the vocab-parallel embedding
(V h / tp); the last the LM head (V h / tp) and final norm. With tied embeddings and pp > 1
the last stage still holds its own copy of the embedding (Megatron-LM).

Activations per layer and micro-batch follow Korthikanti et al. 2022 term by term (Sec. 4.1,
Table 2), 16-bit tensors and 1-byte dropout masks; ``korthikanti_activation_bytes`` is
Table 2 as printed and ``layer_activation_bytes`` is the same accounting generalised to GQA,
SwiGLU and MoE: it equals Table 2 exactly on GPT-shaped layers (multi-head attention, a 4h
GeLU MLP). The report uses it as-is, so it keeps the paper's 5as^2b attention-score term and
dropout masks: with flash attention (no stored score matrix) and dropout 0, as modern recipes
train, it overestimates activations without selective recompute. CP divides the sequence:
every term uses s / cp. Activations on a stage = per-layer bytes x layers per chunk x chunk
activations in flight (``microbatches_in_flight``), plus the embedding dropout mask on the
first stage, the LM-head input and what the loss keeps of the logits on the last (4 s b V / t
for Megatron's vocab-parallel cross entropy, which keeps the fp32 softmax; 2 for the
implementations that keep the bf16 logits or write the gradient into them,
``software.CROSS_ENTROPY``), plus the recompute working set: the tensors of one
layer and one micro-batch that recompute re-materialises during its backward. Megatron-core's
``recompute_modules`` free the outputs they recompute (``recompute_module_savings``); frameworks
with their own selective policy keep what it saves (``saved_op_activation_bytes``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from simulator.scenario.config import RECOMPUTE, ZERO_STAGES, ModelConfig, Scenario, optimizer_state_bytes
from simulator.common.errors import ConfigError
from simulator.common.records import Record, doc
from simulator.layout.grid import pipeline_counts, scenario_split, vstage_layers
from simulator.layout.schedules import check_schedule_args, placement, schedule_peak_in_flight
from simulator.common.units import GiB
from simulator.workload.frameworks import fsdp_gathered_once, resolve
from simulator.workload.software import CROSS_ENTROPY
from simulator.workload.kernels import ACT_BYTES, FP8_SAVED_INPUT_BYTES
from simulator.parts.gpus import gpu_of
from simulator.workload.compute import param_counts
from simulator.workload.mla import attention_params, mla_gemms
from simulator.workload.offload import host_link_Bps, module_offload_bytes, resident_window

COMPONENTS = ("weights", "gradients", "optimizer", "activations", "other")

MASK_BYTES = 1
SAVED_INPUT_PRECISIONS = ("fp8", "mxfp8")
ROUTER_PROB_BYTES = 4  # Megatron-core computes router logits and probabilities in fp32

# Megatron-core DistributedDataParallelConfig.bucket_size default: max(40e6, 1e6 x the DP x CP
# group's size) params (megatron/training/training.py get_model: bucket_size = max(40000000,
# 1000000 * mpu.get_data_parallel_world_size(with_context_parallel=True))).
DDP_BUCKET_MIN_PARAMS = 40_000_000
DDP_BUCKET_PARAMS_PER_RANK = 1_000_000


def ddp_bucket_params(dp_cp: int) -> float:
    """Parameters per DDP gradient bucket for a DP x CP group of ``dp_cp`` ranks (Megatron-core's
    default): the workload's buckets (unless the framework cuts its own,
    ``Software.ddp_bucket_params``) and the memory model's one bucket buffer use it."""
    return float(max(DDP_BUCKET_MIN_PARAMS, DDP_BUCKET_PARAMS_PER_RANK * dp_cp))
# Framework margin, an estimate, the same for every scenario: CUDA context with the loaded
# cuBLAS / cuDNN / Transformer Engine kernels and workspaces (~1 GiB per process on A100/H100),
# NCCL buffers for the TP, PP, DP, CP and EP communicators (NCCL_BUFFSIZE = 4 MiB per channel
# and peer, tens of channels per communicator: ~1.5 GiB), and the caching allocator's
# fragmentation (reserved above allocated), taken as 5% of the tensor bytes.
CUDA_CONTEXT_BYTES = 1.0 * GiB
NCCL_BUFFER_BYTES = 1.5 * GiB
ALLOCATOR_FRAGMENTATION = 0.05
# Room a stage's peak should leave below the GPU's capacity, on top of the margin above (which the
# peak already includes): the caching allocator's fragmentation depends on the allocation pattern,
# and ALLOCATOR_FRAGMENTATION is its average, so a run that fragments twice as much needs about
# another 5% of the tensor bytes, nearly 5% of the capacity at a full GPU (PyTorch's CUDA memory
# management notes: memory reserved but not allocated is lost to a large request; expandable
# segments reduce it). It also covers what the model leaves out: transient kernel workspaces
# beyond the context's, and the HBM the driver keeps (an "80 GB" H100 shows 79.6 GiB).
HEADROOM_FRACTION = 0.05


def model_state_bytes(
    params: float, dp: int, zero_stage: int, weight_bytes: float = 2, grad_bytes: float = 2,
    optimizer_bytes: float = 12,
) -> float:
    """Bytes per GPU of weights + gradients + optimizer states for ``params`` replicated dp ways.

    Rajbhandari et al. 2020, Fig. 1: with Psi = 7.5e9, dp = 64 and 2 + 2 + 12 bytes this is
    120, 31.4, 16.6 and 1.9 GB for ZeRO stages 0 to 3.
    """
    return sum(_state_components(params, dp, zero_stage, weight_bytes, grad_bytes, optimizer_bytes))


def _state_components(
    params: float, shards: int, zero_stage: int, weight_bytes: float, grad_bytes: float,
    optimizer_bytes: float,
) -> tuple[float, float, float]:
    if zero_stage not in ZERO_STAGES:
        raise ConfigError("parallelism.zero_stage", zero_stage, "valid: 0, 1, 2, 3")
    w = params * weight_bytes / (shards if zero_stage >= 3 else 1)
    g = params * grad_bytes / (shards if zero_stage >= 2 else 1)
    o = params * optimizer_bytes / (shards if zero_stage >= 1 else 1)
    return w, g, o


def korthikanti_activation_bytes(
    s: float, b: float, h: float, a: float, t: int, sp: bool, recompute: str
) -> float:
    """Activation bytes of one transformer layer for one micro-batch: Korthikanti et al. 2022, Table 2.

    none: sbh(10 + 24/t + 5as/(ht)) with TP only, sbh/t (34 + 5as/h) with sequence parallelism;
    selective: sbh(10 + 24/t), or 34 sbh/t with SP; full: 2 sbh, the layer input (the paper's
    row has no SP; with SP the stored input is itself split, 2 sbh/t). t = 1 without SP gives
    the paper's no-parallelism row sbh(34 + 5as/h).
    """
    if recompute == "full":
        return 2 * s * b * h / (t if sp else 1)
    if recompute == "selective":
        return 34 * s * b * h / t if sp else s * b * h * (10 + 24 / t)
    if recompute == "none":
        if sp:
            return s * b * h / t * (34 + 5 * a * s / h)
        return s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    raise ConfigError("training.recompute", recompute, f"valid: {', '.join(RECOMPUTE)}")


def layer_activation_bytes(
    model: ModelConfig, layer: int, s: float, b: float, t: int, sp: bool, recompute: str,
    flash_attention: bool = False, dropout: bool = True, etp: int | None = None, quantized_inputs: bool = False,
    softmax_fp32: bool = False, gelu_composed: bool = False,
) -> float:
    """Korthikanti et al. 2022's per-layer accounting (Sec. 4.1) for GQA, SwiGLU and MoE layers.

    Attention: norm input 2sbh, QKV input 2sbh, Q 2sb(a d)/t, K and V 2sb(kv d)/t each (kv
    heads replicated up to t), scores 5asb s/t (softmax 2, dropout mask 1, dropout output 2),
    output-projection input 2sb(a d)/t, dropout mask sbh. MLP: norm input 2sbh, input 2sbh,
    (matrices - 1) x 2sbf/t into the activation (GeLU input, or SwiGLU gate and up), 2sbf/t
    into the down projection, dropout mask sbh. Terms without /t are replicated across TP
    unless sequence parallelism splits them. MoE layers: the router input and fp32
    probabilities, then per routed token copy (s b k etp / t copies on each GPU: balanced
    routing, an expert-TP group of etp ranks sees etp / t of the tokens, all of them at the
    default etp = t, Megatron-core) a 2h expert input and the expert MLP terms with
    f = moe_intermediate_size split by etp, plus shared experts as one MLP. Selective recompute drops the
    score term; full recompute keeps the layer input, 2sbh (/t with SP).

    The defaults are the paper's (unfused attention, dropout 0.1). The report follows the
    scenario's ``training.attention`` as the compute model does: a fused flash-attention
    kernel keeps only its fp32 log-sum-exp statistics (4 a s b / t bytes) instead of the 5 a s^2 b / t
    score term (Dao et al. 2022), and recipes without dropout store no masks.

    ``softmax_fp32``: eager attention under autocast (profile ``attention.unfused_softmax:
    eager_autocast``, ``software.EAGER_SOFTMAX``) saves softmax's float32 output for its backward,
    2 bytes per score more than the 16-bit one. ``gelu_composed``: transformers' gelu_new as eager
    ops under autocast (``software.GELU_NEW_COMPOSED``) saves pow's float32 input, tanh's float32
    output, 0.5 x (16-bit) and 1 + tanh (float32) for autograd, 14 bytes per element of the
    activation instead of the fused GELU's 16-bit input: ``GELU_NEW_SAVED_EXTRA`` more.

    ``quantized_inputs``: FP8 training whose GEMMs keep their quantized input for the weight
    gradient (``FP8_SAVED_INPUT_BYTES`` per element instead of 2): Transformer Engine's Linear saves
    the FP8 (column-wise) copy of its input for the backward, not the 16-bit one
    (transformer_engine/pytorch/module/linear.py: ``saved_inputmat = inputmat`` after the input
    quantizer, at d0067d0; ``inputmat_t`` when ``fp8_wgrad`` at v1.0, 2023). So the inputs of the
    QKV, output-projection, FC1 and FC2 (and expert) GEMMs take 1 byte per element, while the norm
    inputs, Q, K, V (the attention kernel's) and the FC1 outputs the activation's backward reads
    stay 16-bit (profile ``fp8.saves_quantized_inputs``). In an MoE layer the router, a 16-bit
    GEMM, keeps the norm output as before, each routed copy's expert input and down-projection
    input take 1 byte, and shared experts keep a 1-byte copy of the norm output besides.
    """
    if recompute not in RECOMPUTE:
        raise ConfigError("training.recompute", recompute, f"valid: {', '.join(RECOMPUTE)}")
    h, d, a = model.hidden_size, model.head_dim, model.num_attention_heads
    tokens = s * b
    rep = 1 / t if sp else 1.0
    if recompute == "full":
        return ACT_BYTES * tokens * h * rep
    q, kv = a * d, max(model.num_key_value_heads, t) * d
    gemm_in = FP8_SAVED_INPUT_BYTES if quantized_inputs else ACT_BYTES  # a GEMM's saved input, per element
    mask = MASK_BYTES * tokens * h * rep if dropout else 0.0
    attn = (ACT_BYTES + gemm_in) * tokens * h * rep + (ACT_BYTES * (q + 2 * kv) + gemm_in * q) * tokens / t + mask
    if flash_attention:
        attn += 4 * a * tokens / t
    elif recompute == "none":
        attn += (ACT_BYTES + MASK_BYTES + ACT_BYTES + (EAGER_SOFTMAX_SAVED_EXTRA if softmax_fp32 else 0.0)) \
            * a * s * tokens / t
    if model.is_moe_layer(layer):
        # the norm input, and its output as the router (a 16-bit GEMM) keeps it; with quantized
        # inputs the shared experts' first GEMM keeps its own FP8 copy beside it
        mlp = 2 * ACT_BYTES * tokens * h * rep + mask
        if quantized_inputs and model.num_shared_experts:
            mlp += gemm_in * tokens * h * rep
        etp = etp or t
        copies = tokens * model.num_experts_per_tok * etp / t
        mlp += ROUTER_PROB_BYTES * tokens * model.num_experts * rep
        mlp += gemm_in * copies * h + _ffn_bytes(model, copies, model.expert_intermediate_size, etp, gemm_in)
        mlp += _ffn_bytes(model, tokens, model.num_shared_experts * model.expert_intermediate_size, t, gemm_in)
    else:
        mlp = (ACT_BYTES + gemm_in) * tokens * h * rep + mask + _ffn_bytes(model, tokens, model.intermediate_size, t,
                                                                          gemm_in)
        if gelu_composed and model.hidden_act == "gelu_new":
            mlp += GELU_NEW_SAVED_EXTRA * tokens * model.intermediate_size / t
    return attn + mlp


# Eager autograd's saved tensors beyond the fused kernels' (``layer_activation_bytes``), bytes per
# score and per activation element
EAGER_SOFTMAX_SAVED_EXTRA = 4.0 - ACT_BYTES
GELU_NEW_SAVED_EXTRA = (4.0 + 4.0 + 2.0 + 4.0) - ACT_BYTES


def eager_saved(sw) -> dict:
    """``layer_activation_bytes``' keywords for a framework's eager kernels (its ``Software``)."""
    return {"softmax_fp32": sw.unfused_softmax == "eager_autocast", "gelu_composed": sw.gelu_new == "composed"}


def recompute_module_savings(model: ModelConfig, layer: int, s: float, b: float, t: int, sp: bool,
                             modules: tuple[str, ...], etp: int | None = None, quantized_inputs: bool = False) -> float:
    """Activation bytes per micro-batch that Megatron-core's ``recompute_modules`` free in layer
    ``layer``, against ``layer_activation_bytes``' selective accounting (whose attention core,
    ``core_attn``, already re-runs). Each module other than core_attn runs under
    ``CheckpointWithoutOutput`` (megatron/core/transformer/transformer_layer.py,
    multi_latent_attention.py, moe/experts.py at Megatron-LM 1e057005 and d7288711): its output,
    which the next op saved for its backward, is freed once that op has run and is recomputed
    before the backward needs it. So each frees the bytes counted for that output:

    - ``layernorm``: the two norms' outputs, 2sbh (/t with SP) each, kept 16-bit as the QKV GEMM's
      and the MLP's (or router's) input. With quantized GEMM inputs (FP8 Transformer Engine) the
      GEMM keeps its own 1-byte copy, which the recompute does not free; in an MoE layer the router
      (a 16-bit GEMM) still frees its input.
    - ``mla_up_proj`` (MLA layers): the query and key/value up-projections' outputs that the
      attention kernel saved, Q, K and V, 2sb(q + 2kv)/t as counted.
    - ``moe_act`` (MoE layers): the experts' activation output, the down projection's input, per
      routed copy (copies x f / etp at the GEMM's saved-input bytes).
    - ``shared_experts`` (MoE layers): the shared experts' tensors but their input (the norm output,
      kept for the router): their f-wide tensors and, quantized, their 1-byte input copy.
    - ``mlp`` (dense layers): every MLP tensor but the norm's input: the norm output (the GEMM's
      input) and the f-wide tensors.
    - ``moe`` (MoE layers): the whole MoE layer under one checkpoint (moe/moe_layer.py,
      ``moe_layer_recompute``, Megatron-LM 1e057005): every tensor it saved but its input, the norm
      output, which the checkpoint keeps: the router probabilities, each routed copy's expert tensors
      and the shared experts' (``moe_act`` and ``shared_experts`` add nothing beside it).
    """
    h, d, a = model.hidden_size, model.head_dim, model.num_attention_heads
    tokens = s * b
    rep = 1 / t if sp else 1.0
    gemm_in = FP8_SAVED_INPUT_BYTES if quantized_inputs else ACT_BYTES
    moe = model.is_moe_layer(layer)
    freed = 0.0
    if "layernorm" in modules:
        if not quantized_inputs:
            freed += ACT_BYTES * tokens * h * rep  # the attention norm's output
        if moe or not quantized_inputs:
            freed += ACT_BYTES * tokens * h * rep  # the MLP's (or the router's) norm output
    if "mla_up_proj" in modules and model.is_mla:
        q, kv = a * d, max(model.num_key_value_heads, t) * d
        freed += ACT_BYTES * (q + 2 * kv) * tokens / t
    group = etp or t  # the expert-TP group (Megatron-core's default: the TP group)
    copies = tokens * model.num_experts_per_tok * group / t  # routed copies of the tokens, per GPU
    if moe and "moe" in modules:
        freed += ROUTER_PROB_BYTES * tokens * model.num_experts * rep
        freed += gemm_in * copies * h + _ffn_bytes(model, copies, model.expert_intermediate_size, group, gemm_in)
        # the routed tensors above hold the activation output; the shared experts free as under their module
        modules = tuple(m for m in modules if m not in ("moe_act", "shared_experts")) + ("shared_experts",)
    if moe and "moe_act" in modules:
        freed += gemm_in * copies * model.expert_intermediate_size / group
    if moe and "shared_experts" in modules and model.num_shared_experts:
        freed += _ffn_bytes(model, tokens, model.num_shared_experts * model.expert_intermediate_size, t, gemm_in)
        if quantized_inputs:
            freed += gemm_in * tokens * h * rep
    if not moe and "mlp" in modules:
        freed += gemm_in * tokens * h * rep + _ffn_bytes(model, tokens, model.intermediate_size, t, gemm_in)
        if "layernorm" in modules and not quantized_inputs:
            freed -= ACT_BYTES * tokens * h * rep  # the MLP norm's output, counted once
    return freed


def saved_op_activation_bytes(model: ModelConfig, s: float, b: float, t: int, sp: bool, policy: str) -> float | None:
    """Activation bytes one dense transformer layer keeps per micro-batch under a framework's
    op-level selective recompute (profile ``recompute.selective``), or None where the policy is the
    reference (``attention_core``: Korthikanti's accounting, ``layer_activation_bytes``) or does not
    apply (MoE and MLA layers, whose compute keeps the reference too: ``software.layer_with_software``).

    Both policies keep the layer's input (the checkpointed function's argument, 2sbh, /t with SP)
    and then only the tensors the policy saves; every other tensor of the layer is re-created by
    the recompute in the backward (counted in the working set, ``stage_memory``):

    - ``every_second_matmul``, torchtitan's per-op SAC (torchtitan/distributed/activation_checkpoint.py
      ``_save_list`` / ``_get_custom_policy``, the same from 2024-12 to now): an op's output is saved
      when the op is ``aten.mm``, SDPA, a functional reduce-scatter or ``max``, except every second
      mm of the block (a fresh count per block call). torch.utils.checkpoint's SAC
      (``_CachingTorchDispatchMode``) caches the outputs of those ops during the forward whether or
      not the backward reads them. In a Llama block (mm order wq, wk, wv, wo, w1, w3, w2) it keeps
      wq 2sb q/t, wv 2sb kv/t, w1 2sbf/t and w2's output (2sbh: a row-parallel mm's partial sum over
      the whole sequence), plus with SP the reduce-scatters after attention and after the MLP
      (2sbh/t each), and SDPA's output (2sb q/t) and fp32 log-sum-exp (4asb/t); with a 2-matrix MLP
      (mm order wq, wk, wv, wo, w1, w2) wq, wv, w1.
    - ``elementwise``, MaxText's ``minimal_flash`` remat policy (src/maxtext/layers/decoders.py
      ``get_remat_policy``: ``save_from_both_policies(checkpoint_dots_with_no_batch_dims,
      save_only_these_names('context'))``): JAX keeps, among the values the backward needs, the
      projections' outputs and the attention context: Q, K, V (2sb(q + 2kv)/t), the context
      (2sb q/t, with the kernel's fp32 log-sum-exp 4asb/t), the output projection's result (2sbh,
      /t with SP: the residual sum the MLP's norm is recomputed from) and the MLP's gate and up
      projections (2sbf/t each; 2sbf/t for one up projection with a 2-matrix MLP). The down
      projection's output is not a residual of the backward and is not kept.
    - ``attention_projections``, MaxText's ``custom`` remat policy with query_proj, key_proj,
      value_proj, qkv_proj and out_proj (and mlpwo) set to ``device``, as NVIDIA's DGX Cloud
      Llama 2 70B recipe runs it (dgxc-benchmarking maxtext/configure.sh at v24.11.1; decoders.py
      ``get_remat_policy``: ``save_and_offload_only_these_names(names_which_can_be_saved=
      cfg.tensors_on_device, ...)``; base.yml / types.py: decoder_layer_input ``device``, context
      and mlpwi* ``remat`` by default): Q, K, V (2sb(q + 2kv)/t) and the output projection's result
      (2sbh, /t with SP). The context is not saved (the attention core re-runs, so its log-sum-exp
      is not kept either), nor the MLP's input projections; the down projection's output, even when
      named, is not a residual of the backward.
    """
    if policy not in ("every_second_matmul", "elementwise", "attention_projections") or model.is_mla:
        return None
    h, d, a = model.hidden_size, model.head_dim, model.num_attention_heads
    tokens = s * b
    rep = 1 / t if sp else 1.0
    q, kv = a * d, max(model.num_key_value_heads, t) * d
    f = model.intermediate_size
    kept = ACT_BYTES * tokens * h * rep  # the layer's input
    if policy == "attention_projections":
        return kept + ACT_BYTES * tokens * (q + 2 * kv) / t + ACT_BYTES * tokens * h * rep
    kept += ACT_BYTES * tokens * q / t + 4 * a * tokens / t  # attention output and log-sum-exp
    if policy == "every_second_matmul":
        kept += ACT_BYTES * tokens * (q + kv) / t  # wq, wv (wk and wo are the 2nd and 4th mm)
        kept += ACT_BYTES * tokens * f / t  # w1 (5th); w3 (6th) re-runs
        if model.mlp_matrices == 3:
            kept += ACT_BYTES * tokens * h  # w2 (7th), before its reduction
        if sp and t > 1:
            kept += 2 * ACT_BYTES * tokens * h / t  # the two reduce-scatters
    else:
        kept += ACT_BYTES * tokens * (q + 2 * kv) / t
        kept += ACT_BYTES * tokens * h * rep
        kept += ACT_BYTES * tokens * f * (model.mlp_matrices - 1) / t
    return kept


def _ffn_bytes(model: ModelConfig, tokens: float, f: float, t: int, gemm_in: float = ACT_BYTES) -> float:
    """The MLP's f-wide tensors: (matrices - 1) outputs into the activation, 16-bit, and the down
    projection's input at ``gemm_in`` bytes per element."""
    return (ACT_BYTES * (model.mlp_matrices - 1) + gemm_in) * tokens * f / t


@functools.lru_cache(maxsize=4096)
def microbatches_in_flight(
    schedule: str, stage: int, stages: int, microbatches: int, chunks: int = 1
) -> int:
    """Chunk activations stage ``stage`` holds at its peak (one chunk = 1/chunks of its layers).

    Read from the schedule's program (``schedules.schedule_peak_in_flight``: alive from F until its
    W, or its B when not split; for 1F1B, GPipe and interleaved 1F1B from the program's warm-up,
    without building it). 1F1B: min(p - s, m) (Narayanan et al. 2021); GPipe: m; interleaved
    (Megatron-LM): min(2 (p - s - 1) + (v - 1) p + 1, m v); ZB-H1 p, ZB-H2 2p - 1; ZB-V and
    DualPipeV count half-stage chunks (vp = 2); DualPipe counts stages of either model copy.
    """
    return schedule_peak_in_flight(schedule, stage, stages, microbatches, chunks)


@dataclass(frozen=True)
class StageMemory:
    """Bytes per GPU on one pipeline stage, by component."""

    stage: int
    weights: float
    gradients: float
    optimizer: float
    activations: float
    other: float
    in_flight: int

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.other

    @property
    def biggest(self) -> str:
        return max(COMPONENTS, key=lambda c: getattr(self, c))


@dataclass(frozen=True)
class _Params:
    """Parameters per GPU on a stage: dense (sharded over DP x CP) and expert (over EDP)."""

    dense: float
    expert: float
    largest_unit: float  # one layer, the embedding or the head: what ZeRO-3 gathers at once


def _layer_params(model: ModelConfig, layer: int, tp: int, ep: int, etp: int | None = None) -> tuple[float, float]:
    """(dense, expert) parameters of one layer per GPU; norm gains (2h) replicated over TP."""
    h, d = model.hidden_size, model.head_dim
    q, kv = model.num_attention_heads * d, max(model.num_key_value_heads, tp) * d
    dense = 2 * h + (h * (q + 2 * kv) + q * h) / tp
    if model.is_mla:  # down projections replicated over TP, the rest split (simulator.workload.mla)

        down = sum(n * k for name, n, k in mla_gemms(model, 1) if name.endswith("_down_proj"))
        dense = 2 * h + down + (attention_params(model) - down) / tp
    mm = model.mlp_matrices
    if not model.is_moe_layer(layer):
        return dense + mm * h * model.intermediate_size / tp, 0.0
    expert = mm * h * model.expert_intermediate_size
    dense += h * model.num_experts + model.num_shared_experts * expert / tp
    return dense, model.num_experts / ep * expert / (etp or tp)


def stage_layers(model: ModelConfig, stage: int, pp: int, vp: int = 1, first: int | None = None,
                 last: int | None = None, schedule: str = "interleaved",
                 counts: tuple[int, ...] | None = None) -> list[int]:
    """Layer indices on ``stage``, every chunk the schedule places there (``schedules.Placement``):
    chunk c holds virtual stage c * pp + stage (Megatron-LM), stage s and 2 pp - 1 - s for the
    V-shaped schedules, and stage s of one model copy and pp - 1 - s of the other for DualPipe."""
    vstages = vstage_layers(model.num_hidden_layers, pp, vp, first, last, counts)
    place = placement(schedule, pp, vp)
    return [layer for c in range(place.chunks) for layer in vstages[place.vstage(stage, c)]]


def _ends(s: Scenario, stage: int) -> tuple[int, int]:
    """How many model copies have their first virtual stage (embedding) and their last (LM head)
    on ``stage``."""
    par = s.parallelism
    return _ends_of(s.pipeline_schedule, par.pp, par.vp, stage)


@functools.lru_cache(maxsize=4096)
def _ends_of(schedule: str, pp: int, vp: int, stage: int) -> tuple[int, int]:
    place = placement(schedule, pp, vp)
    last = place.virtual_stages - 1
    return (sum(place.locate(0, c)[0] == stage for c in range(place.copies)),
            sum(place.locate(last, c)[0] == stage for c in range(place.copies)))


@functools.lru_cache(maxsize=16)
def _layer_kinds(model: ModelConfig) -> tuple[tuple[bool, int | None], ...]:
    """(is an MoE layer, attention window) of every layer: what the memory model reads of a layer."""
    return tuple((model.is_moe_layer(x), model.attention_window(x)) for x in range(model.num_hidden_layers))


def _stage_params(s: Scenario, stage: int, layers: list[int], kinds: tuple, by_kind: dict) -> _Params:
    """Parameters of ``stage`` holding ``layers`` (``kinds``: ``_layer_kinds``). A layer's
    parameters depend on the layer only through whether it is an MoE layer: one computation per
    kind, kept in ``by_kind`` for every stage of the layout (the planner asks for tens of
    thousands of layouts)."""
    m, par = s.model, s.parallelism
    tp, pp = par.tp, par.pp
    units = []
    for layer in layers:
        moe = kinds[layer][0]
        if moe not in by_kind:
            by_kind[moe] = _layer_params(m, layer, tp, par.ep, par.expert_tp)
        units.append(by_kind[moe])
    dense = sum(u[0] for u in units)
    expert = sum(u[1] for u in units)
    largest = max((u[0] + u[1] for u in units), default=0.0)
    table = m.vocab_size * m.hidden_size / tp
    embeds, heads = _ends(s, stage)
    if embeds:
        dense += table * embeds
        largest = max(largest, table)
    if heads:
        dense += m.hidden_size * heads
        if not m.tie_word_embeddings or pp > 1:
            dense += table * heads
            largest = max(largest, table)
    return _Params(dense, expert, largest)


def _check(s: Scenario) -> None:
    par, m, tr = s.parallelism, s.model, s.training
    for name in ("tp", "pp", "cp", "ep", "vp"):
        value = getattr(par, name)
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"parallelism.{name}", value, "must be a positive integer")
    if s.dp < 1:
        raise ConfigError("parallelism.dp", s.dp, "must be at least 1: use more GPUs or smaller tp x pp x cp")
    if par.zero_stage not in ZERO_STAGES:
        raise ConfigError("parallelism.zero_stage", par.zero_stage, "valid: 0, 1, 2, 3")
    if tr.recompute not in RECOMPUTE:
        raise ConfigError("training.recompute", tr.recompute, f"valid: {', '.join(RECOMPUTE)}")
    for name in ("seq_length", "micro_batch_size"):
        if getattr(tr, name) < 1:
            raise ConfigError(f"training.{name}", getattr(tr, name), "must be a positive integer")
    scenario_split(s)
    if m.is_moe:
        if m.num_experts % par.ep:
            raise ConfigError("parallelism.ep", par.ep, f"must divide num_experts = {m.num_experts}")
        if (par.tp * s.dp * par.cp) % (par.ep * par.expert_tp):
            raise ConfigError("parallelism.ep", par.ep,
                              f"ep x etp must divide tp x dp x cp = {par.tp * s.dp * par.cp}")
    check_schedule_args(s.pipeline_schedule, par.pp, s.microbatches_per_pass, par.vp)


@functools.lru_cache(maxsize=1024)
def _layout_parts(s: Scenario) -> tuple[tuple[_Params, float, int], ...]:
    """``_stage_layout_part`` of every pipeline stage, by stage: one cache look-up (one hash of the
    scenario) per layout rather than per stage, shared by its ZeRO stages (``s`` has zero_stage 0)."""
    # What every stage of the layout shares: each layer's kind, the selective-recompute policy, and
    # the per-kind parameters and activation bytes as the stages compute them (the same numbers), and
    # whether FP8 GEMM inputs are kept quantized.
    layer_kinds = _layer_kinds(s.model)
    sw = resolve(s)
    policy = sw.selective_recompute if s.training.recompute == "selective" else "attention_core"
    saved = {"quantized_inputs": _quantized_inputs(s, sw), **eager_saved(sw)}
    params_by_kind: dict = {}
    bytes_by_kind: dict = {}
    return tuple(_stage_layout_part(s, stage, layer_kinds, policy, saved, params_by_kind, bytes_by_kind)
                 for stage in range(s.parallelism.pp))


def _stage_layout_part(s: Scenario, stage: int, layer_kinds: tuple, policy: str, saved: dict,
                       params_by_kind: dict, bytes_by_kind: dict) -> tuple[_Params, float, int]:
    """(parameters, activation bytes, chunk activations in flight) of ``stage``: the part of
    ``stage_memory`` the ZeRO stage does not change (``s`` has zero_stage 0), with what
    ``_layout_parts`` shares across the layout's stages; ``saved``: ``layer_activation_bytes``'
    keywords of what the framework's kernels keep (FP8 inputs quantized, eager float32 tensors)."""
    par, tr, m = s.parallelism, s.training, s.model
    tp, pp, vp = par.tp, par.pp, par.vp
    layers = stage_layers(m, stage, pp, vp, par.first_pipeline_num_layers, par.last_pipeline_num_layers,
                          s.pipeline_schedule, pipeline_counts(s))
    params = _stage_params(s, stage, layers, layer_kinds, params_by_kind)
    # DualPipe keeps a second model copy: every rank also holds the mirrored stage, whose layers
    # ``stage_layers`` already counts (2x states in total).
    place = placement(s.pipeline_schedule, pp, vp)

    seq, b, sp, rc = tr.seq_length / par.cp, tr.micro_batch_size, par.sequence_parallel, tr.recompute
    kernels = {"flash_attention": tr.attention != "unfused", "dropout": tr.attention == "unfused", "etp": par.expert_tp,
               **saved}
    # layer_activation_bytes depends on the layer only through its kind (MoE or not; the
    # attention window kept in the key too): the same values, computed once per kind
    # (``bytes_by_kind``: kind -> saved, working set), summed in the same order.
    per_mb, working_set = [], []
    for layer in layers:
        kind = layer_kinds[layer]
        if kind not in bytes_by_kind:
            none = layer_activation_bytes(m, layer, seq, b, tp, sp, "none", **kernels)
            a = none if rc == "none" else layer_activation_bytes(m, layer, seq, b, tp, sp, rc, **kernels)
            saved_op = None
            if rc == "selective" and policy != "attention_core" and not kind[0]:
                saved_op = saved_op_activation_bytes(m, seq, b, tp, sp, policy)
            if saved_op is not None:
                a = saved_op
            elif rc == "selective" and tr.recompute_modules:
                if "core_attn" not in tr.recompute_modules and not kernels["flash_attention"]:
                    a = none  # the attention scores are kept
                a -= recompute_module_savings(m, layer, seq, b, tp, sp, tr.recompute_modules, par.expert_tp,
                                              kernels["quantized_inputs"])
            bytes_by_kind[kind] = (a, none - a)
        per_mb.append(bytes_by_kind[kind][0])
        working_set.append(bytes_by_kind[kind][1])
    # in flight within one pass of the schedule (passes run one after another)
    in_flight = microbatches_in_flight(s.pipeline_schedule, stage, pp, s.microbatches_per_pass, vp)
    activations = sum(per_mb) / place.chunks * in_flight
    activations -= _offloaded_bytes(s, layers, per_mb, layer_kinds, kernels, in_flight, place.chunks, bytes_by_kind)
    activations += max(working_set, default=0.0)
    rep = 1 / tp if sp else 1.0
    embeds, heads = _ends(s, stage)
    if embeds:
        activations += MASK_BYTES * seq * b * m.hidden_size * rep * min(in_flight, s.microbatches_per_pass)
    if heads:
        head_in_flight = s.microbatches_per_pass if s.pipeline_schedule == "gpipe" else 1
        kept = CROSS_ENTROPY[resolve(s).cross_entropy][4]
        head = 2 * ACT_BYTES * seq * b * m.hidden_size * rep + kept * seq * b * m.vocab_size / tp
        activations += head * head_in_flight * heads

    return params, activations, in_flight


def _offloaded_bytes(s: Scenario, layers: list[int], per_mb: list[float], layer_kinds: tuple, kernels: dict,
                     in_flight: int, chunks: int, bytes_by_kind: dict) -> float:
    """Activation bytes CPU offloading keeps off the GPU at the stage's peak (``offload``).

    Layer-level (N of L layers, pp 1): at most L - N layers' activations are on the GPU, so the
    first N layers' bytes of each micro-batch in flight are not. Module-level: every in-flight
    layer's offloaded tensors, less two layers' worth back on the GPU: the forward's last group kept
    as the offload margin and the group being reloaded one ahead of the backward."""
    tr = s.training
    if tr.activation_offload_layers:
        return sum(per_mb[:tr.activation_offload_layers]) / chunks * in_flight
    if not tr.activation_offload_modules:
        return 0.0
    moved = []
    for layer in layers:
        key = ("offload", layer_kinds[layer])
        if key not in bytes_by_kind:
            bytes_by_kind[key] = _module_offload_bytes(s, layer, kernels["quantized_inputs"])
        moved.append(bytes_by_kind[key])
    return max(0.0, sum(moved) / chunks * in_flight - 2 * max(moved, default=0.0))


def _quantized_inputs(s: Scenario, sw) -> bool:
    """Whether the GEMMs keep their FP8 input copy for the backward (``layer_activation_bytes``)."""
    return s.training.precision in SAVED_INPUT_PRECISIONS and sw.fp8_saves_quantized_inputs


def _module_offload_bytes(s: Scenario, layer: int, quantized: bool) -> float:
    """``offload.module_offload_bytes`` of ``layer`` with the scenario's shapes and recompute modules."""
    tr, par = s.training, s.parallelism
    return module_offload_bytes(s.model, layer, tr.seq_length / par.cp, tr.micro_batch_size, par.tp,
                                par.sequence_parallel, tr.activation_offload_modules or (), par.expert_tp, quantized,
                                tr.recompute_modules or () if tr.recompute == "selective" else ())


def offload_bytes_per_layer(s: Scenario) -> dict[int, float]:
    """Bytes per micro-batch each layer copies to the host under the scenario's CPU offloading, as
    the memory model counts them: a whole layer's activations (``layer_activation_bytes``, no
    recompute) for the first ``activation_offload_layers`` layers, else the listed modules' tensors
    (``offload.module_offload_bytes``); layers that offload nothing are left out."""
    tr, par, m = s.training, s.parallelism, s.model
    sw = resolve(s)
    quantized = _quantized_inputs(s, sw)
    seq, b, tp, sp = tr.seq_length / par.cp, tr.micro_batch_size, par.tp, par.sequence_parallel
    out = {}
    for layer in range(m.num_hidden_layers):
        if tr.activation_offload_layers:
            if layer >= tr.activation_offload_layers:
                break
            n = layer_activation_bytes(m, layer, seq, b, tp, sp, "none", flash_attention=tr.attention != "unfused",
                                       dropout=tr.attention == "unfused", etp=par.expert_tp, quantized_inputs=quantized,
                                       **eager_saved(sw))
        else:
            n = _module_offload_bytes(s, layer, quantized)
        if n > 0:
            out[layer] = n
    return out


def stage_memory(
    s: Scenario, stage: int, weight_bytes: float = 2, grad_bytes: float = 2,
    optimizer_bytes: float | None = None,
) -> StageMemory:
    """Peak bytes per GPU of pipeline stage ``stage`` (module docstring has the accounting).

    other = communication buffers (one DDP gradient bucket of max(40e6, 1e6 x DP x CP)
    parameters, Megatron-core's default bucket size, capped at the stage's parameters; with
    ZeRO-3 instead the FSDP buffers: two gathered units in flight for prefetch plus one
    unsharded gradient unit before its reduce-scatter, Zhao et al. 2023) + CUDA context + NCCL
    buffers + allocator fragmentation on all tensor bytes.
    """
    _check(s)
    return _stage_memory(s, _layout_parts(_zero_stage_0(s))[stage], stage, weight_bytes, grad_bytes, optimizer_bytes)


def _zero_stage_0(s: Scenario) -> Scenario:
    """``s`` with ZeRO stage 0: everything but the model states and buffers is the same for every
    ZeRO stage, so it is computed once per layout for all four (the planner screens each layout at
    each stage)."""
    return replace(s, parallelism=replace(s.parallelism, zero_stage=0))


def _stage_memory(s: Scenario, part: tuple[_Params, float, int], stage: int, weight_bytes: float = 2,
                  grad_bytes: float = 2, optimizer_bytes: float | None = None,
                  gathered_once: bool | None = None) -> StageMemory:
    """``stage_memory`` from the stage's ZeRO-independent ``part`` (``_stage_layout_part``), ``s``
    already checked; ``gathered_once`` is ``fsdp_gathered_once(s)`` when the caller has it."""
    if optimizer_bytes is None:
        optimizer_bytes = optimizer_state_bytes(s.training.optimizer_state_dtype)
    par = s.parallelism
    zero = par.zero_stage
    dense_group = par.shard_group(s.dp)  # dp x cp, or one copy's shard group with dp_replicate
    expert_group = s.expert_dp
    params, activations, in_flight = part
    dense_states = _state_components(params.dense, dense_group, zero, weight_bytes, grad_bytes, optimizer_bytes)
    expert_states = _state_components(params.expert, expert_group, zero, weight_bytes, grad_bytes, optimizer_bytes)
    weights, grads, optim = (d + e for d, e in zip(dense_states, expert_states))

    stage_params = params.dense + params.expert
    if fsdp_gathered_once(s) if gathered_once is None else gathered_once:
        # torch pipelining: every layer of the stage stays gathered from its first forward to the
        # chunk's last backward, and its unsharded gradient accumulates over the micro-batches
        # (simulator/data/frameworks/torchtitan.yaml fsdp.pipeline_unsharded)
        buffers = stage_params * (weight_bytes + grad_bytes)
    elif zero >= 3:
        buffers = params.largest_unit * (2 * weight_bytes + grad_bytes)
    else:
        buffers = min(ddp_bucket_params(s.dp * par.cp), stage_params) * grad_bytes
    tensors = weights + grads + optim + activations + buffers
    other = buffers + CUDA_CONTEXT_BYTES + NCCL_BUFFER_BYTES + ALLOCATOR_FRAGMENTATION * tensors
    return StageMemory(stage, weights, grads, optim, activations, other, in_flight)


def memory_peak(s: Scenario) -> tuple[float, float]:
    """(peak GiB per GPU, GPU capacity GiB) exactly as ``memory_report`` gives them (its
    ``peak_gib`` and each stage's ``capacity_gib``), without building the report: what the
    planner needs for each of its tens of thousands of layouts."""
    capacity = gpu_of(s.cluster, s.training.precision).hbm_capacity_bytes / GiB
    _check(s)
    parts = _layout_parts(_zero_stage_0(s))
    once = fsdp_gathered_once(s)
    peak = max(round(_stage_memory(s, part, st, gathered_once=once).total / GiB, 4) for st, part in enumerate(parts))
    return peak, round(capacity, 4)


def memory_report(
    s: Scenario, gpu_capacity_bytes: float | None = None, weight_bytes: float = 2,
    grad_bytes: float = 2, optimizer_bytes: float | None = None,
) -> dict:
    """``memory_record(...).to_dict()``: the JSON form."""
    return memory_record(s, gpu_capacity_bytes, weight_bytes, grad_bytes, optimizer_bytes).to_dict()


def memory_record(
    s: Scenario, gpu_capacity_bytes: float | None = None, weight_bytes: float = 2,
    grad_bytes: float = 2, optimizer_bytes: float | None = None,
) -> MemoryReport:
    """Per-stage memory per GPU in GiB (2**30 bytes), the peak and the OOM verdict (issue 5 JSON).

    ``gpu_capacity_bytes`` defaults to the HBM capacity of ``s.cluster.gpu``.
    """
    if gpu_capacity_bytes is None:
        gpu_capacity_bytes = gpu_of(s.cluster, s.training.precision).hbm_capacity_bytes
    if not gpu_capacity_bytes > 0:
        raise ConfigError("gpu_capacity_bytes", gpu_capacity_bytes, "must be a positive byte count")
    if optimizer_bytes is None:
        optimizer_bytes = optimizer_state_bytes(s.training.optimizer_state_dtype)
    for name, value in (("weight_bytes", weight_bytes), ("grad_bytes", grad_bytes),
                        ("optimizer_bytes", optimizer_bytes)):
        if value < 0:
            raise ConfigError(name, value, "bytes per parameter cannot be negative")
    stages = [stage_memory(s, st, weight_bytes, grad_bytes, optimizer_bytes)
              for st in range(s.parallelism.pp)]
    capacity = gpu_capacity_bytes / GiB
    rows = tuple(_stage_row(st, capacity) for st in stages)
    par = s.parallelism

    counts = param_counts(s.model)
    return MemoryReport(
        stages=rows,
        peak_gib=max(r.total_gib for r in rows),
        fits=all(r.fits for r in rows),
        assumptions={
            "bytes_per_param": {"weights": weight_bytes, "gradients": grad_bytes, "optimizer": optimizer_bytes},
            "zero_stage": par.zero_stage,
            "dense_shard_group": par.shard_group(s.dp),
            "expert_shard_group": s.expert_dp,
            "activations": "Korthikanti et al. 2022 Table 2 per layer, generalised to GQA/SwiGLU/MoE, 16-bit, s / cp; "
                           + ("flash attention: no s x s scores stored, only fp32 softmax statistics "
                              "(4 a s b / t bytes per layer), no dropout masks" if s.training.attention == "flash" else
                              "unfused attention: s x s scores, softmax output and dropout mask stored "
                              "(5 a s^2 b / t bytes per layer unless recomputed)"),
            "recompute": s.training.recompute,
            "sequence_parallel": par.sequence_parallel,
            "schedule": s.schedule,
            "microbatches": s.num_microbatches,
            "microbatches_in_flight": [st.in_flight for st in stages],
            "cuda_context_gib": CUDA_CONTEXT_BYTES / GiB,
            "nccl_buffers_gib": NCCL_BUFFER_BYTES / GiB,
            "allocator_fragmentation": ALLOCATOR_FRAGMENTATION,
            "comm_buffers": ("FSDP under a pipeline: the stage's layers gathered and their gradients unsharded"
                             if fsdp_gathered_once(s) else
                             "FSDP: 2 gathered units + 1 unsharded gradient unit") if par.zero_stage >= 3
                            else "one DDP bucket of max(40e6, 1e6 x dp x cp) params",
            **_offload_assumption(s),
        },
        model_params={"total": counts["total"], "active": counts["active"]},
    )


def _offload_assumption(s: Scenario) -> dict:
    """The ``activation_offload`` entry of the memory assumptions, when the scenario offloads."""
    t = s.training
    if t.activation_offload_layers:
        what = {"layers": t.activation_offload_layers,
                "on_gpu": f"at most {resident_window(s)} of "
                          f"{s.model.num_hidden_layers} layers' activations"}
    elif t.activation_offload_modules:
        what = {"modules": list(t.activation_offload_modules),
                "on_gpu": "their tensors of two layers (the offload margin and the reload ahead)"}
    else:
        return {}
    return {"activation_offload": {**what, "host_link_GBps": host_link_Bps(s) / 1e9}}


@dataclass(frozen=True)
class StageMemoryRow(Record):
    """One stage of ``stepsim memory --json``, GiB rounded to 4 decimals."""

    stage: int = doc("pipeline stage")
    weights_gib: float = doc("model weights held on the GPU (ZeRO-3 shards, or the whole stage)", "GiB")
    gradients_gib: float = doc("gradients (sharded from ZeRO-2)", "GiB")
    optimizer_gib: float = doc("fp32 master weights and Adam moments (sharded from ZeRO-1)", "GiB")
    activations_gib: float = doc("saved activations of the micro-batches in flight", "GiB")
    other_gib: float = doc("communication buffers, CUDA context, NCCL buffers and allocator fragmentation", "GiB")
    total_gib: float = doc("the sum: the stage's peak per GPU", "GiB")
    capacity_gib: float = doc("the GPU's HBM", "GiB")
    fits: bool = doc("total_gib <= capacity_gib")
    biggest: str = doc("the largest component")


@dataclass(frozen=True)
class MemoryReport(Record):
    """What ``stepsim memory --json`` prints (``memory_gib_per_gpu`` of ``run --json``)."""

    stages: tuple[StageMemoryRow, ...] = doc("memory per GPU of each pipeline stage")
    peak_gib: float = doc("the largest stage total", "GiB")
    fits: bool = doc("every stage fits its GPU")
    assumptions: dict = doc("what the memory model assumed: bytes per parameter, sharding, recompute, micro-batches in flight, buffers")
    model_params: dict = doc("total and per-token active parameters")


def _stage_row(st: StageMemory, capacity_gib: float) -> StageMemoryRow:
    total = st.total / GiB
    return StageMemoryRow(st.stage, _gib(st.weights), _gib(st.gradients), _gib(st.optimizer), _gib(st.activations),
                          _gib(st.other), round(total, 4), round(capacity_gib, 4), total <= capacity_gib, st.biggest)


def _gib(n_bytes: float) -> float:
    return round(n_bytes / GiB, 4)


