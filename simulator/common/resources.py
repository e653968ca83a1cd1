"""The data shipped inside the package, read with :mod:`importlib.resources` so that it is found
wherever the package is installed (a wheel, an sdist, ``pip install git+...``, an editable checkout).

``simulator/data/`` holds one folder per kind: ``topologies/`` and ``frameworks/`` (YAML, one file
per name), ``models/<org>/<name>.json`` (Hugging Face ``config.json`` copies) and ``scenarios/``
(the example scenarios: in a checkout a link to ``scenarios/`` at its root, which a built wheel or
sdist carries as files).
"""

from __future__ import annotations

import functools
from importlib import resources
from importlib.resources.abc import Traversable

KINDS = ("topologies", "frameworks", "models", "scenarios")


def folder(kind: str) -> Traversable:
    """The shipped folder of one kind of data."""
    if kind not in KINDS:
        raise ValueError(f"unknown data kind {kind!r}; valid: {', '.join(KINDS)}")
    return resources.files("simulator").joinpath("data", kind)


@functools.lru_cache(maxsize=None)
def names(kind: str, suffix: str = ".yaml") -> tuple[str, ...]:
    """The names (file stems) of the shipped files of one kind, sorted (listed once per process: the
    package's data does not change under a running program)."""
    return tuple(sorted(p.name[: -len(suffix)] for p in folder(kind).iterdir()
                        if p.is_file() and p.name.endswith(suffix)))


def entry(kind: str, name: str, suffix: str = ".yaml") -> Traversable:
    """The shipped file ``name`` of one kind (``entry("topologies", "dgx-h100")``)."""
    return folder(kind).joinpath(f"{name}{suffix}")
