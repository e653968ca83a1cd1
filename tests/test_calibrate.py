"""Calibration from a profile: the op -> class mapping, the Kineto export read back by calibrate (factors
of 1), factors priced into the workload exactly, the public excerpts, the profile diff, and bad input.

The round trip is the honest test of the whole chain: stepsim writes its own step as a PyTorch
profiler trace, the reader classifies it like any other, and calibrate must find that stepsim agrees
with itself within 1% in every class and every GEMM shape. A factor of 0.8 must make every GEMM op
exactly 1/0.8 slower and nothing else; the public traces (a recommendation model, not an LLM) must
be read, classified and turned into a file without an error."""

from __future__ import annotations

import ast
import glob
import gzip
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

import simulator
from simulator.calibrate.calibration import calibrate, diff_record, format_comparison, profile_diff
from simulator.calibrate.kineto import classify, read_profile
from simulator.common.errors import ConfigError
from simulator.engine.inputs import scenario_cluster
from simulator.parts.calibration import CLASSES, COMMUNICATION, MAX_FACTOR, MIN_FACTOR, read_calibration
from simulator.parts.frameworks import framework_names
from simulator.parts.gpus import gpu_of
from simulator.scenario.load import scenario_from_dict, scenario_to_dict
from simulator.simulation import load_scenario
from simulator.trace import kineto as export
from simulator.workload.classes import HOST, OP_CLASSES, gemm_key, op_class
from simulator.workload.workload import build_workload

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "scenarios" / "tiny.yaml")
PROFILES = ROOT / "tests" / "data" / "profiles"


def _cli(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simulator", *argv], capture_output=True, text=True, cwd=cwd)


def _blocks(work):
    for c in work.layer_costs.values():
        yield from (c.attn_fwd, c.mlp_fwd, c.attn_bwd, c.mlp_bwd, c.attn_recompute, c.mlp_recompute)
    yield from work.embedding
    yield from work.head
    yield from work.optimizer.values()


def _ops(work):
    return [op for b in _blocks(work) for op in b.ops]


def _workload(s):
    return build_workload(s, gpu_of(s.cluster, s.training.precision))


# --- one mapping from op names to kernel classes ----------------------------------------------------


VARIANTS = ([], ["training.precision=fp8"], ["training.precision=mxfp8"], ["training.recompute=full"],
            ["training.recompute=selective"], ["training.attention=unfused"], ["parallelism.cp=2"],
            ["model.qk_norm=true"], ["moe.grouped_gemm=false"], ["moe.token_dispatcher=flex"],
            *([f"framework={name}"] for name in framework_names()))


def test_every_op_name_the_workload_can_produce_has_a_class():
    """Every op of every shipped scenario under each framework profile and the switches that add
    ops (FP8 casts, recompute, the unfused attention, CP merges, QK norm, per-expert GEMMs, DeepEP)
    maps to a class of the classifier's vocabulary; the literal op names written in the cost models
    too, reached by a scenario or not."""
    names = set()
    built = 0
    for path in sorted(glob.glob(str(ROOT / "scenarios" / "*.yaml"))):
        for sets in VARIANTS:
            try:
                s = load_scenario(path, sets)
                work = _workload(s)
            except ConfigError:
                continue  # a switch the scenario cannot take (FP8 on an A100, cp that does not divide)
            built += 1
            names |= {op.name for op in _ops(work)}
    assert built > 150 and len(names) > 300
    unknown = sorted(n for n in names if op_class(n) is None)
    assert unknown == []
    assert {op_class(n) for n in names} == set(CLASSES) - {COMMUNICATION} | {HOST}

    literal = set()
    makers = {"Op", "mem_op", "gemm_op", "Gemm", "Mem", "mem_chain", "Latency", "gemm_bwd_ops", "_quantize_op"}
    for path in sorted((ROOT / "simulator" / "workload").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in makers
                    and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                literal.add(node.args[0].value)
    assert len(literal) > 50
    assert sorted(n for n in literal if op_class(n) is None) == []
    assert set(OP_CLASSES.values()) <= set(CLASSES) | {HOST}


@pytest.mark.parametrize("name, cls", [("qkv_proj_dgrad", "gemm"), ("mtp_expert_up_3_wgrad", "gemm"),
                                       ("attn_scores_wgrad", "gemm"), ("mtp_attn_core_bwd", "attention"),
                                       ("qkv_proj_quantize_bwd", "elementwise"), ("out_proj_part", "gemm"),
                                       ("zero_grad", "elementwise"), ("moe_host_sync", HOST), ("no_such_op", None)])
def test_op_class_strips_prefixes_and_suffixes(name, cls):
    assert op_class(name) == cls


def test_the_classes_are_the_classifiers_and_the_export_names_land_in_them():
    from simulator.calibrate.kineto import CLASSES as TRACE_CLASSES
    assert set(CLASSES) <= set(TRACE_CLASSES)
    for cls, name in export.KERNEL_NAMES.items():
        assert classify(name) == (cls, ""), name
    for cls, name in export.BACKWARD_NAMES.items():
        assert classify(name)[0] == cls, name
    for op, name in export.NCCL_NAMES.items():
        assert classify(name, "kernel", op) == ("communication", op), name


def test_gemm_key_is_whole_numbers_output_either_way_round():
    assert gemm_key((4096.0, 1024.0, 512.0, 1)) == gemm_key((1024, 4096, 512, 1)) == (1024, 4096, 512, 1)
    assert gemm_key((4096.5, 1024.0, 512.0, 1)) is None and gemm_key(None) is None


# --- the round trip: stepsim's own Kineto trace calibrates to 1 ------------------------------------


@pytest.fixture(scope="module")
def tiny_trace(tmp_path_factory):
    out = tmp_path_factory.mktemp("kineto")
    r = simulator.run(TINY)
    written = r.write_trace(out / "tiny.json.gz", "kineto")
    return r, [Path(p) for p in written]


def test_the_kineto_export_is_a_profile_the_reader_reads(tiny_trace):
    r, files = tiny_trace
    assert [f.name for f in files] == ["tiny-rank0.json.gz", "tiny-rank4.json.gz"]  # one per stage
    doc = json.loads(gzip.decompress(files[0].read_bytes()))
    assert doc["distributedInfo"] == {"backend": "nccl", "rank": 0, "world_size": 8}
    prof = read_profile(files)
    assert [p.rank for p in prof.ranks] == [0, 4] and prof.coverage == 1.0
    for p in prof.ranks:
        assert p.detection == "annotations" and len(p.iterations) == 1
        assert p.gemm_shapes  # record_shapes: aten::mm with Input Dims around each GEMM launch
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    assert all(e["dur"] >= 0 for e in kernels)
    compute = [e for e in kernels if "stepsim_op" in e["args"]]
    assert len(compute) == sum(1 for row, c in export.compute_ops(r.result, 0) for op in c.block.ops
                               if op.time_s > 0 and op_class(op.name) != HOST)


def test_round_trip_gives_factors_of_one(tiny_trace, tmp_path):
    r, files = tiny_trace
    out = tmp_path / "cal.yaml"
    c, data = calibrate(files, TINY, out)
    assert {row.name for row in c.compared} == set(CLASSES)  # every class, communication included (one node)
    for name, entry in data["classes"].items():
        assert entry["factor"] == pytest.approx(1.0, abs=0.01), name
        assert entry["kernels"] == entry["ops"] > 0
    assert data["gemm_shapes"] and all(s["factor"] == pytest.approx(1.0, abs=0.01) for s in data["gemm_shapes"])
    assert "uncalibrated" not in data and "unmodelled" not in data and data["covered"] == 1.0
    assert "intra-node" in data["scope"]
    cal = read_calibration(out)  # the file reads back to the same record
    assert cal == read_calibration(data) and cal.path == str(out)
    calibrated = simulator.run(TINY, [f"calibration={out}"])
    assert calibrated.step_time_s == pytest.approx(r.step_time_s, rel=0.01)
    assert calibrated.to_dict()["calibration"]["modelled"] == []


def test_calibrate_writes_the_same_bytes_twice(tiny_trace, tmp_path):
    _, files = tiny_trace
    calibrate(files, TINY, tmp_path / "a.yaml")
    calibrate(files, TINY, tmp_path / "b.yaml")
    assert (tmp_path / "a.yaml").read_bytes() == (tmp_path / "b.yaml").read_bytes()


def test_a_slower_machine_is_measured_as_such(tiny_trace, tmp_path):
    """A profile whose GEMM kernels took 1.25x stepsim's time gives a GEMM factor of 0.8 and
    leaves the other classes at 1: the factor follows the measurement, not the model."""
    _, files = tiny_trace
    slow = []
    for f in files:
        doc = json.loads(gzip.decompress(f.read_bytes()))
        for e in doc["traceEvents"]:
            if e.get("cat") == "kernel" and classify(e["name"])[0] == "gemm":
                e["dur"] = e["dur"] * 1.25
        target = tmp_path / f.name.replace(".gz", "")
        target.write_text(json.dumps(doc))
        slow.append(target)
    _, data = calibrate(slow, TINY, tmp_path / "cal.yaml")
    assert data["classes"]["gemm"]["factor"] == pytest.approx(0.8, rel=1e-4)
    assert all(s["factor"] == pytest.approx(0.8, rel=1e-3) for s in data["gemm_shapes"])
    assert all(e["factor"] == pytest.approx(1.0, abs=0.01) for n, e in data["classes"].items() if n != "gemm")


# --- factors priced into the workload ----------------------------------------------------------------


def test_a_gemm_factor_of_0_8_makes_every_gemm_exactly_1_over_0_8_slower():
    base = load_scenario(TINY)
    cal = read_calibration({"version": 1, "classes": {"gemm": 0.8}})
    plain, calibrated = _ops(_workload(base)), _ops(_workload(replace(base, calibration=cal)))
    assert [op.name for op in plain] == [op.name for op in calibrated]
    gemms = 0
    for a, b in zip(plain, calibrated):
        if op_class(a.name) == "gemm":
            gemms += 1
            assert b.time_s == pytest.approx(a.time_s / 0.8, rel=1e-12)
            assert (b.flops, b.bytes, b.kernels) == (a.flops, a.bytes, a.kernels)
        else:
            assert b == a
    assert gemms > 50
    r = simulator.run(base, {"calibration": {"version": 1, "classes": {"gemm": 0.8}}})
    report = r.to_dict()["calibration"]
    assert report["calibrated"] == {"gemm": 0.8} and "file" not in report and "communication" not in report
    assert report["modelled"] == ["attention", "norm", "elementwise", "optimizer", "loss", "embedding", "communication"]
    assert "time / factor: gemm 0.8" in r.summary()
    assert r.step_time_s > simulator.run(base).step_time_s


def test_a_shape_factor_wins_over_the_class_factor_for_that_shape_only():
    base = load_scenario(TINY)
    mlp_up = next(op for op in _ops(_workload(base)) if op.name == "mlp_up")
    m, n, k, batch = gemm_key(mlp_up.shape)
    cal = read_calibration({"version": 1, "classes": {"gemm": 0.8},
                            "gemm_shapes": [{"m": n, "n": m, "k": k, "batch": batch, "factor": 0.5}]})
    plain, calibrated = _ops(_workload(base)), _ops(_workload(replace(base, calibration=cal)))
    hit = 0
    for a, b in zip(plain, calibrated):
        if op_class(a.name) != "gemm":
            continue
        mine = gemm_key(a.shape) == (m, n, k, batch)
        hit += mine
        assert b.time_s == pytest.approx(a.time_s / (0.5 if mine else 0.8), rel=1e-12)
    assert hit >= 2  # mlp_up forward and a backward GEMM of the same shape


def test_no_calibration_leaves_the_workload_as_it_was():
    s = load_scenario(TINY)
    assert s.calibration is None
    cal = read_calibration({"version": 1, "classes": {"attention": 1.0}})
    assert _ops(_workload(s)) == _ops(_workload(replace(s, calibration=cal)))


def test_the_communication_factor_scales_nvlink_links_only():
    s = load_scenario(ROOT / "scenarios" / "llama3-70b-64xh100.yaml")
    plain = scenario_cluster(s)
    cal = scenario_cluster(replace(s, calibration=read_calibration({"version": 1, "classes": {"communication": 0.5}})))
    for i, cls in enumerate(plain.link_cls):
        assert cal.link_bw[i] == pytest.approx(plain.link_bw[i] * (0.5 if cls == "nvlink" else 1.0))
    assert {"nvlink", "nic"} <= set(plain.link_cls)


def test_a_calibrated_scenario_round_trips_through_its_dict_and_the_studies_use_it(tmp_path):
    cal = tmp_path / "cal.yaml"
    cal.write_text(yaml.safe_dump({"version": 1, "classes": {"gemm": 0.8, "attention": 0.9}}))
    raw = yaml.safe_load(Path(TINY).read_text())
    raw["calibration"] = "cal.yaml"  # relative to the scenario's folder
    scen = tmp_path / "tiny-cal.yaml"
    scen.write_text(yaml.safe_dump(raw))
    s = simulator.load_scenario(scen)
    assert s.calibration.factors == {"gemm": 0.8, "attention": 0.9} and s.calibration.path == str(cal)
    assert scenario_from_dict(scenario_to_dict(s)) == s
    step = simulator.run(scen).step_time_s
    assert step > simulator.run(TINY).step_time_s
    rows = simulator.sweep(str(scen), {"training.micro_batch_size": [1]}, workers=1)
    assert rows[0]["step_time_s"] == step
    result = simulator.plan(str(scen), space=["tp=2", "pp=2", "cp=1", "micro_batch_size=1", "recompute=none",
                                              "zero_stage=0", "schedule=1f1b"], top=1, workers=1)
    assert result["given"]["step_time_s"] == pytest.approx(step)
    from simulator.studies.whatif import whatif
    assert whatif(str(scen), workers=1, targets=["compute"])["baseline_step_time_s"] == step


# --- the public excerpts -------------------------------------------------------------------------------


def _stand_in(nodes: int) -> dict:
    """An LLM on the excerpts' GPUs and world size: the traces are of recommendation models, so the
    scenario only has to exist; most classes then come out uncalibrated, which is the point."""
    return {"name": "llm-stand-in", "cluster": {"topology": "dgx-a100", "num_nodes": nodes},
            "model": {"hidden_size": 2048, "num_hidden_layers": 8, "num_attention_heads": 16,
                      "intermediate_size": 8192, "vocab_size": 32000},
            "training": {"seq_length": 2048, "micro_batch_size": 1, "global_batch_size": 16 * nodes}}


@pytest.mark.parametrize("name, nodes", [("hta-sampled-2rank", 16), ("hta-adam-a100", 2)])
def test_calibrate_reads_the_public_multi_rank_excerpts_and_writes_a_file(name, nodes, tmp_path):
    out = tmp_path / "cal.yaml"
    c, data = calibrate(PROFILES / name, _stand_in(nodes), out)
    assert c.coverage >= 0.95 and data["coverage"] >= 0.95
    assert 0 < data["covered"] < data["coverage"]  # the calibrated classes: a part of what was classified
    assert read_calibration(out).factors == {k: v["factor"] for k, v in data["classes"].items()}
    assert "gemm" in data["classes"]
    assert all(MIN_FACTOR <= e["factor"] <= MAX_FACTOR for e in data["classes"].values())
    # the jobs span nodes (128 and 16 GPUs): their NCCL time is no NVLink calibration
    assert "span nodes" in data["uncalibrated"][COMMUNICATION]
    assert set(data["unmodelled"]) >= {"memcpy", "memset", "other"}
    assert data["ranks"] == [r.rank for r in read_profile(PROFILES / name).ranks]
    table = format_comparison(c, compared="calibrated")
    assert "unmodelled" in table and "gemm" in table


@pytest.mark.parametrize("name, cluster, words", [
    ("hta-ddp-v100", {"num_nodes": 1, "gpus_per_node": 2}, "ran on Tesla V100-SXM2-32GB"),
    ("hta-adam-a100", {"num_nodes": 1}, "world_size 16"),
    ("hta-sampled-2rank", {"num_nodes": 1}, "world_size 128"),
])
def test_a_profile_of_another_job_is_refused_naming_the_mismatch(name, cluster, words, tmp_path):
    s = _stand_in(1)
    s["cluster"] = {"topology": "dgx-a100", **cluster}
    s["training"]["global_batch_size"] = 2 * cluster.get("gpus_per_node", 8)
    with pytest.raises(ConfigError) as err:
        calibrate(PROFILES / name, s, tmp_path / "cal.yaml")
    assert err.value.field == "profile" and words in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "cal.yaml").exists()


def test_a_rank_the_scenario_does_not_have_is_refused(tiny_trace, tmp_path):
    _, files = tiny_trace
    doc = json.loads(gzip.decompress(files[1].read_bytes()))
    del doc["distributedInfo"]["world_size"]
    path = tmp_path / "rank4.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as err:
        calibrate(path, TINY, tmp_path / "cal.yaml", sets=["cluster.gpus_per_node=4", "parallelism.dp=1"])
    assert err.value.field == "profile" and "rank 4" in str(err.value) and "ranks 0 to 3" in str(err.value)


def test_a_profile_without_common_classes_is_refused(tmp_path):
    trace = {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "cub::DeviceRadixSortOnesweepKernel", "ts": 0,
                              "dur": 5, "pid": 0, "tid": 7, "args": {"correlation": 1}}]}
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(trace))
    with pytest.raises(ConfigError) as err:
        calibrate(path, TINY, tmp_path / "cal.yaml")
    assert err.value.field == "profile" and "no kernel class can be compared" in str(err.value)


# --- the profile diff ------------------------------------------------------------------------------------


def test_profile_diff_compares_the_run_as_simulated(tiny_trace, tmp_path):
    r, files = tiny_trace
    c = profile_diff(r, files)
    assert all(row.ratio == pytest.approx(1.0, abs=0.01) for row in c.classes)
    slower = simulator.run(TINY, {"calibration": {"version": 1, "classes": {"gemm": 0.5}}})
    gemm = profile_diff(slower, files).row("gemm")
    # twice the GEMM time, give or take what the SMs held by communication beside the longer GEMMs cost
    assert 1.9 < gemm.ratio < 2.1
    record = diff_record(c)
    assert [row["class"] for row in record["classes"]][:2] == ["gemm", "attention"]
    assert json.loads(json.dumps(record)) == record


def test_run_profile_diff_prints_the_table_draws_the_plot_and_adds_json(tiny_trace, tmp_path):
    _, files = tiny_trace
    png = tmp_path / "diff.png"
    proc = _cli("run", TINY, "--profile-diff", str(files[0]), "--profile-diff", str(files[1]), "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    assert "profile vs stepsim: tiny" in proc.stdout and "measured_ms" in proc.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    proc = _cli("run", TINY, "--json", "--profile-diff", str(files[0]))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["profile_diff"]["ranks"] == [0] and list(report)[-1] == "profile_diff"


def test_the_calibrate_command_writes_the_file_and_prints_the_table(tiny_trace, tmp_path):
    _, files = tiny_trace
    out = tmp_path / "cal.yaml"
    proc = _cli("calibrate", *map(str, files), "--scenario", TINY, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "calibration written" in proc.stdout and "calibrated" in proc.stdout
    assert out.read_text().startswith("# stepsim calibration")
    assert read_calibration(out).written_by.startswith("stepsim ")


# --- bad input: one line, exit 2 ---------------------------------------------------------------------------


def _bad_files(tmp: Path) -> dict[str, str]:
    files = {
        "bad-yaml.yaml": "version: 1\nclasses: {gemm: 0.8\n",
        "unknown-class.yaml": "version: 1\nclasses: {gpu: 0.8}\n",
        "zero.yaml": "version: 1\nclasses: {gemm: 0}\n",
        "negative.yaml": "version: 1\nclasses: {gemm: {factor: -1}}\n",
        "absurd.yaml": "version: 1\nclasses: {gemm: 1000}\n",
        "version.yaml": "version: 2\nclasses: {gemm: 0.8}\n",
        "no-version.yaml": "classes: {gemm: 0.8}\n",
        "unknown-key.yaml": "version: 1\nfactors: {gemm: 0.8}\n",
        "empty.yaml": "version: 1\nclasses: {}\n",
        "list.yaml": "- 1\n",
        "shape.yaml": "version: 1\nclasses: {gemm: 0.8}\ngemm_shapes: [{m: 8, n: 8, k: 8, factor: 50}]\n",
    }
    for name, text in files.items():
        (tmp / name).write_text(text)
    return files


@pytest.mark.parametrize("name, field, words", [
    ("missing.yaml", "calibration", "no such file"),
    ("bad-yaml.yaml", "calibration", "not valid YAML"),
    ("unknown-class.yaml", "calibration.classes.gpu", "unknown class"),
    ("zero.yaml", "calibration.classes.gemm", "from 0.05 to 20"),
    ("negative.yaml", "calibration.classes.gemm.factor", "from 0.05 to 20"),
    ("absurd.yaml", "calibration.classes.gemm", "do not run the same work"),
    ("version.yaml", "calibration.version", "version 1"),
    ("no-version.yaml", "calibration.version", "version 1"),
    ("unknown-key.yaml", "calibration.factors", "unknown key"),
    ("empty.yaml", "calibration.classes", "at least one class"),
    ("list.yaml", "calibration", "YAML mapping"),
    ("shape.yaml", "calibration.gemm_shapes[0].factor", "from 0.05 to 20"),
])
def test_a_bad_calibration_file_is_one_line_and_exit_2(name, field, words, tmp_path):
    _bad_files(tmp_path)
    raw = yaml.safe_load(Path(TINY).read_text())
    raw["calibration"] = name
    scen = tmp_path / "s.yaml"
    scen.write_text(yaml.safe_dump(raw))
    proc = _cli("run", str(scen))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"stepsim: error: {field}: ") and words in lines[0], lines
    with pytest.raises(ConfigError) as err:
        simulator.load_scenario(scen)
    assert err.value.field == field


@pytest.mark.parametrize("argv, words", [
    (["calibrate", "no-such-trace.json", "--scenario", TINY, "--out", "{tmp}/c.yaml"], "profile: got 'no-such-trace.json'"),
    (["calibrate", TINY, "--scenario", TINY, "--out", "{tmp}/c.yaml"], "profile: "),
    (["calibrate", str(PROFILES / "hta-adam-a100"), "--scenario", TINY, "--out", "{tmp}/c.txt"], "--out: "),
    (["calibrate", str(PROFILES / "hta-adam-a100"), "--scenario", "{tmp}/none.yaml", "--out", "{tmp}/c.yaml"], "scenario: "),
    (["run", TINY, "--plot", "{tmp}/p.png"], "--plot: "),
    (["run", TINY, "--trace-format", "kineto"], "--trace-format: "),
    (["run", TINY, "--trace", "{tmp}/t.gz", "--trace-format", "kineto"], "--trace: "),
    (["run", TINY, "--profile-diff", "{tmp}"], "profile: "),
    (["run", TINY, "--set", "calibration=[1, 2]"], "calibration: "),
])
def test_bad_calibrate_and_profile_diff_arguments_are_one_line_and_exit_2(argv, words, tmp_path):
    proc = _cli(*[a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert proc.returncode == 2, proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"stepsim: error: {words}"), lines
    assert not (tmp_path / "c.yaml").exists()
