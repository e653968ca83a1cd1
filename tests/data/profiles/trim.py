"""Cut a few ProfilerStep iterations out of a Kineto trace, for the excerpts in this folder.

    python tests/data/profiles/trim.py SOURCE.json.gz OUT.json.gz --steps 4 5 [--drop-cat cpu_instant_event]

Keeps every top-level key of the source unchanged and, of ``traceEvents``:
- the metadata events (``"ph": "M"``: process and thread names);
- every event whose ``ts`` lies in [start of the first kept ProfilerStep on the CPU, end of the
  last kept step] where that end is the later of the step's CPU end and the last GPU end of the
  kernels, copies and sets launched inside the kept steps (matched by ``args.correlation``);
- except ProfilerStep annotations of the steps not asked for, and events of ``--drop-cat``
  categories.
Events keep their order and every field. The output is gzip with a zero timestamp, so the same
source gives the same bytes. It prints the SHA-256 of the source and of the output.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re

GPU = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}
LAUNCH = {"cuda_runtime", "cuda_driver", "Runtime"}
STEP = re.compile(r"ProfilerStep#(\d+)$")


def trim(src: str, out: str, steps: list[int], drop: set[str]) -> None:
    with open(src, "rb") as f:
        raw = f.read()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    events = doc["traceEvents"]
    cpu = {}
    for e in events:
        m = STEP.match(str(e.get("name", "")))
        if m and e.get("cat") != "gpu_user_annotation" and int(m.group(1)) in steps:
            cpu[int(m.group(1))] = (e["ts"], e["ts"] + e["dur"])
    missing = sorted(set(steps) - set(cpu))
    if missing:
        raise SystemExit(f"{src}: no ProfilerStep#{missing[0]}")
    lo = min(a for a, _ in cpu.values())
    hi = max(b for _, b in cpu.values())
    launched = set()
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in LAUNCH:
            t = e["ts"]
            if any(a <= t <= b for a, b in cpu.values()):
                launched.add(e.get("args", {}).get("correlation"))
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in GPU and e.get("args", {}).get("correlation") in launched:
            hi = max(hi, e["ts"] + e["dur"])
    kept = []
    for e in events:
        if e.get("ph") == "M":
            kept.append(e)
            continue
        if e.get("cat") in drop or "ts" not in e:
            continue
        m = STEP.match(str(e.get("name", "")))
        if m and int(m.group(1)) not in steps:
            continue
        if lo <= float(e["ts"]) <= hi:
            kept.append(e)
    doc["traceEvents"] = kept
    data = json.dumps(doc).encode()
    with open(out, "wb") as f:
        with gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0, compresslevel=9) as g:
            g.write(data)
    with open(out, "rb") as f:
        packed = f.read()
    print(f"source {src}: sha256 {hashlib.sha256(raw).hexdigest()}, {len(events)} events")
    print(f"output {out}: sha256 {hashlib.sha256(packed).hexdigest()}, {len(kept)} events, "
          f"{len(data)} bytes JSON, {len(packed)} bytes gzip")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("source")
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, nargs="+", required=True)
    ap.add_argument("--drop-cat", nargs="*", default=[])
    a = ap.parse_args()
    trim(a.source, a.out, a.steps, set(a.drop_cat))


if __name__ == "__main__":
    main()
