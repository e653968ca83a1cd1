"""Pipeline schedules: exact orders on tiny pipelines, closed-form bubbles, properties elsewhere.

Timing uses a dependency-driven evaluator defined here rather than the simpy engine: each rank
runs its steps in order, a step starting when its rank is free and the step it depends on has
finished, with free communication. Times are ``Fraction``s, so closed forms are checked exactly.
"""

from collections import Counter
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.errors import ConfigError
from simulator.step.schedules import (
    SCHEDULES,
    Step,
    check_schedule_args,
    gpipe,
    interleaved_1f1b,
    one_f_one_b,
    virtual_stage,
)

STAGES = [1, 2, 3, 4, 8]
MICROBATCHES = [1, 2, 4, 8, 16, 64]
CHUNKS = [2, 3, 4]


def steps(text):
    """``"F01 B10"`` -> (F of micro-batch 0 on chunk 1, B of micro-batch 1 on chunk 0)."""
    return tuple(Step(t[0], int(t[1]), int(t[2])) for t in text.split())


def programs(name, stages, microbatches, chunks=1):
    return [SCHEDULES[name](s, stages, microbatches, chunks) for s in range(stages)]


def simulate(progs, chunks, f, b):
    """Step time and per-rank busy time of ``progs`` with forward time f and backward time b."""
    stages = len(progs)
    last = stages * chunks - 1
    finish = {}
    free = [Fraction(0)] * stages
    nxt = [0] * stages
    progressed = True
    while progressed:
        progressed = False
        for rank, prog in enumerate(progs):
            while nxt[rank] < len(prog):
                step = prog[nxt[rank]]
                vs = virtual_stage(rank, stages, step.chunk)
                if step.kind == "F":
                    dep = ("F", step.microbatch, vs - 1) if vs > 0 else None
                    duration = f
                else:
                    dep = ("B", step.microbatch, vs + 1)
                    if vs == last:
                        dep = ("F", step.microbatch, vs)
                    duration = b
                if dep is not None and dep not in finish:
                    break
                start = max(free[rank], finish[dep]) if dep is not None else free[rank]
                free[rank] = start + duration
                finish[(step.kind, step.microbatch, vs)] = free[rank]
                nxt[rank] += 1
                progressed = True
    stuck = {r: progs[r][nxt[r]] for r in range(stages) if nxt[r] < len(progs[r])}
    assert not stuck, f"deadlock, next steps per rank: {stuck}"
    busy = [sum(f if s.kind == "F" else b for s in prog) for prog in progs]
    return max(free), busy


def max_in_flight(prog):
    live, peak = set(), 0
    for step in prog:
        key = (step.microbatch, step.chunk)
        if step.kind == "F":
            live.add(key)
            peak = max(peak, len(live))
        else:
            live.remove(key)
    return peak


def grid():
    for name in ("gpipe", "1f1b"):
        for p in STAGES:
            for m in MICROBATCHES:
                yield name, p, m, 1
    for p in STAGES:
        for m in MICROBATCHES:
            if m % p == 0:
                for v in CHUNKS:
                    yield "interleaved", p, m, v


GRID = list(grid())


def test_tiny_1f1b_order():
    assert one_f_one_b(0, 2, 3) == steps("F00 F10 B00 F20 B10 B20")
    assert one_f_one_b(1, 2, 3) == steps("F00 B00 F10 B10 F20 B20")
    assert one_f_one_b(0, 4, 2) == steps("F00 F10 B00 B10")


def test_tiny_gpipe_order():
    assert gpipe(1, 2, 2) == steps("F00 F10 B00 B10")


def test_tiny_interleaved_order():
    """p = 2, v = 2, m = 4, derived by hand from Megatron-LM's warm-up and chunk formulas."""
    assert interleaved_1f1b(0, 2, 4, 2) == steps(
        "F00 F10 F01 F11 F20 B01 F30 B11 F21 B00 F31 B10 B21 B31 B20 B30"
    )
    assert interleaved_1f1b(1, 2, 4, 2) == steps(
        "F00 F10 F01 B01 F11 B11 F20 B00 F30 B10 F21 B21 F31 B31 B20 B30"
    )


def test_virtual_stage_follows_megatron_layer_assignment():
    assert [virtual_stage(1, 4, c) for c in range(3)] == [1, 5, 9]


def test_registry_names():
    assert SCHEDULES == {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved": interleaved_1f1b}


@pytest.mark.parametrize("name, p, m, v", GRID)
def test_each_step_once_and_forward_before_backward(name, p, m, v):
    expected = {(mb, c) for mb in range(m) for c in range(v)}
    for prog in programs(name, p, m, v):
        for kind in "FB":
            counts = Counter((s.microbatch, s.chunk) for s in prog if s.kind == kind)
            assert set(counts) == expected and set(counts.values()) == {1}
        position = {(s.kind, s.microbatch, s.chunk): i for i, s in enumerate(prog)}
        assert all(position[("F", *key)] < position[("B", *key)] for key in expected)


@pytest.mark.parametrize("name, p, m, v", GRID)
def test_no_deadlock(name, p, m, v):
    simulate(programs(name, p, m, v), v, Fraction(1), Fraction(2))


@pytest.mark.parametrize("f, b", [(1, 1), (1, 2), (3, 1)])
@pytest.mark.parametrize("m", MICROBATCHES)
@pytest.mark.parametrize("p", STAGES)
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_step_time_and_bubble_closed_form(name, p, m, f, b):
    """(m + p - 1)(f + b) and bubble (p - 1)/(m + p - 1) on every stage (Narayanan et al. 2021)."""
    step, busy = simulate(programs(name, p, m), 1, Fraction(f), Fraction(b))
    assert step == (m + p - 1) * (f + b)
    for rank_busy in busy:
        assert (step - rank_busy) / step == Fraction(p - 1, m + p - 1)


@pytest.mark.parametrize("f, b", [(1, 1), (1, 2), (3, 1)])
@pytest.mark.parametrize("v", CHUNKS)
@pytest.mark.parametrize("p, m", [(p, m) for p in (2, 4, 8) for m in (4, 16, 64) if m % p == 0])
def test_interleaved_step_time_and_bubble_closed_form(p, m, v, f, b):
    """(m + (p - 1)/v)(f + b) and bubble (p - 1)/(v m + p - 1) with per-chunk times f/v, b/v."""
    step, busy = simulate(programs("interleaved", p, m, v), v, Fraction(f, v), Fraction(b, v))
    assert step == (m + Fraction(p - 1, v)) * (f + b)
    for rank_busy in busy:
        assert (step - rank_busy) / step == Fraction(p - 1, v * m + p - 1)


@given(
    name=st.sampled_from(sorted(SCHEDULES)),
    p=st.integers(1, 8),
    groups=st.integers(1, 6),
    v=st.integers(1, 4),
    f=st.integers(1, 5),
    b=st.integers(1, 5),
)
def test_closed_form_holds_for_any_uniform_times(name, p, groups, v, f, b):
    if name != "interleaved":
        v = 1
    m = groups * p if name == "interleaved" else groups
    step, _ = simulate(programs(name, p, m, v), v, Fraction(f, v), Fraction(b, v))
    assert step == (m + Fraction(p - 1, v)) * (f + b)


@pytest.mark.parametrize("m", MICROBATCHES)
@pytest.mark.parametrize("p", STAGES)
def test_activations_in_flight(p, m):
    """1F1B keeps at most p - s micro-batches on stage s; GPipe keeps all m."""
    for s in range(p):
        assert max_in_flight(one_f_one_b(s, p, m)) == min(p - s, m)
        assert max_in_flight(gpipe(s, p, m)) == m


@pytest.mark.parametrize("m", MICROBATCHES)
@pytest.mark.parametrize("p", STAGES)
def test_interleaved_with_one_chunk_is_1f1b(p, m):
    assert programs("interleaved", p, m, 1) == programs("1f1b", p, m)


@pytest.mark.parametrize(
    "args, field",
    [
        (("pipedream", 4, 8, 1), "schedule"),
        (("1f1b", 0, 8, 1), "parallelism.pp"),
        (("1f1b", 4, 8, 0), "parallelism.vp"),
        (("gpipe", 4, 0, 1), "training.global_batch_size"),
        (("1f1b", 4, 8, 2), "parallelism.vp"),
        (("gpipe", 4, 8, 2), "parallelism.vp"),
        (("interleaved", 4, 6, 2), "training.global_batch_size"),
    ],
)
def test_check_schedule_args_errors(args, field):
    with pytest.raises(ConfigError) as err:
        check_schedule_args(*args)
    assert err.value.field == field
    assert "\n" not in str(err.value)


def test_check_schedule_args_messages():
    with pytest.raises(ConfigError, match="choose one of gpipe, 1f1b, interleaved"):
        check_schedule_args("pipedream", 4, 8, 1)
    with pytest.raises(ConfigError, match=r"6 micro-batches.*multiple of pp \(4\)"):
        check_schedule_args("interleaved", 4, 6, 2)


@pytest.mark.parametrize(
    "args",
    [("gpipe", 3, 5, 1), ("1f1b", 8, 1, 1), ("interleaved", 4, 8, 3), ("interleaved", 4, 6, 1)],
)
def test_check_schedule_args_accepts_valid(args):
    check_schedule_args(*args)


def test_schedule_functions_validate():
    with pytest.raises(ConfigError):
        one_f_one_b(0, 4, 8, 2)
    with pytest.raises(ConfigError):
        interleaved_1f1b(0, 4, 6, 2)
    with pytest.raises(ValueError, match="outside"):
        gpipe(4, 4, 8)
