"""The scenario format written out from its one declaration (``scenario.config``): a JSON Schema
(draft 2020-12) that editors with a YAML language server use to complete and check scenario
files (``stepsim schema``), and the Markdown reference (``docs/scenario-reference.md``,
``stepsim schema --markdown``)."""

from __future__ import annotations

from dataclasses import MISSING, fields

from simulator.scenario.config import (LINK_CLASSES, ClusterConfig, Faults, FrameworkOptions, LinkFault, ModelConfig,
                                       MoEConfig, OverlapConfig, ParallelConfig, Scenario, Straggler, TrainingConfig)
from simulator.scenario.hf import HF_CONFIG, HF_ID, MODEL_ALIASES
from simulator.common.schema import Key, default_of, keys_of, section_schema

# The sections of a scenario file, in the order the reference lists them.
SECTIONS = (("model", ModelConfig), ("cluster", ClusterConfig), ("training", TrainingConfig),
            ("parallelism", ParallelConfig), ("overlap", OverlapConfig), ("framework_options", FrameworkOptions),
            ("moe", MoEConfig))
TOP_KEYS = ("name", "schedule", "framework", "calibration")


def _top(name: str) -> Key:
    return keys_of(Scenario)[name]


def _model_schema() -> dict:
    out = section_schema(ModelConfig)
    props = out["properties"]
    for alias, canonical in MODEL_ALIASES.items():
        props[alias] = {**props[canonical], "description": f"alias of {canonical}"}
    props[HF_CONFIG] = {"type": "string", "minLength": 1,
                        "description": "a Hugging Face config.json to read the model fields from (path relative to "
                                       "the scenario); fields written beside it override the file's"}
    props[HF_ID] = {"type": "string", "minLength": 1,
                    "description": "a Hugging Face id of stepsim's model catalog (deepseek-ai/DeepSeek-V3)"}
    core = out.pop("required")
    out["anyOf"] = [{"required": [HF_ID]}, {"required": [HF_CONFIG]}, {"required": core}]
    return {"oneOf": [{"type": "string", "minLength": 1,
                       "description": "a Hugging Face id of stepsim's model catalog"}, out],
            "description": keys_of(Scenario)["model"].help}


def _faults_schema() -> dict:
    straggler = section_schema(Straggler)
    straggler["oneOf"] = [{"required": ["rank"]}, {"required": ["node"]}]
    out = section_schema(Faults)
    out["properties"]["stragglers"] = {"type": "array", "items": straggler,
                                       "description": keys_of(Faults)["stragglers"].help, "default": []}
    out["properties"]["links"] = {"type": "array", "items": section_schema(LinkFault),
                                  "description": keys_of(Faults)["links"].help, "default": []}
    out["properties"]["seed"]["maximum"] = 2**64 - 1
    return out


def json_schema() -> dict:
    """The JSON Schema (draft 2020-12) of a scenario file."""
    props: dict = {}
    for name in TOP_KEYS:
        decl = _top(name)
        props[name] = {**decl.kind.json(), "description": decl.help}
    props["calibration"]["default"] = None
    props["schedule"]["default"] = default_of(next(f for f in fields(Scenario) if f.name == "schedule"))
    props["framework"]["default"] = default_of(next(f for f in fields(Scenario) if f.name == "framework"))
    props["model"] = _model_schema()
    for name, cls in SECTIONS[1:]:
        props[name] = {**section_schema(cls), "description": (cls.__doc__ or "").strip().splitlines()[0]}
    props["faults"] = {**_faults_schema(), "description": "what is broken or noisy in the step"}
    props["claims"] = {"type": "object", "description": "a plan's stated figures, held against a simulation by "
                                                        "stepsim audit (docs/commands.md)"}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "stepsim scenario",
        "description": "One training step to simulate: the model, the machines, the batch, the layout, the software "
                       "(docs/scenario-reference.md).",
        "type": "object",
        "properties": props,
        "required": ["model"],
        "additionalProperties": False,
    }


def _default_text(f, decl: Key) -> str:
    if decl.default_text:
        return decl.default_text
    default = default_of(f)
    if default is MISSING:
        return "required"
    if default is None:
        return "null"
    if isinstance(default, bool):
        return "true" if default else "false"
    if isinstance(default, tuple):
        return "[]" if not default else f"[{', '.join(map(str, default))}]"
    return f"`{default}`"


def _rows(cls: type) -> list[str]:
    lines = ["| key | accepts | default | unit | what it is |", "| --- | --- | --- | --- | --- |"]
    for f in fields(cls):
        decl = f.metadata.get("key")
        if decl is None or decl.kind is None:
            continue
        lines.append(f"| `{f.name}` | {decl.kind.describe()} | {_default_text(f, decl)} | {decl.unit} | "
                     f"{decl.help.replace('|', '/')} |")
    return lines


def markdown() -> str:
    """The scenario reference page (``docs/scenario-reference.md``)."""
    out = [
        "# Scenario reference",
        "",
        "<!-- Generated by `stepsim schema --markdown` from the declarations in simulator/scenario/config.py;"
        " a test fails when this file is stale. -->",
        "",
        "A scenario is one YAML file: the model, the machines, the batch, the layout and the software of one",
        "training step. Every key below is optional unless its default says *required*; a key the format does",
        "not know, a value of the wrong type or out of bounds is a one-line error naming the key. Any key can",
        "be overridden on the command line with `--set section.key=value` (values are YAML: `null`, `true`,",
        "`[a, b]`). Editors with a YAML language server check and complete scenario files against",
        "`docs/scenario.schema.json` (`stepsim schema` prints it); the shipped scenarios start with",
        "`# yaml-language-server: $schema=../docs/scenario.schema.json`.",
        "",
        "## Top level",
        "",
        "| key | accepts | default | unit | what it is |",
        "| --- | --- | --- | --- | --- |",
    ]
    for f in fields(Scenario):
        if f.name in TOP_KEYS:
            decl = f.metadata["key"]
            accepts = decl.kind.describe()
            out.append(f"| `{f.name}` | {accepts} | {_default_text(f, decl)} | | {decl.help} |")
    out += ["| `model` | a Hugging Face id, or a mapping (below) | required | | "
            f"{keys_of(Scenario)['model'].help} |",
            "| `cluster`, `training`, `parallelism`, `overlap`, `framework_options`, `moe`, `faults` | mappings "
            "(below) | | | |",
            "| `claims` | a mapping | | | a plan's stated figures, read by `stepsim audit` only |", ""]
    for name, cls in SECTIONS:
        out += [f"## `{name}`", "", (cls.__doc__ or "").strip().splitlines()[0], ""]
        if name == "model":
            aliases = ", ".join(f"`{a}` for `{c}`" for a, c in MODEL_ALIASES.items())
            out += ["`model:` may be a Hugging Face id of the shipped catalog (`model: deepseek-ai/DeepSeek-V3`), or a",
                    f"mapping of the fields below; `{HF_ID}:` names a catalog model and `{HF_CONFIG}:` a Hugging Face",
                    "`config.json` (path relative to the scenario) to read the fields from, with the fields written",
                    f"beside them overriding theirs. Accepted aliases: {aliases}.", ""]
        out += _rows(cls) + [""]
    out += ["## `faults`", "", (Faults.__doc__ or "").strip().splitlines()[0], ""] + _rows(Faults) + [""]
    out += ["Each entry of `faults.stragglers`:", ""] + _rows(Straggler) + [""]
    out += ["Each entry of `faults.links` (which links a node owns, and in what order `index` counts them, is",
            f"`simulator.parts.topology.node_links`; classes: {', '.join(LINK_CLASSES)}):", ""] + _rows(LinkFault)
    return "\n".join(out) + "\n"
