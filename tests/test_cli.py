"""The command line: real output, JSON contract, clean errors with exit code 2."""

import json
import subprocess
import sys

import pytest

from simulator.cli import main


def test_collective_json_contract(capsys):
    assert main(["collective", "--op", "all_reduce", "--gpus", "8", "--cluster", "dgx-h100",
                 "--sizes", "1MiB,16MiB,1GiB,8GiB", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["size_bytes"] for r in rows] == [2**20, 16 * 2**20, 2**30, 8 * 2**30]
    for r in rows:
        assert set(r) == {"size_bytes", "time_s", "algbw_GBps", "busbw_GBps"}
        assert r["algbw_GBps"] == pytest.approx(r["size_bytes"] / r["time_s"] / 1e9)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 2 * 7 / 8)
    assert rows[-1]["busbw_GBps"] > rows[0]["busbw_GBps"]


def test_collective_table_is_printed(capsys):
    assert main(["collective", "--gpus", "16", "--op", "all_gather", "--sizes", "1GiB"]) == 0
    out = capsys.readouterr().out
    assert "busbw_GB/s" in out and "1GiB" in out


@pytest.mark.parametrize("argv, field", [
    (["collective", "--sizes", "12XB"], "--sizes"),
    (["collective", "--op", "allreduce"], "--op"),
    (["collective", "--cluster", "nope"], "cluster.topology"),
    (["collective", "--gpus", "1"], "--gpus"),
    (["collective", "--network-bandwidth-Gbps", "-4"], "--network-bandwidth-Gbps"),
    (["collective", "--oversubscription", "nan"], "--oversubscription"),
    (["collective", "--sizes", ",,"], "--sizes"),
])
def test_bad_input_is_one_line_naming_the_field_and_exit_2(argv, field):
    proc = subprocess.run([sys.executable, "-m", "simulator", *argv], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and field in proc.stderr and "Traceback" not in proc.stderr


def test_console_script_and_module_agree():
    a = subprocess.run([sys.executable, "-m", "simulator", "collective", "--sizes", "1GiB", "--json"],
                       capture_output=True, text=True, check=True).stdout
    assert json.loads(a)[0]["size_bytes"] == 2**30


def test_building_the_parser_imports_no_model_code():
    """--help and every usage error come from the parser alone: building it must not import the
    planner (and with it numpy and networkx), which cost every one-line error 0.8 s."""
    code = ("import sys; from simulator.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('numpy', 'networkx', 'simpy', 'simulator.studies.planner') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_plan_help_shows_the_planners_default_tolerance():
    from simulator.cli import TOLERANCE_HELP_DEFAULT
    from simulator.studies.planner import DEFAULT_TOLERANCE

    assert TOLERANCE_HELP_DEFAULT == f"{DEFAULT_TOLERANCE * 100:g}%"


def _every_parser(parser, path=("stepsim",)):
    """(command words, parser) of the parser and of every subcommand under it, found by walking argparse."""
    import argparse

    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _every_parser(sub, (*path, name))


def test_every_help_renders(capsys):
    """Help strings are %-templates to argparse: a stray % crashed `stepsim plan --help`."""
    from simulator.cli import build_parser

    found = list(_every_parser(build_parser()))
    assert len(found) > 10  # the walk reached the subcommands
    for words, _ in found:
        with pytest.raises(SystemExit) as stop:
            main([*words[1:], "--help"])
        assert stop.value.code == 0, words
        out = capsys.readouterr().out
        assert out.startswith(f"usage: {' '.join(words)}"), (words, out[:200])


def test_every_command_prints_its_help(capsys):
    """argparse %-formats help texts: a bare % (plan's "default 0%") made `stepsim plan --help` a
    ValueError traceback. Each command's help prints, and plan's shows its default tolerance."""
    from simulator.cli import TOLERANCE_HELP_DEFAULT, build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    for name in commands:
        with pytest.raises(SystemExit) as stop:
            parser.parse_args([name, "--help"])
        assert stop.value.code == 0, name
        text = capsys.readouterr().out
        assert text.startswith(f"usage: stepsim {name}"), name
        if name in ("sweep", "whatif", "plan", "validate", "report"):
            assert "default: one per CPU" in " ".join(text.split()), name
    parser.parse_args(["plan", "x.yaml"])
    with pytest.raises(SystemExit):
        parser.parse_args(["plan", "--help"])
    assert f"(default {TOLERANCE_HELP_DEFAULT})" in " ".join(capsys.readouterr().out.split())
