"""One simulated step, end to end: the pipeline every command, study and notebook calls.

``run(scenario)`` loads the scenario (a file, a mapping or a :class:`Scenario`), checks that its
layout can run (``layout.rules.validate_plan``: errors raise, warnings are kept), prices its memory
(``workload.memory``; a plan that does not fit is a ``ConfigError`` unless ``allow_oom``), simulates
the step (``engine``) and reports it (``reports.report``). The :class:`Run` it returns is typed and
its ``to_dict()`` is exactly what ``stepsim run --json`` prints.

    >>> import simulator
    >>> r = simulator.run("scenarios/tiny.yaml")
    >>> round(r.step_time_s, 4)
    0.0077
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from simulator.common import limits
from simulator.common.errors import ConfigError
from simulator.engine.engine import simulate
from simulator.engine.records import SimOptions, SimResult
from simulator.layout.rules import validate_plan
from simulator.network.cluster import Cluster
from simulator.network.collectives import ALGORITHMS
from simulator.reports.memory import format_memory_table
from simulator.reports.report import StageTimes, StepReport, TimeBreakdown, format_summary, step_record
from simulator.scenario.config import Scenario
from simulator.scenario.load import load_scenario as _load_file
from simulator.scenario.load import scenario_from_dict, scenario_to_dict
from simulator.trace.commmap import comm_map
from simulator.trace.critical_path import critical_path
from simulator.trace.linkuse import link_use
from simulator.trace.kineto import write_kineto
from simulator.trace.perfetto import write_trace

TRACE_FORMATS = ("perfetto", "kineto")
from simulator.workload.memory import MemoryReport, memory_record

ScenarioLike = str | Path | Mapping | Scenario
Overrides = Iterable[str] | Mapping[str, object]


def _override_list(overrides: Overrides) -> list[str]:
    """``--set`` items from a list of ``key=value`` strings or a mapping ``{"parallelism.tp": 8}``."""
    if isinstance(overrides, Mapping):
        return [f"{k}={json.dumps(v)}" for k, v in overrides.items()]
    if isinstance(overrides, str):
        raise ConfigError("overrides", overrides, "must be a list of key=value strings or a mapping, not one string")
    return [str(o) for o in overrides]


def load_scenario(scenario: ScenarioLike, overrides: Overrides = ()) -> Scenario:
    """A checked :class:`Scenario` from a YAML file path, a parsed mapping or a Scenario, with
    ``overrides`` applied as ``--set`` applies them (``["parallelism.tp=8"]`` or
    ``{"parallelism.tp": 8}``). Bad input raises a one-line ``ConfigError``."""
    sets = _override_list(overrides)
    if isinstance(scenario, Scenario):
        if not sets:
            return scenario
        return scenario_from_dict(scenario_to_dict(scenario), sets, default_name=scenario.name)
    if isinstance(scenario, Mapping):
        return scenario_from_dict(dict(scenario), sets)
    if isinstance(scenario, (str, Path)):
        return _load_file(str(scenario), sets)
    raise ConfigError("scenario", type(scenario).__name__, "must be a YAML file path, a mapping or a Scenario")


def check(scenario: Scenario) -> tuple[str, ...]:
    """Raise ``ConfigError`` if the layout cannot run; the warnings of one that runs on slow links."""
    return tuple(validate_plan(scenario))


def memory(scenario: ScenarioLike, overrides: Overrides = ()) -> MemoryReport:
    """Memory per GPU and pipeline stage (``stepsim memory``; ``.to_dict()`` is its ``--json``)."""
    s = load_scenario(scenario, overrides)
    check(s)
    return memory_record(s)


def check_fits(s: Scenario, mem: MemoryReport) -> None:
    """A ``ConfigError`` naming the fullest stage and its biggest component when ``mem`` does not fit."""
    if mem.fits:
        return
    worst = max(mem.stages, key=lambda st: st.total_gib)
    biggest = getattr(worst, f"{worst.biggest}_gib")
    raise ConfigError("memory", f"{worst.total_gib:.1f} GiB on stage {worst.stage}",
                      f"exceeds the {worst.capacity_gib:.1f} GiB of {s.cluster.gpu}; biggest component: "
                      f"{worst.biggest} ({biggest:.1f} GiB); shard more (tp, pp, zero_stage), recompute, or "
                      "pass --allow-oom")


@dataclass(frozen=True)
class Run:
    """One simulated step: the scenario, its report, its memory, the warnings of its layout, and the
    raw result (trace rows, flows) for traces, timelines and further analysis."""

    scenario: Scenario
    report: StepReport
    memory: MemoryReport
    warnings: tuple[str, ...]
    result: SimResult = field(repr=False)

    @property
    def step_time_s(self) -> float:
        return self.report.step_time_s

    @property
    def breakdown(self) -> TimeBreakdown:
        """Mean time per GPU: compute, exposed communication by axis, idle."""
        return self.report.time_breakdown_s

    @property
    def stages(self) -> tuple[StageTimes, ...]:
        return self.report.stages

    @property
    def mfu(self) -> float:
        return self.report.mfu

    @property
    def bubble_fraction(self) -> float:
        return self.report.bubble_fraction

    def to_dict(self, analyses: bool | None = None, wall: bool = True) -> dict:
        """The ``stepsim run --json`` report. ``analyses`` adds the critical path, link use and
        communication map (default: when the run recorded its flows, as ``run --json`` does);
        ``wall=False`` leaves out ``sim_wall_s``, the one field that differs between runs."""
        out = (self.report if wall else replace(self.report, sim_wall_s=None)).to_dict()
        out["memory_gib_per_gpu"] = self.memory.to_dict()
        out["warnings"] = list(self.warnings)
        if self.result.options.record_flows if analyses is None else analyses:
            out["critical_path"] = critical_path(self.result)
            out["link_use"] = link_use(self.result)
            out["comm_map"] = comm_map(self.result)
        return out

    def to_json(self, analyses: bool | None = None) -> str:
        """``to_dict()`` as the JSON text ``stepsim run --json`` prints."""
        return json.dumps(self.to_dict(analyses), indent=2)

    def summary(self) -> str:
        """The human summary ``stepsim run`` prints."""
        return format_summary(self.to_dict(analyses=False))

    def memory_table(self) -> str:
        return format_memory_table(self.memory.to_dict())

    def write_trace(self, path: str | Path, format: str = "perfetto") -> list[str]:
        """A trace of the step; the files written. ``perfetto``: one Perfetto / Chrome trace (JSON)
        of every simulated rank's streams; ``kineto``: per simulated rank a PyTorch profiler trace
        with one kernel per op (``trace.kineto``; the run must have recorded its flows), which
        ``stepsim calibrate`` reads."""
        if format == "kineto":
            return write_kineto(self.result, path)
        if format != "perfetto":
            raise ConfigError("--trace-format", format, f"valid: {', '.join(TRACE_FORMATS)}")
        write_trace(self.result, str(path))
        return [str(path)]


Simulate = Callable[..., SimResult]


@dataclass(frozen=True)
class Checked:
    """A scenario whose layout was checked and whose memory was priced: what ``run`` simulates."""

    scenario: Scenario
    warnings: tuple[str, ...]
    memory: MemoryReport


def checked(scenario: ScenarioLike | Checked, overrides: Overrides = (), on_warning=None) -> Checked:
    """Load ``scenario``, check its layout (errors raise; ``on_warning`` hears each warning) and
    price its memory."""
    if isinstance(scenario, Checked) and not overrides:
        return scenario
    s = load_scenario(scenario.scenario if isinstance(scenario, Checked) else scenario, overrides)
    warnings = check(s)
    for w in warnings if on_warning is not None else ():
        on_warning(w)
    return Checked(s, warnings, memory_record(s))


def check_unfolded(s: Scenario, field: str = "fold") -> int:
    """The factor by which simulating every rank multiplies the folded run's work (ranks per pipeline
    stage), or a one-line ConfigError on ``field`` when the unfolded run would take hours
    (``limits.UNFOLDED_RANKS``, ``limits.STEP_WORK``)."""
    ranks, pp = s.cluster.num_gpus, s.parallelism.pp
    if ranks > limits.UNFOLDED_RANKS.maximum:
        raise ConfigError(field, f"{ranks:,} ranks", f"{limits.UNFOLDED_RANKS.describe()}: drop it (the folded "
                          "run is exact for symmetric layouts) or simulate a smaller data-parallel width")
    work = s.num_microbatches * s.model.num_hidden_layers * (ranks // pp)
    if work > limits.STEP_WORK.maximum:
        raise ConfigError(field, f"{ranks:,} ranks", f"{work:,} micro-batch x layer passes to simulate over every "
                          f"rank; {limits.STEP_WORK.describe()}: drop it (the folded run is exact for symmetric "
                          "layouts) or simulate a smaller data-parallel width")
    return ranks // pp


def run(scenario: ScenarioLike | Checked, overrides: Overrides = (), *, fold: bool = True, algorithm: str = "auto",
        allow_oom: bool = False, record_flows: bool = True, options: SimOptions | None = None,
        cluster: Cluster | None = None, engine: Simulate = simulate, progress=None,
        on_warning: Callable[[str], None] | None = None) -> Run:
    """Simulate one training step of ``scenario`` (a YAML path, a mapping or a Scenario).

    ``fold``: one rank per pipeline stage stands for its stage (exact for symmetric layouts; False
    simulates every rank). ``algorithm``: the collective algorithm (``auto`` is NCCL's choice).
    ``allow_oom``: simulate a plan that does not fit in memory instead of raising. ``record_flows``:
    keep every transfer's rates (for link use and the communication map in ``to_dict``).
    ``options`` replaces ``fold``, ``algorithm`` and ``record_flows`` with a whole ``SimOptions``;
    ``cluster`` runs on a given (what-if) cluster; ``engine(scenario, options, cluster)`` replaces
    the simulation (the planner's stop-above-a-cutoff). ``progress.phase(text)`` hears each stage
    begin (loading only when there is something to load: not for a ``Checked`` scenario); ``on_warning`` hears each warning as soon as it is found. Bad input raises a one-line
    ConfigError."""
    if algorithm not in ALGORITHMS:
        raise ConfigError("algorithm", algorithm, f"valid: {', '.join(ALGORITHMS)}")
    phase = progress.phase if progress is not None else (lambda text: None)
    if not isinstance(scenario, Checked) or overrides:
        phase("loading the scenario")
    c = checked(scenario, overrides, on_warning)
    s, warnings, mem = c.scenario, c.warnings, c.memory
    if not allow_oom:
        check_fits(s, mem)
    if options is None:
        options = SimOptions(fold=fold, algorithm=algorithm, record_flows=record_flows)
    if not options.fold:
        check_unfolded(s)
    phase("simulating the step")
    t0 = time.perf_counter()
    result = engine(s, options, cluster=cluster)
    report = step_record(result, time.perf_counter() - t0)
    return Run(s, report, mem, warnings, result)
