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
import os
from collections.abc import Iterable
from dataclasses import fields, is_dataclass
from pathlib import Path

from simulator.common import limits, resources
from simulator.common.errors import ConfigError, LeftOut, key_text
from simulator.common.yamlfile import load_yaml_file, too_long, yaml_value
from simulator.parts.frameworks import is_profile_path
from simulator.parts.gpus import GPUFile, read_gpu_file
from simulator.parts.topology import load_topology
from simulator.scenario.config import (SCHEDULES, ClusterConfig, Faults, FrameworkOptions, ModelConfig, MoEConfig,
                                       OverlapConfig, ParallelConfig, Scenario, TrainingConfig)
from simulator.scenario.faults import FAULT_KEYS, FAULTS, faults_section, faults_to_dict
from simulator.scenario.hf import HF_CONFIG, HF_ID, MODEL_ALIASES, model_section
from simulator.common.schema import Choice, Text, check_section, keys_of

SECTIONS = {
    "model": ModelConfig,
    "cluster": ClusterConfig,
    "training": TrainingConfig,
    "parallelism": ParallelConfig,
    "overlap": OverlapConfig,
    "framework_options": FrameworkOptions,
    "moe": MoEConfig,
}
TOP_LEVEL_SCALARS = ("name", "schedule", "framework", "calibration")
# Sections a scenario file may carry for other commands; the scenario itself ignores them
# (``claims:`` is read by ``stepsim audit``, see simulator/studies/audit.py).
ANNOTATIONS = ("claims",)


def valid_keys(section: str) -> tuple[str, ...]:
    """Keys a scenario section accepts, sorted (the model section includes aliases and hf_config)."""
    keys = set(keys_of(SECTIONS[section]))
    if section == "model":
        keys |= set(MODEL_ALIASES) | {HF_CONFIG, HF_ID}
    return tuple(sorted(keys))


def _unknown(field: str, value: object, valid: Iterable[str]) -> ConfigError:
    return ConfigError(field, value, f"unknown key; valid: {', '.join(valid)}")


# --- loading -----------------------------------------------------------------------------------

def scenario_path(path: str | Path) -> Path:
    """The file a scenario argument names: a path, or the name of a shipped example scenario
    (``gpt3-175b-1024xa100``, ``simulator/data/scenarios``) when no such file exists."""
    shipped = ", ".join(resources.names("scenarios"))
    if not str(path).strip():
        raise ConfigError("scenario", str(path), f"give a scenario file or a shipped example ({shipped})")
    p = Path(path)
    if os.path.isfile(p):
        return p
    if str(path) in resources.names("scenarios"):
        return Path(str(resources.entry("scenarios", str(path))))
    if os.path.isdir(p):
        raise ConfigError("scenario", str(path), "is a folder, not a scenario file")
    if os.path.lexists(p):
        return p  # a pipe, device or symlink loop: reading it names which
    if too_long(p):
        raise ConfigError("scenario", f"{str(path)[:60]}...", f"is {len(str(path)):,} characters, longer than a file "
                                                             "name can be")
    raise ConfigError("scenario", str(path), f"no such file, nor a shipped example ({shipped})")


def read_scenario_file(path: str | Path) -> dict:
    """The raw mapping of a scenario YAML file, or a one-line ConfigError naming the file."""
    p = scenario_path(path)
    raw = load_yaml_file(p, "scenario")
    if raw is None:
        raise ConfigError("scenario", str(path), "is empty: a scenario is a YAML mapping of name, model, cluster, "
                          "training, parallelism and schedule")
    if not isinstance(raw, dict):
        raise ConfigError("scenario", str(path), "must be a YAML mapping of name, model, cluster, "
                          "training, parallelism and schedule")
    return raw


def load_scenario(path: str, overrides: Iterable[str] = ()) -> Scenario:
    """Read a scenario YAML file, apply ``--set`` overrides, and check every field."""
    p = scenario_path(path)
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
        value = yaml_value(text, key)
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
            raise _unknown(key_text(key), d[key], known)
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
        raise ConfigError("model", LeftOut(), "required: Hugging Face config.json fields, hf_config: path, "
                          "or a Hugging Face id such as deepseek-ai/DeepSeek-V3")
    given = frozenset([*(k for k in TOP_LEVEL_SCALARS if d.get(k) is not None),
                       *(f"{name}.{k}" for name, raw in sections.items() for k, v in raw.items() if v is not None),
                       *(f"{FAULTS}.{k}" for k in (d.get(FAULTS) or {} if isinstance(d.get(FAULTS), dict) else {}))])
    cluster = _cluster(sections["cluster"], base)
    return Scenario(
        name=Text().check("name", d.get("name", default_name)),
        model=model_section(sections["model"], base),
        cluster=cluster,
        training=_training(sections["training"]),
        parallelism=check_section("parallelism", sections["parallelism"], ParallelConfig),
        schedule=Choice(SCHEDULES).check("schedule", d.get("schedule", "1f1b")),
        framework=_framework(d.get("framework"), base),
        overlap=check_section("overlap", sections["overlap"], OverlapConfig),
        framework_options=check_section("framework_options", sections["framework_options"], FrameworkOptions),
        moe=check_section("moe", sections["moe"], MoEConfig),
        faults=faults_section(d.get(FAULTS), cluster),
        given=given,
        calibration=_calibration(d.get("calibration"), base),
    )


def explain_left_out(err: ConfigError, s: Scenario) -> ConfigError:
    """``err`` as it must read when the key it names is one ``s``'s file left out: the value it
    shows is then a default, so the message says "left out (default 1)" instead of "got 1", a
    value the user never wrote. Model keys count as given (the model file or catalog wrote them);
    any other error is returned as it is."""
    if s.given is None or err.field in s.given or isinstance(err.value, LeftOut):
        return err
    section, _, name = err.field.partition(".")
    if not name and section in TOP_LEVEL_SCALARS:
        holder, cls, name = s, Scenario, section
    elif section in SECTIONS and section != "model":
        holder, cls = getattr(s, section), SECTIONS[section]
    elif section == FAULTS:
        holder, cls = s.faults, Faults
    else:
        return err
    f = next((f for f in fields(cls) if f.name == name), None)
    if f is None or getattr(holder, name) != err.value:
        return err
    decl = f.metadata.get("key")
    source = decl.default_text if decl is not None and decl.default_text else "default"
    return ConfigError(err.field, LeftOut.of(err.value, source), err.valid)


def _calibration(value: object, base: Path):
    """The ``calibration`` key, a relative file path read against the scenario's folder."""
    if isinstance(value, str) and value.strip() and not Path(value).is_absolute():
        value = str((base / value).resolve())
    return keys_of(Scenario)["calibration"].kind.check("calibration", value)


def _framework(value: object, base: Path) -> str:
    """The ``framework`` key, a relative profile path made absolute against the scenario's folder."""
    if isinstance(value, str) and is_profile_path(value) and not Path(value).is_absolute():
        value = str((base / value).resolve())
    return keys_of(Scenario)["framework"].kind.check("framework", value)


def _training(raw: dict) -> TrainingConfig:
    t = check_section("training", raw, TrainingConfig)
    if t.recompute_modules is not None and t.recompute != "selective":
        raise ConfigError("training.recompute_modules", list(t.recompute_modules),
                          f"needs recompute: selective (got {t.recompute})")
    return t


def _cluster(raw: dict, base: Path) -> ClusterConfig:
    raw = dict(raw)
    topology = raw.get("topology", ClusterConfig.topology)
    if isinstance(topology, str) and Path(topology).suffix and not Path(topology).is_absolute():
        candidate = base / topology
        if os.path.isfile(candidate):
            raw["topology"] = str(candidate)
    for key in ("gpu", "gpus_per_node"):  # null, like leaving it out: the topology's
        if key in raw and raw[key] is None:
            del raw[key]
    gpu = raw.get("gpu")
    if isinstance(gpu, dict) or (isinstance(gpu, str) and gpu.lower().endswith((".yaml", ".yml"))):
        raw["gpu"] = read_gpu_file(gpu, base)
    if "gpu" not in raw or "gpus_per_node" not in raw:
        spec = load_topology(Text().check("cluster.topology", raw.get("topology", topology)))
        raw.setdefault("gpu", spec.gpu)
        raw.setdefault("gpus_per_node", spec.gpus_per_node)
    cluster = check_section("cluster", raw, ClusterConfig)
    if cluster.num_gpus > limits.NUM_GPUS.maximum:
        raise ConfigError("cluster.num_nodes", cluster.num_nodes,
                          f"{cluster.num_nodes:,} x {cluster.gpus_per_node} GPUs per node is {cluster.num_gpus:,}; "
                          f"a cluster holds {limits.NUM_GPUS.describe()}")
    return cluster


def _plain(x):
    """``dataclasses.asdict``'s conversion (dataclasses to dicts, lists, tuples and dicts rebuilt,
    other values deep-copied) without deep-copying the immutable scalars scenarios are made of:
    the planner converts thousands of scenarios."""
    if type(x) in (int, float, str, bool, type(None)):
        return x
    if isinstance(x, GPUFile):
        return x.to_dict()
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
    if s.calibration is not None:
        out["calibration"] = s.calibration.to_dict()
    return out


# --- plan validation ---------------------------------------------------------------------------


