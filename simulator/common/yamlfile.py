"""Reading YAML input files strictly: a key written twice in one mapping is an error.

PyYAML's ``safe_load`` keeps the last of two equal keys without a word, so a scenario that sets
``tp: 8`` near the top and ``tp: 2`` further down silently runs TP2. YAML 1.2 (section 3.2.1.1)
says mapping keys are unique; this loader enforces it and names the key and its line.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from simulator.common.errors import ConfigError


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """SafeLoader (libyaml's parser when PyYAML has it, 10x faster) that refuses a key given twice
    in one mapping."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    seen: dict = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            continue  # SafeLoader itself reports unhashable keys
        if key in seen:
            raise _DuplicateKey(key, key_node.start_mark.line + 1, seen[key])
        seen[key] = key_node.start_mark.line + 1
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key, line: int, first_line: int):
        super().__init__(f"key {key!r} on line {line} was already given on line {first_line}")
        self.key, self.line, self.first_line = key, line, first_line


def load_yaml_text(text: str, field: str, source: str) -> object:
    """Parse YAML text; invalid YAML or a duplicate key is a one-line ConfigError on ``field``."""
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except _DuplicateKey as err:
        raise ConfigError(field, source, f"duplicate key {err.key!r} on line {err.line} "
                          f"(first given on line {err.first_line}); give each key once") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(field, source, f"is not valid YAML ({err.__class__.__name__}{where})") from None


def load_yaml_file(path: str | Path, field: str) -> object:
    """Read and parse a YAML file strictly (see ``load_yaml_text``)."""
    p = Path(path)
    try:
        text = p.read_text()
    except UnicodeDecodeError:
        raise ConfigError(field, str(path), "is not valid YAML (not UTF-8 text)") from None
    except OSError as err:
        raise ConfigError(field, str(path), f"cannot be read ({err.strerror})") from None
    return load_yaml_text(text, field, str(path))
