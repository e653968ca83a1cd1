"""MoE and catalog models: published parameter counts, MLA dimensions, the MoE layer's kernels,
all-to-all payloads, load imbalance, and bad input (issue 13)."""

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from simulator.scenario.config import MoEConfig, ParallelConfig, TrainingConfig
from simulator.common.errors import ConfigError
from simulator.parts.gpus import get_gpu
from simulator.scenario.load import scenario_from_dict
from simulator.layout.rules import validate_plan
from simulator.studies.cases import _uneven, case_to_scenario_dict
from simulator.workload import moe
from simulator.workload.compute import layer_cost, model_flops_per_token, param_counts
from simulator.workload.mla import attention_params, kv_cache_elements_per_token, window_fraction

ROOT = Path(__file__).resolve().parents[1]
H100 = get_gpu("H100-SXM5-80GB")


def model(hf_id):
    return scenario_from_dict({"model": hf_id}).model


# Published counts: simulator/data/models/README.md (model cards and the DeepSeek-V3 README).
@pytest.mark.parametrize("hf_id, total_b, active_b, tol", [
    ("deepseek-ai/DeepSeek-V3", 671, 37, 0.02),
    ("Qwen/Qwen3-235B-A22B", 235, 22, 0.02),
    ("mistralai/Mixtral-8x7B-v0.1", 46.7, 12.9, 0.02),
    ("meta-llama/Llama-4-Maverick-17B-128E", 400, 17, 0.02),
    ("openai/gpt-oss-120b", 117, None, 0.02),
    ("xai-org/grok-1", 314, None, 0.02),
    ("meta-llama/Llama-3.1-405B", 405, 405, 0.02),
])
def test_parameter_counts_match_the_published_ones(hf_id, total_b, active_b, tol):
    counts = param_counts(model(hf_id))
    assert counts["total"] / 1e9 == pytest.approx(total_b, rel=tol)
    if active_b is not None:
        assert counts["active"] / 1e9 == pytest.approx(active_b, rel=tol)


def test_deepseek_v3_mtp_module_is_counted_apart():
    """The HF repository's 685B = 671B + the 14B MTP module (DeepSeek-V3 README)."""
    counts = param_counts(model("deepseek-ai/DeepSeek-V3"))
    assert (counts["total"] + counts["mtp"]) / 1e9 == pytest.approx(685, rel=0.02)


def test_mla_dimensions_follow_the_deepseek_papers():
    """DeepSeek-V2 Table 1: MLA caches (d_c + d_h^R) = 4.5 d_h = 576 elements per token and layer,
    against 2 n_h d_h = 32768 for MHA; attention runs with 192-wide queries/keys and 128-wide values."""
    m = model("deepseek-ai/DeepSeek-V3")
    assert m.is_mla and (m.qk_head_dim, m.v_dim) == (192, 128)
    assert kv_cache_elements_per_token(m) == 576 == 4.5 * 128
    assert kv_cache_elements_per_token(replace(m, kv_lora_rank=None, kv_channels=128)) == 2 * 128 * 128 == 32768
    h = 7168
    assert attention_params(m) == h * 1536 + 1536 * 128 * 192 + h * 576 + 512 * 128 * 256 + 128 * 128 * h
    # model FLOPs per token: 6 x non-embedding active params (+ head) + 6 L s nq (qk + v)
    counts = param_counts(m)
    n = counts["active"] - counts["embedding"]
    assert model_flops_per_token(m, 4096) == pytest.approx(6 * n + 6 * 61 * 4096 * 128 * (192 + 128))


def test_mla_attention_core_uses_its_head_widths():
    m = model("deepseek-ai/DeepSeek-V3")
    t = TrainingConfig(seq_length=4096)
    core = next(op for op in layer_cost(m, t, ParallelConfig(), H100, 0).attn_fwd.ops if op.name == "attn_core")
    assert core.flops == pytest.approx(2 * 4096 ** 2 * 128 * (192 + 128) / 2)


def test_head_dim_is_honoured():
    """Qwen3-30B-A3B: hidden 2048 / 32 heads = 64, but its head_dim is 128."""
    m = model("Qwen/Qwen3-30B-A3B")
    assert m.head_dim == 128
    qkv = next(op for op in layer_cost(m, TrainingConfig(), ParallelConfig(ep=8), H100, 0).attn_fwd.ops
               if op.name == "qkv_proj")
    assert qkv.flops == 2 * 2048 * (32 + 8) * 128 * 2048


def test_gpt_oss_sliding_layers_compute_only_their_window():
    m = model("openai/gpt-oss-120b")
    assert m.attention_window(0) == 128 and m.attention_window(1) is None
    t = TrainingConfig(seq_length=4096)

    def core(layer):
        return next(op for op in layer_cost(m, t, ParallelConfig(ep=8), H100, layer).attn_fwd.ops
                    if op.name == "attn_core").flops
    assert core(0) / core(1) == pytest.approx(window_fraction(4096, 128))
    assert window_fraction(4096, 128) == pytest.approx((2 * 128 * 4096 - 128 ** 2) / 4096 ** 2)


def test_llama4_maverick_interleaves_moe_layers_with_a_shared_expert():
    m = model("meta-llama/Llama-4-Maverick-17B-128E")
    assert [m.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert (m.num_shared_experts, m.intermediate_size, m.expert_intermediate_size) == (1, 16384, 8192)


def expert_flops(cost):
    return sum(op.flops for op in cost.mlp_fwd.ops if op.name.startswith("expert_"))


def test_imbalance_two_doubles_the_busiest_ranks_expert_compute():
    m = model("Qwen/Qwen3-30B-A3B")
    t, par = TrainingConfig(seq_length=4096), ParallelConfig(ep=8)
    one = layer_cost(m, t, par, H100, 0, MoEConfig(imbalance=1.0))
    two = layer_cost(m, t, par, H100, 0, MoEConfig(imbalance=2.0))
    assert expert_flops(two) == pytest.approx(2 * expert_flops(one))
    up = lambda c: next(op for op in c.mlp_fwd.ops if op.name == "expert_up")  # noqa: E731
    assert up(two).time_s > 1.5 * up(one).time_s
    # the router and the shared parts do not change
    router = lambda c: next(op for op in c.mlp_fwd.ops if op.name == "router")  # noqa: E731
    assert router(two) == router(one)


def test_dispatch_bytes_are_tokens_times_topk_times_hidden_times_bytes():
    m = model("Qwen/Qwen3-30B-A3B")
    tokens = 2 * 4096
    par = ParallelConfig(ep=8)
    assert moe.dispatch_bytes(m, tokens, par, MoEConfig(), 1) == tokens * 8 * 2048 * 2
    assert moe.dispatch_bytes(m, tokens, par, MoEConfig(imbalance=1.5), 1) == 1.5 * tokens * 8 * 2048 * 2
    # DeepEP sends a token once per destination rank: fewer bytes than top-k copies
    assert moe.dispatch_bytes(m, tokens, par, MoEConfig(token_dispatcher="flex"), 1) < tokens * 8 * 2048 * 2


def test_node_limited_routing_cuts_deepep_inter_node_bytes():
    m = model("deepseek-ai/DeepSeek-V3")
    par = ParallelConfig(pp=16, ep=64)
    free = moe.dispatch_bytes(m, 4096, par, MoEConfig(token_dispatcher="flex"), 8)
    limited = moe.dispatch_bytes(m, 4096, par, MoEConfig(token_dispatcher="flex", max_nodes_per_token=4), 8)
    assert limited < free <= 4096 * 8 * 7168 * 2
    assert limited == pytest.approx(4096 * 7168 * 2 * moe.expected_destinations(4, 8))


def test_each_moe_cost_is_its_own_op_and_dropless_syncs_the_host():
    m = model("Qwen/Qwen3-30B-A3B")
    t, par = TrainingConfig(seq_length=4096, precision="fp8"), ParallelConfig(ep=8)
    names = [op.name for op in layer_cost(m, t, par, H100, 0, MoEConfig()).mlp_fwd.ops]
    for name in ("router", "router_topk", "moe_permute", "moe_host_sync", "moe_sort_chunks", "expert_fp8_cast",
                 "expert_up", "expert_act", "expert_down", "moe_unsort_chunks", "moe_unpermute"):
        assert name in names
    sync = next(op for op in layer_cost(m, t, par, H100, 0, MoEConfig()).mlp_fwd.ops if op.name == "moe_host_sync")
    assert sync.time_s >= moe.HOST_SYNC_S
    dropping = [op.name for op in layer_cost(m, t, par, H100, 0, MoEConfig(capacity_factor=1.0)).mlp_fwd.ops]
    assert "moe_host_sync" not in dropping
    backward = [op.name for op in layer_cost(m, t, par, H100, 0, MoEConfig()).mlp_bwd.ops]
    assert "moe_host_sync" not in backward and "moe_host_sync_bwd" not in backward


def test_split_moe_block_puts_the_experts_between_the_all_to_alls():
    m = model("Qwen/Qwen3-30B-A3B")
    cost = layer_cost(m, TrainingConfig(), ParallelConfig(ep=8), H100, 0)
    for block in (cost.mlp_fwd, cost.mlp_bwd):
        before, experts, after = moe.split_moe_block(block)
        assert before.ops and experts.ops and after.ops
        assert all(moe.is_expert_op(op.name.removesuffix("_bwd").removesuffix("_dgrad").removesuffix("_wgrad"))
                   for op in experts.ops)
        assert before.ops + experts.ops + after.ops == block.ops


def test_model_params_in_the_run_and_memory_json():
    from simulator.reports.report import step_report
    from simulator.engine.engine import simulate
    from simulator.workload.memory import memory_report

    s = scenario_from_dict({"model": {"hf_id": "Qwen/Qwen3-30B-A3B", "num_hidden_layers": 2,
                                      "num_experts": 8, "vocab_size": 1024},
                            "cluster": {"num_nodes": 1}, "training": {"seq_length": 512, "global_batch_size": 8},
                            "parallelism": {"ep": 8}})
    counts = param_counts(s.model)
    expected = {"total": counts["total"], "active": counts["active"]}
    assert step_report(simulate(s))["model_params"] == expected
    assert memory_report(s)["model_params"] == expected


@pytest.mark.parametrize("sets, field", [
    (["model.num_experts_per_tok=300"], "model.num_experts_per_tok"),
    (["parallelism.ep=6"], "parallelism.ep"),
    (["model.hf_id=deepseek-ai/DeepSeek-V4"], "model"),
])
def test_bad_moe_input_is_one_line_exit_2(sets, field, tmp_path):
    args = [sys.executable, "-m", "simulator", "run", "scenarios/qwen3-30b-a3b-16xh100.yaml"]
    for item in sets:
        args += ["--set", item]
    proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f" {field}: got " in f" {lines[0]}" and "Traceback" not in proc.stderr


def test_unknown_hf_id_names_close_ids():
    with pytest.raises(ConfigError) as err:
        scenario_from_dict({"model": "deepseek-ai/DeepSeek-V4"})
    assert "deepseek-ai/DeepSeek-V3" in str(err.value) and "\n" not in str(err.value)


def test_validate_splits_61_layers_unevenly_and_ignores_vp_at_pp1():
    assert _uneven(61, 16) == (3, 2) and _uneven(61, 8) == (7, 6)
    case = {"id": "x", "model": {"hf_id": "deepseek-ai/DeepSeek-V3", "layers": 61, "hidden": 7168, "heads": 128,
                                 "ffn_hidden": 18432, "vocab": 129280, "seq_len": 4096, "experts": 256, "topk": 8},
            "hardware": {"gpu": "H800", "count": 2048},
            "parallelism": {"tp": 1, "pp": 16, "dp": 2, "ep": 64, "gbs": 15360, "vp": None},
            "framework_options": {"moe_token_dispatcher": "flex (deepep)"}}
    notes = []
    d = case_to_scenario_dict(case, notes)
    assert d["parallelism"]["dp"] == 128 and any("leaves out expert ranks" in n for n in notes)
    assert (d["parallelism"]["first_pipeline_num_layers"], d["parallelism"]["last_pipeline_num_layers"]) == (3, 2)
    assert d["moe"]["max_nodes_per_token"] == 4  # 4 of 8 expert groups, EP64 over 8 nodes
    validate_plan(scenario_from_dict(d))
    one = dict(case, parallelism={"tp": 1, "pp": 1, "dp": 8, "ep": 8, "gbs": 64, "vp": 4},
               hardware={"gpu": "H100", "count": 8}, model=dict(case["model"], hf_id="Qwen/Qwen3-30B-A3B", layers=48))
    notes = []
    assert case_to_scenario_dict(one, notes)["parallelism"]["vp"] == 1 and any("vp 4 ignored" in n for n in notes)


def test_validate_runs_a_stated_megatron_pipeline_layout():
    """A Megatron-core layout string sets the first and last stages' layers; one stepsim cannot
    run (unequal middle stages, wrong stage or layer count) is named and the default split used."""
    from simulator.studies.cases import megatron_layout

    assert megatron_layout("Et*4|(t*4|)*14tmL", 16) == (4, 4, 1, 61)
    assert megatron_layout("Et|(tt|)*30mL", 32) == (1, 2, 0, 61)
    assert megatron_layout("Et*8|(t*8|)*6t*5mL", 8) == (8, 8, 5, 61)
    assert megatron_layout("Et*4|(t*4|)*14tmL", 8) is None  # 16 stages, not 8
    assert megatron_layout("Ett|ttt|t|tL", 4) is None  # middle stages of 3 and 1 layers
    case = {"id": "x", "model": {"hf_id": "deepseek-ai/DeepSeek-V3", "layers": 61, "hidden": 7168, "heads": 128,
                                 "ffn_hidden": 18432, "vocab": 129280, "seq_len": 4096, "experts": 256, "topk": 8},
            "hardware": {"gpu": "H100", "count": 1024},
            "parallelism": {"tp": 1, "pp": 8, "dp": 128, "ep": 64, "gbs": 8192, "vp": 1,
                            "pipeline_layout": "Et*8|(t*8|)*6t*5mL"},
            "framework_options": {"moe_token_dispatcher": "flex (deepep)"}}
    notes = []
    par = case_to_scenario_dict(case, notes)["parallelism"]
    assert (par["first_pipeline_num_layers"], par["last_pipeline_num_layers"]) == (8, 5)  # default: 7, 6
    assert any("as the case's pipeline_layout" in n for n in notes)
    notes = []
    bad = dict(case, parallelism=dict(case["parallelism"], pipeline_layout="Et*8|(t*8|)*6t*4mL"))  # 60 layers
    par = case_to_scenario_dict(bad, notes)["parallelism"]
    assert (par["first_pipeline_num_layers"], par["last_pipeline_num_layers"]) == (7, 6)
    assert any("not a first/equal-middle/last split" in n for n in notes)
    notes = []
    described = dict(case, parallelism=dict(case["parallelism"], pipeline_layout="DualPipe; split not stated"))
    case_to_scenario_dict(described, notes)
    assert not any("pipeline_layout" in n for n in notes)


def test_whatif_has_an_moe_imbalance_row():
    from simulator.studies.whatif import whatif

    moe_sets = ["model.num_experts=8", "model.num_experts_per_tok=2", "parallelism.ep=2", "moe.imbalance=1.5"]
    result = whatif(str(ROOT / "scenarios" / "tiny.yaml"), sets=moe_sets, workers=1)
    row = next(r for r in result["rows"] if r["target"] == "moe_imbalance")
    assert row["present"]
    assert row["faster_step_time_s"] < result["baseline_step_time_s"] < row["slower_step_time_s"]
    dense = whatif(str(ROOT / "scenarios" / "tiny.yaml"), workers=1)
    assert not next(r for r in dense["rows"] if r["target"] == "moe_imbalance")["present"]


def test_no_published_moe_layout_is_refused():
    """Every case of tests/data/moe-runs.yaml becomes a scenario that validate_plan accepts
    (derived dp, uneven pipeline splits, vp ignored at pp 1); the simulation itself is left to
    ``stepsim validate`` (minutes)."""
    import yaml

    path = ROOT / "tests" / "data" / "moe-runs.yaml"
    if not path.is_file():
        pytest.skip("tests/data/moe-runs.yaml not present")
    cases = yaml.safe_load(path.read_text())["cases"]
    assert len(cases) >= 20
    for case in cases:
        validate_plan(scenario_from_dict(case_to_scenario_dict(case)))


def test_validate_runs_the_stated_dualpipe_schedule_with_overlapped_all_to_alls():
    """A case naming DualPipe (DeepSeek-V3 report, Sec. 3.2.1) runs it, with the EP all-to-alls
    overlapped; a layout DualPipe cannot run (odd micro-batch count) falls back with a note."""
    import copy

    import yaml

    path = ROOT / "tests" / "data" / "moe-runs.yaml"
    if not path.is_file():
        pytest.skip("tests/data/moe-runs.yaml not present")
    case = next(c for c in yaml.safe_load(path.read_text())["cases"] if c["id"] == "deepseek-v3-report-2048xh800")
    d = case_to_scenario_dict(case)
    assert d["schedule"] == "dualpipe" and d["parallelism"]["vp"] == 1 and d["moe"]["overlap_a2a"] is True
    validate_plan(scenario_from_dict(d))
    odd = copy.deepcopy(case)
    odd["parallelism"]["gbs"] = 128 * 33  # 33 micro-batches per pipeline: DualPipe needs an even count
    notes: list[str] = []
    d = case_to_scenario_dict(odd, notes)
    assert d["schedule"] == "1f1b" and not d["moe"].get("overlap_a2a")
    assert any("dualpipe cannot run" in n for n in notes)


def test_te_multi_stream_experts_fill_the_sms_as_four_gemms_at_a_time():
    """Transformer Engine's GroupedLinear on Hopper: one cuBLAS GEMM per expert on 4 streams
    (cublaslt_gemm.cu multi_stream_cublas_gemm, multi_stream.cpp: 4), so the wave occupancy is
    that of min(4, experts) GEMMs' tiles, not of one grouped kernel over all of them."""
    from simulator.workload.compute import gemm_efficiency
    from simulator.parts.gpus import peak

    m = model("Qwen/Qwen3-30B-A3B")  # 128 experts, moe_intermediate 768, hidden 2048
    t, par = TrainingConfig(seq_length=4096, micro_batch_size=1), ParallelConfig(ep=8)  # 16 local experts
    up = lambda c: next(op for op in c.mlp_fwd.ops if op.name == "expert_up")  # noqa: E731
    one_kernel = up(layer_cost(m, t, par, H100, 0, MoEConfig()))
    streams = up(layer_cost(m, t, par, H100, 0, MoEConfig(grouped_gemm_streams=moe.TE_GEMM_STREAMS)))
    rows = 4096 * 8 / 16  # balanced: the rank's experts get tokens x top-k copies, 2048 rows each
    flops = 2 * 16 * rows * 2 * 768 * 2048
    assert streams.flops == one_kernel.flops == pytest.approx(flops)
    rate = peak(H100, "bf16") * gemm_efficiency(rows, 2 * 768, 2048, H100, "bf16", 4)
    assert streams.time_s == pytest.approx(flops / rate + H100.launch_overhead_s)
    assert streams.time_s > 1.1 * one_kernel.time_s  # 4 x 96 tiles per wave set against 16 x 96
    # with no more experts than streams the two are the same kernel shape
    few = ParallelConfig(ep=64)  # 2 local experts
    assert (up(layer_cost(m, t, few, H100, 0, MoEConfig(grouped_gemm_streams=4))).time_s
            == up(layer_cost(m, t, few, H100, 0, MoEConfig())).time_s)


def test_validate_runs_megatron_experts_through_te_streams_on_hopper_only():
    import yaml

    cases = {c["id"]: c for c in yaml.safe_load((ROOT / "tests/data/moe-runs.yaml").read_text())["cases"]}
    mcore = case_to_scenario_dict(cases["mbridge-2511-h100-qwen3-30b-a3b-fp8cs-16"])
    assert mcore["moe"]["grouped_gemm_streams"] == 4
    automodel = case_to_scenario_dict(cases["automodel-h100-qwen3-30b-a3b-bf16-8"])
    assert "grouped_gemm_streams" not in automodel["moe"]
    blackwell = dict(cases["mbridge-2511-h100-qwen3-30b-a3b-fp8cs-16"],
                     hardware=dict(cases["mbridge-2511-h100-qwen3-30b-a3b-fp8cs-16"]["hardware"], gpu="B200"))
    assert "grouped_gemm_streams" not in case_to_scenario_dict(blackwell)["moe"]


def test_nccl_all_to_all_inside_a_node_runs_at_370_of_450_gbps():
    """NCCL's non-allreduce collectives reach 370 GB/s of H100's 450 GB/s NVLink line rate
    (S. Jeaugey, NVIDIA/nccl-tests issue 212): on links at NCCL's rating of them (20.6 of 25 GB/s)
    the all-to-all pays the small rest; links derated further (A100 0.80) pay nothing more."""
    assert moe.a2a_efficiency(MoEConfig(), 1, H100.nvlink_efficiency) * H100.nvlink_efficiency == pytest.approx(370 / 450)
    assert moe.a2a_efficiency(MoEConfig(), 1, get_gpu("A100").nvlink_efficiency) == 1.0
    assert moe.a2a_efficiency(MoEConfig(), 2, H100.nvlink_efficiency) == moe.NCCL_A2A_NET_EFFICIENCY
    assert moe.a2a_efficiency(MoEConfig(token_dispatcher="flex"), 1) == moe.DEEPEP_NVLINK_EFFICIENCY
    from simulator.workload.workload import build_workload

    s = scenario_from_dict({"model": {"hf_id": "Qwen/Qwen3-30B-A3B", "num_hidden_layers": 2, "vocab_size": 1024},
                            "cluster": {"num_nodes": 1, "gpu": "H100"},
                            "training": {"seq_length": 1024, "global_batch_size": 8}, "parallelism": {"ep": 8}})
    w = build_workload(s, H100)
    # on links of 450 x nvlink_efficiency GB/s the payload takes the time of 370 GB/s
    assert w.ep_bytes == pytest.approx(w.ep_payload_bytes * 450 * H100.nvlink_efficiency / 370)


def test_megatron_bridge_moe_a2a_overlap_overlaps_the_ep_all_to_alls():
    """Megatron-Bridge's ``moe_a2a_overlap`` sets Megatron-core's overlap_moe_expert_parallel_comm
    (scripts/performance/utils/overrides.py), the same EP overlap as ``moe_a2a_1f1b_overlap``."""
    import yaml

    cases = {c["id"]: c for c in yaml.safe_load((ROOT / "tests/data/blackwell-runs.yaml").read_text())["cases"]}
    on = cases["mbridge-2606-gb200-dsv3-mxfp8-256"]
    assert on["framework_options"]["moe_a2a_overlap"] is True
    assert case_to_scenario_dict(on)["moe"]["overlap_a2a"] is True
    off = cases["mbridge-2606-b300-dsv3-mxfp8-256"]
    assert off["framework_options"]["moe_a2a_overlap"] is False
    assert not case_to_scenario_dict(off)["moe"].get("overlap_a2a")


def test_validate_turns_fp8_dot_product_attention_into_fp8_attention_only_under_fp8():
    import copy

    import yaml

    cases = {c["id"]: c for c in yaml.safe_load((ROOT / "tests/data/blackwell-runs.yaml").read_text())["cases"]}
    case = cases["mbridge-2606-gb300-dsv3-mxfp8-256"]
    assert case["framework_options"]["fp8_dot_product_attention"] is True
    assert case_to_scenario_dict(case)["training"]["fp8_attention"] is True
    assert "fp8_attention" not in case_to_scenario_dict(cases["mbridge-2606-gb200-dsv3-mxfp8-256"])["training"]
    bf16 = copy.deepcopy(case)
    bf16["precision"] = "bf16"
    bf16["framework_options"].pop("fp8_recipe")
    assert "fp8_attention" not in case_to_scenario_dict(bf16)["training"]


def test_moe_host_ops_are_the_sum_of_their_counted_parts():
    """DeepSeek-V3, EP 32 (8 local experts), alltoall, MXFP8, no router or permute fusion: the
    Megatron-core / Transformer Engine components (simulator.workload.moe constants) added by hand."""
    m = model("deepseek-ai/DeepSeek-V3")
    par = ParallelConfig(ep=32)
    shared = 2 * 4 + 2 + 2 * 2  # two TE Linear, SwiGLU, two input quantisations
    router = (5 + 1) + (10 + 6) + 2  # gating GEMM and view, sigmoid top-k with expert bias, bias count
    meta = 16 + 1  # counts, splits, count all-gather, per-local-expert view
    dtoh = 2 + 2 * 4 + 3 + 2  # wait/record, four copies (+ numpy), per-local-expert counts
    permute = 11
    a2a = 3 * 3  # tokens, probs, combine
    sort = (1 + 2 * 4) + (2 + 4)
    grouped_linear = (4 + 2) + 8 * 1 + (1 + 4 + 2 * 2) + 8 * 1  # fixed, GEMMs, quantise fixed, per expert
    experts = 2 + 2 + 3 * 4 + 2 * grouped_linear
    unpermute = 5 + 1
    assert moe.moe_host_ops(m, par, MoEConfig(), "mxfp8") == (
        shared + router + meta + dtoh + permute, a2a + sort + experts + unpermute + 1)


def test_more_local_experts_issue_more_host_ops_and_quantising_adds_per_expert_work():
    m = model("deepseek-ai/DeepSeek-V3")
    for precision in ("bf16", "fp8", "mxfp8", "nvfp4"):
        few = moe.moe_host_ops(m, ParallelConfig(ep=64), MoEConfig(), precision)
        many = moe.moe_host_ops(m, ParallelConfig(ep=8), MoEConfig(), precision)
        assert many[1] > few[1] and many[0] == few[0]
    bf16 = moe.moe_host_ops(m, ParallelConfig(ep=8), MoEConfig(), "bf16")[1]
    for precision in ("fp8", "mxfp8", "nvfp4"):
        assert moe.moe_host_ops(m, ParallelConfig(ep=8), MoEConfig(), precision)[1] > bf16 + 2 * 32


def test_flex_dispatcher_moves_host_ops_after_the_sync_and_fusions_remove_some():
    """The code says: DeepEP needs no count metadata, copies or first permutation before its sync
    (fewer ops before it and in all) but rebuilds the routing map and permutes after it (more after)."""
    m = model("deepseek-ai/DeepSeek-V3")
    par = ParallelConfig(ep=32)
    a2a = moe.moe_host_ops(m, par, MoEConfig(), "bf16")
    flex = moe.moe_host_ops(m, par, MoEConfig(token_dispatcher="flex"), "bf16")
    assert flex[0] < a2a[0] and sum(flex) < sum(a2a) and flex[1] > a2a[1]
    fused_router = moe.moe_host_ops(m, par, MoEConfig(), "bf16", router_fusion=True)
    fused_permute = moe.moe_host_ops(m, par, MoEConfig(), "bf16", permute_fusion=True)
    assert fused_router[0] < a2a[0] and fused_router[1] == a2a[1]
    assert sum(fused_permute) < sum(a2a)


def test_only_the_ops_after_the_sync_stall_without_run_ahead():
    s, op = moe.HOST_SYNC_S, moe.HOST_OP_S
    # after the sync: 100 ops against 0.5 ms of GPU work stall 0.5 ms; the ops before the next sync
    # are covered by their own GPU time
    assert moe.host_sync_time(1e-3, 0.5e-3, 50, 100) == pytest.approx(s + 100 * op - 0.5e-3)
    # GPU time left over after the sync is a head start for the ops before the next one
    assert moe.host_sync_time(0.2e-3, 1.0e-3, 50, 10) == pytest.approx(s + max(0.0, 50 * op - 0.2e-3 - 0.9e-3))
    assert moe.host_sync_time(0.0, 0.0, 0, 0) == s


def test_a_grace_host_issues_each_op_slower_by_the_measured_ratio():
    """TransformerEngine#2053: one torch Linear forward took 37.08 us of CPU on GB200, 13.48 us on a
    DGX H100's Xeon. Grace-hosted parts carry that ratio; x86-hosted ones (B200, B300, H100) do not."""
    from simulator.parts.gpus import GRACE_HOST_OVERHEAD

    assert GRACE_HOST_OVERHEAD == pytest.approx(37.08 / 13.48)
    assert get_gpu("GB200").host_overhead == get_gpu("GB300").host_overhead == GRACE_HOST_OVERHEAD
    assert get_gpu("B200").host_overhead == get_gpu("B300").host_overhead == get_gpu("H100").host_overhead == 1.0
    # the MoE sync prices its ops at that much more host time per op (closed form above)
    m = model("Qwen/Qwen3-30B-A3B")
    t, par = TrainingConfig(seq_length=4096, precision="bf16"), ParallelConfig(ep=8)
    gb = replace(get_gpu("GB200"), host_overhead=1.0)

    def sync(gpu):
        return next(op.time_s for op in layer_cost(m, t, par, gpu, 0, MoEConfig()).mlp_fwd.ops
                    if op.name == "moe_host_sync")

    assert sync(get_gpu("GB200")) > sync(gb) >= moe.HOST_SYNC_S
    assert moe.host_sync_time(0.0, 0.0, 10, 20, 3 * moe.HOST_OP_S) == pytest.approx(moe.HOST_SYNC_S
                                                                                  + 30 * 3 * moe.HOST_OP_S)


def test_a_whole_iteration_cuda_graph_has_no_host_sync():
    """A CUDA graph cannot hold a device-to-host sync: with the whole iteration captured the dropless
    layer's sync costs nothing, while the per-kernel host issue is gone too (profile cuda_graphs)."""
    m = model("Qwen/Qwen3-30B-A3B")
    t, par = TrainingConfig(seq_length=4096, precision="bf16"), ParallelConfig(ep=8)
    eager = layer_cost(m, t, par, get_gpu("GB200"), 0, MoEConfig())
    graphed = layer_cost(m, t, par, get_gpu("GB200"), 0, MoEConfig(), graphed=True)
    assert next(op.time_s for op in eager.mlp_fwd.ops if op.name == "moe_host_sync") > 0
    assert sum(op.time_s for op in graphed.mlp_fwd.ops if op.name == "moe_host_sync") == 0
    assert eager.mlp_fwd.time_s > graphed.mlp_fwd.time_s


def test_the_workload_charges_a_grace_host_its_slower_kernel_issue():
    from simulator.parts.gpus import gpu_of
    from simulator.workload.frameworks import resolve
    from simulator.workload.workload import build_workload

    s = scenario_from_dict({
        "model": "Qwen/Qwen3-30B-A3B",
        "cluster": {"topology": "gb200-nvl72", "num_nodes": 1, "gpu": "GB200"},
        "training": {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 64, "precision": "bf16"},
        "parallelism": {"tp": 1, "pp": 1, "dp": 64, "ep": 8},
    })
    gpu = gpu_of(s.cluster, s.training.precision)
    assert resolve(s).host_issue_s > 0
    assert build_workload(s, gpu).software.host_issue_s == pytest.approx(resolve(s).host_issue_s
                                                                         * gpu.host_overhead)


def test_a_graphed_router_and_attention_leave_only_their_launches_before_the_sync():
    """With attn, moe_router and moe_preprocess captured, the host ops before the sync are one launch
    per graph plus what no graph holds: ``host_sync_time`` of the reduced counts."""
    m = model("deepseek-ai/DeepSeek-V3")
    t, par = TrainingConfig(seq_length=256, precision="bf16"), ParallelConfig(ep=32, pp=8)  # host-bound
    flex = MoEConfig(token_dispatcher="flex")
    gpu = get_gpu("GB200")
    layer = 5  # an MoE layer

    def sync(scope):
        return next(op.time_s for op in layer_cost(m, t, par, gpu, layer, flex, graph_scope=scope).mlp_fwd.ops
                    if op.name == "moe_host_sync")

    eager, graphed = sync(()), sync(("attn", "moe_router", "moe_preprocess"))
    assert graphed < eager
    base = layer_cost(m, t, par, gpu, layer, flex)
    before, after = moe.moe_host_ops(m, par, flex, "bf16")
    routing = moe.graphed_routing_ops(m, par, flex, "bf16")
    assert 0 < routing <= before
    ops = base.mlp_fwd.ops
    i = [op.name for op in ops].index("moe_host_sync")
    later = [op for op in ops[i + 1:] if not op.name.startswith("shared_")]  # the shared expert runs first

    def counted(op):  # the ops the code count stands for are not counted again
        return not (op.name in ("router", "router_topk", "moe_permute", "moe_unpermute")
                    or moe.is_expert_op(op.name) or op.name.startswith("shared_"))

    gpu_before = base.attn_fwd.time_s + sum(op.time_s for op in ops if op not in later and op is not ops[i])
    gpu_after = sum(op.time_s for op in later)
    ops_before = 1 + sum(map(counted, ops[:i])) + (before - routing + 1)  # one launch per graph
    ops_after = sum(map(counted, later)) + after
    expected = moe.host_sync_time(gpu_before, gpu_after, ops_before, ops_after, moe.HOST_OP_S * gpu.host_overhead)
    assert graphed == pytest.approx(expected)
    # eager, every attention op and the whole routing count
    assert eager == pytest.approx(moe.host_sync_time(gpu_before, gpu_after,
                                                     len(base.attn_fwd.ops) + sum(map(counted, ops[:i])) + before,
                                                     ops_after, moe.HOST_OP_S * gpu.host_overhead))


def test_a_weight_gradient_accumulated_into_fp32_main_grad_moves_eight_bytes_per_weight_element():
    """Megatron-core's fused wgrad accumulation reads and writes the fp32 main_grad (4 + 4 bytes per
    weight element) where a fresh 16-bit gradient writes 2: the same FLOPs, 6 more bytes per
    element of every expert's weight. With few tokens per expert (TP4 x EP8 with sequence
    parallelism: 1024 tokens x top-8 over 8 ranks' 16 local experts, 512 each) the wgrad is then
    memory-bound, its time those bytes at the HBM rate; a dense wgrad over a whole micro-batch stays
    compute-bound and does not change."""
    m = model("Qwen/Qwen3-235B-A22B")
    t = TrainingConfig(seq_length=4096)
    par = ParallelConfig(tp=4, ep=8, etp=1, sequence_parallel=True)
    fresh = layer_cost(m, t, par, H100, 0, MoEConfig(), wgrad_bytes=2)
    fused = layer_cost(m, t, par, H100, 0, MoEConfig(), wgrad_bytes=8)
    op = lambda c, name: next(o for o in c.mlp_bwd.ops + c.attn_bwd.ops if o.name == name)  # noqa: E731
    local = 128 // 8
    for name, n, k in (("expert_up_wgrad", 2 * 1536, 4096), ("expert_down_wgrad", 4096, 1536)):
        a, b = op(fresh, name), op(fused, name)
        assert b.flops == a.flops
        assert b.bytes - a.bytes == pytest.approx(6 * local * n * k)
        # 512 tokens per expert: memory-bound, so the time is the bytes at the HBM rate
        assert b.time_s == pytest.approx(b.bytes / (H100.hbm_bandwidth_Bps * H100.memory_efficiency)
                                         + H100.launch_overhead_s)
        assert b.time_s > 1.5 * a.time_s
    # the attention's projections see the micro-batch's 4096 tokens: compute-bound either way
    assert op(fused, "qkv_proj_wgrad").time_s == op(fresh, "qkv_proj_wgrad").time_s


def test_framework_profiles_say_where_the_weight_gradient_goes():
    from simulator.parts.frameworks import load_profile

    assert load_profile("megatron-core")["optimizer"]["wgrad_bytes_per_param"] == 8
    assert load_profile("nemo")["optimizer"]["wgrad_bytes_per_param"] == 8
    for fsdp in ("torchtitan", "automodel", "composer"):
        assert load_profile(fsdp)["optimizer"]["wgrad_bytes_per_param"] == 2


def test_deepep_and_hybridep_figures_are_logical_bandwidths():
    """DeepEP and HybridEP publish logical bandwidth: the bytes they count include each node's
    (rank's) copies to itself, which cross no link (DeepEP README: "the results are logical
    bandwidth"). stepsim moves only the share that crosses the link, so one dispatch of payload P
    over N nodes takes P / logical = P (N - 1) / N / (efficiency x link rate): EP16 on H800 at
    43 GB/s logical is 21.5 GB/s through each 50 GB/s NIC."""
    deepep, hybrid = MoEConfig(token_dispatcher="flex"), MoEConfig(token_dispatcher="flex", flex_backend="hybridep")
    nic = 50e9
    for nodes, logical in ((2, 43e9), (4, 57.5e9), (8, 50.5e9)):
        share = (nodes - 1) / nodes
        assert share / (moe.a2a_efficiency(deepep, nodes) * nic) == pytest.approx(1 / logical)
    # HybridEP on H100 (16 SMs, BF16 dispatch and combine averaged): 53.9 GB/s logical on 2 nodes
    assert 0.5 / (moe.a2a_efficiency(hybrid, 2) * nic) == pytest.approx(2 / (54.47e9 + 53.35e9))
    assert moe.a2a_efficiency(hybrid, 2) > moe.a2a_efficiency(deepep, 2)
    assert moe.a2a_efficiency(deepep, 3) == moe.a2a_efficiency(deepep, 4)
    assert moe.a2a_efficiency(deepep, 64) == moe.a2a_efficiency(deepep, 8)
    # in one Hopper node 153 / 158 GB/s logical over 8 ranks on H800's 200 GB/s: 7/8 of it crosses
    assert moe.a2a_efficiency(deepep, 1) == pytest.approx(155.5 * 7 / 8 / 200)
    # NVLink 5: the kernels fill less of the link; HybridEP more than DeepEP, less over more ranks
    b5 = dict(nvlink_generation=5)
    assert moe.a2a_efficiency(deepep, 1, **b5) < moe.a2a_efficiency(hybrid, 1, **b5, ep=8) < moe.a2a_efficiency(deepep, 1)
    assert moe.a2a_efficiency(hybrid, 1, **b5, ep=64) < moe.a2a_efficiency(hybrid, 1, **b5, ep=8)
