"""Human output in plain words: the run header names the schedule that ran, the time split and the
plan's layout names are said or explained, rounding hides float noise."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import simulator
from simulator.common.units import hide_float_noise
from simulator.studies.audit import audit, format_audit
from simulator.studies.planner import format_plan, plan
from simulator.studies.planner_space import LABEL_PARTS

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "scenarios" / "tiny.yaml")


def test_run_header_names_the_schedule_that_ran():
    r = simulator.run(TINY, ["parallelism.vp=2", "schedule=1f1b"])
    lay = r.to_dict()["layout"]
    assert lay["schedule"] == "1f1b" and lay["pipeline_schedule"] == "interleaved"
    header = r.summary().splitlines()[0]
    assert ", interleaved (the scenario says 1f1b; vp 2 interleaves it)," in header
    plain = simulator.run(TINY).summary().splitlines()[0]
    assert ", 1f1b, " in plain and "says" not in plain


def test_run_summary_says_what_the_time_went_to():
    text = simulator.run(TINY).summary()
    assert "beside comm" not in text and "exposed" not in text
    assert re.search(r"waiting on TP collectives +\d", text) and re.search(r"waiting on DP gradient sync +\d", text)
    assert re.search(r"of which +\d\.\d{4} s lost to communication kernels sharing the SMs", text)
    assert re.search(r"idle \(pipeline bubble\) +\d", text)
    assert re.search(r"memory peak +3\.1 GiB per GPU of 80 GiB \(fits\)", text)


def test_one_gpu_is_one_gpu():
    one = simulator.run(TINY, ["cluster.gpus_per_node=1", "parallelism.tp=1", "parallelism.pp=1",
                               "parallelism.dp=1", "training.global_batch_size=1"])
    header = one.summary().splitlines()[0]
    assert header.startswith("tiny: 1 GPU, ") and "1 micro-batch per pipeline" in header


@pytest.fixture(scope="module")
def small_plan():
    return plan(TINY, space=["tp=1,2,3", "pp=1,2", "vp=1,2", "micro_batch_size=1", "recompute=none,selective",
                             "zero_stage=0,3"], workers=1, progress=None)


def test_plan_pruning_reasons_show_a_real_layout_not_a_literal_n(small_plan):
    c = small_plan["candidates"]
    assert set(c["pruned_rules_examples"]) == set(c["pruned_rules_by_reason"])
    assert any(" N " in reason or reason.endswith(" N") for reason in c["pruned_rules_by_reason"])
    text = format_plan(small_plan)
    lines = text.splitlines()[1:1 + min(6, len(c["pruned_rules_by_reason"]))]
    for line, (reason, n) in zip(lines, c["pruned_rules_by_reason"].items()):
        example = c["pruned_rules_examples"][reason]
        assert line.strip() == f"{n:,}  e.g. {example}"
        assert not re.search(r"\bN\b", line)
        field = reason.split(":")[0]
        assert re.match(r"TP\d+ PP\d+", example) and f": {field}: got " in example


def test_plan_prints_a_legend_of_the_layout_names_it_shows(small_plan):
    text = format_plan(small_plan)
    legend = text.splitlines()[-1]
    assert legend.startswith("layout names: TPn PPn DPn: tensor-, pipeline- and data-parallel sizes")
    assert "Zn: ZeRO stage n" in legend and "mbsN: micro-batch size" in legend
    shown = " ".join(e["layout"] for e in small_plan["ranked"][:small_plan["top"]])
    for pattern, words in LABEL_PARTS:
        if re.search(pattern, shown):
            assert words in legend
    if "rc-" not in shown + small_plan["given"]["layout"]:
        assert "rc-X" not in legend


def test_audit_text_hides_float_noise_the_json_keeps():
    result = audit(str(ROOT / "scenarios" / "seed004-plan-audit.yaml"))
    step = next(r for r in result["claims"] if r["name"] == "step_time_s")
    text = format_audit(result)
    assert not re.search(r"\de-(1[2-9]|[2-9]\d)", text)
    idle = re.search(r"idle (\S+) s", step["why"]).group(1)
    shown = re.search(r"idle (\S+) s", text).group(1)
    assert shown == ("0" if abs(float(idle)) < 1e-12 else idle)


@pytest.mark.parametrize("text, plain", [
    ("idle 6.939e-18 s", "idle 0 s"), ("-4.1e-16 s", "0 s"), ("1.5e-05 s", "1.5e-05 s"), ("3e-12", "0"),
    ("2e-11", "2e-11"), ("x2.3e-15", "x2.3e-15"), ("TP8 0.0039 s", "TP8 0.0039 s"),
])
def test_hide_float_noise(text, plain):
    assert hide_float_noise(text) == plain
