"""Who a connection is: the check of the credentials a client gives (CONNECT's
``auth_token``, ``user``/``pass``, ``nkey``/``sig``; the binary handshake's token,
user and password) against ``[server] auth_token`` or ``[[auth.users]]``.

As nats-server (``auth.go``: ``processClientOrLeafAuthentication``): a password
starting with ``$2`` is a bcrypt hash and is checked with bcrypt (in a worker
thread: a check costs tens of milliseconds, and the event loop must not wait for
it), any other is compared in constant time; an NKey user signs the nonce the
server sent in its INFO with its private key (Ed25519), and the signature is
checked against the public key configured. An unknown user, a wrong password or
signature: :meth:`Authenticator.check` returns None, and the caller answers
``Authorization Violation``. Passwords are never logged.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets
from dataclasses import dataclass

import trio

from ._config import AuthConfig, UserConfig, decode_user_nkey
from ._permissions import Permissions

__all__ = ["Authenticator", "Identity", "new_nonce"]

#: bcrypt checks at a time (each holds a worker thread for its cost).
_BCRYPT_AT_ONCE = 2


def new_nonce() -> str:
    """A nonce for INFO, as nats-server makes one (11 random bytes, base64url)."""
    return base64.urlsafe_b64encode(secrets.token_bytes(11)).rstrip(b"=").decode()


@dataclass(frozen=True)
class Identity:
    """An authenticated connection: the user's name ("" with the token or without
    auth) and its permissions (None: everything), a copy of its own to keep the
    checks' per-connection state."""

    user: str
    permissions: Permissions | None


_ANONYMOUS = Identity("", None)


class Authenticator:
    """The credentials of one broker (``token``: ``[server] auth_token``)."""

    def __init__(self, auth: AuthConfig, token: str) -> None:
        self.token = token
        self.by_user: dict[str, UserConfig] = {u.user: u for u in auth.users if u.user}
        self.by_nkey: dict[str, UserConfig] = {u.nkey: u for u in auth.users if u.nkey}
        self._perms: dict[str, Permissions | None] = {}
        for u in auth.users:
            cfg = u.permissions or auth.default_permissions
            self._perms[u.name] = Permissions(cfg) if cfg is not None else None
        self._bcrypt = trio.CapacityLimiter(_BCRYPT_AT_ONCE)

    @property
    def required(self) -> bool:
        return bool(self.token or self.by_user or self.by_nkey)

    @property
    def users(self) -> bool:
        return bool(self.by_user or self.by_nkey)

    @property
    def needs_nonce(self) -> bool:
        """Whether INFO carries a nonce (some user signs it with an NKey)."""
        return bool(self.by_nkey)

    def _identity(self, u: UserConfig) -> Identity:
        perms = self._perms[u.name]
        return Identity(u.name, perms.for_connection() if perms is not None else None)

    async def check(
        self, *, user: str = "", password: str = "", token: str = "", nkey: str = "", sig: str = "", nonce: str = "",
    ) -> Identity | None:
        """The identity the credentials prove, or None (refused)."""
        if not self.required:
            return _ANONYMOUS
        if self.token:
            return _ANONYMOUS if token and hmac.compare_digest(token.encode(), self.token.encode()) else None
        if nkey:
            u = self.by_nkey.get(nkey)
            if u is None or not nonce or not _signed(nkey, nonce, sig):
                return None
            return self._identity(u)
        u = self.by_user.get(user)
        if u is None or not password:
            return None
        if u.password.startswith("$2"):
            if not await trio.to_thread.run_sync(_bcrypt_ok, password, u.password, limiter=self._bcrypt):
                return None
        elif not hmac.compare_digest(password.encode(), u.password.encode()):
            return None
        return self._identity(u)


def _bcrypt_ok(password: str, hashed: str) -> bool:
    import bcrypt

    try:
        return bool(bcrypt.checkpw(password.encode(), hashed.encode()))
    except ValueError:  # not a hash bcrypt reads (the config check let it through)
        return False


def _signed(nkey: str, nonce: str, sig: str) -> bool:
    """Whether ``sig`` (base64url or standard base64, padded or not) is the user's
    Ed25519 signature of ``nonce``."""
    import nacl.exceptions
    import nacl.signing

    public = decode_user_nkey(nkey)
    if public is None or not sig:
        return False
    raw = None
    for decode in (base64.urlsafe_b64decode, base64.b64decode):
        try:
            raw = decode(sig + "=" * (-len(sig) % 4))
            break
        except (binascii.Error, ValueError):
            continue
    if raw is None or len(raw) != 64:
        return False
    try:
        nacl.signing.VerifyKey(public).verify(nonce.encode(), raw)
    except nacl.exceptions.BadSignatureError:
        return False
    return True
