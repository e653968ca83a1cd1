"""Step metrics from a simulated trace: pure functions of a :class:`SimResult`.

Conventions:
- ``model_tflops_per_gpu`` and ``mfu`` use model FLOPs, 6N + 12 L h s per token (see
  ``compute.model_flops_per_token``: N active non-embedding weights plus the LM head, attention
  not halved for causal masking, recompute not counted), over the dense peak of the run's
  precision. ``hfu`` uses the same convention plus the FLOPs of activation recompute
  (``compute.hardware_flops_per_token``), so HFU >= MFU, equal without recompute; the report
  states this in ``flops_convention``. (The kernels themselves execute only the causal half of
  attention; ``stages[].flops`` counts those executed FLOPs.)
- Per stage, the step time splits into compute (kernels; of it, ``contention_s`` lost to the SMs
  communication kernels held and ``host_wait_s`` the GPU waited on the host: kernel issue it
  outran, MoE token-count syncs), exposed communication by axis (time
  the compute stream waited on a transfer, after the transfer had started) and idle (waiting
  for a pipeline dependency, or done before the slowest stage). ``bubble_fraction`` of a stage is
  its idle share; the step's is the mean over stages. With uniform stages and free communication
  this is (p-1)/(m+p-1) for 1F1B and GPipe and (p-1)/(v m+p-1) interleaved.
- Stage figures come from the rank at dp = cp = tp = 0 of each stage.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from simulator.common.records import Record, doc
from simulator.engine.records import SimResult
from simulator.parts.gpus import gpu_of, peak
from simulator.reports.faults import fault_report, format_faults
from simulator.reports.memory import headroom_note
from simulator.parts.calibration import CLASSES, COMMUNICATION, COMMUNICATION_SCOPE
from simulator.workload.classes import blocks_classes
from simulator.workload.compute import hardware_flops_per_token, model_flops_per_token, param_counts

AXES = ("tp", "pp", "dp", "fsdp", "cp", "ep", "offload")  # offload: waits on CPU activation offloading copies
FLOPS_CONVENTION = ("model FLOPs 6N + 12 L h s per token (PaLM App. B; Megatron-LM): attention counted over the "
                    "full s x s scores, not halved for causal masking; hfu adds activation-recompute FLOPs in the "
                    "same convention")
COMPUTE_KINDS = ("F", "B", "W", "R", "embed", "head", "opt")


@dataclass(frozen=True)
class StageTimes(Record):
    """One pipeline stage's step, split into compute, exposed communication by axis and idle."""

    stage: int = doc("pipeline stage")
    compute_s: float = doc("kernels running on the stage's GPU (representative rank)", "s")
    exposed_comm_s: dict = doc("time the compute stream waited on communication, by axis (tp, pp, dp, fsdp, cp, ep, offload)", "s")
    idle_s: float = doc("waiting on a pipeline dependency, or done before the slowest stage", "s")
    bubble_fraction: float = doc("idle_s / step time")
    flops: float = doc("FLOPs the kernels executed (causal attention halved, recompute included)", "FLOP")
    contention_s: float = doc("of compute_s, the time lost to the SMs communication kernels held beside it", "s", 0.0)
    host_wait_s: float = doc("of compute_s, the GPU waiting on the host (kernel issue it outran, MoE token-count syncs)", "s", 0.0)


@dataclass(frozen=True)
class TimeBreakdown(Record):
    compute_s: float = doc("kernels running, mean over stages", "s")
    exposed_comm_s: dict = doc("time the compute stream waited on communication by axis, mean over stages", "s")
    idle_s: float = doc("waiting on pipeline dependencies (the bubble), mean over stages", "s")
    contention_s: float = doc("of compute_s, lost to the SMs communication kernels held beside it", "s", 0.0)
    host_wait_s: float = doc("of compute_s, the GPU waiting on the host: kernel issue it outran, MoE token-count syncs (host-bound)", "s", 0.0)


@dataclass(frozen=True)
class Layout(Record):
    tp: int = doc("tensor-parallel size")
    pp: int = doc("pipeline stages")
    dp: int = doc("data-parallel size")
    cp: int = doc("context-parallel size")
    ep: int = doc("expert-parallel size")
    vp: int = doc("virtual pipeline chunks per rank")
    zero_stage: int = doc("ZeRO stage")
    sequence_parallel: bool = doc("Megatron sequence parallelism")
    schedule: str = doc("the pipeline schedule as the scenario names it")
    pipeline_schedule: str = doc("the schedule that ran: interleaved when vp > 1, even where the scenario says 1f1b", "", "")


@dataclass(frozen=True)
class CalibrationReport(Record):
    """Which costs a scenario's ``calibration:`` file set and which stay modelled."""

    OPTIONAL = ("file", "communication")
    calibrated: dict = doc("kernel class -> factor: each op of the class took its modelled time / factor")
    gemm_shapes: int = doc("GEMM shapes priced with their own factor instead of the gemm class's")
    modelled: tuple[str, ...] = doc("kernel classes of the step's ops priced by stepsim's own model")
    file: str | None = doc("the calibration file (absent when the scenario gives it inline)", "", None)
    communication: str | None = doc("with a communication factor: what it covers (NVLink only, never across nodes)", "", None)


@dataclass(frozen=True)
class StepReport(Record):
    """What ``stepsim run --json`` prints (before the memory section is added)."""

    OPTIONAL = ("faults", "sim_wall_s", "pipeline_passes", "calibration")
    name: str = doc("the scenario's name")
    step_time_s: float = doc("one training step, from the first kernel to the last rank's optimizer step", "s")
    tokens_per_step: int = doc("global batch x sequence length", "tokens")
    tokens_per_s: float = doc("tokens_per_step / step_time_s", "tokens/s")
    tokens_per_s_per_gpu: float = doc("tokens_per_s / GPUs", "tokens/s")
    model_tflops_per_gpu: float = doc("model FLOPs (flops_convention) per second per GPU", "TFLOP/s")
    mfu: float = doc("model FLOPs utilisation: model FLOP/s over the dense peak at the run's precision")
    hfu: float = doc("hardware FLOPs utilisation: mfu plus activation-recompute FLOPs")
    flops_convention: str = doc("how model FLOPs are counted")
    bubble_fraction: float = doc("mean over stages of the idle share of the step")
    bubble_fraction_per_stage: tuple[float, ...] = doc("idle share of the step, per pipeline stage")
    time_breakdown_s: TimeBreakdown = doc("where a GPU's step goes, mean over stages")
    stages: tuple[StageTimes, ...] = doc("the same split for each pipeline stage")
    num_gpus: int = doc("GPUs in the job")
    num_microbatches: int = doc("micro-batches per pipeline per step")
    layout: Layout = doc("the parallel layout that ran")
    events: int = doc("simulation events (a measure of the simulation's work)")
    transfers: int = doc("network transfers simulated")
    simulated_ranks: int = doc("ranks simulated (one per stage when folded)")
    model_params: dict = doc("total and per-token active parameters")
    faults: dict | None = doc("only with a faults: section: straggling ranks, touched links, groups crossing a degraded link", "", None)
    sim_wall_s: float | None = doc("wall time the simulation took (the one field that differs between runs)", "s", None)
    pipeline_passes: int | None = doc("training.pipeline_passes, only when the schedule runs more than once", "", None)
    calibration: CalibrationReport | None = doc("only with a calibration: section: the calibrated kernel classes and "
                                                "their factors, and the classes still modelled", "", None)


def stage_breakdown(result: SimResult) -> list[dict]:
    return [st.to_dict() for st in stage_times(result)]


def stage_times(result: SimResult) -> tuple[StageTimes, ...]:
    step = result.step_time_s
    reps = {result.plan.stage_of(r): r for r in sorted(result.simulated_ranks, reverse=True)}
    compute = defaultdict(float)
    flops = defaultdict(float)
    slowed = defaultdict(float)
    host = defaultdict(float)
    exposed = defaultdict(lambda: defaultdict(float))
    for row in result.trace.of_ranks(reps.values()):
        if row.stream != "compute":
            continue
        if row.kind in COMPUTE_KINDS:
            compute[row.rank] += row.end - row.start
            flops[row.rank] += row.flops
            slowed[row.rank] += row.contention_s
            host[row.rank] += row.host_s
        elif row.kind == "wait":
            exposed[row.rank][row.axis] += row.end - row.start
    out = []
    for stage in range(result.plan.pp):
        rank = reps[stage]
        idle = max(0.0, step - compute[rank] - sum(exposed[rank].values()))
        out.append(StageTimes(stage, compute[rank], {a: exposed[rank].get(a, 0.0) for a in AXES}, idle,
                              idle / step if step > 0 else 0.0, flops[rank], slowed[rank], host[rank]))
    return tuple(out)


def model_params(model) -> dict:
    """Total and per-token active parameters (``compute.param_counts``; MTP modules left out)."""
    counts = param_counts(model)
    return {"total": counts["total"], "active": counts["active"]}


def step_report(result: SimResult, wall_s: float | None = None) -> dict:
    """The step report as JSON-ready data (``step_record(...).to_dict()``)."""
    return step_record(result, wall_s).to_dict()


def step_record(result: SimResult, wall_s: float | None = None) -> StepReport:
    s = result.scenario
    step = result.step_time_s
    world = result.plan.world
    tokens = s.training.global_batch_size * s.training.seq_length
    gpu = gpu_of(s.cluster, s.training.precision)
    peak_flops = peak(gpu, s.training.precision)
    model_flops = model_flops_per_token(s.model, s.training.seq_length) * tokens
    hardware_flops = hardware_flops_per_token(s.model, s.training.seq_length, s.training.recompute) * tokens
    stages = stage_times(result)
    n = len(stages)
    par = s.parallelism
    faults = None
    if s.faults.active:
        faults = fault_report(s, result.plan, result.cluster,
                              len(result.simulated_ranks) if result.options.fold else None)
    return StepReport(
        name=s.name,
        step_time_s=step,
        tokens_per_step=tokens,
        tokens_per_s=tokens / step,
        tokens_per_s_per_gpu=tokens / step / world,
        model_tflops_per_gpu=model_flops / step / world / 1e12,
        mfu=model_flops / (step * world * peak_flops),
        hfu=hardware_flops / (step * world * peak_flops),
        flops_convention=FLOPS_CONVENTION,
        bubble_fraction=sum(st.bubble_fraction for st in stages) / n,
        bubble_fraction_per_stage=tuple(st.bubble_fraction for st in stages),
        time_breakdown_s=TimeBreakdown(
            compute_s=sum(st.compute_s for st in stages) / n,
            exposed_comm_s={a: sum(st.exposed_comm_s[a] for st in stages) / n for a in AXES},
            idle_s=sum(st.idle_s for st in stages) / n,
            contention_s=sum(st.contention_s for st in stages) / n,
            host_wait_s=sum(st.host_wait_s for st in stages) / n),
        stages=stages,
        num_gpus=world,
        num_microbatches=s.num_microbatches,
        layout=Layout(par.tp, par.pp, s.dp, par.cp, par.ep, par.vp, par.zero_stage, par.sequence_parallel,
                      s.schedule, s.pipeline_schedule),
        events=result.events,
        transfers=result.transfers,
        simulated_ranks=len(result.simulated_ranks),
        model_params=model_params(s.model),
        faults=faults,
        sim_wall_s=wall_s,
        pipeline_passes=s.training.pipeline_passes if s.training.pipeline_passes > 1 else None,
        calibration=calibration_report(result),
    )


def calibration_report(result: SimResult) -> CalibrationReport | None:
    """What the scenario's calibration set: the factors of the classes the step's ops have, the
    classes left to the model (communication among them unless calibrated), the scope note."""
    cal = result.scenario.calibration
    if cal is None:
        return None
    w = result.workload
    blocks = [b for cost in w.layer_costs.values() for b in (cost.attn_fwd, cost.mlp_fwd, cost.attn_bwd, cost.mlp_bwd,
                                                            cost.attn_recompute, cost.mlp_recompute)]
    blocks += [*w.embedding, *w.head, *w.optimizer.values()]
    present = blocks_classes(blocks) | {COMMUNICATION}
    factors = cal.factors
    comm = factors.get(COMMUNICATION)
    return CalibrationReport(
        calibrated={c: factors[c] for c in CLASSES if c in factors and c in present},
        gemm_shapes=len(cal.gemm_shapes) if "gemm" in present else 0,
        modelled=tuple(c for c in CLASSES if c in present and c not in factors),
        file=cal.path,
        communication=None if comm is None else COMMUNICATION_SCOPE,
    )


# What the compute stream waited for, by axis, in the words of the run summary.
WAITING_ON = {"tp": "TP collectives", "pp": "PP sends", "dp": "DP gradient sync", "fsdp": "FSDP gathers",
              "cp": "CP exchange", "ep": "EP all-to-all", "offload": "CPU offload copies"}


def _plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n:,} {word if n == 1 else many or word + 's'}"


def _time_row(label: str, value: str) -> str:
    return f"    {label:<29} {value}"


def format_summary(report: dict) -> str:
    """A readable summary of a step report."""
    lay = report["layout"]
    b = report["time_breakdown_s"]
    schedule = lay.get("pipeline_schedule") or lay["schedule"]
    if schedule != lay["schedule"]:
        schedule += f" (the scenario says {lay['schedule']}; vp {lay['vp']} interleaves it)"
    lines = [
        f"{report['name']}: {_plural(report['num_gpus'], 'GPU')}, TP{lay['tp']} PP{lay['pp']} DP{lay['dp']} "
        f"CP{lay['cp']} EP{lay['ep']} VP{lay['vp']}, ZeRO-{lay['zero_stage']}, {schedule}, "
        f"{_plural(report['num_microbatches'], 'micro-batch', 'micro-batches')} per pipeline"
        + (f" in {report['pipeline_passes']} passes" if report.get("pipeline_passes") else ""),
        f"  step time          {report['step_time_s']:.4f} s",
        f"  throughput         {report['tokens_per_s']:,.0f} tokens/s ({report['tokens_per_s_per_gpu']:,.1f} per GPU)",
        f"  model TFLOP/s/GPU  {report['model_tflops_per_gpu']:.1f}   MFU {report['mfu']:.1%}   HFU {report['hfu']:.1%}"
        "   (full-attention FLOPs; HFU adds recompute)",
        f"  bubble             {report['bubble_fraction']:.1%} (per stage: "
        + ", ".join(f"{x:.1%}" for x in report["bubble_fraction_per_stage"]) + ")",
        "  time per GPU (mean over stages):",
        _time_row("compute", f"{b['compute_s']:.4f} s"),
    ]
    if b.get("contention_s", 0.0) > 0:
        lines.append(_time_row("  of which", f"{b['contention_s']:.4f} s lost to communication kernels sharing the SMs"))
    if b.get("host_wait_s", 0.0) > 0:
        lines.append(_time_row("  of which", f"{b['host_wait_s']:.4f} s waiting on the host (host-bound: kernel "
                                             "launches, MoE token-count syncs)"))
    for axis, t in b["exposed_comm_s"].items():
        if t > 0:
            lines.append(_time_row(f"waiting on {WAITING_ON.get(axis, axis)}", f"{t:.4f} s"))
    lines.append(_time_row("idle (pipeline bubble)", f"{b['idle_s']:.4f} s"))
    mem = report.get("memory_gib_per_gpu")
    if mem:
        lines.append(f"  memory peak        {mem['peak_gib']:.1f} GiB per GPU "
                     f"of {max(st['capacity_gib'] for st in mem['stages']):.0f} GiB "
                     f"({'fits' if mem['fits'] else 'DOES NOT FIT'})")
        note = headroom_note(mem)
        if note:
            lines.append(f"  headroom warning   {note}")
    if "faults" in report:
        lines += format_faults(report["faults"])
    cal = report.get("calibration")
    if cal:
        done = ", ".join(f"{c} {f:.3g}" for c, f in cal["calibrated"].items()) or "none of the step's classes"
        shapes = f", {cal['gemm_shapes']} GEMM shapes their own" if cal["gemm_shapes"] else ""
        lines.append(f"  calibrated         time / factor: {done}{shapes}"
                     + (f" ({cal['file']})" if cal.get("file") else ""))
        lines.append(f"    modelled         {', '.join(cal['modelled']) or 'no kernel class'}"
                     + ("; collectives across nodes (the communication factor scales NVLink only)"
                        if cal.get("communication") else ""))
    if "sim_wall_s" in report:
        lines.append(f"  simulated in       {report['sim_wall_s']:.2f} s wall, {report['events']:,} events, "
                     f"{report['simulated_ranks']:,} of {report['num_gpus']:,} ranks")
    return "\n".join(lines)
