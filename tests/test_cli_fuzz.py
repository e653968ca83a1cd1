"""Property-based fuzz of the command line (hypothesis), in one process so thousands of inputs fit in CI.

Every generated command must end in one of two ways: exit 0 with a sane report on stdout, or
exit 2 with exactly one line on stderr naming a field. Never a traceback, never a hang (each
example runs under a deadline), and never silent acceptance: a scenario value outside
its documented domain (type, range, ``simulator.common.limits``) that exits 0 fails the test, checked
by an oracle written independently of ``scenario.py``. The first tests run in this process under
SIGALRM; the last ones, over every option of every command and over ``--set`` values as YAML, run
in the child of ``tests/sandbox.py``, which also measures each case's peak memory against a budget
and survives a case that hangs. Runs are derandomized, so CI sees the same inputs every time; the
counts of each outcome are printed (``pytest -s``).
"""

import argparse
import contextlib
import io
import itertools
import json
import math
import signal
import tempfile
from collections import Counter
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sandbox
from simulator import cli
from simulator.cli import build_parser
from simulator.common import limits

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "scenarios" / "tiny.yaml")
PROFILE = ROOT / "tests" / "data" / "profiles" / "hta-adam-a100"  # a one-rank Kineto trace (tests/test_kineto.py)
DEADLINE_S = 30  # per example; tiny runs take well under a second
COUNTS: Counter = Counter()
FUZZ = settings(derandomize=True, database=None, deadline=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


class Hang(Exception):
    pass


def _alarm(_signum, _frame):
    raise Hang(f"no answer within {DEADLINE_S} s")


def invoke(argv: list[str]) -> tuple[int, str, str]:
    """Run the CLI in this process: (status, stdout, stderr). A traceback propagates and fails the test."""
    out, err = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(DEADLINE_S)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = cli.main(argv)
            except SystemExit as stop:  # argparse: --help, --version, usage errors
                status = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 2)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return status, out.getvalue(), err.getvalue()


def check_outcome(argv, status, out, err, kind: str) -> None:
    COUNTS[f"{kind}: exit {status}"] += 1
    assert "Traceback" not in err and "Traceback" not in out, (argv, err)
    if status == 2:
        # one error line; only an error that needs the simulation (a --window past the step's end)
        # may follow that simulation's progress lines
        *before, last = err.splitlines() or [""]
        assert err.endswith("\n") and last.startswith("stepsim: error: "), (argv, err)
        assert not before or ("--window" in argv and all(line.startswith("run: ") for line in before)), (argv, err)
        return
    assert status == 0, (argv, status, err)


# --- scenario keys -------------------------------------------------------------------------------

WHOLE = {  # key: (minimum, maximum) as documented in README / simulator.common.limits
    "model.hidden_size": (1, limits.HIDDEN_SIZE.maximum), "model.num_hidden_layers": (1, limits.NUM_LAYERS.maximum),
    "model.num_attention_heads": (1, limits.HIDDEN_SIZE.maximum),
    "model.intermediate_size": (1, limits.INTERMEDIATE_SIZE.maximum),
    "model.vocab_size": (1, limits.VOCAB_SIZE.maximum), "model.num_experts": (0, limits.NUM_EXPERTS.maximum),
    "model.num_experts_per_tok": (0, limits.NUM_EXPERTS.maximum),
    "cluster.num_nodes": (1, limits.NUM_GPUS.maximum),
    "training.seq_length": (1, limits.SEQ_LENGTH.maximum), "training.micro_batch_size": (1, limits.MICRO_BATCH.maximum),
    "training.global_batch_size": (1, limits.GLOBAL_BATCH.maximum),
    "parallelism.tp": (1, limits.NUM_GPUS.maximum), "parallelism.pp": (1, limits.NUM_GPUS.maximum),
    "parallelism.cp": (1, limits.NUM_GPUS.maximum), "parallelism.ep": (1, limits.NUM_GPUS.maximum),
    "parallelism.vp": (1, limits.NUM_LAYERS.maximum),
}
OPTIONAL_WHOLE = {"model.num_key_value_heads": (1, limits.HIDDEN_SIZE.maximum),  # null: as many as heads
                  "cluster.gpus_per_node": (1, limits.GPUS_PER_NODE.maximum),  # null: the topology's
                  "parallelism.dp": (1, limits.NUM_GPUS.maximum), "parallelism.etp": (1, limits.NUM_GPUS.maximum),
                  "model.moe_intermediate_size": (1, limits.INTERMEDIATE_SIZE.maximum)}
OPTIONAL_NUMBER = {  # key: (minimum, inclusive, maximum)
    "cluster.nvlink_bandwidth_GBps": (0, False, limits.NVLINK_GBPS.maximum),
    "cluster.network_bandwidth_Gbps": (0, False, limits.NETWORK_GBPS.maximum),
    "cluster.oversubscription": (1, True, limits.OVERSUBSCRIPTION.maximum),
    "cluster.gpu_memory_gib": (0, False, limits.GPU_MEMORY_GIB.maximum),
    "cluster.gpu_peak_tflops": (0, False, limits.GPU_PEAK_TFLOPS.maximum),
}
CHOICES = {"training.precision": ("bf16", "fp16", "fp8"), "training.recompute": ("none", "selective", "full"),
           "training.attention": ("flash", "unfused"), "parallelism.zero_stage": (0, 1, 2, 3),
           "schedule": ("gpipe", "1f1b", "interleaved"),
           "model.hidden_act": ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swiglu")}
BOOLEAN = ("parallelism.sequence_parallel", "model.tie_word_embeddings")
KEYS = sorted([*WHOLE, *OPTIONAL_WHOLE, *OPTIONAL_NUMBER, *CHOICES, *BOOLEAN])
UNKNOWN_KEYS = ("parallelism.tensor", "model.hidden", "training", "cluster.gpus", "nothing.at_all", "model.tp.x")


def _is_whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def in_domain(key: str, value) -> bool:
    """The documented domain of one key, written independently of scenario.py."""
    if key in WHOLE:
        lo, hi = WHOLE[key]
        return _is_whole(value) and lo <= value <= hi
    if key in OPTIONAL_WHOLE:
        lo, hi = OPTIONAL_WHOLE[key]
        return value is None or (_is_whole(value) and lo <= value <= hi)
    if key in OPTIONAL_NUMBER:
        lo, inclusive, hi = OPTIONAL_NUMBER[key]
        if value is None:
            return True
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            return False
        return (value >= lo if inclusive else value > lo) and value <= hi
    if key in CHOICES:
        return any(type(value) is type(c) and value == c for c in CHOICES[key])
    if key in BOOLEAN:
        return isinstance(value, bool)
    return False


def yaml_text(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else (".nan" if math.isnan(value) else ("-.inf" if value < 0 else ".inf"))
    return str(value)


def parsed(text: str):
    import yaml
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


values = st.one_of(
    st.integers(-3, 70), st.integers(-10**6, 10**6), st.integers(2**17 - 2, 2**25), st.sampled_from([10**30, -10**30]),
    st.floats(allow_nan=True, allow_infinity=True), st.floats(0.1, 1e4), st.booleans(), st.none(),
    st.sampled_from(["bf16", "fp4", "gelu", "silu", "flash", "unfused", "selective", "1f1b", "gpipe", "", "[1, 2]",
                     "{a: 1}", "'8'", "8.0", "0x10", "1e3", "ring", "none", "full", "yes", "~"]),
)


def test_fuzz_scenario_keys_in_process():
    """Slow-ish (about 40 s): one or two --set overrides of tiny.yaml, on `memory` (no simulation)."""

    @settings(FUZZ, max_examples=1200)
    @given(st.lists(st.tuples(st.one_of(st.sampled_from(KEYS), st.sampled_from(UNKNOWN_KEYS)), values),
                    min_size=1, max_size=2), st.booleans())
    def one(overrides, as_json):
        sets = [a for k, v in overrides for a in ("--set", f"{k}={yaml_text(v)}")]
        argv = ["memory", TINY, *sets, *(["--json"] if as_json else [])]
        status, out, err = invoke(argv)
        check_outcome(argv, status, out, err, "scenario keys")
        if status == 0:
            final = {}
            for k, v in overrides:
                final[k] = parsed(yaml_text(v))
            for k, v in final.items():
                assert k not in UNKNOWN_KEYS, (argv, "unknown key accepted")
                assert in_domain(k, v), (argv, f"{k}={v!r} accepted silently")
            if as_json:
                mem = json.loads(out)
                assert math.isfinite(mem["peak_gib"]) and mem["peak_gib"] > 0
    one()
    print(f"\nfuzz scenario keys: {dict(sorted((k, v) for k, v in COUNTS.items() if k.startswith('scenario')))}")


plausible = st.sampled_from([
    "parallelism.tp=1", "parallelism.tp=4", "parallelism.tp=3", "parallelism.pp=1", "parallelism.pp=4",
    "parallelism.dp=null", "parallelism.dp=1", "parallelism.dp=4", "parallelism.cp=2", "parallelism.vp=2",
    "parallelism.zero_stage=3", "parallelism.sequence_parallel=true", "training.global_batch_size=16",
    "training.global_batch_size=6", "training.micro_batch_size=2", "training.recompute=full",
    "training.recompute=selective", "training.attention=unfused", "training.precision=fp8",
    "training.seq_length=512", "training.seq_length=1000", "model.num_key_value_heads=2",
    "model.num_key_value_heads=3", "model.intermediate_size=4097", "model.vocab_size=32001",
    "model.num_experts=8", "model.num_experts_per_tok=2", "parallelism.ep=2", "schedule=gpipe",
    "schedule=interleaved", "cluster.num_nodes=2", "cluster.network_bandwidth_Gbps=100",
    "cluster.nvlink_bandwidth_GBps=50", "model.hidden_act=silu", "model.num_hidden_layers=8",
])


def test_fuzz_run_on_small_plans_in_process():
    """Slow-ish (about 30 s): `run --json` of tiny.yaml under plausible overrides: a sane report or one line."""
    @settings(FUZZ, max_examples=120)
    @given(st.lists(plausible, min_size=0, max_size=4, unique=True), st.sampled_from(["auto", "ring", "hierarchical"]))
    def one(sets, algorithm):
        argv = ["run", TINY, "--json", "--allow-oom", "--algorithm", algorithm, *(a for s in sets for a in ("--set", s))]
        status, out, err = invoke(argv)
        check_outcome(argv, status, out, err, "run")
        if status == 0:
            r = json.loads(out)
            assert math.isfinite(r["step_time_s"]) and r["step_time_s"] > 0
            assert 0 < r["mfu"] <= r["hfu"] < 1 and 0 <= r["bubble_fraction"] < 1
            assert r["critical_path"]["total_s"] == pytest.approx(r["step_time_s"], rel=1e-9)
    one()
    print(f"\nfuzz run: {dict(sorted((k, v) for k, v in COUNTS.items() if k.startswith('run')))}")


words = st.one_of(st.integers(-10**12, 10**12).map(str), st.sampled_from(
    ["0", "1", "2", "-1", "abc", "", "1e400", "nan", "inf", "0.5", "1MiB", "1GiB,8GiB", "3XB", "auto", "ring",
     "hierarchical", "all_reduce", "send_recv", "all_to_all", "dgx-a100", "nope", "1:2", "0-3", "a:b", "1,2,3"]))


def test_fuzz_output_paths_in_process():
    """Output paths of run --trace/--timeline, validate --plot, sweep/whatif --out: checked before any work."""
    tmp = Path(tempfile.mkdtemp(prefix="stepsim-fuzz-"))
    (tmp / "dir").mkdir()
    (tmp / "file.png").write_bytes(b"old")
    (tmp / "file.json").write_text("old")
    parents = st.sampled_from([str(tmp), str(tmp / "dir"), str(tmp / "missing"), str(tmp / "file.png"),
                               str(tmp / "file.json"), "/proc/1", "/nonexistent/deep"])
    names = st.one_of(st.sampled_from(["step", "x", ".hidden", "dir", "file", "a b", "é", "x" * 300, ""]),
                      st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00/"), max_size=12))
    suffixes = st.sampled_from(["", ".png", ".svg", ".pdf", ".json", ".PNG", ".txt", ".json.gz", "/"])
    targets = st.sampled_from([("run", "--trace"), ("run", "--timeline"), ("validate", "--plot"),
                               ("sweep", "--out"), ("whatif", "--out")])

    @settings(FUZZ, max_examples=400)
    @given(targets, parents, names, suffixes)
    def one(target, parent, name, suffix):
        command, flag = target
        path = f"{parent}/{name}{suffix}"
        if command in ("sweep", "whatif", "validate"):
            # the path check comes first; a path that passes it would start the whole study, so an
            # invalid scenario / runs file stops right after it: exit 2 either way, on the path or on that
            argv = {"sweep": ["sweep", TINY, "--vary", "parallelism.nope=1", flag, path],
                    "whatif": ["whatif", TINY, "--set", "parallelism.tp=3", flag, path],
                    "validate": ["validate", str(tmp / "no-runs.yaml"), flag, path]}[command]
        else:
            argv = ["run", TINY, flag, path]
        status, out, err = invoke(argv)
        check_outcome(argv, status, out, err, f"paths {command} {flag}")
        if command != "run":
            assert status == 2
        elif status == 0:
            written = Path(path)
            assert written.is_file() and written.stat().st_size > 0
            assert written.suffix.lower() in ((".json",) if flag == "--trace" else (".png", ".svg", ".pdf"))
    one()
    print(f"\nfuzz output paths: {dict(sorted((k, v) for k, v in COUNTS.items() if k.startswith('paths')))}")


# --- every option of every command, in a sandbox with a time and a memory budget -----------------

OPTION_TIMEOUT_S = 300  # a hang, not a speed measure: the slowest valid case (plan, 8 workers) takes seconds
OPTION_MEMORY = 256 * sandbox.MiB  # peak resident growth of one case; the largest seen is 40 MiB (a sweep)
LAUGHS = "[" + ", ".join(["&l0 [" + ",".join(["lol"] * 9) + "]"] +
                         [f"&l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 9)]) + "]"

odd_words = st.one_of(
    words,
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=24),
    st.sampled_from(["1e400", "-1e400", "-0", "0x10", "1_000", "1%", "50%", "101%", "-1%", "%", "%%", "50%%",
                     "٣", "８", "１MiB", "1 MiB", "1.5GiB", "1e3MiB", "0.0000001", "9" * 5000, str(10**30), "-",
                     "--", "=", "a=b", "tp=1,2", "tp=", "=1", "parallelism.tp=1,2", "parallelism.tp=", "tp=4,4",
                     "micro_batch_size=0", "zero_stage=9", "recompute=sometimes", "&a [*a]", "*a", LAUGHS,
                     "tp=" + LAUGHS, "parallelism.tp=" + LAUGHS, ",".join(["1"] * 300), "0-1", "1-0", "0:1e-9",
                     ":", "::", "0:", ":0", "inf:", "nan", "1:nan", "x.png", "x.json", "x.html", "x.md", "x.yaml",
                     "sub/x.png", "/dev/null", "/dev/zero", "/proc/1/x.png", ".", "..", "/", "é.png",
                     "process", "step_time", "tokens_per_s_per_gpu", "exact", "simulated", "auto", "ring",
                     "nvls", "sharp", "hierarchical", "dgx-h100", "gb200-nvl72", "localhost:6379", "ray://x:1"]),
    st.lists(st.sampled_from(["1", "2", "8", "0", "-1", "x", "1MiB", "nan", "", " "]), min_size=2, max_size=6)
    .map(",".join),
)


def value_options() -> list[tuple[str, str]]:
    """(command, option) for every option of every subcommand that takes a value, from the parser."""
    found = []
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command, sub in action.choices.items():
                for opt in sub._actions:
                    if opt.option_strings and opt.nargs is None and opt.const is None and \
                            not isinstance(opt, (argparse._HelpAction, argparse._VersionAction)):
                        found.append((command, opt.option_strings[0]))
    return found


def option_argv(command: str, option: str, word: str, folder: Path, n: int) -> list[str] | None:
    """A cheap command line around ``option word``; None for a case that would start a costly study."""
    runs = folder / "runs.yaml"  # one case, of a GPU no catalog has: read, checked, then "none ran"
    audited = folder / "audited.yaml"
    narrow = ["--space", "tp=1,2", "--space", "pp=1", "--space", "cp=1", "--space", "micro_batch_size=1",
              "--space", "recompute=none", "--space", "zero_stage=1", "--space", "schedule=1f1b"]
    if option == "--executor" and word == "ray":
        return None  # a local Ray cluster per case: tests/test_sweep.py runs one
    if option == "--set" and command not in ("run", "memory"):
        return None  # the same apply_overrides as run and memory, and the stop below relies on the base's --set
    if command == "collective" and option == "--gpus" and word.isascii() and word.isdigit() and len(word) < 8 \
            and 64 < int(word) <= limits.NUM_GPUS.maximum:
        word = "64"  # a real but quick collective
    if command == "plan" and option == "--space":
        axis = word.partition("=")[0].strip()
        narrow = [a for pair in zip(narrow[::2], narrow[1::2]) if not pair[1].startswith(f"{axis}=") for a in pair]
    base = {"collective": ["collective", "--sizes", "1MiB", "--gpus", "8"],
            "run": ["run", TINY],
            "memory": ["memory", TINY],
            "validate": ["validate", str(runs), "--workers", "1", "--quiet"],
            "plan": ["plan", TINY, "--workers", "1", "--quiet", *narrow],
            "report": ["report", TINY, "--out", str(folder / "memo.html"), "--set", "parallelism.tp=3"],
            "audit": ["audit", str(audited)],
            "sweep": ["sweep", TINY, "--vary", "parallelism.tp=1,2", "--out", str(folder / f"sweep{n}"), "--workers",
                      "1", "--quiet"],
            "whatif": ["whatif", TINY, "--workers", "1", "--set", "parallelism.tp=3", "--quiet"],
            "calibrate": ["calibrate", str(PROFILE), "--scenario", TINY, "--out", str(folder / f"cal{n}.yaml"),
                          "--quiet"]}[command]
    if command == "run" and option in ("--stages", "--window"):
        base = [*base, "--timeline", str(folder / "t.png")]
    return [*base, option, word]


def test_fuzz_every_option_of_every_command_in_a_sandbox(tmp_path):
    """Every option that takes a value, of every command (walked from the parser), given odd words: exit
    0 or one line with exit 2, within the time and memory budget of each case (tests/sandbox.py)."""
    options = value_options()
    assert len(options) > 30 and ("plan", "--tolerance") in options and ("run", "--window") in options
    (tmp_path / "runs.yaml").write_text(yaml.safe_dump({"cases": [{
        "id": "c", "model": {"hf_id": "meta-llama/Llama-3.1-8B", "seq_len": 2048, "layers": 32},
        "hardware": {"gpu": "H999", "count": 8}, "parallelism": {"tp": 1, "pp": 1, "gbs": 8},
        "measured": {"step_time_s": 1.0}}]}))
    (tmp_path / "audited.yaml").write_text(Path(TINY).read_text() + "claims:\n  step_time_s: 0.01\n")
    box = sandbox.Sandbox(cwd=str(tmp_path))
    counter = itertools.count()
    peaks: Counter = Counter()
    try:
        @settings(FUZZ, max_examples=700)
        @given(st.sampled_from(options), odd_words)
        def one(pair, word):
            command, option = pair
            argv = option_argv(command, option, word, tmp_path, next(counter))
            if argv is None:
                return
            out = box.call(sandbox.cli, argv, timeout_s=OPTION_TIMEOUT_S)
            assert out.kind == "ok", (argv, out.kind, out.value, out.trace)
            status, stdout, stderr = out.value
            check_outcome(argv, status, stdout, stderr, f"options {command}")
            if status == 0 and command == "collective" and option == "--gpus":
                assert 2 <= int(argv[-1]) <= 131072
            assert out.peak_bytes < OPTION_MEMORY, (argv, out.peak_bytes)
            peaks[command] = max(peaks[command], out.peak_bytes)
        one()
    finally:
        box.close()
    print(f"\nfuzz options: {dict(sorted((k, v) for k, v in COUNTS.items() if k.startswith('options')))}")
    print(f"peak MiB per command: { {k: round(v / sandbox.MiB) for k, v in sorted(peaks.items())} }")


yaml_values = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40),
    st.lists(st.sampled_from(list("&*[]{}:,-?!|>'\"# ") + ["&a", "*a", "<<", "1", "x", "null", "1e400",
                                                           "9" * 5000, "2024-02-30"]), max_size=30).map("".join),
    st.sampled_from([LAUGHS, "&a [*a]", "[" * 200 + "]" * 200, "{a: &x 1, b: *x}", "!!binary aGk=",
                     "!!python/object:os.system x", "2024-02-30", "9" * 5000, "[1, 2]", "{}", "~"]),
)


def test_fuzz_set_values_as_yaml_in_a_sandbox(tmp_path):
    """--set KEY=VALUE reads VALUE as YAML through the bounded loader: anchors, aliases, deep nesting,
    tags and numbers Python cannot read are a value or one line, never a hang or a traceback."""
    box = sandbox.Sandbox(cwd=str(tmp_path))
    try:
        @settings(FUZZ, max_examples=300)
        @given(st.sampled_from(KEYS + ["name", "model", "faults.stragglers", "model.layer_types"]), yaml_values)
        def one(key, value):
            argv = ["memory", TINY, "--set", f"{key}={value}"]
            out = box.call(sandbox.cli, argv, timeout_s=OPTION_TIMEOUT_S)
            assert out.kind == "ok", (argv, out.kind, out.value, out.trace)
            check_outcome(argv, *out.value, "set values")
            assert len(out.value[2]) < 2000, (argv, "an error line past 2,000 characters")
            assert out.peak_bytes < OPTION_MEMORY, (argv, out.peak_bytes)
        one()
    finally:
        box.close()
    print(f"\nfuzz set values: {dict(sorted((k, v) for k, v in COUNTS.items() if k.startswith('set values')))}")
