"""The user documentation runs: README and docs/ examples are executed or checked against the code,
so a renamed key, flag or function breaks a test instead of a reader's first try.

- every ```python block of docs/python-api.md (and README's) runs, in order, from the repository root;
- every ```yaml block of docs/scenarios.md and docs/extending.md is a scenario that is simulated, a
  fragment that is laid over scenarios/tiny.yaml and checked, or a file (marked
  ``<!-- file: NAME -->`` on the line before) that the scenarios next to it use;
- every ``stepsim`` command in a ```bash block parses with the real command line, and its scenario
  with its ``--set`` and ``--vary`` values loads;
- output shown after a command is what the command prints today (wall times aside);
- relative links resolve; README stays short and names the test command CI runs.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest
import yaml

import simulator
from simulator.cli import build_parser
from simulator.cli import main as cli_main
from simulator.common import resources
from simulator.scenario.load import scenario_from_dict

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", *DOCS.glob("*.md")])
INSTALL = ("python3 -m venv .venv && .venv/bin/pip install -q -e '.[test,ray]' && "
           ".venv/bin/stepsim run scenarios/gpt3-175b-1024xa100.yaml")
TEST_COMMAND = ".venv/bin/python -m pytest"
README_MAX_LINES = 200
FILE_MARK = re.compile(r"<!-- file: (\S+) -->")


def blocks(path: Path) -> list[dict]:
    """The fenced code blocks of a Markdown page: language, text, the file name marked on the line
    before (or None) and the line the block starts on."""
    out, lines, i = [], path.read_text().splitlines(), 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        mark = FILE_MARK.fullmatch(lines[i - 1].strip()) if i else None
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        out.append({"lang": m.group(1), "text": "\n".join(lines[i + 1:end]) + "\n",
                    "file": mark.group(1) if mark else None, "line": i + 1})
        i = end + 1
    return out


def _ids(items: list[dict], page: str) -> list[str]:
    return [f"{page}:{b['line']}" for b in items]


# --- README -------------------------------------------------------------------------------------

def test_readme_is_short_and_gives_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    bash = [b["text"].strip() for b in blocks(ROOT / "README.md") if b["lang"] == "bash"]
    assert INSTALL in bash
    assert TEST_COMMAND in bash


def test_ci_runs_exactly_the_readme_test_command():
    commands = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert commands[-1] == TEST_COMMAND


def test_the_changelog_starts_with_this_version():
    first = next(line for line in (ROOT / "CHANGELOG.md").read_text().splitlines() if line.startswith("## "))
    assert first.startswith(f"## {simulator.__version__} ")


# --- links --------------------------------------------------------------------------------------

def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but hyphens dropped, spaces to hyphens."""
    heads = [line.lstrip("#").strip() for line in path.read_text().splitlines() if line.startswith("#")]
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_relative_links_resolve(page):
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        name, _, anchor = target.partition("#")
        dest = (page.parent / name).resolve() if name else page
        assert dest.exists(), f"{page.name}: {target}"
        if anchor:
            assert anchor in _anchors(dest), f"{page.name}: {target}"


# --- Python -------------------------------------------------------------------------------------

API_PAGES = [DOCS / "python-api.md", ROOT / "README.md"]


@pytest.mark.parametrize("page", API_PAGES, ids=[p.name for p in API_PAGES])
def test_python_examples_run(page, monkeypatch):
    code = [b for b in blocks(page) if b["lang"] == "python"]
    assert code, page
    monkeypatch.chdir(ROOT)
    namespace: dict = {"__name__": "__docs__"}
    for b in code:
        exec(compile(b["text"], f"{page.name}:{b['line']}", "exec"), namespace)


# --- scenarios ----------------------------------------------------------------------------------

SCENARIO_PAGES = [DOCS / "scenarios.md", DOCS / "extending.md"]
TOP_LEVEL = {"name", "model", "cluster", "training", "parallelism", "schedule", "framework", "overlap",
             "framework_options", "moe", "faults", "claims"}


def _merge(base: dict, part: dict) -> dict:
    out = dict(base)
    for k, v in part.items():
        out[k] = _merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


def _write_files(page: Path, folder: Path) -> None:
    for b in blocks(page):
        if b["file"]:
            dest = folder / b["file"]
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(b["text"])


def _yaml_blocks(page: Path) -> list[dict]:
    return [b for b in blocks(page) if b["lang"] == "yaml"]


YAML_CASES = [(p, b) for p in SCENARIO_PAGES for b in _yaml_blocks(p)]


@pytest.mark.parametrize("page, block", YAML_CASES,
                         ids=[f"{p.name}:{b['line']}" for p, b in YAML_CASES])
def test_yaml_examples_are_valid(page, block, tmp_path, monkeypatch):
    """A whole scenario (name and model) is simulated; a fragment laid over tiny.yaml (dp left to
    follow the GPU count) must load and pass the layout rules; any other YAML is a marked file,
    used by the scenarios beside it."""
    _write_files(page, tmp_path)
    monkeypatch.chdir(tmp_path)
    data = yaml.safe_load(block["text"])
    assert isinstance(data, dict), "a YAML example is a mapping"
    if not set(data) <= TOP_LEVEL:
        assert block["file"], "a YAML example that is not a scenario must be a marked file"
        return
    if "name" in data and "model" in data:
        run = simulator.run(scenario_from_dict(data, base_dir=tmp_path))
        assert run.step_time_s > 0 and run.memory.fits
        return
    tiny = yaml.safe_load((ROOT / "scenarios" / "tiny.yaml").read_text())
    tiny["parallelism"]["dp"] = None
    merged = _merge(tiny, data)
    simulator.checked(scenario_from_dict(merged, base_dir=tmp_path))
    if "claims" in data:
        from simulator.studies.audit import parse_claims
        assert len(parse_claims(merged)) == len(data["claims"])


# --- commands -----------------------------------------------------------------------------------

def _commands_of(block: dict) -> list[tuple[int, list[str]]]:
    """(line, argv after ``stepsim``) of every stepsim command in a bash block; a ``> file``
    redirection stays at the end of argv."""
    out = []
    for n, line in enumerate(block["text"].splitlines()):
        segment: list[str] = []
        for tok in [*shlex.split(line, comments=True), "&&"]:
            if tok in ("&&", "|", ";", "||"):
                if segment and segment[0].endswith("stepsim"):
                    out.append((block["line"] + 1 + n, segment[1:]))
                segment = []
            else:
                segment.append(tok)
    return out


def _commands(page: Path) -> list[tuple[int, list[str]]]:
    """(line, argv after ``stepsim``, without redirections) of every stepsim command in the page's
    bash blocks."""
    out = []
    for b in blocks(page):
        if b["lang"] == "bash":
            out += [(n, argv[:argv.index(">")] if ">" in argv else argv) for n, argv in _commands_of(b)]
    return out


COMMANDS = [(p, line, argv) for p in PAGES for line, argv in _commands(p)]


def _findable(scenario: str) -> bool:
    return (ROOT / scenario).is_file() or scenario in resources.names("scenarios")


@pytest.mark.parametrize("page, line, argv", COMMANDS, ids=[f"{p.name}:{n}" for p, n, _ in COMMANDS])
def test_commands_parse_and_their_scenarios_load(page, line, argv, monkeypatch):
    monkeypatch.chdir(ROOT)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as stop:
        pytest.fail(f"{page.name}:{line}: stepsim {' '.join(argv)} does not parse (exit {stop.code})")
    if getattr(args, "scenario", None) and hasattr(args, "set") and not getattr(args, "validate", False) \
            and _findable(args.scenario):
        sets = args.set or []
        simulator.load_scenario(args.scenario, sets)
        for item in getattr(args, "vary", None) or []:
            key, _, values = item.partition("=")
            for v in values.split(","):
                simulator.load_scenario(args.scenario, [*sets, f"{key}={v}"])
    if args.command == "validate":
        for runs in args.runs:
            # a shell glob stands for the files it matches, of which there must be some
            assert runs.startswith("../shared/") or (ROOT / runs).is_file() or \
                ("*" in runs and any(ROOT.glob(runs))), runs


def _run_stepsim(argv: list[str]) -> tuple[int, str, str]:
    """(status, stdout, stderr) of ``stepsim ARGV`` run in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli_main(argv)
        except SystemExit as stop:
            status = stop.code if isinstance(stop.code, int) else 2
    return status, out.getvalue(), err.getvalue()


def _shown_outputs(page: Path) -> list[dict]:
    """The output blocks of a page: a plain block right after a bash block (the output of that block's
    last stepsim command, the ones before it run first), or a plain block whose first line is
    ``$ stepsim ...`` (that command's output, stderr included)."""
    out, items = [], blocks(page)
    lines = page.read_text().splitlines()
    for prev, b in zip([None, *items], items):
        if b["lang"]:
            continue
        text = b["text"].splitlines()
        if text and text[0].startswith("$ stepsim "):
            out.append({"line": b["line"], "commands": [shlex.split(text[0][2:])[1:]], "shown": text[1:],
                        "stderr": True})
            continue
        between = lines[prev["line"] + len(prev["text"].splitlines()) + 1:b["line"] - 1] if prev else ["x"]
        if prev and prev["lang"] == "bash" and not any(x.strip() for x in between):
            commands = [argv for _, argv in _commands_of(prev)]
            if commands:
                out.append({"line": b["line"], "commands": commands, "shown": text, "stderr": False})
    return out


def _matches(shown: list[str], actual: list[str]) -> bool:
    """The shown lines are the actual ones: a line ``...`` stands for any number of lines, a line
    ending in `` ...`` for any line that starts like it; lines with a wall time are not compared."""
    shown = [x.rstrip() for x in shown if " wall" not in x]
    actual = [x.rstrip() for x in actual if " wall" not in x]
    pos, gap = 0, False
    for want in shown:
        if want.strip() == "...":
            gap = True
            continue
        same = (lambda got: got.startswith(want[:-4])) if want.endswith(" ...") else (lambda got: got == want)
        while pos < len(actual) and not same(actual[pos]):
            if not gap:
                return False
            pos += 1
        if pos == len(actual):
            return False
        pos, gap = pos + 1, False
    return gap or pos == len(actual)


OUTPUTS = [(p, o) for p in PAGES for o in _shown_outputs(p)]


@pytest.mark.parametrize("page, shown", OUTPUTS, ids=[f"{p.name}:{o['line']}" for p, o in OUTPUTS])
def test_shown_outputs_are_what_the_commands_print(page, shown, tmp_path, monkeypatch):
    """Output pasted in the docs is what the command prints today (wall times aside): a model change
    that moves a number shows up here, to be pasted again."""
    for folder in ("scenarios", "tests"):
        (tmp_path / folder).symlink_to(ROOT / folder)
    monkeypatch.chdir(tmp_path)
    for argv in shown["commands"]:
        target = None
        if ">" in argv:
            argv, target = argv[:argv.index(">")], argv[argv.index(">") + 1]
        status, out, err = _run_stepsim(argv)
        if target:
            Path(target).write_text(out)
    actual = (out + err) if shown["stderr"] else out
    assert _matches(shown["shown"], actual.splitlines()), \
        f"{page.name}:{shown['line']}: stepsim {' '.join(argv)} now prints:\n{actual}"


def test_every_command_is_documented():
    """docs/commands.md has a section per subcommand of the parser."""
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    text = (DOCS / "commands.md").read_text()
    for name in sub.choices:
        assert re.search(rf"^## `?stepsim {re.escape(name)}\b", text, re.M), name



def test_the_extending_page_lists_every_shipped_profile():
    """docs/extending.md names the shipped profiles in one sentence: it must list exactly those of
    simulator/data/frameworks/ (a profile added without the page, or removed, fails here)."""
    import re
    from simulator.parts.frameworks import framework_names
    text = (DOCS / "extending.md").read_text()
    sentence = text[text.index("profiles are in `simulator/data/frameworks/`"):].split(";")[0]
    assert tuple(sorted(re.findall(r"`([a-z0-9.-]+)`", sentence.split("(", 1)[1]))) == framework_names()
