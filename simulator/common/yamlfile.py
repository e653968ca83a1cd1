"""Reading the YAML (and JSON) files users give: strictly, and within bounds.

Strict: PyYAML's ``safe_load`` keeps the last of two equal keys without a word, so a scenario that
sets ``tp: 8`` near the top and ``tp: 2`` further down silently runs TP2. YAML 1.2 (section
3.2.1.1) says mapping keys are unique; this loader enforces it and names the key and its line.

Bounded, so that no input file can hang a command or exhaust its memory:

- only a regular file is read, and its type is checked before it is opened: a named pipe would
  block ``open`` until a writer came, ``/dev/zero`` never ends, a folder or socket cannot be read;
- at most :data:`MAX_BYTES`; a NUL byte makes a file binary, and the text must be UTF-8;
- nodes are counted as they are composed, an alias counting every node it repeats, and a file
  that expands past :data:`MAX_NODES` is refused before its values are built: ten lines of nested
  anchors (the "billion laughs") stand for 10^9 values, which any later walk over the data (a
  copy, an error message, a JSON dump) would spend minutes and gigabytes on;
- nesting is at most :data:`MAX_DEPTH` levels, expanded aliases included, and an alias inside the
  node it names (a structure containing itself) is refused.

libyaml scans and parses when PyYAML has it (10x faster than PyYAML's Python scanner); the
composer, which turns events into nodes, is PyYAML's Python one, because libyaml's own composer
cannot be stopped part way and builds every node of the file before anything can count them.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from pathlib import Path

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import Resolver
from yaml.scanner import Scanner

from simulator.common.errors import ConfigError

MAX_BYTES = 16 * 2**20  # 30x the largest shipped runs file (tests/data/study-runs.yaml, 0.56 MB)
MAX_NODES = 200_000  # 12x the nodes of that file (16,055)
MAX_DEPTH = 100  # the shipped files nest at most 9 levels

_FILE_TYPES = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
               (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


class _PythonParser(Reader, Scanner, Parser):
    """PyYAML's own scanner and parser, for a PyYAML built without libyaml."""

    def __init__(self, stream):
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)


_Parser = getattr(getattr(yaml, "cyaml", None), "CParser", _PythonParser)  # libyaml's, when PyYAML has it


class _Refused(yaml.YAMLError):
    """The document is well-formed YAML that this loader will not build (see the module docstring)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key, line: int, first_line: int):
        super().__init__(f"key {key!r} on line {line} was already given on line {first_line}")
        self.key, self.line, self.first_line = key, line, first_line


class _BoundedComposer(Composer):
    """PyYAML's composer, counting expanded nodes and nesting depth as it goes."""

    def __init__(self):
        super().__init__()
        self._expanded = 0  # nodes of the document so far, each alias counted as the nodes it repeats
        self._depth = 0  # nodes enclosing the one being composed
        self._deepest = 0
        self._measured: dict[int, tuple[int, int]] = {}  # id(node): (expanded nodes, levels), once composed

    def _grow(self, nodes: int, levels: int, mark) -> None:
        """Add ``nodes`` nodes reaching ``levels`` levels below the current depth."""
        self._expanded += nodes
        self._deepest = max(self._deepest, self._depth + levels)
        line = f" (line {mark.line + 1})" if mark is not None else ""
        if self._expanded > MAX_NODES:
            raise _Refused(f"expands to more than {MAX_NODES:,} nodes{line}, aliases counted as the nodes they "
                           "repeat; write the data out or split the file")
        if self._deepest > MAX_DEPTH:
            raise _Refused(f"nests deeper than {MAX_DEPTH} levels{line}, aliases expanded")

    def compose_node(self, parent, index):
        if self.check_event(AliasEvent):
            event = self.peek_event()
            node = self.anchors.get(event.anchor)
            if node is not None:  # an unknown alias is left to PyYAML's own error
                if id(node) not in self._measured:
                    raise _Refused(f"alias *{event.anchor} (line {event.start_mark.line + 1}) is inside the node "
                                   f"&{event.anchor} it names: a structure cannot contain itself")
                self._grow(*self._measured[id(node)], event.start_mark)
            return super().compose_node(parent, index)
        before, outer = self._expanded, self._deepest
        self._deepest = self._depth  # the deepest level of this node's subtree, measured afresh
        self._grow(1, 1, self.peek_event().start_mark)
        self._depth += 1
        node = super().compose_node(parent, index)
        self._depth -= 1
        self._measured[id(node)] = (self._expanded - before, self._deepest - self._depth)
        self._deepest = max(outer, self._deepest)
        return node


class _StrictConstructor(SafeConstructor):
    """SafeConstructor that refuses a key given twice in one mapping and names values Python cannot read."""

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep=deep)
        except ValueError as err:  # Python's int() and date() refuse what YAML's patterns let through
            raise yaml.constructor.ConstructorError(None, None, _unreadable(node, err), node.start_mark) from None

    def construct_strict_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue  # keys written next to a merge key (<<: *base) override the merged ones
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                continue  # SafeConstructor itself reports unhashable keys
            if key in seen:
                raise _DuplicateKey(key, key_node.start_mark.line + 1, seen[key])
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


_MERGE_TAG = "tag:yaml.org,2002:merge"
_StrictConstructor.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                                   _StrictConstructor.construct_strict_mapping)


def _unreadable(node: yaml.Node, err: ValueError) -> str:
    if node.tag.endswith(":int"):
        return (f"an integer of {sum(c.isdigit() for c in node.value):,} digits, more than the "
                f"{sys.get_int_max_str_digits():,} a number may have")
    if node.tag.endswith(":timestamp"):
        return f"{node.value!r} is not a date ({err})"
    return f"{node.value!r} cannot be read ({err})" if isinstance(node.value, str) else str(err)


def _loader_on(parser: type) -> type:
    """The strict, bounded loader class over ``parser`` (libyaml's CParser or PyYAML's own)."""

    # the composer comes first: CParser brings a composer of its own, which must not be the one used
    class Loader(_BoundedComposer, parser, _StrictConstructor, Resolver):
        def __init__(self, stream):
            parser.__init__(self, stream)
            _BoundedComposer.__init__(self)
            _StrictConstructor.__init__(self)
            Resolver.__init__(self)

    return Loader


_StrictLoader = _loader_on(_Parser)


def _parse(text: str, loader_class: type | None = None):
    """The document of ``text``; YAMLError (including _Refused and _DuplicateKey) when it is not one."""
    loader = (loader_class or _StrictLoader)(text)
    try:
        return loader.get_single_data()
    except yaml.scanner.ScannerError as err:
        if "maximum nesting depth" in str(err.problem):  # libyaml's scanner reads ahead of the composer
            raise _Refused(f"nests deeper than {MAX_DEPTH} levels (line {err.problem_mark.line + 1})") from None
        raise
    finally:
        loader.dispose()


def _yaml_problem(err: yaml.YAMLError) -> str:
    """What is wrong and where, from PyYAML's error, on one line: "while scanning a simple key
    (line 3, column 1): could not find expected ':' (line 4, column 1)"."""
    if isinstance(err, yaml.reader.ReaderError):
        if isinstance(err.character, int):
            return f"holds the control character #x{err.character:x} (at character {err.position + 1:,})"
        return " ".join(str(err.reason).split())
    parts = []
    for text, mark in ((getattr(err, "context", None), getattr(err, "context_mark", None)),
                       (getattr(err, "problem", None), getattr(err, "problem_mark", None))):
        if text:
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
            parts.append(" ".join(str(text).split()) + where)
    return ": ".join(parts) or err.__class__.__name__


def load_yaml_text(text: str, field: str, source: str) -> object:
    """Parse YAML text within the bounds of the module docstring; invalid YAML, a duplicate key or a
    document past a bound is a one-line ConfigError on ``field`` naming ``source``."""
    try:
        return _parse(text)
    except _DuplicateKey as err:
        raise ConfigError(field, source, f"duplicate key {err.key!r} on line {err.line} "
                          f"(first given on line {err.first_line}); give each key once") from None
    except _Refused as err:
        raise ConfigError(field, source, err.reason) from None
    except yaml.YAMLError as err:
        raise ConfigError(field, source, f"is not valid YAML: {_yaml_problem(err)}") from None


def yaml_value(text: str, field: str) -> object:
    """A value given on the command line (``--set key=value``, ``--vary``, ``--space``), read as YAML:
    ``8`` an int, ``null`` None, ``[1, 2]`` a list; text that is not valid YAML is kept as a string.
    Within the loader's bounds: a value past one is a one-line ConfigError on ``field``."""
    try:
        return _parse(text)
    except _Refused as err:
        raise ConfigError(field, text, err.reason) from None
    except yaml.YAMLError:
        return text


def read_text_file(path: str | Path, field: str, kind: str = "YAML") -> str:
    """The UTF-8 text of a regular file of at most :data:`MAX_BYTES`, or a one-line ConfigError on
    ``field`` naming the file and why it cannot be read as ``kind`` text."""
    name = str(path)
    try:
        info = os.stat(path)  # before opening: opening a FIFO blocks until a writer comes
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise ConfigError(field, name, "is a loop of symbolic links, not a file") from None
        if err.errno == errno.ENAMETOOLONG:
            raise ConfigError(field, f"{name[:60]}...", f"is {len(name):,} characters, longer than a file name can be") \
                from None
        if err.errno == errno.ENOENT:
            if os.path.islink(path):
                raise ConfigError(field, name, f"is a symbolic link to {os.readlink(path)}, which does not exist") from None
            raise ConfigError(field, name, "no such file") from None
        raise ConfigError(field, name, f"cannot be read ({err.strerror})") from None
    _check_regular(info, field, name)
    try:
        # O_NONBLOCK: should the path become a FIFO after the check above, opening it still returns
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise ConfigError(field, name, f"cannot be read ({err.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        _check_regular(os.fstat(fd), field, name)
        try:
            data = f.read(MAX_BYTES + 1)
        except OSError as err:
            raise ConfigError(field, name, f"cannot be read ({err.strerror})") from None
    if len(data) > MAX_BYTES:
        raise ConfigError(field, name, f"is larger than {MAX_BYTES // 2**20} MiB, the most an input file may be")
    return _decode(data, field, name, kind)


def too_long(path: str | Path) -> bool:
    """Whether ``path`` is longer than the system takes for a path or for one of its parts."""
    try:
        os.stat(path)
    except OSError as err:
        return err.errno == errno.ENAMETOOLONG
    return False


def _check_regular(info: os.stat_result, field: str, name: str) -> None:
    if stat.S_ISREG(info.st_mode):
        if info.st_size > MAX_BYTES:
            raise ConfigError(field, name, f"is {info.st_size / 2**20:,.1f} MiB, larger than the "
                                           f"{MAX_BYTES // 2**20} MiB an input file may be")
        return
    what = next((text for test, text in _FILE_TYPES if test(info.st_mode)), "not a regular file")
    raise ConfigError(field, name, f"is {what}, not a file")


def _decode(data: bytes, field: str, name: str, kind: str) -> str:
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ConfigError(field, name, f"is UTF-16 text; save it as UTF-8 {kind}")
    nul = data.find(b"\0")
    if nul >= 0:
        raise ConfigError(field, name, f"is a binary file (a NUL byte at offset {nul:,}), not {kind} text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise ConfigError(field, name, f"is not UTF-8 text (byte 0x{data[err.start]:02x} on line {line}); "
                                       f"save it as UTF-8 {kind}") from None


def load_yaml_file(path: str | Path, field: str) -> object:
    """Read (see ``read_text_file``) and parse (see ``load_yaml_text``) a YAML file a user gave."""
    return load_yaml_text(read_text_file(path, field), field, str(path))
