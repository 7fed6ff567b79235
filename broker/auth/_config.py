"""The ``[auth]`` section: users, their credentials and their permissions, as
nats-server's ``authorization`` block has them, read from TOML.

::

    [[auth.users]]
    user = "orders"
    password = "$2a$11$..."            # plain, or a bcrypt hash ("$2...")
    [auth.users.permissions]
    publish = ["orders.>", "$JS.API.>"]                 # a list: what is allowed
    subscribe = { allow = ["_INBOX.>"], deny = ["_INBOX.secret"] }
    allow_responses = true              # or { max = 1, expires = "2m" }

    [[auth.users]]
    nkey = "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4"

    [auth.default_permissions]          # for users without their own
    subscribe = { deny = [">"] }

The rules are nats-server's (``opts.go``: ``parseUserPermissions``,
``parseVariablePermissions``, ``parseAllowResponses``): ``publish`` and
``subscribe`` are a subject, a list of subjects (allowed), or a table of ``allow``
and ``deny`` (each a subject or a list); a ``subscribe`` entry may name a queue
group after a space (``"orders.* workers"``: only that queue may subscribe);
``allow_responses`` is true or a table of ``max`` (responses per request, default
1; negative: any number) and ``expires`` (a duration, default 2 minutes; negative:
never), and with it a user with no ``publish.allow`` may publish nothing but
responses. Errors are :class:`AuthConfigError` naming the key (the configuration
loader reports them as its own).
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from typing import Any

from protocol.nats import valid_nats_subject
from storage import parse_duration_ms

__all__ = [
    "AuthConfig", "AuthConfigError", "PermissionsConfig", "ResponsePermission", "SubjectPermission", "UserConfig",
    "parse_auth", "decode_user_nkey",
]

#: nats-server's defaults for ``allow_responses: true``.
DEFAULT_RESPONSE_MAX = 1
DEFAULT_RESPONSE_EXPIRES = 120.0
_BCRYPT_RE = re.compile(r"^\$2[abxy]?\$\d\d\$[./A-Za-z0-9]{53}$")
#: The first byte of a user's public NKey, decoded (``U...``: 20 << 3).
_USER_PREFIX = 20 << 3


class AuthConfigError(ValueError):
    """The ``[auth]`` section is invalid; the message names the key."""


@dataclass(frozen=True)
class SubjectPermission:
    """Subjects allowed (None: every one, unless denied; empty: none) and denied."""

    allow: tuple[str, ...] | None = None
    deny: tuple[str, ...] = ()


@dataclass(frozen=True)
class ResponsePermission:
    """Publishing to the reply subject of a message this user received: at most
    ``max_msgs`` times (negative: any number) within ``expires`` seconds of its
    delivery (negative: no limit)."""

    max_msgs: int = DEFAULT_RESPONSE_MAX
    expires: float = DEFAULT_RESPONSE_EXPIRES


@dataclass(frozen=True)
class PermissionsConfig:
    publish: SubjectPermission | None = None
    subscribe: SubjectPermission | None = None
    allow_responses: ResponsePermission | None = None


@dataclass(frozen=True)
class UserConfig:
    """One ``[[auth.users]]`` entry: a ``user`` with a ``password`` (plain or a bcrypt
    hash), or an ``nkey`` (a user's public NKey); its own permissions or None (the
    default permissions apply)."""

    user: str = ""
    password: str = field(default="", repr=False)
    nkey: str = ""
    permissions: PermissionsConfig | None = None

    @property
    def name(self) -> str:
        """How log lines and counters name the user."""
        return self.user or self.nkey


@dataclass(frozen=True)
class AuthConfig:
    users: tuple[UserConfig, ...] = ()
    default_permissions: PermissionsConfig | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.users)


def parse_auth(section: Any) -> AuthConfig:
    """The ``[auth]`` section (a TOML table, or what ``to_dict`` made of an
    :class:`AuthConfig`).

    Raises:
        AuthConfigError: naming the key and what is wrong.
    """
    if isinstance(section, AuthConfig):
        return section
    if not isinstance(section, dict):
        raise AuthConfigError(f"auth: expected a section, got {section!r}")
    for key in section:
        if key not in ("users", "default_permissions"):
            raise AuthConfigError(f"unknown configuration key 'auth.{key}'")
    users_raw = section.get("users", [])
    if not isinstance(users_raw, (list, tuple)):
        raise AuthConfigError(f"auth.users: expected an array of tables ([[auth.users]]), got {users_raw!r}")
    users = tuple(_user(u, f"auth.users[{i}]") for i, u in enumerate(users_raw))
    seen: dict[str, int] = {}
    for i, u in enumerate(users):
        if u.name in seen:
            what = "user" if u.user else "nkey"
            raise AuthConfigError(f"auth.users[{i}].{what}: {u.name!r} is also auth.users[{seen[u.name]}] (each user once)")
        seen[u.name] = i
    dp = section.get("default_permissions")
    return AuthConfig(users, _permissions(dp, "auth.default_permissions") if dp else None)


def _user(entry: Any, key: str) -> UserConfig:
    if isinstance(entry, UserConfig):
        return entry
    if not isinstance(entry, dict):
        raise AuthConfigError(f"{key}: expected a table with user and password, or nkey, got {entry!r}")
    for name in entry:
        if name not in ("user", "password", "nkey", "permissions"):
            raise AuthConfigError(f"unknown configuration key '{key}.{name}'")
    values = {}
    for name in ("user", "password", "nkey"):
        v = entry.get(name, "")
        if not isinstance(v, str):
            raise AuthConfigError(f"{key}.{name}: expected a string")
        values[name] = v
    user, password, nkey = values["user"], values["password"], values["nkey"]
    if nkey:
        if user or password:
            raise AuthConfigError(f"{key}: an nkey user has no user or password (give one kind of credential)")
        if decode_user_nkey(nkey) is None:
            raise AuthConfigError(f"{key}.nkey: {nkey!r} is not a user's public NKey (56 characters starting with U)")
    elif not user:
        raise AuthConfigError(f"{key}: give user and password, or nkey")
    elif not password:
        raise AuthConfigError(f"{key}.password: required for user {user!r}")
    elif password.startswith("$2") and not _BCRYPT_RE.match(password):
        raise AuthConfigError(f"{key}.password: starts with $2 but is not a bcrypt hash ($2a$, $2b$ or $2y$, a cost, 53 characters)")
    elif any(c.isspace() for c in user):
        raise AuthConfigError(f"{key}.user: {user!r} has whitespace")
    perms = entry.get("permissions")
    return UserConfig(user, password, nkey, _permissions(perms, f"{key}.permissions") if perms is not None else None)


def _permissions(value: Any, key: str) -> PermissionsConfig:
    if isinstance(value, PermissionsConfig):
        return value
    if not isinstance(value, dict):
        raise AuthConfigError(f"{key}: expected a table of publish, subscribe and allow_responses")
    for name in value:
        if name not in ("publish", "subscribe", "allow_responses"):
            raise AuthConfigError(f"unknown configuration key '{key}.{name}'")
    pub, sub, resp = (value.get(k) for k in ("publish", "subscribe", "allow_responses"))
    publish = _subject_permission(pub, f"{key}.publish", queues=False) if pub is not None else None
    subscribe = _subject_permission(sub, f"{key}.subscribe", queues=True) if sub is not None else None
    responses = _responses(resp, f"{key}.allow_responses")
    if responses is not None and (publish is None or publish.allow is None):
        # As nats-server: responses turn off the blanket publish allow.
        publish = SubjectPermission((), publish.deny if publish is not None else ())
    return PermissionsConfig(publish, subscribe, responses)


def _subject_permission(value: Any, key: str, queues: bool) -> SubjectPermission:
    if isinstance(value, SubjectPermission):
        return value
    if isinstance(value, dict):
        unknown = next((k for k in value if k not in ("allow", "deny")), None)
        if unknown is not None:
            raise AuthConfigError(f"unknown configuration key '{key}.{unknown}'")
        allow = value.get("allow")
        return SubjectPermission(
            _subjects(allow, f"{key}.allow", queues) if allow is not None else None,
            _subjects(value.get("deny") or (), f"{key}.deny", queues),
        )
    return SubjectPermission(_subjects(value, key, queues))


def _subjects(value: Any, key: str, queues: bool) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) for s in items):
        raise AuthConfigError(f"{key}: expected a subject or a list of subjects, got {value!r}")
    for s in items:
        parts = s.split()
        if queues and len(parts) == 2:
            subject, queue = parts
            if not valid_nats_subject(queue, wildcards=True):
                raise AuthConfigError(f"{key}: {s!r}: the queue group {queue!r} is not valid")
        elif len(parts) == 1:
            subject = parts[0]
        else:
            what = "a subject and a queue group" if queues else "a subject (a queue group has no meaning for publish)"
            raise AuthConfigError(f"{key}: {s!r} is not {what}")
        if not valid_nats_subject(subject, wildcards=True):
            raise AuthConfigError(f"{key}: {s!r} is not a valid subject")
    return tuple(" ".join(s.split()) for s in items)


def _responses(value: Any, key: str) -> ResponsePermission | None:
    if isinstance(value, ResponsePermission) or value is None:
        return value
    if isinstance(value, bool):
        return ResponsePermission() if value else None
    if not isinstance(value, dict):
        raise AuthConfigError(f"{key}: expected true, false or a table of max and expires")
    max_msgs, expires = DEFAULT_RESPONSE_MAX, DEFAULT_RESPONSE_EXPIRES
    for name, v in value.items():
        if name in ("max", "max_msgs"):
            if not isinstance(v, int) or isinstance(v, bool):
                raise AuthConfigError(f"{key}.{name}: expected an integer")
            max_msgs = v or DEFAULT_RESPONSE_MAX  # (0: the default, as nats-server)
        elif name == "expires":
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                seconds = float(v)
            elif isinstance(v, str):
                negative = v.strip().startswith("-")
                try:
                    seconds = parse_duration_ms(v.strip().lstrip("-"), key) / 1000.0
                except ValueError as exc:
                    raise AuthConfigError(f"{key}.expires: {exc}") from None
                seconds = -seconds if negative else seconds
            else:
                raise AuthConfigError(f"{key}.expires: expected a duration such as \"2m\"")
            expires = seconds or DEFAULT_RESPONSE_EXPIRES
        else:
            raise AuthConfigError(f"unknown configuration key '{key}.{name}'")
    return ResponsePermission(max_msgs, expires)


def decode_user_nkey(nkey: str) -> bytes | None:
    """The 32-byte Ed25519 public key of a user's NKey (base32 of a prefix byte, the
    key and a CRC-16), or None when ``nkey`` is not one."""
    if len(nkey) != 56 or not nkey.startswith("U"):
        return None
    try:
        raw = base64.b32decode(nkey)
    except (binascii.Error, ValueError):
        return None
    if len(raw) != 35 or raw[0] != _USER_PREFIX:
        return None
    if int.from_bytes(raw[33:], "little") != _crc16(raw[:33]):
        return None
    return raw[1:33]


def _crc16(data: bytes) -> int:
    """CRC-16/XMODEM, as NKeys checksum their encoding."""
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc
