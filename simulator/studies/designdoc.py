"""The numbers of a design memo (seed 000's worksheet), gathered from simulations of one scenario.

``gather`` simulates the scenario once with recorded flows and returns, as plain data, exactly
what ``stepsim run --json`` and ``stepsim memory --json`` report for it (minus the wall time),
plus: the placement of every axis (``reports.placement``), a what-if on the link classes that
carried traffic and on compute (``studies.whatif``), a fallback layout (``fallback_design``), the
step at half and double the global batch, and the checkpoint plan (``workload.checkpoint``).
Figures are drawn by ``reports.plots`` into PNG bytes. Wall times are left out so that the same
scenario gives the same memo, byte for byte.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

from simulator.common.errors import ConfigError
from simulator.common.progress import as_progress
from simulator.studies.sweep import Task, base_of, rows_of
from simulator.engine.engine import scenario_cluster
from simulator.parts.gpus import gpu_of
from simulator.parts.topology import LINK_CLASSES
from simulator.reports.placement import placement
from simulator.reports.plots import plot_memory, plot_timeline, plot_tornado
from simulator.reports.timeline import timeline, view
from simulator.scenario.load import scenario_from_dict, scenario_to_dict
from simulator.simulation import checked, run
from simulator.studies.whatif import whatif
from simulator.workload.checkpoint import checkpoint_plan
from simulator.workload.compute import param_counts

RECOMPUTE_ORDER = ("none", "selective", "full")


# --- fallback: a neighbourhood search (the planner can replace it behind fallback_design) ---------

def neighbours(s) -> list[tuple[str, tuple[str, ...]]]:
    """Layouts one step away from ``s``: tp, pp (and ep for MoE) x2 or /2 with dp following the GPU
    count, micro-batch x2 or /2, recompute one level up or down. (label, --set overrides)."""
    p, t = s.parallelism, s.training
    out: list[tuple[str, tuple[str, ...]]] = []
    free_dp = ("parallelism.dp=null",)

    def pp_moves(new_pp: int) -> tuple[str, ...]:
        moves = (f"parallelism.pp={new_pp}", *free_dp)
        if new_pp == 1 and p.vp > 1:
            moves += ("parallelism.vp=1", "schedule=1f1b")
        return moves

    for factor, tag in ((2, "x2"), (0.5, "/2")):
        tp = int(p.tp * factor)
        if tp >= 1 and tp != p.tp:
            out.append((f"TP{tp}", (f"parallelism.tp={tp}", *free_dp)))
        pp = int(p.pp * factor)
        if pp >= 1 and pp != p.pp:
            out.append((f"PP{pp}", pp_moves(pp)))
        if s.model.is_moe:
            ep = int(p.ep * factor)
            if ep >= 1 and ep != p.ep:
                out.append((f"EP{ep}", (f"parallelism.ep={ep}",)))
        mb = int(t.micro_batch_size * factor)
        if mb >= 1 and mb != t.micro_batch_size:
            out.append((f"micro-batch {mb}", (f"training.micro_batch_size={mb}",)))
    i = RECOMPUTE_ORDER.index(t.recompute)
    for j in (i - 1, i + 1):
        if 0 <= j < len(RECOMPUTE_ORDER):
            out.append((f"recompute {RECOMPUTE_ORDER[j]}", (f"training.recompute={RECOMPUTE_ORDER[j]}",)))
    return out


def fallback_design(scenario, sets: Sequence[str] = (), *, executor: str = "process",
                    workers: int | None = None, baseline_step_time_s: float | None = None, progress=None) -> dict:
    """The best alternative layout: every neighbour (``neighbours``) that is valid and fits in
    memory, simulated; the fastest wins (same global batch, so the same tokens per step).

    Returns ``source``, ``candidates`` (label, overrides, step time, MFU, bubble, peak memory, or why
    it was dropped) and ``best`` (the fastest valid candidate, None when no neighbour runs)."""
    raw, base_dir, name = base_of(scenario, sets)
    s = scenario_from_dict(raw, base_dir=base_dir, default_name=name)
    moves = neighbours(s)
    tasks = [(label, Task(raw, base_dir, name, overrides)) for label, overrides in moves]
    if baseline_step_time_s is None:
        tasks.append(("baseline", Task(raw, base_dir, name)))
    bar = as_progress(progress, "report")
    bar.phase(f"simulating {len(moves)} neighbouring layouts for a fallback", total=len(tasks))
    results = rows_of(tasks, lambda label: f"fallback layout {label}", executor, workers, progress=bar)
    base = baseline_step_time_s if baseline_step_time_s is not None else results["baseline"]["step_time_s"]
    candidates = []
    for label, overrides in moves:
        r = results[label]
        row = {"label": label, "overrides": list(overrides), "step_time_s": r["step_time_s"], "mfu": r["mfu"],
               "bubble_fraction": r["bubble_fraction"], "peak_memory_gib": r["peak_memory_gib"],
               "tokens_per_s_per_gpu": r["tokens_per_s_per_gpu"],
               "exposed_comm_s": sum((r.get(k) or 0.0) for k in r if k.startswith("exposed_")),
               "change": r["step_time_s"] / base - 1 if r["step_time_s"] else None, "dropped": None}
        if r["error"]:
            row["dropped"] = r["error"]
        elif not r["fits"]:
            row["dropped"] = f"does not fit in memory ({r['peak_memory_gib']:.1f} GiB per GPU)"
        candidates.append(row)
    valid = [c for c in candidates if c["dropped"] is None]
    best = min(valid, key=lambda c: (c["step_time_s"], c["label"])) if valid else None
    return {"source": "neighbourhood search (one step in tp, pp, ep, micro-batch, recompute)",
            "baseline_step_time_s": base, "candidates": candidates, "best": best}


# --- global batch ---------------------------------------------------------------------------------

def batch_study(scenario, sets: Sequence[str] = (), *, executor: str = "process", workers: int | None = None,
                report: dict, progress=None) -> list[dict]:
    """The same layout at half and double the global batch (skipped where the batch is not a valid
    multiple), with the baseline row taken from ``report``."""
    raw, base_dir, name = base_of(scenario, sets)
    s = scenario_from_dict(raw, base_dir=base_dir, default_name=name)
    gbs = s.training.global_batch_size
    sizes = ([gbs // 2] if gbs % 2 == 0 else []) + [gbs * 2]
    tasks = [(str(g), Task(raw, base_dir, name, (f"training.global_batch_size={g}",))) for g in sizes]
    bar = as_progress(progress, "report")
    bar.phase("simulating the global batch halved and doubled", total=len(tasks))
    results = rows_of(tasks, lambda g: f"global batch {g}", executor, workers, progress=bar)
    unit = s.training.micro_batch_size * s.dp
    rows = [{"global_batch_size": gbs, "microbatches": gbs // unit, "step_time_s": report["step_time_s"],
             "tokens_per_s": report["tokens_per_s"], "bubble_fraction": report["bubble_fraction"],
             "baseline": True}]
    world = s.cluster.num_gpus
    for g in sizes:
        r = results[str(g)]
        if r["error"] or r["step_time_s"] is None:
            continue
        rows.append({"global_batch_size": g, "microbatches": g // unit, "step_time_s": r["step_time_s"],
                     "tokens_per_s": r["tokens_per_s_per_gpu"] * world, "bubble_fraction": r["bubble_fraction"],
                     "baseline": False})
    p = s.parallelism
    for row in rows:
        m = row["microbatches"]
        row["bubble_closed_form"] = (p.pp - 1) / (p.vp * m + p.pp - 1) if m else None
    return sorted(rows, key=lambda r: r["global_batch_size"])


# --- everything -----------------------------------------------------------------------------------

def _png(draw) -> bytes:
    """The PNG bytes ``draw(path)`` writes."""
    with tempfile.TemporaryDirectory(prefix="stepsim-memo-") as tmp:
        path = Path(tmp) / "figure.png"
        draw(str(path))
        return path.read_bytes()


def gather(scenario: str, sets: Sequence[str] = (), *, factor: float = 2.0, executor: str = "process",
           workers: int | None = None, fallback=fallback_design, progress=None) -> dict:
    """All numbers and figures of the design memo for one scenario file (see the module docstring);
    ``progress`` (a stream, a ``progress.Progress`` or None) hears each stage and simulation."""
    bar = as_progress(progress, "report")
    c = checked(scenario, sets)
    s, mem = c.scenario, c.memory.to_dict()
    if not mem["fits"]:
        worst = max(mem["stages"], key=lambda st: st["total_gib"])
        raise ConfigError("memory", f"{worst['total_gib']:.1f} GiB on stage {worst['stage']}",
                          f"exceeds the {worst['capacity_gib']:.1f} GiB of {s.cluster.gpu}: a memo needs a plan "
                          "that runs; shard more (tp, pp, zero_stage) or recompute")
    bar.phase("simulating the step with its flows recorded")
    r = run(c, allow_oom=True)
    result, report = r.result, r.to_dict(wall=False)
    used = [c for c in LINK_CLASSES if report["link_use"]["classes"].get(c, {}).get("bytes", 0) > 0]
    wi = whatif(scenario, sets=sets, factor=factor, executor=executor, workers=workers,
                targets=(*used, "compute"), progress=bar)
    faster = [r for r in wi["rows"] if r["present"]]
    bottleneck = min(faster, key=lambda r: (r["faster_change"], r["target"]))
    fb = fallback(scenario, sets, executor=executor, workers=workers,
                  baseline_step_time_s=report["step_time_s"], progress=bar)
    batches = batch_study(scenario, sets, executor=executor, workers=workers, report=report, progress=bar)
    bar.phase("drawing the figures")
    counts = param_counts(s.model)
    gpu = gpu_of(s.cluster, s.training.precision)
    cluster = scenario_cluster(s)
    spec = cluster.spec
    # the picture ``stepsim run --timeline`` draws by default: a steady-state window and the whole step
    chart, overview = view(timeline(result, report))
    figures = {
        "timeline": _png(lambda path: plot_timeline(chart, path, overview)),
        "tornado": _png(lambda path: plot_tornado(wi, path)),
        "memory": _png(lambda path: plot_memory(mem, path, s.name)),
    }
    return {
        "scenario": scenario_to_dict(s),
        "cluster": {
            "topology": spec.name, "num_nodes": s.cluster.num_nodes, "gpus_per_node": s.cluster.gpus_per_node,
            "num_gpus": s.cluster.num_gpus, "gpu": s.cluster.gpu, "hbm_gib": gpu.hbm_capacity_bytes / 2**30,
            "nvlink_GBps": s.cluster.nvlink_bandwidth_GBps or spec.nvlink_bandwidth_GBps,
            "network_Gbps": s.cluster.network_bandwidth_Gbps or spec.network_bandwidth_Gbps,
            "nics_per_node": spec.nics_per_node, "rail_optimized": spec.rail_optimized,
            "oversubscription": s.cluster.oversubscription or spec.oversubscription,
            "link_classes": sorted(set(cluster.link_cls), key=lambda c: (c not in LINK_CLASSES, LINK_CLASSES.index(c)
                                                                           if c in LINK_CLASSES else 0, c)),
        },
        "params": {"total": counts["total"], "active": counts["active"]},
        "run": report,
        "memory": mem,
        "placement": placement(s, result.plan, cluster),
        "whatif": wi,
        "bottleneck": bottleneck,
        "fallback": fb,
        "batch": batches,
        "checkpoint": checkpoint_plan(s, counts["total"], report["step_time_s"]),
        "figures": figures,
        "timeline": {"window_s": list(chart.window_s) if overview is not None else None},
    }
