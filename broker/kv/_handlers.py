"""The KV commands: KV_GET, KV_TOUCH and KV_KEYS, as functions ``(kv, session,
command) -> Reply``, and the run of KV_GETs one read brings (:func:`kv_get_frames`).
Puts, creates, updates, deletes and purges are ordinary publishes."""

from __future__ import annotations

import protocol as P
from protocol import validate_filter, validate_subject

from broker.core import Reply, Topic

from ._reads import KvReads

__all__ = ["kv_get", "kv_get_frames", "kv_keys", "kv_touch"]


def kv_get(kv: KvReads, session: object, cmd: P.KvGet) -> Reply:
    broker = kv.broker
    topic = broker.catalog.topic(cmd.stream, cmd.topic)
    validate_subject(cmd.subject)
    entry, epoch = kv.get(topic, cmd.subject, cmd.revision, broker.clock.now_ns())
    broker.counters.messages_out += 1
    payload = P.InfoMap.pack(entry)
    return (payload, epoch) if epoch else payload


def kv_get_frames(
    kv: KvReads, requests: list[tuple[int, bytes]], start: int, max_bytes: int
) -> tuple[list[bytes], int, int, Exception | None]:
    """KV_GET requests of one read (``(correlation id, payload)`` each, as
    ``ProtocolConnection.take_requests`` takes them), from ``start`` on, answered as
    one run: the bucket looked up once for consecutive requests naming it the same
    way, the clock read once, no command object per request, each answer packed
    straight into its frame (``protocol.info_map_frame``). Each answer is the frame
    :func:`kv_get` gives for it, byte for byte.

    Returns the answers' frames, their size in bytes, the index of the first request
    not answered (``len(requests)``: all were) and, when it stopped before the end:
    the error that request's handler raises (the session answers it as any
    handler's error); or None: the answers reached ``max_bytes`` (the session
    looks at its output limits before it goes on), or else that request must take
    the ordinary path (its payload is not a well-formed KV_GET with a valid UTF-8
    key, whose refusal the decoder words; or its bucket refreshes keys on read, a
    get that writes a lease and waits for its sync).
    """
    broker = kv.broker
    lookup = broker.catalog.topic
    get = kv.get
    now = broker.clock.now_ns()
    out: list[bytes] = []
    size = 0
    target: bytes | None = None
    topic: Topic  # the first request's bucket is looked up before its get (here != None)
    i = start
    n = len(requests)
    code = P.Command.KV_GET
    frame = P.info_map_frame
    split = P.KvGet.split
    try:
        while i < n:
            corr, payload = requests[i]
            parts = split(payload)
            if parts is None:
                break
            here, key, revision = parts
            if here != target:
                # Another bucket, or another spelling of it: the decoder checks the
                # identifiers, the catalog finds the topic (or refuses).
                try:
                    cmd = P.KvGet.decode(payload)
                except Exception:
                    break
                target = None
                topic = lookup(cmd.stream, cmd.topic)
                bucket = topic.config.kv
                if bucket is not None and bucket["refresh"] == "on_read_and_write":
                    break
                target = here
            try:
                subject = key.decode()
            except UnicodeDecodeError:
                break
            validate_subject(subject)
            entry, _ = get(topic, subject, revision, now)
            answer = frame(code, corr, entry)
            out.append(answer)
            i += 1
            size += len(answer)
            if size >= max_bytes:
                break
    except Exception as exc:
        broker.counters.messages_out += i - start
        return out, size, i, exc
    broker.counters.messages_out += i - start
    return out, size, i, None


def kv_touch(kv: KvReads, session: object, cmd: P.KvTouch) -> Reply:
    broker = kv.broker
    topic = broker.catalog.topic(cmd.stream, cmd.topic)
    validate_subject(cmd.subject)
    entry, epoch = kv.touch(topic, cmd.subject, broker.clock.now_ns())
    payload = P.InfoMap(entry).encode()
    return (payload, epoch) if epoch else payload


def kv_keys(kv: KvReads, session: object, cmd: P.KvKeys) -> Reply:
    broker = kv.broker
    topic = broker.catalog.topic(cmd.stream, cmd.topic)
    validate_filter(cmd.subject_filter)
    return P.InfoMap({"keys": kv.keys(topic, cmd.subject_filter, broker.clock.now_ns())}).encode()
