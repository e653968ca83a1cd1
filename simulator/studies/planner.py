"""``stepsim plan``: find the fastest layout of a scenario's model on its cluster, ranked by simulation.

The scenario gives the model, cluster, global batch, sequence length and precision; its own
layout is the "given" one, always simulated and ranked among the others. Candidates
(``planner_space``) are pruned in order, each prune counted:

1. rules: ``scenario.validate_plan`` rejects the layout (counted per rule);
2. memory: ``memory.memory_report``'s peak (``memory.memory_peak``) exceeds ``max_memory_fraction`` of the GPU memory;
3. bound: ``bound.step_lower_bound`` (compute only, no communication, pipeline fill and drain,
   never above the simulated step) shows the layout cannot enter the first ``prove`` ranks nor, with
   ``pareto``, the Pareto front of step time against peak memory (memory in steps of
   ``PARETO_BIN_FRACTION`` of the GPU's: the front is the fastest layout of each step that beats
   every layout of the steps below). The bound is computed lazily: ``_Bounds.cheap``, a weaker
   bound shared by all layouts with the same layer costs, prunes most layouts without it.

The survivors are simulated in ascending order of their bound, so good layouts are found first
and the bound prunes the most. With n simulations in flight (the workers and ``QUEUED`` more in
the pool's queue), the decision on the k-th submission uses exactly the results of submissions
0 .. k - n (waiting for them if need be), never whichever happened to finish first, so a plan is
deterministic for a given worker count. Exactness: a layout is only pruned when its bound exceeds
the step time of ``prove`` simulated layouts (and, with ``pareto``, when a simulated layout at most as slow as its bound is in
the same memory step or a lower one), so the best, the first ``prove`` ranks and (with ``pareto``) the Pareto front are those of simulating every
valid layout that fits; ``tests/test_planner.py`` checks this against brute force.

``prove`` (default 1: the best) is how many ranks the plan proves; the table shows ``top``. Ranks
past ``prove`` are the fastest of the layouts simulated to the end, each marked ``rank_exact``
when no layout the plan pruned or stopped could be faster (``_least_unseen_step``), else shown as
">=rank". Proving the best alone is what the question "which layout should I run?" needs, and it
costs a fraction of proving five: on Llama 3 405B / 16,384 H100 the exact top 5 simulated 92
layouts against 52 for the best (README, "Benchmarks"). Without ``pareto`` the front is that of the
simulated layouts.

``tolerance`` t > 0 prunes a layout as soon as its bound x (1 + t) exceeds those step times
instead. A layout so pruned has step >= bound > (the ``prove``-th simulated step) / (1 + t), so the
step shown at each rank i <= ``prove`` is at most (1 + t) x the exact plan's i-th step (if one of
the exact top i was pruned, it is slower than shown-i / (1 + t)); and with ``pareto`` every layout
that fits has a front layout in its memory step or a lower one at most (1 + t) x its step. The
result says ``tolerance``; ``tests/test_planner.py`` checks both statements against brute force.

Both objectives rank alike: every layout uses all the GPUs (dp is derived), so tokens/s/GPU is
global batch x sequence / (step time x GPUs). ``--out`` keeps ``plan.jsonl``, one line per
simulation (appended, fsynced; a rerun skips what is logged, a line cut short is recomputed), and
``pareto.png``.
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import os
from bisect import insort
from collections.abc import Sequence
from pathlib import Path

import yaml

from simulator.scenario.config import Scenario
from simulator.common.errors import ConfigError, WorkerDied
from simulator.common.files import atomic_write_text, remove_stale
from simulator.reports.report import AXES
from simulator.scenario.load import scenario_from_dict, scenario_to_dict
from simulator.studies.planner_space import (Layout, candidate_scenario, enumerate_layouts, layout_of,
                                             label_legend, layout_order, merge_enumerations, parse_space)
from dataclasses import dataclass, replace
from simulator.common.units import GiB
from simulator.engine.engine import scenario_cluster
from simulator.layout.grid import Plan, framework_counts, vstage_layers
from simulator.layout.schedules import placement
from simulator.network.collectives import time_collective
from simulator.parts.gpus import gpu_of
from simulator.reports.plots import plot_pareto
from simulator.studies.bound import (LinkSeconds, blocking_tp_s, schedule_walk_bound, stage_fsdp_busy, step_compute,
                                     step_lower_bound)
from simulator.studies.sweep import (EXECUTORS, METRICS, Task, _Lock, base_of, evaluate, point_id, read_log, scenario_hash)
from simulator.common.progress import as_progress
from simulator.studies.workers import Lost, check_local_workers, local_limit, outcome, process_pool
from simulator.workload.frameworks import fsdp_gathered_once
from simulator.workload.memory import memory_peak, memory_report
from simulator.workload.workload import build_workload

OBJECTIVES = ("step_time", "tokens_per_s_per_gpu")
# ``--tolerance``: the bound prunes a layout unless it could beat a shown one by more than this
# fraction (``plan``'s docstring); 0 is exact.
DEFAULT_TOLERANCE = 0.0
MAX_TOLERANCE = 0.5
LOG = "plan.jsonl"
# Memory step of the Pareto front: layouts within 5% of the GPU's memory (4 GiB of an 80 GiB
# H100) count as using the same memory, so the front lists a slower layout only when it saves at
# least that much; finer steps would simulate many slow layouts to list savings of a few MiB.
PARETO_BIN_FRACTION = 0.05
PARETO_PLOT = "pareto.png"


@dataclass(frozen=True)
class Screened:
    """A valid layout after the memory pass: its peak memory, verdict and (if it fits) its bound
    (None until computed: the planner computes it only when ``cheap_s`` cannot settle the layout)."""

    layout: Layout
    peak_gib: float
    fits: bool
    bound_s: float | None
    cheap_s: float | None = None


def _enumerate_part(args: tuple):
    """``planner_space.enumerate_layouts`` of one part of the space, run in the worker pool."""
    s, values, part = args
    return enumerate_layouts(s, values, part)


def _screen(args: tuple) -> list[tuple[float, bool]]:
    """(peak GiB, fits) of each layout: the memory pass, run in the worker pool."""
    s, layouts, fraction = args
    out = []
    for layout in layouts:
        peak, capacity = memory_peak(candidate_scenario(s, layout))
        out.append((peak, peak <= fraction * capacity))
    return out


# The cheap bound is a sum of the same costs in another order than ``step_lower_bound``'s: this
# margin keeps it below that bound whatever the float rounding.
CHEAP_MARGIN = 1e-6
# Simulations queued in the pool beyond one per worker. The planner takes results in submission
# order (so that it decides alike on every run), and without a queue a worker whose simulation
# stopped early sat idle until the oldest one ended; a queued submission is decided knowing fewer
# results (a looser cutoff), so more is not better. Measured on Llama 3 405B / 16K and 70B / 64,
# ``--top 1 --pareto simulated``, two workers, two runs each (2026-11-27, wall s): 0 queued 93-95 and
# 15-16; 1: 83-86 and 15-17; 2: 72-78 and 15-17; 3: 79-80 and 17-18; 5: 76 and 23 (70B simulates 8
# layouts instead of 4). Every run found the same best.
QUEUED = 2


class _Bounds:
    """Lower bounds of one scenario's layouts: ``exact`` is ``bound.step_lower_bound``; ``cheap``
    a weaker one shared by many layouts, so most layouts never need the exact one.

    cheap = m x (sum over all layers of F + B per micro-batch, with the blocking TP collectives,
    plus the embedding's and LM head's) / pp. With one model copy (every schedule but DualPipe)
    each virtual stage is held by one rank, so the pp ranks' works ``W_s`` of ``step_lower_bound``
    add up to at least that sum x m (under ZeRO-3 each F and B is an ``fsdp_chain``, never below its
    plain sum), and the bound is at least the largest ``W_s``, hence at least their mean. Layer,
    embedding and head costs and the blocking TP seconds depend only on tp, cp, sequence
    parallelism, ep, etp, micro-batch size and recompute (``workload.build_workload`` and
    ``bound.blocking_tp_s`` read nothing else of the layout), so they are computed once per such
    key. With ZeRO-3 it is also at least the seconds stage 0's DP x CP group's busiest link carries
    that stage's FSDP traffic (``_fsdp_floor``), one of the terms the exact bound takes the largest
    of, and which decides most ZeRO-3 layouts' exact bound on a large cluster (Llama 3 405B on
    16,384 GPUs: 1,068 of the 1,248 whose exact bound the plan computed). ``tests/test_planner.py``
    checks cheap <= exact on every fitting layout of its spaces."""

    def __init__(self, s: Scenario):
        self.s = s
        self.gpu = gpu_of(s.cluster, s.training.precision)
        self.collective_time = node_collective_time(s)
        self.group_time = cluster_collective_time(s)
        self._per_key: dict[tuple, tuple] = {}
        self._groups: dict[tuple, tuple] = {}  # stage 0's ZeRO shard group by (tp, pp, dp, cp, ep, etp, dp_replicate)
        self._busy: dict[tuple, float] = {}
        self._gathered_once: bool | None = None  # ZeRO-3 layers kept gathered under a pipeline

    def _workload(self, layout: Layout):
        """(the layout's scenario, its workload on this scenario's GPU)."""
        cs = candidate_scenario(self.s, layout)
        return cs, build_workload(cs, self.gpu)

    def exact(self, layout: Layout) -> float:
        cs, w = self._workload(layout)
        return step_lower_bound(cs, w, self.collective_time, self.group_time, self.gpu.num_sms)

    def refined(self, layout: Layout, exact: float) -> float:
        """``exact`` (the layout's exact bound) or ``bound.schedule_walk_bound``, whichever is larger:
        a walk of every step of every stage, computed only for the layouts the plan would simulate."""
        cs, w = self._workload(layout)
        blocking = blocking_tp_s(cs, w, self.collective_time)
        fwd, bwd = step_compute(cs, w, blocking, self.collective_time, self.group_time, self.gpu.num_sms)
        return max(exact, schedule_walk_bound(cs, w, fwd, bwd, self.group_time))

    def cheap(self, layout: Layout) -> float | None:
        """The cheap bound, or None when it does not apply (DualPipe's two model copies)."""
        if placement(layout.schedule, layout.pp, layout.vp).copies != 1:
            return None
        key = (layout.tp, layout.cp, layout.sequence_parallel, layout.ep, layout.etp, layout.micro_batch_size,
               layout.recompute)
        if key not in self._per_key:
            cs, w = self._workload(layout)
            blocking = blocking_tp_s(cs, w, self.collective_time)
            moe_layer = cs.model.is_moe_layer
            total = sum(w.layer_costs[x].fwd_time_s + w.layer_costs[x].bwd_time_s + sum(blocking[moe_layer(x)])
                        for x in range(cs.model.num_hidden_layers))
            total += w.embedding[0].time_s + w.embedding[1].time_s + w.head[0].time_s + w.head[1].time_s
            self._per_key[key] = (total, w.layer_dense_params)
        total, dense_params = self._per_key[key]
        m = self.s.training.global_batch_size // (layout.micro_batch_size * layout.dp)
        floor = self._fsdp_floor(layout, m, dense_params) if layout.zero_stage == 3 else 0.0
        return max(m * total / layout.pp, floor) * (1 - CHEAP_MARGIN)

    def _fsdp_floor(self, layout: Layout, m: int, dense_params: dict[int, float]) -> float:
        """ZeRO-3: the seconds pipeline stage 0's DP x CP group's busiest link carries the stage's FSDP
        traffic alone (``bound.stage_fsdp_busy``), which ``bound.fsdp_link_bound`` and so the exact
        bound are at least; 0 when the layers stay gathered across micro-batches
        (``fsdp_gathered_once``). The group and each layer's parameters per GPU (tp, ep and etp
        only) come from caches, the sum over links is memoised by group, layers and micro-batches."""
        if layout.pp > 1 and self._gathered_once is None:
            self._gathered_once = fsdp_gathered_once(candidate_scenario(self.s, layout))
        if layout.pp > 1 and self._gathered_once:
            return 0.0
        gkey = (layout.tp, layout.pp, layout.dp, layout.cp, layout.ep, layout.etp, layout.dp_replicate)
        if gkey not in self._groups:
            cs = candidate_scenario(self.s, layout)
            par = cs.parallelism
            plan = Plan.build(par.tp, par.pp, cs.dp, par.cp, par.ep, par.expert_tp, par.dp_replicate)
            self._groups[gkey] = plan.dp_cp_group(int(plan.grid[0, 0, 0, 0]))
        group = self._groups[gkey]
        if len(group) < 2:
            return 0.0
        place = placement(layout.schedule, layout.pp, layout.vp)
        first, last = layout.first_pipeline_num_layers, layout.last_pipeline_num_layers
        vstages = vstage_layers(self.s.model.num_hidden_layers, layout.pp, layout.vp, first, last,
                                framework_counts(self.s.model, self.s.framework, layout.pp, layout.vp, first, last))
        params = tuple(dense_params[x] for c in range(place.chunks) for x in vstages[place.vstage(0, c)])
        bkey = (group, params, m)
        if bkey not in self._busy:
            self._busy[bkey] = stage_fsdp_busy(group, list(params), m, self.group_time) or 0.0
        return self._busy[bkey]


def node_collective_time(s: Scenario):
    """(op, n, bytes) -> seconds of a collective over the first n GPUs of one idle node of ``s``'s
    cluster (its link overrides applied), memoised: what ``bound.blocking_tp_s`` needs; ``n`` may
    instead be a tuple of the node's local ranks (a strided group, ``bound.cp_exchange_s``)."""
    node = scenario_cluster(replace(s, cluster=replace(s.cluster, num_nodes=1)))
    cache: dict = {}

    def collective_time(op: str, n: int | tuple[int, ...], size: float) -> float:
        key = (op, n, size)
        if key not in cache:
            cache[key] = time_collective(node, op, range(n) if isinstance(n, int) else n, size)[0]
        return cache[key]

    return collective_time


def cluster_collective_time(s: Scenario):
    """(op, ranks, bytes) -> (seconds of a collective over those global ranks alone on ``s``'s idle
    cluster, seconds each link is busy with its bytes as ``bound.LinkSeconds``), memoised, the
    cluster built on first use: what ``bound.fsdp_stage_compute`` and ``bound.fsdp_link_busy`` need."""
    cache: dict = {}
    cluster = []

    def group_time(op: str, ranks: tuple, size: float) -> float:
        key = (op, ranks, size)
        if key not in cache:
            if not cluster:
                cluster.append(scenario_cluster(s))
            seconds, net = time_collective(cluster[0], op, ranks, size)
            cache[key] = (seconds, LinkSeconds.of(net.stats.bytes_carried / net.capacity))
        return cache[key]

    return group_time


class _Runner:
    """Simulations in flight, by submission index: inline (1 worker), a process pool or Ray."""

    def __init__(self, executor: str, workers: int, address: str | None):
        self.executor, self.workers = executor, workers
        self.pool = self.ray = None
        self.local = 1  # processes of the local pool (the memory screen and the enumeration), 1 inline
        self.pending: dict[int, object] = {}
        self.ready: dict[int, dict] = {}
        self._ray_started = False
        self.address = address
        if executor == "ray":
            try:
                import ray  # noqa: F401  (only that it is installed: Ray starts in ``connect``)
            except ImportError:
                raise ConfigError("--executor", "ray", "Ray is not installed: pip install 'stepsim[ray]'") from None
        if workers > 1:
            # workers die with the planner, even on kill -9; with Ray the local pool only screens
            self.local = workers if executor != "ray" else min(workers, local_limit())
            self.pool = process_pool(self.local)

    def connect(self) -> None:
        """Start or join Ray (``--executor ray``), once the space is known to hold a valid layout:
        an impossible ``--space`` is a one-line error without a Ray start first."""
        if self.executor != "ray" or self.ray is not None:
            return
        import ray

        if not ray.is_initialized():
            try:
                if self.address:
                    ray.init(address=self.address, log_to_driver=False, logging_level="warning")
                else:
                    ray.init(num_cpus=self.workers, include_dashboard=False, log_to_driver=False,
                             logging_level="warning")
            except ConnectionError as err:
                raise ConfigError("--address", self.address, f"cannot join the Ray cluster ({err})") from None
            self._ray_started = True
        self.ray = ray
        self.remote = ray.remote(num_cpus=1)(evaluate)

    @property
    def parallel(self) -> bool:
        """Whether a submission runs beside this process (a pool or Ray) rather than inline."""
        return self.pool is not None or self.ray is not None

    def map_local(self, fn, items: list, what: str) -> list:
        """``fn`` of each item in the local pool; a dead worker is a ``WorkerDied`` naming ``what``
        (nothing is logged before these passes, so a rerun starts them over)."""
        if self.pool is None or len(items) < 2:
            return [fn(x) for x in items]
        out = self.pool.map(fn, items)
        for i, x in enumerate(out):
            if isinstance(x, Lost):
                raise WorkerDied(f"plan: {what} (part {i + 1} of {len(items)})", x.cause, "no layout was simulated yet; "
                                 "a rerun starts over")
        return out

    def submit(self, index: int, task: Task) -> None:
        if self.ray is not None:
            self.pending[index] = self.remote.remote(task)
        elif self.pool is not None:
            self.pending[index] = self.pool.submit(evaluate, task)
        else:
            self.ready[index] = evaluate(task)

    def result(self, index: int) -> dict | Lost:
        """Submission ``index``'s row, or a ``Lost`` if its worker process died."""
        if index in self.ready:
            return self.ready.pop(index)
        handle = self.pending.pop(index)
        return self.ray.get(handle) if self.ray is not None else outcome(handle)

    def drain(self) -> list[tuple[int, dict]]:
        """The rows of every submission still out, waiting for each (those whose worker died are left out)."""
        rows = []
        for index in sorted(self.pending):
            row = self.result(index)
            if not isinstance(row, Lost):
                rows.append((index, row))
        return rows

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close(cancel=True)
        if self._ray_started:
            self.ray.shutdown()


def parse_tolerance(value) -> float:
    """``--tolerance`` as a fraction: a number (0.01) or a percentage ("1%"); a one-line error
    otherwise."""
    text = str(value).strip()
    try:
        number = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        number = math.nan
    if isinstance(value, bool) or not 0 <= number <= MAX_TOLERANCE:
        raise ConfigError("--tolerance", value, f"must be a fraction from 0 to {MAX_TOLERANCE} or a percentage "
                                                f"from 0% to {MAX_TOLERANCE:.0%} (0 is exact), e.g. 0.01 or 1%")
    return number


def memory_bin(peak_gib: float, capacity_gib: float) -> int:
    """The Pareto front's memory step: ``PARETO_BIN_FRACTION`` of the GPU's memory."""
    return int(peak_gib // (PARETO_BIN_FRACTION * capacity_gib))


class _Front:
    """Simulated layouts known so far: sorted step times, and the fastest step per memory bin.
    ``tolerance`` t prunes a layout whose bound is within a factor 1 + t of what would prune it
    exactly (``plan``'s docstring says what that guarantees)."""

    def __init__(self, capacity_gib: float, tolerance: float = 0.0):
        self.capacity = capacity_gib
        self.slack = 1.0 + tolerance
        self.steps: list[float] = []
        self.fastest: dict[int, float] = {}

    def add(self, step: float, mem: float) -> None:
        insort(self.steps, step)
        b = memory_bin(mem, self.capacity)
        self.fastest[b] = min(step, self.fastest.get(b, step))

    def fastest_up_to(self, mem: float) -> float:
        """The least step simulated at this peak memory's bin or a lower one (inf if none)."""
        b = memory_bin(mem, self.capacity)
        return min((st for k, st in self.fastest.items() if k <= b), default=math.inf)

    def cutoff(self, mems: Sequence[float], top: int, pareto: bool) -> float | None:
        """The step above which a layout of any of these peak memories is pruned now (``prunes``
        holds for every bound above it), or None while none would be: what a simulation can stop
        at (``SimOptions.stop_above_s``). The front only grows, so it prunes later too."""
        if len(self.steps) < top:
            return None
        reach = self.steps[top - 1]
        if pareto:
            reach = max(reach, *(self.fastest_up_to(mem) for mem in mems))
        return None if math.isinf(reach) else reach / self.slack

    def prunes(self, bound: float, mem: float, top: int, pareto: bool) -> bool:
        reach = bound * self.slack  # exactly ``bound`` at tolerance 0
        if len(self.steps) < top or reach <= self.steps[top - 1]:
            return False
        return not pareto or self.fastest_up_to(mem) <= reach


def _no_fit(s, valid: list, by_layout: dict, max_memory_fraction: float) -> None:
    """Raise the one-line error of a plan in which no valid layout fits: the smallest-memory
    layout and by how much it exceeds the allowed memory."""
    smallest = min(valid, key=lambda x: (by_layout[x][0], layout_order(x)))
    peak, capacity = by_layout[smallest][0], _capacity_gib(s)
    raise ConfigError("memory", f"no layout fits in {max_memory_fraction * capacity:.1f} GiB",
                      f"the smallest, {smallest.label()}, needs {peak:.1f} GiB per GPU, "
                      f"{peak - max_memory_fraction * capacity:.1f} GiB too many")


def _check_arguments(objective: str, executor: str, top: int, prove: int, max_memory_fraction: float,
                     tolerance: float | str | None) -> float:
    """The plan's flags, each a one-line ConfigError when out of range; the tolerance as a fraction."""
    if objective not in OBJECTIVES:
        raise ConfigError("--objective", objective, f"valid: {', '.join(OBJECTIVES)}")
    if executor not in EXECUTORS:
        raise ConfigError("--executor", executor, f"valid: {', '.join(EXECUTORS)}")
    if not isinstance(top, int) or isinstance(top, bool) or top < 1:
        raise ConfigError("--top", top, "must be a whole number >= 1")
    if not isinstance(prove, int) or isinstance(prove, bool) or not 1 <= prove <= top:
        raise ConfigError("--prove", prove, f"must be a whole number from 1 to --top ({top})")
    if not 0 < max_memory_fraction <= 1:
        raise ConfigError("--max-memory-fraction", max_memory_fraction, "must be a number in (0, 1]")
    return parse_tolerance(DEFAULT_TOLERANCE if tolerance is None else tolerance)


def _enumerate(s: Scenario, values, runner: _Runner, parts: int):
    """The layouts of the space with the structural rules applied, in ``parts`` interleaved parts;
    a one-line error when none is valid."""
    enum = merge_enumerations(runner.map_local(_enumerate_part, [(s, values, (i, parts)) for i in range(parts)],
                                               "enumerating the layouts"))
    if not enum.valid:
        reason, count = enum.pruned_rules.most_common(1)[0] if enum.pruned_rules else ("the space is empty", 0)
        raise ConfigError("--space", f"{enum.enumerated} layouts", f"none is valid; most common rule: {reason} "
                          f"({count} layouts)")
    return enum


def _memory_screen(s: Scenario, valid: list, runner: _Runner, parts: int,
                   max_memory_fraction: float) -> dict[Layout, tuple[float, bool]]:
    """(peak GiB, fits) of every valid layout; a one-line error naming the smallest when none fits."""
    chunks = [valid[i::parts] for i in range(parts)]
    screened_chunks = runner.map_local(_screen, [(s, c, max_memory_fraction) for c in chunks], "the memory screen")
    by_layout = {}
    for chunk, results in zip(chunks, screened_chunks):
        for layout, (peak, fits) in zip(chunk, results):
            by_layout[layout] = (peak, fits)
    if not any(fits for _, fits in by_layout.values()):
        _no_fit(s, valid, by_layout, max_memory_fraction)
    return by_layout


def _open_log(folder: Path, bar) -> tuple[_Lock, dict[str, dict], object]:
    """The plan's folder locked, the rows its log already holds (a damaged line dropped and the log
    rewritten without it), and the log open for appending."""
    folder.mkdir(parents=True, exist_ok=True)
    lock = _Lock(folder, notes=bar)
    remove_stale(folder)
    done, damaged = read_log(folder / LOG)
    if damaged:
        atomic_write_text(folder / LOG, "".join(json.dumps(r, sort_keys=True) + "\n" for r in done.values()))
    return lock, done, open(folder / LOG, "a")


class _Search:
    """The simulations of one plan, in ascending bound order (module docstring): what was submitted,
    what came back, what the bounds pruned. Submission 0 is the given layout as written; it ranks
    with the candidates when it is one of them (the same scenario), and is otherwise only scored."""

    def __init__(self, s: Scenario, task: Task, runner: _Runner, bar, done: dict[str, dict], log, folder,
                 given: Layout, front: _Front, prove: int, pareto: bool):
        self.s, self.task, self.runner, self.bar = s, task, runner, bar
        self.done, self.log, self.folder = done, log, folder
        self.given, self.front, self.prove, self.pareto = given, front, prove, pareto
        self.base = scenario_hash(task.raw)
        self.given_id = point_id(self.base, {"given": True})
        self.order: list[Layout] = []
        self.results: list[dict] = []
        self.pruned_bound: list[Screened] = []
        self.exact_of: dict[Layout, float] = {}
        self.submitted: dict[Layout, int] = {}  # candidate -> its submission index
        self.twin_of: dict[int, int] = {}  # submission -> the earlier one whose simulation it shares
        self.given_early = False
        self.given_is_candidate = False

    def start_given(self) -> None:
        """With workers, the given layout goes out once something fits, so one simulates it while
        this process bounds: it is simulated whatever the bounds say."""
        self.given_early = self.runner.parallel and self.given_id not in self.done
        if self.given_early:
            self.runner.submit(0, replace(self.task, overrides=()))

    def task_id(self, index: int) -> str:
        return self.given_id if index == 0 else point_id(self.base, self.order[index].key())

    def keep(self, i: int, metrics: dict) -> dict:
        row = {"point_id": self.task_id(i), "layout": self.order[i].key(), **metrics}
        self.done[row["point_id"]] = row
        if self.log is not None:
            self.log.write(json.dumps(row, sort_keys=True) + "\n")
            self.log.flush()
            os.fsync(self.log.fileno())
        return row

    def died(self, i: int, lost: Lost) -> WorkerDied:
        """Log what the simulations still out give, then the error naming layout ``i``."""
        saved = [self.keep(index, metrics) for index, metrics in self.runner.drain()]
        what = "plan: the given layout" if i == 0 else f"plan: layout {self.order[i].label()}"
        if self.log is None:
            after = "without --out nothing is kept: rerun with --out DIR to make the plan resumable"
        else:
            after = (f"{len(self.done)} simulations are logged in {self.folder / LOG} ({len(saved)} of them finished "
                     "after it); rerun the same command to resume: it reuses them and simulates the rest")
        return WorkerDied(what, lost.cause, after)

    def collect(self, upto: int) -> None:
        """The results of submissions up to ``upto`` (exclusive), in submission order."""
        while len(self.results) < upto:
            i = len(self.results)
            tid = self.task_id(i)
            twin = i in self.twin_of
            if tid in self.done:
                row = self.done[tid]
            else:
                metrics = (_twin_row(self.results[self.twin_of[i]], self.s, self.order[i]) if twin
                           else self.runner.result(i))
                if isinstance(metrics, Lost):
                    raise self.died(i, metrics)
                row = self.keep(i, metrics)
            self.results.append(row)
            if (i > 0 or self.given_is_candidate) and row.get("step_time_s") is not None:
                self.front.add(row["step_time_s"], self.peak_of[self.order[i]])
            if not twin:
                best = f"best {self.front.steps[0]:.4g} s" if self.front.steps else "none ranked yet"
                self.bar.advance(f"{'given ' if i == 0 else ''}{self.order[i].label()}: {_outcome(row)}; {best}, "
                                 f"{len(self.pruned_bound):,} pruned by bound")

    def submit(self, layout: Layout) -> None:
        self.order.append(layout)
        i = len(self.order) - 1
        cutoff = None
        if i > 0 or self.given_is_candidate:
            twin = _zero_twin(layout)
            if twin in self.submitted:
                self.twin_of[i] = self.submitted[twin]
                return
            self.submitted[layout] = i
            if i > 0:
                # the simulation may stop once its step provably cannot enter the result, for
                # this layout nor its ZeRO twin (which shares it, with its own memory)
                mems = [self.peak_of[layout]]
                if twin in self.by_layout and self.by_layout[twin][1]:
                    mems.append(self.by_layout[twin][0])
                cutoff = self.front.cutoff(mems, self.prove, self.pareto)
        tid = self.task_id(i)
        if tid in self.done and self.done[tid].get("stopped_above_s") not in (None, cutoff):
            del self.done[tid]  # logged by a plan that stopped it elsewhere: run it again
        if tid not in self.done and not (i == 0 and self.given_early):
            self.runner.submit(i, replace(self.task, overrides=() if i == 0 else layout.overrides(),
                                          stop_above_s=cutoff))

    def run(self, valid: list[Layout], by_layout: dict[Layout, tuple[float, bool]], bounds: _Bounds,
            in_flight: int) -> None:
        """Bound every layout that fits, then simulate in ascending exact-bound order until the
        bounds prune the rest."""
        self.by_layout = by_layout
        self.screened = []
        for x in valid:
            peak, fits = by_layout[x]
            cheap = bounds.cheap(x) if fits else None
            exact = bounds.exact(x) if fits and cheap is None else None
            self.screened.append(Screened(x, peak, fits, exact, exact if cheap is None else cheap))
        fitting = self.fitting = [c for c in self.screened if c.fits]
        given = self.given
        self.given_is_candidate = given in fit_of_layouts(fitting) and candidate_scenario(self.s, given) == self.s
        self.peak_of = {c.layout: c.peak_gib for c in fitting}
        front, prove, pareto = self.front, self.prove, self.pareto
        self.submit(given)
        # The candidates in ascending (exact bound, layout) order, exact bounds computed lazily: a
        # heap holds those computed; the rest wait in ascending cheap-bound order and join the heap
        # while their cheap bound is at most the heap's least exact bound (so the heap's top is the
        # least of all), unless the cheap bound already prunes them. Pruning is monotone in the
        # bound and in the simulated results (which only grow), so a layout the cheap bound prunes
        # now, its exact bound would prune at its turn: the submissions are those of visiting
        # every layout in exact-bound order.
        waiting = sorted((c for c in fitting if not (self.given_is_candidate and c.layout == given)),
                         key=lambda c: (c.cheap_s, layout_order(c.layout)))
        heap: list = []
        nxt = 0
        refined: set[Layout] = set()  # layouts whose bound includes ``bound.schedule_walk_bound``
        pushes = itertools.count()  # heap entries' last key (value and layout order already differ)
        while True:
            self.collect(decision_point(len(self.order), len(self.results), self.twin_of, in_flight))
            while nxt < len(waiting) and (not heap or waiting[nxt].cheap_s <= heap[0][0]):
                cand = waiting[nxt]
                nxt += 1
                if cand.bound_s is None and front.prunes(cand.cheap_s, cand.peak_gib, prove, pareto):
                    self.pruned_bound.append(cand)
                    continue
                exact = cand.bound_s if cand.bound_s is not None else bounds.exact(cand.layout)
                self.exact_of[cand.layout] = exact
                heapq.heappush(heap, (exact, layout_order(cand.layout), next(pushes), cand))
            if not heap:
                break
            exact, _, _, cand = heapq.heappop(heap)
            if front.prunes(exact, cand.peak_gib, prove, pareto):
                self.pruned_bound.append(replace(cand, bound_s=exact))
                continue
            if cand.layout not in refined:
                # About to be simulated: the walk of its schedule and data-parallel stream, too
                # costly for every layout, may lift it past others (back into the heap) or prune it.
                refined.add(cand.layout)
                full = bounds.refined(cand.layout, exact)
                if full > exact:
                    self.exact_of[cand.layout] = full
                    heapq.heappush(heap, (full, layout_order(cand.layout), next(pushes), cand))
                    continue
            self.submit(cand.layout)
        self.collect(len(self.order))


def plan(scenario: str | Path | Scenario | dict, *, sets: Sequence[str] = (), space: Sequence[str] = (),
         top: int = 5, prove: int = 1, objective: str = "step_time", max_memory_fraction: float = 1.0,
         pareto: bool = False,
         tolerance: float | str | None = None, out: str | Path | None = None, workers: int | None = None, executor: str = "process",
         address: str | None = None, progress=None) -> dict:
    """Plan a scenario (module docstring); returns the result in the ``--json`` shape. ``progress``
    (a stream, a ``progress.Progress`` or None) hears each stage and each simulation. A simulation
    whose worker process died ends the plan with a ``WorkerDied`` naming its layout, once the
    simulations still out have finished (and, with ``out``, been logged for the rerun)."""
    tolerance = _check_arguments(objective, executor, top, prove, max_memory_fraction, tolerance)
    workers = check_local_workers(workers, executor, address)
    raw, base_dir, name = base_of(scenario, sets)
    s = scenario_from_dict(raw, base_dir=base_dir, default_name=name)
    bar = as_progress(progress, "plan")

    values = parse_space(space, s)
    runner = _Runner(executor, workers, address)
    folder = Path(out) if out is not None else None
    lock = log = None
    try:
        # the structural shapes, then the memory screen, in 4 interleaved parts per local process
        parts = 4 * runner.local if runner.pool is not None else 1
        # the layouts, the rules and the memory screen may still end in a one-line error: until they
        # are through, progress shows on a terminal only, so that such an error stands alone in a log
        bar.status("enumerating the layouts")
        enum = _enumerate(s, values, runner, parts)
        runner.connect()
        bar.status(f"{enum.enumerated:,} layouts, {len(enum.valid):,} valid: the memory screen")
        done: dict[str, dict] = {}
        if folder is not None:
            lock, done, log = _open_log(folder, bar)
        by_layout = _memory_screen(s, enum.valid, runner, parts, max_memory_fraction)
        bar.phase(f"{enum.enumerated:,} layouts, {len(enum.valid):,} valid, "
                  f"{sum(fits for _, fits in by_layout.values()):,} fit: lower bounds and simulations")
        search = _Search(s, Task(raw, base_dir, name, ()), runner, bar, done, log, folder, layout_of(s),
                         _Front(_capacity_gib(s), tolerance), prove, pareto)
        search.start_given()
        bounds = _Bounds(s)
        search.run(enum.valid, by_layout, bounds, workers + (QUEUED if workers > 1 else 0))
    finally:
        runner.close()
        if log is not None:
            log.close()
        if lock is not None:
            lock.release()

    result = _result(s, enum, search.screened, search.fitting, search.pruned_bound, search.order, search.results,
                     search.given_is_candidate, top, objective, max_memory_fraction, pareto, bounds, search.exact_of)
    result["prove"] = prove
    result["tolerance"] = tolerance
    # of the simulated layouts, those whose ZeRO-1/2 twin's simulation was reused (``_zero_twin``)
    result["candidates"]["shared_with_zero_twin"] = len(search.twin_of)
    if folder is not None and result["pareto"]:
        plot_pareto(result, str(folder / PARETO_PLOT))
    return result


def _outcome(row: dict) -> str:
    """A simulation's row in a few words, for the progress line."""
    if row.get("error"):
        return "invalid"
    if row.get("step_time_s") is None:
        return f"stopped above {row['stopped_above_s']:.4g} s"
    return f"{row['step_time_s']:.4g} s" + ("" if row.get("fits", True) else " (does not fit)")


def decision_point(submitted: int, collected: int, twins, in_flight: int) -> int:
    """How many submissions' results the next decision waits for: all but the last ``in_flight - 1``
    simulations still out, so ``in_flight`` are out while the planner decides and submits (the
    workers and ``QUEUED`` more with a pool, one without). A submission
    that shares its ZeRO twin's simulation (index in ``twins``) runs nothing and does not count.
    The answer depends on the submission order alone, not on which results happen to be in (or
    logged by an interrupted run), so the plan decides alike on every run."""
    upto, out = submitted, 0
    while upto > collected:
        if upto - 1 not in twins:
            if out == in_flight - 1:
                break
            out += 1
        upto -= 1
    return upto


def _zero_twin(layout: Layout) -> Layout | None:
    """The layout that simulates exactly like ``layout``: ZeRO-1 and ZeRO-2 run the same program
    (``program.build_program`` reduce-scatters the gradients and all-gathers the parameters for
    either; ``workload.build_workload`` shards the optimizer step for any stage >= 1; nothing else
    on the simulation path reads the stage), so only their memory differs."""
    if layout.zero_stage not in (1, 2):
        return None
    return replace(layout, zero_stage=3 - layout.zero_stage)


def _twin_row(twin: dict, s: Scenario, layout: Layout) -> dict:
    """``sweep.evaluate``'s row for ``layout`` from its ZeRO twin's: the simulated metrics shared,
    the memory its own."""
    row = {k: twin.get(k) for k in METRICS}
    for k in ("stopped_above_s", "step_at_least_s"):
        if k in twin:
            row[k] = twin[k]
    if row.get("error") is None:
        mem = memory_report(candidate_scenario(s, layout))
        row["peak_memory_gib"], row["fits"] = mem["peak_gib"], mem["fits"]
    return row


def fit_of_layouts(fitting: list[Screened]) -> set[Layout]:
    return {c.layout for c in fitting}


def _capacity_gib(s: Scenario) -> float:
    return gpu_of(s.cluster, s.training.precision).hbm_capacity_bytes / GiB


# --- the result --------------------------------------------------------------------------------

def _entry(s: Scenario, layout: Layout, row: dict, bound: float | None) -> dict:
    d = scenario_to_dict(candidate_scenario(s, layout))
    exposed = {a: row.get(f"exposed_{a}_s") or 0.0 for a in AXES}
    largest = max(AXES, key=lambda a: exposed[a]) if any(exposed.values()) else None
    return {
        "layout": layout.label(),
        "parallelism": d["parallelism"],
        "schedule": layout.schedule,
        "training": d["training"],
        "step_time_s": row["step_time_s"],
        "tokens_per_s_per_gpu": row["tokens_per_s_per_gpu"],
        "memory_gib_per_gpu": row["peak_memory_gib"],
        "fits": row["fits"],
        "mfu": row["mfu"],
        "bubble_fraction": row["bubble_fraction"],
        "compute_s": row["compute_s"],
        "idle_s": row["idle_s"],
        "exposed_comm_s": exposed,
        "largest_exposed_comm": largest,
        "lower_bound_s": bound,
    }


def _result(s, enum, screened, fitting, pruned_bound, order, results, given_is_candidate, top, objective,
            fraction, pareto, bounds: _Bounds, exact_of: dict) -> dict:
    fits = {c.layout for c in fitting}
    given, given_row = order[0], results[0]
    if given in fits and given not in exact_of:
        exact_of[given] = bounds.exact(given)
    if given_row.get("error"):
        raise ConfigError("scenario", s.name, f"the given layout cannot run: {given_row['error']}")
    scored = [(layout, row) for i, (layout, row) in enumerate(zip(order, results))
              if (i > 0 or given_is_candidate) and row.get("step_time_s") is not None and row["fits"]]
    # equal steps (ZeRO-1 and -2 twins, ``_zero_twin``): the one with less memory first, so it is the
    # best and the front never holds a layout another matches in time with less memory
    scored.sort(key=lambda lr: (lr[1]["step_time_s"], lr[1]["peak_memory_gib"], layout_order(lr[0])))
    stopped = [row for row in results if row.get("step_at_least_s") is not None]
    unseen = _least_unseen_step(pruned_bound, stopped, bounds)
    ranked = []
    for i, (layout, row) in enumerate(scored):
        entry = {**_entry(s, layout, row, exact_of[layout]), "rank": i + 1}
        entry["rank_exact"] = entry["step_time_s"] <= unseen
        ranked.append(entry)
    g = _entry(s, given, given_row, exact_of.get(given))
    g["rank"] = 1 + sum(e["step_time_s"] < g["step_time_s"] for e in ranked)
    g["rank_exact"] = g["step_time_s"] <= unseen
    g["in_space"] = given_is_candidate
    g["gap"] = g["step_time_s"] / ranked[0]["step_time_s"] - 1
    front, low = [], math.inf
    capacity = _capacity_gib(s)
    for e in ranked:
        b = memory_bin(e["memory_gib_per_gpu"], capacity)
        if b < low:
            front.append(e)
            low = b
    best = dict(ranked[0])
    best["why"] = why(ranked[0], ranked[1] if len(ranked) > 1 else None, _capacity_gib(s) * fraction)
    rules = dict(sorted(enum.pruned_rules.items(), key=lambda kv: (-kv[1], kv[0])))
    return {
        "scenario": s.name,
        "objective": objective,
        "candidates": {
            "enumerated": enum.enumerated,
            "pruned_rules": sum(enum.pruned_rules.values()),
            "pruned_memory": len(screened) - len(fitting),
            "pruned_bound": len(pruned_bound),
            "simulated": len(order) - (0 if given_is_candidate else 1),
            # of the simulated, those stopped once their step provably could not enter the result
            "stopped_early": len(stopped),
            "pruned_rules_by_reason": rules,
            # per reason, the first layout it pruned with its whole message (the reasons' numbers are N)
            "pruned_rules_examples": {reason: enum.example(reason) for reason in rules},
        },
        "best": best,
        "given": g,
        "ranked": ranked,
        "pareto": [{"layout": e["layout"], "step_time_s": e["step_time_s"], "memory_gib_per_gpu": e["memory_gib_per_gpu"],
                    "rank": e["rank"]} for e in front],
        "pareto_exact": pareto,
        "top": top,
    }


def _least_unseen_step(pruned_bound: list[Screened], stopped: list[dict], bounds: _Bounds) -> float:
    """The least step a layout that was not simulated to the end could have: the least exact bound
    of the bound-pruned layouts and the least ``step_at_least_s`` of the stopped simulations (inf
    if there are none). A simulated step at most this is at its exact rank (``rank_exact``); above
    it, a layout the plan did not finish might be faster, and the rank is a lower bound. Exact
    bounds are computed in ascending cheap-bound order, only while the cheap bound is below the
    least found so far (cheap <= exact, ``_Bounds``)."""
    def known(c: Screened) -> float:  # at most the layout's exact bound
        return c.cheap_s if c.bound_s is None else c.bound_s

    least = min((row["step_at_least_s"] for row in stopped), default=math.inf)
    for c in sorted(pruned_bound, key=lambda c: (known(c), layout_order(c.layout))):
        if known(c) >= least:
            break
        least = min(least, c.bound_s if c.bound_s is not None else bounds.exact(c.layout))
    return least


def why(best: dict, runner_up: dict | None, capacity_gib: float) -> str:
    """One line: what binds the best layout, and what the runner-up loses against it."""
    step = best["step_time_s"]
    terms = {"bubble": best["idle_s"], **{f"exposed {a.upper()}": t for a, t in best["exposed_comm_s"].items()}}
    name, worst = max(terms.items(), key=lambda kv: kv[1])
    share = best["compute_s"] / step
    if share >= 0.9:
        binds = f"compute ({share:.0%} of the step is kernels; largest loss {name} {worst / step:.1%})"
    else:
        binds = f"{name} ({worst / step:.1%} of the step; kernels {share:.0%})"
    mem = best["memory_gib_per_gpu"]
    if mem >= 0.9 * capacity_gib:
        binds += f"; memory is tight ({mem:.1f} of {capacity_gib:.1f} GiB)"
    line = f"bound by {binds}"
    if runner_up is not None:
        diffs = {"compute": runner_up["compute_s"] - best["compute_s"], "bubble": runner_up["idle_s"] - best["idle_s"],
                 **{f"exposed {a.upper()}": runner_up["exposed_comm_s"][a] - best["exposed_comm_s"][a]
                    for a in best["exposed_comm_s"]}}
        what, loss = max(diffs.items(), key=lambda kv: kv[1])
        gap = runner_up["step_time_s"] / step - 1
        if gap == 0:
            more = runner_up["memory_gib_per_gpu"] - mem
            line += f"; runner-up {runner_up['layout']} takes the same step with {more:.1f} GiB more per GPU"
        else:
            line += f"; runner-up {runner_up['layout']} is {gap:.2%} slower, mostly {what} (+{loss:.3g} s)"
    return line


def format_plan(result: dict) -> str:
    """The text report: counts, top-N table, the given layout's rank, the Pareto front, the why."""
    c = result["candidates"]
    lines = [f"{result['scenario']}: {c['enumerated']:,} layouts enumerated, {c['pruned_rules']:,} pruned by rule, "
             f"{c['pruned_memory']:,} by memory, {c['pruned_bound']:,} by bound, {c['simulated']:,} simulated"
             + (f" ({c['stopped_early']:,} stopped once they could not enter the result)" if c.get("stopped_early")
                else "")]
    examples = c.get("pruned_rules_examples", {})
    for reason, n in list(c["pruned_rules_by_reason"].items())[:6]:
        lines.append(f"  {n:>8,}  " + (f"e.g. {examples[reason]}" if examples.get(reason) else reason))
    tol = result.get("tolerance", 0.0)
    if tol:
        lines.append(f"tolerance {tol:.2%}: the step shown at each rank is at most {tol:.2%} above the exact plan's "
                     f"(--tolerance 0 for exact)")
    head = f"{'rank':>4}  {'layout':<46} {'step_s':>9} {'tok/s/GPU':>10} {'MFU':>6} {'mem_GiB':>8} {'bubble':>7}  largest exposed"
    lines += ["", head]

    def row(e, rank):
        ax = e["largest_exposed_comm"]
        exposed = f"{ax} {e['exposed_comm_s'][ax]:.3f} s" if ax else "-"
        return (f"{rank:>4}  {e['layout']:<46} {e['step_time_s']:>9.4f} {e['tokens_per_s_per_gpu']:>10.1f} "
                f"{e['mfu']:>6.1%} {e['memory_gib_per_gpu']:>8.1f} {e['bubble_fraction']:>7.1%}  {exposed}")

    shown = result["ranked"][:result["top"]]
    for e in shown:
        lines.append(row(e, e["rank"] if e["rank_exact"] else f">={e['rank']}"))
    unproven = [e["rank"] for e in shown if not e["rank_exact"]]
    if unproven:
        lines.append(f"ranks {unproven[0]}-{unproven[-1]} (>=): the fastest of the layouts simulated to the end; "
                     f"one the plan pruned or stopped might sit between them (--prove {shown[-1]['rank']} "
                     f"ranks them exactly)" if len(unproven) > 1 else
                     f"rank {unproven[0]} (>=): the fastest other layout simulated to the end; one the plan "
                     f"pruned or stopped might be faster (--prove {unproven[0]} ranks it exactly)")
    g = result["given"]
    rank = f"{g['rank']}" if g["rank_exact"] else f">={g['rank']}"
    fits = "" if g["fits"] else "  (does NOT fit)"
    lines += ["", "given:", row(g, rank) + fits,
              f"given layout ranks {rank}, {g['gap']:+.2%} against the best" if g["gap"] is not None else ""]
    tol = result.get("tolerance", 0.0)
    if result["pareto_exact"]:
        kind = "exact" if not tol else (f"within {tol:.2%}: every layout that fits has one here in its memory "
                                        f"step or below at most {tol:.2%} slower")
    else:
        kind = "of the simulated"
    lines += ["", f"Pareto front, step time vs peak memory ({kind}):"]
    for p in result["pareto"]:
        lines.append(f"  {p['step_time_s']:>9.4f} s  {p['memory_gib_per_gpu']:>6.1f} GiB  #{p['rank']} {p['layout']}")
    lines += ["", f"best: {result['best']['layout']}: {result['best']['why']}"]
    labels = [e["layout"] for e in shown] + [g["layout"]] + [p["layout"] for p in result["pareto"]]
    legend = label_legend(labels)
    if legend:
        lines += ["", "layout names: " + "; ".join(legend)
                  + ("; >=N: rank N at best (see above)" if unproven or not g["rank_exact"] else "")]
    return "\n".join(lines)


def emit_scenario(result: dict, s_or_raw, path: str | Path, sets: Sequence[str] = ()) -> None:
    """Write the best layout as a scenario file ``stepsim run`` accepts."""
    raw, base_dir, name = base_of(s_or_raw, sets)
    s = scenario_from_dict(raw, base_dir=base_dir, default_name=name)
    best = result["best"]
    d = scenario_to_dict(s)
    d["name"] = f"{s.name}-planned"
    d["parallelism"] = best["parallelism"]
    d["training"] = best["training"]
    d["schedule"] = best["schedule"]
    text = (f"# Written by stepsim plan: the best of {result['candidates']['simulated']} simulated layouts of "
            f"{s.name}, {best['step_time_s']:.4f} s per step.\n" + yaml.safe_dump(d, sort_keys=False))
    atomic_write_text(path, text)
