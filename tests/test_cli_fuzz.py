"""Property-based fuzz of the command line (hypothesis), run in-process so thousands of inputs fit in CI.

Every generated command must end in one of two ways: exit 0 with a sane report on stdout, or
exit 2 with exactly one line on stderr naming a field. Never a traceback, never a hang (each
example runs under a SIGALRM deadline), and never silent acceptance: a scenario value outside
its documented domain (type, range, ``simulator.common.limits``) that exits 0 fails the test, checked
by an oracle written independently of ``scenario.py``. Runs are derandomized, so CI sees the
same inputs every time; the counts of each outcome are printed (``pytest -s``).
"""

import contextlib
import io
import json
import math
import signal
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator import cli
from simulator.common import limits

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "scenarios" / "tiny.yaml")
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


def flag_argv(command, flag, word):
    base = {"collective": ["collective", "--sizes", "1MiB"], "run": ["run", TINY],
            "whatif": ["whatif", TINY, "--workers", "1"],
            "sweep": ["sweep", TINY, "--vary", "parallelism.tp=1,2", "--out", "{out}"],
            "validate": ["validate", str(ROOT / "tests" / "data" / "nemo-2407-runs.yaml"), "--workers", "1"]}[command]
    return [*base, flag, word]


FLAGS = {"collective": ["--gpus", "--sizes", "--op", "--algorithm", "--cluster", "--network-bandwidth-Gbps",
                        "--nvlink-bandwidth-GBps", "--oversubscription"],
         "run": ["--algorithm", "--stages", "--window"],
         "whatif": ["--factor", "--workers"], "sweep": ["--workers", "--vary", "--executor"],
         "validate": ["--workers"]}


def test_fuzz_flags_in_process():
    """Flag values of collective, run, whatif, sweep and validate: expensive valid runs are skipped, the
    rest must be exit 0 or one line."""
    tmp = Path(tempfile.mkdtemp(prefix="stepsim-fuzz-"))
    pairs = st.sampled_from([(c, f) for c, fs in FLAGS.items() for f in fs])

    @settings(FUZZ, max_examples=600)
    @given(pairs, words)
    def one(pair, word):
        command, flag = pair
        if command == "collective" and flag == "--gpus" and word.lstrip("-").isdigit() and 2 <= int(word) <= 131072:
            word = str(min(int(word), 64))  # a real but quick collective
        if command in ("whatif", "sweep", "validate") and word.lstrip("-").isdigit() and int(word) >= 1:
            return  # a valid worker count runs the whole study: covered by tests/test_sweep.py
        if command == "whatif" and flag == "--factor":
            try:
                if 1 < float(word) <= 1000:
                    return
            except ValueError:
                pass
        if command == "sweep" and flag == "--vary" and "=" not in word:
            pass
        argv = [a.replace("{out}", str(tmp / "sweep")) for a in flag_argv(command, flag, word)]
        if command == "run" and flag in ("--stages", "--window"):
            argv += ["--timeline", str(tmp / "t.png")]
        status, out, err = invoke(argv)
        check_outcome(argv, status, out, err, f"flags {command}")
        if status == 0 and command == "collective" and flag == "--gpus":
            assert 2 <= int(word) <= 131072
    one()
    print(f"\nfuzz flags: {dict(sorted((k, v) for k, v in COUNTS.items() if k.startswith('flags')))}")


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
