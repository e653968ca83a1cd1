"""Bring your own parts: a framework profile by path, the generic profile when none is named, and a GPU
described inline or in a file; each with the same one-line errors as the shipped parts."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from simulator.common import resources
from simulator.common.errors import ConfigError
from simulator.parts.frameworks import GENERIC, load_profile
from simulator.scenario.load import load_scenario, scenario_from_dict, scenario_to_dict
from simulator.simulation import run

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "scenarios" / "tiny.yaml"
H100 = {"name": "my-h100", "like": "H100-SXM5-80GB", "peak_tflops": {"bf16": 989, "fp16": 989, "fp8": 1979, "tf32": 494.7},
        "hbm_gib": 80, "hbm_bandwidth_GBps": 3350, "nvlink_bandwidth_GBps": 450}


def _tiny(**changes) -> dict:
    d = yaml.safe_load(TINY.read_text())
    d.update(changes)
    return d


def _write(folder: Path, name: str, data) -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_profile_given_by_path_runs_like_the_shipped_profile_it_copies(tmp_path):
    _write(tmp_path, "my-stack.yaml", yaml.safe_load(resources.entry("frameworks", "megatron-core").read_text()))
    path = _write(tmp_path, "s.yaml", _tiny(framework="./my-stack.yaml"))
    s = load_scenario(str(path))
    assert s.framework == str((tmp_path / "my-stack.yaml").resolve())
    assert run(s).step_time_s == run(str(TINY)).step_time_s
    again = scenario_from_dict(scenario_to_dict(s))  # what a sweep or plan worker rebuilds
    assert again == s


def test_no_framework_or_null_is_the_generic_profile_and_it_runs():
    left_out = _tiny()
    del left_out["framework"]
    for d in (left_out, _tiny(framework=None)):
        s = scenario_from_dict(d)
        assert s.framework == GENERIC
        r = run(s)
        assert r.step_time_s > 0
    assert run(scenario_from_dict(left_out)).step_time_s != run(str(TINY)).step_time_s  # generic is not Megatron


def test_every_generic_value_states_the_shipped_profiles_it_was_taken_from():
    raw = yaml.safe_load(resources.entry("frameworks", GENERIC).read_text())
    names = [n for n in resources.names("frameworks") if n != GENERIC]
    for section, entries in raw.items():
        if isinstance(entries, dict):
            for key, entry in entries.items():
                assert "megatron-core" in entry["source"] and "torchtitan" in entry["source"], (section, key)
    assert len(names) >= 7


@pytest.mark.parametrize("value, pattern", [
    ("nanotronx", r"framework: got 'nanotronx'; no shipped profile of that name .*docs/extending.md"),
    ("./missing-profile.yaml", r"framework: got '.*missing-profile.yaml'; "),
    (7, r"framework: got 7; must be a non-empty string"),
])
def test_an_unknown_framework_is_a_one_line_error_saying_what_to_do(value, pattern, tmp_path):
    with pytest.raises(ConfigError, match=pattern):
        scenario_from_dict(_tiny(framework=value), base_dir=tmp_path)


@pytest.mark.parametrize("edit, field", [
    (lambda p: p["overlap"].update(tp_comms={"value": True, "source": "x"}), "overlap.tp_comms"),
    (lambda p: p.update(overlaps={}), "overlaps"),
    (lambda p: p["execution"]["host_issue_us"].update(value=-3), "execution.host_issue_us"),
    (lambda p: p["optimizer"]["adam_bytes_per_param"].update(source=""), "optimizer.adam_bytes_per_param"),
    (lambda p: p["attention"]["kernel"].update(value="flash9"), "attention.kernel"),
])
def test_a_bad_profile_file_names_the_file_and_the_key(edit, field, tmp_path):
    profile = yaml.safe_load(resources.entry("frameworks", "torchtitan").read_text())
    edit(profile)
    path = _write(tmp_path, "bad.yaml", profile)
    with pytest.raises(ConfigError) as err:
        load_profile(str(path))
    assert err.value.field == f"{path}: {field}" and "\n" not in str(err.value)


def test_a_gpu_described_with_a_catalog_gpus_figures_runs_as_that_gpu(tmp_path):
    inline = run(_tiny(cluster={**_tiny()["cluster"], "gpu": H100}))
    assert inline.step_time_s == run(str(TINY)).step_time_s
    _write(tmp_path, "gpu.yaml", H100)
    path = _write(tmp_path, "s.yaml", _tiny(cluster={**_tiny()["cluster"], "gpu": "gpu.yaml"}))
    from_file = run(str(path))
    assert from_file.step_time_s == inline.step_time_s and str(from_file.scenario.cluster.gpu) == "my-h100"
    half = run(_tiny(cluster={**_tiny()["cluster"], "gpu": {**H100, "hbm_bandwidth_GBps": 1675}}))
    assert half.step_time_s > inline.step_time_s  # memory-bound kernels slow down, nothing gets faster


@pytest.mark.parametrize("gpu, field", [
    ({**H100, "peak_tflops": {"fp8": 1979}}, "cluster.gpu.peak_tflops.bf16"),
    ({**H100, "peak_tflops": {"bf16": -1}}, "cluster.gpu.peak_tflops.bf16"),
    ({**H100, "peak_tflops": {"bf17": 1}}, "cluster.gpu.peak_tflops.bf17"),
    ({**H100, "hbm_gib": 0}, "cluster.gpu.hbm_gib"),
    ({**H100, "like": "V100"}, "cluster.gpu.like"),
    ({**H100, "nvlink_generation": 7}, "cluster.gpu.nvlink_generation"),
    ({**H100, "colour": "green"}, "cluster.gpu.colour"),
    ({k: v for k, v in H100.items() if k != "hbm_gib"}, "cluster.gpu.hbm_gib"),
])
def test_a_bad_gpu_description_is_a_one_line_error_naming_the_field(gpu, field):
    with pytest.raises(ConfigError) as err:
        scenario_from_dict(_tiny(cluster={**_tiny()["cluster"], "gpu": gpu}))
    assert err.value.field == field


def test_the_cli_runs_a_scenario_with_a_profile_path_and_an_inline_gpu(tmp_path):
    _write(tmp_path, "my-stack.yaml", yaml.safe_load(resources.entry("frameworks", "nemo").read_text()))
    path = _write(tmp_path, "s.yaml", _tiny(framework="my-stack.yaml", cluster={**_tiny()["cluster"], "gpu": H100}))
    proc = subprocess.run([sys.executable, "-m", "simulator", "run", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0 and "step time" in proc.stdout, proc.stderr
    bad = _write(tmp_path, "b.yaml", _tiny(framework="nope"))
    proc = subprocess.run([sys.executable, "-m", "simulator", "run", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
