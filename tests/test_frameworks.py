"""Framework profiles and the kernel-level software costs: closed forms on small layers and tiny worlds."""

import dataclasses
from pathlib import Path

import pytest
import yaml

import simulator

from simulator.scenario.config import (ClusterConfig, FrameworkOptions, ModelConfig, OverlapConfig, ParallelConfig, Scenario,
                              TrainingConfig)
from simulator.common.errors import ConfigError
from simulator.parts.gpus import get_gpu
from simulator.reports.report import step_report
from simulator.scenario.load import load_scenario, scenario_from_dict, scenario_to_dict
from simulator.engine.engine import simulate
from simulator.studies.cases import case_to_scenario_dict
from simulator.workload.compute import layer_cost
from simulator.workload.kernels import Gemm
from simulator.workload.frameworks import resolve
from simulator.parts.frameworks import framework_names, load_profile
from simulator.workload.software import fp8_extra, layer_with_software

H100 = get_gpu("H100")
LLAMA = ModelConfig(hidden_size=1024, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8,
                    intermediate_size=4096, vocab_size=32000, hidden_act="silu")
TRAIN = TrainingConfig(seq_length=1024, micro_batch_size=1, global_batch_size=8)


def scen(framework="megatron-core", overlap=OverlapConfig(), options=FrameworkOptions(), model=LLAMA, dp=8,
         tp=1, sp=False, zero=0, precision="bf16", m=1):
    return Scenario(name="t", model=model, cluster=ClusterConfig(),
                    training=dataclasses.replace(TRAIN, precision=precision, global_batch_size=m * dp),
                    parallelism=ParallelConfig(tp=tp, dp=dp, sequence_parallel=sp, zero_stage=zero),
                    framework=framework, overlap=overlap, framework_options=options)


def sw_layer(s):
    base = layer_cost(s.model, s.training, s.parallelism, H100, 0)
    return base, layer_with_software(base, s.model, s.training, s.parallelism, H100, 0, resolve(s))


def test_the_seven_frameworks_load_and_every_entry_names_a_source():
    assert framework_names() == ("automodel", "colossalai", "composer", "deepspeed", "flash-attention", "fms-fsdp",
                                 "generic", "gpt-neox", "huggingface", "internevo", "litgpt", "llm.c", "maxtext",
                                 "megatron-core", "megatron-llama", "modded-nanogpt", "nanogpt",
                                 "nanotron", "nemo", "olmo-core", "torchtitan")
    for name in framework_names():
        assert load_profile(name)["overlap"]["param_prefetch_depth"] >= 0


@pytest.mark.parametrize("name", framework_names())
def test_every_shipped_profile_runs_the_paths_its_keys_select(name):
    """ZeRO-3 with context parallelism, FP8, selective recompute and a gated GQA MLP read every
    section of a profile (prefetch depth, CP exchange and merge, K/V expansion, FP8 casts, the
    selective policy, the loss): each shipped profile runs it, and twice to the same step time."""
    overrides = [f"framework={name}", "parallelism.pp=1", "parallelism.cp=2", "parallelism.zero_stage=3",
                 "training.precision=fp8", "training.recompute=selective", "model.hidden_act=silu",
                 "model.num_key_value_heads=2"]
    first = simulate(load_scenario("scenarios/tiny.yaml", overrides))
    again = simulate(load_scenario("scenarios/tiny.yaml", overrides))
    assert 0 < first.step_time_s < float("inf")
    assert again.step_time_s == first.step_time_s


def test_unknown_framework_is_one_line_error_listing_the_valid_ones():
    d = scenario_to_dict(scen())
    d["framework"] = "jax-thing"
    with pytest.raises(ConfigError) as err:
        scenario_from_dict(d)
    assert "\n" not in str(err.value) and "torchtitan" in str(err.value) and "framework" in str(err.value)


def test_overlap_key_overrides_the_profile():
    assert resolve(scen()).grad_reduce is True
    assert resolve(scen(overlap=OverlapConfig(grad_reduce=False))).grad_reduce is False
    assert resolve(scen("deepspeed")).grad_reduce is False
    assert resolve(scen("torchtitan", options=FrameworkOptions(cuda_graphs=True))).host_issue_s == 0


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_megatron_core_profile_adds_nothing_to_the_reference_layer(precision):
    base, with_sw = sw_layer(scen(precision=precision))
    assert with_sw == base


def test_kernel_count_of_one_layer_per_profile():
    """Reference (fused) SwiGLU layer: forward 7 + 5 kernels (norm, QKV, RoPE on q and on k,
    attention, out-proj, residual; norm, up, activation, down, residual), backward 9 + 7 (each
    GEMM's dgrad and wgrad, RoPE's two). Eager torchtitan adds 6 per RMSNorm, 2 + 2 for RoPE on q
    and k (3 kernels each where the fused RoPE has one), 1 for silu * up; the backward twice
    those; torch.compile fuses them back to the reference count."""
    base, _ = sw_layer(scen())
    assert [b.kernels for b in (base.attn_fwd, base.mlp_fwd, base.attn_bwd, base.mlp_bwd)] == [7, 5, 9, 7]
    _, eager = sw_layer(scen("torchtitan", options=FrameworkOptions(compile=False)))
    assert [b.kernels for b in (eager.attn_fwd, eager.mlp_fwd, eager.attn_bwd, eager.mlp_bwd)] == \
        [7 + 6 + 4, 5 + 6 + 1, 9 + 2 * 10, 7 + 2 * 7]
    _, compiled = sw_layer(scen("torchtitan", options=FrameworkOptions(compile=True)))
    assert [b.kernels for b in (compiled.attn_fwd, compiled.mlp_fwd)] == [7, 5]


def test_unfused_rmsnorm_moves_36_bytes_per_element_against_the_fused_4():
    s = scen("torchtitan", options=FrameworkOptions(compile=False), model=dataclasses.replace(LLAMA, hidden_act="gelu"))
    base, eager = sw_layer(s)
    extra = [op for op in eager.mlp_fwd.ops if op.name == "unfused_elementwise"][0]
    norm = [op for op in base.mlp_fwd.ops if op.name == "post_attn_norm"][0]
    assert norm.bytes == 4 * 1024 * 1024  # tokens x hidden x (read 2 + write 2)
    assert extra.bytes == 32 * 1024 * 1024 and extra.kernels == 6  # GeLU adds nothing


def test_fp8_tensorwise_cast_bytes_per_gemm_closed_form():
    """torchao tensorwise, compiled: 6 bytes per element of X, W and dY (amax pass r2, cast and
    transpose r2 w1 w1); the reference pays 4 on X (0 when a norm produces it) and dY, and casts
    the weight once per step."""
    m, n, k = 4096.0, 3072.0, 1024.0
    sw = resolve(scen("torchtitan", options=FrameworkOptions(compile=True, fp8_recipe="tensorwise"), precision="fp8"))
    fb, _, bb, _ = fp8_extra([Gemm("out_proj", m, n, k)], sw)
    assert fb == pytest.approx(2 * m * k + 6 * k * n) and bb == pytest.approx(2 * m * n)
    fb, _, bb, _ = fp8_extra([Gemm("qkv_proj", m, n, k)], sw)
    assert fb == pytest.approx(6 * m * k + 6 * k * n) and bb == pytest.approx(2 * m * n)
    te = resolve(scen("megatron-core", precision="fp8"))
    assert fp8_extra([Gemm("qkv_proj", m, n, k), Gemm("out_proj", m, n, k)], te) == (0.0, 0, 0.0, 0)


def _dp(report):
    return report["time_breakdown_s"]["exposed_comm_s"]["dp"]


def test_exposed_grad_reduce_equals_its_collective_time_when_overlap_is_off():
    off = simulate(scen(overlap=OverlapConfig(grad_reduce=False), zero=0))
    comm = sum(r.end - r.start for r in off.trace if r.stream == "dp" and r.kind == "comm")
    rep_off = step_report(off)
    assert comm > 0 and _dp(rep_off) == pytest.approx(comm, rel=1e-9)
    rep_on = step_report(simulate(scen(zero=0)))
    assert _dp(rep_on) < _dp(rep_off)
    # overlapped, the all-reduce's SMs slow the backward under it: that time moves into compute
    slowed = rep_on["time_breakdown_s"]["contention_s"] - rep_off["time_breakdown_s"]["contention_s"]
    assert slowed > 0
    assert rep_off["step_time_s"] - rep_on["step_time_s"] == pytest.approx(_dp(rep_off) - _dp(rep_on) - slowed,
                                                                           rel=1e-6)


def test_tp_comm_overlap_off_exposes_the_backward_tp_collectives():
    on = step_report(simulate(scen(dp=1, tp=8, sp=True)))
    off = step_report(simulate(scen(dp=1, tp=8, sp=True, overlap=OverlapConfig(tp_comm=False))))
    on_tp, off_tp = (r["time_breakdown_s"]["exposed_comm_s"]["tp"] for r in (on, off))
    assert off_tp > on_tp and off["step_time_s"] > on["step_time_s"]


def test_async_tp_hides_forward_sequence_parallel_collectives():
    plain = step_report(simulate(scen(dp=1, tp=8, sp=True)))
    fast = step_report(simulate(scen(dp=1, tp=8, sp=True, overlap=OverlapConfig(async_tp=True))))
    assert fast["time_breakdown_s"]["exposed_comm_s"]["tp"] < plain["time_breakdown_s"]["exposed_comm_s"]["tp"]


def test_param_gather_off_exposes_the_zero1_all_gather():
    on = step_report(simulate(scen(zero=1)))
    off = step_report(simulate(scen(zero=1, overlap=OverlapConfig(param_gather=False))))
    assert _dp(off) > _dp(on)


def test_a_host_bound_step_lasts_at_least_its_kernel_issue_time():
    """A tiny eager model: every kernel's GPU time is below the 10 us host issue time, so the
    compute stream waits on the host (host_dispatch rows) and the step is at least the number of
    kernels issued times 10 us (minus the lead the host had at the step's start); with CUDA graphs
    there is no host issue cost."""
    tiny = ModelConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                       intermediate_size=256, vocab_size=100, hidden_act="silu")
    s = dataclasses.replace(scen("torchtitan", model=tiny, dp=1, options=FrameworkOptions(compile=False)),
                            training=TrainingConfig(seq_length=32, micro_batch_size=1, global_batch_size=1))
    res = simulate(s)
    stalls = [r for r in res.trace if r.label == "host_dispatch"]
    assert stalls
    w = res.workload
    lc = w.layer_costs[0]
    kernels = (2 * sum(b.kernels for b in (lc.attn_fwd, lc.mlp_fwd, lc.attn_bwd, lc.mlp_bwd))
               + sum(b.kernels for b in w.embedding + w.head))
    assert res.step_time_s >= kernels * 10e-6 - w.optimizer[0].time_s
    graphs = simulate(dataclasses.replace(s, framework_options=FrameworkOptions(compile=False, cuda_graphs=True)))
    assert not [r for r in graphs.trace if r.label == "host_dispatch"]
    assert graphs.step_time_s < res.step_time_s


def test_a_cuda_graph_scope_issues_its_modules_in_one_launch_each():
    """Megatron-core --cuda-graph-scope: the attention blocks (and the dense MLPs with mlp) are
    replayed from graphs, one host launch each; the rest is issued kernel by kernel. The step lies
    between the eager one and the whole-iteration graph's."""
    tiny = ModelConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                       intermediate_size=256, vocab_size=100, hidden_act="silu")
    s = dataclasses.replace(scen("megatron-core", model=tiny, dp=1),
                            training=TrainingConfig(seq_length=32, micro_batch_size=1, global_batch_size=1))
    eager = simulate(s)
    attn = simulate(dataclasses.replace(s, framework_options=FrameworkOptions(cuda_graph_scope=("attn",))))
    both = simulate(dataclasses.replace(s, framework_options=FrameworkOptions(cuda_graph_scope=("attn", "mlp"))))
    whole = simulate(dataclasses.replace(s, framework_options=FrameworkOptions(cuda_graphs=True)))
    assert eager.step_time_s > attn.step_time_s > both.step_time_s > whole.step_time_s
    from simulator.engine.inputs import step_inputs
    from simulator.program.builder import Compute

    ins = step_inputs(dataclasses.replace(s, framework_options=FrameworkOptions(cuda_graph_scope=("attn",))))
    ops = [op for op in ins.programs[0] if isinstance(op, Compute)]
    assert all(op.graphed == (op.label == "attention") for op in ops) and any(op.graphed for op in ops)
    # the step gains at most the host time the attention blocks save: their kernels less one launch
    # each, at 10 us (less where the host had a lead on the GPU)
    lc = ins.workload.layer_costs[0]
    saved = 2 * (lc.attn_fwd.kernels - 1 + lc.attn_bwd.kernels - 1) * 10e-6
    assert 0.5 * saved < eager.step_time_s - attn.step_time_s <= saved + 1e-12


def test_cuda_graph_scope_values_are_megatrons_and_bad_ones_are_one_line_errors():
    d = scenario_to_dict(scen())
    d["framework_options"] = {"cuda_graph_scope": ["attn", "moe_router", "moe_preprocess"]}
    assert scenario_from_dict(d).framework_options.cuda_graph_scope == ("attn", "moe_router", "moe_preprocess")
    for bad, word in ((["attention"], "attn, mlp, moe_router, moe_preprocess, moe"), (["moe_preprocess"], "moe_router"),
                      ("attn", "non-empty list"), ([], "non-empty list")):
        d["framework_options"] = {"cuda_graph_scope": bad}
        with pytest.raises(ConfigError) as err:
            scenario_from_dict(d)
        assert "\n" not in str(err.value) and "framework_options.cuda_graph_scope" in str(err.value)
        assert word in str(err.value)


def test_validate_reads_a_partial_capture_as_the_scope():
    from simulator.studies.cases import _framework_keys

    partial = _framework_keys({"framework_options": {"cuda_graphs": "transformer_engine (attn, moe_router, moe_preprocess)"}})
    assert partial["framework_options"] == {"cuda_graph_scope": ["attn", "moe_router", "moe_preprocess"]}
    assert _framework_keys({"framework_options": {"cuda_graphs": "full_iteration"}})["framework_options"] == {
        "cuda_graphs": True}


def test_the_report_says_how_long_the_gpu_waited_on_the_host():
    """host_wait_s is the host_dispatch rows (the GPU outran kernel issue) plus the MoE token-count
    syncs inside compute blocks; it is part of compute_s, and zero with the iteration graphed."""
    tiny = ModelConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                       intermediate_size=256, vocab_size=100, hidden_act="silu")
    s = dataclasses.replace(scen("torchtitan", model=tiny, dp=1, options=FrameworkOptions(compile=False)),
                            training=TrainingConfig(seq_length=32, micro_batch_size=1, global_batch_size=1))
    res = simulate(s)
    stalls = sum(r.end - r.start for r in res.trace if r.label == "host_dispatch")
    b = step_report(res)["time_breakdown_s"]
    assert stalls > 0 and b["host_wait_s"] == pytest.approx(stalls) and b["host_wait_s"] < b["compute_s"]
    graphed = simulate(dataclasses.replace(s, framework_options=FrameworkOptions(cuda_graphs=True)))
    assert step_report(graphed)["time_breakdown_s"]["host_wait_s"] == 0
    # dropless MoE: every MoE layer forward waits at least one sync round trip
    from simulator.workload import moe

    q = load_scenario("scenarios/qwen3-30b-a3b-16xh100.yaml")
    r = simulate(q)
    forwards = sum(1 for row in r.trace if row.stage == 0 and row.label == "moe" and row.kind in ("F", "R")
                   and row.host_s > 0)
    assert forwards > 0
    assert step_report(r)["stages"][0]["host_wait_s"] >= forwards * moe.HOST_SYNC_S


def test_megatron_core_reproduces_todays_tiny_report():
    """tiny.yaml names megatron-core, and the profiles change nothing else on it: the step time of
    scenarios/tiny.yaml as before framework profiles existed, with the measured attention curves
    of simulator.workload.attention (0.00708287188943954 s at 2fa9630 with the old single
    efficiency; tiny's 1k-token causal attention is 0.6% slower on the FA3 curve; 0.007128107584182506
    s before communication kernels' SMs were priced and the Hopper sustained fraction refitted;
    0.007110474883389537 s before the loss was priced as Megatron-core's unfused cross-entropy, 38 / 14
    bytes per logit instead of 12 / 24; 0.007573734584882077 s before the fused RoPE kernels were
    priced; 0.007725035361001479 s before GEMMs whose output tiles leave SMs idle were split along k;
    0.007362295789263101 s before the embedding and LM head communicated over TP; 0.00739660000906108 s
    before Hopper's NVLink links carried NCCL's rating of them, 20.6 of 25 GB/s)."""
    plain = step_report(simulate(load_scenario("scenarios/tiny.yaml")))
    explicit = step_report(simulate(load_scenario("scenarios/tiny.yaml", ["framework=megatron-core"])))
    assert plain["step_time_s"] == explicit["step_time_s"] == 0.0074786083801506135


def test_validate_reads_framework_and_options():
    case = {"id": "x", "framework": "torchtitan",
            "framework_options": {"compile": True, "fp8_recipe": "rowwise", "async_tp": True,
                                  "activation_checkpointing": "full", "overlap": {"grad_reduce": False, "pp_p2p": False}},
            "model": {"params_b": None, "layers": 4, "hidden": 1024, "ffn_hidden": 4096, "heads": 8, "vocab": 32000,
                      "seq_len": 1024},
            "hardware": {"gpu": "H100 96GB HBM2e (Grand Teton, 500 W power limit)", "count": 8},
            "parallelism": {"tp": 1, "pp": 1, "gbs": 8}}
    s = scenario_from_dict(case_to_scenario_dict(case))
    assert s.framework == "torchtitan" and s.training.recompute == "full"
    assert s.framework_options == FrameworkOptions(compile=True, fp8_recipe="rowwise")
    assert s.overlap == OverlapConfig(grad_reduce=False, async_tp=True)
    assert get_gpu(s.cluster.gpu).name == "H100-SXM5-96GB"
    # a row that does not say is a Megatron-style run (the published tables were); one that says null
    # states an unknown stack, which runs the generic profile
    unstated = {k: v for k, v in case.items() if k not in ("framework", "framework_options")}
    assert scenario_from_dict(case_to_scenario_dict(unstated)).framework == "megatron-core"
    unknown = scenario_from_dict(case_to_scenario_dict({**case, "framework": None, "framework_options": None}))
    assert unknown.framework == "generic"


@pytest.mark.parametrize("name", ["H100 PCIe", "H100 NVL 94GB"])
def test_gpu_variants_with_other_clocks_are_an_error_not_the_sxm_part(name):
    with pytest.raises(ConfigError):
        get_gpu(name)


def test_torchtitan_selective_recompute_reruns_every_second_matmul():
    """Per-op SAC on a SwiGLU block (mm order wq, wk, wv, wo, w1, w3, w2): wk, wo, w3 re-run,
    i.e. the K share of the QKV GEMM, the whole output projection and half the up-projection, plus
    every elementwise op; the attention core is saved."""
    s = dataclasses.replace(scen("torchtitan", options=FrameworkOptions(compile=True)),
                            training=dataclasses.replace(TRAIN, recompute="selective"))
    base, sac = sw_layer(s)
    flops = {op.name: op.flops for op in base.attn_fwd.ops + base.mlp_fwd.ops}
    expected = flops["qkv_proj"] * 1024 / (1024 + 2 * 1024) + flops["out_proj"] + flops["mlp_up"] / 2
    assert sac.attn_recompute.flops == pytest.approx(expected)
    assert "attn_core" not in [op.name for op in sac.attn_recompute.ops]
    assert base.attn_recompute.flops == flops["attn_core"]  # the reference: attention core only


def _loss_ops(s):
    from simulator.workload.workload import build_workload

    fwd, bwd = build_workload(s, H100).head
    return (next(op for op in fwd.ops if op.name == "cross_entropy"),
            next(op for op in bwd.ops if op.name == "cross_entropy_bwd"))


@pytest.mark.parametrize("framework,compile_,impl,fwd_b,fwd_k,bwd_b,bwd_k", [
    ("megatron-core", None, "megatron", 38, 6, 14, 2),  # .float, max, sub_, exp, sum, div_ / mul_, cast
    ("nemo", None, "megatron-fused", 22, 3, 18, 2),  # Inductor: cast+max, sub+exp+sum, div / copy, mul+casts
    ("torchtitan", False, "torch", 22, 2, 26, 3),  # cast, 3-pass log_softmax / zero, 2-pass bwd, cast
    ("torchtitan", True, "torch-compiled", 4, 1, 4, 1),
    ("automodel", True, "torch", 22, 2, 26, 3),  # AutoModel does not compile its loss
    ("composer", None, "triton", 2, 1, 4, 1),  # flash-attn's online-softmax Triton kernel
    ("maxtext", None, "xla", 10, 3, 6, 1),
])
def test_the_loss_moves_its_implementations_bytes_per_logit(framework, compile_, impl, fwd_b, fwd_k, bwd_b, bwd_k):
    """Bytes and kernels per logit of the T x V / tp logits, counted in each implementation's
    source (software.CROSS_ENTROPY); tp 2 halves the logits a rank holds."""
    s = scen(framework, options=FrameworkOptions(compile=compile_), tp=2, dp=4)
    assert resolve(s).cross_entropy == impl
    fwd, bwd = _loss_ops(s)
    logits = TRAIN.seq_length * TRAIN.micro_batch_size * LLAMA.vocab_size / 2
    assert fwd.bytes == pytest.approx(fwd_b * logits) and fwd.kernels == fwd_k
    assert bwd.bytes == pytest.approx(bwd_b * logits) and bwd.kernels == bwd_k
    assert fwd.time_s == pytest.approx(fwd.bytes / (H100.hbm_bandwidth_Bps * H100.memory_efficiency)
                                       + fwd_k * H100.launch_overhead_s, rel=1e-9)


def test_framework_options_cross_entropy_overrides_the_profile_and_sets_what_the_last_stage_keeps():
    from simulator.workload.memory import stage_memory

    unfused, te = scen(tp=2, dp=4), scen(options=FrameworkOptions(cross_entropy="te"), tp=2, dp=4)
    assert _loss_ops(te)[0].bytes == pytest.approx(6 * 1024 * 16000)
    # TE writes the gradient into the bf16 logits (2 bytes kept per logit), Megatron keeps fp32 softmax (4)
    diff = stage_memory(unfused, 0).activations - stage_memory(te, 0).activations
    assert diff == pytest.approx(2 * 1024 * 16000)
    d = scenario_to_dict(te)
    d["framework_options"]["cross_entropy"] = "fused"
    with pytest.raises(ConfigError) as err:
        scenario_from_dict(d)
    assert "\n" not in str(err.value) and "framework_options.cross_entropy" in str(err.value) and "megatron-fused" in str(err.value)


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_a_profile_flag_that_is_not_true_or_false_is_a_one_line_error(bad, tmp_path):
    """fp8.saves_quantized_inputs (like the other FP8 flags) must be true or false: 'yes', 1 or
    null in a profile file name the file, the key and what is valid."""
    import yaml as _yaml

    from simulator.common import resources
    from simulator.common.errors import ConfigError
    from simulator.parts import frameworks

    raw = _yaml.safe_load(resources.entry("frameworks", "megatron-core").read_text())
    raw["fp8"]["saves_quantized_inputs"]["value"] = bad
    path = tmp_path / "my-stack.yaml"
    path.write_text(_yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"my-stack.yaml: fp8.saves_quantized_inputs: got .*must be true or false"):
        frameworks.load_profile(str(path))


def test_maxtext_custom_policy_reruns_the_attention_core_and_the_mlp_input_projections():
    """framework_options.selective_recompute attention_projections (MaxText's custom policy with
    Q, K, V and out_proj on device, NVIDIA's DGX Cloud 70B recipe): the context and the MLP's input
    projections are not saved, so the attention core and the gate/up GEMM re-run with every
    elementwise op; the saved projections (QKV, out) and the down projection do not."""
    s = dataclasses.replace(scen("maxtext", options=FrameworkOptions(selective_recompute="attention_projections")),
                            training=dataclasses.replace(TRAIN, recompute="selective"))
    assert resolve(s).selective_recompute == "attention_projections"
    base, custom = sw_layer(s)
    flops = {op.name: op.flops for op in base.attn_fwd.ops + base.mlp_fwd.ops}
    assert custom.attn_recompute.flops == pytest.approx(flops["attn_core"] + flops["mlp_up"])
    names = [op.name for op in custom.attn_recompute.ops]
    assert "attn_core" in names and "mlp_up" in names
    assert not {"qkv_proj", "out_proj", "mlp_down"} & set(names)
    # the profile's own policy (minimal_flash) keeps every dot's output: elementwise ops only
    _, flash = sw_layer(dataclasses.replace(s, framework_options=FrameworkOptions()))
    assert flash.attn_recompute.flops == 0 and flash.attn_recompute.ops


@pytest.mark.parametrize("bad", ["custom", "full", 3])
def test_an_unknown_selective_recompute_policy_is_a_one_line_error(bad):
    d = scenario_to_dict(scen("maxtext"))
    d["framework_options"]["selective_recompute"] = bad
    with pytest.raises(ConfigError) as err:
        scenario_from_dict(d)
    msg = str(err.value)
    assert "\n" not in msg and "framework_options.selective_recompute" in msg and "attention_projections" in msg


def _maxtext_case(saved, policy="custom"):
    return {"id": "m", "framework": "maxtext",
            "framework_options": {"remat_policy": policy, "remat_tensors_on_device": saved},
            "model": {"params_b": None, "layers": 4, "hidden": 1024, "ffn_hidden": 4096, "heads": 8, "vocab": 32000,
                      "seq_len": 1024},
            "hardware": {"gpu": "H100-SXM5-80GB", "count": 8},
            "parallelism": {"tp": 1, "pp": 1, "gbs": 8, "recompute": "selective (MaxText remat_policy custom)"}}


@pytest.mark.parametrize("saved,policy", [
    (["query_proj", "value_proj", "key_proj", "qkv_proj", "out_proj", "mlpwo"], "attention_projections"),  # DGXC bf16
    (["query_proj", "value_proj", "key_proj", "qkv_proj", "out_proj"], "attention_projections"),  # DGXC fp8
    (["query_proj", "value_proj", "key_proj", "out_proj", "context", "mlpwi_0", "mlpwi_1"], "elementwise"),
])
def test_validate_maps_maxtext_custom_remat_to_the_policy_its_saved_tensors_make(saved, policy):
    notes = []
    s = scenario_from_dict(case_to_scenario_dict(_maxtext_case(saved), notes))
    assert s.training.recompute == "selective" and s.framework_options.selective_recompute == policy
    assert any(policy in n for n in notes)
    minimal = scenario_from_dict(case_to_scenario_dict(_maxtext_case(None, "minimal_flash")))
    assert minimal.framework_options.selective_recompute is None  # the profile's (elementwise)


@pytest.mark.parametrize("saved", [None, ["query_proj", "out_proj"], ["query_proj", "key_proj", "value_proj",
                                                                        "out_proj", "context"], "query_proj"])
def test_validate_refuses_a_maxtext_custom_remat_it_does_not_model(saved):
    with pytest.raises(ConfigError) as err:
        case_to_scenario_dict(_maxtext_case(saved))
    assert "\n" not in str(err.value) and "remat_tensors_on_device" in str(err.value)


def test_a_case_validate_cannot_describe_is_an_error_row_even_from_a_worker(tmp_path):
    """A MaxText custom remat list stepsim does not model raises in ``case_to_scenario_dict``: the
    case becomes an error row beside the others, also when a worker process raised it (a
    ConfigError survives pickling with its field, value and message)."""
    import pickle

    from simulator.studies.validate import predict, validate_file

    err = ConfigError("x: framework_options.remat_tensors_on_device", ["foo"], "valid: ...")
    back = pickle.loads(pickle.dumps(err))
    assert (back.field, back.value, back.valid, str(back)) == (err.field, err.value, err.valid, str(err))
    bad = _maxtext_case(["foo"])
    row = predict(bad)
    assert "remat_tensors_on_device" in row["error"] and "\n" not in row["error"]
    good = dict(_maxtext_case(["query_proj", "key_proj", "value_proj", "out_proj"]), id="good",
                measured={"step_time_s": 1.0})
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump({"cases": [bad, good]}))
    result = validate_file(path, workers=2, progress=None)
    rows = {r["id"]: r for r in result["rows"]}
    assert isinstance(rows["m"]["error"], str) and isinstance(rows["good"]["error"], float)


def _ops(block, name):
    return [op for op in block.ops if op.name == name]


def test_autocast_stacks_cast_every_weight_each_forward_and_accumulate_after_the_first_micro_batch():
    """nanogpt (fp32 weights under autocast): per micro-batch a forward cast of every weight (read
    4, write 2), a backward cast of its gradient (read 2, write 4), and on every micro-batch but the
    first an fp32 add into .grad (12 bytes): with m micro-batches each carries (m - 1) / m of it.
    One kernel per weight tensor: the attention block's qkv and output projections, the MLP's up
    and down (GeLU) projections."""
    model = dataclasses.replace(LLAMA, hidden_act="gelu")
    h, f = 1024, 4096
    attn_w, mlp_w = 4 * h * h, 2 * h * f
    for m, share in ((1, 0.0), (4, 3 / 4)):
        s = scen("nanogpt", model=model, m=m)
        sw = resolve(s)
        cost = layer_with_software(layer_cost(s.model, s.training, s.parallelism, H100, 0), s.model, s.training,
                                   s.parallelism, H100, 0, sw, s.num_microbatches)
        for block, weights in ((cost.attn_fwd, attn_w), (cost.mlp_fwd, mlp_w)):
            (cast,) = _ops(block, "weight_cast")
            assert cast.bytes == pytest.approx(6 * weights) and cast.kernels == 2
        for block, weights in ((cost.attn_bwd, attn_w), (cost.mlp_bwd, mlp_w)):
            (grad,) = _ops(block, "grad_pass")
            assert grad.bytes == pytest.approx(6 * weights)
            acc = _ops(block, "grad_accumulate")
            assert (acc[0].bytes if acc else 0.0) == pytest.approx(12 * weights * share)


def test_weight_passes_cost_their_bytes_at_hbm_speed_and_megatron_core_pays_none():
    """The passes are memory-bound: a nanotron step with more micro-batches pays its fp32
    accumulator's 10 bytes per local weight each micro-batch; megatron-core's fused accumulation
    adds no op; under ZeRO-3 the accumulation is on the rank's shard only."""
    s = scen("nanotron", m=8)
    cost = layer_with_software(layer_cost(s.model, s.training, s.parallelism, H100, 0), s.model, s.training,
                               s.parallelism, H100, 0, resolve(s), s.num_microbatches)
    (grad,) = _ops(cost.mlp_bwd, "grad_pass")
    assert grad.bytes == pytest.approx(10 * 3 * 1024 * 4096)  # SwiGLU: gate, up, down
    assert grad.time_s >= grad.bytes / (H100.hbm_bandwidth_Bps * H100.memory_efficiency) * 0.999
    assert not _ops(cost.mlp_fwd, "weight_cast")
    _, mc = sw_layer(scen("megatron-core", m=8))
    names = {op.name for blk in (mc.attn_fwd, mc.attn_bwd, mc.mlp_fwd, mc.mlp_bwd) for op in blk.ops}
    assert not names & {"weight_cast", "grad_pass", "grad_accumulate"}
    s3 = scen("nanogpt", m=4, zero=3)
    c3 = layer_with_software(layer_cost(s3.model, s3.training, s3.parallelism, H100, 0), s3.model, s3.training,
                             s3.parallelism, H100, 0, resolve(s3), 4, grad_shard=8)
    (acc,) = _ops(c3.mlp_bwd, "grad_accumulate")
    assert acc.bytes == pytest.approx(12 * 3 * 1024 * 4096 * 3 / 4 / 8)


def test_a_profile_written_before_the_weight_pass_keys_loads_with_them_at_zero(tmp_path):
    raw = yaml.safe_load(open("simulator/data/frameworks/nanotron.yaml"))
    for key in ("weight_cast_bytes_per_param", "grad_cast_bytes_per_param", "grad_accumulate_bytes_per_param"):
        del raw["optimizer"][key]
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(raw))
    opt = load_profile(str(path))["optimizer"]
    assert (opt["weight_cast_bytes_per_param"], opt["grad_cast_bytes_per_param"],
            opt["grad_accumulate_bytes_per_param"]) == (0.0, 0.0, 0.0)
    raw["optimizer"]["grad_cast_bytes_per_param"] = {"value": -1, "source": "x"}
    bad = tmp_path / "bad.yaml"  # load_profile caches by path
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"bad.yaml: optimizer.grad_cast_bytes_per_param: got -1; must be a number >= 0$"):
        load_profile(str(bad))


def test_deepspeed_accumulates_the_whole_gradient_under_zero1_and_its_partition_under_zero2():
    """grad_accum_dtype defaults to bf16: ZeRO-1 leaves autograd's in-place add into .grad (6 bytes
    per weight after the first micro-batch), ZeRO-2 adds into the rank's partition, 1 / dp of it."""
    from simulator.workload.workload import build_workload

    def acc(zero):
        w = build_workload(scen("deepspeed", m=4, zero=zero), H100)
        return sum(op.bytes for op in w.layer_costs[0].mlp_bwd.ops if op.name == "grad_accumulate")
    weights = 3 * 1024 * 4096
    assert acc(1) == pytest.approx(6 * weights * 3 / 4)
    assert acc(2) == pytest.approx(6 * weights * 3 / 4 / 8)


def _grad_calls(res):
    """(op -> calls) of the first simulated rank's data-parallel gradient collectives."""
    rank = res.simulated_ranks[0]
    return {op: calls for r, axis, op, calls, _, _ in res.comm_calls
            if r == rank and axis == "dp" and op in ("all_reduce", "reduce_scatter")}


def test_deepspeed_all_reduces_zero_gradients_and_zero2_reduces_every_micro_batch():
    """DeepSpeed's ZeRO-1/2 all-reduce each bucket (multi-rank bucket all-reduce); ZeRO-2's hooks
    reduce in every micro-batch's backward, ZeRO-1 at the accumulation boundary only; Megatron-core
    reduce-scatters once."""
    mc = simulate(scen(zero=2, m=4))
    buckets = _grad_calls(mc)["reduce_scatter"]
    assert buckets >= 1 and set(_grad_calls(mc)) == {"reduce_scatter"}
    ds1 = simulate(scen("deepspeed", zero=1, m=4))
    ds2 = simulate(scen("deepspeed", zero=2, m=4))
    assert _grad_calls(ds1) == {"all_reduce": buckets}
    assert _grad_calls(ds2) == {"all_reduce": 4 * buckets}
    stated = simulate(scen("deepspeed", zero=2, m=4, options=FrameworkOptions(grad_collective="reduce_scatter")))
    assert _grad_calls(stated) == {"reduce_scatter": 4 * buckets}
    # without overlap_comm the three early reductions block the compute stream: exposed in full
    r1, r2 = step_report(ds1), step_report(ds2)
    each = sum(sec for r, axis, op, _, _, sec in ds1.comm_calls
               if r == ds1.simulated_ranks[0] and op == "all_reduce" and axis == "dp")
    assert each > 0
    assert _dp(r2) - _dp(r1) == pytest.approx(3 * each, rel=0.02)
    assert r2["step_time_s"] > r1["step_time_s"]
    # one micro-batch: nothing to reduce early
    assert _grad_calls(simulate(scen("deepspeed", zero=2, m=1))) == {"all_reduce": buckets}
    # ZeRO-3 reduce-scatters per layer whatever the profile's ZeRO-1/2 collective
    assert "all_reduce" not in {op for _, axis, op, *_ in simulate(scen("deepspeed", zero=3, m=4)).comm_calls
                                if axis in ("dp", "fsdp")}


def test_validate_gives_deepspeed_runs_before_2024_the_reduce_scatter():
    case = {"id": "x", "framework": "deepspeed", "source": "Smith et al., arXiv 2201.11990",
            "model": {"params_b": None, "layers": 4, "hidden": 1024, "ffn_hidden": 4096, "heads": 8, "vocab": 32000,
                      "seq_len": 1024},
            "hardware": {"gpu": "A100 80GB", "count": 8}, "parallelism": {"tp": 1, "pp": 1, "gbs": 8}}
    assert scenario_from_dict(case_to_scenario_dict(case)).framework_options.grad_collective == "reduce_scatter"
    late = scenario_from_dict(case_to_scenario_dict({**case, "source": "DeepSpeed blog, 2025"}))
    assert late.framework_options.grad_collective is None and resolve(late).grad_collective == "all_reduce"
    stated = {**case, "framework_options": {"grad_collective": "all_reduce"}}
    assert scenario_from_dict(case_to_scenario_dict(stated)).framework_options.grad_collective == "all_reduce"


@pytest.mark.parametrize("bad", ["allreduce", "reduce", 1, True, ["all_reduce"]])
def test_a_bad_grad_collective_is_a_one_line_error(bad):
    with pytest.raises(ConfigError, match=r"^framework_options.grad_collective: got .*; valid: reduce_scatter, "
                                          r"all_reduce$"):
        load_scenario("scenarios/tiny.yaml", [f"framework_options.grad_collective={bad}"])


def test_zero2_accumulates_expert_gradients_on_their_expert_data_parallel_partition():
    """Under ZeRO-2 the kept gradient is the rank's partition: dense weights over the DP group,
    routed experts over expert-DP (the optimizer and memory model partition them so)."""
    from simulator.workload.software import _gemms, mlp_steps
    from simulator.workload.workload import build_workload
    from simulator.workload.compute import local_tokens

    def scenario(zero):
        return scenario_from_dict({"model": {"hf_id": "Qwen/Qwen3-30B-A3B", "num_hidden_layers": 2, "num_experts": 8,
                                             "vocab_size": 1024},
                                   "cluster": {"num_nodes": 2}, "framework": "deepspeed",
                                   "training": {"seq_length": 512, "global_batch_size": 64},
                                   "parallelism": {"ep": 4, "zero_stage": zero}})

    s = scenario(2)
    assert s.dp == 16 and s.expert_dp == 4 and s.num_microbatches == 4
    gemms = _gemms(mlp_steps(s.model, 0, *local_tokens(s.training, s.parallelism), s.parallelism))
    experts = sum(g.k * g.n * g.groups for g in gemms if g.name.startswith("expert_"))
    dense = sum(g.k * g.n * g.groups for g in gemms) - experts
    assert experts > 0 and dense > 0

    def acc(zero):
        w = build_workload(scenario(zero), H100)
        return sum(op.bytes for op in w.layer_costs[0].mlp_bwd.ops if op.name == "grad_accumulate")
    assert acc(1) == pytest.approx(6 * (dense + experts) * 3 / 4)
    assert acc(2) == pytest.approx(6 * (dense / 16 + experts / 4) * 3 / 4)


GPT2_SHAPE = dataclasses.replace(LLAMA, hidden_act="gelu_new")


def _named(block, name):
    return [op for op in block.ops if op.name == name]


def test_transformers_gelu_new_is_its_composed_autocast_ops_per_activation_element():
    """NewGELUActivation under autocast: 72 bytes and 9 kernels forward, 110 and 14 backward, beyond
    the one-kernel GELU, per element of the 1024-token x 4096 activation; a compiled run, another
    activation or a profile with a GELU kernel adds none."""
    base, eager = sw_layer(scen("huggingface", model=GPT2_SHAPE))
    elements = 1024 * 4096
    fwd, bwd = _named(eager.mlp_fwd, "eager_gelu"), _named(eager.mlp_bwd, "eager_gelu_bwd")
    assert [(op.bytes, op.kernels) for op in fwd] == [(72.0 * elements, 9)]
    assert [(op.bytes, op.kernels) for op in bwd] == [(110.0 * elements, 14)]
    assert fwd[0].time_s >= fwd[0].bytes / H100.hbm_bandwidth_Bps
    assert eager.mlp_fwd.time_s > base.mlp_fwd.time_s + fwd[0].time_s * 0.999
    for s in (scen("huggingface", model=GPT2_SHAPE, options=FrameworkOptions(compile=True)),
              scen("huggingface", model=dataclasses.replace(LLAMA, hidden_act="gelu")),
              scen("nanogpt", model=GPT2_SHAPE), scen("megatron-core", model=GPT2_SHAPE)):
        _, layer = sw_layer(s)
        assert not _named(layer.mlp_fwd, "eager_gelu") and not _named(layer.mlp_bwd, "eager_gelu_bwd")


def test_transformers_eager_attention_pays_its_scale_mask_and_float32_softmax_per_score():
    """training.attention: unfused on the huggingface profile: 24 bytes and 4 kernels forward, 26 and
    4 backward per score (b x heads x s x s) beyond the fused scale-mask-softmax; the same layer
    with flash attention, or Megatron's fused kernel, adds none."""
    unfused = dataclasses.replace(TRAIN, attention="unfused", micro_batch_size=2, global_batch_size=16)
    s = dataclasses.replace(scen("huggingface", model=GPT2_SHAPE), training=unfused)
    _, eager = sw_layer(s)
    scores = 2 * 8 * 1024 * 1024
    assert [(op.bytes, op.kernels) for op in _named(eager.attn_fwd, "eager_softmax")] == [(24.0 * scores, 4)]
    assert [(op.bytes, op.kernels) for op in _named(eager.attn_bwd, "eager_softmax_bwd")] == [(26.0 * scores, 4)]
    tp2 = dataclasses.replace(s, parallelism=dataclasses.replace(s.parallelism, tp=2, dp=4))
    _, half = sw_layer(tp2)
    assert _named(half.attn_fwd, "eager_softmax")[0].bytes == 24.0 * scores / 2
    for other in (scen("huggingface", model=GPT2_SHAPE),
                  dataclasses.replace(scen("megatron-core", model=GPT2_SHAPE), training=unfused)):
        _, layer = sw_layer(other)
        assert not _named(layer.attn_fwd, "eager_softmax")


def test_a_gpt2_class_case_runs_gelu_new_and_others_keep_gelu():
    case = yaml.safe_load("""
id: t
framework: huggingface
precision: bf16
model: {params_b: 0.124, hf_id: openai-community/gpt2, layers: 12, hidden: 768, ffn_hidden: 3072, heads: 12,
        vocab: 50257, seq_len: 1024}
hardware: {gpu: A100-SXM4-80GB, count: 8, gpus_per_node: 8}
parallelism: {tp: 1, pp: 1, dp: 8, cp: 1, mbs: 8, gbs: 256, recompute: none}
measured: {step_time_s: 1.0}
""")
    assert case_to_scenario_dict(case)["model"]["hidden_act"] == "gelu_new"
    case["model"].pop("hf_id")
    assert case_to_scenario_dict(case)["model"]["hidden_act"] == "gelu"
    case["framework_options"] = {"stack": "transformers GPT2LMHeadModel"}
    assert case_to_scenario_dict(case)["model"]["hidden_act"] == "gelu_new"


NANOTRON_3B_CASE = """
id: t
framework: nanotron
precision: bf16
model: {params_b: 3.574, layers: 28, hidden: 3072, ffn_hidden: 8192, heads: 32, kv_heads: 32, vocab: 131072, seq_len: 4096}
hardware: {gpu: H100-SXM5-80GB, count: 8, gpus_per_node: 8}
parallelism: {tp: 8, pp: 1, dp: 1, cp: 1, mbs: 1, gbs: 1, recompute: none}
measured: {step_time_s: 1.0}
"""


def test_a_tied_case_fits_its_activation_to_the_tied_count():
    """3.574B is both nanotron's tied SwiGLU Llama (28 x 3072, ffn 8192, vocab 131072) and an untied
    GeLU model of the same shape: ``tied: true`` picks the first, and ties the scenario's LM head."""
    case = yaml.safe_load(NANOTRON_3B_CASE)
    untied = case_to_scenario_dict(case)["model"]
    assert (untied["hidden_act"], untied["tie_word_embeddings"]) == ("gelu", False)
    case["model"]["tied"] = True
    tied = case_to_scenario_dict(case)["model"]
    assert (tied["hidden_act"], tied["tie_word_embeddings"]) == ("silu", True)


def test_a_case_may_state_its_activation_over_the_parameter_fit():
    """MPT as llm-foundry benchmarked it: tied, GeLU, and learned positions whose parameters
    (seq_len x d_model) the count includes; fitted to that count the tied model would come out
    SwiGLU. A stated ``hidden_act`` is taken as stated."""
    case = yaml.safe_load(NANOTRON_3B_CASE)
    case["model"].update(tied=True, hidden_act="gelu")
    assert case_to_scenario_dict(case)["model"]["hidden_act"] == "gelu"
    case["model"]["hidden_act"] = "swish"
    with pytest.raises(ConfigError, match=r"^model\.hidden_act: got 'swish'; valid: gelu, "):
        case_to_scenario_dict(case)


@pytest.mark.parametrize("value", ["yes", 1, [True]])
def test_a_bad_tied_value_is_a_one_line_error(value):
    case = yaml.safe_load(NANOTRON_3B_CASE)
    case["model"]["tied"] = value
    with pytest.raises(ConfigError, match=r"^model\.tied: got .+; must be true or false$"):
        case_to_scenario_dict(case)


@pytest.mark.parametrize("section,key,value", [("fusion", "gelu_new", "tanh"), ("fusion", "gelu_new", 3),
                                               ("attention", "unfused_softmax", "eager"),
                                               ("attention", "unfused_softmax", ["fused"]),
                                               ("attention", "kernel", "fa0"),
                                               ("data_parallel", "ddp_bucket_params", -1),
                                               ("data_parallel", "ddp_bucket_params", "25MB"),
                                               ("data_parallel", "ddp_bucket_params", [1]),
                                               ("pipeline", "split", "params"), ("pipeline", "split", 2),
                                               ("pipeline", "split", ["layers"])])
def test_bad_values_of_the_newer_profile_keys_are_one_line_errors(tmp_path, section, key, value):
    prof = yaml.safe_load((Path(simulator.__file__).parent / "data" / "frameworks" / "generic.yaml").read_text())
    prof.setdefault(section, {})[key] = {"value": value, "source": "test"}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(prof))
    load_profile.cache_clear()
    with pytest.raises(ConfigError) as err:
        load_profile(str(path))
    assert f"{section}.{key}" in str(err.value) and "\n" not in str(err.value)


def test_eager_autocast_kernels_keep_their_float32_tensors_for_the_backward():
    """Per layer and micro-batch: the float32 softmax output adds 2 bytes per score (b x heads x s x
    s / t) and the composed gelu_new 12 per activation element (tokens x f / t), in the memory
    report's layer accounting; other activations and profiles keep the fused kernels' bytes."""
    from simulator.workload.memory import layer_activation_bytes
    s, b, t = 1024.0, 2, 2
    args = (GPT2_SHAPE, 0, s, b, t, False, "none")
    base = layer_activation_bytes(*args, dropout=True)
    assert layer_activation_bytes(*args, dropout=True, softmax_fp32=True) - base == 2 * 8 * s * s * b / t
    assert layer_activation_bytes(*args, dropout=True, gelu_composed=True) - base == 12 * s * b * 4096 / t
    gelu = (dataclasses.replace(GPT2_SHAPE, hidden_act="gelu"),) + args[1:]
    assert layer_activation_bytes(*gelu, gelu_composed=True) == layer_activation_bytes(*gelu)
    assert layer_activation_bytes(*args, flash_attention=True, softmax_fp32=True) == \
        layer_activation_bytes(*args, flash_attention=True)


def test_torch_ddp_buckets_split_a_layer_past_the_cap_into_equal_collectives():
    """torch DDP caps a gradient bucket at bucket_cap_mb (25 MiB of fp32 gradients: 6,553,600
    parameters on the huggingface profile): a 12.6M-parameter layer is reduced in two all-reduces
    of half its gradients, launched when its backward ends; Megatron-core's sizing keeps one
    bucket of several layers."""
    from simulator.program.builder import build_program, Launch, Enqueue
    from simulator.workload.workload import build_workload
    model = dataclasses.replace(LLAMA, hidden_act="gelu", num_hidden_layers=2)  # 12 h^2 = 12,582,912 per layer
    hf, mc = scen("huggingface", model=model), scen("megatron-core", model=model)
    w_hf, w_mc = build_workload(hf, H100), build_workload(mc, H100)
    per_layer = w_hf.layer_dense_params[0]
    assert per_layer == 12 * 1024 * 1024
    # the embedding and LM head (2 x 32000 x 1024 untied) as their own bucket: 10 parts
    assert [(b.layers, b.parts) for b in w_hf.buckets[0]] == [((1,), 2), ((0,), 2), ((), 10)]
    assert [(b.layers, b.parts) for b in w_mc.buckets[0]] == [((1, 0), 1)]

    def dp_sizes(s, w):
        return sorted(op.nbytes for op in build_program(s, w, 0) if type(op) in (Launch, Enqueue) and op.group == "dpcp")

    hf_sizes = dp_sizes(hf, w_hf)
    halves, tenths = [x for x in hf_sizes if x == per_layer / 2 * 4], [x for x in hf_sizes if x != per_layer / 2 * 4]
    assert len(halves) == 4 and len(tenths) == 10 and len(set(tenths)) == 1
    assert tenths[0] == pytest.approx(2 * 32000 * 1024 / 10 * 4)
    assert len(dp_sizes(mc, w_mc)) == 1



@pytest.mark.parametrize("sp, position, fwd, bwd", [
    (True, "rope", ["reduce_scatter", "all_gather"], ["all_gather", "reduce_scatter", "all_gather"]),
    (True, "learned", ["all_reduce", "all_gather"], ["all_gather", "reduce_scatter", "all_gather"]),
    (False, "rope", ["all_reduce"], ["all_reduce"]),
])
def test_the_vocabulary_parallel_embedding_and_lm_head_communicate_over_tp(sp, position, fwd, bwd):
    """Besides each layer's, a TP step sums the vocabulary-sharded embedding (reduce-scattered into
    the sequence-parallel region, or all-reduced: with learned positions Megatron-core all-reduces
    and slices), gathers the LM head's input (SP) and, backward, gathers that input again for the
    weight gradient (SP), reduce-scatters or all-reduces its input gradient and gathers the
    embedding's: exactly these collectives beyond the layers'."""
    from collections import Counter

    from simulator.engine.inputs import step_inputs
    from simulator.program.builder import Launch

    def tp_ops(layers, tp=8, dp=1):
        model = dataclasses.replace(LLAMA, position_embedding=position, num_hidden_layers=layers)
        program = step_inputs(scen(dp=dp, tp=tp, sp=sp and tp > 1, model=model)).programs[0]
        return [op.op for op in program if isinstance(op, Launch) and op.group == "tp"]

    two, four = tp_ops(2), tp_ops(4)
    per_layer = Counter(four)
    per_layer.subtract(two)  # two layers' worth
    extra = Counter(two)
    extra.subtract(per_layer)
    assert +extra == Counter(fwd + bwd)
    assert two[0] == fwd[0]  # the embedding's sum opens the step
    assert (two[-1] == "all_gather") == sp  # and, with SP, the gather of its gradient closes it
    one = tp_ops(1, tp=1, dp=8)  # TP 1: no group to sum over, only the layers' (empty) calls
    assert tp_ops(2, tp=1, dp=8) == one + one
