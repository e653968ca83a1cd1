"""The YAML loader every user file goes through: bounded, and one line naming the field and the file.

The unit tests below hold each bound and each kind of file that is not YAML text; the property
tests feed the loader random text, random bytes and random documents of anchors and aliases in a
child process (``tests/sandbox.py``) that gives each case a wall-time and a memory budget.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sandbox
from simulator.common import yamlfile
from simulator.common.errors import ConfigError
from simulator.common.yamlfile import MAX_BYTES, MAX_DEPTH, MAX_NODES, load_yaml_file, load_yaml_text

ROOT = Path(__file__).resolve().parent.parent
CASE_TIMEOUT_S = 20  # a hang, not a speed measure: a case takes milliseconds
CASE_MEMORY = 64 * sandbox.MiB  # peak resident growth of one small case


def refused(text: str) -> str:
    with pytest.raises(ConfigError) as err:
        load_yaml_text(text, "scenario", "x.yaml")
    message = str(err.value)
    assert "\n" not in message and message.startswith("scenario: got 'x.yaml'; "), message
    return message


def laughs(levels: int, width: int) -> str:
    """The "billion laughs": each level an anchored list of ``width`` aliases of the level below."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def laughs_nodes(levels: int, width: int) -> int:
    """Nodes of ``laughs(levels, width)`` written out: the mapping, its keys and each level's list."""
    total, size = 1 + levels, 1 + width
    for _ in range(levels):
        total += size
        size = 1 + width * size
    return total


# --- bounds ----------------------------------------------------------------------------------

def test_the_billion_laughs_is_refused_at_once():
    text = laughs(9, 9)
    assert len(text) < 500 and laughs_nodes(9, 9) > 4 * 10**8
    assert "expands to more than 200,000 nodes" in refused(text)


def test_a_document_of_exactly_the_node_cap_loads_and_one_more_is_refused():
    width = 999  # a: a list of 999 scalars (1,000 nodes); b: a list of m aliases of it; c: p scalars
    m = (MAX_NODES - 1006) // 1000
    p = MAX_NODES - 1006 - 1000 * m
    assert p >= 1
    head = f"a: &a [{', '.join(['0'] * width)}]\nb: [{', '.join(['*a'] * m)}]\nc: ["
    doc = load_yaml_text(head + ", ".join(["0"] * p) + "]\n", "scenario", "x.yaml")
    assert sandbox.expanded_size(doc, MAX_NODES + 10) == MAX_NODES
    assert f"expands to more than {MAX_NODES:,} nodes" in refused(head + ", ".join(["0"] * (p + 1)) + "]\n")


def test_nesting_is_bounded_aliases_expanded():
    assert load_yaml_text("[" * MAX_DEPTH + "]" * MAX_DEPTH, "scenario", "x.yaml") is not None
    assert f"nests deeper than {MAX_DEPTH} levels" in refused("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
    half = MAX_DEPTH // 2
    deep = f"a: &a {'[' * half}{']' * half}\nb: {'[' * half}*a{']' * half}\n"  # 1 + 50 + 50 levels
    assert f"nests deeper than {MAX_DEPTH} levels" in refused(deep)
    # libyaml's own limit (1,000 levels) is past ours: the message is ours, not a scanner error
    assert f"nests deeper than {MAX_DEPTH} levels" in refused("[" * 5000 + "]" * 5000)


def test_a_structure_that_contains_itself_is_refused():
    assert "alias *a (line 1) is inside the node &a it names" in refused("&a [1, *a]")
    assert "alias *m (line 2)" in refused("&m\nx: *m\n")


def test_aliases_that_stay_small_still_load_and_merge_keys_work():
    doc = load_yaml_text("base: &b {tp: 2, pp: 1}\nrun: {<<: *b, pp: 4}\nboth: [*b, *b]\n", "scenario", "x.yaml")
    assert doc == {"base": {"tp": 2, "pp": 1}, "run": {"tp": 2, "pp": 4}, "both": [{"tp": 2, "pp": 1}] * 2}


def test_a_key_given_twice_is_still_refused():
    assert "duplicate key 'tp' on line 3 (first given on line 1)" in refused("tp: 1\npp: 2\ntp: 3\n")


def test_numbers_and_dates_python_cannot_read_are_named():
    assert "an integer of 5,000 digits" in refused(f"x: {'9' * 5000}\n")
    assert "'2024-02-30' is not a date" in refused("x: 2024-02-30\n")


def test_invalid_yaml_says_what_and_where():
    assert refused("a: [1\n").endswith("is not valid YAML: while parsing a flow sequence (line 1, column 4): "
                                       "did not find expected ',' or ']' (line 2, column 1)")


def test_libyaml_parses_when_pyyaml_has_it():
    if not yaml.__with_libyaml__:
        pytest.skip("PyYAML without libyaml")
    assert yamlfile._Parser is yaml.cyaml.CParser


def test_the_pure_python_parser_gives_the_same_documents_and_bounds(monkeypatch):
    """A PyYAML built without libyaml reads every shipped file the same way and keeps the bounds."""
    files = sorted((ROOT / "scenarios").glob("*.yaml")) + [ROOT / "tests" / "data" / "nemo-2407-runs.yaml"]
    fast = [load_yaml_file(f, "scenario") for f in files]
    monkeypatch.setattr(yamlfile, "_StrictLoader", yamlfile._loader_on(yamlfile._PythonParser))
    assert [load_yaml_file(f, "scenario") for f in files] == fast
    assert "expands to more than" in refused(laughs(9, 9))
    assert "nests deeper than" in refused("[" * 5000 + "]" * 5000)
    assert "duplicate key" in refused("a: 1\na: 2\n")
    assert "is inside the node &a it names" in refused("&a [*a]")


# --- files that are not YAML text ----------------------------------------------------------------

def file_refused(path) -> str:
    with pytest.raises(ConfigError) as err:
        load_yaml_file(path, "scenario")
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"scenario: got {str(path)!r}; "), message
    return message


def test_a_named_pipe_is_refused_without_opening_it(tmp_path):
    """Opening a FIFO for reading blocks until a writer comes: a child process shows no hang."""
    fifo = tmp_path / "scenario.yaml"
    os.mkfifo(fifo)
    code = ("from simulator.common.yamlfile import load_yaml_file\n"
            f"try:\n    load_yaml_file({str(fifo)!r}, 'scenario')\nexcept ValueError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert out == f"scenario: got {str(fifo)!r}; is a named pipe (FIFO), not a file\n"


def test_folders_devices_sockets_and_links_are_named(tmp_path):
    assert file_refused(tmp_path).endswith("is a folder, not a file")
    assert file_refused("/dev/zero").endswith("is a character device, not a file")
    sock_path = tmp_path / "s.yaml"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(sock_path))
        assert file_refused(sock_path).endswith("is a socket, not a file")
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    assert file_refused(tmp_path / "a").endswith("is a loop of symbolic links, not a file")
    (tmp_path / "gone.yaml").symlink_to(tmp_path / "nowhere.yaml")
    assert file_refused(tmp_path / "gone.yaml").endswith(f"is a symbolic link to {tmp_path / 'nowhere.yaml'}, "
                                                         "which does not exist")
    assert file_refused(tmp_path / "missing.yaml").endswith("no such file")


def test_binary_non_utf8_and_oversized_files_are_named(tmp_path):
    cases = {b"name: x\n\x00\x01": "is a binary file (a NUL byte at offset 8), not YAML text",
             b"name: caf\xe9\n": "is not UTF-8 text (byte 0xe9 on line 1); save it as UTF-8 YAML",
             "name: x\n".encode("utf-16"): "is UTF-16 text; save it as UTF-8 YAML",
             b"name: x\x07\n": "is not valid YAML: holds the control character #x7 (at character 8)"}
    for i, (data, message) in enumerate(cases.items()):
        (tmp_path / f"{i}.yaml").write_bytes(data)
        assert file_refused(tmp_path / f"{i}.yaml").endswith(message)
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(MAX_BYTES + 1)  # sparse: no disk used
    assert file_refused(big).endswith("is 16.0 MiB, larger than the 16 MiB an input file may be")
    (tmp_path / "bom.yaml").write_bytes("\ufefftp: 2\n".encode())
    assert load_yaml_file(tmp_path / "bom.yaml", "scenario") == {"tp": 2}


def test_a_file_at_the_node_cap_stays_within_its_memory_budget(tmp_path):
    """The largest document the loader builds: MAX_NODES nodes written out (no aliases)."""
    path = tmp_path / "flat.yaml"
    path.write_text("[" + ",".join(["0"] * (MAX_NODES - 1)) + "]\n")
    box = sandbox.Sandbox()
    try:
        out = box.call(sandbox.load_file, str(path), MAX_NODES, timeout_s=300)
    finally:
        box.close()
    assert out.kind == "ok" and out.value == ("value", MAX_NODES), out
    assert out.peak_bytes < 256 * sandbox.MiB, out.peak_bytes  # 107 MiB measured


# --- properties ------------------------------------------------------------------------------------

FUZZ = settings(derandomize=True, database=None, deadline=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                       HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def box():
    b = sandbox.Sandbox()
    yield b
    b.close()


def check(box, fn, arg, source: str):
    """One case in the sandbox: a value within the node cap, or one line naming the field and source."""
    out = box.call(fn, arg, MAX_NODES, timeout_s=CASE_TIMEOUT_S)
    assert out.kind == "ok", (arg, out.kind, out.value, out.trace)
    assert out.peak_bytes < CASE_MEMORY, (arg, out.peak_bytes)
    kind, value = out.value
    if kind == "value":
        assert value <= MAX_NODES, arg
    else:
        assert "\n" not in value and value.startswith(f"scenario: got {source!r}; "), (arg, value)
    return kind, value


YAMLISH = st.sampled_from(list("&*[]{}:,-?!|>'\"#% \n\t\\@`~") + ["<<", "&a", "*a", "&b", "*b", "---", "...",
                                                                     "%YAML 1.1", "!!python/object", "1e9", "0x1f"])


def test_random_text_loads_or_is_one_line(box):
    @settings(FUZZ, max_examples=400)
    @given(st.one_of(st.text(max_size=200), st.lists(st.one_of(YAMLISH, st.text(max_size=4)), max_size=60).map("".join)))
    def one(text):
        check(box, sandbox.load_text, text, "fuzz.yaml")
    one()


def test_random_bytes_load_or_are_one_line(box, tmp_path):
    path = tmp_path / "fuzz.yaml"

    @settings(FUZZ, max_examples=300)
    @given(st.one_of(st.binary(max_size=300), st.text(max_size=100).map(lambda t: t.encode("utf-8")),
                     st.text(max_size=100).map(lambda t: t.encode("utf-16")),
                     st.tuples(st.text(max_size=50), st.binary(max_size=4)).map(lambda p: p[0].encode() + p[1])))
    def one(data):
        path.write_bytes(data)
        check(box, sandbox.load_file, str(path), str(path))
    one()


ANCHORS = ("a", "b", "c")


@st.composite
def documents(draw):
    """Flow-style YAML of nested lists and mappings, some nodes anchored and some aliases: defined,
    undefined, enclosing (a structure containing itself) or repeated many times over."""
    def node(depth: int) -> str:
        anchor = f"&{draw(st.sampled_from(ANCHORS))} " if draw(st.integers(0, 3)) == 0 else ""
        kind = draw(st.sampled_from(["scalar", "alias", "list", "map"] if depth < 4 else ["scalar", "alias"]))
        if kind == "scalar":
            return anchor + draw(st.sampled_from(["1", "x", "null", "2.5", "true", "''", "-1"]))
        if kind == "alias":
            return f"*{draw(st.sampled_from(ANCHORS))}"
        items = [node(depth + 1) for _ in range(draw(st.integers(0, 5)))]
        if kind == "list":
            return anchor + "[" + ", ".join(items) + "]"
        return anchor + "{" + ", ".join(f"k{i}: {v}" for i, v in enumerate(items)) + "}"
    return node(0)


def test_random_anchored_documents_load_or_are_one_line(box):
    seen = set()

    @settings(FUZZ, max_examples=500)
    @given(documents())
    def one(text):
        kind, value = check(box, sandbox.load_text, text, "fuzz.yaml")
        seen.add(kind if kind == "value" else value.split("; ", 1)[1].split(" (")[0][:30])
    one()
    # the strategy reached documents that load, undefined aliases and structures containing themselves
    assert {"value", "is not valid YAML: found undef", "alias *a"} <= seen, seen


def test_billion_laughs_of_any_shape_are_refused_exactly_past_the_cap(box):
    @settings(FUZZ, max_examples=150)
    @given(st.integers(1, 12), st.integers(1, 40))
    def one(levels, width):
        kind, value = check(box, sandbox.load_text, laughs(levels, width), "fuzz.yaml")
        nodes = laughs_nodes(levels, width)
        if nodes <= MAX_NODES:
            assert (kind, value) == ("value", nodes)
        else:
            assert kind == "error" and "expands to more than 200,000 nodes" in value
    one()
