"""Per-rank programs as data: what one pipeline stage does in a step, as an ordered tuple of ops.

``build_program`` is a pure function of the scenario, its workload and a stage: it expands the
stage's pipeline schedule (``schedules``) into compute blocks, collective launches and waits,
pipeline sends and receives, and the data-parallel stream's collectives. The engine
(``engine.py``) only walks these tuples with simpy; it decides nothing. Every rank of a stage
runs the same program (its groups differ), so a program is built once per stage.

What the ops express, and where each choice comes from:
- Tensor parallelism (Shoeybi et al. 2019; sequence parallelism, Korthikanti et al. 2022): the
  all-reduce, or all-gather + reduce-scatter, around attention and the MLP; in backward the
  input-gradient collective overlaps the weight-gradient GEMM (Megatron-LM's
  ``LinearWithGradAccumulationAndAsyncCommunication``) unless ``overlap.tp_comm`` is off; async TP
  (torchtitan, TE userbuffers) hides the gather under the first GEMM and the scatter under the last.
- Context parallelism: the K/V exchange overlaps the attention core (Megatron-core/TE ring
  ``p2p``) or only the local causal call (``all_gather``, Llama 3 Sec. 3.3.2).
- Expert parallelism: dispatch and combine all-to-alls around the local experts, optionally
  overlapped (``moe.overlap_a2a``).
- Data parallelism: gradient buckets reduced on their own stream as the last backward of a chunk
  produces them (Megatron DDP ``overlap_grad_reduce``), parameter all-gathers for ZeRO-1/2
  (``overlap_param_gather``), and for ZeRO-3/FSDP a per-layer gather prefetched
  ``param_prefetch_depth`` layers ahead and a per-layer reduce-scatter after each backward.
- Zero-bubble schedules split a backward into B (input gradient) and W (weight gradient: the
  ``*_wgrad`` GEMMs; Qi et al. 2024, Sec. 2): a split B leaves them out and its W step runs them,
  and a chunk's gradients are reduced after its last W instead of its last B.
- CPU activation offloading (``workload.offload``): a layer's offloaded activations are copied to
  the host after its forward and back before its backward, on the rank's two copy streams.
  Layer-level (Transformer Engine's default scheduling, N of L layers): the forward of layer j
  waits for layer j - (L - N)'s copy out, layer k's copy back starts after layer k + (L - N)'s
  backward, and a layer's backward waits for it. Module-level (Megatron-core's fine-grained
  offloading): the forward never waits; each layer's copy back starts at the backward of the
  layer before it in backward order (across micro-batches and chunks), and the backward waits for
  it; a chunk's last layer stays on the GPU when its backward comes right after its forward.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simulator.scenario.config import Scenario
from simulator.layout.schedules import Placement, Step, placement, schedule
from simulator.workload.compute import (CP_CORE_OPS, CP_LOCAL_OPS, bucket_reduce_calls, forward_weights, joined,
                                        module_gather_calls, released_weights, split_around,
                                        split_at_gemm, split_weight_grad)
from simulator.workload.kernels import BlockCost
from simulator.workload.frameworks import fsdp_gathered_once, routing_graphed
from simulator.workload.moe import split_moe_block
from simulator.workload.offload import resident_window
from simulator.workload.workload import GRAD_BYTES, PARAM_BYTES, Workload


# The ops. ``group`` names a process group of the rank: tp, cp, dpcp, ep, edp, etp. ``axis`` is the
# parallelism the trace charges the communication to. ``handle`` numbers a launch within a program.
# Ops are values: hashed and compared by their fields, never changed once built (``dataclasses.replace``
# makes a changed copy). They are not declared frozen because a frozen dataclass sets each field
# through object.__setattr__, four times slower to build, and a step builds hundreds of thousands.

@dataclass(slots=True, unsafe_hash=True)
class Compute:
    kind: str  # F, B, W, R (recompute), embed, head, opt
    block: BlockCost
    label: str
    microbatch: int = -1
    chunk: int = -1
    layer: int = -1
    graphed: bool = False  # replayed from a CUDA graph (``framework_options.cuda_graph_scope``): one host launch


@dataclass(slots=True, unsafe_hash=True)
class Launch:
    """Start the rank's part of a collective; it runs while the rank goes on. ``calls`` > 1: the
    bytes go as that many equal calls back to back on one stream, each paying its own latency
    (``network.collectives.Collectives.prepare``): a stack that fetches each module's parameters
    with its own call (``compute.module_gather_calls``)."""
    handle: int
    group: str
    op: str
    nbytes: float
    axis: str
    stamp: bool = False  # remember when it completes (it is later waited for among others)
    calls: float = 1.0


@dataclass(slots=True, unsafe_hash=True)
class Enqueue:
    """Queue a collective on the rank's data-parallel stream, which runs them one after another
    (``calls`` as for ``Launch``)."""
    handle: int
    group: str
    op: str
    nbytes: float
    axis: str
    calls: float = 1.0


@dataclass(slots=True, unsafe_hash=True)
class Wait:
    """Block the compute stream until every handle is done (a ``wait`` row when it blocks)."""
    handles: tuple[int, ...]
    axis: str
    label: str = ""
    microbatch: int = -1
    chunk: int = -1
    layer: int = -1


@dataclass(slots=True, unsafe_hash=True)
class Copy:
    """Copy activations between the GPU and host memory (CPU offloading, ``workload.offload``) on
    the rank's copy stream for ``direction`` (d2h, h2d), which runs its copies one after another
    beside the compute; not before the copy ``after`` (a handle, -1: none) has ended."""
    handle: int
    direction: str
    nbytes: float
    after: int = -1
    microbatch: int = -1
    chunk: int = -1
    layer: int = -1


@dataclass(slots=True, unsafe_hash=True)
class Send:
    """Post activations (kind F) or gradients (B) of ``vstage`` for micro-batch ``microbatch``."""
    dst_stage: int
    vstage: int
    microbatch: int
    kind: str


@dataclass(slots=True, unsafe_hash=True)
class Recv:
    vstage: int
    microbatch: int
    kind: str
    chunk: int


@dataclass(slots=True, unsafe_hash=True)
class StepBegin:
    """A schedule step starts (after its receive)."""


@dataclass(slots=True, unsafe_hash=True)
class StepEnd:
    kind: str
    microbatch: int
    chunk: int


@dataclass(slots=True, unsafe_hash=True)
class HostStart:
    """Where the host's kernel-issue clock starts, relative to the step (0 or earlier)."""
    time_s: float


@dataclass(slots=True, unsafe_hash=True)
class CloseStream:
    """No more collectives for the data-parallel stream; the rank waits for it to drain."""


@dataclass(slots=True, unsafe_hash=True)
class JoinStream:
    pass


Op = Compute | Launch | Enqueue | Wait | Copy | Send | Recv | StepBegin | StepEnd | HostStart | CloseStream | JoinStream


def schedule_steps(s: Scenario, stage: int) -> tuple[Step, ...]:
    """The rank's steps for the whole step: the schedule over ``microbatches_per_pass``
    micro-batches, once per ``training.pipeline_passes`` (pass k numbers its micro-batches from
    k x microbatches_per_pass), one pass after another."""
    par = s.parallelism
    per_pass = s.microbatches_per_pass
    one = schedule(s.pipeline_schedule, stage, par.pp, per_pass, par.vp)
    if s.training.pipeline_passes == 1:
        return one
    return tuple(replace(st, microbatch=st.microbatch + k * per_pass)
                 for k in range(s.training.pipeline_passes) for st in one)


def grad_reduce_op(zero: int, collective: str = "reduce_scatter") -> str:
    """The collective that reduces a data-parallel gradient bucket: all-reduce without ZeRO, else
    the framework's (``Software.grad_collective``): a reduce-scatter (ZeRO-1/2 keep 1/dp of the
    gradients; ZeRO-3 reduce-scatters per layer) or, as DeepSpeed's ZeRO-1/2 do, an all-reduce of
    the bucket from which each rank keeps its partition."""
    return "all_reduce" if zero == 0 else "reduce_scatter" if zero == 3 else collective


def stage_placement(s: Scenario) -> Placement:
    """Where the scenario's schedule puts each model chunk (``schedules.Placement``)."""
    return placement(s.pipeline_schedule, s.parallelism.pp, s.parallelism.vp)


# Compute labels whose blocks a cuda_graph_scope entry captures (Megatron-core CudaGraphModule): the
# attention block with "attn", the dense MLP with "mlp"; MoE blocks are decided in ``moe_block``.
GRAPHED_LABELS = {"attention": "attn", "mlp": "mlp"}


def build_program(s: Scenario, work: Workload, stage: int, extras: bool = True) -> tuple[Op, ...]:
    """The ordered ops of every rank of pipeline stage ``stage`` (pure)."""
    return _Builder(s, work, stage, extras).build()


class _Builder:
    def __init__(self, s: Scenario, work: Workload, stage: int, extras: bool):
        self.s, self.w, self.stage, self.extras = s, work, stage, extras
        self.sw = work.software
        par = s.parallelism
        self.sp = par.sequence_parallel and par.tp > 1
        self.ops: list = []
        self.next_handle = 0
        self.launch_at: dict[int, int] = {}  # handle -> index of its Launch op
        self.multi: set[int] = set()  # handles a multi-handle wait reads (``_stamped``)
        # ZeRO-3 under a pipeline, torch pipelining style (``frameworks.fsdp_gathered_once``): a layer
        # is gathered at its first forward of the step and stays unsharded over the micro-batches;
        # its gradients are reduce-scattered after the chunk's last backward
        self.unsharded = fsdp_gathered_once(s, self.sw)
        self.held_grads: list = []  # layers whose reduce-scatter waits for the chunk's last backward
        self.replica_held = 0.0  # bytes of cross-copy all-reduce not yet launched (``fsdp_grad_ops``)
        self._splits: dict = {}  # (split function, id(block), args) -> (block, its parts)
        self._memo_cache: dict = {}  # per-layer figures (``_memo``)
        # ZeRO-2 reducing in every micro-batch's backward (DeepSpeed's partitioned gradients)
        self.every_microbatch = par.zero_stage == 2 and self.sw.zero2_reduce_every_microbatch

    def split(self, fn, block, *args):
        """``fn(block, *args)``, computed once per block: every micro-batch of a layer kind splits the
        same block the same way. The block is kept beside its parts so its id stays its own."""
        key = (fn, id(block), args)
        hit = self._splits.get(key)
        if hit is None:
            hit = self._splits[key] = (block, fn(block, *args))
        return hit[1]

    # emitting --------------------------------------------------------------------------------

    def compute(self, kind, block, label, microbatch=-1, chunk=-1, layer=-1, graphed=None):
        """Append a block; ``graphed`` None: the attention block and the dense MLP are replayed from
        CUDA graphs when the scenario's ``cuda_graph_scope`` names them (attn, mlp)."""
        if block.time_s > 0:
            if graphed is None:
                graphed = GRAPHED_LABELS.get(label, "") in self.sw.graph_scope
            self.ops.append(Compute(kind, block, label, microbatch, chunk, layer, graphed))

    def launch(self, group, op, nbytes, axis, calls=1.0) -> int:
        h = self.next_handle
        self.next_handle += 1
        self.launch_at[h] = len(self.ops)
        self.ops.append(Launch(h, group, op, nbytes, axis, False, calls))
        return h

    def enqueue(self, group, op, nbytes, axis, calls=1.0) -> int:
        h = self.next_handle
        self.next_handle += 1
        self.ops.append(Enqueue(h, group, op, nbytes, axis, calls))
        return h

    def wait(self, handles, axis, label="", microbatch=-1, chunk=-1, layer=-1):
        handles = tuple(handles)
        if len(handles) > 1:
            self.multi.update(handles)
        self.ops.append(Wait(handles, axis, label, microbatch, chunk, layer))

    def copy(self, direction, nbytes, after=-1, **at) -> int:
        h = self.next_handle
        self.next_handle += 1
        self.ops.append(Copy(h, direction, nbytes, after, **at))
        return h

    def collective(self, group, op, nbytes, axis, **at):
        self.wait((self.launch(group, op, nbytes, axis),), axis, op, **at)

    # one layer -------------------------------------------------------------------------------

    def layer_forward(self, layer, mb, chunk, kind="F"):
        s, w = self.s, self.w
        cost = w.layer_costs[layer]
        cp = s.parallelism.cp
        at = dict(microbatch=mb, chunk=chunk, layer=layer)
        if self.sp and self.sw.async_tp:
            cp_ev = self.launch("cp", "all_gather", w.cp_bytes * cp, "cp")
            self.async_tp_forward(kind, cost.attn_fwd, "qkv_proj", "out_proj", "attention", at)
            self.wait((cp_ev,), "cp", **at)
            if not s.model.is_moe_layer(layer):
                self.async_tp_forward(kind, cost.mlp_fwd, "mlp_up", "mlp_down", "mlp", at)
                return
            self.mlp_forward(layer, kind, at)
            return
        if self.sp:
            self.collective("tp", "all_gather", w.tp_bytes, "tp", **at)
        if cp > 1:
            self.context_parallel_attention(kind, cost.attn_fwd, w.cp_bytes, at)
        else:
            cp_ev = self.launch("cp", "all_gather", w.cp_bytes * cp, "cp")
            self.compute(kind, cost.attn_fwd, "attention", **at)
            self.wait((cp_ev,), "cp", **at)
        self.collective("tp", "reduce_scatter" if self.sp else "all_reduce", w.tp_bytes, "tp", **at)
        self.mlp_forward(layer, kind, at)

    def async_tp_forward(self, kind, block, first, last, label, at):
        """Async TP (torch micro-pipelined collective matmuls, TE userbuffers): the input
        all-gather runs under the first GEMM and the output reduce-scatter under the last
        (torchtitan async-TP post; Wang et al. 2022, 'Overlap communication with dependent
        computation via decomposition')."""
        w = self.w
        before, head, rest = self.split(split_around, block, (first,))
        middle, tail, after = self.split(split_around, rest, (last,))
        self.compute(kind, before, label, **at)
        gather = self.launch("tp", "all_gather", w.tp_bytes, "tp")
        self.compute(kind, head, label, **at)
        self.wait((gather,), "tp", "all_gather", **at)
        self.compute(kind, middle, label, **at)
        scatter = self.launch("tp", "reduce_scatter", w.tp_bytes, "tp")
        self.compute(kind, tail, label, **at)
        self.wait((scatter,), "tp", "reduce_scatter", **at)
        self.compute(kind, after, label, **at)

    def mlp_forward(self, layer, kind, at):
        cost = self.w.layer_costs[layer]
        moe = self.s.model.is_moe_layer(layer)
        if self.sp:
            self.mlp_tp_collective(moe, "all_gather", at)
        if moe:
            self.moe_block(kind, cost.mlp_fwd, at)
        else:
            self.compute(kind, cost.mlp_fwd, "mlp", **at)
        self.mlp_tp_collective(moe, "reduce_scatter" if self.sp else "all_reduce", at)

    def moe_block(self, kind, block, at):
        """Router and permutation, dispatch all-to-all, local experts, combine all-to-all,
        unpermutation and shared experts (``moe.split_moe_block``); reversed in backward. With
        ``moe.overlap_a2a`` the all-to-alls run under the rank's other work and are waited for at
        the end of the block."""
        w = self.w
        before, experts, after = self.split(split_moe_block, block)
        overlap = self.s.moe.overlap_a2a
        whole = "moe" in self.sw.graph_scope
        # the router and the EP preprocess run before the dispatch, their gradients after the combine
        routing = routing_graphed(self.sw.graph_scope)
        self.compute(kind, before, "moe", **at, graphed=whole or (routing and kind != "B"))
        if overlap:
            first = self.launch("ep", "all_to_all", w.ep_bytes, "ep")
        else:
            self.collective("ep", "all_to_all", w.ep_bytes, "ep", **at)
        self.compute(kind, experts, "moe", **at, graphed=whole)
        if overlap:
            second = self.launch("ep", "all_to_all", w.ep_bytes, "ep")
        else:
            self.collective("ep", "all_to_all", w.ep_bytes, "ep", **at)
        self.compute(kind, after, "moe", **at, graphed=whole or (routing and kind == "B"))
        if overlap:
            self.wait((first,), "ep", "all_to_all", **at)
            self.wait((second,), "ep", "all_to_all", **at)

    def mlp_tp_collective(self, moe, op, at):
        """The TP collective around an MLP. An MoE layer with expert TP (etp) below tp gathers and
        scatters over its etp group only, etp / tp of the bytes; with etp = 1 there is none."""
        par, w = self.s.parallelism, self.w
        if moe and par.expert_tp < par.tp:
            if par.expert_tp > 1:
                self.collective("etp", op, w.tp_bytes * par.expert_tp / par.tp, "tp", **at)
            return
        self.collective("tp", op, w.tp_bytes, "tp", **at)

    def layer_backward(self, layer, mb, chunk, split=False):
        """The layer's backward; ``split`` leaves its weight-gradient GEMMs to a later W step."""
        s, w = self.s, self.w
        cost = w.layer_costs[layer]
        attn_bwd, mlp_bwd = cost.attn_bwd, cost.mlp_bwd
        if split:
            attn_bwd, mlp_bwd = self.split(split_weight_grad, attn_bwd)[0], self.split(split_weight_grad, mlp_bwd)[0]
        at = dict(microbatch=mb, chunk=chunk, layer=layer)
        if s.training.recompute == "full":
            self.layer_forward(layer, mb, chunk, kind="R")
        moe = s.model.is_moe_layer(layer)
        if self.sp:
            self.mlp_tp_collective(moe, "all_gather", at)
        if s.training.recompute == "selective" and cost.mlp_recompute.ops:
            if moe and "moe" in (s.training.recompute_modules or ()):
                self.moe_block("R", cost.mlp_recompute, at)  # the whole layer, its all-to-alls too
            else:
                self.compute("R", cost.mlp_recompute, "moe" if moe else "mlp", **at)
        if moe:
            self.moe_block("B", mlp_bwd, at)
            self.mlp_tp_collective(moe, "reduce_scatter" if self.sp else "all_reduce", at)
        else:
            self.column_parallel_backward(mlp_bwd, "mlp_up", "mlp", at)
        if self.sp:
            self.collective("tp", "all_gather", w.tp_bytes, "tp", **at)
        if s.training.recompute == "selective":
            self.compute("R", cost.attn_recompute, "attention", **at)
        if s.parallelism.cp > 1:
            rest = self.context_parallel_attention("B", attn_bwd, 2 * w.cp_bytes, at)
            self.column_parallel_backward(rest, "qkv_proj", "attention", at)
        else:
            cp_ev = self.launch("cp", "all_gather", 2 * w.cp_bytes * s.parallelism.cp, "cp")
            self.column_parallel_backward(attn_bwd, "qkv_proj", "attention", at, cp_ev)

    def layer_weight_grad(self, layer, mb, chunk):
        """The W step of a layer: the weight-gradient GEMMs a split backward left out."""
        cost = self.w.layer_costs[layer]
        at = dict(microbatch=mb, chunk=chunk, layer=layer)
        self.compute("W", self.split(split_weight_grad, cost.mlp_bwd)[1], "mlp", **at)
        self.compute("W", self.split(split_weight_grad, cost.attn_bwd)[1], "attention", **at)

    def context_parallel_attention(self, kind, block, chunk_bytes, at):
        """Attention under context parallelism. The ops before the core compute first; the
        exchange of the other ranks' K and V (backward: also dK and dV) starts with the core.
        ``cp_comm_type: p2p`` (Megatron-core / TE ``AttnFuncWithCPAndKVP2P``): its cp - 1 ring
        steps overlap the whole core; ``all_gather`` (Llama 3, Sec. 3.3.2; PyTorch's
        context_parallel ``allgather`` rotater): K and V are gathered while only the local causal
        call computes, and the calls on the other ranks' keys wait for it. With
        ``overlap.cp_comm: false`` the whole exchange is exposed. Forward, the rest of the block
        computes here; backward, it is returned for the column-parallel backward."""
        before, core, after = self.split(split_around, block, CP_CORE_OPS)
        self.compute(kind, before, "attention", **at)
        cp_ev = self.launch("cp", "all_gather", chunk_bytes * self.s.parallelism.cp, "cp")
        if not self.sw.cp_comm:
            self.wait((cp_ev,), "cp", **at)
            self.compute(kind, core, "attention", **at)
        elif self.sw.cp_comm_type == "all_gather":
            _, local, remote = self.split(split_around, core, CP_LOCAL_OPS)
            self.compute(kind, local, "attention", **at)
            self.wait((cp_ev,), "cp", **at)
            self.compute(kind, remote, "attention", **at)
        else:
            self.compute(kind, core, "attention", **at)
            self.wait((cp_ev,), "cp", **at)
        if kind == "B":
            return after
        self.compute(kind, after, "attention", **at)
        return None

    def embedding_forward_tp(self, at):
        """The vocabulary-parallel embedding's sum over the TP group: each rank looks up the tokens
        of its vocabulary shard (zeros elsewhere) and the partial embeddings are reduce-scattered
        into the sequence-parallel region with sequence parallelism and rotary or no positions,
        else all-reduced (and, with sequence parallelism, then sliced with no communication).
        Megatron-core ``VocabParallelEmbedding.forward`` (``reduce_scatter_embeddings``,
        megatron/core/tensor_parallel/layers.py) and ``LanguageModelEmbedding``
        (megatron/core/models/common/embeddings/language_model_embedding.py); torchtitan's
        ``RowwiseParallel`` embedding with ``output_layouts=Shard(1)`` and nanotron's
        ``TensorParallelEmbedding`` in REDUCE_SCATTER mode do the same."""
        s = self.s
        if s.parallelism.tp <= 1:
            return
        scatter = self.sp and s.model.position_embedding != "learned"
        self.collective("tp", "reduce_scatter" if scatter else "all_reduce", self.w.tp_bytes, "tp", **at)

    def column_parallel_backward(self, block, gemm, label, at, cp_ev=None, kind="B"):
        """Backward of a block ending in a column-parallel GEMM. With Megatron-LM's TP overlap
        (``LinearWithGradAccumulationAndAsyncCommunication``, TE's Linear) the input-gradient
        all-reduce (reduce-scatter with SP) runs under the weight-gradient GEMM and the saved
        sequence-sharded input is re-gathered under the input-gradient GEMM; without it
        (``overlap.tp_comm: false``, e.g. DTensor TP in eager PyTorch) both are exposed. ``kind``: the
        trace kind of its compute (``head`` for the LM head)."""
        w = self.w
        before, dgrad, wgrad, after = self.split(split_at_gemm, block, gemm)
        reduce = "reduce_scatter" if self.sp else "all_reduce"
        if not (self.sw.tp_comm or (self.sp and self.sw.async_tp)):
            self.compute(kind, before, label, **at)
            if self.sp:
                self.collective("tp", "all_gather", w.tp_bytes, "tp", **at)
            self.compute(kind, joined(dgrad, wgrad), label, **at)
            if cp_ev is not None:
                self.wait((cp_ev,), "cp", **at)
            self.collective("tp", reduce, w.tp_bytes, "tp", **at)
            self.compute(kind, after, label, **at)
            return
        if self.sp:
            self.compute(kind, before, label, **at)
            gather = self.launch("tp", "all_gather", w.tp_bytes, "tp")
            self.compute(kind, dgrad, label, **at)
            self.wait((gather,), "tp", "all_gather", **at)
        else:
            self.compute(kind, joined(before, dgrad), label, **at)
        if cp_ev is not None:
            self.wait((cp_ev,), "cp", **at)
        grad = self.launch("tp", reduce, w.tp_bytes, "tp")
        self.compute(kind, wgrad, label, **at)
        self.wait((grad,), "tp", reduce, **at)
        self.compute(kind, after, label, **at)

    # data parallelism -------------------------------------------------------------------------

    def grad_ops(self, bucket, zero):
        """The bucket's gradient collectives: those of one part, once per part (``Bucket.parts``)."""
        op = grad_reduce_op(zero, self.sw.grad_collective)
        parts = bucket.parts
        out = []
        if bucket.dense_params:
            out.append(("dpcp", op, bucket.dense_params / parts * GRAD_BYTES))
            out.extend(self.replica_reduce(bucket.dense_params / parts * GRAD_BYTES))
        if bucket.expert_params:
            out.append(("edp", op, bucket.expert_params / parts * GRAD_BYTES))
        return out * parts

    def replica_reduce(self, nbytes):
        """Hybrid sharding (``parallelism.dp_replicate`` > 1): after the reduce-scatter inside a
        copy, each rank all-reduces its 1 / shard-group slice with the ranks holding the same slice
        in the other copies (PyTorch FSDP2 HSDP: reduce-scatter then all-reduce on the reduce
        stream, torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py foreach_reduce; Megatron-core
        --num-distributed-optimizer-instances: reduce-scatter in the instance, all-reduce across)."""
        par = self.s.parallelism
        if par.dp_replicate <= 1:
            return []
        return [("dprep", "all_reduce", nbytes / par.shard_group(self.s.dp))]

    @staticmethod
    def param_ops(bucket):
        out = []
        if bucket.dense_params:
            out.append(("dpcp", "all_gather", bucket.dense_params * PARAM_BYTES))
        if bucket.expert_params:
            out.append(("edp", "all_gather", bucket.expert_params * PARAM_BYTES))
        return out

    # the whole stage ---------------------------------------------------------------------------

    def build(self) -> tuple:
        s, w, stage = self.s, self.w, self.stage
        par = s.parallelism
        place = stage_placement(s)
        nvs, m = place.virtual_stages, s.microbatches_per_pass
        zero = par.zero_stage
        sw = self.sw
        steps = schedule_steps(s, stage)
        # (pass, chunk) -> index of the step that finishes the chunk's weight gradients in that
        # pass: each pass of the schedule ends with its own gradient reduction (torch pipelining
        # runs FSDP's post-backward at every schedule step's last backward)
        last_grad = {}
        for i, st in enumerate(steps):
            if st.kind == "W" or (st.kind == "B" and not getattr(st, "split", False)):
                last_grad[st.microbatch // m, st.chunk] = i
        pending: list[int] = []  # handles the rank waits for before its optimizer step
        deferred: list[tuple] = []  # gradient collectives held until the backward ends

        def grads(kind, op, size, axis, calls=1.0):
            if sw.grad_reduce:
                pending.append(self.enqueue(kind, op, size, axis, calls))
            else:
                deferred.append((kind, op, size, axis, calls))

        if sw.host_issue_s and self.extras:
            # The host issued this step's first kernels while the previous step's optimizer ran on
            # the GPU (it synchronised for the gradient norm before issuing the optimizer's kernels).
            opt = w.optimizer[stage]
            self.ops.append(HostStart(min(0.0, opt.kernels * sw.host_issue_s - opt.time_s)))
        param_ready: dict[int, int] = {}
        if zero in (1, 2):
            for chunk in range(place.chunks):
                for bucket in reversed(w.buckets[place.vstage(stage, chunk)]):
                    h = None
                    for kind, op, size in self.param_ops(bucket):
                        h = self.enqueue(kind, op, size, "dp")
                        pending.append(h)
                    for layer in bucket.layers:
                        if h is not None:
                            param_ready[layer] = h
        if param_ready and not sw.param_gather:
            # No overlap (DeepSpeed ZeRO-1/2 gathers right after the optimizer step): every
            # parameter all-gather is exposed before the first forward.
            self.wait(tuple(dict.fromkeys(param_ready.values())), "dp")
            param_ready.clear()
        depth = sw.param_prefetch_depth if sw.param_gather else 0
        gathered: set = set()  # layers kept gathered (``self.unsharded``)
        fsdp_ready: dict = {}
        bucket_of = {vs: {layer: b for b in w.buckets[vs] for layer in b.layers}  # the bucket holding a layer
                     for vs in {place.vstage(stage, c) for c in range(place.chunks)}}
        off = _Offload(self, steps, place, stage)

        def fsdp_gather(layer, key):
            if zero == 3 and key not in fsdp_ready and layer not in gathered:
                # dense weights over the DP x CP shard group, an MoE layer's experts over their
                # expert-data-parallel group (FSDP2 / Megatron-FSDP shard experts over EDP)
                # a backward gather also brings the dense modules released after their recompute
                backward = key[0] == "B"
                again = self.regathered(layer) if backward else 0.0
                fsdp_ready[key] = tuple(
                    self.launch(group, "all_gather", (n + (again if group == "dpcp" else 0.0)) * PARAM_BYTES, "fsdp",
                                self.gather_calls(layer, backward) if group == "dpcp" else 1.0)
                    for group, n in self.fsdp_units(layer))
                if self.unsharded:
                    gathered.add(layer)

        for i, st in enumerate(steps):
            vs = place.vstage(stage, st.chunk)
            layers = w.layers(vs)
            mb, chunk = st.microbatch, st.chunk
            if i and mb // m != steps[i - 1].microbatch // m:
                gathered.clear()  # a new pass: the last one resharded what it had gathered
            copy = place.copy_of(mb % m, m)
            at = dict(microbatch=mb, chunk=chunk)
            final = last_grad[mb // m, chunk] == i
            grads_of = bucket_of[vs]
            if st.kind == "F":
                if vs > 0:
                    self.ops.append(Recv(vs, mb, "F", chunk))
                self.ops.append(StepBegin())
                if vs == 0 and self.extras:
                    self.compute("embed", w.embedding[0], "embedding", **at)
                    self.embedding_forward_tp(at)
                def fkey(x, mb=mb):
                    return ("U", x) if self.unsharded else ("F", mb, x)

                for layer in layers:
                    if layer in param_ready:
                        self.wait((param_ready.pop(layer),), "dp", layer=layer, **at)
                    fsdp_gather(layer, fkey(layer))
                    for ahead in range(layer + 1, layer + 1 + depth):
                        if ahead in layers:
                            fsdp_gather(ahead, fkey(ahead))
                    if zero == 3 and fkey(layer) in fsdp_ready:
                        self.wait(fsdp_ready.pop(fkey(layer)), "fsdp", layer=layer, **at)
                    off.before_forward(mb, chunk, layer)
                    self.layer_forward(layer, mb, chunk)
                    off.after_forward(mb, chunk, layer, layers, steps, i)
                if vs == nvs - 1 and self.extras:
                    if self.sp:
                        # the LM head's input, gathered from the sequence-parallel region
                        self.collective("tp", "all_gather", w.tp_bytes, "tp", **at)
                    self.compute("head", w.head[0], "lm_head+loss", **at)
                self.ops.append(StepEnd("F", mb, chunk))
                if vs < nvs - 1:
                    self.ops.append(Send(place.locate(vs + 1, copy)[0], vs + 1, mb, "F"))
            elif st.kind == "B":
                split = getattr(st, "split", False)
                if vs < nvs - 1:
                    self.ops.append(Recv(vs, mb, "B", chunk))
                self.ops.append(StepBegin())
                if vs == nvs - 1 and self.extras:
                    if s.parallelism.tp > 1:
                        self.column_parallel_backward(w.head[1], "lm_head", "lm_head+loss", at, kind="head")
                    else:
                        self.compute("head", w.head[1], "lm_head+loss", **at)
                for layer in reversed(layers):
                    if zero == 3 and not self.unsharded:
                        fsdp_gather(layer, ("B", mb, layer))
                        for ahead in range(layer - 1, layer - 1 - depth, -1):
                            if ahead in layers:
                                fsdp_gather(ahead, ("B", mb, ahead))
                        self.wait(fsdp_ready.pop(("B", mb, layer)), "fsdp", layer=layer, **at)
                    off.before_backward(mb, chunk, layer)
                    self.layer_backward(layer, mb, chunk, split)
                    off.after_backward(mb, chunk, layer)
                    if not split:
                        self.layer_grads_ready(layer, final, grads_of, grads, pending)
                for op in self.flush_replica():
                    grads(*op)
                if vs == 0 and self.extras:
                    if self.sp:
                        # the gradient of the embedding's scatter into the sequence-parallel region
                        self.collective("tp", "all_gather", w.tp_bytes, "tp", **at)
                    self.compute("embed", w.embedding[1], "embedding", **at)
                if final:
                    self.unlayered_grads(vs, grads)
                    self.unsharded_grads(grads)
                elif self.every_microbatch and not split:
                    self.unlayered_grads(vs, lambda group, op, nbytes, _axis: self.reduce_early(group, op, nbytes,
                                                                                                pending))
                self.ops.append(StepEnd("B", mb, chunk))
                if vs > 0:
                    self.ops.append(Send(place.locate(vs - 1, copy)[0], vs - 1, mb, "B"))
            else:  # W: the weight gradients a split B left
                self.ops.append(StepBegin())
                for layer in reversed(layers):
                    self.layer_weight_grad(layer, mb, chunk)
                    self.layer_grads_ready(layer, final, grads_of, grads, pending)
                for op in self.flush_replica():
                    grads(*op)
                if final:
                    self.unlayered_grads(vs, grads)
                    self.unsharded_grads(grads)
                self.ops.append(StepEnd("W", mb, chunk))
        for item in deferred:
            pending.append(self.enqueue(*item))
        self.ops.append(CloseStream())
        if pending:
            self.wait(tuple(pending), "fsdp" if zero == 3 else "dp")
        self.ops.append(JoinStream())
        if self.extras:
            self.compute("opt", w.optimizer[stage], "optimizer")
        return self._stamped()

    def layer_grads_ready(self, layer, final, grads_of, grads, pending):
        """A layer's weight gradients exist: FSDP reduce-scatters them now; with DDP a bucket is
        reduced when its last layer's gradients of the chunk's last micro-batch are ready."""
        zero = self.s.parallelism.zero_stage
        if self.unsharded:
            if final:
                self.held_grads.append(layer)
        elif zero == 3 and (self.s.parallelism.dp_replicate > 1 or not self.sw.grad_reduce):
            # on the DP stream, in order (the all-reduce across copies needs the reduce-scatter's
            # result), or after the backward without gradient-reduce overlap
            for op in self.fsdp_grad_ops(layer):
                grads(*op)
        elif zero == 3:  # no copies: just the reduce-scatters, launched from the compute stream
            for group, op, nbytes, axis, calls in self.fsdp_grad_ops(layer):
                pending.append(self.launch(group, op, nbytes, axis, calls))
        elif grads_of[layer].layers[-1] == layer and (final or self.every_microbatch):
            for kind, op, nbytes in self.grad_ops(grads_of[layer], zero):
                if final:
                    grads(kind, op, nbytes, "dp")
                else:
                    self.reduce_early(kind, op, nbytes, pending)

    def reduce_early(self, group, op, nbytes, pending):
        """A gradient bucket reduced in a micro-batch's backward before the last one (ZeRO-2 that
        reduces every micro-batch, ``Software.zero2_reduce_every_microbatch``): on the DP stream
        when the framework overlaps the gradient reduction, else on the compute stream, which waits
        for it (DeepSpeed without overlap_comm reduces each full bucket on the current stream,
        stage_1_and_2.py average_tensor)."""
        if self.sw.grad_reduce:
            pending.append(self.enqueue(group, op, nbytes, "dp"))
        else:
            self.collective(group, op, nbytes, "dp")

    def fsdp_grad_ops(self, layer):
        """(group, op, bytes, axis) of one layer's ZeRO-3 gradient reduction: the reduce-scatter
        inside the copy, then with hybrid sharding the all-reduce across copies. A framework that
        combines those all-reduces (``fsdp.replica_combine_bytes``: XLA's all-reduce combiner under
        MaxText's --xla_gpu_all_reduce_combine_threshold_bytes) holds them until a group is full:
        the group is launched with the layer after which the next one (a stack's layers are the
        same size) would not fit, the rest by ``flush_replica`` when the backward pass ends."""
        size = self.w.layer_dense_params[layer] * GRAD_BYTES
        ops = [(group, "reduce_scatter", n * GRAD_BYTES, "fsdp", self.reduce_calls(layer) if group == "dpcp" else 1.0)
               for group, n in self.fsdp_units(layer)]
        limit = self.sw.fsdp_replica_combine_bytes
        replica = self.replica_reduce(size)
        if not (replica and limit > 0):
            return ops + [(k, o, n, "dp") for k, o, n in replica]
        nbytes = replica[0][2]
        self.replica_held += nbytes
        if self.replica_held + nbytes > limit:
            ops += self.flush_replica()
        return ops

    def _memo(self, key, compute):
        """``compute()``, once per key: a layer's figures are the same at every micro-batch."""
        hit = self._memo_cache.get(key)
        if hit is None:
            hit = self._memo_cache[key] = compute()
        return hit

    def dense_weights(self, layer):
        """Parameters per GPU of the layer's weight GEMMs in forward order (``compute.forward_weights``)."""
        return self._memo(("weights", layer), lambda: forward_weights(self.w.layer_costs[layer],
                                                                       self.s.model.is_moe_layer(layer)))

    def released(self, layer):
        """The weights a ZeRO-3 layer's modules release after their recompute forward under full
        recompute and gather again for their backward (``compute.released_weights``); none
        without a reuse distance or full recompute."""
        distance = self.sw.fsdp_release_reuse_distance
        if distance <= 0 or self.s.training.recompute != "full":
            return ()
        return self._memo(("released", layer), lambda: released_weights(self.dense_weights(layer), distance))

    def regathered(self, layer):
        """Dense parameters per GPU a ZeRO-3 layer's backward gathers a second time under full
        recompute (``compute.regathered_params``, the sum of ``released``): they travel with the
        gather before the layer's backward."""
        return float(sum(self.released(layer)))

    def gather_calls(self, layer, backward):
        """All-gather calls in which a ZeRO-3 layer's dense parameters arrive for one pass
        (``compute.module_gather_calls``; 1 for a stack that gathers a whole unit in one call): a
        backward under full recompute fetches them for the recompute forward, then the released
        modules again."""
        bucket = self.sw.fsdp_gather_bucket_params
        if bucket <= 0:
            return 1.0

        def count():
            calls = module_gather_calls(self.dense_weights(layer), bucket)
            again = self.released(layer) if backward else ()
            return calls + module_gather_calls(again, bucket) if again else calls
        return self._memo(("gather", layer, backward), count)

    def reduce_calls(self, layer):
        """Reduce-scatter calls in which a ZeRO-3 layer's dense gradients leave, in the order the
        backward produces them (``compute.bucket_reduce_calls``; 1: one per unit)."""
        bucket = self.sw.fsdp_reduce_bucket_params
        if bucket <= 0:
            return 1.0
        return self._memo(("reduce", layer),
                          lambda: bucket_reduce_calls(tuple(reversed(self.dense_weights(layer))), bucket))

    def fsdp_units(self, layer):
        """(group, parameters per GPU) ZeRO-3 gathers and reduce-scatters for one layer: its dense
        parameters over the DP x CP shard group and, on an MoE layer, its local experts over the
        expert-data-parallel group (the memory model shards them the same way)."""
        w = self.w
        out = [("dpcp", w.layer_dense_params[layer])]
        if w.layer_expert_params.get(layer):
            out.append(("edp", w.layer_expert_params[layer]))
        return out

    def flush_replica(self):
        """The combined cross-copy all-reduce still held (``fsdp_grad_ops``), if any."""
        held, self.replica_held = self.replica_held, 0.0
        return [("dprep", "all_reduce", held, "dp")] if held > 0 else []

    def unsharded_grads(self, grads):
        """ZeRO-3 under a pipeline with ``fsdp_pipeline_unsharded``: the chunk's last backward is
        done, and FSDP's post-backward reduce-scatters every layer's gradients in turn on its
        reduce stream (torch pipelining runs post_backward for each block after the last
        micro-batch's backward)."""
        for layer in self.held_grads:
            for op in self.fsdp_grad_ops(layer):
                grads(*op)
        for op in self.flush_replica():
            grads(*op)
        self.held_grads = []

    def unlayered_grads(self, vs, grads):
        """Buckets holding no layer (embedding, LM head) are reduced after the chunk's last backward."""
        zero = self.s.parallelism.zero_stage
        if zero == 3:
            return
        for bucket in self.w.buckets[vs]:
            if not bucket.layers:
                for kind, op, size in self.grad_ops(bucket, zero):
                    grads(kind, op, size, "dp")

    def _stamped(self) -> tuple:
        """The ops, the launches that a multi-handle wait reads marked so the engine records when
        they end (found through the handles ``wait`` saw and where ``launch`` put each)."""
        ops = self.ops
        for h in self.multi:
            i = self.launch_at.get(h)  # None for a handle of the data-parallel stream (``enqueue``)
            if i is not None:
                ops[i] = replace(ops[i], stamp=True)
        return tuple(ops)


class _Offload:
    """The copies and waits of CPU activation offloading for one stage's program (module docstring;
    ``workload.offload``), issued through the builder as its layer loops reach each layer."""

    def __init__(self, b: _Builder, steps: tuple, place: Placement, stage: int):
        self.b = b
        self.bytes = b.w.offload_bytes or {}
        tr = b.s.training
        self.layers_n = tr.activation_offload_layers
        self.window = resident_window(b.s)
        self.out: dict = {}  # (micro-batch, chunk, layer) -> handle of its copy to the host
        self.back: dict = {}  # ... of its copy back
        self.order: list = []  # module-level: the offloaded layers in backward order
        self.next_of: dict = {}
        if self.bytes and not self.layers_n:
            w = b.w
            for st in steps:
                if st.kind == "B":
                    vs = place.vstage(stage, st.chunk)
                    self.order.extend((st.microbatch, st.chunk, x) for x in reversed(w.layers(vs)) if x in self.bytes)
            self.next_of = {key: self.order[k + 1] for k, key in enumerate(self.order[:-1])}

    def before_forward(self, mb, chunk, layer):
        """Layer-level: at most L - N layers' activations on the GPU, so wait for layer j - (L - N)'s copy out."""
        if self.layers_n:
            key = (mb, chunk, layer - self.window)
            if key in self.out:
                self.b.wait((self.out[key],), "offload", "d2h", microbatch=mb, chunk=chunk, layer=layer)

    def after_forward(self, mb, chunk, layer, layers, steps, i):
        if layer not in self.bytes:
            return
        if (not self.layers_n and layer == layers[-1] and i + 1 < len(steps) and steps[i + 1].kind == "B"
                and steps[i + 1].microbatch == mb and steps[i + 1].chunk == chunk):
            return  # its backward comes next: Megatron-core keeps the group (``should_bulk_offload``)
        self.out[mb, chunk, layer] = self.b.copy("d2h", self.bytes[layer], microbatch=mb, chunk=chunk, layer=layer)

    def reload(self, key):
        if key in self.out and key not in self.back:
            mb, chunk, layer = key
            self.back[key] = self.b.copy("h2d", self.bytes[layer], self.out[key], microbatch=mb, chunk=chunk,
                                         layer=layer)

    def before_backward(self, mb, chunk, layer):
        key = (mb, chunk, layer)
        if not self.layers_n:
            self.reload(key)  # the first of the order: nothing reloaded it ahead
            if key in self.next_of:
                self.reload(self.next_of[key])
        if key in self.back:
            self.b.wait((self.back[key],), "offload", "h2d", microbatch=mb, chunk=chunk, layer=layer)

    def after_backward(self, mb, chunk, layer):
        """Layer-level: layer k's reload starts once layer k + (L - N)'s backward has freed its activations."""
        if self.layers_n:
            self.reload((mb, chunk, layer - self.window))
