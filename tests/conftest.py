"""Shared fixtures: each shipped scenario is simulated once per test session.

test_scenarios_run checks the step report of every scenario in ``scenarios/`` and test_trace_views
its critical path, link use and flows; both read the same simulation (with flows recorded, which
changes no number of the report: the recorder only copies rates it already computed)."""

from __future__ import annotations

from functools import lru_cache

import pytest

from simulator.scenario.load import load_scenario
from simulator.engine.engine import SimOptions, SimResult, simulate


@lru_cache(maxsize=None)
def _shipped(path: str) -> SimResult:
    return simulate(load_scenario(path), SimOptions(record_flows=True))


@pytest.fixture(scope="session")
def shipped_result():
    """``shipped_result(path)``: the simulation of a shipped scenario, with flows recorded."""
    yield lambda path: _shipped(str(path))
    _shipped.cache_clear()
