"""Checkpoint size and write time, full (consolidated) against sharded; pure functions.

What a training checkpoint holds (Megatron-LM ``save_checkpoint`` and its distributed
checkpoint): the 16-bit model weights (2 bytes per parameter) and the optimizer state, fp32
master weights plus Adam's m and v (12 bytes per parameter, the ZeRO accounting of
``memory.py``). Gradients are not saved. Every parameter is saved once: replicas across data
parallelism are deduplicated.

- A *full* checkpoint is gathered to one process and written as one file set by one node (the
  ``torch.save`` of a consolidated state dict; what conversion to a Hugging Face checkpoint needs):
  its write time is the whole size over one node's storage bandwidth.
- A *sharded* checkpoint (Megatron's ``dist_checkpointing`` with fully parallel save, PyTorch
  DCP) has every GPU write its own shard, replicated tensors spread over the data-parallel
  ranks: each node writes size / nodes, all nodes at once.

Storage bandwidth is per node, ``cluster.storage_bandwidth_GBps`` (decimal GB/s). Its default,
``DEFAULT_STORAGE_GBPS``, is what each node of Meta's Llama 3 cluster got when all of its nodes
wrote at once: Tectonic sustained 2 TB/s for 16,384 GPUs in 2,048 nodes (Dubey et al. 2024, "The
Llama 3 Herd of Models", Sec. 3.3.1), 0.98 GB/s per node. It is a conservative figure for a shared
parallel file system; a node's own storage NICs (2 x 400 Gb/s on a DGX H100) cap it near 100 GB/s.

Blocking saves every N steps cost write_time / (N x step_time) of the training time. Young's
interval (J. W. Young 1974, "A first order approximation to the optimum checkpoint interval"),
sqrt(2 x write time x mean time between failures), minimises lost work plus save time; the job's
failure rate scales the Llama 3 run's 419 unexpected interruptions in 54 days on 16,384 GPUs
(Dubey et al. 2024, Sec. 3.3.4, Table 5) to the job's GPU count.
"""

from __future__ import annotations

import math

from simulator.scenario.config import Scenario
from simulator.common.units import GBps

WEIGHT_BYTES = 2  # 16-bit model weights
OPTIMIZER_BYTES = 12  # fp32 master weights, Adam m and v
DEFAULT_STORAGE_GBPS = 2000.0 / 2048  # Llama 3: 2 TB/s sustained over 2,048 nodes
LLAMA3_INTERRUPTIONS = 419  # unexpected interruptions (Dubey et al. 2024, Table 5)
LLAMA3_DAYS = 54
LLAMA3_GPUS = 16384


def storage_Bps(s: Scenario) -> float:
    """Per-node checkpoint write bandwidth in bytes/s (scenario value or the documented default)."""
    value = s.cluster.storage_bandwidth_GBps
    return GBps(DEFAULT_STORAGE_GBPS if value is None else value)


def checkpoint_bytes(total_params: float) -> float:
    """Bytes of one checkpoint: (2 + 12) bytes per parameter, every parameter once."""
    return total_params * (WEIGHT_BYTES + OPTIMIZER_BYTES)


def mtbf_s(num_gpus: int) -> float:
    """Mean time between job interruptions, the Llama 3 failure rate per GPU scaled to ``num_gpus``."""
    per_gpu_rate = LLAMA3_INTERRUPTIONS / (LLAMA3_DAYS * 86400.0 * LLAMA3_GPUS)
    return 1.0 / (per_gpu_rate * num_gpus)


def checkpoint_plan(s: Scenario, total_params: float, step_time_s: float,
                    every_steps: tuple[int, ...] = (100, 500, 1000)) -> dict:
    """Full against sharded checkpoint: bytes, write time, and the cost of saving every N steps."""
    size = checkpoint_bytes(total_params)
    nodes = s.cluster.num_nodes
    world = s.cluster.num_gpus
    bw = storage_Bps(s)
    full_s = size / bw
    sharded_s = size / nodes / bw
    mtbf = mtbf_s(world)
    young_s = math.sqrt(2 * sharded_s * mtbf)
    return {
        "checkpoint_bytes": size,
        "shard_bytes_per_gpu": size / world,
        "storage_bandwidth_GBps_per_node": bw / 1e9,
        "storage_default": s.cluster.storage_bandwidth_GBps is None,
        "full_write_s": full_s,
        "sharded_write_s": sharded_s,
        "every": [{"steps": n, "full_overhead": full_s / (n * step_time_s),
                   "sharded_overhead": sharded_s / (n * step_time_s)} for n in every_steps],
        "mtbf_s": mtbf,
        "young_interval_s": young_s,
        "young_interval_steps": max(1, round(young_s / step_time_s)),
    }
