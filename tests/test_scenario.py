"""Scenario loading, overrides and plan validation: shipped files, one test per rule, a property."""

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.common.errors import ConfigError
from simulator.scenario.load import apply_overrides, load_scenario, scenario_from_dict, scenario_to_dict
from simulator.layout.rules import validate_plan

SCENARIOS = sorted((Path(__file__).resolve().parent.parent / "scenarios").glob("*.yaml"))
TINY = next(p for p in SCENARIOS if p.name == "tiny.yaml")


def tiny(*overrides: str):
    return load_scenario(str(TINY), list(overrides))


def expect_error(field: str, fn, *args, left_out: bool = False):
    """The one-line error of ``fn(*args)`` names ``field`` and the value it got, or (``left_out``)
    says the key was left out: a message never shows a value the file did not write."""
    with pytest.raises(ConfigError) as info:
        fn(*args)
    message = str(info.value)
    assert message.startswith(f"{field}: left out" if left_out else f"{field}: got "), message
    assert "\n" not in message
    return message


# --- shipped scenarios ---------------------------------------------------------------------------

def test_the_issue_s_five_scenarios_are_shipped():
    names = {p.stem for p in SCENARIOS}
    assert {"tiny", "gpt3-175b-1024xa100", "llama3-405b-16384xh100", "llama3-70b-64xh100",
            "mixtral-8x7b-64xh100"} <= names


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_shipped_scenario_loads_validates_and_round_trips(path):
    s = load_scenario(str(path))
    warnings = validate_plan(s)
    if path.stem.startswith(("seed004", "deepseek-v3")):  # EP groups across nodes (DeepSeek-V3: EP64 on 8 nodes)
        assert len(warnings) == 1 and "EP group spans nodes" in warnings[0]
    else:
        assert warnings == []
    assert s.name == path.stem
    assert scenario_from_dict(scenario_to_dict(s)) == s
    assert path.read_text().startswith("#"), "each file opens with where its numbers come from"


def test_tiny_is_the_hand_checkable_layout():
    s = tiny()
    assert (s.parallelism.tp, s.parallelism.pp, s.dp) == (2, 2, 2)
    assert s.cluster.num_gpus == 8
    assert s.num_microbatches == 4
    assert s.model.head_dim == 128


def test_published_layouts():
    by_name = {p.stem: load_scenario(str(p)) for p in SCENARIOS}
    llama = by_name["llama3-405b-16384xh100"]
    assert llama.cluster.num_gpus == 16384
    assert (llama.parallelism.tp, llama.parallelism.pp, llama.dp) == (8, 16, 128)
    assert llama.training.global_batch_size * llama.training.seq_length == 2048 * 8192
    gpt3 = by_name["gpt3-175b-1024xa100"]
    assert gpt3.cluster.gpu == "A100-SXM4-80GB" and gpt3.cluster.num_gpus == 1024
    mixtral = by_name["mixtral-8x7b-64xh100"]
    assert mixtral.model.num_experts == 8 and mixtral.parallelism.ep == 8


# --- loading errors ------------------------------------------------------------------------------

def test_missing_file(tmp_path):
    expect_error("scenario", load_scenario, str(tmp_path / "nope.yaml"))


def test_not_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n  - : :")
    expect_error("scenario", load_scenario, str(bad))


def test_not_a_mapping(tmp_path):
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n- 2\n")
    expect_error("scenario", load_scenario, str(bad))


def test_name_defaults_to_the_file_stem(tmp_path):
    d = yaml.safe_load(TINY.read_text())
    del d["name"]
    path = tmp_path / "my-run.yaml"
    path.write_text(yaml.safe_dump(d))
    assert load_scenario(str(path)).name == "my-run"


@pytest.mark.parametrize("key, field", [
    ("optimizer", "optimizer"),
    ("parallelism.pipeline", "parallelism.pipeline"),
    ("training.lr", "training.lr"),
    ("cluster.gpus", "cluster.gpus"),
    ("model.rope_theta", "model.rope_theta"),
])
def test_unknown_keys_in_the_file_are_rejected(key, field):
    d = yaml.safe_load(TINY.read_text())
    parts = key.split(".")
    (d if len(parts) == 1 else d[parts[0]])[parts[-1]] = 1
    message = expect_error(field, scenario_from_dict, d)
    assert "valid:" in message


# --- overrides -----------------------------------------------------------------------------------

def test_override_parses_yaml_scalars():
    s = tiny("parallelism.tp=1", "parallelism.dp=4")
    assert s.parallelism.tp == 1 and isinstance(s.parallelism.tp, int)
    assert tiny("parallelism.dp=null").parallelism.dp is None
    assert tiny("parallelism.dp=").parallelism.dp is None
    assert tiny("parallelism.sequence_parallel=true").parallelism.sequence_parallel is True
    assert tiny("cluster.network_bandwidth_Gbps=200.5").cluster.network_bandwidth_Gbps == 200.5


def test_override_tp8_from_the_issue():
    s = tiny("parallelism.tp=8", "parallelism.pp=1", "parallelism.dp=1",
             "model.num_attention_heads=8", "training.global_batch_size=4")
    assert s.parallelism.tp == 8
    assert validate_plan(s) == []


def test_override_top_level_and_nested_model():
    s = tiny("name=what-if", "schedule=gpipe", "model.hidden_size=2048", "model.num_hidden_layers=8")
    assert (s.name, s.schedule, s.model.hidden_size, s.model.num_hidden_layers) == ("what-if", "gpipe", 2048, 8)


def test_override_creates_a_missing_section():
    d = {"model": yaml.safe_load(TINY.read_text())["model"]}
    out = apply_overrides(d, ["parallelism.tp=2"])
    assert out["parallelism"] == {"tp": 2}
    assert "parallelism" not in d, "the input dict is not mutated"


def test_override_model_with_a_catalog_id_replaces_the_inline_model():
    s = tiny("model=meta-llama/Llama-3.1-8B")
    assert (s.model.hidden_size, s.model.num_hidden_layers, s.model.vocab_size) == (4096, 32, 128256)
    assert tiny("model= meta-llama/Llama-3.1-8B ").model == s.model
    expect_error("model", tiny, "model=nope/Nope")  # not in the catalog
    expect_error("model", tiny, "model=5")  # neither an id nor model.<key>


@pytest.mark.parametrize("item, field", [
    ("parallelism.foo=1", "parallelism.foo"),
    ("bogus.tp=1", "bogus.tp"),
    ("bogus=1", "bogus"),
    ("parallelism.tp.x=1", "parallelism.tp.x"),
    ("name.x=1", "name.x"),
    ("parallelism.tp", "--set"),
    ("=3", "--set"),
    ("model=", "model"),
])
def test_bad_overrides(item, field):
    expect_error(field, tiny, item)


def test_override_of_a_model_field_replaces_its_alias():
    d = yaml.safe_load(TINY.read_text())
    d["model"].update(num_local_experts=8, num_experts_per_tok=2)
    s = scenario_from_dict(d, ["model.num_experts=16"])
    assert s.model.num_experts == 16


# --- model aliases and hf_config -----------------------------------------------------------------

@pytest.mark.parametrize("alias, field", [
    ("num_local_experts", "num_experts"),
    ("n_routed_experts", "num_experts"),
    ("n_shared_experts", "num_shared_experts"),
])
def test_aliases(alias, field):
    d = yaml.safe_load(TINY.read_text())
    d["model"].update({"num_experts": 4, "num_experts_per_tok": 2, alias: 4})
    assert getattr(scenario_from_dict(d).model, field) == 4


def test_conflicting_alias_is_an_error():
    d = yaml.safe_load(TINY.read_text())
    d["model"].update(num_experts=4, num_local_experts=8, num_experts_per_tok=2)
    expect_error("model.num_local_experts", scenario_from_dict, d)


def test_kv_heads_default_to_attention_heads():
    d = yaml.safe_load(TINY.read_text())
    del d["model"]["num_key_value_heads"]
    assert scenario_from_dict(d).model.num_key_value_heads == 8


MIXTRAL_HF = {
    "architectures": ["MixtralForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
    "vocab_size": 32000, "hidden_act": "silu", "tie_word_embeddings": False,
    "num_local_experts": 8, "num_experts_per_tok": 2, "rope_theta": 1e6, "sliding_window": None,
    "torch_dtype": "bfloat16",
}


def write_hf_scenario(tmp_path, model: dict) -> Path:
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(MIXTRAL_HF))
    d = yaml.safe_load(TINY.read_text())
    d["model"] = model
    d["parallelism"] = {"tp": 1, "pp": 1, "dp": 8, "ep": 8}
    path = tmp_path / "moe.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


def test_hf_config_is_read_relative_to_the_scenario(tmp_path, monkeypatch):
    path = write_hf_scenario(tmp_path, {"hf_config": "hf/config.json"})
    monkeypatch.chdir("/")
    s = load_scenario(str(path))
    m = s.model
    assert (m.hidden_size, m.num_hidden_layers, m.num_key_value_heads, m.hidden_act) == (4096, 32, 8, "silu")
    assert (m.num_experts, m.num_experts_per_tok) == (8, 2)
    assert validate_plan(s) == []


def test_fields_next_to_hf_config_override_it(tmp_path):
    path = write_hf_scenario(tmp_path, {"hf_config": "hf/config.json", "num_hidden_layers": 4})
    assert load_scenario(str(path)).model.num_hidden_layers == 4
    assert load_scenario(str(path), ["model.num_hidden_layers=8"]).model.num_hidden_layers == 8


def test_hf_config_errors(tmp_path):
    path = write_hf_scenario(tmp_path, {"hf_config": "hf/missing.json"})
    expect_error("model.hf_config", load_scenario, str(path))
    (tmp_path / "hf" / "broken.json").write_text("{not json")
    expect_error("model.hf_config", load_scenario, str(path), ["model.hf_config=hf/broken.json"])
    (tmp_path / "hf" / "partial.json").write_text(json.dumps({"hidden_size": 64}))
    expect_error("model.num_hidden_layers", load_scenario, str(path), ["model.hf_config=hf/partial.json"],
                 left_out=True)


# openai-community/gpt2-medium's config.json fields (its size fields and activation as published)
GPT2_MEDIUM_HF = {"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
                  "n_ctx": 1024, "n_embd": 1024, "n_head": 16, "n_layer": 24, "n_positions": 1024,
                  "vocab_size": 50257, "layer_norm_epsilon": 1e-05}


def test_a_gpt2_family_config_reads_its_own_field_names(tmp_path):
    """GPT-2's config.json names its sizes n_embd / n_layer / n_head, leaves the MLP width to
    4 x n_embd (n_inner absent) and the LM head tied by transformers' default: read as
    transformers reads it. BLOOM's n_embed and OPT's ffn_dim likewise; a field written in the
    scenario still wins, and an activation stepsim does not model is a one-line error."""
    (tmp_path / "gpt2.json").write_text(json.dumps(GPT2_MEDIUM_HF))
    d = yaml.safe_load(TINY.read_text())
    d["model"] = {"hf_config": "gpt2.json"}
    d["parallelism"] = {"tp": 1, "pp": 1, "dp": 8}
    path = tmp_path / "gpt2.yaml"
    path.write_text(yaml.safe_dump(d))
    m = load_scenario(str(path)).model
    assert (m.hidden_size, m.num_hidden_layers, m.num_attention_heads, m.num_key_value_heads) == (1024, 24, 16, 16)
    assert (m.intermediate_size, m.hidden_act, m.tie_word_embeddings) == (4096, "gelu_new", True)
    assert load_scenario(str(path), ["model.intermediate_size=2048"]).model.intermediate_size == 2048
    (tmp_path / "gpt2.json").write_text(json.dumps({**GPT2_MEDIUM_HF, "n_inner": 3000, "tie_word_embeddings": False}))
    m = load_scenario(str(path)).model
    assert (m.intermediate_size, m.tie_word_embeddings) == (3000, False)
    (tmp_path / "gpt2.json").write_text(json.dumps({"model_type": "bloom", "n_embed": 1024, "n_layer": 24, "n_head": 16,
                                                   "vocab_size": 250880}))
    m = load_scenario(str(path)).model
    assert (m.hidden_size, m.intermediate_size, m.tie_word_embeddings) == (1024, 4096, True)
    (tmp_path / "gpt2.json").write_text(json.dumps({"model_type": "opt", "hidden_size": 1024, "num_hidden_layers": 24,
                                                   "num_attention_heads": 16, "ffn_dim": 4096, "vocab_size": 50272,
                                                   "activation_function": "relu"}))
    m = load_scenario(str(path)).model
    assert (m.intermediate_size, m.hidden_act, m.tie_word_embeddings) == (4096, "relu", False)
    (tmp_path / "gpt2.json").write_text(json.dumps({**GPT2_MEDIUM_HF, "activation_function": "quick_gelu"}))
    expect_error("model.hidden_act", load_scenario, str(path))


# --- field checks --------------------------------------------------------------------------------

@pytest.mark.parametrize("item, field", [
    ("parallelism.tp=0", "parallelism.tp"),
    ("parallelism.tp='8'", "parallelism.tp"),
    ("parallelism.tp=1.5", "parallelism.tp"),
    ("parallelism.tp=true", "parallelism.tp"),
    ("parallelism.dp=-2", "parallelism.dp"),
    ("parallelism.zero_stage=4", "parallelism.zero_stage"),
    ("parallelism.zero_stage=1.0", "parallelism.zero_stage"),
    ("parallelism.sequence_parallel='yes'", "parallelism.sequence_parallel"),
    ("training.precision=fp4", "training.precision"),
    ("training.recompute=some", "training.recompute"),
    ("training.seq_length=0", "training.seq_length"),
    ("cluster.num_nodes=0", "cluster.num_nodes"),
    ("cluster.oversubscription=0.5", "cluster.oversubscription"),
    ("cluster.nvlink_bandwidth_GBps=0", "cluster.nvlink_bandwidth_GBps"),
    ("model.hidden_act=gelu_fast", "model.hidden_act"),
    ("model.tie_word_embeddings=1", "model.tie_word_embeddings"),
    ("model.hidden_size=1001", "model.hidden_size"),
    ("model.num_key_value_heads=3", "model.num_key_value_heads"),
    ("model.num_experts_per_tok=2", "model.num_experts_per_tok"),
    ("schedule=zero-bubble", "schedule"),
    ("name=", "name"),
])
def test_field_checks(item, field):
    expect_error(field, tiny, item)


def test_tp_message_is_the_documented_one():
    assert str(pytest.raises(ConfigError, tiny, "parallelism.tp=0").value) == \
        "parallelism.tp: got 0; must be a whole number >= 1"


def test_cluster_defaults_come_from_the_topology():
    d = yaml.safe_load(TINY.read_text())
    d["cluster"] = {"topology": "dgx-a100", "num_nodes": 1}
    s = scenario_from_dict(d)
    assert (s.cluster.gpu, s.cluster.gpus_per_node) == ("A100-SXM4-80GB", 8)
    d["cluster"] = {"topology": "dgx-a100", "num_nodes": 1, "gpu": None, "gpus_per_node": None}
    assert scenario_from_dict(d).cluster == s.cluster  # null, like leaving the field out
    assert tiny("cluster.gpus_per_node=null", "cluster.gpu=null").cluster == tiny().cluster


# --- plan validation: one test per rule -----------------------------------------------------------

@pytest.mark.parametrize("items, field", [
    (["cluster.gpu=Z100"], "cluster.gpu"),
    (["training.precision=fp8", "cluster.gpu=A100-SXM4-80GB"], "training.precision"),
    (["parallelism.dp=4"], "parallelism.dp"),
    (["parallelism.dp=null", "cluster.num_nodes=1", "cluster.gpus_per_node=6"], "cluster.num_nodes"),
    (["parallelism.tp=4", "parallelism.pp=1", "model.num_attention_heads=6", "model.num_key_value_heads=6",
      "model.hidden_size=768"], "parallelism.tp"),
    (["parallelism.tp=4", "parallelism.pp=1", "model.num_attention_heads=24", "model.num_key_value_heads=6",
      "model.hidden_size=1536"], "parallelism.tp"),
    (["model.num_hidden_layers=3"], "parallelism.pp"),
    (["parallelism.vp=4", "schedule=interleaved"], "parallelism.vp"),
    (["parallelism.ep=2"], "parallelism.ep"),
    (["model.num_experts=3", "model.num_experts_per_tok=1", "parallelism.ep=2"], "parallelism.ep"),
    (["model.num_experts=8", "model.num_experts_per_tok=2", "parallelism.ep=4"], "parallelism.ep"),
    (["training.global_batch_size=7"], "training.global_batch_size"),
    (["parallelism.cp=2", "parallelism.dp=1", "training.seq_length=1026"], "training.seq_length"),
    (["parallelism.sequence_parallel=true", "training.seq_length=1023"], "training.seq_length"),
    (["parallelism.vp=2", "schedule=gpipe"], "parallelism.vp"),
    (["parallelism.vp=2", "parallelism.pp=1", "parallelism.dp=4", "schedule=interleaved"], "parallelism.vp"),
    (["parallelism.vp=2", "schedule=interleaved", "training.global_batch_size=2"], "training.global_batch_size"),
    (["cluster.topology=no-such-fabric", "cluster.gpu=H100"], "cluster.topology"),
    (["cluster.gpus_per_node=12", "parallelism.dp=3"], "cluster.gpus_per_node"),
])
def test_each_rule_names_its_field(items, field):
    expect_error(field, lambda: validate_plan(tiny(*items)))


def test_kv_heads_fewer_than_tp_are_replicated_not_rejected():
    s = tiny("parallelism.tp=8", "parallelism.pp=1", "parallelism.dp=1", "training.global_batch_size=4",
             "model.num_attention_heads=16", "model.num_key_value_heads=2")
    assert validate_plan(s) == []


def test_world_size_message_says_what_would_fit():
    message = expect_error("parallelism.dp", lambda: validate_plan(tiny("parallelism.dp=4")))
    assert "set dp to 2 or null" in message
    message = expect_error("cluster.num_nodes", lambda: validate_plan(
        tiny("parallelism.dp=null", "parallelism.tp=1", "parallelism.pp=1", "parallelism.cp=3")))
    assert "multiple of 3 nodes" in message


def test_dp_is_derived_when_null():
    s = tiny("parallelism.dp=null")
    assert validate_plan(s) == [] and s.dp == 2


def test_layer_message_lists_valid_degrees():
    message = expect_error("parallelism.pp", lambda: validate_plan(tiny("model.num_hidden_layers=9")))
    assert "valid: 1, 3, 9" in message


def test_interleaved_with_one_chunk_is_1f1b():
    assert validate_plan(tiny("schedule=interleaved")) == []
    assert validate_plan(tiny("schedule=interleaved", "parallelism.vp=2")) == []


def test_sequence_parallel_with_tp1_is_a_no_op():
    assert validate_plan(tiny("parallelism.tp=1", "parallelism.dp=4", "parallelism.sequence_parallel=true")) == []


def test_tp_spanning_nodes_warns_naming_the_slower_link():
    s = tiny("cluster.num_nodes=2", "parallelism.tp=16", "parallelism.pp=1", "parallelism.dp=1",
             "model.num_attention_heads=16", "model.num_key_value_heads=16", "training.global_batch_size=1")
    (warning,) = validate_plan(s)
    assert warning.startswith("parallelism.tp: got 16;")
    assert "its collectives cross the 400 Gb/s network instead of 450 GB/s NVLink" in warning


def test_ep_spanning_nodes_warns():
    s = tiny("cluster.num_nodes=2", "parallelism.tp=2", "parallelism.pp=1", "parallelism.dp=8",
             "parallelism.ep=8", "model.num_experts=8", "model.num_experts_per_tok=2")
    (warning,) = validate_plan(s)
    assert warning.startswith("parallelism.ep: got 8;") and "400 Gb/s network" in warning


def test_warnings_use_the_scenario_s_link_overrides():
    s = tiny("cluster.num_nodes=2", "parallelism.tp=16", "parallelism.pp=1", "parallelism.dp=1",
             "model.num_attention_heads=16", "training.global_batch_size=1",
             "cluster.network_bandwidth_Gbps=200", "cluster.nvlink_bandwidth_GBps=300")
    (warning,) = validate_plan(s)
    assert "200 Gb/s network instead of 300 GB/s NVLink" in warning


def test_warnings_name_the_gpus_own_nvlink_rate():
    s = tiny("cluster.num_nodes=2", "parallelism.tp=16", "parallelism.pp=1", "parallelism.dp=1",
             "model.num_attention_heads=16", "model.num_key_value_heads=16", "training.global_batch_size=1",
             "cluster.gpu=H800")
    (warning,) = validate_plan(s)
    assert "400 Gb/s network instead of 200 GB/s NVLink" in warning  # the H800's, not the DGX-H100's 450


def test_a_gpu_of_another_generation_than_the_topologys_node_warns():
    (warning,) = validate_plan(tiny("cluster.gpu=GB200"))
    assert warning.startswith("cluster.gpu: got GB200; topology dgx-h100 is a node of H100-SXM5-80GB (NVLink 4)")
    assert validate_plan(tiny("cluster.gpu=H800")) == validate_plan(tiny("cluster.gpu=H200")) == []  # Hopper both
    assert "cluster.gpu: got H100" in validate_plan(tiny("cluster.gpu=H100", "cluster.topology=dgx-a100"))[0]


def test_moe_settings_on_a_dense_model_warn_that_they_do_nothing():
    (warning,) = validate_plan(tiny("moe.imbalance=2"))
    assert warning == ("moe.imbalance: got 2.0; the model is dense (model.num_experts is 0), so moe.imbalance "
                       "has no effect")
    (warning,) = validate_plan(tiny("moe.token_dispatcher=flex", "parallelism.etp=2"))
    assert "so moe.token_dispatcher, parallelism.etp have no effect" in warning
    moe = tiny("model.num_experts=8", "model.num_experts_per_tok=2", "moe.imbalance=2")
    assert not any("dense" in w for w in validate_plan(moe))


def test_validate_plan_rechecks_replaced_fields():
    s = tiny()
    bad = dataclasses.replace(s, parallelism=dataclasses.replace(s.parallelism, tp=0))
    expect_error("parallelism.tp", validate_plan, bad)


# --- property: random small scenarios validate or fail cleanly -----------------------------------

@st.composite
def scenario_dicts(draw):
    """Small scenarios, mostly consistent so that every plan rule is reached, each value sometimes off.

    ``usually(good, other)`` keeps the consistent value three times in four.
    """
    def usually(good, other):
        return draw(st.sampled_from([good, good, good, other]))

    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.integers(min_value=1, max_value=4))
    cp = draw(st.sampled_from([1, 1, 2]))
    dp = draw(st.sampled_from([1, 2, 4]))
    vp = usually(1, draw(st.sampled_from([2, 3])))
    ep = draw(st.sampled_from([1, 1, 2, 4]))
    gpn = draw(st.sampled_from([8, 8, 4, 2]))
    heads = usually(tp * draw(st.sampled_from([1, 2])), draw(st.integers(min_value=1, max_value=12)))
    experts = usually(0 if ep == 1 else ep * 2, draw(st.sampled_from([0, 3, 8])))
    mbs = draw(st.integers(min_value=1, max_value=2))
    return {
        "name": "p",
        "model": {
            "hidden_size": heads * draw(st.sampled_from([8, 64])),
            "num_hidden_layers": usually(pp * vp * draw(st.integers(min_value=1, max_value=3)),
                                         draw(st.integers(min_value=1, max_value=12))),
            "num_attention_heads": heads,
            "num_key_value_heads": draw(st.sampled_from([None, heads, 1, 2, 8])),
            "intermediate_size": draw(st.sampled_from([64, 256])),
            "vocab_size": 1000,
            "hidden_act": draw(st.sampled_from(["gelu", "silu", "relu"])),
            "num_experts": experts,
            "num_experts_per_tok": min(experts, 2),
        },
        "cluster": {
            "topology": draw(st.sampled_from(["dgx-h100", "dgx-a100", "llama3-roce", "omnipath-a100"])),
            "num_nodes": usually(max(1, tp * pp * cp * dp // gpn), draw(st.integers(min_value=1, max_value=3))),
            "gpus_per_node": gpn,
        },
        "training": {
            "seq_length": usually(1024, draw(st.sampled_from([30, 64, 100]))),
            "micro_batch_size": mbs,
            "global_batch_size": usually(mbs * dp * pp * draw(st.integers(min_value=1, max_value=4)),
                                         draw(st.integers(min_value=1, max_value=64))),
            "precision": usually("bf16", draw(st.sampled_from(["fp16", "fp8"]))),
            "recompute": draw(st.sampled_from(["none", "selective", "full"])),
        },
        "parallelism": {
            "tp": tp, "pp": pp, "cp": cp, "ep": ep, "vp": vp,
            "dp": draw(st.sampled_from([None, dp])),
            "sequence_parallel": draw(st.booleans()),
            "zero_stage": draw(st.sampled_from([0, 1, 2, 3])),
        },
        "schedule": usually("interleaved" if vp > 1 else "1f1b", draw(st.sampled_from(["gpipe", "1f1b"]))),
    }


BAD_OVERRIDES = [
    "parallelism.tp=0", "parallelism.pp=-1", "parallelism.dp=0", "parallelism.vp=1.5", "name=",
    "parallelism.sequence_parallel='yes'", "parallelism.zero_stage=5", "parallelism.x=1",
    "training.precision=fp4", "training.global_batch_size=0", "model.hidden_act=tanh",
    "model.num_attention_heads=0", "model.num_key_value_heads=3", "model.n_routed_experts=4",
    "model.num_experts_per_tok=9", "cluster.gpu=Z9", "cluster.topology=nope", "cluster.num_nodes=0",
    "cluster.gpus_per_node=12", "cluster.oversubscription=0.5", "schedule=dualpipe", "bogus=1",
]


@settings(max_examples=400, deadline=None)
@given(scenario_dicts(), st.one_of(st.just([]), st.lists(st.sampled_from(BAD_OVERRIDES), min_size=1, max_size=1)))
def test_random_scenarios_validate_or_raise_config_error(d, overrides):
    try:
        s = scenario_from_dict(d, overrides)
        warnings = validate_plan(s)
    except ConfigError as err:
        assert "\n" not in str(err)
        return
    assert all(isinstance(w, str) for w in warnings)
    assert s.parallelism.tp * s.parallelism.pp * s.dp * s.parallelism.cp == s.cluster.num_gpus
    assert s.num_microbatches >= 1
    assert scenario_from_dict(scenario_to_dict(s)) == s


def test_vp_above_one_with_1f1b_means_interleaved_as_the_issue_example_says(tmp_path):
    from simulator.scenario.load import scenario_from_dict
    from simulator.layout.rules import validate_plan
    s = scenario_from_dict({
        "name": "gpt3-175b-128xh100",
        "model": {"hidden_size": 12288, "num_hidden_layers": 96, "num_attention_heads": 96,
                  "num_key_value_heads": 96, "intermediate_size": 49152, "vocab_size": 51200},
        "cluster": {"topology": "dgx-h100", "num_nodes": 16, "gpus_per_node": 8, "gpu": "H100-SXM5-80GB"},
        "training": {"seq_length": 2048, "micro_batch_size": 1, "global_batch_size": 256},
        "parallelism": {"tp": 4, "pp": 8, "dp": None, "vp": 12, "sequence_parallel": True, "zero_stage": 1},
        "schedule": "1f1b"})
    assert validate_plan(s) == [] and s.pipeline_schedule == "interleaved"


def test_expert_tp_must_divide_tp_and_needs_sequence_parallelism_below_it():
    import dataclasses

    from simulator.scenario.config import ModelConfig, ParallelConfig, Scenario, ClusterConfig, TrainingConfig
    from simulator.common.errors import ConfigError
    from simulator.layout.rules import validate_plan

    moe = ModelConfig(hidden_size=1024, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8,
                      intermediate_size=1024, vocab_size=32000, hidden_act="silu", num_experts=16,
                      num_experts_per_tok=2)
    s = Scenario(name="t", model=moe, cluster=ClusterConfig(topology="dgx-h100", num_nodes=1),
                 training=TrainingConfig(seq_length=1024, global_batch_size=8),
                 parallelism=ParallelConfig(tp=2, dp=4, ep=8, sequence_parallel=True))
    with pytest.raises(ConfigError, match=r"parallelism\.ep: got 8; ep x etp \(8 x 2\) must divide .* set etp: 1"):
        validate_plan(s)
    ok = dataclasses.replace(s, parallelism=dataclasses.replace(s.parallelism, etp=1))
    validate_plan(ok)
    with pytest.raises(ConfigError, match=r"parallelism\.etp: got 3; must divide tp"):
        validate_plan(dataclasses.replace(s, parallelism=dataclasses.replace(s.parallelism, etp=3)))
    with pytest.raises(ConfigError, match=r"parallelism\.etp: got 1; below tp .* sequence_parallel"):
        validate_plan(dataclasses.replace(ok, parallelism=dataclasses.replace(ok.parallelism, sequence_parallel=False)))


def test_nvl72_rank_grid_keeps_dividing_groups_in_one_rack_and_warns_when_tp_x_cp_does_not_divide_72():
    """Megatron order on 72-GPU nodes: TP8 groups and TP8 x CP... blocks that divide 72 stay in a rack;
    tp 8 x cp 2 = 16 does not divide 72, so the CP groups of ranks 64-79 straddle racks: warned."""
    from simulator.layout.grid import Plan
    base = ["cluster.topology=gb200-nvl72", "cluster.gpus_per_node=72", "cluster.gpu=GB200",
            "cluster.num_nodes=2", "parallelism.pp=1", "training.global_batch_size=144"]
    ok = tiny(*base, "parallelism.tp=4", "parallelism.cp=2", "parallelism.dp=18", "model.num_attention_heads=16",
              "model.num_key_value_heads=16", "training.seq_length=64")
    assert validate_plan(ok) == []
    plan = Plan.build(4, 1, 18, 2)
    assert all(len({r // 72 for r in plan.cp_group(r)}) == 1 for r in range(144))
    bad = tiny(*base, "parallelism.tp=8", "parallelism.cp=2", "parallelism.dp=9", "model.num_attention_heads=16",
               "model.num_key_value_heads=16", "training.seq_length=64")
    (warning,) = validate_plan(bad)
    assert warning.startswith("parallelism.cp: got 2; tp x cp = 16") and "straddle" in warning
    plan = Plan.build(8, 1, 9, 2)
    assert {r // 72 for r in plan.cp_group(64)} == {0, 1}
