"""stepsim: a discrete-event simulator of one training step of a large model on a GPU cluster.

The public API (documented in ``docs/python-api.md``; every ``stepsim`` command is a thin layer
over it)::

    import simulator
    r = simulator.run("scenarios/tiny.yaml")
    r.step_time_s, r.breakdown, r.stages, r.memory, r.warnings, r.to_json()

``load_scenario``, ``run``, ``memory``, ``plan``, ``sweep``, ``checked``, ``Run``, ``Scenario`` and
``ConfigError`` are loaded on first use, so ``import simulator`` (and ``stepsim --help``) stays fast.
"""

from __future__ import annotations

import importlib

__version__ = "0.5.9"
__all__ = ["Checked", "ConfigError", "Run", "Scenario", "checked", "load_scenario", "memory", "plan", "run", "sweep",
           "__version__"]


def __getattr__(name: str):
    if name in __all__:
        value = getattr(importlib.import_module("simulator.api"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'simulator' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
