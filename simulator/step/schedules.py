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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from simulator.errors import ConfigError


@dataclass(frozen=True)
class Step:
    """One forward (``"F"``) or backward (``"B"``) pass of a micro-batch through a model chunk."""

    kind: str
    microbatch: int
    chunk: int


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
    warmup = min(stages - stage - 1, microbatches)
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
    warmup = min(2 * (stages - stage - 1) + (chunks - 1) * stages, total)

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


def _interleaved_microbatch(k: int, stages: int, chunks: int) -> int:
    return (k // (stages * chunks)) * stages + k % stages


def _check_stage(stage: int, stages: int) -> None:
    if not 0 <= stage < stages:
        raise ValueError(f"stage {stage} is outside a {stages}-stage pipeline")


SCHEDULES: dict[str, Callable[..., tuple[Step, ...]]] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved": interleaved_1f1b,
}


def check_schedule_args(name: str, stages: int, microbatches: int, chunks: int) -> None:
    """Raise ``ConfigError`` naming the scenario field to fix if the schedule cannot run.

    ``microbatches`` is derived (global_batch_size / (micro_batch_size x dp)), so its errors
    point at ``training.global_batch_size`` and carry the derived count as the value.
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
    if chunks > 1 and name != "interleaved":
        raise ConfigError(
            "parallelism.vp",
            chunks,
            f"the {name} schedule runs one model chunk per rank: set vp to 1 or use interleaved",
        )
    if name == "interleaved" and chunks > 1 and microbatches % stages:
        raise ConfigError(
            "training.global_batch_size",
            f"{microbatches} micro-batches per pipeline",
            f"the interleaved schedule needs a multiple of pp ({stages}): "
            "make global_batch_size a multiple of micro_batch_size * dp * pp",
        )
