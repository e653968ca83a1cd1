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
from pathlib import Path

from simulator.common import limits, resources
from simulator.common.errors import ConfigError
from simulator.common.schema import Choice, Flag, Number, Whole
from simulator.common.yamlfile import load_yaml_file, load_yaml_text


FP8_RECIPES = ("delayed", "tensorwise", "rowwise", "blockwise", "mxfp8")



OVERLAP_KEYS = ("tp_comm", "grad_reduce", "param_gather", "param_prefetch_depth", "async_tp", "cp_comm")



FUSION_KEYS = ("norm", "rope", "activation", "cross_entropy", "cross_entropy_compiled")



EXECUTION_KEYS = ("compile", "cuda_graphs", "host_issue_us", "compiled_host_issue_us")



# Megatron-core --cuda-graph-scope (megatron/core/transformer/enums.py CudaGraphModule, d98e8a6;
# the DeepSeek-V3 GB200 guide, Sec. 2.3): the attention block, the dense MLP, the MoE router (and
# shared experts), the EP preprocess (with the router only), the whole MoE layer (token-drop only)
CUDA_GRAPH_SCOPES = ("attn", "mlp", "moe_router", "moe_preprocess", "moe")



FP8_KEYS = ("recipe", "casts_fused_into_producers", "weight_cast_once_per_step", "saves_quantized_inputs",
            "lm_head_quantized")



OPTIMIZER_KEYS = ("adam_bytes_per_param", "clip_bytes_per_param", "zero_grad_bytes_per_param", "wgrad_bytes_per_param",
                  "weight_cast_bytes_per_param", "grad_cast_bytes_per_param", "grad_accumulate_bytes_per_param")

# How ZeRO-1/2 reduce a gradient bucket over the data-parallel group (program.builder.grad_reduce_op):
# reduce-scatter, each rank keeping its partition (Megatron-core's distributed optimizer), or an
# all-reduce of the whole bucket, each rank copying out its partition (DeepSpeed since its
# multi-rank bucket all-reduce, deepspeed/runtime/zero/stage_1_and_2.py average_tensor)
GRAD_COLLECTIVES = ("reduce_scatter", "all_reduce")

# Keys added after 0.3.0: a profile written before them may leave them out and gets this value
# (0: the pass does not run, as every profile assumed before the key existed)
OPTIONAL_KEYS = {("optimizer", "weight_cast_bytes_per_param"): 0.0,
                 ("optimizer", "grad_cast_bytes_per_param"): 0.0,
                 ("optimizer", "grad_accumulate_bytes_per_param"): 0.0,
                 ("data_parallel", "grad_collective"): "reduce_scatter",
                 ("data_parallel", "zero2_reduce_every_microbatch"): False,
                 ("data_parallel", "ddp_bucket_params"): 0.0,
                 ("fusion", "gelu_new"): "kernel",
                 ("attention", "unfused_softmax"): "fused",
                 ("pipeline", "split"): "layers",
                 ("fsdp", "release_reuse_distance"): 0.0,
                 ("fsdp", "gather_bucket_params"): 0.0,
                 ("fsdp", "reduce_bucket_params"): 0.0,
                 ("pipeline", "max_zero_stage"): 3,
                 ("data_parallel", "max_zero_stage"): 3,
                 # the LM head stays 16-bit under FP8 unless a profile says otherwise (Megatron-core's
                 # output layer is not a Transformer Engine module; torchtitan filters "output")
                 ("fp8", "lm_head_quantized"): False}



# What training.recompute: selective re-runs, per framework (software.recompute_shares,
# memory.saved_op_activation_bytes): Megatron's attention core, torchtitan's per-op SAC, MaxText's
# minimal_flash (elementwise ops only) and MaxText's custom policy saving Q, K, V and the output
# projection (attention core, MLP input projections and elementwise ops re-run)
SELECTIVE_POLICIES = ("attention_core", "every_second_matmul", "elementwise", "attention_projections")



ATTENTION_KERNELS = ("fa1", "fa2", "sdpa", "fa3", "cudnn")



# The language-model loss as the framework computes it (costs in software.CROSS_ENTROPY): Megatron-core's
# vocab_parallel_cross_entropy unfused or with cross_entropy_loss_fusion (impl native), Transformer
# Engine's parallel_cross_entropy (impl te), PyTorch's F.cross_entropy on fp32 logits eager or under
# torch.compile, flash-attn's Triton CrossEntropyLoss, XLA's fusion of MaxText's custom-VJP loss
CROSS_ENTROPY_IMPLS = ("megatron", "megatron-fused", "te", "torch", "torch-compiled", "triton", "xla")



CP_COMM_TYPES = ("p2p", "all_gather")



CP_MERGES = ("te", "torch")



# How the framework's model code runs model.hidden_act gelu_new (the tanh-approximate GELU): one
# kernel (F.gelu(approximate="tanh"), a fused bias-GELU), or transformers' NewGELUActivation, a
# Python formula of eager ops under autocast (``software.GELU_NEW_COMPOSED``)
GELU_NEW_IMPLS = ("kernel", "composed")
# How training.attention: unfused scales, masks and normalises the scores: one fused
# scale-mask-softmax kernel (Megatron's FusedScaleMaskSoftmax, what compute.py prices), or separate
# eager kernels with autocast's float32 softmax (transformers' GPT2Attention, ``software.EAGER_SOFTMAX``)
UNFUSED_SOFTMAX = ("fused", "eager_autocast")

# How the framework spreads the decoder layers over pipeline stages when the scenario does not say
# (no first/last_pipeline_num_layers or pipeline_layers): as many on each stage (Megatron-core;
# pp x vp must divide them), or by cumulative parameter count with the LM head weighed in
# (nanotron's build_model, ``simulator.layout.grid.cost_balanced_split``)
PIPELINE_SPLITS = ("layers", "parameters")

# Whose transformer-layer code runs: Megatron-core's (megatron/core/transformer, its RoPE and
# MoE experts, with their model-specific unfused paths, ``software.megatron_layer_extras``) or the
# framework's own model code
MODEL_CODES = ("megatron-core", "own")






_FLAG = Flag()
_BYTES = Number(0, True, required="must be a number >= 0")
# The profile format, each key once: section -> key -> what it accepts. Every entry of a profile
# file is {value: ..., source: "..."}.
PROFILE_KEYS = {
    "model": {"code": Choice(MODEL_CODES)},
    "attention": {"kernel": Choice(ATTENTION_KERNELS), "cp_comm_type": Choice(CP_COMM_TYPES),
                  "kv_heads_expanded": _FLAG, "cp_merge": Choice(CP_MERGES),
                  "unfused_softmax": Choice(UNFUSED_SOFTMAX)},
    "overlap": {"tp_comm": _FLAG, "grad_reduce": _FLAG, "param_gather": _FLAG,
                "param_prefetch_depth": Whole(0, limits.PREFETCH_DEPTH), "async_tp": _FLAG, "cp_comm": _FLAG},
    "fusion": {"norm": _FLAG, "rope": _FLAG, "activation": _FLAG, "cross_entropy": Choice(CROSS_ENTROPY_IMPLS),
               "cross_entropy_compiled": Choice(CROSS_ENTROPY_IMPLS), "gelu_new": Choice(GELU_NEW_IMPLS)},
    "execution": {"compile": _FLAG, "cuda_graphs": _FLAG, "host_issue_us": _BYTES, "compiled_host_issue_us": _BYTES},
    "fp8": {"recipe": Choice(FP8_RECIPES), "casts_fused_into_producers": _FLAG, "weight_cast_once_per_step": _FLAG,
            "saves_quantized_inputs": _FLAG, "lm_head_quantized": _FLAG},
    "optimizer": {k: _BYTES for k in OPTIMIZER_KEYS},
    "recompute": {"selective": Choice(SELECTIVE_POLICIES)},
    "fsdp": {"pipeline_unsharded": _FLAG, "replica_combine_bytes": _BYTES, "release_reuse_distance": _BYTES,
             "gather_bucket_params": _BYTES, "reduce_bucket_params": _BYTES},
    "data_parallel": {"grad_collective": Choice(GRAD_COLLECTIVES), "zero2_reduce_every_microbatch": _FLAG,
                      "ddp_bucket_params": _BYTES, "max_zero_stage": Choice((0, 1, 2, 3))},
    "pipeline": {"split": Choice(PIPELINE_SPLITS), "max_zero_stage": Choice((0, 1, 2, 3))},
}
SECTIONS = {section: tuple(keys) for section, keys in PROFILE_KEYS.items()}
GENERIC = "generic"  # the profile of a scenario that names no framework


def framework_names() -> tuple[str, ...]:
    """Profiles shipped in ``data/frameworks/``, sorted."""
    return resources.names("frameworks")


def is_profile_path(value: str) -> bool:
    """Whether ``framework:`` names a profile file rather than a shipped profile."""
    return value.lower().endswith((".yaml", ".yml")) or "/" in value or "\\" in value


@functools.lru_cache(maxsize=32)
def load_profile(name: str) -> dict:
    """The profile's values by section (sources dropped): a shipped profile by name, or a profile
    file by path; a one-line ConfigError naming the file and the key otherwise."""
    if is_profile_path(name):
        path = Path(name)
        raw = load_yaml_file(path, "framework")
        where = str(path)
    else:
        names = framework_names()
        if name not in names:
            raise ConfigError("framework", name, f"no shipped profile of that name ({', '.join(names)}): give the path "
                                                 "of a profile YAML (docs/extending.md), or leave framework out for "
                                                 "the generic profile")
        where = f"{name}.yaml"
        raw = load_yaml_text(resources.entry("frameworks", name).read_text(), "framework", where)
    if not isinstance(raw, dict):
        raise ConfigError("framework", where, "must be a YAML mapping of profile sections (docs/extending.md)")
    for section in raw:
        if section not in PROFILE_KEYS and section not in ("name", "description"):
            raise ConfigError(f"{where}: {section}", raw[section],
                              f"unknown section; valid: name, description, {', '.join(PROFILE_KEYS)}")
    out: dict = {}
    for section, kinds in PROFILE_KEYS.items():
        entries = raw.get(section) or {}
        if not isinstance(entries, dict):
            raise ConfigError(f"{where}: {section}", entries, f"must be a mapping of {', '.join(kinds)}")
        for key in entries:
            if key not in kinds:
                raise ConfigError(f"{where}: {section}.{key}", entries[key], f"unknown key; valid: {', '.join(kinds)}")
        out[section] = {}
        for key, kind in kinds.items():
            entry = entries.get(key)
            if entry is None and (section, key) in OPTIONAL_KEYS:
                out[section][key] = OPTIONAL_KEYS[(section, key)]
                continue
            if not isinstance(entry, dict) or "value" not in entry or not entry.get("source"):
                raise ConfigError(f"{where}: {section}.{key}", entry, "needs a value and a source")
            out[section][key] = kind.check(f"{where}: {section}.{key}", entry["value"])
    return out
