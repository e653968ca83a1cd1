"""The small kernels a layer launches: QK-norm and fused RoPE in the attention, Megatron-core's MoE
bookkeeping kernels and per-expert GEMM launches, and their count against a profiled run."""

from pathlib import Path

import pytest
import yaml

from simulator.common.errors import ConfigError
from simulator.scenario.load import scenario_from_dict
from simulator.engine.inputs import gpu_of
from simulator.studies.cases import case_to_scenario_dict
from simulator.workload import moe as M
from simulator.workload.workload import build_workload

DATA = Path(__file__).parent / "data" / "moe-runs.yaml"
BLOCKS = ("attn_fwd", "mlp_fwd", "attn_bwd", "mlp_bwd", "attn_recompute", "mlp_recompute")


def scenario(model="Qwen/Qwen3-30B-A3B", framework="megatron-core", options=None, ep=8, **extra):
    raw = {"model": model, "cluster": {"topology": "dgx-h100", "num_nodes": 1},
           "parallelism": {"ep": ep} if "A3B" in model or "gpt-oss" in model else {},
           "training": {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 16, "precision": "bf16"},
           **extra}
    if framework:
        raw["framework"] = framework
    if options:
        raw["framework_options"] = options
    return scenario_from_dict(raw)


def ops(s, layer=0):
    work = build_workload(s, gpu_of(s.cluster, s.training.precision))
    cost = work.layer_costs[layer]
    return {op.name: op for name in BLOCKS for op in getattr(cost, name).ops}, work


def test_qwen3_normalises_query_and_key_heads_and_llama_does_not():
    assert scenario().model.qk_norm is True
    assert scenario("meta-llama/Llama-3.1-8B").model.qk_norm is False
    qwen, _ = ops(scenario())
    llama, _ = ops(scenario("meta-llama/Llama-3.1-8B"))
    assert "qk_norm" in qwen and "qk_norm_bwd" in qwen
    assert "qk_norm" not in llama


def test_rope_and_qk_norm_move_the_bytes_of_q_and_k():
    s = scenario()
    m = s.model
    qk = 4096 * (m.num_attention_heads + m.num_key_value_heads) * m.head_dim  # TP 1
    o, _ = ops(s)
    assert o["rope"].bytes == pytest.approx(4 * qk)  # read and write 2 bytes per element
    assert o["rope_bwd"].bytes == pytest.approx(4 * qk)  # the same kernel on the gradient
    assert o["qk_norm"].bytes == pytest.approx(4 * qk)
    assert o["qk_norm_bwd"].bytes == pytest.approx(6 * qk)  # x and dy read, dx written
    assert (o["rope"].kernels, o["qk_norm"].kernels, o["qk_norm_bwd"].kernels) == (2, 2, 4)


def test_unfused_rope_adds_only_what_the_fused_kernel_does_not_move():
    s = scenario("meta-llama/Llama-3.1-8B", framework="torchtitan")
    m = s.model
    qk = 4096 * (m.num_attention_heads + m.num_key_value_heads) * m.head_dim
    o, work = ops(s)
    o.update({op.name: op for op in work.layer_costs[0].attn_fwd.ops})  # the attention block's, not the MLP's
    # the attention block's extra: the composite input norm's 32 bytes per element of its input, and
    # RoPE's 20 bytes per element of q and k less the 4 the fused kernel (still priced) moves
    assert o["rope"].bytes == pytest.approx(4 * qk)
    assert o["unfused_elementwise"].bytes == pytest.approx(32 * 4096 * m.hidden_size + 16 * qk)


def test_megatron_moe_layer_carries_its_small_kernels_and_other_frameworks_do_not():
    mega, _ = ops(scenario())
    auto, _ = ops(scenario(framework="automodel"))
    for name in ("moe_route_kernels", "moe_expert_kernels", "moe_route_kernels_bwd", "moe_expert_kernels_bwd"):
        assert name in mega and mega[name].time_s > 0
        assert name not in auto
    # each small kernel costs one launch gap
    gap = 3e-6
    assert mega["moe_route_kernels"].time_s == pytest.approx(mega["moe_route_kernels"].kernels * gap)


def test_fusions_cut_the_small_kernels():
    s = scenario()
    plain = M.bookkeeping_kernels(s.model, s.parallelism, s.moe, "bf16", False, False)
    fused = M.bookkeeping_kernels(s.model, s.parallelism, s.moe, "bf16", True, True)
    assert sum(map(sum, fused.values())) < sum(map(sum, plain.values()))
    # Qwen3's softmax router unfused: 9 kernels forward where the priced op stands for one
    assert plain["route"][0] >= M.ROUTER_TOPK_KERNELS["softmax"] - 1
    routed, _ = ops(scenario(options={"moe_router_fusion": True, "moe_permute_fusion": True}))
    unfused, _ = ops(scenario())
    assert routed["moe_route_kernels"].kernels < unfused["moe_route_kernels"].kernels


def test_per_expert_gemms_on_four_streams_wait_one_gap_per_gemm_a_stream_runs_after_its_first():
    # 128 experts / 8 = 16 local experts, 4 per stream (Transformer Engine's multi-stream cuBLAS)
    one_kernel = scenario(ep=8)  # the default: one grouped kernel over the local experts
    assert M.grouped_gemm_launches(one_kernel.model, one_kernel.parallelism, one_kernel.moe) == (0, 0)
    s = scenario(ep=8, moe={"grouped_gemm_streams": 4})
    gaps, kernels = M.grouped_gemm_launches(s.model, s.parallelism, s.moe)
    assert (gaps, kernels) == (16 // 4 - 1, 16 - 1)
    o, _ = ops(s)
    assert o["expert_gemm_launches"].time_s == pytest.approx(2 * gaps * 3e-6)
    assert o["expert_gemm_launches_bwd"].time_s == pytest.approx(4 * gaps * 3e-6)


def test_qk_norm_key_rejects_a_non_boolean():
    with pytest.raises(ConfigError) as e:
        scenario_from_dict({"model": {"hidden_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 8,
                                      "num_key_value_heads": 8, "intermediate_size": 4096, "vocab_size": 1000,
                                      "qk_norm": "yes"},
                            "cluster": {"topology": "dgx-h100", "num_nodes": 1}})
    assert "model.qk_norm" in str(e.value)
    for key in ("moe_router_fusion", "moe_permute_fusion"):
        with pytest.raises(ConfigError) as e:
            scenario(options={key: 3})
        assert f"framework_options.{key}" in str(e.value)


def test_kernel_count_of_a_profiled_step_is_near_the_profile():
    """Megatron-Bridge's EP-overlap skill (7ded17da, PR 5094) profiled the BF16 Qwen3-30B-A3B run on 16
    H100 (EP16, HybridEP, force-balanced, overlap off): 463,348 kernels on rank 0 per step. Before the
    small kernels were modelled the layers launched a quarter of that."""
    cases = yaml.safe_load(DATA.read_text())["cases"]
    case = next(c for c in cases if c["id"] == "mbridge-skill-h100-qwen3-30b-a3b-bf16-hybridep-16")
    s = scenario_from_dict(case_to_scenario_dict(case, []))
    work = build_workload(s, gpu_of(s.cluster, s.training.precision))
    micro = s.training.global_batch_size // (s.training.micro_batch_size * s.dp)
    _, launches = M.grouped_gemm_launches(s.model, s.parallelism, s.moe)
    per_micro = 0
    for layer, cost in work.layer_costs.items():
        per_micro += sum(getattr(cost, b).kernels for b in BLOCKS)
        if s.model.is_moe_layer(layer):
            per_micro += 6 * launches + 4  # the per-expert GEMMs; dispatch and combine, both ways
    per_micro += sum(b.kernels for b in (*work.head, *work.embedding))
    kernels = micro * per_micro
    assert kernels == pytest.approx(463_348, rel=0.25), kernels
    assert micro == 64


def test_deepep_multihot_conversion_waits_for_the_gpu_three_times():
    """Megatron-core's DeepEP path converts the received top-k indices to a routing map with
    PyTorch ops whose output sizes depend on the data (mask index twice, repeat_interleave): three
    reads back to the host after the dispatch, each with the GPU drained, and the conversion's
    ops issued while it waits. The fused converter (--enable-experimental with permute fusion),
    HybridEP and the alltoall dispatcher have none; neither has another framework's MoE code."""
    deepep = {"moe": {"token_dispatcher": "flex"}}
    s = scenario(**deepep)
    o, _ = ops(s)
    kernel_s = gpu_of(s.cluster, "bf16").launch_overhead_s  # each small kernel's gap
    assert o["moe_expert_kernels"].time_s == pytest.approx(o["moe_expert_kernels"].kernels * kernel_s)
    issue = M.FLEX_MULTIHOT_OPS * M.HOST_OP_S - M.FLEX_MULTIHOT_KERNELS[0] * kernel_s
    assert o["moe_multihot_sync"].time_s == pytest.approx(3 * M.HOST_SYNC_S + issue)
    assert o["moe_multihot_sync"].time_s > 3 * M.HOST_SYNC_S
    fused, _ = ops(scenario(**deepep, options={"enable_experimental": True, "moe_permute_fusion": True}))
    experimental_only, _ = ops(scenario(**deepep, options={"enable_experimental": True}))
    hybrid, _ = ops(scenario(moe={"token_dispatcher": "flex", "flex_backend": "hybridep"}))
    alltoall, _ = ops(scenario())
    titan, _ = ops(scenario(**deepep, framework="torchtitan"))
    assert "moe_multihot_sync" in experimental_only  # the fused converter needs permute fusion too
    for other in (fused, hybrid, alltoall, titan):
        assert "moe_multihot_sync" not in other
    # the conversion's ops leave the token-count sync's after-run: its stall does not grow
    assert o["moe_host_sync"].time_s <= fused["moe_host_sync"].time_s + 1e-12


def test_flex_backend_and_enable_experimental_are_checked():
    with pytest.raises(ConfigError, match="moe.flex_backend"):
        scenario(moe={"token_dispatcher": "flex", "flex_backend": "nccl"})
    with pytest.raises(ConfigError, match="framework_options.enable_experimental"):
        scenario(options={"enable_experimental": "yes"})


def _gpt(position_embedding, framework="megatron-core"):
    model = {"hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 16,
             "intermediate_size": 4096, "vocab_size": 50304, "hidden_act": "gelu",
             "position_embedding": position_embedding}
    return scenario(model=model, framework=framework)


def test_only_rotary_models_rotate_q_and_k_and_a_learned_table_costs_its_gather_and_add():
    """rope prices the fused rotary kernel in every layer; learned (GPT-2, GPT-3, OPT), alibi (BLOOM,
    MPT) and none do not. A learned table adds, on the first stage, the gather of its rows and their
    add into the token rows: 10 bytes per element of the T x h output in two kernels; backward, the
    gradient read and written (4 bytes per element) and the scatter-add into the seq x h table with
    its fp32 main gradient (12 bytes per table element)."""
    rope, _ = ops(_gpt("rope"))
    assert "rope" in rope and "rope_bwd" in rope
    for kind in ("learned", "alibi", "none"):
        o, work = ops(_gpt(kind))
        assert "rope" not in o and "rope_bwd" not in o
        names = [op.name for op in work.embedding[0].ops]
        assert ("position_embedding" in names) == (kind == "learned")
    _, work = ops(_gpt("learned"))
    fwd = {op.name: op for op in work.embedding[0].ops}
    bwd = {op.name: op for op in work.embedding[1].ops}
    tokens, h = 4096, 1024
    assert fwd["position_embedding"].bytes == pytest.approx(10 * tokens * h) and fwd["position_embedding"].kernels == 2
    assert bwd["position_embedding_bwd"].bytes == pytest.approx(4 * tokens * h + 12 * 4096 * h)
    # the layers are otherwise the same: only the RoPE ops differ
    learned, _ = ops(_gpt("learned"))
    assert set(rope) - set(learned) == {"rope", "rope_bwd"}
    assert all(rope[k] == learned[k] for k in learned)


def test_an_eager_framework_pays_its_unfused_rope_only_on_a_rotary_model():
    rope, work_rope = ops(_gpt("rope", "torchtitan"))
    learned, work_learned = ops(_gpt("learned", "torchtitan"))
    extra = {op.name: op for op in work_rope.layer_costs[0].attn_fwd.ops}["unfused_elementwise"]
    plain = {op.name: op for op in work_learned.layer_costs[0].attn_fwd.ops}["unfused_elementwise"]
    m = _gpt("rope").model
    qk = 4096 * (m.num_attention_heads + m.num_key_value_heads) * m.head_dim
    assert extra.bytes - plain.bytes == pytest.approx(16 * qk)


@pytest.mark.parametrize("model_type, expected", [("gpt2", "learned"), ("opt", "learned"), ("gpt_bigcode", "learned"),
                                                   ("gpt_neo", "learned"), ("bloom", "alibi"), ("mpt", "alibi"),
                                                   ("llama", "rope"), ("gptj", "rope")])
def test_a_hugging_face_config_says_how_its_model_places_tokens(tmp_path, model_type, expected):
    import json
    config = {"model_type": model_type, "hidden_size": 768, "num_hidden_layers": 2, "num_attention_heads": 12,
              "intermediate_size": 3072, "vocab_size": 50257, "hidden_act": "gelu_new"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    s = scenario_from_dict({"model": {"hf_config": "config.json"}}, base_dir=tmp_path)
    assert s.model.position_embedding == expected
    # a field written beside the file wins
    s = scenario_from_dict({"model": {"hf_config": "config.json", "position_embedding": "none"}}, base_dir=tmp_path)
    assert s.model.position_embedding == "none"


@pytest.mark.parametrize("value", ["rotary", 1, True])
def test_an_unknown_position_embedding_is_a_one_line_error(value, capsys):
    from simulator.cli import main
    code = main(["run", "simulator/data/scenarios/tiny.yaml", "--set", f"model.position_embedding={value}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "model.position_embedding" in err and "rope, learned" in err
    dense = yaml.safe_load((DATA.parent / "nemo-2407-runs.yaml").read_text())["cases"][0]
    with pytest.raises(ConfigError, match="model.position_embedding"):
        case_to_scenario_dict({**dense, "model": {**dense["model"], "position_embedding": value}})
    assert case_to_scenario_dict({**dense, "model": {**dense["model"], "position_embedding": "learned"}})["model"][
        "position_embedding"] == "learned"
