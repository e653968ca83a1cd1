"""Scenario configuration: frozen dataclasses grouped by concern.

The YAML key names are a contract with users (see README): model fields use Hugging Face
``config.json`` names; cluster, training and parallelism fields carry their units in the name.
What-ifs are ``dataclasses.replace``, never mutation.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer, in Hugging Face config.json field names."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    hidden_act: str = "gelu"  # gelu: 2 MLP matrices; silu: SwiGLU, 3 matrices
    tie_word_embeddings: bool = False
    num_experts: int = 0  # routed experts; 0 = dense
    num_experts_per_tok: int = 0
    moe_intermediate_size: int | None = None
    num_shared_experts: int = 0
    first_k_dense_replace: int = 0  # leading dense layers in an MoE model (DeepSeek field name)
    kv_channels: int | None = None  # per-head dimension when not hidden / heads (HF head_dim, Megatron kv_channels)
    q_lora_rank: int | None = None  # MLA (DeepSeek-V2/V3): query down-projection rank; None: no compression
    kv_lora_rank: int | None = None  # MLA: compressed KV rank; None: standard (GQA) attention
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    num_nextn_predict_layers: int = 0  # multi-token-prediction modules on the last stage (DeepSeek-V3)
    interleave_moe_layer_step: int = 1  # every k-th layer is MoE (Llama 4; Qwen decoder_sparse_step)
    sliding_window: int | None = None  # key window of the layers layer_types marks sliding_attention
    layer_types: tuple[str, ...] | None = None  # per layer: full_attention | sliding_attention
    scoring_func: str = "softmax"  # router: softmax (Mixtral, Qwen) or sigmoid (DeepSeek-V3)
    norm_topk_prob: bool = False  # renormalise the top-k router weights (one more pass over them)
    mlp_gated: bool | None = None  # gated MLP (3 matrices) whatever hidden_act says (Grok-1: gated GELU)
    swiglu_limit: float | None = None  # GLU inputs clamped to this (GPT-OSS: 7.0, HF swiglu_limit)
    expert_bias: bool = False  # routed experts' linear layers carry biases (GPT-OSS; HF model_type gpt_oss)
    # YaRN's attention factor on cos/sin, as Megatron-core derives it from rope_scaling
    # (_yarn_get_concentration_factor): 0.1 ln(factor) + 1 without mscale / mscale_all_dim (GPT-OSS:
    # 1.347), their ratio with them (DeepSeek-V3: 1.0); 1.0 without YaRN
    rope_mscale: float = 1.0
    # RMSNorm on each query and key head before RoPE (Qwen3: HF Qwen3Attention q_norm / k_norm, which
    # its config has no field for; Megatron-core qk_layernorm, which Megatron-Bridge's Qwen3 and
    # Qwen3-MoE bridges set)
    qk_norm: bool = False

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
    topology: str = "dgx-h100"
    num_nodes: int = 1
    gpus_per_node: int = 8
    gpu: str = "H100-SXM5-80GB"
    nvlink_bandwidth_GBps: float | None = None
    network_bandwidth_Gbps: float | None = None
    oversubscription: float | None = None
    gpu_memory_gib: float | None = None  # optional overrides of the catalog GPU
    gpu_peak_tflops: float | None = None  # dense peak at the run's precision
    gpu_power_limit_W: float | None = None  # board power limit (nvidia-smi -pl); None: the part's default
    storage_bandwidth_GBps: float | None = None  # checkpoint write rate per node; None: checkpoint.DEFAULT_STORAGE_GBPS
    host_link_GBps: float | None = None  # GPU <-> host memory, per GPU and direction (activation offloading); None: the GPU's

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node


@dataclass(frozen=True)
class TrainingConfig:
    seq_length: int = 2048
    micro_batch_size: int = 1
    global_batch_size: int = 1
    precision: str = "bf16"  # bf16 | fp16 | fp8 | mxfp8 | nvfp4 (GEMMs; attention 16-bit unless fp8_attention)
    recompute: str = "none"  # none | selective | full
    # with recompute: selective, Megatron-core's --recompute-modules (None: core_attn, its default)
    recompute_modules: tuple[str, ...] | None = None
    attention: str = "flash"  # flash (the framework's fused kernel) | fa2 | sdpa | fa3 | cudnn | cudnn91 | flex | unfused (materialised scores, pre-2023 Megatron)
    fp8_attention: bool = False  # attention matmuls in FP8 (Transformer Engine fp8_dot_product_attention, cuDNN); needs an FP8 precision
    # Adam's first and second moments: fp32, or bf16 (Megatron-core --use-precision-aware-optimizer
    # --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16; DeepSeek-V3); the master weights stay fp32
    optimizer_state_dtype: str = "fp32"
    # Times the step runs the pipeline schedule, each pass over num_microbatches / pipeline_passes
    # micro-batches with its own fill, drain and gradient reduction: a framework whose gradient
    # accumulation loop calls the pipeline schedule once per accumulation step (NeMo AutoModel's
    # train_ft.py, torch.distributed.pipelining's schedule.step). 1: one schedule (Megatron).
    pipeline_passes: int = 1
    # CPU activation offloading (``simulator.workload.offload``). Layer-level: the activations of the
    # first N transformer layers go to host memory in the forward and come back for the backward
    # (Megatron-core --cpu-offloading-num-layers, Transformer Engine's get_cpu_offload_context); 0: off.
    activation_offload_layers: int = 0
    # Module-level: the inputs of these submodules go to host memory in every layer (Megatron-core
    # --fine-grained-activation-offloading --offload-modules); None: off.
    activation_offload_modules: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ParallelConfig:
    tp: int = 1
    pp: int = 1
    dp: int | None = None
    cp: int = 1
    ep: int = 1
    vp: int = 1
    sequence_parallel: bool = False
    zero_stage: int = 0
    first_pipeline_num_layers: int | None = None  # Megatron-core decoder_first_pipeline_num_layers
    last_pipeline_num_layers: int | None = None  # decoder_last_pipeline_num_layers
    etp: int | None = None  # expert tensor parallel size (Megatron-core); None: the same as tp
    cp_comm_type: str | None = None  # p2p (K/V ring under the attention core) | all_gather (gathered first); None: the framework's
    # Hybrid sharding (HSDP): ZeRO/FSDP shards over dp x cp / dp_replicate ranks, and dp_replicate
    # copies of the sharded state reduce their gradients with one all-reduce across the copies.
    dp_replicate: int = 1

    @property
    def expert_tp(self) -> int:
        return self.etp or self.tp

    def shard_group(self, dp: int) -> int:
        """Ranks one ZeRO/FSDP shard of the dense state spans: dp x cp / dp_replicate."""
        return dp * self.cp // self.dp_replicate


TOKEN_DISPATCHERS = ("alltoall", "allgather", "flex")
# Megatron-core --moe-flex-dispatcher-backend: the kernels behind the flex dispatcher
FLEX_BACKENDS = ("deepep", "hybridep")
# GEMM precisions whose operands are quantized (Transformer Engine FP8 recipes, MXFP8, NVFP4)
QUANTIZED_PRECISIONS = ("fp8", "mxfp8", "nvfp4")
OPTIMIZER_STATE_DTYPES = ("fp32", "bf16")  # training.optimizer_state_dtype: Adam's moments


def optimizer_state_bytes(dtype: str) -> int:
    """Bytes per parameter of the optimizer state: the fp32 master weight (4) and Adam's two moments
    (4 each in fp32, 2 each in bf16; Rajbhandari et al. 2020 count 12 for fp32 moments)."""
    return 4 + 2 * (2 if dtype == "bf16" else 4)


@dataclass(frozen=True)
class MoEConfig:
    """How the MoE layers run (Megatron-core names in comments); see simulator.workload.moe."""

    imbalance: float = 1.0  # busiest expert rank's routed tokens / the mean (1.0: force-balanced)
    capacity_factor: float | None = None  # moe_expert_capacity_factor: drop and pad to capacity; None: dropless
    max_nodes_per_token: int | None = None  # node-limited routing (DeepSeek-V3: 4); None: unlimited
    token_dispatcher: str = "alltoall"  # moe_token_dispatcher_type: alltoall | allgather | flex (DeepEP)
    flex_backend: str = "deepep"  # moe_flex_dispatcher_backend: deepep | hybridep (flex only)
    overlap_a2a: bool = False  # EP all-to-all hidden behind other compute (only if the framework does it)
    grouped_gemm: bool = True  # moe_grouped_gemm: one grouped kernel for the local experts
    # Transformer Engine's GroupedLinear on Hopper: one cuBLAS GEMM per expert, round-robin on 4
    # streams (simulator.workload.moe); None: one grouped kernel over all experts' tiles (CUTLASS)
    grouped_gemm_streams: int | None = None
    router_dtype: str = "fp32"  # moe_router_dtype: fp32 (Megatron recipes) or bf16


@dataclass(frozen=True)
class OverlapConfig:
    """Which communication the framework hides under compute; None takes the framework profile's
    default (``simulator/data/frameworks/<name>.yaml``)."""

    tp_comm: bool | None = None  # backward TP all-reduce / reduce-scatter under the weight-gradient GEMM
    grad_reduce: bool | None = None  # DP gradient buckets reduced during the last backward
    param_gather: bool | None = None  # ZeRO-1/2 parameter all-gather under the forward; FSDP prefetch
    param_prefetch_depth: int | None = None  # FSDP (ZeRO-3) layers gathered ahead of the one computing
    async_tp: bool | None = None  # forward TP all-gather / reduce-scatter pipelined with the GEMMs
    cp_comm: bool | None = None  # context-parallel K/V exchange under the attention core


@dataclass(frozen=True)
class FrameworkOptions:
    """Switches of the training framework; None takes the profile's default."""

    compile: bool | None = None  # torch.compile / XLA: fused elementwise kernels, lower host cost
    cuda_graphs: bool | None = None  # kernels replayed from a CUDA graph: no per-kernel host issue
    # Megatron-core --cuda-graph-scope: only these modules replayed from CUDA graphs (attn, mlp,
    # moe_router, moe_preprocess, moe); the rest is issued kernel by kernel
    cuda_graph_scope: tuple[str, ...] | None = None
    fp8_recipe: str | None = None  # delayed | tensorwise | rowwise | blockwise | mxfp8
    # hybrid sharding: cross-copy gradient all-reduces combined up to this many bytes per GPU
    # (XLA's --xla_gpu_all_reduce_combine_threshold_bytes when layers are not scanned)
    replica_combine_bytes: float | None = None
    # Megatron-core use_transformer_engine_op_fuser (Megatron-Bridge cutedsl_fused_grouped_mlp): the
    # experts' fc1, activation and fc2 run as one Transformer Engine fused op, biases and the GLU
    # clamp inside it (moe/experts.py _make_fused_ops, Megatron-core 0.18)
    te_op_fuser: bool | None = None
    # Megatron-core moe_router_fusion (Transformer Engine's fused top-k routing) and moe_permute_fusion
    # (TE's fused permutation, chunk sort and unpermutation); None: off, Megatron-core's default
    # (transformer_config.py). Their kernels and host ops: simulator.workload.moe
    moe_router_fusion: bool | None = None
    moe_permute_fusion: bool | None = None
    # Megatron-core --enable-experimental: with moe_permute_fusion, the DeepEP path converts the
    # received top-k indices to its routing map in one fused kernel (fused_indices_to_multihot)
    # instead of PyTorch ops that wait for the GPU three times; None: off, Megatron's default
    enable_experimental: bool | None = None
    # the language-model loss implementation (simulator.workload.frameworks.CROSS_ENTROPY_IMPLS);
    # None: the profile's (fusion.cross_entropy, or fusion.cross_entropy_compiled with compile)
    cross_entropy: str | None = None
    # what training.recompute: selective re-runs (simulator.workload.frameworks.SELECTIVE_POLICIES);
    # None: the profile's (recompute.selective)
    selective_recompute: str | None = None


@dataclass(frozen=True)
class Straggler:
    """A slow GPU (``rank``) or every GPU of a node (``node``): its kernels take
    ``compute_slowdown`` times as long (1.25: a GPU held at 80% clock by a thermal or power cap)."""

    compute_slowdown: float
    rank: int | None = None
    node: int | None = None


@dataclass(frozen=True)
class LinkFault:
    """Links of one class belonging to node ``node`` carry ``bandwidth_fraction`` of their rate
    (0: failed, routes avoid them). ``index`` picks one of them; which links a node owns, and in
    what order, is in :mod:`simulator.network.faults`."""

    node: int
    link_class: str
    bandwidth_fraction: float
    index: int | None = None


@dataclass(frozen=True)
class Faults:
    """What is broken or noisy in the step: slow GPUs, degraded or failed links, and per-kernel
    time jitter (coefficient of variation, drawn from ``seed``). Tuples, so a Scenario hashes."""

    stragglers: tuple[Straggler, ...] = ()
    links: tuple[LinkFault, ...] = ()
    compute_jitter_cv: float = 0.0
    seed: int = 0

    @property
    def active(self) -> bool:
        """Whether anything is faulted (a seed alone changes nothing)."""
        return bool(self.stragglers or self.links or self.compute_jitter_cv > 0)


@dataclass(frozen=True)
class Scenario:
    name: str
    model: ModelConfig
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    parallelism: ParallelConfig = field(default_factory=ParallelConfig)
    schedule: str = "1f1b"  # gpipe | 1f1b | interleaved
    framework: str = "megatron-core"  # a profile in simulator/data/frameworks/
    overlap: OverlapConfig = field(default_factory=OverlapConfig)
    framework_options: FrameworkOptions = field(default_factory=FrameworkOptions)
    moe: MoEConfig = field(default_factory=MoEConfig)
    faults: Faults = field(default_factory=Faults)

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
