"""Benchmark (not a test): wall time, peak RSS and events of whole training steps.

Run: python tests/benchmarks/bench_step.py [scenario.yaml ...]
Each scenario runs in its own process so peak RSS is its own. Default: the GPT-3 175B
1,024-GPU and the Llama-3-405B 16,384-GPU scenarios.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ["scenarios/gpt3-175b-1024xa100.yaml", "scenarios/llama3-405b-16384xh100.yaml"]

CHILD = """
import json, resource, sys, time
t0 = time.perf_counter()
from simulator.scenario import load_scenario
from simulator.engine import simulate
from simulator.report import step_report
s = load_scenario(sys.argv[1])
t1 = time.perf_counter()
r = step_report(simulate(s))
t2 = time.perf_counter()
print(json.dumps({"load_s": t1 - t0, "simulate_s": t2 - t1, "wall_s": t2 - t0, "events": r["events"],
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "step_time_s": r["step_time_s"], "gpus": r["num_gpus"]}))
"""


def main(paths: list[str]) -> None:
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    for path in paths or DEFAULT:
        out = subprocess.run([sys.executable, "-c", CHILD, path], capture_output=True, text=True, cwd=ROOT, check=True)
        r = json.loads(out.stdout)
        print(f"{Path(path).stem}: {r['gpus']} GPUs, wall {r['wall_s']:.2f} s (simulate {r['simulate_s']:.2f} s), "
              f"peak RSS {r['rss_mib']:.0f} MiB, {r['events']:,} events, {r['events'] / r['simulate_s']:,.0f} events/s, "
              f"simulated step {r['step_time_s']:.3f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
