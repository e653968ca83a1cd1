"""Pictures read at any scale: the timeline's steady-state window and overview, and the plots'
titles, units and legends."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from PIL import Image

from simulator.cli import main
from simulator.engine.engine import SimOptions, simulate
from simulator.reports.plots import TIMELINE_COLORS, _dominant_categories, plot_timeline
from simulator.reports.timeline import WINDOW_MICROBATCHES, parse_window, select, steady_window, timeline, view
from simulator.scenario.load import load_scenario

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "scenarios" / "tiny.yaml")
# tiny with 32 micro-batches per pipeline: a step far longer than a readable window
LONG = ["training.global_batch_size=64"]


@pytest.fixture(scope="module")
def long_step():
    return timeline(simulate(load_scenario(TINY, LONG), SimOptions()))


@pytest.fixture(scope="module")
def short_step():
    return timeline(simulate(load_scenario(TINY), SimOptions()))


def _png_size(data: bytes) -> tuple[int, int]:
    return Image.open(io.BytesIO(data)).size


def test_the_window_is_a_few_whole_micro_batches_around_the_middle(long_step):
    tl = long_step
    t0, t1 = steady_window(tl)
    assert 0 < t0 < t1 < tl.step_time_s
    starts = {lab.start for lab in tl.labels}
    ends = {lab.end for lab in tl.labels}
    assert t0 in starts and t1 in ends  # cut at schedule-step boundaries
    for stage in range(tl.stages):
        steps = sorted((lab for lab in tl.labels if lab.stage == stage), key=lambda lab: lab.start)
        inside = [lab for lab in steps if t0 <= lab.start and lab.end <= t1]
        per_mb = len(steps) / len({lab.microbatch for lab in steps})
        lo, hi = WINDOW_MICROBATCHES
        assert (lo - 1) * per_mb <= len(inside) <= (hi + 1) * per_mb, stage
        assert len(inside) < len(steps) / 3  # a window, not most of the step
        middle = (steps[0].start + steps[-1].end) / 2
        longest = max(lab.end - lab.start for lab in steps)
        assert abs((t0 + t1) / 2 - middle) <= 2 * longest, stage


def test_a_short_step_is_drawn_whole_and_an_explicit_window_keeps_the_overview(short_step, long_step):
    chart, overview = view(short_step)
    assert overview is None and chart.window_s is None
    chart, overview = view(long_step)
    assert overview is not None and overview.window_s is None and chart.window_s == steady_window(long_step)
    chart, overview = view(long_step, (1,), (0.001, 0.002))
    assert chart.rows == (1,) and overview.rows == (1,) and chart.window_s == (0.001, 0.002)
    whole = parse_window(":", long_step.step_time_s)
    chart, overview = view(long_step, None, whole)
    assert overview is None and chart.span_s == (0.0, long_step.step_time_s)


def test_the_overview_strip_shows_the_category_that_fills_each_bin(long_step):
    bins = 400
    grid = _dominant_categories(long_step, long_step.rows, bins)
    width = long_step.step_time_s / bins
    cats = list(TIMELINE_COLORS)
    checked = 0
    for b in long_step.bars:
        first, last = int(b.start / width) + 1, int(b.end / width) - 1  # bins wholly inside the bar
        for k in range(first, last + 1):
            assert cats[grid[b.stage, k]] == b.category
            checked += 1
    assert checked > bins  # the long bars cover many bins on both stages
    assert (grid >= 0).all()  # bars tile the step: no bin is empty


def test_run_timeline_is_a_readable_window_by_default(tmp_path, capsys):
    default, whole = tmp_path / "default.png", tmp_path / "whole.png"
    sets = ["--set", LONG[0]]
    assert main(["run", TINY, *sets, "--timeline", str(default)]) == 0
    assert main(["run", TINY, *sets, "--timeline", str(whole), "--window", ":"]) == 0
    assert main(["run", TINY, *sets, "--timeline", str(tmp_path / "tail.png"), "--window", "0.01:"]) == 0
    capsys.readouterr()
    w, h = _png_size(default.read_bytes())
    assert w <= 1700 and h <= 1100  # about 10 x 5 inches at 150 dpi
    assert _png_size(whole.read_bytes())[0] > w  # the whole step on request, as wide as it needs


def test_timeline_title_names_the_schedule_that_ran(tmp_path):
    tl = timeline(simulate(load_scenario(TINY, ["parallelism.pp=2", "parallelism.vp=2", "schedule=1f1b",
                                                "training.global_batch_size=8"]), SimOptions()))
    assert "interleaved" in tl.title and "1f1b" not in tl.title
    assert tl.chunks == 2
    chart, overview = view(tl)
    plot_timeline(chart, str(tmp_path / "t.png"), overview)
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"


def test_select_then_view_keeps_the_chosen_rows(long_step):
    part = select(long_step, (0,))
    chart, overview = view(part)
    assert chart.rows == (0,) and {b.stage for b in chart.bars} == {0}
    assert overview is not None and {b.stage for b in overview.bars} == {0}


# --- every plot: a title naming what it shows, axis units, a legend ---------------------------------

@pytest.fixture
def drawn(monkeypatch):
    """The figures the plot functions save, read back as they were drawn: titles, axis labels, legend
    entries, tick labels and where texts landed."""
    import simulator.reports.plots as plots

    figures = []

    def capture(fig, path):
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        axes = []
        for ax in fig.axes:
            legend = ax.get_legend()
            axes.append({
                "ax": ax, "box": ax.get_window_extent(renderer),
                "title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
                "legend": [t.get_text() for t in legend.get_texts()] if legend else [],
                "xticks": [(t.get_text(), t.get_window_extent(renderer)) for t in ax.get_xticklabels()
                           if t.get_visible() and t.get_text()],
                "yticks": [(t.get_text(), t.get_window_extent(renderer)) for t in ax.get_yticklabels()
                           if t.get_visible() and t.get_text()],
                "texts": [(t.get_text(), t.get_window_extent(renderer)) for t in ax.texts],
            })
        figures.append({"axes": axes, "legends": [[t.get_text() for t in lg.get_texts()] for lg in fig.legends],
                        "texts": [t.get_text() for t in fig.texts]})
        Path(path).write_bytes(b"")

    monkeypatch.setattr(plots, "save_figure", capture)
    return figures


def _no_overlap(ticks) -> bool:
    boxes = sorted((b for _, b in ticks), key=lambda b: b.x0)
    return all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:]))


def test_validation_ticks_are_plain_numbers_that_do_not_overlap(drawn, tmp_path):
    from simulator.reports.plots import plot_validation

    rows = [{"id": f"c{i}", "error": p / m - 1, "groups": {"gpu": "H100-SXM5-80GB", "axes": "tp+dp"},
             "measured": {"step_time_s": m}, "predicted": {"step_time_s": p}}
            for i, (m, p) in enumerate([(25, 27), (31, 29), (44, 40), (52, 58), (68, 66)])]
    plot_validation({"rows": rows, "summary": {"mape": 0.07, "scored": 5}}, str(tmp_path / "v.png"), "runs.yaml")
    ax = drawn[0]["axes"][0]
    assert ax["title"].startswith("runs.yaml: ") and ax["xlabel"].endswith("(s)") and ax["ylabel"].endswith("(s)")
    assert "H100 tp+dp" in ax["legend"] and "±20%" in ax["legend"]
    for ticks in (ax["xticks"], ax["yticks"]):
        assert ticks and all(re.fullmatch(r"\d+(\.\d+)?", text) for text, _ in ticks)
    assert _no_overlap(ax["xticks"])


def test_pareto_front_is_a_staircase_and_the_best_label_stays_in_the_frame(drawn, tmp_path):
    from simulator.reports.plots import plot_pareto

    ranked = [{"layout": "TP8 PP4 DP2 mbs1 Z1 ends1/1", "memory_gib_per_gpu": 71.0, "step_time_s": 14.2, "rank": 1},
              {"layout": "TP4 PP8 DP2 mbs1 Z1", "memory_gib_per_gpu": 48.0, "step_time_s": 15.1, "rank": 2},
              {"layout": "TP2 PP8 DP4 mbs1 Z1", "memory_gib_per_gpu": 66.0, "step_time_s": 16.4, "rank": 3}]
    result = {"scenario": "some-scenario", "ranked": ranked, "best": ranked[0], "pareto": [ranked[1], ranked[0]],
              "given": {"layout": "TP4 PP4 DP4 mbs1 Z1", "memory_gib_per_gpu": 59.2, "step_time_s": 15.7}}
    plot_pareto(result, str(tmp_path / "p.png"))
    ax = drawn[0]["axes"][0]
    assert ax["title"].startswith("some-scenario: ")
    assert ax["xlabel"] == "peak memory per GPU (GiB)" and ax["ylabel"] == "step time (s)"
    assert any(label.startswith("Pareto front") for label in ax["legend"])
    front = [line for line in ax["ax"].get_lines() if line.get_label().startswith("Pareto front")]
    assert len(front) == 1 and front[0].get_drawstyle() == "steps-post"
    (text, box), = [(t, b) for t, b in ax["texts"] if t.startswith("best: ")]
    frame = ax["box"]
    assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1, text


def test_sweep_plots_keep_categories_apart_and_mark_what_does_not_fit(drawn, tmp_path):
    from simulator.reports.plots import plot_sweep

    def row(tp, rc, step, fits=True, error=None):
        return {"point": {"parallelism.tp": tp, "training.recompute": rc}, "step_time_s": None if error else step,
                "fits": fits, "error": error, "peak_memory_gib": 90.0 if not fits else 50.0,
                "compute_s": None if error else step * 0.8, "idle_s": None if error else step * 0.2}

    rows = [row(2, "none", 4.0, fits=False), row(2, "full", 5.2), row(4, "none", 4.1), row(4, "full", 5.4),
            row(8, "none", None, error="parallelism.tp: got 8; ...")]
    plot_sweep(rows, ["parallelism.tp", "training.recompute"], str(tmp_path), "some-scenario")
    by_tp, by_rc, breakdown = (f["axes"][0] for f in drawn)
    for ax in (by_tp, by_rc, breakdown):
        assert ax["title"].startswith("some-scenario: ")
    assert by_tp["ylabel"] == by_rc["ylabel"] == "step time (s)" and breakdown["xlabel"].endswith("(s)")
    for ax in (by_tp, by_rc):
        assert "hollow: does not fit in memory" in ax["legend"] and "1 invalid point not drawn" in ax["legend"]
    # numeric tp: points joined; categorical recompute: no line between none and full
    assert any(len(line.get_xdata()) > 1 for line in by_tp["ax"].get_lines())
    assert not any(len(line.get_xdata()) > 1 for line in by_rc["ax"].get_lines())
    labels = [t for t, _ in breakdown["yticks"]]
    assert "tp=2, recompute=none  (does not fit: 90.0 GiB)" in labels
    assert any(t.endswith("(invalid: not simulated)") for t in labels)
    assert "does not fit in memory" in breakdown["legend"] and "compute" in breakdown["legend"]


def test_memory_tornado_and_timeline_name_the_scenario_and_their_units(drawn, tmp_path, long_step):
    import simulator
    from simulator.reports.plots import plot_memory, plot_tornado

    plot_memory(simulator.memory(TINY).to_dict(), str(tmp_path / "m.png"), "tiny")
    rows = [{"target": "compute", "present": True, "faster_step_time_s": 0.005, "slower_step_time_s": 0.0137},
            {"target": "nvlink", "present": True, "faster_step_time_s": 0.0075, "slower_step_time_s": 0.0081}]
    plot_tornado({"name": "tiny", "baseline_step_time_s": 0.0077, "factor": 2.0, "rows": rows}, str(tmp_path / "t.png"))
    chart, overview = view(long_step)
    plot_timeline(chart, str(tmp_path / "tl.png"), overview)
    mem, tornado, tl = drawn
    ax = mem["axes"][0]
    assert ax["title"].startswith("tiny: ") and ax["xlabel"] == "memory per GPU (GiB)"
    assert "buffers" in ax["legend"] and "other" not in ax["legend"] and "capacity 80 GiB" in ax["legend"]
    ax = tornado["axes"][0]
    assert ax["title"].startswith("tiny: ") and ax["xlabel"] == "step time (ms)"
    assert set(ax["legend"]) == {"as simulated: 7.7 ms", "2x slower", "2x faster"}
    assert tl["texts"][0].startswith("tiny: ")
    assert [a["xlabel"] for a in tl["axes"]] == ["time since the step began (ms)", "whole step, time (s)"]
    assert {"forward", "backward", "idle (pipeline bubble)"} <= set(tl["legends"][0])
