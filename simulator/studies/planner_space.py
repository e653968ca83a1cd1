"""The planner's search space: layouts of one model on one cluster, and the rules that prune them.

A :class:`Layout` is one choice of every axis ``stepsim plan`` searches: tp, pp, cp, ep, etp, vp,
micro-batch size, recompute, ZeRO stage, schedule, sequence parallelism and hybrid sharding
(``dp_replicate``: copies of the ZeRO-sharded state, with ZeRO stage 1-3 only); dp is derived from
the GPU count (tp x pp x dp x cp = GPUs). The default space (``default_space``) holds the values
worth trying for the scenario (powers of two up to a node for tp, the GPU count's divisors up to
the layer count for pp, ...) plus the scenario's own values; ``--space key=v1,v2`` replaces an
axis. The space is enumerated canonically, so no two layouts run the same thing: sequence
parallelism only with tp > 1, the interleaved schedule only with vp > 1 (vp 1 is plain 1F1B),
etp only on MoE models and only below tp (etp = tp is the default). When pp x vp does not divide
the layers, the first and last virtual stages take fewer (``cases.pipeline_ends``: equal ends as BLOOM and
Llama 3 405B balanced theirs, else Megatron-core's unequal first/last split as DeepSeek-V3 needs).
A scenario that sets its own first and last stage layers (a published pipeline layout) adds that
split as a second candidate at its own pp and vp, and its own dp_replicate (hybrid sharding, e.g.
FSDP over 128 GPUs in 16 copies) is tried beside 1 on every layout it divides, so the given layout
is one of the candidates.

Whether a layout can run at all is ``scenario.validate_plan``'s verdict and nothing else; its
error, by field and rule, is the reason a layout is pruned. The verdict does not depend on
recompute or the ZeRO stage, so it is computed once per layout without them.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace

import yaml

from simulator.scenario.config import Scenario
from simulator.common.errors import ConfigError
from simulator.common.yamlfile import yaml_value
from simulator.workload.offload import layer_offload_runs, module_offload_runs
from simulator.scenario.load import scenario_from_dict, scenario_to_dict
from simulator.scenario.config import RECOMPUTE, ZERO_STAGES
from simulator.layout.rules import check_zero_stage, validate_plan
from simulator.layout.schedules import SCHEDULES
from simulator.studies.cases import pipeline_ends

AXES = ("tp", "pp", "dp", "cp", "ep", "etp", "vp", "micro_batch_size", "recompute", "zero_stage",
        "schedule", "sequence_parallel", "dp_replicate")
# Schedules searched by default; any schedule in ``schedules.SCHEDULES`` may be asked for with
# --space schedule=..., and new ones (zero-bubble, DualPipe) join the default here.
DEFAULT_SCHEDULES = ("1f1b", "interleaved")
MICRO_BATCH_SIZES = (1, 2, 4)
CP_SIZES = (1, 2, 4, 8)
MAX_VP = 8
_INT_AXES = ("tp", "pp", "dp", "cp", "ep", "vp", "micro_batch_size", "dp_replicate")


@dataclass(frozen=True)
class Layout:
    """One candidate layout. ``etp`` None means the same as tp; first/last follow from pp x vp."""

    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    etp: int | None
    vp: int
    micro_batch_size: int
    recompute: str
    zero_stage: int
    schedule: str
    sequence_parallel: bool
    first_pipeline_num_layers: int | None = None
    last_pipeline_num_layers: int | None = None
    dp_replicate: int = 1  # hybrid sharding: copies of the ZeRO-sharded state (1: one shard group)

    def overrides(self) -> tuple[str, ...]:
        """The ``--set`` overrides that turn the base scenario into this layout."""
        par = {k: getattr(self, k) for k in ("tp", "pp", "dp", "cp", "ep", "etp", "vp", "sequence_parallel",
                                              "zero_stage", "first_pipeline_num_layers", "last_pipeline_num_layers",
                                              "dp_replicate")}
        out = [f"parallelism.{k}={_yaml(v)}" for k, v in par.items()]
        out.append("parallelism.pipeline_layers=null")  # a base scenario's own split fits its own pp x vp only
        out += [f"training.micro_batch_size={self.micro_batch_size}", f"training.recompute={self.recompute}",
                f"schedule={self.schedule}"]
        if self.recompute != "selective":
            # the modules a selective recompute re-runs (a base scenario's recompute_modules) mean
            # nothing without it, and the scenario checks refuse them there
            out.append("training.recompute_modules=null")
        # a base scenario's CPU activation offloading goes where the framework can run it
        # (``offload.check_offload``): layer offloading with pp 1 and no recompute, module
        # offloading without full recompute or a split backward; elsewhere the layout runs without
        if not layer_offload_runs(self.pp, self.recompute):
            out.append("training.activation_offload_layers=0")
        if not module_offload_runs(self.recompute, self.schedule):
            out.append("training.activation_offload_modules=null")
        return tuple(out)

    def label(self) -> str:
        parts = [f"TP{self.tp}", f"PP{self.pp}", f"DP{self.dp}"]
        parts += [f"{k}{v}" for k, v in (("CP", self.cp), ("EP", self.ep), ("VP", self.vp)) if v > 1]
        if self.etp is not None:
            parts.append(f"ETP{self.etp}")
        parts.append(f"mbs{self.micro_batch_size}")
        parts.append(f"Z{self.zero_stage}")
        if self.dp_replicate > 1:
            parts.append(f"HSDP{self.dp_replicate}")  # the sharded state in that many copies
        if self.recompute != "none":
            parts.append(f"rc-{self.recompute}")
        if self.sequence_parallel:
            parts.append("SP")
        if self.schedule not in ("1f1b", "interleaved"):
            parts.append(self.schedule)
        if self.first_pipeline_num_layers or self.last_pipeline_num_layers:
            # an uneven split: layers on the first and last (virtual) stage
            parts.append(f"ends{self.first_pipeline_num_layers or 0}/{self.last_pipeline_num_layers or 0}")
        return " ".join(parts)

    def key(self) -> dict:
        return asdict(self)

    def shape_label(self) -> str:
        """The structural part of ``label`` (what the rule pruner checks): sizes, micro-batch, schedule."""
        parts = [f"TP{self.tp}", f"PP{self.pp}"]
        parts += [f"{k}{v}" for k, v in (("CP", self.cp), ("EP", self.ep), ("VP", self.vp)) if v > 1]
        parts.append(f"mbs{self.micro_batch_size}")
        if self.schedule not in ("1f1b", "interleaved"):
            parts.append(self.schedule)
        return " ".join(parts)


# What each part of a layout label means, for the legend printed under a table of labels.
LABEL_PARTS = (
    (r"\bTP\d", "TPn PPn DPn: tensor-, pipeline- and data-parallel sizes"),
    (r"\bCP\d", "CPn: context-parallel size (the sequence split over n GPUs)"),
    (r"\bEP\d", "EPn: expert-parallel size"),
    (r"\bETP\d", "ETPn: tensor-parallel size inside each expert"),
    (r"\bVP\d", "VPn: n model chunks per GPU (interleaved pipeline)"),
    (r"\bmbs\d", "mbsN: micro-batch size"),
    (r"\bZ\d", "Zn: ZeRO stage n (1: optimizer states sharded, 2: also gradients, 3: also weights)"),
    (r"\bHSDP\d", "HSDPn: hybrid sharding, the sharded state kept in n copies"),
    (r"\brc-", "rc-X: activation recompute X"),
    (r"\bSP\b", "SP: sequence parallelism"),
    (r"\bends\d", "endsA/B: A layers on the first pipeline stage, B on the last (an uneven split)"),
)


def label_legend(labels) -> list[str]:
    """The lines of ``LABEL_PARTS`` that the given layout labels use."""
    text = " ".join(labels)
    return [words for pattern, words in LABEL_PARTS if re.search(pattern, text)]


def _yaml(v: object) -> str:
    return "null" if v is None else yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()


def layout_of(s: Scenario) -> Layout:
    """The layout a scenario runs (its ``parallelism``, micro-batch size, recompute and schedule)."""
    p, t = s.parallelism, s.training
    return Layout(p.tp, p.pp, s.dp, p.cp, p.ep, p.etp, p.vp, t.micro_batch_size, t.recompute, p.zero_stage,
                  s.pipeline_schedule, p.sequence_parallel, p.first_pipeline_num_layers, p.last_pipeline_num_layers,
                  p.dp_replicate)


def apply_layout(s: Scenario, layout: Layout) -> Scenario:
    """``s`` with ``layout``'s values, through the scenario checks (``--set`` overrides)."""
    return scenario_from_dict(scenario_to_dict(s), layout.overrides())


def candidate_scenario(s: Scenario, layout: Layout) -> Scenario:
    """The same scenario as ``apply_layout`` (a test checks it), built with ``dataclasses.replace``:
    the planner builds tens of thousands, and the values it enumerates are well-typed. A dp of 0
    (tp x pp x cp does not divide the GPUs) is left to ``validate_plan`` as dp null."""
    par = replace(s.parallelism, tp=layout.tp, pp=layout.pp, dp=layout.dp or None, cp=layout.cp, ep=layout.ep,
                  etp=layout.etp, vp=layout.vp, sequence_parallel=layout.sequence_parallel,
                  zero_stage=layout.zero_stage, first_pipeline_num_layers=layout.first_pipeline_num_layers,
                  last_pipeline_num_layers=layout.last_pipeline_num_layers, dp_replicate=layout.dp_replicate)
    modules = s.training.recompute_modules if layout.recompute == "selective" else None
    t = s.training
    off_layers = t.activation_offload_layers if layer_offload_runs(layout.pp, layout.recompute) else 0
    off_modules = t.activation_offload_modules if module_offload_runs(layout.recompute, layout.schedule) else None
    training = replace(t, micro_batch_size=layout.micro_batch_size, recompute=layout.recompute,
                       recompute_modules=modules, activation_offload_layers=off_layers,
                       activation_offload_modules=off_modules)
    return replace(s, parallelism=par, training=training, schedule=layout.schedule)


# --- the space ---------------------------------------------------------------------------------

def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _powers_of_two(limit: int) -> list[int]:
    return [2 ** k for k in range(int(math.log2(limit)) + 1)] if limit >= 1 else [1]


def default_space(s: Scenario) -> dict[str, tuple]:
    """Values tried for each axis, the scenario's own included (module docstring)."""
    m, c, p, t = s.model, s.cluster, s.parallelism, s.training
    world, layers = c.num_gpus, m.num_hidden_layers
    tp = set(_powers_of_two(min(c.gpus_per_node, m.num_attention_heads))) | {p.tp}
    pp = {d for d in _divisors(world) if d <= layers} | {p.pp}
    cp = {x for x in CP_SIZES if world % x == 0} | {p.cp}
    if m.is_moe:
        ep = {d for d in _divisors(m.num_experts) if d <= world} | {p.ep}
        etp: set = {None, 1} | {p.etp}
    else:
        ep, etp = {1} | {p.ep}, {None} | {p.etp}
    vp = set(range(1, MAX_VP + 1)) | {d for d in _divisors(layers) if d <= 2 * MAX_VP} | {p.vp}
    return {
        "tp": tuple(sorted(tp)), "pp": tuple(sorted(pp)), "dp": None, "cp": tuple(sorted(cp)),
        "ep": tuple(sorted(ep)), "etp": tuple(sorted(etp, key=lambda x: (x is not None, x or 0))),
        "vp": tuple(sorted(vp)), "micro_batch_size": tuple(sorted(set(MICRO_BATCH_SIZES) | {t.micro_batch_size})),
        "recompute": RECOMPUTE, "zero_stage": ZERO_STAGES,
        "schedule": tuple(dict.fromkeys((*DEFAULT_SCHEDULES, s.pipeline_schedule))),
        "sequence_parallel": (False, True),
        # hybrid sharding of MoE models is not modelled (scenario checks)
        "dp_replicate": (1,) if m.is_moe else tuple(sorted({1, p.dp_replicate})),
    }


def parse_space(items: Sequence[str] | Mapping[str, Sequence], s: Scenario) -> dict[str, tuple]:
    """The default space with ``--space key=v1,v2`` axes replaced; impossible values are ConfigErrors.

    Impossible: an unknown axis, a value of the wrong kind, a group size below 1 or above the GPU
    count (vp above the layer count, a micro-batch above the global batch),
    a recompute mode, ZeRO stage or schedule that does not exist, etp on a dense model, dp_replicate
    above 1 on an MoE model or with ZeRO stage 0 only.
    """
    space = default_space(s)
    pairs = list(items.items()) if isinstance(items, Mapping) else [_split(item) for item in items]
    seen = set()
    world = s.cluster.num_gpus
    for axis, values in pairs:
        if axis not in AXES:
            raise ConfigError("--space", axis, f"unknown axis; valid: {', '.join(AXES)}")
        if axis in seen:
            raise ConfigError("--space", axis, "given twice: list all its values in one --space")
        seen.add(axis)
        out = []
        for v in values:
            if axis in _INT_AXES or axis == "etp":
                if axis == "etp" and v is None:
                    out.append(v)
                    continue
                # sizes of a parallel group are bounded by the GPUs; model chunks per rank by the
                # layers; the micro-batch by the global batch
                top, what = {"vp": (s.model.num_hidden_layers, "the layer count"),
                             "micro_batch_size": (s.training.global_batch_size, "the global batch size")
                             }.get(axis, (world, "the GPU count"))
                if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= top:
                    raise ConfigError(f"--space {axis}", v, f"must be a whole number from 1 to {what} ({top})")
                if axis == "etp" and not s.model.is_moe:
                    raise ConfigError("--space etp", v, "expert tensor parallelism needs an MoE model (num_experts > 0)")
                if axis == "dp_replicate" and v > 1 and s.model.is_moe:
                    raise ConfigError("--space dp_replicate", v, "hybrid sharding of expert weights is not modelled: "
                                      "use 1 for MoE models")
            elif axis == "recompute" and v not in RECOMPUTE:
                raise ConfigError("--space recompute", v, f"valid: {', '.join(RECOMPUTE)}")
            elif axis == "zero_stage" and v not in ZERO_STAGES:
                raise ConfigError("--space zero_stage", v, f"valid: {', '.join(map(str, ZERO_STAGES))}")
            elif axis == "schedule" and v not in SCHEDULES:
                raise ConfigError("--space schedule", v, f"valid: {', '.join(SCHEDULES)}")
            elif axis == "sequence_parallel" and not isinstance(v, bool):
                raise ConfigError("--space sequence_parallel", v, "valid: true, false")
            if v in out:
                raise ConfigError(f"--space {axis}", v, "value given twice")
            out.append(v)
        space[axis] = tuple(out)
    if min(space["dp_replicate"]) > 1 and not any(z > 0 for z in space["zero_stage"]):
        raise ConfigError("--space dp_replicate", ",".join(map(str, space["dp_replicate"])),
                          "hybrid sharding replicates a sharded state: add 1, or a zero_stage of 1, 2 or 3")
    return space


def _split(item: str) -> tuple[str, tuple]:
    key, sep, text = str(item).partition("=")
    if not sep or not key.strip() or not text.strip():
        raise ConfigError("--space", item, "expected axis=v1,v2,..., e.g. tp=4,8")
    values = []
    for part in text.split(","):
        values.append(yaml_value(part.strip(), f"--space {key.strip()}"))
    return key.strip(), tuple(values)


# --- enumeration and the rule pruner -----------------------------------------------------------

@dataclass
class Enumeration:
    """The valid layouts and how many were enumerated and pruned by rule, per reason; ``examples``:
    per reason, the first layout it pruned (in ``layout_order``) and its whole error message."""

    valid: list[Layout]
    enumerated: int
    pruned_rules: Counter
    warnings: dict[Layout, list[str]]
    examples: dict[str, tuple[tuple, str]] = field(default_factory=dict)

    def example(self, reason: str) -> str:
        return self.examples[reason][1] if reason in self.examples else ""


def _note(examples: dict, reason: str, shape: Layout, err: ConfigError) -> None:
    key = layout_order(shape)
    if reason not in examples or key < examples[reason][0]:
        examples[reason] = (key, f"{shape.shape_label()}: {err}")


def _reason(err: ConfigError) -> str:
    """The rule an error names, without the numbers of one layout (so reasons can be counted)."""
    text = re.sub(r"\s*\([^)]*\)", "", err.valid.split(";")[0].split(": ")[0])
    text = re.sub(r"\s*=.*", "", text)
    return f"{err.field}: {re.sub(r'[0-9]+', 'N', text)}"


_LAYOUT_FIELDS = tuple(f.name for f in fields(Layout))


def layout_order(layout: Layout) -> tuple:
    """A total order on layouts (None etp first), for deterministic ties: the fields in
    declaration order (as ``asdict`` lists them, without its deep copies)."""
    return tuple(-1 if v is None else v for v in (getattr(layout, k) for k in _LAYOUT_FIELDS))


def enumerate_layouts(s: Scenario, space: Mapping[str, tuple], part: tuple[int, int] = (0, 1)) -> Enumeration:
    """Every canonical layout of ``space`` (module docstring), checked by ``validate_plan``. With
    ``part = (i, k)`` only every k-th structural shape from the i-th: the k parts, run in parallel
    and put together by ``merge_enumerations``, give the whole enumeration."""
    world, layers = s.cluster.num_gpus, s.model.num_hidden_layers
    valid: list[Layout] = []
    reasons: Counter = Counter()
    warnings: dict = {}
    examples: dict = {}
    enumerated = 0
    structural = itertools.product(space["tp"], space["pp"], space["cp"], space["ep"], space["etp"], space["vp"],
                                   space["schedule"], space["sequence_parallel"], space["micro_batch_size"])
    given = (s.parallelism.pp, s.parallelism.vp)
    given_ends = (s.parallelism.first_pipeline_num_layers, s.parallelism.last_pipeline_num_layers)
    for tp, pp, cp, ep, etp, vp, schedule, sp, mbs in itertools.islice(structural, part[0], None, part[1]):
        if (sp and tp == 1) or (etp is not None and etp >= tp) or (schedule == "interleaved") != (vp > 1):
            continue  # not canonical: the same run as another layout of the space
        dp = world // (tp * pp * cp) if world % (tp * pp * cp) == 0 else None
        if space.get("dp") is not None and dp not in space["dp"]:
            continue
        splits = [pipeline_ends(layers, pp * vp)]
        if (pp, vp) == given and any(given_ends) and given_ends not in splits:
            splits.append(given_ends)
        for first, last in splits:
            enumerated += _enumerate_shape(s, space, Layout(tp, pp, dp or 0, cp, ep, etp, vp, mbs, "none", 0, schedule,
                                                            sp, first, last), dp, valid, reasons, warnings, examples)
    return Enumeration(sorted(valid, key=layout_order), enumerated, reasons, warnings, examples)


def _enumerate_shape(s: Scenario, space: Mapping[str, tuple], shape: Layout, dp: int | None, valid: list,
                     reasons: Counter, warnings: dict, examples: dict) -> int:
    """Check one structural shape (recompute, ZeRO stage and hybrid sharding aside) and add its
    layouts to ``valid`` (or its rule to ``reasons``); returns how many layouts it stands for.
    Hybrid sharding (dp_replicate > 1) pairs only with ZeRO stages 1-3: with stage 0 every DP rank
    is already a replica, the same run as dp_replicate 1."""
    sharded = [z for z in space["zero_stage"] if z > 0]
    counts = {r: len(space["recompute"]) * (len(space["zero_stage"]) if r == 1 else len(sharded))
              for r in space["dp_replicate"]}
    n = sum(counts.values())
    try:
        warns = validate_plan(candidate_scenario(s, shape))
    except ConfigError as err:
        reasons[_reason(err)] += n
        _note(examples, _reason(err), shape, err)
        return n
    for r in space["dp_replicate"]:
        if r > 1 and sharded:
            try:  # does r divide this shape's dp (its rule, one check for every ZeRO stage)
                validate_plan(candidate_scenario(s, replace(shape, dp_replicate=r, zero_stage=sharded[0])))
            except ConfigError as err:
                reasons[_reason(err)] += counts[r]
                _note(examples, _reason(err), replace(shape, dp_replicate=r), err)
                continue
        for rc, zero in itertools.product(space["recompute"], space["zero_stage"] if r == 1 else sharded):
            layout = replace(shape, dp=dp, recompute=rc, zero_stage=zero, dp_replicate=r)
            try:  # the one rule that reads the ZeRO stage (validate_plan's own check)
                check_zero_stage(s.framework, shape.pp, zero)
            except ConfigError as err:
                reasons[_reason(err)] += 1
                _note(examples, _reason(err), layout, err)
                continue
            valid.append(layout)
            if warns:
                warnings[layout] = warns
    return n


def merge_enumerations(parts: list[Enumeration]) -> Enumeration:
    """The enumeration of the whole space from those of its parts (``enumerate_layouts``' ``part``)."""
    examples: dict = {}
    for e in parts:
        for reason, (key, text) in e.examples.items():
            if reason not in examples or key < examples[reason][0]:
                examples[reason] = (key, text)
    return Enumeration(sorted((x for e in parts for x in e.valid), key=layout_order),
                       sum(e.enumerated for e in parts), sum((e.pruned_rules for e in parts), Counter()),
                       {k: v for e in parts for k, v in e.warnings.items()}, examples)
