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


class ConfigError(ValueError):
    """A user-facing input error: one line naming the field, the bad value and what is valid.

    The CLI prints ``str(err)`` and exits with status 2; it never shows a traceback for these.
    A ``LeftOut`` value reads "field: left out (default 1); valid" instead of "field: got ...".
    """

    def __init__(self, field: str, value: object, valid: str):
        self.field = field
        self.value = value
        self.valid = valid
        shown = str(value) if isinstance(value, LeftOut) else f"got {yaml_text(value)}"
        super().__init__(f"{field}: {shown}; {valid}")

    def __reduce__(self):
        # rebuilt from its three parts when it crosses a process boundary (a worker of validate,
        # sweep or plan): the default pickling passes only the message and cannot call __init__
        return (ConfigError, (self.field, self.value, self.valid))


def yaml_text(value: object) -> str:
    """The bad value as the user wrote it: YAML's null, true and false rather than Python's None,
    True and False (scenarios and ``--set`` values are YAML); anything else by its repr."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


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
