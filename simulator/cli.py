"""The ``stepsim`` command line. Bad input prints one line and exits with status 2."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys

from simulator.common import limits, units
from simulator.common.errors import ConfigError
from simulator.common.outputs import FIGURE_SUFFIXES, JSON_SUFFIXES, check_output_folder, check_output_path
from simulator.common.progress import add_progress_flags, progress_from_args


# ``stepsim plan --tolerance``'s default as its help shows it: the planner's DEFAULT_TOLERANCE
# (a test holds them equal), written here so that building the parser does not import the planner
# and with it numpy and networkx (every --help and every one-line error paid 0.8 s for them).
TOLERANCE_HELP_DEFAULT = "0%"


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # A value that starts with a minus and a digit (-1%, -1GiB, -0.5) is a value, so its flag's
        # own check names what is valid; argparse's default takes only plain negative numbers and
        # otherwise reports "expected one argument". No stepsim option looks like a number.
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message: str):
        self.exit(2, f"stepsim: error: {message}\n")


def _collective(args) -> int:
    from simulator.network.collectives import ALGORITHMS, OPS, algorithm_used, bus_factor, time_collective
    from simulator.network.cluster import build_cluster
    from simulator.parts.topology import load_topology

    if args.op not in OPS:
        raise ConfigError("--op", args.op, f"valid: {', '.join(OPS)}")
    if args.algorithm not in ALGORITHMS:
        raise ConfigError("--algorithm", args.algorithm, f"valid: {', '.join(ALGORITHMS)}")
    if args.gpus < 2:
        raise ConfigError("--gpus", args.gpus, "a collective needs at least 2 GPUs")
    if args.gpus > limits.NUM_GPUS.maximum:
        raise ConfigError("--gpus", args.gpus, f"must be {limits.NUM_GPUS.describe()}")
    spec = load_topology(args.cluster)
    num_nodes = math.ceil(args.gpus / spec.gpus_per_node)
    cluster = build_cluster(spec, num_nodes, network_bandwidth_Gbps=args.network_bandwidth_Gbps,
                            nvlink_bandwidth_GBps=args.nvlink_bandwidth_GBps,
                            oversubscription=args.oversubscription)
    sizes = [units.parse_size(s, "--sizes") for s in args.sizes.split(",") if s.strip()]
    ranks = list(range(args.gpus))
    if args.op == "send_recv":
        ranks = [0, args.gpus - 1]
    rows = []
    for size in sizes:
        t, _ = time_collective(cluster, args.op, ranks, size, args.algorithm)
        algbw = size / t / 1e9
        rows.append({"size_bytes": size, "time_s": t, "algbw_GBps": algbw,
                     "busbw_GBps": algbw * bus_factor(args.op, len(ranks))})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    used = sorted({algorithm_used(cluster, args.op, ranks, size, args.algorithm) for size in sizes})
    ran = "" if args.algorithm == "auto" or used == [args.algorithm] else \
        f" (not available for {args.op} here: ran {', '.join(used)})"
    print(f"# {args.op} over {args.gpus} GPUs of {cluster.spec.name} ({num_nodes} node(s)), "
          f"algorithm {args.algorithm}{ran}")
    print(f"{'size':>12} {'bytes':>14} {'time_us':>12} {'algbw_GB/s':>11} {'busbw_GB/s':>11}")
    for r in rows:
        print(f"{units.format_size(r['size_bytes']):>12} {r['size_bytes']:>14d} {r['time_s'] * 1e6:>12.2f} "
              f"{r['algbw_GBps']:>11.2f} {r['busbw_GBps']:>11.2f}")
    return 0


def _load(args):
    """The scenario of a command's arguments, checked; its warnings go to stderr."""
    from simulator import simulation

    s = simulation.load_scenario(args.scenario, args.set or [])
    warnings = simulation.check(s)
    for w in warnings:
        _warn(w)
    return s, list(warnings)


def _warn(text: str) -> None:
    print(f"stepsim: warning: {text}", file=sys.stderr)


def _check_memory(s, args) -> None:
    from simulator import simulation

    if not args.allow_oom:
        simulation.check_fits(s, simulation.memory_record(s))


def _run(args) -> int:
    from simulator import simulation
    from simulator.network.collectives import ALGORITHMS

    if args.algorithm not in ALGORITHMS:
        raise ConfigError("--algorithm", args.algorithm, f"valid: {', '.join(ALGORITHMS)}")
    if args.trace:
        check_output_path(args.trace, "--trace", JSON_SUFFIXES)
    if args.timeline:
        check_output_path(args.timeline, "--timeline", FIGURE_SUFFIXES)
    elif args.stages is not None or args.window is not None:
        raise ConfigError("--stages" if args.stages is not None else "--window",
                          args.stages if args.stages is not None else args.window, "only applies with --timeline FILE")
    with progress_from_args(args, "run") as bar:
        bar.phase("loading the scenario")
        s = simulation.load_scenario(args.scenario, args.set or [])
        if args.stages is not None or args.window is not None:
            from simulator.reports.timeline import parse_stages, parse_window
            if args.stages is not None:
                parse_stages(args.stages, s.parallelism.pp)
            if args.window is not None:
                parse_window(args.window, math.inf)
        fold = not (args.no_fold or args.trace_all_ranks)
        result = simulation.run(s, fold=fold, algorithm=args.algorithm, allow_oom=args.allow_oom,
                                record_flows=bool(args.json), progress=bar, on_warning=_warn)
        if args.trace:
            bar.phase(f"writing {args.trace}")
            result.write_trace(args.trace)
        if args.timeline:
            bar.phase(f"drawing {args.timeline}")
            from simulator.reports.plots import plot_timeline
            from simulator.reports.timeline import parse_stages, parse_window, select, timeline
            tl = timeline(result.result, result.to_dict(analyses=False))
            stages = parse_stages(args.stages, tl.stages) if args.stages is not None else None
            window = parse_window(args.window, tl.step_time_s) if args.window is not None else None
            plot_timeline(select(tl, stages, window), args.timeline)
        if args.json:
            bar.phase("critical path, link use, communication map")
            text = result.to_json()
    print(text if args.json else result.summary())
    return 0


def _memory(args) -> int:
    from simulator import simulation

    s, _ = _load(args)
    from simulator.reports.memory import format_memory_table

    mem = simulation.memory_record(s).to_dict()
    print(json.dumps(mem, indent=2) if args.json else format_memory_table(mem))
    return 0


def _validate(args) -> int:
    from pathlib import Path

    from simulator.studies.validate import format_table, validate_file
    from simulator.studies.validation_page import page

    if args.plot:
        check_output_path(args.plot, "--plot", FIGURE_SUFFIXES)
        if len(args.runs) > 1:
            raise ConfigError("--plot", args.plot, "draws one runs file: give one file, or drop --plot")
    if args.json and args.markdown:
        raise ConfigError("--markdown", True, "prints the validation page; it cannot be combined with --json")
    results = []
    with progress_from_args(args, "validate") as bar:
        for runs in args.runs:
            results.append((runs, validate_file(runs, workers=args.workers, progress=bar)))
    if args.plot:
        from simulator.reports.plots import plot_validation
        plot_validation(results[0][1], args.plot)
    if args.markdown:
        print(page([(Path(runs).stem, runs, result) for runs, result in results]), end="")
    elif len(results) == 1:
        print(json.dumps(results[0][1], indent=2) if args.json else format_table(results[0][1]))
    elif args.json:
        print(json.dumps({runs: result for runs, result in results}, indent=2))
    else:
        print("\n\n".join(f"== {runs}\n{format_table(result)}" for runs, result in results))
    for runs, result in results:
        _none_ran(result["rows"], lambda r: isinstance(r.get("error"), str), runs, "simulated")
    return 0


def _none_ran(rows: list[dict], failed, runs: str, what: str) -> None:
    """A runs file of which no case could be ``what`` (simulated, planned) is bad input: exit 2 with
    the first case's reason, after the table printed case by case (validate, plan --validate)."""
    if rows and all(failed(r) for r in rows):
        raise ConfigError("runs", runs, f"no case could be {what}; the first, {rows[0]['id']}, says: "
                                        f"{rows[0]['error']}")


def _sweep(args) -> int:
    from simulator.studies.sweep import CSV, JSONL, format_table, run_sweep

    _check_workers(args)
    check_output_folder(args.out, "--out")
    rows = run_sweep(args.scenario, args.vary, args.out, sets=args.set or [], workers=args.workers,
                     executor=args.executor, address=args.address, progress=None if args.quiet else sys.stderr)
    keys = [v.partition("=")[0].strip() for v in args.vary]
    print(format_table(rows, keys))
    print(f"{len(rows)} points: {args.out}/{CSV}, {args.out}/{JSONL} and plots")
    if rows and all(r.get("error") for r in rows):
        # the rows are saved above; a sweep of which no point could be simulated is bad input
        first = rows[0]
        raise ConfigError("--vary", _point_text(first["point"]),
                          f"no point of the sweep is valid; the first says: {first['error']}")
    return 0


def _point_text(point: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in point.items())


def _whatif(args) -> int:
    from simulator.studies.whatif import format_whatif, whatif, write_whatif

    _check_workers(args)
    if args.out:
        check_output_folder(args.out, "--out")
    s, _ = _load(args)
    _check_memory(s, args)
    with progress_from_args(args, "whatif") as bar:
        bar.phase("simulating the baseline and each resource faster and slower")
        result = whatif(args.scenario, sets=args.set or [], factor=args.factor, executor=args.executor,
                        workers=args.workers, address=args.address, progress=bar)
    if args.out:
        write_whatif(result, args.out)
    print(json.dumps(result, indent=2) if args.json else format_whatif(result))
    return 0


def _plan(args) -> int:
    from simulator.studies.planner import emit_scenario, format_plan, plan

    _check_workers(args)
    if args.out:
        check_output_folder(args.out, "--out")
    if args.emit:
        check_output_path(args.emit, "--emit", (".yaml", ".yml"))
    if args.validate:
        from simulator.studies.plan_check import check_runs, format_check

        result = check_runs(args.scenario, workers=args.workers)
        print(json.dumps(result, indent=2) if args.json else format_check(result))
        _none_ran(result["rows"], lambda r: "error" in r, args.scenario, "planned")
        return 0
    result = plan(args.scenario, sets=args.set or [], space=args.space or [], top=args.top, prove=args.prove,
                  objective=args.objective, max_memory_fraction=args.max_memory_fraction, out=args.out,
                  pareto=args.pareto == "exact",
                  tolerance=args.tolerance,
                  workers=args.workers, executor=args.executor, address=args.address,
                  progress=None if args.quiet else sys.stderr, force_progress=args.progress)
    if args.emit:
        emit_scenario(result, args.scenario, args.emit, sets=args.set or [])
    print(json.dumps(result, indent=2) if args.json else format_plan(result))
    return 0


def _report(args) -> int:
    import time
    from pathlib import Path

    from simulator.common.files import atomic_write, atomic_write_text
    from simulator.reports.memo import memo_html, memo_markdown
    from simulator.studies.designdoc import gather

    check_output_path(args.out, "--out", (".html", ".htm"))
    if args.md:
        check_output_path(args.md, "--md", (".md",))
    _check_workers(args)
    if not args.factor > 1:
        raise ConfigError("--factor", args.factor, "must be a number > 1 (2 means 2x faster and 2x slower)")
    _load(args)
    t0 = time.perf_counter()
    with progress_from_args(args, "report") as bar:
        bar.phase("simulating the step, its what-ifs, the fallback layout and the batch sizes")
        data = gather(args.scenario, args.set or [], factor=args.factor, workers=args.workers)
    atomic_write_text(args.out, memo_html(data))
    written = [args.out]
    if args.md:
        md = Path(args.md)
        paths = {}
        for name, png in sorted(data["figures"].items()):
            fig = md.with_name(f"{md.stem}-{name}.png")
            atomic_write(fig, lambda f, png=png: f.write(png), binary=True)
            paths[name] = fig.name
            written.append(str(fig))
        atomic_write_text(md, memo_markdown(data, paths))
        written.insert(1, str(md))
    print(f"memo written: {', '.join(written)} ({time.perf_counter() - t0:.1f} s wall)")
    return 0


def _audit(args) -> int:
    from simulator.common.files import atomic_write_text
    from simulator.reports.auditpage import audit_html
    from simulator.scenario.load import read_scenario_file
    from simulator.studies.audit import audit, format_audit, parse_claims

    if args.out:
        check_output_path(args.out, "--out", (".html", ".htm"))
    parse_claims(read_scenario_file(args.scenario))
    result = audit(args.scenario, args.set or [])
    if args.out:
        atomic_write_text(args.out, audit_html(result))
    print(json.dumps(result, indent=2) if args.json else format_audit(result))
    return 0


def _check_workers(args) -> None:
    from simulator.studies.workers import check_local_workers

    if args.workers is not None:
        check_local_workers(args.workers, getattr(args, "executor", "process"), getattr(args, "address", None))


def _diff(args) -> int:
    from simulator.studies.diff import diff_files, format_diff

    with progress_from_args(args, "diff") as bar:
        result = diff_files(args.a, args.b, progress=bar)
    print(json.dumps(result, indent=2) if args.json else format_diff(result, None if args.all else 60))
    return 0


def version() -> str:
    """The package's version (``simulator.__version__``, the one place it is written)."""
    from simulator import __version__

    return __version__


def _schema(args) -> int:
    if args.report:
        from simulator.reports.reference import markdown as report_markdown
        print(report_markdown(), end="")
        return 0
    from simulator.scenario.reference import json_schema, markdown

    print(markdown() if args.markdown else json.dumps(json_schema(), indent=2), end="" if args.markdown else "\n")
    return 0


def _bench(args) -> int:
    from simulator.studies.bench import run

    run(quick=args.quick, only="plan" if args.plan else "scale" if args.scale else None)
    return 0


def _scenario_parser(sub, name: str, text: str) -> argparse.ArgumentParser:
    """A subcommand that takes a scenario file and ``--set`` overrides."""
    parser = sub.add_parser(name, help=text)
    parser.add_argument("scenario", help="scenario YAML file")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override a scenario key, e.g. --set parallelism.tp=8 (repeatable)")
    return parser


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="stepsim", description="Simulate one training step of a large model on a GPU cluster.")
    p.add_argument("--version", action="version", version=f"stepsim {version()}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    c = sub.add_parser("collective", help="time one collective on an idle cluster (like nccl-tests)")
    c.add_argument("--op", default="all_reduce", help="all_reduce | reduce_scatter | all_gather | all_to_all | broadcast | send_recv")
    c.add_argument("--gpus", type=int, default=8)
    c.add_argument("--cluster", default="dgx-h100", help="topology name (simulator/data/topologies) or a YAML path")
    c.add_argument("--sizes", default="1MiB,16MiB,1GiB,8GiB", help="comma-separated sizes (nccl-tests conventions)")
    c.add_argument("--algorithm", default="auto", help="auto (NCCL's choice: ring or NVLS) | ring | hierarchical | nvls | sharp (NVLS+SHARP all_reduce across nodes)")
    c.add_argument("--network-bandwidth-Gbps", dest="network_bandwidth_Gbps", type=float, default=None)
    c.add_argument("--nvlink-bandwidth-GBps", dest="nvlink_bandwidth_GBps", type=float, default=None)
    c.add_argument("--oversubscription", type=float, default=None)
    c.add_argument("--json", action="store_true", help="print JSON")
    c.set_defaults(func=_collective)

    for name, func, text in (("run", _run, "simulate one training step of a scenario"),
                             ("memory", _memory, "memory per GPU and pipeline stage of a scenario")):
        r = _scenario_parser(sub, name, text)
        r.add_argument("--json", action="store_true", help="print the report as JSON")
        r.set_defaults(func=func)
        if name == "run":
            r.add_argument("--allow-oom", action="store_true", help="simulate even if the plan does not fit in memory")
            r.add_argument("--no-fold", action="store_true",
                           help="simulate every rank instead of one per pipeline stage (slow; for checking)")
            r.add_argument("--algorithm", default="auto", help="collective algorithm: auto (ring, or NVLS where NCCL's model prefers it) | ring | hierarchical | nvls | sharp")
            r.add_argument("--trace", metavar="FILE", help="write a Perfetto / Chrome trace (JSON) of the step")
            r.add_argument("--trace-all-ranks", action="store_true",
                           help="simulate unfolded so the trace holds every rank (slow on large clusters)")
            r.add_argument("--timeline", metavar="FILE", help="draw the step as a Gantt chart per stage (PNG/SVG/PDF)")
            r.add_argument("--stages", default=None, metavar="LIST",
                           help="timeline rows: stage numbers and ranges, e.g. 0,3,7 or 0-3,12 (default: all)")
            r.add_argument("--window", default=None, metavar="T0:T1",
                           help="timeline time window in seconds, e.g. 0.5:1.25 (default: the whole step)")
            add_progress_flags(r)
    v = sub.add_parser("validate", help="predict published training runs and report the error")
    v.add_argument("runs", nargs="+", help="files in the format of shared/validation/public-runs.yaml")
    v.add_argument("--json", action="store_true", help="print the result as JSON (a mapping by file for several)")
    v.add_argument("--markdown", action="store_true",
                   help="print the validation page (docs/validation.md): summaries and signed errors per file")
    v.add_argument("--plot", metavar="FILE", help="draw predicted against measured step time (PNG/SVG/PDF)")
    v.add_argument("--workers", type=int, default=2, help="simulations in parallel (processes)")
    add_progress_flags(v)
    v.set_defaults(func=_validate)

    pl = _scenario_parser(sub, "plan", "find the fastest layout of a scenario's model on its cluster, by simulation")
    pl.add_argument("--top", type=int, default=5, help="layouts in the table (default 5)")
    pl.add_argument("--prove", type=int, default=1,
                    help="ranks proven exact up to --tolerance (default 1, the best); the table's other rows are the "
                         "fastest of the layouts simulated, shown as >=rank unless no unsimulated layout could beat them")
    pl.add_argument("--json", action="store_true", help="print the result as JSON")
    pl.add_argument("--emit", metavar="FILE", help="write the best layout as a scenario file")
    pl.add_argument("--out", default=None, help="folder for plan.jsonl (a rerun skips what is done) and pareto.png")
    pl.add_argument("--workers", type=int, default=None, help="simulations in parallel (default: 2 or the CPU count)")
    pl.add_argument("--executor", default="process", choices=("process", "ray"),
                    help="process pool (default) or Ray (pip install 'stepsim[ray]')")
    pl.add_argument("--address", default=None, help="Ray cluster to join (default: start a local one)")
    pl.add_argument("--space", action="append", metavar="AXIS=V1,V2,...",
                    help="values of one axis, e.g. --space tp=4,8 (repeatable; axes: tp pp dp cp ep etp vp "
                         "micro_batch_size recompute zero_stage schedule sequence_parallel)")
    pl.add_argument("--objective", default="step_time", choices=("step_time", "tokens_per_s_per_gpu"))
    pl.add_argument("--max-memory-fraction", type=float, default=1.0,
                    help="a layout fits if its peak memory is at most this fraction of the GPU's (default 1)")
    pl.add_argument("--pareto", default="simulated", choices=("exact", "simulated"),
                    help="simulated: the front of the layouts the plan simulated (default); exact: also simulate "
                         "what the exact Pareto front needs (slower)")
    pl.add_argument("--tolerance", default=None, metavar="T",
                    help="prune a layout unless it could beat the shown one at its rank (or on the Pareto front) by "
                         f"more than T, a fraction or a percentage: 0 is exact (default {TOLERANCE_HELP_DEFAULT})")
    pl.add_argument("--validate", action="store_true",
                    help="SCENARIO is a public-runs file: plan every run and compare with its published layout")
    add_progress_flags(pl)
    pl.set_defaults(func=_plan)

    m = _scenario_parser(sub, "report", "a design memo (one self-contained HTML page) answering the design worksheet")
    m.add_argument("--out", required=True, metavar="FILE", help="the memo, HTML")
    m.add_argument("--md", metavar="FILE", help="also write the memo as Markdown (figures as FILE-stem-*.png)")
    m.add_argument("--factor", type=float, default=2.0, help="what-if factor for the bottleneck (default 2)")
    m.add_argument("--workers", type=int, default=None, help="simulations in parallel (default: CPU count)")
    add_progress_flags(m)
    m.set_defaults(func=_report)

    a = _scenario_parser(sub, "audit", "hold a plan's claims: section against a simulation of the plan")
    a.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    a.add_argument("--out", metavar="FILE", help="also write the audit as an HTML page")
    a.set_defaults(func=_audit)

    d = sub.add_parser("diff", help="what changed between two run/memory JSON reports, or two scenarios")
    d.add_argument("a", help="a report (.json, from run --json or memory --json) or a scenario (.yaml)")
    d.add_argument("b", help="the same kind of file as a")
    d.add_argument("--json", action="store_true", help="print the differences as JSON")
    d.add_argument("--all", action="store_true", help="list every changed field (default: the first 60)")
    add_progress_flags(d)
    d.set_defaults(func=_diff)

    sc = sub.add_parser("schema", help="the JSON Schema of scenario files (for editors), or the reference of the "
                                       "scenario keys or of the --json report fields")
    what = sc.add_mutually_exclusive_group()
    what.add_argument("--markdown", action="store_true", help="the scenario reference as Markdown (docs/scenario-reference.md)")
    what.add_argument("--report", action="store_true", help="the run --json report fields as Markdown (docs/report-reference.md)")
    sc.set_defaults(func=_schema)

    b = sub.add_parser("bench", help="wall time, peak memory and events of fixed simulations (not a test)")
    which = b.add_mutually_exclusive_group()
    which.add_argument("--quick", action="store_true", help="only the small cases")
    which.add_argument("--plan", action="store_true", help="only the planner cases (stepsim plan against one run)")
    which.add_argument("--scale", action="store_true",
                   help="only the GB200 NVL72 rack-scale cases, including 1,792 racks (129,024 GPUs)")
    b.set_defaults(func=_bench)

    for name, func, text in (("sweep", _sweep, "simulate the cartesian product of varied scenario keys, in parallel"),
                             ("whatif", _whatif, "step time with each link class or compute 2x faster and slower")):
        w = _scenario_parser(sub, name, text)
        w.add_argument("--workers", type=int, default=None, help="simulations in parallel (default: CPU count)")
        w.add_argument("--executor", default="process", choices=("process", "ray"),
                       help="process pool (default) or Ray (pip install 'stepsim[ray]')")
        w.add_argument("--address", default=None, help="Ray cluster to join (default: start a local one)")
        w.set_defaults(func=func)
        if name == "sweep":
            w.add_argument("--vary", action="append", required=True, metavar="KEY=V1,V2,...",
                           help="a scenario key and its values, e.g. --vary parallelism.tp=4,8 (repeatable)")
            w.add_argument("--out", default="results", help="folder for results.jsonl, results.csv and plots; "
                                                            "a rerun skips finished points")
            # a sweep reports each point on stderr even off a terminal (logs); --quiet silences it
            add_progress_flags(w)
        else:
            w.add_argument("--factor", type=float, default=2.0, help="how much faster and slower (default 2)")
            w.add_argument("--out", default=None, help="folder for whatif.csv, whatif.json and tornado.png")
            w.add_argument("--json", action="store_true")
            w.add_argument("--allow-oom", action="store_true", help="go on even if the plan does not fit in memory")
            add_progress_flags(w)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as err:
        print(f"stepsim: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
