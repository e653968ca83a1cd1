"""The golden figures of tests/golden/steps.json: ``python tests/golden.py`` prints what changed
against the current code, ``--write`` rewrites the file (after a change meant to move numbers; the
commit then says which and why)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ratchets import FILES, GOLDEN, HERE, validate

from simulator.simulation import run

SCENARIOS = sorted((HERE.parent / "scenarios").glob("*.yaml"))


def figures(report: dict, mem: dict) -> dict:
    """The golden part of a step report and its memory report."""
    return {"step_time_s": report["step_time_s"], "bubble_fraction": report["bubble_fraction"],
            "time_breakdown_s": report["time_breakdown_s"], "stages": report["stages"],
            "memory_peak_gib": mem["peak_gib"], "memory_stages": mem["stages"]}


def scenario_figures(path: Path) -> dict:
    r = run(str(path), record_flows=False)
    return figures(r.to_dict(analyses=False), r.memory.to_dict())


def current() -> dict:
    out = {"_about": GOLDEN["_about"], "scenarios": {p.stem: scenario_figures(p) for p in SCENARIOS},
           "validation": {}}
    for name in FILES:
        rows = validate(name)["rows"]
        out["validation"][name] = {r["id"]: (r["predicted"]["step_time_s"] if isinstance(r.get("predicted"), dict)
                                             else None) for r in rows}
    return out


def main(argv: list[str]) -> int:
    now = current()
    for section in ("scenarios", "validation"):
        for name in sorted(set(now[section]) | set(GOLDEN[section])):
            if now[section].get(name) != GOLDEN[section].get(name):
                print(f"changed: {section} {name}")
    if "--write" in argv:
        (HERE / "golden" / "steps.json").write_text(json.dumps(now, indent=1, sort_keys=True))
        print("written: tests/golden/steps.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
