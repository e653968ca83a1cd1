"""NCCL's three wire protocols for ring collectives: fixed latency, per-step latency, efficiency.

NCCL moves ring data with one of three protocols and picks, per call, the one its cost model
says is fastest (``time = latency + bytes / bandwidth``, NVIDIA/nccl ``src/graph/tuning.cc``,
2.18-2.21). The constants below are that file's, in seconds:

- base latency per call (Ring): LL 6.6 us, LL128 14.0 us, Simple 8.4 us;
- latency per ring step over NVLink: LL 0.6 us, LL128 1.9 us, Simple 3.4 us; over the network:
  LL 2.7 us, LL128 4.0 us, Simple 14.0 us;
- bandwidth: Simple uses the whole link; LL128 carries 120 useful bytes per 128 (0.92 in
  NCCL's model) and is enabled only inside an NVLink domain; LL sends 8-byte data with 8-byte
  flags, 1/4 of the bus bandwidth for all_reduce or across nodes (1/3 otherwise), at most
  19 GB/s across nodes (``llMaxBws``). That cap is on the whole collective: NCCL's tuner
  multiplies the per-channel bandwidth by the channel count and then takes the minimum with
  ``llMaxBw`` (``ncclTopoTuneModel``: ``busBw = nChannels * bw``, then ``busBw = min(llMaxBw,
  busBw * ...)`` for LL), so a collective running as k rings (channels) gets 19 / k GB/s per ring.
  NCCL also caps LL at 87.7 GB/s inside a node; the measured 1 MiB DGX H100 point (27.4 us) is
  faster than that cap allows, so it is left out.

Checked against ``validation/collectives.yaml`` (8 x H100 all_reduce, measured vs this model
with the ring on 450 GB/s NVLink, time): 8 B 13.7 vs 15.0 us (LL), 1 MiB 27.4 vs 31.3 us (LL),
16 MiB 124 vs 112 us (LL128), 128 MiB 586 vs 578 us (Simple). NCCL's per-step latencies are
measured end to end (wire, switch, flags and kernel), so they replace the topology's hop
latencies for ring collectives.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

US = 1e-6


@dataclass(frozen=True)
class Protocol:
    name: str
    base_s: float
    step_nvlink_s: float
    step_net_s: float
    intra_node_only: bool = False


SIMPLE = Protocol("Simple", 8.4 * US, 3.4 * US, 14.0 * US)
LL128 = Protocol("LL128", 14.0 * US, 1.9 * US, 4.0 * US, intra_node_only=True)
LL = Protocol("LL", 6.6 * US, 0.6 * US, 2.7 * US)
PROTOCOLS = (SIMPLE, LL128, LL)

LL128_EFFICIENCY = 0.92
LL_MAX_BUSBW_INTER_Bps = 19.0e9


def efficiency(proto: Protocol, op: str, link_bw: float, multi_node: bool, channels: int = 1) -> float:
    """Useful fraction of ``link_bw`` (bytes/s) the protocol delivers on one of ``channels`` rings
    that run the collective together (LL's cap across nodes is the whole collective's)."""
    if proto is SIMPLE:
        return 1.0
    if proto is LL128:
        return LL128_EFFICIENCY
    share = 1 / 4 if (multi_node or op == "all_reduce") else 1 / 3
    return min(share, LL_MAX_BUSBW_INTER_Bps / (link_bw * max(1, channels))) if multi_node else share


def step_latency(proto: Protocol, inter_fraction: float) -> float:
    """Mean latency of one ring step when ``inter_fraction`` of the ring's edges cross nodes."""
    return (1 - inter_fraction) * proto.step_nvlink_s + inter_fraction * proto.step_net_s


def choose(op: str, nbytes: float, steps: int, link_bw: float, inter_fraction: float,
           channels: int = 1, shared_bw: float | None = None) -> tuple[Protocol, float]:
    """(protocol, efficiency) with the smallest modelled time for ``nbytes`` sent per rank over
    ``steps`` ring steps on links of ``link_bw``, one of ``channels`` rings of the collective that
    gets ``shared_bw`` of its links when they all run (default ``link_bw``); the efficiency
    inflates the bytes relative to ``link_bw``. Ties go to Simple, then LL128."""
    rate = link_bw if shared_bw is None else shared_bw
    multi_node = inter_fraction > 0
    best = None
    for proto in PROTOCOLS:
        if proto.intra_node_only and multi_node:
            continue
        eff = efficiency(proto, op, link_bw, multi_node, channels)
        t = proto.base_s + steps * step_latency(proto, inter_fraction) + nbytes / eff / rate
        if best is None or t < best[0]:
            best = (t, proto, eff)
    return best[1], best[2]


# --- NVLS: NVLink SHARP, reduction and multicast in the NVSwitch ------------------------------
#
# NCCL's NVLS algorithm (2.17+, NVSwitch gen 3 and later: H100/H200 HGX, B200/B300 HGX, GB200/GB300
# NVL72) reduces in the switch: each GPU pulls the switch-reduced sum of its slice
# (``multimem.ld_reduce``) and multicasts the result back (``multimem.st``). NCCL's tuning model
# (``src/graph/tuning.cc``, ``ncclTopoTuneModel``; ``src/graph/search.cc``,
# ``ncclTopoSearchTryNvls``) prices it as follows, and stepsim uses the same terms:
# - channels c = min(n, NCCL_MAX_NVLS_ARITY = 32) (``src/include/device.h``); a GPU's NVLink carries
#   one unit per channel and one more for the channel it heads, so a channel gets L / (c + 1) of the
#   per-GPU NVLink rate L and the graph c L / (c + 1);
# - all_reduce bus bandwidth 2 eff L (c - 1) / (c + 1) (two pipelined operations, one channel kept
#   back), eff = ``nvlsEfficiency``: 0.85 Hopper, 0.74 Blackwell; L in NCCL's own NVLink rating
#   (``src/graph/topo.h``: 20.6 of 25 GB/s per NVLink4 link, 40.1 of 50 per NVLink5 link), which
#   is what the cluster's NVLink links carry (``GPUSpec.nvlink_efficiency``), so eff applies as is
#   (0.85 x 20.6 / 25 = 0.700 and 0.74 x 40.1 / 50 = 0.593 of the nominal rate);
# - reduce_scatter / all_gather: c L / (c + 1) x eff x (n - 1) / n x (n - 1) / n for the full
#   buffer, and only when n <= 32 (``enqueue.cc``: NVLS for them needs localRanks <= the arity);
# - latency: 25 us per call on NVLink (hwLatencies NVLINK/NVLS/Simple), base 0; Simple only.
# For 8 x H100 this is 2 x 0.700 x 450 x 7/9 = 490 GB/s all_reduce busbw against 466-480 measured
# (validation/collectives.yaml), where the ring cannot exceed the 450 GB/s link rate.

NVLS_LATENCY_S = 25.0 * US
NVLS_MAX_ARITY = 32
NVLS_EFFICIENCY = {4: 0.85, 5: 0.74}  # by NVLink generation, of NCCL's NVLink rating (the links' rate)


def nvls_wire_bytes(op: str, n: int, size: float) -> float | None:
    """Bytes per GPU, each direction of its NVLink, that NCCL's model charges an NVLS ``op`` of
    ``size`` over ``n`` GPUs of one NVSwitch domain (before efficiency); None where NCCL has no NVLS."""
    c = min(n, NVLS_MAX_ARITY)
    if n < 2 or c < 2:
        return None
    if op == "all_reduce":
        return size * (n - 1) * (c + 1) / (n * (c - 1))
    if op in ("reduce_scatter", "all_gather") and n <= NVLS_MAX_ARITY:
        return size * (c + 1) / c * (n / (n - 1)) ** 2
    return None


def nvls_time(op: str, n: int, size: float, link_bw: float, generation: int) -> float | None:
    """Modelled time of an uncontended NVLS ``op`` (NCCL's cost model on ``link_bw`` per direction)."""
    eff = NVLS_EFFICIENCY.get(generation)
    wire = nvls_wire_bytes(op, n, size)
    if eff is None or wire is None:
        return None
    return NVLS_LATENCY_S + wire / (link_bw * eff)


def ring_time(op: str, n: int, size: float, link_bw: float, inter_fraction: float = 0.0) -> float:
    """Modelled time of an uncontended ring ``op`` in the protocol :func:`choose` picks."""
    steps = 2 * (n - 1) if op == "all_reduce" else n - 1
    nbytes = steps / n * size
    proto, eff = choose(op, nbytes, steps, link_bw, inter_fraction)
    return proto.base_s + steps * step_latency(proto, inter_fraction) + nbytes / (link_bw * eff)


# --- NVLS + SHARP: in-network reduction across nodes (NCCL's NVLS algorithm with CollNet) -------
#
# With the SHARP plugin (NCCL_COLLNET_ENABLE=1, InfiniBand Quantum switches with SHARP), NCCL runs
# a multi-node all_reduce as NVLS: the node's NVSwitch reduces across its local GPUs and each NVLS
# head sends its slice through its NIC to the SHARP aggregation tree, which reduces across nodes
# in the switches and returns the result, multicast back over NVLink. ``src/graph/tuning.cc``
# (``ncclTopoTuneModel``) prices it per channel as min(intra, inter): intra the single-node NVLS
# term above with c = min(local ranks, 32) channels, inter the channel's NIC rate (``bwInter``),
# over as many channels as the node has NVLS heads (one per NIC), so the bus bandwidth is
# min(2 eff L (c - 1) / (c + 1), k x NIC) for k local GPUs each with its own NIC, and the time
# S 2(n - 1)/n / busbw plus the NVLS latencies: 25 us on NVLink and 18 us on the network
# (hwLatencies NVLINK and NET, NVLS/Simple; the route's own latency is left out). NCCL's model
# charges each NIC 2(n-1)/n x S/k, twice what the aggregation tree moves (S/k up, S/k down): the
# model is kept as NCCL's tuner sees it. Only all_reduce: reduce_scatter and all_gather over SHARP
# need plugin support NCCL checks at run time. NCCL uses it only when CollNet is enabled, so
# ``auto`` never picks it; ``algorithm: sharp`` asks for it.

SHARP_NET_LATENCY_S = 18.0 * US


def sharp_wire_bytes(n: int, local: int, size: float) -> tuple[float, float] | None:
    """(NVLink bytes per GPU per direction, NIC bytes per GPU per direction) NCCL's model charges an
    NVLS+SHARP all_reduce of ``size`` over ``n`` GPUs, ``local`` on each node; None where it cannot run."""
    c = min(local, NVLS_MAX_ARITY)
    if n <= local or local < 2 or n % local:
        return None
    return size * (n - 1) * (c + 1) / (n * (c - 1)), size * 2 * (n - 1) / (n * local)


def sharp_time(n: int, local: int, size: float, link_bw: float, nic_bw: float, generation: int) -> float | None:
    """Modelled time of an uncontended NVLS+SHARP all_reduce (see above); None where it cannot run."""
    eff = NVLS_EFFICIENCY.get(generation)
    wire = sharp_wire_bytes(n, local, size)
    if eff is None or wire is None:
        return None
    return NVLS_LATENCY_S + SHARP_NET_LATENCY_S + max(wire[0] / (link_bw * eff), wire[1] / nic_bw)


# --- SMs a communication kernel holds ------------------------------------------------------------
#
# NCCL runs a collective or a send/receive as one kernel with one CTA per channel, and a CTA stays
# on its SM for the whole call, including the time it waits for peers. A CTA has up to
# NCCL_MAX_NTHREADS = 640 threads and scratch shared memory for each of their warps
# (``ncclShmemDynamicSize``, ``src/include/device.h``), and a Hopper GEMM CTA needs most of an SM's
# shared memory: the two do not share an SM, and a compute kernel launched beside a collective gets
# the SMs the collective left. An Nsight Systems trace of PyTorch FSDP on an H100 shows the
# all-gather kernel with 24 CTAs beside a 132-CTA GEMM, whose time then nearly doubles from the
# wave it spills
# (NVIDIA developer forum, "Compute-communication overlap causes severe GEMM performance
# degradation because of tail effect", 2025); averaged over GPT and Llama training kernels on
# A100 and H100, overlapped compute runs 18.9% slower than alone (max 40%; Lee et al.,
# "Characterizing compute-communication overlap in GPU-accelerated distributed deep learning",
# arXiv 2507.03114, 2025). 24 of 132 SMs taken is a 1 / (1 - 24/132) = 1.22x slower compute,
# the same order. DeepEP's dispatch and combine kernels run on 20 SMs (its historical default,
# Megatron-core ``moe_flex_dispatcher_num_sms`` docstring).
NCCL_KERNEL_SMS = 24
DEEPEP_KERNEL_SMS = 20


# With NCCL user-buffer registration of the data-parallel buffers (Megatron-core
# ``DistributedDataParallelConfig.nccl_ub``: the FSDP and distributed-optimizer parameter and
# gradient buffers allocated from a pool registered with NCCL, ``fsdp_double_buffer``), NCCL reads
# and writes them in place and picks its SM-lean kernels (NVLS and its copy-engine and symmetric
# kernels on NVLink; NCCL docs "User Buffer Registration": it "can accelerate collectives and
# reduce the resource usage (e.g. #channel usage)"). Megatron-core's docstring of ``nccl_ub``
# (megatron/core/distributed/distributed_data_parallel_config.py) gives the SMs an all-gather and
# a reduce-scatter then use, by the domain the group spans, without SHARP: NVLink only 4 / 5,
# NVLink and InfiniBand 16 / 16, InfiniBand only (one GPU per node) 1 / 4. It gives no figure for
# an all-reduce, which keeps NCCL_KERNEL_SMS; nor does stepsim take the SHARP column (Megatron's
# --use-sharp is not a scenario key).
REGISTERED_KERNEL_SMS = {"nvl": {"all_gather": 4, "reduce_scatter": 5},
                         "nvl+ib": {"all_gather": 16, "reduce_scatter": 16},
                         "ib": {"all_gather": 1, "reduce_scatter": 4}}
REGISTERED_AXES = ("dp", "fsdp")


def registered_domain(members: Sequence[int], gpus_per_domain: int) -> str:
    """Which row of ``REGISTERED_KERNEL_SMS`` a group of ranks (GPU = rank) spans: one NVLink
    domain (``nvl``), several with one member each (``ib``), or several with more (``nvl+ib``)."""
    domains = Counter(m // gpus_per_domain for m in members)
    if len(domains) == 1:
        return "nvl"
    return "ib" if max(domains.values()) == 1 else "nvl+ib"


def kernel_sms(op: str, axis: str, token_dispatcher: str, registered: str | None = None) -> int:
    """SMs the communication kernel of one call holds on each of its GPUs while it runs;
    ``registered``: the data-parallel buffers are registered with NCCL and the call's group spans
    that domain (``registered_domain``)."""
    if axis == "ep" and op == "all_to_all" and token_dispatcher == "flex":
        return DEEPEP_KERNEL_SMS
    if registered is not None and axis in REGISTERED_AXES:
        return REGISTERED_KERNEL_SMS[registered].get(op, NCCL_KERNEL_SMS)
    return NCCL_KERNEL_SMS


def least_kernel_sms(op: str, axis: str, token_dispatcher: str, registered: bool) -> int:
    """The fewest SMs a call of ``op`` on ``axis`` holds on any group (``kernel_sms``), for bounds
    that must not exceed the step: with registered buffers, its least over the domains."""
    if registered and axis in REGISTERED_AXES:
        return min(kernel_sms(op, axis, token_dispatcher, d) for d in REGISTERED_KERNEL_SMS)
    return kernel_sms(op, axis, token_dispatcher)
