"""How compute time varies: straggling ranks and per-kernel jitter, as pure functions.

Stragglers (``faults.stragglers``): rank r runs on GPU r and node N holds GPUs
``N * gpus_per_node`` to ``(N + 1) * gpus_per_node - 1`` (``plan.py``: nodes hold consecutive
ranks), so a node entry slows all of them. A rank named by several entries takes the largest
slowdown (a node entry and a rank entry do not compound).

Jitter (``faults.compute_jitter_cv``): each kernel's time has coefficient of variation c.
Assuming the k kernels of a block are independent and of equal length, a block of total time T
takes T + sigma Z with sigma = c T / sqrt(k) and Z standard normal, clamped at 0 (a negative
draw takes no time; so the mean sits slightly above T once sigma is a sizeable part of T).
A group of n ranks that synchronises after the block proceeds at the slowest of n independent
such draws. The maximum is drawn exactly from one uniform u: P(max Z_i <= z) = Phi(z)^n, so
max Z_i = Phi^{-1}(u^(1/n)) (the inverse-CDF method on the n-th order statistic), computed as
-Phi^{-1}(1 - u^(1/n)) with ``expm1`` so large n keeps its precision.

GPU speed spread (``faults.gpu_speed_cv``): each GPU keeps one speed for the whole step, its
compute times multiplied by 1 + c Z (Z standard normal, drawn once per GPU; ``gpu_speed_factor``),
as identical GPUs under one power cap run at different clocks (Sinha et al., SC'22). Stragglers
and the spread compound.

Determinism: a draw is a function of (seed, key) only, hashed with BLAKE2b (Python's ``hash``
is salted per process), so the order in which the engine asks for draws, or which ranks a
folded run simulates, changes nothing. Keys are tuples of ints and strings, for example
(rank, microbatch, chunk, layer, label, kind).
"""

from __future__ import annotations

import functools
import hashlib
import math
from statistics import NormalDist

import numpy as np

from simulator.common import limits
from simulator.layout.lanes import lanes
from simulator.scenario.config import Scenario

_NORMAL = NormalDist()


def rank_slowdowns(s: Scenario) -> dict[int, float]:
    """Compute-time multiplier of every straggling rank (ranks not listed run at 1.0), rank order."""
    g = s.cluster.gpus_per_node
    out: dict[int, float] = {}
    for x in s.faults.stragglers:
        ranks = [x.rank] if x.rank is not None else range(x.node * g, (x.node + 1) * g)
        for r in ranks:
            out[r] = max(out.get(r, 1.0), x.compute_slowdown)
    return {r: f for r, f in sorted(out.items()) if f > 1.0}


def gpu_speed_factor(cv: float, z: float) -> float:
    """The compute-time multiplier of a GPU ``z`` standard deviations slower than the median one,
    for a persistent speed spread of coefficient of variation ``cv`` (Sinha et al., SC'22, arXiv
    2208.11035: identical GPUs of one cluster differ by 8% on average, max to min, because power
    management runs each chip at its own clock under the same power cap). Floored at half the time:
    no GPU is twice as fast as its SKU's median."""
    return max(0.5, 1.0 + cv * z)


def uniform(seed: int, key: tuple) -> float:
    """A uniform draw in (0, 1) that depends only on ``seed`` and ``key`` (53 bits of BLAKE2b)."""
    digest = hashlib.blake2b(repr((seed, key)).encode(), digest_size=8).digest()
    return ((int.from_bytes(digest, "big") >> 11) + 0.5) / 2**53


def max_normal(u: float, n: int = 1) -> float:
    """The largest of ``n`` independent standard normals, from one uniform ``u``: Phi^{-1}(u^(1/n))."""
    tail = -math.expm1(math.log(u) / n)  # 1 - u^(1/n), exact for u near 1
    return -_NORMAL.inv_cdf(tail)


class Jitter:
    """Per-kernel time noise of coefficient of variation ``cv``, drawn from ``seed``."""

    def __init__(self, cv: float, seed: int = 0):
        if not cv >= 0:
            raise ValueError(f"cv must be >= 0, got {cv!r}")
        self.cv = float(cv)
        self.seed = int(seed)

    @classmethod
    def of(cls, s: Scenario) -> "Jitter":
        return cls(s.faults.compute_jitter_cv, s.faults.seed)

    @property
    def enabled(self) -> bool:
        return self.cv > 0

    def block_time(self, T: float, kernels: int, key: tuple, group_size: int = 1) -> float:
        """Time of a block of ``kernels`` kernels lasting ``T`` on average, for the slowest of
        ``group_size`` ranks that wait for each other after it (module docstring)."""
        if not self.enabled or T <= 0 or kernels < 1:
            return T
        sigma = self.cv * T / math.sqrt(kernels)
        return max(0.0, T + sigma * max_normal(uniform(self.seed, key), max(1, group_size)))


def max_normal_moments(n: int) -> tuple[float, float]:
    """Mean and variance of the largest of ``n`` independent standard normals, by quadrature of
    its density n phi(z) Phi(z)^(n-1) (n = 1: 0 and 1; n = 8: about 1.42 and 0.37)."""
    return _moments(max(1, int(n)))


@functools.lru_cache(maxsize=256)
def _moments(n: int) -> tuple[float, float]:
    z = np.linspace(-10.0, 10.0, 8001)
    cdf = np.array([_NORMAL.cdf(x) for x in z]) if n > 1 else None
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    density = pdf if cdf is None else n * pdf * cdf ** (n - 1)
    mean = float(np.trapezoid(z * density, z))
    return mean, float(np.trapezoid((z - mean) ** 2 * density, z))


def straggler_lanes(s: Scenario, plan) -> list[tuple[int, ...]] | None:
    """With stragglers and no random variation, the lanes (``layout.lanes``) a folded run simulates
    one rank of, the initial colour of a rank being its slowdown: exact, at the cost of the lanes
    the stragglers split off. ``None`` (fold by stage) without stragglers, or with jitter or a GPU
    speed spread, whose every rank draws its own times (there the folded run takes order
    statistics), or when the lanes would cost more than an unfolded run may (then each stage runs
    at its slowest rank's speed, an upper bound the report names)."""
    slow = rank_slowdowns(s)
    if not slow or s.faults.compute_jitter_cv > 0 or s.faults.gpu_speed_cv > 0:
        return None
    factors = sorted(set(slow.values()))
    colour = np.zeros(plan.world, dtype=np.int64)
    for rank, factor in slow.items():
        colour[rank] = 1 + factors.index(factor)
    found = lanes(plan, colour)
    # Past the budget of an unfolded run (``limits``: ranks one by one, micro-batch x layer passes),
    # thousands of distinct stragglers would make the exact run take hours: keep the upper bound.
    per_stage = len(found) / plan.pp
    work = s.num_microbatches * s.model.num_hidden_layers * per_stage
    if len(found) > limits.UNFOLDED_RANKS.maximum or work > limits.STEP_WORK.maximum:
        return None
    return found


class StepVariability:
    """Stragglers and jitter as one engine sees them, folded or not.

    Unfolded, every rank draws its own block times (group size 1) and the simulation takes the
    maxima where ranks wait for each other. Folded, one rank stands for its stage, so it must run
    as the slowest of the ranks it stands for:

    - stragglers: the representative runs at the largest slowdown of its stage's ranks (it is the
      straggler's own replica, which sets the pace at every collective it joins);
    - jitter, within a replica: the ``replica`` ranks that synchronise at every layer (TP x CP, x EP
      in an MoE model, the whole stage with ZeRO-3's per-layer gathers) proceed after each block
      at the maximum of ``replica`` draws, drawn exactly (``max_normal``);
    - jitter, across replicas: the stage's R = ranks / replica replicas drift apart independently
      and meet only at the data-parallel collectives. By then replica i has drifted D_i, a sum of
      per-block deviations with variance V (the variance of each block's maximum, summed); the
      slowest is the largest of R such drifts. The representative's own drift is one of them, so
      a data-parallel collective starts ``max(0, sqrt(V) z - D_rep)`` later, with z the largest of
      R - 1 standard normals, drawn once per stage (the slowest replica stays the slowest).
    """

    def __init__(self, s: Scenario, plan, fold: bool):
        self.fold = fold
        self.jitter = Jitter.of(s)
        slow = rank_slowdowns(s)
        self.slow = slow  # by rank; folded, by stage: its slowest rank's factor
        if fold:
            self.slow = {}
            for rank, factor in slow.items():
                stage = plan.stage_of(rank)
                self.slow[stage] = max(factor, self.slow.get(stage, 1.0))
        cv, seed = s.faults.gpu_speed_cv, s.faults.seed
        if cv > 0:
            # A persistent spread: each GPU keeps its speed. Unfolded, every rank draws its own;
            # folded, the stage's representative runs at the slowest of the stage's ranks, drawn
            # exactly as the largest of that many normals. Every rank of a replica waits for its
            # slowest member at each layer, and the slowest replica holds the others at the
            # data-parallel collectives for the whole step, so that GPU sets the stage's pace: an
            # upper bound when pipeline stages share the step (the slowest GPUs of two stages need
            # not be in one replica), exact with one stage.
            if fold:
                n = plan.world // plan.pp
                for stage in range(plan.pp):
                    z = max_normal(uniform(seed, ("gpu-speed", stage)), n)
                    self.slow[stage] = self.slow.get(stage, 1.0) * gpu_speed_factor(cv, z)
            else:
                for rank in range(plan.world):
                    z = max_normal(uniform(seed, ("gpu-speed", rank)), 1)
                    self.slow[rank] = self.slow.get(rank, 1.0) * gpu_speed_factor(cv, z)
        par = s.parallelism
        stage_ranks = plan.world // plan.pp
        replica = stage_ranks if par.zero_stage == 3 else par.tp * par.cp * (par.ep if s.model.is_moe else 1)
        self.replica = min(stage_ranks, replica) if fold else 1
        self.replicas = stage_ranks // self.replica if fold else 1
        self.drift: dict[int, list[float]] = {}  # rank -> [deviation so far, its variance]
        self.stage_of = plan.stage_of

    @property
    def active(self) -> bool:
        return bool(self.slow) or self.jitter.enabled  # rank_slowdowns lists only factors > 1

    def block_time(self, rank: int, op, index: int) -> float:
        """Time of compute op ``op`` (the ``index``-th of the rank's program) on ``rank``."""
        t = op.block.time_s * self.slow.get(self.stage_of(rank) if self.fold else rank, 1.0)
        if not self.jitter.enabled:
            return t
        key = (self.stage_of(rank) if self.fold else rank, index)  # folded: the stage's draws, whoever stands for it
        drawn = self.jitter.block_time(t, op.block.kernels, key, self.replica)
        if self.fold and self.replicas > 1:
            sigma = self.jitter.cv * t / math.sqrt(max(1, op.block.kernels))
            mean, var = max_normal_moments(self.replica)
            d = self.drift.setdefault(rank, [0.0, 0.0])
            d[0] += drawn - (t + sigma * mean)
            d[1] += sigma * sigma * var
        return drawn

    def drift_of(self, rank: int) -> tuple[float, float] | None:
        d = self.drift.get(rank)
        return None if d is None else (d[0], d[1])

    def inherit(self, rank: int, drift: tuple[float, float] | None) -> None:
        """``rank`` waited for a pipeline hand-off: from here on it runs behind the sender's work,
        so its drift is the sender's (the variance of a path's length accumulates along the path
        the hand-offs make critical, across stages)."""
        if drift is not None:
            self.drift[rank] = [drift[0], drift[1]]

    def replica_lag(self, rank: int) -> float:
        """How much later than ``rank`` the slowest replica of its stage reaches a data-parallel
        collective (0 unfolded, without jitter, or with one replica)."""
        d = self.drift.get(rank)
        if d is None or self.replicas < 2:
            return 0.0
        z = max_normal(uniform(self.jitter.seed, ("replicas", self.stage_of(rank))), self.replicas - 1)
        return max(0.0, math.sqrt(d[1]) * z - d[0])
