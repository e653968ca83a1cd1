"""Predict published training runs: turn each case of a public-runs file into a scenario
(``simulator.studies.cases``, which documents the defaults for what a case leaves out) and simulate it.

A case with ``excluded_from_score: <reason>`` is simulated and printed (marked "excluded") but
left out of the summary's MAPE and signed mean, which are also given with it
(``mape_with_excluded``, ``signed_mean_with_excluded``). A data file states when it uses this (its
``selection:``); moe-runs.yaml uses it only for a number its publisher filed as a regression.

Predicted TFLOP/s per GPU are the measured ones scaled by measured / predicted step time, i.e.
the source's own FLOP convention (model or hardware FLOPs) applied to the predicted step. A
measured TFLOP/s or MFU becomes a step time through stepsim's model FLOPs of the run, in the
convention the case states (``measured.flops_convention``: ``full`` unless it says ``causal``).
"""

from __future__ import annotations


from simulator.common.errors import ConfigError
from simulator.common.progress import as_progress
from simulator.studies.workers import Lost, check_local_workers, outcome, process_pool
from simulator.scenario.load import scenario_from_dict
from simulator.simulation import run
from simulator.studies.cases import case_to_scenario_dict, groups_of, load_cases, measured_step
from simulator.workload.compute import model_flops_per_token

# How a case's measured TFLOP/s or MFU counted FLOPs (``measured.flops_convention``): ``full``,
# stepsim's model FLOPs (attention not halved, Megatron-LM's convention until 2025 and NeMo's
# published MFU); ``causal``, the attention term halved (Megatron-LM's logged TFLOP/s since
# 8873b55d, 2025-03-06: ``compute.model_flops_per_token``).
FLOP_CONVENTIONS = ("full", "causal")


def predict(case: dict) -> dict:
    """Simulate one case; returns its row (predictions, measured values, error) or an error row."""
    notes: list[str] = []
    try:
        d = case_to_scenario_dict(case, notes)
    except ConfigError as err:  # a case its fields cannot describe (e.g. an unmodelled MaxText remat list)
        return {"id": case["id"], "error": str(err)}
    row = {"id": case["id"], "groups": groups_of(case, d)}
    if notes:
        row["assumed"] = notes
    if case.get("excluded_from_score"):
        row["excluded"] = str(case["excluded_from_score"])
    meas = case.get("measured") or {}
    convention = meas.get("flops_convention", "full")
    if convention not in FLOP_CONVENTIONS:
        row["error"] = str(ConfigError(f"{case['id']}: measured.flops_convention", convention,
                                       f"must be one of {', '.join(FLOP_CONVENTIONS)}"))
        return row
    try:
        scenario = scenario_from_dict(d)
        rep = run(scenario, allow_oom=True, record_flows=False).report.to_dict()
    except ConfigError as err:
        row["error"] = str(err)
        return row
    flops = rep["model_tflops_per_gpu"] * 1e12 * rep["step_time_s"]
    peak_flops = rep["model_tflops_per_gpu"] * 1e12 / rep["mfu"] if rep["mfu"] else None
    if convention == "causal":  # the source's FLOPs: the same step with the attention term halved
        seq = scenario.training.seq_length
        flops *= model_flops_per_token(scenario.model, seq, causal=True) / model_flops_per_token(scenario.model, seq)
    step, basis = measured_step(case, flops, peak_flops)
    if convention == "causal" and basis in ("tflops_model_flops", "mfu_model_flops"):
        basis += "_causal"
    row["predicted"] = {"step_time_s": rep["step_time_s"], "mfu": rep["mfu"],
                        "model_tflops_per_gpu": rep["model_tflops_per_gpu"]}
    row["measured"] = {"step_time_s": step, "tflops_per_gpu": meas.get("tflops_per_gpu"), "basis": basis}
    if step:
        row["error"] = rep["step_time_s"] / step - 1
        if meas.get("tflops_per_gpu"):
            row["predicted"]["tflops_per_gpu"] = meas["tflops_per_gpu"] * step / rep["step_time_s"]
    return row


# What ``case_to_scenario_dict`` reads from every case (the rest has defaults or is optional).
def validate_file(path: str, workers: int | None = None, progress=None) -> dict:
    """Predict every case of a public-runs file. ``progress`` (a stream, a ``progress.Progress`` or
    None) hears each case finish. A case whose worker process died is a row with ``worker_died``
    (how it ended) and that as its ``error``, and the other cases go on: ``died`` lists them."""
    workers = check_local_workers(workers)
    cases = load_cases(path)
    bar = as_progress(progress, "validate")
    bar.phase(f"predicting {len(cases)} published runs", total=len(cases))
    rows = []
    if workers > 1 and len(cases) > 1:
        with process_pool(min(workers, len(cases))) as pool:
            futures = [pool.submit(predict, case) for case in cases]
            for case, fut in zip(cases, futures):
                row = outcome(fut)
                if isinstance(row, Lost):
                    row = {"id": case["id"], "error": f"not predicted: {row.cause}", "worker_died": row.cause}
                    bar.note(f"case {case['id']}: {row['worker_died']}; the other cases go on")
                rows.append(row)
                bar.advance(str(row["id"]))
    else:
        for case in cases:
            rows.append(predict(case))
            bar.advance(str(rows[-1]["id"]))
    predicted = [r for r in rows if isinstance(r.get("error"), float)]
    scored = [r for r in predicted if not r.get("excluded")]
    summary = {"cases": len(rows), "scored": len(scored),
               "mape": _mape(scored),
               "signed_mean": sum(r["error"] for r in scored) / len(scored) if scored else None,
               "excluded": len(predicted) - len(scored),
               "mape_with_excluded": _mape(predicted),
               "signed_mean_with_excluded": sum(r["error"] for r in predicted) / len(predicted) if predicted else None,
               "within_20pct": sum(abs(r["error"]) <= 0.20 for r in scored) / max(1, len(scored)),
               "worst": max((abs(r["error"]) for r in scored), default=None),
               "by_group": {}}
    for key in ("gpu", "precision", "kind", "axes"):
        values = sorted({r["groups"][key] for r in scored})
        summary["by_group"][key] = {v: _mape([r for r in scored if r["groups"][key] == v]) for v in values}
    return {"rows": rows, "summary": summary, "died": [r["id"] for r in rows if r.get("worker_died")]}


def _mape(rows: list[dict]) -> float | None:
    return sum(abs(r["error"]) for r in rows) / len(rows) if rows else None


def format_table(result: dict) -> str:
    w = max([36] + [len(r["id"]) for r in result["rows"]])
    lines = [f"{'case':<{w}} {'measured_s':>10} {'predicted_s':>11} {'error':>8} {'meas_TF':>8} {'pred_TF':>8}"]
    marks = {"tokens_per_s": "t", "tflops_model_flops": "f", "mfu_model_flops": "f"}
    for r in result["rows"]:
        if "predicted" not in r:
            lines.append(f"{r['id']:<{w}} {'':>10} {'':>11} {'n/a':>8}  {r.get('error', '')}")
            continue
        pred = f"{r['predicted']['step_time_s']:>11.2f}"
        if not isinstance(r.get("error"), float):
            lines.append(f"{r['id']:<{w}} {'':>10} {pred} {'':>8}")
            continue
        mt = r["measured"].get("tflops_per_gpu")
        pt = r["predicted"].get("tflops_per_gpu")
        mark = marks.get(r["measured"].get("basis"), " ")
        lines.append(f"{r['id']:<{w}} {r['measured']['step_time_s']:>9.2f}{mark} {pred} "
                     f"{r['error']:>+8.1%} {mt if mt else '':>8} {f'{pt:.1f}' if pt else '':>8}"
                     + ("  (excluded)" if r.get("excluded") else ""))
    for r in result["rows"]:
        for note in r.get("assumed", ()):
            lines.append(f"  assumed for {r['id']}: {note}")
    s = result["summary"]
    lines.append("")
    if not s["scored"]:
        rows = result["rows"]
        failed = sum(isinstance(r.get("error"), str) for r in rows)
        excluded = sum(bool(r.get("excluded")) and not isinstance(r.get("error"), str) for r in rows)
        unmeasured = len(rows) - failed - excluded
        if not failed and not excluded:
            lines.append(f"nothing to score: no case has a measured step time, tokens/s, TFLOP/s or MFU "
                         f"({unmeasured} predicted)")
        else:
            why = [f"{n} {what}" for n, what in ((failed, "could not be simulated"), (excluded, "excluded from the score"),
                                                 (unmeasured, "without a measured step time, tokens/s, TFLOP/s or MFU"))
                   if n]
            lines.append(f"nothing to score: {'; '.join(why)}")
        return "\n".join(lines)
    lines.append(f"MAPE {s['mape']:.1%} over {s['scored']} cases; within 20%: {s['within_20pct']:.0%}; "
                 f"worst {s['worst']:.1%}; signed mean {s['signed_mean']:+.1%}")
    if s.get("excluded"):
        lines.append(f"  with the {s['excluded']} excluded case(s): MAPE {s['mape_with_excluded']:.1%}, "
                     f"signed mean {s['signed_mean_with_excluded']:+.1%}")
        for r in result["rows"]:
            if r.get("excluded") and isinstance(r.get("error"), float):
                lines.append(f"  excluded {r['id']}: {r['excluded']}")
    if any(r.get("measured", {}).get("basis") in marks for r in result["rows"]):
        lines.append("  measured step marked t: from tokens/s per GPU; f: from TFLOP/s or MFU with stepsim's "
                     "model FLOPs (the source's FLOP convention may differ)")
    for key, groups in s["by_group"].items():
        lines.append(f"  by {key}: " + ", ".join(f"{k} {v:.1%}" for k, v in groups.items()))
    return "\n".join(lines)
