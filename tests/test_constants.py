"""tests/data/constants.yaml, the list of fitted constants and estimates that docs/validation.md ends
with (``stepsim validate ... --markdown --constants tests/data/constants.yaml``): every value it gives
is the code's, every entry says what it is and what it rests on, the page renders it, and the
command line refuses a bad file in one line."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest
import yaml

from simulator.cli import main
from simulator.common.errors import ConfigError
from simulator.studies.validation_page import CONSTANT_KINDS, constants_section, load_constants, page

CONSTANTS = Path(__file__).parent / "data" / "constants.yaml"
ENTRIES = yaml.safe_load(CONSTANTS.read_text())


def _module_and_rest(name: str):
    """The longest importable module that ``name`` starts with, and the expression after it."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        return module, name[len(module.__name__) + 1:]
    raise AssertionError(f"{name}: no importable module")


def evaluate(name: str):
    """The value of an entry's name: its module, then the attributes, items and calls after it."""
    module, rest = _module_and_rest(name)
    return eval(rest, dict(vars(module)))  # the file's own names, written in this repository


def plain(value):
    """Tuples as lists (YAML has no tuple), so the file's value compares equal to the code's."""
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


CHECKED = [e for e in ENTRIES if e.get("checked", True)]
LITERALS = [e for e in ENTRIES if not e.get("checked", True)]


@pytest.mark.parametrize("entry", CHECKED, ids=[e["name"] for e in CHECKED])
def test_every_checked_value_is_the_codes(entry):
    """Change a fitted constant or an estimate in the code and this fails until the list says so."""
    value = plain(evaluate(entry["name"]))
    assert value == entry["value"], f"{entry['name']} is {value!r} in the code, {entry['value']!r} in {CONSTANTS.name}"


@pytest.mark.parametrize("entry", LITERALS, ids=[e["name"] for e in LITERALS])
def test_a_literal_inside_a_function_is_still_written_there(entry):
    """A literal inside a function cannot be read by itself: its function still exists and its source
    still holds the number (the weaker check the file's ``checked: false`` marks)."""
    assert entry["name"].split("#")[0] == entry["function"]
    module, rest = _module_and_rest(entry["function"])
    function = eval(rest, dict(vars(module)))
    assert callable(function), entry["function"]
    assert repr(entry["value"]) in inspect.getsource(function), \
        f"{entry['function']} no longer writes {entry['value']!r}: update {CONSTANTS.name}"


def test_every_entry_is_fitted_or_an_estimate_and_says_what_and_why():
    assert load_constants(CONSTANTS) == ENTRIES  # the file passes the command line's own checks
    assert len(ENTRIES) == len({e["name"] for e in ENTRIES})
    for e in ENTRIES:
        assert e["kind"] in CONSTANT_KINDS, e["name"]
        assert e["what"].strip() and e["basis"].strip(), e["name"]
        assert ("#" in e["name"]) == (e.get("checked") is False), e["name"]
    kinds = [e["kind"] for e in ENTRIES]
    assert kinds.count("fitted") >= 4 and kinds.count("estimate") >= 20


def test_the_fitted_constants_the_gpu_catalog_documents_are_listed():
    """gpus.py's two sustained fractions are the constants it calls calibrated on measured runs; the
    split-K constants added after the audit: SPLIT_K_MIN an estimate, SPLIT_K_PARTIAL_BYTES a byte count."""
    kinds = {e["name"]: e["kind"] for e in ENTRIES}
    assert kinds["simulator.parts.gpus._A100_SUSTAINED"] == kinds["simulator.parts.gpus._HOPPER_SUSTAINED"] == "fitted"
    assert kinds["simulator.workload.compute.SPLIT_K_MIN"] == "estimate"
    assert "simulator.workload.compute.SPLIT_K_PARTIAL_BYTES" not in kinds


def _table_rows(text: str, heading: str) -> list[str]:
    block = text.split(heading, 1)[1].split("\n### ", 1)[0]
    return [line for line in block.splitlines() if line.startswith("| `")]


def test_the_section_has_a_table_of_fitted_constants_and_one_of_estimates_a_row_per_entry():
    text = constants_section(CONSTANTS)
    assert text.startswith("## Fitted constants and estimates\n")
    fitted, estimates = ([e for e in ENTRIES if e["kind"] == kind] for kind in ("fitted", "estimate"))
    assert "| name | value | what | fitted to |" in text and "| name | value | what | basis |" in text
    for heading, entries in ((f"### Fitted constants ({len(fitted)})", fitted),
                             (f"### Estimates ({len(estimates)})", estimates)):
        rows = _table_rows(text, heading)
        assert len(rows) == len(entries), heading
        for row, entry in zip(rows, entries):
            assert row.startswith(f"| `{entry['name']}` |") and row.count(" | ") == 3, row
    assert "| `simulator.workload.memory.CUDA_CONTEXT_BYTES` | 1,073,741,824 |" in text
    assert "| `simulator.parts.gpus._LAUNCH_S` | 3e-06 |" in text


def test_the_page_ends_with_the_section_only_when_given_the_file():
    assert "Fitted constants and estimates" not in page([])
    text = page([], constants=CONSTANTS)
    assert text.rstrip().endswith(constants_section(CONSTANTS).splitlines()[-1])
    assert "--constants tests/data/constants.yaml" in text.split("-->", 1)[0]


def _write(tmp_path: Path, entries) -> Path:
    path = tmp_path / "constants.yaml"
    path.write_text(yaml.safe_dump(entries))
    return path


@pytest.mark.parametrize("change, says", [
    ({"kind": "sourced"}, "has kind 'sourced'; valid: fitted, estimate"),
    ({"basis": " "}, "needs basis: a non-empty text"),
    ({"what": None}, "needs what: a non-empty text"),
    ({"source": "x"}, "has the unknown key 'source'"),
    ({"checked": False}, "is not checked: name the function holding it"),
])
def test_a_bad_entry_is_one_line_naming_it(tmp_path, change, says):
    entry = {"name": "m.X", "value": 1.0, "kind": "estimate", "what": "x", "basis": "y"}
    with pytest.raises(ConfigError) as err:
        load_constants(_write(tmp_path, [entry, {**entry, "name": "m.Y", **change}]))
    text = str(err.value)
    assert text.startswith("--constants: got '") and "entry 2 (m.Y)" in text and says in text
    assert "\n" not in text


def test_a_missing_constants_file_is_one_line_and_exit_2(tmp_path, capsys):
    missing = tmp_path / "nope.yaml"
    assert main(["validate", str(tmp_path / "runs.yaml"), "--markdown", "--constants", str(missing)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"stepsim: error: --constants: got '{missing}'; no such file\n"


@pytest.mark.parametrize("extra, says", [
    ([], "appends a table to the validation page: give --markdown with it"),
    (["--markdown"], "entry 1 (m.X) has kind 'sourced'"),
])
def test_constants_without_markdown_or_a_bad_file_is_one_line_and_exit_2(tmp_path, capsys, extra, says):
    path = _write(tmp_path, [{"name": "m.X", "value": 1, "kind": "sourced", "what": "x", "basis": "y"}])
    assert main(["validate", str(tmp_path / "runs.yaml"), "--constants", str(path), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stepsim: error: --constants: got '") and says in err and err.count("\n") == 1


def test_validate_markdown_appends_the_constants_section(tmp_path, capsys, monkeypatch):
    """The flag reaches the page: one small runs file, its prediction stood in for (the page is the point)."""
    import simulator.studies.validate as validate

    runs = tmp_path / "small-runs.yaml"
    runs.write_text(yaml.safe_dump({"cases": [{
        "id": "c", "model": {"hf_id": "meta-llama/Llama-3.1-8B", "seq_len": 2048, "layers": 32},
        "hardware": {"gpu": "H100", "count": 8}, "parallelism": {"tp": 1, "pp": 1, "gbs": 8},
        "measured": {"step_time_s": 1.0}}]}))
    result = {"summary": {"cases": 1, "scored": 1, "mape": 0.1, "signed_mean": 0.1, "within_20pct": 1.0,
                          "worst": 0.1},
              "rows": [{"id": "c", "groups": {"gpu": "H100", "kind": "dense"}, "measured": {"step_time_s": 1.0},
                        "predicted": {"step_time_s": 1.1}, "error": 0.1}]}
    monkeypatch.setattr(validate, "validate_file", lambda path, workers=None, progress=None: result)
    assert main(["validate", str(runs), "--markdown", "--quiet", "--constants", str(CONSTANTS)]) == 0
    out = capsys.readouterr().out
    assert "### small-runs" in out and "| c | H100 | dense | 1.000 | 1.100 | +10.0% |" in out
    assert out.index("### small-runs") < out.index("## Fitted constants and estimates")
    assert out.rstrip().endswith(constants_section(CONSTANTS).splitlines()[-1])
