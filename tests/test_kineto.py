"""simulator.calibrate.kineto: reading PyTorch profiler (Kineto) traces into per-class kernel time.

Three kinds of checks: the public excerpts in tests/data/profiles (classes, coverage, iterations,
and totals recomputed here by a second, plain computation over the raw JSON), small synthetic
traces whose every number is known, and bad inputs that must give a one-line ConfigError."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from simulator.calibrate import kineto
from simulator.calibrate.kineto import ClassTime, ConfigError, GemmShape, Part, classify, read_profile

DATA = Path(__file__).parent / "data" / "profiles"
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


# --- the public excerpts ------------------------------------------------------------------------


def _raw_events(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


@pytest.fixture(scope="module")
def excerpts():
    return {name: read_profile(DATA / name) for name in ("hta-sampled-2rank", "hta-ddp-v100", "hta-adam-a100")}


EXPECTED = {
    # name: (ranks, kept steps, dropped step, classes that must be present)
    "hta-sampled-2rank": ((0, 1), (552,), 551, {"communication", "gemm", "embedding", "elementwise", "memcpy", "memset", "norm", "optimizer"}),
    "hta-ddp-v100": ((1,), (5,), 4, {"communication", "gemm", "elementwise", "memcpy", "memset", "norm"}),
    "hta-adam-a100": ((0,), (553,), 552, {"communication", "gemm", "elementwise", "memcpy", "memset", "optimizer", "embedding"}),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_excerpt_classes_coverage_and_iterations(excerpts, name):
    ranks, kept, dropped, classes = EXPECTED[name]
    prof = excerpts[name]
    assert tuple(r.rank for r in prof.ranks) == ranks
    assert prof.coverage >= 0.95
    for r in prof.ranks:
        assert r.detection == "annotations"
        assert tuple(i.step for i in r.iterations) == kept
        assert tuple(i.step for i in r.dropped) == (dropped,)
        assert r.coverage >= 0.95, (r.rank, r.coverage)
        assert classes <= {c.name for c in r.classes}
        assert [c.name for c in r.classes] == sorted(c.name for c in r.classes)
        assert sum(c.time_us for c in r.classes) == pytest.approx(r.kernel_time_us)
        assert sum(c.count for c in r.classes) == r.kernel_count
        assert 0 < r.busy_us <= r.wall_us and r.idle_us == pytest.approx(r.wall_us - r.busy_us)
        for c in r.classes:
            assert c.share == pytest.approx(c.time_us / r.busy_us)
            if c.parts:
                assert sum(p.time_us for p in c.parts) == pytest.approx(c.time_us)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_excerpt_numbers_recomputed_by_hand(excerpts, name):
    """The window, the kernel count and time, the NCCL time and the busy time of each rank,
    recomputed from the raw JSON with plain loops (no code shared with the reader)."""
    for r in excerpts[name].ranks:
        events = _raw_events(Path(r.path))
        step = r.iterations[0].step
        cpu = next(e for e in events if e.get("name") == f"ProfilerStep#{step}" and e.get("cat") != "gpu_user_annotation")
        launch_ts = {e["args"]["correlation"]: e["ts"] for e in events
                     if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
        gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATS]
        mine = [e for e in gpu if cpu["ts"] <= launch_ts.get(e["args"].get("correlation"), -1) <= cpu["ts"] + cpu["dur"]]
        start = min(e["ts"] for e in mine)
        end = max(e["ts"] + e["dur"] for e in mine)  # the last kept step has no successor in the excerpt
        assert (r.iterations[0].start_us, r.iterations[0].end_us) == (start, end)
        inside = [e for e in gpu if start <= e["ts"] < end]
        assert r.kernel_count == len(inside)
        assert r.kernel_time_us == pytest.approx(sum(e["dur"] for e in inside))
        nccl = sum(e["dur"] for e in inside if e["name"].startswith("nccl"))
        assert r.time_of("communication") == pytest.approx(nccl)
        # busy: mark every covered microsecond (these traces have whole-microsecond times)
        assert all(float(e["ts"]).is_integer() and float(e["dur"]).is_integer() for e in inside)
        covered = bytearray(int(end - start))
        for e in inside:
            a = int(e["ts"] - start)
            b = min(int(e["ts"] + e["dur"] - start), len(covered))
            covered[a:b] = b"\x01" * (b - a)
        assert r.busy_us == sum(covered)


def test_excerpt_without_annotations_found_by_repetition(excerpts, tmp_path):
    """The DDP excerpt with its ProfilerStep annotations removed: the repeating kernel sequence
    gives the same kept window and the same numbers as the annotations did."""
    src = DATA / "hta-ddp-v100" / "rank-1.json.gz"
    with gzip.open(src, "rt") as f:
        doc = json.load(f)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")]
    path = tmp_path / "stripped.json"
    path.write_text(json.dumps(doc))
    prof = read_profile(path)
    (r,), (a,) = prof.ranks, excerpts["hta-ddp-v100"].ranks
    assert r.detection == "repetition" and len(r.iterations) == 1 and len(r.dropped) == 1
    assert (r.iterations[0].start_us, r.iterations[0].end_us) == (a.iterations[0].start_us, a.iterations[0].end_us)
    assert (r.classes, r.busy_us, r.wall_us) == (a.classes, a.busy_us, a.wall_us)
    assert any("repeating kernel sequence" in w for w in prof.warnings)


def test_excerpt_two_ranks_of_one_job(excerpts):
    prof = excerpts["hta-sampled-2rank"]
    assert [r.world_size for r in prof.ranks] == [128, 128]
    assert [os.path.basename(r.path) for r in prof.ranks] == ["rank-0.json.gz", "rank-1.json.gz"]
    for r in prof.ranks:
        comm = next(c for c in r.classes if c.name == "communication")
        assert [p.name for p in comm.parts] == ["send_recv"]
        assert r.gemm_shapes and all(g.op in ("aten::mm", "aten::addmm", "aten::bmm") for g in r.gemm_shapes)
    assert excerpts["hta-ddp-v100"].ranks[0].device == "Tesla V100-SXM2-32GB"
    ddp = next(c for c in excerpts["hta-ddp-v100"].ranks[0].classes if c.name == "communication")
    assert [p.name for p in ddp.parts] == ["all_reduce"]


def test_excerpt_gemm_shapes_match_the_recorded_dims(excerpts):
    r = excerpts["hta-adam-a100"].ranks[0]
    events = _raw_events(Path(r.path))
    dims = {tuple(map(tuple, e["args"]["Input Dims"][1:3])) for e in events
            if e.get("cat") == "cpu_op" and e.get("name") == "aten::addmm"}
    assert ((4096, 2798), (2798, 64)) in dims  # addmm(bias, [M, K], [K, N])
    shape = next(g for g in r.gemm_shapes if g.op == "aten::addmm" and g.k == 2798)
    assert (shape.m, shape.n, shape.k, shape.batch) == (4096, 64, 2798, 1)
    assert shape.flop == 2 * 4096 * 64 * 2798
    assert r.gemm_shapes == tuple(sorted(r.gemm_shapes, key=lambda g: (g.op, g.m, g.n, g.k, g.batch)))


# --- synthetic traces ---------------------------------------------------------------------------

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_cublas"
FLASH = "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>>(Flash_fwd_params)"
NORM = "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int)"
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
ADAM = "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor<float, 4>>()"
LOSS = "void at::native::(anonymous namespace)::cross_entropy_loss_kernel<float>()"
ODD = "mystery_kernel_v2"
FILL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>()"

# (name, cat, stream, start offset, duration) of one iteration's GPU work; stream 13 overlaps 7
LAYOUT = [
    (GEMM, "kernel", 7, 0, 100),
    (NCCL, "kernel", 13, 50, 80),
    (FLASH, "kernel", 7, 110, 50),
    (NORM, "kernel", 7, 160, 10),
    ("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", 7, 190, 5),  # 20 us idle before it
    ("Memset (Device)", "gpu_memset", 7, 195, 1),
    (ADAM, "kernel", 7, 200, 20),  # 4 us idle before it
    (LOSS, "kernel", 7, 220, 7),
    (ODD, "kernel", 7, 227, 3),
]
PERIOD = 10_000


def _synthetic(steps=(1, 2, 3), annotate=True, warmup_extra=True, gpu_cat=None, launch_cat="cuda_runtime"):
    """Events of ``steps`` iterations: step n's CPU range starts at n*PERIOD, its GPU work at
    n*PERIOD + 100 as LAYOUT says; the first step also runs a 50 us fill kernel at its end."""
    events, corr = [], 0
    for n in steps:
        c0, g0 = n * PERIOD, n * PERIOD + 100
        if annotate:
            events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1,
                           "ts": c0, "dur": 5000, "args": {}})
        layout = LAYOUT + ([(FILL, "kernel", 7, 300, 50)] if warmup_extra and n == steps[0] else [])
        for i, (name, cat, stream, off, dur) in enumerate(layout):
            corr += 1
            events.append({"ph": "X", "cat": launch_cat, "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                           "ts": c0 + 10 + i, "dur": 1, "args": {"correlation": corr}})
            events.append({"ph": "X", "cat": gpu_cat or cat, "name": name, "pid": 0, "tid": stream, "ts": g0 + off,
                           "dur": dur, "args": {"correlation": corr, "stream": stream, "device": 0}})
    return events


def _write(path: Path, events, meta=None, gz=False, bare=False) -> Path:
    doc = events if bare else {"schemaVersion": 1, **(meta or {}), "traceEvents": events}
    text = json.dumps(doc, indent=1)
    if gz:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


# per-class totals over the two kept iterations of _synthetic()
KEPT = {"gemm": 200, "communication": 160, "attention": 100, "norm": 20, "memcpy": 10, "memset": 2,
        "optimizer": 40, "loss": 14, "other": 6}


def test_synthetic_exact_class_times_idle_and_warmup(tmp_path):
    prof = read_profile(_write(tmp_path / "t.json", _synthetic(), meta={"distributedInfo": {"rank": 3, "world_size": 8}}))
    (r,) = prof.ranks
    assert (r.rank, r.world_size, r.detection) == (3, 8, "annotations")
    assert r.dropped == (kineto.Iteration(1, PERIOD + 100, 2 * PERIOD + 100),)
    # step 2 ends where step 3's GPU work starts; the last step ends with its last kernel
    assert r.iterations == (kineto.Iteration(2, 2 * PERIOD + 100, 3 * PERIOD + 100),
                            kineto.Iteration(3, 3 * PERIOD + 100, 3 * PERIOD + 330))
    assert {c.name: c.time_us for c in r.classes} == KEPT
    assert {c.name: c.count for c in r.classes} == {k: 2 for k in KEPT}
    busy = 2 * (230 - 20 - 4)  # the gaps before the copy and after the memset; NCCL covers the one after the GEMM
    assert (r.wall_us, r.busy_us, r.idle_us) == (PERIOD + 230, busy, PERIOD + 230 - busy)
    assert r.step_time_us == (PERIOD + 230) / 2
    assert r.kernel_time_us == sum(KEPT.values()) and r.kernel_count == 18
    assert r.coverage == (sum(KEPT.values()) - 6) / sum(KEPT.values())
    comm = next(c for c in r.classes if c.name == "communication")
    assert comm == ClassTime("communication", 2, 160, 160 / busy, (Part("all_reduce", 2, 160),))
    assert next(c for c in r.classes if c.name == "memcpy").parts == (Part("HtoD", 2, 10),)
    assert r.time_of("elementwise") == 0  # the warm-up's fill kernel went with the warm-up
    assert prof.warnings == ()


def test_synthetic_keep_warmup(tmp_path):
    r = read_profile(_write(tmp_path / "t.json", _synthetic()), drop_warmup=False).ranks[0]
    assert [i.step for i in r.iterations] == [1, 2, 3] and r.dropped == ()
    assert r.time_of("elementwise") == 50 and r.time_of("gemm") == 300


def test_synthetic_one_step_is_kept(tmp_path):
    r = read_profile(_write(tmp_path / "t.json", _synthetic(steps=(7,)))).ranks[0]
    assert [i.step for i in r.iterations] == [7] and r.dropped == ()
    assert r.wall_us == 350 and r.time_of("gemm") == 100


def test_synthetic_repetition_without_annotations(tmp_path):
    prof = read_profile(_write(tmp_path / "t.json", _synthetic(annotate=False)))
    r = prof.ranks[0]
    assert r.detection == "repetition"
    assert [(i.step, i.start_us) for i in r.iterations] == [(None, 2 * PERIOD + 100), (None, 3 * PERIOD + 100)]
    assert {c.name: c.time_us for c in r.classes} == KEPT
    assert any("repeating kernel sequence" in w for w in prof.warnings)


def test_synthetic_no_structure_is_one_window(tmp_path):
    events = [{"ph": "X", "cat": "kernel", "name": n, "pid": 0, "tid": 7, "ts": 100 + 10 * i, "dur": 5, "args": {}}
              for i, n in enumerate([GEMM, FLASH, NORM])]
    prof = read_profile(_write(tmp_path / "t.json", events))
    r = prof.ranks[0]
    assert r.detection == "whole trace" and r.iterations == (kineto.Iteration(None, 100, 125),)
    assert (r.busy_us, r.idle_us) == (15, 10)
    assert prof.warnings


@pytest.mark.parametrize("variant", ["gz", "bare", "old-cats", "tiny-chunks", "bom", "string-times"])
def test_synthetic_formats_give_the_same_numbers(tmp_path, monkeypatch, variant):
    if variant == "gz":
        path = _write(tmp_path / "t.json.gz", _synthetic(), gz=True)
    elif variant == "bare":
        path = _write(tmp_path / "t.json", _synthetic(), bare=True)
    elif variant == "old-cats":  # Kineto before 2021 spelled them Kernel and Runtime
        events = _synthetic(launch_cat="Runtime")
        for e in events:
            e["cat"] = {"kernel": "Kernel", "gpu_memcpy": "Memcpy", "gpu_memset": "Memset"}.get(e["cat"], e["cat"])
        path = _write(tmp_path / "t.json", events)
    elif variant == "bom":  # a byte-order mark, as some editors write
        path = tmp_path / "t.json"
        path.write_text("\ufeff" + json.dumps({"traceEvents": _synthetic()}), encoding="utf-8")
    elif variant == "string-times":  # some exporters quote ts and dur
        events = _synthetic()
        for e in events:
            e["ts"], e["dur"] = str(e["ts"]), str(e["dur"])
        path = _write(tmp_path / "t.json", events)
    else:  # values cut at every possible place by the streaming reader
        monkeypatch.setattr(kineto, "_CHUNK", 7)
        path = _write(tmp_path / "t.json", _synthetic())
    r = read_profile(path).ranks[0]
    assert {c.name: c.time_us for c in r.classes} == KEPT and r.busy_us == 412


def test_synthetic_gemm_shapes_from_the_innermost_operator(tmp_path):
    def op(name, ts, dur, dims):
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": {"Input Dims": dims}}

    def launch(ts, corr, kernel_ts, name=GEMM, dur=10):
        return [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts, "dur": 1,
                 "args": {"correlation": corr}},
                {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": kernel_ts, "dur": dur,
                 "args": {"correlation": corr, "stream": 7}}]

    events = [
        op("aten::linear", 10, 30, [[32, 16], [64, 16], [64]]),
        op("aten::addmm", 12, 26, [[64], [32, 16], [16, 64], [], []]),
        *launch(20, 1, 1000),
        op("aten::mm", 50, 5, [[8, 8], [8, 8]]),  # ends before the next launch: not its operator
        op("aten::matmul", 49, 30, [[4, 8, 16], [4, 16, 32]]),
        op("aten::bmm", 56, 20, [[4, 8, 16], [4, 16, 32]]),
        *launch(60, 2, 1020),
        *launch(62, 3, 1040, name="void splitKreduce_kernel<float>()", dur=2),  # two kernels, one product
        op("aten::linear", 100, 10, [[2, 3, 16], [64, 16], [64]]),
        *launch(105, 4, 1060),
        *launch(200, 5, 1080),  # no operator around it
        *launch(206, 6, 1100, name=FLASH),  # not a GEMM kernel
    ]
    r = read_profile(_write(tmp_path / "t.json", events)).ranks[0]
    assert r.gemm_shapes == (
        GemmShape("aten::addmm", 32, 64, 16, 1, 1, 10),
        GemmShape("aten::bmm", 8, 32, 16, 4, 2, 12),
        GemmShape("aten::linear", 6, 64, 16, 1, 1, 10),
    )


def test_folder_of_ranks_and_rank_from_file_order(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    _write(d / "b.json", _synthetic(), meta={"distributedInfo": {"rank": 0}})
    _write(d / "a.json.gz", _synthetic(), meta={"distributedInfo": {"rank": 1}}, gz=True)
    (d / "notes.txt").write_text("not a trace")
    prof = read_profile(d)
    assert [(r.rank, os.path.basename(r.path)) for r in prof.ranks] == [(0, "b.json"), (1, "a.json.gz")]
    e = tmp_path / "norank"
    e.mkdir()
    _write(e / "x.json", _synthetic())
    _write(e / "y.json", _synthetic())
    prof = read_profile([e / "y.json", e / "x.json"])
    assert [os.path.basename(r.path) for r in prof.ranks] == ["y.json", "x.json"]
    assert any("no distributedInfo.rank" in w for w in prof.warnings)


def test_classify_names():
    cases = {
        "nvjet_tst_192x192_64x4_1x2_h_bz_coopB_NNT": ("gemm", ""),
        "ampere_bf16_s16816gemm_bf16_128x256_ldg8_f2f_stages_64x3_nn": ("gemm", ""),
        "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4>(Params)": ("gemm", ""),
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0": ("attention", ""),
        "fmha_cutlassF_f16_aligned_64x64_rf_sm80": ("attention", ""),
        "void transformer_engine::normalization::rmsnorm_fwd_tuned_kernel<>()": ("norm", ""),
        "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0": ("norm", ""),
        "triton_poi_fused_mul_silu_0": ("elementwise", ""),
        "void at::native::(anonymous namespace)::fused_dropout_kernel_vec<float>()": ("elementwise", ""),
        "void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, true, false>(float*)": ("loss", ""),
        "void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, false, false>(float*)": ("attention", ""),
        "void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float>()": ("loss", ""),
        "void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>>()": ("optimizer", ""),
        "void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16>()": ("embedding", ""),
        "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)": ("communication", "send_recv"),
        "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)": ("communication", "reduce_scatter"),
        "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)": ("communication", "all_gather"),
        "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*)": ("communication", "broadcast"),
        "void cub::DeviceRadixSortOnesweepKernel<long>()": ("other", ""),
    }
    for name, want in cases.items():
        assert classify(name) == want, name
    assert classify("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy") == ("memcpy", "DtoH")
    assert classify("Memset (Device)", "gpu_memset") == ("memset", "")
    assert classify("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t()", collective="all_to_all_single") == ("communication", "all_to_all")
    assert set(kineto.CLASSES) >= {c for c, _ in (classify(n) for n in cases)}


# --- bad input ----------------------------------------------------------------------------------


def _bad(tmp_path, name: str, content: bytes | None) -> Path:
    p = tmp_path / name
    if content is not None:
        p.write_bytes(content)
    return p


BAD = {
    "missing": ("nope.json", None, "no such file"),
    "empty file": ("e.json", b"", "empty file"),
    "not json": ("t.json", b"step time was 3 s\n", "not a valid JSON trace"),
    "truncated": ("t.json", b'{"traceEvents": [{"ph": "X", "cat": "kernel", ', "not a valid JSON trace"),
    "json, not a trace": ("t.json", b'{"model": "llama", "layers": 32}', "without 'traceEvents'"),
    "array of numbers": ("t.json", json.dumps(list(range(500))).encode(), "other than event objects"),
    "no kernels": ("t.json", json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 2}]}).encode(), "no GPU kernels"),
    "binary": ("t.json", bytes(range(256)) * 8, "binary"),
    "gzip of garbage": ("t.json.gz", b"\x1f\x8b\x08\x00garbage-not-deflate" * 3, "binary or damaged"),
    "png": ("t.json", b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, "binary"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_config_error(tmp_path, case):
    name, content, words = BAD[case]
    path = _bad(tmp_path, name, content)
    with pytest.raises(ConfigError) as info:
        read_profile(path)
    err = info.value
    assert err.field == "profile" and str(path) == err.value
    assert words in str(err) and "\n" not in str(err)


def test_bad_folders_and_duplicate_ranks(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no .json or .json.gz") as info:
        read_profile(tmp_path / "empty")
    assert info.value.field == "profile"
    with pytest.raises(ConfigError, match="give at least one"):
        read_profile([])
    a = _write(tmp_path / "a.json", _synthetic(), meta={"distributedInfo": {"rank": 2}})
    b = _write(tmp_path / "b.json", _synthetic(), meta={"distributedInfo": {"rank": 2}})
    with pytest.raises(ConfigError, match="rank 2 is also in") as info:
        read_profile([a, b])
    assert "\n" not in str(info.value)
