"""Configuration: the embedded TOML and the dataclasses agree, and every mistake in
a config file stops the broker with a message naming the key."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from broker.config import DEFAULT_CONFIG_TOML, Config, ConfigError, RemoteSettings, load_config, parse_size, to_dict
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
        ("[limits]\nmax_subscription_subject_bytes = 0\n", "limits.max_subscription_subject_bytes: must be at least 1"),
        ("[limits]\nmax_subscription_subject_bytes = \"long\"\n", "limits.max_subscription_subject_bytes: 'long' is not a size"),
        ("[limits]\nmax_subscription_bytes_total = 64\n",
         "limits.max_subscription_bytes_total: must be at least 64 KiB (about 50 subscriptions)"),
        ("[nats]\nmax_control_line = 511\n", "nats.max_control_line: must be between 512 bytes and 1 MiB (nats-server's default: 4096)"),
        ("[nats]\nmax_control_line = \"2 MiB\"\n", "nats.max_control_line: must be between 512 bytes and 1 MiB"),
        ("[http]\nhead_timeout = \"0s\"\n", "http.head_timeout: must be positive"),
        ("[http]\nhead_timeout = {}\n", "http.head_timeout: expected a duration such as \"2s\" or a number of seconds"),
        ("[http]\nmax_connections = 0\n", "http.max_connections: must be at least 1, got 0"),
        ("[http]\nmax_connections_per_peer = 100\n", "http.max_connections_per_peer: must be between 1 and http.max_connections (64), got 100"),
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


def test_subscription_limits() -> None:
    """Issue 27: what subscriptions may hold, per connection and in all."""
    c = Config()
    assert (c.limits.max_subscriptions_per_connection, c.limits.max_subscription_subject_bytes) == (1024, 1024)
    assert (c.limits.max_subscription_bytes_total, c.nats.max_control_line) == (64 * 1024 * 1024, 4096)
    c = Config().replace(**{"limits.max_subscription_bytes_total": "1 GiB", "limits.max_subscription_subject_bytes": "4 KiB",
                            "nats.max_control_line": "8 KiB"})
    assert (c.limits.max_subscription_bytes_total, c.limits.max_subscription_subject_bytes, c.nats.max_control_line) == (
        1 << 30, 4096, 8192)


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


# -- [nats] domain and [[nats.remotes]] --------------------------------------------------

_HUB = '[[nats.remotes]]\ndomain = "hub"\nurl = "nats://hub.example:4333"\n'


def test_remotes_load_and_are_found_by_domain(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text(
        '[nats]\ndomain = "leaf"\n' + _HUB + 'token = "t0ken"\n'
        '[[nats.remotes]]\ndomain = "edge-2"\nurl = "tls://10.0.0.2"\nuser = "copier"\npassword = "pw"\n'
    )
    c = load_config(f)
    hub, edge = c.nats.remotes
    assert (hub.domain, hub.host, hub.port, hub.token, hub.tls) == ("hub", "hub.example", 4333, "t0ken", False)
    assert (edge.host, edge.port, edge.user, edge.password, edge.tls) == ("10.0.0.2", 4222, "copier", "pw", True)
    assert "t0ken" not in repr(c) and "'pw'" not in repr(c)  # secrets stay out of logs
    assert c.nats.domain == "leaf" and c.nats.remote("HUB") is hub
    assert hub.api_prefix == "$JS.hub.API" and RemoteSettings(domain="x", api="$JS.API.").api_prefix == "$JS.API"
    assert Config().replace(**{"nats.remotes": to_dict(c)["nats"]["remotes"]}).nats.remotes == c.nats.remotes


def test_remote_for_names_a_remote_by_domain(tmp_path: Path) -> None:
    from broker.config import remote_for
    from protocol import ErrorCode, error_class

    f = tmp_path / "c.toml"
    f.write_text('[nats]\ndomain = "leaf"\n' + _HUB)
    c = load_config(f)
    hub = c.nats.remotes[0]
    assert remote_for(c, {"name": "S"}) is None
    assert remote_for(c, {"name": "S", "external": {"api": "$JS.API"}}) is None
    assert remote_for(c, {"name": "S", "domain": "leaf"}) is None  # our own domain
    assert remote_for(c, {"name": "S", "external": {"api": "$JS.leaf.API"}}) is None
    assert remote_for(c, {"name": "S", "external": {"api": "$JS.hub.API", "deliver": ""}}) is hub
    assert remote_for(c, {"name": "S", "external": {"api": "$JS.hub.API."}}) is hub
    assert remote_for(c, {"name": "S", "domain": "Hub"}) is hub
    assert remote_for(c, {"name": "S", "domain": "hub", "external": {"api": "$JS.hub.API"}}) is hub
    unknown, bad = error_class(ErrorCode.UNKNOWN_DOMAIN), error_class(ErrorCode.INVALID_EXTERNAL_API)
    with pytest.raises(unknown) as info:
        remote_for(c, {"name": "S", "domain": "far"})
    assert info.value.message == (
        "source 'S': JetStream domain 'far' is not this server's and no [[nats.remotes]] entry has it (configured: hub)")
    assert int(info.value.code) == 6070
    with pytest.raises(unknown, match=r"JetStream domain 'far' .*\(configured: none\)"):
        remote_for(Config(), {"name": "S", "external": {"api": "$JS.far.API"}})
    with pytest.raises(bad) as info:
        remote_for(c, {"name": "S", "external": {"api": "JS.acc.API"}})
    assert info.value.message == "source 'S': external.api 'JS.acc.API' is not $JS.<domain>.API (a remote is named by its JetStream domain)"
    assert int(info.value.code) == 6071
    with pytest.raises(bad, match=r"^source 'S': external.api '\$JS.hub.API' and domain 'far' name different domains \(INVALID_EXTERNAL_API 6071\)$"):
        remote_for(c, {"name": "S", "domain": "far", "external": {"api": "$JS.hub.API"}})
    with pytest.raises(bad, match=r"external.api '\$JS.API' \(this server\) and domain 'hub' name different domains"):
        remote_for(c, {"name": "S", "domain": "hub", "external": {"api": "$JS.API"}})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[nats]\ndomain = "a.b"\n', "nats.domain: 'a.b' is not a JetStream domain name (letters, digits, _ and -, at most 64)"),
        ('[nats]\nremotes = 1\n', "nats.remotes: expected an array of tables ([[nats.remotes]]), got 1"),
        ('[nats]\nremotes = [1]\n', "nats.remotes[0]: expected a table with domain and url, got 1"),
        ('[[nats.remotes]]\nurl = "nats://h:1"\n', "nats.remotes[0].domain: required (the remote's JetStream domain, the X of $JS.X.API)"),
        ('[[nats.remotes]]\ndomain = "$x"\nurl = "nats://h:1"\n', "nats.remotes[0].domain: '$x' is not a JetStream domain name"),
        ('[[nats.remotes]]\ndomain = "hub"\n', "nats.remotes[0].url: required (nats://host:port or tls://host:port)"),
        ('[[nats.remotes]]\ndomain = "hub"\nurl = "http://h:1"\n', "nats.remotes[0].url: 'http://h:1' is not nats://host:port or tls://host:port"),
        ('[[nats.remotes]]\ndomain = "hub"\nurl = "hub:4222"\n', "nats.remotes[0].url: 'hub:4222' is not nats://host:port or tls://host:port"),
        ('[[nats.remotes]]\ndomain = "hub"\nurl = "nats://h:99999"\n', "nats.remotes[0].url: 'nats://h:99999' is not a URL such as nats://host:4222"),
        ('[[nats.remotes]]\ndomain = "hub"\nurl = "nats://h:0"\n', "nats.remotes[0].url: port 0 is not a port to connect to"),
        ('[[nats.remotes]]\ndomain = "hub"\nurl = "nats://u:p@h:1"\n',
         "nats.remotes[0].url: put the credentials in nats.remotes[0].token or nats.remotes[0].user and nats.remotes[0].password, not in the URL"),
        ('[[nats.remotes]]\ndomain = "hub"\nurl = "nats://h:1/x"\n', "nats.remotes[0].url: 'nats://h:1/x' has more than a host and a port"),
        ('[[nats.remotes]]\ndomain = "hub"\nurl = "nats://h:1"\nport = 1\n', "unknown configuration key 'nats.remotes[0].port'"),
        ('[[nats.remotes]]\ndomain = "hub"\nurl = "nats://h:1"\ntoken = 5\n', "nats.remotes[0].token: expected a string, got 5"),
        ('[[nats.remotes]]\ndomain = "hub"\nurl = "nats://h:1"\ntoken = "t"\nuser = "u"\npassword = "p"\n',
         "nats.remotes[0].token: give a token or a user and password, not both"),
        ('[[nats.remotes]]\ndomain = "hub"\nurl = "nats://h:1"\nuser = "u"\n', "nats.remotes[0].password: required with nats.remotes[0].user"),
        ('[[nats.remotes]]\ndomain = "hub"\nurl = "nats://h:1"\npassword = "p"\n', "nats.remotes[0].user: required with nats.remotes[0].password"),
        ('[[nats.remotes]]\ndomain = "hub"\nurl = "nats://h:1"\ntls_key = "k.pem"\n', "nats.remotes[0].tls_key: requires nats.remotes[0].tls_cert"),
        ('[[nats.remotes]]\ndomain = "hub"\nurl = "nats://h:1"\ntls_ca = "/nonexistent/ca.pem"\n',
         "nats.remotes[0].tls_ca: cannot read '/nonexistent/ca.pem': No such file or directory"),
        ('[[nats.remotes]]\ndomain = "hub"\nurl = "nats://h:1"\napi = "$JS.*.API"\n',
         "nats.remotes[0].api: '$JS.*.API' is not a subject prefix such as \"$JS.API\" (no wildcards)"),
        (_HUB + '[[nats.remotes]]\ndomain = "HUB"\nurl = "nats://h:1"\n',
         "nats.remotes[1].domain: 'HUB' is also the domain of nats.remotes[0] (each remote has its own domain)"),
    ],
)
def test_remote_mistakes_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "c.toml"
    f.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(f)
    assert str(info.value).startswith(message)


def test_remote_tls_files_are_checked(tmp_path: Path) -> None:
    import trustme

    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    client = ca.issue_cert("copier@example")
    client.cert_chain_pems[0].write_to_path(str(tmp_path / "client.pem"))
    client.private_key_pem.write_to_path(str(tmp_path / "client.key"))
    (tmp_path / "junk.pem").write_text("nothing\n")
    base = _HUB + f'tls_ca = "{tmp_path / "ca.pem"}"\n'
    f = tmp_path / "c.toml"
    f.write_text(base + f'tls_cert = "{tmp_path / "client.pem"}"\ntls_key = "{tmp_path / "client.key"}"\n')
    remote = load_config(f).nats.remotes[0]
    assert remote.tls and remote.ssl_context().check_hostname
    f.write_text(_HUB + f'tls_ca = "{tmp_path / "junk.pem"}"\n')
    with pytest.raises(ConfigError, match=r"^nats.remotes\[0\].tls_ca: '.*junk.pem' holds no PEM CA certificate"):
        load_config(f)
    f.write_text(base + f'tls_cert = "{tmp_path / "client.pem"}"\n')  # no key in the file
    with pytest.raises(ConfigError, match=r"^nats.remotes\[0\].tls_key: '.*client.pem' holds no PEM private key"):
        load_config(f)
