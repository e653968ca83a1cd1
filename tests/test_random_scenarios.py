"""Random scenarios, end to end: a clean ConfigError or a complete, sane report; never a crash."""

from hypothesis import HealthCheck, given, settings, strategies as st

from simulator.engine.engine import simulate
from simulator.common.errors import ConfigError
from simulator.workload.memory import memory_report
from simulator.reports.report import step_report
from simulator.scenario.load import scenario_from_dict
from simulator.layout.rules import validate_plan


@st.composite
def scenario_dicts(draw):
    moe = draw(st.booleans())
    heads = draw(st.sampled_from([4, 8, 16]))
    model = {"hidden_size": heads * 64, "num_hidden_layers": draw(st.sampled_from([2, 4, 6, 8])),
             "num_attention_heads": heads, "num_key_value_heads": draw(st.sampled_from([heads, heads // 4])),
             "intermediate_size": heads * 256, "vocab_size": 4096,
             "hidden_act": draw(st.sampled_from(["gelu", "silu"]))}
    if moe:
        model.update(num_experts=draw(st.sampled_from([4, 8])), num_experts_per_tok=2)
    return {
        "name": "random",
        "model": model,
        "cluster": {"topology": draw(st.sampled_from(["dgx-h100", "dgx-a100", "omnipath-a100", "llama3-roce"])),
                    "num_nodes": draw(st.sampled_from([1, 2, 4])),
                    "network_bandwidth_Gbps": draw(st.sampled_from([None, 100, 800]))},
        "training": {"seq_length": draw(st.sampled_from([256, 512, 1024])), "micro_batch_size": draw(st.sampled_from([1, 2])),
                     "global_batch_size": draw(st.sampled_from([4, 8, 16, 32])),
                     "recompute": draw(st.sampled_from(["none", "selective", "full"])),
                     "attention": draw(st.sampled_from(["flash", "unfused"]))},
        "parallelism": {"tp": draw(st.sampled_from([1, 2, 4, 8])), "pp": draw(st.sampled_from([1, 2, 4])),
                        "dp": None, "cp": draw(st.sampled_from([1, 2])), "ep": draw(st.sampled_from([1, 2, 4])),
                        "vp": draw(st.sampled_from([1, 2])), "sequence_parallel": draw(st.booleans()),
                        "zero_stage": draw(st.sampled_from([0, 1, 2, 3]))},
        "schedule": draw(st.sampled_from(["gpipe", "1f1b", "interleaved"])),
    }


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario_dicts())
def test_random_scenario_gives_a_report_or_a_clean_error(d):
    try:
        s = scenario_from_dict(d)
        validate_plan(s)
        mem = memory_report(s)
    except ConfigError as err:
        assert "\n" not in str(err)
        return
    assert mem["peak_gib"] > 0
    r = step_report(simulate(s))
    assert r["step_time_s"] > 0 and 0 < r["mfu"] < 1
    for st_ in r["stages"]:
        total = st_["compute_s"] + sum(st_["exposed_comm_s"].values()) + st_["idle_s"]
        assert abs(total - r["step_time_s"]) <= 1e-9 * r["step_time_s"]
