"""Scenario files: YAML in, a checked frozen :class:`Scenario` out, and the plan's validity rules.

``load_scenario`` reads a file, applies ``--set key.path=value`` overrides and checks every
field once (type and range, one-line :class:`ConfigError` naming the dotted field).
``validate_plan`` then checks that the parallel layout can run at all (divisibility rules as
Megatron-LM enforces them) and returns warnings for layouts that run but use slow links.

Model fields use Hugging Face ``config.json`` names. Accepted aliases: ``num_local_experts``
(Mixtral) and ``n_routed_experts`` (DeepSeek) for ``num_experts``, ``n_shared_experts`` for
``num_shared_experts``. ``num_key_value_heads`` defaults to ``num_attention_heads``.
``hf_config: path/to/config.json`` (relative to the scenario file) loads the model fields from a
Hugging Face config, ignoring the keys stepsim does not model (``rope_theta``, ...); fields written
next to it in the scenario override the file's. ``model: deepseek-ai/DeepSeek-V3`` (a Hugging Face
id as a plain string, or ``hf_id:`` inside the mapping) loads the shipped copy of that model's
config.json from ``simulator/data/models`` (:mod:`simulator.parts.models`).

Cluster fields left out or null (``gpu``, ``gpus_per_node``) come from the topology file, so a
``dgx-a100`` cluster gets A100s without saying so twice.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import MISSING, asdict, fields, is_dataclass
from functools import partial
from pathlib import Path

import yaml

from simulator.scenario.config import (FLEX_BACKENDS, OPTIMIZER_STATE_DTYPES, QUANTIZED_PRECISIONS, TOKEN_DISPATCHERS,
                              ClusterConfig, Faults, FrameworkOptions, LinkFault, ModelConfig, MoEConfig, OverlapConfig,
                              ParallelConfig, Scenario, Straggler, TrainingConfig)
from simulator.common import limits
from simulator.common.errors import ConfigError, yaml_text
from simulator.common.yamlfile import load_yaml_file
from simulator.layout.grid import vstage_layers
from simulator.layout.schedules import SCHEDULES, check_schedule_args
from simulator.network.faults import effective_spec, node_links
from simulator.network.cluster import LINK_CLASSES, load_topology, nvlink_GBps, nvlink_generation
from simulator.workload.attention import ATTENTION_BACKENDS
from simulator.workload.frameworks import CROSS_ENTROPY_IMPLS, FP8_RECIPES, SELECTIVE_POLICIES, framework_names

HIDDEN_ACTS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swiglu")
PRECISIONS = ("bf16", "fp16", "fp8", "mxfp8", "nvfp4")  # GEMM precision; attention 16-bit unless training.fp8_attention
RECOMPUTE = ("none", "selective", "full")
ZERO_STAGES = (0, 1, 2, 3)

MODEL_ALIASES = {
    "num_local_experts": "num_experts",
    "n_routed_experts": "num_experts",
    "n_shared_experts": "num_shared_experts",
    "head_dim": "kv_channels",
    "experts_per_token": "num_experts_per_tok",
    "decoder_sparse_step": "interleave_moe_layer_step",
    "moe_layer_freq": "interleave_moe_layer_step",
}
# Hugging Face model types whose attention normalises each query and key head (``qk_norm``).
QK_NORM_MODEL_TYPES = ("qwen3", "qwen3_moe")
HF_CONFIG = "hf_config"
HF_ID = "hf_id"
SECTIONS = {
    "model": ModelConfig,
    "cluster": ClusterConfig,
    "training": TrainingConfig,
    "parallelism": ParallelConfig,
    "overlap": OverlapConfig,
    "framework_options": FrameworkOptions,
    "moe": MoEConfig,
}
LAYER_TYPES = ("full_attention", "sliding_attention")
TOP_LEVEL_SCALARS = ("name", "schedule", "framework")
# Sections a scenario file may carry for other commands; the scenario itself ignores them
# (``claims:`` is read by ``stepsim audit``, see simulator/studies/audit.py).
ANNOTATIONS = ("claims",)
FAULTS = "faults"
FAULT_KEYS = ("stragglers", "links", "compute_jitter_cv", "seed")
STRAGGLER_KEYS = ("rank", "node", "compute_slowdown")
LINK_FAULT_KEYS = ("node", "link_class", "bandwidth_fraction", "index")
MAX_SLOWDOWN = 100.0  # a GPU 100x slower than its peers is down, not straggling
MAX_JITTER_CV = 1.0  # measured kernel-time noise is a few percent; cv 1 is already a wild spread


# --- field checkers: (dotted field, value) -> value, or ConfigError ---------------------------

def whole(field: str, value: object, minimum: int, limit: limits.Limit | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(field, value, f"must be a whole number >= {minimum}")
    if limit is not None and value > limit.maximum:
        raise ConfigError(field, value, f"must be a whole number >= {minimum} and {limit.describe()}")
    return value


def optional_whole(field: str, value: object, minimum: int, limit: limits.Limit | None = None) -> int | None:
    return None if value is None else whole(field, value, minimum, limit)


def _optional_number(field: str, value: object, minimum: float, inclusive: bool,
                     limit: limits.Limit | None = None) -> float | None:
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < minimum or (value == minimum and not inclusive):
        bound = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
        raise ConfigError(field, value, f"must be a number {bound} or null")
    if limit is not None and value > limit.maximum:
        raise ConfigError(field, value, f"must be {limit.describe()}, or null")
    return value


def _choice(field: str, value: object, choices: tuple) -> object:
    if not any(type(value) is type(c) and value == c for c in choices):
        raise ConfigError(field, value, f"valid: {', '.join(str(c) for c in choices)}")
    return value


def _boolean(field: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(field, value, "must be true or false")
    return value


def _optional_boolean(field: str, value: object) -> bool | None:
    return None if value is None else _boolean(field, value)


def _optional_choice(field: str, value: object, choices: tuple) -> object:
    return None if value is None else _choice(field, value, choices)


def _text(field: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(field, value, "must be a non-empty string")
    return value


def _optional_text(field: str, value: object) -> str | None:
    return None if value is None else _text(field, value)


def _optional_flag(field: str, value: object) -> bool | None:
    return None if value is None else _boolean(field, value)


def _number(field: str, value: object, low: float, high: float, what: str) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not low <= value <= high:
        raise ConfigError(field, value, what)
    return float(value)


def _names(field: str, value: object, valid: tuple[str, ...]) -> tuple[str, ...] | None:
    """A non-empty list of names from ``valid``, duplicates dropped; None stays None."""
    if value is None:
        return None
    if (not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, str) for v in value)
            or any(v not in valid for v in value)):
        raise ConfigError(field, value, f"must be a non-empty list of {', '.join(valid)}")
    return tuple(dict.fromkeys(value))


def _recompute_modules(field: str, value: object) -> tuple[str, ...] | None:
    from simulator.workload.compute import RECOMPUTE_MODULES

    return _names(field, value, RECOMPUTE_MODULES)


def _offload_modules(field: str, value: object) -> tuple[str, ...] | None:
    from simulator.workload.offload import OFFLOAD_MODULES

    return _names(field, value, OFFLOAD_MODULES)


def _graph_scope(field: str, value: object) -> tuple[str, ...] | None:
    from simulator.workload.frameworks import CUDA_GRAPH_SCOPES

    scope = _names(field, value, CUDA_GRAPH_SCOPES)
    if scope and "moe_preprocess" in scope and "moe_router" not in scope:
        raise ConfigError(field, value, "moe_preprocess is captured with moe_router only (Megatron-core): add moe_router")
    return scope


def _layer_types(field: str, value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(field, value, f"must be a list of {' or '.join(LAYER_TYPES)}, one per layer")
    for v in value:
        if v not in LAYER_TYPES:
            raise ConfigError(field, v, f"valid layer types: {', '.join(LAYER_TYPES)}")
    return tuple(value)


def _imbalance(field: str, value: object) -> float:
    if value is None:
        raise ConfigError(field, value, "must be a number >= 1 (busiest expert rank's tokens / the mean)")
    return float(_optional_number(field, value, 1, True))


Checker = Callable[[str, object], object]


def _upto(limit: limits.Limit, minimum: int = 1) -> Checker:
    return partial(whole, minimum=minimum, limit=limit)


_CHECKS: dict[str, dict[str, Checker]] = {
    "model": {
        "hidden_size": _upto(limits.HIDDEN_SIZE),
        "num_hidden_layers": _upto(limits.NUM_LAYERS),
        "num_attention_heads": _upto(limits.HIDDEN_SIZE),
        "num_key_value_heads": _upto(limits.HIDDEN_SIZE),
        "intermediate_size": _upto(limits.INTERMEDIATE_SIZE),
        "vocab_size": _upto(limits.VOCAB_SIZE),
        "hidden_act": partial(_choice, choices=HIDDEN_ACTS),
        "tie_word_embeddings": _boolean,
        "num_experts": _upto(limits.NUM_EXPERTS, 0),
        "num_experts_per_tok": _upto(limits.NUM_EXPERTS, 0),
        "moe_intermediate_size": partial(optional_whole, minimum=1, limit=limits.INTERMEDIATE_SIZE),
        "num_shared_experts": _upto(limits.NUM_EXPERTS, 0),
        "first_k_dense_replace": _upto(limits.NUM_LAYERS, 0),
        "kv_channels": partial(optional_whole, minimum=1, limit=limits.HIDDEN_SIZE),
        "q_lora_rank": partial(optional_whole, minimum=1, limit=limits.HIDDEN_SIZE),
        "kv_lora_rank": partial(optional_whole, minimum=1, limit=limits.HIDDEN_SIZE),
        "qk_nope_head_dim": partial(optional_whole, minimum=0, limit=limits.HIDDEN_SIZE),
        "qk_rope_head_dim": partial(optional_whole, minimum=0, limit=limits.HIDDEN_SIZE),
        "v_head_dim": partial(optional_whole, minimum=1, limit=limits.HIDDEN_SIZE),
        "num_nextn_predict_layers": _upto(limits.NUM_LAYERS, 0),
        "interleave_moe_layer_step": _upto(limits.NUM_LAYERS, 1),
        "sliding_window": partial(optional_whole, minimum=1, limit=limits.SEQ_LENGTH),
        "layer_types": _layer_types,
        "scoring_func": partial(_choice, choices=("softmax", "sigmoid")),
        "norm_topk_prob": _boolean,
        "mlp_gated": _optional_flag,
        "swiglu_limit": partial(_optional_number, minimum=0, inclusive=False),
        "expert_bias": _boolean,
        "qk_norm": _boolean,
        "rope_mscale": partial(_number, low=1.0, high=math.inf, what="must be a number >= 1"),
    },
    "cluster": {
        "topology": _text,
        "num_nodes": _upto(limits.NUM_GPUS),
        "gpus_per_node": _upto(limits.GPUS_PER_NODE),
        "gpu": _text,
        "nvlink_bandwidth_GBps": partial(_optional_number, minimum=0, inclusive=False, limit=limits.NVLINK_GBPS),
        "network_bandwidth_Gbps": partial(_optional_number, minimum=0, inclusive=False, limit=limits.NETWORK_GBPS),
        "oversubscription": partial(_optional_number, minimum=1, inclusive=True, limit=limits.OVERSUBSCRIPTION),
        "gpu_memory_gib": partial(_optional_number, minimum=0, inclusive=False, limit=limits.GPU_MEMORY_GIB),
        "gpu_peak_tflops": partial(_optional_number, minimum=0, inclusive=False, limit=limits.GPU_PEAK_TFLOPS),
        "gpu_power_limit_W": partial(_optional_number, minimum=0, inclusive=False, limit=limits.GPU_POWER_W),
        "storage_bandwidth_GBps": partial(_optional_number, minimum=0, inclusive=False, limit=limits.STORAGE_GBPS),
        "host_link_GBps": partial(_optional_number, minimum=0, inclusive=False, limit=limits.HOST_LINK_GBPS),
    },
    "training": {
        "seq_length": _upto(limits.SEQ_LENGTH),
        "micro_batch_size": _upto(limits.MICRO_BATCH),
        "global_batch_size": _upto(limits.GLOBAL_BATCH),
        "precision": partial(_choice, choices=PRECISIONS),
        "recompute": partial(_choice, choices=RECOMPUTE),
        "recompute_modules": _recompute_modules,
        "attention": partial(_choice, choices=ATTENTION_BACKENDS),
        "fp8_attention": _boolean,
        "optimizer_state_dtype": partial(_choice, choices=OPTIMIZER_STATE_DTYPES),
        "pipeline_passes": _upto(limits.MICROBATCHES),
        "activation_offload_layers": _upto(limits.NUM_LAYERS, minimum=0),
        "activation_offload_modules": _offload_modules,
    },
    "parallelism": {
        "tp": _upto(limits.NUM_GPUS),
        "pp": _upto(limits.NUM_GPUS),
        "dp": partial(optional_whole, minimum=1, limit=limits.NUM_GPUS),
        "cp": _upto(limits.NUM_GPUS),
        "ep": _upto(limits.NUM_GPUS),
        "etp": partial(optional_whole, minimum=1, limit=limits.NUM_GPUS),
        "vp": _upto(limits.NUM_LAYERS),
        "sequence_parallel": _boolean,
        "zero_stage": partial(_choice, choices=ZERO_STAGES),
        "first_pipeline_num_layers": partial(optional_whole, minimum=0, limit=limits.NUM_LAYERS),
        "last_pipeline_num_layers": partial(optional_whole, minimum=0, limit=limits.NUM_LAYERS),
        "cp_comm_type": partial(_optional_choice, choices=("p2p", "all_gather")),
        "dp_replicate": _upto(limits.NUM_GPUS),
    },
    "overlap": {
        "tp_comm": _optional_boolean,
        "grad_reduce": _optional_boolean,
        "param_gather": _optional_boolean,
        "param_prefetch_depth": partial(optional_whole, minimum=0, limit=limits.PREFETCH_DEPTH),
        "async_tp": _optional_boolean,
        "cp_comm": _optional_boolean,
    },
    "framework_options": {
        "compile": _optional_boolean,
        "cuda_graphs": _optional_boolean,
        "cuda_graph_scope": _graph_scope,
        "fp8_recipe": partial(_optional_choice, choices=FP8_RECIPES),
        "replica_combine_bytes": partial(_optional_number, minimum=0, inclusive=True),
        "te_op_fuser": _optional_boolean,
        "moe_router_fusion": _optional_boolean,
        "moe_permute_fusion": _optional_boolean,
        "enable_experimental": _optional_boolean,
        "cross_entropy": partial(_optional_choice, choices=CROSS_ENTROPY_IMPLS),
        "selective_recompute": partial(_optional_choice, choices=SELECTIVE_POLICIES),
    },
    "moe": {
        "imbalance": _imbalance,
        "capacity_factor": partial(_optional_number, minimum=0, inclusive=False),
        "max_nodes_per_token": partial(optional_whole, minimum=1),
        "token_dispatcher": partial(_choice, choices=TOKEN_DISPATCHERS),
        "flex_backend": partial(_choice, choices=FLEX_BACKENDS),
        "overlap_a2a": _boolean,
        "grouped_gemm": _boolean,
        "grouped_gemm_streams": partial(optional_whole, minimum=1),
        "router_dtype": partial(_choice, choices=("fp32", "bf16")),
    },
}


def valid_keys(section: str) -> tuple[str, ...]:
    """Keys a scenario section accepts, sorted (the model section includes aliases and hf_config)."""
    keys = set(_CHECKS[section])
    if section == "model":
        keys |= set(MODEL_ALIASES) | {HF_CONFIG, HF_ID}
    return tuple(sorted(keys))


def _unknown(field: str, value: object, valid: Iterable[str]) -> ConfigError:
    return ConfigError(field, value, f"unknown key; valid: {', '.join(valid)}")


# --- loading -----------------------------------------------------------------------------------

def read_scenario_file(path: str | Path) -> dict:
    """The raw mapping of a scenario YAML file, or a one-line ConfigError naming the file."""
    p = Path(path)
    try:
        found = p.is_file()
    except OSError:
        found = False
    if not found:
        raise ConfigError("scenario", str(path), "is a folder, not a scenario file" if p.is_dir() else "no such file")
    raw = load_yaml_file(p, "scenario")
    if not isinstance(raw, dict):
        raise ConfigError("scenario", str(path), "must be a YAML mapping of name, model, cluster, "
                          "training, parallelism and schedule")
    return raw


def load_scenario(path: str, overrides: Iterable[str] = ()) -> Scenario:
    """Read a scenario YAML file, apply ``--set`` overrides, and check every field."""
    p = Path(path)
    return scenario_from_dict(read_scenario_file(p), overrides, base_dir=p.parent, default_name=p.stem)


def _copy_data(x):
    """``copy.deepcopy`` of parsed YAML data, faster on its dicts, lists and scalars."""
    t = type(x)
    if t in (int, float, str, bool, type(None)):
        return x
    if t is dict:
        return {k: _copy_data(v) for k, v in x.items()}
    if t is list:
        return [_copy_data(v) for v in x]
    return copy.deepcopy(x)


def apply_overrides(d: dict, overrides: Iterable[str]) -> dict:
    """A copy of ``d`` with each ``key.path=value`` applied; values are parsed as YAML scalars.

    ``parallelism.tp=8`` sets an int, ``parallelism.dp=null`` sets None, ``name=x`` a top-level
    value. Setting a model field drops its aliases (``model.num_experts=16`` replaces a
    ``num_local_experts`` written in the file). ``model=<Hugging Face id>`` replaces the whole model
    with a catalog model, as ``model: <id>`` in the file does.
    """
    out = _copy_data(d)
    for item in overrides:
        key, sep, text = str(item).partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError("--set", item, "expected key.path=value, e.g. parallelism.tp=8")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            value = text
        parts = key.split(".")
        head = parts[0]
        if head in TOP_LEVEL_SCALARS:
            if len(parts) != 1:
                raise ConfigError(key, value, f"{head} is a single value: use --set {head}=...")
            out[head] = value
            continue
        if head == FAULTS:
            if len(parts) != 2:  # the whole section, or too deep: name one key per --set
                raise ConfigError(key, value, f"expected {FAULTS}.<key>; valid keys: {', '.join(FAULT_KEYS)}")
            if parts[1] not in FAULT_KEYS:
                raise _unknown(key, value, [f"{FAULTS}.{k}" for k in FAULT_KEYS])
            section = out.get(FAULTS)
            if section is None:
                section = out[FAULTS] = {}
            if not isinstance(section, dict):
                raise ConfigError(FAULTS, section, "must be a mapping of keys")
            section[parts[1]] = value
            continue
        if head not in SECTIONS:
            raise _unknown(key, value, [*TOP_LEVEL_SCALARS, *(f"{s}.<key>" for s in (*SECTIONS, FAULTS))])
        if key == "model" and isinstance(value, str) and value.strip():
            out["model"] = value.strip()  # a catalog id, checked where the model is built
            continue
        if len(parts) != 2:
            ids = "a Hugging Face id (model=meta-llama/Llama-3.1-8B) or " if key == "model" else ""
            raise ConfigError(key, value, f"expected {ids}{head}.<key>; valid keys: {', '.join(valid_keys(head))}")
        name = parts[1]
        if name not in valid_keys(head):
            raise _unknown(key, value, valid_keys(head))
        section = out.get(head)
        if section is None:
            section = out[head] = {}
        if head == "model" and isinstance(section, str):
            section = out[head] = {HF_ID: section}
        if not isinstance(section, dict):
            raise ConfigError(head, section, "must be a mapping of keys")
        if head == "model":
            canonical = MODEL_ALIASES.get(name, name)
            for other in [k for k in section if k != name and MODEL_ALIASES.get(k, k) == canonical]:
                del section[other]
        section[name] = value
    return out


def scenario_from_dict(d: dict, overrides: Iterable[str] = (), *, base_dir: str | Path | None = None,
                       default_name: str = "scenario") -> Scenario:
    """Build a checked :class:`Scenario` from a parsed scenario mapping.

    ``base_dir`` is where relative ``hf_config`` and topology paths are looked up (the scenario
    file's folder; the working directory when None).
    """
    if not isinstance(d, dict):
        raise ConfigError("scenario", type(d).__name__, "must be a mapping of name, model, cluster, "
                          "training, parallelism and schedule")
    d = apply_overrides(d, overrides)
    known = (*TOP_LEVEL_SCALARS, *SECTIONS, FAULTS, *ANNOTATIONS)
    for key in d:
        if key not in known:
            raise _unknown(str(key), d[key], known)
    base = Path(base_dir) if base_dir is not None else Path(".")
    sections = {}
    for name in SECTIONS:
        raw = d.get(name)
        if raw is None:
            raw = {}
        if name == "model" and isinstance(raw, str):
            raw = {HF_ID: raw}
        if not isinstance(raw, dict):
            raise ConfigError(name, raw, f"must be a mapping; valid keys: {', '.join(valid_keys(name))}")
        sections[name] = raw
    if "model" not in d:
        raise ConfigError("model", None, "required: Hugging Face config.json fields, hf_config: path, "
                          "or a Hugging Face id such as deepseek-ai/DeepSeek-V3")
    cluster = _cluster(sections["cluster"], base)
    return Scenario(
        name=_text("name", d.get("name", default_name)),
        model=_model(sections["model"], base),
        cluster=cluster,
        training=_training(sections["training"]),
        parallelism=_section("parallelism", sections["parallelism"], ParallelConfig),
        schedule=_choice("schedule", d.get("schedule", "1f1b"), tuple(SCHEDULES)),
        framework=_choice("framework", d.get("framework", "megatron-core"), framework_names()),
        overlap=_section("overlap", sections["overlap"], OverlapConfig),
        framework_options=_section("framework_options", sections["framework_options"], FrameworkOptions),
        moe=_section("moe", sections["moe"], MoEConfig),
        faults=_faults(d.get(FAULTS), cluster),
    )


def _training(raw: dict) -> TrainingConfig:
    t = _section("training", raw, TrainingConfig)
    if t.recompute_modules is not None and t.recompute != "selective":
        raise ConfigError("training.recompute_modules", list(t.recompute_modules),
                          f"needs recompute: selective (got {t.recompute})")
    return t


def _section(name: str, raw: dict, cls: type):
    checks = _CHECKS[name]
    for key in raw:
        if key not in checks:
            raise _unknown(f"{name}.{key}", raw[key], sorted(checks))
    values = {}
    for f in fields(cls):
        if f.name in raw:
            values[f.name] = checks[f.name](f"{name}.{f.name}", raw[f.name])
        elif f.default is MISSING and f.default_factory is MISSING:
            raise ConfigError(f"{name}.{f.name}", None, "required")
    return cls(**values)


def _model(raw: dict, base: Path) -> ModelConfig:
    for key in raw:
        if key not in valid_keys("model"):
            raise _unknown(f"model.{key}", raw[key], valid_keys("model"))
    merged: dict = {}
    if raw.get(HF_ID) is not None:
        from simulator.parts.models import catalog_config

        merged.update(_hf_dict_fields(catalog_config(_text("model.hf_id", raw[HF_ID]))))
    if raw.get(HF_CONFIG) is not None:
        merged.update(_hf_fields(raw[HF_CONFIG], base))
    written: dict[str, str] = {}
    for key, value in raw.items():
        if key in (HF_CONFIG, HF_ID):
            continue
        canonical = MODEL_ALIASES.get(key, key)
        if canonical in written and raw[written[canonical]] != value:
            raise ConfigError(f"model.{key}", value,
                              f"conflicts with model.{written[canonical]} ({raw[written[canonical]]!r}): give one")
        written[canonical] = key
        merged[canonical] = value
    if merged.get("num_key_value_heads") is None and "num_attention_heads" in merged:
        merged["num_key_value_heads"] = merged["num_attention_heads"]
    model = _section("model", merged, ModelConfig)
    if model.kv_channels is None and model.hidden_size % model.num_attention_heads:
        raise ConfigError("model.hidden_size", model.hidden_size,
                          f"must be a multiple of num_attention_heads ({model.num_attention_heads})")
    if model.num_attention_heads % model.num_key_value_heads:
        raise ConfigError("model.num_key_value_heads", model.num_key_value_heads,
                          f"must divide num_attention_heads ({model.num_attention_heads})")
    if model.num_experts and not 1 <= model.num_experts_per_tok <= model.num_experts:
        raise ConfigError("model.num_experts_per_tok", model.num_experts_per_tok,
                          f"must be between 1 and num_experts ({model.num_experts})")
    if not model.num_experts and (model.num_experts_per_tok or model.num_shared_experts):
        field = "num_experts_per_tok" if model.num_experts_per_tok else "num_shared_experts"
        raise ConfigError(f"model.{field}", getattr(model, field),
                          "must be 0 for a dense model (num_experts is 0)")
    if model.first_k_dense_replace > model.num_hidden_layers:
        raise ConfigError("model.first_k_dense_replace", model.first_k_dense_replace,
                          f"must be at most num_hidden_layers ({model.num_hidden_layers})")
    if model.kv_lora_rank:
        for name in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if getattr(model, name) is None:
                raise ConfigError(f"model.{name}", None, "required with kv_lora_rank (multi-head latent attention)")
    if model.layer_types is not None and len(model.layer_types) != model.num_hidden_layers:
        raise ConfigError("model.layer_types", f"{len(model.layer_types)} entries",
                          f"must give one per layer ({model.num_hidden_layers})")
    return model


def _hf_fields(path_value: object, base: Path) -> dict:
    """The fields stepsim models, read from a Hugging Face config.json; other keys are ignored."""
    _text("model.hf_config", path_value)
    path = Path(path_value)
    if not path.is_absolute():
        path = base / path
    if not path.is_file():
        raise ConfigError("model.hf_config", str(path_value), f"no such file ({path})")
    try:
        hf = json.loads(path.read_text(), object_pairs_hook=_unique_keys)
    except _DuplicateJSONKey as err:
        raise ConfigError("model.hf_config", str(path_value), f"duplicate key {err.args[0]!r}; give each key once") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError("model.hf_config", str(path_value), f"is not valid JSON ({err.__class__.__name__})") from None
    if not isinstance(hf, dict):
        raise ConfigError("model.hf_config", str(path_value), "must be a JSON object of config fields")
    return _hf_dict_fields(hf)


def _hf_dict_fields(hf: dict) -> dict:
    """The modelled fields of a parsed Hugging Face config, translated where the HF layout differs:

    - a multimodal config (Llama 4) keeps its language model in ``text_config``;
    - Llama 4 names the expert (and shared-expert) width ``intermediate_size`` and the dense
      layers' ``intermediate_size_mlp``, and every Llama 4 MoE layer has one shared expert
      (HF ``Llama4TextMoe.shared_expert``);
    - ``sliding_window`` only applies where ``layer_types`` marks ``sliding_attention``, or to
      every layer when there is no ``layer_types`` and ``use_sliding_window`` is not false
      (Mistral 7B); Qwen3 and Mixtral give ``sliding_window: null`` or ``use_sliding_window: false``;
    - Grok-1's feed-forward is gated (three matrices around a GELU, xai-org/grok-1 model.py
      ``DenseBlock``: linear, linear_v, linear_1), which ``hidden_act: gelu`` alone does not say;
    - GPT-OSS's experts carry biases (HF ``GptOssExperts`` gate_up_proj_bias, down_proj_bias; the
      config has no field for it): ``expert_bias``;
    - Qwen3 (dense and MoE) normalises each query and key head (HF ``Qwen3Attention.q_norm`` /
      ``k_norm``; no config field): ``qk_norm``;
    - ``rope_scaling`` of type yarn gives ``rope_mscale`` (``yarn_mscale``).
    """
    if isinstance(hf.get("text_config"), dict):
        hf = {**{k: v for k, v in hf.items() if k != "text_config"}, **hf["text_config"]}
    hf = dict(hf)
    if hf.get("intermediate_size_mlp") is not None and hf.get("num_local_experts"):
        hf["moe_intermediate_size"] = hf["intermediate_size"]
        hf["intermediate_size"] = hf["intermediate_size_mlp"]
        hf.setdefault("n_shared_experts", 1)
    if hf.get("sliding_window") and hf.get("layer_types") is None:
        if hf.get("use_sliding_window") is False:
            hf["sliding_window"] = None
        elif isinstance(hf.get("num_hidden_layers"), int):
            hf["layer_types"] = ["sliding_attention"] * hf["num_hidden_layers"]
    if str(hf.get("model_type", "")).lower() == "grok-1":
        hf.setdefault("mlp_gated", True)
    if str(hf.get("model_type", "")).lower() == "gpt_oss":
        hf.setdefault("expert_bias", True)
    if str(hf.get("model_type", "")).lower() in QK_NORM_MODEL_TYPES:
        hf.setdefault("qk_norm", True)
    mscale = yarn_mscale(hf.get("rope_scaling"))
    if mscale != 1.0:
        hf.setdefault("rope_mscale", mscale)
    out = {}
    # Canonical names first, so an alias never shadows a field the file also gives by its own name.
    for key in sorted(hf, key=lambda k: k in MODEL_ALIASES):
        canonical = MODEL_ALIASES.get(key, key)
        if canonical in _CHECKS["model"] and hf[key] is not None and canonical not in out:
            out[canonical] = hf[key]
    return out


def yarn_mscale(rope_scaling: object) -> float:
    """YaRN's attention factor on cos/sin as Megatron-core computes it (yarn_rotary_pos_embedding.py
    ``_yarn_get_mscale``, ``_yarn_get_concentration_factor``): g(f, m) = 0.1 m ln f + 1 (1 for
    f <= 1); g(f, mscale) / g(f, mscale_all_dim) when the config gives both, else g(f, 1).
    1.0 for any other rope_scaling or none."""
    if not isinstance(rope_scaling, dict):
        return 1.0
    kind = str(rope_scaling.get("rope_type") or rope_scaling.get("type") or "").lower()
    factor = rope_scaling.get("factor")
    if kind != "yarn" or not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor <= 1:
        return 1.0

    def g(m: float) -> float:
        return 0.1 * m * math.log(factor) + 1.0

    m, m_all = rope_scaling.get("mscale"), rope_scaling.get("mscale_all_dim")
    if isinstance(m, (int, float)) and isinstance(m_all, (int, float)) and g(m_all) > 0:
        return g(m) / g(m_all)
    return g(1.0)


class _DuplicateJSONKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateJSONKey(key)
        out[key] = value
    return out


def _cluster(raw: dict, base: Path) -> ClusterConfig:
    raw = dict(raw)
    topology = raw.get("topology", ClusterConfig.topology)
    if isinstance(topology, str) and Path(topology).suffix and not Path(topology).is_absolute():
        candidate = base / topology
        if candidate.is_file():
            raw["topology"] = str(candidate)
    for key in ("gpu", "gpus_per_node"):  # null, like leaving it out: the topology's
        if key in raw and raw[key] is None:
            del raw[key]
    if "gpu" not in raw or "gpus_per_node" not in raw:
        spec = load_topology(_text("cluster.topology", raw.get("topology", topology)))
        raw.setdefault("gpu", spec.gpu)
        raw.setdefault("gpus_per_node", spec.gpus_per_node)
    cluster = _section("cluster", raw, ClusterConfig)
    if cluster.num_gpus > limits.NUM_GPUS.maximum:
        raise ConfigError("cluster.num_nodes", cluster.num_nodes,
                          f"{cluster.num_nodes:,} x {cluster.gpus_per_node} GPUs per node is {cluster.num_gpus:,}; "
                          f"a cluster holds {limits.NUM_GPUS.describe()}")
    return cluster


def _entries(field: str, value: object, shape: str) -> list:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ConfigError(field, value, f"must be a list of mappings {shape}")
    return value


def _keys(field: str, entry: dict, valid: tuple[str, ...]) -> None:
    for key in entry:
        if key not in valid:
            raise _unknown(f"{field}.{key}", entry[key], valid)


def _faults(raw: object, cluster: ClusterConfig) -> Faults:
    """The ``faults:`` section: stragglers, degraded links and compute jitter (see ``config.Faults``
    and ``simulator.network.faults`` for which links a node owns)."""
    if raw is None:
        return Faults()
    if not isinstance(raw, dict):
        raise ConfigError(FAULTS, raw, f"must be a mapping; valid keys: {', '.join(FAULT_KEYS)}")
    _keys(FAULTS, raw, FAULT_KEYS)
    gpus, nodes = cluster.num_gpus, cluster.num_nodes
    stragglers = []
    for i, entry in enumerate(_entries("faults.stragglers", raw.get("stragglers"),
                                       "{rank: R} or {node: N}, each with compute_slowdown")):
        f = f"faults.stragglers[{i}]"
        _keys(f, entry, STRAGGLER_KEYS)
        if ("rank" in entry) == ("node" in entry):
            raise ConfigError(f, entry, "give exactly one of rank or node")
        rank = node = None
        if "rank" in entry:
            rank = whole(f"{f}.rank", entry["rank"], 0)
            if rank >= gpus:
                raise ConfigError(f"{f}.rank", rank, f"must be a rank from 0 to {gpus - 1} (the cluster has {gpus} GPUs)")
        else:
            node = whole(f"{f}.node", entry["node"], 0)
            if node >= nodes:
                raise ConfigError(f"{f}.node", node, f"must be a node from 0 to {nodes - 1} (the cluster has {_nodes(nodes)})")
        slowdown = _number(f"{f}.compute_slowdown", entry.get("compute_slowdown"), 1.0, MAX_SLOWDOWN,
                           f"must be a compute-time multiplier from 1 to {MAX_SLOWDOWN:g} (1.25: 25% slower)")
        stragglers.append(Straggler(compute_slowdown=slowdown, rank=rank, node=node))
    links = []
    raw_links = _entries("faults.links", raw.get("links"),
                         "{node: N, link_class: C, bandwidth_fraction: f} (optional index)")
    spec = effective_spec(load_topology(cluster.topology), cluster.gpus_per_node, cluster.oversubscription) \
        if raw_links else None
    for i, entry in enumerate(raw_links):
        f = f"faults.links[{i}]"
        _keys(f, entry, LINK_FAULT_KEYS)
        for key in ("node", "link_class", "bandwidth_fraction"):
            if key not in entry:
                raise ConfigError(f"{f}.{key}", None, "required")
        node = whole(f"{f}.node", entry["node"], 0)
        if node >= nodes:
            raise ConfigError(f"{f}.node", node, f"must be a node from 0 to {nodes - 1} (the cluster has {_nodes(nodes)})")
        cls = _choice(f"{f}.link_class", entry["link_class"], LINK_CLASSES)
        owned = node_links(spec, nodes, node, cls)
        if not owned:
            present = [c for c in LINK_CLASSES if node_links(spec, nodes, node, c)]
            raise ConfigError(f"{f}.link_class", cls, f"this cluster ({spec.name}, {_nodes(nodes)}) has no {cls} "
                              f"links; valid here: {', '.join(present)}")
        index = entry.get("index")
        if index is not None:
            index = whole(f"{f}.index", index, 0)
            if index >= len(owned):
                raise ConfigError(f"{f}.index", index, f"node {node} has {len(owned)} {cls} links: "
                                  f"give 0 to {len(owned) - 1}, or leave index out for all of them")
        fraction = _number(f"{f}.bandwidth_fraction", entry["bandwidth_fraction"], 0.0, 1.0,
                           "must be a number from 0 (failed) to 1 (healthy)")
        links.append(LinkFault(node=node, link_class=cls, bandwidth_fraction=fraction, index=index))
    cv = _number("faults.compute_jitter_cv", raw.get("compute_jitter_cv", 0.0), 0.0, MAX_JITTER_CV,
                 f"must be a coefficient of variation from 0 to {MAX_JITTER_CV:g} (kernel-time noise is a few percent)")
    seed = whole("faults.seed", raw.get("seed", 0), 0)
    if seed >= 2**64:
        raise ConfigError("faults.seed", seed, "must be a whole number from 0 to 2**64 - 1")
    return Faults(stragglers=tuple(stragglers), links=tuple(links), compute_jitter_cv=cv, seed=seed)


def faults_to_dict(f: Faults) -> dict:
    """``f`` as the YAML mapping it was read from (left-out keys stay out)."""
    return {
        "stragglers": [{k: v for k, v in asdict(x).items() if v is not None} for x in f.stragglers],
        "links": [{k: v for k, v in asdict(x).items() if v is not None} for x in f.links],
        "compute_jitter_cv": f.compute_jitter_cv,
        "seed": f.seed,
    }


def _plain(x):
    """``dataclasses.asdict``'s conversion (dataclasses to dicts, lists, tuples and dicts rebuilt,
    other values deep-copied) without deep-copying the immutable scalars scenarios are made of:
    the planner converts thousands of scenarios."""
    if type(x) in (int, float, str, bool, type(None)):
        return x
    if is_dataclass(x) and not isinstance(x, type):
        return {f.name: _plain(getattr(x, f.name)) for f in fields(x)}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*[_plain(v) for v in x])
    if isinstance(x, (list, tuple)):
        return type(x)(_plain(v) for v in x)
    if isinstance(x, dict):
        return type(x)((_plain(k), _plain(v)) for k, v in x.items())
    return copy.deepcopy(x)


def scenario_to_dict(s: Scenario) -> dict:
    """Every field of ``s`` as plain data; ``scenario_from_dict`` of it gives ``s`` back."""
    out: dict = {"name": s.name}
    for name in SECTIONS:
        out[name] = _plain(getattr(s, name))
    out["schedule"] = s.schedule
    out["framework"] = s.framework
    if s.faults != Faults():
        out[FAULTS] = faults_to_dict(s.faults)
    return out


# --- plan validation ---------------------------------------------------------------------------

def validate_plan(s: Scenario) -> list[str]:
    """Raise ConfigError if the parallel plan cannot run; return warnings for slow layouts.

    Rules (Megatron-LM's, in this order): GPU and topology known, precision supported; world size
    = tp x pp x dp x cp; tp divides the attention heads, and divides the KV heads or is a multiple
    of them (Megatron replicates each KV head over tp / kv ranks when kv < tp); pp x vp divides the
    layers; ep divides the experts and dp x cp (the expert-parallel group is carved out of the
    data x context ranks); the FFN widths divide by tp and etp (``_check_tp_splits``);
    micro_batch_size x dp divides the global batch, giving at most ``limits.MICROBATCHES``; with cp > 1 the sequence
    splits into 2 x cp chunks (load-balanced causal attention); with sequence parallelism each TP
    rank holds seq / (cp x tp) tokens; vp > 1 needs pp > 1 and the interleaved schedule, whose
    own rules ``schedules.check_schedule_args`` applies. Interleaved with vp 1 is plain 1F1B.

    Warnings name the slower link a TP or EP group falls back to when it spans nodes (ranks are
    laid out TP fastest, then CP/DP with EP consecutive right after TP).
    """
    from simulator.parts.gpus import get_gpu, peak

    s = scenario_from_dict(scenario_to_dict(s))
    m, c, t, p = s.model, s.cluster, s.training, s.parallelism
    gpu = get_gpu(c.gpu)
    peak(gpu, t.precision)
    from simulator.workload.offload import check_offload

    check_offload(s)
    if t.fp8_attention and (t.precision not in QUANTIZED_PRECISIONS or t.attention not in ("flash", "cudnn")):
        raise ConfigError("training.fp8_attention", True,
                          "needs training.precision fp8, mxfp8 or nvfp4 and the fused cuDNN kernel (training.attention "
                          "flash or cudnn): Transformer Engine runs FP8 attention inside an FP8 recipe; valid: false")
    scope = s.framework_options.cuda_graph_scope or ()
    if "moe" in scope and m.is_moe and s.moe.capacity_factor is None:
        raise ConfigError("framework_options.cuda_graph_scope", list(scope),
                          "moe captures drop-and-pad MoE layers only (Megatron-core CudaGraphModule.moe): set "
                          "moe.capacity_factor, or capture moe_router and moe_preprocess")
    if c.gpu_power_limit_W is not None:
        if gpu.tdp_w is None:
            raise ConfigError("cluster.gpu_power_limit_W", c.gpu_power_limit_W,
                              f"{gpu.name} has no catalogued TDP to scale from; valid: null")
        if not 0.25 * gpu.tdp_w <= c.gpu_power_limit_W <= gpu.tdp_w:
            raise ConfigError("cluster.gpu_power_limit_W", c.gpu_power_limit_W,
                              f"must be between {0.25 * gpu.tdp_w:g} and {gpu.tdp_w:g} W ({gpu.name}'s TDP; below a "
                              "quarter of it the clock-power law used is not credible)")
    spec = load_topology(c.topology)
    if c.gpus_per_node > spec.nics_per_node and c.gpus_per_node % spec.nics_per_node:
        raise ConfigError("cluster.gpus_per_node", c.gpus_per_node,
                          f"{spec.name} has {spec.nics_per_node} NICs per node, which must be shared evenly: "
                          f"use a multiple of {spec.nics_per_node} or at most {spec.nics_per_node}")

    world = c.num_gpus
    base = p.tp * p.pp * p.cp
    if p.dp is None:
        if world % base:
            step = base // math.gcd(base, c.gpus_per_node)
            raise ConfigError("cluster.num_nodes", c.num_nodes,
                              f"{world} GPUs ({_nodes(c.num_nodes)} x {c.gpus_per_node}) are not divisible by "
                              f"tp x pp x cp = {base}: use a multiple of {step} nodes")
    elif base * p.dp != world:
        if world % base == 0:
            fix = f"set dp to {world // base} or null"
        elif (base * p.dp) % c.gpus_per_node == 0:
            fix = f"set cluster.num_nodes to {base * p.dp // c.gpus_per_node}"
        else:
            fix = f"tp x pp x cp = {base} does not divide the GPU count either"
        raise ConfigError("parallelism.dp", p.dp,
                          f"tp x pp x dp x cp = {base * p.dp} must equal the {world} GPUs "
                          f"({_nodes(c.num_nodes)} x {c.gpus_per_node}): {fix}")
    dp = s.dp

    if m.num_attention_heads % p.tp:
        raise ConfigError("parallelism.tp", p.tp, f"must divide num_attention_heads ({m.num_attention_heads}); "
                          f"valid: {_listing(_divisors(m.num_attention_heads))}")
    kv = m.num_key_value_heads
    if kv % p.tp and p.tp % kv:
        raise ConfigError("parallelism.tp", p.tp, f"must divide num_key_value_heads ({kv}) or be a multiple "
                          "of it (Megatron then replicates each KV head)")
    layers = m.num_hidden_layers
    uneven = p.first_pipeline_num_layers is not None or p.last_pipeline_num_layers is not None
    if uneven:
        vstage_layers(layers, p.pp, p.vp, p.first_pipeline_num_layers, p.last_pipeline_num_layers)
    elif layers % p.pp:
        raise ConfigError("parallelism.pp", p.pp, f"must divide num_hidden_layers ({layers}); "
                          f"valid: {_listing(_divisors(layers))}, or set first/last_pipeline_num_layers")
    elif layers % (p.pp * p.vp):
        raise ConfigError("parallelism.vp", p.vp, f"pp x vp must divide num_hidden_layers ({layers}); "
                          f"valid vp with pp {p.pp}: {_listing(_divisors(layers // p.pp))}")
    if p.ep > 1 and not m.is_moe:
        raise ConfigError("parallelism.ep", p.ep, "must be 1 for a dense model (model.num_experts is 0)")
    if m.is_moe and m.num_experts % p.ep:
        raise ConfigError("parallelism.ep", p.ep, f"must divide num_experts ({m.num_experts}); "
                          f"valid: {_listing(_divisors(m.num_experts))}")
    etp = p.expert_tp
    if p.tp % etp:
        raise ConfigError("parallelism.etp", p.etp, f"must divide tp ({p.tp}); valid: {_listing(_divisors(p.tp))}")
    if etp < p.tp and m.is_moe and not p.sequence_parallel:
        raise ConfigError("parallelism.etp", p.etp, f"below tp ({p.tp}) needs sequence_parallel: true "
                          "(each expert-TP group takes its ranks' sequence shards)")
    if (p.tp * dp * p.cp) % (p.ep * etp):
        ranks = p.tp * dp * p.cp
        hint = (" (or set etp: 1 to let expert groups span TP ranks)" if p.etp is None and p.tp > 1
                and ranks % p.ep == 0 else "")
        raise ConfigError("parallelism.ep", p.ep, f"ep x etp ({p.ep} x {etp}) must divide tp x dp x cp = {ranks} "
                          f"(Megatron folds the expert groups out of a stage's ranks); valid ep with etp {etp}: "
                          f"{_listing(_divisors(math.gcd(ranks // etp, m.num_experts or 1)))}{hint}")
    if p.dp_replicate > 1:
        if dp % p.dp_replicate:
            raise ConfigError("parallelism.dp_replicate", p.dp_replicate,
                              f"must divide dp ({dp}): the shard groups are dp / dp_replicate consecutive DP ranks; "
                              f"valid: {_listing(_divisors(dp))}")
        if p.zero_stage == 0:
            raise ConfigError("parallelism.dp_replicate", p.dp_replicate,
                              "replicates a sharded state, so it needs zero_stage 1, 2 or 3 (with zero_stage 0 "
                              "every DP rank is already a full replica: use 1)")
        if m.is_moe:
            raise ConfigError("parallelism.dp_replicate", p.dp_replicate,
                              "hybrid sharding of expert weights is not modelled: use 1 for MoE models")
    _check_tp_splits(m, p)
    unit = t.micro_batch_size * dp
    if t.global_batch_size % unit:
        below = t.global_batch_size // unit * unit
        near = f"{below} or {below + unit}" if below else f"{unit}"
        raise ConfigError("training.global_batch_size", t.global_batch_size,
                          f"must be a multiple of micro_batch_size x dp = {t.micro_batch_size} x {dp} = {unit}, "
                          f"e.g. {near}")
    if p.cp > 1 and t.seq_length % (2 * p.cp):
        raise ConfigError("training.seq_length", t.seq_length,
                          f"must be a multiple of 2 x cp = {2 * p.cp} (load-balanced causal context "
                          f"parallelism cuts the sequence into 2 x cp chunks)")
    if p.sequence_parallel and p.tp > 1 and t.seq_length % (p.cp * p.tp):
        raise ConfigError("training.seq_length", t.seq_length,
                          f"with sequence_parallel each TP rank holds seq_length / (cp x tp) tokens: "
                          f"must be a multiple of cp x tp = {p.cp * p.tp}")
    if p.vp > 1 and p.pp == 1:
        raise ConfigError("parallelism.vp", p.vp, "virtual pipeline stages need pp > 1: set vp to 1")
    if s.num_microbatches > limits.MICROBATCHES.maximum:
        raise ConfigError("training.global_batch_size", t.global_batch_size,
                          f"gives {s.num_microbatches:,} micro-batches per pipeline; {limits.MICROBATCHES.describe()}: "
                          "raise micro_batch_size or dp")
    if s.num_microbatches % t.pipeline_passes:
        raise ConfigError("training.pipeline_passes", t.pipeline_passes,
                          f"must divide the {s.num_microbatches} micro-batches per pipeline (each pass runs "
                          "the schedule over an equal share)")
    check_schedule_args(s.pipeline_schedule, p.pp, s.microbatches_per_pass, p.vp)

    nvlink = nvlink_GBps(spec, c.gpu, c.nvlink_bandwidth_GBps)
    network = c.network_bandwidth_Gbps or spec.network_bandwidth_Gbps
    slower = f"the {network:g} Gb/s network instead of {nvlink:g} GB/s NVLink"
    warnings = []
    if not m.is_moe:
        default = MoEConfig()
        unused = [(f"moe.{f.name}", getattr(s.moe, f.name)) for f in fields(MoEConfig)
                  if getattr(s.moe, f.name) != getattr(default, f.name)]
        unused += [("parallelism.etp", p.etp)] if p.etp is not None else []
        if unused:
            (key, value), names = unused[0], ", ".join(k for k, _ in unused)
            warnings.append(f"{key}: got {yaml_text(value)}; the model is dense (model.num_experts is 0), so "
                            f"{names} {'has' if len(unused) == 1 else 'have'} no effect")
    built_for = nvlink_generation(spec.gpu)  # 0: a GPU the catalog lacks
    if built_for and built_for != gpu.nvlink_generation:
        warnings.append(f"cluster.gpu: got {c.gpu}; topology {c.topology} is a node of {spec.gpu} (NVLink "
                        f"{built_for}), so its NVSwitch, NICs and PCIe are another generation's "
                        f"than this GPU's (NVLink {gpu.nvlink_generation}): simulated as that node with this "
                        f"GPU; a topology of this GPU's generation is the real machine")
    if c.gpus_per_node % p.tp:
        warnings.append(f"parallelism.tp: got {p.tp}; TP group spans nodes of {c.gpus_per_node} GPUs: "
                        f"its collectives cross {slower}")
    block = p.tp * p.cp  # a CP group's ranks sit tp apart inside the first tp x cp consecutive ranks
    if p.cp > 1 and c.gpus_per_node % block and block % c.gpus_per_node:
        warnings.append(f"parallelism.cp: got {p.cp}; tp x cp = {block} consecutive ranks do not divide the "
                        f"{c.gpus_per_node} GPUs of a node (NVLink domain), so some CP groups straddle two "
                        f"nodes and cross {slower}; Megatron places ranks the same way, recipes pick "
                        f"tp x cp dividing {c.gpus_per_node}")
    if p.ep > 1 and c.gpus_per_node % (p.ep * p.expert_tp):
        warnings.append(f"parallelism.ep: got {p.ep}; EP group spans nodes (ep x etp = {p.ep * p.expert_tp} consecutive "
                        f"ranks, {c.gpus_per_node} GPUs per node): its all-to-alls cross {slower}")
    return warnings


def _check_tp_splits(m: ModelConfig, p: ParallelConfig) -> None:
    """The FFN widths split over tensor-parallel ranks, as Megatron-core's column- and row-parallel
    linears require (``tensor_parallel.utils.divide`` asserts exact division): the dense MLP's
    ``intermediate_size`` by tp, each routed expert's width by the expert TP size etp, the
    shared experts' combined width by tp. The vocabulary need not divide: Megatron pads it to a
    multiple of 128 x tp (``_vocab_size_with_padding``). Heads are checked by the caller."""
    if any(not m.is_moe_layer(layer) for layer in range(m.num_hidden_layers)) and m.intermediate_size % p.tp:
        raise ConfigError("parallelism.tp", p.tp, f"must divide model.intermediate_size ({m.intermediate_size}): "
                          f"Megatron splits the MLP over tp ranks; valid: {_listing(_common_divisors(m))}")
    if not m.is_moe:
        return
    width = m.expert_intermediate_size
    if width % p.expert_tp:
        field, value = ("parallelism.etp", p.etp) if p.etp is not None else ("parallelism.tp", p.tp)
        raise ConfigError(field, value, f"expert TP size must divide the expert width ({width}): "
                          f"valid: {_listing(_divisors(width))}")
    shared = m.num_shared_experts * width
    if shared % p.tp:
        raise ConfigError("parallelism.tp", p.tp, f"must divide the shared experts' width "
                          f"({m.num_shared_experts} x {width} = {shared}); valid: {_listing(_divisors(shared))}")


def _common_divisors(m: ModelConfig) -> list[int]:
    return _divisors(math.gcd(m.num_attention_heads, m.intermediate_size))


def _nodes(n: int) -> str:
    return f"{n} node" if n == 1 else f"{n} nodes"


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _listing(values: list[int], limit: int = 16) -> str:
    shown = ", ".join(str(v) for v in values[:limit])
    return shown if len(values) <= limit else f"{shown}, ..."
