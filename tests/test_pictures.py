"""Pictures read at any scale: the timeline's steady-state window and overview, and the plots'
titles, units and legends."""

from __future__ import annotations

import io
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
