"""Sweeps and what-ifs: the table, its files, resuming after kill -9, executors that agree."""

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.common.errors import ConfigError
from simulator.studies.sweep import CSV, JSONL, METRICS, parse_vary, points, read_log, run_sweep, table_csv
from simulator.studies.whatif import TARGETS, whatif, write_whatif

from procs import kill_9, kill_all, live_children, wait_for_lines

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "scenarios" / "tiny.yaml")
TWO_NODES = ["cluster.num_nodes=2", "parallelism.dp=null"]  # DP crosses the NICs, so bandwidth matters
BANDWIDTH = "cluster.network_bandwidth_Gbps"


def _csv_rows(path: Path) -> list[dict]:
    return list(csv.DictReader(io.StringIO(path.read_text())))


def test_four_by_two_sweep_gives_eight_rows_plots_and_step_time_never_rises_with_bandwidth(tmp_path):
    vary = [f"{BANDWIDTH}=100,200,400,800", "parallelism.tp=2,4"]
    rows = run_sweep(TINY, vary, tmp_path, sets=TWO_NODES, workers=2, progress=None)
    assert [r["point"] for r in rows] == points(parse_vary(vary))
    table = _csv_rows(tmp_path / CSV)
    assert len(table) == 8 and list(table[0]) == [BANDWIDTH, "parallelism.tp", *METRICS]
    assert all(r["error"] == "" and r["fits"] == "true" for r in table)
    assert METRICS[-2:] == ("contention_s", "host_wait_s")  # appended: earlier columns keep their places
    assert all(0 <= float(r["host_wait_s"]) < float(r["compute_s"]) and float(r["contention_s"]) >= 0 for r in table)
    for tp in ("2", "4"):
        times = [float(r["step_time_s"]) for r in table if r["parallelism.tp"] == tp]
        assert len(times) == 4 and all(b <= a for a, b in zip(times, times[1:])), times
        assert times[-1] < times[0]
    for name in ("step_time_vs_cluster_network_bandwidth_Gbps.png", "step_time_vs_parallelism_tp.png",
                 "breakdown.png"):
        assert (tmp_path / name).stat().st_size > 10_000
    assert len((tmp_path / JSONL).read_text().splitlines()) == 8


def test_invalid_and_oom_points_are_rows_not_crashes(tmp_path):
    rows = run_sweep(TINY, {"parallelism.tp": [2, 3], "training.micro_batch_size": [1, 1024]}, tmp_path,
                     sets=["training.global_batch_size=2048"], workers=1, progress=None, plots=False)
    by = {(r["point"]["parallelism.tp"], r["point"]["training.micro_batch_size"]): r for r in rows}
    assert "tp" in by[3, 1]["error"] and by[3, 1]["step_time_s"] is None
    assert by[2, 1]["fits"] is True and by[2, 1]["error"] is None
    oom = by[2, 1024]
    assert oom["fits"] is False and oom["peak_memory_gib"] > 80 and oom["step_time_s"] > 0


def test_rerun_skips_finished_points_and_a_cut_short_line_is_recomputed(tmp_path):
    vary = [f"{BANDWIDTH}=100,400", "parallelism.tp=2,4"]
    first = run_sweep(TINY, vary, tmp_path, sets=TWO_NODES, workers=1, progress=None, plots=False)
    log = tmp_path / JSONL
    text = log.read_text()
    lines = text.splitlines(keepends=True)
    log.write_text("".join(lines[:-1]) + lines[-1][:25])  # a kill in the middle of the last append
    err = io.StringIO()
    again = run_sweep(TINY, vary, tmp_path, sets=TWO_NODES, workers=1, progress=err, plots=False)
    assert "3 of 4 points already done" in err.getvalue() and err.getvalue().count("sweep: ") == 2
    assert again == first
    rows, damaged = read_log(log)
    assert not damaged and len(rows) == 4 and log.read_text().endswith("\n")
    err = io.StringIO()
    assert run_sweep(TINY, vary, tmp_path, sets=TWO_NODES, workers=1, progress=err, plots=False) == first
    assert "4 of 4 points already done" in err.getvalue()
    # another base scenario is another sweep: nothing is reused
    other = run_sweep(TINY, vary, tmp_path, sets=[*TWO_NODES, "training.seq_length=2048"], workers=1,
                      progress=None, plots=False)
    assert [r["point_id"] for r in other] != [r["point_id"] for r in first]
    assert len(read_log(log)[0]) == 8


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads worker processes from Linux /proc")
def test_kill_9_part_way_loses_nothing_kills_the_workers_and_the_rerun_completes_the_table(tmp_path):
    """slow (about 20 s): a real sweep killed with SIGKILL; its pool workers must die with it (parent-death
    signal), its lock must be taken over, and the rerun must give exactly the full set of rows."""
    out = tmp_path / "results"
    argv = [sys.executable, "-m", "simulator", "sweep", TINY, "--out", str(out), "--workers", "2",
            "--vary", f"{BANDWIDTH}=100,150,200,300,400,600,800,1600",
            "--set", "training.global_batch_size=1024", *(a for s in TWO_NODES for a in ("--set", s))]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    workers = []
    try:
        wait_for_lines(proc, out / JSONL, 1, 60)
        assert proc.poll() is None, "the sweep finished before it could be killed; make its points slower"
        workers = live_children(proc.pid)
        assert workers, "the sweep runs its points in pool workers"
        assert all(os.getpgid(w) == os.getpgid(proc.pid) for w in workers), "workers stay in the sweep's group"
        assert (out / ".lock").read_text().strip() == str(proc.pid)
        survivors = kill_9(proc, workers)
        assert not survivors, f"pool workers {survivors} outlived the killed sweep"
    finally:
        kill_all(workers)
    killed_rows, _ = read_log(out / JSONL)
    assert 1 <= len(killed_rows) < 8
    if (out / CSV).exists():
        table = _csv_rows(out / CSV)
        assert all(r["step_time_s"] for r in table) and len(table) <= len(killed_rows)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"{len(killed_rows)} of 8 points already done" in done.stderr
    assert f"taking over the lock of {out}: its owner, pid {proc.pid}, ended" in done.stderr
    assert (out / ".lock").read_text() == ""
    lines = (out / JSONL).read_text().splitlines()
    ids = [json.loads(line)["point_id"] for line in lines if line.strip()]
    assert len(ids) == len(set(ids)) == 8
    for pid, row in killed_rows.items():
        assert read_log(out / JSONL)[0][pid] == row
    table = _csv_rows(out / CSV)
    assert [int(r[BANDWIDTH]) for r in table] == [100, 150, 200, 300, 400, 600, 800, 1600]
    assert all(float(r["step_time_s"]) > 0 for r in table)
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_executors_and_worker_counts_give_identical_tables():
    vary = {BANDWIDTH: [100, 800], "parallelism.pp": [1, 2]}
    serial = run_sweep(TINY, vary, sets=TWO_NODES, workers=1, progress=None)
    pooled = run_sweep(TINY, vary, sets=TWO_NODES, workers=2, progress=None)
    keys = list(vary)
    assert table_csv(pooled, keys) == table_csv(serial, keys)


def test_ray_executor_gives_the_process_pool_table(tmp_path):
    pytest.importorskip("ray", reason="Ray is the optional extra stepsim[ray]; CI installs it")
    vary = [f"{BANDWIDTH}=100,800", "parallelism.tp=2,4"]
    pooled = run_sweep(TINY, vary, tmp_path / "pool", sets=TWO_NODES, workers=2, progress=None, plots=False)
    rayed = run_sweep(TINY, vary, tmp_path / "ray", sets=TWO_NODES, workers=2, executor="ray",
                      progress=None, plots=False)
    assert rayed == pooled
    assert (tmp_path / "ray" / CSV).read_bytes() == (tmp_path / "pool" / CSV).read_bytes()


@pytest.mark.parametrize("vary, field", [
    (["parallelism.tpx=1,2"], "parallelism.tpx"),
    (["parallelism.tp"], "--vary"),
    (["parallelism.tp=2,2"], "--vary parallelism.tp"),
    (["parallelism.tp=2", "parallelism.tp=4"], "--vary"),
])
def test_bad_vary_is_a_config_error(vary, field):
    with pytest.raises(ConfigError) as err:
        run_sweep(TINY, vary, progress=None)
    assert err.value.field == field


def test_sweep_cli_errors_are_one_line_with_exit_2(tmp_path):
    for extra in (["--vary", "parallelism.nope=1"], ["--vary", "parallelism.tp=2", "--executor", "dask"]):
        proc = subprocess.run([sys.executable, "-m", "simulator", "sweep", TINY, "--out", str(tmp_path), *extra],
                              capture_output=True, text=True)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_a_sweep_with_no_valid_point_keeps_its_rows_and_exits_2(tmp_path):
    """tiny.yaml pins dp = 2, so tp 1 misses its 8 GPUs and tp 3 does not divide its 8 heads (the
    cause named first, before the GPU count it also misses): every point is invalid. The rows
    are written (each with its reason), the plots draw without a legend of nothing, and the
    command ends with one error line and status 2 instead of reporting success."""
    def sweep(out, *extra):
        return subprocess.run([sys.executable, "-m", "simulator", "sweep", TINY, "--vary", "parallelism.tp=1,3",
                               "--quiet", "--workers", "1", "--out", str(out), *extra],
                              capture_output=True, text=True, timeout=120)

    proc = sweep(tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "no point of the sweep is valid" in proc.stderr
    assert "Warning" not in proc.stderr and "Traceback" not in proc.stderr
    rows, _ = read_log(tmp_path / JSONL)
    errors = sorted(r["error"] for r in rows.values())
    assert len(rows) == 2 and "tp x pp x dp x cp" in errors[0] and "must divide num_attention_heads" in errors[1]
    assert (tmp_path / "breakdown.png").stat().st_size > 0
    one_valid = sweep(tmp_path / "mixed", "--set", "parallelism.dp=null")
    assert one_valid.returncode == 0, one_valid.stderr  # tp 1 runs with dp derived; tp 3 stays an invalid row


def test_whatif_faster_never_slows_slower_never_speeds_and_compute_dominates(tmp_path):
    result = whatif(TINY, sets=TWO_NODES, workers=2)
    base = result["baseline_step_time_s"]
    rows = {r["target"]: r for r in result["rows"]}
    assert list(rows) == list(TARGETS)
    assert not rows["spine-core"]["present"] and rows["nvlink"]["present"] and rows["nic"]["present"]
    for r in rows.values():
        assert r["faster_step_time_s"] <= base <= r["slower_step_time_s"]
    assert rows["nvlink"]["slower_step_time_s"] > base
    assert rows["compute"]["faster_change"] < -0.2 and rows["compute"]["slower_change"] > 0.4
    paths = write_whatif(result, tmp_path)
    assert all(Path(p).stat().st_size > 0 for p in paths)
    assert len((tmp_path / "whatif.csv").read_text().splitlines()) == 1 + len(TARGETS)


def test_whatif_cli(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "simulator", "whatif", TINY, "--json", "--workers", "1",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["factor"] == 2.0 and (tmp_path / "tornado.png").exists()
    bad = subprocess.run([sys.executable, "-m", "simulator", "whatif", TINY, "--factor", "0.5"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--factor" in bad.stderr and bad.stderr.count("\n") == 1


def test_a_log_written_before_the_appended_columns_still_makes_a_table():
    """A results.jsonl from before contention_s / host_wait_s existed resumes into a table whose new
    cells are empty, not an error."""
    old = {"point": {"parallelism.tp": 2}, "step_time_s": 1.0, "compute_s": 0.5}
    rows = list(csv.DictReader(io.StringIO(table_csv([old], ["parallelism.tp"]))))
    assert rows[0]["step_time_s"] == "1.0" and rows[0]["host_wait_s"] == "" and rows[0]["contention_s"] == ""
