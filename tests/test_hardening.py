"""Every bad input a one-line error before any work; progress, --version, diff, timeline selection."""

import io
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from simulator import cli
from simulator.common.errors import ConfigError
from simulator.common.outputs import check_output_folder, check_output_path
from simulator.reports.timeline import parse_stages, parse_window, select, timeline
from simulator.scenario.load import load_scenario
from simulator.layout.rules import validate_plan
from simulator.engine.engine import simulate
from simulator.workload.compute import hardware_flops_per_token, model_flops_per_token

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "scenarios" / "tiny.yaml")


def run_cli(argv, monkeypatch=None, capsys=None):
    """(exit status, stdout, stderr) of the CLI run in this process."""
    try:
        status = cli.main(argv)
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else 2
    out = capsys.readouterr() if capsys is not None else None
    return status, (out.out if out else ""), (out.err if out else "")


PROGRESS_LINE = re.compile(r"(run|validate|plan|plan --validate|sweep|whatif|report|diff|audit): ")


def one_line_error(status, err, field, after_work=False):
    """Status 2 and one error line; ``after_work``: an error found once the work ran (no case of a
    runs file could be simulated) may follow that work's progress lines, and nothing else."""
    assert status == 2, err
    *before, last = err.splitlines() or [""]
    assert err.endswith("\n") and last.startswith(f"stepsim: error: {field}") and "Traceback" not in err, err
    assert (all(PROGRESS_LINE.match(line) for line in before) if after_work else not before), err


@pytest.fixture
def no_simulation(monkeypatch):
    """Any simulation fails the test: errors must come before the work. (The planner is imported
    first: it takes sweep's ``evaluate`` by name, and imported under the patch it would keep it.)"""
    import simulator.engine.engine as engine
    import simulator.studies.planner  # noqa: F401

    def boom(*_a, **_k):
        raise AssertionError("simulated before checking the input")
    monkeypatch.setattr(engine, "simulate", boom)
    monkeypatch.setattr("simulator.studies.sweep.evaluate", boom)
    monkeypatch.setattr("simulator.studies.planner.evaluate", boom)
    monkeypatch.setattr("simulator.studies.validate.predict", boom)


# --- output paths ------------------------------------------------------------------------------

def _bad_paths(tmp_path):
    afile = tmp_path / "afile.txt"
    afile.write_text("x")
    return {"missing folder": str(tmp_path / "nope" / "step.png"), "a directory": str(tmp_path),
            "unsupported extension": str(tmp_path / "step.bmp"), "inside a file": str(afile / "step.png")}


@pytest.mark.parametrize("flag, suffix", [("--trace", ".json"), ("--timeline", ".png")])
def test_run_output_paths_are_checked_before_simulating(flag, suffix, tmp_path, capsys, no_simulation):
    for case, path in _bad_paths(tmp_path).items():
        path = path.replace(".png", suffix) if case != "unsupported extension" else path
        status, _, err = run_cli(["run", TINY, flag, path], capsys=capsys)
        one_line_error(status, err, flag)


def test_validate_plot_sweep_out_and_whatif_out_are_checked_first(tmp_path, capsys, no_simulation):
    bad = _bad_paths(tmp_path)
    for path in (bad["missing folder"], bad["a directory"], bad["unsupported extension"]):
        one_line_error(*run_cli(["validate", str(ROOT / "tests/data/nemo-2407-runs.yaml"), "--plot", path],
                                capsys=capsys)[::2], "--plot")
    afile = tmp_path / "afile.txt"
    for argv in (["sweep", TINY, "--vary", "parallelism.tp=1,2", "--out", str(afile)],
                 ["sweep", TINY, "--vary", "parallelism.tp=1,2", "--out", str(afile / "below")],
                 ["whatif", TINY, "--out", str(afile)]):
        one_line_error(*run_cli(argv, capsys=capsys)[::2], "--out")


def test_an_existing_result_file_is_overwritten_but_a_read_only_one_is_refused(tmp_path, capsys):
    trace = tmp_path / "step.json"
    trace.write_text("old")
    status, out, err = run_cli(["run", TINY, "--trace", str(trace), "--quiet"], capsys=capsys)
    assert status == 0, err
    assert json.loads(trace.read_text())  # the re-run replaced the old result
    assert check_output_path(trace, "--trace", (".json",)) == trace
    trace.chmod(0o444)
    try:
        if not os.access(trace, os.W_OK):  # as root every file is writable: nothing to refuse
            with pytest.raises(ConfigError, match="read-only"):
                check_output_path(trace, "--trace", (".json",))
    finally:
        trace.chmod(0o644)
    assert check_output_folder(tmp_path / "new" / "deeper", "--out") == tmp_path / "new" / "deeper"
    with pytest.raises(ConfigError, match="File name too long|cannot be used"):
        check_output_path(tmp_path / ("x" * 5000 + ".png"), "--timeline", (".png",))
    assert check_output_path(tmp_path / "STEP.PNG", "--timeline", (".png",))


# --- flags and limits --------------------------------------------------------------------------

@pytest.mark.parametrize("argv, field", [
    (["run", TINY, "--algorithm", "butterfly"], "--algorithm"),
    (["sweep", TINY, "--vary", "parallelism.tp=1,2", "--workers", "0"], "--workers"),
    (["whatif", TINY, "--workers", "0"], "--workers"),
    (["whatif", TINY, "--factor", "1e300"], "--factor"),
    (["validate", str(ROOT / "tests/data/nemo-2407-runs.yaml"), "--workers", "0"], "--workers"),
    (["plan", TINY, "--workers", "0"], "--workers"),
    # a value starting with a minus is a value, checked by its flag (argparse said "expected one argument")
    (["plan", TINY, "--tolerance", "-1%"], "--tolerance: got '-1%'; must be a fraction"),
    (["collective", "--sizes", "-1GiB"], "--sizes: got '-1GiB'; expected a byte count"),
    (["plan", TINY, "--workers", "-3"], "--workers"),
    # a thousand forked processes at once would exhaust the memory (``workers.check_local_workers``)
    (["sweep", TINY, "--vary", "parallelism.tp=1,2", "--workers", "100000"], "--workers"),
    (["whatif", TINY, "--workers", "100000"], "--workers"),
    (["plan", TINY, "--workers", "100000"], "--workers"),
    (["plan", TINY, "--executor", "ray", "--workers", "100000"], "--workers"),  # a local Ray: local processes
    (["plan", str(ROOT / "tests/data/nemo-2407-runs.yaml"), "--validate", "--workers", "100000"], "--workers"),
    (["validate", str(ROOT / "tests/data/nemo-2407-runs.yaml"), "--workers", "100000"], "--workers"),
    (["collective", "--gpus", str(10**9)], "--gpus"),
    (["collective", "--sizes", "1e400"], "--sizes"),
    (["collective", "--sizes", "0.2"], "--sizes"),
    (["run", TINY, "--set", f"model.hidden_size={10**30}"], "model.hidden_size"),
    (["run", TINY, "--set", "model.vocab_size=1000000000"], "model.vocab_size"),
    (["run", TINY, "--set", "cluster.num_nodes=1000000"], "cluster.num_nodes"),
    (["run", TINY, "--set", "cluster.network_bandwidth_Gbps=1e30"], "cluster.network_bandwidth_Gbps"),
    (["run", TINY, "--set", "training.global_batch_size=1000000"], "training.global_batch_size"),
    (["run", TINY, "--set", "model.intermediate_size=4097"], "parallelism.tp"),
    (["run", TINY, "--stages", "0"], "--stages"),
    (["run", TINY, "--timeline", "x.png", "--stages", "0,9"], "--stages"),
    (["run", TINY, "--timeline", "x.png", "--window", "a:b"], "--window"),
    (["collective", "--network-bandwidth-Gbps", "inf"], "--network-bandwidth-Gbps"),  # was accepted
    (["report", TINY, "--out", "m.html", "--factor", "1e300"], "--factor"),
    (["memory", "x" * 5000], "scenario"),                                 # an OSError traceback
    (["validate", "x" * 300], "runs"),
    (["diff", "x" * 300 + ".json", "b.json"], "a"),
    (["memory", ""], "scenario"),                                         # said '' "is a folder"
    (["sweep", TINY, "--vary", "parallelism.tp=" + ",".join(map(str, range(1, 400))),
      "--vary", "training.micro_batch_size=" + ",".join(map(str, range(1, 400)))], "--vary"),  # 159,201 points
])
def test_meaningless_or_absurd_flags_are_one_line_errors(argv, field, capsys, no_simulation):
    one_line_error(*run_cli(argv, capsys=capsys)[::2], field)


def test_the_limit_is_named_in_the_error(capsys):
    _, _, err = run_cli(["memory", TINY, "--set", f"model.hidden_size={10**30}"], capsys=capsys)
    assert "at most 131,072" in err and "Megatron-LM 1T" in err


def test_model_dimensions_must_split_over_tp_as_megatron_requires():
    with pytest.raises(ConfigError, match=r"parallelism.tp: got 2; must divide model.intermediate_size \(4097\)"):
        validate_plan(load_scenario(TINY, ["model.intermediate_size=4097"]))
    validate_plan(load_scenario(TINY, ["model.vocab_size=32001"]))  # Megatron pads the vocabulary
    moe = ["model.num_experts=8", "model.num_experts_per_tok=2", "model.moe_intermediate_size=1001"]
    with pytest.raises(ConfigError, match="expert width"):
        validate_plan(load_scenario(TINY, moe))
    validate_plan(load_scenario(TINY, moe[:2] + ["model.moe_intermediate_size=1000"]))


def test_duplicate_yaml_keys_are_refused_naming_the_key_and_line(tmp_path, capsys):
    text = Path(TINY).read_text().replace("  pp: 2\n", "  pp: 2\n  tp: 8\n")
    dup = tmp_path / "dup.yaml"
    dup.write_text(text)
    status, _, err = run_cli(["run", str(dup)], capsys=capsys)
    one_line_error(status, err, "scenario")
    line = text.splitlines().index("  tp: 8") + 1
    assert f"duplicate key 'tp' on line {line}" in err
    topo = tmp_path / "topo.yaml"
    topo.write_text("gpus_per_node: 8\ngpus_per_node: 4\n")
    status, _, err = run_cli(["memory", TINY, "--set", f"cluster.topology={topo}"], capsys=capsys)
    one_line_error(status, err, "cluster.topology")
    assert "duplicate key 'gpus_per_node'" in err


def test_a_hundred_thousand_gpu_collective_is_refused_at_once_not_hung(capsys):
    status, _, err = run_cli(["collective", "--gpus", "131073", "--sizes", "1MiB"], capsys=capsys)
    one_line_error(status, err, "--gpus")


# --- newcomer path -----------------------------------------------------------------------------

def test_version_is_written_once_and_pyproject_reads_it(capsys):
    """simulator.__version__ is the one place: pyproject.toml takes it (dynamic), --version prints it."""
    import simulator

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "simulator.__version__"}
    status, out, _ = run_cli(["--version"], capsys=capsys)
    assert status == 0 and out.strip() == f"stepsim {simulator.__version__}"
    from importlib import metadata
    assert metadata.version("stepsim") == simulator.__version__


def test_progress_goes_to_stderr_only_and_json_stays_clean(capsys):
    status, out, err = run_cli(["run", TINY, "--json", "--progress"], capsys=capsys)
    assert status == 0 and json.loads(out)["step_time_s"] > 0
    assert "run: " in err and "simulating the step" in err
    status, out, err = run_cli(["run", TINY, "--json", "--quiet"], capsys=capsys)
    assert status == 0 and err == "" and json.loads(out)
    status, out, err = run_cli(["run", TINY], capsys=capsys)  # off a terminal: a plain line per stage
    assert status == 0 and err == "run: " + err.split("run: ", 1)[1] and "\r" not in err
    assert [line.split(" s ", 1)[1] for line in err.splitlines()] == ["simulating the step"]
    status, out, err = run_cli(["run", TINY, "--set", "parallelism.tp=3"], capsys=capsys)
    assert status == 2 and err.count("\n") == 1 and "run: " not in err  # bad input: the error line alone


def test_progress_counts_whatif_simulations(capsys):
    status, out, err = run_cli(["whatif", TINY, "--workers", "1", "--json", "--progress"], capsys=capsys)
    assert status == 0 and json.loads(out)["rows"]
    counts = re.findall(r"(\d+)/(\d+) ", err)
    assert counts and counts[-1][0] == counts[-1][1] and len(counts) == int(counts[-1][1])


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_redraws_one_line_on_a_terminal_with_the_fraction_and_a_time_left(monkeypatch):
    from simulator.common.progress import Progress

    monkeypatch.setenv("COLUMNS", "200")
    stream = _Tty()
    with Progress("sweep", stream=stream, interval_s=10) as bar:
        bar.phase("", total=4)
        for i in range(3):
            bar.advance(f"point {i}")
    text = stream.getvalue()
    assert "\n" not in text and text.endswith("\r\x1b[K")  # redrawn in place, cleared at the end
    last = text.split("\r")[-2]
    assert "3/4 75%" in last and "ETA" in last and last.endswith("point 2\x1b[K")


def test_the_status_line_fits_the_terminal_and_notes_get_their_own_line(monkeypatch):
    from simulator.common.progress import Progress

    monkeypatch.setenv("COLUMNS", "40")
    stream = _Tty()
    with Progress("report", stream=stream, interval_s=10) as bar:
        bar.phase("simulating the baseline and fourteen what-ifs of a long name", total=15)
        bar.note("a worker died")
        bar.advance("what-if nvlink 2x faster")
    frames = [f.removesuffix("\x1b[K") for f in stream.getvalue().split("\r") if f.removesuffix("\x1b[K")]
    assert frames and all(len(f) <= 39 for f in frames if "\n" not in f)
    assert any(f.endswith("...") for f in frames)
    assert "report: a worker died\n" in stream.getvalue()


def test_progress_off_a_terminal_is_one_plain_line_per_stage_and_step():
    from simulator.common.progress import Progress

    stream = io.StringIO()
    with Progress("validate", stream=stream) as bar:
        bar.phase("predicting 3 published runs", total=3)
        bar.resume(1)
        bar.status("not in a log")
        bar.advance("case-b")
        bar.advance("case-c")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3 and "\r" not in stream.getvalue() and "not in a log" not in stream.getvalue()
    assert re.fullmatch(r"validate: \d+\.\d s predicting 3 published runs", lines[0])
    assert re.fullmatch(r"validate: 2/3 \d+\.\d s \(ETA \d+ s\) case-b", lines[1])
    assert re.fullmatch(r"validate: 3/3 \d+\.\d s case-c", lines[2])  # no time left to estimate
    quiet = io.StringIO()
    with Progress("validate", stream=quiet, enabled=False) as bar:
        bar.phase("x", total=1)
        bar.note("y")
        bar.advance("z")
    assert quiet.getvalue() == ""


def test_memory_assumptions_say_what_the_attention_kernel_stores(capsys):
    flash = run_cli(["memory", TINY, "--json"], capsys=capsys)[1]
    unfused = run_cli(["memory", TINY, "--json", "--set", "training.attention=unfused"], capsys=capsys)[1]
    flash_text = json.loads(flash)["assumptions"]["activations"]
    assert "no flash-attention credit" not in flash_text and "flash attention: no s x s scores" in flash_text
    assert "unfused attention: s x s scores" in json.loads(unfused)["assumptions"]["activations"]


def test_hfu_is_model_flops_plus_recompute_in_one_convention():
    s = load_scenario(TINY)
    m, seq = s.model, s.training.seq_length
    base = model_flops_per_token(m, seq)
    assert hardware_flops_per_token(m, seq, "none") == base
    assert base < hardware_flops_per_token(m, seq, "selective") < hardware_flops_per_token(m, seq, "full")
    # Megatron-LM Eq. 3: full recompute is a fourth pass over the layers: layers x 4/3, head x 1
    h, L, V = m.hidden_size, m.num_hidden_layers, m.vocab_size
    layers = 72 * L * h * h * (1 + seq / (6 * h))
    assert hardware_flops_per_token(m, seq, "full") == pytest.approx(layers * 4 / 3 + 6 * V * h, rel=1e-9)


def test_diff_of_two_reports_and_of_two_scenarios(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(run_cli(["run", TINY, "--json"], capsys=capsys)[1])
    b.write_text(run_cli(["run", TINY, "--json", "--set", "cluster.nvlink_bandwidth_GBps=100"], capsys=capsys)[1])
    status, out, err = run_cli(["diff", str(a), str(b), "--json"], capsys=capsys)
    assert status == 0, err
    changed = {r["field"]: r for r in json.loads(out)["report"]["changed"]}
    assert "sim_wall_s" not in changed and "name" not in changed
    step = changed["step_time_s"]
    assert step["b"] > step["a"] and step["change"] == pytest.approx(step["b"] / step["a"] - 1)
    status, out, _ = run_cli(["diff", str(a), str(a)], capsys=capsys)
    assert status == 0 and "results: 0 changed" in out
    other = tmp_path / "tp4.yaml"
    other.write_text(Path(TINY).read_text().replace("  tp: 2\n", "  tp: 4\n").replace("  dp: 2\n", "  dp: 1\n"))
    status, out, err = run_cli(["diff", TINY, str(other)], capsys=capsys)
    assert status == 0, err
    assert re.search(r"parallelism\.tp\s+2\s+4\s+\+100\.00%", out) and "step_time_s" in out
    one_line_error(*run_cli(["diff", TINY, str(a)], capsys=capsys)[::2], "b")
    one_line_error(*run_cli(["diff", str(a), str(tmp_path / "none.json")], capsys=capsys)[::2], "b")


def test_timeline_stage_and_window_selection():
    tl = timeline(simulate(load_scenario(TINY)))
    assert parse_stages("0-1", 2) == (0, 1) and parse_stages("1,0,1", 2) == (0, 1)
    with pytest.raises(ConfigError):
        parse_stages("2", 2)
    t0, t1 = parse_window(f"{tl.step_time_s / 4}:", tl.step_time_s)
    assert t1 == tl.step_time_s
    part = select(tl, (1,), (t0, t1))
    assert part.rows == (1,) and {b.stage for b in part.bars} == {1}
    assert all(t0 <= b.start < b.end <= t1 for b in part.bars)
    # the clipped bars still tile the window on the kept stage
    assert sum(b.end - b.start for b in part.bars) == pytest.approx(t1 - t0, rel=1e-9)


def test_timeline_of_selected_stages_is_drawn(tmp_path, capsys):
    png = tmp_path / "part.png"
    status, _, err = run_cli(["run", TINY, "--timeline", str(png), "--stages", "1", "--window", "0:0.004"],
                             capsys=capsys)
    assert status == 0, err
    assert png.stat().st_size > 5_000


def test_readme_validate_examples_run_from_the_repository():
    text = (ROOT / "README.md").read_text()
    assert "the issue" not in text.lower()
    paths = re.findall(r"stepsim validate ([^\s`]+)", text)
    assert paths
    for p in paths:
        if p.startswith("../shared/"):
            assert "beside the repository" in text  # said plainly, and a command that works from the repo is given
        else:
            assert (ROOT / p).is_file() or p == "runs.yaml", p
    assert any(not p.startswith("..") and p != "runs.yaml" for p in paths)


def test_no_traceback_for_a_bad_runs_file(tmp_path):
    bad = tmp_path / "runs.yaml"
    bad.write_text("cases: [\n")
    proc = subprocess.run([sys.executable, "-m", "simulator", "validate", str(bad)], capture_output=True, text=True,
                          cwd=ROOT)
    one_line_error(proc.returncode, proc.stderr, "runs")


def test_duplicate_keys_in_a_hugging_face_config_are_refused(tmp_path, capsys):
    hf = tmp_path / "config.json"
    hf.write_text('{"hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8, '
                  '"intermediate_size": 4096, "vocab_size": 32000, "hidden_size": 2048}')
    status, _, err = run_cli(["memory", TINY, "--set", f"model.hf_config={hf}"], capsys=capsys)
    one_line_error(status, err, "model.hf_config")
    assert "duplicate key 'hidden_size'" in err


GOOD_CASE = {"id": "c", "model": {"hf_id": "meta-llama/Llama-3.1-8B", "seq_len": 2048, "layers": 32},
             "hardware": {"gpu": "H100", "count": 8}, "parallelism": {"tp": 1, "pp": 1, "gbs": 8},
             "measured": {"step_time_s": 1.0}}


@pytest.mark.parametrize("doc, field", [
    ([1, 2], "runs"),                                                     # not a mapping
    ({"cases": {"a": 1}}, "runs"),                                        # cases not a list
    ({"cases": [1]}, "cases[0]"),                                         # a case that is not a mapping
    ({"cases": [{"model": {}}]}, "cases[0]"),                             # no id
    ({"cases": [GOOD_CASE, GOOD_CASE]}, "cases[1].id"),                   # an id twice
    ({"cases": [{**GOOD_CASE, "model": None}]}, "cases[c].model"),
    ({"cases": [{**GOOD_CASE, "model": {"hf_id": "nope/Nope", "seq_len": 2048, "layers": 2}}]},
     "cases[c].model.hidden"),                                            # not a catalog id: the shape is needed
    ({"cases": [{**GOOD_CASE, "hardware": {"gpu": "H100"}}]}, "cases[c].hardware.count"),
    ({"cases": [{**GOOD_CASE, "parallelism": {"tp": 1, "pp": "2", "gbs": 8}}]}, "cases[c].parallelism.pp"),
    ({"cases": [{**GOOD_CASE, "parallelism": {"tp": 1, "pp": 1, "gbs": 8, "mbs": "abc"}}]},
     "cases[c].parallelism.mbs"),
    ({"cases": [{**GOOD_CASE, "hardware": {"gpu": "H999", "count": 8}}]}, "runs"),  # every case fails to run
    ({"cases": []}, "runs"),                                              # nothing to validate: was exit 0
])
def test_a_malformed_runs_file_is_one_line_for_validate_and_plan(tmp_path, capsys, doc, field):
    """validate and plan --validate read a runs file through the same check (``validate.load_cases``):
    a case missing a field every case needs, or giving a count that is not one, is one line naming
    the case and field before anything runs (these were KeyError / TypeError tracebacks); a case
    that names an unknown GPU is that case's row, and a file of which no case runs exits 2."""
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump(doc))
    ran = "H999" in str(doc)  # the cases ran (each failed): their progress comes before the error
    status, out, err = run_cli(["validate", str(path), "--workers", "1"], capsys=capsys)
    one_line_error(status, err, field, after_work=ran)
    if ran:  # the table printed before the error says why nothing was scored
        assert "nothing to score: 1 could not be simulated" in out
    status, _, err = run_cli(["plan", str(path), "--validate"], capsys=capsys)
    one_line_error(status, err, field, after_work=ran)


def test_the_pre_simulation_window_check_names_no_step_length(capsys):
    """Before the simulation the step's length is unknown: the message said "inside the step of inf s"."""
    status, _, err = run_cli(["run", TINY, "--timeline", "x.png", "--window", "1:0"], capsys=capsys)
    one_line_error(status, err, "--window")
    assert err.rstrip().endswith("t0 must be below t1") and "inf" not in err


@pytest.mark.parametrize("key, value, message", [
    ("network_bandwidth_Gbps", ".nan", "must be a positive number"),          # accepted, then a link error
    ("nvlink_bandwidth_GBps", ".inf", "must be a positive number"),           # accepted
    ("oversubscription", ".nan", "must be a ratio >= 1"),
    ("gpus_per_node", "100000000", "at most 1,024"),                         # ran without end
    ("nodes_per_leaf", "1000000000000", "at most 131,072"),                  # a 116 TiB numpy array
])
def test_a_topology_file_is_bounded_like_the_scenario_keys_it_stands_for(tmp_path, capsys, key, value, message):
    text = (ROOT / "simulator" / "data" / "topologies" / "dgx-h100.yaml").read_text()
    topo = tmp_path / "topo.yaml"
    topo.write_text(re.sub(rf"^{key}:.*$", f"{key}: {value}", text, flags=re.M))
    status, _, err = run_cli(["collective", "--cluster", str(topo), "--sizes", "1MiB"], capsys=capsys)
    one_line_error(status, err, f"topology.{key}")
    assert message in err


def test_a_topology_that_is_a_pipe_or_device_is_named_not_taken_for_a_missing_name(tmp_path, capsys):
    fifo = tmp_path / "topo"
    os.mkfifo(fifo)
    for path, what in ((fifo, "is a named pipe (FIFO)"), ("/dev/zero", "is a character device")):
        status, _, err = run_cli(["memory", TINY, "--set", f"cluster.topology={path}"], capsys=capsys)
        one_line_error(status, err, "cluster.topology")
        assert what in err


def test_keys_are_named_as_yaml_writes_them_and_errors_stay_on_one_line(tmp_path, capsys):
    """`~: 2` was reported as parallelism.None and `yes: 2` as parallelism.True; a key holding a
    newline split the error over two lines."""
    text = Path(TINY).read_text()
    for written, shown in (("~", "parallelism.null"), ("yes", "parallelism.true"), ('"t\\np"', "parallelism.t\\np")):
        path = tmp_path / "keys.yaml"
        path.write_text(text.replace("  tp: 2\n", f"  tp: 2\n  {written}: 2\n"))
        one_line_error(*run_cli(["memory", str(path)], capsys=capsys)[::2], shown)
    one_line_error(*run_cli(["memory", TINY, "--set", "parallel\nism.tp=2"], capsys=capsys)[::2], "parallel\\nism.tp")


@pytest.mark.parametrize("name", ["a\nb", "\x1b[31mred", "a\tb"])
def test_names_with_control_characters_are_refused(name, capsys):
    """A newline or an escape sequence in the name broke or recoloured the report's lines."""
    status, _, err = run_cli(["memory", TINY, "--set", f"name={json.dumps(name)}"], capsys=capsys)
    one_line_error(status, err, "name")
    assert "without control characters" in err


def test_an_empty_scenario_file_says_it_is_empty(tmp_path, capsys):
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing yet\n")
    status, _, err = run_cli(["memory", str(empty)], capsys=capsys)
    one_line_error(status, err, "scenario")
    assert "is empty" in err


def test_a_runs_path_that_is_a_folder_says_so(tmp_path, capsys):
    status, _, err = run_cli(["validate", str(tmp_path)], capsys=capsys)
    one_line_error(status, err, "runs")
    assert "is a folder" in err


def test_bench_judges_a_plan_by_wall_time_against_the_median_of_three_runs():
    """issue 17's limits are on wall time against one ``stepsim run``: ``stepsim bench --plan`` runs
    the reference three times and divides by the median (one run's wall varies by a fifth here),
    and plans as ``stepsim plan`` does, with the planner's default workers."""
    from simulator.studies.bench import _PLAN, DEFAULT_WORKERS, PLAN_CASES, REFERENCE_RUNS, plan_cases, plan_ratio

    assert plan_ratio(30.0, [3.0, 4.0, 3.5], 10) == "  8.6x the median run (3.50 s of 3.00-4.00); limit 10x: met"
    assert plan_ratio(91.0, [3.5, 3.4, 4.5], 25).endswith("26.0x the median run (3.50 s of 3.40-4.50); limit 25x: over")
    rows = plan_cases()
    for label, path, _ in PLAN_CASES:
        mine = [r for r in rows if r[0].split()[1] == label]
        assert sum("(reference" in r[0] for r in mine) == REFERENCE_RUNS
        plans = [r for r in mine if r[1] is _PLAN]
        assert plans and all(r[2][0] == path and r[2][-1] == DEFAULT_WORKERS for r in plans)
        # the default plan: a table of 5, the best proven, the front of the simulated, no tolerance
        assert any(r[2][1:5] == ["5", "1", "simulated", "0"] for r in plans)


def test_every_bench_case_names_a_scenario_that_loads():
    """``stepsim bench`` is not run by the tests (timings), so its case lists are checked here
    without simulating: every case of the default, --quick, --scale and --plan lists names a known
    child program and, for a step, a scenario file whose overrides load and pass the rules."""
    from simulator.studies.bench import _ALL_REDUCE, _PLAN, _STEP, cases, plan_cases, scale_cases

    lists = {"default": cases(), "quick": cases(True), "scale": scale_cases(), "plan": plan_cases()}
    assert all(lists.values()) and len(lists["quick"]) < len(lists["default"])
    for name, chosen in lists.items():
        labels = [label for label, _, _ in chosen]
        assert len(labels) == len(set(labels)), name
        for label, program, argv in chosen:
            assert program in (_STEP, _PLAN, _ALL_REDUCE), label
            if program is _STEP:
                validate_plan(load_scenario(str(ROOT / argv[0]), argv[1:]))
            elif program is _PLAN:
                assert (ROOT / argv[0]).is_file(), label


def test_library_calls_refuse_more_local_workers_than_the_machine_holds():
    """The same limit when the planner, a sweep or validate is called from Python (no CLI check
    before it), before any process starts; the limit itself is accepted."""
    from simulator.studies.planner import plan
    from simulator.studies.sweep import Task, run_tasks
    from simulator.studies.validate import validate_file
    from simulator.studies.workers import WORKERS_PER_CPU, check_local_workers

    too_many = WORKERS_PER_CPU * (os.cpu_count() or 1) + 1
    with pytest.raises(ConfigError, match=f"at most {too_many - 1} local processes"):
        plan(TINY, workers=too_many, progress=None)
    with pytest.raises(ConfigError, match="--workers"):
        list(run_tasks([("a", Task({}, ".", "a", ()))], "process", too_many))
    with pytest.raises(ConfigError, match="--workers"):
        validate_file(str(ROOT / "tests/data/nemo-2407-runs.yaml"), workers=too_many)
    for bad in (0, -1, 1.5, True):  # one check (``check_local_workers``) for every entry point
        for call in (lambda: plan(TINY, workers=bad, progress=None),
                     lambda: list(run_tasks([("a", Task({}, ".", "a", ()))], "process", bad)),
                     lambda: validate_file(str(ROOT / "tests/data/nemo-2407-runs.yaml"), workers=bad)):
            with pytest.raises(ConfigError, match="--workers: got .*; must be a whole number >= 1"):
                call()
    assert check_local_workers(too_many - 1) == too_many - 1  # the limit itself is accepted
    assert check_local_workers(too_many, "ray", "head:6379") == too_many  # a Ray cluster's workers are not local


def test_errors_show_yaml_values_as_yaml_writes_them():
    """Scenario and --set values are YAML: a bad null or boolean is shown as the user wrote it."""
    assert str(ConfigError("cluster.gpus_per_node", None, "must be a whole number >= 1")) == \
        "cluster.gpus_per_node: got null; must be a whole number >= 1"
    assert str(ConfigError("parallelism.tp", True, "x")).startswith("parallelism.tp: got true;")
    assert str(ConfigError("parallelism.tp", "8x", "x")).startswith("parallelism.tp: got '8x';")


# --- errors in root-cause order ------------------------------------------------------------------

@pytest.mark.parametrize("sets, says", [
    # tp 3 splits neither the 8 heads nor the 8 GPUs: the heads are the cause, not the node count
    (["parallelism.tp=3", "parallelism.dp=null"], "parallelism.tp: got 3; must divide num_attention_heads (8)"),
    (["parallelism.tp=3"], "parallelism.tp: got 3; must divide num_attention_heads (8)"),
    # vp needs a pipeline before the layers can be split into pp x vp chunks
    (["parallelism.pp=1", "parallelism.dp=4", "parallelism.vp=3"], "parallelism.vp: got 3; virtual pipeline stages "
                                                                  "need pp > 1"),
    # the FFN split is the model's rule, named before the GPU count that tp 16 also misses
    (["parallelism.tp=16", "model.num_attention_heads=16", "model.num_key_value_heads=16",
      "model.intermediate_size=4104"], "parallelism.tp: got 16; must divide model.intermediate_size (4104)"),
])
def test_the_first_error_is_the_root_cause(sets, says):
    with pytest.raises(ConfigError) as err:
        validate_plan(load_scenario(TINY, sets))
    assert str(err.value).startswith(says), err.value


def test_a_key_left_out_is_named_as_left_out_with_its_default(tmp_path, capsys):
    """No training: section and a layout of dp 2: the batch rule fails on the default batch of 1,
    and the message says the key was left out instead of 'got 1', a value the file never wrote."""
    raw = yaml.safe_load(Path(TINY).read_text())
    del raw["training"]
    path = tmp_path / "no-training.yaml"
    path.write_text(yaml.safe_dump(raw))
    status, _, err = run_cli(["run", str(path)], capsys=capsys)
    one_line_error(status, err, "training.global_batch_size")
    assert err.startswith("stepsim: error: training.global_batch_size: left out (default 1); must be a multiple of "
                          "micro_batch_size x dp = 1 x 2 = 2")
    # written, the same value is a value the user gave
    status, _, err = run_cli(["run", str(path), "--set", "training.global_batch_size=1"], capsys=capsys)
    assert "training.global_batch_size: got 1; must be a multiple" in err
    del raw["cluster"]["num_nodes"]
    raw["parallelism"].update(tp=2, pp=2, dp=None, cp=1)
    raw["training"] = {"global_batch_size": 8}
    path.write_text(yaml.safe_dump(raw))
    status, _, err = run_cli(["run", str(path), "--set", "parallelism.tp=1", "--set", "parallelism.pp=3",
                              "--set", "model.num_hidden_layers=3"], capsys=capsys)
    assert err.startswith("stepsim: error: cluster.num_nodes: left out (default 1); 8 GPUs"), err
    del raw["model"]["hidden_size"]
    path.write_text(yaml.safe_dump(raw))
    status, _, err = run_cli(["memory", str(path)], capsys=capsys)
    assert err == "stepsim: error: model.hidden_size: left out; required\n"


def test_a_window_is_checked_in_two_steps_and_never_against_an_unknown_step(tmp_path, capsys):
    png = str(tmp_path / "t.png")
    status, _, err = run_cli(["run", TINY, "--timeline", png, "--window", "5:1"], capsys=capsys)
    one_line_error(status, err, "--window")
    assert "t0 must be below t1" in err and "inf" not in err
    status, _, err = run_cli(["run", TINY, "--timeline", png, "--window", "-1:1"], capsys=capsys)
    assert status == 2 and "t0 must be at least 0" in err
    status, _, err = run_cli(["run", TINY, "--timeline", png, "--window", "5:6"], capsys=capsys)
    import simulator

    step = simulator.run(simulator.load_scenario(TINY)).step_time_s
    assert status == 2 and err.splitlines()[-1].startswith("stepsim: error: --window: got '5:6'; starts at or past "
                                                           f"the end of the step, {step:.6g} s")


@pytest.mark.parametrize("gpus", [2049, 4096, 131072])
def test_an_all_to_all_whose_pairs_exceed_the_budget_is_refused_before_simulating(gpus, capsys):
    """Its flows grow with the square of the GPUs: 131,072 GPUs never returned; 2,048 is 4.2M pairs."""
    status, _, err = run_cli(["collective", "--cluster", "dgx-h100", "--gpus", str(gpus), "--op", "all_to_all"],
                             capsys=capsys)
    one_line_error(status, err, "--gpus")
    assert "pairs" in err and "use at most 2,048 GPUs" in err


def test_a_ring_over_as_many_gpus_is_not_refused(capsys):
    status, out, _ = run_cli(["collective", "--cluster", "dgx-h100", "--gpus", "4096", "--op", "all_reduce",
                              "--sizes", "1GiB"], capsys=capsys)
    assert status == 0 and "1GiB" in out


def test_an_expert_group_whose_all_to_all_exceeds_the_budget_is_refused():
    from simulator.common import limits

    assert 4096 * 4095 > limits.ALL_TO_ALL_PAIRS.maximum
    from simulator import simulation

    with pytest.raises(ConfigError) as err:
        simulation.checked("qwen3-30b-a3b-16xh100", ["parallelism.ep=4096"])
    assert err.value.field == "parallelism.ep" and "16,773,120 pairs" in str(err.value)


def test_no_fold_states_its_cost_and_is_refused_past_the_rank_budget(capsys):
    status, _, err = run_cli(["run", TINY, "--no-fold"], capsys=capsys)
    assert status == 0 and "--no-fold: all 8 ranks are simulated instead of one per pipeline stage (2)" in err
    status, _, err = run_cli(["run", "llama3-405b-16384xh100", "--no-fold"], capsys=capsys)
    one_line_error(status, err, "--no-fold")
    assert "16,384 ranks" in err and "at most 8,192" in err
    status, _, err = run_cli(["run", "llama3-405b-16384xh100", "--trace-all-ranks", "--trace", "x.json"],
                             capsys=capsys)
    one_line_error(status, err, "--trace-all-ranks")


def test_a_step_whose_work_exceeds_the_budget_is_refused_before_simulating(capsys):
    """16,384 micro-batches through 4,096 layers were accepted and ran for hours (each bound alone is
    inside its limit); the product is the work the engine walks."""
    status, _, err = run_cli(["run", TINY, "--set", "model.num_hidden_layers=4096", "--set",
                              "training.global_batch_size=32768", "--allow-oom"], capsys=capsys)
    one_line_error(status, err, "training.global_batch_size")
    assert "67,108,864 passes" in err and "at most 4,194,304" in err


def test_an_unfolded_step_whose_work_exceeds_the_budget_is_refused(capsys):
    status, _, err = run_cli(["run", TINY, "--no-fold", "--set", "model.num_hidden_layers=512", "--set",
                              "cluster.num_nodes=512", "--set", "parallelism.dp=1024", "--set",
                              "training.global_batch_size=8192", "--allow-oom"], capsys=capsys)
    one_line_error(status, err, "--no-fold")
    assert "passes to simulate over every rank" in err


def test_the_python_api_refuses_the_same_unfolded_work_naming_fold():
    """The guard sits in simulation.run, which every command and notebook calls, not only in the CLI."""
    import simulator

    with pytest.raises(ConfigError) as err:
        simulator.run("llama3-405b-16384xh100", fold=False)
    assert err.value.field == "fold" and "16,384 ranks" in str(err.value)
