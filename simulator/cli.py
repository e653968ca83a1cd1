"""The ``stepsim`` command line. Bad input prints one line and exits with status 2."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys

from simulator.common import limits, units
from simulator.common.errors import ConfigError, LeftOut, WorkerDied
from simulator.common.outputs import FIGURE_SUFFIXES, JSON_SUFFIXES, check_output_folder, check_output_path
from simulator.common.progress import add_progress_flags, progress_from_args

HTML_SUFFIXES = (".html", ".htm")
# what an --out that names a folder must not look like: a file of a kind the commands write
FILE_SUFFIXES = (*HTML_SUFFIXES, ".md", *JSON_SUFFIXES, ".jsonl", ".csv", ".yaml", ".yml", *FIGURE_SUFFIXES, ".txt")


# ``stepsim plan --tolerance``'s default as its help shows it: the planner's DEFAULT_TOLERANCE
# (a test holds them equal), written here so that building the parser does not import the planner
# and with it numpy and networkx (every --help and every one-line error paid 0.8 s for them).
TOLERANCE_HELP_DEFAULT = "0%"


def _help_text(text: str) -> str:
    """``text`` as argparse prints it: help strings are %-format templates, so a literal % is doubled."""
    return text.replace("%", "%%")


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
    if args.op == "all_to_all" and args.gpus * (args.gpus - 1) > limits.ALL_TO_ALL_PAIRS.maximum:
        most = (1 + math.isqrt(1 + 4 * limits.ALL_TO_ALL_PAIRS.maximum)) // 2  # the largest n with n (n - 1) <= it
        raise ConfigError("--gpus", args.gpus, f"an all_to_all over {args.gpus:,} GPUs couples "
                          f"{args.gpus * (args.gpus - 1):,} pairs; {limits.ALL_TO_ALL_PAIRS.describe()}: "
                          f"use at most {most:,} GPUs")
    _check_cluster_flags(args)
    sizes = [units.parse_size(s, "--sizes") for s in args.sizes.split(",") if s.strip()]
    if not sizes:
        raise ConfigError("--sizes", args.sizes, "give at least one size, e.g. 1MiB,1GiB")
    spec = load_topology(args.cluster)
    num_nodes = math.ceil(args.gpus / spec.gpus_per_node)
    cluster = build_cluster(spec, num_nodes, network_bandwidth_Gbps=args.network_bandwidth_Gbps,
                            nvlink_bandwidth_GBps=args.nvlink_bandwidth_GBps,
                            oversubscription=args.oversubscription)
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


def _check_cluster_flags(args) -> None:
    """collective's overrides of the topology, within the bounds of the scenario keys they stand for."""
    from simulator.common.schema import keys_of
    from simulator.scenario.config import ClusterConfig

    declared = keys_of(ClusterConfig)
    for flag, name in (("--network-bandwidth-Gbps", "network_bandwidth_Gbps"),
                       ("--nvlink-bandwidth-GBps", "nvlink_bandwidth_GBps"), ("--oversubscription", "oversubscription")):
        value, kind = getattr(args, name), declared[name].kind
        if value is None:
            continue
        low = value >= kind.minimum if kind.inclusive else value > kind.minimum
        if not (math.isfinite(value) and low and value <= kind.limit.maximum):
            bound = f">= {kind.minimum:g}" if kind.inclusive else f"> {kind.minimum:g}"
            raise ConfigError(flag, value, f"must be a number {bound} and {kind.limit.describe()}; "
                                           "leave it out for the topology's")


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
        kineto = args.trace_format == "kineto"
        check_output_path(args.trace, "--trace", (*JSON_SUFFIXES, ".gz") if kineto else JSON_SUFFIXES)
        if not str(args.trace).lower().endswith(JSON_SUFFIXES + (".json.gz",)):
            raise ConfigError("--trace", args.trace, "a Kineto trace ends in .json or .json.gz")
    elif args.trace_format != "perfetto":
        raise ConfigError("--trace-format", args.trace_format, "only applies with --trace FILE")
    if args.plot and not args.profile_diff:
        raise ConfigError("--plot", args.plot, "only applies with --profile-diff PROFILE")
    if args.plot:
        check_output_path(args.plot, "--plot", FIGURE_SUFFIXES)
    if args.timeline:
        check_output_path(args.timeline, "--timeline", FIGURE_SUFFIXES)
    elif args.stages is not None or args.window is not None:
        raise ConfigError("--stages" if args.stages is not None else "--window",
                          args.stages if args.stages is not None else args.window, "only applies with --timeline FILE")
    if args.window is not None:
        from simulator.reports.timeline import parse_window
        parse_window(args.window)  # its form; whether it lies inside the step is known after the simulation
    # every input is checked before the first progress line: bad input is one line on stderr
    c = simulation.checked(args.scenario, args.set or [], on_warning=_warn)
    if args.stages is not None:
        from simulator.reports.timeline import parse_stages
        parse_stages(args.stages, c.scenario.parallelism.pp)
    if not args.allow_oom:
        simulation.check_fits(c.scenario, c.memory)
    if args.profile_diff:
        from simulator.calibrate.kineto import check_traces
        check_traces(args.profile_diff)
    fold = not (args.no_fold or args.trace_all_ranks)
    if not fold:
        flag = "--no-fold" if args.no_fold else "--trace-all-ranks"
        factor = simulation.check_unfolded(c.scenario, flag)
        if factor > 1:
            _warn(f"{flag}: all {c.scenario.cluster.num_gpus:,} ranks are simulated instead of one per pipeline stage "
                  f"({c.scenario.parallelism.pp}): up to {factor:,}x the folded run's time and memory")
    with progress_from_args(args, "run") as bar:
        result = simulation.run(c, fold=fold, algorithm=args.algorithm, allow_oom=True,
                                record_flows=bool(args.json) or args.trace_format == "kineto",
                                progress=bar)
        if args.timeline:
            from simulator.reports.timeline import parse_stages, parse_window, timeline
            tl = timeline(result.result, result.to_dict(analyses=False))
            stages = parse_stages(args.stages, tl.stages) if args.stages is not None else None
            window = parse_window(args.window, tl.step_time_s) if args.window is not None else None
        if args.trace:
            bar.phase(f"writing {args.trace}")
            written = result.write_trace(args.trace, args.trace_format)
            if args.trace_format == "kineto":
                print(f"stepsim: Kineto trace(s): {', '.join(written)}", file=sys.stderr)
        diff = None
        if args.profile_diff:
            from simulator.calibrate.calibration import diff_record, format_comparison, profile_diff
            bar.phase("reading the profile")
            comparison = profile_diff(result, args.profile_diff)
            diff = diff_record(comparison)
            if args.plot:
                from simulator.reports.plots import plot_profile_diff
                bar.phase(f"drawing {args.plot}")
                plot_profile_diff(diff, args.plot)
        if args.timeline:
            bar.phase(f"drawing {args.timeline}")
            from simulator.reports.plots import plot_timeline
            from simulator.reports.timeline import view
            chart, overview = view(tl, stages, window)
            plot_timeline(chart, args.timeline, overview)
        if args.json:
            bar.phase("critical path, link use, communication map")
            report = result.to_dict()
            if diff is not None:
                report["profile_diff"] = diff
            text = json.dumps(report, indent=2)
    print(text if args.json else result.summary())
    if diff is not None and not args.json:
        print()
        print(format_comparison(comparison))
    return 0


def _calibrate(args) -> int:
    from simulator.calibrate.calibration import calibrate, diff_record, format_comparison

    from simulator import simulation
    from simulator.calibrate.kineto import check_traces

    check_output_path(args.out, "--out", (".yaml", ".yml"))
    simulation.checked(args.scenario, args.set or [], on_warning=_warn)  # bad input: one line, before progress
    check_traces(args.profile)
    with progress_from_args(args, "calibrate") as bar:
        comparison, data = calibrate(args.profile, args.scenario, args.out, sets=args.set or [], progress=bar,
                                     written_by=f"stepsim {version()} calibrate")
    if args.json:
        print(json.dumps({**diff_record(comparison), "calibration": data}, indent=2))
        return 0
    print(format_comparison(comparison, "calibrate", compared="calibrated"))
    factors = ", ".join(f"{name} {entry['factor']:.3g}" for name, entry in data["classes"].items())
    print(f"calibration written: {args.out} ({factors}; {data['covered']:.1%} of the profile's kernel time)")
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

    from simulator.studies.cases import load_cases
    from simulator.studies.validate import format_table, validate_file
    from simulator.studies.validation_page import load_constants, page

    if args.plot:
        check_output_path(args.plot, "--plot", FIGURE_SUFFIXES)
        if len(args.runs) > 1:
            raise ConfigError("--plot", args.plot, "draws one runs file: give one file, or drop --plot")
    if args.json and args.markdown:
        raise ConfigError("--markdown", True, "prints the validation page; it cannot be combined with --json")
    if args.constants is not None:
        if not args.markdown:
            raise ConfigError("--constants", args.constants, "appends a table to the validation page: give --markdown "
                                                             "with it")
        load_constants(args.constants)  # a bad file is reported before any case is predicted
    if args.collectives is not None:
        from simulator.studies.nccl_check import load_nccl_cases
        if not args.markdown:
            raise ConfigError("--collectives", args.collectives, "adds a section to the validation page: give "
                                                                 "--markdown with it")
        load_nccl_cases(args.collectives, "--collectives")
    _check_workers(args)
    for runs in args.runs:  # every file's cases are checked before the first is predicted
        load_cases(runs)
    results = []
    with progress_from_args(args, "validate") as bar:
        for runs in args.runs:
            results.append((runs, validate_file(runs, workers=args.workers, progress=bar)))
    if args.plot:
        from simulator.reports.plots import plot_validation
        plot_validation(results[0][1], args.plot, Path(args.runs[0]).name)
    if args.markdown:
        collectives = None
        if args.collectives is not None:
            from simulator.studies.nccl_check import score_nccl_file
            collectives = (args.collectives, score_nccl_file(args.collectives))
        print(page([(Path(runs).stem, runs, result) for runs, result in results], constants=args.constants,
                   collectives=collectives), end="")
    elif len(results) == 1:
        print(json.dumps(results[0][1], indent=2) if args.json else format_table(results[0][1]))
    elif args.json:
        print(json.dumps({runs: result for runs, result in results}, indent=2))
    else:
        print("\n\n".join(f"== {runs}\n{format_table(result)}" for runs, result in results))
    _raise_died([r for _, result in results for r in result["rows"]], "validate: case",
                "the other cases are in the table; validate keeps no log, so a rerun predicts every case again")
    for runs, result in results:
        _none_ran(result["rows"], lambda r: isinstance(r.get("error"), str), runs, "simulated")
    return 0


def _raise_died(rows: list[dict], what: str, after: str) -> None:
    """Exit 1 naming the first case whose worker process died (``worker_died`` rows), once the
    table of the others is printed (validate, plan --validate)."""
    died = [r for r in rows if r.get("worker_died")]
    if died:
        more = f" (and {len(died) - 1} more case{'s' if len(died) > 2 else ''})" if len(died) > 1 else ""
        raise WorkerDied(f"{what} {died[0]['id']}", died[0]["worker_died"] + more, after)


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
    keys = [v.partition("=")[0].strip() for v in args.vary]

    def show(rows: list[dict], complete: bool = True) -> None:
        if args.json:
            print(json.dumps(rows, indent=2))
            return
        print(format_table(rows, keys))
        if complete:  # an incomplete sweep draws no plots; its error line says where its rows are
            print(f"{len(rows)} points: {args.out}/{CSV}, {args.out}/{JSONL} and plots")

    with progress_from_args(args, "sweep") as bar:
        try:
            rows = run_sweep(args.scenario, args.vary, args.out, sets=args.set or [], workers=args.workers,
                             executor=args.executor, address=args.address, progress=bar)
        except WorkerDied as err:
            bar.close()
            show(err.rows, complete=False)
            raise
    show(rows)
    if rows and all(r.get("error") for r in rows):
        # the rows are saved above; a sweep of which no point could be simulated is bad input
        first = rows[0]
        raise ConfigError("--vary", _point_text(first["point"]),
                          f"no point of the sweep is valid; the first says: {first['error']}")
    return 0


def _point_text(point: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in point.items())


def _whatif(args) -> int:
    from simulator.studies.whatif import check_factor, format_whatif, whatif, write_whatif

    _check_workers(args)
    check_factor(args.factor)
    if args.out:
        check_output_folder(args.out, "--out")
    s, _ = _load(args)
    _check_memory(s, args)
    with progress_from_args(args, "whatif") as bar:
        result = whatif(args.scenario, sets=args.set or [], factor=args.factor, executor=args.executor,
                        workers=args.workers, address=args.address, progress=bar)
    if args.out:
        write_whatif(result, args.out)
    print(json.dumps(result, indent=2) if args.json else format_whatif(result))
    return 0


# ``plan --validate`` plans every run of a public-runs file with the planner's defaults: the flags
# that shape one plan of one scenario do not apply, and are refused rather than silently ignored.
PLAN_ONLY = (("set", "--set"), ("space", "--space"), ("top", "--top"), ("prove", "--prove"), ("emit", "--emit"),
             ("out", "--out"), ("executor", "--executor"), ("address", "--address"), ("objective", "--objective"),
             ("max_memory_fraction", "--max-memory-fraction"), ("pareto", "--pareto"), ("tolerance", "--tolerance"))


def _plan(args) -> int:
    from simulator.studies.planner import emit_scenario, format_plan, plan

    _check_workers(args)
    if args.validate:
        from simulator.studies.plan_check import check_runs, format_check

        for dest, flag in PLAN_ONLY:
            if getattr(args, dest) != args.plan_defaults[dest]:
                raise ConfigError(flag, getattr(args, dest), "does not apply with --validate, which plans every run "
                                                             "of a public-runs file with the planner's defaults; "
                                                             "leave it out")
        with progress_from_args(args, "plan --validate") as bar:
            result = check_runs(args.scenario, workers=args.workers, progress=bar)
        print(json.dumps(result, indent=2) if args.json else format_check(result))
        _raise_died(result["rows"], "plan --validate: case", "the other cases are in the table; a rerun plans "
                                                           "every case again")
        _none_ran(result["rows"], lambda r: "error" in r, args.scenario, "planned")
        return 0
    if args.out:
        check_output_folder(args.out, "--out")
    if args.emit:
        check_output_path(args.emit, "--emit", (".yaml", ".yml"))
    with progress_from_args(args, "plan") as bar:
        result = plan(args.scenario, sets=args.set or [], space=args.space or [], top=args.top, prove=args.prove,
                      objective=args.objective, max_memory_fraction=args.max_memory_fraction, out=args.out,
                      pareto=args.pareto == "exact", tolerance=args.tolerance, workers=args.workers,
                      executor=args.executor, address=args.address, progress=bar)
    if args.emit:
        emit_scenario(result, args.scenario, args.emit, sets=args.set or [])
    print(json.dumps(result, indent=2) if args.json else format_plan(result))
    return 0


def _page_outputs(args, page: str) -> tuple[str | None, str | None]:
    """(the HTML file, the output folder) of ``report`` or ``audit``. ``--out`` is a folder, as on
    every command; an ``--out`` ending in .html or .htm is the page itself, as it was before
    ``--html`` existed. Each is checked before any work."""
    html, folder = args.html, None
    if args.out is not None:
        suffix = os.path.splitext(str(args.out))[1].lower()
        if suffix in HTML_SUFFIXES:
            if html is not None:
                raise ConfigError("--out", args.out, f"names the page and so does --html ({html}): give it once")
            html = args.out
        elif suffix in FILE_SUFFIXES:
            own = "--md FILE" if suffix == ".md" and hasattr(args, "md") else "--html FILE"
            raise ConfigError("--out", args.out, f"is a folder (for {page}.html and the rest), not a {suffix} file; "
                                                 f"give a folder name, or {own} for that file alone")
        else:
            folder = args.out
    if html is not None:
        check_output_path(html, "--html" if html == args.html else "--out", HTML_SUFFIXES)
    if folder is not None:
        check_output_folder(folder, "--out")
    return html, folder


def _report(args) -> int:
    import time
    from pathlib import Path

    from simulator.common.files import atomic_write, atomic_write_text
    from simulator.reports.memo import memo_html, memo_markdown
    from simulator.studies.designdoc import gather
    from simulator.studies.whatif import check_factor

    html, folder = _page_outputs(args, "memo")
    md = args.md
    if md:
        check_output_path(md, "--md", (".md",))
    if html is None and md is None and folder is None:
        raise ConfigError("--out", LeftOut(), "give a folder for memo.html, memo.md and its figures (--out DIR), or "
                                              "--html FILE, or --md FILE")
    if folder is not None:
        html = html or str(Path(folder) / "memo.html")
        md = md or str(Path(folder) / "memo.md")
    _check_workers(args)
    check_factor(args.factor)
    _load(args)
    t0 = time.perf_counter()
    with progress_from_args(args, "report") as bar:
        data = gather(args.scenario, args.set or [], factor=args.factor, workers=args.workers, progress=bar)
        if folder is not None:
            Path(folder).mkdir(parents=True, exist_ok=True)
        written = []
        if html:
            bar.phase(f"writing {html}")
            atomic_write_text(html, memo_html(data))
            written.append(html)
        if md:
            bar.phase(f"writing {md}")
            page = Path(md)
            paths = {}
            figures = []
            for name, png in sorted(data["figures"].items()):
                fig = page.with_name(f"{page.stem}-{name}.png")
                atomic_write(fig, lambda f, png=png: f.write(png), binary=True)
                paths[name] = fig.name
                figures.append(str(fig))
            atomic_write_text(page, memo_markdown(data, paths))
            written += [md, *figures]
    print(f"memo written: {', '.join(written)} ({time.perf_counter() - t0:.1f} s wall)")
    return 0


def _audit(args) -> int:
    from pathlib import Path

    from simulator.common.files import atomic_write_text
    from simulator.reports.auditpage import audit_html
    from simulator.scenario.load import read_scenario_file
    from simulator.studies.audit import audit, format_audit, parse_claims

    from simulator import simulation

    html, folder = _page_outputs(args, "audit")
    parse_claims(read_scenario_file(args.scenario))
    simulation.checked(args.scenario, args.set or [])  # a plan that cannot run is an error before any progress
    with progress_from_args(args, "audit") as bar:
        bar.phase("simulating the plan")
        result = audit(args.scenario, args.set or [])
    if folder is not None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        html = html or str(Path(folder) / "audit.html")
        atomic_write_text(Path(folder) / "audit.json", json.dumps(result, indent=2) + "\n")
    if html is not None:
        atomic_write_text(html, audit_html(result))
    print(json.dumps(result, indent=2) if args.json else format_audit(result))
    return 0


def _check_workers(args) -> None:
    from simulator.studies.workers import check_local_workers

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

    run(quick=args.quick, only="plan" if args.plan else "scale" if args.scale else "unfold" if args.unfold else None)
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
            r.add_argument("--trace-format", default="perfetto", choices=("perfetto", "kineto"),
                           help="perfetto (default): one file of every rank's streams; kineto: per simulated rank a "
                                "PyTorch profiler trace, one kernel per op (FILE-rank<R>.json), for stepsim calibrate")
            r.add_argument("--profile-diff", action="append", metavar="PROFILE",
                           help="compare with a PyTorch profiler trace (a file per rank, or their folder; repeatable): "
                                "measured against simulated time per kernel class")
            r.add_argument("--plot", metavar="FILE", help="with --profile-diff: draw the comparison (PNG/SVG/PDF)")
            r.add_argument("--timeline", metavar="FILE", help="draw the step as a Gantt chart per stage (PNG/SVG/PDF)")
            r.add_argument("--stages", default=None, metavar="LIST",
                           help="timeline rows: stage numbers and ranges, e.g. 0,3,7 or 0-3,12 (default: all)")
            r.add_argument("--window", default=None, metavar="T0:T1",
                           help="timeline time window in seconds, e.g. 0.5:1.25, or : for the whole step (default: "
                                "a few micro-batches around the middle of the step, the whole step drawn above "
                                "as an overview)")
            add_progress_flags(r)
    cal = sub.add_parser("calibrate", help="efficiency factors per kernel class from a PyTorch profiler trace of the "
                                           "job (docs/calibrate.md), for a scenario's calibration: key")
    cal.add_argument("profile", nargs="+", help="Kineto trace files (.json or .json.gz, one per rank) or their folder")
    cal.add_argument("--scenario", required=True, help="the scenario of the profiled run (same model, layout per "
                                                      "node, precision: for a one-node profile, the job's one-node version)")
    cal.add_argument("--out", required=True, metavar="FILE", help="the calibration file to write (.yaml)")
    cal.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a scenario key (repeatable)")
    cal.add_argument("--json", action="store_true", help="print the comparison and the file's contents as JSON")
    add_progress_flags(cal)
    cal.set_defaults(func=_calibrate)

    v = sub.add_parser("validate", help="predict published training runs and report the error")
    v.add_argument("runs", nargs="+", help="files in the format of shared/validation/public-runs.yaml")
    v.add_argument("--json", action="store_true", help="print the result as JSON (a mapping by file for several)")
    v.add_argument("--markdown", action="store_true",
                   help="print the validation page (docs/validation.md): summaries and signed errors per file")
    v.add_argument("--collectives", metavar="FILE",
                   help="with --markdown: add the section of published collective bandwidths (nccl-tests) from FILE, "
                        "e.g. tests/data/nccl-scale.yaml")
    v.add_argument("--constants", metavar="FILE",
                   help="with --markdown: append the table of fitted constants and estimates from FILE")
    v.add_argument("--plot", metavar="FILE", help="draw predicted against measured step time (PNG/SVG/PDF)")
    v.add_argument("--workers", type=int, default=None, help=limits.workers_help())
    add_progress_flags(v)
    v.set_defaults(func=_validate)

    pl = _scenario_parser(sub, "plan", "find the fastest layout of a scenario's model on its cluster, by simulation")
    pl.add_argument("--top", type=int, default=5, help="layouts in the table (default 5)")
    pl.add_argument("--prove", type=int, default=1,
                    help="ranks proven exact up to --tolerance (default 1, the best); the table's other rows are the "
                         "fastest of the layouts simulated, shown as >=rank unless no unsimulated layout could beat them")
    pl.add_argument("--json", action="store_true", help="print the result as JSON")
    pl.add_argument("--emit", metavar="FILE", help="write the best layout as a scenario file")
    pl.add_argument("--out", default=None, metavar="DIR",
                    help="folder for plan.jsonl (a rerun skips what is done) and pareto.png")
    pl.add_argument("--workers", type=int, default=None,
                    help=limits.workers_help(ray=True) + "; the plan found is the same for any count, its counts of "
                                                         "simulated layouts are not")
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
                         f"more than T, a fraction or a percentage: 0 is exact (default {_help_text(TOLERANCE_HELP_DEFAULT)})")
    pl.add_argument("--validate", action="store_true",
                    help="SCENARIO is a public-runs file: plan every run and compare with its published layout")
    add_progress_flags(pl)
    pl.set_defaults(func=_plan, plan_defaults={dest: pl.get_default(dest) for dest, _ in PLAN_ONLY})

    m = _scenario_parser(sub, "report", "a design memo (one self-contained HTML page) answering the design worksheet")
    m.add_argument("--out", metavar="DIR", help="folder for memo.html, memo.md and its figures (an --out ending in "
                                                "'.html' is the HTML page itself, as before --html)")
    m.add_argument("--html", metavar="FILE", help="the memo as one self-contained HTML page")
    m.add_argument("--md", metavar="FILE", help="the memo as Markdown (figures as FILE-stem-*.png beside it)")
    m.add_argument("--factor", type=float, default=2.0, help="what-if factor for the bottleneck (default 2)")
    m.add_argument("--workers", type=int, default=None, help=limits.workers_help())
    add_progress_flags(m)
    m.set_defaults(func=_report)

    a = _scenario_parser(sub, "audit", "hold a plan's claims: section against a simulation of the plan")
    a.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    a.add_argument("--out", metavar="DIR", help="folder for audit.html and audit.json (an --out ending in '.html' "
                                                "is the HTML page itself, as before --html)")
    a.add_argument("--html", metavar="FILE", help="also write the audit as an HTML page")
    add_progress_flags(a)
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
    which.add_argument("--unfold", action="store_true",
                       help="only steps folded against unfolded (--no-fold): GPT-3 175B on 512 A100, Llama 3 405B "
                            "on 1,024 H100 (minutes)")
    b.set_defaults(func=_bench)

    for name, func, text in (("sweep", _sweep, "simulate the cartesian product of varied scenario keys, in parallel"),
                             ("whatif", _whatif, "step time with each link class or compute 2x faster and slower")):
        w = _scenario_parser(sub, name, text)
        w.add_argument("--workers", type=int, default=None, help=limits.workers_help(ray=True))
        w.add_argument("--executor", default="process", choices=("process", "ray"),
                       help="process pool (default) or Ray (pip install 'stepsim[ray]')")
        w.add_argument("--address", default=None, help="Ray cluster to join (default: start a local one)")
        w.set_defaults(func=func)
        if name == "sweep":
            w.add_argument("--vary", action="append", required=True, metavar="KEY=V1,V2,...",
                           help="a scenario key and its values, e.g. --vary parallelism.tp=4,8 (repeatable)")
            w.add_argument("--out", default="results", metavar="DIR",
                           help="folder for results.jsonl, results.csv and plots (default results); a rerun skips "
                                "finished points")
            w.add_argument("--json", action="store_true", help="print the rows as JSON")
            add_progress_flags(w)
        else:
            w.add_argument("--factor", type=float, default=2.0, help="how much faster and slower (default 2)")
            w.add_argument("--out", default=None, metavar="DIR", help="folder for whatif.csv, whatif.json and tornado.png")
            w.add_argument("--json", action="store_true", help="print the result as JSON")
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
    except WorkerDied as err:
        print(f"stepsim: error: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
