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

from simulator.common.errors import ConfigError
from simulator.layout.schedules import (
    SCHEDULES,
    Placement,
    Step,
    check_schedule_args,
    depends_on,
    dualpipe,
    dualpipev,
    gpipe,
    interleaved_1f1b,
    one_f_one_b,
    peak_in_flight,
    placement,
    virtual_stage,
    zb_h1,
    zb_h2,
    zb_v,
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
    assert SCHEDULES == {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved": interleaved_1f1b,
                         "zb-h1": zb_h1, "zb-h2": zb_h2, "zb-v": zb_v, "dualpipe": dualpipe,
                         "dualpipev": dualpipev}


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
    name=st.sampled_from(["gpipe", "1f1b", "interleaved"]),
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
        (("zb-v", 4, 8, 1), "parallelism.vp"),
        (("dualpipev", 4, 8, 3), "parallelism.vp"),
        (("dualpipe", 4, 8, 2), "parallelism.vp"),
        (("zb-h1", 4, 8, 2), "parallelism.vp"),
        (("dualpipe", 3, 8, 1), "parallelism.pp"),
        (("dualpipe", 4, 6, 1), "training.global_batch_size"),
        (("dualpipe", 4, 9, 1), "training.global_batch_size"),
        (("dualpipev", 4, 7, 2), "training.global_batch_size"),
    ],
)
def test_check_schedule_args_errors(args, field):
    with pytest.raises(ConfigError) as err:
        check_schedule_args(*args)
    assert err.value.field == field
    assert "\n" not in str(err.value)


def test_check_schedule_args_messages():
    with pytest.raises(ConfigError, match="choose one of gpipe, 1f1b, interleaved, zb-h1"):
        check_schedule_args("pipedream", 4, 8, 1)
    with pytest.raises(ConfigError, match=r"6 micro-batches.*multiple of pp \(4\)"):
        check_schedule_args("interleaved", 4, 6, 2)


@pytest.mark.parametrize(
    "args",
    [("gpipe", 3, 5, 1), ("1f1b", 8, 1, 1), ("interleaved", 4, 8, 3), ("interleaved", 4, 6, 1),
     ("zb-h1", 4, 3, 1), ("zb-h2", 8, 1, 1), ("zb-v", 4, 2, 2), ("dualpipe", 4, 8, 1), ("dualpipev", 3, 6, 2)],
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


# --- zero bubble and DualPipe: F/B/W steps on placements -----------------------------------------

# (name, vp) as a scenario would set them.
NEW = [("zb-h1", 1), ("zb-h2", 1), ("zb-v", 2), ("dualpipe", 1), ("dualpipev", 2)]


def run(name, p, m, v, f=1, b=1, w=1):
    """Walk every rank's program with F = f, split B = b (input gradient), W = w, unsplit B = b + w.

    Returns (step time, per rank: first start, last end, busy time). Asserts no deadlock.
    """
    place = placement(name, p, v)
    progs = [SCHEDULES[name](s, p, m, v) for s in range(p)]
    f, b, w = Fraction(f), Fraction(b), Fraction(w)
    finish, free, nxt = {}, [Fraction(0)] * p, [0] * p
    first = [None] * p
    progressed = True
    while progressed:
        progressed = False
        for rank, prog in enumerate(progs):
            while nxt[rank] < len(prog):
                step = prog[nxt[rank]]
                dep = depends_on(place, rank, step)
                if dep is not None and dep not in finish:
                    break
                start = max(free[rank], finish[dep]) if dep is not None else free[rank]
                first[rank] = start if first[rank] is None else first[rank]
                duration = {"F": f, "W": w}.get(step.kind, b if step.split else b + w)
                free[rank] = start + duration
                finish[(step.kind, step.microbatch, place.vstage(rank, step.chunk))] = free[rank]
                nxt[rank] += 1
                progressed = True
    stuck = {r: progs[r][nxt[r]] for r in range(p) if nxt[r] < len(progs[r])}
    assert not stuck, f"deadlock, next steps per rank: {stuck}"
    busy = [sum({"F": f, "W": w}.get(s.kind, b if s.split else b + w) for s in prog) for prog in progs]
    return max(free), list(zip(first, free, busy))


def bubble(ranks):
    """The papers' bubble: idle between a rank's first and last step, on the worst rank, and
    that as a fraction of the rank's span (each rank's optimizer step runs when it is done)."""
    worst = max(ranks, key=lambda r: r[1] - r[0] - r[2])
    idle = worst[1] - worst[0] - worst[2]
    return idle, idle / (worst[1] - worst[0])


def new_grid():
    for name, v in NEW:
        for p in (1, 2, 3, 4, 8):
            if name == "dualpipe" and p % 2:
                continue
            for m in (1, 2, 4, 5, 8, 16, 17, 32):
                if name.startswith("dualpipe") and (m < 2 * p or (name == "dualpipe" and m % 2)):
                    continue
                yield name, p, m, v


NEW_GRID = list(new_grid())
PM = [(p, m) for p in (2, 4, 8) for m in (8, 16, 32)]


@pytest.mark.parametrize("name, p, m, v", NEW_GRID)
def test_new_schedules_each_step_once_and_in_order(name, p, m, v):
    """One F and one B per (micro-batch, chunk), a W iff the B is split, F < B < W on the rank."""
    place = placement(name, p, v)
    expected = Counter()
    for mb in range(m):
        for c in range(place.chunks):
            if place.layout != "dual" or place.copy_of(mb, m) == c:
                expected[(mb, c)] = 1
    for rank in range(p):
        prog = SCHEDULES[name](rank, p, m, v)
        at = {(s.kind, s.microbatch, s.chunk): i for i, s in enumerate(prog)}
        assert len(at) == len(prog)
        for kind in "FB":
            assert Counter((s.microbatch, s.chunk) for s in prog if s.kind == kind) == expected
        split = {(s.microbatch, s.chunk) for s in prog if s.kind == "B" and s.split}
        assert {(s.microbatch, s.chunk) for s in prog if s.kind == "W"} == split
        for mb, c in expected:
            assert at[("F", mb, c)] < at[("B", mb, c)] < at.get(("W", mb, c), len(prog))


@pytest.mark.parametrize("name, p, m, v", NEW_GRID)
def test_new_schedules_no_deadlock(name, p, m, v):
    for f, b, w in ((1, 1, 1), (1, 2, 1), (3, 1, 2)):
        run(name, p, m, v, f, b, w)


@given(
    name_v=st.sampled_from(NEW),
    p=st.sampled_from([1, 2, 3, 4, 6, 8]),
    m=st.integers(1, 40),
    times=st.tuples(st.integers(1, 5), st.integers(1, 5), st.integers(1, 5)),
)
def test_new_schedules_property(name_v, p, m, times):
    name, v = name_v
    if name == "dualpipe":
        p, m = p + p % 2, m + m % 2
    if name.startswith("dualpipe"):
        m = max(m, 2 * p)
    step, ranks = run(name, p, m, v, *times)
    work = sum(times) * m * (1 if name == "zb-h1" or name == "zb-h2" else 2) / (1 if name != "dualpipe" else 2)
    assert all(r[2] == work for r in ranks)
    assert step >= work


@pytest.mark.parametrize("p, m", PM)
def test_zb_h1_bubble(p, m):
    """(p - 1)(F + B - W) at F = B = W: a third of 1F1B's (p - 1)(F + B + W) (Qi et al. 3.1)."""
    idle, frac = bubble(run("zb-h1", p, m, 1)[1])
    assert idle == p - 1
    assert abs(frac - Fraction(p - 1, 3 * m + p - 1)) <= Fraction(1, 50)
    _, ranks = run("1f1b", p, m, 1, 1, 2, 0)  # 1F1B: unsplit B of 2 units
    assert bubble(ranks)[0] == 3 * (p - 1)


@pytest.mark.parametrize("p, m", PM)
def test_zb_h2_bubble(p, m):
    """(p - 1)(F + B - 2W) = 0 at F = B = W once m >= 2p - 1 (Qi et al. 3.1)."""
    idle, _ = bubble(run("zb-h2", p, m, 1)[1])
    assert idle == (0 if m >= 2 * p - 1 else p - 1)


def test_tiny_zb_v_order():
    """p = 2, m = 4 (m >= 2p - 1, so nothing is padded): rank 0 warms up with 2p - 1 F0's, then
    (F1 B1) twice, (F0 B0 F1 B1) while forwards remain, B0's; rank 1 F0 (F1 F0) (F1 B1), ...;
    W's where the next F or B is not ready at unit times."""
    def program(s):
        return " ".join(f"{x.kind}{x.microbatch}{x.chunk}" for x in zb_v(s, 2, 4))
    assert program(0) == ("F00 F10 F20 F01 B01 W01 F11 B11 W11 F30 B00 W00 F21 B21 W21 B10 W10 F31 B31 "
                          "B20 W31 B30 W20 W30")
    assert program(1) == ("F00 F01 F10 F11 B01 W01 F20 B00 W00 F21 B11 W11 F30 B10 W10 F31 B21 B20 B31 "
                          "B30 W21 W20 W31 W30")


@pytest.mark.parametrize("p, m", PM + [(3, 5), (4, 7), (8, 15), (8, 12)])
def test_zb_v_bubble(p, m):
    """Zero at F = B = W once m >= 2p - 1 (Qi et al. 2024: ZB-V has no bubble at equal times),
    2p - 1 - m units below that (the F1 of micro-batch 0 reaches rank 0 at 2p - 1)."""
    idle, frac = bubble(run("zb-v", p, m, 2)[1])
    assert idle == max(0, 2 * p - 1 - m)
    if m >= 2 * p:
        assert frac <= Fraction(1, 50)


@pytest.mark.parametrize("times", [(1, 2, 1), (2, 1, 1), (2, 3, 1), (2, 2, 1), (334, 469, 176)])
@pytest.mark.parametrize("p, m", [(2, 8), (4, 16), (8, 32), (4, 7)])
def test_zb_v_bubble_at_other_ratios(p, m, times):
    """With chunk times F, B and W <= min(F, B): 2 (p - 1)(max(F, B) - W), below 1F1B's
    2 (p - 1)(F + B + W) and ZB-H1's 2 (p - 1)(F + B - W) in the same half-stage units."""
    f, b, w = times
    idle, _ = bubble(run("zb-v", p, m, 2, f, b, w)[1])
    assert idle == 2 * (p - 1) * (max(f, b) - w)
    assert idle < bubble(run("zb-h1", p, m, 1, 2 * f, 2 * b, 2 * w)[1])[0]


def dual_closed_form(p_stages, f=1, b=1, w=1):
    """DualPipe README: (PP/2 - 1)(F&B + B - 3W), B the full backward, F&B = F + B here."""
    full = b + w
    return (Fraction(p_stages, 2) - 1) * (f + full + full - 3 * w)


@pytest.mark.parametrize("p, m", [(p, m) for p, m in PM if m >= 2 * p] + [(2, 4), (4, 8), (6, 12), (6, 24)])
def test_dualpipe_bubble(p, m):
    """Measured (PP/2 - 1) F at F = B = W: at most the README's (PP/2 - 1)(F&B + B - 3W) with
    F&B = F + B_full (2 (PP/2 - 1) here); it equals the README's form with F&B = F + B - W."""
    idle, frac = bubble(run("dualpipe", p, m, 1)[1])
    assert idle == Fraction(p, 2) - 1
    assert idle == dual_closed_form(p) / 2 <= dual_closed_form(p)


@pytest.mark.parametrize("p, m", [(p, m) for p, m in PM if m >= 2 * p] + [(2, 4), (3, 6), (4, 8)])
def test_dualpipev_bubble(p, m):
    """As DualPipe with PP = 2p virtual stages: (p - 1) F measured, README's form halved."""
    idle, frac = bubble(run("dualpipev", p, m, 2)[1])
    assert idle == p - 1 == dual_closed_form(2 * p) / 2


@pytest.mark.parametrize("p, m", PM)
def test_peak_in_flight_per_schedule(p, m):
    """1F1B p on stage 0; ZB-H1 p; ZB-H2 2p - 1; ZB-V 2p half-stage chunks (= p stages);
    DualPipe PP + 1 stages; DualPipeV 2p + 1 half-stage chunks (README: PP + 1, PP = 2p)."""
    peaks = {name: [peak_in_flight(SCHEDULES[name](s, p, m, v)) for s in range(p)]
             for name, v in NEW if m >= 2 * p or not name.startswith("dualpipe")}
    assert peak_in_flight(one_f_one_b(0, p, m)) == p
    assert max(peaks["zb-h1"]) == p
    assert max(peaks["zb-h2"]) == min(2 * p - 1, m)
    assert max(peaks["zb-v"]) == min(2 * p, 2 * m)
    if m >= 2 * p:
        assert max(peaks["dualpipe"]) == p + 1
        assert max(peaks["dualpipev"]) == 2 * p + 1


def test_peak_in_flight_split_and_unsplit():
    assert peak_in_flight(steps("F00 F10 B00 B10")) == 2
    split = (Step("F", 0, 0), Step("B", 0, 0, True), Step("F", 1, 0), Step("W", 0, 0))
    assert peak_in_flight(split) == 2


def test_placements():
    inter = placement("interleaved", 4, 2)
    assert [inter.vstage(1, c) for c in (0, 1)] == [1, 5] and inter.locate(5) == (1, 1)
    v = placement("zb-v", 4, 2)
    assert (v.virtual_stages, v.copies) == (8, 1)
    assert [v.vstage(0, c) for c in (0, 1)] == [0, 7] and v.locate(7) == (0, 1) and v.locate(4) == (3, 1)
    dual = placement("dualpipe", 4, 1)
    assert (dual.virtual_stages, dual.copies, dual.chunks) == (4, 2, 2)
    assert dual.vstage(0, 1) == 3 and dual.locate(3, 1) == (0, 1) and dual.locate(3, 0) == (3, 0)
    assert [dual.copy_of(mb, 8) for mb in (0, 3, 4, 7)] == [0, 0, 1, 1]
    assert placement("1f1b", 4) == Placement("interleaved", 4, 1)
    for place in (inter, v, dual):
        for copy in range(place.copies):
            for vs in range(place.virtual_stages):
                stage, chunk = place.locate(vs, copy)
                assert place.vstage(stage, chunk) == vs


def test_dualpipe_follows_the_reference_steps():
    """p = 2, m = 4: rank 0 runs copy 0 (micro-batches 0, 1) forwards, copy 1 (2, 3) backwards."""
    assert [(s.kind, s.microbatch, s.chunk, s.split) for s in dualpipe(0, 2, 4)] == [
        ("F", 0, 0, False), ("F", 2, 1, False),
        ("F", 1, 0, False), ("B", 2, 1, False), ("F", 3, 1, False), ("B", 0, 0, False),
        ("B", 3, 1, False), ("B", 1, 0, True), ("W", 1, 0, False),
    ]
