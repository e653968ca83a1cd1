"""The shipped model catalog: Hugging Face ``config.json`` files under ``data/models/<org>/<name>.json``.

A scenario names a model by its Hugging Face id (``model: deepseek-ai/DeepSeek-V3``); the file is
read from the installed package (``pyproject.toml`` ships ``data/models/*/*.json`` as package data),
never from the network. ``data/models/README.md`` lists each file's source and the model's published
parameter counts.
"""

from __future__ import annotations

import difflib
import functools
import json
from simulator.common import resources
from simulator.common.errors import ConfigError


@functools.lru_cache(maxsize=1)
def catalog_ids() -> tuple[str, ...]:
    """Every Hugging Face id in the catalog, sorted."""
    return tuple(sorted(f"{org.name}/{f.name[:-5]}" for org in resources.folder("models").iterdir() if org.is_dir()
                        for f in org.iterdir() if f.name.endswith(".json")))


def catalog_config(hf_id: str) -> dict:
    """The parsed config.json of ``hf_id`` (matched case-insensitively), or a one-line ConfigError
    naming the closest ids."""
    ids = catalog_ids()
    by_lower = {i.lower(): i for i in ids}
    found = by_lower.get(hf_id.strip().lower())
    if found is None:
        close = difflib.get_close_matches(hf_id.lower(), list(by_lower), n=3, cutoff=0.3)
        names = [by_lower[c] for c in close] or list(ids[:3])
        raise ConfigError("model", hf_id, f"not a Hugging Face id in stepsim's catalog; closest: {', '.join(names)} "
                          f"({len(ids)} models; or give the fields inline or hf_config: path/to/config.json)")
    org, name = found.split("/")
    return json.loads(resources.folder("models").joinpath(org, f"{name}.json").read_text())
