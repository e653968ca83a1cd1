"""The package follows its data flow: scenario -> layout -> workload -> program -> engine -> trace ->
reports -> studies -> cli. Read from the source with the ast module, not by hand: no import points
up the flow, none goes round in a circle, and imports sit at module level except where a dependency
is heavy or optional (the CLI loads each command on demand so --help stays fast; matplotlib and Ray
load when a picture or a Ray cluster is asked for; the package's lazy API facade)."""

import ast
import sys
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "simulator"
# Lowest first. The trace's record types (engine.records) are what the engine fills; the trace
# package holds the analyses that read them.
LAYERS = ("common", "parts", "scenario", "layout", "workload", "program", "network", "engine", "trace", "reports",
          "simulation", "calibrate", "studies", "api", "cli")
LAZY_MODULES = {"simulator.cli", "simulator"}  # may import simulator modules inside functions
HEAVY_OR_OPTIONAL = {"matplotlib", "ray"}  # may be imported inside functions anywhere


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _layer(module: str) -> str:
    if module == "simulator":
        return "api"
    head = module.split(".")[1]
    return "cli" if head in ("cli", "__main__") else head


def _target(name: str) -> str:
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _imports():
    """(importer, imported module, at module level?, line) for every import of a simulator module,
    and (importer, top-level package, line) for every function-level import of anything else."""
    internal, external = [], []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [f"{node.module}.{a.name}" for a in node.names]
                root = node.module
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
                root = names[0]
            else:
                continue
            if root.split(".")[0] == "simulator":
                for n in names:
                    target = _target(n)
                    if target != module:
                        internal.append((module, target, id(node) in top, node.lineno))
            elif id(node) not in top and root.split(".")[0] != "__future__":
                external.append((module, root.split(".")[0], node.lineno))
    return internal, external


INTERNAL, EXTERNAL = _imports()


def test_every_module_belongs_to_a_layer():
    assert {_layer(m) for m in MODULES} <= set(LAYERS)


def test_no_import_points_up_the_data_flow():
    up = [(a, b, line) for a, b, _, line in INTERNAL if LAYERS.index(_layer(b)) > LAYERS.index(_layer(a))]
    assert up == []


def test_no_import_cycle():
    graph = defaultdict(set)
    for a, b, _, _ in INTERNAL:
        graph[a].add(b)
    sys.setrecursionlimit(10000)
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(MODULES):
        if v not in index:
            visit(v)
    assert cycles == []


def test_imports_are_at_module_level_unless_heavy_or_optional():
    nested = [(a, b, line) for a, b, top, line in INTERNAL if not top and a not in LAZY_MODULES]
    assert nested == []
    assert [(m, root, line) for m, root, line in EXTERNAL
            if root not in HEAVY_OR_OPTIONAL and m not in LAZY_MODULES] == []


def test_only_the_engine_and_the_network_model_import_simpy_and_only_plots_import_matplotlib():
    simpy = {m for m, path in MODULES.items() if "import simpy" in path.read_text()}
    assert simpy <= {"simulator.engine.engine", "simulator.network.flows", "simulator.network.collectives"}
    mpl = {m for m, path in MODULES.items() if "import matplotlib" in path.read_text()}
    assert mpl == {"simulator.reports.plots"}


def test_the_trace_analyses_read_the_trace_records_not_the_engine():
    for a, b, _, _ in INTERNAL:
        if _layer(a) in ("trace", "reports"):
            assert b != "simulator.engine.engine", (a, b)
