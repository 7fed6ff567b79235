"""The ``ttlbroker`` commands that drive a running broker: streams, topics,
publish, fetch, last, sub, stats, export, delete, purge and offsets (consumers are
in ``_consumer.py``, KV buckets in ``_kv.py``, the reports in ``_reports.py``,
``pub``'s templates in ``_templates.py``). ``_run.py`` connects and runs one.

Errors are one line on stderr naming the error and its code; the exit status is 1
(2 when the broker cannot be reached or the connection is lost, 130 on Ctrl-C):
``_exits.py``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import trio

from protocol import BrokerError, Message

from ._args import headers, ident, tls_option
from ._exits import CliError, ExitStatus, connection_loss_exits, error_line, fail, say
from ._output import Out, Where, count, listing, rate, size
from ._reports import stream_report
from ._tables import show_stats, show_streams, show_topic, show_topics, stream_json, topic_json
from ._templates import MessageTemplate, TemplateError
from broker.client import Client, ConnectionClosedError, connect

if TYPE_CHECKING:
    from ._progress import Progress

__all__ = [
    "cmd_stream", "cmd_topic", "cmd_pub", "cmd_fetch", "cmd_last", "cmd_sub", "cmd_stats", "cmd_export",
    "cmd_delete", "cmd_purge", "cmd_offset",
]

# -- streams and topics ------------------------------------------------------------------


#: Topic options given by value (argument -> option) and by a flag.
_TOPIC_VALUES = (
    ("subjects", "subjects"), ("max_msgs_per_subject", "max_msgs_per_subject"), ("segment_size", "segment_size"),
    ("marker_ttl", "subject_delete_marker_ttl"), ("duplicate_window", "duplicate_window"),
    ("storage", "storage"),
    ("max_msgs", "max_msgs"), ("max_bytes", "max_bytes"), ("max_msg_size", "max_msg_size"),
    ("max_consumers", "max_consumers"), ("discard", "discard"),
)
_TOPIC_FLAGS = ("deny_purge", "allow_msg_ttl", "allow_rollup", "allow_msg_schedules", "pedantic", "discard_new_per_subject")


def _topic_options(args: argparse.Namespace, updating: bool) -> dict[str, Any]:
    opts: dict[str, Any] = {opt: v for arg, opt in _TOPIC_VALUES if (v := getattr(args, arg)) is not None and v != []}
    opts.update((flag, True) for flag in _TOPIC_FLAGS if getattr(args, flag))
    if args.no_republish:
        if args.republish_dest or args.republish_src or args.republish_headers_only:
            raise fail(CliError.BAD_ARGUMENT, "--no-republish cannot be combined with the other --republish options")
        opts["republish"] = None
    elif args.republish_dest is not None:
        rp: dict[str, Any] = {"dest": args.republish_dest, "headers_only": args.republish_headers_only}
        if args.republish_src is not None:
            rp["src"] = args.republish_src
        opts["republish"] = rp
    elif args.republish_src is not None or args.republish_headers_only:
        raise fail(CliError.BAD_ARGUMENT, "--republish-src and --republish-headers-only need --republish-dest")
    if updating and args.expiry is not None:
        opts["message_expiry"] = args.expiry
    return opts


async def cmd_stream(c: Client, args: argparse.Namespace, out: Out) -> None:
    if args.action == "create":
        s = await c.create_stream(args.name, args.id or 0)
        out.obj(stream_json(s), f"created stream {s.name} (id {s.id})")
    elif args.action == "list":
        show_streams(out, await c.list_streams())
    elif args.action == "report":
        await stream_report(c, args, out)
    elif args.action in ("rm", "delete"):
        await c.delete_stream(ident(args.stream))
        out.obj({"deleted": args.stream}, f"deleted stream {args.stream}")


async def cmd_topic(c: Client, args: argparse.Namespace, out: Out) -> None:
    if args.action == "create":
        t = await c.create_topic(
            ident(args.stream), args.name, partitions=args.partitions, message_expiry=args.expiry,
            topic_id=args.id or 0, **_topic_options(args, False),
        )
        shown = topic_json(t)
        out.obj(shown, f"created topic {args.stream}/{t.name} (id {t.id}, subjects {listing(shown.get('subjects', []))})")
    elif args.action == "update":
        changes = _topic_options(args, True)
        if not changes:
            raise fail(CliError.BAD_ARGUMENT, "topic update needs at least one option to change")
        t = await c.update_topic(ident(args.stream), ident(args.topic), **changes)
        out.obj(topic_json(t), f"updated topic {args.stream}/{t.name}")
    elif args.action == "list":
        show_topics(out, await c.list_topics(ident(args.stream)))
    elif args.action == "info":
        show_topic(out, await c.get_topic(ident(args.stream), ident(args.topic)))
    elif args.action in ("rm", "delete"):
        await c.delete_topic(ident(args.stream), ident(args.topic))
        out.obj({"deleted": f"{args.stream}/{args.topic}"}, f"deleted topic {args.stream}/{args.topic}")


# -- publish ------------------------------------------------------------------------------


async def cmd_pub(c: Client, args: argparse.Namespace, out: Out) -> None:
    """One message, or ``--count N`` (``_templates.py``: with templates each one is
    rendered; without, one body is encoded and sent N times)."""
    data = args.data.encode() if args.data is not None else sys.stdin.buffer.read()
    hdrs = headers(args.header)
    if args.ttl:
        hdrs["Nats-TTL"] = args.ttl
    try:
        msg = MessageTemplate(args.subject, data, hdrs, enabled=not args.no_templates)
    except TemplateError as exc:
        raise fail(CliError.BAD_ARGUMENT, f"pub: {exc}") from None
    if args.count == 1:
        subject, data, hdrs = msg.render(1)
        ack = await c.publish(subject, data, headers=hdrs or None)
        assert ack is not None
        result = {"stream_id": ack.stream_id, "topic_id": ack.topic_id, "partition": ack.partition, "offset": ack.offset}
        if ack.duplicate:  # its Nats-Msg-Id was stored within the topic's duplicate window
            result["duplicate"] = True
            text = f"duplicate: {subject} is stored at partition {ack.partition} offset {ack.offset} (not stored again)"
        else:
            text = f"published {subject} -> partition {ack.partition} offset {ack.offset}"
        out.obj(result, text)
        return
    await _publish_many(c, args, out, msg.batch)


class _Tally:
    def __init__(self) -> None:
        self.acked = self.errors = self.duplicates = 0
        self.first: int | None = None
        self.last: int | None = None

    @property
    def published(self) -> int:
        return self.acked - self.errors - self.duplicates


#: At most this many bytes of messages in one ``pub --count`` batch (and at most half
#: the broker's largest frame, ``max_frame_bytes`` of its handshake info).
_BATCH_BYTES = 4 << 20
#: What a PUBLISH frame holds besides its messages: the frame's header (16 bytes),
#: then the flags and the count (docs/protocol.md).
_PUBLISH_OVERHEAD = 16 + 5


async def _publish_many(c: Client, args: argparse.Namespace, out: Out,
                        batch: Callable[[int, int, int], list[bytes]]) -> None:
    """``pub --count N``: batches of up to 1000 messages and ``_BATCH_BYTES``
    (``batch(done, most, budget)`` gives the next ones), with progress on a
    terminal, a final line always, and on Ctrl-C the count published so far and exit
    status 130. With ``--sleep`` one message at a time, and the pause between them.

    The first Ctrl-C ends the loop once the batch in flight is acked (or the pause at
    once), so the count is exact; a second one (or five seconds without the acks)
    cancels at once."""
    from ._progress import Progress

    total = args.count
    pause = args.sleep
    frame = int(c.server_info.get("max_frame_bytes") or 0)
    budget = min(_BATCH_BYTES, frame // 2) if frame else _BATCH_BYTES
    tally = _Tally()
    stop = trio.Event()
    started = time.perf_counter()
    with Progress(f"publishing {args.subject}", total, "msgs") as progress:
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(_stop_on_sigint, stop, nursery.cancel_scope)
                await _publish_batches(c, total, pause, frame, budget, batch, tally, stop, progress)
                nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:  # the broker's error (a message over its frame limit), as itself
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
    seconds = time.perf_counter() - started
    summary: dict[str, object] = {
        "published": tally.published, "errors": tally.errors, "first_offset": tally.first, "last_offset": tally.last,
    }
    if tally.duplicates:
        summary["duplicates"] = tally.duplicates
    summary["seconds"] = round(seconds, 3)
    if stop.is_set():
        summary["interrupted"] = True
        out.obj(summary)
        print(f"interrupted: published {count(tally.published)} of {count(total)}", file=sys.stderr, flush=True)
        raise ExitStatus(130)
    notes = [f"{count(tally.errors)} refused"] if tally.errors else []
    if tally.duplicates:
        notes.append(f"{count(tally.duplicates)} duplicates not stored again")
    what = count(tally.published) if not notes else f"{count(tally.published)} of {count(tally.acked)}"
    out.obj(
        summary,
        f"published {what} messages on {args.subject} in {seconds:.1f} s ({rate(tally.acked, seconds)} msgs/s)"
        + (f"; {', '.join(notes)}" if notes else ""),
    )
    if tally.errors:
        raise ExitStatus(1)


async def _publish_batches(
    c: Client, total: int, pause: float, frame: int, budget: int, batch: Callable[[int, int, int], list[bytes]],
    tally: _Tally, stop: trio.Event, progress: Progress,
) -> None:
    while tally.acked < total and not stop.is_set():
        if pause and tally.acked:
            with trio.move_on_after(pause):
                await stop.wait()
            if stop.is_set():
                break
        bodies = batch(tally.acked, 1 if pause else min(1000, total - tally.acked), budget)
        if frame and len(bodies[0]) + _PUBLISH_OVERHEAD > frame:  # the broker would close the connection
            raise fail(CliError.BAD_ARGUMENT, f"pub: message {count(tally.acked + 1)} takes {count(len(bodies[0]))} bytes, more than a frame "
                       f"of the broker holds ({count(frame)} bytes with the frame's own, its limits.max_frame_bytes)")
        acks = await c.publish_batch(bodies)
        assert acks is not None
        for a in acks:
            if not a.ok:
                tally.errors += 1
                if tally.errors == 1:  # the first refusal says why (the summary counts them all)
                    say(error_line(a.error) if a.error is not None else f"error: refused with status {a.status}")
            elif a.duplicate:  # not an error: the Nats-Msg-Id is stored already
                tally.duplicates += 1
            else:
                tally.first = tally.first if tally.first is not None else a.offset
                tally.last = a.offset
        tally.acked += len(bodies)
        progress.update(tally.acked)


async def _stop_on_sigint(
    stop: trio.Event, scope: trio.CancelScope, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        task_status.started()
        async for _ in signals:
            if stop.is_set():
                scope.cancel()
            else:
                stop.set()
                scope.deadline = trio.current_time() + 5


# -- reading --------------------------------------------------------------------------


async def cmd_fetch(c: Client, args: argparse.Namespace, out: Out) -> None:
    offset = args.offset
    remaining = args.count
    while remaining > 0:
        f = await c.fetch(ident(args.stream), ident(args.topic), args.partition, offset, min(remaining, 1000), subject=args.subject)
        for m in f.messages:
            out.message(m, args.stream, args.topic)
        remaining -= len(f.messages)
        if f.next_offset <= offset or f.next_offset > f.last_offset:
            break
        offset = f.next_offset


async def cmd_last(c: Client, args: argparse.Namespace, out: Out) -> None:
    m = await c.get_last(ident(args.stream), ident(args.topic), args.subject)
    out.message(m, args.stream, args.topic)


async def cmd_sub(c: Client, args: argparse.Namespace, out: Out) -> None:
    """Print what the subscription receives (``--raw``: the payloads alone, each
    ending with a newline, as natscli's ``sub --raw``). A lost connection ends it
    with one line on stderr saying why, exit status 2; with ``--reconnect`` the
    client reconnects (a line on stderr for each disconnect and reconnect) until it
    gives up."""
    if args.raw and out.json:
        raise fail(CliError.BAD_ARGUMENT, "sub: --raw prints the payloads alone, --json whole messages: give one of them")
    names: dict[tuple[int, int], tuple[Where, Where]] = {}

    async def where(m: Message) -> tuple[Where, Where]:
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
            stream = cast("str | int", t.extra.get("stream", m.stream_id))  # the stream's name (docs/protocol.md)
            names[key] = (stream, t.name)
        return names[key]

    seen = 0
    with connection_loss_exits():
        async with await c.subscribe(args.filter) as sub:
            # The ready line (with --json and --raw too: it is on stderr): the broker has answered
            # the subscribe, so what is published from now on is delivered.
            print(f"subscribed to {args.filter}", file=sys.stderr, flush=True)
            async for m in sub:
                if args.raw:
                    sys.stdout.buffer.write(m.payload if m.payload.endswith(b"\n") else m.payload + b"\n")
                    sys.stdout.buffer.flush()
                else:
                    stream, topic = await where(m)
                    out.message(m, stream, topic)
                seen += 1
                if args.count and seen >= args.count:
                    break


# -- the rest -------------------------------------------------------------------------


async def cmd_stats(c: Client, args: argparse.Namespace, out: Out) -> None:
    show_stats(out, await c.stats())


async def cmd_export(c: Client, args: argparse.Namespace, out: Out) -> None:
    """One request does the whole pass. On a terminal a second connection reads the
    pass's progress from ``stats`` (``export_pass_done`` of ``export_pass_segments``)
    four times a second for the bar, rate and ETA; then the final line."""
    from ._progress import Progress

    started = time.perf_counter()
    with Progress("exporting" + (" (sealing first)" if args.seal else ""), None, "segments", bar=True) as progress:
        if progress.shown:
            res = await _export_with_progress(c, args, progress)
        else:
            res = await c.export(seal=args.seal)
    seconds = time.perf_counter() - started
    if out.json:
        out.obj({**res, "seconds": round(seconds, 3)})
        return
    for e in res["exported"]:
        print(f"exported {e['path']} ({count(e['rows'])} rows, {size(e['bytes'])})")
    rows = sum(e["rows"] for e in res["exported"])
    n = len(res["exported"])
    print(
        f"exported {n} segment{'' if n == 1 else 's'} ({count(rows)} rows, {size(sum(e['bytes'] for e in res['exported']))}) "
        f"to {res['dir']} in {seconds:.1f} s ({rate(rows, seconds)} rows/s); "
        f"{res['sealed']} sealed first, {res['segments_in_export']} in the export",
        flush=True,
    )


async def _export_with_progress(c: Client, args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    """The export, while a second connection feeds ``progress``; the export's own
    error comes out as itself, not in an exception group."""
    res: dict[str, Any] = {}

    async def export() -> None:
        res.update(await c.export(seal=args.seal))
        nursery.cancel_scope.cancel()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(export)
            nursery.start_soon(_export_progress, args, progress)
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
    return res


async def _export_progress(args: argparse.Namespace, progress: Progress) -> None:
    """Read the pass's progress four times a second; a watcher that cannot connect
    or loses its connection just stops (the export goes on)."""
    try:
        async with connect(args.server, token=args.token, user=args.user, password=args.password, name="ttlbroker-cli-progress", reconnect=False,
                           tls=tls_option(args)) as watcher:
            while True:
                stats = await watcher.stats()
                if stats.get("export_pass_segments"):
                    progress.update(stats["export_pass_done"], stats["export_pass_segments"])
                await trio.sleep(0.25)
    except (OSError, BrokerError, ConnectionClosedError):
        return


async def cmd_delete(c: Client, args: argparse.Namespace, out: Out) -> None:
    await c.delete_message(ident(args.stream), ident(args.topic), args.partition, args.offset)
    out.obj({"deleted": {"partition": args.partition, "offset": args.offset}}, f"deleted partition {args.partition} offset {args.offset}")


async def cmd_purge(c: Client, args: argparse.Namespace, out: Out) -> None:
    n = await c.purge(ident(args.stream), ident(args.topic), args.subject)
    out.obj({"purged": n}, f"purged {count(n)} messages")


async def cmd_offset(c: Client, args: argparse.Namespace, out: Out) -> None:
    s, t = ident(args.stream), ident(args.topic)
    if args.action == "get":
        o = await c.get_offset(s, t, args.consumer, args.partition)
        out.obj({"consumer": args.consumer, "partition": args.partition, "offset": o}, str(o))
    elif args.action == "set":
        await c.store_offset(s, t, args.consumer, args.partition, args.offset)
        out.obj({"consumer": args.consumer, "partition": args.partition, "offset": args.offset}, f"stored {args.offset}")
    else:
        await c.delete_offset(s, t, args.consumer, args.partition)
        out.obj({"consumer": args.consumer, "partition": args.partition, "deleted": True}, "deleted")
