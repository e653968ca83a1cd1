"""The one schema of stepsim's input formats: each key is declared once, on its dataclass field.

A field is declared with :func:`key`, which carries its default, its kind (:class:`Whole`,
:class:`Number`, :class:`Between`, :class:`Choice`, :class:`Flag`, :class:`Text`, :class:`Names`
and a few special kinds), a one-line help text and its unit. Everything else is derived from that
declaration: the check of a value read from YAML or ``--set`` (a one-line ``ConfigError`` naming the
dotted field, the value and what is valid), the JSON Schema of the format (``stepsim schema``) and
the scenario reference (``docs/scenario-reference.md``).

Why dataclass field metadata and not pydantic or attrs + cattrs: the scenario is a tree of frozen
dataclasses that the whole simulator passes around and hashes (``dataclasses.replace`` for
what-ifs, LRU caches keyed by sections), the checks are a handful of kinds with messages users
already rely on, and the planner builds thousands of scenarios a second, so a validation layer
that coerces types (pydantic's lax mode turns ``"8"`` into 8), rewords errors or costs a model
instance per section would change behaviour and speed for no gain. The JSON Schema is written from
the same declarations and is itself checked against the 2020-12 meta-schema by the tests.
"""

from __future__ import annotations

import functools

import math
import re
from collections.abc import Callable
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

from simulator.common.errors import ConfigError, LeftOut, key_text
from simulator.common.limits import Limit


@dataclass(frozen=True)
class Kind:
    """What a key accepts. ``check`` returns the value to store or raises ConfigError."""

    def check(self, name: str, value: object) -> object:  # pragma: no cover - every kind overrides it
        raise NotImplementedError

    def json(self) -> dict:  # pragma: no cover
        raise NotImplementedError

    def describe(self) -> str:  # pragma: no cover
        raise NotImplementedError


def _nullable(schema: dict, optional: bool) -> dict:
    if not optional:
        return schema
    if "enum" in schema:
        return {**schema, "enum": [*schema["enum"], None]}
    kind = schema["type"]
    return {**schema, "type": [*(kind if isinstance(kind, list) else [kind]), "null"]}


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Whole(Kind):
    """A whole number >= ``minimum`` (and within ``limit``); null too when ``optional``."""

    minimum: int = 1
    limit: Limit | None = None
    optional: bool = False

    def check(self, name: str, value: object) -> int | None:
        if value is None and self.optional:
            return None
        return whole(name, value, self.minimum, self.limit)

    def json(self) -> dict:
        out: dict = {"type": "integer", "minimum": self.minimum}
        if self.limit is not None:
            out["maximum"] = self.limit.maximum
        return _nullable(out, self.optional)

    def describe(self) -> str:
        top = f" to {self.limit.maximum:,}" if self.limit is not None else ""
        return f"whole number {self.minimum}{top}" if top else f"whole number >= {self.minimum}"


def whole(name: str, value: object, minimum: int, limit: Limit | None = None) -> int:
    """A whole number >= ``minimum`` (and within ``limit``), or a one-line ConfigError."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(name, value, f"must be a whole number >= {minimum}")
    if limit is not None and value > limit.maximum:
        raise ConfigError(name, value, f"must be a whole number >= {minimum} and {limit.describe()}")
    return value


def optional_whole(name: str, value: object, minimum: int, limit: Limit | None = None) -> int | None:
    """``whole``, or None for null."""
    return None if value is None else whole(name, value, minimum, limit)


@dataclass(frozen=True)
class Number(Kind):
    """A finite number above ``minimum`` (at it too when ``inclusive``), within ``limit``, or null.
    ``required`` (a message) refuses null."""

    minimum: float = 0.0
    inclusive: bool = False
    limit: Limit | None = None
    required: str | None = None

    def check(self, name: str, value: object) -> float | None:
        if value is None:
            if self.required:
                raise ConfigError(name, value, self.required)
            return None
        ok = is_number(value)
        null = "" if self.required else " or null"  # a required number does not take null
        if not ok or value < self.minimum or (value == self.minimum and not self.inclusive):
            bound = f">= {self.minimum:g}" if self.inclusive else f"> {self.minimum:g}"
            raise ConfigError(name, value, f"must be a number {bound}{null}")
        if self.limit is not None and value > self.limit.maximum:
            raise ConfigError(name, value, f"must be {self.limit.describe()}{',' if null else ''}{null}")
        return float(value) if self.required else value

    def json(self) -> dict:
        out: dict = {"type": "number", ("minimum" if self.inclusive else "exclusiveMinimum"): self.minimum}
        if self.limit is not None:
            out["maximum"] = self.limit.maximum
        return _nullable(out, not self.required)

    def describe(self) -> str:
        bound = f">= {self.minimum:g}" if self.inclusive else f"> {self.minimum:g}"
        top = f", at most {self.limit.maximum:,}" if self.limit is not None else ""
        return f"number {bound}{top}" + ("" if self.required else ", or null")


@dataclass(frozen=True)
class Between(Kind):
    """A number from ``low`` to ``high`` inclusive; ``what`` is the message when it is not."""

    low: float
    high: float
    what: str

    def check(self, name: str, value: object) -> float:
        if not is_number(value) or not self.low <= value <= self.high:
            raise ConfigError(name, value, self.what)
        return float(value)

    def json(self) -> dict:
        out: dict = {"type": "number", "minimum": self.low}
        if math.isfinite(self.high):
            out["maximum"] = self.high
        return out

    def describe(self) -> str:
        return f"number {self.low:g} to {self.high:g}" if math.isfinite(self.high) else f"number >= {self.low:g}"


@dataclass(frozen=True)
class Choice(Kind):
    """One of ``choices`` (compared with its type: ``1`` is not ``true``); null too when ``optional``."""

    choices: tuple
    optional: bool = False

    def check(self, name: str, value: object) -> object:
        if value is None and self.optional:
            return None
        if not any(type(value) is type(c) and value == c for c in self.choices):
            raise ConfigError(name, value, f"valid: {', '.join(str(c) for c in self.choices)}")
        return value

    def json(self) -> dict:
        return _nullable({"enum": list(self.choices)}, self.optional)

    def describe(self) -> str:
        return "one of " + ", ".join(f"`{c}`" for c in self.choices) + (", or null" if self.optional else "")


@dataclass(frozen=True)
class Flag(Kind):
    """true or false; null too when ``optional`` (null: the framework profile's default)."""

    optional: bool = False

    def check(self, name: str, value: object) -> bool | None:
        if value is None and self.optional:
            return None
        if not isinstance(value, bool):
            raise ConfigError(name, value, "must be true or false")
        return value

    def json(self) -> dict:
        return _nullable({"type": "boolean"}, self.optional)

    def describe(self) -> str:
        return "true or false" + (", or null" if self.optional else "")


_CONTROL_FREE = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"  # JSON Schema (ECMA 262) spelling of the check below
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class Text(Kind):
    """A non-empty string without control characters (names and paths: a newline or an escape
    sequence in one would break or recolour the lines of a report); null too when ``optional``."""

    optional: bool = False

    def check(self, name: str, value: object) -> str | None:
        if value is None and self.optional:
            return None
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(name, value, "must be a non-empty string")
        if _CONTROL.search(value):
            raise ConfigError(name, value, "must be text without control characters (a newline, tab or escape)")
        return value

    def json(self) -> dict:
        return _nullable({"type": "string", "minLength": 1, "pattern": _CONTROL_FREE}, self.optional)

    def describe(self) -> str:
        return "text" + (", or null" if self.optional else "")


@dataclass(frozen=True)
class Names(Kind):
    """A non-empty list of names from ``valid``, duplicates dropped, or null. ``rule(name, names)``
    checks what the names must be together."""

    valid: tuple[str, ...]
    rule: Callable[[str, tuple[str, ...]], None] | None = None

    def check(self, name: str, value: object) -> tuple[str, ...] | None:
        if value is None:
            return None
        if (not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, str) for v in value)
                or any(v not in self.valid for v in value)):
            raise ConfigError(name, value, f"must be a non-empty list of {', '.join(self.valid)}")
        names = tuple(dict.fromkeys(value))
        if self.rule is not None:
            self.rule(name, names)
        return names

    def json(self) -> dict:
        return {"type": ["array", "null"], "items": {"enum": list(self.valid)}, "minItems": 1}

    def describe(self) -> str:
        return "list of " + ", ".join(f"`{v}`" for v in self.valid) + ", or null"


@dataclass(frozen=True)
class PerLayer(Kind):
    """One name from ``valid`` per layer (its length is checked against the layer count later)."""

    valid: tuple[str, ...]

    def check(self, name: str, value: object) -> tuple[str, ...] | None:
        if value is None:
            return None
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ConfigError(name, value, f"must be a list of {' or '.join(self.valid)}, one per layer")
        for v in value:
            if v not in self.valid:
                raise ConfigError(name, v, f"valid layer types: {', '.join(self.valid)}")
        return tuple(value)

    def json(self) -> dict:
        return {"type": ["array", "null"], "items": {"enum": list(self.valid)}}

    def describe(self) -> str:
        return "list, one of " + ", ".join(f"`{v}`" for v in self.valid) + " per layer, or null"


@dataclass(frozen=True)
class Counts(Kind):
    """A list of whole numbers >= ``minimum``, each within ``limit``, at most ``length`` of them
    (their count is checked against the layout later), or null."""

    minimum: int = 0
    limit: Limit | None = None
    length: Limit | None = None

    def check(self, name: str, value: object) -> tuple[int, ...] | None:
        if value is None:
            return None
        if not isinstance(value, (list, tuple)) or not value:
            raise ConfigError(name, value, f"must be a list of whole numbers >= {self.minimum}, or null")
        if self.length is not None and len(value) > self.length.maximum:
            raise ConfigError(name, f"{len(value):,} entries", f"at most {self.length.maximum:,} entries")
        return tuple(whole(f"{name}[{i}]", v, self.minimum, self.limit) for i, v in enumerate(value))

    def json(self) -> dict:
        item: dict = {"type": "integer", "minimum": self.minimum}
        if self.limit is not None:
            item["maximum"] = self.limit.maximum
        out: dict = {"type": ["array", "null"], "items": item, "minItems": 1}
        if self.length is not None:
            out["maxItems"] = self.length.maximum
        return out

    def describe(self) -> str:
        return f"list of whole numbers >= {self.minimum}, or null"


@dataclass(frozen=True)
class PerName(Kind):
    """A mapping from names of ``valid`` to numbers above ``minimum`` (``peak_tflops: {bf16: 989}``),
    stored as a sorted tuple of pairs so the record hashes; ``required`` names must be present."""

    valid: tuple[str, ...]
    minimum: float = 0.0
    required: tuple[str, ...] = ()
    limit: Limit | None = None

    def check(self, name: str, value: object) -> tuple[tuple[str, float], ...]:
        if not isinstance(value, dict) or not value:
            raise ConfigError(name, value, f"must be a mapping of {', '.join(self.valid)} to numbers")
        for k, v in value.items():
            if k not in self.valid:
                raise ConfigError(f"{name}.{k}", v, f"unknown key; valid: {', '.join(self.valid)}")
            if not is_number(v) or v <= self.minimum or (self.limit is not None and v > self.limit.maximum):
                top = f" and {self.limit.describe()}" if self.limit is not None else ""
                raise ConfigError(f"{name}.{k}", v, f"must be a number > {self.minimum:g}{top}")
        for k in self.required:
            if k not in value:
                raise ConfigError(f"{name}.{k}", LeftOut(), "required")
        return tuple(sorted((k, float(v)) for k, v in value.items()))

    def json(self) -> dict:
        item: dict = {"type": "number", "exclusiveMinimum": self.minimum}
        if self.limit is not None:
            item["maximum"] = self.limit.maximum
        return {"type": "object", "properties": {k: item for k in self.valid}, "additionalProperties": False,
                "required": list(self.required), "minProperties": 1}

    def describe(self) -> str:
        return "mapping of " + ", ".join(f"`{v}`" for v in self.valid) + " to numbers" + (
            f" (`{'`, `'.join(self.required)}` required)" if self.required else "")


@dataclass(frozen=True)
class Key:
    """The declaration of one scenario key (``field.metadata["key"]``). ``default_text`` names a
    default that is not a constant (``the topology's``)."""

    kind: Kind
    help: str
    unit: str = ""
    default_text: str = ""


def key(default: Any = MISSING, kind: Kind | None = None, *, help: str, unit: str = "", default_text: str = "") -> Any:
    """A dataclass field that is a scenario key: its default, kind, one line of help, its unit."""
    meta = {"key": Key(kind, help, unit, default_text)}
    if default is MISSING:
        return field(metadata=meta)
    return field(default=default, metadata=meta)


def keys_of(cls: type) -> dict[str, Key]:
    """The declared keys of a section dataclass, in declaration order (a new dict each call)."""
    return dict(_declared(cls))


@functools.lru_cache(maxsize=None)
def _declared(cls: type) -> tuple[tuple[str, Key], ...]:
    """``keys_of`` read once per class: a section's fields are fixed when its class is made, and
    the planner checks thousands of layouts, each a scenario built section by section."""
    return tuple((f.name, f.metadata["key"]) for f in fields(cls) if "key" in f.metadata)


def default_of(f: Field) -> object:
    """The default a field takes when the key is left out (MISSING: required)."""
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def check_section(section: str, raw: dict, cls: type):
    """Build ``cls`` from a section mapping: unknown keys refused, each key checked, required keys
    present; the first bad key is a one-line ConfigError named ``section.key``."""
    declared = keys_of(cls)
    for name in raw:
        if name not in declared:
            raise ConfigError(f"{section}.{key_text(name)}", raw[name],
                              f"unknown key; valid: {', '.join(sorted(declared))}")
    values = {}
    for f in fields(cls):
        if f.name in raw:
            values[f.name] = declared[f.name].kind.check(f"{section}.{f.name}", raw[f.name])
        elif f.default is MISSING and f.default_factory is MISSING:
            raise ConfigError(f"{section}.{f.name}", LeftOut(), "required")
    return cls(**values)


def section_schema(cls: type, extra: dict | None = None) -> dict:
    """The JSON Schema of one section: every declared key with its kind, default and help."""
    props = {}
    required = []
    for f in fields(cls):
        if "key" not in f.metadata:
            continue
        decl: Key = f.metadata["key"]
        prop = dict(decl.kind.json()) if decl.kind is not None else {}
        prop["description"] = decl.help + (f" ({decl.unit})" if decl.unit else "")
        default = default_of(f)
        if decl.default_text:
            prop["description"] += f"; default: {decl.default_text}"
        elif default is MISSING:
            required.append(f.name)
        else:
            prop["default"] = list(default) if isinstance(default, tuple) else default
        props[f.name] = prop
    out: dict = {"type": "object", "properties": {**props, **(extra or {})}, "additionalProperties": False}
    if required:
        out["required"] = required
    return out
