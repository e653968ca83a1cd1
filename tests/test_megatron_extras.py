"""Megatron-core's model-specific unfused paths (software.megatron_layer_extras): eager RoPE under a
YaRN attention factor, the GLU clamp and the per-expert bias loop of GPT-OSS, closed forms."""

import dataclasses
import math

import pytest

from simulator.scenario.config import FrameworkOptions, ModelConfig, ParallelConfig, Scenario, TrainingConfig
from simulator.common.errors import ConfigError
from simulator.parts.gpus import get_gpu
from simulator.scenario.load import scenario_from_dict
from simulator.scenario.hf import yarn_mscale
from simulator.workload.compute import layer_cost
from simulator.workload.frameworks import resolve
from simulator.parts.frameworks import load_profile
from simulator.workload.software import EXPERT_BIAS, GLU_CLAMP, MEGATRON_ROPE_UNFUSED, layer_with_software

H100 = get_gpu("H100")


def model(hf_id):
    return scenario_from_dict({"model": hf_id}).model


def test_hf_configs_give_the_fields_megatron_core_reads():
    oss = model("openai/gpt-oss-120b")
    assert oss.swiglu_limit == 7.0 and oss.expert_bias
    assert oss.rope_mscale == pytest.approx(0.1 * math.log(32) + 1)  # yarn factor 32, no mscale: 1.3466
    dsv3 = model("deepseek-ai/DeepSeek-V3")  # yarn factor 40 with mscale = mscale_all_dim = 1: ratio 1
    assert dsv3.rope_mscale == 1.0 and not dsv3.expert_bias and dsv3.swiglu_limit is None
    assert model("meta-llama/Llama-3.1-8B").rope_mscale == 1.0  # rope_type llama3, not yarn


def test_yarn_mscale_closed_forms():
    assert yarn_mscale(None) == 1.0
    assert yarn_mscale({"rope_type": "yarn", "factor": 1.0}) == 1.0
    assert yarn_mscale({"type": "yarn", "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707}) == pytest.approx(1.0)
    assert yarn_mscale({"type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 0.0}) == pytest.approx(
        0.1 * math.log(40) + 1)
    assert yarn_mscale({"rope_type": "dynamic", "factor": 4}) == 1.0


def test_every_profile_says_whose_layer_code_it_runs():
    codes = {name: load_profile(name)["model"]["code"] for name in
             ("megatron-core", "nemo", "torchtitan", "deepspeed", "composer", "maxtext", "automodel")}
    assert codes == {"megatron-core": "megatron-core", "nemo": "megatron-core", "torchtitan": "own",
                     "deepspeed": "own", "composer": "own", "maxtext": "own", "automodel": "own"}


SMALL = ModelConfig(hidden_size=1024, num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=4,
                    kv_channels=64, intermediate_size=1024, vocab_size=1000, hidden_act="silu", num_experts=16,
                    num_experts_per_tok=4, moe_intermediate_size=512, swiglu_limit=7.0, expert_bias=True,
                    rope_mscale=1.3)
TRAIN = TrainingConfig(seq_length=2048, micro_batch_size=1, global_batch_size=8)


def extras(framework, m=SMALL, par=ParallelConfig(ep=4, dp=8)):
    s = Scenario(name="t", model=m, training=TRAIN, parallelism=par, framework=framework,
                 framework_options=FrameworkOptions())
    base = layer_cost(m, TRAIN, par, H100, 0)
    return base, layer_with_software(base, m, TRAIN, par, H100, 0, resolve(s))


def named(block, name):
    return [op for op in block.ops if op.name == name]


def test_megatron_core_prices_the_three_paths_by_their_bytes_and_kernels():
    base, cost = extras("megatron-core")
    tokens, nloc = 2048, 16 // 4
    copies = tokens * 4  # balanced: tokens x top-k routed copies on the rank's experts
    rope = named(cost.attn_fwd, "rope_unfused")[0]
    assert rope.bytes == pytest.approx(MEGATRON_ROPE_UNFUSED[0] * tokens * (16 + 4) * 64) and rope.kernels == 24
    assert named(cost.attn_bwd, "rope_unfused_bwd")[0].bytes == pytest.approx(rope.bytes)
    clamp = named(cost.mlp_fwd, "expert_act_clamp")[0]
    assert clamp.bytes == pytest.approx(GLU_CLAMP[0] * copies * 2 * 512) and clamp.kernels == 3
    assert named(cost.mlp_bwd, "expert_act_clamp_bwd")[0].bytes == pytest.approx(GLU_CLAMP[2] * copies * 2 * 512)
    bias = named(cost.mlp_fwd, "expert_down_bias")[0]
    assert bias.bytes == pytest.approx(EXPERT_BIAS[0] * copies * 1024) and bias.kernels == 2 * nloc + 1
    bias_bwd = named(cost.mlp_bwd, "expert_down_bias_bwd")[0]
    assert bias_bwd.bytes == pytest.approx(EXPERT_BIAS[2] * copies * 1024) and bias_bwd.kernels == 4 * nloc + 1
    # placed where the code runs them: the clamp before the activation, the bias after fc2 (forward)
    names = [op.name for op in cost.mlp_fwd.ops]
    assert names.index("expert_act_clamp") + 1 == names.index("expert_act")
    assert names.index("expert_down_bias") == names.index("expert_down") + 1
    # the eager RoPE takes the fused kernel's place; the clamp and the bias loop are added
    assert not named(cost.attn_fwd, "rope") and not named(cost.attn_bwd, "rope_bwd")
    extra = rope.time_s - named(base.attn_fwd, "rope")[0].time_s + clamp.time_s + bias.time_s
    assert cost.attn_fwd.time_s + cost.mlp_fwd.time_s == pytest.approx(base.attn_fwd.time_s + base.mlp_fwd.time_s + extra)


def test_other_stacks_and_plain_models_pay_none_of_them():
    _, own = extras("automodel")
    _, plain = extras("megatron-core", dataclasses.replace(SMALL, swiglu_limit=None, expert_bias=False, rope_mscale=1.0))
    for cost in (own, plain):
        ops = {op.name for b in (cost.attn_fwd, cost.attn_bwd, cost.mlp_fwd, cost.mlp_bwd) for op in b.ops}
        assert not ops & {"rope_unfused", "rope_unfused_bwd", "expert_act_clamp", "expert_act_clamp_bwd",
                          "expert_down_bias", "expert_down_bias_bwd"}


def test_moe_act_recompute_reruns_the_clamp():
    t = dataclasses.replace(TRAIN, recompute="selective", recompute_modules=("moe_act",))
    par = ParallelConfig(ep=4, dp=8)
    s = Scenario(name="t", model=SMALL, training=t, parallelism=par, framework="megatron-core")
    cost = layer_with_software(layer_cost(SMALL, t, par, H100, 0), SMALL, t, par, H100, 0, resolve(s))
    assert [op.name for op in cost.mlp_recompute.ops] == ["expert_act_clamp", "expert_act"]


def test_bad_model_fields_are_one_line_errors():
    for key, value in (("rope_mscale", 0.5), ("swiglu_limit", -1), ("expert_bias", "yes")):
        with pytest.raises(ConfigError) as err:
            scenario_from_dict({"model": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                                          "intermediate_size": 128, "vocab_size": 100, key: value}})
        assert err.value.field == f"model.{key}"


def test_the_te_op_fuser_keeps_only_the_rope_path():
    par = ParallelConfig(ep=4, dp=8)
    s = Scenario(name="t", model=SMALL, training=TRAIN, parallelism=par, framework="megatron-core",
                 framework_options=FrameworkOptions(te_op_fuser=True))
    cost = layer_with_software(layer_cost(SMALL, TRAIN, par, H100, 0), SMALL, TRAIN, par, H100, 0, resolve(s))
    ops = {op.name for b in (cost.attn_fwd, cost.mlp_fwd, cost.mlp_bwd) for op in b.ops}
    assert "rope_unfused" in ops and not ops & {"expert_act_clamp", "expert_down_bias", "expert_down_bias_bwd"}


def test_validate_reads_the_op_fuser_and_a_stated_mtp_depth():
    from pathlib import Path

    import yaml

    from simulator.studies.cases import case_to_scenario_dict

    cases = {c["id"]: c for c in yaml.safe_load((Path(__file__).parent / "data" / "blackwell-runs.yaml").read_text())["cases"]}
    fused = [c for c in cases.values() if (c.get("framework_options") or {}).get("cutedsl_fused_grouped_mlp")]
    assert fused and all(case_to_scenario_dict(c)["framework_options"]["te_op_fuser"] is True for c in fused)
    no_mtp = case_to_scenario_dict(cases["mbridge-2511-gb300-dsv3-bf16-256"])  # a "w/o MTP" row, mtp_layers 0
    assert scenario_from_dict(no_mtp).model.num_nextn_predict_layers == 0
    assert model("deepseek-ai/DeepSeek-V3").num_nextn_predict_layers == 1
    # Kimi K2 (not in the catalog under its Base id): fitted on 1.04T parameters with its 2,048-wide
    # experts and MLA, the activation comes out SwiGLU, as its config says
    assert case_to_scenario_dict(cases["mbridge-2606-gb300-kimi-k2-mxfp8-256"])["model"]["hidden_act"] == "silu"


def test_the_glu_offset_copy_is_a_second_host_sync_priced_by_the_issue_after_it():
    """Megatron-core's clamped GLU copies linear_offset host-to-device with a blocking copy (a stream
    sync): the GPU then idles for the round trip and for whatever of the issue of the layer's
    remaining ops (activation, bias loop: moe.glu_path_ops; fc2, reorder, unpermute, combine: moe.glu_tail_ops) its
    GPU time does not cover. On a host 100x slower than x86 every op after the copy is exposed."""
    from simulator.workload import moe

    par = ParallelConfig(ep=4, dp=8)
    slow = dataclasses.replace(H100, host_overhead=100.0)
    one = layer_cost(SMALL, TRAIN, par, slow, 0)
    two = layer_cost(SMALL, TRAIN, par, slow, 0, glu_sync=True)
    names = [op.name for op in two.mlp_fwd.ops]
    assert names.index("moe_glu_sync") + 1 == names.index("expert_act")
    nloc, h = 4, moe.HOST_OP_S * 100.0
    late = (moe.GLU_ACT_OPS + moe.grouped_linear_host_ops(nloc, "bf16") + moe.UNPERMUTE_OPS
            + moe.EXPERT_BIAS_OPS + moe.EXPERT_BIAS_PER_EXPERT_OPS * nloc + moe.COLLECTIVE_OPS + moe.UNSORT_CHUNKS_OPS
            + 1)  # the residual add after the layer
    i = names.index("moe_glu_sync")
    gpu_after = sum(op.time_s for op in two.mlp_fwd.ops[i + 1:])
    glu = named(two.mlp_fwd, "moe_glu_sync")[0]
    assert glu.time_s >= moe.HOST_SYNC_S + late * h - gpu_after - 1e-12
    # a second sync only loses run-ahead: the two cost at least the one, plus a round trip
    assert two.mlp_fwd.host_wait_s >= one.mlp_fwd.host_wait_s + moe.HOST_SYNC_S - 1e-12
    assert two.mlp_fwd.time_s - two.mlp_fwd.host_wait_s == pytest.approx(one.mlp_fwd.time_s - one.mlp_fwd.host_wait_s)


def test_only_megatron_cores_clamped_glu_syncs_and_moe_act_recompute_syncs_again():
    from simulator.workload.workload import glu_sync

    def sw(framework, **opts):
        return resolve(Scenario(name="t", model=SMALL, training=TRAIN, parallelism=ParallelConfig(ep=4, dp=8),
                                framework=framework, framework_options=FrameworkOptions(**opts)))

    assert glu_sync(SMALL, sw("megatron-core")) and glu_sync(SMALL, sw("nemo"))
    assert not glu_sync(SMALL, sw("automodel")) and not glu_sync(SMALL, sw("megatron-core", te_op_fuser=True))
    assert not glu_sync(dataclasses.replace(SMALL, swiglu_limit=None), sw("megatron-core"))
    t = dataclasses.replace(TRAIN, recompute="selective", recompute_modules=("moe_act",))
    par = ParallelConfig(ep=4, dp=8)
    s = Scenario(name="t", model=SMALL, training=t, parallelism=par, framework="megatron-core")
    cost = layer_with_software(layer_cost(SMALL, t, par, H100, 0, glu_sync=True), SMALL, t, par, H100, 0, resolve(s))
    assert [op.name for op in cost.mlp_recompute.ops] == ["expert_act_clamp", "moe_glu_sync", "expert_act"]
    from simulator.workload.moe import HOST_OP_S, HOST_SYNC_S

    assert named(cost.mlp_recompute, "moe_glu_sync")[0].time_s == pytest.approx(HOST_SYNC_S + HOST_OP_S)
