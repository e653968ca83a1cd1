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

Determinism: a draw is a function of (seed, key) only, hashed with BLAKE2b (Python's ``hash``
is salted per process), so the order in which the engine asks for draws, or which ranks a
folded run simulates, changes nothing. Keys are tuples of ints and strings, for example
(rank, microbatch, chunk, layer, label, kind).
"""

from __future__ import annotations

import hashlib
import math
from statistics import NormalDist

from simulator.config import Scenario

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
