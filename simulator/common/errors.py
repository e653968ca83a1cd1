"""The errors users see: a bad value in a scenario, topology or command line (``ConfigError``), and
a worker process that died under a study (``WorkerDied``)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class LeftOut:
    """The value of a key or flag the user did not give. A message never shows such a value as if
    it had been written ("got 1"): it says the key was left out and what applied instead, the
    ``default`` (``source`` names a default that is not a constant, "the topology's"), or nothing
    when there is none (a required key)."""

    default: object = None
    has_default: bool = False
    source: str = "default"

    @classmethod
    def of(cls, default: object, source: str = "default") -> "LeftOut":
        return cls(default, True, source)

    def __str__(self) -> str:
        if not self.has_default:
            return "left out"
        return f"left out ({self.source}: {yaml_text(self.default)})" if self.source != "default" else \
            f"left out (default {yaml_text(self.default)})"

import re
import reprlib


class ConfigError(ValueError):
    """A user-facing input error: one line naming the field, the bad value and what is valid.

    The CLI prints ``str(err)`` and exits with status 2; it never shows a traceback for these.
    A ``LeftOut`` value reads "field: left out (default 1); valid" instead of "field: got ...".
    """

    def __init__(self, field: str, value: object, valid: str):
        self.field = field
        self.value = value
        self.valid = valid
        # one line whatever the user typed: a key or path may hold a newline, shown as \n
        shown = str(value) if isinstance(value, LeftOut) else f"got {yaml_text(value)}"
        super().__init__(_CONTROL.sub(_escaped, f"{field}: {shown}; {valid}"))

    def __reduce__(self):
        # rebuilt from its three parts when it crosses a process boundary (a worker of validate,
        # sweep or plan): the default pickling passes only the message and cannot call __init__
        return (ConfigError, (self.field, self.value, self.valid))


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _escaped(match: re.Match) -> str:
    return repr(match.group())[1:-1]


def yaml_text(value: object) -> str:
    """The bad value as the user wrote it: YAML's null, true and false rather than Python's None,
    True and False (scenarios and ``--set`` values are YAML); anything else by its repr, shortened
    when it is large (a YAML alias can stand for millions of values; a line must stay readable)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if _small(value):
        return repr(value)
    text = _SHORT.repr(value)
    return text if len(text) <= _MAX_SHOWN else f"{text[:_MAX_SHOWN - 5]} ...{text[-1]}"


def key_text(key: object) -> str:
    """A mapping key as the user wrote it, for a field name: ``~`` and ``yes`` are YAML's null and
    true, which Python would print as None and True."""
    return key if isinstance(key, str) else yaml_text(key)


class _ShortRepr(reprlib.Repr):
    """``repr`` with the first items of long containers, strings and numbers, then ``...``."""

    def __init__(self):
        super().__init__()
        self.maxlevel = 3
        self.maxdict = self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = 8
        self.maxstring = self.maxother = 200
        self.maxlong = 60

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > _MAX_INT_BITS:  # repr refuses ints past sys.get_int_max_str_digits()
            return f"<an integer of about {int(x.bit_length() * 0.30103):,} digits>"
        return super().repr_int(x, level)


_SHORT = _ShortRepr()
_MAX_INT_BITS = 3000  # about 900 digits
_MAX_ITEMS = 200  # values and keys in a value shown whole
_MAX_TEXT = 500  # characters of one string shown whole
_MAX_SHOWN = 300  # characters of a shortened value


def _small(value: object) -> bool:
    """Whether ``repr(value)`` is short enough to show whole; visits at most _MAX_ITEMS items."""
    stack, seen = [value], 0
    while stack:
        v = stack.pop()
        seen += 1
        if seen > _MAX_ITEMS:
            return False
        if isinstance(v, dict):
            stack.extend(v)
            stack.extend(v.values())
        elif isinstance(v, (list, tuple, set, frozenset)):
            stack.extend(v)
        elif isinstance(v, (str, bytes)) and len(v) > _MAX_TEXT:
            return False
        elif isinstance(v, int) and v.bit_length() > _MAX_INT_BITS:
            return False
    return True


class WorkerDied(RuntimeError):
    """A worker process died before it returned a result: the out-of-memory killer's SIGKILL, a
    crash, a ``kill``. Not bad input, so the CLI prints the one-line message and exits with
    status 1 (2 is for bad input). ``what`` names the point, case or layout it was computing,
    ``cause`` how the worker ended, ``after`` what became of the rest and of a rerun."""

    def __init__(self, what: str, cause: str, after: str = ""):
        self.what, self.cause, self.after = what, cause, after
        super().__init__(f"{what}: {cause}" + (f"; {after}" if after else ""))

    def __reduce__(self):
        return (WorkerDied, (self.what, self.cause, self.after))
