"""A simulated step as PyTorch profiler (Kineto) traces: one Chrome-trace JSON file per simulated rank,
in the shape ``torch.profiler``'s ``export_chrome_trace`` writes, so that ``stepsim calibrate`` (and
TensorBoard, Perfetto, HolisticTraceAnalysis) read it as they read a real job's.

Each file holds one ``ProfilerStep#1`` (a CPU ``user_annotation`` over the step) and:

- one GPU ``kernel`` event per op of the rank's compute blocks, laid out in each block's trace row
  in the order the block lists its ops, each taking its share of the row (the row is the block's
  time with what the SMs held by communication kernels and stragglers added, spread over its ops
  in proportion to their modelled times). The MoE host syncs are gaps, as in a real trace (the GPU
  waits on the host there). A kernel's name is one the classifier files under its op's class
  (``KERNEL_NAMES``, ``simulator.workload.classes``); ``args`` carry the op (``stepsim_op``), its
  layer, micro-batch and kind;
- a ``cudaLaunchKernel`` (``cuda_runtime``) on the CPU thread for each kernel, with its
  ``correlation``, and for GEMMs of whole-number shape an ``aten::mm`` (``aten::bmm`` batched)
  ``cpu_op`` with ``Input Dims`` around the launch, as ``record_shapes=True`` records them;
- one NCCL kernel per collective call of the rank, from its launch to its end (``SimResult.comm_spans``,
  recorded with ``SimOptions.record_flows``), on a stream per axis, with ``Collective name``;
- ``distributedInfo`` (rank, world size) and ``deviceProperties`` (the GPU's name).

Pipeline transfers and CPU offloading copies are not written as kernels beyond their NCCL
send/recv calls; a folded run writes one representative rank per pipeline stage.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from simulator.common.files import atomic_write
from simulator.engine.records import Row, SimResult
from simulator.parts.gpus import gpu_of
from simulator.program import builder as P
from simulator.program.builder import build_program
from simulator.workload.classes import HOST, op_class

# Kernel names the trace classifier (``calibrate.kineto.classify``) files under each class; a test
# holds it. Real kernel names of the reference stack: cuBLAS on Hopper, FlashAttention, TE's RMSNorm.
KERNEL_NAMES = {
    "gemm": "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT",
    "attention": "flash_fwd_kernel",
    "norm": "rmsnorm_fwd_tuned_kernel",
    "elementwise": "vectorized_elementwise_kernel",
    "optimizer": "multi_tensor_apply_kernel",
    "loss": "cross_entropy_fwd_kernel",
    "embedding": "indexSelectLargeIndex",
}
BACKWARD_NAMES = {"attention": "flash_bwd_kernel", "norm": "rmsnorm_bwd_tuned_kernel",
                  "loss": "cross_entropy_bwd_kernel"}
NCCL_NAMES = {
    "all_reduce": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
    "all_gather": "ncclDevKernel_AllGather_RING_LL",
    "reduce_scatter": "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL",
    "broadcast": "ncclDevKernel_Broadcast_RING_LL",
    "all_to_all": "ncclDevKernel_SendRecv",
    "send_recv": "ncclDevKernel_SendRecv",
}
COMPUTE_KINDS = ("F", "B", "W", "R", "embed", "head", "opt")
COMPUTE_STREAM = 7
AXES = ("tp", "cp", "ep", "pp", "dp", "fsdp", "offload")
GPU_PID, CPU_PID, CPU_TID, NCCL_TID = 0, 1, 1, 2


def compute_ops(result: SimResult, rank: int) -> list[tuple[Row, P.Compute]]:
    """The compute rows of a simulated rank, each with the program's block it ran: the engine walks
    the program in order and writes one row per ``Compute`` (``host_dispatch`` rows aside)."""
    if rank not in result.simulated_ranks:
        raise ValueError(f"rank {rank} was not simulated (simulated: {list(result.simulated_ranks)})")
    stage = result.plan.stage_of(rank)
    program = build_program(result.scenario, result.workload, stage, result.options.extras)
    computes = [op for op in program if isinstance(op, P.Compute)]
    rows = [r for r in result.trace if r.rank == rank and r.stream == "compute" and r.kind in COMPUTE_KINDS
            and r.label != "host_dispatch"]
    if len(rows) != len(computes) or any((r.kind, r.label, r.layer, r.microbatch) !=
                                         (c.kind, c.label, c.layer, c.microbatch) for r, c in zip(rows, computes)):
        raise RuntimeError(f"rank {rank}: the trace's compute rows do not follow the stage's program")
    return list(zip(rows, computes))


def op_intervals(row: Row, compute: P.Compute):
    """(op, start, end) of each op of a row's block, back to back over the row in proportion to
    the ops' modelled times."""
    block = compute.block
    scale = (row.end - row.start) / block.time_s if block.time_s > 0 else 0.0
    t = row.start
    for op in block.ops:
        d = op.time_s * scale
        yield op, t, t + d
        t += d


def _us(t: float) -> float:
    return round(t * 1e6, 3)


def kernel_name(op_name: str, cls: str) -> str:
    if op_name.endswith("_bwd") and cls in BACKWARD_NAMES:
        return BACKWARD_NAMES[cls]
    return KERNEL_NAMES[cls]


def _dims(shape) -> tuple[str, list] | None:
    """The aten operator and ``Input Dims`` of a GEMM of whole-number shape (m, n, k, batch)."""
    if shape is None:
        return None
    vals = []
    for x in shape[:3]:
        r = round(x)
        if r < 1 or abs(x - r) > 1e-9 * max(1.0, abs(x)):
            return None
        vals.append(int(r))
    m, n, k = vals
    batch = int(shape[3])
    if batch == 1:
        return "aten::mm", [[m, k], [k, n]]
    return "aten::bmm", [[batch, m, k], [batch, k, n]]


def kineto_trace(result: SimResult, rank: int) -> dict:
    """The Kineto trace document of one simulated rank (see the module docstring)."""
    s = result.scenario
    gpu = gpu_of(s.cluster, s.training.precision)
    events: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": GPU_PID, "tid": 0, "args": {"name": f"GPU 0 (rank {rank})"}},
        {"ph": "M", "name": "process_name", "pid": CPU_PID, "tid": 0, "args": {"name": "host"}},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": CPU_PID, "tid": CPU_TID,
         "ts": 0.0, "dur": _us(result.step_time_s) + 1.0},
    ]
    corr = 0
    for row, compute in compute_ops(result, rank):
        for op, start, end in op_intervals(row, compute):
            cls = op_class(op.name)
            if end <= start or cls is None or cls == HOST:
                continue
            corr += 1
            ts, te = _us(start), _us(end)
            dims = _dims(op.shape) if cls == "gemm" else None
            if dims is not None:
                events.append({"ph": "X", "cat": "cpu_op", "name": dims[0], "pid": CPU_PID, "tid": CPU_TID, "ts": ts,
                               "dur": 0.0, "args": {"Input Dims": dims[1]}})
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": CPU_PID,
                           "tid": CPU_TID, "ts": ts, "dur": 0.0, "args": {"correlation": corr}})
            events.append({"ph": "X", "cat": "kernel", "name": kernel_name(op.name, cls), "pid": GPU_PID,
                           "tid": COMPUTE_STREAM, "ts": ts, "dur": round(te - ts, 3),
                           "args": {"correlation": corr, "stream": COMPUTE_STREAM, "device": 0,
                                    "stepsim_op": op.name, "kind": row.kind, "layer": row.layer,
                                    "microbatch": row.microbatch}})
    for span_rank, axis, op, size, start, end in result.comm_spans:
        if span_rank != rank or end <= start:
            continue
        corr += 1
        stream = 20 + (AXES.index(axis) if axis in AXES else len(AXES))
        ts, te = _us(start), _us(end)
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": CPU_PID,
                       "tid": NCCL_TID, "ts": ts, "dur": 0.0, "args": {"correlation": corr}})
        events.append({"ph": "X", "cat": "kernel", "name": NCCL_NAMES.get(op, "ncclDevKernel_Generic"),
                       "pid": GPU_PID, "tid": stream, "ts": ts, "dur": round(te - ts, 3),
                       "args": {"correlation": corr, "stream": stream, "device": 0, "Collective name": op,
                                "stepsim_axis": axis, "bytes": size}})
    return {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": result.plan.world},
        "deviceProperties": [{"id": 0, "name": gpu.name, "numSms": gpu.num_sms,
                              "totalGlobalMem": int(gpu.hbm_capacity_bytes)}],
        "traceName": f"stepsim {s.name} rank {rank}",
        "displayTimeUnit": "ms",
        "traceEvents": events,
    }


def kineto_paths(path: str | Path, ranks) -> dict[int, Path]:
    """Where each rank's file goes: ``step.json`` -> ``step-rank0.json``, ``step-rank4.json`` (the
    same with ``.json.gz``)."""
    p = Path(path)
    name = p.name
    suffix = ".json.gz" if name.lower().endswith(".json.gz") else p.suffix
    stem = name[:-len(suffix)] if suffix else name
    return {r: p.with_name(f"{stem}-rank{r}{suffix}") for r in sorted(ranks)}


def write_kineto(result: SimResult, path: str | Path) -> list[str]:
    """One Kineto trace per simulated rank (``kineto_paths``), each written atomically (gzip for
    ``.json.gz``, with no timestamp, so the bytes depend on the step alone); the paths written."""
    if not result.options.record_flows:
        raise ValueError("a Kineto trace needs the collectives' spans: simulate with record_flows")
    written = []
    for rank, target in kineto_paths(path, result.simulated_ranks).items():
        data = json.dumps(kineto_trace(result, rank), separators=(",", ":")).encode()
        if target.name.lower().endswith(".gz"):
            data = gzip.compress(data, mtime=0)
        atomic_write(target, lambda f, data=data: f.write(data), binary=True)
        written.append(str(target))
    return written
