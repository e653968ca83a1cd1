"""The trace stored by column: an unfolded step's rows read back exactly as the engine made them.

A run's rows are appended as ``Row``s and, every full ``Trace.BLOCK`` of them, stored by column.
Here the block is made small so that a small cluster's unfolded step crosses many blocks, and
every way of reading the rows (iteration, reversed, index, slices, ``of_ranks``) and every view
built on them must equal the run whose rows all stayed ``Row``s.
"""

import json
from pathlib import Path

import pytest

from simulator.engine import engine
from simulator.engine.engine import SimOptions, simulate
from simulator.engine.records import Row, Trace, TraceRows
from simulator.reports.report import step_report
from simulator.scenario.load import load_scenario
from simulator.trace.commmap import comm_map
from simulator.trace.critical_path import critical_path, row_slack
from simulator.trace.perfetto import trace_events

ROOT = Path(__file__).resolve().parents[1]


def _run(block: int, monkeypatch, waiting: int = 0):
    """A 32-GPU unfolded step (TP8, PP2 interleaved, DP2, 8 layers: every kind of row) stored in
    blocks of ``block`` rows once ``waiting`` wait, the engine offering a store every 128 events."""
    monkeypatch.setattr(Trace, "BLOCK", block)
    monkeypatch.setattr(Trace, "WAITING", waiting)
    monkeypatch.setattr(engine, "_COMPACT_EVERY", 127)
    s = load_scenario(str(ROOT / "scenarios/gpt3-175b-1024xa100.yaml"),
                      ["cluster.num_nodes=4", "parallelism.dp=2", "parallelism.pp=2", "parallelism.vp=2",
                       "training.global_batch_size=8", "model.num_hidden_layers=8"])
    return simulate(s, SimOptions(fold=False, record_flows=True))


@pytest.fixture(scope="module")
def pair():
    mp = pytest.MonkeyPatch()
    try:
        rows = _run(1 << 30, mp)  # every row stays a Row
        blocks = _run(97, mp)  # a block size that divides nothing
        late = _run(97, mp, waiting=3000)  # blocks stored only once 3,000 rows wait
        return rows, blocks, late
    finally:
        mp.undo()


def test_rows_read_back_exactly(pair):
    rows, blocks, late = pair
    whole, packed = rows.trace, blocks.trace
    assert isinstance(packed, TraceRows) and len(packed._blocks) > 10 and len(packed._tail) < 97
    assert len(whole._blocks) == 0
    listed = list(whole)
    assert len(packed) == len(listed) > 10000
    assert list(packed) == listed
    assert all(type(r) is Row for r in packed)
    assert list(reversed(packed)) == listed[::-1]
    for i in (0, 1, 96, 97, 98, 1000, len(listed) - 1, -1, -len(listed)):
        assert packed[i] == listed[i]
    assert packed[5:300:7] == tuple(listed[5:300:7])
    assert packed == whole and packed == tuple(listed) and not packed == tuple(listed[:-1])
    # stored late, the rows still waiting (fewer than 3,000, more than a block) stay Rows, read at
    # their places
    assert 97 <= len(late.trace._tail) < 3000 and len(late.trace._blocks) > 5
    assert late.trace == whole and list(reversed(late.trace)) == listed[::-1]
    for i in (len(listed) - len(late.trace._tail) - 1, len(listed) - len(late.trace._tail), len(listed) - 1):
        assert late.trace[i] == listed[i]
    with pytest.raises(IndexError):
        packed[len(listed)]
    # dependencies come back as the same (rank, stream, time)
    assert sum(r.dep is not None for r in packed) == sum(r.dep is not None for r in listed) > 1000
    assert all(type(r.dep[0]) is int and type(r.dep[2]) is float for r in packed if r.dep is not None)
    # every field reads back with the type the engine gave it: the store changes no int to a float
    for i, field in enumerate(Row._fields):
        if field != "dep":
            assert {type(r[i]) for r in listed} == {type(r[i]) for r in packed}, field


def test_of_ranks_is_a_filter_in_order(pair):
    _, blocks, late = pair
    listed = list(blocks.trace)
    for ranks in ([0], [3, 17, 30], range(32)):
        want = set(ranks)
        assert list(blocks.trace.of_ranks(ranks)) == [r for r in listed if r.rank in want]
        assert list(late.trace.of_ranks(ranks)) == [r for r in listed if r.rank in want]


def test_views_are_byte_identical(pair):
    rows, blocks, _ = pair
    for view in (step_report, comm_map, critical_path, row_slack):
        assert json.dumps(view(rows), sort_keys=True, default=str) == json.dumps(view(blocks), sort_keys=True,
                                                                                 default=str)
    assert json.dumps(trace_events(rows), sort_keys=True) == json.dumps(trace_events(blocks), sort_keys=True)
