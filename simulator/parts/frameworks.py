"""Framework profiles: what a training stack does around the GEMMs, as data.

A profile is one YAML file (``simulator/data/frameworks/<name>.yaml`` for the shipped ones, or a
file of the user's given by path): which communication overlaps exist and are on by default,
which elementwise ops run fused, eager or compiled execution and its host cost per kernel, the
FP8 recipe and how its casts are fused, and the optimizer's passes. Every entry is
``{value: ..., source: "..."}``: the framework's docs or source code it comes from.
:func:`load_profile` reads and checks one; ``simulator.workload.frameworks.resolve`` turns it and a
scenario's overrides into the behaviour the cost models read.
"""

from __future__ import annotations

import functools

from simulator.common import resources
from simulator.common.errors import ConfigError
from simulator.common.yamlfile import load_yaml_text


FP8_RECIPES = ("delayed", "tensorwise", "rowwise", "blockwise", "mxfp8")



OVERLAP_KEYS = ("tp_comm", "grad_reduce", "param_gather", "param_prefetch_depth", "async_tp", "cp_comm")



FUSION_KEYS = ("norm", "rope", "activation", "cross_entropy", "cross_entropy_compiled")



EXECUTION_KEYS = ("compile", "cuda_graphs", "host_issue_us", "compiled_host_issue_us")



# Megatron-core --cuda-graph-scope (megatron/core/transformer/enums.py CudaGraphModule, d98e8a6;
# the DeepSeek-V3 GB200 guide, Sec. 2.3): the attention block, the dense MLP, the MoE router (and
# shared experts), the EP preprocess (with the router only), the whole MoE layer (token-drop only)
CUDA_GRAPH_SCOPES = ("attn", "mlp", "moe_router", "moe_preprocess", "moe")



FP8_KEYS = ("recipe", "casts_fused_into_producers", "weight_cast_once_per_step", "saves_quantized_inputs")



OPTIMIZER_KEYS = ("adam_bytes_per_param", "clip_bytes_per_param", "zero_grad_bytes_per_param", "wgrad_bytes_per_param")



# What training.recompute: selective re-runs, per framework (software.recompute_shares,
# memory.saved_op_activation_bytes): Megatron's attention core, torchtitan's per-op SAC, MaxText's
# minimal_flash (elementwise ops only) and MaxText's custom policy saving Q, K, V and the output
# projection (attention core, MLP input projections and elementwise ops re-run)
SELECTIVE_POLICIES = ("attention_core", "every_second_matmul", "elementwise", "attention_projections")



ATTENTION_KERNELS = ("fa2", "sdpa", "fa3", "cudnn")



# The language-model loss as the framework computes it (costs in software.CROSS_ENTROPY): Megatron-core's
# vocab_parallel_cross_entropy unfused or with cross_entropy_loss_fusion (impl native), Transformer
# Engine's parallel_cross_entropy (impl te), PyTorch's F.cross_entropy on fp32 logits eager or under
# torch.compile, flash-attn's Triton CrossEntropyLoss, XLA's fusion of MaxText's custom-VJP loss
CROSS_ENTROPY_IMPLS = ("megatron", "megatron-fused", "te", "torch", "torch-compiled", "triton", "xla")



CP_COMM_TYPES = ("p2p", "all_gather")



CP_MERGES = ("te", "torch")



# Whose transformer-layer code runs: Megatron-core's (megatron/core/transformer, its RoPE and
# MoE experts, with their model-specific unfused paths, ``software.megatron_layer_extras``) or the
# framework's own model code
MODEL_CODES = ("megatron-core", "own")



SECTIONS = {"model": ("code",), "attention": ("kernel", "cp_comm_type", "kv_heads_expanded", "cp_merge"), "overlap": OVERLAP_KEYS, "fusion": FUSION_KEYS, "execution": EXECUTION_KEYS, "fp8": FP8_KEYS,
            "optimizer": OPTIMIZER_KEYS, "recompute": ("selective",), "fsdp": ("pipeline_unsharded", "replica_combine_bytes")}



def framework_names() -> tuple[str, ...]:
    """Profiles shipped in ``data/frameworks/``, sorted."""
    return resources.names("frameworks")



@functools.lru_cache(maxsize=16)
def load_profile(name: str) -> dict:
    """The profile's values by section (sources dropped), or a one-line ConfigError."""
    names = framework_names()
    if name not in names:
        raise ConfigError("framework", name, f"valid: {', '.join(names)}")
    path = resources.entry("frameworks", name)
    raw = load_yaml_text(path.read_text(), "framework", str(path))
    out: dict = {}
    for section, keys in SECTIONS.items():
        entries = raw.get(section) or {}
        out[section] = {}
        for key in keys:
            entry = entries.get(key)
            if not isinstance(entry, dict) or "value" not in entry or not entry.get("source"):
                raise ConfigError(f"{path.name}: {section}.{key}", entry, "needs a value and a source")
            out[section][key] = entry["value"]
    if out["recompute"]["selective"] not in SELECTIVE_POLICIES:
        raise ConfigError(f"{path.name}: recompute.selective", out["recompute"]["selective"],
                          f"valid: {', '.join(SELECTIVE_POLICIES)}")
    for key, valid in (("kernel", ATTENTION_KERNELS), ("cp_comm_type", CP_COMM_TYPES), ("cp_merge", CP_MERGES)):
        if out["attention"][key] not in valid:
            raise ConfigError(f"{path.name}: attention.{key}", out["attention"][key], f"valid: {', '.join(valid)}")
    if out["model"]["code"] not in MODEL_CODES:
        raise ConfigError(f"{path.name}: model.code", out["model"]["code"], f"valid: {', '.join(MODEL_CODES)}")
    for key in ("cross_entropy", "cross_entropy_compiled"):
        if out["fusion"][key] not in CROSS_ENTROPY_IMPLS:
            raise ConfigError(f"{path.name}: fusion.{key}", out["fusion"][key], f"valid: {', '.join(CROSS_ENTROPY_IMPLS)}")
    for key in ("casts_fused_into_producers", "weight_cast_once_per_step", "saves_quantized_inputs"):
        if not isinstance(out["fp8"][key], bool):
            raise ConfigError(f"{path.name}: fp8.{key}", out["fp8"][key], "valid: true, false")
    if out["fp8"]["recipe"] not in FP8_RECIPES:
        raise ConfigError(f"{path.name}: fp8.recipe", out["fp8"]["recipe"], f"valid: {', '.join(FP8_RECIPES)}")
    return out
