"""Process groups of the rank grid, including the folded expert groups."""

import pytest

from simulator.layout.grid import Plan


@pytest.mark.parametrize("tp, dp, cp, ep", [(2, 4, 1, 2), (2, 2, 2, 4), (4, 4, 2, 8), (1, 8, 1, 8)])
def test_default_expert_groups_are_carved_out_of_dp_x_cp_at_equal_tp_position(tp, dp, cp, ep):
    plan = Plan.build(tp, 2, dp, cp, ep)
    for r in range(plan.world):
        dpcp = plan.dp_cp_group(r)
        i = dpcp.index(r)
        assert plan.ep_group(r) == dpcp[i // ep * ep:(i // ep + 1) * ep]
        assert plan.expert_dp_group(r) == dpcp[i % ep::ep]
        assert plan.expert_tp_group(r) == plan.tp_group(r)


def test_expert_tp_1_lets_an_expert_group_span_tp_ranks():
    """Qwen3-235B's layout: TP2 x DP16 per stage, EP32 with expert TP 1."""
    plan = Plan.build(2, 8, 16, 1, 32, etp=1)
    stage1 = [int(x) for x in plan.stage_ranks(1)]
    for r in (0, 5, 33, 63):
        assert plan.ep_group(r) == tuple(int(x) for x in plan.stage_ranks(plan.stage_of(r)))
        assert plan.expert_dp_group(r) == (r,) and plan.expert_tp_group(r) == (r,)
    assert plan.ep_group(40) == tuple(stage1)
    # etp 1 with ep 16: two expert-DP replicas of each expert per stage
    plan = Plan.build(2, 1, 16, 1, 16, etp=1)
    assert plan.ep_group(3) == tuple(range(16)) and plan.expert_dp_group(3) == (3, 19)


def test_every_rank_is_in_exactly_one_group_of_each_kind():
    plan = Plan.build(4, 2, 4, 2, 4, etp=2)
    for kind in ("tp", "cp", "dp", "ep", "edp", "etp"):
        for stage in range(2):
            groups = plan.groups_on_stage(stage, kind)
            members = sorted(r for g in groups for r in g)
            assert members == sorted(int(x) for x in plan.stage_ranks(stage)), kind


def test_groups_on_stage_slices_equal_a_scan_of_every_rank():
    """groups_on_stage slices the grid; it must list the groups a per-rank scan finds, in the same order."""
    import itertools
    for tp, pp, dp, cp, ep in itertools.product([1, 2, 4], [1, 3], [1, 2, 6], [1, 2], [1, 2, 4]):
        for etp in sorted({1, tp}):
            if (tp * dp * cp) % (ep * etp):
                continue
            plan = Plan.build(tp, pp, dp, cp, ep, etp)
            fns = {"tp": plan.tp_group, "cp": plan.cp_group, "dp": plan.dp_group, "dpcp": plan.dp_cp_group,
                   "ep": plan.ep_group, "edp": plan.expert_dp_group, "etp": plan.expert_tp_group}
            for stage in range(pp):
                for kind, fn in fns.items():
                    scan = tuple(dict.fromkeys(fn(int(r)) for r in plan.stage_ranks(stage)))
                    assert plan.groups_on_stage(stage, kind) == scan, (tp, pp, dp, cp, ep, etp, kind)
