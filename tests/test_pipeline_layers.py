"""``parallelism.pipeline_layers``: any split of the layers over the (virtual) pipeline stages,
and nanotron's cost-balanced split that the validation cases use for nanotron runs."""

import pytest

import simulator
from simulator.common.errors import ConfigError
from simulator.layout.grid import vstage_layers
from simulator.studies.cases import case_to_scenario_dict, nanotron_split


def _run(*sets):
    return simulator.run(simulator.load_scenario("scenarios/tiny.yaml", list(sets)), record_flows=False)


def test_the_even_split_written_out_is_the_default_byte_for_byte():
    split, even = _run("parallelism.pipeline_layers=[2, 2]").to_dict(), _run().to_dict()
    split.pop("sim_wall_s"), even.pop("sim_wall_s")
    assert split == even


def test_an_uneven_split_moves_work_and_memory_to_the_heavier_stage():
    light_first = _run("parallelism.pipeline_layers=[1, 3]")
    even = _run()
    stages = light_first.stages
    assert stages[1].compute_s > stages[0].compute_s
    assert light_first.step_time_s > even.step_time_s
    per_stage = simulator.memory(simulator.load_scenario("scenarios/tiny.yaml", ["parallelism.pipeline_layers=[1, 3]"]))
    assert per_stage.stages[1].weights_gib > per_stage.stages[0].weights_gib


def test_interleaved_counts_are_per_virtual_stage():
    sets = ["parallelism.vp=2", "schedule=interleaved", "training.global_batch_size=16"]
    assert vstage_layers(4, 2, 2, counts=(1, 1, 1, 1)) == (range(0, 1), range(1, 2), range(2, 3), range(3, 4))
    assert _run(*sets, "parallelism.pipeline_layers=[1, 1, 1, 1]").step_time_s == _run(*sets).step_time_s


@pytest.mark.parametrize("value, field", [
    ("[1, 2]", "parallelism.pipeline_layers"),  # adds up to 3, not 4
    ("[1, 1, 2]", "parallelism.pipeline_layers"),  # 3 entries for pp x vp = 2
    ("[1, -3]", "parallelism.pipeline_layers[1]"),
    ("abc", "parallelism.pipeline_layers"),
])
def test_a_bad_split_is_a_one_line_error_naming_the_key(value, field):
    with pytest.raises(ConfigError) as err:
        _run(f"parallelism.pipeline_layers={value}")
    assert str(err.value).startswith(field + ":")


def test_a_split_and_first_last_together_are_refused():
    with pytest.raises(ConfigError, match="either pipeline_layers or first/last"):
        _run("parallelism.pipeline_layers=[1, 3]", "parallelism.first_pipeline_num_layers=1")


def test_nanotron_split_follows_its_cumulative_cost_rule():
    """80 Llama layers (h 8192, ffn 28672, vocab 128256) on 32 stages: the LM head weighs about
    0.6 of a layer, so some stages take 3 layers, others 2, the last 1; 8B on 4 stages 9, 9, 8, 6."""
    big = {"hidden": 8192, "ffn_hidden": 28672, "layers": 80, "vocab": 128256, "heads": 64, "params_b": 80}
    split = nanotron_split(big, 32)
    assert len(split) == 32 and sum(split) == 80 and split[-1] == 1 and set(split) == {1, 2, 3}
    small = {"hidden": 4096, "ffn_hidden": 14336, "layers": 32, "vocab": 128256, "heads": 32, "params_b": 8}
    assert nanotron_split(small, 4) == (9, 9, 8, 6)


def test_a_nanotron_case_takes_nanotron_split_and_no_interleaving():
    case = {"id": "n", "framework": "nanotron",
            "model": {"hidden": 4096, "ffn_hidden": 14336, "layers": 32, "vocab": 128256, "heads": 32,
                      "kv_heads": 8, "params_b": 8, "seq_len": 4096},
            "hardware": {"gpu": "H100-SXM5-80GB", "count": 64, "gpus_per_node": 8},
            "parallelism": {"tp": 8, "pp": 4, "dp": 2, "mbs": 1, "gbs": 64},
            "measured": {"step_time_s": 1.0}}
    notes = []
    d = case_to_scenario_dict(case, notes)
    assert d["parallelism"]["pipeline_layers"] == [9, 9, 8, 6]
    assert d["parallelism"]["vp"] == 1
    assert any("cost-balanced" in n for n in notes)


def test_the_planner_drops_a_base_split_for_its_candidates():
    """A base scenario's split fits its own pp x vp only: candidates run the even split (or their
    ends), and the given layout is still simulated as written."""
    r = simulator.plan("scenarios/tiny.yaml", ["parallelism.pipeline_layers=[1, 3]"], workers=1, top=3)
    assert r["given"]["step_time_s"] > 0
    assert r["ranked"]


def test_a_sweep_varies_the_split_from_the_command_line_and_draws_it(tmp_path):
    """``--vary`` splits at the commas outside brackets, so a list is one value; the figures group
    points by value, lists included (a list value crashed the step-time figure)."""
    from simulator.studies.sweep import parse_vary
    assert parse_vary(["parallelism.pipeline_layers=[1,3],[2,2],[3,1]"]) == (
        ("parallelism.pipeline_layers", ([1, 3], [2, 2], [3, 1])),)
    assert parse_vary(["parallelism.tp=1,2"]) == (("parallelism.tp", (1, 2)),)
    rows = simulator.sweep("scenarios/tiny.yaml", ["parallelism.pipeline_layers=[1,3],[2,2],[3,1]"],
                           out=tmp_path, workers=1)
    steps = [r["step_time_s"] for r in rows]
    assert steps[1] == pytest.approx(_run().step_time_s) and len(set(steps)) == 3
    assert (tmp_path / "step_time_vs_parallelism_pipeline_layers.png").stat().st_size > 0


@pytest.mark.parametrize("text", ["parallelism.tp=1,,2", "parallelism.pipeline_layers=[1,3],", "parallelism.tp=,1"])
def test_an_empty_value_in_a_vary_list_is_an_error_not_a_silent_null(text):
    from simulator.studies.sweep import parse_vary
    with pytest.raises(ConfigError, match="empty"):
        parse_vary([text])


NANOTRON_1B = {"name": "n", "framework": "nanotron",
               "model": {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
                         "num_key_value_heads": 32, "intermediate_size": 8192, "vocab_size": 131072,
                         "tie_word_embeddings": True, "hidden_act": "silu"},
               "cluster": {"gpu": "H100-SXM5-80GB", "num_nodes": 1},
               "parallelism": {"tp": 1, "pp": 2, "dp": 4},
               "training": {"global_batch_size": 64, "micro_batch_size": 4, "seq_length": 4096}}


def _split_of(d: dict, *sets) -> list[int]:
    from simulator.layout.grid import scenario_split

    return [len(r) for r in scenario_split(simulator.load_scenario(d, list(sets)))]


def test_a_nanotron_scenario_takes_nanotron_split_as_a_case_does():
    """The profile's pipeline.split: parameters. The 1.34B tied Llama's LM head (vocab x hidden)
    weighs four layers: nanotron puts 11 layers on the first stage and 5 beside the head, as the
    case converter's nanotron_split; the engine's stages and the memory report follow it."""
    case = {"hidden": 2048, "ffn_hidden": 8192, "layers": 16, "vocab": 131072, "heads": 32, "params_b": 1.342, "tied": True}
    assert _split_of(NANOTRON_1B) == list(nanotron_split(case, 2)) == [11, 5]
    run = simulator.run(NANOTRON_1B, record_flows=False)
    assert run.stages[0].compute_s > 0 and run.stages[1].compute_s > 0
    mem = simulator.memory(NANOTRON_1B)
    assert mem.stages[0].weights_gib > mem.stages[1].weights_gib  # 11 layers against 5 (+ the tied head's copy)


def test_nanotrons_split_places_layer_counts_pp_does_not_divide_and_yields_to_the_layout():
    assert _split_of(NANOTRON_1B, "model.num_hidden_layers=15") == [10, 5]
    assert simulator.run(NANOTRON_1B, ["model.num_hidden_layers=15"], record_flows=False).step_time_s > 0
    # a split the scenario states wins; interleaving (which nanotron has not) splits evenly
    assert _split_of(NANOTRON_1B, "parallelism.pipeline_layers=[8, 8]") == [8, 8]
    assert _split_of(NANOTRON_1B, "parallelism.first_pipeline_num_layers=6") == [6, 10]
    assert _split_of(NANOTRON_1B, "parallelism.vp=2", "training.global_batch_size=64") == [4, 4, 4, 4]
    # Megatron's profile keeps the even split, and its rule that pp divides the layers
    assert _split_of(NANOTRON_1B, "framework=megatron-core") == [8, 8]
    with pytest.raises(ConfigError, match="parallelism.pp: got 2; must divide num_hidden_layers"):
        simulator.run(NANOTRON_1B, ["framework=megatron-core", "model.num_hidden_layers=15"])
