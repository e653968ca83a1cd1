"""``stepsim plan``: the lower bound, exact pruning against brute force, resume, emit, errors."""

import functools
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.common.errors import ConfigError
from simulator.parts.gpus import gpu_of
from simulator.scenario.load import load_scenario, scenario_from_dict, scenario_to_dict
from simulator.studies.bound import step_lower_bound
from simulator.engine.engine import SimOptions, simulate
from simulator.studies import planner
from simulator.studies.planner import plan
from simulator.studies.planner_space import (apply_layout, candidate_scenario, default_space, enumerate_layouts,
                                             layout_of, layout_order, merge_enumerations, parse_space)
from simulator.studies.sweep import Task, evaluate
from simulator.workload.workload import build_workload

from procs import kill_9, kill_all, live_children, wait_for_lines


def _scenario(model: dict, nodes: int, gbs: int, seq: int, par: dict, schedule: str = "1f1b") -> dict:
    return {"name": "s", "model": model,
            "cluster": {"topology": "dgx-h100", "num_nodes": nodes, "gpus_per_node": 8},
            "training": {"seq_length": seq, "micro_batch_size": 1, "global_batch_size": gbs, "recompute": "none"},
            "parallelism": par, "schedule": schedule}


LLAMA_8B = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "intermediate_size": 14336, "vocab_size": 128256, "hidden_act": "silu"}
GPT_1_3B = {"hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
            "intermediate_size": 8192, "vocab_size": 51200, "hidden_act": "gelu"}
SMALL_MOE = {"hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 4,
             "intermediate_size": 2048, "vocab_size": 32000, "hidden_act": "silu", "num_experts": 8,
             "num_experts_per_tok": 2}

# Three small spaces (the issue's "8B on 16, 1.3B on 8, an MoE on 32"), narrowed so that brute
# force stays fast, with pipelines, interleaving, recompute, ZeRO-3, CP and EP among them.
SPACES = {
    "llama8b-16gpu": (_scenario(LLAMA_8B, 2, 8, 1024, {"tp": 4, "pp": 2, "zero_stage": 1}),
                      ["tp=4,8", "pp=1,2", "cp=1", "vp=1,2", "micro_batch_size=1", "recompute=none,full",
                       "zero_stage=1,3", "sequence_parallel=true", "dp_replicate=1,2"]),
    "gpt1.3b-8gpu": (_scenario(GPT_1_3B, 1, 16, 2048, {"tp": 2, "pp": 1}),
                     ["tp=1,2,4", "pp=1,2", "cp=1,2", "vp=1,3", "micro_batch_size=1,2", "recompute=none,selective",
                      "zero_stage=1", "sequence_parallel=false"]),
    "moe-32gpu": (_scenario(SMALL_MOE, 4, 32, 1024, {"tp": 1, "ep": 8, "zero_stage": 1}),
                  ["tp=1,2", "pp=1,2", "cp=1", "ep=2,4,8", "vp=1", "micro_batch_size=1", "recompute=none,full",
                   "zero_stage=1", "sequence_parallel=false,true"]),
    # the 8B space with the data-parallel buffers registered with NCCL (framework_options.nccl_ub):
    # its collectives hold fewer SMs, and the bounds take the fewest over the domains
    "llama8b-16gpu-nccl-ub": (dict(_scenario(LLAMA_8B, 2, 8, 1024, {"tp": 4, "pp": 2, "zero_stage": 1}),
                                   framework_options={"nccl_ub": True}),
                              ["tp=2,4,8", "pp=1,2", "cp=1", "vp=1,2", "micro_batch_size=1", "recompute=none,full",
                               "zero_stage=1,3", "sequence_parallel=true", "dp_replicate=1,2"]),
}


@functools.lru_cache(maxsize=None)
def _brute_force_rows(key: str) -> tuple[tuple[float, str, float], ...]:
    """(step, label, peak GiB) of every valid layout of ``SPACES[key]`` that fits, fastest first
    (cached: the exactness and the tolerance tests share it)."""
    raw, space = SPACES[key]
    s = scenario_from_dict(raw)
    enum = enumerate_layouts(s, parse_space(space, s))
    out = []
    for layout in enum.valid:
        row = evaluate(Task(raw, ".", "s", layout.overrides()))
        assert row["error"] is None
        if row["fits"]:
            out.append((row["step_time_s"], row["peak_memory_gib"], layout_order(layout), layout.label()))
    # the planner's order: step, then peak memory and ``layout_order`` for ties
    return tuple((step, label, mem) for step, mem, _, label in sorted(out))


def _brute_force(key: str) -> list[tuple[float, str]]:
    return [(step, label) for step, label, _ in _brute_force_rows(key)]


def _capacity(key: str) -> float:
    s = scenario_from_dict(SPACES[key][0])
    return gpu_of(s.cluster, s.training.precision).hbm_capacity_bytes / 2**30


def _front(rows, capacity: float) -> list[tuple[float, str]]:
    """The Pareto front as the planner defines it: in (step, memory, layout) order, each layout whose
    memory step is below every faster one's."""
    out, low = [], float("inf")
    for step, label, mem in rows:
        b = planner.memory_bin(mem, capacity)
        if b < low:
            out.append((step, label))
            low = b
    return out


@pytest.mark.parametrize("key", list(SPACES))
def test_planner_best_and_top_equal_brute_force_slow(key):
    """Exactness of pruning at tolerance 0 (slow: simulates every valid layout of three small
    spaces): the best, the top 3 and the Pareto front are brute force's."""
    raw, space = SPACES[key]
    truth = _brute_force(key)
    result = plan(raw, space=space, top=3, prove=3, pareto=True, workers=2, progress=None, tolerance=0)
    c = result["candidates"]
    assert c["enumerated"] == c["pruned_rules"] + c["pruned_memory"] + c["pruned_bound"] + c["simulated"]
    assert c["simulated"] < len(truth)  # the bound pruned something, yet:
    assert result["best"]["step_time_s"] == truth[0][0]
    assert [(e["step_time_s"], e["layout"]) for e in result["ranked"][:3]] == truth[:3]
    assert result["tolerance"] == 0 and result["pareto_exact"]
    front = _front(_brute_force_rows(key), _capacity(key))
    assert [p["step_time_s"] for p in result["pareto"]] == [step for step, _ in front]
    assert [p["layout"] for p in result["pareto"]] == [label for _, label in front]
    for e in result["ranked"]:
        assert e["lower_bound_s"] <= e["step_time_s"]


@pytest.mark.parametrize("key", list(SPACES))
def test_planner_tolerance_guarantee_against_brute_force_slow(key):
    """``tolerance`` t: the step shown at each rank is at most (1 + t) x brute force's at that
    rank, and every layout that fits has a Pareto point with no more memory (in the front's
    memory steps) at most (1 + t) x slower; a wide t simulates no more layouts than t = 0."""
    raw, space = SPACES[key]
    rows = _brute_force_rows(key)
    capacity = _capacity(key)
    exact = plan(raw, space=space, top=3, prove=3, pareto=True, workers=1, progress=None, tolerance=0)
    for t in (0.01, 0.05, 0.2):
        result = plan(raw, space=space, top=3, prove=3, pareto=True, workers=1, progress=None,
                      tolerance=f"{t:.0%}")
        assert result["tolerance"] == pytest.approx(t)
        c = result["candidates"]
        assert c["enumerated"] == c["pruned_rules"] + c["pruned_memory"] + c["pruned_bound"] + c["simulated"]
        assert c["simulated"] <= exact["candidates"]["simulated"]
        shown = [e["step_time_s"] for e in result["ranked"][:3]]
        assert len(shown) == min(3, len(rows))
        for i, step in enumerate(shown):
            assert rows[i][0] <= step <= (1 + t) * rows[i][0]
        front = [(p["step_time_s"], planner.memory_bin(p["memory_gib_per_gpu"], capacity)) for p in result["pareto"]]
        for step, _, mem in rows:
            b = planner.memory_bin(mem, capacity)
            assert any(fb <= b and fs <= (1 + t) * step for fs, fb in front), (step, mem)
    if key == "gpt1.3b-8gpu":  # there the widest tolerance prunes more, so the guarantee is exercised
        assert c["simulated"] < exact["candidates"]["simulated"]


@pytest.mark.parametrize("key", list(SPACES))
def test_default_plan_proves_the_best_and_marks_what_it_did_not_prove_slow(key):
    """The default plan (``prove`` 1, the front of the simulated layouts) proves the best only: its
    best is brute force's, and every ranked row it marks ``rank_exact`` is brute force's row at that
    rank; a row it does not mark is at least as slow as brute force's at its rank (a layout the plan
    pruned or stopped may sit before it). It simulates no more than proving the top 3 does."""
    raw, space = SPACES[key]
    rows = _brute_force_rows(key)
    result = plan(raw, space=space, top=3, workers=1, progress=None)
    proved = plan(raw, space=space, top=3, prove=3, workers=1, progress=None)
    assert result["prove"] == 1 and not result["pareto_exact"] and result["tolerance"] == 0
    assert (result["best"]["step_time_s"], result["best"]["layout"]) == rows[0][:2]
    assert result["ranked"][0]["rank_exact"]
    for e in result["ranked"]:
        step, label, _ = rows[e["rank"] - 1]
        if e["rank_exact"]:
            assert (e["step_time_s"], e["layout"]) == (step, label)
        else:
            assert e["step_time_s"] >= step
    assert all(e["rank_exact"] for e in proved["ranked"][:3])
    assert result["candidates"]["simulated"] <= proved["candidates"]["simulated"]
    text = planner.format_plan(result)
    marked = [e for e in result["ranked"][:3] if not e["rank_exact"]]
    assert all(f">={e['rank']}" in text for e in marked)


@pytest.mark.parametrize("value", ["0", "-2", "6", "two", "1.5"])
def test_bad_prove_is_a_one_line_error(value, capsys):
    """--prove counts ranks from 1 to --top (5 by default)."""
    try:
        code = main(["plan", "scenarios/tiny.yaml", "--prove", value])
    except SystemExit as exc:  # argparse's own one-line error for a value that is not a whole number
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--prove" in err, err


@pytest.mark.parametrize("value", ["-1%", "51%", "0.6", "abc", "nan", "inf", True])
def test_bad_tolerance_is_a_one_line_error(value, capsys):
    with pytest.raises(ConfigError, match="--tolerance"):
        planner.parse_tolerance(value)
    if isinstance(value, str):
        assert main(["plan", "scenarios/tiny.yaml", f"--tolerance={value}"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("stepsim: error: --tolerance")


def test_bound_never_exceeds_the_step_and_is_exact_without_communication_on_one_stage():
    tiny = load_scenario("scenarios/tiny.yaml")
    cases = [tiny, *(apply_layout(tiny, replace(layout_of(tiny), **kw)) for kw in (
        dict(recompute="full"), dict(recompute="selective", zero_stage=3), dict(vp=2, schedule="interleaved"),
        dict(pp=1, dp=4), dict(tp=1, pp=4, dp=2, micro_batch_size=2), dict(sequence_parallel=True),
        dict(sequence_parallel=True, recompute="full"), dict(tp=4, pp=1, sequence_parallel=True),
        # the schedules' placements and split backwards (zb-h1's last step on a stage is a W)
        dict(schedule="zb-h1"), dict(schedule="zb-h2"), dict(vp=2, schedule="zb-v"), dict(schedule="dualpipe"),
        dict(vp=2, schedule="dualpipev")))]
    # ZeRO-3 under a pipeline, torch pipelining style (gathered once per step)
    cases.append(replace(apply_layout(tiny, replace(layout_of(tiny), zero_stage=3)), framework="torchtitan"))
    assert cases[-1].parallelism.pp > 1
    for s in cases:
        gpu = gpu_of(s.cluster, s.training.precision)
        w = build_workload(s, gpu)
        bound = step_lower_bound(s, w)
        assert step_lower_bound(s, w, planner.node_collective_time(s), planner.cluster_collective_time(s),
                                gpu.num_sms) <= simulate(s).step_time_s
        assert bound <= simulate(s).step_time_s
        assert bound <= simulate(s, SimOptions(communication=False)).step_time_s
    one = apply_layout(tiny, replace(layout_of(tiny), pp=1, dp=4))
    w = build_workload(one, gpu_of(one.cluster, "bf16"))
    assert step_lower_bound(one, w) == pytest.approx(simulate(one, SimOptions(communication=False)).step_time_s,
                                                     rel=1e-8)
    # PipeDream-Flush: with p stages the bound covers the fill and drain, (m + p - 1)(f + b) for equal stages.
    two = load_scenario("scenarios/tiny.yaml")
    w = build_workload(two, gpu_of(two.cluster, "bf16"))
    assert step_lower_bound(two, w) == pytest.approx(simulate(two, SimOptions(communication=False)).step_time_s,
                                                     rel=1e-6)


def test_fsdp_chain_is_the_longest_path():
    from simulator.studies.bound import fsdp_chain

    assert fsdp_chain([1.0, 1.0, 1.0], [0.0, 0.0, 0.0], 1) == 3.0
    # depth 0: every gather waits for the previous layer
    assert fsdp_chain([1.0, 1.0, 1.0], [2.0, 2.0, 2.0], 0) == 9.0
    # depth 1: layers 0 and 1 gathered from the start (0-2), 0 runs 2-3, 1 runs 3-4; 2 gathered 3-5, runs 5-6
    assert fsdp_chain([1.0, 1.0, 1.0], [2.0, 2.0, 2.0], 1) == 6.0


def _tiny_on_two_nodes(overlap: dict | None = None, **kw):
    """The tiny scenario on two nodes (DP 4 crosses the network) with the layout changes ``kw`` and
    the ``overlap`` section's keys ``overlap`` sets."""
    raw = scenario_to_dict(load_scenario("scenarios/tiny.yaml"))
    raw["cluster"]["num_nodes"] = 2
    raw["training"]["global_batch_size"] = 16
    raw["parallelism"]["dp"] = 4
    if overlap:
        raw.setdefault("overlap", {}).update(overlap)
    return apply_layout(scenario_from_dict(raw), replace(layout_of(scenario_from_dict(raw)), **kw))


@pytest.mark.parametrize("kw", [
    dict(zero_stage=3), dict(zero_stage=3, recompute="full"), dict(zero_stage=3, tp=2, pp=1, dp=8),
    dict(zero_stage=3, tp=8, pp=1, dp=2), dict(zero_stage=3, pp=4, dp=2, tp=2),
    dict(zero_stage=3, tp=2, pp=2, dp=2, cp=2, sequence_parallel=True), dict(zero_stage=1, tp=1, pp=1, dp=16),
    dict(zero_stage=3, schedule="dualpipe"), dict(zero_stage=3, vp=2, schedule="zb-v"),
])
def test_bound_with_fsdp_never_exceeds_the_step_across_nodes(kw):
    """ZeRO-3's parameter all-gathers (chained behind the layers, and the busiest link's traffic)
    keep the bound below the simulated step, on two nodes where DP crosses the network."""
    s = _tiny_on_two_nodes(**kw)
    gpu = gpu_of(s.cluster, s.training.precision)
    w = build_workload(s, gpu)
    bound = step_lower_bound(s, w, planner.node_collective_time(s), planner.cluster_collective_time(s), gpu.num_sms)
    assert step_lower_bound(s, w, planner.node_collective_time(s)) <= bound <= simulate(s).step_time_s


@pytest.mark.parametrize("kw", [
    dict(tp=2), dict(tp=4, pp=1, dp=2), dict(tp=4, pp=1, dp=2, sequence_parallel=True),
    dict(tp=2, sequence_parallel=True, recompute="selective"), dict(tp=2, sequence_parallel=True, recompute="full"),
    dict(tp=2, vp=2, schedule="interleaved", sequence_parallel=True), dict(tp=2, cp=2, sequence_parallel=True),
    dict(tp=2, sequence_parallel=True, schedule="zb-h1"),
])
def test_overlapped_tp_contention_keeps_the_bound_below_the_step(kw):
    """The SMs the backward's overlapped TP collectives hold (``bound.overlap_contention_s``) raise
    the bound, never above the simulated step; a split backward (zb-h1) takes no such term."""
    from simulator.studies.bound import overlap_contention_s

    s = _tiny_on_two_nodes(**kw)
    gpu = gpu_of(s.cluster, s.training.precision)
    w = build_workload(s, gpu)
    sms = gpu.num_sms
    node, cluster = planner.node_collective_time(s), planner.cluster_collective_time(s)
    extra = overlap_contention_s(s, w, node, sms)
    without = step_lower_bound(s, w, node, cluster)
    bound = step_lower_bound(s, w, node, cluster, sms)
    assert without <= bound <= simulate(s).step_time_s
    if kw.get("schedule") == "zb-h1":
        assert extra == {False: 0.0, True: 0.0} and bound == without
    else:
        assert extra[False] > 0 and bound > without


@pytest.mark.parametrize("kw", [
    dict(tp=2, sequence_parallel=True), dict(tp=4, pp=1, dp=2, sequence_parallel=True),
    dict(tp=2, sequence_parallel=True, recompute="full"), dict(tp=2, vp=2, schedule="interleaved", sequence_parallel=True),
    dict(tp=2, sequence_parallel=True, schedule="zb-h1"), dict(tp=2, sequence_parallel=True, schedule="dualpipe"),
    dict(tp=2, vp=2, sequence_parallel=True, schedule="zb-v"), dict(tp=4, pp=2, dp=2, sequence_parallel=True, recompute="full"),
])
def test_async_tp_forward_keeps_the_bound_below_the_step(kw):
    """With async TP the forward's all-gather and reduce-scatter run beside the first and last GEMMs
    (``bound.async_tp_forward_s``): the term raises the bound, never above the simulated step, and
    is zero without async TP."""
    from simulator.studies.bound import async_tp_forward_s

    plain, s = _tiny_on_two_nodes(**kw), _tiny_on_two_nodes({"async_tp": True}, **kw)
    gpu = gpu_of(s.cluster, s.training.precision)
    node, cluster = planner.node_collective_time(s), planner.cluster_collective_time(s)
    w = build_workload(s, gpu)
    assert async_tp_forward_s(plain, build_workload(plain, gpu), node, gpu.num_sms) == {False: 0.0, True: 0.0}
    extra = async_tp_forward_s(s, w, node, gpu.num_sms)
    assert extra[False] > 0
    assert async_tp_forward_s(s, w, node, None)[False] <= extra[False]
    bound = step_lower_bound(s, w, node, cluster, gpu.num_sms)
    assert bound <= simulate(s).step_time_s


@pytest.mark.parametrize("kw, overlap", [
    (dict(tp=2, cp=2, sequence_parallel=True), {}), (dict(tp=1, pp=1, dp=4, cp=4), {}),
    (dict(tp=2, cp=2, sequence_parallel=True, recompute="full"), {}),
    (dict(tp=2, cp=2, vp=2, schedule="interleaved", sequence_parallel=True), {}),
    (dict(tp=2, cp=2, sequence_parallel=True), {"cp_comm": False}),
    (dict(tp=2, cp=2, sequence_parallel=True), {"async_tp": True}),
])
def test_cp_exchange_keeps_the_bound_below_the_step(kw, overlap):
    """The context-parallel exchange beside the attention core (``bound.cp_exchange_s``) raises
    the bound, never above the simulated step; exposed whole without ``overlap.cp_comm``; the
    forward's is left out under async TP."""
    from simulator.studies.bound import cp_exchange_s

    s = _tiny_on_two_nodes(overlap, **kw)
    gpu = gpu_of(s.cluster, s.training.precision)
    node, cluster = planner.node_collective_time(s), planner.cluster_collective_time(s)
    w = build_workload(s, gpu)
    fwd, bwd = cp_exchange_s(s, w, node, gpu.num_sms)
    assert bwd > 0 and (fwd == 0) == bool(overlap.get("async_tp"))
    assert cp_exchange_s(s, w, node, None)[1] <= bwd
    assert step_lower_bound(s, w, node, cluster, gpu.num_sms) <= simulate(s).step_time_s


def _llama70b_zero3_tp2_cp2():
    """Llama 3 70B on 64 H100 as TP2 CP2 ZeRO-3 over 32 GPUs (DP 16), 1F1B, batch 64."""
    raw = scenario_to_dict(load_scenario("scenarios/llama3-70b-64xh100.yaml"))
    raw["training"]["global_batch_size"] = 64
    base = scenario_from_dict(raw)
    return apply_layout(base, replace(layout_of(base), tp=2, pp=1, dp=16, cp=2, vp=1, zero_stage=3, schedule="1f1b",
                                      sequence_parallel=True, recompute="none", first_pipeline_num_layers=None,
                                      last_pipeline_num_layers=None))


def test_fsdp_contention_bound_is_its_closed_form_and_below_the_step():
    """Llama 3 70B, TP2 CP2 ZeRO-3 over 32 GPUs on 64 H100 (the gathers cross the network, hidden
    by the prefetch): the SMs the FSDP collectives hold lift the bound to C + (24/132) L +
    (108/132) T, with C the compute alone (the step without communication, pp 1), L the busiest
    link's FSDP busy time and T the blocking TP collectives; the simulated step stays above it."""
    from simulator.network.nccl import NCCL_KERNEL_SMS
    from simulator.studies.bound import blocking_tp_s, fsdp_link_busy, stage_compute

    s = _llama70b_zero3_tp2_cp2()
    gpu = gpu_of(s.cluster, s.training.precision)
    w = build_workload(s, gpu)
    node, cluster = planner.node_collective_time(s), planner.cluster_collective_time(s)
    without = step_lower_bound(s, w, node, cluster)
    bound = step_lower_bound(s, w, node, cluster, gpu.num_sms)
    compute = simulate(s, SimOptions(communication=False)).step_time_s
    fwd, bwd = stage_compute(w, blocking_tp_s(s, w, node))
    waits = s.num_microbatches * (sum(fwd) + sum(bwd)) - (compute - w.optimizer[0].time_s)
    k = NCCL_KERNEL_SMS / gpu.num_sms
    assert waits > 0
    assert bound == pytest.approx(compute + k * fsdp_link_busy(s, w, cluster)[0] + (1 - k) * waits, rel=1e-8)
    assert without * 1.1 < bound < simulate(s).step_time_s



def test_fsdp_bound_with_registered_buffers_stays_below_the_step():
    """The same layout with ``framework_options.nccl_ub``: its FSDP collectives hold a few SMs
    (``nccl.REGISTERED_KERNEL_SMS``), so both the bound and the step fall, and the bound stays
    below the step; the progress walk's bound too."""
    from simulator.studies.bound import StepAbove, simulate_below

    plain = _llama70b_zero3_tp2_cp2()
    s = replace(plain, framework_options=replace(plain.framework_options, nccl_ub=True))
    gpu = gpu_of(s.cluster, s.training.precision)
    node, cluster = planner.node_collective_time(s), planner.cluster_collective_time(s)
    bounds = [step_lower_bound(x, build_workload(x, gpu), node, cluster, gpu.num_sms) for x in (plain, s)]
    steps = [simulate(x).step_time_s for x in (plain, s)]
    assert bounds[1] < bounds[0] and steps[1] < steps[0]
    assert bounds[1] < steps[1]
    with pytest.raises(StepAbove):
        simulate_below(s, cutoff_s=steps[1] * 0.98)
    assert simulate_below(s, cutoff_s=steps[1] * 1.001).step_time_s == pytest.approx(steps[1], rel=1e-12)


def test_blocking_ep_all_to_alls_are_two_per_moe_pass_and_keep_the_bound_below_the_step():
    """Mixtral 8x7B on 64 H100, EP8 inside a node: each MoE layer's forward and backward wait for a
    dispatch and a combine all-to-all (full recompute: the forward's again), each at least its
    time alone on an idle node; none with moe.overlap_a2a or with EP across nodes. The bound
    rises by them and stays below the simulated step. With TP the MoE block's own TP collectives
    count in both passes."""
    from simulator.studies.bound import blocking_ep_s

    base = load_scenario("scenarios/mixtral-8x7b-64xh100.yaml")
    for recompute in ("none", "full"):
        s = apply_layout(base, replace(layout_of(base), recompute=recompute))
        w = build_workload(s, gpu_of(s.cluster, s.training.precision))
        node = planner.node_collective_time(s)
        one = node("all_to_all", 8, w.ep_bytes)  # one all-to-all over 8 GPUs of an idle node
        assert one > 0
        assert blocking_ep_s(s, w, node) == pytest.approx((2 * one, (4 if recompute == "full" else 2) * one))
        overlapped = replace(s, moe=replace(s.moe, overlap_a2a=True))
        assert blocking_ep_s(overlapped, w, node) == (0.0, 0.0)
        bound = step_lower_bound(s, w, node, planner.cluster_collective_time(s))
        without = step_lower_bound(overlapped, w, node, planner.cluster_collective_time(s))
        assert without < bound < simulate(s).step_time_s
    # TP2 with sequence parallelism: the attention's all-gather and reduce-scatter, the MoE block's own
    # (expert TP = tp), and the two all-to-alls of EP4, in each pass
    from simulator.studies.bound import blocking_tp_s

    tp2 = apply_layout(base, replace(layout_of(base), tp=2, dp=8, ep=4, etp=None, sequence_parallel=True))
    w = build_workload(tp2, gpu_of(tp2.cluster, "bf16"))
    node = planner.node_collective_time(tp2)
    ag, rs = node("all_gather", 2, w.tp_bytes), node("reduce_scatter", 2, w.tp_bytes)
    a2a = node("all_to_all", 4, w.ep_bytes)
    fwd, bwd = blocking_tp_s(tp2, w, node)[True]
    assert fwd == pytest.approx((ag + rs) + (ag + rs) + 2 * a2a)
    assert bwd == pytest.approx(ag + (ag + rs) + 2 * a2a)
    wide = apply_layout(base, replace(layout_of(base), tp=2, dp=8, etp=2, sequence_parallel=True))
    assert wide.parallelism.ep * wide.parallelism.expert_tp == 16  # ep x etp over two nodes
    assert blocking_ep_s(wide, build_workload(wide, gpu_of(wide.cluster, "bf16")),
                         planner.node_collective_time(wide)) == (0.0, 0.0)


def test_stage_fsdp_busy_is_the_busiest_link_of_its_collectives():
    """One stage's FSDP busy time is the busiest link's seconds of, per layer and micro-batch, two
    parameter all-gathers and one gradient reduce-scatter over its group: checked against the
    per-link loads of the three collectives (one parameter count, as in a dense model, and two, as
    when MoE layers hold fewer dense parameters); None without parameters."""
    from simulator.studies.bound import stage_fsdp_busy
    from simulator.workload.workload import GRAD_BYTES, PARAM_BYTES

    s = load_scenario("scenarios/llama3-70b-64xh100.yaml")
    group_time = planner.cluster_collective_time(s)
    group = tuple(range(0, 64, 4))  # one rank of each TP4 group: 16 GPUs on all eight nodes

    def load(x):
        return 2 * group_time("all_gather", group, x * PARAM_BYTES)[1] + group_time("reduce_scatter", group,
                                                                                      x * GRAD_BYTES)[1]

    x, y, m = 2.0e8, 5.0e7, 6
    one = stage_fsdp_busy(group, [x] * 5, m, group_time)
    assert one == pytest.approx(m * 5 * float(load(x).max()), rel=1e-12)
    assert stage_fsdp_busy(group, [x] * 5, m, group_time) == one  # the memoised peak gives the same seconds
    two = stage_fsdp_busy(group, [x, y, x, 0.0, y, x], m, group_time)
    assert two == pytest.approx(m * float((3 * load(x) + 2 * load(y)).max()), rel=1e-12)
    assert m * 3 * float(load(x).max()) < two <= one
    assert stage_fsdp_busy(group, [0.0, 0.0], m, group_time) is None


def test_enumeration_in_parts_is_the_whole_enumeration():
    """The planner validates the space in interleaved parts in its pool: put together, they are the
    enumeration of the whole space (layouts in order, counts and reasons, warnings)."""
    s = load_scenario("scenarios/llama3-70b-64xh100.yaml")
    values = parse_space(["tp=2,4,8", "pp=1,2,4,8", "micro_batch_size=1,2"], s)
    whole = enumerate_layouts(s, values)
    assert whole.valid and whole.pruned_rules
    for k in (2, 3, 8):
        parts = [enumerate_layouts(s, values, (i, k)) for i in range(k)]
        assert merge_enumerations(parts) == whole
        assert sum(len(p.valid) for p in parts) == len(whole.valid)

def test_candidate_scenarios_equal_the_checked_ones():
    s = load_scenario("scenarios/llama3-70b-64xh100.yaml")
    enum = enumerate_layouts(s, parse_space(["tp=4,8", "pp=2,4", "cp=1,2"], s))
    for layout in enum.valid[::37]:
        assert candidate_scenario(s, layout) == apply_layout(s, layout)
    assert candidate_scenario(s, layout_of(s)) == s


def test_hybrid_sharding_is_an_axis_with_the_scenarios_own_copies_and_zero_stages_1_to_3():
    """A scenario's own dp_replicate (hybrid sharding, as MaxText's DGX Cloud 70B runs shard FSDP
    over 128 GPUs in 16 copies) joins 1 in the default space, so the given layout is a candidate;
    copies pair only with ZeRO stages 1-3, a count that does not divide dp is pruned by its rule,
    and the layouts run what their overrides say."""
    s = load_scenario("scenarios/llama3-70b-64xh100.yaml", ["parallelism.zero_stage=3", "parallelism.dp_replicate=2"])
    assert default_space(s)["dp_replicate"] == (1, 2)
    values = parse_space(["tp=4,8", "pp=1,4", "cp=2", "vp=1,5", "micro_batch_size=1", "recompute=none",
                          "zero_stage=0,3", "sequence_parallel=true", "dp_replicate=1,2,3"], s)
    enum = enumerate_layouts(s, values)
    assert layout_of(s) in enum.valid and layout_of(s).dp_replicate == 2
    hybrid = [x for x in enum.valid if x.dp_replicate > 1]
    assert hybrid and all(x.zero_stage == 3 and x.dp % x.dp_replicate == 0 for x in hybrid)
    assert {x.dp_replicate for x in hybrid} == {2}  # dp is 8, 4, 2 or 1 here: 3 divides none
    assert any(r.startswith("parallelism.dp_replicate") for r in enum.pruned_rules)
    assert all(f"HSDP{x.dp_replicate}" in x.label() for x in hybrid)
    for x in hybrid[:3]:
        cs = candidate_scenario(s, x)
        assert cs == apply_layout(s, x) and cs.parallelism.dp_replicate == x.dp_replicate
    # a dp_replicate 1 scenario keeps the default space as before
    assert default_space(load_scenario("scenarios/llama3-70b-64xh100.yaml"))["dp_replicate"] == (1,)


def test_hybrid_sharding_on_an_moe_model_is_a_one_line_error(capsys):
    args = ["plan", "scenarios/tiny.yaml", "--set", "model.num_experts=4", "--set", "model.num_experts_per_tok=2",
            "--space", "dp_replicate=1,2"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("stepsim: error: --space dp_replicate")


def test_default_space_holds_the_published_layouts():
    for path in ("scenarios/llama3-70b-64xh100.yaml", "scenarios/llama3-405b-16384xh100.yaml"):
        s = load_scenario(path)
        space = default_space(s)
        given = layout_of(s)
        assert given.tp in space["tp"] and given.pp in space["pp"] and given.vp in space["vp"]


def test_resume_simulates_nothing_twice_and_emit_reproduces_the_step(tmp_path, monkeypatch):
    space = ["tp=2,4", "pp=1,2", "micro_batch_size=1", "recompute=none", "zero_stage=1"]
    first = plan("scenarios/tiny.yaml", space=space, out=tmp_path, workers=1, progress=None)
    log = (tmp_path / "plan.jsonl").read_text().splitlines()
    assert len(log) == first["candidates"]["simulated"] + (0 if first["given"]["in_space"] else 1)
    assert (tmp_path / "pareto.png").stat().st_size > 0

    def no_simulation(task):
        raise AssertionError("a logged candidate was simulated again")

    monkeypatch.setattr(planner, "evaluate", no_simulation)
    again = plan("scenarios/tiny.yaml", space=space, out=tmp_path, workers=1, progress=None)
    assert json.dumps(again, sort_keys=True) == json.dumps(first, sort_keys=True)
    monkeypatch.undo()

    # A log cut short by a kill: the damaged line is recomputed, the rest reused.
    (tmp_path / "plan.jsonl").write_text("\n".join(log[:-1]) + "\n" + log[-1][:20])
    resumed = plan("scenarios/tiny.yaml", space=space, out=tmp_path, workers=1, progress=None)
    assert json.dumps(resumed, sort_keys=True) == json.dumps(first, sort_keys=True)

    emitted = tmp_path / "best.yaml"
    planner.emit_scenario(first, "scenarios/tiny.yaml", emitted)
    assert main(["run", str(emitted), "--json"]) == 0
    s = load_scenario(str(emitted))
    assert simulate(s).step_time_s == first["best"]["step_time_s"]


@pytest.mark.parametrize("submitted, collected, twins, workers, upto", [
    (5, 0, {}, 1, 5),  # one worker: every result is in before a decision
    (5, 0, {}, 2, 4),  # two: the last simulation runs on while the planner decides
    (5, 0, {4: 3}, 2, 3),  # the last submission shares its twin's run: the one before still counts
    (5, 0, {3: 0, 4: 1}, 3, 1),  # two twins at the end, two simulations out
    (5, 4, {}, 3, 4),  # never below what is already collected
    (3, 0, {1: 0, 2: 0}, 2, 0),  # only twins after the one simulation out
])
def test_decision_point_leaves_workers_minus_one_simulations_out(submitted, collected, twins, workers, upto):
    assert planner.decision_point(submitted, collected, twins, workers) == upto


def test_two_workers_plan_alike_every_time_and_as_one_worker_at_the_top(tmp_path):
    """Decisions depend on the submission order only: two runs with two workers give the same JSON
    (ZeRO twins in the space, so some submissions share a simulation), a rerun on the first one's
    log simulates nothing new, and the exact top 3 is one worker's."""
    space = ["tp=1,2", "pp=1,2", "micro_batch_size=1", "recompute=none,full", "zero_stage=1,2"]
    first = plan("scenarios/tiny.yaml", space=space, out=tmp_path, workers=2, progress=None, tolerance=0, prove=3)
    assert first["candidates"]["shared_with_zero_twin"] > 0
    second = plan("scenarios/tiny.yaml", space=space, workers=2, progress=None, tolerance=0, prove=3)
    assert json.dumps(second, sort_keys=True) == json.dumps(first, sort_keys=True)
    lines = len((tmp_path / "plan.jsonl").read_text().splitlines())
    again = plan("scenarios/tiny.yaml", space=space, out=tmp_path, workers=2, progress=None, tolerance=0, prove=3)
    assert json.dumps(again, sort_keys=True) == json.dumps(first, sort_keys=True)
    assert len((tmp_path / "plan.jsonl").read_text().splitlines()) == lines
    one = plan("scenarios/tiny.yaml", space=space, workers=1, progress=None, tolerance=0, prove=3)
    assert [(e["layout"], e["step_time_s"]) for e in one["ranked"][:3]] == \
        [(e["layout"], e["step_time_s"]) for e in first["ranked"][:3]]


def test_ray_plans_as_the_process_pool_and_an_impossible_space_does_not_start_it(monkeypatch):
    """``--executor ray`` (a local Ray) gives the process pool's plan, JSON for JSON; a space with
    no valid layout is refused before Ray starts (the enumeration runs first)."""
    ray = pytest.importorskip("ray", reason="Ray is the optional extra stepsim[ray]; CI installs it")
    with monkeypatch.context() as m:
        m.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray started for a space with no valid layout"))
        with pytest.raises(ConfigError, match="--space: .* none is valid"):
            plan("scenarios/tiny.yaml", space=["pp=3", "vp=1"], executor="ray", workers=2, progress=None)
    space = ["tp=1,2", "pp=1,2", "micro_batch_size=1", "recompute=none", "zero_stage=1"]
    pooled = plan("scenarios/tiny.yaml", space=space, workers=2, progress=None)
    rayed = plan("scenarios/tiny.yaml", space=space, executor="ray", workers=2, progress=None)
    assert json.dumps(rayed, sort_keys=True) == json.dumps(pooled, sort_keys=True)
    assert not ray.is_initialized()  # the plan shut down the Ray it started


def test_json_keys_are_the_issue_contract():
    result = plan("scenarios/tiny.yaml", space=["tp=2", "pp=1,2", "micro_batch_size=1", "recompute=none",
                                                "zero_stage=0,1"], workers=1, progress=None)
    assert set(result["candidates"]) >= {"enumerated", "pruned_rules", "pruned_memory", "pruned_bound", "simulated"}
    keys = {"parallelism", "schedule", "training", "step_time_s", "tokens_per_s_per_gpu", "memory_gib_per_gpu"}
    assert set(result["best"]) >= keys | {"why"}
    assert set(result["given"]) >= keys | {"rank"}
    assert result["ranked"] and result["pareto"]
    assert result["best"]["why"].startswith("bound by ")


@pytest.mark.parametrize("space, field", [
    (["tp=0"], "--space tp"), (["nope=1"], "--space"), (["recompute=some"], "--space recompute"),
    (["zero_stage=4"], "--space zero_stage"), (["schedule=chimera"], "--space schedule"),
    (["etp=1"], "--space etp"), (["tp=2", "tp=4"], "--space"), (["tp=2,2"], "--space tp"),
    (["vp=1000"], "--space vp"), (["micro_batch_size=100000"], "--space micro_batch_size"),
    (["dp_replicate=0"], "--space dp_replicate"), (["dp_replicate=two"], "--space dp_replicate"),
    (["dp_replicate=1.5"], "--space dp_replicate"), (["dp_replicate=2", "zero_stage=0"], "--space dp_replicate"),
])
def test_impossible_space_values_are_one_line_errors(space, field, capsys):
    args = ["plan", "scenarios/tiny.yaml"] + [x for v in space for x in ("--space", v)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"stepsim: error: {field}")


def test_no_layout_fits_names_the_smallest(capsys):
    args = ["plan", "scenarios/llama3-70b-64xh100.yaml", "--set", "cluster.num_nodes=1", "--set", "parallelism.dp=null",
            "--set", "training.global_batch_size=16", "--space", "tp=8", "--space", "pp=1", "--space", "cp=1"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "no layout fits" in err and "the smallest, TP8 PP1 DP1" in err and "GiB too many" in err


def test_planner_is_no_slower_than_a_published_layout():
    """The CI subset of ``stepsim plan --validate`` (the full run is in the issue-17 note): Korthikanti
    et al.'s 22B on 8 A100s, planned over the whole default space."""
    from pathlib import Path

    from simulator.studies.plan_check import check_runs

    runs = Path(__file__).resolve().parents[2] / "shared" / "validation" / "public-runs.yaml"
    result = check_runs(runs, workers=2, ids=["korthikanti-t5-22b-selective"])
    row = result["rows"][0]
    assert "error" not in row
    assert row["best_fits"] and row["no_slower"]
    assert row["given_rank"] >= 1 and row["gain"] >= 0


# Known failures on the runs on at most 8 GPUs, kept strict so a fix shows up here (issue 17 stays
# open while any remain). None since the memory model follows the frameworks' selective-recompute
# policies (torchtitan's per-op SAC, MaxText's minimal_flash): the four torchtitan / MaxText FSDP
# rows it used to put above the GPU memory now fit, their published layout ranked first.
KNOWN_PLAN_FAILURES: dict[str, dict[str, str]] = {}


@pytest.mark.slow
@pytest.mark.parametrize("runs", ["public-runs.yaml", "blackwell-runs.yaml", "framework-runs.yaml",
                                  "megatron-bridge-runs.yaml", "moe-runs.yaml", "nemo-2407-runs.yaml"])
def test_planner_best_fits_and_is_no_slower_on_every_published_run_slow(runs):
    """Issue 17: on the published runs on at most 8 GPUs (CI time; every run with
    ``python -m simulator.studies.plan_check --out plan_published.txt``) the planner's best fits
    and is predicted no slower than the published layout (each planned over
    ``plan_check.narrow_space``, the published layout among the candidates)."""
    from pathlib import Path

    from simulator.studies.plan_check import check_runs

    here = Path(__file__).resolve().parent
    path = here.parents[1] / "shared" / "validation" / runs if runs == "public-runs.yaml" else here / "data" / runs
    result = check_runs(path, workers=2, narrow=True, max_gpus=8)
    failing = {row["id"]: row.get("error") or f"best fits {row['best_fits']}, no slower {row['no_slower']}, "
               f"published fits {row['given_fits']}" for row in result["rows"]
               if "error" in row or not (row["best_fits"] and row["no_slower"])}
    # Known failures, kept strict so a fix shows up here (issue 17 stays open while any remain).
    assert failing.keys() == KNOWN_PLAN_FAILURES.get(runs, {}).keys(), failing


@pytest.mark.parametrize("key", list(SPACES))
def test_cheap_bound_never_exceeds_the_exact_bound_and_memory_peak_is_the_reports(key):
    """The planner's cheap bound (shared by layouts with the same layer costs) is at most the
    exact bound on every layout of the small spaces, whatever their pipeline, and its memory pass
    gives ``memory_report``'s peak and capacity."""
    from simulator.workload.memory import memory_peak, memory_report

    raw, space = SPACES[key]
    s = scenario_from_dict(raw)
    space = [a for a in space if not a.startswith(("pp=", "vp=", "zero_stage="))] + [
        "pp=1,2,4", "vp=1,2", "zero_stage=0,1,2,3"]
    bounds = planner._Bounds(s)
    checked = floored = 0
    for layout in enumerate_layouts(s, parse_space(space, s)).valid:
        cs = candidate_scenario(s, layout)
        mem = memory_report(cs)
        assert memory_peak(cs) == (mem["peak_gib"], mem["stages"][0]["capacity_gib"])
        cheap = bounds.cheap(layout)
        assert cheap is not None and cheap <= bounds.exact(layout)
        checked += 1
        if layout.zero_stage == 3:  # the FSDP link floor, when it is what the cheap bound is
            m = cs.num_microbatches
            floor = bounds._fsdp_floor(layout, m, build_workload(cs, bounds.gpu).layer_dense_params)
            floored += floor * (1 - planner.CHEAP_MARGIN) == cheap
    assert checked > 20
    if key.startswith("llama8b-16gpu"):
        assert floored > 0  # the ZeRO-3 floor is exercised (on 16 GPUs its groups span two nodes)


def test_zero1_and_zero2_simulate_alike_and_the_planner_shares_their_simulation():
    """ZeRO-1 and ZeRO-2 run the same program (only their memory differs), so the planner
    simulates one of a pair and reuses it for the other: every ranked row of such a plan is the
    row ``sweep.evaluate`` gives that layout on its own."""
    from simulator.studies.sweep import METRICS

    raw, _ = SPACES["gpt1.3b-8gpu"]
    space = ["tp=1,2", "pp=1,2", "cp=1", "vp=1", "micro_batch_size=1", "recompute=none", "zero_stage=1,2",
             "sequence_parallel=false"]
    s = scenario_from_dict(raw)
    for layout in enumerate_layouts(s, parse_space(space, s)).valid[:4]:
        z1 = evaluate(Task(raw, ".", "s", replace(layout, zero_stage=1).overrides()))
        z2 = evaluate(Task(raw, ".", "s", replace(layout, zero_stage=2).overrides()))
        assert z1["error"] is None and z1["peak_memory_gib"] > z2["peak_memory_gib"]
        assert {k: z1[k] for k in METRICS if k not in ("peak_memory_gib", "fits")} == \
            {k: z2[k] for k in METRICS if k not in ("peak_memory_gib", "fits")}
    result = plan(raw, space=space, top=8, workers=1, progress=None)
    assert result["candidates"]["shared_with_zero_twin"] > 0
    for e in result["ranked"]:
        layout = next(x for x in enumerate_layouts(s, parse_space(space, s)).valid if x.label() == e["layout"])
        row = evaluate(Task(raw, ".", "s", layout.overrides()))
        assert (e["step_time_s"], e["memory_gib_per_gpu"], e["fits"], e["bubble_fraction"]) == \
            (row["step_time_s"], row["peak_memory_gib"], row["fits"], row["bubble_fraction"])


def test_layer_counts_without_equal_ends_take_megatrons_unequal_split():
    """61 layers (DeepSeek-V3's count) on 8 stages: no equal first/last split exists (61 - 2f is odd),
    so the planner lays them out as ``stepsim validate`` does: 7 first, 6 last, 8 on each other."""
    model = dict(LLAMA_8B, num_hidden_layers=61, hidden_size=1024, intermediate_size=4096,
                 num_attention_heads=8, num_key_value_heads=8)
    s = scenario_from_dict(_scenario(model, 8, 64, 1024, {"tp": 1, "pp": 8}))
    enum = enumerate_layouts(s, parse_space(["tp=1", "pp=4,8", "cp=1", "vp=1", "micro_batch_size=1",
                                             "recompute=none", "zero_stage=1"], s))
    by_pp = {layout.pp: layout for layout in enum.valid}
    assert set(by_pp) == {4, 8}, enum.pruned_rules
    assert (by_pp[8].first_pipeline_num_layers, by_pp[8].last_pipeline_num_layers) == (7, 6)
    assert 7 + 6 + 6 * 8 == 61
    # 4 stages: 61 - 2f is odd for every f, so again unequal: 15 first, 16 on the two middle, 14 last
    assert (by_pp[4].first_pipeline_num_layers, by_pp[4].last_pipeline_num_layers) == (15, 14)
    assert simulate(candidate_scenario(s, by_pp[8])).step_time_s > 0


@pytest.mark.parametrize("zero", [0, 1, 2])
@pytest.mark.parametrize("pp, vp, schedule", [(1, 1, "1f1b"), (2, 1, "1f1b"), (2, 2, "interleaved")])
@pytest.mark.parametrize("network_gbps", [400, 25])
def test_schedule_walk_bound_stays_below_the_step_and_binds_on_a_slow_network(zero, pp, vp, schedule, network_gbps):
    """``bound.schedule_walk_bound`` (each rank's schedule at least compute, pipeline transfers
    between stages, and the data-parallel stream's collectives one after another, each enqueued no
    earlier than the walk allows) never exceeds the simulated step; on a 25 Gb/s network, where the
    reductions dominate, it is above every other term of the bound and more than half the step."""
    from simulator.studies.bound import blocking_tp_s, schedule_walk_bound, step_compute

    s = load_scenario("scenarios/tiny.yaml", [
        "cluster.num_nodes=4", "training.global_batch_size=32", f"parallelism.dp={16 // pp}",
        f"parallelism.zero_stage={zero}", f"parallelism.pp={pp}", f"parallelism.vp={vp}", f"schedule={schedule}",
        f"cluster.network_bandwidth_Gbps={network_gbps}"])
    b = planner._Bounds(s)
    w = build_workload(s, b.gpu)
    blocking = blocking_tp_s(s, w, b.collective_time)
    fwd, bwd = step_compute(s, w, blocking, b.collective_time, b.group_time, b.gpu.num_sms)
    walk = schedule_walk_bound(s, w, fwd, bwd, b.group_time)
    step = simulate(s).step_time_s
    exact = step_lower_bound(s, w, b.collective_time, b.group_time, b.gpu.num_sms)
    assert 0 < walk <= step
    if network_gbps == 25:
        assert walk > exact and walk > 0.5 * step


@pytest.mark.parametrize("pp, vp, schedule", [(2, 1, "1f1b"), (4, 1, "1f1b"), (2, 2, "interleaved")])
def test_schedule_walk_bound_counts_the_pipeline_transfers(pp, vp, schedule):
    """Each hop between stages takes at least one pair's send alone (``schedule_walk_bound``'s
    ``hop``): the walk with the activations' bytes is above the same walk with none, and still
    below the simulated step (a hop once passed the pair in the wrong shape and timed nothing)."""
    from simulator.studies.bound import blocking_tp_s, schedule_walk_bound, step_compute

    s = load_scenario("scenarios/tiny.yaml", [
        "cluster.num_nodes=4", "training.global_batch_size=32", f"parallelism.dp={32 // (pp * 2)}",
        f"parallelism.pp={pp}", f"parallelism.vp={vp}", f"schedule={schedule}", "cluster.network_bandwidth_Gbps=25"])
    b = planner._Bounds(s)
    w = build_workload(s, b.gpu)
    blocking = blocking_tp_s(s, w, b.collective_time)
    fwd, bwd = step_compute(s, w, blocking, b.collective_time, b.group_time, b.gpu.num_sms)
    walk = schedule_walk_bound(s, w, fwd, bwd, b.group_time)
    assert w.pp_bytes > 0
    assert schedule_walk_bound(s, replace(w, pp_bytes=0.0), fwd, bwd, b.group_time) < walk <= simulate(s).step_time_s


def test_stopped_simulations_are_sound_and_rerun_when_a_resumed_plan_needs_more(tmp_path):
    """A candidate whose simulation the planner stopped (its step provably above the cutoff that
    keeps it out of the result) logs no step, the cutoff and the bound it stopped on, which is
    above the cutoff and at most the step a full simulation gives; a plan resumed from that log
    with a wider result (--top 3) reruns those layouts and answers as a fresh plan does."""
    space = ["tp=2,4", "pp=1,2", "micro_batch_size=1", "recompute=none", "zero_stage=1"]
    first = plan("scenarios/tiny.yaml", space=space, top=1, out=tmp_path, workers=1, progress=None)
    assert first["candidates"]["stopped_early"] >= 1
    rows = [json.loads(line) for line in (tmp_path / "plan.jsonl").read_text().splitlines()]
    stopped = [r for r in rows if r.get("step_at_least_s") is not None]
    assert len(stopped) == first["candidates"]["stopped_early"]
    s = load_scenario("scenarios/tiny.yaml")
    base = layout_of(s)
    for row in stopped:
        layout = replace(base, **{k: v for k, v in row["layout"].items() if hasattr(base, k)})
        full = simulate(candidate_scenario(s, layout)).step_time_s
        assert row["step_time_s"] is None and row["error"] is None
        assert row["stopped_above_s"] < row["step_at_least_s"] <= full
        assert full > first["best"]["step_time_s"]
    again = plan("scenarios/tiny.yaml", space=space, top=3, prove=3, out=tmp_path, workers=1, progress=None)
    fresh = plan("scenarios/tiny.yaml", space=space, top=3, prove=3, out=tmp_path / "fresh", workers=1,
                 progress=None)
    assert json.dumps(again, sort_keys=True) == json.dumps(fresh, sort_keys=True)
    assert len(again["ranked"]) == again["candidates"]["simulated"] - again["candidates"]["stopped_early"]


# tiny on two nodes with a large batch: about 10 simulations of a few tenths of a second each
KILL_SPACE = ["--set", "training.global_batch_size=2048", "--set", "cluster.num_nodes=2", "--set", "parallelism.dp=4"]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads worker processes from Linux /proc")
def test_kill_9_of_a_plan_kills_its_workers_and_the_rerun_reuses_its_log(tmp_path):
    """slow (about 20 s): a real plan killed with SIGKILL once it has logged a simulation; its pool
    workers must die with it (parent-death signal), and the rerun reuses every logged row."""
    out = tmp_path / "plan"
    argv = [sys.executable, "-m", "simulator", "plan", "scenarios/tiny.yaml", "--out", str(out), "--workers", "2",
            "--quiet", "--json", *KILL_SPACE]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    log = out / "plan.jsonl"
    workers = []
    try:
        wait_for_lines(proc, log, 2, 120)
        assert proc.poll() is None, "the plan finished before it could be killed; widen its space"
        workers = live_children(proc.pid)
        assert len(workers) == 2, "the plan simulates in two pool workers"
        survivors = kill_9(proc, workers)
        assert not survivors, f"pool workers {survivors} outlived the killed plan"
    finally:
        kill_all(workers)
    logged = [json.loads(line) for line in log.read_text().splitlines() if line.strip().endswith("}")]
    assert logged, "the killed plan had logged simulations"
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = {r["point_id"]: r for r in map(json.loads, log.read_text().splitlines())}
    result = json.loads(done.stdout)
    assert len(rows) == result["candidates"]["simulated"] + (0 if result["given"]["in_space"] else 1)
    for row in logged:  # the rows logged before the kill are reused as they were, not simulated again
        assert rows[row["point_id"]] == row


def test_a_scenario_with_recompute_modules_plans_every_recompute():
    """A base scenario whose selective recompute names its modules (``training.recompute_modules``,
    as ``validate`` writes for Megatron-Bridge's DeepSeek-V3 rows) plans recompute none and full
    too: the modules go with selective only (the scenario checks refuse them otherwise), and the
    planner's fast scenario is still ``apply_layout``'s."""
    s = load_scenario("scenarios/tiny.yaml", ["training.recompute=selective", "training.recompute_modules=[mlp]"])
    space = ["tp=2", "pp=1", "cp=1", "vp=1", "schedule=1f1b", "sequence_parallel=false", "micro_batch_size=1",
             "recompute=none,selective,full", "zero_stage=1"]
    enum = enumerate_layouts(s, parse_space(space, s))
    assert sorted(x.recompute for x in enum.valid) == ["full", "none", "selective"], enum.pruned_rules
    for layout in enum.valid:
        fast = candidate_scenario(s, layout)
        assert fast == apply_layout(s, layout)
        assert fast.training.recompute_modules == (("mlp",) if layout.recompute == "selective" else None)
    result = plan(scenario_to_dict(s), space=space, workers=1, progress=None)
    assert result["candidates"]["simulated"] >= 1


def test_a_published_uneven_pipeline_split_is_a_candidate_beside_the_rule_split():
    """A scenario that sets its own first/last stage layers (as validate does from a Megatron-core
    pipeline layout) has that split among the candidates at its pp and vp, beside the rule's
    split, so the given layout ranks as a candidate; other pp keep the rule's split only."""
    model = dict(LLAMA_8B, num_hidden_layers=61, hidden_size=1024, intermediate_size=4096,
                 num_attention_heads=8, num_key_value_heads=8)
    raw = _scenario(model, 8, 64, 1024, {"tp": 1, "pp": 8, "dp": 8, "zero_stage": 1})
    raw["parallelism"].update(first_pipeline_num_layers=4, last_pipeline_num_layers=9)
    s = scenario_from_dict(raw)
    space = ["tp=1", "pp=4,8", "cp=1", "vp=1", "micro_batch_size=1", "recompute=none", "zero_stage=1"]
    enum = enumerate_layouts(s, parse_space(space, s))
    ends = sorted((x.pp, x.first_pipeline_num_layers, x.last_pipeline_num_layers) for x in enum.valid)
    assert ends == [(4, 15, 14), (8, 4, 9), (8, 7, 6)], enum.pruned_rules
    assert layout_of(s) in enum.valid
    assert "ends4/9" in layout_of(s).label() and "ends7/6" in next(
        x for x in enum.valid if x.first_pipeline_num_layers == 7).label()
    result = plan(raw, space=space, workers=1, progress=None)
    assert result["given"]["in_space"]


def test_plan_check_table_says_why_the_best_is_slower_than_the_published_layout():
    """A published run whose best is slower than its published layout (gain < 0) is not printed as
    'the published layout is the best': the row names the memory it needs when it does not fit the
    memory model, or that it was not in the planned space."""
    from simulator.studies.plan_check import format_check

    base = dict(given="TP1 PP1 DP64 mbs2 Z3", best="TP1 PP1 DP64 mbs2 Z3 rc-full", given_rank=1, given_rank_exact=True,
                beats="")
    rows = [dict(base, id="oom", gain=-0.2, given_fits=False, given_memory_gib=144.7),
            dict(base, id="outside", gain=-0.03, given_fits=True, given_memory_gib=60.0),
            dict(base, id="same", gain=0.0, given_fits=True, given_memory_gib=60.0)]
    summary = dict(planned=3, cases=3, best_fits=3, no_slower=1, given_in_top5=3, planner_wins=0, given_fits=2)
    lines = format_check({"rows": rows, "summary": summary}).splitlines()
    oom, outside, same = (next(x for x in lines if x.startswith(k)) for k in ("oom", "outside", "same"))
    assert "needs 144.7 GiB" in oom and "(OOM)" in oom and "-20.0%" in oom
    assert "not in the planned space" in outside and "-3.0%" in outside
    assert "(published layout is the best)" in same


def test_link_seconds_add_and_scale_as_the_dense_arrays_do():
    """``bound.LinkSeconds`` keeps only busy links; sums over different link sets, scalings and the
    busiest link equal the dense arrays' to the last bit, and zero plus a load is the load."""
    import numpy as np

    from simulator.studies.bound import LinkSeconds

    rng = np.random.default_rng(7)
    a, b = rng.random(400), rng.random(400)
    a[rng.random(400) < 0.7] = 0.0
    b[rng.random(400) < 0.6] = 0.0
    dense = 0.0 + 3 * (2 * a + b) + 5 * b
    sparse = 0.0 + 3 * (2 * LinkSeconds.of(a) + LinkSeconds.of(b)) + 5 * LinkSeconds.of(b)
    back = np.zeros(400)
    back[sparse.links] = sparse.seconds
    assert np.array_equal(back, dense)
    assert sparse.max() == float(dense.max())
    assert LinkSeconds.of(np.zeros(5)).max() == 0.0


def test_a_framework_that_refuses_zero_2_or_3_under_a_pipeline_gets_no_such_layout():
    """DeepSpeed's pipeline engine asserts ZeRO stage 0 or 1 (profile pipeline.max_zero_stage): a
    scenario asking for more is a one-line error, and the planner prunes those layouts by that rule
    instead of ranking them first (it did: TP4 PP4 Z2 came out best for DeepSpeed)."""
    s = load_scenario("scenarios/llama3-70b-64xh100.yaml", ["framework=deepspeed"])
    from simulator.layout.rules import validate_plan

    with pytest.raises(ConfigError) as err:
        validate_plan(load_scenario("scenarios/llama3-70b-64xh100.yaml",
                                    ["framework=deepspeed", "parallelism.zero_stage=2"]))
    assert "deepspeed runs ZeRO stage 1 at most under pipeline parallelism (pp 4)" in str(err.value)
    values = parse_space(["tp=4,8", "pp=1,2,4", "zero_stage=1,2,3"], s)
    enum = enumerate_layouts(s, values)
    assert enum.valid and all(x.zero_stage <= 1 for x in enum.valid if x.pp > 1)
    assert any(x.zero_stage == 3 for x in enum.valid if x.pp == 1)  # without a pipeline all stages run
    assert any("at most under pipeline parallelism" in reason for reason in enum.pruned_rules)
    megatron = enumerate_layouts(load_scenario("scenarios/llama3-70b-64xh100.yaml"), values)
    assert any(x.zero_stage == 2 for x in megatron.valid if x.pp > 1)  # Megatron-core has no such rule


def test_nanotron_has_zero_1_at_most_with_or_without_a_pipeline():
    """nanotron builds its ZeRO-1 optimizer for any zero_stage > 0 (profile data_parallel.max_zero_stage):
    stage 2 or 3 is a one-line error and no planned layout has it; stage 1 runs."""
    from simulator.layout.rules import validate_plan

    def nanotron(*sets):
        return load_scenario("scenarios/llama3-70b-64xh100.yaml", ["framework=nanotron", *sets])

    with pytest.raises(ConfigError, match="nanotron runs ZeRO stage 1 at most: valid: 0, 1"):
        validate_plan(nanotron("parallelism.zero_stage=3", "parallelism.pp=1", "parallelism.vp=1",
                               "parallelism.dp=16"))
    validate_plan(nanotron("parallelism.zero_stage=1"))
    s = nanotron()
    enum = enumerate_layouts(s, parse_space(["tp=4,8", "pp=1,2", "zero_stage=0,1,2,3"], s))
    assert enum.valid and max(x.zero_stage for x in enum.valid) == 1
