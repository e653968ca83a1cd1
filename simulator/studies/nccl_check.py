"""Score ``stepsim collective`` against published nccl-tests bus bandwidth (tests/data/nccl-scale.yaml).

Each point of a case is simulated as ``stepsim collective`` would (one collective alone on an idle
cluster, ``time_collective``, algorithm ``auto``) and its bus bandwidth compared with the measured one:
signed error = predicted / measured - 1 (positive: the model is too fast, its busbw too high).

Mapping rules, decided per case from what the case states, never from its measured numbers:

- topology: the shipped topology of the case's GPU (``simulator.studies.cases.topology_for``), whatever
  the fabric (a RoCE or EFA case runs on the topology's InfiniBand-like fat tree with the rate below);
- ranks: the point's ``ranks`` when it has one, else the case's; they must be a whole number >= 2;
- nodes: ranks / the topology's ``gpus_per_node`` (rounded up; ranks 0..n-1 take part, as in ``stepsim
  collective``);
- network rate: the case's ``nic_per_gpu_Gbps`` when stated. A topology's ``network_bandwidth_Gbps`` is
  the rate of one NIC and a node has ``nics_per_node`` of them, so the override is the per-GPU rate
  x gpus_per_node / nics_per_node (the same per-GPU rate whatever NIC count the source gives: p5's
  32 x 100 Gb/s EFA is 8 x 400 Gb/s here). When not stated (null), the topology's own rate, even if a
  case's free-text note suggests another (p4de: null, its note cites 50 Gb/s per GPU for P4d; run at
  dgx-a100's 200);
- op: the point's ``collective`` when it has one, else the case's.

A point is scored when it has a numeric ``size_bytes``, a numeric ``busbw_GBps`` > 0, a GPU, whole ranks
and an op ``stepsim collective`` knows; any other point is listed in ``unscored`` with its reason (a
size given as a range, a vendor slide with no GPU or rank count, nccl-tests' 8-byte row whose busbw
prints as 0.00).

The summary is given over all scored points and apart for the bandwidth regime (size >= 64 MiB) and
the latency regime (below): the two test different mechanisms (link rates and algorithm choice vs
per-step latencies and protocol overheads), and a mean over both hides one behind the other.
Per-fabric signed means use a fabric family read from the case's ``fabric`` text and node count
(``fabric_family``).
"""

from __future__ import annotations

import math
from numbers import Real
from pathlib import Path

from simulator.common.errors import ConfigError
from simulator.common.yamlfile import load_yaml_file
from simulator.network.cluster import build_cluster
from simulator.network.collectives import OPS, bus_factor, time_collective
from simulator.parts.topology import load_topology
from simulator.studies.cases import topology_for

BANDWIDTH_REGIME_BYTES = 64 * 2**20
REGIMES = ("bandwidth", "latency")


def load_nccl_cases(path: str | Path, field: str = "nccl") -> list[dict]:
    """The cases of an nccl-scale file (a mapping with a ``cases`` list of mappings with an ``id`` and
    ``points``); a bad file is a ConfigError."""
    data = load_yaml_file(Path(path), field)
    cases = data.get("cases") if isinstance(data, dict) else None
    if not isinstance(cases, list) or not all(isinstance(c, dict) and c.get("id") for c in cases):
        raise ConfigError(field, str(path), "give a file with a 'cases' list, each case a mapping with an 'id'")
    for c in cases:
        if not isinstance(c.get("points"), list):
            raise ConfigError(field, str(path), f"case {c['id']}: 'points' must be a list")
    return cases


def _number(x) -> bool:
    return isinstance(x, Real) and not isinstance(x, bool) and math.isfinite(x)


def fabric_family(case: dict) -> str:
    """A short fabric name from what the case states: NVL72 (multi-node NVLink racks), NVLink (one
    node), else EFA, RoCE or InfiniBand as its ``fabric`` text names it."""
    text = str(case.get("fabric") or "").lower()
    if "mnnvl" in text or case.get("gpus_per_node") == 72:
        return "NVL72"
    if case.get("nodes") == 1 or text.startswith("nvlink"):
        return "NVLink"
    for key, name in (("efa", "EFA"), ("roce", "RoCE"), ("infiniband", "InfiniBand")):
        if key in text:
            return name
    return str(case.get("fabric") or "unknown")


def regime_of(size_bytes: float) -> str:
    return "bandwidth" if size_bytes >= BANDWIDTH_REGIME_BYTES else "latency"


def _why_unscored(case: dict, point: dict) -> str | None:
    size, busbw = point.get("size_bytes"), point.get("busbw_GBps")
    ranks = point.get("ranks", case.get("ranks"))
    op = point.get("collective", case.get("collective"))
    if not case.get("gpu"):
        return "no GPU stated"
    if not (isinstance(ranks, int) and not isinstance(ranks, bool) and ranks >= 2):
        return f"no whole rank count (ranks: {ranks!r})"
    if not _number(size):
        return "no numeric size" if size is None else f"size is not a number ({size!r})"
    if not _number(busbw) or busbw <= 0:
        return f"busbw not > 0 ({busbw!r})"
    if op not in OPS:
        return f"collective {op!r} not simulated"
    return None


def score_nccl_file(path: str | Path) -> dict:
    """``rows`` (one per scored point), ``unscored`` (one per other point, with its ``reason``) and
    ``summary`` (see the module docstring)."""
    rows, unscored, points = [], [], 0
    clusters: dict[tuple, object] = {}
    cases = load_nccl_cases(path)
    for case in cases:
        for point in case["points"]:
            points += 1
            reason = _why_unscored(case, point) if isinstance(point, dict) else "point is not a mapping"
            if reason:
                unscored.append({"id": case["id"], "point": point, "reason": reason})
                continue
            ranks = point.get("ranks", case["ranks"])
            op = point.get("collective", case["collective"])
            topology = topology_for(case["gpu"])
            spec = load_topology(topology)
            nodes = math.ceil(ranks / spec.gpus_per_node)
            per_gpu = case.get("nic_per_gpu_Gbps")
            network = per_gpu * spec.gpus_per_node / spec.nics_per_node if _number(per_gpu) else None
            key = (topology, nodes, network)
            if key not in clusters:
                clusters[key] = build_cluster(spec, nodes, network_bandwidth_Gbps=network)
            size = point["size_bytes"]
            t, _ = time_collective(clusters[key], op, list(range(ranks)), size)
            predicted = size / t / 1e9 * bus_factor(op, ranks)
            measured = float(point["busbw_GBps"])
            rows.append({"id": case["id"], "fabric": fabric_family(case), "topology": topology, "op": op,
                         "ranks": ranks, "nodes": nodes, "network_bandwidth_Gbps": network, "size_bytes": size,
                         "regime": regime_of(size), "measured_busbw_GBps": measured,
                         "predicted_busbw_GBps": predicted, "error": predicted / measured - 1})
    summary = {"cases": len(cases), "points": points, **_stats(rows),
               "unscored": len(unscored),
               "regimes": {k: _stats([r for r in rows if r["regime"] == k]) for k in REGIMES}}
    return {"rows": rows, "unscored": unscored, "summary": summary}


def _stats(rows: list[dict]) -> dict:
    errors = [r["error"] for r in rows]
    fabrics: dict[str, list[float]] = {}
    for r in rows:
        fabrics.setdefault(r["fabric"], []).append(r["error"])
    return {"scored": len(rows),
            "mape": sum(abs(e) for e in errors) / len(errors) if errors else None,
            "signed_mean": sum(errors) / len(errors) if errors else None,
            "worst": max((abs(e) for e in errors), default=None),
            "by_fabric": {f: sum(v) / len(v) for f, v in sorted(fabrics.items())}}


def _pct(x: float | None, sign: bool = False) -> str:
    return "" if x is None else (f"{x:+.1%}" if sign else f"{x:.1%}")


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n:g} B"


def nccl_section(result: dict, source: str) -> str:
    """A Markdown section of ``score_nccl_file``'s result: a summary line per regime and a table of
    every scored point (case, ranks, fabric, size, measured and predicted busbw, signed error), then
    the unscored points with their reasons."""
    s = result["summary"]
    line = (f"`{source}`: {s['scored']} of {s['points']} points scored, MAPE {_pct(s['mape'])}, "
            f"signed mean {_pct(s['signed_mean'], True)}")
    for name in REGIMES:
        r = s["regimes"][name]
        bound = ">=" if name == "bandwidth" else "<"
        line += (f"; {name} regime (size {bound} 64 MiB) {r['scored']} points, MAPE {_pct(r['mape'])}, "
                 f"signed mean {_pct(r['signed_mean'], True)}")
    lines = ["### nccl-scale", "", line + ".", "",
             "| case | ranks | fabric | op | size | measured GB/s | predicted GB/s | signed error |",
             "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: |"]
    for r in result["rows"]:
        lines.append(f"| {r['id']} | {r['ranks']} | {r['fabric']} | {r['op']} | {_size(r['size_bytes'])} | "
                     f"{r['measured_busbw_GBps']:.2f} | {r['predicted_busbw_GBps']:.2f} | {r['error']:+.1%} |")
    if result.get("unscored"):
        lines += ["", "Not scored:", ""]
        for u in result["unscored"]:
            lines.append(f"- {u['id']}: {u['reason'].replace('|', '/')}")
    return "\n".join(lines)
