"""Figures. The only module that imports matplotlib; it draws what analysis already computed."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path: str) -> None:
    """Write atomically: a half-written figure never replaces a good one."""
    target = Path(path)
    suffix = target.suffix or ".png"
    fd, tmp = tempfile.mkstemp(dir=target.parent if str(target.parent) else ".", suffix=suffix)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=150, bbox_inches="tight")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def plot_validation(result: dict, path: str) -> None:
    """Predicted against measured step time, log-log, with the 20% band."""
    plt = _pyplot()
    rows = [r for r in result["rows"] if isinstance(r.get("error"), float)]
    fig, ax = plt.subplots(figsize=(6.5, 6))
    colors = {}
    for r in rows:
        key = f"{r['groups']['gpu'].split('-')[0]} {r['groups']['axes']}"
        colors.setdefault(key, f"C{len(colors) % 10}")
        ax.scatter(r["measured"]["step_time_s"], r["predicted"]["step_time_s"], color=colors[key], s=28,
                   label=key if key not in ax.get_legend_handles_labels()[1] else None)
    lo = min(min(r["measured"]["step_time_s"], r["predicted"]["step_time_s"]) for r in rows) * 0.7
    hi = max(max(r["measured"]["step_time_s"], r["predicted"]["step_time_s"]) for r in rows) * 1.4
    ax.plot([lo, hi], [lo, hi], color="black", lw=1)
    ax.fill_between([lo, hi], [lo * 0.8, hi * 0.8], [lo * 1.2, hi * 1.2], color="grey", alpha=0.15, label="±20%")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("stepsim predicted step time (s)")
    s = result["summary"]
    ax.set_title(f"stepsim vs published runs: MAPE {s['mape']:.1%}, {s['scored']} cases")
    ax.legend(fontsize=8, loc="upper left")
    save_figure(fig, path)
    plt.close(fig)
