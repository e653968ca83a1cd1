"""Every shipped scenario's step time, breakdown and memory equal tests/golden/steps.json exactly:
what the code gave before the 0.2.0 re-cut, moved only by commits that mean to (``tests/golden.py``)."""

from pathlib import Path

import pytest

from golden import SCENARIOS, figures
from ratchets import GOLDEN
from simulator.reports.report import step_report
from simulator.scenario.load import load_scenario
from simulator.workload.memory import memory_report


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_a_shipped_scenario_gives_its_golden_figures(path: Path, shipped_result):
    got = figures(step_report(shipped_result(path)), memory_report(load_scenario(str(path))))
    assert got == GOLDEN["scenarios"][path.stem]


def test_every_shipped_scenario_has_golden_figures():
    assert sorted(p.stem for p in SCENARIOS) == sorted(GOLDEN["scenarios"])
