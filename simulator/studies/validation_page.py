"""docs/validation.md, written from the validation of every file of published runs
(``stepsim validate FILE... --markdown``): a summary per file, in-sample and out-of-sample apart, and
each file's rows with their signed errors; with ``constants=`` (``--constants FILE``), the table of
fitted constants and estimates (tests/data/constants.yaml) at the end.

A file is in-sample unless its header says ``sample: out``: in-sample files are those whose runs
constants were fitted to or mechanisms were studied on; an out-of-sample file is collected before
a model change and never used to make one. Signed error = predicted / measured - 1 (negative: the
model is too fast).
"""

from __future__ import annotations

from pathlib import Path

from simulator.common.errors import ConfigError
from simulator.common.yamlfile import load_yaml_file
from simulator.studies.nccl_check import nccl_section

SAMPLES = {"in": "In-sample", "out": "Out-of-sample"}


def sample_of(path: str | Path) -> str:
    """``in`` or ``out``, from the file's ``sample:`` header (``in`` when absent)."""
    data = load_yaml_file(Path(path), "runs")
    value = data.get("sample", "in") if isinstance(data, dict) else "in"
    return value if value in SAMPLES else "in"


def _pct(x: float | None, sign: bool = False) -> str:
    return "" if x is None else (f"{x:+.1%}" if sign else f"{x:.1%}")


def summary_row(name: str, result: dict) -> str:
    """One file's row of the summary table."""
    s, rows = result["summary"], result["rows"]
    refused = sum(isinstance(r.get("error"), str) for r in rows)
    return (f"| [{name}](#{name}) | {s['cases']} | {s['scored']} | {refused} | {_pct(s['mape'])} | "
            f"{_pct(s['signed_mean'], True)} | {_pct(s['within_20pct']) if s['scored'] else ''} | "
            f"{_pct(s['worst'])} |")


SUMMARY_HEADER = ("| file | runs | scored | refused | MAPE | signed mean | within 20% | worst |\n"
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")


def section(name: str, result: dict, source: str) -> str:
    """One file's section: every row, measured and predicted step and the signed error."""
    s = result["summary"]
    lines = [f"### {name}", "", f"`{source}`: {s['scored']} of {s['cases']} runs scored, MAPE {_pct(s['mape'])}, "
             f"signed mean {_pct(s['signed_mean'], True)}.", "",
             "| run | GPU | kind | measured s | predicted s | signed error |", "| --- | --- | --- | ---: | ---: | ---: |"]
    for r in result["rows"]:
        groups = r.get("groups") or {}
        gpu, kind = groups.get("gpu", ""), groups.get("kind", "")
        if isinstance(r.get("error"), str):
            lines.append(f"| {r['id']} | {gpu} | {kind} | | | refused: {r['error'].replace('|', '/')} |")
            continue
        pred = f"{r['predicted']['step_time_s']:.3f}" if isinstance(r.get("predicted"), dict) else ""
        if not isinstance(r.get("error"), float):
            lines.append(f"| {r['id']} | {gpu} | {kind} | | {pred} | not measured |")
            continue
        note = " (excluded)" if r.get("excluded") else ""
        lines.append(f"| {r['id']} | {gpu} | {kind} | {r['measured']['step_time_s']:.3f} | {pred} | "
                     f"{r['error']:+.1%}{note} |")
    return "\n".join(lines)


CONSTANT_KINDS = ("fitted", "estimate")
CONSTANT_KEYS = ("name", "value", "checked", "function", "kind", "what", "basis")
_CONSTANT_TEXT = ("name", "what", "basis")  # non-empty text in every entry


def load_constants(path: str | Path, field: str = "--constants") -> list[dict]:
    """The entries of a constants file (tests/data/constants.yaml: a list of mappings with name,
    value, kind, what and basis, and for a literal inside a function ``checked: false`` and
    ``function``), checked; a bad file or entry is a one-line ConfigError on ``field``."""
    data = load_yaml_file(Path(path), field)
    where = str(path)
    if not isinstance(data, list) or not data:
        raise ConfigError(field, where, "must be a YAML list of constants, each with name, value, kind, what and "
                                        "basis (tests/data/constants.yaml)")
    seen: dict[str, int] = {}
    for i, entry in enumerate(data, 1):
        if not isinstance(entry, dict):
            raise ConfigError(field, where, f"entry {i} is not a mapping of name, value, kind, what and basis")
        name = entry.get("name")
        label = f"entry {i} ({name[:80]})" if isinstance(name, str) else f"entry {i}"
        unknown = [k for k in entry if k not in CONSTANT_KEYS]
        if unknown:
            raise ConfigError(field, where, f"{label} has the unknown key {unknown[0]!r}; "
                                            f"valid: {', '.join(CONSTANT_KEYS)}")
        for key in _CONSTANT_TEXT:
            if not isinstance(entry.get(key), str) or not entry[key].strip():
                raise ConfigError(field, where, f"{label} needs {key}: a non-empty text")
        if "value" not in entry:
            raise ConfigError(field, where, f"{label} needs value: the constant's value in the code")
        if entry.get("kind") not in CONSTANT_KINDS:
            raise ConfigError(field, where, f"{label} has kind {entry.get('kind')!r}; "
                                            f"valid: {', '.join(CONSTANT_KINDS)}")
        if not isinstance(entry.get("checked", True), bool):
            raise ConfigError(field, where, f"{label}: checked must be true or false")
        if entry.get("checked") is False and not (isinstance(entry.get("function"), str) and entry["function"]):
            raise ConfigError(field, where, f"{label} is not checked: name the function holding it (function:)")
        if name in seen:
            raise ConfigError(field, where, f"{label} was already listed as entry {seen[name]}; list each once")
        seen[name] = i
    return data


def _value_text(value: object) -> str:
    """A constant's value as a table shows it: 4 significant digits, byte counts whole."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, float):
        if value.is_integer():
            return f"{value:,.0f}" if abs(value) >= 10_000 else f"{value:.1f}"
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_value_text(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(_value_text(v) for v in value) + ")"
    return str(value)


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _constant_row(entry: dict) -> str:
    cells = (f"`{entry['name']}`", _value_text(entry["value"]), entry["what"], entry["basis"])
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def constants_section(path: str | Path) -> str:
    """The page's section "Fitted constants and estimates" from a constants file (``load_constants``):
    a table of the fitted constants (name, value, what, fitted to) and one of the estimates (name,
    value, what, basis), a row per entry in the file's order."""
    entries = load_constants(path)
    fitted = [e for e in entries if e["kind"] == "fitted"]
    estimates = [e for e in entries if e["kind"] == "estimate"]
    out = ["## Fitted constants and estimates", "",
           f"From `{path}`, which a test holds equal to the code. **Fitted**: chosen to match measured",
           "runs or curves, listed with what they were fitted to (a part that takes another's fitted value",
           "says so). **Estimates**: called an estimate by the code, or given without a source or a",
           "measurement; each is to be sourced or measured, and is listed here until it is.", "",
           f"### Fitted constants ({len(fitted)})", "",
           "| name | value | what | fitted to |", "| --- | ---: | --- | --- |"]
    out += [_constant_row(e) for e in fitted]
    out += ["", f"### Estimates ({len(estimates)})", "",
            "| name | value | what | basis |", "| --- | ---: | --- | --- |"]
    out += [_constant_row(e) for e in estimates]
    return "\n".join(out)


def page(files: list[tuple[str, str, dict]], constants: str | Path | None = None,
         collectives: tuple[str, dict] | None = None) -> str:
    """The whole page from (name, path as shown, validate result) per file; with ``collectives``
    (path as shown, ``nccl_check.score_nccl_file`` result), the section of collective bus bandwidths
    after the files'; with ``constants``, the section of fitted constants and estimates from that
    file (``constants_section``) at the end."""
    by_sample: dict[str, list] = {k: [] for k in SAMPLES}
    for name, path, result in files:
        by_sample[sample_of(path)].append((name, path, result))
    out = ["# Validation", "",
           "<!-- Generated by `stepsim validate ../shared/validation/public-runs.yaml tests/data/*-runs.yaml "
           "--markdown --collectives tests/data/nccl-scale.yaml --constants tests/data/constants.yaml > "
           "docs/validation.md`; each file's section is checked against this page by its ratchet test, and the "
           "constants by tests/test_constants.py. -->", "",
           "stepsim predicts published training runs it is given only the description of (model, hardware, layout,",
           "software): the measured figures are used for the error columns only. Signed error = predicted /",
           "measured - 1: negative means stepsim is too fast. **In-sample** files hold the runs the model's few",
           "fitted constants were fitted to (shared/validation/public-runs.yaml) or that later mechanisms were",
           "studied on; an **out-of-sample** file was collected before a model change and never used to make one.",
           "The constants fitted to measurements, and what they were fitted to, are listed at the end.", ""]
    for sample, title in SAMPLES.items():
        if by_sample[sample]:
            out += [f"## {title}", "", SUMMARY_HEADER]
            out += [summary_row(name, result) for name, _, result in by_sample[sample]]
            out.append("")
    for sample, title in SAMPLES.items():
        for name, path, result in by_sample[sample]:
            out += [section(name, result, path), ""]
    if collectives is not None:
        source, result = collectives
        out += ["## Collectives", "",
                "Published nccl-tests bus bandwidths against `stepsim collective` on the cluster each case states",
                "(in-sample: collected to study networks as built). Signed error = predicted / measured busbw - 1:",
                "positive means stepsim's collective is too fast.", "", nccl_section(result, source), ""]
    if constants is not None:
        out += [constants_section(constants), ""]
    return "\n".join(out)
