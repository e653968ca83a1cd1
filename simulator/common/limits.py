"""Upper bounds on sizes and counts: a value past them is a typo or a unit slip, not a plan.

Each bound is a power of two set well above the largest published value of its kind (named
below), so every real or near-future configuration passes, while ``hidden_size: 10**30`` is a
one-line error instead of astronomic step times. The error names the bound and its reason.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Limit:
    maximum: int
    why: str

    def describe(self) -> str:
        return f"at most {self.maximum:,} ({self.why})"


# Model dimensions. Published extremes: hidden 25,600 (Megatron-LM 1T, Narayanan et al. 2021,
# Table 1), 128 layers (same), FFN 102,400 (same, 4 h), vocabulary about 262,000 (Gemma 3),
# 384 routed experts (Kimi K2), context 10M tokens (Llama 4 Scout).
HIDDEN_SIZE = Limit(2**17, "5x the widest published model, Megatron-LM 1T at 25,600")
NUM_LAYERS = Limit(2**12, "32x the deepest published LLM, Megatron-LM 1T at 128 layers")
INTERMEDIATE_SIZE = Limit(2**19, "5x the widest published FFN, Megatron-LM 1T at 102,400")
VOCAB_SIZE = Limit(2**22, "16x the largest published vocabulary, Gemma 3 at about 262,000")
NUM_EXPERTS = Limit(2**14, "40x the most routed experts published, Kimi K2 at 384")
SEQ_LENGTH = Limit(2**24, "above the longest published context, Llama 4 Scout at 10M tokens")
GLOBAL_BATCH = Limit(2**24, "sequences; 8,000x Llama 3 405B's final 2,048 (16M tokens)")
MICRO_BATCH = Limit(2**16, "sequences per micro-batch")

# Cluster. The largest single training clusters built to date hold about 100,000 GPUs (2024);
# the largest NVLink domains announced are 576 GPUs (NVIDIA Vera Rubin NVL576).
NUM_GPUS = Limit(2**17, "GPUs; above the largest training clusters built, about 100,000 GPUs")
GPUS_PER_NODE = Limit(1024, "GPUs per node; the largest announced NVLink domain is 576")
NVLINK_GBPS = Limit(10**5, "GB/s per direction; 50x NVLink 5's 900")
NETWORK_GBPS = Limit(10**6, "Gb/s per NIC; 600x today's 1.6 Tb/s NICs")
FABRIC_FANOUT = Limit(2**17, "nodes per leaf or leaves per pod; a fabric has no more ports than the largest "
                             "cluster has GPUs")
OVERSUBSCRIPTION = Limit(1024, "a fabric ratio; real ones are 1 to 8")
GPU_MEMORY_GIB = Limit(2**16, "GiB per GPU; 200x B200's 192 GB")
GPU_PEAK_TFLOPS = Limit(10**6, "TFLOP/s per GPU; 200x B200's dense FP8 peak")
GPU_POWER_W = Limit(5000, "W per GPU; 3.5x GB300's 1,400 W")
STORAGE_GBPS = Limit(2**16, "GB/s per node; 600x a node's eight 400 Gb/s NICs")
HOST_LINK_GBPS = Limit(2**14, "GB/s per GPU and direction; 36x NVLink-C2C's 450")
PREFETCH_DEPTH = Limit(1024, "layers gathered ahead; deeper than any model has layers to prefetch")

# Simulation work: the engine walks every micro-batch of every stage. Megatron-LM's largest
# published runs use at most a few thousand micro-batches per pipeline per step.
MICROBATCHES = Limit(2**14, "micro-batches per pipeline per step (global batch / (micro-batch x dp))")

# Collective sizes: 1 PiB is beyond the memory of any GPU node.
MESSAGE_BYTES = Limit(2**50, "bytes, 1 PiB: beyond any node's memory")

# Simulation cost. An all-to-all couples every ordered pair of its ranks in one transfer: its flows,
# and the time and memory to simulate it, grow with the square of the ranks (2,048 GPUs: 4.2M pairs,
# about 24 s and 1.5 GB; measured on one core, 2026-11). Refused above, before simulating.
ALL_TO_ALL_PAIRS = Limit(2**22, "pairs of ranks in one all-to-all, about 2,048 ranks; its cost grows with "
                                "the square of the ranks")

# The work of one simulated step: each micro-batch passes every layer forward and backward on
# the ranks simulated (one per pipeline stage, folded), about 40 engine events per micro-batch and
# layer (GPT-3 175B: 341K events for 96 x 96; Llama 3 405B: 88K for 16 x 126) at about 180K events
# a second on one core (stepsim bench, 2026-11-28). 2**22 such passes are about 15 minutes.
STEP_WORK = Limit(2**22, "micro-batch x layer passes simulated, about 15 minutes of simulation")

# Unfolded runs (--no-fold) simulate every rank instead of one per pipeline stage: Llama 3 405B on
# 1,024 GPUs takes about 260 s and 1.8 GB so (measured 2026-11, issue 48), and the cost grows with
# the ranks. Above this many ranks an unfolded run would take hours: refused.
UNFOLDED_RANKS = Limit(2**13, "ranks simulated one by one; 1,024 take minutes and the cost grows with the ranks")

# Studies: a sweep runs one simulation per point of the cartesian product of its --vary values.
SWEEP_POINTS = Limit(2**17, "points; a day of the fastest scenario's simulations on one core")

# Local worker processes (``--workers``). The simulator is CPU-bound, so more than a few per CPU
# only queue for the cores while each holds its own simulation in memory (about 0.1-1 GiB on a
# 16K-GPU cluster).
WORKERS_PER_CPU = 4


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity mask, which a container or ``taskset`` narrows),
    else the machine's."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_workers() -> int:
    """``--workers`` left out, on every command that has it: one process per CPU."""
    return cpu_count()


def local_limit() -> int:
    """The most local worker processes: ``WORKERS_PER_CPU`` per CPU."""
    return WORKERS_PER_CPU * cpu_count()


def workers_help(ray: bool = False) -> str:
    """The help of ``--workers``, one text for every command (``ray``: the command has ``--executor``)."""
    text = (f"simulations in parallel, each in its own process (default: one per CPU, {default_workers()} here; "
            f"at most {local_limit()} local ones")
    return text + ("; with --executor ray --address, any number of Ray workers)" if ray else ")")
