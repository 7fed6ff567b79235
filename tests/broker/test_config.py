"""Configuration: the embedded TOML and the dataclasses agree, and every mistake in
a config file stops the broker with a message naming the key."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from broker.config import DEFAULT_CONFIG_TOML, Config, ConfigError, load_config, parse_size, to_dict
from storage import FsyncPolicy


def test_embedded_toml_equals_the_dataclass_defaults() -> None:
    assert load_config() == Config()
    raw = tomllib.loads(DEFAULT_CONFIG_TOML())
    assert set(raw) == set(to_dict(Config()))
    for section, values in raw.items():
        assert set(values) == set(to_dict(Config())[section]), section


def test_defaults_are_the_documented_embedded_default() -> None:
    c = Config()
    assert (c.server.host, c.server.port, c.system.path) == ("127.0.0.1", 8090, "./ttlbroker-data")
    assert c.system.partition.fsync == FsyncPolicy("always")
    assert c.message_cleaner.enabled and c.message_cleaner.interval == 60
    assert c.export.dir == "" and c.export.worker_priority == "idle"


def test_a_file_overrides_key_by_key(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text(
        '[server]\nport = 9999\n[system.segment]\nsize_bytes = "1 MiB"\n'
        '[system.partition]\nfsync = "250ms"\n[message_cleaner]\ninterval = "2 m"\n'
    )
    c = load_config(f)
    assert c.server.port == 9999 and c.server.host == "127.0.0.1"
    assert c.system.segment.size_bytes == 1024 * 1024
    assert c.system.partition.fsync == FsyncPolicy("interval", 250.0)
    assert c.message_cleaner.interval == 120.0


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[server]\nprot = 1\n", "unknown configuration key 'server.prot'"),
        ("[nonsense]\n", "unknown configuration key 'nonsense'"),
        ("[server]\nport = \"x\"\n", "server.port: expected an integer"),
        ("[server]\nport = 70000\n", "not a TCP port"),
        ("[system.partition]\nfsync = \"sometimes\"\n", "system.partition.fsync"),
        ("[system.partition]\nfsync = \"0ms\"\n", "must be positive"),
        ("[system.segment]\nsize_bytes = \"lots\"\n", "not a size"),
        ("[system.segment]\nsize_bytes = 10\n", "between 4 KiB and 1 GiB"),
        ("[message_cleaner]\nenabled = \"yes\"\n", "expected true or false"),
        ("[limits]\nmax_payload_bytes = \"32 MiB\"\n", "fit in limits.max_frame_bytes"),
        ("[logging]\nlevel = \"loud\"\n", "logging.level"),
        ("[export]\nworker_priority = \"high\"\n", "export.worker_priority: one of idle, low, normal"),
        ("[nats]\ntls_handshake_first = true\n", "nats.tls_handshake_first: needs TLS ([server] tls_cert and tls_key"),
        ("[nats]\ntls_handshake_first = \"0ms\"\n", "nats.tls_handshake_first: a wait must be positive"),
        ("[nats]\ntls_handshake_first = \"soon\"\n", "nats.tls_handshake_first"),
        ("[nats]\ntls_handshake_first = [1]\n", "nats.tls_handshake_first: expected true, false or a duration"),
        ("server = 1\n", "must be a section"),
        ("[server\n", "not valid TOML"),
        ("[system]\nfile_mode = 600\n", "system.file_mode: expected a string"),
        ("[system]\nfile_mode = \"0999\"\n", "not an octal permission mode"),
        ("[system]\nfile_mode = \"01777\"\n", "not an octal permission mode"),
        ("[system]\nfile_mode = \"0400\"\n", "must give the owner at least 0600"),
        ("[system]\ndir_mode = \"0600\"\n", "system.dir_mode: '0600' must give the owner at least 0700"),
        ("[limits]\nhandshake_timeout = \"0s\"\n", "limits.handshake_timeout: must be positive"),
        ("[limits]\nhandshake_timeout = \"soon\"\n", "limits.handshake_timeout"),
        ("[limits]\nslow_consumer_seconds = 0\n", "limits.slow_consumer_seconds: must be positive"),
        ("[limits]\nmax_pending_bytes_total = \"1 MiB\"\n", "at least limits.max_pending_bytes_per_connection"),
        ("[limits]\nauth_failure_delay = \"20s\"\n", "must not exceed limits.auth_failure_delay_max"),
    ],
)
def test_config_mistakes_name_the_key(tmp_path: Path, text: str, fragment: str) -> None:
    f = tmp_path / "c.toml"
    f.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(f)
    assert fragment in str(info.value)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")


@pytest.mark.parametrize(("text", "n"), [("64 MiB", 64 << 20), ("1GB", 10**9), ("512", 512), ("1.5 KiB", 1536), (7, 7)])
def test_sizes(text: str | int, n: int) -> None:
    assert parse_size(text, "k") == n


def test_fsync_policy_parsing() -> None:
    assert FsyncPolicy.parse("always").acks_wait_for_sync
    assert FsyncPolicy.parse("NEVER") == FsyncPolicy("never")
    assert FsyncPolicy.parse("1s") == FsyncPolicy("interval", 1000.0)
    assert FsyncPolicy.parse(50) == FsyncPolicy("interval", 50.0)
    assert str(FsyncPolicy.parse("200ms")) == "interval 200ms"
    with pytest.raises(ValueError):
        FsyncPolicy.parse("soon")


def test_connection_limits_and_file_modes() -> None:
    c = Config()
    li = c.limits
    assert (li.handshake_timeout, li.slow_consumer_seconds) == (5.0, 10.0)
    assert (li.auth_failure_delay, li.auth_failure_delay_max) == (0.5, 10.0)
    assert li.max_pending_bytes_total == 512 * 1024 * 1024
    assert (c.system.file_mode, c.system.dir_mode) == ("0600", "0700")
    assert (c.system.file_mode_bits, c.system.dir_mode_bits) == (0o600, 0o700)
    c = Config().replace(**{"system.file_mode": "640", "system.dir_mode": "0o750", "limits.handshake_timeout": "250ms"})
    assert (c.system.file_mode_bits, c.system.dir_mode_bits, c.limits.handshake_timeout) == (0o640, 0o750, 0.25)
