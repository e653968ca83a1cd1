"""Measured against simulated: a profile of the user's job next to stepsim's program for the same ranks,
per kernel class; the efficiency factors ``stepsim calibrate`` writes, and the table and plot of
``stepsim run --profile-diff``.

What is compared
----------------
The profile (``kineto.read_profile``) gives, per profiled rank, the kernel time of each class over
its steady-state iterations, divided here by the iterations: one iteration of that rank. The
scenario, simulated once (``simulation.run``; folded, so a pipeline stage's representative rank
stands for each of its ranks), gives the same rank's step: each compute row of the trace is the
block of the stage's program it ran (``trace.kineto.compute_ops``), spread over the block's ops in
proportion to their modelled times, so an op's simulated time includes what the SMs held by
communication kernels beside it cost (as a measured kernel's duration does), and each op adds to
its class (``workload.classes.op_class``). Communication is each collective call's time from launch
to end (``SimResult.comm_calls``), which is what an NCCL kernel's duration measures.

A class's factor is simulated / measured, summed over the profiled ranks (so the ranks weigh by
their time); ``factor_min``/``factor_max`` are the ranks' own. GEMMs recorded with their shapes
(``record_shapes=True``) whose shape stepsim's program also runs get a factor per shape
(``workload.classes.gemm_key``: output dimensions either way round, k, batch).

What is refused, and what is only noted
---------------------------------------
Refused with a one-line error on ``profile``: a trace without GPU kernels (the reader); a rank the
scenario does not have; a recorded world size other than the scenario's GPUs; a GPU other than the
scenario's (``deviceProperties``, when the trace names it); a profile of which no class can be
compared with the scenario's program. Noted in the file and the table: a class stepsim models that
the profile lacks (``uncalibrated``), a class the profile has and stepsim's program does not
(``unmodelled``: memcpy, memset, other), a ratio outside ``parts.calibration``'s bounds
(``uncalibrated``: not the same work), and communication when a group of a profiled rank spans
nodes: a one-node profile calibrates NVLink collectives only, and the factor is applied to NVLink
only (``parts.calibration.COMMUNICATION_SCOPE``). Kernel counts far apart are a warning: the layers,
micro-batches or layout may differ.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from simulator.common.errors import ConfigError
from simulator.common.files import atomic_write_text
from simulator.parts.calibration import (CLASSES, COMMUNICATION, COMMUNICATION_SCOPE, MAX_FACTOR, MIN_FACTOR, VERSION,
                                         read_calibration)
from simulator.parts.gpus import GPUFile, lookup_name
from simulator.simulation import Run, load_scenario, run
from simulator.trace.kineto import compute_ops, op_intervals
from simulator.workload.classes import HOST, gemm_key, op_class
from simulator.calibrate.kineto import CLASSES as TRACE_CLASSES
from simulator.calibrate.kineto import Profile, read_profile

FIELD = "profile"
GROUPS = ("tp", "cp", "dpcp", "dprep", "ep", "edp", "etp")
COUNT_RATIO_WARNING = 8.0  # GEMM kernels per iteration this far apart: other work, not other efficiency


@dataclass(frozen=True)
class ClassRow:
    """One kernel class: measured and simulated time of one iteration, summed over the profiled ranks."""

    name: str
    measured_s: float
    simulated_s: float
    kernels: int  # measured, per iteration
    ops: int  # stepsim's, per iteration
    share: float  # measured over the ranks' GPU-busy time
    per_rank: tuple[tuple[int, float, float], ...]  # (rank, measured_s, simulated_s)
    status: str  # compared (calibrate: the class's factor), uncalibrated, unmodelled
    note: str = ""

    @property
    def ratio(self) -> float | None:
        """simulated / measured, None when either side is empty."""
        return self.simulated_s / self.measured_s if self.measured_s > 0 and self.simulated_s > 0 else None

    @property
    def rank_ratios(self) -> list[float]:
        return [sim / meas for _, meas, sim in self.per_rank if meas > 0 and sim > 0]


@dataclass(frozen=True)
class ShapeRow:
    """GEMMs of one shape (``gemm_key``) both sides run."""

    shape: tuple[int, int, int, int]
    measured_s: float
    simulated_s: float
    kernels: int
    ops: int
    stepsim_ops: tuple[str, ...]

    @property
    def ratio(self) -> float:
        return self.simulated_s / self.measured_s


@dataclass(frozen=True)
class Comparison:
    """A profile next to the simulation of its scenario (see the module docstring)."""

    scenario: str
    profile: tuple[str, ...]
    ranks: tuple[int, ...]
    representative: dict  # profiled rank -> the simulated rank standing for it
    device: str | None
    iterations: int  # fewest kept iterations of a rank
    coverage: float
    measured_step_s: float  # one iteration's wall time, mean over the ranks
    simulated_step_s: float
    measured_busy_s: float  # GPU-busy time of one iteration, summed over the ranks
    classes: tuple[ClassRow, ...]
    shapes: tuple[ShapeRow, ...]
    warnings: tuple[str, ...]

    def row(self, name: str) -> ClassRow | None:
        return next((c for c in self.classes if c.name == name), None)

    @property
    def compared(self) -> tuple[ClassRow, ...]:
        """The classes both sides run whose ratio is within bounds: those a calibration sets."""
        return tuple(c for c in self.classes if c.status == "compared")


# --- simulated time per class ---------------------------------------------------------------------


def _simulated(run_: Run, rank: int) -> tuple[dict, dict, dict, dict]:
    """Of one simulated rank's step: seconds and op counts per class, and seconds and op names per
    GEMM shape key."""
    seconds: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    shape_s: dict[tuple, float] = defaultdict(float)
    shape_ops: dict[tuple, list] = defaultdict(list)
    for row, compute in compute_ops(run_.result, rank):
        for op, start, end in op_intervals(row, compute):
            cls = op_class(op.name)
            if cls is None or cls == HOST or end <= start:
                continue
            seconds[cls] += end - start
            count[cls] += 1
            if cls == "gemm":
                key = gemm_key(op.shape)
                if key is not None:
                    shape_s[key] += end - start
                    shape_ops[key].append(op.name)
    for r, _axis, _op, calls, _nbytes, secs in run_.result.comm_calls:
        if r == rank and secs > 0:
            seconds[COMMUNICATION] += secs
            count[COMMUNICATION] += calls
    return seconds, count, shape_s, shape_ops


def _representative(run_: Run, rank: int) -> int:
    plan = run_.result.plan
    if rank in run_.result.simulated_ranks:
        return rank
    stage = plan.stage_of(rank)
    return next(r for r in sorted(run_.result.simulated_ranks) if plan.stage_of(r) == stage)


def _crossing_groups(run_: Run, rank: int) -> list[str]:
    """The groups of ``rank`` (and its pipeline neighbours) that span nodes."""
    plan, cluster, s = run_.result.plan, run_.result.cluster, run_.scenario
    kinds = [k for k in GROUPS if s.model.is_moe or k not in ("ep", "edp", "etp")]
    out = []
    for kind in kinds:
        members = plan.group_of(rank, kind)
        if len({cluster.node_of(m) for m in members}) > 1:
            out.append(kind)
    stage = plan.stage_of(rank)
    for other in (stage - 1, stage + 1):
        if 0 <= other < plan.pp and cluster.node_of(plan.pp_peer(rank, other)) != cluster.node_of(rank):
            out.append("pp")
            break
    return out


# --- checks ---------------------------------------------------------------------------------------


def _gpu_key(text: str | None) -> str | None:
    return lookup_name(text) if text else None


def _check_layout(profile: Profile, run_: Run) -> None:
    s = run_.scenario
    world = run_.result.plan.world
    where = f"{s.cluster.num_nodes} node(s) x {s.cluster.gpus_per_node} GPUs"
    scenario_gpu = s.cluster.gpu
    for r in profile.ranks:
        name = os.path.basename(r.path)
        if r.world_size is not None and r.world_size != world:
            raise ConfigError(FIELD, f"{name}: world_size {r.world_size}",
                              f"the scenario runs {world} GPUs ({where}): give the scenario of the profiled run "
                              "(for a one-node profile, the one-node version of the big job)")
        if r.rank >= world:
            raise ConfigError(FIELD, f"{name}: rank {r.rank}", f"the scenario has ranks 0 to {world - 1} ({where})")
        if r.device and not isinstance(scenario_gpu, GPUFile):
            mine, theirs = _gpu_key(r.device), _gpu_key(str(scenario_gpu))
            if mine != theirs:
                raise ConfigError(FIELD, f"{name}: ran on {r.device}",
                                  f"the scenario's GPU is {scenario_gpu} (cluster.gpu): kernel times of one GPU do not "
                                  "calibrate another")


# --- the comparison -------------------------------------------------------------------------------


def compare(profile: Profile, run_: Run, paths: tuple[str, ...] = ()) -> Comparison:
    """The profile's ranks next to the simulated ranks standing for them, per class (module docstring)."""
    _check_layout(profile, run_)
    reps = {r.rank: _representative(run_, r.rank) for r in profile.ranks}
    sims = {rep: _simulated(run_, rep) for rep in sorted(set(reps.values()))}
    measured: dict[str, float] = defaultdict(float)
    kernels: dict[str, float] = defaultdict(float)
    simulated: dict[str, float] = defaultdict(float)
    ops: dict[str, int] = defaultdict(int)
    per_rank: dict[str, list] = defaultdict(list)
    shape_meas: dict[tuple, float] = defaultdict(float)
    shape_kernels: dict[tuple, float] = defaultdict(float)
    shape_sim: dict[tuple, float] = defaultdict(float)
    shape_ops: dict[tuple, list] = defaultdict(list)
    busy = 0.0
    crossing: set[str] = set()
    for r in profile.ranks:
        n = len(r.iterations)
        seconds, count, sh_s, sh_ops = sims[reps[r.rank]]
        busy += r.busy_us * 1e-6 / n
        names = {c.name for c in r.classes} | set(seconds)
        for name in names:
            meas = r.time_of(name) * 1e-6 / n
            cnt = next((c.count for c in r.classes if c.name == name), 0) / n
            measured[name] += meas
            kernels[name] += cnt
            simulated[name] += seconds.get(name, 0.0)
            ops[name] += count.get(name, 0)
            per_rank[name].append((r.rank, meas, seconds.get(name, 0.0)))
        mine: dict[tuple, list] = defaultdict(lambda: [0.0, 0.0])
        for g in r.gemm_shapes:
            m, nn = sorted((g.m, g.n))
            key = (m, nn, g.k, g.batch)
            mine[key][0] += g.time_us * 1e-6 / n
            mine[key][1] += g.count / n
        for key, (t, c) in mine.items():
            if key in sh_s:
                shape_meas[key] += t
                shape_kernels[key] += c
                shape_sim[key] += sh_s[key]
                shape_ops[key].extend(sh_ops[key])
        crossing.update(_crossing_groups(run_, r.rank))
    rows = []
    for name in sorted(measured, key=_class_order):
        meas, sim = measured[name], simulated[name]
        status, note = "compared", ""
        if name not in CLASSES:
            status, note = "unmodelled", f"stepsim's program has no {name} ops"
        elif sim <= 0 and meas > 0:
            status, note = "unmodelled", f"the scenario's program has no {name} ops for these ranks"
        elif meas <= 0:
            status, note = "uncalibrated", f"the profile has no {name} kernels"
        elif name == COMMUNICATION and crossing:
            status, note = "uncalibrated", (f"the profiled ranks' {', '.join(sorted(crossing))} groups span nodes: a "
                                            "factor measured there is not an NVLink one; profile one node with the "
                                            "one-node scenario")
        else:
            ratio = sim / meas
            if not MIN_FACTOR <= ratio <= MAX_FACTOR:
                status, note = "uncalibrated", (f"simulated / measured = {ratio:.3g}, outside {MIN_FACTOR:g} to "
                                                f"{MAX_FACTOR:g}: the profile and the scenario do not run the "
                                                "same work")
            elif name == COMMUNICATION:
                note = COMMUNICATION_SCOPE
        if meas <= 0 and sim <= 0:
            continue
        rows.append(ClassRow(name, meas, sim, round(kernels[name]), ops[name], meas / busy if busy else 0.0,
                             tuple(sorted(per_rank[name])), status, note))
    shapes = tuple(ShapeRow(key, shape_meas[key], shape_sim[key], round(shape_kernels[key]), len(shape_ops[key]),
                            tuple(sorted(set(shape_ops[key]))))
                   for key in sorted(shape_meas)
                   if shape_meas[key] > 0 and MIN_FACTOR <= shape_sim[key] / shape_meas[key] <= MAX_FACTOR)
    usable = [c for c in rows if c.status == "compared"]
    if not usable:
        reasons = "; ".join(f"{c.name}: {c.note}" for c in rows if c.note) or "no class in common"
        raise ConfigError(FIELD, ", ".join(paths) or "the profile",
                          f"no kernel class can be compared with the scenario's program ({reasons})")
    warnings = list(profile.warnings)
    gemm = next((c for c in rows if c.name == "gemm" and c.kernels and c.ops), None)
    if gemm is not None and not 1 / COUNT_RATIO_WARNING <= gemm.ops / gemm.kernels <= COUNT_RATIO_WARNING:
        warnings.append(f"GEMMs per iteration: {gemm.kernels} kernels measured, {gemm.ops} in stepsim's program: the "
                        "layers, micro-batches or layout of the profile and the scenario may differ")
    if not run_.memory.fits:
        warnings.append("stepsim's memory model says the scenario does not fit, yet the profiled run ran")
    steps = [r.step_time_us * 1e-6 for r in profile.ranks]
    devices = sorted({r.device for r in profile.ranks if r.device})
    return Comparison(
        scenario=run_.scenario.name, profile=tuple(paths) or tuple(r.path for r in profile.ranks),
        ranks=tuple(r.rank for r in profile.ranks), representative=reps,
        device=", ".join(devices) or None, iterations=min(len(r.iterations) for r in profile.ranks),
        coverage=profile.coverage, measured_step_s=sum(steps) / len(steps),
        simulated_step_s=run_.step_time_s, measured_busy_s=busy, classes=tuple(rows), shapes=shapes,
        warnings=tuple(warnings))


def _class_order(name: str) -> tuple[int, str]:
    order = (*CLASSES, *TRACE_CLASSES)
    return (order.index(name) if name in order else len(order), name)


# --- the calibration file -------------------------------------------------------------------------


def _sig(x: float) -> float:
    return float(f"{x:.6g}")


def calibration_data(c: Comparison, scenario: str | None = None, written_by: str | None = None) -> dict:
    """The calibration file's mapping (``parts.calibration``): a factor with its evidence per
    calibrated class, the shapes, the notes."""
    classes = {}
    for row in c.compared:
        ratios = row.rank_ratios
        entry = {"factor": _sig(row.ratio), "measured_s": _sig(row.measured_s), "simulated_s": _sig(row.simulated_s),
                 "kernels": row.kernels, "ops": row.ops, "share": _sig(row.share)}
        if len(ratios) > 1:
            entry.update(factor_min=_sig(min(ratios)), factor_max=_sig(max(ratios)))
        classes[row.name] = entry
    out: dict = {"version": VERSION, "classes": classes}
    if "gemm" in classes and c.shapes:
        out["gemm_shapes"] = [{"m": s.shape[0], "n": s.shape[1], "k": s.shape[2], "factor": _sig(s.ratio),
                               "batch": s.shape[3], "measured_s": _sig(s.measured_s),
                               "simulated_s": _sig(s.simulated_s),
                               "kernels": s.kernels, "ops": s.ops, "stepsim_ops": ", ".join(s.stepsim_ops)}
                              for s in c.shapes]
    uncalibrated = {row.name: row.note for row in c.classes if row.status == "uncalibrated"}
    unmodelled = {row.name: row.note for row in c.classes if row.status == "unmodelled"}
    if uncalibrated:
        out["uncalibrated"] = uncalibrated
    if unmodelled:
        out["unmodelled"] = unmodelled
    out["scope"] = ("communication: " + COMMUNICATION_SCOPE if COMMUNICATION in classes else
                    "no communication factor: collectives stay modelled")
    out["profile"] = list(c.profile)
    if scenario:
        out["scenario"] = scenario
    out["ranks"] = list(c.ranks)
    if c.device:
        out["device"] = c.device
    out["iterations"] = c.iterations
    out["coverage"] = _sig(c.coverage)
    total = sum(row.measured_s for row in c.classes)
    out["covered"] = _sig(sum(row.measured_s for row in c.compared) / total) if total else 0.0
    if written_by:
        out["written_by"] = written_by
    read_calibration(out)  # what is written reads back
    return out


HEADER = """# stepsim calibration: efficiency factors measured from a profile (docs/calibrate.md).
# factor = stepsim's simulated time / the measured kernel time of the class, one iteration, over the
# profiled ranks; a scenario with `calibration: <this file>` prices each op of a class at its
# modelled time / factor (GEMMs of a listed shape at that shape's factor).
"""


def write_calibration(path: str | Path, data: dict) -> None:
    """The calibration file, atomically: a header saying what the numbers mean, then the mapping."""
    atomic_write_text(path, HEADER + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120))


def calibrate(profile_paths, scenario, out: str | Path | None = None, sets=(), progress=None,
              written_by: str | None = None) -> tuple[Comparison, dict]:
    """Read the profile, simulate the scenario without any calibration of its own (factors are
    measured against the model), compare, and write the calibration file to ``out``; the
    comparison and the file's mapping. ``written_by`` names the writer in the file."""
    if isinstance(profile_paths, (str, os.PathLike)):
        profile_paths = [profile_paths]
    paths = tuple(str(p) for p in profile_paths)
    phase = progress.phase if progress is not None else (lambda text: None)
    phase("loading the scenario")
    s = load_scenario(scenario, sets)
    phase("reading the profile")
    prof = read_profile(paths)
    phase("simulating the scenario")
    sim = run(replace(s, calibration=None), allow_oom=True, record_flows=False)
    c = compare(prof, sim, paths)
    data = calibration_data(c, str(scenario) if isinstance(scenario, (str, os.PathLike)) else s.name, written_by)
    if out is not None:
        write_calibration(out, data)
    return c, data


def profile_diff(run_: Run, profile_paths) -> Comparison:
    """``run_`` (as simulated, calibrated or not) next to a profile: ``stepsim run --profile-diff``."""
    if isinstance(profile_paths, (str, os.PathLike)):
        profile_paths = [profile_paths]
    paths = tuple(str(p) for p in profile_paths)
    return compare(read_profile(paths), run_, paths)


# --- tables ---------------------------------------------------------------------------------------


def _ms(x: float) -> str:
    return f"{x * 1e3:.3f}"


def format_comparison(c: Comparison, title: str = "profile vs stepsim", compared: str = "") -> str:
    """The per-class table: measured and simulated milliseconds of one iteration (summed over the
    profiled ranks), their ratio, the share of GPU-busy time, and what became of the class
    (``compared`` names the classes whose ratio is usable: ``calibrated`` for ``stepsim calibrate``)."""
    ranks = ", ".join(f"{r}" + (f" (as {c.representative[r]})" if c.representative[r] != r else "") for r in c.ranks)
    lines = [f"{title}: {c.scenario}; profiled rank(s) {ranks}, {c.iterations} steady iteration(s) each"
             + (f", {c.device}" if c.device else "") + f"; classified {c.coverage:.1%} of kernel time",
             f"  one iteration: measured {_ms(c.measured_step_s)} ms, stepsim step {_ms(c.simulated_step_s)} ms "
             "(wall, mean over the ranks)",
             f"{'class':<14} {'measured_ms':>12} {'stepsim_ms':>11} {'sim/meas':>9} {'share':>7} "
             f"{'kernels':>8} {'ops':>7}  {'status' if compared else 'note'}"]
    for row in c.classes:
        ratio = f"{row.ratio:.3f}" if row.ratio is not None else "-"
        spread = row.rank_ratios
        wide = len(spread) > 1 and max(spread) - min(spread) > 0.01 * min(spread)
        span = f" [{min(spread):.3g} to {max(spread):.3g} by rank]" if wide else ""
        lines.append((f"{row.name:<14} {_ms(row.measured_s):>12} {_ms(row.simulated_s):>11} {ratio:>9} "
                     f"{row.share:>7.1%} {row.kernels:>8} {row.ops:>7}  "
                     + (compared if row.status == "compared" else row.status) + span
                     + (f": {row.note}" if row.note and row.status != "compared" else "")).rstrip())
    comm = c.row(COMMUNICATION)
    if comm is not None and comm.status == "compared" and compared:
        lines.append(f"communication: {COMMUNICATION_SCOPE}")
    if c.shapes:
        lines.append(f"{len(c.shapes)} GEMM shape(s) in both: " + ", ".join(
            f"{s.shape[0]}x{s.shape[1]}x{s.shape[2]}" + (f"x{s.shape[3]}" if s.shape[3] > 1 else "") + f" {s.ratio:.2f}"
            for s in sorted(c.shapes, key=lambda s: -s.measured_s)[:6]) + (" ..." if len(c.shapes) > 6 else ""))
    lines.extend(f"warning: {w}" for w in c.warnings)
    return "\n".join(lines)


def diff_record(c: Comparison) -> dict:
    """The comparison as plain data (``run --json --profile-diff``'s ``profile_diff``; the plot's input)."""
    return {
        "scenario": c.scenario, "profile": list(c.profile), "ranks": list(c.ranks),
        "representative": {str(k): v for k, v in sorted(c.representative.items())}, "device": c.device,
        "iterations": c.iterations, "coverage": c.coverage, "measured_step_s": c.measured_step_s,
        "simulated_step_s": c.simulated_step_s, "measured_busy_s": c.measured_busy_s,
        "classes": [{"class": r.name, "measured_s": r.measured_s, "simulated_s": r.simulated_s, "ratio": r.ratio,
                     "share": r.share, "kernels": r.kernels, "ops": r.ops, "status": r.status, "note": r.note,
                     "per_rank": [{"rank": k, "measured_s": m, "simulated_s": s} for k, m, s in r.per_rank]}
                    for r in c.classes],
        "gemm_shapes": [{"shape": list(s.shape), "measured_s": s.measured_s, "simulated_s": s.simulated_s,
                         "ratio": s.ratio, "kernels": s.kernels, "ops": s.ops} for s in c.shapes],
        "warnings": list(c.warnings),
    }

