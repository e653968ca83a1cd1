"""The public Python API behind ``import simulator``: the calls every command is a thin layer over.

    import simulator
    s = simulator.load_scenario("scenarios/tiny.yaml", overrides={"parallelism.tp": 2})
    r = simulator.run(s)                      # a Run: r.step_time_s, r.breakdown, r.stages, r.memory
    print(r.summary())                        # what `stepsim run` prints; r.to_json() is `run --json`
    m = simulator.memory(s)                   # `stepsim memory`
    best = simulator.plan(s, top=3)           # `stepsim plan --json`
    rows = simulator.sweep(s, {"parallelism.tp": [1, 2]})   # `stepsim sweep`

Scenarios may be a YAML path, a parsed mapping or a ``Scenario``; ``overrides`` are ``--set``
items, as a list of ``"key.path=value"`` strings or a mapping ``{"key.path": value}``. Bad input
raises ``ConfigError`` (one line: the field, the value, what is valid). Nothing here prints unless
given a ``progress`` stream.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from simulator.common.errors import ConfigError
from simulator.scenario.config import Scenario
from simulator.simulation import Checked, Overrides, Run, ScenarioLike, checked, load_scenario, memory, run
from simulator.simulation import _override_list as override_list
from simulator.studies.planner import plan as _plan
from simulator.studies.sweep import run_sweep

__all__ = ["Checked", "ConfigError", "Run", "Scenario", "checked", "load_scenario", "memory", "plan", "run", "sweep"]


def plan(scenario: ScenarioLike, overrides: Overrides = (), *, space: Sequence[str] = (), top: int = 5,
         prove: int = 1, objective: str = "step_time", max_memory_fraction: float = 1.0, pareto: bool = False,
         tolerance: float | str | None = None, out: str | Path | None = None, workers: int | None = None,
         executor: str = "process", address: str | None = None, progress=None) -> dict:
    """The fastest layouts of the scenario's model on its cluster, ranked by simulation: the result
    ``stepsim plan --json`` prints (``best``, ``ranked``, ``given``, ``pareto``, ``candidates``).
    ``space`` narrows the axes as ``--space`` does (``["tp=4,8", "pp=1,2"]``)."""
    return _plan(scenario, sets=override_list(overrides), space=list(space), top=top, prove=prove,
                 objective=objective, max_memory_fraction=max_memory_fraction, pareto=pareto, tolerance=tolerance,
                 out=out, workers=workers, executor=executor, address=address, progress=progress)


def sweep(scenario: ScenarioLike, vary: Mapping[str, Iterable] | Sequence[str], overrides: Overrides = (), *,
          out: str | Path | None = None, workers: int | None = None, executor: str = "process",
          address: str | None = None, progress=None, plots: bool = True) -> list[dict]:
    """The cartesian product of the varied keys (``{"parallelism.tp": [4, 8]}`` or ``["parallelism.tp=4,8"]``),
    one simulation per point: rows in product order, each ``{"point_id", "point", step_time_s, ...}``.
    With ``out`` the rows are also kept there (``results.jsonl``, ``results.csv``, plots) and a rerun
    skips finished points."""
    if isinstance(scenario, Checked):
        scenario = scenario.scenario
    return run_sweep(scenario, vary, out, sets=override_list(overrides), workers=workers, executor=executor,
                     address=address, progress=progress, plots=plots)
