"""How fast, and in how much memory, a 1 GB Kineto trace is read (not a test: run it by hand).

    python tests/bench_kineto_1gb.py [--gb 1.0] [--dir /tmp] [--cases stream jsonload ijson hta]

Writes a synthetic Kineto trace of about ``--gb`` GB (uncompressed JSON, the event mix of a
training step with record_shapes: per kernel one cpu_op, one cudaLaunchKernel, one kernel and two
ac2g flow events, 10 ProfilerStep iterations), then reads it once per case, each in a fresh
process, and prints wall time, CPU time (user + system: steadier than wall time on a shared
machine) and peak RSS:

- ``stream``: :func:`simulator.calibrate.kineto.read_profile` (standard library only);
- ``streamscan``: the same reader's event iteration alone (:func:`iter_trace`), no analysis;
- ``jsonload``: ``json.load`` of the whole document, the plain approach, with no analysis;
- ``ijson``: ``ijson.items(f, "traceEvents.item")`` with its C backend, iterating the events with
  no analysis (needs ``pip install ijson``);
- ``hta``: HolisticTraceAnalysis's ``TraceAnalysis(trace_dir=...)`` parse, then
  ``get_gpu_kernel_breakdown`` (needs ``pip install HolisticTraceAnalysis``; ``--hta-python`` names
  the interpreter of a separate environment that has it).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time

KERNELS = [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas", "aten::mm", 180.0),
    ("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>, true>(Flash_fwd_params)", "aten::_flash_attention_forward", 120.0),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>)", "aten::add", 12.0),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)", "aten::native_layer_norm", 15.0),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "nccl:all_reduce", 300.0),
]


def generate(path: str, gb: float, steps: int = 10) -> int:
    """Write the synthetic trace; returns the number of GPU kernels."""
    rng = random.Random(0)
    target = int(gb * 1e9)
    per_kernel = 1350  # bytes of JSON per kernel with its op, launch and flows (measured below)
    n_kernels = target // per_kernel
    per_step = n_kernels // steps
    t = 1_700_000_000_000_000
    corr = 1
    written = 0
    with open(path, "w") as f:
        head = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85029158912}],
                "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 8}, "record_shapes": 1}
        f.write(json.dumps(head)[:-1] + ', "traceEvents": [\n')
        f.write('{"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "python"}}')
        gpu_t = t + 50
        for s in range(steps):
            step_start = t
            parts = []
            for i in range(per_step):
                name, op, dur = KERNELS[i % len(KERNELS)]
                dur = round(dur * (0.9 + 0.2 * rng.random()), 3)
                cpu_ts = t
                parts.append(
                    f',\n{{"ph": "X", "cat": "cpu_op", "name": "{op}", "pid": 100, "tid": 100, "ts": {cpu_ts}, "dur": 9, '
                    f'"args": {{"External id": {corr}, "Record function id": 0, "Ev Idx": {corr}, '
                    f'"Input Dims": [[4096, 8192], [8192, 8192]], "Input type": ["c10::BFloat16", "c10::BFloat16"], '
                    f'"Input Strides": [[8192, 1], [1, 8192]], "Concrete Inputs": ["", ""]}}}}'
                    f',\n{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 100, "ts": {cpu_ts + 2}, "dur": 5, '
                    f'"args": {{"External id": {corr}, "cbid": 211, "correlation": {corr}}}}}'
                    f',\n{{"ph": "s", "id": {corr}, "pid": 100, "tid": 100, "ts": {cpu_ts + 2}, "cat": "ac2g", "name": "ac2g"}}'
                    f',\n{{"ph": "X", "cat": "kernel", "name": "{name}", "pid": 0, "tid": 7, "ts": {gpu_t}, "dur": {dur}, '
                    f'"args": {{"External id": {corr}, "queued": 0, "device": 0, "context": 1, "stream": 7, "correlation": {corr}, '
                    f'"registers per thread": 168, "shared memory": 147456, "blocks per SM": 1.0, "warps per SM": 8.0, '
                    f'"grid": [132, 1, 1], "block": [384, 1, 1], "est. achieved occupancy %": 13}}}}'
                    f',\n{{"ph": "f", "id": {corr}, "pid": 0, "tid": 7, "ts": {gpu_t}, "cat": "ac2g", "name": "ac2g", "bp": "e"}}')
                t += 10
                gpu_t = max(gpu_t + dur + 1.0, t + 20)
                corr += 1
                if len(parts) >= 2000:
                    chunk = "".join(parts)
                    written += len(chunk)
                    f.write(chunk)
                    parts = []
            chunk = "".join(parts)
            written += len(chunk)
            f.write(chunk)
            f.write(f',\n{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{s}", "pid": 100, "tid": 100, '
                    f'"ts": {step_start}, "dur": {t - step_start}, "args": {{"External id": 0}}}}')
            t += 500
            gpu_t += 500
        f.write('\n], "traceName": "synthetic"}\n')
    return per_step * steps


CASES = {
    "stream": "from simulator.calibrate.kineto import read_profile\n"
              "p = read_profile(PATH)\nr = p.ranks[0]\n"
              "print(f'{r.kernel_count} kernels in {len(r.iterations)} kept iterations, coverage {r.coverage:.3f}')",
    "streamscan": "from simulator.calibrate.kineto import iter_trace\nmeta, events = iter_trace(PATH)\n"
                  "n = sum(1 for _ in events)\nprint(n, 'events')",
    "jsonload": "import json\nwith open(PATH) as f:\n    d = json.load(f)\nprint(len(d['traceEvents']), 'events')",
    "ijson": "import ijson\nn = 0\nwith open(PATH, 'rb') as f:\n    for ev in ijson.items(f, 'traceEvents.item', use_float=True):\n"
             "        n += 1\nprint(n, 'events', ijson.backend)",
    "hta": "import os\nfrom hta.trace_analysis import TraceAnalysis\n"
           "a = TraceAnalysis(trace_dir=os.path.dirname(PATH))\n"
           "k = a.get_gpu_kernel_breakdown(visualize=False)\nprint(k[0].shape, 'kernel types')",
}

_WRAP = """
import resource, sys, time
PATH = sys.argv[1]
t0 = time.perf_counter()
{body}
u = resource.getrusage(resource.RUSAGE_SELF)
print(f"wall {{time.perf_counter() - t0:.1f}} s, CPU {{u.ru_utime + u.ru_stime:.1f}} s, peak RSS {{u.ru_maxrss / 1024:.0f}} MiB")
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--dir", default="/tmp/kineto-bench")
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--hta-python", default=sys.executable)
    ap.add_argument("--timeout", type=float, default=1800.0)
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    path = os.path.join(a.dir, "rank0.pt.trace.json")
    if not os.path.exists(path):
        t0 = time.perf_counter()
        n = generate(path, a.gb)
        print(f"wrote {path}: {os.path.getsize(path) / 1e9:.2f} GB, {n} kernels, {time.perf_counter() - t0:.0f} s")
    else:
        print(f"reusing {path}: {os.path.getsize(path) / 1e9:.2f} GB")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for case in a.cases:
        python = a.hta_python if case == "hta" else sys.executable
        code = _WRAP.format(body=CASES[case])
        try:
            out = subprocess.run([python, "-c", code, path], capture_output=True, text=True, cwd=root, timeout=a.timeout)
            text = (out.stdout.strip() or "") + ("" if out.returncode == 0 else f" FAILED {out.returncode}: {out.stderr.strip()[-400:]}")
        except subprocess.TimeoutExpired:
            text = f"no answer within {a.timeout:.0f} s"
        print(f"{case}: {text}")


if __name__ == "__main__":
    main()
