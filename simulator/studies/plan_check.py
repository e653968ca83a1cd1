"""Check the planner against published runs: is its best layout fitting and no slower than the one used?

Every case of a public-runs file (``shared/validation/public-runs.yaml`` format) becomes a scenario
as ``stepsim validate`` builds it (``validate.case_to_scenario_dict``), and is planned with its
published layout as the given one (top 5, Pareto pruning off: only the ranking matters here). A row
reports whether the best fits, its predicted gain over the published layout (a negative gain would
be a planner failure: the published layout is itself a candidate when it lies in the default
space), the published layout's rank, and the best's one-line "why".
"""

from __future__ import annotations

from pathlib import Path

import yaml

from simulator.errors import ConfigError
from simulator.studies.planner import plan
from simulator.studies.validate import case_to_scenario_dict

TOP = 5


def check_case(case: dict, workers: int | None = None, space=()) -> dict:
    """Plan one published run; its row (or an ``error`` row)."""
    row = {"id": case["id"]}
    try:
        result = plan(case_to_scenario_dict(case), space=space, top=TOP, pareto=False, workers=workers,
                      progress=None)
    except ConfigError as err:
        row["error"] = str(err)
        return row
    best, given = result["best"], result["given"]
    row.update(
        best=best["layout"], best_step_s=best["step_time_s"], best_fits=best["fits"],
        best_memory_gib=best["memory_gib_per_gpu"], given=given["layout"], given_step_s=given["step_time_s"],
        given_fits=given["fits"], given_in_space=given["in_space"], given_rank=given["rank"],
        given_rank_exact=given["rank_exact"], gain=given["step_time_s"] / best["step_time_s"] - 1,
        no_slower=best["step_time_s"] <= given["step_time_s"], why=best["why"], candidates=result["candidates"],
    )
    return row


def check_runs(path: str | Path, workers: int | None = None, ids: list[str] | None = None) -> dict:
    """Rows for every case of ``path`` (or only ``ids``) and a summary."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError("runs", str(path), "no such file")
    cases = (yaml.safe_load(p.read_text()) or {}).get("cases") or []
    if ids is not None:
        cases = [c for c in cases if c["id"] in ids]
    rows = [check_case(c, workers) for c in cases]
    ok = [r for r in rows if "error" not in r]
    return {
        "file": str(path),
        "rows": rows,
        "summary": {
            "cases": len(rows),
            "planned": len(ok),
            "best_fits": sum(r["best_fits"] for r in ok),
            "no_slower": sum(r["no_slower"] for r in ok),
            "given_in_top5": sum(r["given_rank"] <= TOP for r in ok),
            "given_fits": sum(r["given_fits"] for r in ok),
            "median_gain": sorted(r["gain"] for r in ok)[len(ok) // 2] if ok else None,
        },
    }


def format_check(result: dict) -> str:
    lines = [f"{'case':<34} {'given':<34} {'rank':>5} {'best':<40} {'gain':>7}  why"]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"{r['id']:<34} error: {r['error']}")
            continue
        rank = str(r["given_rank"]) if r["given_rank_exact"] else f">={r['given_rank']}"
        fits = "" if r["given_fits"] else " (OOM)"
        lines.append(f"{r['id']:<34} {r['given'] + fits:<34} {rank:>5} {r['best']:<40} {r['gain']:>+7.1%}  {r['why']}")
    s = result["summary"]
    lines.append(f"{s['planned']} of {s['cases']} planned; best fits in {s['best_fits']}, no slower than published in "
                 f"{s['no_slower']}; published layout in the top {TOP} in {s['given_in_top5']} "
                 f"(it fits the memory model in {s['given_fits']})")
    return "\n".join(lines)
