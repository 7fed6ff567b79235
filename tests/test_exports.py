"""Package boundaries (DESIGN.md) and public surfaces."""

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
    exception: config.py reads the configuration file it is given."""
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
