"""Pipelined KV gets that arrive in one read are answered as one run
(``Session._kv_get_run``, ``broker.kv.kv_get_frames``): each request still gets exactly the
answer it gets alone through ``next_event`` and its handler, byte for byte and in
order, errors inside a run included (unknown bucket, not a bucket, bad key, not
found, another key's revision, a malformed payload, a damaged record, a request split
across reads, another command in the middle); a bucket that refreshes keys on read
takes the ordinary path and still writes its lease."""

from __future__ import annotations

import types
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ttl_helpers import broker_and_client

import protocol as P
from broker.server import _session
from broker.kv import kv_get_frames
from broker.server._session import Session

KV_GET = int(P.Command.KV_GET)
KV = P.Identifier.of("kv")


def get_frame(corr: int, bucket: str | int, key: str, revision: int = 0, *, subject: str | None = None) -> bytes:
    topic = P.Identifier.of(bucket)
    payload = P.KvGet(KV, topic, f"$KV.{bucket}.{key}" if subject is None else subject, revision).encode()
    return P.encode_frame(KV_GET, 0, corr, 0, payload)


def raw_get_frame(corr: int, payload: bytes) -> bytes:
    return P.encode_frame(KV_GET, 0, corr, 0, payload)


def ping(corr: int) -> bytes:
    return P.encode_frame(P.Command.PING, 0, corr, 0)


class Raw:
    """A handshaken connection that reads answers as frames (code, flags, id,
    status, payload): equal frames are equal bytes."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.dec = P.FrameDecoder()

    @classmethod
    async def open(cls, address: str) -> Raw:
        host, port = address.rsplit(":", 1)
        raw = cls(await trio.open_tcp_stream(host, int(port)))
        await raw.stream.send_all(P.encode_frame(P.Command.HANDSHAKE, 0, 1, 0, P.Handshake(P.PROTOCOL_VERSION, "", "t").encode()))
        assert (await raw.frames(1))[0].status == 0
        return raw

    async def frames(self, n: int) -> list[P.Frame]:
        out: list[P.Frame] = []
        with trio.fail_after(5):
            while len(out) < n:
                frame = self.dec.next_frame()
                if frame is not None:
                    out.append(frame)
                    continue
                data = await self.stream.receive_some(65536)
                assert data, "connection closed"
                self.dec.feed(data)
        return out


def spy_on_runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(first, end) of each stretch ``kv_get_frames`` answered."""
    runs: list[tuple[int, int]] = []

    def spy(broker: Any, requests: Any, start: int, max_bytes: int) -> Any:
        out = kv_get_frames(broker, requests, start, max_bytes)
        runs.append((start, out[2]))
        return out

    monkeypatch.setattr(_session, "kv_get_frames", spy)
    return runs


def no_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every request through next_event, as before runs of gets."""
    monkeypatch.setattr(P.ProtocolConnection, "take_requests", lambda self, code, limit: [])


async def make_buckets(h: Any, c: Any) -> dict[str, int]:
    b = await c.kv_create("b", history=2)
    revs = {}
    for i in range(5):
        revs[f"k{i}"] = await b.put(f"k{i}", b"v%d" % i * (i + 1))
    await b.put("k4", b"second")
    await b.delete("gone")
    t = await c.kv_create("t", ttl=60)
    await t.put("x", b"expires")
    r = await c.kv_create("r", ttl=10, refresh="on_read_and_write")
    revs["hot"] = await r.put("hot", b"v")
    await c.create_topic("kv", "plain", subjects=["plain.>"])
    return revs


async def test_errors_inside_a_run_get_the_answers_they_get_alone(mock_clock, data_dir, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    async with broker_and_client(data_dir) as (h, c):
        revs = await make_buckets(h, c)
        target = KV.encode() + P.Identifier.of("b").encode()
        frames = [
            get_frame(1, "b", "k0"),
            get_frame(2, "nope", "k0"),  # TOPIC_NOT_FOUND
            get_frame(3, "b", "a..b"),  # INVALID_SUBJECT
            get_frame(4, "b", "missing"),  # MESSAGE_NOT_FOUND
            get_frame(5, "b", "k1", revs["k0"]),  # another key's revision: not found
            get_frame(6, "b", "k1", revs["k1"]),
            raw_get_frame(7, target + b"\x02\xff\xfe" + bytes(8)),  # a key that is not UTF-8: MALFORMED_PAYLOAD
            raw_get_frame(8, P.KvGet(KV, P.Identifier.of("b"), "$KV.b.k2", 0).encode()[:-1]),  # revision cut short
            ping(9),
            get_frame(10, "plain", "k0", subject="plain.k0"),  # NOT_A_BUCKET
            get_frame(11, "r", "hot"),  # refresh on read: the ordinary path, a lease
            get_frame(12, "b", "k4"),
            get_frame(13, "t", "x"),
            get_frame(14, "b", "gone"),  # a tombstone: found, operation DEL
            get_frame(15, "b", "k3", subject="$KV.b.k3"),
        ]
        tail = get_frame(16, "b", "k4", revs["k4"])
        data = b"".join(frames) + tail[:20]

        runs = spy_on_runs(monkeypatch)
        raw = await Raw.open(h.address)
        async with raw.stream:  # closed before the broker stops, whatever happens
            await raw.stream.send_all(data)
            after = await raw.frames(len(frames))
            await raw.stream.send_all(tail[20:] + get_frame(17, "b", "k0"))
            after += await raw.frames(2)
        # What each request gets alone: next_event's refusal, or its handler's
        # answer or error, in its response frame.
        conn = P.ProtocolConnection(P.Role.SERVER)
        conn.state = P.State.READY
        handler = h.services.dispatch.sync[P.KvGet]
        for frame, got in zip([*frames, tail, get_frame(17, "b", "k0")], after):
            conn.receive_data(frame)
            event = conn.next_event()
            if isinstance(event, P.InvalidRequest):
                alone = conn.send_error(event.correlation_id, event.code, event.error)
            elif isinstance(event.command, P.Ping):
                continue
            else:
                try:
                    reply = handler(None, event.command)
                except P.BrokerError as err:
                    alone = conn.send_error(event.correlation_id, KV_GET, err)
                else:
                    alone = conn.send_raw_response(event.correlation_id, KV_GET, reply[0] if isinstance(reply, tuple) else reply)
            assert P.encode_frame(*got) == alone
        assert [f.correlation_id for f in after] == list(range(1, 18))
        E = P.ErrorCode
        assert [f.status for f in after] == [
            0, E.TOPIC_NOT_FOUND, E.INVALID_SUBJECT, E.MESSAGE_NOT_FOUND, E.MESSAGE_NOT_FOUND, 0,
            E.MALFORMED_PAYLOAD, E.MALFORMED_PAYLOAD, 0, E.NOT_A_BUCKET, 0, 0, 0, 0, 0, 0, 0,
        ]
        assert after[1].payload == b"stream 'kv' has no topic 'nope'"
        assert after[3].payload == b"key '$KV.b.missing' not found in bucket 'b'"
        assert after[4].payload == f"revision {revs['k0']} of '$KV.b.k1' not found in bucket 'b'".encode()
        assert P.InfoMap.values_of(after[13].payload)["operation"] == "DEL"
        # The runs answered the eight gets that found their key (the errors inside
        # them by their handler's error); the malformed ones (7, 8) and the one the
        # refresh bucket left (11) went the ordinary way.
        assert sum(end - start for start, end in runs) == 8
        bucket = h.broker.catalog.topic(KV, P.Identifier.of("r"))
        assert bucket.consumers.get(_kv_lease(revs["hot"]), 0) > 0


def _kv_lease(offset: int) -> str:
    from broker.kv import LEASE_PREFIX

    return f"{LEASE_PREFIX}{offset}"


async def test_a_damaged_record_inside_a_run_is_refused_each_time(mock_clock, data_dir, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The key's newest revision is damaged: refused when the read finds it so, and
    by the next get, which knows (never "not found": docs/semantics.md §3.4)."""
    async with broker_and_client(data_dir) as (h, c):
        revs = await make_buckets(h, c)
        log = h.broker.catalog.topic(KV, P.Identifier.of("b")).partitions[0].log
        seg = log.segments[-1]
        rel = revs["k2"] - seg.base
        with open(seg.log_path, "r+b") as f:
            f.seek(seg.positions[rel] + 45)
            byte = f.read(1)
            f.seek(seg.positions[rel] + 45)
            f.write(bytes([byte[0] ^ 0x10]))
        runs = spy_on_runs(monkeypatch)
        raw = await Raw.open(h.address)
        async with raw.stream:  # closed before the broker stops, whatever happens
            await raw.stream.send_all(get_frame(1, "b", "k1") + get_frame(2, "b", "k2") + get_frame(3, "b", "k2") + get_frame(4, "b", "k3"))
            got = await raw.frames(4)
        assert [f.status for f in got] == [0, P.ErrorCode.CORRUPTED_RECORD, P.ErrorCode.CORRUPTED_RECORD, 0]
        assert got[1].payload == got[2].payload == (
            f"the newest revision of key '$KV.b.k2' in bucket 'b' is damaged: revision {revs['k2']} cannot be read, "
            "and no older revision is served in its place (`ttlbroker repair` writes the damaged record off)"
        ).encode()
        assert P.InfoMap.values_of(got[3].payload)["value"] == b"v3" * 4
        assert (await c.stats())["corrupt_records"] == 1
        assert runs == [(0, 1), (2, 2), (3, 4)]  # each error ends a stretch, inside the run


async def test_runs_answer_byte_for_byte_what_each_request_gets_alone(mock_clock, data_dir) -> None:  # type: ignore[no-untyped-def]
    """Hypothesis: any sequence of gets (good, missing, bad, malformed, another
    spelling of the bucket, other buckets) given to ``Session._kv_get_run`` queues
    the frames the read loop queues for them one by one (``next_event``, then the
    handler or the refusal), in order."""
    async with broker_and_client(data_dir) as (h, c):
        revs = await make_buckets(h, c)
        broker = h.broker
        b_id = broker.catalog.topic(KV, P.Identifier.of("b")).id
        target = KV.encode() + P.Identifier.of("b").encode()

        def session() -> tuple[Session, list[bytes]]:
            s = object.__new__(Session)
            s.broker = broker
            s.dispatch = h.services.dispatch
            s.conn = P.ProtocolConnection(P.Role.SERVER)
            s.conn.state = P.State.READY
            s.id = 0
            s.corr = 0
            s.perms = None  # no [auth]: every subject allowed
            # A transport that takes every frame and is never over a limit.
            s.transport = types.SimpleNamespace(now_bytes=0, stopped_or_full=lambda: False)  # type: ignore[assignment]
            out: list[bytes] = []
            s.send_now = out.append
            return s, out

        keys = [*(f"k{i}" for i in range(5)), "x", "hot", "gone", "missing", "a..b", "", "a b", "*"]
        one = st.one_of(
            st.tuples(st.just("get"), st.sampled_from(["b", "t", "r", "nope", "plain", b_id]), st.sampled_from(keys),
                      st.sampled_from([0, 0, 0, *revs.values(), 2**64 - 1])),
            st.tuples(st.just("raw"), st.sampled_from([
                target + b"\x02\xff\xfe" + bytes(8), target, b"", b"\x01", target + b"\x03$KV" + bytes(9),
                target + b"\x00" + bytes(8),
            ])),
        )

        @given(st.lists(one, max_size=40))
        @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
        def check(items: list[Any]) -> None:
            frames = []
            for corr, item in enumerate(items, 1):
                if item[0] == "raw":
                    frames.append(raw_get_frame(corr, item[1]))
                else:
                    _, bucket, key, rev = item
                    name = "b" if bucket == b_id else bucket
                    subject = f"plain.{key}" if bucket == "plain" else f"$KV.{name}.{key}"
                    frames.append(get_frame(corr, bucket, key, rev, subject=subject))
            data = b"".join(frames)
            # The read loop, one request at a time.
            alone, expected = session()
            alone.conn.receive_data(data)
            handler = h.services.dispatch.sync[P.KvGet]
            while (event := alone.conn.next_event()) is not P.NEED_DATA:
                if isinstance(event, P.Request):
                    alone._handle_now(event, handler)
                else:
                    alone._refuse(event)
            # The run.
            run, got = session()
            run.conn.receive_data(data)
            requests = run.conn.take_requests(KV_GET, 1000)
            assert len(requests) == len(items)
            with pytest.raises(StopIteration):  # no checkpoint: nothing is over a limit
                run._kv_get_run(requests).send(None)
            assert b"".join(got) == b"".join(expected)

        check()


async def test_a_run_looks_at_its_output_every_send_early_bytes(mock_clock, data_dir, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Large values: a run's stretches end once their answers reach SEND_EARLY
    bytes (the session sends them and looks at its output limits before the
    next), and every answer is still there, in order."""
    async with broker_and_client(data_dir) as (h, c):
        kv = await c.kv_create("big")
        value = b"v" * 6000
        for i in range(10):
            await kv.put(f"k{i}", value)
        runs = spy_on_runs(monkeypatch)
        raw = await Raw.open(h.address)
        async with raw.stream:
            await raw.stream.send_all(b"".join(get_frame(i, "big", f"k{i}") for i in range(10)))
            got = await raw.frames(10)
        assert [f.correlation_id for f in got] == list(range(10))
        assert all(f.status == 0 and P.InfoMap.values_of(f.payload)["value"] == value for f in got)
        assert _session.SEND_EARLY == 16 * 1024
        assert runs == [(0, 3), (3, 6), (6, 9), (9, 10)]
