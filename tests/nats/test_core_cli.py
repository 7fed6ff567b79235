"""``ttlbroker serve`` and the NATS listener: the ``nats on`` line, ``--nats-port``,
``--no-nats``, a NATS port in use (one line, exit 2), and the ``[nats]`` keys."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trio
from conftest import BrokerProcess, env_with_project, make_config
from helpers import RawNats


import protocol.nats as PN
from broker import Config
from broker.config import ConfigError, load_config


async def test_serve_port_0_prints_a_free_nats_port(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path)
    try:
        url = broker.nats_url
        assert url.startswith("nats://127.0.0.1:") and not url.endswith(":4222")
        peer = await RawNats.open(url)
        info = await peer.next_event()
        assert isinstance(info, PN.NatsInfo) and info.info["port"] == int(url.rsplit(":", 1)[1])
        await peer.stream.aclose()
    finally:
        assert broker.stop() == 0


def test_no_nats(tmp_path: Path) -> None:
    p = subprocess.Popen(
        [sys.executable, "-m", "broker", "serve", "--port", "0", "--http-port", "0", "--no-nats", "--data", "d"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=tmp_path, env=env_with_project(),
    )
    assert p.stdout is not None
    first = p.stdout.readline()
    p.terminate()
    rest, _ = p.communicate(timeout=30)
    assert first.startswith("listening on ") and rest == ""  # no "nats on" line


def test_nats_port_in_use(tmp_path: Path, taken_port: int) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "broker", "serve", "--port", "0", "--http-port", "0", "--nats-port", str(taken_port),
         "--data", "d"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env_with_project(), stdin=subprocess.DEVNULL,
    )
    lines = [line for line in p.stderr.splitlines() if not line.startswith("ts=")]
    assert (p.returncode, p.stdout, lines) == (2, "", [
        f"error: CANNOT_START: NATS port 127.0.0.1:{taken_port} is in use (a nats-server or another broker?): set [nats] port or "
        "--nats-port (0 = any free one), or turn the NATS listener off with --no-nats or [nats] enabled = false"
    ])
    assert not (tmp_path / "d").exists()  # bound before the data directory is touched


def test_the_nats_line_comes_after_listening_and_monitoring(tmp_path: Path, taken_port: int) -> None:
    p = subprocess.Popen(
        [sys.executable, "-m", "broker", "serve", "--port", "0", "--http-port", "-1", "--nats-port", "0", "--data", "d"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=tmp_path, env=env_with_project(),
    )
    try:
        assert p.stdout is not None
        lines = [p.stdout.readline() for _ in range(3)]
    finally:
        p.terminate()
        p.wait(30)
        assert p.stdout is not None
        p.stdout.close()
    assert [line.split()[0] for line in lines] == ["listening", "monitoring", "nats"], lines
    assert lines[2].startswith("nats on nats://127.0.0.1:")


def test_defaults_and_keys(tmp_path: Path) -> None:
    nats = Config().nats
    assert (nats.enabled, nats.host, nats.port, nats.stream, nats.ping_interval, nats.max_pings_out) == (
        True, "", 4222, "nats", 120.0, 2)
    f = tmp_path / "c.toml"
    f.write_text('[nats]\nenabled = false\nhost = "0.0.0.0"\nport = 4333\nstream = "apps"\nping_interval = "30s"\nmax_pings_out = 5\n')
    nats = load_config(f).nats
    assert (nats.enabled, nats.host, nats.port, nats.stream, nats.ping_interval, nats.max_pings_out) == (
        False, "0.0.0.0", 4333, "apps", 30.0, 5)


@pytest.mark.parametrize(("changes", "message"), [
    ({"nats.port": 70000}, "nats.port: 70000 is not a TCP port (1..65535) or 0 (any free port)"),
    ({"nats.port": 8090, "server.port": 8090}, "nats.port: 8090 is also server.port; the NATS listener needs a port of its own"),
    ({"nats.ping_interval": 0}, "nats.ping_interval: must be positive"),
    ({"nats.max_pings_out": 0}, "nats.max_pings_out: must be at least 1"),
    ({"nats.stream": ""}, "nats.stream: must not be empty"),
])
def test_bad_keys(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        Config().replace(**changes)
    assert str(info.value) == message


def test_the_listener_host_defaults_to_the_servers(data_dir: Path) -> None:
    assert make_config(data_dir, **{"nats.enabled": True}).nats.host == ""  # "" = [server] host

    async def main() -> str | None:
        from conftest import start_server

        async with start_server(make_config(data_dir, **{"nats.enabled": True, "server.host": "127.0.0.1"})) as h:
            return h.nats_host

    assert trio.run(main) == "127.0.0.1"
