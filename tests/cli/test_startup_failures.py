"""Every way ``ttlbroker serve`` can fail to start is one line on stderr naming the
cause and what to do, and exit status 2; never a traceback."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BrokerProcess, env_with_project, extra_missing, require


def serve(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``serve`` (both ports free by default) and return (exit status, the
    stderr lines that are not structured log lines)."""
    p = subprocess.run(
        [sys.executable, "-m", "broker", "serve", "--port", "0", "--http-port", "0", *args],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env={**env_with_project(), **(env or {})},
        stdin=subprocess.DEVNULL,
    )
    assert p.stdout == "", p.stdout  # it never said "listening on"
    assert "Traceback" not in p.stderr, p.stderr
    return p.returncode, "\n".join(line for line in p.stderr.splitlines() if not line.startswith("ts="))


def test_port_in_use(tmp_path: Path, taken_port: int) -> None:
    rc, err = serve(tmp_path, "--port", str(taken_port), "--data", "d")
    assert rc == 2
    assert err == (
        f"error: CANNOT_START: cannot listen on 127.0.0.1:{taken_port}: the address is in use (another broker or program holds it): "
        "stop it, or choose another port with --port or [server] port"
    )
    assert not (tmp_path / "d").exists()  # the port is bound before the data directory is touched


def test_monitoring_port_in_use(tmp_path: Path, taken_port: int) -> None:
    rc, err = serve(tmp_path, "--http-port", str(taken_port), "--data", "d")
    assert (rc, err) == (
        2, f"error: CANNOT_START: monitoring port 127.0.0.1:{taken_port} is in use (another broker? set [http] port or --http-port; 0 turns monitoring off)"
    )


def test_address_not_of_this_machine(tmp_path: Path) -> None:
    rc, err = serve(tmp_path, "--host", "192.0.2.1", "--data", "d")  # TEST-NET-1: never local
    assert rc == 2
    assert err == (
        "error: CANNOT_START: cannot listen on 192.0.2.1:0: 192.0.2.1 is not an address of this machine; "
        "use 127.0.0.1, 0.0.0.0 or one of its interfaces with --host or [server] host"
    )


def test_host_that_does_not_resolve(tmp_path: Path) -> None:
    rc, err = serve(tmp_path, "--host", "no-such-host.invalid", "--data", "d")
    assert rc == 2 and err.count("\n") == 0
    assert err.startswith("error: CANNOT_START: cannot listen on no-such-host.invalid:0: the host name 'no-such-host.invalid' does not resolve (")
    assert err.endswith("); use an address of this machine with --host or [server] host")


def test_data_directory_held_by_another_broker(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    fd = os.open(tmp_path / "d" / "LOCK", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running broker holds it
        rc, err = serve(tmp_path, "--data", "d")
    finally:
        os.close(fd)
    assert rc == 2
    assert err == (
        f"error: STORAGE_FAILURE (4002): data directory {tmp_path / 'd'} is in use by another broker: "
        "stop that broker first, or give this one another directory"
    )


def test_data_directory_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "d").write_text("not a directory")
    rc, err = serve(tmp_path, "--data", "d")
    assert rc == 2
    assert err == (
        f"error: CANNOT_START: cannot use {tmp_path / 'd' / 'streams'}: Not a directory (the data directory, --data or [system] path, "
        "and the export directory, --export-dir or [export] dir, must be directories this user can read and write)"
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads and writes any directory whatever its permissions")
def test_data_directory_this_user_cannot_use(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir(mode=0o500)
    rc, err = serve(tmp_path, "--data", "d")
    assert rc == 2
    assert err.startswith(f"error: CANNOT_START: cannot use {tmp_path / 'd'}") and "Permission denied" in err and err.count("\n") == 0


def test_invalid_configuration(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text('[server]\nport = "eighty"\n')
    rc, err = serve(tmp_path, "--config", "bad.toml")
    assert (rc, err) == (2, "error: INVALID_CONFIG: server.port: expected an integer, got 'eighty'")
    rc, err = serve(tmp_path, "--config", "missing.toml")
    assert (rc, err) == (2, "error: INVALID_CONFIG: config file 'missing.toml' does not exist")


def test_export_without_pyarrow(tmp_path: Path) -> None:
    require(extra_missing("spark"), "this test, which hides pyarrow from a complete install,")
    fake = tmp_path / "fake" / "pyarrow"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named pyarrow')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "fake"), env_with_project().get("PYTHONPATH", "")])}
    rc, err = serve(tmp_path, "--data", "d", "--export-dir", "ex", env=env)
    assert (rc, err) == (
        2, "error: EXPORT_NOT_CONFIGURED (5001): the export needs pyarrow (No module named pyarrow): pip install 'ttlbroker[spark]'"
    )


def test_damaged_catalog(tmp_path: Path) -> None:
    data = tmp_path / "d"
    data.mkdir()
    b = BrokerProcess(data, "--http-port", "0")
    subprocess.run([sys.executable, "-m", "broker", "stream", "create", "shop", "--server", b.address],
                   check=True, capture_output=True, env=env_with_project())
    assert b.stop() == 0
    for name in ("catalog.json", "catalog.json.1"):  # both copies: nothing to fall back on
        path = data / name
        raw = bytearray(path.read_bytes())
        raw[10] ^= 0xFF
        path.write_bytes(bytes(raw))
    rc, err = serve(tmp_path, "--data", "d")
    assert rc == 2 and err.count("\n") == 0
    assert err.startswith(f"error: STORAGE_FAILURE (4002): the catalog of {data} is damaged (")
    assert "restore catalog.json from a backup (both copies are left as they are;" in err
