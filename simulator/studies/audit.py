"""Hold a plan's stated claims against a simulation of the plan.

A plan file is a scenario plus a ``claims:`` section mapping claim names (``CLAIMS``) to what the
plan states: a number (the plan says "it is x"), ``{at_most: x}`` ("below x") or
``{at_least: x}`` ("x or more"). Each claim is simulated and judged ``holds`` or ``fails`` with
its tolerance:

- ``step_time_s``, ``tokens_per_s``, ``mfu``: 15% relative. stepsim's step time is within 4.2%
  MAPE of 29 published runs (worst 20%) and within 15% of NVIDIA's out-of-sample FP8 tables
  (worst -14.7%; README, "Accuracy against published runs"); a claim further off than that is
  off by more than the simulator's own error.
- ``memory_gib_per_gpu``: 15% relative. Model states are exact ZeRO arithmetic; activations
  (Korthikanti et al. 2022) and the 2.5 GiB framework margin are estimates of that order.
- ``exposed_comm_fraction``, ``compute_busy_fraction``: 0.05 absolute (5 points of the step):
  both are differences of large times, so a relative tolerance would be too tight near zero.
- ``gpus_used``: exact; a layout uses tp x pp x dp x cp GPUs, no more, no fewer.

The registry ``CLAIMS`` is a dict literal: a new claim is one entry (how to measure it from the
step report, the memory report and the scenario, its tolerance and the one-line reason).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from simulator.common.errors import ConfigError, LeftOut
from simulator.common.units import hide_float_noise
from simulator.scenario.load import read_scenario_file, scenario_from_dict
from simulator.simulation import run
from simulator.scenario.load import scenario_path

RELATIONS = ("at_most", "at_least")
STEP_TOLERANCE = 0.15
MEMORY_TOLERANCE = 0.15
FRACTION_TOLERANCE = 0.05


@dataclass(frozen=True)
class Measured:
    """What a claim is held against: the step report, the memory report, the scenario."""

    report: dict
    memory: dict
    scenario: object


@dataclass(frozen=True)
class ClaimSpec:
    unit: str
    tolerance: float
    relative: bool
    tolerance_why: str
    measure: Callable[[Measured], float]
    explain: Callable[[Measured], str]
    # the values the quantity can take at all (a stated value outside them is bad input, not a claim
    # that fails): "positive", "fraction" (0 to 1), "share" (above 0, at most 1) or "count" (whole, >= 1)
    domain: str = "positive"


_DOMAINS = {"positive": (lambda x: x > 0, "must be above 0"),
            "fraction": (lambda x: 0 <= x <= 1, "must be a fraction from 0 to 1"),
            "share": (lambda x: 0 < x <= 1, "must be above 0 and at most 1 (a fraction of the peak)"),
            "count": (lambda x: x >= 1 and x == int(x), "must be a whole number >= 1")}


def _exposed(m: Measured) -> float:
    return sum(m.report["time_breakdown_s"]["exposed_comm_s"].values())


def _explain_memory(m: Measured) -> str:
    st = max(m.memory["stages"], key=lambda r: r["total_gib"])
    return (f"peak on stage {st['stage']}: weights {st['weights_gib']:.2f} + gradients {st['gradients_gib']:.2f} + "
            f"optimizer {st['optimizer_gib']:.2f} + activations {st['activations_gib']:.2f} + buffers and runtime "
            f"{st['other_gib']:.2f} GiB")


def _explain_mfu(m: Measured) -> str:
    r = m.report
    return (f"{r['model_tflops_per_gpu']:.1f} model TFLOP/s per GPU (6N + 12Lhs per token) over the GPU's dense peak; "
            f"compute kernels fill {r['time_breakdown_s']['compute_s'] / r['step_time_s']:.0%} of the step")


def _explain_tokens(m: Measured) -> str:
    r = m.report
    return f"{r['tokens_per_step']:,} tokens per step / {r['step_time_s']:.4g} s per step"


def _explain_step(m: Measured) -> str:
    b = m.report["time_breakdown_s"]
    return (f"compute {b['compute_s']:.4g} s + exposed communication {_exposed(m):.4g} s + idle {b['idle_s']:.4g} s "
            "(mean GPU; forward, backward and optimizer step)")


def _explain_comm(m: Measured) -> str:
    parts = sorted(((t, a) for a, t in m.report["time_breakdown_s"]["exposed_comm_s"].items() if t > 0), reverse=True)
    detail = ", ".join(f"{a} {t:.4g} s" for t, a in parts) or "none"
    return f"exposed communication {_exposed(m):.4g} s of a {m.report['step_time_s']:.4g} s step ({detail})"


def _explain_gpus(m: Measured) -> str:
    lay = m.report["layout"]
    return f"tp x pp x dp x cp = {lay['tp']} x {lay['pp']} x {lay['dp']} x {lay['cp']}"


def _explain_busy(m: Measured) -> str:
    b = m.report["time_breakdown_s"]
    return f"kernels run {b['compute_s']:.4g} s of the {m.report['step_time_s']:.4g} s step on the mean GPU"


_STEP_WHY = "stepsim's step-time error on published runs: 4.2% MAPE, worst 20% in sample, 14.7% out of sample"
_FRACTION_WHY = "a difference of large times: 5 points of the step"

CLAIMS: dict[str, ClaimSpec] = {
    "memory_gib_per_gpu": ClaimSpec("GiB", MEMORY_TOLERANCE, True,
                                    "activations and the framework margin are estimates of that order",
                                    lambda m: m.memory["peak_gib"], _explain_memory),
    "mfu": ClaimSpec("", STEP_TOLERANCE, True, _STEP_WHY, lambda m: m.report["mfu"], _explain_mfu, "share"),
    "tokens_per_s": ClaimSpec("tokens/s", STEP_TOLERANCE, True, _STEP_WHY, lambda m: m.report["tokens_per_s"],
                              _explain_tokens),
    "step_time_s": ClaimSpec("s", STEP_TOLERANCE, True, _STEP_WHY, lambda m: m.report["step_time_s"], _explain_step),
    "exposed_comm_fraction": ClaimSpec("", FRACTION_TOLERANCE, False, _FRACTION_WHY,
                                       lambda m: _exposed(m) / m.report["step_time_s"], _explain_comm, "fraction"),
    "gpus_used": ClaimSpec("GPUs", 0.0, False, "a layout uses exactly tp x pp x dp x cp GPUs",
                           lambda m: float(m.report["num_gpus"]), _explain_gpus, "count"),
    "compute_busy_fraction": ClaimSpec("", FRACTION_TOLERANCE, False, _FRACTION_WHY,
                                       lambda m: m.report["time_breakdown_s"]["compute_s"] / m.report["step_time_s"],
                                       _explain_busy, "fraction"),
}


def _number(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(field, value, "must be a finite number, or {at_most: x} / {at_least: x}")
    return float(value)


def parse_claims(raw: dict) -> list[tuple[str, str, float]]:
    """(name, relation, stated) per claim, in file order; relation is ``equals``, ``at_most`` or ``at_least``."""
    claims = raw.get("claims")
    valid = ", ".join(CLAIMS)
    if claims is None:
        raise ConfigError("claims", LeftOut(), f"required: a mapping of claim to stated value; valid claims: {valid}")
    if not isinstance(claims, dict) or not claims:
        raise ConfigError("claims", claims, f"must be a non-empty mapping of claim to stated value; valid claims: {valid}")
    out = []
    for name, value in claims.items():
        if name not in CLAIMS:
            raise ConfigError(f"claims.{name}", value, f"unknown claim; valid: {valid}")
        if isinstance(value, dict):
            if len(value) != 1 or next(iter(value)) not in RELATIONS:
                raise ConfigError(f"claims.{name}", value, "expected a number, {at_most: x} or {at_least: x}")
            relation, stated = next(iter(value.items()))
            field = f"claims.{name}.{relation}"
        else:
            relation, stated, field = "equals", value, f"claims.{name}"
        number = _number(field, stated)
        within, why = _DOMAINS[CLAIMS[name].domain]
        if not within(number):
            raise ConfigError(field, stated, why)
        out.append((name, relation, number))
    return out


def judge(name: str, relation: str, stated: float, simulated: float) -> tuple[bool, str]:
    """(holds, the tolerance as words) for one claim."""
    spec = CLAIMS[name]
    tol = spec.tolerance
    slack = tol * abs(stated) if spec.relative else tol
    words = (f"{tol:.0%}" if spec.relative else f"{tol:g}") if tol else "exact"
    if relation == "at_most":
        return simulated <= stated + slack, f"at most {stated:.4g} + {words}"
    if relation == "at_least":
        return simulated >= stated - slack, f"at least {stated:.4g} - {words}"
    if not tol:
        return simulated == stated, f"exactly {stated:.4g}"
    return abs(simulated - stated) <= slack, f"{stated:.4g} +- {words}"


def audit(path: str | Path, sets=()) -> dict:
    """Simulate the plan file and judge every claim. JSON: ``claims`` (name, stated, simulated, verdict,
    why), ``tolerances`` per claim, ``name``, ``layout``, counts of ``holds`` and ``fails``."""
    p = scenario_path(path)
    raw = read_scenario_file(p)
    claims = parse_claims(raw)
    r = run(scenario_from_dict(raw, sets, base_dir=p.parent, default_name=p.stem), allow_oom=True,
            record_flows=False)
    s, warnings, mem, report = r.scenario, list(r.warnings), r.memory.to_dict(), r.report.to_dict()
    measured = Measured(report, mem, s)
    rows = []
    for name, relation, stated in claims:
        spec = CLAIMS[name]
        simulated = spec.measure(measured)
        holds, rule = judge(name, relation, stated, simulated)
        ratio = f"; simulated / stated = {simulated / stated:.3g}" if stated else ""
        rows.append({"name": name, "stated": stated, "simulated": simulated,
                     "verdict": "holds" if holds else "fails",
                     "why": f"{spec.explain(measured)} (tolerance: {rule}{ratio})"})
    return {
        "name": s.name,
        "claims": rows,
        "relations": {name: relation for name, relation, _ in claims},
        "tolerances": {name: {"tolerance": CLAIMS[name].tolerance, "relative": CLAIMS[name].relative,
                              "why": CLAIMS[name].tolerance_why} for name, _, _ in claims},
        "holds": sum(r["verdict"] == "holds" for r in rows),
        "fails": sum(r["verdict"] == "fails" for r in rows),
        "layout": report["layout"],
        "num_gpus": report["num_gpus"],
        "step_time_s": report["step_time_s"],
        "warnings": warnings,
    }


def format_audit(result: dict) -> str:
    lines = [f"{result['name']}: {result['fails']} of {len(result['claims'])} claims fail",
             f"{'claim':<24} {'stated':>14} {'simulated':>14}  verdict  why"]
    for r in result["claims"]:
        rel = {"at_most": "<= ", "at_least": ">= "}.get(result["relations"][r["name"]], "")
        lines.append(f"{r['name']:<24} {rel + format(r['stated'], '.4g'):>14} {r['simulated']:>14.4g}  "
                     f"{r['verdict']:<7}  {hide_float_noise(r['why'])}")
    return "\n".join(lines)
