"""A pool worker killed under a study (SIGKILL, as the out-of-memory killer does): one line naming
the point, case or layout it held, status 1, no traceback, the other work finished, and where the
command keeps a log (sweep, plan with --out) a rerun that resumes. Linux only: the tests find the
busy worker in /proc."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from procs import alive, busy_child, kill_all, live_children, wait_for_lines

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "scenarios" / "tiny.yaml")
# tiny on two nodes with a large batch: a few seconds per simulation, long enough to be killed in
SLOW = ["--set", "training.global_batch_size=4096", "--set", "cluster.num_nodes=2", "--set", "parallelism.dp=4"]
# A sweep point of SLOW simulates in about 0.45 s, less than busy_child's 0.5 s window, so the worker it
# picked had often finished its point by the kill (a flaky pass-through, status 0). Eight times the
# batch gives each point several seconds.
SLOWER = ["--set", "training.global_batch_size=32768", *SLOW[2:]]

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads worker processes from /proc")


def _kill_a_busy_worker(argv, *, wait_for: Path | None = None):
    """Start ``argv``, SIGKILL one pool worker in the middle of a task, and return the finished
    process (stdout, stderr, status) with the workers it had."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    workers = []
    try:
        if wait_for is not None:
            wait_for_lines(proc, wait_for, 1, 120)
        victim = busy_child(proc.pid, 120)
        assert victim is not None and proc.poll() is None, "the command finished before a worker could be killed"
        workers = live_children(proc.pid)
        os.kill(victim, signal.SIGKILL)
        out, err = proc.communicate(timeout=600)
        workers += [w for w in live_children(proc.pid) if w not in workers]
    finally:
        if proc.poll() is None:
            proc.kill()
        kill_all(workers)
    return out, err, proc.returncode, workers


def _one_error_line(err: str, starts: str) -> str:
    assert "Traceback" not in err and err.count("\n") == 1, err
    line = err.strip()
    assert line.startswith(f"stepsim: error: {starts}") and "killed by SIGKILL (as the out-of-memory killer does)" in line
    return line


def test_a_killed_sweep_worker_loses_its_point_alone_and_the_rerun_resumes(tmp_path):
    out = tmp_path / "results"
    bandwidth = "cluster.network_bandwidth_Gbps"
    argv = [sys.executable, "-m", "simulator", "sweep", TINY, "--out", str(out), "--workers", "2", "--quiet",
            "--vary", f"{bandwidth}=100,200,400", *SLOWER]
    stdout, err, status, workers = _kill_a_busy_worker(argv)
    assert status == 1
    line = _one_error_line(err, f"sweep point {bandwidth}=")
    assert "the other 2 of 3 points are in" in line and "rerun the same command to resume" in line
    lost = int(line.split(f"{bandwidth}=")[1].split(":")[0])
    logged = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(r["point"][bandwidth] for r in logged) == sorted({100, 200, 400} - {lost})
    assert all(r["step_time_s"] > 0 for r in logged)
    assert len(stdout.splitlines()) == 3  # the table of the finished points: a header and two rows
    assert not [w for w in workers if alive(w)], "no worker outlives the sweep"
    again = subprocess.run([a for a in argv if a != "--quiet"], capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert "2 of 3 points already done" in again.stderr
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(r["point"][bandwidth] for r in rows) == [100, 200, 400] and rows[:2] == logged


def test_a_killed_plan_worker_names_its_layout_and_the_rerun_reuses_the_log(tmp_path):
    out = tmp_path / "plan"
    argv = [sys.executable, "-m", "simulator", "plan", TINY, "--out", str(out), "--workers", "2", "--quiet", "--json",
            "--top", "5", "--prove", "5", "--space", "micro_batch_size=1", *SLOW]
    stdout, err, status, workers = _kill_a_busy_worker(argv, wait_for=out / "plan.jsonl")
    assert status == 1 and stdout == ""
    line = _one_error_line(err, "plan: ")
    assert "simulations are logged in" in line and "rerun the same command to resume" in line
    logged = {r["point_id"]: r for r in map(json.loads, (out / "plan.jsonl").read_text().splitlines())}
    assert logged and not [w for w in workers if alive(w)]
    again = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    rows = {r["point_id"]: r for r in map(json.loads, (out / "plan.jsonl").read_text().splitlines())}
    assert all(rows[k] == v for k, v in logged.items()) and json.loads(again.stdout)["best"]


def test_a_killed_validate_worker_is_its_case_s_row_and_the_others_are_predicted(tmp_path):
    doc = yaml.safe_load((ROOT / "tests/data/megatron-bridge-runs.yaml").read_text())
    doc["cases"] = doc["cases"][:3]
    runs = tmp_path / "runs.yaml"
    runs.write_text(yaml.safe_dump(doc))
    argv = [sys.executable, "-m", "simulator", "validate", str(runs), "--workers", "2", "--quiet", "--json"]
    stdout, err, status, workers = _kill_a_busy_worker(argv)
    assert status == 1
    line = _one_error_line(err, "validate: case ")
    result = json.loads(stdout)
    assert len(result["rows"]) == 3 and len(result["died"]) == 1 and f"case {result['died'][0]}:" in line
    dead = next(r for r in result["rows"] if r["id"] == result["died"][0])
    assert "SIGKILL" in dead["worker_died"] and dead["error"].startswith("not predicted:")
    assert all(isinstance(r["error"], float) for r in result["rows"] if r is not dead)
    assert not [w for w in workers if alive(w)]


def test_a_killed_whatif_worker_names_its_what_if(tmp_path):
    argv = [sys.executable, "-m", "simulator", "whatif", TINY, "--workers", "2", "--quiet", *SLOW]
    stdout, err, status, workers = _kill_a_busy_worker(argv)
    assert status == 1 and stdout == ""
    line = _one_error_line(err, "what-if ")
    assert "simulations finished; nothing is saved, a rerun starts over" in line
    assert not [w for w in workers if alive(w)]
