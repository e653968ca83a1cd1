"""The Python API (``import simulator``) is the one path the commands take: the same numbers, the same
JSON, the same one-line errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import simulator
from simulator.common.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "scenarios" / "tiny.yaml")


def _cli(*argv: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "simulator", *argv], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_run_to_json_is_what_run_json_prints_but_the_wall_time():
    api = json.loads(simulator.run(TINY).to_json())
    cli = json.loads(_cli("run", TINY, "--json"))
    api.pop("sim_wall_s"), cli.pop("sim_wall_s")
    assert api == cli
    assert list(api) == list(cli)  # the same fields in the same order


def test_run_is_typed_and_its_parts_agree():
    r = simulator.run(TINY)
    assert isinstance(r, simulator.Run) and isinstance(r.scenario, simulator.Scenario)
    assert r.step_time_s == r.report.step_time_s == r.to_dict()["step_time_s"]
    b = r.breakdown
    assert b.compute_s + sum(b.exposed_comm_s.values()) + b.idle_s == pytest.approx(r.step_time_s)
    assert len(r.stages) == r.scenario.parallelism.pp and r.memory.fits and r.warnings == ()
    assert r.summary().splitlines()[1].strip().startswith("step time")


def test_load_scenario_takes_a_path_a_mapping_or_a_scenario_with_overrides_as_list_or_mapping():
    s = simulator.load_scenario(TINY, {"parallelism.tp": 4, "parallelism.dp": None})
    assert s == simulator.load_scenario(TINY, ["parallelism.tp=4", "parallelism.dp=null"])
    assert (s.parallelism.tp, s.dp) == (4, 1)
    assert simulator.load_scenario(s) is s
    import yaml
    raw = yaml.safe_load(Path(TINY).read_text())
    assert simulator.load_scenario(raw, {"parallelism.tp": 4, "parallelism.dp": None}) == s
    assert simulator.run(s, {"parallelism.tp": 2, "parallelism.dp": 2}).step_time_s == simulator.run(TINY).step_time_s


def test_memory_is_what_memory_json_prints():
    assert simulator.memory(TINY).to_dict() == json.loads(_cli("memory", TINY, "--json"))


def test_sweep_and_plan_answer_as_their_commands():
    rows = simulator.sweep(TINY, {"parallelism.tp": [1, 2]}, {"parallelism.dp": None}, workers=1)
    assert [r["point"]["parallelism.tp"] for r in rows] == [1, 2] and all(r["step_time_s"] > 0 for r in rows)
    assert rows[1]["step_time_s"] == simulator.run(TINY).step_time_s
    result = simulator.plan(TINY, space=["tp=1,2", "pp=1,2", "cp=1", "micro_batch_size=1", "recompute=none",
                                         "zero_stage=1"], top=2, workers=1)
    assert result["best"]["step_time_s"] <= result["given"]["step_time_s"]


@pytest.mark.parametrize("call, field", [
    (lambda: simulator.run(TINY, ["parallelism.tp=0"]), "parallelism.tp"),
    (lambda: simulator.run(TINY, "parallelism.tp=2"), "overrides"),
    (lambda: simulator.run(TINY, algorithm="magic"), "algorithm"),
    (lambda: simulator.load_scenario(42), "scenario"),
    (lambda: simulator.run(TINY, {"parallelism.tp": 1, "parallelism.pp": 1, "parallelism.dp": 8,
                                  "model.hidden_size": 16384, "model.num_attention_heads": 128,
                                  "model.num_key_value_heads": 128, "model.num_hidden_layers": 64}), "memory"),
])
def test_bad_input_raises_the_one_line_config_error(call, field):
    with pytest.raises(ConfigError) as err:
        call()
    assert err.value.field == field and "\n" not in str(err.value)


def test_import_simulator_is_light_until_the_api_is_used():
    code = "import sys, simulator; print('simpy' in sys.modules, 'numpy' in sys.modules, simulator.__version__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.split()
    assert out[:2] == ["False", "False"] and out[2] == simulator.__version__
