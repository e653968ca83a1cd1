"""The types every cost model shares: one kernel (``Op``), the kernels of one block of a layer
(``BlockCost``), a layer's blocks (``LayerCost``), the steps a layer plan is written in before it
is priced (``Gemm``, ``Mem``, ``Latency``, ``AttnCore``), and element sizes.

Kept apart from the models that build them (``compute``, ``moe``, ``software``, ``memory``,
``offload``) so that those import the types in one direction and never each other in a circle.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

ACT_BYTES = 2  # 16-bit activations
# FP8 recipes whose GEMMs keep a quantized copy of their input for the backward (``layer_activation_bytes``):
# one byte per element (E4M3; MXFP8's E8M0 scales, one byte per 32 elements, are left out)
FP8_SAVED_INPUT_BYTES = 1.0


# Ops whose time is the GPU waiting on the host, not running kernels: the dropless MoE layer's
# token-count sync and Megatron-core's GLU-clamp offset copy (``moe.price_host_sync``).
HOST_WAIT_OPS = ("moe_host_sync", "moe_glu_sync")



@dataclass(frozen=True)
class Op:
    """One kernel on one GPU, after sharding."""

    name: str
    flops: float
    bytes: float
    time_s: float
    kernels: int = 1  # kernel launches this op stands for (an unfused chain of elementwise kernels > 1)
    shape: tuple[float, float, float, int] | None = None  # a GEMM's (m, n, k, groups): calibration by shape



@dataclass(frozen=True)
class BlockCost:
    ops: tuple[Op, ...] = ()

    # Cached (the block is immutable): the engine reads a block's time once per micro-batch and
    # the planner's bound once per layer and layout.
    @functools.cached_property
    def time_s(self) -> float:
        return sum(op.time_s for op in self.ops)

    @functools.cached_property
    def flops(self) -> float:
        return sum(op.flops for op in self.ops)

    @functools.cached_property
    def kernels(self) -> int:
        return sum(op.kernels for op in self.ops)

    @functools.cached_property
    def host_wait_s(self) -> float:
        """Of ``time_s``, the GPU idle waiting on the host inside the block (``HOST_WAIT_OPS``)."""
        return sum((op.time_s for op in self.ops if op.name in HOST_WAIT_OPS), 0.0)



@dataclass(frozen=True)
class LayerCost:
    attn_fwd: BlockCost
    mlp_fwd: BlockCost
    attn_bwd: BlockCost
    mlp_bwd: BlockCost
    attn_recompute: BlockCost
    mlp_recompute: BlockCost

    @property
    def fwd_time_s(self) -> float:
        return self.attn_fwd.time_s + self.mlp_fwd.time_s

    @property
    def bwd_time_s(self) -> float:
        """Backward including whatever recompute re-runs first."""
        return sum(b.time_s for b in (self.attn_bwd, self.mlp_bwd, self.attn_recompute, self.mlp_recompute))



@dataclass(frozen=True)
class Gemm:
    name: str
    m: float
    n: float
    k: float
    groups: int = 1
    streams: int | None = None  # per-GEMM kernels on this many streams (see gemm_op); None: one grouped kernel



@dataclass(frozen=True)
class Mem:
    """A memory-bound step of ``kernels`` kernels moving ``nbytes`` forward; its backward moves
    ``bwd_factor`` times that in ``bwd_kernels`` kernels (default: twice the bytes, as many kernels)."""

    name: str
    nbytes: float
    kernels: int = 1
    bwd_factor: float = 2.0
    bwd_kernels: int | None = None



@dataclass(frozen=True)
class Latency:
    """A fixed stall of the GPU stream (a host sync), forward only: backward reuses its result."""

    name: str
    time_s: float



@dataclass(frozen=True)
class AttnCore:
    window: int | None = None



Step = Gemm | Mem | AttnCore | Latency
