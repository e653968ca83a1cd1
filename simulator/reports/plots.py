"""Figures. The only module that imports matplotlib; it draws what analysis already computed."""

from __future__ import annotations

from pathlib import Path

from simulator.common.files import atomic_write


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path: str) -> None:
    """Write atomically: a half-written figure never replaces a good one."""
    fmt = (Path(path).suffix or ".png")[1:]
    atomic_write(path, lambda f: fig.savefig(f, format=fmt, dpi=150, bbox_inches="tight"), binary=True)


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


_BREAKDOWN_COLORS = {"compute_s": "#4C72B0", "exposed_tp_s": "#DD8452", "exposed_pp_s": "#C44E52",
                     "exposed_dp_s": "#8172B3", "exposed_fsdp_s": "#937860", "exposed_cp_s": "#DA8BC3",
                     "exposed_ep_s": "#8C8C8C", "idle_s": "#CCB974"}


def _short(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def _point_label(point: dict, keys) -> str:
    return ", ".join(f"{_short(k)}={point[k]}" for k in keys)


def _numeric(values) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def plot_sweep_step_time(rows: list[dict], keys: list[str], key: str, path: str) -> None:
    """Step time against one varied key, one line per combination of the other varied keys.

    Points that do not fit in memory are drawn hollow; invalid points are left out.
    """
    plt = _pyplot()
    values = list(dict.fromkeys(r["point"][key] for r in rows))
    numeric = _numeric(values)
    others = [k for k in keys if k != key]
    lines: dict[tuple, list[dict]] = {}
    for r in rows:
        lines.setdefault(tuple(r["point"][k] for k in others), []).append(r)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (combo, members) in enumerate(lines.items()):
        ok = [r for r in members if not r.get("error")]
        if not ok:
            continue
        xs = [r["point"][key] if numeric else values.index(r["point"][key]) for r in ok]
        ys = [r["step_time_s"] for r in ok]
        color = f"C{i % 10}"
        label = ", ".join(f"{_short(k)}={v}" for k, v in zip(others, combo)) or None
        ax.plot(xs, ys, color=color, lw=1.5, label=label if len(lines) <= 12 else None)
        ax.scatter(xs, ys, s=36, zorder=3, color=[color if r["fits"] else "white" for r in ok],
                   edgecolors=color, linewidths=1.5)
    if numeric:
        positive = [v for v in values if v > 0]
        if len(positive) == len(values) and max(values) / min(values) >= 8:
            ax.set_xscale("log", base=2)
        ax.set_xticks(values, [f"{v:g}" for v in values])
        ax.minorticks_off()
    else:
        ax.set_xticks(range(len(values)), [str(v) for v in values])
    ax.set_xlabel(key)
    ax.set_ylabel("step time (s)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.set_title(f"step time vs {_short(key)}" + ("  (hollow: does not fit in memory)"
                                                  if any(not r.get("error") and not r["fits"] for r in rows) else ""))
    if others and len(lines) <= 12:
        ax.legend(fontsize=8, title=None, loc="best")
    save_figure(fig, path)
    plt.close(fig)


def plot_sweep_breakdown(rows: list[dict], keys: list[str], path: str) -> None:
    """Per point, the step split into compute, exposed communication by axis and idle (horizontal bars)."""
    plt = _pyplot()
    parts = [p for p in _BREAKDOWN_COLORS if any((r.get(p) or 0) > 0 for r in rows)]
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.32 * len(rows)))
    labels = [_point_label(r["point"], keys) + ("  (invalid)" if r.get("error") else "") for r in rows]
    y = list(range(len(rows)))
    left = [0.0] * len(rows)
    for part in parts:
        widths = [(r.get(part) or 0.0) for r in rows]
        name = part[:-2].replace("exposed_", "exposed ")
        ax.barh(y, widths, left=left, color=_BREAKDOWN_COLORS[part], label=name, height=0.7)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time per GPU, mean over pipeline stages (s)")
    ax.set_title("where the step time goes")
    ax.grid(axis="x", alpha=0.3)
    if parts:  # no valid point, no bars: matplotlib warns on a legend of nothing
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    save_figure(fig, path)
    plt.close(fig)


def plot_sweep(rows: list[dict], keys: list[str], folder: str) -> list[str]:
    """All sweep figures in ``folder``: ``step_time_vs_<key>.png`` per varied key and ``breakdown.png``."""
    paths = []
    for key in keys:
        path = str(Path(folder) / f"step_time_vs_{key.replace('.', '_')}.png")
        plot_sweep_step_time(rows, keys, key, path)
        paths.append(path)
    path = str(Path(folder) / "breakdown.png")
    plot_sweep_breakdown(rows, keys, path)
    paths.append(path)
    return paths


def plot_tornado(result: dict, path: str) -> None:
    """Step time when each link class or compute is ``factor`` x faster or slower, widest swing on top."""
    plt = _pyplot()
    base = result["baseline_step_time_s"]
    f = result["factor"]
    rows = sorted((r for r in result["rows"] if r["present"]),
                  key=lambda r: r["slower_step_time_s"] - r["faster_step_time_s"])
    fig, ax = plt.subplots(figsize=(7.5, 1.4 + 0.5 * len(rows)))
    y = list(range(len(rows)))
    slow = [r["slower_step_time_s"] - base for r in rows]
    fast = [r["faster_step_time_s"] - base for r in rows]
    ax.barh(y, slow, left=base, color="#C44E52", label=f"{f:g}x slower")
    ax.barh(y, fast, left=base, color="#55A868", label=f"{f:g}x faster")
    for yi, r in zip(y, rows):
        for t, side in ((max(r["slower_step_time_s"], base), 1), (min(r["faster_step_time_s"], base), -1)):
            change = (r["slower_step_time_s"] if side > 0 else r["faster_step_time_s"]) / base - 1
            ax.annotate(f"{change:+.1%}", (t, yi), xytext=(4 * side, 0), textcoords="offset points",
                        ha="left" if side > 0 else "right", va="center", fontsize=8)
    ax.axvline(base, color="black", lw=1)
    ax.set_yticks(y, [r["target"] for r in rows])
    lo = min(r["faster_step_time_s"] for r in rows)
    hi = max(r["slower_step_time_s"] for r in rows)
    pad = (hi - lo) * 0.25 or base * 0.05
    ax.set_xlim(lo - pad, hi + pad)
    ax.set_xlabel(f"step time (s); baseline {base:.4g} s")
    ax.set_title(f"{result['name']}: step time if one resource were {f:g}x faster or slower")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    save_figure(fig, path)
    plt.close(fig)


TIMELINE_COLORS = {"forward": "#4C72B0", "backward": "#55A868", "weight_grad": "#2E6B3A", "recompute": "#8172B2", "optimizer": "#937860",
                   "tp": "#DD8452", "pp": "#C44E52", "dp": "#DA8BC3", "fsdp": "#CCB974", "ep": "#64B5CD",
                   "cp": "#8C8C8C", "offload": "#B07AA1", "idle": "#F2F2F2"}


def plot_timeline(tl, path: str) -> None:
    """Gantt chart of a :class:`simulator.reports.timeline.Timeline`: one row per stage, micro-batch numbers
    on the schedule steps wide enough to hold them (as the Megatron-LM schedule figures).

    The figure sizes itself to what it draws: rows get thinner (down to 0.16 in) and stage labels are
    thinned to at most 32 as stages grow, the width follows the number of schedule steps in the window,
    and the legend sits above the plot so it never drifts away from a tall chart.
    """
    plt = _pyplot()
    from matplotlib.patches import Patch

    rows = tl.rows
    row_of = {stage: i for i, stage in enumerate(rows)}
    n = max(len(rows), 1)
    t0, t1 = tl.span_s
    row_in = 0.42 if n <= 16 else max(0.16, 0.42 * 16 / n)
    height = max(2.2, row_in * n + 1.6)
    per_stage = len(tl.labels) / n
    fig, ax = plt.subplots(figsize=(min(40.0 if n <= 16 else 24.0, max(16.0, 0.16 * per_stage)), height))
    by_cat: dict = {}
    for b in tl.bars:
        by_cat.setdefault(b.category, []).append(b)
    for cat, bars in by_cat.items():
        for stage in sorted({b.stage for b in bars}):
            spans = [(b.start, b.end - b.start) for b in bars if b.stage == stage]
            ax.broken_barh(spans, (row_of[stage] - 0.42, 0.84), facecolors=TIMELINE_COLORS.get(cat, "black"),
                           linewidth=0)
    ax.set_xlim(t0, t1)
    ax.set_ylim(n - 0.5, -0.5)
    fig.canvas.draw()
    px_per_s = ax.get_window_extent().width / (t1 - t0)
    row_px = ax.get_window_extent().height / n
    font = max(4.0, min(8.0, row_px * 0.45))
    if row_px >= 7:
        for lab in tl.labels:
            text = str(lab.microbatch)
            if (lab.end - lab.start) * px_per_s < font * 0.85 * len(text) + 2:
                continue
            ax.text((lab.start + lab.end) / 2, row_of[lab.stage], text, ha="center", va="center", fontsize=font,
                    color="white", fontweight="bold", clip_on=True)
    wide = [lab for lab in tl.labels if (lab.end - lab.start) * px_per_s >= 6]
    ax.vlines([lab.start for lab in wide], [row_of[lab.stage] - 0.42 for lab in wide],
              [row_of[lab.stage] + 0.42 for lab in wide], color="white", lw=0.5)
    every = max(1, -(-n // 32))
    ticks = list(range(0, n, every))
    ax.set_yticks(ticks)
    ax.set_yticklabels([f"stage {rows[i]}" for i in ticks], fontsize=8 if n > 8 else 9)
    if t1 - t0 < 1:
        from matplotlib.ticker import FuncFormatter
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x * 1e3:g}"))
        ax.set_xlabel("time (ms)")
    else:
        ax.set_xlabel("time (s)")
    title = tl.title
    if tl.window_s is not None:
        title += f"\nwindow {t0:.6g} s to {t1:.6g} s"
    ax.set_title(title, fontsize=10, pad=22 if tl.window_s is None else 30)
    used = [c for c in TIMELINE_COLORS if c in by_cat]
    ax.legend(handles=[Patch(facecolor=TIMELINE_COLORS[c], edgecolor="#999999" if c == "idle" else "none", label=c)
                       for c in used], loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(used), fontsize=8,
              frameon=False, borderaxespad=0.2)
    save_figure(fig, path)
    plt.close(fig)


def plot_pareto(result: dict, path: str) -> None:
    """Step time against peak memory of every simulated layout of a plan, the Pareto front joined
    and the given layout marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ranked = result["ranked"]
    ax.scatter([e["memory_gib_per_gpu"] for e in ranked], [e["step_time_s"] for e in ranked], s=18, color="C0",
               alpha=0.5, label="simulated layouts")
    front = sorted(result["pareto"], key=lambda p: p["memory_gib_per_gpu"])
    ax.plot([p["memory_gib_per_gpu"] for p in front], [p["step_time_s"] for p in front], "o-", color="C3",
            label="Pareto front")
    g = result["given"]
    ax.scatter([g["memory_gib_per_gpu"]], [g["step_time_s"]], marker="*", s=160, color="black", zorder=4,
               label=f"given ({g['layout']})")
    best = result["best"]
    ax.annotate(best["layout"], (best["memory_gib_per_gpu"], best["step_time_s"]), fontsize=7,
                xytext=(4, -10), textcoords="offset points")
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel("step time (s)")
    ax.grid(alpha=0.3)
    ax.set_title(f"{result['scenario']}: step time vs memory")
    ax.legend(fontsize=8, loc="best")
    save_figure(fig, path)


MEMORY_COLORS = {"weights": "#4C72B0", "gradients": "#55A868", "optimizer": "#8172B3",
                 "activations": "#DD8452", "other": "#937860"}


def plot_memory(mem: dict, path: str) -> None:
    """Memory per GPU by pipeline stage (``memory.memory_report``): stacked components against capacity."""
    plt = _pyplot()
    stages = mem["stages"]
    fig, ax = plt.subplots(figsize=(7.5, 1.3 + 0.42 * len(stages)))
    y = list(range(len(stages)))
    left = [0.0] * len(stages)
    for comp, color in MEMORY_COLORS.items():
        widths = [st[f"{comp}_gib"] for st in stages]
        ax.barh(y, widths, left=left, color=color, label=comp, height=0.68)
        left = [a + b for a, b in zip(left, widths)]
    cap = stages[0]["capacity_gib"]
    ax.axvline(cap, color="#C44E52", lw=1.5, ls="--", label=f"capacity {cap:.0f} GiB")
    for yi, st in zip(y, stages):
        ax.annotate(f"{st['total_gib']:.1f} GiB", (st["total_gib"], yi), xytext=(4, 0), textcoords="offset points",
                    va="center", fontsize=8)
    ax.set_yticks(y, [f"stage {st['stage']}" for st in stages])
    ax.invert_yaxis()
    ax.set_xlim(0, max(cap, max(st["total_gib"] for st in stages)) * 1.12)
    ax.set_xlabel("GiB per GPU")
    ax.set_title(f"memory per GPU by pipeline stage: peak {mem['peak_gib']:.1f} GiB "
                 f"({'fits' if mem['fits'] else 'does NOT fit'})", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.25 if len(stages) > 2 else -0.45),
              ncol=6, frameon=False)
    save_figure(fig, path)
    plt.close(fig)


def plot_profile_diff(diff: dict, path: str) -> None:
    """Per kernel class, measured against simulated milliseconds of one iteration (summed over the
    profiled ranks), with simulated / measured beside each pair: ``stepsim run --profile-diff``."""
    plt = _pyplot()
    rows = [r for r in diff["classes"] if r["measured_s"] > 0 or r["simulated_s"] > 0][::-1]
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(rows) + 1.6))
    y = list(range(len(rows)))
    meas = [r["measured_s"] * 1e3 for r in rows]
    sim = [r["simulated_s"] * 1e3 for r in rows]
    ax.barh([i + 0.2 for i in y], meas, height=0.4, color="#4C72B0", label="measured (profile)")
    ax.barh([i - 0.2 for i in y], sim, height=0.4, color="#DD8452", label="stepsim")
    top = max(meas + sim) or 1.0
    for i, r in zip(y, rows):
        text = f"{r['ratio']:.2f}x" if r["ratio"] is not None else r["status"]
        ax.text(max(r["measured_s"], r["simulated_s"]) * 1e3 + 0.01 * top, i, text, va="center", fontsize=8)
    ax.set_yticks(y)
    ax.set_yticklabels([r["class"] for r in rows])
    ax.set_xlim(0, top * 1.18)
    ax.set_xlabel("ms per iteration (summed over the profiled ranks); label: stepsim / measured")
    ranks = ", ".join(str(r) for r in diff["ranks"])
    ax.set_title(f"{diff['scenario']}: profile vs stepsim, rank(s) {ranks}")
    ax.legend(fontsize=8, loc="lower right")
    save_figure(fig, path)
    plt.close(fig)
