"""TLS for the client: ``tls_context`` and the ``tls`` argument of ``connect``.

``connect(address, tls=...)`` takes an ``ssl.SSLContext``, ``True`` (the system's
trusted CAs: ``ssl.create_default_context()``) or ``None``/``False`` (plain TCP);
an address written ``tls://host:port`` means ``tls=True`` unless a context is given.
The name checked against the broker's certificate (and sent as SNI) is the host
part of the address, so connect by the name or IP address the certificate is for.
Every connection of a client, reconnections included, uses the same context.
"""

from __future__ import annotations

import ssl

__all__ = ["tls_context", "resolve_tls", "MIN_VERSION"]

MIN_VERSION = ssl.TLSVersion.TLSv1_2
_SCHEMES = {"tls://": True, "tcp://": False}


def tls_context(ca: str | None = None, cert: str | None = None, key: str | None = None) -> ssl.SSLContext:
    """A client TLS context that verifies the broker's certificate and host name.

    Args:
        ca: a PEM file of the CA(s) to trust instead of the system's (for a broker
            whose certificate your own CA signed).
        cert: a PEM client certificate (chain), for a broker that requires client
            certificates (``[server] tls_ca``); may hold the key too.
        key: the PEM private key of ``cert`` when it is in a file of its own.

    Raises:
        OSError: a file cannot be read (``FileNotFoundError`` ...).
        ssl.SSLError: a file is not a usable certificate or key.
        ValueError: ``key`` without ``cert``.
    """
    if key and not cert:
        raise ValueError("a client key needs its certificate (cert=...)")
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca or None)
    ctx.minimum_version = MIN_VERSION
    if cert:
        ctx.load_cert_chain(cert, key or None)
    return ctx


def resolve_tls(address: str, tls: ssl.SSLContext | bool | None) -> tuple[str, ssl.SSLContext | None]:
    """``(address without a tls:// or tcp:// prefix, the context to use or None)``."""
    scheme_tls: bool | None = None
    lowered = address.lower()
    for prefix, on in _SCHEMES.items():
        if lowered.startswith(prefix):
            address, scheme_tls = address[len(prefix):], on
            break
    if isinstance(tls, ssl.SSLContext):
        return address, tls
    if tls is None:
        tls = bool(scheme_tls)
    elif not isinstance(tls, bool):
        raise TypeError(f"tls must be an ssl.SSLContext, True, False or None, not {type(tls).__name__}")
    return address, (ssl.create_default_context() if tls else None)
