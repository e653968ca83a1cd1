"""Read PyTorch profiler (Kineto) traces and measure GPU kernel time per kernel class.

This is the trace-reading half of ``stepsim calibrate``: it turns one or several rank files of a
user's job into per-rank, per-class kernel times over the steady-state iterations. It knows nothing
of stepsim's cost model; the caller turns these times into efficiency factors.

What it reads
-------------
A Kineto trace is Chrome-trace JSON, ``.json`` or ``.json.gz``: an object whose ``traceEvents``
array holds the events, beside metadata such as ``schemaVersion``, ``distributedInfo`` (``rank``,
``world_size``, ``backend``) and ``deviceProperties`` (GPU names). A bare event array is accepted
too. Only complete events (``"ph": "X"``, ``ts`` and ``dur`` in microseconds) are used:

- GPU activity: ``cat`` ``kernel``, ``gpu_memcpy``, ``gpu_memset`` (``Kernel``, ``Memcpy``,
  ``Memset`` in older Kineto), with ``args.correlation`` and ``args.stream``;
- launches: ``cat`` ``cuda_runtime`` / ``cuda_driver`` (``Runtime`` in older Kineto), on the CPU
  thread that launched, with the same ``args.correlation`` as the kernel;
- iterations: ``ProfilerStep#N`` annotations on the CPU (``cat`` ``user_annotation``, or
  ``cpu_op`` in older traces); GPU-side copies (``gpu_user_annotation``) are ignored;
- shapes: ``cpu_op`` events of GEMM operators with ``args["Input Dims"]`` (``record_shapes=True``).

A kernel is tied to its operator through its launch: the innermost GEMM ``cpu_op`` on the launching
thread whose time range holds the launch. (``args["External id"]`` of a launch names its operator
only in newer Kineto; in older traces it repeats the correlation id, so time nesting is used.)

Iterations and windows
----------------------
Step N's GPU window opens at the first kernel start among the kernels launched inside the CPU range
of ``ProfilerStep#N`` and ends where step N+1's window opens (or, for the last step, at the last end
of step N's own kernels). Every GPU event is counted in the window where it starts. Without
``ProfilerStep`` annotations the repeating kernel sequence is used (see :func:`_repetitions`);
failing that, the whole trace is one window. The first window (warm-up) is dropped when more than
one is found. GPU-busy time is the union of kernel intervals on all streams inside the kept windows,
idle time the rest of the windows.

Classes
-------
Kernel names are matched case-insensitively against one rule per class, in the order of
:data:`CLASSES` (first match wins); :func:`classify` is the rule set:

- ``communication``: NCCL/RCCL kernels (``nccl*``), custom all-reduce and DeepEP/NVSHMEM kernels;
  the part names the collective: ``args["Collective name"]`` where Kineto recorded it (newer
  PyTorch), else the NCCL kernel name (``ncclDevKernel_AllGather_...`` -> ``all_gather``). An
  all-to-all runs NCCL's SendRecv kernel, so without ``Collective name`` it shows as ``send_recv``;
- ``memcpy`` / ``memset``: the ``gpu_memcpy`` / ``gpu_memset`` events; a copy's part is its
  direction (``HtoD``, ``DtoH``, ``DtoD``, ``PtoP``);
- ``loss``: cross entropy, log-softmax (also PyTorch's ``softmax_warp_*<..., is_log_softmax=true>``),
  NLL;
- ``attention``: flash / FMHA / cuDNN SDPA / xFormers kernels, and any other softmax (the unfused
  attention's);
- ``embedding``: embedding lookups and their gradients (``indexSelect``, ``embedding_backward``,
  FBGEMM table-batched embeddings and their sparse-feature permutes). Not in the brief's list: the
  public training traces are recommendation models where these kernels are 15-25% of GPU time;
- ``optimizer``: ``multi_tensor_apply`` / foreach / fused Adam and friends, grad-norm clipping;
- ``norm``: layer norm, RMSNorm, batch/group norm, their Welford statistics and gamma/beta
  gradients, Inductor's fused mean-rsqrt reductions;
- ``gemm``: cuBLAS / cuBLASLt (``*gemm*``, ``nvjet*``, ``sm90_xmma*``, ``ampere_*``, split-K
  reductions, epilogues), CUTLASS, hipBLASLt/Tensile (``Cijk_*``), Triton templates, and cuDNN
  convolutions (implicit GEMM, Winograd, FFT, with their layout transforms);
- ``elementwise``: memory-bound pointwise, reduction, copy/concat/layout, indexing, cast and
  quantize, activation, dropout and RoPE kernels, Inductor's ``triton_poi/red/per`` kernels;
- ``other``: the rest (on the public traces: CUB sort and scan, 0-2.6% of kernel time).

Library choice
--------------
Measured with ``tests/bench_kineto_1gb.py`` on a synthetic 0.96 GB trace (3.7 M events, 741 k
kernels, each with its aten op and ``record_shapes`` dims, its launch and two flow events; 10
iterations), one fresh process per case, on a shared 2-core machine (CPU time is the steady
figure; wall time was about the same on a quiet machine and up to twice it under load):

=====================================================  ========  ========  =========
how                                                    CPU       wall      peak RSS
=====================================================  ========  ========  =========
this module, whole analysis (``read_profile``)         14.4 s    14.8 s    530 MiB
this module, same file gzipped (57 MB)                 15.2 s    --        519 MiB
this module, events only (``iter_trace``)              9.5 s     --        38 MiB
``json.load`` of the document, no analysis             30.7 s    39.5 s    4,475 MiB
ijson 3.6 (yajl2_c backend), events only               9.8 s     11.8 s    23 MiB
HolisticTraceAnalysis 0.5.0: parse + kernel breakdown  85.1 s    87.4 s    4,988 MiB
=====================================================  ========  ========  =========

- Plain ``json.load`` needs memory of four to five times the file and is twice as slow: no.
- ijson streams at the speed of the reader here, but it is a compiled dependency for no gain:
  this module walks the top level itself and lets the standard library's C scanner
  (``JSONDecoder.raw_decode``) decode one event at a time from a 4 M-character buffer, which costs
  the same CPU as ijson's C backend and a few MiB more.
- HolisticTraceAnalysis (MIT) loads the whole trace into pandas (its default parser is
  ``json.loads`` of the file), takes six times the CPU and ten times the memory of this module on
  the 1 GB trace, and brings 106 packages, 480 MB installed (pandas, numpy, plotly, jupyterlab,
  pydot, pytest). What it gives: per-rank kernel type shares (communication / computation /
  memory), per-kernel-name statistics, idle-time, overlap and queue-length breakdowns, critical
  path, stragglers, filters by ProfilerStep iteration. It does not sort kernels into the classes
  a cost model prices (GEMM, attention, norm, ...) nor give GEMM shapes per kernel, so the name
  classifier and most of this module would sit on top of it anyway.

So: the standard library only. Most of the 530 MiB is what is kept per kernel (a tuple of seven
fields), per launch and per GEMM operator; the text of the trace is never held whole.

Everything returned is a frozen dataclass with sorted, deterministic contents. Bad input raises a
one-line :class:`~simulator.common.errors.ConfigError` on the field ``profile``.
"""

from __future__ import annotations

import bisect
import gzip
import io
import json
import math
import os
import re
import zlib
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from simulator.common.errors import ConfigError

FIELD = "profile"

#: the kernel classes, in the order a kernel name is tried against them (first match wins);
#: ``memcpy``/``memset`` come from the event category, ``other`` is what no rule claims
CLASSES = ("communication", "memcpy", "memset", "loss", "attention", "embedding", "optimizer",
           "norm", "gemm", "elementwise", "other")

_GPU_CATS = {"kernel": "kernel", "Kernel": "kernel", "gpu_memcpy": "memcpy", "Memcpy": "memcpy",
             "gpu_memset": "memset", "Memset": "memset"}
_LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver", "Runtime", "hip_runtime", "hip_driver",
                          "privateuse1_runtime", "privateuse1_driver"})
_STEP = re.compile(r"ProfilerStep#(\d+)$")
_GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul",
                       "aten::linear", "aten::_scaled_mm", "aten::_addmm_activation", "aten::_int_mm",
                       "aten::addbmm"})

# --- classification -----------------------------------------------------------------------------

_I = re.IGNORECASE
_RULES: tuple[tuple[str, re.Pattern], ...] = (
    ("communication", re.compile(
        r"nccl|rccl|msccl|cross_device_reduce|custom_?all_?reduce|deep_?ep|nvshmem|userbuffers"
        r"|\ball_?to_?all|one_?shot_?all_?reduce|two_?shot_?all_?reduce", _I)),
    # softmax_warp_* has is_log_softmax as its fifth template argument
    ("loss", re.compile(r"cross_?entropy|log_?softmax|nll_?loss|"
                        r"softmax_warp_(?:forward|backward)<(?:[^,<>]+,\s*){4}true", _I)),
    ("attention", re.compile(
        r"flash|fmha|attention|_attn|attn_|sdpa|softmax|xformers|\bmha|mha_|paged_?att|"
        r"decode_?att|fused_?mha", _I)),
    ("embedding", re.compile(
        r"embedding|index_?select|indexSelect|embedding_?bag|bounds_check_indices|permute_pooled_embs|"
        r"linearize_index|bucketize_sparse|permute_2D|permute_indices_weights|sparse_features|"
        r"jagged|keyed_jagged|tbe_", _I)),
    ("optimizer", re.compile(
        r"multi_tensor|adam|adagrad|lamb_|sgd|foreach|optimizer|fused_?adam|muon|lion_|"
        r"l2norm|clip_grad|triton_for_", _I)),
    ("norm", re.compile(
        r"layer_?norm|rms_?norm|group_?norm|batch_?norm|instance_?norm|RowwiseMoments|"
        r"bn_fw|bn_bw|welford|GammaBeta|ln_fwd|ln_bwd|norm_fwd|norm_bwd|"
        r"triton_(?:red|per)_fused\w*mean\w*rsqrt", _I)),
    ("gemm", re.compile(
        r"gemm|gemv|cublas|cutlass|xmma|nvjet|cudnn|scudnn|implicit_?gemm|dgrad|wgrad|"
        r"\bsm\d\d_|ampere_|volta_|turing_|hopper_|Cijk_|hipblas|matmul|wgmma|splitKreduce|"
        r"triton_tem|_mma_|\bmma_|dot_?kernel|grouped_?mm|convolution|conv_?[123]d|_conv_|winograd|fft2d", _I)),
    ("elementwise", re.compile(
        r"elementwise|vectorized|unrolled|pointwise|reduce_kernel|reduction|functor|fill|copy|"
        r"cat_?array|CatArray|concat|transpose|permute|rope|rotary|dropout|cast|gelu|silu|swiglu|"
        r"geglu|relu|activation|_act_|bias|triton_(poi|red|per)_|triton__|index_put|"
        r"indexing_backward|scatter|gather|quantize|fp8|hfp8|amax|clamp|where|masked|"
        r"cumsum|arange|random|philox|bernoulli|uniform|normal_|pool|upsample|index_?func|index_add|"
        r"pad|repeat|roll|tril|triu|to_copy|memcpy|memset|zero|nonzero|sum_kernel|mean_kernel|"
        r"elemwise|unary|binary|ternary", _I)),
)

_COLLECTIVE_NAMES = (
    ("allreduce", "all_reduce"), ("allgather", "all_gather"), ("reducescatter", "reduce_scatter"),
    ("alltoall", "all_to_all"), ("broadcast", "broadcast"), ("sendrecv", "send_recv"),
    ("send", "send"), ("recv", "recv"), ("barrier", "barrier"), ("reduce", "reduce"),
    ("generic", "generic"),
)
_MEMCPY_KIND = re.compile(r"\b(HtoD|DtoH|DtoD|HtoH|PtoP|DtoA|AtoD|AtoH|HtoA|AtoA)\b")


def _collective(text: str) -> str:
    """``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``, ``broadcast``,
    ``send_recv``, ``send``, ``recv``, ``reduce``, ``barrier``, ``generic`` or ``unknown``."""
    flat = re.sub(r"[^a-z]", "", text.lower())
    for key, name in _COLLECTIVE_NAMES:
        if key in flat:
            return name
    return "unknown"


def classify(name: str, category: str = "kernel", collective: str | None = None) -> tuple[str, str]:
    """The class of one GPU event and its part within the class.

    ``category`` is the trace's ``cat`` (``kernel``, ``gpu_memcpy``, ``gpu_memset``, or their
    older spellings). The part names the collective of a ``communication`` kernel (from
    ``collective``, Kineto's ``args["Collective name"]``, when the trace has it, else from the
    NCCL kernel name), the direction of a ``memcpy`` (``HtoD``, ``DtoH``, ``DtoD``, ...), and is ``""``
    for the other classes.
    """
    kind = _GPU_CATS.get(category, "kernel")
    if kind == "memcpy" or (kind == "kernel" and name.startswith("Memcpy ")):
        m = _MEMCPY_KIND.search(name)
        return "memcpy", (m.group(1) if m else "unknown")
    if kind == "memset" or (kind == "kernel" and name.startswith("Memset")):
        return "memset", ""
    for cls, rule in _RULES:
        if rule.search(name):
            if cls == "communication":
                if collective:
                    return cls, _collective(collective)
                m = re.search(r"nccl(?:Dev)?Kernel_([A-Za-z]+)", name)
                if m:
                    return cls, _collective(m.group(1))
                if re.search(r"all_?reduce", name, _I):
                    return cls, "all_reduce"
                if re.search(r"deep_?ep|all_?to_?all|dispatch|combine", name, _I):
                    return cls, "all_to_all"
                return cls, "unknown"
            return cls, ""
    return "other", ""


# --- results ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    """One named part of a class: a collective of ``communication``, a direction of ``memcpy``."""
    name: str
    count: int
    time_us: float


@dataclass(frozen=True)
class ClassTime:
    """Kernel time of one class over a rank's kept iterations.

    ``time_us`` sums kernel durations (streams that overlap each count in full); ``share`` is
    ``time_us`` over the rank's GPU-busy time, so shares can add up past 1 where streams overlap.
    """
    name: str
    count: int
    time_us: float
    share: float
    parts: tuple[Part, ...] = ()


@dataclass(frozen=True)
class GemmShape:
    """GEMMs of one shape: ``(m, n, k)`` of each product, ``batch`` products per launch (bmm).

    ``op`` is the aten operator that launched them (``aten::mm``, ``aten::addmm``, ...); ``count``
    and ``time_us`` are their kernels over the kept iterations (a GEMM that launches two kernels,
    such as a split-K product and its reduction, counts both)."""
    op: str
    m: int
    n: int
    k: int
    batch: int
    count: int
    time_us: float

    @property
    def flop(self) -> int:
        """Multiply-add FLOP of one launch: 2 m n k batch."""
        return 2 * self.m * self.n * self.k * self.batch


@dataclass(frozen=True)
class Iteration:
    """One training iteration's GPU window, in the trace's clock (microseconds)."""
    step: int | None  # N of ProfilerStep#N; None when found by repetition or for the whole trace
    start_us: float
    end_us: float

    @property
    def time_us(self) -> float:
        return self.end_us - self.start_us


@dataclass(frozen=True)
class RankProfile:
    """One rank's kernel time over its kept (steady-state) iterations.

    All times are totals over ``iterations``: divide by ``len(iterations)`` for one step
    (:attr:`step_time_us` does so for the wall time). ``kernel_time_us`` sums every kept GPU
    event's duration, ``busy_us`` is the time at least one stream was busy, ``idle_us`` the rest
    of the windows. ``coverage`` is the share of ``kernel_time_us`` in a class other than ``other``.
    """
    rank: int
    path: str
    device: str | None
    world_size: int | None
    detection: str  # "annotations", "repetition" or "whole trace"
    iterations: tuple[Iteration, ...]
    dropped: tuple[Iteration, ...]  # the warm-up window(s) left out
    wall_us: float
    busy_us: float
    idle_us: float
    kernel_count: int
    kernel_time_us: float
    classes: tuple[ClassTime, ...]
    gemm_shapes: tuple[GemmShape, ...]
    coverage: float

    @property
    def step_time_us(self) -> float:
        return self.wall_us / len(self.iterations)

    def time_of(self, name: str) -> float:
        """Total time of class ``name`` (0.0 when the rank has none)."""
        return next((c.time_us for c in self.classes if c.name == name), 0.0)


@dataclass(frozen=True)
class Profile:
    """Every rank read, by rank; ``warnings`` says where the reading had to guess."""
    ranks: tuple[RankProfile, ...]
    warnings: tuple[str, ...] = field(default=())

    @property
    def coverage(self) -> float:
        """Share of all ranks' kernel time in a class other than ``other``."""
        total = sum(r.kernel_time_us for r in self.ranks)
        covered = sum(r.kernel_time_us * r.coverage for r in self.ranks)
        return covered / total if total else 0.0


# --- streaming JSON -----------------------------------------------------------------------------

_CHUNK = 1 << 22  # characters read at a time
_LARGEST = 1 << 26  # characters one top-level value may take before it is taken as malformed
_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class _Stream:
    """The top level of one JSON document, read a chunk at a time; values are decoded by the
    standard library's C scanner one at a time, so memory holds one chunk and one event."""

    def __init__(self, text: io.TextIOBase, path: str):
        self.text = text
        self.path = path
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.consumed = 0  # characters dropped from the front of buf so far

    def _fill(self, at_least: int = _CHUNK) -> None:
        chunk = self.text.read(max(at_least, _CHUNK))
        if not chunk:
            self.eof = True
        if self.pos:
            self.consumed += self.pos
            self.buf = self.buf[self.pos:]
            self.pos = 0
        if "\x00" in chunk:
            raise ConfigError(FIELD, self.path, "a binary file, not a trace: expected Kineto JSON, .json or .json.gz")
        self.buf += chunk

    def peek(self) -> str:
        """The next non-blank character ('' at the end of the file)."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if self.eof:
                return ""
            self._fill()

    def expect(self, chars: str) -> str:
        c = self.peek()
        if not c or c not in chars:
            self._bad(f"expected {' or '.join(repr(x) for x in chars)}")
        self.pos += 1
        return c

    def value(self):
        self.peek()
        while True:
            try:
                obj, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as err:
                if self.eof or len(self.buf) - self.pos > _LARGEST:
                    self._bad(err.msg)
                self._fill(len(self.buf) - self.pos)  # the value runs past the chunk: double the buffer
                continue
            if end >= len(self.buf) and not self.eof:  # a number may continue in the next chunk
                self._fill()
                continue
            self.pos = end
            return obj

    def _bad(self, what: str):
        at = self.consumed + self.pos
        raise ConfigError(FIELD, self.path, f"not a valid JSON trace at character {at}: {what}")


def _open_text(path: str) -> io.TextIOBase:
    with open(path, "rb") as f:
        magic = f.read(2)
    raw = gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")
    return io.TextIOWrapper(raw, encoding="utf-8-sig", errors="strict")


def iter_trace(path: str) -> tuple[dict, Iterator[dict]]:
    """The events of one trace file, one at a time (what :func:`read_profile` reads with).

    Returns ``(meta, events)``: ``events`` yields each item of ``traceEvents`` as a dict; ``meta``
    fills with the other top-level keys as the reader passes them, so it is complete only once
    ``events`` is exhausted. Errors are raised as :class:`ConfigError` while iterating."""
    meta: dict = {}

    def events() -> Iterator[dict]:
        try:
            with _open_text(path) as text:
                s = _Stream(text, path)
                first = s.peek()
                if first == "[":
                    yield from _array(s)
                    return
                if first != "{":
                    if first == "":
                        raise ConfigError(FIELD, path, "an empty file: expected Kineto trace JSON")
                    s._bad("expected '{' or '['")
                s.expect("{")
                seen = False
                if s.peek() == "}":
                    s.pos += 1
                else:
                    while True:
                        key = s.value()
                        if not isinstance(key, str):
                            s._bad("expected a key")
                        s.expect(":")
                        if key == "traceEvents":
                            seen = True
                            yield from _array(s)
                        else:
                            meta[key] = s.value()
                        if s.expect(",}") == "}":
                            break
                if s.peek():
                    s._bad("extra data after the trace")
                if not seen:
                    raise ConfigError(FIELD, path, "JSON without 'traceEvents': not a Kineto/Chrome trace")
        except RecursionError:
            raise ConfigError(FIELD, path, "JSON nested too deeply to be a trace") from None
        except (UnicodeDecodeError, gzip.BadGzipFile, zlib.error, EOFError) as err:
            raise ConfigError(FIELD, path, f"a binary or damaged file, not a trace ({type(err).__name__})") from None
        except IsADirectoryError:
            raise ConfigError(FIELD, path, "a folder where a trace file was expected") from None
        except FileNotFoundError:
            raise ConfigError(FIELD, path, "no such file") from None
        except PermissionError:
            raise ConfigError(FIELD, path, "the file cannot be read (permission denied)") from None
        except OSError as err:
            raise ConfigError(FIELD, path, f"the file cannot be read ({err.strerror or err})") from None

    return meta, events()


def _array(s: _Stream) -> Iterator:
    s.expect("[")
    if s.peek() == "]":
        s.pos += 1
        return
    while True:
        yield s.value()
        if s.expect(",]") == "]":
            return


# --- one rank -----------------------------------------------------------------------------------


def _number(x) -> float | None:
    if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        return float(x)
    if isinstance(x, str):  # a few exporters write timestamps as strings
        try:
            v = float(x)
        except ValueError:
            return None
        return v if math.isfinite(v) else None
    return None


class _Raw:
    """What one rank file holds that the analysis needs, kept compactly."""

    def __init__(self):
        self.names: dict[str, int] = {}
        self.name_list: list[str] = []
        self.kernels: list[tuple] = []  # (ts, dur, name id, kind, stream, correlation, collective)
        self.launches: dict[int, tuple] = {}  # correlation -> (ts, pid, tid)
        self.steps: dict[int, tuple[float, float]] = {}  # N -> (ts, end)
        self.gemm_ops: dict[tuple, list] = {}  # (pid, tid) -> [(ts, end, op, dims)]
        self.device = None  # args.device of the first kernel


def _key(x):
    """An id as a dict key: ints and strings as they are, anything else by its text."""
    return x if isinstance(x, (int, str, float)) or x is None else json.dumps(x, sort_keys=True)


def _scan(path: str) -> tuple[dict, _Raw]:
    meta, events = iter_trace(path)
    raw = _Raw()
    names, name_list, kernels, launches = raw.names, raw.name_list, raw.kernels, raw.launches
    bad_events = 0
    for ev in events:
        if type(ev) is not dict:
            bad_events += 1
            if bad_events > 100:
                raise ConfigError(FIELD, path, "'traceEvents' holds something other than event objects: not a trace")
            continue
        if ev.get("ph") != "X":
            continue
        cat = ev.get("cat")
        kind = _GPU_CATS.get(cat)
        if kind is not None:
            ts, dur = _number(ev.get("ts")), _number(ev.get("dur"))
            if ts is None or dur is None or dur < 0:
                continue
            name = ev.get("name")
            name = name if isinstance(name, str) else str(name)
            nid = names.get(name)
            if nid is None:
                nid = names[name] = len(name_list)
                name_list.append(name)
            args = ev.get("args")
            if not isinstance(args, dict):
                args = {}
            coll = args.get("Collective name")
            kernels.append((ts, dur, nid, kind, _key(args.get("stream", ev.get("tid"))), _key(args.get("correlation")),
                            coll if isinstance(coll, str) else None))
            if raw.device is None:
                raw.device = _key(args.get("device"))
        elif cat in _LAUNCH_CATS:
            args = ev.get("args")
            corr = args.get("correlation") if isinstance(args, dict) else None
            ts = _number(ev.get("ts"))
            if corr is not None and ts is not None:
                launches[_key(corr)] = (ts, _key(ev.get("pid")), _key(ev.get("tid")))
        else:
            name = ev.get("name")
            if not isinstance(name, str):
                continue
            if name.startswith("ProfilerStep#") and cat != "gpu_user_annotation":
                m = _STEP.match(name)
                ts, dur = _number(ev.get("ts")), _number(ev.get("dur"))
                if m and ts is not None and dur is not None:
                    raw.steps[int(m.group(1))] = (ts, ts + dur)
            elif name in _GEMM_OPS:
                args = ev.get("args")
                dims = args.get("Input Dims") if isinstance(args, dict) else None
                ts, dur = _number(ev.get("ts")), _number(ev.get("dur"))
                if isinstance(dims, list) and ts is not None and dur is not None:
                    raw.gemm_ops.setdefault((_key(ev.get("pid")), _key(ev.get("tid"))), []).append((ts, ts + dur, name, dims))
    if not kernels:
        raise ConfigError(FIELD, path, "the trace has no GPU kernels (profile with ProfilerActivity.CUDA)")
    return meta, raw


def _repetitions(order: list[int], times: list[float]) -> list[int] | None:
    """Indices (into the start-ordered kernel list) where iterations begin, found from the
    repeating kernel sequence, or None when it does not repeat.

    A trace of n identical iterations runs every kernel name a multiple of n times. n is the
    largest count of some name such that names whose counts are multiples of n hold at least 90%
    of kernel time. The anchor is the first-starting name that runs exactly n times; the trace is
    taken to open at an iteration's start (as the profiler's schedule does), so each later
    iteration starts as many kernels before its anchor as the first one did, where the kernels
    there repeat the first iteration's opening names, and at its anchor otherwise."""
    counts: dict[int, int] = {}
    weight: dict[int, float] = {}
    for nid, t in zip(order, times):
        counts[nid] = counts.get(nid, 0) + 1
        weight[nid] = weight.get(nid, 0.0) + t
    total = sum(weight.values()) or 1.0
    best = 1
    for n in sorted({c for c in counts.values() if c >= 2}, reverse=True):
        covered = sum(w for nid, w in weight.items() if counts[nid] % n == 0)
        if covered >= 0.9 * total:
            best = n
            break
    if best < 2:
        return None
    anchor = next(nid for nid in order if counts[nid] == best)
    at = [i for i, nid in enumerate(order) if nid == anchor]
    lead = order[:at[0]]
    cuts = [0]
    for i in at[1:]:
        j = i - len(lead)
        cuts.append(j if j > cuts[-1] and order[j:i] == lead else i)
    return cuts


def _gemm_shape(op: str, dims: list) -> tuple[int, int, int, int] | None:
    """(m, n, k, batch) of a GEMM operator from its recorded input dims, or None."""
    def ok(d):
        return isinstance(d, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in d)

    def prod(xs):
        p = 1
        for x in xs:
            p *= x
        return p

    try:
        if op in ("aten::mm", "aten::_scaled_mm", "aten::_int_mm"):
            a, b = dims[0], dims[1]
        elif op in ("aten::addmm", "aten::_addmm_activation"):
            a, b = dims[1], dims[2]
        elif op == "aten::bmm":
            a, b = dims[0], dims[1]
        elif op in ("aten::baddbmm", "aten::addbmm"):
            a, b = dims[1], dims[2]
        elif op == "aten::linear":
            x, w = dims[0], dims[1]
            if not (ok(x) and ok(w)) or len(x) < 1 or len(w) != 2 or x[-1] != w[1]:
                return None
            return prod(x[:-1]), w[0], x[-1], 1
        elif op == "aten::matmul":
            a, b = dims[0], dims[1]
            if not (ok(a) and ok(b)) or len(a) < 2 or len(b) < 2:
                return None
            if len(b) == 2:
                return prod(a[:-1]), b[1], a[-1], 1
            return a[-2], b[-1], a[-1], prod(a[:-2])
        else:
            return None
    except (IndexError, TypeError):
        return None
    if not (ok(a) and ok(b)) or len(a) != len(b) or len(a) not in (2, 3):
        return None
    if len(a) == 2:
        m, k, k2, n, batch = a[0], a[1], b[0], b[1], 1
    else:
        batch, m, k, k2, n = a[0], a[1], a[2], b[1], b[2]
    if k != k2:
        return None
    return m, n, k, batch


def _innermost(ops: list, starts: list[float], t: float):
    """The innermost operator of ``ops`` (sorted by start) running at time ``t``."""
    i = bisect.bisect_right(starts, t) - 1
    for j in range(i, max(-1, i - 64), -1):
        if ops[j][1] >= t:
            return ops[j]
    return None


def _rank_profile(path: str, rank: int, meta: dict, raw: _Raw, drop_warmup: bool,
                  warnings: list[str]) -> RankProfile:
    kernels = sorted(raw.kernels, key=lambda k: (k[0], k[0] + k[1], k[2], str(k[4])))
    starts = [k[0] for k in kernels]
    last_end = max(k[0] + k[1] for k in kernels)
    name_list = raw.name_list

    # iterations from ProfilerStep annotations: kernels launched inside step N's CPU range
    windows: list[Iteration] = []
    detection = "annotations"
    if raw.steps:
        nums = sorted(raw.steps)
        cpu_starts = [raw.steps[n][0] for n in nums]
        first: dict[int, float] = {}
        last: dict[int, float] = {}
        for ts, dur, _nid, _kind, _stream, corr, _c in kernels:
            launch = raw.launches.get(corr) if corr is not None else None
            if launch is None:
                continue
            i = bisect.bisect_right(cpu_starts, launch[0]) - 1
            if i < 0:
                continue
            n = nums[i]
            if launch[0] > raw.steps[n][1]:
                continue
            if n not in first or ts < first[n]:
                first[n] = ts
            last[n] = max(last.get(n, ts + dur), ts + dur)
        found = sorted(first)
        for j, n in enumerate(found):
            nxt = found[j + 1] if j + 1 < len(found) else None
            end = first[nxt] if nxt == n + 1 else last[n]
            if end > first[n]:
                windows.append(Iteration(n, first[n], end))
        if not windows:
            warnings.append(f"rank {rank}: ProfilerStep annotations launch no kernel in {path}; "
                            "iterations found from the repeating kernel sequence")
    if not windows:
        detection = "repetition"
        cuts = _repetitions([k[2] for k in kernels], [k[1] for k in kernels])
        if cuts:
            for j, i in enumerate(cuts):
                end = kernels[cuts[j + 1]][0] if j + 1 < len(cuts) else last_end
                if end > kernels[i][0]:
                    windows.append(Iteration(None, kernels[i][0], end))
            warnings.append(f"rank {rank}: no ProfilerStep annotations; {len(windows)} iterations "
                            "found from the repeating kernel sequence")
        if not windows:
            detection = "whole trace"
            windows = [Iteration(None, kernels[0][0], last_end)]
            warnings.append(f"rank {rank}: no ProfilerStep annotations and no repeating kernel "
                            "sequence; the whole trace is taken as one iteration")
    dropped: tuple[Iteration, ...] = ()
    if drop_warmup and len(windows) > 1:
        dropped, windows = (windows[0],), windows[1:]

    # every GPU event that starts inside a kept window
    per_class: dict[str, list] = {}  # name -> [count, time, {part: [count, time]}]
    kernel_count = 0
    kernel_time = 0.0
    busy = 0.0
    gemm_hits: list[tuple] = []
    for w in windows:
        lo = bisect.bisect_left(starts, w.start_us)
        hi = bisect.bisect_left(starts, w.end_us)
        cur_s = cur_e = None
        for ts, dur, nid, kind, _stream, corr, coll in kernels[lo:hi]:
            cls, part = _classify_cached(name_list[nid], kind, coll)
            rec = per_class.get(cls)
            if rec is None:
                rec = per_class[cls] = [0, 0.0, {}]
            rec[0] += 1
            rec[1] += dur
            if part:
                p = rec[2].setdefault(part, [0, 0.0])
                p[0] += 1
                p[1] += dur
            kernel_count += 1
            kernel_time += dur
            if cls == "gemm" and corr is not None:
                gemm_hits.append((corr, dur))
            end = min(ts + dur, w.end_us)
            if cur_e is None or ts > cur_e:
                if cur_e is not None:
                    busy += cur_e - cur_s
                cur_s, cur_e = ts, end
            elif end > cur_e:
                cur_e = end
        if cur_e is not None:
            busy += cur_e - cur_s
    wall = sum(w.time_us for w in windows)

    classes = tuple(
        ClassTime(name, rec[0], rec[1], rec[1] / busy if busy else 0.0,
                  tuple(Part(p, v[0], v[1]) for p, v in sorted(rec[2].items())))
        for name, rec in sorted(per_class.items()))
    other = per_class.get("other", [0, 0.0])[1]
    coverage = (kernel_time - other) / kernel_time if kernel_time else 0.0

    # GEMM shapes, where the trace recorded them
    shapes: dict[tuple, list] = {}
    if raw.gemm_ops and gemm_hits:
        index = {}
        for key, ops in raw.gemm_ops.items():
            ops.sort(key=lambda o: (o[0], -o[1]))
            index[key] = (ops, [o[0] for o in ops])
        for corr, dur in gemm_hits:
            launch = raw.launches.get(corr)
            if launch is None:
                continue
            found = index.get((launch[1], launch[2]))
            if found is None:
                continue
            op = _innermost(found[0], found[1], launch[0])
            if op is None:
                continue
            shape = _gemm_shape(op[2], op[3])
            if shape is None:
                continue
            rec = shapes.setdefault((op[2],) + shape, [0, 0.0])
            rec[0] += 1
            rec[1] += dur
    gemm_shapes = tuple(GemmShape(k[0], k[1], k[2], k[3], k[4], v[0], v[1]) for k, v in sorted(shapes.items()))

    dist = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    world = dist.get("world_size") if isinstance(dist.get("world_size"), int) else None
    props = meta.get("deviceProperties")
    device = None
    if isinstance(props, list):  # every GPU of the host; the rank's is the one its kernels ran on
        named = [p for p in props if isinstance(p, dict) and isinstance(p.get("name"), str)]
        mine = [p for p in named if p.get("id") == raw.device] or named[:1]
        device = mine[0]["name"] if mine else None
    return RankProfile(rank=rank, path=path, device=device, world_size=world, detection=detection,
                       iterations=tuple(windows), dropped=dropped, wall_us=wall, busy_us=busy,
                       idle_us=wall - busy, kernel_count=kernel_count, kernel_time_us=kernel_time,
                       classes=classes, gemm_shapes=gemm_shapes, coverage=coverage)


_CLASS_CACHE: dict[tuple, tuple[str, str]] = {}


def _classify_cached(name: str, kind: str, coll: str | None) -> tuple[str, str]:
    key = (name, kind, coll)
    hit = _CLASS_CACHE.get(key)
    if hit is None:
        if len(_CLASS_CACHE) > 100_000:
            _CLASS_CACHE.clear()
        cat = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}[kind]
        hit = _CLASS_CACHE[key] = classify(name, cat, coll)
    return hit


# --- entry point --------------------------------------------------------------------------------


def _trace_files(paths: Iterable[str]) -> list[str]:
    files: list[str] = []
    for p in paths:
        p = os.fspath(p)
        if os.path.isdir(p):
            try:
                inside = sorted(os.listdir(p))
            except OSError as err:
                raise ConfigError(FIELD, p, f"the folder cannot be read ({err.strerror or err})") from None
            found = [os.path.join(p, f) for f in inside
                     if (f.endswith(".json") or f.endswith(".json.gz")) and os.path.isfile(os.path.join(p, f))]
            if not found:
                raise ConfigError(FIELD, p, "the folder holds no .json or .json.gz trace file")
            files.extend(found)
        elif os.path.exists(p):
            files.append(p)
        else:
            raise ConfigError(FIELD, p, "no such file or folder")
    if not files:
        raise ConfigError(FIELD, [], "give at least one trace file or folder")
    return files


def check_traces(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> list[str]:
    """The trace files ``paths`` name, each read up to its first event: what the CLI checks before
    its first progress line, so a missing file, an empty folder or a file that is not trace JSON
    is one line (a fault deeper in a file is found while reading it)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files = _trace_files(paths)
    for path in files:
        _, events = iter_trace(path)
        next(events, None)
    return files


def read_profile(paths: str | os.PathLike | Iterable[str | os.PathLike], *, drop_warmup: bool = True) -> Profile:
    """Read one or several Kineto rank traces (files, or folders of ``.json``/``.json.gz`` files).

    Each file is one rank; its rank is ``distributedInfo.rank`` when the trace has it, else its
    position among the files. The first iteration of each rank is dropped as warm-up when the
    rank has more than one (``drop_warmup=False`` keeps it). Raises :class:`ConfigError` on the
    field ``profile`` for anything that is not a readable trace with GPU kernels.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files = _trace_files(paths)
    warnings: list[str] = []
    ranks: dict[int, RankProfile] = {}
    for i, path in enumerate(files):
        meta, raw = _scan(path)
        dist = meta.get("distributedInfo")
        rank = dist.get("rank") if isinstance(dist, dict) else None
        if not isinstance(rank, int) or isinstance(rank, bool):
            rank = i
            if len(files) > 1:
                warnings.append(f"{path}: no distributedInfo.rank; taken as rank {i} by file order")
        if rank in ranks:
            raise ConfigError(FIELD, path, f"rank {rank} is also in {ranks[rank].path}: give one trace per rank")
        ranks[rank] = _rank_profile(path, rank, meta, raw, drop_warmup, warnings)
    return Profile(ranks=tuple(ranks[r] for r in sorted(ranks)), warnings=tuple(warnings))


def format_profile(profile: Profile) -> str:
    """A plain-text table of a profile: per rank the windows, then the classes."""
    lines = []
    for r in profile.ranks:
        n = len(r.iterations)
        steps = ",".join(str(i.step) for i in r.iterations if i.step is not None) or "-"
        lines.append(f"rank {r.rank} ({r.device or 'GPU ?'}), {os.path.basename(r.path)}: {n} iteration(s) "
                     f"[{steps}] by {r.detection}; step {r.step_time_us / 1e3:.3f} ms, busy "
                     f"{r.busy_us / n / 1e3:.3f} ms, idle {r.idle_us / n / 1e3:.3f} ms; "
                     f"{r.kernel_count} GPU events; coverage {100 * r.coverage:.1f}%")
        for c in r.classes:
            parts = ", ".join(f"{p.name} {p.time_us / n / 1e3:.3f}" for p in c.parts)
            lines.append(f"  {c.name:<13} {c.count:>7} {c.time_us / n / 1e3:>10.3f} ms/step "
                         f"{100 * c.share:>6.1f}%" + (f"  ({parts})" if parts else ""))
        if r.gemm_shapes:
            lines.append(f"  {len(r.gemm_shapes)} GEMM shapes")
    lines.extend(f"warning: {w}" for w in profile.warnings)
    return "\n".join(lines)

