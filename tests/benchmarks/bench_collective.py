"""Benchmark (not a test): an 8 GiB ring all-reduce over 1,024 H100 GPUs on a fat tree.

Run: python tests/benchmarks/bench_collective.py
Prints wall time, peak RSS, simulated time and busbw.
"""

import resource
import time

from simulator.collectives import bus_factor, time_collective
from simulator.topology import build_cluster, load_topology


def main() -> None:
    t0 = time.perf_counter()
    cluster = build_cluster(load_topology("dgx-h100"), 128)
    t1 = time.perf_counter()
    size = 8 * 2**30
    sim_s, net = time_collective(cluster, "all_reduce", range(1024), size)
    t2 = time.perf_counter()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
    busbw = size / sim_s / 1e9 * bus_factor("all_reduce", 1024)
    print(f"all_reduce 8GiB x 1024 GPUs (dgx-h100, 128 nodes): build {t1 - t0:.2f} s, "
          f"simulate {t2 - t1:.2f} s, wall {t2 - t0:.2f} s, peak RSS {rss:.0f} MiB, "
          f"simulated {sim_s * 1e3:.2f} ms, busbw {busbw:.1f} GB/s, "
          f"transfers {net.stats.transfers}, rate updates {net.stats.rate_updates}")


if __name__ == "__main__":
    main()
