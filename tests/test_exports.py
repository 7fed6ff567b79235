"""Package boundaries and public surfaces (docs/architecture.md, "Layers").

The import rules are read from the code's own import statements, every one of them:
at module level, inside functions (lazy imports) and under ``if TYPE_CHECKING:``,
since each is a dependency a reader has to follow.

* no import cycle among the modules of ``broker``, ``protocol``, ``storage`` and
  ``spark_export``;
* each package imports only packages of a lower layer (``LAYERS``) and its own
  modules;
* no module imports a private module (``_name``) of a package it is not inside: a
  package is used through its ``__init__``'s public names (a subpackage is inside:
  ``protocol.nats`` uses ``protocol._records``). Tests may reach the private
  modules of the package they test.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import extra_missing, require

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("broker", "protocol", "storage", "spark_export")
#: Each package's layer: a module may import only from its own package and from
#: packages of a lower layer (a subpackage counts as its own package: ``broker.core``
#: is not part of ``broker``). docs/architecture.md draws the same picture.
LAYERS = {
    "protocol": 0,
    "protocol.nats": 1,
    "storage": 1,
    "broker.auth": 2,
    "broker.client": 2,
    "broker.config": 3,
    "spark_export": 3,
    "broker.core": 4,
    "broker.consumers": 5,
    "broker.kv": 5,
    "broker.net": 5,
    "broker.replication": 5,
    "broker.nats": 6,
    "broker.monitoring": 7,
    "broker.server": 8,
    "broker.cli": 9,
    "broker": 10,
}
FORBIDDEN_IN_PROTOCOL = {"trio", "asyncio", "socket", "selectors", "threading", "os", "time", "uvloop", "sys"}


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the project's packages: dotted name -> file."""
    found: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def import_graph(mods: dict[str, Path]) -> dict[str, dict[str, int]]:
    """module -> {imported project module: line of the first such import}. ``from
    pkg import name`` counts ``pkg`` and, when ``name`` is a module, ``pkg.name``."""
    graph: dict[str, dict[str, int]] = {}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                names = [target] + [f"{target}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name in mods and name != mod:
                    edges.setdefault(name, node.lineno)
        graph[mod] = edges
    return graph


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan): every module
    of a group reaches every other through imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(groups, key=len, reverse=True)


def _cycle_path(graph: dict[str, dict[str, int]], group: set[str]) -> list[str]:
    """One cycle inside a strongly connected group: start, ..., start."""
    start = min(group)
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v]):
            if w == start:
                return paths[v] + [start]
            if w in group and w not in paths:
                paths[w] = paths[v] + [w]
                todo.append(w)
    raise AssertionError("not a cycle")  # pragma: no cover


def package_of(mod: str) -> str:
    """The package in ``LAYERS`` a module belongs to (the longest that prefixes it)."""
    parts = mod.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if name in LAYERS:
            return name
    raise KeyError(f"{mod} is in no package of LAYERS")


def upward_imports(graph: dict[str, dict[str, int]], mods: dict[str, Path]) -> list[str]:
    """``file:line: a imports b (layer x imports layer y)`` for every import of a
    package from the same or a higher layer."""
    out = []
    for mod, edges in sorted(graph.items()):
        mine = package_of(mod)
        for target, line in sorted(edges.items()):
            theirs = package_of(target)
            if theirs != mine and LAYERS[theirs] >= LAYERS[mine]:
                out.append(
                    f"{mods[mod].relative_to(ROOT)}:{line}: {mod} imports {target} "
                    f"({mine}, layer {LAYERS[mine]}, may import only lower layers than {theirs}, layer {LAYERS[theirs]})"
                )
    return out


def private_imports(graph: dict[str, dict[str, int]], mods: dict[str, Path]) -> list[str]:
    """``file:line: a imports b`` for every import of a private module (a name
    starting with ``_`` below its package) from outside that package (a subpackage
    is inside: ``protocol.nats`` may use ``protocol._records``)."""
    out = []
    for mod, edges in sorted(graph.items()):
        for target, line in sorted(edges.items()):
            theirs = package_of(target)
            private = any(p.startswith("_") and not p.startswith("__") for p in target[len(theirs) :].split("."))
            if private and not (mod == theirs or mod.startswith(theirs + ".")):
                out.append(f"{mods[mod].relative_to(ROOT)}:{line}: {mod} imports {target}, private to {theirs}")
    return out


def describe_cycles(graph: dict[str, dict[str, int]], mods: dict[str, Path]) -> list[str]:
    """One line per group of modules that import each other: its members, and one
    cycle through it with the line of each import."""
    out = []
    for group in import_cycles(graph):
        path = _cycle_path(graph, set(group))
        steps = ", ".join(f"{a} -> {b} ({mods[a].relative_to(ROOT)}:{graph[a][b]})" for a, b in zip(path, path[1:]))
        out.append(f"{len(group)} modules ({', '.join(group)}); one cycle: {steps}")
    return out


def test_no_import_cycles() -> None:
    mods = project_modules()
    cycles = describe_cycles(import_graph(mods), mods)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_imports_go_only_down_the_layers() -> None:
    mods = project_modules()
    offenders = upward_imports(import_graph(mods), mods)
    assert not offenders, "imports from the same or a higher layer:\n" + "\n".join(offenders)


def test_no_package_imports_another_packages_private_modules() -> None:
    mods = project_modules()
    offenders = private_imports(import_graph(mods), mods)
    assert not offenders, "private modules imported across packages:\n" + "\n".join(offenders)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


@pytest.mark.parametrize("path", sorted((ROOT / "protocol").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_protocol_is_sans_io(path: Path) -> None:
    assert not (_imports(path) & FORBIDDEN_IN_PROTOCOL), f"{path.name} imports {_imports(path) & FORBIDDEN_IN_PROTOCOL}"


@pytest.mark.parametrize("path", sorted((ROOT / "storage").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_storage_knows_nothing_of_the_network_or_the_broker(path: Path) -> None:
    assert not (_imports(path) & {"trio", "asyncio", "socket", "broker", "spark_export"})


@pytest.mark.parametrize(
    "path", sorted(p for p in (ROOT / "broker").rglob("*.py") if "client" not in p.parts), ids=lambda p: str(p.relative_to(ROOT))
)
def test_broker_parses_no_bytes_and_opens_no_files(path: Path) -> None:
    """broker/ leaves byte layouts to protocol/ and files to storage/. One reasoned
    exception: config.py reads the configuration file it is given (and the TLS
    certificate files that file names)."""
    imported = _imports(path)
    assert "struct" not in imported, f"{path.name} packs bytes itself"
    assert "pyspark" not in imported
    if path.name == "config.py":
        return
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id == "open":
                raise AssertionError(f"{path.name}:{node.lineno} opens a file")
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in ("os", "shutil"):
                raise AssertionError(f"{path.name}:{node.lineno} calls {f.value.id}.{f.attr}")


def test_public_surfaces() -> None:
    import broker
    import broker.client
    import protocol
    import storage

    for mod in (protocol, storage, broker, broker.client):
        for name in mod.__all__:
            assert not name.startswith("_") or name.startswith("__"), name
            assert hasattr(mod, name), f"{mod.__name__}.{name} is listed but missing"
    assert {"serve", "Config", "load_config"} <= set(broker.__all__)
    assert {"connect", "Client", "Message", "BrokerError", "StreamNotFoundError"} <= set(broker.client.__all__)


def test_spark_export_imports_no_spark_until_a_job_runs() -> None:
    """The broker's export task and ``load`` need pyarrow only: pyspark is imported
    when a Spark job starts, rich when stderr is a terminal."""
    require(extra_missing("spark"), "the spark_export import test")
    import subprocess
    import sys

    code = (
        "import sys, spark_export, spark_export.load, spark_export.jobs, spark_export.__main__, spark_export.submit; "
        "print(sorted(m for m in ('pyspark', 'rich', 'py4j') if m in sys.modules))"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT), timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


def test_the_spark_extra_pins_what_the_installed_pyspark_supports() -> None:
    """pyspark declares the pandas it supports (``pandas>=...`` in its extras) and
    prints a FutureWarning at every job under pandas 3: the extra asks for a pandas
    in pyspark's range and below 3, and that is what is installed."""
    require(extra_missing("spark"), "the spark extra's pins test")
    import tomllib
    from importlib.metadata import requires, version

    from packaging.requirements import Requirement

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["spark"]
    ours = {Requirement(r).name: Requirement(r).specifier for r in extra}
    theirs = [Requirement(r) for r in requires("pyspark") or [] if r.startswith("pandas")]
    assert theirs, "pyspark no longer declares its pandas"
    minimum = min(s.version for r in theirs for s in r.specifier if s.operator == ">=")
    assert ours["pandas"].contains(minimum) and not ours["pandas"].contains("3.0.0")
    assert all(r.specifier.contains(minimum) for r in theirs)
    assert ours["pandas"].contains(version("pandas")) and ours["pyspark"].contains(version("pyspark"))
    assert ours["pyarrow"].contains(version("pyarrow"))
