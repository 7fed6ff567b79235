"""TLS on the broker's port: ``[server] tls_cert``/``tls_key``/``tls_ca``,
the clients' ``tls=`` option, and what failed TLS handshakes cost.

Certificates are made at test time by ``trustme``: a CA that signs the broker's
certificate (for 127.0.0.1 and localhost) and a client certificate, and a second CA
that signs nothing the broker trusts. Brokers run in the test's trio loop
(``start_server``); the asyncio client needs its own loop, so its tests start the
broker as a subprocess through the CLI's ``--tls-*`` flags.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing
import trustme
from conftest import BrokerProcess, env_with_project, make_config, start_server
from helpers import RawPeer, handshake_bytes

import protocol as P
from broker import Config
from broker.net._limits import LogLimiter
from broker.server._startup import StartupError
from broker.net._tls import TLS_REQUIRED_REASON
from broker.client import ConnectionClosedError, aio, connect, tls_context
from broker.client._backend import TLS_EOF_MESSAGE
from broker.client._tls import resolve_tls
from broker.config import TLS_MIN_VERSION, ConfigError, load_config, server_context
from broker.server import ServerHandle, serve


@dataclass
class Certs:
    dir: Path
    ca: Path  # the CA of the broker's and the client's certificates
    server: Path  # the broker's certificate chain and key, in one file
    server_cert: Path
    server_key: Path
    client: Path  # a client certificate signed by ``ca`` (chain and key)
    other_ca: Path  # a CA that signed nothing here
    other_client: Path  # a client certificate signed by ``other_ca``


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    d = tmp_path_factory.mktemp("certs")
    ca, other = trustme.CA(), trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    c = Certs(d, d / "ca.pem", d / "server.pem", d / "server.crt", d / "server.key", d / "client.pem", d / "other-ca.pem",
              d / "other-client.pem")
    ca.cert_pem.write_to_path(str(c.ca))
    other.cert_pem.write_to_path(str(c.other_ca))
    leaf.private_key_and_cert_chain_pem.write_to_path(str(c.server))
    for blob in leaf.cert_chain_pems:
        blob.write_to_path(str(c.server_cert), append=True)
    leaf.private_key_pem.write_to_path(str(c.server_key))
    ca.issue_cert("client@example.com").private_key_and_cert_chain_pem.write_to_path(str(c.client))
    other.issue_cert("client@example.com").private_key_and_cert_chain_pem.write_to_path(str(c.other_client))
    return c


def tls_config(data_dir: Path, certs: Certs, client_ca: bool = False, **changes: object) -> Config:
    tls = {"server.tls_cert": str(certs.server_cert), "server.tls_key": str(certs.server_key)}
    if client_ca:
        tls["server.tls_ca"] = str(certs.ca)
    return make_config(data_dir, **{"system.partition.fsync": "never", **tls, **changes})


def log_events(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, object]]:
    return [dict(getattr(r, "fields", {}), level=r.levelname) for r in caplog.records if r.getMessage() == event]


async def publish_and_fetch(c) -> None:  # type: ignore[no-untyped-def]
    await c.create_stream("shop")
    await c.create_topic("shop", "orders", partitions=1, subjects=["orders.>"])
    acks = [await c.publish("orders.eu.1", f"m{i}".encode()) for i in range(3)]
    assert [a.offset for a in acks] == [1, 2, 3]
    fetched = await c.fetch("shop", "orders", 0, 1, 10)
    assert [m.payload for m in fetched.messages] == [b"m0", b"m1", b"m2"]


# -- the clients over TLS ------------------------------------------------------------------


async def test_trio_client_publishes_and_fetches_over_tls(data_dir: Path, certs: Certs) -> None:
    async with start_server(tls_config(data_dir, certs)) as h:
        async with connect(h.address, tls=tls_context(ca=str(certs.ca))) as c:
            await publish_and_fetch(c)
            (session,) = h.services.guard.sessions
            assert isinstance(session.stream, trio.SSLStream)
            assert session.stream.version() in ("TLSv1.2", "TLSv1.3")
            assert session.peer.startswith("127.0.0.1:")  # the peer's name survives the wrapping
            stats = await c.stats()
            async with httpx.AsyncClient(base_url=h.monitoring_url or "", timeout=10) as http:
                (shown,) = (await http.get("/connz")).json()["connections"]  # as nats-server shows a TLS connection
                varz = (await http.get("/varz")).json()
            assert shown["tls_version"] == session.stream.version().removeprefix("TLSv")
            assert shown["tls_cipher_suite"] == session.stream.cipher()[0] and varz["tls_required"] is True
        # A tls:// address with a context, and "localhost" (also in the certificate).
        async with connect(f"tls://localhost:{h.port}", tls=tls_context(ca=str(certs.ca))) as c:
            assert await c.ping() >= 0
    assert stats["tls_handshake_failures"] == 0 and stats["connections_failed"] == 0


async def test_the_trio_client_reconnects_over_tls(data_dir: Path, certs: Certs) -> None:
    async with start_server(tls_config(data_dir, certs)) as h:
        reconnected = trio.Event()
        async with connect(
            h.address, tls=tls_context(ca=str(certs.ca)), reconnect_wait=0.01, on_reconnect=lambda n: reconnected.set(),
        ) as c:
            await c.ping()
            for session in list(h.services.guard.sessions):
                session.abort()  # the broker drops the connection
            with trio.fail_after(10):
                await reconnected.wait()
            assert await c.ping() >= 0 and c.reconnects == 1
            (session,) = h.services.guard.sessions
            assert isinstance(session.stream, trio.SSLStream)
        assert h.broker.counters.tls_handshake_failures == 0


def test_asyncio_client_publishes_and_fetches_over_tls(tmp_path: Path, certs: Certs) -> None:
    """The broker from the command line with --tls-cert/--tls-key (one PEM file with
    both), driven by the asyncio client on asyncio's loop and on uvloop."""
    proc = BrokerProcess(tmp_path, "--tls-cert", str(certs.server), "--tls-key", str(certs.server))
    try:
        async def main(first: bool) -> dict[str, int]:
            async with aio.connect(proc.address, tls=aio.tls_context(ca=str(certs.ca)), reconnect=False) as c:
                if first:
                    await publish_and_fetch(c)
                else:
                    assert len((await c.fetch("shop", "orders", 0, 1, 10)).messages) == 3
                    # Pipelined: the link joins the writes of one loop turn into one TLS record.
                    acks = await asyncio.gather(*(c.publish("orders.eu.2", b"p") for _ in range(500)))
                    assert sorted(a.offset for a in acks) == list(range(4, 504))
                return await c.stats()

        assert asyncio.run(main(True))["tls_handshake_failures"] == 0
        assert aio.run(main(False))["tls_handshake_failures"] == 0  # uvloop where installed

        async def wrong_ca() -> None:
            async with aio.connect(proc.address, tls=tls_context(ca=str(certs.other_ca)), reconnect=False):
                pass

        with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed: unable to get local issuer certificate"):
            asyncio.run(wrong_ca())

        async def plain() -> None:
            async with aio.connect(proc.address, reconnect=False):
                pass

        with pytest.raises(P.UnauthorizedError) as refused:  # type: ignore[attr-defined]
            asyncio.run(plain())
        assert refused.value.message == TLS_REQUIRED_REASON
    finally:
        proc.stop()
    assert "event=listening" in proc.stderr and "tls=True client_certificates=False" in proc.stderr
    assert "event=tls_handshake_failed" in proc.stderr


def test_asyncio_tls_client_to_a_plain_port_fails_cleanly(broker_process: BrokerProcess, certs: Certs) -> None:
    async def main() -> None:
        async with aio.connect(broker_process.address, tls=tls_context(ca=str(certs.ca)), reconnect=False):
            pass

    with pytest.raises(ssl.SSLEOFError) as failed:
        asyncio.run(main())
    assert str(failed.value) == TLS_EOF_MESSAGE

    async def still_serving() -> float:
        async with aio.connect(broker_process.address, reconnect=False) as c:
            return await c.ping()

    assert asyncio.run(still_serving()) >= 0


# -- what the client checks -----------------------------------------------------------------


async def test_a_broker_certificate_from_an_unknown_ca_fails_on_the_client(
    data_dir: Path, certs: Certs, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="broker")
    async with start_server(tls_config(data_dir, certs)) as h:
        with pytest.raises(ssl.SSLCertVerificationError) as failed:
            async with connect(h.address, tls=tls_context(ca=str(certs.other_ca))):
                pass
        assert failed.value.verify_message == "unable to get local issuer certificate"
        assert "certificate verify failed" in str(failed.value)
        with pytest.raises(ssl.SSLCertVerificationError):  # the system's CAs do not know ours either
            async with connect(f"tls://{h.address}"):
                pass
        async with connect(h.address, tls=tls_context(ca=str(certs.ca))) as c:  # others are still served
            assert await c.ping() >= 0
        assert h.broker.counters.tls_handshake_failures == 2
    (logged,) = log_events(caplog, "tls_handshake_failed")  # the second one within 10 s: suppressed
    assert logged["level"] == "WARNING" and str(logged["peer"]).startswith("127.0.0.1:")
    assert logged["suppressed"] == 0 and "closed the connection during the TLS handshake" in str(logged["error"])


async def test_a_certificate_for_another_host_fails_on_the_client(data_dir: Path, certs: Certs, tmp_path: Path) -> None:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca2.pem"))
    ca.issue_cert("broker.example").private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "elsewhere.pem"))
    cfg = make_config(data_dir, **{"server.tls_cert": str(tmp_path / "elsewhere.pem"), "server.tls_key": str(tmp_path / "elsewhere.pem")})
    async with start_server(cfg) as h:
        with pytest.raises(ssl.SSLCertVerificationError) as failed:
            async with connect(h.address, tls=tls_context(ca=str(tmp_path / "ca2.pem"))):
                pass
        assert "IP address mismatch" in str(failed.value)


# -- client certificates --------------------------------------------------------------------


async def test_with_tls_ca_only_clients_with_a_certificate_signed_by_it_get_in(
    data_dir: Path, certs: Certs, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="broker")
    async with start_server(tls_config(data_dir, certs, client_ca=True)) as h:
        # The broker's alert tells the client why. TLS 1.3 finishes the client's side of
        # the handshake before the broker checks its certificate, so there the refusal
        # arrives as the connection breaking; TLS 1.2 fails the handshake itself.
        for client_cert, alert in ((None, "alert certificate required"), (certs.other_client, "alert unknown ca")):
            ctx = tls_context(ca=str(certs.ca), cert=str(client_cert) if client_cert else None)
            with pytest.raises(ConnectionClosedError, match=f"the connection broke \\(TLS: .*{alert}\\)"):
                async with connect(h.address, tls=ctx, reconnect=False) as c:
                    await c.ping()
            ctx.maximum_version = ssl.TLSVersion.TLSv1_2
            with pytest.raises(ssl.SSLError, match="alert handshake failure" if client_cert is None else alert):
                async with connect(h.address, tls=ctx, reconnect=False):
                    pass
        async with connect(h.address, tls=tls_context(ca=str(certs.ca), cert=str(certs.client))) as c:
            await publish_and_fetch(c)
            stats = await c.stats()
        assert stats["tls_handshake_failures"] == 4 and stats["auth_failures"] == 0
    (first,) = log_events(caplog, "tls_handshake_failed")  # the others within 10 s: suppressed
    assert first["level"] == "WARNING" and first["reason"] == "PEER_DID_NOT_RETURN_A_CERTIFICATE"
    assert str(first["peer"]).startswith("127.0.0.1:")


def _tls_1_1_client_hello() -> bytes:
    """A ClientHello that offers TLS 1.1 and nothing newer (no supported_versions
    extension), built by hand: the client's own OpenSSL may no longer speak 1.1."""
    body = (
        b"\x03\x02" + os.urandom(32) + b"\x00"  # version 1.1, random, no session id
        + b"\x00\x04\x00\x2f\x00\x35"  # TLS_RSA_WITH_AES_128_CBC_SHA, ..._256_CBC_SHA
        + b"\x01\x00"  # no compression
    )
    handshake = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + len(handshake).to_bytes(2, "big") + handshake


async def test_a_client_limited_to_tls_1_1_is_refused(data_dir: Path, certs: Certs, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="broker")
    async with start_server(tls_config(data_dir, certs)) as h:
        host, port = h.address.rsplit(":", 1)
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            await stream.send_all(_tls_1_1_client_hello())
            answer = b""
            with trio.fail_after(10):
                while len(answer) < 7 and (chunk := await stream.receive_some(64)):
                    answer += chunk
        # A fatal alert record (21), level 2, protocol_version (70).
        assert answer[0] == 21 and answer[5:7] == b"\x02\x46", answer
        assert h.broker.counters.tls_handshake_failures == 1
    (logged,) = log_events(caplog, "tls_handshake_failed")
    assert logged["reason"] == "UNSUPPORTED_PROTOCOL"


def test_the_context_requires_tls_1_2_and_client_certificates_with_tls_ca(certs: Certs) -> None:
    ctx = server_context(str(certs.server), str(certs.server))
    assert ctx.minimum_version == TLS_MIN_VERSION == ssl.TLSVersion.TLSv1_2 and ctx.verify_mode == ssl.CERT_NONE
    ctx = server_context(str(certs.server_cert), str(certs.server_key), str(certs.ca))
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    client = tls_context(ca=str(certs.ca))
    assert client.minimum_version == ssl.TLSVersion.TLSv1_2 and client.check_hostname and client.verify_mode == ssl.CERT_REQUIRED
    with pytest.raises(ValueError, match="needs its certificate"):
        tls_context(key=str(certs.server_key))


def test_addresses_and_the_tls_argument() -> None:
    ctx = ssl.create_default_context()
    assert resolve_tls("127.0.0.1:1", None) == ("127.0.0.1:1", None)
    assert resolve_tls("tcp://127.0.0.1:1", None) == ("127.0.0.1:1", None)
    assert resolve_tls("TLS://h:1", ctx) == ("h:1", ctx)
    address, made = resolve_tls("tls://h:1", None)
    assert address == "h:1" and isinstance(made, ssl.SSLContext) and made.check_hostname
    assert isinstance(resolve_tls("h:1", True)[1], ssl.SSLContext)
    assert resolve_tls("tls://h:1", False) == ("h:1", None)
    with pytest.raises(TypeError):
        resolve_tls("h:1", "yes")  # type: ignore[arg-type]


# -- the wrong protocol on either side -------------------------------------------------------


async def test_a_plain_client_on_the_tls_port_is_told_and_others_are_served(data_dir: Path, certs: Certs) -> None:
    async with start_server(tls_config(data_dir, certs)) as h:
        with pytest.raises(P.UnauthorizedError) as refused:  # type: ignore[attr-defined]
            async with connect(h.address, reconnect=False):
                pass
        assert refused.value.message == TLS_REQUIRED_REASON
        raw = await RawPeer.open(h.address)
        await raw.send(handshake_bytes())
        (goodbye,) = await raw.wait_closed()
        assert isinstance(goodbye, P.Push) and goodbye.kind == P.PushKind.GOODBYE
        assert goodbye.status == P.ErrorCode.UNAUTHORIZED
        async with connect(h.address, tls=tls_context(ca=str(certs.ca))) as c:
            await publish_and_fetch(c)
        counters = h.broker.counters
        assert counters.tls_handshake_failures == 2 and counters.connections_total == 3 and counters.auth_failures == 0


async def test_a_tls_client_on_a_plain_port_fails_cleanly_and_others_are_served(
    server: ServerHandle, certs: Certs, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="broker")
    with pytest.raises(ssl.SSLEOFError) as failed:
        async with connect(server.address, tls=tls_context(ca=str(certs.ca))):
            pass
    assert str(failed.value) == TLS_EOF_MESSAGE
    async with connect(server.address) as c:
        await publish_and_fetch(c)
        stats = await c.stats()
    assert stats["tls_handshake_failures"] == 1 and stats["connections_failed"] == 0  # one counter per ended connection
    (logged,) = log_events(caplog, "tls_handshake_failed")
    assert logged["level"] == "WARNING" and logged["reason"] == "TLS_ON_PLAIN_PORT"
    assert str(logged["peer"]).startswith("127.0.0.1:")


async def test_failed_tls_handshakes_are_counted_and_logged_once_per_host_per_10s(
    data_dir: Path, certs: Certs, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A scanner: 20 plain connections in a burst, then one more 10 s later."""
    caplog.set_level(logging.INFO, logger="broker")
    async with start_server(tls_config(data_dir, certs)) as h:
        async def knock() -> None:
            raw = await RawPeer.open(h.address)
            await raw.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            await raw.wait_closed()
            await raw.aclose()

        for _ in range(20):
            await knock()
        await trio.sleep(10)
        await knock()
        assert h.broker.counters.tls_handshake_failures == 21
    logged = log_events(caplog, "tls_handshake_failed")
    assert [e["suppressed"] for e in logged] == [0, 19]
    assert {e["level"] for e in logged} == {"WARNING"} and {e["reason"] for e in logged} == {"NOT_TLS"}
    assert all(str(e["peer"]).startswith("127.0.0.1:") for e in logged)


async def test_a_silent_connection_to_the_tls_port_times_out(
    data_dir: Path, certs: Certs, autojump_clock: trio.testing.MockClock
) -> None:
    async with start_server(tls_config(data_dir, certs, **{"limits.handshake_timeout": "2s"})) as h:
        raw = await RawPeer.open(h.address)
        start = trio.current_time()
        assert await raw.wait_closed(timeout=10) == []
        assert trio.current_time() - start == pytest.approx(2.0)
        assert h.broker.counters.handshake_timeouts == 1 and h.broker.counters.tls_handshake_failures == 0
        async with connect(h.address, tls=tls_context(ca=str(certs.ca))) as c:
            assert await c.ping() >= 0


async def test_tls_handshakes_in_progress_are_bounded_by_max_connections(data_dir: Path, certs: Certs) -> None:
    async with start_server(tls_config(data_dir, certs, **{"limits.max_connections": 2})) as h:
        silent = [await RawPeer.open(h.address) for _ in range(2)]
        await trio.testing.wait_all_tasks_blocked()
        third = await RawPeer.open(h.address)
        assert await third.wait_closed(timeout=2) == []  # closed at once, not after handshake_timeout
        assert h.broker.counters.connections_refused == 1
        for raw in silent:
            await raw.aclose()
        async with connect(h.address, tls=tls_context(ca=str(certs.ca))) as c:
            assert await c.ping() >= 0


def test_log_limiter_is_per_host_and_bounded() -> None:
    lim = LogLimiter(10.0, hosts=100)
    assert [lim.allow("a", t) for t in (0.0, 1.0, 9.9, 10.0, 10.5, 25.0)] == [0, None, None, 2, None, 1]
    assert lim.allow("b", 1.0) == 0
    for i in range(1000):
        lim.allow(f"h{i}", 30.0)
    assert len(lim._hosts) == 100


# -- configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"tls_cert": "missing.pem", "tls_key": "server.key"},
         "server.tls_cert: cannot read '{d}/missing.pem': No such file or directory"),
        ({"tls_cert": "server.crt", "tls_key": "missing.key"},
         "server.tls_key: cannot read '{d}/missing.key': No such file or directory"),
        ({"tls_cert": "adir", "tls_key": "server.key"}, "server.tls_cert: cannot read '{d}/adir': Is a directory"),
        ({"tls_cert": "server.crt", "tls_key": "server.key", "tls_ca": "missing-ca.pem"},
         "server.tls_ca: cannot read '{d}/missing-ca.pem': No such file or directory"),
        ({"tls_cert": "server.key", "tls_key": "server.key"},
         "server.tls_cert: '{d}/server.key' holds no PEM certificate (-----BEGIN CERTIFICATE-----)"),
        ({"tls_cert": "server.crt", "tls_key": "server.crt"},
         "server.tls_key: '{d}/server.crt' holds no PEM private key (-----BEGIN PRIVATE KEY-----)"),
        ({"tls_cert": "server.crt", "tls_key": "client.pem"},
         "server.tls_key: the private key in '{d}/client.pem' does not match the certificate in '{d}/server.crt'"),
        ({"tls_cert": "server.crt", "tls_key": "encrypted.key"},
         "server.tls_key: '{d}/encrypted.key' is encrypted; the broker needs an unencrypted key (readable by its user only)"),
        ({"tls_cert": "server.crt", "tls_key": "server.key", "tls_ca": "server.key"},
         "server.tls_ca: '{d}/server.key' holds no PEM CA certificate (-----BEGIN CERTIFICATE-----)"),
        ({"tls_cert": "garbage.crt", "tls_key": "server.key"},
         "server.tls_cert: cannot load '{d}/garbage.crt' with the key in '{d}/server.key': a certificate or the key in them "
         "is damaged (OpenSSL: "),
        ({"tls_cert": "server.crt", "tls_key": "server.key", "tls_ca": "garbage.crt"},
         "server.tls_ca: cannot load '{d}/garbage.crt': a certificate in it is damaged (OpenSSL: "),
        ({"tls_cert": "server.crt"}, "server.tls_key: required when server.tls_cert is set (give both, or neither for no TLS)"),
        ({"tls_key": "server.key"}, "server.tls_cert: required when server.tls_key is set (give both, or neither for no TLS)"),
        ({"tls_ca": "ca.pem"},
         "server.tls_ca: requires server.tls_cert and server.tls_key (client certificates are checked inside TLS)"),
    ],
)
def test_tls_config_mistakes_are_one_line_naming_the_file(certs: Certs, tmp_path: Path, files: dict[str, str], message: str) -> None:
    d = certs.dir
    (d / "adir").mkdir(exist_ok=True)
    (d / "garbage.crt").write_text("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
    _write_encrypted_key(certs.server_key, d / "encrypted.key")
    text = "[server]\n" + "".join(f'{k} = "{d / v}"\n' for k, v in files.items())
    (tmp_path / "c.toml").write_text(text)
    with pytest.raises(ConfigError) as failed:
        load_config(tmp_path / "c.toml")
    expected = message.format(d=d)
    if expected.endswith("(OpenSSL: "):  # then OpenSSL's own words, which depend on its version
        assert str(failed.value).startswith(expected) and str(failed.value).endswith(")")
    else:
        assert str(failed.value) == expected
    assert "\n" not in str(failed.value)


def _write_encrypted_key(plain: Path, out: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(plain.read_bytes(), None)
    out.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"pw"),
    ))


def test_tls_files_load_from_the_config_file(certs: Certs, tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text(
        f'[server]\ntls_cert = "{certs.server_cert}"\ntls_key = "{certs.server_key}"\ntls_ca = "{certs.ca}"\n'
    )
    cfg = load_config(tmp_path / "c.toml")
    assert cfg.server.tls and cfg.server.tls_ca == str(certs.ca)
    assert not Config().server.tls and Config().server.ssl_context() is None


async def test_a_certificate_gone_by_the_time_the_broker_starts_is_a_startup_error(data_dir: Path, certs: Certs, tmp_path: Path) -> None:
    cert = tmp_path / "moving.crt"
    cert.write_bytes(certs.server_cert.read_bytes())
    cfg = make_config(data_dir, **{"server.tls_cert": str(cert), "server.tls_key": str(certs.server_key)})
    cert.unlink()
    with pytest.raises(StartupError) as failed:
        await serve(cfg)
    assert failed.value.message == f"invalid configuration: server.tls_cert: cannot read '{cert}': No such file or directory"


def test_serve_with_a_missing_certificate_prints_one_line_and_exits_2(tmp_path: Path, certs: Certs) -> None:
    missing = tmp_path / "nope.pem"
    done = subprocess.run(
        [sys.executable, "-m", "broker", "serve", "--port", "0", "--data", str(tmp_path / "data"),
         "--tls-cert", str(missing), "--tls-key", str(certs.server_key)],
        capture_output=True, text=True, env=env_with_project(), timeout=60, cwd=str(tmp_path),
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"error: INVALID_CONFIG: server.tls_cert: cannot read '{missing}': No such file or directory\n"
    assert not os.path.exists(tmp_path / "data")
