"""Package boundaries (each package's ``__init__`` docstring says what it may import;
``docs/architecture.md``) and public surfaces."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN_IN_PROTOCOL = {"trio", "asyncio", "socket", "selectors", "threading", "os", "time", "uvloop", "sys"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


@pytest.mark.parametrize("path", sorted((ROOT / "protocol").glob("*.py")), ids=lambda p: p.name)
def test_protocol_is_sans_io(path: Path) -> None:
    assert not (_imports(path) & FORBIDDEN_IN_PROTOCOL), f"{path.name} imports {_imports(path) & FORBIDDEN_IN_PROTOCOL}"


@pytest.mark.parametrize("path", sorted((ROOT / "storage").glob("*.py")), ids=lambda p: p.name)
def test_storage_knows_nothing_of_the_network_or_the_broker(path: Path) -> None:
    assert not (_imports(path) & {"trio", "asyncio", "socket", "broker", "spark_export"})


@pytest.mark.parametrize(
    "path", sorted(p for p in (ROOT / "broker").rglob("*.py") if "client" not in p.parts), ids=lambda p: p.name
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
