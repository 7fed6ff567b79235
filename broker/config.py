"""Configuration: Iggy-style TOML sections, typed frozen dataclasses, validation.

The embedded ``default_config.toml`` is the one place defaults are written down; the
dataclasses below carry the same defaults (a test checks they agree) so that a
``Config()`` built in code is the embedded default too. Loading merges a user file
over the defaults key by key; an unknown section or key, or a value of the wrong
kind, stops the broker with a message naming the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import ssl
import tomllib
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, TypeVar

from protocol import ErrorCode, error_class
from protocol.nats import valid_nats_subject
from storage import FsyncPolicy, parse_duration_ms

from broker.auth import AuthConfig, AuthConfigError, parse_auth

__all__ = [
    "Config", "ConfigError", "load_config", "parse_size", "parse_mode", "server_context", "DEFAULT_CONFIG_TOML",
    "TLS_MIN_VERSION", "ANY_PORT", "RemoteSettings", "remote_for", "valid_domain",
]


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key."""


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "kib": 1024, "ki": 1024,
    "m": 1000**2, "mb": 1000**2, "mib": 1024**2, "mi": 1024**2,
    "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "gi": 1024**3,
    "t": 1000**4, "tb": 1000**4, "tib": 1024**4, "ti": 1024**4,
}


def parse_size(value: int | str, key: str) -> int:
    """``"64 MiB"``, ``"1GB"``, ``512`` → bytes."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a size, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{key}: a size must not be negative")
        return value
    m = _SIZE_RE.match(str(value))
    if not m:
        raise ConfigError(f"{key}: {value!r} is not a size such as '64 MiB' or 1048576")
    return int(float(m.group(1)) * _SIZE_UNITS[(m.group(2) or "").lower()])


def _seconds(value: object, key: str) -> float:
    if not isinstance(value, (int, float, str)):  # a TOML table, list or date
        raise ConfigError(f"{key}: expected a duration such as \"2s\" or a number of seconds, got {value!r}")
    try:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if value < 0:
                raise ValueError("must not be negative")
            return float(value)
        return parse_duration_ms(value, key) / 1000.0
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc}") from None


def _handshake_first(value: object) -> bool | float:
    """``[nats] tls_handshake_first``: true, false, or how long to wait (``"50ms"``)."""
    if isinstance(value, bool):
        return value
    if not isinstance(value, (int, float, str)):
        raise ConfigError(f"nats.tls_handshake_first: expected true, false or a duration such as \"50ms\", got {value!r}")
    seconds = _seconds(value, "nats.tls_handshake_first")
    if seconds <= 0:
        raise ConfigError("nats.tls_handshake_first: a wait must be positive (true: TLS first always)")
    return seconds


_MODE_RE = re.compile(r"^(?:0o?)?([0-7]{1,3})$")


def parse_mode(value: object, key: str, required: int = 0) -> int:
    """``"0600"`` (or ``"600"``, ``"0o600"``) → ``0o600``. Only strings: a TOML
    integer such as ``600`` is decimal, which is never what a mode means.

    ``required`` are the owner bits the broker needs to use its own files."""
    if not isinstance(value, str):
        raise ConfigError(f"{key}: expected an octal string such as \"0600\", got {value!r}")
    m = _MODE_RE.match(value.strip().lower())
    if not m:
        raise ConfigError(f"{key}: {value!r} is not an octal permission mode such as \"0600\" (0000..0777)")
    mode = int(m.group(1), 8)
    if mode & required != required:
        raise ConfigError(f"{key}: {value!r} must give the owner at least {required:04o} (the broker reads and writes its own files)")
    return mode


# -- TLS ------------------------------------------------------------------------------
# The configuration reads the TLS files it names (as it reads itself), so that a
# missing or unusable one stops the broker before it starts; ``broker/net/_tls.py``
# uses the context on connections.

TLS_MIN_VERSION = ssl.TLSVersion.TLSv1_2
_CERT_RE = re.compile(rb"-----BEGIN (?:TRUSTED |X509 )?CERTIFICATE-----")
_KEY_RE = re.compile(rb"-----BEGIN (?:[A-Z]+ )*PRIVATE KEY-----")
_ENCRYPTED_RE = re.compile(rb"-----BEGIN ENCRYPTED PRIVATE KEY-----|Proc-Type: *4, *ENCRYPTED")


def _read(key: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path!r}: {exc.strerror or exc}") from None


def _openssl_text(exc: ssl.SSLError) -> str:
    """OpenSSL's text without the source location: ``[SSL] PEM lib``."""
    return str(exc.strerror or exc.reason or exc).split(" (_ssl.c:")[0]


def server_context(cert: str, key: str, ca: str = "") -> ssl.SSLContext:
    """The broker's TLS context: the certificate chain in ``cert`` with the private
    key in ``key`` (PEM; the same file may hold both), TLS 1.2 or later, and, when
    ``ca`` is set, client certificates signed by a CA in ``ca`` required.

    Raises:
        ConfigError: one line naming the key, the file and what is wrong with it.
    """
    if not cert or not key:
        given, missing = ("server.tls_cert", "server.tls_key") if cert else ("server.tls_key", "server.tls_cert")
        raise ConfigError(f"{missing}: required when {given} is set (give both, or neither for no TLS)")
    if not _CERT_RE.search(_read("server.tls_cert", cert)):
        raise ConfigError(f"server.tls_cert: {cert!r} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    key_pem = _read("server.tls_key", key)
    if not _KEY_RE.search(key_pem):
        raise ConfigError(f"server.tls_key: {key!r} holds no PEM private key (-----BEGIN PRIVATE KEY-----)")
    encrypted = ConfigError(f"server.tls_key: {key!r} is encrypted; the broker needs an unencrypted key (readable by its user only)")
    if _ENCRYPTED_RE.search(key_pem):
        raise encrypted
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = TLS_MIN_VERSION

    def no_password() -> str:  # OpenSSL would otherwise ask on the terminal
        raise encrypted

    try:
        ctx.load_cert_chain(cert, key, password=no_password)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise ConfigError(f"server.tls_key: the private key in {key!r} does not match the certificate in {cert!r}") from None
        raise ConfigError(
            f"server.tls_cert: cannot load {cert!r} with the key in {key!r}: a certificate or the key in them is damaged "
            f"(OpenSSL: {_openssl_text(exc)})"
        ) from None
    except OSError as exc:  # gone since it was read
        raise ConfigError(f"server.tls_cert: cannot read {cert!r} or {key!r}: {exc.strerror or exc}") from None
    if ca:
        if not _CERT_RE.search(_read("server.tls_ca", ca)):
            raise ConfigError(f"server.tls_ca: {ca!r} holds no PEM CA certificate (-----BEGIN CERTIFICATE-----)")
        try:
            ctx.load_verify_locations(cafile=ca)
        except ssl.SSLError as exc:
            raise ConfigError(f"server.tls_ca: cannot load {ca!r}: a certificate in it is damaged (OpenSSL: {_openssl_text(exc)})") from None
        except OSError as exc:
            raise ConfigError(f"server.tls_ca: cannot read {ca!r}: {exc.strerror or exc}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8090
    auth_token: str = ""
    name: str = "ttlbroker"
    #: TLS: the certificate chain and private key (PEM files; both or neither), and
    #: the CA whose client certificates are required (empty: none required).
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""

    @property
    def tls(self) -> bool:
        """Whether the broker's port speaks TLS."""
        return bool(self.tls_cert or self.tls_key)

    def ssl_context(self) -> ssl.SSLContext | None:
        """The broker's TLS context, loaded from the files now (None without TLS).

        Raises:
            ConfigError: a file is missing, unreadable or unusable (one line naming it).
        """
        if not self.tls:
            if self.tls_ca:
                raise ConfigError("server.tls_ca: requires server.tls_cert and server.tls_key (client certificates are checked inside TLS)")
            return None
        return server_context(self.tls_cert, self.tls_key, self.tls_ca)


#: The bounds of ``[nats] max_control_line``: a control line must hold a client's
#: CONNECT (nats-py's and nats.go's are a few hundred bytes without credentials); past
#: 1 MiB it is no longer a bound worth the name.
_CONTROL_LINE_MIN = 512
_CONTROL_LINE_MAX = 1024 * 1024
#: The smallest ``[limits] max_subscription_bytes_total``: a smaller one is taken
#: for a mistake of unit (64 meant as MiB) rather than meant.
_SUBSCRIPTION_BUDGET_MIN = 64 * 1024

#: ``[http] port`` for "any free port" (nats-server's RANDOM_PORT); 0 is "off".
ANY_PORT = -1
#: ``[export] worker_priority`` (spark_export/worker.py applies it).
EXPORT_PRIORITIES = ("idle", "low", "normal")


@dataclass(frozen=True)
class HttpConfig:
    """Monitoring over HTTP (``broker.monitoring``): /metrics, /healthz, /varz."""

    host: str = "127.0.0.1"
    #: 0 = no monitoring port; :data:`ANY_PORT` = any free one (nats-server's -1).
    port: int = 8091
    #: Connections served at once; past it a new one takes the place of one that is
    #: idle or slow (``broker/monitoring/_http.py``, rule 2), or is refused.
    max_connections: int = 64
    #: The same per peer host, so that one client's connections replace its own.
    max_connections_per_peer: int = 16
    #: Seconds a request head has to arrive whole (from the accept, or from its first
    #: byte on a kept-alive connection).
    head_timeout: float = 2.0

    @property
    def enabled(self) -> bool:
        return self.port != 0


_DOMAIN_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def valid_domain(name: str) -> bool:
    """A JetStream domain name: one subject token (it is the ``X`` of
    ``$JS.X.API``), letters, digits, ``_`` and ``-``, at most 64 characters."""
    return bool(_DOMAIN_RE.match(name))


_REMOTE_SCHEMES = ("nats", "tls")


@dataclass(frozen=True)
class RemoteSettings:
    """One ``[[nats.remotes]]`` entry: another server (a ttlbroker or a nats-server)
    whose streams a mirror or source of this broker copies, reached as a NATS client.
    A mirror or source picks it by naming its JetStream ``domain``
    (:func:`remote_for`)."""

    #: The remote's JetStream domain (its ``$JS.<domain>.API``); unique.
    domain: str = ""
    #: ``nats://host:port`` or ``tls://host:port`` (4222 when no port is given).
    url: str = ""
    #: CONNECT ``auth_token``; or ``user`` and ``password`` (not both kinds).
    token: str = field(default="", repr=False)
    user: str = ""
    password: str = field(default="", repr=False)
    #: TLS: the CA to trust instead of the system's, and a client certificate (and its
    #: key, when not in the same file) for a server that requires one. Any of them,
    #: or a ``tls://`` URL, turns TLS on.
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    #: The JetStream API prefix to ask there; empty: ``$JS.<domain>.API`` (a server
    #: without a domain: ``$JS.API``; the domain is then only this broker's name
    #: for it).
    api: str = ""

    @property
    def api_prefix(self) -> str:
        """The JetStream API prefix the remote answers (no trailing dot)."""
        return self.api.rstrip(".") or f"$JS.{self.domain}.API"

    @property
    def host(self) -> str:
        return urllib.parse.urlsplit(self.url).hostname or ""

    @property
    def port(self) -> int:
        return urllib.parse.urlsplit(self.url).port or 4222

    @property
    def tls(self) -> bool:
        """Whether the connection starts TLS (after the server's INFO, as nats clients
        do; also when the server's INFO requires it)."""
        return self.url.lower().startswith("tls://") or bool(self.tls_ca or self.tls_cert or self.tls_key)

    def ssl_context(self) -> ssl.SSLContext:
        """A client context that checks the remote's certificate and host name (against
        ``tls_ca``, or the system's CAs), with the client certificate if given.

        Raises:
            ConfigError: a file is missing or unusable (one line naming the key).
        """
        return remote_context(self, _remote_key(self))

    def check(self, key: str) -> None:
        """The entry's values are usable (``key``: how messages name it).

        Raises:
            ConfigError: naming the key and what is wrong.
        """
        if not self.domain:
            raise ConfigError(f"{key}.domain: required (the remote's JetStream domain, the X of $JS.X.API)")
        if not valid_domain(self.domain):
            raise ConfigError(f"{key}.domain: {self.domain!r} is not a JetStream domain name (letters, digits, _ and -, at most 64)")
        if not self.url:
            raise ConfigError(f"{key}.url: required (nats://host:port or tls://host:port)")
        try:
            parts = urllib.parse.urlsplit(self.url)
            port = parts.port
        except ValueError as exc:
            raise ConfigError(f"{key}.url: {self.url!r} is not a URL such as nats://host:4222 ({exc})") from None
        if parts.scheme.lower() not in _REMOTE_SCHEMES or not parts.hostname:
            raise ConfigError(f"{key}.url: {self.url!r} is not nats://host:port or tls://host:port")
        if parts.username is not None or parts.password is not None:
            raise ConfigError(f"{key}.url: put the credentials in {key}.token or {key}.user and {key}.password, not in the URL")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ConfigError(f"{key}.url: {self.url!r} has more than a host and a port")
        if port == 0:
            raise ConfigError(f"{key}.url: port 0 is not a port to connect to")
        if self.token and (self.user or self.password):
            raise ConfigError(f"{key}.token: give a token or a user and password, not both")
        if bool(self.user) != bool(self.password):
            missing = "password" if self.user else "user"
            raise ConfigError(f"{key}.{missing}: required with {key}.{'user' if self.user else 'password'}")
        if self.tls_key and not self.tls_cert:
            raise ConfigError(f"{key}.tls_key: requires {key}.tls_cert (a client certificate and its key)")
        if self.api and not valid_nats_subject(self.api.rstrip(".")):
            raise ConfigError(f"{key}.api: {self.api!r} is not a subject prefix such as \"$JS.API\" (no wildcards)")
        if self.tls:
            remote_context(self, key)


def _remote_key(remote: RemoteSettings) -> str:
    return f"nats.remotes[{remote.domain}]"


def remote_context(remote: RemoteSettings, key: str) -> ssl.SSLContext:
    """The TLS context of a remote (:meth:`RemoteSettings.ssl_context`)."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = TLS_MIN_VERSION
    if remote.tls_ca:
        if not _CERT_RE.search(_read(f"{key}.tls_ca", remote.tls_ca)):
            raise ConfigError(f"{key}.tls_ca: {remote.tls_ca!r} holds no PEM CA certificate (-----BEGIN CERTIFICATE-----)")
        try:
            ctx.load_verify_locations(cafile=remote.tls_ca)
        except ssl.SSLError as exc:
            raise ConfigError(f"{key}.tls_ca: cannot load {remote.tls_ca!r}: a certificate in it is damaged (OpenSSL: {_openssl_text(exc)})") from None
        except OSError as exc:
            raise ConfigError(f"{key}.tls_ca: cannot read {remote.tls_ca!r}: {exc.strerror or exc}") from None
    if remote.tls_cert:
        cert, keyfile = remote.tls_cert, remote.tls_key or remote.tls_cert
        if not _CERT_RE.search(_read(f"{key}.tls_cert", cert)):
            raise ConfigError(f"{key}.tls_cert: {cert!r} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
        key_pem = _read(f"{key}.tls_key", keyfile)
        if not _KEY_RE.search(key_pem):
            raise ConfigError(f"{key}.tls_key: {keyfile!r} holds no PEM private key (-----BEGIN PRIVATE KEY-----)")
        encrypted = ConfigError(f"{key}.tls_key: {keyfile!r} is encrypted; the broker needs an unencrypted key")
        if _ENCRYPTED_RE.search(key_pem):
            raise encrypted

        def no_password() -> str:
            raise encrypted

        try:
            ctx.load_cert_chain(cert, keyfile, password=no_password)
        except ssl.SSLError as exc:
            if exc.reason == "KEY_VALUES_MISMATCH":
                raise ConfigError(f"{key}.tls_key: the private key in {keyfile!r} does not match the certificate in {cert!r}") from None
            raise ConfigError(f"{key}.tls_cert: cannot load {cert!r} with the key in {keyfile!r} (OpenSSL: {_openssl_text(exc)})") from None
        except OSError as exc:
            raise ConfigError(f"{key}.tls_cert: cannot read {cert!r} or {keyfile!r}: {exc.strerror or exc}") from None
    return ctx


_REMOTE_KEYS = {f.name for f in dataclasses.fields(RemoteSettings)}


def _remotes(value: object, key: str = "nats.remotes") -> tuple[RemoteSettings, ...]:
    """The ``[[nats.remotes]]`` entries, each checked; their domains unique."""
    if not isinstance(value, list):
        raise ConfigError(f"{key}: expected an array of tables ([[nats.remotes]]), got {value!r}")
    out: list[RemoteSettings] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(value):
        where = f"{key}[{i}]"
        if isinstance(entry, RemoteSettings):
            entry = {f: getattr(entry, f) for f in _REMOTE_KEYS}
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: expected a table with domain and url, got {entry!r}")
        for name in entry:
            if name not in _REMOTE_KEYS:
                raise _unknown_key(f"{where}.{name}", _REMOTE_KEYS)
        remote = RemoteSettings(**{name: _typed(v, str, f"{where}.{name}") for name, v in entry.items()})
        remote.check(where)
        folded = remote.domain.lower()
        if folded in seen:
            raise ConfigError(f"{where}.domain: {remote.domain!r} is also the domain of {key}[{seen[folded]}] (each remote has its own domain)")
        seen[folded] = i
        out.append(remote)
    return tuple(out)


@dataclass(frozen=True)
class NatsConfig:
    """The NATS listener (``broker.nats``)."""

    enabled: bool = True
    #: Empty: the server's host.
    host: str = ""
    #: 0 = any free port.
    port: int = 4222
    #: The ttlbroker stream whose topics are the NATS streams.
    stream: str = "nats"
    #: Seconds between the server's PINGs to a NATS client.
    ping_interval: float = 120.0
    #: Unanswered PINGs after which the connection is closed (Stale Connection).
    max_pings_out: int = 2
    #: With TLS: False = INFO first, then the client's TLS handshake (nats-server's
    #: default); True = the client starts TLS at once (nats-py's and nats.go's
    #: ``tls_handshake_first``), INFO goes after it; seconds = wait that long for a
    #: TLS handshake before sending INFO, so both kinds of client connect.
    tls_handshake_first: bool | float = False
    #: This broker's JetStream domain (nats-server's ``jetstream { domain }``): its
    #: API answers ``$JS.<domain>.API.>`` as well as ``$JS.API.>``. Empty: none.
    domain: str = ""
    #: Other servers mirrors and sources copy from (``[[nats.remotes]]``).
    remotes: tuple[RemoteSettings, ...] = ()
    #: The longest control line (an operation and its arguments, before any payload)
    #: a NATS client may send, as nats-server's ``max_control_line``; past it,
    #: ``-ERR 'maximum control line exceeded'`` and the connection is closed.
    max_control_line: int = 4096

    def remote(self, domain: str) -> RemoteSettings | None:
        """The remote of that JetStream domain (names compare without case), or None."""
        folded = domain.lower()
        for r in self.remotes:
            if r.domain.lower() == folded:
                return r
        return None


@dataclass(frozen=True)
class SegmentConfig:
    size_bytes: int = 64 * 1024 * 1024
    message_expiry: int = 0


@dataclass(frozen=True)
class PartitionConfig:
    fsync: FsyncPolicy = field(default_factory=FsyncPolicy)


@dataclass(frozen=True)
class SystemConfig:
    path: str = "./ttlbroker-data"
    #: Permission bits of files and directories the broker creates (octal strings).
    file_mode: str = "0600"
    dir_mode: str = "0700"
    segment: SegmentConfig = field(default_factory=SegmentConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)

    @property
    def file_mode_bits(self) -> int:
        return parse_mode(self.file_mode, "system.file_mode", 0o600)

    @property
    def dir_mode_bits(self) -> int:
        return parse_mode(self.dir_mode, "system.dir_mode", 0o700)


@dataclass(frozen=True)
class CleanerConfig:
    enabled: bool = True
    interval: float = 60.0


@dataclass(frozen=True)
class ExportConfig:
    dir: str = ""
    interval: float = 60.0
    #: The export worker's CPU priority: idle (SCHED_IDLE), low (nice +10), normal.
    worker_priority: str = "idle"


@dataclass(frozen=True)
class LimitsConfig:
    max_frame_bytes: int = 16 * 1024 * 1024
    max_payload_bytes: int = 1024 * 1024
    max_connections: int = 1024
    max_pending_bytes_per_connection: int = 64 * 1024 * 1024
    max_subscriptions_per_connection: int = 1024
    #: The longest subject filter (and NATS queue group), in UTF-8 bytes, a
    #: subscription may have.
    max_subscription_subject_bytes: int = 1024
    #: The subscription budget: the estimated bytes all core subscriptions of both
    #: protocols may hold together (``broker.core.subscription_footprint``).
    max_subscription_bytes_total: int = 64 * 1024 * 1024
    max_partitions: int = 1024
    max_fetch_bytes: int = 8 * 1024 * 1024
    max_republish_hops: int = 8
    #: Durable consumers one topic may have.
    max_consumers_per_topic: int = 1024
    #: Queued output of all connections together (the output budget).
    max_pending_bytes_total: int = 512 * 1024 * 1024
    #: How long a connection may stay over max_pending_bytes_per_connection.
    slow_consumer_seconds: float = 10.0
    #: How long a new connection has to complete its handshake.
    handshake_timeout: float = 5.0
    #: Delay before a failed handshake is answered (doubling per recent failure of the
    #: same host, up to auth_failure_delay_max).
    auth_failure_delay: float = 0.5
    auth_failure_delay_max: float = 10.0
    #: Bytes of records all memory-storage topics together may hold (``storage:
    #: memory``); a publish past it is refused.
    memory_storage_bytes: int = 256 * 1024 * 1024


@dataclass(frozen=True)
class LoggingConfig:
    level: str = "info"
    format: str = "logfmt"


@dataclass(frozen=True)
class Config:
    """The whole configuration. ``Config()`` is the embedded default."""

    server: ServerConfig = field(default_factory=ServerConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    nats: NatsConfig = field(default_factory=NatsConfig)
    system: SystemConfig = field(default_factory=SystemConfig)
    message_cleaner: CleanerConfig = field(default_factory=CleanerConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)

    def replace(self, **changes: object) -> Config:
        """A copy with dotted keys changed: ``cfg.replace(**{"server.port": 0})``."""
        data = to_dict(self)
        for dotted, value in changes.items():
            node = data
            *path, last = dotted.split(".")
            for part in path:
                node = node[part]
            if last not in node:
                raise _unknown_key(dotted, node, "unknown key {}")
            node[last] = value
        return _build(data)

    @property
    def data_dir(self) -> str:
        return self.system.path


_API_RE = re.compile(r"^\$JS\.([^.\s]+)\.API\.?$")
_LOCAL_API = ("$JS.API", "$JS.API.")


def remote_for(config: Config, source: Mapping[str, Any]) -> RemoteSettings | None:
    """The remote a mirror's or source's configuration (the JetStream API's
    ``StreamSource`` JSON: ``{"name", "external": {"api", "deliver"}, "domain"}``)
    names, or None when it copies a stream of this broker: no ``external.api`` and
    no ``domain``, ``external.api`` ``$JS.API``, or this broker's own ``[nats]
    domain``. ``external.api`` ``$JS.<domain>.API`` (what nats.go makes of a
    source's ``Domain``) and ``domain`` (what nats-py sends as given) both name the
    domain; with both, they must agree. Domains compare without case.

    Raises:
        UnknownDomainError: no ``[[nats.remotes]]`` entry has the domain named.
        InvalidExternalApiError: ``external.api`` is not ``$JS.<domain>.API``, or it
            and ``domain`` disagree.
    """
    external = source.get("external") or {}
    api = external.get("api") if isinstance(external, Mapping) else None
    domain = source.get("domain") or ""
    name = source.get("name") or ""
    if not isinstance(domain, str) or (api is not None and not isinstance(api, str)):
        raise error_class(ErrorCode.INVALID_EXTERNAL_API)(f"source {name!r}: domain and external.api are strings")
    named = ""
    if api and api not in _LOCAL_API:
        m = _API_RE.match(api)
        if m is None:
            raise error_class(ErrorCode.INVALID_EXTERNAL_API)(
                f"source {name!r}: external.api {api!r} is not $JS.<domain>.API (a remote is named by its JetStream domain)")
        named = m.group(1)
        if domain and domain.lower() != named.lower():
            raise error_class(ErrorCode.INVALID_EXTERNAL_API)(
                f"source {name!r}: external.api {api!r} and domain {domain!r} name different domains")
    elif api in _LOCAL_API and domain and domain.lower() != config.nats.domain.lower():
        raise error_class(ErrorCode.INVALID_EXTERNAL_API)(
            f"source {name!r}: external.api {api!r} (this server) and domain {domain!r} name different domains")
    else:
        named = domain
    if not named or named.lower() == config.nats.domain.lower():
        return None
    remote = config.nats.remote(named)
    if remote is None:
        known = ", ".join(r.domain for r in config.nats.remotes) or "none"
        raise error_class(ErrorCode.UNKNOWN_DOMAIN)(
            f"source {name!r}: JetStream domain {named!r} is not this server's and no [[nats.remotes]] entry has it (configured: {known})")
    return remote


def DEFAULT_CONFIG_TOML() -> str:  # noqa: N802 - a constant that is read lazily
    return resources.files("broker").joinpath("default_config.toml").read_text()


def to_dict(cfg: Config) -> dict[str, Any]:
    """The config as plain TOML-shaped values (sizes in bytes, durations in seconds)."""

    def conv(obj: object) -> object:
        if isinstance(obj, FsyncPolicy):
            return obj.mode if obj.mode != "interval" else f"{obj.interval_ms:g}ms"
        if isinstance(obj, tuple):
            return [conv(v) for v in obj]
        if dataclasses.is_dataclass(obj):
            return {f.name: conv(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        return obj

    return {f.name: conv(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}


def _unknown_key(name: str, known: Iterable[str], words: str = "unknown configuration key {!r}") -> ConfigError:
    """The error for the key ``name`` (dotted) where only ``known`` keys are
    (``words`` says it), with the known one it is closest to, if one is close (a
    typo): ``unknown configuration key 'server.portt' (did you mean 'server.port'?)``."""
    where, dot, last = name.rpartition(".")
    if last.endswith("]"):  # an entry of an array of tables: nothing to suggest in its place
        return ConfigError(words.format(name))
    close = difflib.get_close_matches(last, sorted(known), n=1)
    hint = f" (did you mean {where + dot + close[0]!r}?)" if close else ""
    return ConfigError(words.format(name) + hint)


def _merge(base: dict[str, Any], over: dict[str, Any], where: str) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        name = f"{where}.{key}" if where else key
        if key not in base:
            raise _unknown_key(name, base)
        if isinstance(base[key], dict):
            if not isinstance(value, dict):
                raise ConfigError(f"{name} must be a section")
            # An empty section of the defaults takes any keys (checked when built).
            out[key] = _merge(base[key], value, name) if base[key] else value
        else:
            out[key] = value
    return out


_T = TypeVar("_T", bool, int, str)
_EXPECTED = {bool: "true or false", int: "an integer", str: "a string"}


def _typed(value: object, kind: type[_T], key: str) -> _T:
    """``value``, if it is a ``kind`` (bool, int or str; a bool is not an int here)."""
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    raise ConfigError(f"{key}: expected {_EXPECTED[kind]}, got {value!r}")


def _build(d: dict[str, Any]) -> Config:
    s, sysd, cl, ex, li, lo = d["server"], d["system"], d["message_cleaner"], d["export"], d["limits"], d["logging"]
    ht = d["http"]
    na = d["nats"]
    try:
        fsync = FsyncPolicy.parse(sysd["partition"]["fsync"])
    except ValueError as exc:
        raise ConfigError(f"system.partition.fsync: {exc}") from None
    cfg = Config(
        server=ServerConfig(
            host=_typed(s["host"], str, "server.host"),
            port=_typed(s["port"], int, "server.port"),
            auth_token=_typed(s["auth_token"], str, "server.auth_token"),
            name=_typed(s["name"], str, "server.name"),
            tls_cert=_typed(s["tls_cert"], str, "server.tls_cert"),
            tls_key=_typed(s["tls_key"], str, "server.tls_key"),
            tls_ca=_typed(s["tls_ca"], str, "server.tls_ca"),
        ),
        http=HttpConfig(
            host=_typed(ht["host"], str, "http.host"),
            port=_typed(ht["port"], int, "http.port"),
            max_connections=_typed(ht["max_connections"], int, "http.max_connections"),
            max_connections_per_peer=_typed(ht["max_connections_per_peer"], int, "http.max_connections_per_peer"),
            head_timeout=_seconds(ht["head_timeout"], "http.head_timeout"),
        ),
        nats=NatsConfig(
            enabled=_typed(na["enabled"], bool, "nats.enabled"),
            host=_typed(na["host"], str, "nats.host"),
            port=_typed(na["port"], int, "nats.port"),
            stream=_typed(na["stream"], str, "nats.stream"),
            ping_interval=_seconds(na["ping_interval"], "nats.ping_interval"),
            max_pings_out=_typed(na["max_pings_out"], int, "nats.max_pings_out"),
            tls_handshake_first=_handshake_first(na["tls_handshake_first"]),
            domain=_typed(na["domain"], str, "nats.domain"),
            remotes=_remotes(na["remotes"]),
            max_control_line=parse_size(na["max_control_line"], "nats.max_control_line"),
        ),
        system=SystemConfig(
            path=_typed(sysd["path"], str, "system.path"),
            file_mode=_typed(sysd["file_mode"], str, "system.file_mode"),
            dir_mode=_typed(sysd["dir_mode"], str, "system.dir_mode"),
            segment=SegmentConfig(
                size_bytes=parse_size(sysd["segment"]["size_bytes"], "system.segment.size_bytes"),
                message_expiry=_typed(sysd["segment"]["message_expiry"], int, "system.segment.message_expiry"),
            ),
            partition=PartitionConfig(fsync=fsync),
        ),
        message_cleaner=CleanerConfig(
            enabled=_typed(cl["enabled"], bool, "message_cleaner.enabled"),
            interval=_seconds(cl["interval"], "message_cleaner.interval"),
        ),
        export=ExportConfig(
            dir=_typed(ex["dir"], str, "export.dir"),
            interval=_seconds(ex["interval"], "export.interval"),
            worker_priority=_typed(ex["worker_priority"], str, "export.worker_priority"),
        ),
        limits=LimitsConfig(**_limits(li)),
        logging=LoggingConfig(level=_typed(lo["level"], str, "logging.level"), format=_typed(lo["format"], str, "logging.format")),
        auth=_auth(d["auth"]),
    )
    _validate(cfg)
    return cfg


def _auth(section: Any) -> AuthConfig:
    try:
        return parse_auth(section)
    except AuthConfigError as exc:
        raise ConfigError(str(exc)) from None


_SIZE_LIMITS = {"max_frame_bytes", "max_payload_bytes", "max_pending_bytes_per_connection", "max_fetch_bytes", "max_pending_bytes_total",
                "memory_storage_bytes", "max_subscription_subject_bytes", "max_subscription_bytes_total"}
_DURATION_LIMITS = {"slow_consumer_seconds", "handshake_timeout", "auth_failure_delay", "auth_failure_delay_max"}


def _limits(section: dict[str, Any]) -> dict[str, Any]:
    """The ``[limits]`` section's values, each checked and converted (sizes to bytes,
    durations to seconds): the keyword arguments of :class:`LimitsConfig`."""
    return {k: _limit(k, v) for k, v in section.items()}


def _limit(key: str, value: Any) -> int | float:  # (a TOML value, of whatever type the file gave)
    if key in _SIZE_LIMITS:
        return parse_size(value, f"limits.{key}")
    if key in _DURATION_LIMITS:
        return _seconds(value, f"limits.{key}")
    return _typed(value, int, f"limits.{key}")


def _validate(cfg: Config) -> None:
    if not 0 <= cfg.server.port <= 65535:
        raise ConfigError(f"server.port: {cfg.server.port} is not a TCP port (0..65535)")
    if not ANY_PORT <= cfg.http.port <= 65535:
        raise ConfigError(f"http.port: {cfg.http.port} is not a TCP port (1..65535), 0 (off) or -1 (any free port)")
    if cfg.http.port > 0 and cfg.http.port == cfg.server.port and cfg.http.host == cfg.server.host:
        raise ConfigError(f"http.port: {cfg.http.port} is also server.port; monitoring needs a port of its own")
    ht = cfg.http
    if ht.max_connections < 1:
        raise ConfigError(f"http.max_connections: must be at least 1, got {ht.max_connections}")
    if not 1 <= ht.max_connections_per_peer <= ht.max_connections:
        raise ConfigError(
            f"http.max_connections_per_peer: must be between 1 and http.max_connections ({ht.max_connections}), "
            f"got {ht.max_connections_per_peer}"
        )
    if ht.head_timeout <= 0:
        raise ConfigError("http.head_timeout: must be positive (a request head needs some time to arrive)")
    na = cfg.nats
    if not 0 <= na.port <= 65535:
        raise ConfigError(f"nats.port: {na.port} is not a TCP port (1..65535) or 0 (any free port)")
    if na.enabled and na.port and na.port == cfg.server.port and (na.host or cfg.server.host) == cfg.server.host:
        raise ConfigError(f"nats.port: {na.port} is also server.port; the NATS listener needs a port of its own")
    if na.ping_interval <= 0:
        raise ConfigError("nats.ping_interval: must be positive")
    if na.max_pings_out < 1:
        raise ConfigError("nats.max_pings_out: must be at least 1")
    if not na.stream:
        raise ConfigError("nats.stream: must not be empty")
    if not _CONTROL_LINE_MIN <= na.max_control_line <= _CONTROL_LINE_MAX:
        raise ConfigError(f"nats.max_control_line: must be between {_CONTROL_LINE_MIN} bytes and 1 MiB (nats-server's default: 4096)")
    if na.domain and not valid_domain(na.domain):
        raise ConfigError(f"nats.domain: {na.domain!r} is not a JetStream domain name (letters, digits, _ and -, at most 64)")
    if na.tls_handshake_first is not False and not cfg.server.tls_cert:
        raise ConfigError("nats.tls_handshake_first: needs TLS ([server] tls_cert and tls_key, or --tls-cert and --tls-key)")
    seg = cfg.system.segment
    if not 4096 <= seg.size_bytes <= 1024**3:
        raise ConfigError("system.segment.size_bytes: must be between 4 KiB and 1 GiB")
    if not 0 <= seg.message_expiry <= 0xFFFFFFFE:
        raise ConfigError("system.segment.message_expiry: seconds, 0..4294967294")
    if cfg.message_cleaner.interval <= 0:
        raise ConfigError("message_cleaner.interval: must be positive")
    if cfg.export.interval <= 0:
        raise ConfigError("export.interval: must be positive")
    if cfg.export.worker_priority not in EXPORT_PRIORITIES:
        raise ConfigError(f"export.worker_priority: one of {', '.join(EXPORT_PRIORITIES)}")
    li = cfg.limits
    if li.max_frame_bytes < 1024:
        raise ConfigError("limits.max_frame_bytes: must be at least 1 KiB")
    if not 1 <= li.max_payload_bytes <= li.max_frame_bytes - 64:
        raise ConfigError("limits.max_payload_bytes: must be positive and fit in limits.max_frame_bytes")
    for key in ("max_connections", "max_subscriptions_per_connection", "max_partitions", "max_republish_hops"):
        if getattr(li, key) < 1:
            raise ConfigError(f"limits.{key}: must be at least 1")
    if li.max_pending_bytes_per_connection < li.max_frame_bytes:
        raise ConfigError("limits.max_pending_bytes_per_connection: must be at least limits.max_frame_bytes")
    if li.max_fetch_bytes < 1024:
        raise ConfigError("limits.max_fetch_bytes: must be at least 1 KiB")
    if li.max_pending_bytes_total < li.max_pending_bytes_per_connection:
        raise ConfigError("limits.max_pending_bytes_total: must be at least limits.max_pending_bytes_per_connection")
    for key in ("slow_consumer_seconds", "handshake_timeout"):
        if getattr(li, key) <= 0:
            raise ConfigError(f"limits.{key}: must be positive")
    if li.memory_storage_bytes < 0:
        raise ConfigError("limits.memory_storage_bytes: must not be negative (0: no memory storage)")
    if li.max_subscription_subject_bytes < 1:
        raise ConfigError("limits.max_subscription_subject_bytes: must be at least 1")
    if li.max_subscription_bytes_total < _SUBSCRIPTION_BUDGET_MIN:
        raise ConfigError("limits.max_subscription_bytes_total: must be at least 64 KiB (about 50 subscriptions)")
    if li.auth_failure_delay > li.auth_failure_delay_max:
        raise ConfigError("limits.auth_failure_delay: must not exceed limits.auth_failure_delay_max")
    parse_mode(cfg.system.file_mode, "system.file_mode", 0o600)
    parse_mode(cfg.system.dir_mode, "system.dir_mode", 0o700)
    if cfg.logging.level not in ("debug", "info", "warning", "error"):
        raise ConfigError("logging.level: one of debug, info, warning, error")
    if cfg.logging.format not in ("logfmt", "json"):
        raise ConfigError("logging.format: one of logfmt, json")
    if cfg.auth.users and cfg.server.auth_token:
        raise ConfigError("auth.users: give [server] auth_token or [[auth.users]], not both (as nats-server: a token, or users)")
    cfg.server.ssl_context()  # the TLS files exist and load


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """The embedded defaults, overlaid with the TOML file at ``path`` if given.

    Raises:
        ConfigError: unreadable file, bad TOML, unknown key, wrong type, bad value.
    """
    defaults = tomllib.loads(DEFAULT_CONFIG_TOML())
    if path is None:
        return _build(defaults)
    try:
        with open(path, "rb") as f:
            user = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {os.fspath(path)!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {os.fspath(path)!r} is not valid TOML: {exc}") from None
    return _build(_merge(defaults, user, ""))
