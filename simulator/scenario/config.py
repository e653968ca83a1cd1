"""The scenario format: frozen dataclasses grouped by concern, each key declared once.

Every field is a scenario key declared with :func:`simulator.common.schema.key`: its default,
its kind (type, bounds, allowed values), one line of help and its unit. Checks, ``--set`` parsing,
error messages, the JSON Schema (``stepsim schema``) and ``docs/scenario-reference.md`` are all
derived from these declarations.

The YAML key names are a contract with users: model fields use Hugging Face ``config.json``
names; cluster, training and parallelism fields carry their units in the name. What-ifs are
``dataclasses.replace``, never mutation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from simulator.common import limits
from simulator.common.errors import ConfigError
from simulator.parts.frameworks import (CROSS_ENTROPY_IMPLS, CUDA_GRAPH_SCOPES, FP8_RECIPES, GENERIC, GRAD_COLLECTIVES,
                                        SELECTIVE_POLICIES, framework_names, load_profile)
from simulator.parts.calibration import Calibration, calibration_schema, read_calibration
from simulator.parts.gpus import GPUFile, read_gpu_file
from simulator.common.schema import (Between, Choice, Counts, Flag, Kind, Names, Number, PerLayer, Text, Whole, key,
                                     section_schema)

# --- the vocabulary of the format: the values a key may take ---------------------------------

HIDDEN_ACTS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swiglu")
# How a model says where a token is: rotary embeddings on q and k in every layer (Llama, Qwen, ...),
# a learned table added to the token embeddings (GPT-2, GPT-3, OPT, Megatron-LM's learned_absolute,
# llm-foundry's MPT by default), ALiBi's bias inside the attention kernel (BLOOM, MPT with alibi),
# or nothing (``compute.attention_steps``, ``compute.embedding_cost``).
POSITION_EMBEDDINGS = ("rope", "learned", "alibi", "none")
PRECISIONS = ("bf16", "fp16", "fp8", "mxfp8", "nvfp4")  # GEMM precision; attention 16-bit unless training.fp8_attention
RECOMPUTE = ("none", "selective", "full")
ZERO_STAGES = (0, 1, 2, 3)
LAYER_TYPES = ("full_attention", "sliding_attention")
SCORING_FUNCS = ("softmax", "sigmoid")
# training.attention: the framework's fused kernel (flash) or a named one (simulator.workload.attention)
ATTENTION_BACKENDS = ("flash", "fa1", "fa2", "sdpa", "fa3", "cudnn", "cudnn91", "flex", "triton", "unfused")
# Kernels that skip the pairs a document mask leaves out: FlashAttention's variable-length calls
# (flash_attn_varlen_func, FA1's flash_attn_unpadded), cuDNN's through Transformer Engine's THD
# format, FlexAttention's block mask. SDPA, the Triton kernel and unfused attention take a dense
# mask and compute every pair (``training.document_tokens``).
DOCUMENT_MASKED_BACKENDS = ("flash", "fa1", "fa2", "fa3", "cudnn", "cudnn91", "flex")
# Megatron-core --recompute-modules (simulator.workload.compute.RECOMPUTE_MODULE_OPS)
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "moe_act", "shared_experts", "mlp", "moe")
# Megatron-core --offload-modules (simulator.workload.offload)
OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act")
MOE_OFFLOAD_MODULES = ("expert_fc1", "moe_act")  # offload MoE expert tensors
# Pipeline schedules (simulator.layout.schedules.SCHEDULES)
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v", "dualpipe", "dualpipev")
CP_COMM_TYPES = ("p2p", "all_gather")
TOKEN_DISPATCHERS = ("alltoall", "allgather", "flex")
# Megatron-core --moe-flex-dispatcher-backend: the kernels behind the flex dispatcher
FLEX_BACKENDS = ("deepep", "hybridep")
ROUTER_DTYPES = ("fp32", "bf16")
# GEMM precisions whose operands are quantized (Transformer Engine FP8 recipes, MXFP8, NVFP4)
QUANTIZED_PRECISIONS = ("fp8", "mxfp8", "nvfp4")
OPTIMIZER_STATE_DTYPES = ("fp32", "bf16")  # training.optimizer_state_dtype: Adam's moments
LINK_CLASSES = ("nvlink", "pcie", "nic", "leaf-spine", "spine-core")
MAX_SLOWDOWN = 100.0  # a GPU 100x slower than its peers is down, not straggling
MAX_JITTER_CV = 1.0  # measured kernel-time noise is a few percent; cv 1 is already a wild spread
# A persistent per-GPU speed spread: Sinha et al., "Not All GPUs Are Created Equal" (SC'22, arXiv
# 2208.11035) measured 8% average (22% at most) performance variation across the identical GPUs of
# five clusters, outliers 1.5x slower than the median GPU; a cv of 0.3 is far beyond that.
MAX_GPU_SPEED_CV = 0.3


def optimizer_state_bytes(dtype: str) -> int:
    """Bytes per parameter of the optimizer state: the fp32 master weight (4) and Adam's two moments
    (4 each in fp32, 2 each in bf16; Rajbhandari et al. 2020 count 12 for fp32 moments)."""
    return 4 + 2 * (2 if dtype == "bf16" else 4)


def _graph_scope_rule(name: str, scope: tuple[str, ...]) -> None:
    if "moe_preprocess" in scope and "moe_router" not in scope:
        raise ConfigError(name, list(scope), "moe_preprocess is captured with moe_router only (Megatron-core): add moe_router")


@dataclass(frozen=True)
class GPUChoice(Kind):
    """``cluster.gpu``: a catalog name, or a described GPU (``parts.gpus.GPUFile``, a mapping; a
    file path is read into one by the loader, relative to the scenario)."""

    def check(self, name: str, value: object) -> str | GPUFile:
        if isinstance(value, GPUFile):
            return value
        if isinstance(value, dict):
            return read_gpu_file(value, field=name)
        return Text().check(name, value)

    def json(self) -> dict:
        return {"oneOf": [{"type": "string", "minLength": 1,
                           "description": "a catalog GPU, or the path of a GPU YAML file (relative to the scenario)"},
                          section_schema(GPUFile)]}

    def describe(self) -> str:
        return "a catalog GPU name, a GPU YAML file, or a mapping of GPU fields"


@dataclass(frozen=True)
class FrameworkChoice(Kind):
    """``framework``: a shipped profile by name or a profile file by path (the loader makes a
    relative path absolute); null is the generic profile (``parts.frameworks.GENERIC``)."""

    def check(self, name: str, value: object) -> str:
        if value is None:
            return GENERIC
        value = Text().check(name, value)
        load_profile(value)  # an unknown name or a bad file is named here
        return value

    def json(self) -> dict:
        return {"type": ["string", "null"], "minLength": 1, "examples": list(framework_names())}

    def describe(self) -> str:
        return "a shipped profile (" + ", ".join(f"`{n}`" for n in framework_names()) + "), a profile file, or null"


@dataclass(frozen=True)
class CalibrationChoice(Kind):
    """``calibration``: a calibration file (``parts.calibration``; the loader makes a relative path
    absolute against the scenario's folder), its mapping inline, or null: every cost modelled."""

    def check(self, name: str, value: object) -> Calibration | None:
        if value is None:
            return None
        return read_calibration(value, field=name)

    def json(self) -> dict:
        return {"oneOf": [{"type": "string", "minLength": 1,
                           "description": "a calibration file written by stepsim calibrate (relative to the scenario)"},
                          {"type": "null"}, calibration_schema()]}

    def describe(self) -> str:
        return "a calibration file from `stepsim calibrate` (docs/calibrate.md), its mapping inline, or null"


def _dim(minimum: int = 1, limit: limits.Limit = limits.HIDDEN_SIZE, optional: bool = True) -> Whole:
    return Whole(minimum, limit, optional)


def _upto(limit: limits.Limit, minimum: int = 1) -> Whole:
    return Whole(minimum, limit)


_MAYBE = Flag(optional=True)


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer, in Hugging Face config.json field names."""

    hidden_size: int = key(kind=_upto(limits.HIDDEN_SIZE), help="model width (HF hidden_size)")
    num_hidden_layers: int = key(kind=_upto(limits.NUM_LAYERS), help="transformer layers")
    num_attention_heads: int = key(kind=_upto(limits.HIDDEN_SIZE), help="query heads")
    num_key_value_heads: int = key(kind=_upto(limits.HIDDEN_SIZE), help="key/value heads (GQA)",
                                   default_text="num_attention_heads")
    intermediate_size: int = key(kind=_upto(limits.INTERMEDIATE_SIZE), help="dense MLP width")
    vocab_size: int = key(kind=_upto(limits.VOCAB_SIZE), help="vocabulary size", unit="tokens")
    hidden_act: str = key("gelu", Choice(HIDDEN_ACTS), help="MLP activation: gelu-like means 2 MLP matrices, silu/swiglu a gated MLP of 3")
    tie_word_embeddings: bool = key(False, Flag(), help="the LM head shares the embedding matrix")
    num_experts: int = key(0, _upto(limits.NUM_EXPERTS, 0), help="routed experts per MoE layer; 0: a dense model")
    num_experts_per_tok: int = key(0, _upto(limits.NUM_EXPERTS, 0), help="experts each token is routed to (top-k)")
    moe_intermediate_size: int | None = key(None, _dim(limit=limits.INTERMEDIATE_SIZE),
                                            help="width of each routed expert; null: intermediate_size")
    num_shared_experts: int = key(0, _upto(limits.NUM_EXPERTS, 0), help="shared experts every token passes through")
    first_k_dense_replace: int = key(0, _upto(limits.NUM_LAYERS, 0),
                                     help="leading dense layers of an MoE model (DeepSeek field name)", unit="layers")
    kv_channels: int | None = key(None, _dim(), help="per-head width when not hidden / heads (HF head_dim, Megatron kv_channels)")
    q_lora_rank: int | None = key(None, _dim(), help="MLA (DeepSeek-V2/V3): query down-projection rank; null: no compression")
    kv_lora_rank: int | None = key(None, _dim(), help="MLA: compressed key/value rank; null: standard (GQA) attention")
    qk_nope_head_dim: int | None = key(None, _dim(0), help="MLA: per-head query/key width without RoPE")
    qk_rope_head_dim: int | None = key(None, _dim(0), help="MLA: per-head query/key width with RoPE")
    v_head_dim: int | None = key(None, _dim(), help="MLA: per-head value width")
    num_nextn_predict_layers: int = key(0, _upto(limits.NUM_LAYERS, 0),
                                        help="multi-token-prediction modules on the last stage (DeepSeek-V3)")
    interleave_moe_layer_step: int = key(1, _upto(limits.NUM_LAYERS, 1),
                                         help="every k-th layer is MoE (Llama 4; Qwen decoder_sparse_step)")
    sliding_window: int | None = key(None, _dim(limit=limits.SEQ_LENGTH),
                                     help="key window of the layers layer_types marks sliding_attention", unit="tokens")
    layer_types: tuple[str, ...] | None = key(None, PerLayer(LAYER_TYPES),
                                              help="per layer: full_attention or sliding_attention")
    scoring_func: str = key("softmax", Choice(SCORING_FUNCS), help="router scores: softmax (Mixtral, Qwen) or sigmoid (DeepSeek-V3)")
    norm_topk_prob: bool = key(False, Flag(), help="renormalise the top-k router weights (one more pass over them)")
    mlp_gated: bool | None = key(None, _MAYBE, help="gated MLP (3 matrices) whatever hidden_act says (Grok-1: gated GELU); null: from hidden_act")
    swiglu_limit: float | None = key(None, Number(0, False), help="GLU inputs clamped to this (GPT-OSS: 7.0, HF swiglu_limit); null: no clamp")
    expert_bias: bool = key(False, Flag(), help="routed experts' linear layers carry biases (GPT-OSS)")
    # YaRN's attention factor on cos/sin, as Megatron-core derives it from rope_scaling
    # (_yarn_get_concentration_factor): 0.1 ln(factor) + 1 without mscale / mscale_all_dim (GPT-OSS:
    # 1.347), their ratio with them (DeepSeek-V3: 1.0); 1.0 without YaRN
    rope_mscale: float = key(1.0, Between(1.0, math.inf, "must be a number >= 1"),
                             help="YaRN attention factor on cos/sin (from rope_scaling in a Hugging Face config); 1: no YaRN")
    # RMSNorm on each query and key head before RoPE (Qwen3: HF Qwen3Attention q_norm / k_norm, which
    # its config has no field for; Megatron-core qk_layernorm, which Megatron-Bridge's Qwen3 and
    # Qwen3-MoE bridges set)
    qk_norm: bool = key(False, Flag(), help="RMSNorm on each query and key head before RoPE (Qwen3; set from model_type)")
    position_embedding: str = key("rope", Choice(POSITION_EMBEDDINGS),
                                  help="rope (rotary on q and k in every layer), learned (a position table added to the "
                                       "token embeddings: GPT-2, GPT-3, OPT), alibi (a bias inside the attention kernel: "
                                       "BLOOM, MPT) or none; set from model_type")

    @property
    def head_dim(self) -> int:
        """Per-head width: kv_channels (HF head_dim) when given; under MLA the query/key width."""
        if self.kv_lora_rank:
            return (self.qk_nope_head_dim or 0) + (self.qk_rope_head_dim or 0)
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def is_mla(self) -> bool:
        return bool(self.kv_lora_rank)

    @property
    def rotary_qk(self) -> bool:
        """Whether a rotary kernel runs on the attention's q and k (``compute.attention_steps``):
        a rotary model outside MLA, whose decoupled rope is priced in ``mla.py``."""
        return self.position_embedding == "rope" and not self.is_mla

    @property
    def qk_head_dim(self) -> int:
        """Query/key width per head: nope + rope parts under MLA, head_dim otherwise."""
        return self.head_dim

    @property
    def v_dim(self) -> int:
        """Value (and attention output) width per head."""
        return (self.v_head_dim or self.head_dim) if self.is_mla else self.head_dim

    def attention_window(self, layer: int) -> int | None:
        """Key window of ``layer``: sliding_window where layer_types says sliding_attention, else None."""
        if not self.sliding_window or not self.layer_types:
            return None
        kind = self.layer_types[layer] if layer < len(self.layer_types) else "full_attention"
        return self.sliding_window if kind == "sliding_attention" else None

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def mlp_matrices(self) -> int:
        if self.mlp_gated is not None:
            return 3 if self.mlp_gated else 2
        return 3 if self.hidden_act in ("silu", "swiglu", "swish") else 2

    @property
    def expert_intermediate_size(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    def is_moe_layer(self, layer: int) -> bool:
        """MoE after the first_k_dense_replace dense layers, on every interleave_moe_layer_step-th
        layer ((layer + 1) % step == 0, the Llama 4 / Qwen ``decoder_sparse_step`` convention)."""
        step = self.interleave_moe_layer_step
        return self.is_moe and layer >= self.first_k_dense_replace and (layer + 1) % step == 0


@dataclass(frozen=True)
class ClusterConfig:
    """The machines: a topology, how many nodes of it, and optional overrides of its parts."""

    topology: str = key("dgx-h100", Text(), help="a shipped topology name or a topology YAML file (path relative to the scenario)")
    num_nodes: int = key(1, _upto(limits.NUM_GPUS), help="nodes (NVLink domains) in the job")
    gpus_per_node: int = key(8, Whole(1, limits.GPUS_PER_NODE, optional=True), help="GPUs per node the job uses",
                             default_text="the topology's")
    gpu: str | GPUFile = key("H100-SXM5-80GB", GPUChoice(),
                             help="a GPU of the catalog (name or alias), a GPU YAML file, or the GPU's fields inline "
                                  "(docs/extending.md)", default_text="the topology's")
    nvlink_bandwidth_GBps: float | None = key(None, Number(0, False, limits.NVLINK_GBPS),
                                              help="NVLink rate per GPU; null: the GPU's or the topology's", unit="GB/s per direction")
    network_bandwidth_Gbps: float | None = key(None, Number(0, False, limits.NETWORK_GBPS),
                                               help="NIC line rate; null: the topology's", unit="Gb/s per NIC")
    oversubscription: float | None = key(None, Number(1, True, limits.OVERSUBSCRIPTION),
                                         help="leaf uplink oversubscription; null: the topology's (1 = full bisection)")
    gpu_memory_gib: float | None = key(None, Number(0, False, limits.GPU_MEMORY_GIB),
                                       help="override of the GPU's HBM capacity", unit="GiB")
    gpu_peak_tflops: float | None = key(None, Number(0, False, limits.GPU_PEAK_TFLOPS),
                                        help="override of the GPU's dense peak at the run's precision", unit="TFLOP/s")
    gpu_power_limit_W: float | None = key(None, Number(0, False, limits.GPU_POWER_W),
                                          help="board power limit (nvidia-smi -pl); null: the part's default", unit="W")
    storage_bandwidth_GBps: float | None = key(None, Number(0, False, limits.STORAGE_GBPS),
                                               help="checkpoint write rate per node; null: simulator.workload.checkpoint's default", unit="GB/s")
    host_link_GBps: float | None = key(None, Number(0, False, limits.HOST_LINK_GBPS),
                                       help="GPU to host memory rate for activation offloading; null: the GPU's", unit="GB/s per GPU and direction")

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node


@dataclass(frozen=True)
class TrainingConfig:
    """The batch, the precision and what the step re-runs."""

    seq_length: int = key(2048, _upto(limits.SEQ_LENGTH), help="tokens per sequence", unit="tokens")
    micro_batch_size: int = key(1, _upto(limits.MICRO_BATCH), help="sequences per micro-batch", unit="sequences")
    global_batch_size: int = key(1, _upto(limits.GLOBAL_BATCH), help="sequences per step over all data-parallel ranks", unit="sequences")
    precision: str = key("bf16", Choice(PRECISIONS), help="GEMM precision (attention stays 16-bit unless fp8_attention)")
    recompute: str = key("none", Choice(RECOMPUTE), help="activation recompute: none, selective (the framework's policy) or full")
    recompute_modules: tuple[str, ...] | None = key(None, Names(RECOMPUTE_MODULES),
                                                    help="with recompute: selective, Megatron-core's --recompute-modules; null: core_attn")
    attention: str = key("flash", Choice(ATTENTION_BACKENDS),
                         help="attention kernel: flash (the framework's fused kernel) or a named one; unfused materialises the scores")
    fp8_attention: bool = key(False, Flag(), help="attention matmuls in FP8 (Transformer Engine, cuDNN); needs an FP8 precision")
    # Documents packed into each sequence with attention masked to each document (packed SFT with
    # variable-length attention, pre-training with document masking; ``compute._attn_core``): the
    # token-weighted mean document length, sum(d^2) / sum(d), which for documents of one length is
    # that length. null: one document per sequence.
    document_tokens: int | None = key(None, _dim(limit=limits.SEQ_LENGTH),
                                      help="packed documents: attention only within documents of this token-weighted "
                                           "mean length, sum(d^2)/sum(d); null: one document per sequence",
                                      unit="tokens")
    # Adam's first and second moments: fp32, or bf16 (Megatron-core --use-precision-aware-optimizer
    # --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16; DeepSeek-V3); the master weights stay fp32
    optimizer_state_dtype: str = key("fp32", Choice(OPTIMIZER_STATE_DTYPES),
                                     help="Adam's moments in fp32 or bf16 (the master weights stay fp32)")
    # Times the step runs the pipeline schedule, each pass over num_microbatches / pipeline_passes
    # micro-batches with its own fill, drain and gradient reduction: a framework whose gradient
    # accumulation loop calls the pipeline schedule once per accumulation step (NeMo AutoModel's
    # train_ft.py, torch.distributed.pipelining's schedule.step). 1: one schedule (Megatron).
    pipeline_passes: int = key(1, _upto(limits.MICROBATCHES),
                               help="times the step runs the pipeline schedule, each over an equal share of the micro-batches")
    # CPU activation offloading (``simulator.workload.offload``). Layer-level: the activations of the
    # first N transformer layers go to host memory in the forward and come back for the backward
    # (Megatron-core --cpu-offloading-num-layers, Transformer Engine's get_cpu_offload_context); 0: off.
    activation_offload_layers: int = key(0, _upto(limits.NUM_LAYERS, minimum=0),
                                         help="CPU offloading of the first N layers' activations (Megatron-core); 0: off", unit="layers")
    # Module-level: the inputs of these submodules go to host memory in every layer (Megatron-core
    # --fine-grained-activation-offloading --offload-modules); None: off.
    activation_offload_modules: tuple[str, ...] | None = key(None, Names(OFFLOAD_MODULES),
                                                             help="CPU offloading of these submodules' inputs in every layer; null: off")


@dataclass(frozen=True)
class ParallelConfig:
    """How the model is split over the GPUs."""

    tp: int = key(1, _upto(limits.NUM_GPUS), help="tensor-parallel size")
    pp: int = key(1, _upto(limits.NUM_GPUS), help="pipeline-parallel stages")
    dp: int | None = key(None, Whole(1, limits.NUM_GPUS, optional=True),
                         help="data-parallel size; null: GPUs / (tp x pp x cp)")
    cp: int = key(1, _upto(limits.NUM_GPUS), help="context-parallel size (the sequence split over cp ranks)")
    ep: int = key(1, _upto(limits.NUM_GPUS), help="expert-parallel size (MoE)")
    vp: int = key(1, _upto(limits.NUM_LAYERS), help="virtual pipeline chunks per rank (interleaved 1F1B)")
    sequence_parallel: bool = key(False, Flag(), help="Megatron sequence parallelism with tp > 1")
    zero_stage: int = key(0, Choice(ZERO_STAGES), help="ZeRO stage: 1 shards the optimizer, 2 also the gradients, 3 (FSDP) also the weights")
    first_pipeline_num_layers: int | None = key(None, Whole(0, limits.NUM_LAYERS, optional=True),
                                                help="layers of the first stage (Megatron-core decoder_first_pipeline_num_layers); null: even split")
    last_pipeline_num_layers: int | None = key(None, Whole(0, limits.NUM_LAYERS, optional=True),
                                               help="layers of the last stage (decoder_last_pipeline_num_layers); null: even split")
    pipeline_layers: tuple[int, ...] | None = key(None, Counts(0, limits.NUM_LAYERS, limits.NUM_LAYERS),
                                                  help="decoder layers of each virtual stage, pp x vp entries (chunk c of stage s "
                                                       "is entry c x pp + s), for any split a framework makes (nanotron's "
                                                       "cost-balanced one, Megatron-core's pipeline layout); null: even split "
                                                       "or first/last_pipeline_num_layers")
    etp: int | None = key(None, Whole(1, limits.NUM_GPUS, optional=True), help="expert tensor-parallel size (Megatron-core); null: tp")
    cp_comm_type: str | None = key(None, Choice(CP_COMM_TYPES, optional=True),
                                   help="p2p (K/V ring under the attention core) or all_gather (gathered first); null: the framework's")
    # Hybrid sharding (HSDP): ZeRO/FSDP shards over dp x cp / dp_replicate ranks, and dp_replicate
    # copies of the sharded state reduce their gradients with one all-reduce across the copies.
    dp_replicate: int = key(1, _upto(limits.NUM_GPUS),
                            help="hybrid sharding: copies of the ZeRO/FSDP-sharded state (HSDP); 1: plain sharding")

    @property
    def expert_tp(self) -> int:
        return self.etp or self.tp

    def shard_group(self, dp: int) -> int:
        """Ranks one ZeRO/FSDP shard of the dense state spans: dp x cp / dp_replicate."""
        return dp * self.cp // self.dp_replicate


@dataclass(frozen=True)
class MoEConfig:
    """How the MoE layers run (Megatron-core names in help); see simulator.workload.moe."""

    imbalance: float = key(1.0, Number(1, True, required="must be a number >= 1 (busiest expert rank's tokens / the mean)"),
                           help="busiest expert rank's routed tokens / the mean; 1: force-balanced")
    capacity_factor: float | None = key(None, Number(0, False),
                                        help="moe_expert_capacity_factor: drop and pad to capacity; null: dropless")
    max_nodes_per_token: int | None = key(None, Whole(1, optional=True),
                                          help="node-limited routing (DeepSeek-V3: 4); null: unlimited")
    token_dispatcher: str = key("alltoall", Choice(TOKEN_DISPATCHERS),
                                help="moe_token_dispatcher_type: alltoall, allgather or flex (DeepEP, HybridEP)")
    flex_backend: str = key("deepep", Choice(FLEX_BACKENDS), help="moe_flex_dispatcher_backend (flex only)")
    overlap_a2a: bool = key(False, Flag(), help="EP all-to-all hidden behind other compute (only if the framework does it)")
    grouped_gemm: bool = key(True, Flag(), help="moe_grouped_gemm: one grouped kernel for the local experts")
    # Transformer Engine's GroupedLinear on Hopper: one cuBLAS GEMM per expert, round-robin on 4
    # streams (simulator.workload.moe); None: one grouped kernel over all experts' tiles (CUTLASS)
    grouped_gemm_streams: int | None = key(None, Whole(1, optional=True),
                                           help="TE GroupedLinear: one GEMM per expert on this many streams; null: one grouped kernel")
    router_dtype: str = key("fp32", Choice(ROUTER_DTYPES), help="moe_router_dtype: fp32 (Megatron recipes) or bf16")


@dataclass(frozen=True)
class OverlapConfig:
    """Which communication the framework hides under compute; null takes the framework profile's
    default (``simulator/data/frameworks/<name>.yaml``)."""

    tp_comm: bool | None = key(None, _MAYBE, help="backward TP all-reduce / reduce-scatter under the weight-gradient GEMM "
                               "(Megatron's default; Megatron-core's --tp-comm-overlap is async_tp)")
    grad_reduce: bool | None = key(None, _MAYBE, help="DP gradient buckets reduced during the last backward")
    param_gather: bool | None = key(None, _MAYBE, help="ZeRO-1/2 parameter all-gather under the forward; FSDP prefetch")
    param_prefetch_depth: int | None = key(None, Whole(0, limits.PREFETCH_DEPTH, optional=True),
                                           help="FSDP (ZeRO-3) layers gathered ahead of the one computing", unit="layers")
    async_tp: bool | None = key(None, _MAYBE, help="forward TP all-gather / reduce-scatter pipelined with the GEMMs "
                                "(Megatron-core --tp-comm-overlap / NeMo tp_comm_overlap: TE userbuffers; torchtitan "
                                "enable_async_tensor_parallel)")
    cp_comm: bool | None = key(None, _MAYBE, help="context-parallel K/V exchange under the attention core")


@dataclass(frozen=True)
class FrameworkOptions:
    """Switches of the training framework; null takes the profile's default."""

    compile: bool | None = key(None, _MAYBE, help="torch.compile / XLA: fused elementwise kernels, lower host cost")
    cuda_graphs: bool | None = key(None, _MAYBE, help="kernels replayed from a CUDA graph: no per-kernel host issue")
    # Megatron-core --cuda-graph-scope: only these modules replayed from CUDA graphs (attn, mlp,
    # moe_router, moe_preprocess, moe); the rest is issued kernel by kernel
    cuda_graph_scope: tuple[str, ...] | None = key(None, Names(CUDA_GRAPH_SCOPES, rule=_graph_scope_rule),
                                                   help="Megatron-core --cuda-graph-scope: only these modules replayed from CUDA graphs")
    fp8_recipe: str | None = key(None, Choice(FP8_RECIPES, optional=True), help="FP8 scaling recipe; null: the profile's")
    # hybrid sharding: cross-copy gradient all-reduces combined up to this many bytes per GPU
    # (XLA's --xla_gpu_all_reduce_combine_threshold_bytes when layers are not scanned)
    replica_combine_bytes: float | None = key(None, Number(0, True),
                                              help="hybrid sharding: cross-copy gradient all-reduces combined up to this size", unit="bytes per GPU")
    # Megatron-core use_transformer_engine_op_fuser (Megatron-Bridge cutedsl_fused_grouped_mlp): the
    # experts' fc1, activation and fc2 run as one Transformer Engine fused op, biases and the GLU
    # clamp inside it (moe/experts.py _make_fused_ops, Megatron-core 0.18)
    te_op_fuser: bool | None = key(None, _MAYBE, help="Megatron-core use_transformer_engine_op_fuser: the experts as one TE fused op")
    # Megatron-core moe_router_fusion (Transformer Engine's fused top-k routing) and moe_permute_fusion
    # (TE's fused permutation, chunk sort and unpermutation); None: off, Megatron-core's default
    # (transformer_config.py). Their kernels and host ops: simulator.workload.moe
    moe_router_fusion: bool | None = key(None, _MAYBE, help="Megatron-core moe_router_fusion (TE fused top-k routing); null: off")
    moe_permute_fusion: bool | None = key(None, _MAYBE, help="Megatron-core moe_permute_fusion (TE fused permutation); null: off")
    # Megatron-core --enable-experimental: with moe_permute_fusion, the DeepEP path converts the
    # received top-k indices to its routing map in one fused kernel (fused_indices_to_multihot)
    # instead of PyTorch ops that wait for the GPU three times; None: off, Megatron's default
    enable_experimental: bool | None = key(None, _MAYBE, help="Megatron-core --enable-experimental (DeepEP's fused routing map); null: off")
    cross_entropy: str | None = key(None, Choice(CROSS_ENTROPY_IMPLS, optional=True),
                                    help="the language-model loss implementation; null: the profile's")
    selective_recompute: str | None = key(None, Choice(SELECTIVE_POLICIES, optional=True),
                                          help="what recompute: selective re-runs; null: the profile's")
    grad_collective: str | None = key(None, Choice(GRAD_COLLECTIVES, optional=True),
                                      help="how ZeRO-1/2 reduce a gradient bucket (reduce_scatter, or all_reduce as DeepSpeed does); null: the profile's")
    # Megatron-core DistributedDataParallelConfig.nccl_ub: the data-parallel parameter and gradient
    # buffers registered with NCCL, whose all-gathers and reduce-scatters then hold a few SMs
    # (simulator.network.nccl.REGISTERED_KERNEL_SMS); None: off, Megatron-core's default
    nccl_ub: bool | None = key(None, _MAYBE, help="Megatron-core nccl_ub: data-parallel buffers registered with NCCL, "
                               "whose all-gathers / reduce-scatters hold a few SMs; null: off")


@dataclass(frozen=True)
class Straggler:
    """A slow GPU (``rank``) or every GPU of a node (``node``): its kernels take
    ``compute_slowdown`` times as long (1.25: a GPU held at 80% clock by a thermal or power cap)."""

    compute_slowdown: float = key(kind=Between(1.0, MAX_SLOWDOWN, f"must be a compute-time multiplier from 1 to {MAX_SLOWDOWN:g} (1.25: 25% slower)"),
                                  help="compute-time multiplier of the slow GPU(s)")
    rank: int | None = key(None, Whole(0, optional=True), help="the slow GPU (give rank or node)")
    node: int | None = key(None, Whole(0, optional=True), help="every GPU of this node is slow (give rank or node)")


@dataclass(frozen=True)
class LinkFault:
    """Links of one class belonging to node ``node`` carry ``bandwidth_fraction`` of their rate
    (0: failed, routes avoid them). ``index`` picks one of them; which links a node owns, and in
    what order, is in :mod:`simulator.parts.topology`."""

    node: int = key(kind=Whole(0), help="the node whose links are degraded")
    link_class: str = key(kind=Choice(LINK_CLASSES), help="which of the node's links")
    bandwidth_fraction: float = key(kind=Between(0.0, 1.0, "must be a number from 0 (failed) to 1 (healthy)"),
                                    help="fraction of the rate they keep; 0: failed, routed around")
    index: int | None = key(None, Whole(0, optional=True), help="one of those links (simulator.parts.topology.node_links order); null: all")


@dataclass(frozen=True)
class Faults:
    """What is broken or noisy in the step: slow GPUs, degraded or failed links, and per-kernel
    time jitter (coefficient of variation, drawn from ``seed``). Tuples, so a Scenario hashes."""

    stragglers: tuple[Straggler, ...] = key((), help="slow GPUs or nodes: {rank: R} or {node: N}, each with compute_slowdown")
    links: tuple[LinkFault, ...] = key((), help="degraded or failed links: {node: N, link_class: C, bandwidth_fraction: f}, optional index")
    compute_jitter_cv: float = key(0.0, Between(0.0, MAX_JITTER_CV, f"must be a coefficient of variation from 0 to {MAX_JITTER_CV:g} (kernel-time noise is a few percent)"),
                                   help="per-kernel time noise, coefficient of variation")
    gpu_speed_cv: float = key(0.0, Between(0.0, MAX_GPU_SPEED_CV, f"must be a coefficient of variation from 0 to "
                                                                  f"{MAX_GPU_SPEED_CV:g} (measured spreads are a few "
                                                                  "percent)"),
                              help="persistent per-GPU compute speed spread, coefficient of variation: each GPU keeps "
                                   "its speed for the whole step (Sinha et al. SC'22: 8% max-to-min across a cluster's "
                                   "identical GPUs, about 0.012)")
    seed: int = key(0, Whole(0), help="seed of the jitter and speed-spread draws")

    @property
    def active(self) -> bool:
        """Whether anything is faulted (a seed alone changes nothing)."""
        return bool(self.stragglers or self.links or self.compute_jitter_cv > 0 or self.gpu_speed_cv > 0)


@dataclass(frozen=True)
class Scenario:
    """One training step to simulate: the model, the machines, the batch, the layout, the software."""

    name: str = key(kind=Text(), help="the scenario's name in reports", default_text="the file's name without .yaml")
    model: ModelConfig = key(help="the model: Hugging Face config.json fields, hf_config: path, or a Hugging Face id")
    cluster: ClusterConfig = field(default_factory=ClusterConfig, metadata={"section": "the machines"})
    training: TrainingConfig = field(default_factory=TrainingConfig, metadata={"section": "the batch and precision"})
    parallelism: ParallelConfig = field(default_factory=ParallelConfig, metadata={"section": "the layout"})
    schedule: str = key("1f1b", Choice(SCHEDULES), help="pipeline schedule (vp > 1 with 1f1b runs interleaved 1F1B)")
    framework: str = key(GENERIC, FrameworkChoice(),
                         help="the training stack: a shipped profile's name, or the path of a profile YAML "
                              "(docs/extending.md); null or left out: the generic profile")
    overlap: OverlapConfig = field(default_factory=OverlapConfig, metadata={"section": "communication overlap"})
    framework_options: FrameworkOptions = field(default_factory=FrameworkOptions, metadata={"section": "framework switches"})
    moe: MoEConfig = field(default_factory=MoEConfig, metadata={"section": "MoE layers"})
    faults: Faults = field(default_factory=Faults, metadata={"section": "faults and noise"})
    calibration: Calibration | None = key(None, CalibrationChoice(),
                                          help="efficiency factors measured from a profile of the job (stepsim calibrate; "
                                               "path relative to the scenario): each op of a calibrated kernel class takes "
                                               "its modelled time / the class's factor; null: every cost modelled")
    # The keys its file (or mapping, after --set) wrote, "section.key" and top-level names; None
    # when unknown (a Scenario built in Python). Not part of the scenario: only error messages read
    # it, to say a key was left out rather than show its default as a value the user gave.
    given: frozenset[str] | None = field(default=None, compare=False, repr=False)

    @property
    def pipeline_schedule(self) -> str:
        """The schedule that runs: vp > 1 means interleaved 1F1B, whether written 1f1b or interleaved."""
        if self.schedule == "1f1b" and self.parallelism.vp > 1:
            return "interleaved"
        return self.schedule

    @property
    def dp(self) -> int:
        """Data-parallel degree: given, or derived from the GPU count."""
        p = self.parallelism
        if p.dp is not None:
            return p.dp
        return self.cluster.num_gpus // (p.tp * p.pp * p.cp)

    @property
    def expert_dp(self) -> int:
        """Ranks of a stage holding the same experts (expert-DP group): tp x dp x cp / (ep x etp);
        dp x cp for a dense model, whose weights are all dense."""
        p = self.parallelism
        if not self.model.is_moe:
            return self.dp * p.cp
        return p.tp * self.dp * p.cp // (p.ep * p.expert_tp)

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per pipeline per step: global batch / (micro-batch x DP)."""
        return self.training.global_batch_size // (self.training.micro_batch_size * self.dp)

    @property
    def microbatches_per_pass(self) -> int:
        """Micro-batches each run of the pipeline schedule takes (``training.pipeline_passes``)."""
        return self.num_microbatches // self.training.pipeline_passes
