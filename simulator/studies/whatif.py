"""Sensitivity: the step time if one link class, or compute, were ``factor`` times faster or slower.

A link what-if multiplies the bandwidth of every link of one class (``topology.LINK_CLASSES``:
nvlink, pcie, nic, leaf-spine, spine-core) and touches nothing else: routes, latencies and the
workload stay. The compute what-if multiplies the GPU's peak FLOP/s (every precision) and HBM
bandwidth (``SimOptions.compute_scale``); kernel launch overheads stay. A class with no links in
the scenario's cluster (no spine-core tier in one pod, no leaf-spine links under one leaf) is
reported as absent rather than simulated. All runs go through ``sweep.run_tasks``, so they run
in parallel on any executor.

Two fault rows (``fault_rows`` in the result; not in ``rows``, the tornado or the CSV, which
stay "x faster / x slower") change only the scenario's ``faults:`` section, added to any faults
it already has, and give one step time each:
- "one straggler node": every GPU of node 0 at compute_slowdown 1.25, a GPU held at 80% of its
  clock by a power or thermal cap (Llama 3's report, Dubey et al. 2024 section 3.3.4, hunts such
  slow stragglers and ties a diurnal 1-2% throughput swing to GPU clock scaling under heat).
  Node 0 holds pipeline stage 0, which every micro-batch goes through.
- "one degraded leaf-spine link": the uplink from node 0's first leaf to spine 0 at a quarter of
  its bandwidth (``{node: 0, link_class: leaf-spine, index: 0}``, see
  ``simulator.network.faults``), the link D-mod-K routing uses to bring traffic from other
  leaves down to node 0's first rail (a flapping optic that renegotiated to a lower rate).
  Skipped, with the reason, when the cluster has no leaf-spine links (one node, or one leaf).

The ``moe_imbalance`` row (MoE models only) sets ``moe.imbalance``, the busiest expert rank's
tokens over the mean: ``factor`` times the scenario's value for "slower", divided by ``factor``
(at least 1, perfectly balanced) for "faster".
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from simulator.common.errors import ConfigError
from simulator.common.files import atomic_write_text
from simulator.common.progress import as_progress
from simulator.studies.sweep import Task, base_of, rows_of
from simulator.parts.topology import LINK_CLASSES
from simulator.engine.engine import scenario_cluster
from simulator.layout.rules import validate_plan
from simulator.reports.plots import plot_tornado
from simulator.scenario.load import scenario_from_dict
import json

TARGETS = (*LINK_CLASSES, "compute", "moe_imbalance")
STRAGGLER_SLOWDOWN = 1.25  # a GPU at 80% clock: compute takes 1 / 0.8 as long
DEGRADED_FRACTION = 0.25
FAULT_ROWS = {
    "one straggler node": ("stragglers", {"node": 0, "compute_slowdown": STRAGGLER_SLOWDOWN}),
    "one degraded leaf-spine link": ("links", {"node": 0, "link_class": "leaf-spine", "index": 0,
                                               "bandwidth_fraction": DEGRADED_FRACTION}),
}
FAULT_TARGETS = tuple(FAULT_ROWS)
MAX_FACTOR = 1000.0  # 1000x any link or GPU is far outside any hardware generation; beyond, times underflow


def check_factor(factor: object) -> float:
    """``--factor`` of whatif and report: how many times faster and slower, above 1 and at most
    ``MAX_FACTOR``; a one-line error otherwise."""
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 1 < factor <= MAX_FACTOR:
        raise ConfigError("--factor", factor, f"must be a number > 1 and at most {MAX_FACTOR:g} "
                          "(2 means 2x faster and 2x slower)")
    return factor


def whatif(scenario, *, sets: Sequence[str] = (), factor: float = 2.0, executor: str = "process",
           workers: int | None = None, address: str | None = None,
           targets: Sequence[str] | None = None, progress=None) -> dict:
    """Baseline and per-target step times at ``factor`` x faster and slower, as plain data.

    ``targets`` limits the rows to some of ``TARGETS`` and ``FAULT_TARGETS`` (default: all of them);
    ``progress`` (a stream, a ``progress.Progress`` or None) hears each simulation finish. A
    simulation whose worker process died is a ``WorkerDied`` naming it, once the others are done."""
    check_factor(factor)
    raw, base_dir, name = base_of(scenario, sets)
    s = scenario_from_dict(raw, base_dir=base_dir, default_name=name)
    validate_plan(s)
    chosen = TARGETS if targets is None else tuple(t for t in TARGETS if t in targets)
    chosen_faults = FAULT_TARGETS if targets is None else tuple(t for t in FAULT_TARGETS if t in targets)
    for t in targets or ():
        if t not in (*TARGETS, *FAULT_TARGETS):
            raise ConfigError("what-if target", t, f"valid: {', '.join((*TARGETS, *FAULT_TARGETS))}")
    cluster = scenario_cluster(s)
    present = ({cls: len(cluster.links_of_class(cls)) > 0 for cls in LINK_CLASSES} | {"compute": True}
               | {"moe_imbalance": s.model.is_moe})
    base = Task(raw, base_dir, name)
    tasks = [("baseline", base)]
    for target in chosen:
        if not present[target]:
            continue
        for tag, scale in (("faster", factor), ("slower", 1 / factor)):
            if target == "compute":
                task = Task(raw, base_dir, name, compute_scale=scale)
            elif target == "moe_imbalance":
                imbalance = max(1.0, s.moe.imbalance / scale)
                task = Task({**raw, "moe": {**(raw.get("moe") or {}), "imbalance": imbalance}}, base_dir, name)
            else:
                task = Task(raw, base_dir, name, link_scale=((target, scale),))
            tasks.append((f"{target}:{tag}", task))
    skipped = {}
    for target in chosen_faults:
        key, entry = FAULT_ROWS[target]
        if key == "links" and not present["leaf-spine"]:
            skipped[target] = (f"no leaf-spine links in this cluster ({s.cluster.num_nodes} node"
                               f"{'s' if s.cluster.num_nodes > 1 else ''} under one leaf)")
            continue
        section = dict(raw.get("faults") or {})
        section[key] = [*(section.get(key) or []), entry]
        tasks.append((f"fault:{target}", Task({**raw, "faults": section}, base_dir, name)))
    bar = as_progress(progress, "whatif")
    bar.phase(f"simulating the baseline and {len(tasks) - 1} what-ifs", total=len(tasks))
    results = rows_of(tasks, lambda tid: task_label(tid, factor), executor, workers, address, progress=bar)
    if results["baseline"]["error"]:
        raise ConfigError("scenario", name, results["baseline"]["error"])
    baseline = results["baseline"]["step_time_s"]
    rows = []
    for target in chosen:
        if present[target]:
            faster = results[f"{target}:faster"]["step_time_s"]
            slower = results[f"{target}:slower"]["step_time_s"]
        else:
            faster = slower = baseline
        rows.append({"target": target, "present": present[target], "faster_step_time_s": faster,
                     "slower_step_time_s": slower, "faster_change": faster / baseline - 1,
                     "slower_change": slower / baseline - 1})
    fault_rows = []
    for target in chosen_faults:
        key, entry = FAULT_ROWS[target]
        row = {"target": target, "present": target not in skipped, "fault": {key: [entry]}}
        if target in skipped:
            row.update(step_time_s=baseline, change=0.0, skipped=skipped[target])
        else:
            r = results[f"fault:{target}"]
            if r["error"]:
                raise ConfigError("scenario", name, r["error"])
            row.update(step_time_s=r["step_time_s"], change=r["step_time_s"] / baseline - 1)
        fault_rows.append(row)
    return {"name": s.name, "factor": float(factor), "baseline_step_time_s": baseline,
            "fits": results["baseline"]["fits"], "rows": rows, "fault_rows": fault_rows}


def task_label(task_id: str, factor: float) -> str:
    """A what-if simulation by name: ``nvlink:faster`` at factor 2 is "what-if nvlink 2x faster",
    ``fault:one straggler node`` is "what-if one straggler node"."""
    if task_id == "baseline":
        return "what-if baseline (the scenario as written)"
    target, _, tag = task_id.partition(":")
    return f"what-if {tag}" if target == "fault" else f"what-if {target} {factor:g}x {tag}"


def format_whatif(result: dict) -> str:
    f = result["factor"]
    lines = [f"{result['name']}: baseline step time {result['baseline_step_time_s']:.4f} s; "
             f"each resource {f:g}x faster / {f:g}x slower",
             f"{'resource':<12} {'faster_s':>10} {'change':>8} {'slower_s':>10} {'change':>8}"]
    for r in result["rows"]:
        if not r["present"]:
            what = "(dense model)" if r["target"] == "moe_imbalance" else "(no such links in this cluster)"
            lines.append(f"{r['target']:<12} {what:>38}")
            continue
        lines.append(f"{r['target']:<12} {r['faster_step_time_s']:>10.4f} {r['faster_change']:>+8.1%} "
                     f"{r['slower_step_time_s']:>10.4f} {r['slower_change']:>+8.1%}")
    faults = result.get("fault_rows") or []
    if faults:
        lines.append(f"{'fault (scenario change)':<30} {'step_s':>10} {'change':>8}")
    for r in faults:
        if not r["present"]:
            lines.append(f"{r['target']:<30} (skipped: {r['skipped']})")
            continue
        lines.append(f"{r['target']:<30} {r['step_time_s']:>10.4f} {r['change']:>+8.1%}")
    return "\n".join(lines)


def whatif_csv(result: dict) -> str:
    cols = ("target", "present", "faster_step_time_s", "slower_step_time_s", "faster_change", "slower_change")
    lines = [",".join(cols)]
    for r in result["rows"]:
        lines.append(",".join(str(r[c]).lower() if isinstance(r[c], bool) else repr(r[c]) if isinstance(r[c], float)
                              else str(r[c]) for c in cols))
    return "\n".join(lines) + "\n"


def write_whatif(result: dict, folder: str | Path) -> list[str]:
    """``whatif.csv``, ``whatif.json`` and ``tornado.png`` in ``folder``, each written atomically."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "whatif.csv", whatif_csv(result))
    atomic_write_text(out / "whatif.json", json.dumps(result, indent=2) + "\n")
    plot_tornado(result, str(out / "tornado.png"))
    return [str(out / n) for n in ("whatif.csv", "whatif.json", "tornado.png")]
