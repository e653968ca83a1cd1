"""CPU activation offloading: which saved activations leave the GPU, how many bytes, and when they
move. Pure functions of the scenario; the memory model (``memory``) takes the bytes off the stage's
activations, the program builder (``step.program``) issues the copies and the waits, and the engine
runs the copies on the rank's two copy streams (``engine.StepEngine.copy``).

Two mechanisms, as the frameworks ship them:

- Layer-level (``training.activation_offload_layers`` N of a model's L layers): Megatron-core's
  ``--cpu-offloading --cpu-offloading-num-layers N`` runs Transformer Engine's
  ``get_cpu_offload_context(num_layers=N, model_layers=L)`` (megatron/core/transformer/
  transformer_block.py). TE's default scheduling (docs/features/other_optimizations/cpu_offloading/
  cpu_offloading.rst, TransformerEngine d0067d0): the first N layers are offloaded; at most L - N
  layers' activations are on the GPU at any time, which stalls the forward of layer j until layer
  j - (L - N) is offloaded and lets layer j's reload start only once layer j + (L - N)'s backward
  has freed its activations; a layer's backward waits for its reload. Megatron-core allows it only
  without pipeline parallelism and without recompute (transformer_config.py ``__post_init__``), and
  Megatron-Bridge's performance recipes set it for Llama 3 70B and 405B under Megatron FSDP on
  GB200 / GB300 (scripts/performance/configs/llama/llama3_workload_base_configs.py, v0.4.2).
- Module-level (``training.activation_offload_modules``): Megatron-core's
  ``--fine-grained-activation-offloading --offload-modules ...`` (docs/user-guide/features/
  fine_grained_activation_offloading.md; megatron/core/pipeline_parallel/
  fine_grained_activation_offload.py). Each listed module's saved tensors are copied to pinned host
  memory on a D2H stream right after its forward (the compute stream does not wait), and reloaded
  on an H2D stream one group ahead of the backward that needs them (``bulk_reload``: the next group
  in backward order, across micro-batches and model chunks, ``pre_reload_last_layer``); the backward
  waits for its group's reload. The last groups of the forward are kept on the GPU (the offload
  margin) so the first backward does not wait. Here a layer's listed modules form one group.

The bytes are those the memory model counts for the tensors each module saves
(``memory.layer_activation_bytes``): ``attn_norm`` the layer input; ``qkv_linear`` the QKV GEMM's
input (the norm output, or its FP8 copy); ``core_attn`` Q, K, V and the kernel's log-sum-exp;
``attn_proj`` the output projection's input; ``mlp_norm`` the MLP norm's input; ``expert_fc1`` each
routed token copy's expert input; ``moe_act`` the activation's input (the FC1 outputs). A tensor a
recompute module already frees (``layernorm``'s norm outputs, ``mla_up_proj``'s Q, K, V) is not
offloaded again.

What is left out: the copy engines use no SMs, but the copies read and write HBM; that bandwidth,
small beside the compute's (TE's docs note it may slow memory-bound kernels), is not taken from the
compute. The host memory is assumed large enough (480 GB LPDDR5X per Grace, 2 TB per DGX H100).
"""

from __future__ import annotations

from simulator.scenario.config import ModelConfig, Scenario
from simulator.layout.schedules import SPLIT_BACKWARD
from simulator.workload.kernels import ACT_BYTES, FP8_SAVED_INPUT_BYTES
from simulator.common.units import GBps
from simulator.parts.gpus import gpu_of

# Megatron-core's --offload-modules choices for transformer layers (transformer_config.py);
# fused_group_mlp (TE op fuser) and gdp_qkv (gated delta product) are not modelled.

LSE_BYTES = 4  # the attention kernel's fp32 log-sum-exp per head and token


def module_offload_bytes(model: ModelConfig, layer: int, s: float, b: float, t: int, sp: bool,
                         modules: tuple[str, ...], etp: int | None = None, quantized_inputs: bool = False,
                         recompute_modules: tuple[str, ...] = ()) -> float:
    """Bytes of layer ``layer`` per micro-batch that offloading ``modules`` moves to the host (the
    tensors each module saves, as ``memory.layer_activation_bytes`` counts them; module docstring)."""
    h, d, a = model.hidden_size, model.head_dim, model.num_attention_heads
    tokens = s * b
    rep = 1 / t if sp else 1.0
    gemm_in = FP8_SAVED_INPUT_BYTES if quantized_inputs else ACT_BYTES
    norms_freed = "layernorm" in recompute_modules and not quantized_inputs
    q, kv = a * d, max(model.num_key_value_heads, t) * d
    moved = 0.0
    if "attn_norm" in modules:
        moved += ACT_BYTES * tokens * h * rep
    if "qkv_linear" in modules and not norms_freed:
        moved += gemm_in * tokens * h * rep
    if "core_attn" in modules:
        if not (model.is_mla and "mla_up_proj" in recompute_modules):
            moved += ACT_BYTES * tokens * (q + 2 * kv) / t
        moved += LSE_BYTES * a * tokens / t
    if "attn_proj" in modules:
        moved += gemm_in * tokens * q / t
    if "mlp_norm" in modules:
        moved += ACT_BYTES * tokens * h * rep
    if model.is_moe_layer(layer):
        copies = tokens * model.num_experts_per_tok * (etp or t) / t
        if "expert_fc1" in modules:
            moved += gemm_in * copies * h
        if "moe_act" in modules:
            moved += ACT_BYTES * (model.mlp_matrices - 1) * copies * model.expert_intermediate_size / (etp or t)
    return moved


def layer_offload_runs(pp: int, recompute: str) -> bool:
    """Whether a layout can run layer-level offloading (Megatron-core: pp 1, no recompute)."""
    return pp == 1 and recompute == "none"


def module_offload_runs(recompute: str, schedule: str) -> bool:
    """Whether a layout can run module-level offloading (no full recompute, no split backward)."""
    return recompute != "full" and schedule not in SPLIT_BACKWARD


def resident_window(s: Scenario) -> int:
    """Layers whose activations may be on the GPU at once under layer-level offloading: L - N."""
    return s.model.num_hidden_layers - s.training.activation_offload_layers


def host_link_Bps(s: Scenario) -> float:
    """Bytes per second, per direction, of one GPU's link to its host memory: the cluster's
    ``host_link_GBps`` when set, else the GPU's catalogued link (``hardware.GPUSpec.host_link_Bps``)."""
    if s.cluster.host_link_GBps is not None:
        return GBps(s.cluster.host_link_GBps)
    return gpu_of(s.cluster, s.training.precision).host_link_Bps
