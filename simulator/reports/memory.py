"""The memory report as a text table (``stepsim memory``), and the headroom warning every human
report of memory carries."""

from __future__ import annotations

from simulator.workload.memory import (ALLOCATOR_FRAGMENTATION, CUDA_CONTEXT_BYTES, HEADROOM_FRACTION,
                                       NCCL_BUFFER_BYTES)
from simulator.common.units import GiB

# The ``other`` component of the JSON report, as the tables name it
COMPONENT_NAMES = {"weights": "weights", "gradients": "gradients", "optimizer": "optimizer",
                   "activations": "activations", "other": "buffers"}


def buffers_legend(report: dict) -> str:
    """What the ``buffers`` column (``other_gib``) holds."""
    a = report.get("assumptions", {})
    comm = a.get("comm_buffers", "communication buffers")
    return (f"buffers: {comm}, the CUDA context ({CUDA_CONTEXT_BYTES / GiB:g} GiB), NCCL's buffers "
            f"({NCCL_BUFFER_BYTES / GiB:g} GiB) and allocator fragmentation ({ALLOCATOR_FRAGMENTATION:.0%} of the "
            "tensor bytes)")


def headroom_note(report: dict) -> str | None:
    """A warning when a stage fits but its peak leaves less than ``HEADROOM_FRACTION`` of its GPU's
    capacity free (None otherwise, and for a plan that does not fit: that is an error, not a
    warning)."""
    tight = [st for st in report["stages"]
             if st["fits"] and st["capacity_gib"] - st["total_gib"] < HEADROOM_FRACTION * st["capacity_gib"]]
    if not tight:
        return None
    st = max(tight, key=lambda r: (r["total_gib"] / r["capacity_gib"], -r["stage"]))
    cap = st["capacity_gib"]
    where = f"stage {st['stage']}" if len(report["stages"]) > 1 else "the GPU"
    more = f" ({len(tight)} stages are that close)" if len(tight) > 1 else ""
    return (f"{where} peaks at {st['total_gib']:.1f} of {cap:.0f} GiB{more}, leaving {cap - st['total_gib']:.1f} GiB: "
            f"less than the {HEADROOM_FRACTION:.0%} ({HEADROOM_FRACTION * cap:.1f} GiB) headroom assumed for allocator "
            f"fragmentation above the {ALLOCATOR_FRAGMENTATION:.0%} average already counted and for transient "
            "buffers the model leaves out; it may run out of memory")


def format_memory_table(report: dict) -> str:
    """Per-stage table in GiB, one row per stage, then the peak, the verdict and what the columns hold."""
    cols = ("weights", "gradients", "optimizer", "activations", "other", "total")
    header = (f"{'stage':>5} " + " ".join(f"{COMPONENT_NAMES.get(c, c):>11}" for c in cols)
              + f" {'capacity':>9}  {'fits':<4}  biggest")
    lines = [header]
    for r in report["stages"]:
        values = " ".join(f"{r[c + '_gib']:>11.2f}" for c in cols)
        fits = "yes" if r["fits"] else "NO"
        lines.append(f"{r['stage']:>5} {values} {r['capacity_gib']:>9.1f}  {fits:<4}  "
                     f"{COMPONENT_NAMES.get(r['biggest'], r['biggest'])}")
    verdict = "fits" if report["fits"] else "does NOT fit"
    lines.append(f"peak {report['peak_gib']:.2f} GiB per GPU: {verdict}")
    note = headroom_note(report)
    if note:
        lines.append(f"headroom warning: {note}")
    lines.append("GiB per GPU; " + buffers_legend(report))
    off = report.get("assumptions", {}).get("activation_offload")
    if off:
        what = (f"the first {off['layers']} layers" if "layers" in off else
                f"the saved tensors of {', '.join(off['modules'])}")
        lines.append(f"CPU activation offloading: {what} to host memory ({off['on_gpu']} on the GPU; "
                     f"host link {off['host_link_GBps']:g} GB/s per direction)")
    return "\n".join(lines)
