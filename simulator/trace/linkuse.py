"""How busy the links were during a step: bytes, average and peak utilisation per link class.

Bytes per link come from the network's accounting (every byte a transfer was asked to move,
counted on each link of its route) and are always available. Peaks need the rate history of every
transfer (``SimOptions(record_flows=True)``): a link's load is the sum over the transfers on it
of rate x member flows, piecewise constant between rate changes, and its peak utilisation is the
largest load over its capacity. Average utilisation of a link is bytes / (capacity x step time).
"""

from __future__ import annotations

import numpy as np

from simulator.engine.records import SimResult

LINK_CLASSES = ("nvlink", "pcie", "nic", "leaf-spine", "spine-core")


def rate_changes(result: SimResult) -> list[tuple[float, float, int]]:
    """(time, change of rate per member flow, transfer index) of every recorded transfer, in time
    order, decreases first at equal times."""
    out = []
    for k, f in enumerate(result.flows):
        prev = 0.0
        for t, r in zip(f.times, f.rates):
            out.append((t, r - prev, k))
            prev = r
        if f.times:
            out.append((f.end, -prev, k))
    out.sort(key=lambda e: (e[0], e[1] > 0, e[2]))
    return out


def peak_load(result: SimResult) -> np.ndarray:
    """Largest load (bytes/s) each link carried at any time of the step (zeros without flows).

    A sweep over the rate changes: at equal times decreases come first, so every intermediate
    sum is at most the true load after all changes at that time."""
    load = np.zeros(result.cluster.num_links)
    peak = np.zeros(result.cluster.num_links)
    flows = result.flows
    for _, delta, k in rate_changes(result):
        if delta == 0:
            continue
        f = flows[k]
        load[f.links] += f.mult * delta
        if delta > 0:
            np.maximum.at(peak, f.links, load[f.links])
    return peak


def link_use(result: SimResult, hottest: int = 5) -> dict:
    """Per link class: links, bytes, average utilisation (over all its links and over the links
    that carried traffic), peak utilisation (``None`` without recorded flows) and the hottest links."""
    cluster = result.cluster
    step = result.step_time_s
    carried = np.asarray(result.link_bytes, dtype=float)
    cap = cluster.link_bw
    avg = carried / (cap * step) if step > 0 else np.zeros_like(carried)
    recorded = bool(result.flows)
    peak = peak_load(result) / cap if recorded else None
    cls = np.array(cluster.link_cls)
    out = {}
    for c in [c for c in LINK_CLASSES if c in set(cluster.link_cls)] + sorted(set(cluster.link_cls) - set(LINK_CLASSES)):
        ids = np.flatnonzero(cls == c)
        used = ids[carried[ids] > 0]
        order = sorted(ids.tolist(), key=lambda i: (-avg[i], i))[:hottest]
        out[c] = {
            "links": int(len(ids)),
            "links_used": int(len(used)),
            "bytes": float(carried[ids].sum()),
            "capacity_Bps": float(cap[ids[0]]) if len(ids) else 0.0,
            "avg_utilisation": float(avg[ids].mean()) if len(ids) else 0.0,
            "avg_utilisation_used": float(avg[used].mean()) if len(used) else 0.0,
            "max_avg_utilisation": float(avg[ids].max()) if len(ids) else 0.0,
            "peak_utilisation": float(peak[ids].max()) if recorded and len(ids) else None,
            "hottest": [{"link": "->".join(cluster.link_ends[i]), "bytes": float(carried[i]),
                         "avg_utilisation": float(avg[i]),
                         "peak_utilisation": float(peak[i]) if recorded else None}
                        for i in order if carried[i] > 0],
        }
    busiest = max(out, key=lambda c: (out[c]["max_avg_utilisation"], c)) if out else None
    return {"step_time_s": step, "hottest_class": busiest, "classes": out}
