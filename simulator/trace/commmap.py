"""The communication of a step, one row per collective kind (tp, sp, pp, dp, fsdp, ep, cp).

Per GPU figures are means over the simulated ranks (one per pipeline stage when folded):
``calls`` per step, ``bytes_per_call`` and ``bytes_per_step`` in the nccl-tests size convention of
``simulator.network.collectives``, ``time_s`` from launch to completion summed over the calls (the time
the collective was in flight, overlapped or not) and ``exposed_s``, the time the compute stream
waited on it. ``wire_bytes`` is what the whole cluster put on links for that kind (every link of
every route counted) and ``link_classes`` splits it by link class; both need recorded flows
(``SimOptions(record_flows=True)``). TP collectives are ``sp`` when sequence parallelism turns
them into all-gather / reduce-scatter.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from simulator.engine.records import SimResult
from simulator.trace.linkuse import LINK_CLASSES

KINDS = ("tp", "sp", "pp", "dp", "fsdp", "ep", "cp")


def _kind(axis: str, op: str, sp: bool) -> str:
    return "sp" if axis == "tp" and sp and op in ("all_gather", "reduce_scatter") else axis


def comm_map(result: SimResult) -> dict:
    """Rows keyed by collective kind (only the kinds the run used), plus the hottest and most exposed."""
    s = result.scenario
    sp = bool(s.parallelism.sequence_parallel and s.parallelism.tp > 1)
    ranks = len(result.simulated_ranks)
    rows: dict = defaultdict(lambda: {"calls": 0.0, "bytes_per_step": 0.0, "time_s": 0.0, "exposed_s": 0.0,
                                      "ops": set()})
    for rank, axis, op, calls, nbytes, seconds in result.comm_calls:
        row = rows[_kind(axis, op, sp)]
        row["calls"] += calls / ranks
        row["bytes_per_step"] += nbytes / ranks
        row["time_s"] += seconds / ranks
        row["ops"].add(op)
    for r in result.trace:
        if r.stream == "compute" and r.kind == "wait" and r.axis:
            op = r.label if r.label and not r.label.startswith("recv") else ""
            rows[_kind(r.axis, op, sp)]["exposed_s"] += (r.end - r.start) / ranks
    wire = _wire(result)
    out = {}
    for kind in KINDS:
        if kind not in rows:
            continue
        row = rows[kind]
        link_axis = "tp" if kind == "sp" else kind
        classes = wire.get(link_axis) if wire is not None else None
        out[kind] = {
            "calls": row["calls"],
            "ops": sorted(row["ops"]),
            "bytes_per_call": row["bytes_per_step"] / row["calls"] if row["calls"] else 0.0,
            "bytes_per_step": row["bytes_per_step"],
            "time_s": row["time_s"],
            "exposed_s": row["exposed_s"],
            "hidden_fraction": 1 - row["exposed_s"] / row["time_s"] if row["time_s"] > 0 else 0.0,
            "wire_bytes": sum(classes.values()) if classes is not None else None,
            "link_classes": classes,
            "crosses": _outermost(classes),
        }
    if sp and "sp" in out and "tp" in out:
        _share_wire(out)
    return {
        "kinds": out,
        "hottest": max(out, key=lambda k: (out[k]["time_s"], k)) if out else None,
        "most_exposed": max(out, key=lambda k: (out[k]["exposed_s"], k)) if out else None,
    }


def _outermost(classes: dict | None) -> str | None:
    """The highest tier a kind's bytes reach (nvlink < pcie < nic < leaf-spine < spine-core)."""
    if not classes:
        return None
    return max(classes, key=lambda c: (LINK_CLASSES.index(c) if c in LINK_CLASSES else -1, c))


def _wire(result: SimResult) -> dict | None:
    """axis -> {link class: bytes on links}, from the recorded transfers (labelled by axis)."""
    if not result.flows:
        return None
    cls = np.array(result.cluster.link_cls)
    names = sorted(set(result.cluster.link_cls))
    code = {c: i for i, c in enumerate(names)}
    link_code = np.array([code[c] for c in cls])
    acc: dict = defaultdict(lambda: np.zeros(len(names)))
    for f in result.flows:
        acc[str(f.label)] += np.bincount(link_code[f.links], weights=f.mult * f.size, minlength=len(names))
    return {axis: {names[i]: float(v[i]) for i in range(len(names)) if v[i] > 0} for axis, v in acc.items()}


def _share_wire(out: dict) -> None:
    """Flows do not tell TP all-reduce from SP gathers: split the tp wire bytes by bytes per step."""
    tp, sp = out["tp"], out["sp"]
    total = tp["bytes_per_step"] + sp["bytes_per_step"]
    if not total or tp["link_classes"] is None:
        return
    for row in (tp, sp):
        share = row["bytes_per_step"] / total
        row["link_classes"] = {c: b * share for c, b in tp["link_classes"].items()}
        row["wire_bytes"] = sum(row["link_classes"].values())


def format_comm_map(cmap: dict) -> str:
    lines = [f"{'kind':<5} {'calls':>8} {'MB/call':>10} {'GB/step':>9} {'time_s':>9} {'exposed_s':>9}  crosses"]
    for kind, r in cmap["kinds"].items():
        lines.append(f"{kind:<5} {r['calls']:>8.0f} {r['bytes_per_call'] / 1e6:>10.2f} {r['bytes_per_step'] / 1e9:>9.2f} "
                     f"{r['time_s']:>9.4f} {r['exposed_s']:>9.4f}  {r['crosses'] or '-'}")
    return "\n".join(lines)
