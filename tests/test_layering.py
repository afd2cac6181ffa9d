"""One direction of dependencies, and no cycle of files: every `perseusd` import, read from the source of
every module (including imports inside functions and under `TYPE_CHECKING`), goes from a layer to one the
table below allows, and no module reaches itself through imports (in `perseusd` and in `benchmarks`).

client/protocol -> planner, gpu -> profiling, carbon, workload -> switching, leasing, cluster -> jobs ->
power -> the node cap, the power pool -> metrics -> daemon, with ctl and emulate beside them. The table is
acyclic (checked), so allowing an import both ways is not a way out: moving the shared piece below both is.
There is no exception: the composition root `perseusd/daemon/main.py` sits at the top, in the daemon's layer.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIR = REPO_ROOT / "perseusd"
CLIENT_DIR = REPO_ROOT / "client_lib" / "perseus_client"

# layer -> the layers its modules may import (besides its own). "base" is perseusd/__init__.py, errors.py,
# argtypes.py, private_file.py, records.py and threads.py; every other layer is a package of perseusd.
ALLOWED: Mapping[str, frozenset[str]] = {
    "base": frozenset(),
    "planner": frozenset({"base"}),
    "gpu": frozenset({"base"}),
    "profiling": frozenset({"base", "planner"}),
    "carbon": frozenset({"base", "planner"}),
    "workload": frozenset({"base", "planner", "gpu"}),
    "switching": frozenset({"base", "planner", "gpu", "profiling"}),
    "leasing": frozenset({"base", "gpu"}),
    "cluster": frozenset({"base"}),
    "jobs": frozenset({"base", "planner", "gpu", "profiling", "carbon", "cluster", "switching"}),
    "power": frozenset({"base", "planner", "gpu", "workload"}),
    "cap": frozenset({"base", "planner", "gpu", "leasing", "jobs", "power"}),
    "pool": frozenset({"base", "gpu", "cluster", "power"}),
    "metrics": frozenset({"base", "gpu", "carbon", "switching", "leasing", "jobs"}),
    "daemon": frozenset(
        {
            "base",
            "planner",
            "gpu",
            "profiling",
            "carbon",
            "switching",
            "leasing",
            "cluster",
            "jobs",
            "power",
            "cap",
            "pool",
            "metrics",
        }
    ),
    "ctl": frozenset({"base", "planner", "power"}),
    "emulate": frozenset({"base", "planner", "gpu", "workload"}),
}


def module_name(path: Path, root: Path = REPO_ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    """The layer of a `perseusd` module (dotted name)."""
    parts = module.split(".")
    if len(parts) == 1 or (
        len(parts) == 2 and parts[1] in {"errors", "argtypes", "private_file", "records", "threads"}
    ):
        return "base"
    return parts[1]


def imported_modules(path: Path, root: Path = REPO_ROOT) -> Iterator[tuple[int, str]]:
    """(line, dotted module) of every import in a file, relative ones resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            # `from perseusd.daemon import core` imports the module perseusd.daemon.core
            named = {f"{module}.{alias.name}" for alias in node.names}
            for target in sorted(named) if all(is_module(n, root) for n in named) else [module]:
                yield node.lineno, target


def is_module(dotted: str, root: Path) -> bool:
    path = root.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def violations(root: Path = REPO_ROOT) -> list[str]:
    """Every import against the table in `root`/perseusd, as `file:line: source imports target (layers)`."""
    found = []
    for path in sorted((root / "perseusd").rglob("*.py")):
        source = module_name(path, root)
        source_layer = layer_of(source)
        for line, target in imported_modules(path, root):
            if target.split(".")[0] != "perseusd" or not is_module(target, root):
                continue
            target_layer = layer_of(target)
            if target_layer != source_layer and target_layer not in ALLOWED[source_layer]:
                found.append(
                    f"{path.relative_to(root)}:{line}: {source} imports {target} "
                    f"({source_layer} -> {target_layer} is not allowed)"
                )
    return found


def test_every_import_goes_down_the_layers() -> None:
    found = violations()
    assert not found, "imports against the layering (tests/test_layering.py):\n" + "\n".join(found)


def test_the_table_has_no_cycle() -> None:
    visiting: list[str] = []
    done: set[str] = set()

    def visit(layer: str) -> None:
        if layer in visiting:
            cycle = [*visiting[visiting.index(layer) :], layer]
            pytest.fail(f"the layering table has a cycle: {' -> '.join(cycle)}")
        if layer in done:
            return
        visiting.append(layer)
        for lower in ALLOWED[layer]:
            visit(lower)
        visiting.pop()
        done.add(layer)

    for layer in ALLOWED:
        visit(layer)


def test_every_package_has_a_layer() -> None:
    packages = {p.parent.name for p in PACKAGE_DIR.glob("*/__init__.py")}
    assert packages <= set(ALLOWED), f"packages without a layer in ALLOWED: {sorted(packages - set(ALLOWED))}"
    assert all(lower in ALLOWED for lowers in ALLOWED.values() for lower in lowers)


def test_the_client_imports_nothing_of_the_daemon() -> None:
    found = [
        f"{path.relative_to(REPO_ROOT)}:{line}: {target}"
        for path in sorted(CLIENT_DIR.rglob("*.py"))
        for line, target in imported_modules(path)
        if target.split(".")[0] == "perseusd"
    ]
    assert not found, found


WIRE_LAYERS = frozenset({"daemon", "ctl"})
"""The layers that speak the wire: the daemon answers requests, perseusctl sends them."""


def test_the_wire_stops_at_the_daemon() -> None:
    """Libraries raise domain errors (`perseusd.errors`); only the daemon's table turns them into wire errors,
    so no module below it names `ProtocolError`."""
    found = [
        f"{path.relative_to(REPO_ROOT)}:{node.lineno}"
        for path in sorted(PACKAGE_DIR.rglob("*.py"))
        if layer_of(module_name(path)) not in WIRE_LAYERS
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and any(alias.name == "ProtocolError" for alias in node.names)
    ]
    assert not found, "ProtocolError below the daemon: " + ", ".join(found)


def module_graph(package: str, root: Path = REPO_ROOT) -> dict[str, set[str]]:
    """Each module of `package` (a folder under `root`) -> the modules of `package` it imports."""
    graph = {}
    for path in sorted((root / package).rglob("*.py")):
        source = module_name(path, root)
        graph[source] = {
            target
            for _, target in imported_modules(path, root)
            if target.split(".")[0] == package and target != source and is_module(target, root)
        }
    return graph


def import_cycles(graph: Mapping[str, set[str]]) -> list[str]:
    """The cycles a depth-first walk of the import graph meets, each as `a -> b -> a`."""
    found: list[str] = []
    visiting: list[str] = []
    done: set[str] = set()

    def visit(module: str) -> None:
        visiting.append(module)
        for target in sorted(graph.get(module, ())):
            if target in visiting:
                found.append(" -> ".join([*visiting[visiting.index(target) :], target]))
            elif target not in done:
                visit(target)
        visiting.pop()
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            visit(module)
    return found


@pytest.mark.parametrize("package", ["perseusd", "benchmarks"])
def test_no_file_imports_itself_through_others(package: str) -> None:
    cycles = import_cycles(module_graph(package))
    assert not cycles, f"import cycles between the files of {package}:\n" + "\n".join(cycles)


def test_a_back_edge_is_named(tmp_path: Path) -> None:
    """The check itself: an import from jobs or the metrics into the daemon is reported with its file, line
    and layers; one from the daemon into jobs or the metrics (the composition root's included) is not; a cycle
    of files is reported as its path."""
    assert layer_of("perseusd.pool.agent") == "pool"
    assert layer_of("perseusd.cluster.job_board") == "cluster"
    assert layer_of("perseusd.errors") == "base"
    files = {
        "perseusd/__init__.py": "",
        "perseusd/daemon/__init__.py": "",
        "perseusd/daemon/core.py": "from perseusd.jobs import manager\n",
        "perseusd/daemon/main.py": "import perseusd.metrics.collector\n",
        "perseusd/metrics/__init__.py": "",
        "perseusd/metrics/collector.py": "from ..daemon.core import DaemonCore\n",
        "perseusd/jobs/__init__.py": "",
        "perseusd/jobs/manager.py": "import os\n\n\ndef f() -> None:\n    from perseusd.daemon import core\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert violations(tmp_path) == [
        "perseusd/jobs/manager.py:5: perseusd.jobs.manager imports perseusd.daemon.core "
        "(jobs -> daemon is not allowed)",
        "perseusd/metrics/collector.py:1: perseusd.metrics.collector imports perseusd.daemon.core "
        "(metrics -> daemon is not allowed)",
    ]
    assert import_cycles(module_graph("perseusd", tmp_path)) == [
        "perseusd.daemon.core -> perseusd.jobs.manager -> perseusd.daemon.core"
    ]
    (tmp_path / "perseusd/jobs/manager.py").write_text("import os\n")
    assert import_cycles(module_graph("perseusd", tmp_path)) == []
