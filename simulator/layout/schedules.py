"""Pipeline schedules as data: the ordered forward and backward steps of one pipeline rank.

A schedule function returns the steps rank ``stage`` of a ``stages``-deep pipeline runs for
``microbatches`` micro-batches, in order; the engine only walks them. With ``chunks`` model
chunks per rank, chunk ``c`` on rank ``s`` is virtual stage ``c * stages + s`` (Megatron-LM's
layer assignment), so a micro-batch visits every rank once per chunk.

The engine enforces these dependencies between steps, ``L`` being the last virtual stage:

- ``F(mb, vs)`` needs ``F(mb, vs - 1)``: the activations received from the previous stage;
- ``B(mb, vs)`` needs ``B(mb, vs + 1)``: the gradient received from the next stage;
- ``B(mb, L)`` needs ``F(mb, L)``: the loss.

Each rank keeps the order it is given, so a schedule is correct when every rank can always
make progress; ``tests/test_schedules.py`` checks this and the closed-form bubbles.

Zero-bubble and DualPipe schedules add ``W`` steps (split backwards) and other chunk layouts:
``placement(name, stages, chunks)`` says where each chunk sits and ``depends_on`` gives each
step's dependency. Bubble, as the papers count it: idle time between a rank's first and last
step on the worst rank (each rank's optimizer step runs when it is done); bubble fraction =
that idle time / that rank's span. For gpipe, 1f1b and interleaved this equals the idle time
of stage 0 over the whole step.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from simulator.common.errors import ConfigError


@dataclass(frozen=True)
class Step:
    """One pass of a micro-batch through a model chunk on this rank.

    ``kind`` is ``"F"`` (forward), ``"B"`` (backward) or ``"W"`` (weight gradient). A ``"B"``
    with ``split=False`` computes the input and the weight gradients; with ``split=True`` only
    the input gradient, and a later ``Step("W", mb, chunk)`` on the same rank computes that
    (micro-batch, chunk)'s weight gradient (Qi et al. 2024, Section 2).
    """

    kind: str
    microbatch: int
    chunk: int
    split: bool = False


def virtual_stage(stage: int, stages: int, chunk: int) -> int:
    """Position of ``chunk`` on rank ``stage`` in the whole model: ``chunk * stages + stage``.

    Megatron-LM gives rank ``s`` the layer blocks ``s, s + p, s + 2p, ...`` (Narayanan et al.,
    SC21, Section 2.2.2), so with p = 4 and two chunks rank 1 holds virtual stages 1 and 5.
    """
    return chunk * stages + stage


def gpipe(stage: int, stages: int, microbatches: int, chunks: int = 1) -> tuple[Step, ...]:
    """All forwards, then all backwards, both in micro-batch order 0..m-1 (Huang et al. 2019).

    Backwards run first-in first-out, as Megatron-LM's 1F1B does when every micro-batch is in
    warm-up; with equal per-micro-batch times the backward order does not change the step time.
    Every stage keeps all m micro-batches' activations until its first backward.
    """
    check_schedule_args("gpipe", stages, microbatches, chunks)
    _check_stage(stage, stages)
    return tuple(Step("F", mb, 0) for mb in range(microbatches)) + tuple(
        Step("B", mb, 0) for mb in range(microbatches)
    )


def one_f_one_b(stage: int, stages: int, microbatches: int, chunks: int = 1) -> tuple[Step, ...]:
    """PipeDream-Flush 1F1B (Narayanan et al., SC21; Megatron-LM's non-interleaved schedule).

    Warm-up runs ``min(stages - stage - 1, m)`` forwards, the steady state alternates one
    forward and one backward, the cool-down drains the remaining backwards. Stage ``s`` holds at
    most ``stages - s`` micro-batches in flight. With uniform forward time f and backward time b
    per stage and free communication the step takes ``(m + p - 1)(f + b)``: a bubble of
    ``(p - 1) / (m + p - 1)``.
    """
    check_schedule_args("1f1b", stages, microbatches, chunks)
    _check_stage(stage, stages)
    warmup = _warmup(stage, stages, microbatches, 1)
    steps = [Step("F", mb, 0) for mb in range(warmup)]
    for k in range(microbatches - warmup):
        steps += [Step("F", warmup + k, 0), Step("B", k, 0)]
    steps += [Step("B", mb, 0) for mb in range(microbatches - warmup, microbatches)]
    return tuple(steps)


def interleaved_1f1b(stage: int, stages: int, microbatches: int, chunks: int) -> tuple[Step, ...]:
    """Interleaved 1F1B over ``chunks`` model chunks per rank (Narayanan et al., SC21, 2.2.2).

    Reproduces Megatron-LM's ``forward_backward_pipelining_with_interleaving`` with its default
    ``microbatch_group_size_per_vp_stage = pp``: the rank runs ``m * v`` virtual micro-batches.
    The k-th forward is micro-batch ``(k // (p v)) p + k % p`` on chunk ``(k // p) % v``: groups
    of p micro-batches go through chunk 0, then chunk 1, and so on. The k-th backward is the same
    micro-batch on chunk ``v - 1 - (k // p) % v``. Warm-up is ``2 (p - s - 1) + (v - 1) p``
    forwards, capped at ``m v`` (then the whole rank is forwards followed by backwards), then one
    forward and one backward alternate, then the backwards drain.

    With per-chunk times f/v and b/v the step takes ``(m + (p - 1) / v)(f + b)``: a bubble of
    ``(p - 1) / (v m + p - 1)``. Megatron requires m to be a multiple of p. With one chunk this is
    ``one_f_one_b``, as in Megatron-LM, which runs the non-interleaved schedule when there is no
    virtual pipeline; the interleaved warm-up formula would give 1F1B the ``2 (p - s - 1)``
    warm-up instead, keeping more activations for the same step time.
    """
    check_schedule_args("interleaved", stages, microbatches, chunks)
    _check_stage(stage, stages)
    if chunks == 1:
        return one_f_one_b(stage, stages, microbatches)
    total = microbatches * chunks
    warmup = _warmup(stage, stages, microbatches, chunks)

    def forward(k: int) -> Step:
        return Step("F", _interleaved_microbatch(k, stages, chunks), (k // stages) % chunks)

    def backward(k: int) -> Step:
        chunk = chunks - 1 - (k // stages) % chunks
        return Step("B", _interleaved_microbatch(k, stages, chunks), chunk)

    steps = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        steps += [forward(warmup + k), backward(k)]
    steps += [backward(k) for k in range(total - warmup, total)]
    return tuple(steps)


def _warmup(stage: int, stages: int, microbatches: int, chunks: int) -> int:
    """Forwards rank ``stage`` runs before its first backward: 1F1B's ``min(p - s - 1, m)`` with one
    chunk, interleaved 1F1B's ``min(2 (p - s - 1) + (v - 1) p, m v)`` with ``chunks`` = v > 1."""
    if chunks == 1:
        return min(stages - stage - 1, microbatches)
    return min(2 * (stages - stage - 1) + (chunks - 1) * stages, microbatches * chunks)


def _interleaved_microbatch(k: int, stages: int, chunks: int) -> int:
    return (k // (stages * chunks)) * stages + k % stages


# --- placements ----------------------------------------------------------------------------------

LAYOUTS = ("interleaved", "v", "dual")


@dataclass(frozen=True)
class Placement:
    """Where each model chunk sits: ``chunks`` chunks on each of ``stages`` ranks.

    ``layout`` is one of:

    - ``"interleaved"`` (gpipe, 1f1b, interleaved, zb-h1, zb-h2): chunk c on rank s is virtual
      stage ``c * stages + s`` (Megatron-LM); with one chunk, virtual stage = rank.
    - ``"v"`` (zb-v, dualpipev): two chunks per rank, chunk 0 on rank s is virtual stage s and
      chunk 1 is ``2 p - 1 - s``, so the last virtual stage (the loss) is on rank 0.
    - ``"dual"`` (dualpipe): two model copies of p virtual stages each; chunk c on a rank holds
      copy c; copy 0 puts virtual stage s on rank s, copy 1 puts it on rank p - 1 - s. Micro-batches
      ``0 .. m/2 - 1`` run through copy 0, ``m/2 .. m - 1`` through copy 1 (global ids).

    Dependencies (``depends_on``): F(mb, vs) needs F(mb, vs - 1) of the same copy; B(mb, vs) needs
    B(mb, vs + 1), and on the last virtual stage F(mb, last) (the loss); W(mb, vs) needs
    B(mb, vs) on the same rank.
    """

    layout: str
    stages: int
    chunks: int

    @property
    def virtual_stages(self) -> int:
        """Virtual stages of one model copy."""
        if self.layout == "dual":
            return self.stages
        return self.stages * self.chunks

    @property
    def copies(self) -> int:
        """Model copies held across the pipeline: 2 for DualPipe (2x parameters), else 1."""
        return 2 if self.layout == "dual" else 1

    def vstage(self, stage: int, chunk: int) -> int:
        """Virtual stage (within its copy) of ``chunk`` on rank ``stage``."""
        p = self.stages
        if self.layout == "v":
            return stage if chunk == 0 else 2 * p - 1 - stage
        if self.layout == "dual":
            return stage if chunk == 0 else p - 1 - stage
        return chunk * p + stage

    def locate(self, vstage: int, copy: int = 0) -> tuple[int, int]:
        """(rank, chunk) holding virtual stage ``vstage`` of model copy ``copy``."""
        p = self.stages
        if not 0 <= vstage < self.virtual_stages or not 0 <= copy < self.copies:
            raise ValueError(f"no virtual stage {vstage} of copy {copy} in {self}")
        if self.layout == "v":
            return (vstage, 0) if vstage < p else (2 * p - 1 - vstage, 1)
        if self.layout == "dual":
            return (vstage, 0) if copy == 0 else (p - 1 - vstage, 1)
        return vstage % p, vstage // p

    def copy_of(self, microbatch: int, microbatches: int) -> int:
        """Model copy micro-batch ``microbatch`` of ``microbatches`` runs through."""
        if self.layout == "dual":
            return 0 if microbatch < microbatches // 2 else 1
        return 0


@functools.lru_cache(maxsize=1024)
def placement(name: str, stages: int, chunks: int = 1) -> Placement:
    """The placement schedule ``name`` runs with ``stages`` ranks and ``chunks`` = parallelism.vp
    (cached: a frozen value, asked for per stage by the memory model and the engine)."""
    check_schedule_args(name, stages, 1 << 30, chunks, _microbatches_checked=False)
    if name in ("zb-v", "dualpipev"):
        return Placement("v", stages, 2)
    if name == "dualpipe":
        return Placement("dual", stages, 2)
    return Placement("interleaved", stages, chunks)


def depends_on(place: Placement, stage: int, step: Step) -> tuple[str, int, int] | None:
    """The step ``step`` on rank ``stage`` waits for, as (kind, microbatch, virtual stage).

    The micro-batch id fixes the model copy, so the key is unique; None for a first forward.
    """
    vs = place.vstage(stage, step.chunk)
    if step.kind == "F":
        return ("F", step.microbatch, vs - 1) if vs > 0 else None
    if step.kind == "B":
        if vs == place.virtual_stages - 1:
            return ("F", step.microbatch, vs)
        return ("B", step.microbatch, vs + 1)
    return ("B", step.microbatch, vs)


def schedule_peak_in_flight(name: str, stage: int, stages: int, microbatches: int, chunks: int = 1) -> int:
    """``peak_in_flight`` of the program ``SCHEDULES[name]`` gives rank ``stage``, without building it
    where its shape says it: GPipe runs every forward first (m); 1F1B and interleaved 1F1B run
    their warm-up (``_warmup``), then alternate one forward and one backward, so one more than the
    warm-up, at most all m v. The other schedules are walked."""
    check_schedule_args(name, stages, microbatches, chunks)
    if name in ("gpipe", "1f1b", "interleaved"):
        _check_stage(stage, stages)
        if name == "gpipe":
            return microbatches
        v = chunks if name == "interleaved" else 1
        return min(_warmup(stage, stages, microbatches, v) + 1, microbatches * v)
    return peak_in_flight(schedule(name, stage, stages, microbatches, chunks))


def peak_in_flight(steps: tuple[Step, ...] | list[Step]) -> int:
    """Most (micro-batch, chunk) activations alive at once on a rank running ``steps``.

    An activation is alive from its F until its W, or until its B when the B is not split
    (Qi et al. 2024, Section 2: W still needs the stored inputs).
    """
    live = peak = 0
    for step in steps:
        if step.kind == "F":
            live += 1
            peak = max(peak, live)
        elif step.kind == "W" or not step.split:
            live -= 1
    return peak


# --- zero bubble (Qi et al.) -----------------------------------------------------------------------


def zb_h1(stage: int, stages: int, microbatches: int, chunks: int = 1) -> tuple[Step, ...]:
    """ZB-H1 (Qi et al., ICLR 2024, "Zero Bubble Pipeline Parallelism", Section 3.1, Figure 3).

    B is split into B (input gradient) and W (weight gradient). Each rank keeps 1F1B's order of
    F and B (warm-up ``p - s - 1`` forwards), and a W runs whenever the next F or B cannot start:
    it waits for its input, or an F would exceed p activations alive (1F1B's peak). The W's are
    placed by walking the pipeline at unit F = B = W times (``_fill_weights``).

    Bubble (idle between a rank's first and last step, on the worst rank) with times F, B, W:
    ``(p - 1)(F + B - W)``, a third of 1F1B's ``(p - 1)(F + B + W)`` at equal times, for m >= p.
    Memory: at most p micro-batches' activations on every rank (1F1B's stage-0 peak).
    """
    check_schedule_args("zb-h1", stages, microbatches, chunks)
    _check_stage(stage, stages)
    return _zb_line(stages, microbatches, stages, 1)[stage]


def zb_h2(stage: int, stages: int, microbatches: int, chunks: int = 1) -> tuple[Step, ...]:
    """ZB-H2 (Qi et al., ICLR 2024, Section 3.1, Figure 3 bottom).

    As ZB-H1 with ``2 (p - s - 1)`` warm-up forwards and room for ``2p - 1`` activations: the
    extra forwards fill the warm-up bubble and the trailing W's fill the cool-down, turning the
    trapezoid into a parallelogram. Bubble ``(p - 1)(F + B - 2W)``: zero at equal times for
    m >= 2p - 1, measured between each rank's first and last step (the paper drops the
    optimizer's synchronisation with its post-validation, Section 4). Memory: 2p - 1 activations.
    """
    check_schedule_args("zb-h2", stages, microbatches, chunks)
    _check_stage(stage, stages)
    return _zb_line(stages, microbatches, 2 * stages - 1, 2)[stage]


def zb_v(stage: int, stages: int, microbatches: int, chunks: int = 2) -> tuple[Step, ...]:
    """ZB-V (Qi et al., "Pipeline Parallelism with Controllable Memory", NeurIPS 2024, and arXiv
    2401.10241v2 Section 6): two chunks per rank in a V (``Placement`` layout ``"v"``), rank s
    holding virtual stages s (chunk 0) and 2p - 1 - s (chunk 1), so the loss is on rank 0.

    The paper builds it from one micro-batch's passes (F down the V and back up, the input
    gradients B retracing it, each W after its B) repeated every six units at F = B = W. Derived
    here from the V's dependencies at unit times, that gives rank s this F and B order
    (``_v_order``):

    - warm-up: ``2 (p - s) - 1`` F of chunk 0, ``s`` x (F1 F0), then ``p - s`` x (F1 B1);
    - steady state: (F0 B0 F1 B1) until every forward has run;
    - cool-down: ``s`` x (B0 B1), then ``p - s`` x B0.

    For m < 2p - 1 it is the order of ``2p - 1`` micro-batches with the missing ones left out.
    Every B is split; its W is placed as in ZB-H1 by walking the pipeline at unit times
    (``_fill_weights``): a W runs when the next F or B cannot start, or an F would exceed 2p
    chunk activations alive. The order is fixed (computed at unit times), not re-planned per
    F/B/W ratio as the paper's time-aware scheduler is.

    Memory: at most 2p chunk activations of half a stage each on every rank, 1F1B's peak of p
    stages. Bubble (idle between a rank's first and last step, on the worst rank), measured
    (``tests/test_schedules.py``): zero at F = B = W once m >= 2p - 1, and ``2p - 1 - m`` units
    for p <= m < 2p - 1; with chunk times F, B and W <= min(F, B), ``2 (p - 1)(max(F, B) - W)``,
    against 1F1B's ``2 (p - 1)(F + B + W)`` in the same half-stage units.
    """
    check_schedule_args("zb-v", stages, microbatches, chunks)
    _check_stage(stage, stages)
    return _zb_v(stages, microbatches)[stage]


def _line_order(stage: int, stages: int, microbatches: int, warmup: int) -> list[Step]:
    w = min(warmup, microbatches)
    order = [Step("F", mb, 0) for mb in range(w)]
    for k in range(microbatches - w):
        order += [Step("F", w + k, 0), Step("B", k, 0, True)]
    return order + [Step("B", k, 0, True) for k in range(microbatches - w, microbatches)]


@functools.lru_cache(maxsize=256)
def _zb_line(stages: int, microbatches: int, cap: int, warmup_factor: int) -> tuple[tuple[Step, ...], ...]:
    orders = [_line_order(s, stages, microbatches, warmup_factor * (stages - s - 1)) for s in range(stages)]
    return _fill_weights(Placement("interleaved", stages, 1), orders, cap)


def _fill_weights(place: Placement, orders: list[list[Step]], cap: int) -> tuple[tuple[Step, ...], ...]:
    """Insert each split B's W into fixed F/B orders, walking the pipeline at unit step times.

    At each time unit a rank starts its next F or B if its dependency has finished and an F
    would keep at most ``cap`` activations alive; otherwise it runs its oldest pending W. The
    remaining W's run after the last B.
    """
    stages = place.stages
    done: dict = {}
    progs: list[list[Step]] = [[] for _ in range(stages)]
    nxt = [0] * stages
    pending: list[deque] = [deque() for _ in range(stages)]
    alive = [0] * stages
    t = 0
    while any(nxt[r] < len(orders[r]) for r in range(stages)):
        finished = {}
        for r in range(stages):
            if nxt[r] < len(orders[r]):
                step = orders[r][nxt[r]]
                dep = depends_on(place, r, step)
                if (dep is None or done.get(dep, t + 1) <= t) and not (step.kind == "F" and alive[r] >= cap):
                    progs[r].append(step)
                    finished[(step.kind, step.microbatch, place.vstage(r, step.chunk))] = t + 1
                    nxt[r] += 1
                    if step.kind == "F":
                        alive[r] += 1
                    else:
                        pending[r].append(step)
                    continue
            if pending[r]:
                b = pending[r].popleft()
                progs[r].append(Step("W", b.microbatch, b.chunk))
                alive[r] -= 1
        done.update(finished)
        t += 1
    for r in range(stages):
        progs[r] += [Step("W", b.microbatch, b.chunk) for b in pending[r]]
    return tuple(tuple(p) for p in progs)


def _v_order(stage: int, stages: int, microbatches: int) -> list[Step]:
    """ZB-V's F and split-B order on rank ``stage`` (``zb_v``): phases for max(m, 2p - 1)
    micro-batches, each kind and chunk counting its own micro-batches, the missing ones dropped."""
    p, s = stages, stage
    n = max(microbatches, 2 * p - 1)
    phases = (
        [("F", 0)] * (2 * (p - s) - 1)
        + [("F", 1), ("F", 0)] * s
        + [("F", 1), ("B", 1)] * (p - s)
        + [("F", 0), ("B", 0), ("F", 1), ("B", 1)] * (n - p)
        + [("B", 0), ("B", 1)] * s
        + [("B", 0)] * (p - s)
    )
    count = {key: 0 for key in phases}
    order = []
    for kind, chunk in phases:
        mb = count[kind, chunk]
        count[kind, chunk] += 1
        if mb < microbatches:  # the steady state's surplus F0's (mb >= n) drop out here too
            order.append(Step(kind, mb, chunk, kind == "B"))
    return order


@functools.lru_cache(maxsize=256)
def _zb_v(stages: int, microbatches: int) -> tuple[tuple[Step, ...], ...]:
    orders = [_v_order(s, stages, microbatches) for s in range(stages)]
    return _fill_weights(Placement("v", stages, 2), orders, 2 * stages)


# --- DualPipe (DeepSeek-AI) -------------------------------------------------------------------------


def dualpipe(stage: int, stages: int, microbatches: int, chunks: int = 1) -> tuple[Step, ...]:
    """DualPipe (DeepSeek-V3 technical report, Section 3.2.1; deepseek-ai/DualPipe
    ``dualpipe/dualpipe.py``, ``DualPipe.step``): bidirectional, two model copies.

    Every rank holds stage s of copy 0 (chunk 0) and stage p - 1 - s of copy 1 (chunk 1);
    micro-batches 0..m/2-1 enter at rank 0, m/2..m-1 at rank p - 1. The rank runs the file's
    eight steps with h = min(s, p - 1 - s), n = p / 2, and its own direction as phase 0:
    ``2(n-h-1)`` F0; ``h+1`` x (F0 F1); ``n-h-1`` x (B1 W1 F1) split; ``m/2 - p + h + 1`` x
    (F0 B1 F1 B0); ``n-h-1`` x (B1 F1 B0); ``h+1`` x (B1 B0), the later half split; ``n-h-1`` x
    (W B0) split; ``h+1`` x W. Paired "F&B" steps run back to back here (the engine may overlap
    their communication). Needs even p, even m >= 2p.

    README table, with PP = p stages, B the full backward and F&B a forward-backward pair:
    bubble ``(PP/2 - 1)(F&B + B - 3W)``; parameters 2x; activations PP + 1 (full stages).
    """
    check_schedule_args("dualpipe", stages, microbatches, chunks)
    _check_stage(stage, stages)
    half = stages // 2
    second = stage >= half
    h = min(stage, stages - 1 - stage)
    per_copy = microbatches // 2

    def target(phase: int, count: int) -> tuple[int, int]:
        chunk = phase ^ second
        return chunk * per_copy + count, chunk

    return _dual_steps(half, h, per_copy, target)


def dualpipev(stage: int, stages: int, microbatches: int, chunks: int = 2) -> tuple[Step, ...]:
    """DualPipeV (deepseek-ai/DualPipe ``dualpipe/dualpipev.py``, "cut-in-half" of DualPipe by
    Sea AI Lab): DualPipe's eight steps on a V (``Placement`` layout ``"v"``), one model copy.

    Rank s runs steps 1-8 of ``dualpipe`` with n = p, h = s and all m micro-batches through both
    of its chunks (chunk 0 = virtual stage s, chunk 1 = 2p - 1 - s). Needs m >= 2p.

    README table (PP = 2p virtual stages, on PP/2 devices): bubble ``(PP/2 - 1)(F&B + B - 3W)``
    = ``(p - 1)(F&B + B - 3W)``; activations PP + 1 chunk activations (half-stage chunks) per
    device; the table's 2x parameters compares with 1F1B over PP devices, per device it holds
    two chunks of a 2p-way split (vp = 2).
    """
    check_schedule_args("dualpipev", stages, microbatches, chunks)
    _check_stage(stage, stages)
    return _dual_steps(stages, stage, microbatches, lambda phase, count: (count, phase))


def _dual_steps(n: int, h: int, per_phase: int, target: Callable[[int, int], tuple[int, int]]) -> tuple[Step, ...]:
    """DualPipe's eight steps (``DualPipe.step``): F/B counters per phase, W's first-in first-out."""
    steps: list[Step] = []
    forwards, backwards = [0, 0], [0, 0]
    weights: deque = deque()

    def f(phase: int) -> None:
        mb, chunk = target(phase, forwards[phase])
        forwards[phase] += 1
        steps.append(Step("F", mb, chunk))

    def b(phase: int, split: bool = False) -> None:
        mb, chunk = target(phase, backwards[phase])
        backwards[phase] += 1
        steps.append(Step("B", mb, chunk, split))
        if split:
            weights.append((mb, chunk))

    def w() -> None:
        steps.append(Step("W", *weights.popleft()))

    for _ in range(2 * (n - h - 1)):  # 1: nF0
        f(0)
    for _ in range(h + 1):  # 2: nF0F1
        f(0)
        f(1)
    for _ in range(n - h - 1):  # 3: nB1W1F1, zero bubble
        b(1, True)
        w()
        f(1)
    for _ in range(per_phase - 2 * n + h + 1):  # 4: nF0B1F1B0, the main step
        f(0)
        b(1)
        f(1)
        b(0)
    for _ in range(n - h - 1):  # 5: nB1F1B0
        b(1)
        f(1)
        b(0)
    split = False
    for i in range(h + 1):  # 6: nB1B0, the second half split
        if i == (h + 1) // 2 and h % 2 == 1:
            split = True
        b(1, split)
        if i == (h + 1) // 2 and h % 2 == 0:
            split = True
        b(0, split)
    for _ in range(n - h - 1):  # 7: nWB0, zero bubble
        w()
        b(0, True)
    while weights:  # 8: nW
        w()
    return tuple(steps)



def _check_stage(stage: int, stages: int) -> None:
    if not 0 <= stage < stages:
        raise ValueError(f"stage {stage} is outside a {stages}-stage pipeline")


SCHEDULES: dict[str, Callable[..., tuple[Step, ...]]] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved": interleaved_1f1b,
    "zb-h1": zb_h1,
    "zb-h2": zb_h2,
    "zb-v": zb_v,
    "dualpipe": dualpipe,
    "dualpipev": dualpipev,
}


@functools.lru_cache(maxsize=4096)
def schedule(name: str, stage: int, stages: int, microbatches: int, chunks: int = 1) -> tuple[Step, ...]:
    """``SCHEDULES[name](stage, stages, microbatches, chunks)``, computed once per arguments: a
    schedule is a pure function of them and its steps are frozen, so the planner's bounds, the
    memory model and the program builder share one copy across the layouts that ask for it."""
    return SCHEDULES[name](stage, stages, microbatches, chunks)


# Schedules whose backward leaves the weight gradients to a later W step.
SPLIT_BACKWARD = ("zb-h1", "zb-h2", "zb-v", "dualpipe", "dualpipev")
# Schedules that place their own two chunks per rank (vp must be 2) and DualPipe (vp must be 1).
V_SHAPED = ("zb-v", "dualpipev")


def check_schedule_args(
    name: str, stages: int, microbatches: int, chunks: int, _microbatches_checked: bool = True
) -> None:
    """Raise ``ConfigError`` naming the scenario field to fix if the schedule cannot run.

    ``microbatches`` is derived (global_batch_size / (micro_batch_size x dp)), so its errors
    point at ``training.global_batch_size`` and carry the derived count as the value.

    Chunk rules: interleaved takes any vp; zb-v and dualpipev need vp = 2 (they split the model
    into 2p virtual stages and put two on each rank, in a V); dualpipe needs vp = 1 (p stages,
    each rank also holding the mirrored stage of a second model copy) and an even pp; the other
    schedules run one chunk per rank. DualPipe and DualPipeV need m >= 2p (``DualPipe.step``
    asserts ``num_chunks >= num_ranks * 2``), DualPipe also an even m.
    """
    if name not in SCHEDULES:
        raise ConfigError("schedule", name, f"choose one of {', '.join(SCHEDULES)}")
    if stages < 1:
        raise ConfigError("parallelism.pp", stages, "must be a positive integer")
    if chunks < 1:
        raise ConfigError("parallelism.vp", chunks, "must be a positive integer")
    if microbatches < 1:
        raise ConfigError(
            "training.global_batch_size",
            f"{microbatches} micro-batches per pipeline",
            "needs at least one: make it at least micro_batch_size * dp",
        )
    if name in V_SHAPED and chunks != 2:
        raise ConfigError(
            "parallelism.vp",
            chunks,
            f"the {name} schedule puts two model chunks on each rank in a V: set vp to 2",
        )
    if name == "dualpipe" and stages % 2:
        raise ConfigError("parallelism.pp", stages, "dualpipe needs an even pp (two directions meet in the middle)")
    if chunks > 1 and name not in ("interleaved", *V_SHAPED):
        raise ConfigError(
            "parallelism.vp",
            chunks,
            f"the {name} schedule runs one model chunk per rank: set vp to 1 or use interleaved",
        )
    if not _microbatches_checked:
        return
    if name == "interleaved" and chunks > 1 and microbatches % stages:
        raise ConfigError(
            "training.global_batch_size",
            f"{microbatches} micro-batches per pipeline",
            f"the interleaved schedule needs a multiple of pp ({stages}): "
            "make global_batch_size a multiple of micro_batch_size * dp * pp",
        )
    if name in ("dualpipe", "dualpipev") and microbatches < 2 * stages:
        raise ConfigError(
            "training.global_batch_size",
            f"{microbatches} micro-batches per pipeline",
            f"the {name} schedule needs at least 2 x pp ({2 * stages}): "
            "make global_batch_size at least micro_batch_size * dp * 2 * pp",
        )
    if name == "dualpipe" and microbatches % 2:
        raise ConfigError(
            "training.global_batch_size",
            f"{microbatches} micro-batches per pipeline",
            "the dualpipe schedule splits them over two directions: "
            "make global_batch_size a multiple of micro_batch_size * dp * 2",
        )
