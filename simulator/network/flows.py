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

A start or an end only changes the rates of the transfers that share a link with it, directly or
through others: the transfers in flight are kept in connected components (transfers linked by
shared links), and only the touched component is recomputed. Each transfer has its own completion
event, scheduled from its current rate; a rate change reschedules it and a per-transfer version
counter makes the stale event a no-op.

Links are simulated in classes: links with the same capacity that every transfer template seen
so far (:meth:`Network.template`) either crosses with the same multiplicity or avoids. Within a
class every link carries the same flows, so one of them stands for all: the max-min levels, the
components and each link's bytes are exactly those of the links one by one (a folded stage's
collective over 1,008 groups crosses 16K NVLink links but a handful of classes). A template that
cuts a class splits it; the transfers and templates holding the old class take the new one too.
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
class FlowRecord:
    """One transfer as it ran (kept with ``Network(record=True)``): ``rates[i]`` bytes/s per
    member from ``times[i]`` to the next time or ``end``; the last byte left at ``end`` and
    arrived ``latency`` later."""

    label: object
    start: float
    links: np.ndarray
    mult: np.ndarray
    size: float
    members: int
    latency: float
    times: list = field(default_factory=list)
    rates: list = field(default_factory=list)
    end: float = float("nan")


class Template:
    """The links of a transfer: ``links`` and ``mult`` (physical link ids, member flows on each),
    and the same as link classes, ``clist`` and ``mlist`` (Python lists, for the per-class
    bookkeeping; kept up to date as classes split, which only appends to them) and as arrays,
    ``cls`` and ``cmult``, built from the lists when next asked for after a split: a cluster whose
    groups all route differently splits classes thousands of times, and rebuilding every crossing
    template's arrays at each split cost more than the simulation (1,792 GB200 racks, CP groups
    across racks)."""

    __slots__ = ("links", "mult", "clist", "mlist", "alone", "_cls", "_cmult")

    def __init__(self, links: np.ndarray, mult: np.ndarray, cls: np.ndarray, cmult: np.ndarray, clist: list,
                 mlist: list, alone: float | None = None):
        self.links, self.mult = links, mult
        self._cls, self._cmult = cls, cmult
        self.clist, self.mlist = clist, mlist
        self.alone = alone  # bytes/s per member with the links to itself (memo, cleared on a split)

    @property
    def cls(self) -> np.ndarray:
        if self._cls is None:
            self._cls = np.array(self.clist, dtype=np.int64)
        return self._cls

    @property
    def cmult(self) -> np.ndarray:
        if self._cmult is None:
            self._cmult = np.array(self.mlist, dtype=float)
        return self._cmult

    def extend(self, cls: list, mults: list) -> None:
        """New classes split off classes it crosses, with its multiplicities on them."""
        self.clist.extend(cls)
        self.mlist.extend(mults)
        self._cls = self._cmult = None
        self.alone = None


@dataclass(eq=False, slots=True)
class Transfer:
    """One coupled group of member flows in flight; ``links`` and ``mult`` are its link classes."""

    tpl: Template
    size: float  # bytes per member
    latency: float
    done: simpy.Event
    label: object = None
    remaining: float = 0.0  # bytes per member left at time ``since``
    rate: float = 0.0
    since: float = 0.0
    start: float = 0.0
    members: int = 1
    version: int = 0
    component: "Component | None" = None
    record: FlowRecord | None = None
    provisional: bool = False  # its rate was set alone at its start; a flush at that instant replaces it

    @property
    def links(self) -> np.ndarray:
        return self.tpl.cls

    @property
    def mult(self) -> np.ndarray:
        return self.tpl.cmult


@dataclass(eq=False, slots=True)
class Component:
    """Transfers connected through shared links; rates are recomputed per component."""

    id: int
    transfers: dict = field(default_factory=dict)  # Transfer -> None, in insertion order
    dirty: bool = False
    split: bool = False  # a transfer left it: re-partition it at the next flush (``_flush``)


class LinkStats:
    """Accounting for reports: bytes each link was asked to carry (``bytes_carried``, per link)."""

    def __init__(self, net: "Network"):
        self._net = net
        self.transfers = 0
        self.rate_updates = 0

    @property
    def bytes_carried(self) -> np.ndarray:
        return np.asarray(self._net._bytes, dtype=float)[self._net._cls]


_CLASSES: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}


def _capacity_classes(capacity: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct capacities, the class of each link): ``np.unique`` of a cluster's capacities,
    kept per capacity array (a cluster passes the same array to every network built on it, and a
    planner's bounds build hundreds; on 16K GPUs the unique took 10 ms each). The entry holds the
    array, so its id is not reused; an array changed in place after use would be misread, and no
    caller does that (``Cluster.with_bandwidth_scaled`` makes a new one). Each network gets its
    own copies, which it refines as transfers arrive."""
    hit = _CLASSES.get(id(capacity))
    if hit is None or hit[0] is not capacity:
        cap, cls = np.unique(capacity, return_inverse=True)
        if len(_CLASSES) > 64:  # a long-lived process (a sweep worker) keeps only recent clusters
            _CLASSES.clear()
        hit = _CLASSES[id(capacity)] = (capacity, cap, cls.reshape(-1).astype(np.int64))
    return hit[1].copy(), hit[2].copy()  # copies: a network splits its classes in place (``_split``)


class Network:
    """Links with capacities (bytes/s) shared max-min fairly by the transfers in flight."""

    def __init__(self, env: simpy.Environment, capacity: np.ndarray, record: bool = False, classes: bool = True):
        self.env = env
        self.record = record
        self.flows: list[FlowRecord] = []
        self.capacity = np.asarray(capacity, dtype=float)
        self.stats = LinkStats(self)
        # link classes (module docstring): at first one per capacity value
        # (``classes=False``: every link its own class, the reference the tests compare against)
        if classes:
            self._cap, self._cls = _capacity_classes(self.capacity)
        else:
            self._cap, self._cls = self.capacity.copy(), np.arange(len(self.capacity), dtype=np.int64)
        self._size = np.bincount(self._cls, minlength=len(self._cap))  # links per class
        # per class, as Python lists: a transfer updates a few entries of each, which plain lists do
        # faster than numpy's scalar indexing (the same floats: the same products and sums)
        self._bytes = [0.0] * len(self._cap)  # bytes each link of the class carried
        # per class, the templates crossing it with their multiplicity on it
        self._holders: list[list[tuple[Template, float]]] = [[] for _ in self._cap]
        self._templates: dict = {}
        self._owner = [-1] * len(self._cap)  # component id per class
        self._users = [0] * len(self._cap)  # transfers in flight per class
        self._components: dict[int, Component] = {}
        self._next_id = 0
        self._dirty: list[Component] = []
        self._flush_pending = False

    @property
    def active(self) -> list[Transfer]:
        return [t for comp in self._components.values() for t in comp.transfers]

    def _new_component(self) -> Component:
        comp = Component(self._next_id)
        self._components[comp.id] = comp
        self._next_id += 1
        return comp

    def _assign(self, t: Transfer, comp: Component) -> None:
        comp.transfers[t] = None
        t.component = comp
        owner, cid = self._owner, comp.id
        for c in t.tpl.clist:
            owner[c] = cid

    def template(self, links: np.ndarray, mult: np.ndarray) -> Template:
        """The registered template of distinct ``links`` with ``mult`` member flows on each."""
        links = np.asarray(links, dtype=np.int64)
        mult = np.asarray(mult, dtype=float)
        key = (links.tobytes(), mult.tobytes())
        tpl = self._templates.get(key)
        if tpl is None:
            self._refine(links, mult)
            cls, first = np.unique(self._cls[links], return_index=True)
            tpl = Template(links, mult, cls, mult[first], cls.tolist(), mult[first].tolist())
            for c, m in zip(tpl.clist, tpl.mlist):
                self._holders[c].append((tpl, m))
            self._templates[key] = tpl
        return tpl

    def _refine(self, links: np.ndarray, mult: np.ndarray) -> None:
        """Split the classes ``links`` cuts (partly covered, or with different multiplicities) so
        that each class is inside the template with one multiplicity, or outside it."""
        if len(links) == 0:
            return
        _, m = np.unique(mult, return_inverse=True)
        m = m.reshape(-1)
        key = self._cls[links] * (int(m.max()) + 1) + m
        parts, inverse, counts = np.unique(key, return_inverse=True, return_counts=True)
        inverse = inverse.reshape(-1)
        parent = parts // (int(m.max()) + 1)
        covered = np.bincount(parent, weights=counts, minlength=len(self._cap))[parent]
        first = np.ones(len(parts), dtype=bool)
        first[1:] = parent[1:] != parent[:-1]
        # each part gets a new class, but a class fully covered keeps its id for its first part
        new = ~(first & (covered == self._size[parent]))
        if not new.any():
            return
        n0 = len(self._cap)
        ids = np.full(len(parts), -1, dtype=np.int64)
        ids[new] = n0 + np.arange(int(new.sum()))
        moved = ids[inverse] >= 0
        self._cls[links[moved]] = ids[inverse][moved]
        src = parent[new]
        self._cap = np.concatenate([self._cap, self._cap[src]])
        for p in src.tolist():
            self._bytes.append(self._bytes[p])
            self._owner.append(self._owner[p])
            self._users.append(self._users[p])
        self._size = np.concatenate([self._size, counts[new]])
        np.subtract.at(self._size, src, counts[new])
        pending: dict[int, tuple[Template, list, list]] = {}
        for p, c in zip(src.tolist(), ids[new].tolist()):
            holders = self._holders[p]
            self._holders.append(list(holders))
            for tpl, m in holders:
                entry = pending.get(id(tpl))
                if entry is None:
                    entry = pending[id(tpl)] = (tpl, [], [])
                entry[1].append(c)
                entry[2].append(m)
        for tpl, cls, mults in pending.values():
            tpl.extend(cls, mults)

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
        if size <= 0 or len(links) == 0:
            done = self.env.event()
            self._after(latency, done)
            return done
        return self.transfer_template(self.template(links, mult), size, latency, label, members)

    def transfer_template(self, tpl: Template, size: float, latency: float = 0.0, label: object = None,
                          members: int = 1, done: simpy.Event | None = None) -> simpy.Event:
        """As :meth:`transfer_links`, over a registered :class:`Template`; ``done``: the event to fire
        (a new one by default)."""
        if done is None:
            done = self.env.event()
        if size <= 0 or len(tpl.links) == 0:
            self._after(latency, done)
            return done
        clist = tpl.clist
        nbytes, owner = self._bytes, self._owner
        for c, m in zip(clist, tpl.mlist):
            nbytes[c] += m * size
        taken = [o for o in (owner[c] for c in clist) if o >= 0]
        self.stats.transfers += 1
        now = self.env.now
        t = Transfer(tpl=tpl, size=float(size), latency=latency, done=done, label=label,
                     remaining=float(size), since=now, start=now, members=members)
        if self.record:
            t.record = FlowRecord(label, now, tpl.links, tpl.mult, float(size), members, latency)
            self.flows.append(t.record)
        if not taken:
            comps = []
        elif taken.count(taken[0]) == len(taken):  # the common case: the links of one component, or free
            comps = [self._components[taken[0]]]
        else:
            comps = sorted((self._components[i] for i in set(taken)), key=lambda c: (-len(c.transfers), c.id))
        if comps:
            comp = comps[0]
            for other in comps[1:]:
                for u in other.transfers:
                    self._assign(u, comp)
                other.transfers.clear()
                other.dirty = False
                comp.split = comp.split or other.split
                del self._components[other.id]
        else:
            comp = self._new_component()
        users = self._users
        for c in clist:
            users[c] += 1
        self._assign(t, comp)
        if comps:
            self._mark(comp)
        else:  # alone on free links: its rate now, as the flush would set it at this same instant
            self.stats.rate_updates += 1
            self._set_rate(t, self._alone(t.tpl), now)
            t.provisional = True
        return done

    def _mark(self, comp: Component) -> None:
        if not comp.dirty:
            comp.dirty = True
            self._dirty.append(comp)
        if not self._flush_pending:
            self._flush_pending = True
            ev = self.env.timeout(0)
            ev.callbacks.append(self._flush)

    def _after(self, delay: float, event: simpy.Event) -> None:
        """Trigger ``event`` ``delay`` seconds from now, through a timeout: until then it is not
        ``triggered``, which callers that hold SMs while a transfer runs read."""
        if delay > 0:
            t = self.env.timeout(delay)
            t.callbacks.append(lambda _e: event.succeed())
        else:
            event.succeed()

    def _arrive(self, t: Transfer) -> None:
        """The last byte of ``t`` left: its event fires ``latency`` later, scheduled as itself (as a
        ``Timeout`` is) rather than through a timeout that then triggers it: one event per transfer
        instead of two. Nothing reads ``triggered`` of an event whose transfer is in flight."""
        if t.latency > 0:
            t.done._ok, t.done._value = True, None
            self.env.schedule(t.done, simpy.events.NORMAL, t.latency)
        else:
            t.done.succeed()

    def _flush(self, _event) -> None:
        """Recompute the rates of every component marked since the last flush, first splitting those
        that transfers left (``_finish``): once per component and instant, however many of its
        transfers ended then (a collective phase of thousands of transfers ends at one instant, and
        a split per ending transfer cost the square of their number). The parts are the connected
        components of the transfers that remain, whatever the order they left in."""
        self._flush_pending = False
        dirty, self._dirty = self._dirty, []
        for comp in dirty:
            if comp.dirty:
                comp.dirty = False
                if comp.split:
                    comp.split = False
                    for part in self._split(comp):
                        part.dirty = False
                        self._recompute(part)
                else:
                    self._recompute(comp)

    def _recompute(self, comp: Component) -> None:
        groups = list(comp.transfers)
        if not groups:
            return
        now = self.env.now
        if len(groups) == 1:
            rates = [self._alone(groups[0].tpl)]
        else:
            entry_group = np.repeat(np.arange(len(groups)), [len(t.links) for t in groups])
            entry_link = np.concatenate([t.links for t in groups])
            entry_mult = np.concatenate([t.mult for t in groups])
            rates = max_min_rates(self._cap, entry_group, entry_link, entry_mult, len(groups)).tolist()
        self.stats.rate_updates += 1
        for t, r in zip(groups, rates):
            if t.provisional:
                t.provisional = False
                if now == t.since:
                    # flushed at the instant it started alone: this rate is its first, as if it
                    # had waited for the flush like any other transfer (same records and count)
                    self.stats.rate_updates -= 1
                    if r == t.rate:
                        continue
                    if t.record is not None:
                        t.record.times.pop()
                        t.record.rates.pop()
            if r == t.rate and t.version:
                continue
            self._set_rate(t, r, now)

    def _alone(self, tpl: Template) -> float:
        """The rate of a template's flows with its links to themselves (cached on the template)."""
        if tpl.alone is None:
            tpl.alone = float((self._cap[tpl.cls] / tpl.cmult).min())
        return tpl.alone

    def _set_rate(self, t: Transfer, r: float, now: float) -> None:
        """From ``now`` the transfer moves at ``r``; its finish is scheduled (an earlier one lapses)."""
        t.remaining -= t.rate * (now - t.since)
        t.since = now
        t.rate = r
        t.version += 1
        if t.record is not None:
            t.record.times.append(now)
            t.record.rates.append(r)
        ev = self.env.timeout(max(t.remaining / r, 0.0))
        ev.callbacks.append(lambda _e, t=t, v=t.version: self._finish(t, v))

    def _finish(self, t: Transfer, version: int) -> None:
        if version != t.version:
            return
        comp = t.component
        del comp.transfers[t]
        t.component = None
        if t.record is not None:
            t.record.end = self.env.now
        users, owner = self._users, self._owner
        for c in t.tpl.clist:
            users[c] -= 1
            if users[c] == 0:
                owner[c] = -1
        self._arrive(t)
        if comp.transfers:
            comp.split = True
            self._mark(comp)
        else:
            del self._components[comp.id]

    def _split(self, comp: Component) -> list[Component]:
        """Re-partition a component after transfers left it: its parts, ``comp`` first."""
        groups = list(comp.transfers)
        if len(groups) > 1:
            entry_group = np.repeat(np.arange(len(groups)), [len(t.links) for t in groups])
            _, local = np.unique(np.concatenate([t.links for t in groups]), return_inverse=True)
            label = np.arange(len(groups))
            while True:
                link_label = np.full(local.max() + 1, len(groups))
                np.minimum.at(link_label, local, label[entry_group])
                new = label.copy()
                np.minimum.at(new, entry_group, link_label[local])
                new = new[new]
                if np.array_equal(new, label):
                    break
                label = new
            parts: dict[int, Component] = {}
            for t, lab in zip(groups, label.tolist()):
                if lab not in parts:
                    parts[lab] = comp if not parts else self._new_component()
                part = parts[lab]
                if part is not comp:
                    del comp.transfers[t]
                    self._assign(t, part)
            return list(parts.values())
        return [comp]
