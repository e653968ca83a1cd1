"""Typed report records: frozen dataclasses whose ``to_dict()`` is their JSON form.

Fields come out in declaration order, which is the order of the ``--json`` contract; nested
records and tuples of records are converted; a field listed in ``OPTIONAL`` is left out while it is
None (keys that appear only when they apply, such as ``faults``).
"""

from __future__ import annotations

from dataclasses import MISSING, field, fields
from typing import Any, ClassVar


def doc(help: str, unit: str = "", default: Any = MISSING) -> Any:
    """A record field with its one line of help and unit: the report reference
    (``docs/report-reference.md``) is written from them."""
    meta = {"help": help, "unit": unit}
    return field(metadata=meta) if default is MISSING else field(default=default, metadata=meta)


class Record:
    OPTIONAL: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict:
        out = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is None and f.name in self.OPTIONAL:
                continue
            out[f.name] = _plain(value)
        return out


def _plain(value):
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
