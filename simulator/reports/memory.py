"""The memory report as a text table (``stepsim memory``)."""

from __future__ import annotations


def format_memory_table(report: dict) -> str:
    """Per-stage table in GiB, one row per stage, then the peak and the verdict."""
    cols = ("weights", "gradients", "optimizer", "activations", "other", "total")
    header = f"{'stage':>5} " + " ".join(f"{c:>11}" for c in cols) + f" {'capacity':>9}  {'fits':<4}  biggest"
    lines = [header]
    for r in report["stages"]:
        values = " ".join(f"{r[c + '_gib']:>11.2f}" for c in cols)
        fits = "yes" if r["fits"] else "NO"
        lines.append(f"{r['stage']:>5} {values} {r['capacity_gib']:>9.1f}  {fits:<4}  {r['biggest']}")
    verdict = "fits" if report["fits"] else "does NOT fit"
    lines.append(f"peak {report['peak_gib']:.2f} GiB per GPU: {verdict}")
    off = report.get("assumptions", {}).get("activation_offload")
    if off:
        what = (f"the first {off['layers']} layers" if "layers" in off else
                f"the saved tensors of {', '.join(off['modules'])}")
        lines.append(f"CPU activation offloading: {what} to host memory ({off['on_gpu']} on the GPU; "
                     f"host link {off['host_link_GBps']:g} GB/s per direction)")
    return "\n".join(lines)
