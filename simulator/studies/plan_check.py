"""Check the planner against published runs: is its best layout fitting and no slower than the one used?

Every case of a public-runs file (``shared/validation/public-runs.yaml`` format) becomes a scenario
as ``stepsim validate`` builds it (``cases.case_to_scenario_dict``), and is planned with its
published layout as the given one (the top 5 proven, ``prove`` 5, and the Pareto front of the simulated
layouts: only the ranking matters here). A row
reports whether the best fits, its predicted gain over the published layout (a negative gain would
be a planner failure: the published layout is itself a candidate when it lies in the default
space), the published layout's rank, and the best's one-line "why".
"""

from __future__ import annotations

from pathlib import Path


from simulator.common.errors import ConfigError, WorkerDied
from simulator.common.progress import as_progress
from simulator.studies.planner import plan
from simulator.studies.cases import case_to_scenario_dict, load_cases
from simulator.scenario.load import scenario_from_dict
import argparse
import sys

TOP = 5


def narrow_space(raw: dict) -> list[str]:
    """A small space around a published layout, for checking every run in CI time: its tp, pp, cp,
    ep, etp, vp, schedule and sequence parallelism as published; recompute none / selective / full,
    its micro-batch size and twice it, its ZeRO stage and 1 (Megatron's distributed optimizer),
    and (the default space's) its hybrid-sharding copies and 1: at most 12 layouts, 24 with hybrid
    sharding, the published one among them."""
    s = scenario_from_dict(raw)
    p, tr = s.parallelism, s.training
    mbs = [tr.micro_batch_size]
    if tr.global_batch_size % (2 * tr.micro_batch_size * s.dp) == 0:
        mbs.append(2 * tr.micro_batch_size)
    # etp >= tp is the default (etp = tp) written out: the planner enumerates it as null
    etp = "null" if p.etp is None or p.etp >= p.tp else str(p.etp)
    space = [f"tp={p.tp}", f"pp={p.pp}", f"cp={p.cp}", f"ep={p.ep}", f"vp={p.vp}",
             f"schedule={s.pipeline_schedule}", f"sequence_parallel={str(p.sequence_parallel).lower()}",
             f"micro_batch_size={','.join(map(str, mbs))}", "recompute=none,selective,full",
             f"zero_stage={','.join(map(str, dict.fromkeys((p.zero_stage, 1))))}"]
    if s.model.is_moe:
        space.append(f"etp={etp}")
    return space


def check_case(case: dict, workers: int | None = None, space=(), narrow: bool = False) -> dict:
    """Plan one published run; its row (or an ``error`` row). ``narrow``: over ``narrow_space``."""
    row = {"id": case["id"]}
    try:
        raw = case_to_scenario_dict(case)
        if narrow:
            space = narrow_space(raw)
        result = plan(raw, space=space, top=TOP, prove=TOP, pareto=False, workers=workers, progress=None)
    except ConfigError as err:
        row["error"] = str(err)
        return row
    except WorkerDied as err:
        row.update(error=f"not planned: {err.what}: {err.cause}", worker_died=err.cause)
        return row
    best, given = result["best"], result["given"]
    row.update(
        best=best["layout"], best_step_s=best["step_time_s"], best_fits=best["fits"],
        best_memory_gib=best["memory_gib_per_gpu"], given=given["layout"], given_step_s=given["step_time_s"],
        given_fits=given["fits"], given_memory_gib=given["memory_gib_per_gpu"], given_in_space=given["in_space"], given_rank=given["rank"],
        given_rank_exact=given["rank_exact"], gain=given["step_time_s"] / best["step_time_s"] - 1,
        no_slower=best["step_time_s"] <= given["step_time_s"], why=best["why"], candidates=result["candidates"],
        beats=beats(given, best),
    )
    return row


def beats(given: dict, best: dict) -> str:
    """One line: what the best changes against the published layout and where the time goes."""
    changed = []
    for section in ("parallelism", "training"):
        for k, v in best[section].items():
            if given[section].get(k) != v:
                changed.append(f"{k} {given[section].get(k)}->{v}")
    if given["schedule"] != best["schedule"]:
        changed.append(f"schedule {given['schedule']}->{best['schedule']}")
    saved = {"compute": given["compute_s"] - best["compute_s"], "bubble": given["idle_s"] - best["idle_s"],
             **{f"exposed {a.upper()}": given["exposed_comm_s"][a] - best["exposed_comm_s"][a]
                for a in given["exposed_comm_s"]}}
    what, secs = max(saved.items(), key=lambda kv: kv[1])
    return f"{', '.join(changed) or 'same layout'}: saves mostly {what} ({secs:.3g} s)"


def check_runs(path: str | Path, workers: int | None = None, ids: list[str] | None = None,
               narrow: bool = False, progress=None, max_gpus: int | None = None) -> dict:
    """Rows for every case of ``path`` (or only ``ids``, or only runs on at most ``max_gpus``
    GPUs) and a summary; ``narrow`` plans each over ``narrow_space`` (CI time) instead of the
    default space. ``progress``: a stream, a ``progress.Progress`` or None. A case whose plan lost
    a worker process is an error row with ``worker_died``, and the other cases go on."""
    p = Path(path)
    cases = load_cases(p)
    if ids is not None:
        cases = [c for c in cases if c["id"] in ids]
    if max_gpus is not None:
        cases = [c for c in cases if (c.get("hardware") or {}).get("count", max_gpus + 1) <= max_gpus]
    bar = as_progress(progress, "plan --validate")
    bar.phase(f"planning {len(cases)} published runs", total=len(cases))
    rows = []
    for c in cases:
        rows.append(check_case(c, workers, narrow=narrow))
        if rows[-1].get("worker_died"):
            bar.note(f"case {c['id']}: {rows[-1]['worker_died']}; the other cases go on")
        bar.advance(f"{p.name}: {c['id']}")
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
            "planner_wins": sum(r["gain"] > 0 for r in ok),
            "given_fits": sum(r["given_fits"] for r in ok),
            "median_gain": sorted(r["gain"] for r in ok)[len(ok) // 2] if ok else None,
        },
    }


def format_check(result: dict) -> str:
    rows = result["rows"]
    ok = [r for r in rows if "error" not in r]

    def given_of(r: dict) -> str:
        return r["given"] + ("" if r["gain"] == 0 or r["given_fits"] else " (OOM)")

    # columns as wide as their longest entry (layout labels grow with HSDP, CP, EP, ends)
    wid = max([len("case")] + [len(r["id"]) for r in rows])
    wgiven = max([len("given")] + [len(given_of(r)) for r in ok])
    wbest = max([len("best")] + [len(r["best"]) for r in ok])
    lines = [f"{'case':<{wid}} {'given':<{wgiven}} {'rank':>5} {'best':<{wbest}} {'gain':>7}  why the best wins"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['id']:<{wid}} error: {r['error']}")
            continue
        rank = str(r["given_rank"]) if r["given_rank_exact"] else f">={r['given_rank']}"
        given = given_of(r)
        if r["gain"] == 0:
            lines.append(f"{r['id']:<{wid}} {given:<{wgiven}} {rank:>5} (published layout is the best)")
            continue
        if r["gain"] < 0:  # the best is slower: the published layout is not among the fitting ones
            rank = "-"
            why = (f"published layout needs {r['given_memory_gib']:.1f} GiB: over the memory model's capacity"
                   if not r["given_fits"] else "published layout not in the planned space")
        else:
            why = r["beats"]
        lines.append(f"{r['id']:<{wid}} {given:<{wgiven}} {rank:>5} {r['best']:<{wbest}} {r['gain']:>+7.1%}  {why}")
    s = result["summary"]
    lines.append(f"{s['planned']} of {s['cases']} planned; best fits in {s['best_fits']}, no slower than published in "
                 f"{s['no_slower']}; published layout in the top {TOP} in {s['given_in_top5']}, the planner beats it in "
                 f"{s['planner_wins']} "
                 f"(it fits the memory model in {s['given_fits']})")
    return "\n".join(lines)


RUNS_FILES = ("../shared/validation/public-runs.yaml", "tests/data/blackwell-runs.yaml",
              "tests/data/framework-runs.yaml", "tests/data/megatron-bridge-runs.yaml", "tests/data/moe-runs.yaml",
              "tests/data/nemo-2407-runs.yaml")


def main(argv: list[str] | None = None) -> int:
    """``python -m simulator.studies.plan_check [runs.yaml ...] [--out table.txt] [--full]``: every
    published run of the files (default: shared/validation/public-runs.yaml and tests/data/), planned
    over ``narrow_space`` (``--full``: the default space), as one table per file and a total."""
    ap = argparse.ArgumentParser(prog="python -m simulator.studies.plan_check")
    ap.add_argument("runs", nargs="*")
    ap.add_argument("--out")
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--workers", type=int)
    args = ap.parse_args(argv)
    files = args.runs or [str(Path(f).resolve()) for f in RUNS_FILES]  # from a checkout
    parts, total = [], {"cases": 0, "planned": 0, "best_fits": 0, "no_slower": 0, "given_in_top5": 0,
                        "planner_wins": 0}
    for f in files:
        result = check_runs(f, workers=args.workers, narrow=not args.full, progress=sys.stderr)
        parts.append(f"== {Path(f).name}\n{format_check(result)}")
        for k in total:
            total[k] += result["summary"][k]
        if args.out:
            Path(args.out).write_text("\n\n".join(parts) + "\n")
    parts.append(f"== total: {total['planned']} of {total['cases']} planned; best fits in {total['best_fits']}, "
                 f"no slower than published in {total['no_slower']}; published layout in the top {TOP} in "
                 f"{total['given_in_top5']}; the planner beats it in {total['planner_wins']}")
    text = "\n\n".join(parts) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
