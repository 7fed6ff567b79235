"""The ``ttlbroker`` command: start a broker, and drive one.

``ttlbroker serve`` runs a broker in the foreground and prints ``listening on
HOST:PORT`` once it accepts connections. Every other command talks to a running
broker (``--server HOST:PORT``, default ``127.0.0.1:8090`` or ``$TTLBROKER_SERVER``).
With ``--json`` results are JSON (messages as JSON Lines, one object each); errors go
to stderr as one line naming the error and its code, and the exit status is 1 (2 when
the broker cannot be reached or the connection is lost, 130 on Ctrl-C).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import json
import os
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import trio

from protocol import TTL_NEVER, BrokerError, Message, parse_go_duration, rfc3339_ns

from .client import Client, ConnectionClosedError, ReconnectFailedError, connect, encode_msg
from .client._client import RECONNECT_ATTEMPTS

__all__ = ["main", "build_parser"]

DEFAULT_SERVER = "127.0.0.1:8090"


# -- output ---------------------------------------------------------------------------


_rfc3339 = rfc3339_ns


def message_json(m: Message, stream: Any, topic: Any) -> dict[str, Any]:
    """One message as the CLI prints it with ``--json``."""
    out: dict[str, Any] = {
        "stream": stream,
        "topic": topic,
        "partition": m.partition,
        "offset": m.offset,
        "timestamp": _rfc3339(m.timestamp),
        "timestamp_ns": m.timestamp,
        "subject": m.subject,
        "headers": m.headers,
    }
    try:
        out["payload"] = m.payload.decode()
    except UnicodeDecodeError:
        out["payload"] = base64.b64encode(m.payload).decode()
        out["payload_encoding"] = "base64"
    if m.ttl:
        out["ttl"] = "never" if m.ttl == TTL_NEVER else m.ttl
    if m.is_marker:
        out["marker"] = m.marker_reason.header_value
    return out


def _message_line(m: Message, stream: Any, topic: Any) -> str:
    payload = m.payload.decode(errors="replace")
    hdrs = " ".join(f"{k}={v}" for k, v in m.headers.items())
    where = f"{stream}/{topic}[{m.partition}]@{m.offset}" if m.offset else "(not stored)"
    marker = f" marker={m.marker_reason.header_value}" if m.is_marker else ""
    return f"{where} {m.subject}{marker}{' ' + hdrs if hdrs else ''} {payload}"


class Out:
    def __init__(self, as_json: bool) -> None:
        self.json = as_json

    def obj(self, value: Any, text: str | None = None) -> None:
        if self.json:
            print(json.dumps(value, default=str), flush=True)
        else:
            print(text if text is not None else _pretty(value), flush=True)

    def message(self, m: Message, stream: Any, topic: Any) -> None:
        if self.json:
            print(json.dumps(message_json(m, stream, topic)), flush=True)
        else:
            print(_message_line(m, stream, topic), flush=True)


def _pretty(value: Any) -> str:
    if isinstance(value, dict):
        return "\n".join(f"{k}: {v}" for k, v in value.items())
    return str(value)


def _topic_json(t: Any) -> dict[str, Any]:
    return {
        "id": t.id,
        "name": t.name,
        "stream_id": t.stream_id,
        "partitions_count": t.partitions_count,
        "message_expiry": t.message_expiry,
        "size": t.size,
        "messages_count": t.messages_count,
        **t.extra.get("options", {}),
        "pending_expiries": t.extra.get("pending_expiries", 0),
        "removed": t.extra.get("removed", {}),
        "markers": t.extra.get("markers", {}),
        "duplicates": t.extra.get("duplicates", 0),
        "partitions": t.extra.get("partitions", []),
    }


def _stream_json(s: Any) -> dict[str, Any]:
    return {"id": s.id, "name": s.name, "topics_count": s.topics_count, "size": s.size, "messages_count": s.messages_count}


def _ident(text: str) -> int | str:
    return int(text) if text.isdigit() else text


# -- commands -------------------------------------------------------------------------


def _topic_options(args: argparse.Namespace, updating: bool) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if args.subjects:
        opts["subjects"] = args.subjects
    if args.max_msgs_per_subject is not None:
        opts["max_msgs_per_subject"] = args.max_msgs_per_subject
    if args.deny_purge:
        opts["deny_purge"] = True
    if args.segment_size is not None:
        opts["segment_size"] = args.segment_size
    if args.allow_msg_ttl:
        opts["allow_msg_ttl"] = True
    if args.marker_ttl is not None:
        opts["subject_delete_marker_ttl"] = args.marker_ttl
    if args.allow_rollup:
        opts["allow_rollup"] = True
    if args.duplicate_window is not None:
        opts["duplicate_window"] = args.duplicate_window
    if args.pedantic:
        opts["pedantic"] = True
    if args.no_republish:
        if args.republish_dest or args.republish_src or args.republish_headers_only:
            raise SystemExit("error: --no-republish cannot be combined with the other --republish options")
        opts["republish"] = None
    elif args.republish_dest is not None:
        rp: dict[str, Any] = {"dest": args.republish_dest, "headers_only": args.republish_headers_only}
        if args.republish_src is not None:
            rp["src"] = args.republish_src
        opts["republish"] = rp
    elif args.republish_src is not None or args.republish_headers_only:
        raise SystemExit("error: --republish-src and --republish-headers-only need --republish-dest")
    if updating and args.expiry is not None:
        opts["message_expiry"] = args.expiry
    return opts


async def cmd_stream(c: Client, args: argparse.Namespace, out: Out) -> None:
    if args.action == "create":
        s = await c.create_stream(args.name, args.id or 0)
        out.obj(_stream_json(s), f"created stream {s.name!r} (id {s.id})")
    elif args.action == "list":
        streams = await c.list_streams()
        if out.json:
            for s in streams:
                out.obj(_stream_json(s))
        else:
            for s in streams:
                print(f"{s.id:>5}  {s.name:<30} topics={s.topics_count} messages={s.messages_count} bytes={s.size}")
    elif args.action == "delete":
        await c.delete_stream(_ident(args.stream))
        out.obj({"deleted": args.stream}, f"deleted stream {args.stream!r}")


async def cmd_topic(c: Client, args: argparse.Namespace, out: Out) -> None:
    if args.action == "create":
        t = await c.create_topic(
            _ident(args.stream), args.name, partitions=args.partitions, message_expiry=args.expiry,
            topic_id=args.id or 0, **_topic_options(args, False),
        )
        out.obj(_topic_json(t), f"created topic {args.stream}/{t.name} (id {t.id}, subjects {', '.join(t.options['subjects'])})")
    elif args.action == "update":
        changes = _topic_options(args, True)
        if not changes:
            raise SystemExit("error: topic update needs at least one option to change")
        t = await c.update_topic(_ident(args.stream), _ident(args.topic), **changes)
        out.obj(_topic_json(t), f"updated topic {args.stream}/{t.name}")
    elif args.action == "list":
        topics = await c.list_topics(_ident(args.stream))
        if out.json:
            for t in topics:
                out.obj(_topic_json(t))
        else:
            for t in topics:
                print(
                    f"{t.id:>5}  {t.name:<30} partitions={t.partitions_count} expiry={t.message_expiry}s "
                    f"messages={t.messages_count} subjects={','.join(t.options.get('subjects', []))}"
                )
    elif args.action == "info":
        t = await c.get_topic(_ident(args.stream), _ident(args.topic))
        out.obj(_topic_json(t))
    elif args.action == "delete":
        await c.delete_topic(_ident(args.stream), _ident(args.topic))
        out.obj({"deleted": f"{args.stream}/{args.topic}"}, f"deleted topic {args.stream}/{args.topic}")


def _headers(pairs: list[str]) -> dict[str, str]:
    out = {}
    for p in pairs or []:
        key, sep, value = p.partition("=")
        if not sep or not key:
            raise SystemExit(f"error: --header takes KEY=VALUE, not {p!r}")
        out[key] = value
    return out


async def cmd_pub(c: Client, args: argparse.Namespace, out: Out) -> None:
    data = args.data.encode() if args.data is not None else sys.stdin.buffer.read()
    headers = _headers(args.header)
    if getattr(args, "ttl", None):
        headers["Nats-TTL"] = args.ttl
    if args.count == 1:
        ack = await c.publish(args.subject, data, headers=headers or None)
        assert ack is not None
        result = {"stream_id": ack.stream_id, "topic_id": ack.topic_id, "partition": ack.partition, "offset": ack.offset}
        if ack.duplicate:  # its Nats-Msg-Id was stored within the topic's duplicate window
            result["duplicate"] = True
            text = f"duplicate: {args.subject} is stored at partition {ack.partition} offset {ack.offset} (not stored again)"
        else:
            text = f"published {args.subject} -> partition {ack.partition} offset {ack.offset}"
        out.obj(result, text)
        return
    body = encode_msg(args.subject, data, headers or None)
    sent = errors = duplicates = 0
    first = last = None
    batch = 1000
    while sent < args.count:
        n = min(batch, args.count - sent)
        acks = await c.publish_batch([body] * n)
        assert acks is not None
        for a in acks:
            if not a.ok:
                errors += 1
                if errors == 1:
                    print(f"error: {a.error}", file=sys.stderr)
            elif a.duplicate:  # not an error: the Nats-Msg-Id is stored already
                duplicates += 1
            else:
                first = first if first is not None else a.offset
                last = a.offset
        sent += n
    summary = {"published": sent - errors - duplicates, "errors": errors, "first_offset": first, "last_offset": last}
    notes = [f"{errors} refused"] if errors else []
    if duplicates:
        summary["duplicates"] = duplicates
        notes.append(f"{duplicates} duplicates not stored again")
    out.obj(
        summary,
        f"published {sent - errors - duplicates} of {sent} messages on {args.subject}" + (f" ({', '.join(notes)})" if notes else ""),
    )
    if errors:
        raise SystemExit(1)


async def cmd_fetch(c: Client, args: argparse.Namespace, out: Out) -> None:
    offset = args.offset
    remaining = args.count
    while remaining > 0:
        f = await c.fetch(_ident(args.stream), _ident(args.topic), args.partition, offset, min(remaining, 1000), subject=args.subject)
        for m in f.messages:
            out.message(m, args.stream, args.topic)
        remaining -= len(f.messages)
        if f.next_offset <= offset or f.next_offset > f.last_offset:
            break
        offset = f.next_offset


async def cmd_last(c: Client, args: argparse.Namespace, out: Out) -> None:
    m = await c.get_last(_ident(args.stream), _ident(args.topic), args.subject)
    out.message(m, args.stream, args.topic)


class _ExitStatus(Exception):
    """End the command with this exit status (its message is already printed)."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _closed_text(err: ConnectionClosedError) -> str:
    """Why a connection went, for one line on stderr: the reason, and the GOODBYE's
    code when there was one."""
    code = err.code
    if code is None:
        return err.reason
    name = getattr(code, "name", None)
    return f"{err.reason} ({name} {int(code)})" if name else f"{err.reason} (code {int(code)})"


def _on_disconnect(err: ConnectionClosedError) -> None:
    print(f"disconnected: {_closed_text(err)}; reconnecting", file=sys.stderr, flush=True)


def _on_reconnect_to(server: str, again: str = "subscribed again") -> Callable[[int], None]:
    def on_reconnect(attempts: int) -> None:
        tries = f"{attempts} attempt{'' if attempts == 1 else 's'}"
        print(f"reconnected to {server} after {tries}; {again}", file=sys.stderr, flush=True)

    return on_reconnect


async def cmd_sub(c: Client, args: argparse.Namespace, out: Out) -> None:
    """Print what the subscription receives. A lost connection ends it with one line
    on stderr saying why, exit status 2; with ``--reconnect`` the client reconnects
    (a line on stderr for each disconnect and reconnect) until it gives up."""
    names: dict[tuple[int, int], tuple[str, str]] = {}

    async def where(m: Message) -> tuple[Any, Any]:
        if not m.stream_id:
            return None, None
        key = (m.stream_id, m.topic_id)
        if key not in names:
            try:
                t = await c.get_topic(m.stream_id, m.topic_id)
            except ConnectionClosedError:
                if c.closed:
                    raise
                return m.stream_id, m.topic_id  # lost on the way: print the ids this time
            names[key] = (t.extra.get("stream", m.stream_id), t.name)
        return names[key]

    seen = 0
    with _connection_loss_exits():
        async with await c.subscribe(args.filter) as sub:
            if not out.json:
                print(f"subscribed to {args.filter}", file=sys.stderr, flush=True)
            async for m in sub:
                stream, topic = await where(m)
                out.message(m, stream, topic)
                seen += 1
                if args.count and seen >= args.count:
                    break


@contextlib.contextmanager
def _connection_loss_exits() -> Iterator[None]:
    """A lost connection (or a client that gave up reconnecting) is one line on
    stderr saying why, and exit status 2."""
    try:
        yield
    except ReconnectFailedError as exc:
        print(f"error: {exc.reason}", file=sys.stderr, flush=True)  # the reason names the loss
        raise _ExitStatus(2) from None
    except ConnectionClosedError as exc:
        print(f"error: connection lost: {_closed_text(exc)}", file=sys.stderr, flush=True)
        raise _ExitStatus(2) from None


async def cmd_stats(c: Client, args: argparse.Namespace, out: Out) -> None:
    out.obj(await c.stats())


def _entry_json(e: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "bucket": e.bucket, "key": e.key, "revision": e.revision, "operation": e.operation,
        "created": _rfc3339(e.created), "ttl_remaining": e.ttl_remaining,
    }
    try:
        out["value"] = e.value.decode()
    except UnicodeDecodeError:
        out["value"] = base64.b64encode(e.value).decode()
        out["value_encoding"] = "base64"
    return out


def _ttl_arg(text: str | None) -> int | str | None:
    if text is None:
        return None
    return int(text) if text.isdigit() else text


async def cmd_kv(c: Client, args: argparse.Namespace, out: Out) -> None:
    a = args.action
    if a == "add":
        kv = await c.kv_create(args.bucket, history=args.history, ttl=args.ttl, refresh=args.refresh,
                               visibility=args.visibility, marker_ttl=args.marker_ttl)
        out.obj(await kv.status(), f"created bucket {kv.bucket!r}")
        return
    kv = await c.kv(args.bucket)
    if a in ("put", "create", "update"):
        value = args.value.encode() if args.value is not None else sys.stdin.buffer.read()
        ttl = _ttl_arg(args.ttl)
        if a == "put":
            rev = await kv.put(args.key, value, ttl=ttl)
        elif a == "create":
            rev = await kv.create(args.key, value, ttl=ttl)
        else:
            rev = await kv.update(args.key, value, args.revision, ttl=ttl)
        out.obj({"bucket": kv.bucket, "key": args.key, "revision": rev}, f"{args.key} revision {rev}")
    elif a == "get":
        e = await kv.get(args.key, revision=args.revision)
        if out.json:
            out.obj(_entry_json(e))
        else:
            sys.stdout.buffer.write(e.value + b"\n")
    elif a in ("delete", "purge"):
        rev = await (kv.delete(args.key) if a == "delete" else kv.purge(args.key))
        out.obj({"bucket": kv.bucket, "key": args.key, "revision": rev, "operation": a.upper()}, f"{a}d {args.key}")
    elif a == "touch":
        left = await kv.touch(args.key)
        out.obj({"bucket": kv.bucket, "key": args.key, "ttl_remaining": left},
                f"{args.key}: {'no TTL' if left is None else f'{left:.3f} s left'}")
    elif a == "keys":
        keys = await kv.keys(args.pattern)
        if out.json:
            out.obj({"keys": keys})
        else:
            for k in keys:
                print(k)
    elif a == "history":
        for e in await kv.history(args.key):
            out.obj(_entry_json(e), f"{e.revision:>8}  {e.operation:<7} {e.value.decode(errors='replace')}")
    elif a == "watch":
        n = 0
        async for e in kv.watch(args.keys, include_current=args.current):
            out.obj(_entry_json(e), f"{e.revision:>8}  {e.operation:<7} {e.key} {e.value.decode(errors='replace')}")
            sys.stdout.flush()
            n += 1
            if args.count and n >= args.count:
                break
    elif a == "info":
        out.obj(await kv.status())


async def cmd_export(c: Client, args: argparse.Namespace, out: Out) -> None:
    res = await c.export(seal=args.seal)
    if out.json:
        out.obj(res)
        return
    for e in res["exported"]:
        print(f"exported {e['path']} ({e['rows']} rows, {e['bytes']} bytes)")
    print(
        f"{len(res['exported'])} segment(s) exported to {res['dir']}"
        f" ({res['sealed']} sealed first; {res['segments_in_export']} in the export)"
    )


async def cmd_delete(c: Client, args: argparse.Namespace, out: Out) -> None:
    await c.delete_message(_ident(args.stream), _ident(args.topic), args.partition, args.offset)
    out.obj({"deleted": {"partition": args.partition, "offset": args.offset}}, f"deleted partition {args.partition} offset {args.offset}")


async def cmd_purge(c: Client, args: argparse.Namespace, out: Out) -> None:
    n = await c.purge(_ident(args.stream), _ident(args.topic), args.subject)
    out.obj({"purged": n}, f"purged {n} messages")


async def cmd_offset(c: Client, args: argparse.Namespace, out: Out) -> None:
    s, t = _ident(args.stream), _ident(args.topic)
    if args.action == "get":
        o = await c.get_offset(s, t, args.consumer, args.partition)
        out.obj({"consumer": args.consumer, "partition": args.partition, "offset": o}, str(o))
    elif args.action == "set":
        await c.store_offset(s, t, args.consumer, args.partition, args.offset)
        out.obj({"consumer": args.consumer, "partition": args.partition, "offset": args.offset}, f"stored {args.offset}")
    else:
        await c.delete_offset(s, t, args.consumer, args.partition)
        out.obj({"consumer": args.consumer, "partition": args.partition, "deleted": True}, "deleted")


def _duration(text: str) -> float:
    """Seconds from ``30``, ``1.5``, or a Go duration (``30s``, ``1m30s``, ``500ms``)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return parse_go_duration(text) / 1e9
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r} (use e.g. 30s, 1m, 500ms)") from None


def _durations(text: str) -> list[float]:
    return [_duration(t.strip()) for t in text.split(",") if t.strip()]


def _start_offset(text: str) -> int | dict[int, int]:
    """``N`` (every partition) or ``P:N,P:N`` (per partition)."""
    try:
        if ":" not in text:
            return int(text)
        return {int(p): int(o) for p, _, o in (part.partition(":") for part in text.split(","))}
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid start offset {text!r} (N, or PARTITION:N,...)") from None


def _start_time(text: str) -> dt.datetime:
    try:
        t = dt.datetime.fromisoformat(text.replace("z", "Z").replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid time {text!r} (ISO 8601, e.g. 2026-01-02T15:04:05Z)") from None
    return t if t.tzinfo is not None else t.replace(tzinfo=dt.timezone.utc)


def _seconds_text(v: Any) -> str:
    if isinstance(v, (int, float)):
        return f"{v:g}s"
    return str(v)


def _consumer_lines(info: Any) -> str:
    """A consumer's info for people."""
    cfg = info.config
    filters = ", ".join(cfg.get("filter_subjects") or []) or "(all subjects)"
    deliver = cfg.get("deliver_policy", "all")
    if "opt_start_offset" in cfg:
        deliver += f" from {cfg['opt_start_offset']}"
    if "opt_start_time" in cfg:
        deliver += f" from {_rfc3339(cfg['opt_start_time'])}"
    lines = [
        f"consumer {info.raw.get('stream', '?')}/{info.raw.get('topic', '?')}/{info.name}",
        f"  filter:          {filters}",
        f"  deliver:         {deliver}",
        f"  ack:             {cfg.get('ack_policy')} (wait {_seconds_text(cfg.get('ack_wait'))}, "
        f"max deliver {cfg.get('max_deliver')}"
        + (f", backoff {','.join(_seconds_text(b) for b in cfg['backoff'])}" if cfg.get("backoff") else "") + ")",
        f"  max ack pending: {cfg.get('max_ack_pending')}",
        f"  max waiting:     {cfg.get('max_waiting')}",
        f"  mode:            {cfg.get('mode')}"
        + (f" (member timeout {_seconds_text(cfg.get('member_timeout'))})" if cfg.get("mode") == "partitioned" else ""),
    ]
    if cfg.get("description"):
        lines.append(f"  description:     {cfg['description']}")
    delivered = info.raw.get("delivered", {})
    floor = info.raw.get("ack_floor", {})
    lines += [
        f"  pending:         {info.num_pending}",
        f"  ack pending:     {info.num_ack_pending}",
        f"  redelivered:     {info.num_redelivered}",
        f"  waiting pulls:   {info.num_waiting}",
        f"  delivered:       consumer seq {delivered.get('consumer_seq', 0)}, stream seq {delivered.get('stream_seq', 0)}",
        f"  ack floor:       consumer seq {floor.get('consumer_seq', 0)}, stream seq {floor.get('stream_seq', 0)}",
    ]
    for p in info.partitions:
        owner = f" owner={p.get('owner') or '-'}" if "owner" in p else ""
        lines.append(
            f"  partition {p['partition']}: delivered={p.get('delivered', 0)} ack_floor={p.get('ack_floor', 0)} "
            f"pending={p.get('num_pending', 0)} ack_pending={p.get('num_ack_pending', 0)}{owner}"
        )
    for m in info.raw.get("members", []):
        lines.append(f"  member {m['name']}: partitions={m['partitions']} connected={m['connected']}")
    return "\n".join(lines)


def _consumer_config_args(args: argparse.Namespace) -> dict[str, Any]:
    cfg: dict[str, Any] = {}
    if args.filter:
        cfg["filter_subjects"] = args.filter
    deliver = args.deliver
    if args.start_offset is not None and deliver is None:
        deliver = "by_start_offset"
    if args.start_time is not None and deliver is None:
        deliver = "by_start_time"
    if deliver == "by_start_offset" and args.start_offset is None:
        raise SystemExit("error: --deliver by_start_offset needs --start-offset")
    if deliver == "by_start_time" and args.start_time is None:
        raise SystemExit("error: --deliver by_start_time needs --start-time")
    if args.start_offset is not None and deliver != "by_start_offset":
        raise SystemExit("error: --start-offset goes with --deliver by_start_offset")
    if args.start_time is not None and deliver != "by_start_time":
        raise SystemExit("error: --start-time goes with --deliver by_start_time")
    if deliver is not None:
        cfg["deliver_policy"] = deliver
    if args.start_offset is not None:
        cfg["opt_start_offset"] = args.start_offset
    if args.start_time is not None:
        cfg["opt_start_time"] = args.start_time
    for key in ("ack_wait", "max_deliver", "backoff", "max_ack_pending", "max_waiting", "member_timeout", "description"):
        value = getattr(args, key)
        if value is not None:
            cfg[key] = value
    if args.ack is not None:
        cfg["ack_policy"] = args.ack
    if args.partitioned:
        cfg["mode"] = "partitioned"
    return cfg


async def cmd_consumer(c: Client, args: argparse.Namespace, out: Out) -> None:
    s, t = _ident(args.stream), _ident(args.topic)
    a = args.action
    if a == "add":
        info = await c.create_consumer(s, t, args.name, **_consumer_config_args(args))
        out.obj(info.raw, f"created consumer {args.stream}/{args.topic}/{info.name}")
    elif a == "info":
        info = await c.consumer_info(s, t, args.name)
        out.obj(info.raw, _consumer_lines(info))
    elif a == "list":
        for info in await c.list_consumers(s, t):
            out.obj(
                info.raw,
                f"{info.name:<20} pending={info.num_pending} ack_pending={info.num_ack_pending} "
                f"redelivered={info.num_redelivered} waiting={info.num_waiting} mode={info.config.get('mode')}",
            )
    elif a == "rm":
        await c.delete_consumer(s, t, args.name)
        out.obj({"deleted": f"{args.stream}/{args.topic}/{args.name}"}, f"deleted consumer {args.stream}/{args.topic}/{args.name}")
    elif a == "next":
        got: list[Any] = []
        while len(got) < args.count:
            batch = await c.pull(s, t, args.name, min(args.count - len(got), 1000), expires=args.wait)
            if not batch:
                break
            got.extend(batch)
            for m in batch:
                out.message(m, args.stream, args.topic)
                if not args.no_ack:
                    await m.ack()
        if got and not args.no_ack:
            await got[-1].ack(sync=True)  # the others go with it: all durable before we exit
        if not got:
            print(f"error: no message within {_seconds_text(args.wait)}", file=sys.stderr, flush=True)
            raise _ExitStatus(1)
    elif a == "sub":
        seen = 0
        with _connection_loss_exits():
            async with c.consume(s, t, args.name, batch=args.batch, member=args.member) as messages:
                if not out.json:
                    who = f" as member {args.member} (partitions {messages.partitions})" if args.member else ""
                    print(f"consuming {args.stream}/{args.topic}/{args.name}{who}", file=sys.stderr, flush=True)
                async for m in messages:
                    out.message(m, args.stream, args.topic)
                    await m.ack()
                    seen += 1
                    if args.count and seen >= args.count:
                        break


CLIENT_COMMANDS: dict[str, Callable[[Client, argparse.Namespace, Out], Awaitable[None]]] = {
    "consumer": cmd_consumer,
    "stream": cmd_stream,
    "topic": cmd_topic,
    "pub": cmd_pub,
    "fetch": cmd_fetch,
    "last": cmd_last,
    "sub": cmd_sub,
    "stats": cmd_stats,
    "export": cmd_export,
    "kv": cmd_kv,
    "delete": cmd_delete,
    "purge": cmd_purge,
    "offset": cmd_offset,
}


# -- parser ---------------------------------------------------------------------------


def _add_topic_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--expiry", type=int, metavar="SECONDS", help="max age in seconds (0 = none; default: the broker's)")
    p.add_argument("--subjects", nargs="+", metavar="FILTER", help="subject filters the topic captures")
    p.add_argument("--max-msgs-per-subject", type=int, metavar="N", help="keep at most N messages per subject (0 = unlimited)")
    p.add_argument("--deny-purge", action="store_true", help="refuse purges and deletes")
    p.add_argument("--segment-size", type=int, metavar="BYTES", help="seal segments at this size")
    p.add_argument("--allow-msg-ttl", action="store_true", help="accept per-message TTLs (once on, never off)")
    p.add_argument(
        "--marker-ttl", type=int, metavar="SECONDS",
        help="leave a subject delete marker living this long when a subject's last message goes (0 = off)",
    )
    p.add_argument("--allow-rollup", action="store_true", help="honour Nats-Rollup headers (sub, all)")
    p.add_argument(
        "--duplicate-window", type=int, metavar="SECONDS",
        help="remember Nats-Msg-Id this long to store each id once (default 120, at most the max age; 0 = off)",
    )
    p.add_argument("--pedantic", action="store_true", help="refuse instead of fixing the configuration automatically")
    p.add_argument("--republish-dest", metavar="TEMPLATE", help="republish stored messages on this subject transform (ADR-28/30)")
    p.add_argument("--republish-src", metavar="FILTER", help="only messages matching this filter (default '>')")
    p.add_argument("--republish-headers-only", action="store_true", help="republish headers only (Nats-Msg-Size gives the size)")
    p.add_argument("--no-republish", action="store_true", help="update: remove the republish rule")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--server", default=os.environ.get("TTLBROKER_SERVER", DEFAULT_SERVER), metavar="HOST:PORT")
    common.add_argument("--token", default=os.environ.get("TTLBROKER_TOKEN", ""), help="auth token")
    common.add_argument("--json", action="store_true", help="print JSON (messages as JSON Lines)")

    parser = argparse.ArgumentParser(prog="ttlbroker", description="ttlbroker: run and drive a message broker")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("serve", help="run a broker in the foreground")
    p.add_argument("--config", metavar="FILE", help="TOML config (default: the embedded defaults)")
    p.add_argument("--data", metavar="DIR", help="data directory (overrides [system] path)")
    p.add_argument("--host", help="listen address (overrides [server] host)")
    p.add_argument("--port", type=int, help="listen port, 0 = any free one (overrides [server] port)")
    p.add_argument("--fsync", help="always | never | an interval like 200ms (overrides [system.partition] fsync)")
    p.add_argument("--export-dir", metavar="DIR", help="export sealed segments to Parquet here (overrides [export] dir)")
    p.add_argument("--print-config", action="store_true", help="print the embedded default config and exit")

    for name, text in (
        ("check", "verify every file of a stopped broker's data directory; exit 0 clean, 1 damage found"),
        ("repair", "recover a stopped broker's data directory, applying the documented fixes"),
    ):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("--data", metavar="DIR", help="data directory (default: [system] path of --config)")
        p.add_argument("--config", metavar="FILE", help="TOML config to take the data and export directories from")
        p.add_argument("--export-dir", metavar="DIR", help="also check the Parquet export's manifest there")

    p = sub.add_parser("stream", help="create, list or delete streams")
    ss = p.add_subparsers(dest="action", required=True)
    q = ss.add_parser("create", parents=[common])
    q.add_argument("name")
    q.add_argument("--id", type=int, help="stream id (default: the next free one)")
    ss.add_parser("list", parents=[common])
    q = ss.add_parser("delete", parents=[common])
    q.add_argument("stream")

    p = sub.add_parser("topic", help="create, update, list, show or delete topics")
    ts = p.add_subparsers(dest="action", required=True)
    q = ts.add_parser("create", parents=[common])
    q.add_argument("stream")
    q.add_argument("name")
    q.add_argument("--partitions", type=int, default=1)
    q.add_argument("--id", type=int, help="topic id (default: the next free one)")
    _add_topic_options(q)
    q = ts.add_parser("update", parents=[common])
    q.add_argument("stream")
    q.add_argument("topic")
    _add_topic_options(q)
    q = ts.add_parser("list", parents=[common])
    q.add_argument("stream")
    for action in ("info", "delete"):
        q = ts.add_parser(action, parents=[common])
        q.add_argument("stream")
        q.add_argument("topic")

    p = sub.add_parser("pub", parents=[common], help="publish a message (DATA from stdin when absent)")
    p.add_argument("subject")
    p.add_argument("data", nargs="?")
    p.add_argument("--header", action="append", metavar="K=V", help="a header (repeatable)")
    p.add_argument("--count", type=int, default=1, help="publish the message N times")
    p.add_argument("--ttl", metavar="VALUE", help="per-message TTL, sent as the Nats-TTL header (30, 90s, 1h30m, never)")

    p = sub.add_parser("fetch", parents=[common], help="read messages of a partition")
    p.add_argument("stream")
    p.add_argument("topic")
    p.add_argument("--partition", type=int, default=0)
    p.add_argument("--offset", type=int, default=1)
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--subject", help="only messages on subjects matching this filter")

    p = sub.add_parser("last", parents=[common], help="the newest message on a subject")
    p.add_argument("stream")
    p.add_argument("topic")
    p.add_argument("subject")

    p = sub.add_parser(
        "sub", parents=[common], help="print messages published on matching subjects",
        description="Print messages published on matching subjects. A lost connection ends it with one line on "
        "stderr saying why and exit status 2, unless --reconnect is given.",
    )
    p.add_argument("filter")
    p.add_argument("--count", type=int, default=0, help="exit after N messages (0 = run until interrupted)")
    p.add_argument(
        "--reconnect", action="store_true",
        help="when the connection is lost, reconnect and subscribe again (one line on stderr for each disconnect "
        "and reconnect); messages published meanwhile are not delivered",
    )
    p.add_argument(
        "--max-reconnects", type=int, default=RECONNECT_ATTEMPTS, metavar="N",
        help=f"with --reconnect: give up after N failed attempts in a row (default {RECONNECT_ATTEMPTS}; -1 = never)",
    )

    sub.add_parser("stats", parents=[common], help="the broker's counters")

    p = sub.add_parser("export", parents=[common], help="export sealed segments to Parquet now (the broker's --export-dir)")
    p.add_argument("--seal", action="store_true", help="seal the active segments first, so that everything stored is exported")

    p = sub.add_parser("delete", parents=[common], help="delete one message")
    p.add_argument("stream")
    p.add_argument("topic")
    p.add_argument("--partition", type=int, required=True)
    p.add_argument("--offset", type=int, required=True)

    p = sub.add_parser("purge", parents=[common], help="purge a topic, or the subjects matching --subject")
    p.add_argument("stream")
    p.add_argument("topic")
    p.add_argument("--subject")

    p = sub.add_parser("offset", help="named consumer offsets")
    os_ = p.add_subparsers(dest="action", required=True)
    for action in ("get", "set", "delete"):
        q = os_.add_parser(action, parents=[common])
        q.add_argument("stream")
        q.add_argument("topic")
        q.add_argument("consumer")
        q.add_argument("--partition", type=int, default=0)
        if action == "set":
            q.add_argument("offset", type=int)

    p = sub.add_parser("consumer", help="durable consumers: add, info, list, rm, next, sub")
    cs = p.add_subparsers(dest="action", required=True)
    q = cs.add_parser("add", parents=[common], help="create a durable consumer (the same again is a no-op)")
    q.add_argument("stream")
    q.add_argument("topic")
    q.add_argument("name")
    q.add_argument("--filter", action="append", metavar="SUBJECT", help="a subject filter (repeatable; default: all)")
    q.add_argument("--deliver", choices=["all", "new", "last", "last_per_subject", "by_start_offset", "by_start_time"],
                   help="where it starts (default all)")
    q.add_argument("--start-offset", type=_start_offset, metavar="N|P:N,...", help="with by_start_offset")
    q.add_argument("--start-time", type=_start_time, metavar="ISO8601", help="with by_start_time")
    q.add_argument("--ack", choices=["explicit", "none", "all"], help="ack policy (default explicit)")
    q.add_argument("--ack-wait", type=_duration, metavar="DURATION", help="redeliver unacked after this (default 30s)")
    q.add_argument("--max-deliver", type=int, metavar="N", help="give a message up after N deliveries (-1 = never)")
    q.add_argument("--backoff", type=_durations, metavar="D,D,...", help="redelivery delays by delivery count")
    q.add_argument("--max-ack-pending", type=int, metavar="N", help="at most N unacked deliveries (-1 = unlimited)")
    q.add_argument("--max-waiting", type=int, metavar="N", help="at most N waiting pulls")
    q.add_argument("--partitioned", action="store_true", help="each partition owned by one member of its group")
    q.add_argument("--member-timeout", type=_duration, metavar="DURATION", help="partitioned: a silent member leaves after this")
    q.add_argument("--description")
    for action, helptext in (("info", "a consumer's configuration and state"), ("rm", "delete a consumer and its state")):
        q = cs.add_parser(action, parents=[common], help=helptext)
        q.add_argument("stream")
        q.add_argument("topic")
        q.add_argument("name")
    q = cs.add_parser("list", parents=[common], help="the consumers of a topic")
    q.add_argument("stream")
    q.add_argument("topic")
    q = cs.add_parser("next", parents=[common], help="pull, print and ack messages")
    q.add_argument("stream")
    q.add_argument("topic")
    q.add_argument("name")
    q.add_argument("--count", type=int, default=1, help="how many (default 1)")
    q.add_argument("--no-ack", action="store_true", help="do not ack (they come again after the ack wait)")
    q.add_argument("--wait", type=_duration, default=5.0, metavar="DURATION", help="how long to wait for them (default 5s)")
    q = cs.add_parser(
        "sub", parents=[common], help="print and ack messages as they come, until interrupted",
        description="Print and ack a consumer's messages as they come. A lost connection ends it with one line on "
        "stderr saying why and exit status 2, unless --reconnect is given.",
    )
    q.add_argument("stream")
    q.add_argument("topic")
    q.add_argument("name")
    q.add_argument("--member", help="join the (partitioned) consumer's group under this name")
    q.add_argument("--batch", type=int, default=500, help="messages per pull (default 500)")
    q.add_argument("--count", type=int, default=0, help="exit after N messages (0 = run until interrupted)")
    q.add_argument(
        "--reconnect", action="store_true",
        help="when the connection is lost, reconnect and pull again (one line on stderr for each disconnect and "
        "reconnect); unacked messages may come again",
    )
    q.add_argument(
        "--max-reconnects", type=int, default=RECONNECT_ATTEMPTS, metavar="N",
        help=f"with --reconnect: give up after N failed attempts in a row (default {RECONNECT_ATTEMPTS}; -1 = never)",
    )

    p = sub.add_parser("kv", help="KV buckets with per-key TTLs that reads can refresh")
    kv = p.add_subparsers(dest="action", required=True)
    q = kv.add_parser("add", parents=[common], help="create a bucket")
    q.add_argument("bucket")
    q.add_argument("--history", type=int, default=1, help="revisions kept per key (default 1)")
    q.add_argument("--ttl", type=int, default=0, metavar="SECONDS", help="default TTL of a key (0 = none)")
    q.add_argument("--refresh", choices=["on_write", "on_read_and_write"], default="on_write")
    q.add_argument("--visibility", choices=["never_return_expired", "return_expired_if_not_cleaned_up"],
                   default="never_return_expired")
    q.add_argument("--marker-ttl", type=int, default=60, metavar="SECONDS", help="how long an expiry marker stays")
    for action, helptext in (("put", "store a value"), ("create", "store a value only if the key holds none"),
                             ("update", "compare-and-set on the key's revision")):
        q = kv.add_parser(action, parents=[common], help=helptext)
        q.add_argument("bucket")
        q.add_argument("key")
        q.add_argument("value", nargs="?", help="(stdin when absent)")
        if action == "update":
            q.add_argument("--revision", type=int, required=True, help="the revision the key must be at")
        q.add_argument("--ttl", metavar="VALUE", help="the key's TTL: seconds, a duration (90s) or never")
    for action, helptext in (("get", "the value of a key"), ("delete", "delete a key (a DEL tombstone)"),
                             ("purge", "purge a key and its history"), ("history", "every stored revision of a key"),
                             ("touch", "restart a key's TTL without a new revision")):
        q = kv.add_parser(action, parents=[common], help=helptext)
        q.add_argument("bucket")
        q.add_argument("key")
        if action == "get":
            q.add_argument("--revision", type=int, default=0)
    q = kv.add_parser("keys", parents=[common], help="keys that hold a value")
    q.add_argument("bucket")
    q.add_argument("pattern", nargs="?", default=">")
    q = kv.add_parser("watch", parents=[common], help="print puts, deletes, purges and expirations")
    q.add_argument("bucket")
    q.add_argument("keys", nargs="?", default=">")
    q.add_argument("--count", type=int, default=0, help="exit after N events (0 = until interrupted)")
    q.add_argument("--current", action="store_true", help="start with the current values")
    q = kv.add_parser("info", parents=[common], help="a bucket's settings and state")
    q.add_argument("bucket")
    return parser


# -- entry point ------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    from ._log import configure_logging
    from .config import DEFAULT_CONFIG_TOML, ConfigError, load_config
    from .server import run_server

    if args.print_config:
        print(DEFAULT_CONFIG_TOML(), end="")
        return 0
    try:
        cfg = load_config(args.config)
        changes: dict[str, Any] = {}
        if args.data:
            changes["system.path"] = args.data
        if args.host:
            changes["server.host"] = args.host
        if args.port is not None:
            changes["server.port"] = args.port
        if args.fsync:
            changes["system.partition.fsync"] = args.fsync
        if args.export_dir:
            changes["export.dir"] = args.export_dir
        if changes:
            cfg = cfg.replace(**changes)
    except ConfigError as exc:
        print(f"error: invalid configuration: {exc}", file=sys.stderr)
        return 2
    configure_logging(cfg.logging.level, cfg.logging.format)
    try:
        try:
            trio.run(run_server, cfg)
        except BaseExceptionGroup as group:
            # A refusal to start (a damaged catalog, a locked data directory) arrives
            # wrapped by the server's nursery: show it as the one line it is.
            leaves = _leaves(group)
            if len(leaves) == 1 and isinstance(leaves[0], (BrokerError, OSError)):
                raise leaves[0] from None
            raise
    except BrokerError as exc:
        print(f"error: {exc.code.name} ({int(exc.code)}): {exc.message}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: cannot serve on {cfg.server.host}:{cfg.server.port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0


def _check(args: argparse.Namespace) -> int:
    """``ttlbroker check`` / ``repair``: see ``storage/_check.py``."""
    from storage import Damage, StorageFailure, check_data_dir

    from .config import ConfigError, load_config

    repair = args.command == "repair"
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        print(f"error: invalid configuration: {exc}", file=sys.stderr)
        return 2
    root = args.data or cfg.system.path
    export_dir = args.export_dir or cfg.export.dir

    def show(d: Damage) -> None:
        print("damage " + d.line(), flush=True)

    try:
        summary = check_data_dir(root, show, repair=repair)
    except StorageFailure as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2 if "not a directory" in exc.message or "in use" in exc.message else 1
    found = len(summary.damage)
    if export_dir:
        from spark_export._manifest import Manifest, ManifestUnreadable

        manifest_damage: list[Damage] = []
        try:
            Manifest.load(export_dir, lambda d: (manifest_damage.append(d), show(d)), readonly=True)
        except ManifestUnreadable as exc:
            print(f"damage export_manifest: {exc.message}")
        found += len(manifest_damage)
    for path, dest in summary.moved:
        print(f"moved {path} to {dest}")
    for path, first, last in summary.written_off:
        rng = f"offset {first}" if first == last else f"offsets {first}..{last}"
        print(f"written off {path}: {rng} could not be read and are lost for good (the segment's files are kept in quarantine/)")
    what = "repaired" if repair else "checked"
    print(
        f"{what} {root}: {summary.topics} topic(s), {summary.partitions} partition(s), {summary.segments} segment(s), "
        f"{summary.records} live record(s) verified; "
        + (f"{found} piece(s) of damage" + (" handled as listed" if repair else " found (`ttlbroker repair` applies the fixes)")
           if found else "no damage found")
    )
    return 0 if repair or not found else 1


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


async def _run_client(args: argparse.Namespace) -> int:
    out = Out(args.json)
    # One-shot commands report a lost connection; only `sub --reconnect` reconnects.
    options: dict[str, Any] = {"reconnect": False}
    if getattr(args, "reconnect", False):
        again = "pulling again" if args.command == "consumer" else "subscribed again"
        options = {
            "reconnect": True, "max_reconnect_attempts": args.max_reconnects,
            "on_disconnect": _on_disconnect, "on_reconnect": _on_reconnect_to(args.server, again),
        }
    try:
        async with connect(args.server, token=args.token, name="ttlbroker-cli", **options) as c:
            await CLIENT_COMMANDS[args.command](c, args, out)
    except _ExitStatus as exc:
        return exc.status
    except BrokerError as exc:
        print(f"error: {exc.code.name} ({int(exc.code)}): {exc.message}", file=sys.stderr)
        return 1
    except ConnectionClosedError as exc:
        cause = exc.__cause__
        if isinstance(cause, BrokerError):
            print(f"error: {cause.code.name} ({int(cause.code)}): {cause.message}", file=sys.stderr)
            return 1
        print(f"error: {exc.reason}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot connect to {args.server}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except TimeoutError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command in ("check", "repair"):
            return _check(args)
        return trio.run(_run_client, args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
