"""Fair-share flow network model inside simpy.

A *transfer* is a group of one or more member flows, each crossing its own route (a list of link
ids) and carrying the same number of bytes; all members progress at one common rate. A single
send is a transfer of one member; a ring step of a collective is a transfer whose members are the
ring's edges, since each ring step waits for its slowest edge (DESIGN-NOTES, "Collectives as
coupled flows").

Rates are max-min fair over links (progressive filling, Bertsekas and Gallager, *Data Networks*,
section 6.5), with each member flow counted on every link it crosses. They are recomputed whenever
a transfer starts or ends; in between every transfer drains at a constant rate, so the next event
is the earliest completion. Latency is paid once per transfer, after its last byte (cut-through).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import simpy


def max_min_rates(capacity: np.ndarray, entry_group: np.ndarray, entry_link: np.ndarray,
                  entry_mult: np.ndarray, num_groups: int) -> np.ndarray:
    """Max-min fair rate of each group's member flows by progressive filling.

    ``entry_*`` list the (group, link, multiplicity) incidences: group g puts ``mult`` member
    flows on ``link``. Every unfrozen group's rate rises together until a link fills; the groups
    crossing full links freeze at that level; repeat until all are frozen.
    """
    links, local = np.unique(entry_link, return_inverse=True)
    cap = capacity[links]
    residual = cap.astype(float)
    rate = np.zeros(num_groups)
    frozen = np.zeros(num_groups, dtype=bool)
    level = 0.0
    while True:
        active = ~frozen[entry_group]
        if not active.any():
            return rate
        denom = np.bincount(local[active], weights=entry_mult[active], minlength=len(links))
        used = denom > 0
        headroom = np.full(len(links), np.inf)
        headroom[used] = residual[used] / denom[used]
        step = headroom.min()
        level += step
        residual -= step * denom
        full = used & (headroom <= step * (1 + 1e-9) + 1e-300)
        newly = np.unique(entry_group[active & full[local]])
        rate[newly] = level
        frozen[newly] = True


@dataclass(eq=False)
class Transfer:
    """One coupled group of member flows in flight."""

    links: np.ndarray
    mult: np.ndarray
    size: float  # bytes per member
    latency: float
    done: simpy.Event
    label: object = None
    remaining: float = 0.0
    rate: float = 0.0
    start: float = 0.0
    members: int = 1


@dataclass
class LinkStats:
    """Accounting for reports: bytes each link was asked to carry."""

    bytes_carried: np.ndarray
    transfers: int = 0
    rate_updates: int = 0


class Network:
    """Links with capacities (bytes/s) shared max-min fairly by the transfers in flight."""

    def __init__(self, env: simpy.Environment, capacity: np.ndarray):
        self.env = env
        self.capacity = np.asarray(capacity, dtype=float)
        self.active: list[Transfer] = []
        self.stats = LinkStats(bytes_carried=np.zeros(len(self.capacity)))
        self._last = env.now
        self._version = 0
        self._flush_pending = False

    def transfer(self, routes: Sequence[np.ndarray], size: float, latency: float = 0.0,
                 label: object = None) -> simpy.Event:
        """Start a transfer of ``size`` bytes on each route; the event fires when all arrive."""
        if size <= 0 or not routes:
            return self.transfer_links(np.zeros(0, dtype=np.int64), np.zeros(0), size, latency, label)
        links, mult = np.unique(np.concatenate(routes), return_counts=True)
        return self.transfer_links(links, mult.astype(float), size, latency, label, len(routes))

    def transfer_links(self, links: np.ndarray, mult: np.ndarray, size: float, latency: float = 0.0,
                       label: object = None, members: int = 1) -> simpy.Event:
        """As :meth:`transfer`, with the routes given as distinct links and member counts on each."""
        done = self.env.event()
        if size <= 0 or len(links) == 0:
            self._after(latency, done)
            return done
        self.stats.bytes_carried[links] += mult * size
        self.stats.transfers += 1
        self._advance()
        self.active.append(Transfer(links=links, mult=mult, size=float(size), latency=latency, done=done,
                                    label=label, remaining=float(size), start=self.env.now, members=members))
        if not self._flush_pending:
            self._flush_pending = True
            ev = self.env.timeout(0)
            ev.callbacks.append(self._flush)
        return done

    def _after(self, delay: float, event: simpy.Event) -> None:
        if delay > 0:
            t = self.env.timeout(delay)
            t.callbacks.append(lambda _e: event.succeed())
        else:
            event.succeed()

    def _advance(self) -> None:
        elapsed = self.env.now - self._last
        if elapsed > 0:
            for t in self.active:
                t.remaining -= t.rate * elapsed
        self._last = self.env.now

    def _flush(self, _event) -> None:
        self._flush_pending = False
        self._reschedule()

    def _reschedule(self) -> None:
        self._version += 1
        if not self.active:
            return
        self._recompute()
        dt = min(t.remaining / t.rate for t in self.active)
        version = self._version
        ev = self.env.timeout(max(dt, 0.0))
        ev.callbacks.append(lambda _e: self._on_wake(version))

    def _recompute(self) -> None:
        groups = self.active
        entry_group = np.repeat(np.arange(len(groups)), [len(t.links) for t in groups])
        entry_link = np.concatenate([t.links for t in groups])
        entry_mult = np.concatenate([t.mult for t in groups])
        rates = max_min_rates(self.capacity, entry_group, entry_link, entry_mult, len(groups))
        for t, r in zip(groups, rates):
            t.rate = float(r)
        self.stats.rate_updates += 1

    def _on_wake(self, version: int) -> None:
        if version != self._version:
            return
        self._advance()
        still = []
        for t in self.active:
            if t.remaining <= 1e-9 * t.size:
                self._after(t.latency, t.done)
            else:
                still.append(t)
        self.active = still
        self._reschedule()
