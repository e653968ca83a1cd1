"""Calibration files: efficiency factors per kernel class, measured from a profile of the user's job.

``stepsim calibrate`` (``simulator.calibrate.calibration``) compares the GPU time a PyTorch profiler
trace spends in each kernel class with the time stepsim's own program for the same ranks spends in
ops of that class, and writes the ratio simulated / measured as the class's factor. A scenario's
``calibration:`` key names such a file; the workload then prices each op of a calibrated class at
its modelled time / factor (``simulator.workload.classes``). This module is the format: what a file
may hold, its checks, and the record a scenario carries.

The file (YAML)::

    version: 1                       # the format; another version is refused
    classes:                         # class -> factor and its evidence (or just the factor)
      gemm: {factor: 0.83, measured_s: 0.0412, simulated_s: 0.0342, kernels: 5184, ops: 4608, share: 0.61}
      attention: 0.91
    gemm_shapes:                     # optional, GEMMs of one shape their own factor
      - {m: 4096, n: 4096, k: 8192, batch: 1, factor: 0.88}
    uncalibrated: {embedding: "the profile has no embedding kernels"}   # optional notes
    unmodelled: {memcpy: "stepsim's program has no memcpy ops"}
    scope: ...                       # optional: what the communication factor covers
    profile: [...], scenario: ..., ranks: [...], device: ..., iterations: 3, coverage: 0.99, covered: 0.93

Classes (the classifier's, ``simulator.calibrate.kineto.CLASSES``, less those stepsim has no ops
for): ``gemm``, ``attention``, ``norm``, ``elementwise``, ``optimizer``, ``loss``, ``embedding`` and
``communication``. A factor outside 1/20 to 20 is refused: a model that far from a measurement is
not mis-calibrated, it describes other work (another model, layout or batch than the profiled run).
A one-node profile measures NVLink collectives only, so the ``communication`` factor scales the
NVLink links' rate (``engine.inputs.scenario_cluster``): collectives inside a node take their
bandwidth time / factor; the NICs and the fabric keep their modelled rates.

Everything is a frozen dataclass of tuples, so a Scenario holding a calibration still hashes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from simulator.common.errors import ConfigError
from simulator.common.schema import Between, Number, Text, Whole, check_section, key, section_schema
from simulator.common.yamlfile import load_yaml_file

FIELD = "calibration"
VERSION = 1
# the kernel classes a factor may be given for, in the order files and reports list them
COMPUTE_CLASSES = ("gemm", "attention", "norm", "elementwise", "optimizer", "loss", "embedding")
COMMUNICATION = "communication"
CLASSES = (*COMPUTE_CLASSES, COMMUNICATION)
MIN_FACTOR, MAX_FACTOR = 0.05, 20.0
FACTOR_RULE = (f"must be a number from {MIN_FACTOR:g} to {MAX_FACTOR:g} (simulated / measured time; further out, "
               "the profile and the scenario do not run the same work)")
COMMUNICATION_SCOPE = ("intra-node (NVLink) collectives only: the factor scales the NVLink links' rate; the NICs "
                       "and the fabric between nodes keep their modelled rates")

_FACTOR = Between(MIN_FACTOR, MAX_FACTOR, FACTOR_RULE)
_SECONDS = Number(0, True)
_COUNT = Whole(0, optional=True)
_NOTE = Text(optional=True)


@dataclass(frozen=True)
class ClassFactor:
    """One entry of ``classes:``: the factor and the evidence it was measured from."""

    factor: float = key(kind=_FACTOR,
                        help="simulated / measured time: each op of the class takes its modelled time / factor")
    measured_s: float | None = key(None, _SECONDS, unit="s",
                                   help="measured kernel time per iteration, summed over the profiled ranks")
    simulated_s: float | None = key(None, _SECONDS, help="stepsim's time of the same ranks' ops of the class", unit="s")
    kernels: int | None = key(None, _COUNT, help="measured kernels per iteration, over the profiled ranks")
    ops: int | None = key(None, _COUNT, help="stepsim ops per iteration, over the profiled ranks")
    share: float | None = key(None, Number(0, True), help="measured time over the ranks' GPU-busy time")
    factor_min: float | None = key(None, Number(0, False), help="lowest factor of one profiled rank")
    factor_max: float | None = key(None, Number(0, False), help="highest factor of one profiled rank")


@dataclass(frozen=True)
class ShapeFactor:
    """GEMMs of one shape: output m x n (either way round: a weight gradient is the transposed
    product), reduction k, ``batch`` products per launch; their own factor."""

    m: int = key(kind=Whole(1), help="output rows (the smaller output dimension)")
    n: int = key(kind=Whole(1), help="output columns (the larger output dimension)")
    k: int = key(kind=Whole(1), help="reduction dimension")
    factor: float = key(kind=_FACTOR, help="simulated / measured time of these GEMMs")
    batch: int = key(1, Whole(1), help="products per launch (batched GEMM)")
    measured_s: float | None = key(None, _SECONDS, help="measured time per iteration", unit="s")
    simulated_s: float | None = key(None, _SECONDS, help="stepsim's time per iteration", unit="s")
    kernels: int | None = key(None, _COUNT, help="measured kernels per iteration")
    ops: int | None = key(None, _COUNT, help="stepsim ops per iteration")
    stepsim_ops: str | None = key(None, _NOTE, help="the stepsim ops of this shape")

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return self.m, self.n, self.k, self.batch


@dataclass(frozen=True)
class Calibration:
    """A checked calibration file. ``path`` is the file it was read from (None: given inline); it
    is not part of the data, so a scenario written out and read back is the same."""

    classes: tuple[tuple[str, ClassFactor], ...]
    gemm_shapes: tuple[ShapeFactor, ...] = ()
    uncalibrated: tuple[tuple[str, str], ...] = ()
    unmodelled: tuple[tuple[str, str], ...] = ()
    scope: str | None = None
    profile: tuple[str, ...] = ()
    scenario: str | None = None
    ranks: tuple[int, ...] = ()
    device: str | None = None
    iterations: int | None = None
    coverage: float | None = None
    covered: float | None = None
    written_by: str | None = None
    path: str | None = field(default=None, compare=False)

    def factor(self, cls: str) -> float | None:
        """The factor of class ``cls``, None when it is not calibrated."""
        return next((c.factor for name, c in self.classes if name == cls), None)

    @property
    def factors(self) -> dict[str, float]:
        return {name: c.factor for name, c in self.classes}

    @property
    def shape_factors(self) -> dict[tuple[int, int, int, int], float]:
        return {s.shape: s.factor for s in self.gemm_shapes}

    def to_dict(self) -> dict:
        """The file's mapping (what ``read_calibration`` reads back to an equal record)."""
        out: dict = {"version": VERSION}
        out["classes"] = {name: _plain(c) for name, c in self.classes}
        if self.gemm_shapes:
            out["gemm_shapes"] = [_plain(s) for s in self.gemm_shapes]
        for name in ("uncalibrated", "unmodelled"):
            if getattr(self, name):
                out[name] = dict(getattr(self, name))
        for name in ("scope", "scenario", "device", "iterations", "coverage", "covered", "written_by"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.profile:
            out["profile"] = list(self.profile)
        if self.ranks:
            out["ranks"] = list(self.ranks)
        return out


TOP_KEYS = ("version", "classes", "gemm_shapes", "uncalibrated", "unmodelled", "scope", "profile", "scenario",
            "ranks", "device", "iterations", "coverage", "covered", "written_by")


def _plain(record) -> dict:
    return {f.name: getattr(record, f.name) for f in fields(record) if getattr(record, f.name) is not None}


def read_calibration(value: object, base: Path | None = None, field: str = FIELD) -> Calibration:
    """A checked :class:`Calibration` from a file path (relative to ``base``) or a parsed mapping;
    anything else, or a bad entry, is a one-line ConfigError naming the key."""
    if isinstance(value, Calibration):
        return value
    path = None
    if isinstance(value, (str, Path)):
        if not str(value).strip():
            raise ConfigError(field, value, "must be the path of a calibration file (stepsim calibrate --out)")
        p = Path(value)
        if not p.is_absolute() and base is not None:
            p = base / p
        if p.is_dir():
            raise ConfigError(field, str(p), "is a folder; give the calibration file stepsim calibrate wrote")
        value = load_yaml_file(p, field)
        path = str(p)
        if not isinstance(value, dict):
            raise ConfigError(field, path, "must be a YAML mapping (a file written by stepsim calibrate)")
    if not isinstance(value, dict):
        raise ConfigError(field, value, "must be the path of a calibration file (stepsim calibrate --out), "
                                        "a mapping of its keys, or null")
    for name in value:
        if name not in TOP_KEYS:
            raise ConfigError(f"{field}.{name}", value[name], f"unknown key; valid: {', '.join(TOP_KEYS)}")
    version = value.get("version")
    if version != VERSION or isinstance(version, bool):
        raise ConfigError(f"{field}.version", version,
                          f"this stepsim reads calibration files of version {VERSION}; rerun stepsim calibrate")
    raw = value.get("classes")
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{field}.classes", raw, f"must be a mapping of at least one class to its factor; "
                                                  f"classes: {', '.join(CLASSES)}")
    classes = []
    for name, entry in raw.items():
        where = f"{field}.classes.{name}"
        if name not in CLASSES:
            raise ConfigError(where, entry, f"unknown class; valid: {', '.join(CLASSES)}")
        if isinstance(entry, dict):
            classes.append((name, check_section(where, entry, ClassFactor)))
        else:
            classes.append((name, ClassFactor(factor=_FACTOR.check(where, entry))))
    classes.sort(key=lambda c: CLASSES.index(c[0]))
    shapes = value.get("gemm_shapes") or []
    if not isinstance(shapes, list):
        raise ConfigError(f"{field}.gemm_shapes", shapes, "must be a list of {m, n, k, batch, factor} entries")
    checked = []
    for i, entry in enumerate(shapes):
        where = f"{field}.gemm_shapes[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(where, entry, "must be a mapping of m, n, k, batch and factor")
        s = check_section(where, entry, ShapeFactor)
        if s.m > s.n:
            s = ShapeFactor(**{**_plain(s), "m": s.n, "n": s.m})
        checked.append(s)
    if len({s.shape for s in checked}) != len(checked):
        raise ConfigError(f"{field}.gemm_shapes", len(checked), "lists a shape twice; give each shape once")
    notes = {}
    for name in ("uncalibrated", "unmodelled"):
        raw_notes = value.get(name) or {}
        if not isinstance(raw_notes, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                      for k, v in raw_notes.items()):
            raise ConfigError(f"{field}.{name}", raw_notes, "must be a mapping of class to a note")
        notes[name] = tuple(sorted(raw_notes.items()))
    profile = value.get("profile") or []
    if isinstance(profile, str):
        profile = [profile]
    if not isinstance(profile, list) or not all(isinstance(p, str) for p in profile):
        raise ConfigError(f"{field}.profile", profile, "must be the list of profile files read")
    ranks = value.get("ranks") or []
    if not isinstance(ranks, list) or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks):
        raise ConfigError(f"{field}.ranks", ranks, "must be the list of profiled ranks")
    iterations = value.get("iterations")
    fraction = Between(0.0, 1.0, "must be a fraction from 0 to 1")
    coverage, covered = value.get("coverage"), value.get("covered")
    return Calibration(
        classes=tuple(classes), gemm_shapes=tuple(sorted(checked, key=lambda s: s.shape)),
        uncalibrated=notes["uncalibrated"], unmodelled=notes["unmodelled"],
        scope=_NOTE.check(f"{field}.scope", value.get("scope")), profile=tuple(profile),
        scenario=_NOTE.check(f"{field}.scenario", value.get("scenario")), ranks=tuple(ranks),
        device=_NOTE.check(f"{field}.device", value.get("device")),
        iterations=None if iterations is None else Whole(1).check(f"{field}.iterations", iterations),
        coverage=None if coverage is None else fraction.check(f"{field}.coverage", coverage),
        covered=None if covered is None else fraction.check(f"{field}.covered", covered),
        written_by=_NOTE.check(f"{field}.written_by", value.get("written_by")),
        path=path)


def calibration_schema() -> dict:
    """The JSON Schema of a calibration file's mapping (inline in a scenario, or the file)."""
    note = {"type": "object", "additionalProperties": {"type": "string"}}
    entry = {"oneOf": [{"type": "number", "minimum": MIN_FACTOR, "maximum": MAX_FACTOR}, section_schema(ClassFactor)]}
    return {
        "type": "object",
        "properties": {
            "version": {"const": VERSION, "description": "the calibration format version"},
            "classes": {"type": "object", "properties": {c: entry for c in CLASSES}, "additionalProperties": False,
                        "minProperties": 1,
                        "description": "kernel class -> factor (simulated / measured) and evidence"},
            "gemm_shapes": {"type": "array", "items": section_schema(ShapeFactor)},
            "uncalibrated": {**note, "description": "classes stepsim models but could not calibrate, and why"},
            "unmodelled": {**note, "description": "classes the profile has and stepsim's program does not"},
            "scope": {"type": "string", "description": "what the communication factor covers"},
            "profile": {"type": "array", "items": {"type": "string"}, "description": "the profile files read"},
            "scenario": {"type": "string", "description": "the scenario of the profiled run"},
            "ranks": {"type": "array", "items": {"type": "integer", "minimum": 0}, "description": "the profiled ranks"},
            "device": {"type": "string", "description": "the GPU the profile ran on"},
            "iterations": {"type": "integer", "minimum": 1, "description": "steady-state iterations measured per rank"},
            "coverage": {"type": "number", "minimum": 0, "maximum": 1,
                         "description": "share of the profile's kernel time the classifier placed in a class"},
            "covered": {"type": "number", "minimum": 0, "maximum": 1,
                        "description": "share of the profile's kernel time in the calibrated classes"},
            "written_by": {"type": "string", "description": "the stepsim that wrote the file"},
        },
        "required": ["version", "classes"],
        "additionalProperties": False,
    }
