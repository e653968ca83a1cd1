"""Megatron-core's --recompute-modules as selective recompute: which forward ops each re-runs."""

import pytest

from simulator.scenario.config import MoEConfig, ParallelConfig, TrainingConfig
from simulator.common.errors import ConfigError
from simulator.parts.gpus import get_gpu
from simulator.scenario.load import scenario_from_dict
from simulator.studies.cases import case_to_scenario_dict
from simulator.workload.compute import layer_cost

H100 = get_gpu("H100-SXM5-80GB")


def model(hf_id):
    return scenario_from_dict({"model": hf_id}).model


def times(block):
    return {op.name: op.time_s for op in block.ops}


def cost(m, modules, layer=0, recompute="selective", par=ParallelConfig(ep=8)):
    t = TrainingConfig(seq_length=4096, recompute=recompute, recompute_modules=modules)
    return layer_cost(m, t, par, H100, layer, MoEConfig())


def test_layernorm_and_moe_act_rerun_exactly_those_forward_ops():
    m = model("Qwen/Qwen3-30B-A3B")
    c = cost(m, ("layernorm", "moe_act"))
    fwd_attn, fwd_mlp = times(c.attn_fwd), times(c.mlp_fwd)
    assert times(c.attn_recompute) == {"input_norm": fwd_attn["input_norm"]}
    assert times(c.mlp_recompute) == {"post_attn_norm": fwd_mlp["post_attn_norm"],
                                      "expert_act": fwd_mlp["expert_act"]}
    # the backward is the no-recompute backward plus those ops
    none = cost(m, None, recompute="none")
    extra = fwd_attn["input_norm"] + fwd_mlp["post_attn_norm"] + fwd_mlp["expert_act"]
    assert c.bwd_time_s == pytest.approx(none.bwd_time_s + extra)


def test_default_modules_are_megatrons_core_attn():
    m = model("Qwen/Qwen3-30B-A3B")
    default, core = cost(m, None), cost(m, ("core_attn",))
    assert [op.name for op in default.attn_recompute.ops] == ["attn_core"]
    assert default == core and not default.mlp_recompute.ops


def test_mlp_reruns_dense_layers_only_and_mla_up_proj_the_up_projections():
    m = model("deepseek-ai/DeepSeek-V3")
    dense, sparse = cost(m, ("mla_up_proj", "mlp"), layer=0), cost(m, ("mla_up_proj", "mlp"), layer=5)
    assert dense.mlp_recompute == dense.mlp_fwd  # the whole dense MLP
    assert not sparse.mlp_recompute.ops  # "mlp" leaves MoE layers alone
    assert [op.name for op in sparse.attn_recompute.ops] == ["q_up_proj", "kv_up_proj"]


def test_modules_need_selective_and_known_names():
    base = {"model": "Qwen/Qwen3-30B-A3B", "cluster": {"topology": "dgx-h100", "num_nodes": 1},
            "training": {"seq_length": 4096, "global_batch_size": 8, "recompute": "full",
                         "recompute_modules": ["layernorm"]},
            "parallelism": {"ep": 8}}
    with pytest.raises(ConfigError, match="needs recompute: selective"):
        scenario_from_dict(base)
    base["training"].update(recompute="selective", recompute_modules=["layernorm", "attention"])
    with pytest.raises(ConfigError, match="must be a non-empty list"):
        scenario_from_dict(base)
    base["training"]["recompute_modules"] = ["layernorm", "moe_act"]
    assert scenario_from_dict(base).training.recompute_modules == ("layernorm", "moe_act")


def test_validate_reads_module_names_from_the_recompute_text_or_the_option():
    case = {"id": "x", "source": "2025", "model": {"hf_id": "Qwen/Qwen3-30B-A3B", "layers": 48, "hidden": 2048,
                                                   "ffn_hidden": 6144, "heads": 32, "vocab": 151936, "seq_len": 4096,
                                                   "experts": 128, "topk": 8},
            "hardware": {"gpu": "H100", "count": 8}, "framework_options": {},
            "parallelism": {"tp": 1, "pp": 1, "ep": 8, "gbs": 64,
                            "recompute": "selective+sequence-parallel (layernorm, moe_act)"}}
    assert case_to_scenario_dict(case)["training"]["recompute_modules"] == ["layernorm", "moe_act"]
    case["parallelism"]["recompute"] = "selective (RMSNorm, MLA up-projection)"
    assert "recompute_modules" not in case_to_scenario_dict(case)["training"]
    case["framework_options"]["recompute_modules"] = ["mla_up_proj", "mlp"]
    assert case_to_scenario_dict(case)["training"]["recompute_modules"] == ["mla_up_proj", "mlp"]


def test_moe_reruns_the_whole_moe_layer_but_not_its_norm_and_residual():
    """Megatron-core's "moe" module checkpoints the MoE layer (moe_layer.py): router, permutation,
    experts, shared experts and the token-count sync re-run; the norm before it re-runs only with
    "layernorm"; a dense layer is left alone."""
    m = model("deepseek-ai/DeepSeek-V3")
    sparse = cost(m, ("moe",), layer=5)
    fwd = [op.name for op in sparse.mlp_fwd.ops]
    assert [op.name for op in sparse.mlp_recompute.ops] == [n for n in fwd if n not in ("post_attn_norm",
                                                                                        "mlp_residual")]
    assert {"router", "expert_up", "expert_down", "shared_up", "moe_host_sync"} <= set(fwd)
    with_norm = cost(m, ("layernorm", "moe"), layer=5)
    assert [op.name for op in with_norm.mlp_recompute.ops] == [n for n in fwd if n != "mlp_residual"]
    assert not cost(m, ("moe",), layer=0).mlp_recompute.ops  # dense layer 0
    # moe_act adds nothing beside it
    assert cost(m, ("moe", "moe_act"), layer=5).mlp_recompute == sparse.mlp_recompute


def test_moe_recompute_runs_the_dispatch_and_combine_again():
    """The recomputed MoE layer sends its tokens again: six all-to-alls per MoE layer and
    micro-batch instead of four, and the step is longer."""
    from simulator.engine.engine import simulate

    def run(modules):
        s = scenario_from_dict({
            "model": "Qwen/Qwen3-30B-A3B", "cluster": {"topology": "dgx-h100", "num_nodes": 1},
            "training": {"seq_length": 1024, "global_batch_size": 8, "micro_batch_size": 1,
                         "recompute": "selective", "recompute_modules": modules},
            "parallelism": {"ep": 8}})
        res = simulate(s)
        a2a = sum(1 for r in res.trace if r.axis == "ep" and r.label == "all_to_all" and r.rank == 0)
        return res.step_time_s, a2a

    t_act, n_act = run(["moe_act"])
    t_moe, n_moe = run(["moe"])
    assert n_act == 48 * 4 and n_moe == 48 * 6  # 48 MoE layers, one micro-batch per rank
    assert t_moe > t_act


def small_case(source, options, **parallelism):
    """A published-run case of a small dense model on 8 A100s, with these framework options."""
    return {"id": "x", "source": source, "model": {"layers": 4, "hidden": 1024, "ffn_hidden": 4096, "heads": 8,
                                                   "vocab": 32000, "seq_len": 2048},
            "hardware": {"gpu": "A100-SXM4-80GB", "count": 8}, "framework_options": options,
            "parallelism": {"tp": 1, "pp": 1, "gbs": 8, **parallelism}}


@pytest.mark.parametrize("stated, recompute", [("full", "full"), ("selective (attention core)", "selective"),
                                               ("none", "none"), ("Full, every layer", "full")])
def test_a_cases_activation_checkpointing_sets_the_recompute(stated, recompute):
    case = small_case("2024", {"activation_checkpointing": stated}, recompute="none")
    assert case_to_scenario_dict(case)["training"]["recompute"] == recompute


def test_an_activation_checkpointing_statement_it_cannot_read_is_a_one_line_error_not_no_recompute():
    """A flag list such as '--checkpoint-activations' used to fall through to no recompute at all."""
    case = small_case("2022", {"activation_checkpointing": "--checkpoint-activations (recipe)"}, recompute="full")
    with pytest.raises(ConfigError) as err:
        case_to_scenario_dict(case)
    message = str(err.value)
    assert "framework_options.activation_checkpointing" in message and "--checkpoint-activations" in message
    assert "none, selective or full" in message and "\n" not in message


@pytest.mark.parametrize("stated, kernel", [("fa2", "fa2"), ("sdpa (F.scaled_dot_product_attention)", "sdpa"),
                                            ("eager (materialised scores)", "unfused"),
                                            ("FlashAttention-1 (flash-attn 1.0.4)", "fa1"),
                                            ("cudnn_flash_te", "cudnn"), ("flash", "flash")])
def test_a_cases_attention_statement_names_the_kernel(stated, kernel):
    assert case_to_scenario_dict(small_case("2024", {"attention": stated}))["training"]["attention"] == kernel


def test_an_attention_statement_naming_no_priced_kernel_is_a_one_line_error_not_the_default():
    """'Megatron fused softmax (no FlashAttention)' used to run the framework's flash kernel."""
    case = small_case("2022", {"attention": "Megatron fused softmax (no FlashAttention)"})
    with pytest.raises(ConfigError) as err:
        case_to_scenario_dict(case)
    message = str(err.value)
    assert "framework_options.attention" in message and "Megatron fused softmax" in message
    assert "must start with fa2" in message and "\n" not in message
