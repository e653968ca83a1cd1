"""Figures. The only module that imports matplotlib; it draws what analysis already computed."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from simulator.common.files import atomic_write
from simulator.reports.memory import COMPONENT_NAMES
from simulator.workload.memory import HEADROOM_FRACTION


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path: str) -> None:
    """Write atomically: a half-written figure never replaces a good one."""
    fmt = (Path(path).suffix or ".png")[1:]
    atomic_write(path, lambda f: fig.savefig(f, format=fmt, dpi=150, bbox_inches="tight"), binary=True)


def _plain_log_ticks(axis) -> None:
    """Ticks of a log axis at 1, 2 and 5 times powers of ten, written as plain numbers (10, 20, 50;
    0.5, 1, 2), with unlabelled minor ticks: matplotlib's default labels every minor tick inside one
    decade as 2x10^1, 3x10^1, ..., which overlap."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:g}"))
    axis.set_minor_formatter(NullFormatter())


def plot_validation(result: dict, path: str, name: str | None = None) -> None:
    """Predicted against measured step time, log-log, with the 20% band; ``name``: the runs file."""
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
    ax.plot([lo, hi], [lo, hi], color="black", lw=1, label="prediction = measurement")
    ax.fill_between([lo, hi], [lo * 0.8, hi * 0.8], [lo * 1.2, hi * 1.2], color="grey", alpha=0.15, label="±20%")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    _plain_log_ticks(ax.xaxis)
    _plain_log_ticks(ax.yaxis)
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("stepsim predicted step time (s)")
    s = result["summary"]
    ax.set_title(f"{name + ': ' if name else ''}stepsim vs published runs\nMAPE {s['mape']:.1%} over "
                 f"{s['scored']} scored cases", fontsize=11)
    ax.legend(fontsize=8, loc="upper left", title="GPU and parallel axes", title_fontsize=8)
    ax.grid(alpha=0.25, which="major")
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


def plot_sweep_step_time(rows: list[dict], keys: list[str], key: str, path: str, name: str | None = None) -> None:
    """Step time against one varied key, one series per combination of the other varied keys.

    A numeric key is an axis and its points are joined; a categorical one (recompute, a schedule)
    has no values between its categories, so its points stand alone, side by side. Points that do
    not fit in memory are drawn hollow; invalid points are left out and counted in the legend.
    """
    plt = _pyplot()
    from matplotlib.lines import Line2D

    values = list(dict.fromkeys(r["point"][key] for r in rows))
    numeric = _numeric(values)
    others = [k for k in keys if k != key]
    lines: dict[tuple, list[dict]] = {}
    for r in rows:
        lines.setdefault(tuple(r["point"][k] for k in others), []).append(r)
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    drawn = [(combo, [r for r in members if not r.get("error")]) for combo, members in lines.items()]
    drawn = [(combo, ok) for combo, ok in drawn if ok]
    dodge = 0.6 / max(len(drawn), 1)
    handles = []
    for i, (combo, ok) in enumerate(drawn):
        color = f"C{i % 10}"
        if numeric:
            xs = [r["point"][key] for r in ok]
        else:
            xs = [values.index(r["point"][key]) + (i - (len(drawn) - 1) / 2) * dodge for r in ok]
        ys = [r["step_time_s"] for r in ok]
        if numeric:
            ax.plot(xs, ys, color=color, lw=1.5)
        ax.scatter(xs, ys, s=40, zorder=3, color=[color if r["fits"] else "white" for r in ok],
                   edgecolors=color, linewidths=1.5)
        label = ", ".join(f"{_short(k)}={v}" for k, v in zip(others, combo))
        if label and len(drawn) <= 12:
            handles.append(Line2D([], [], color=color, marker="o", lw=1.5 if numeric else 0, label=label))
    if any(not r["fits"] for _, ok in drawn for r in ok):
        handles.append(Line2D([], [], color="grey", marker="o", markerfacecolor="white", lw=0,
                              label="hollow: does not fit in memory"))
    invalid = sum(1 for r in rows if r.get("error"))
    if invalid:
        handles.append(Line2D([], [], lw=0, label=f"{invalid} invalid point{'s' if invalid > 1 else ''} not drawn"))
    if numeric:
        positive = [v for v in values if v > 0]
        if len(positive) == len(values) and max(values) / min(values) >= 8:
            ax.set_xscale("log", base=2)
        ax.set_xticks(values, [f"{v:g}" for v in values])
        ax.minorticks_off()
    else:
        ax.set_xticks(range(len(values)), [str(v) for v in values])
        ax.set_xlim(-0.6, len(values) - 0.4)
    ax.set_xlabel(key)
    _seconds_axis(ax.yaxis, [r["step_time_s"] for _, ok in drawn for r in ok], "step time")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.set_title(f"{name + ': ' if name else ''}step time by {_short(key)}", fontsize=11)
    if handles:
        ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2,
                  frameon=False)
    save_figure(fig, path)
    plt.close(fig)


_BREAKDOWN_NAMES = {"compute_s": "compute", "exposed_tp_s": "waiting on TP", "exposed_pp_s": "waiting on PP",
                    "exposed_dp_s": "waiting on DP", "exposed_fsdp_s": "waiting on FSDP",
                    "exposed_cp_s": "waiting on CP", "exposed_ep_s": "waiting on EP", "idle_s": "idle (bubble)"}


def plot_sweep_breakdown(rows: list[dict], keys: list[str], path: str, name: str | None = None) -> None:
    """Per point, the step split into compute, exposed communication by axis and idle (horizontal
    bars); points that do not fit in memory are hatched and say so, invalid ones say why they are empty."""
    plt = _pyplot()
    from matplotlib.patches import Patch

    parts = [p for p in _BREAKDOWN_COLORS if any((r.get(p) or 0) > 0 for r in rows)]
    fig, ax = plt.subplots(figsize=(8, 1.6 + 0.32 * len(rows)))

    def label(r: dict) -> str:
        text = _point_label(r["point"], keys)
        if r.get("error"):
            return text + "  (invalid: not simulated)"
        if not r["fits"]:
            return text + f"  (does not fit: {r['peak_memory_gib']:.1f} GiB)"
        return text

    y = list(range(len(rows)))
    left = [0.0] * len(rows)
    hatch = ["////" if not r.get("error") and not r["fits"] else None for r in rows]
    for part in parts:
        widths = [(r.get(part) or 0.0) for r in rows]
        bars = ax.barh(y, widths, left=left, color=_BREAKDOWN_COLORS[part], label=_BREAKDOWN_NAMES.get(part, part),
                       height=0.7, edgecolor="white", linewidth=0.3)
        for bar, h in zip(bars, hatch):
            if h:
                bar.set_hatch(h)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_yticks(y, [label(r) for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time per GPU, mean over pipeline stages (s)")
    ax.set_title(f"{name + ': ' if name else ''}where the step time goes", fontsize=11)
    ax.grid(axis="x", alpha=0.3)
    handles = [Patch(facecolor=_BREAKDOWN_COLORS[part], label=_BREAKDOWN_NAMES.get(part, part)) for part in parts]
    if any(hatch):
        handles.append(Patch(facecolor="white", edgecolor="grey", hatch="////", label="does not fit in memory"))
    if handles:  # no valid point, no bars: matplotlib warns on a legend of nothing
        ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    save_figure(fig, path)
    plt.close(fig)


def _hashable(value):
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _hashable(v)) for k, v in sorted(value.items()))
    return value


def plot_sweep(rows: list[dict], keys: list[str], folder: str, name: str | None = None) -> list[str]:
    """All sweep figures in ``folder``: ``step_time_vs_<key>.png`` per varied key and ``breakdown.png``;
    ``name``: the scenario's, for the titles."""
    # a varied value may be a list or a mapping (``parallelism.pipeline_layers``): the figures
    # group and label points by value, so they see it as a tuple
    rows = [{**r, "point": {k: _hashable(v) for k, v in r["point"].items()}} for r in rows]
    paths = []
    for key in keys:
        path = str(Path(folder) / f"step_time_vs_{key.replace('.', '_')}.png")
        plot_sweep_step_time(rows, keys, key, path, name)
        paths.append(path)
    path = str(Path(folder) / "breakdown.png")
    plot_sweep_breakdown(rows, keys, path, name)
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
    in_ms = max(r["slower_step_time_s"] for r in rows) < 1
    ax.axvline(base, color="black", lw=1, label=f"as simulated: {base * 1e3:.4g} ms" if in_ms else
               f"as simulated: {base:.4g} s")
    ax.set_yticks(y, [r["target"] for r in rows])
    lo = min(r["faster_step_time_s"] for r in rows)
    hi = max(r["slower_step_time_s"] for r in rows)
    pad = (hi - lo) * 0.25 or base * 0.05
    ax.set_xlim(lo - pad, hi + pad)
    _seconds_axis(ax.xaxis, [hi], "step time")
    ax.set_title(f"{result['name']}: step time if one resource were {f:g}x faster or slower")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    save_figure(fig, path)
    plt.close(fig)


TIMELINE_COLORS = {"forward": "#4C72B0", "backward": "#55A868", "weight_grad": "#2E6B3A", "recompute": "#8172B2", "optimizer": "#937860",
                   "tp": "#DD8452", "pp": "#C44E52", "dp": "#DA8BC3", "fsdp": "#CCB974", "ep": "#64B5CD",
                   "cp": "#8C8C8C", "offload": "#B07AA1", "idle": "#F2F2F2"}


def _window_text(t0: float, t1: float) -> str:
    unit, scale = ("ms", 1e3) if t1 - t0 < 1 else ("s", 1.0)
    return f"{t0 * scale:.4g} to {t1 * scale:.4g} {unit}"


def _dominant_categories(tl, rows, bins: int):
    """Per row of ``rows`` and per time bin of the whole step, the index (in ``TIMELINE_COLORS``)
    of the category that covers most of the bin, -1 where nothing does: the overview strip at its
    own resolution, so a step of a hundred thousand bars draws as fast as one of ten."""
    cats = list(TIMELINE_COLORS)
    edges = np.linspace(0.0, tl.step_time_s, bins + 1)
    cover = np.zeros((len(cats), len(rows), bins))
    spans: dict = {}
    for b in tl.bars:
        spans.setdefault((b.category, b.stage), []).append((b.start, b.end))
    row_of = {stage: i for i, stage in enumerate(rows)}
    for (cat, stage), ivs in spans.items():
        if stage not in row_of or cat not in TIMELINE_COLORS:
            continue
        ivs.sort()
        start = np.array([a for a, _ in ivs])
        length = np.array([b - a for a, b in ivs])
        before = np.concatenate(([0.0], np.cumsum(length)))
        k = np.searchsorted(start, edges, side="right") - 1
        inside = np.where(k >= 0, np.clip(edges - start[np.maximum(k, 0)], 0.0, length[np.maximum(k, 0)]), 0.0)
        covered = before[np.maximum(k, 0)] * (k >= 0) + inside
        cover[cats.index(cat), row_of[stage]] = np.diff(covered)
    best = cover.argmax(axis=0)
    return np.where(cover.max(axis=0) > 0, best, -1)


def plot_timeline(tl, path: str, overview=None) -> None:
    """Gantt chart of a :class:`simulator.reports.timeline.Timeline`: one row per stage, micro-batch
    numbers on the schedule steps wide enough to hold them (as the Megatron-LM schedule figures),
    and the model chunk under them when stages hold several.

    ``overview`` (``timeline.view``): the whole step on the same rows, drawn as a compact strip above
    the chart with the chart's window boxed. The figure sizes itself to what it draws: rows get
    thinner (down to 0.16 in) and stage labels are thinned to at most 32 as stages grow, the width
    follows the number of schedule steps in the window, and title and legend are placed in inches so
    they never drift away from a tall chart.
    """
    plt = _pyplot()
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch, Rectangle
    from matplotlib.ticker import FuncFormatter

    rows = tl.rows
    row_of = {stage: i for i, stage in enumerate(rows)}
    n = max(len(rows), 1)
    t0, t1 = tl.span_s
    row_in = 0.42 if n <= 16 else max(0.16, 0.42 * 16 / n)
    per_stage = len(tl.labels) / n
    width = min(40.0 if n <= 16 else 24.0, max(10.0, 0.16 * per_stage))
    windowed = overview is not None or tl.window_s is not None
    used = [c for c in TIMELINE_COLORS if any(b.category == c for b in (overview or tl).bars)]
    ncol = len(used) if len(used) <= 8 else -(-len(used) // 2)
    legend_in = 0.25 * -(-len(used) // max(ncol, 1)) + 0.25
    left_in, right_in, top_in, bottom_in = 0.95, 0.3, 0.45 + 0.2 * windowed, 0.6 + legend_in
    main_in = row_in * n
    over_in = 0.0 if overview is None else min(1.2, max(0.5, 0.07 * n))
    gap_in = 0.0 if overview is None else 0.75
    height = top_in + over_in + gap_in + main_in + bottom_in
    fig = plt.figure(figsize=(width, height))
    plot_w = (width - left_in - right_in) / width
    ax = fig.add_axes((left_in / width, bottom_in / height, plot_w, main_in / height))

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
    two_lines = tl.chunks > 1 and row_px >= 3.4 * font
    if row_px >= 7:
        for lab in tl.labels:
            text = str(lab.microbatch)
            chars = max(len(text), 1 + len(str(lab.chunk))) if two_lines else len(text)
            if (lab.end - lab.start) * px_per_s < font * 0.85 * chars + 2:
                continue
            if two_lines:
                text += f"\nc{lab.chunk}"
            ax.text((lab.start + lab.end) / 2, row_of[lab.stage], text, ha="center", va="center", fontsize=font,
                    color="white", fontweight="bold", clip_on=True, linespacing=1.0)
    wide = [lab for lab in tl.labels if (lab.end - lab.start) * px_per_s >= 6]
    ax.vlines([lab.start for lab in wide], [row_of[lab.stage] - 0.42 for lab in wide],
              [row_of[lab.stage] + 0.42 for lab in wide], color="white", lw=0.5)
    every = max(1, -(-n // 32))
    ticks = list(range(0, n, every))
    ax.set_yticks(ticks)
    ax.set_yticklabels([f"stage {rows[i]}" for i in ticks], fontsize=8 if n > 8 else 9)
    if t1 - t0 < 1:
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x * 1e3:g}"))
        ax.set_xlabel("time since the step began (ms)")
    else:
        ax.set_xlabel("time since the step began (s)")

    title = tl.title
    if overview is not None or tl.window_s is not None:
        shown = sorted({lab.microbatch for lab in tl.labels if lab.end - lab.start > 0})
        mbs = (f"micro-batches {shown[0]} to {shown[-1]}" if len(shown) > 1 else
               f"micro-batch {shown[0]}" if shown else "no schedule step")
        title += (f"\nwindow {_window_text(t0, t1)} of the {tl.step_time_s:.4g} s step ({mbs} in view)"
                  + ("; the whole step above, the window boxed" if overview is not None else ""))
    fig.text(0.5, 1 - 0.12 / height, title, ha="center", va="top", fontsize=10)

    if overview is not None:
        ov = fig.add_axes((left_in / width, (bottom_in + main_in + gap_in) / height, plot_w, over_in / height))
        bins = max(200, int(plot_w * width * 150))
        grid = _dominant_categories(overview, rows, bins)
        cats = list(TIMELINE_COLORS)
        cmap = ListedColormap(["#FFFFFF"] + [TIMELINE_COLORS[c] for c in cats])
        ov.imshow(grid + 1, cmap=cmap, vmin=0, vmax=len(cats), aspect="auto", interpolation="nearest",
                  extent=(0.0, overview.step_time_s, n - 0.5, -0.5))
        ov.set_xlim(0.0, overview.step_time_s)
        ov.set_ylim(n - 0.5, -0.5)
        ov.set_yticks([0, n - 1] if n > 1 else [0])
        ov.set_yticklabels([f"stage {rows[0]}", f"stage {rows[-1]}"] if n > 1 else [f"stage {rows[0]}"], fontsize=7)
        ov.tick_params(axis="x", labelsize=7)
        ov.set_xlabel("whole step, time (s)", fontsize=8, labelpad=1)
        for a, b in ((0.0, t0), (t1, overview.step_time_s)):
            if b > a:
                ov.axvspan(a, b, color="white", alpha=0.55, lw=0)
        ov.add_patch(Rectangle((t0, -0.5), t1 - t0, n, fill=False, edgecolor="black", lw=1.6, clip_on=False))
    handles = [Patch(facecolor=TIMELINE_COLORS[c], edgecolor="#999999" if c == "idle" else "none",
                     label=CATEGORY_NAMES.get(c, c)) for c in used]
    note = ("bar labels: micro-batch number" + (", and cN: model chunk N" if two_lines else "")
            if row_px >= 7 else None)
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, (legend_in + 0.05) / height),
               ncol=max(ncol, 1), fontsize=8, frameon=False, title=note, title_fontsize=8)
    save_figure(fig, path)
    plt.close(fig)


# Legend names of the timeline's categories: communication is what the compute stream waited for.
CATEGORY_NAMES = {"forward": "forward", "backward": "backward", "weight_grad": "weight gradient",
                  "recompute": "recompute", "optimizer": "optimizer", "tp": "waiting on TP", "pp": "waiting on PP",
                  "dp": "waiting on DP", "fsdp": "waiting on FSDP", "ep": "waiting on EP (all-to-all)",
                  "cp": "waiting on CP", "offload": "waiting on CPU offload", "idle": "idle (pipeline bubble)"}


def _seconds_axis(axis, values, label: str) -> None:
    """Label an axis of seconds, in ms when every value is below a second."""
    from matplotlib.ticker import FuncFormatter

    if values and max(values) < 1:
        axis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x * 1e3:g}"))
        axis.set_label_text(f"{label} (ms)")
    else:
        axis.set_label_text(f"{label} (s)")


def plot_pareto(result: dict, path: str) -> None:
    """Step time against peak memory of every simulated layout of a plan, the Pareto front as the
    staircase it is (the fastest step within a memory budget: nothing lies between two front
    points), the best layout named inside the frame and the given layout marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    ranked = result["ranked"]
    xs = [e["memory_gib_per_gpu"] for e in ranked]
    ys = [e["step_time_s"] for e in ranked]
    ax.scatter(xs, ys, s=18, color="C0", alpha=0.5, label="simulated layouts")
    front = sorted(result["pareto"], key=lambda p: p["memory_gib_per_gpu"])
    g = result["given"]
    best = result["best"]
    allx = xs + [g["memory_gib_per_gpu"]]
    ally = ys + [g["step_time_s"]]
    span_x = (max(allx) - min(allx)) or max(allx) * 0.1 or 1.0
    right = max(allx) + 0.08 * span_x
    fx = [p["memory_gib_per_gpu"] for p in front] + [right]
    fy = [p["step_time_s"] for p in front] + [front[-1]["step_time_s"]]
    ax.step(fx, fy, where="post", color="C3", lw=1.2, ls="--", label="Pareto front: fastest step within a memory budget")
    ax.scatter(fx[:-1], fy[:-1], s=36, color="C3", zorder=3)
    ax.scatter([g["memory_gib_per_gpu"]], [g["step_time_s"]], marker="*", s=160, color="black", zorder=4,
               label=f"given ({g['layout']})")
    ax.scatter([best["memory_gib_per_gpu"]], [best["step_time_s"]], marker="o", s=90, facecolors="none",
               edgecolors="black", lw=1.4, zorder=5, label=f"best ({best['layout']})")
    ax.set_xlim(min(allx) - 0.08 * span_x, right)
    span_y = (max(ally) - min(ally)) or max(ally) * 0.1
    ax.set_ylim(max(0.0, min(ally) - 0.12 * span_y), max(ally) + 0.12 * span_y)
    # the best point's name toward the inside of the frame, wherever the point sits
    bx, by = best["memory_gib_per_gpu"], best["step_time_s"]
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    left_half, low_half = (bx - x0) < (x1 - x0) / 2, (by - y0) < (y1 - y0) / 2
    ax.annotate(f"best: {best['layout']}", (bx, by), fontsize=8, xytext=(8 if left_half else -8, 10 if low_half else -12),
                textcoords="offset points", ha="left" if left_half else "right", va="bottom" if low_half else "top",
                annotation_clip=True)
    ax.set_xlabel("peak memory per GPU (GiB)")
    _seconds_axis(ax.yaxis, ally, "step time")
    ax.grid(alpha=0.3)
    ax.set_title(f"{result['scenario']}: step time against memory of the layouts the plan simulated", fontsize=10)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    save_figure(fig, path)
    plt.close(fig)


MEMORY_COLORS = {"weights": "#4C72B0", "gradients": "#55A868", "optimizer": "#8172B3",
                 "activations": "#DD8452", "other": "#937860"}


def plot_memory(mem: dict, path: str, name: str | None = None) -> None:
    """Memory per GPU by pipeline stage (``memory.memory_report``): stacked components against the
    capacity and the headroom below it (``workload.memory.HEADROOM_FRACTION``); ``name``: the scenario's."""
    plt = _pyplot()
    stages = mem["stages"]
    n = len(stages)
    bars_in = 0.42 * n + 0.3
    fig = plt.figure(figsize=(7.5, bars_in + 1.55))
    ax = fig.add_axes((0.14, 1.0 / (bars_in + 1.55), 0.82, bars_in / (bars_in + 1.55)))
    y = list(range(n))
    left = [0.0] * n
    for comp, color in MEMORY_COLORS.items():
        widths = [st[f"{comp}_gib"] for st in stages]
        ax.barh(y, widths, left=left, color=color, label=COMPONENT_NAMES.get(comp, comp), height=0.68)
        left = [a + b for a, b in zip(left, widths)]
    cap = stages[0]["capacity_gib"]
    ax.axvline(cap, color="#C44E52", lw=1.5, ls="--", label=f"capacity {cap:.0f} GiB")
    ax.axvline(cap * (1 - HEADROOM_FRACTION), color="#C44E52", lw=1, ls=":",
               label=f"{HEADROOM_FRACTION:.0%} headroom below it")
    for yi, st in zip(y, stages):
        ax.annotate(f"{st['total_gib']:.1f} GiB", (st["total_gib"], yi), xytext=(4, 0), textcoords="offset points",
                    va="center", fontsize=8, bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0})
    every = max(1, -(-n // 32))
    ax.set_yticks(y[::every], [f"stage {st['stage']}" for st in stages][::every], fontsize=9 if n <= 16 else 7)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_xlim(0, max(cap, max(st["total_gib"] for st in stages)) * 1.12)
    ax.set_xlabel("memory per GPU (GiB)")
    verdict = "fits" if mem["fits"] else "does NOT fit"
    ax.set_title(f"{name + ': ' if name else ''}memory per GPU by pipeline stage, peak {mem['peak_gib']:.1f} GiB "
                 f"({verdict})", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.55 / bars_in), ncol=4, frameon=False)
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
