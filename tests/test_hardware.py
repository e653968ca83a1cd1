"""GPU catalog: datasheet numbers, aliases, errors that name the field and the valid values."""

import dataclasses

import pytest

from simulator.common.errors import ConfigError
from simulator.parts.gpus import GPU_CATALOG, PRECISIONS, GPUSpec, gemm_ceiling, get_gpu, peak


def test_h100_datasheet_numbers():
    gpu = get_gpu("H100-SXM5-80GB")
    assert gpu.peak_flops["bf16"] == 989e12
    assert gpu.peak_flops["fp8"] == 1979e12
    assert gpu.hbm_bandwidth_Bps == 3.35e12
    assert gpu.hbm_capacity_bytes == 80 * 2**30
    assert gpu.num_sms == 132


def test_a100_datasheet_numbers():
    gpu = get_gpu("A100-SXM4-80GB")
    assert gpu.peak_flops["bf16"] == 312e12
    assert gpu.num_sms == 108
    assert get_gpu("A100-SXM4-40GB").hbm_capacity_bytes == 40 * 2**30


@pytest.mark.parametrize(
    "name, per_direction",
    [("A100", 300e9), ("A800", 200e9), ("H100", 450e9), ("H800", 200e9), ("H200", 450e9), ("B200", 900e9)],
)
def test_nvlink_is_per_direction(name, per_direction):
    assert get_gpu(name).nvlink_bandwidth_Bps == per_direction


def test_h200_has_141_gb():
    assert get_gpu("h200").hbm_capacity_bytes == 141 * 2**30


@pytest.mark.parametrize(
    "alias, canonical",
    [
        ("H100", "H100-SXM5-80GB"),
        ("h100", "H100-SXM5-80GB"),
        ("  a100 ", "A100-SXM4-80GB"),
        ("a100-sxm4-40gb", "A100-SXM4-40GB"),
        ("B200", "B200-SXM-180GB"),
        ("h800-80gb", "H800-80GB"),
        ("NVIDIA A800 80GB SXM4", "A800-SXM4-80GB"),
        ("a800", "A800-SXM4-80GB"),
    ],
)
def test_aliases_case_insensitive(alias, canonical):
    assert get_gpu(alias) is GPU_CATALOG[canonical]


def test_a800_is_the_a100_with_two_thirds_of_its_nvlink():
    """NVIDIA's export variant: A100 SXM4 80GB compute, memory and TDP; NVLink 400 of 600 GB/s.
    Its 40 GB and PCIe cards are other parts (other links), so they are not guessed."""
    a800, a100 = get_gpu("A800"), get_gpu("A100-SXM4-80GB")
    assert a800.peak_flops == a100.peak_flops and a800.num_sms == a100.num_sms
    assert (a800.hbm_bandwidth_Bps, a800.hbm_capacity_bytes, a800.tdp_w) == \
        (a100.hbm_bandwidth_Bps, a100.hbm_capacity_bytes, a100.tdp_w)
    assert a800.nvlink_bandwidth_Bps == pytest.approx(a100.nvlink_bandwidth_Bps * 400 / 600)
    for other in ("A800 40GB", "A800 PCIe 80GB"):
        with pytest.raises(ConfigError):
            get_gpu(other)


def test_unknown_gpu_names_field_and_sorted_valid_list():
    with pytest.raises(ConfigError) as err:
        get_gpu("V100")
    assert err.value.field == "cluster.gpu"
    assert err.value.value == "V100"
    listed = err.value.valid.removeprefix("valid: ").split(", ")
    assert listed == sorted(listed)
    assert "H100-SXM5-80GB" in listed


def test_a100_has_no_fp8():
    with pytest.raises(ConfigError) as err:
        peak(get_gpu("A100"), "fp8")
    assert err.value.field == "training.precision"
    assert "bf16" in err.value.valid
    with pytest.raises(ConfigError):
        gemm_ceiling(get_gpu("A100"), "fp8")


def test_peak_fp16_equals_bf16_and_fp8_doubles_on_hopper():
    for gpu in GPU_CATALOG.values():
        assert peak(gpu, "fp16") == peak(gpu, "bf16")
        if "fp8" in gpu.peak_flops:
            assert peak(gpu, "fp8") == pytest.approx(2 * peak(gpu, "bf16"), rel=1e-3)


@pytest.mark.parametrize("gpu", list(GPU_CATALOG.values()), ids=list(GPU_CATALOG))
def test_catalog_entries_are_complete_and_physical(gpu: GPUSpec):
    assert set(gpu.peak_flops) <= set(PRECISIONS)
    assert {"bf16", "fp16", "tf32"} <= set(gpu.peak_flops)
    for precision in gpu.peak_flops:
        low = 0.3 if precision == "nvfp4" else 0.5  # NVFP4 kernels reach ~0.6 of FP8's fraction (hardware.py)
        assert low < gemm_ceiling(gpu, precision) < 1.0
    assert 0.5 < gpu.memory_efficiency < 1.0
    assert 0 < gpu.launch_overhead_s < 20e-6
    assert gpu.source


def test_spec_is_frozen_and_hashable():
    gpu = get_gpu("H100")
    with pytest.raises(dataclasses.FrozenInstanceError):
        gpu.num_sms = 1
    assert {gpu: 1}[gpu] == 1
    faster = dataclasses.replace(gpu, hbm_bandwidth_Bps=2 * gpu.hbm_bandwidth_Bps)
    assert faster.hbm_bandwidth_Bps == 6.7e12


@pytest.mark.parametrize("name, expected", [
    ("NVIDIA H100 80GB HBM3", "H100-SXM5-80GB"), ("A100 40GB SXM", "A100-SXM4-40GB"),
    ("a100_sxm4_80gb", "A100-SXM4-80GB"), ("NVIDIA H200", "H200-SXM-141GB")])
def test_gpu_names_as_people_write_them_find_the_catalog_entry(name, expected):
    assert get_gpu(name).name == expected


def test_grace_hopper_is_not_taken_for_an_h200():
    """'gh200' contains 'h200': the superchip has its own memory and a Grace host (TE#2053: a torch
    Linear forward took 33.17 us of CPU on GH200, 13.48 us on a DGX H100's Xeon)."""
    for name, key, gib, tbps in (("GH200", "GH200-96GB", 96, 4.0), ("NVIDIA GH200 480GB", "GH200-96GB", 96, 4.0),
                                 ("GH200 144GB HBM3e", "GH200-144GB", 144, 4.9)):
        gpu = get_gpu(name)
        assert gpu.name == key and gpu.hbm_capacity_bytes == gib * 2**30 and gpu.hbm_bandwidth_Bps == tbps * 1e12
        assert gpu.peak_flops == get_gpu("H100").peak_flops and gpu.num_sms == 132
        assert gpu.host_overhead == pytest.approx(33.17 / 13.48)
    assert get_gpu("H200").host_overhead == 1.0
    with pytest.raises(ConfigError, match="cluster.gpu"):  # no such part: not a guess at H200
        get_gpu("GH200 PCIe")


def test_pcie_parts_are_not_mistaken_for_sxm():
    with pytest.raises(ConfigError, match="cluster.gpu"):
        get_gpu("H100 PCIe")


# --- power limit (hardware.power_factor) ------------------------------------------------------

def test_power_factor_is_the_dvfs_cube_law():
    from simulator.parts.gpus import power_factor
    assert power_factor(700, 700) == 1.0
    assert power_factor(500, 700) == pytest.approx(0.8939, abs=1e-4)
    # halving the power keeps 2^(-1/3) of the clock
    assert power_factor(350, 700) == pytest.approx(0.5 ** (1 / 3))
    # inside torchtitan's bracket for its 500 W H100: between H100 NVL's and H100 SXM's peak
    assert 835 / 989 < power_factor(500, 700) < 1.0
    with pytest.raises(ValueError):
        power_factor(800, 700)


def test_grand_teton_h100_runs_compute_bound_kernels_at_its_500_w_limit():
    from simulator.parts.gpus import gpu_of, power_factor
    from simulator.scenario.config import ClusterConfig
    teton = gpu_of(ClusterConfig(gpu="H100-SXM5-96GB"), "bf16")
    sxm = gpu_of(ClusterConfig(gpu="H100-SXM5-80GB"), "bf16")
    assert teton.sustained_fraction == pytest.approx(sxm.sustained_fraction * power_factor(500, 700))
    # raised to its 700 W TDP (torchtitan: "tuning it up to 700W TDP can potentially provide further speedups")
    raised = gpu_of(ClusterConfig(gpu="H100-SXM5-96GB", gpu_power_limit_W=700), "bf16")
    assert raised.sustained_fraction == pytest.approx(sxm.sustained_fraction)
    capped = gpu_of(ClusterConfig(gpu="H100-SXM5-80GB", gpu_power_limit_W=500), "bf16")
    assert capped.sustained_fraction == pytest.approx(teton.sustained_fraction)
    # memory-bound kernels keep their bandwidth
    assert capped.memory_efficiency == sxm.memory_efficiency


def test_a_power_limit_slows_a_compute_bound_step_and_a_bad_one_is_a_one_line_error(tmp_path):
    import subprocess, sys
    y = tmp_path / "s.yaml"
    y.write_text("model: meta-llama/Llama-3.1-8B\ncluster: {topology: dgx-h100, num_nodes: 1}\n"
                 "training: {seq_length: 4096, global_batch_size: 8}\nparallelism: {dp: 8, zero_stage: 1}\n")

    def run(*sets):
        args = [a for v in sets for a in ("--set", v)]
        return subprocess.run([sys.executable, "-m", "simulator", "run", str(y), "--json", *args],
                              capture_output=True, text=True)
    import json
    full = json.loads(run().stdout)["step_time_s"]
    capped = json.loads(run("cluster.gpu_power_limit_W=500").stdout)["step_time_s"]
    assert full < capped < full / 0.8939 * 1.0001
    for bad in ("800", "100", "-5", "abc"):
        r = run(f"cluster.gpu_power_limit_W={bad}")
        assert r.returncode == 2 and "cluster.gpu_power_limit_W" in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    r = run("cluster.gpu=B200-SXM-180GB", "cluster.topology=dgx-b200", "cluster.gpu_power_limit_W=800")
    assert r.returncode == 2 and "no catalogued TDP" in r.stderr


def test_blackwell_gemm_ceilings_are_the_published_mamf():
    """S. Bekman's MAMF table (ml-engineering, compute/accelerator): B200 1745.0 / 3432.5, B300
    1769.0 / 3353.3, GB200 1822.0 / 3615.6 TFLOP/s BF16 / FP8; GB300 takes B300's (same die)."""
    from simulator.parts.gpus import gemm_ceiling

    for name, bf16, fp8, peak16 in (("B200", 1745.0, 3432.5, 2250), ("B300", 1769.0, 3353.3, 2250),
                                    ("GB200", 1822.0, 3615.6, 2500), ("GB300", 1769.0, 3353.3, 2250)):
        gpu = get_gpu(name)
        assert gpu.gemm_efficiency["bf16"] == pytest.approx(bf16 / peak16)
        assert gpu.gemm_efficiency["fp8"] == pytest.approx(fp8 / (2 * peak16))
        # block-scaled GEMMs: NVIDIA's B300 kernel times at equal shapes (TE GEMM profiling tutorial,
        # pre-quantized, per layer): FP8 6.812, MXFP8 7.161, NVFP4 3.764 ms; NVFP4 peak 3x FP8's there
        assert gpu.gemm_efficiency["mxfp8"] == pytest.approx(gpu.gemm_efficiency["fp8"] * 6.812 / 7.161)
        assert gpu.gemm_efficiency["nvfp4"] == pytest.approx(gpu.gemm_efficiency["fp8"] * 6.812 / 3.764 / 3)
        assert gemm_ceiling(gpu, "bf16") == pytest.approx(bf16 / peak16 * gpu.sustained_fraction)


def test_hopper_fp8_gemm_ceiling_is_the_published_mamf():
    """Bekman's MAMF table: H100 SXM FP8 e4m3 1402.6 of 1979 TFLOP/s (the matmul alone; casts are
    compute.py's quantize ops)."""
    from simulator.parts.gpus import gemm_ceiling
    gpu = get_gpu("H100-SXM5-80GB")
    assert gpu.gemm_efficiency["fp8"] == pytest.approx(1402.6 / 1979)
    assert gemm_ceiling(gpu, "fp8") == pytest.approx(1402.6 / 1979 * gpu.sustained_fraction)
