"""Which ranks stand for each other: the coarsest partition of the ranks into *lanes* whose members
would run the same timeline, so that one simulated rank per lane is exact.

A folded run has one lane per pipeline stage: every rank of a stage runs the same program at the
same speed and joins groups that look alike, so one representative can stand for all of them.
A straggler breaks that symmetry, and not only for itself: its TP group waits for it at every
layer, its data-parallel group at every gradient reduction, the next stage of its replica at every
hand-off. Which ranks end up alike is a fixed point, found here by colour refinement (the
equitable partition of the rank graph, Weisfeiler-Leman 1968; McKay and Piperno, "Practical graph
isomorphism II", 2014, section 3): start from colours that say what a rank is (its stage, its
compute speed), then give two ranks the same new colour only if they had the same colour and, for
every kind of group, their groups hold the same multiset of colours, and their pipeline peers on
the next and previous stages have the same colour. Repeat until no colour splits.

At the fixed point every group of one kind that touches a lane has the same multiset of lanes, so
the members of a lane arrive at every collective together and all the groups a lane touches start
together: a collective of a lane waits for the other lanes of those groups (a rendezvous of lanes,
not of ranks), then starts the flows of all of them, as a folded stage starts the flows of all its
groups. With no straggler the lanes are the stages (folding); with every rank distinct, the ranks
(unfolding); in between, the cost is that of the lanes.
"""

from __future__ import annotations

import numpy as np

from simulator.layout.grid import Plan

GROUP_KINDS = ("tp", "cp", "dpcp", "dprep", "ep", "edp", "etp")


def group_table(plan: Plan, kind: str) -> np.ndarray:
    """Every ``kind`` group of every stage as rows of ranks (each rank in exactly one row)."""
    return np.array([g for stage in range(plan.pp) for g in plan.groups_on_stage(stage, kind)], dtype=np.int64)


def _relabel(columns: list[np.ndarray]) -> np.ndarray:
    """One colour per distinct row of the stacked columns, numbered in order of first appearance
    by rank (so the colours, and the lanes, do not depend on numpy's sort of the rows)."""
    _, first, inverse = np.unique(np.stack(columns, axis=1), axis=0, return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first, kind="stable"), kind="stable")
    return order[inverse.ravel()]


def lanes(plan: Plan, colour: np.ndarray) -> list[tuple[int, ...]]:
    """The lanes of ``plan`` for the initial ``colour`` of each rank (any integers: ranks that
    differ in what they compute must differ in colour; the stage is added here), each lane its
    ranks in ascending order, lanes ordered by their first rank."""
    world = plan.world
    ranks = np.arange(world)
    stage = ranks // (world // plan.pp)
    colour = _relabel([stage, np.asarray(colour, dtype=np.int64)])
    tables = [t for t in (group_table(plan, k) for k in GROUP_KINDS) if t.ndim == 2 and t.shape[1] > 1]
    peers = []
    if plan.pp > 1:
        coords = plan.grid.reshape(plan.pp, -1)
        for shift in (1, -1):
            peer = np.empty(world, dtype=np.int64)
            peer[coords.ravel()] = np.roll(coords, -shift, axis=0).ravel()
            peers.append(peer)
    count = len(np.unique(colour))
    while True:
        columns = [colour]
        for table in tables:
            signature = np.sort(colour[table], axis=1)
            _, group_colour = np.unique(signature, axis=0, return_inverse=True)
            per_rank = np.empty(world, dtype=np.int64)
            per_rank[table] = np.repeat(group_colour.ravel(), table.shape[1]).reshape(table.shape)
            columns.append(per_rank)
        columns += [colour[peer] for peer in peers]
        refined = _relabel(columns)
        new_count = int(refined.max()) + 1
        colour = refined
        if new_count == count:
            break
        count = new_count
    order = np.argsort(colour, kind="stable")
    cuts = np.flatnonzero(np.diff(colour[order])) + 1
    found = [tuple(int(r) for r in part) for part in np.split(order, cuts)]
    return sorted(found)
