"""One schema: every scenario key is declared once, and the JSON Schema, the checks and the reference
pages all come from that declaration."""

import json
from dataclasses import fields
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft202012Validator

from simulator.common.errors import ConfigError
from simulator.layout import schedules
from simulator.reports import reference as report_reference
from simulator.scenario import config, reference
from simulator.scenario.load import SECTIONS, load_scenario, scenario_from_dict
from simulator.common.schema import keys_of
from simulator.simulation import run
from simulator.workload.compute import RECOMPUTE_MODULE_OPS

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))
SCHEMA = reference.json_schema()
VALIDATOR = Draft202012Validator(SCHEMA)


def test_the_schema_is_a_valid_draft_2020_12_schema():
    Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_every_shipped_scenario_validates_and_names_the_schema(path):
    text = path.read_text()
    assert text.splitlines()[0] == "# yaml-language-server: $schema=../docs/scenario.schema.json"
    assert list(VALIDATOR.iter_errors(yaml.safe_load(text))) == []


@pytest.mark.parametrize("section, key, bad", [
    ("parallelism", "tp", "8"), ("parallelism", "tp", 0), ("parallelism", "tensor", 2),
    ("training", "precision", "fp4"), ("training", "seq_length", 2.5), ("cluster", "num_nodes", -1),
    ("overlap", "tp_comm", "yes"), ("moe", "imbalance", 0.5), ("framework_options", "cuda_graph_scope", ["x"]),
    ("cluster", "nvlink_bandwidth_GBps", 0), ("training", "recompute_modules", []),
])
def test_a_wrong_type_value_or_unknown_key_is_refused_by_the_schema_and_by_the_loader_alike(section, key, bad):
    """The schema editors use and the loader stepsim runs agree: both refuse, the loader naming the key."""
    d = yaml.safe_load((ROOT / "scenarios" / "tiny.yaml").read_text())
    d.setdefault(section, {})[key] = bad
    assert list(VALIDATOR.iter_errors(d)), f"the schema accepted {section}.{key}: {bad!r}"
    with pytest.raises(ConfigError) as err:
        scenario_from_dict(d)
    assert err.value.field == f"{section}.{key}"


def test_an_unknown_top_level_key_is_refused_by_both():
    d = yaml.safe_load((ROOT / "scenarios" / "tiny.yaml").read_text())
    d["paralelism"] = {"tp": 2}
    assert list(VALIDATOR.iter_errors(d))
    with pytest.raises(ConfigError, match="paralelism: got"):
        scenario_from_dict(d)


def test_every_key_of_every_section_is_declared_with_a_kind_and_one_line_of_help():
    for cls in (*SECTIONS.values(), config.Faults, config.Straggler, config.LinkFault):
        declared = keys_of(cls)
        assert set(declared) == {f.name for f in fields(cls)}, cls.__name__
        for name, decl in declared.items():
            assert decl.kind is not None or cls is config.Faults, f"{cls.__name__}.{name}"
            assert decl.help and "\n" not in decl.help, f"{cls.__name__}.{name}"


def test_the_vocabulary_of_the_format_is_the_one_the_models_implement():
    """Allowed values are declared with the format; the registries that implement them must match."""
    assert config.SCHEDULES == tuple(schedules.SCHEDULES)
    assert config.RECOMPUTE_MODULES == tuple(RECOMPUTE_MODULE_OPS)
    split = tuple(n for n, fn in schedules.SCHEDULES.items()
                  if any(st.split for st in fn(0, 4, 8, 2 if n in schedules.V_SHAPED else 1)))
    assert split == schedules.SPLIT_BACKWARD


@pytest.mark.parametrize("path, text", [
    ("docs/scenario.schema.json", json.dumps(reference.json_schema(), indent=2) + "\n"),
    ("docs/scenario-reference.md", reference.markdown()),
    ("docs/report-reference.md", report_reference.markdown()),
])
def test_the_generated_references_are_up_to_date(path, text):
    """Regenerate with `stepsim schema > docs/scenario.schema.json`, `stepsim schema --markdown >
    docs/scenario-reference.md` and `stepsim schema --report > docs/report-reference.md`."""
    assert (ROOT / path).read_text() == text, f"{path} is stale: regenerate it (see this test's docstring)"


def test_the_report_reference_lists_exactly_the_keys_a_run_reports():
    r = run(load_scenario(str(ROOT / "scenarios" / "tiny.yaml"))).to_dict()
    documented = [f.name for f in fields(report_reference.StepReport)]
    documented += [name for name, _ in report_reference.EXTRA] + list(report_reference.ANALYSES)
    optional = set(report_reference.StepReport.OPTIONAL) - {"sim_wall_s"}
    assert [k for k in documented if k not in optional] == list(r)
    for name, (_, keys) in report_reference.ANALYSES.items():
        assert set(keys) == set(r[name]), name
