"""What changed between two reports, or between two scenarios and their simulated steps.

Reports (``run --json``, ``memory --json``) are flattened to dotted fields (``time_breakdown_s.
exposed_comm_s.tp``, ``stages[3].idle_s``); a field is listed when its value differs, numbers with
their relative change ``(b - a) / |a|``. ``sim_wall_s`` (wall time of the simulation, which varies
between runs of the same scenario) is left out. Two scenarios are compared by their keys (every
field after defaults are filled in) and by the reports of simulating both.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from simulator.common.errors import ConfigError
from simulator.common.yamlfile import read_text_file
from dataclasses import replace
from simulator.scenario.load import scenario_to_dict
from simulator.simulation import checked, run

VOLATILE = ("sim_wall_s",)
REPORT_SUFFIXES = (".json",)
SCENARIO_SUFFIXES = (".yaml", ".yml")


def flatten(value: object, prefix: str = "") -> dict[str, object]:
    """Nested dicts and lists as {dotted.path[index]: scalar}, in their order."""
    out: dict[str, object] = {}
    if isinstance(value, dict):
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(value, list):
        if not value:
            out[prefix] = []
        for i, item in enumerate(value):
            out.update(flatten(item, f"{prefix}[{i}]"))
    else:
        out[prefix] = value
    return out


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def relative_change(a: object, b: object) -> float | None:
    """(b - a) / |a| for two finite numbers with a != 0, else None."""
    if not (_number(a) and _number(b)) or a == 0 or not (math.isfinite(a) and math.isfinite(b)):
        return None
    return (b - a) / abs(a)


def diff_values(a: dict, b: dict, ignore: tuple[str, ...] = VOLATILE) -> dict:
    """Changed fields of two nested mappings: {"changed": [...], "only_in_a": [...], "only_in_b": [...]}."""
    fa = {k: v for k, v in flatten(a).items() if k.split(".")[0].split("[")[0] not in ignore}
    fb = {k: v for k, v in flatten(b).items() if k.split(".")[0].split("[")[0] not in ignore}
    changed = []
    for key, va in fa.items():
        if key in fb and fb[key] != va:
            changed.append({"field": key, "a": va, "b": fb[key], "change": relative_change(va, fb[key])})
    return {"changed": changed,
            "only_in_a": [k for k in fa if k not in fb],
            "only_in_b": [k for k in fb if k not in fa]}


def load_report(path: str, field: str) -> dict:
    """A ``run --json`` or ``memory --json`` report, or a one-line ConfigError."""
    p = Path(path)
    if not os.path.lexists(p):
        raise ConfigError(field, path, "no such file")
    text = read_text_file(p, field, "JSON")
    try:
        data = json.loads(text)
    except ValueError as err:
        raise ConfigError(field, path, f"is not valid JSON: {err}") from None
    except RecursionError:
        raise ConfigError(field, path, "nests too deep to be a stepsim report") from None
    if not isinstance(data, dict) or not ({"step_time_s", "stages"} & set(data)):
        raise ConfigError(field, path, "must be the JSON report of stepsim run --json or memory --json")
    return data


def _simulate(scenario) -> tuple[dict, dict]:
    """(scenario keys, step report with memory) of one scenario (a file or a ``Checked``); a plan
    that does not fit is still simulated, as in a sweep."""
    r = run(scenario, allow_oom=True, record_flows=False)
    report = replace(r.report, sim_wall_s=None).to_dict()
    report["memory_gib_per_gpu"] = r.memory.to_dict()
    return scenario_to_dict(r.scenario), report


def diff_files(a: str, b: str, progress=None) -> dict:
    """Compare two report JSON files, or two scenario YAML files (keys and simulated reports)."""
    kinds = []
    for field, path in (("a", a), ("b", b)):
        suffix = Path(path).suffix.lower()
        if suffix in REPORT_SUFFIXES:
            kinds.append("report")
        elif suffix in SCENARIO_SUFFIXES:
            kinds.append("scenario")
        else:
            raise ConfigError(field, path, "must be a report (.json) or a scenario (.yaml, .yml)")
    if kinds[0] != kinds[1]:
        raise ConfigError("b", b, f"must be a {kinds[0]} like a ({a}): compare two reports or two scenarios")
    out: dict = {"a": a, "b": b, "kind": kinds[0]}
    if kinds[0] == "report":
        out["report"] = diff_values(load_report(a, "a"), load_report(b, "b"))
        return out
    # both scenarios are checked before either is simulated: a bad b is an error at once
    ca, cb = checked(a), checked(b)
    if progress is not None:
        progress.phase(f"simulating {a}")
    keys_a, rep_a = _simulate(ca)
    if progress is not None:
        progress.phase(f"simulating {b}")
    keys_b, rep_b = _simulate(cb)
    out["scenario"] = diff_values(keys_a, keys_b, ignore=())
    out["report"] = diff_values(rep_a, rep_b)
    return out


def _show(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return json.dumps(v) if not isinstance(v, str) else v


def format_diff(result: dict, max_rows: int | None = 60) -> str:
    """Side by side: field, a, b, relative change; scenario keys first when comparing scenarios."""
    lines = [f"a: {result['a']}", f"b: {result['b']}"]
    for part in ("scenario", "report"):
        if part not in result:
            continue
        d = result[part]
        rows = d["changed"]
        title = "scenario keys" if part == "scenario" else "results"
        lines.append(f"{title}: {len(rows)} changed" + (":" if rows else ""))
        width = max([28] + [len(r["field"]) for r in rows[:max_rows]])
        shown = rows if max_rows is None else rows[:max_rows]
        for r in shown:
            change = "" if r["change"] is None else f"{r['change']:+.2%}"
            lines.append(f"  {r['field']:<{width}} {_show(r['a']):>14} {_show(r['b']):>14} {change:>9}")
        if max_rows is not None and len(rows) > max_rows:
            lines.append(f"  ... {len(rows) - max_rows} more (--all shows them)")
        for side in ("a", "b"):
            only = d[f"only_in_{side}"]
            if only:
                more = f", ... {len(only) - 8} more" if len(only) > 8 else ""
                lines.append(f"  only in {side}: {', '.join(only[:8])}{more}")
    return "\n".join(lines)
