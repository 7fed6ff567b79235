"""``ttlbroker consumer add|edit|info|list|report|rm|next|sub``: durable consumers
(the report is ``_reports.py``).

``consumer edit`` is natscli's: the consumer's configuration with the options given
changed goes to the broker as an update, whose rules decide what may change (a new
deliver policy, start position, ack policy or mode is refused with
CONSUMER_UPDATE_DENIED); then the differences (``-old`` / ``+new``, as the broker
now holds it) and the consumer's info, or ``No difference in configuration``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import trio

from ._args import ident
from ._exits import CliError, ExitStatus, connection_loss_exits, fail
from ._output import Out, duration
from ._reports import consumer_report
from ._tables import consumer_fields, show_consumer, show_consumers
from broker.client import Client, ConsumerMessage

__all__ = ["cmd_consumer"]


def _consumer_config(args: argparse.Namespace) -> dict[str, Any]:
    cfg: dict[str, Any] = {}
    if args.filter:
        cfg["filter_subjects"] = args.filter
    deliver = args.deliver
    if args.start_offset is not None and deliver is None:
        deliver = "by_start_offset"
    if args.start_time is not None and deliver is None:
        deliver = "by_start_time"
    if deliver == "by_start_offset" and args.start_offset is None:
        raise fail(CliError.BAD_ARGUMENT, "--deliver by_start_offset needs --start-offset")
    if deliver == "by_start_time" and args.start_time is None:
        raise fail(CliError.BAD_ARGUMENT, "--deliver by_start_time needs --start-time")
    if args.start_offset is not None and deliver != "by_start_offset":
        raise fail(CliError.BAD_ARGUMENT, "--start-offset goes with --deliver by_start_offset")
    if args.start_time is not None and deliver != "by_start_time":
        raise fail(CliError.BAD_ARGUMENT, "--start-time goes with --deliver by_start_time")
    if deliver is not None:
        cfg["deliver_policy"] = deliver
    if args.start_offset is not None:
        cfg["opt_start_offset"] = args.start_offset
    if args.start_time is not None:
        cfg["opt_start_time"] = args.start_time
    for key in ("ack_wait", "max_deliver", "backoff", "max_ack_pending", "max_waiting", "member_timeout", "description",
                "dead_letter_subject", "dead_letter_expired"):
        value = getattr(args, key)
        if value is not None:
            cfg[key] = value
    if args.ack is not None:
        cfg["ack_policy"] = args.ack
    if args.partitioned:
        cfg["mode"] = "partitioned"
    return cfg


async def cmd_consumer(c: Client, args: argparse.Namespace, out: Out) -> None:
    a = args.action
    if a == "report":
        await consumer_report(c, args, out)
        return
    s, t = ident(args.stream), ident(args.topic)
    if a == "add":
        info = await c.create_consumer(s, t, args.name, **_consumer_config(args))
        out.obj(info.raw, f"created consumer {args.stream}/{args.topic}/{info.name}")
    elif a == "edit":
        await _edit(c, args, out, s, t)
    elif a == "info":
        show_consumer(out, await c.consumer_info(s, t, args.name))
    elif a == "list":
        show_consumers(out, await c.list_consumers(s, t))
    elif a == "rm":
        await c.delete_consumer(s, t, args.name)
        out.obj({"deleted": f"{args.stream}/{args.topic}/{args.name}"}, f"deleted consumer {args.stream}/{args.topic}/{args.name}")
    elif a == "redrive":
        r = await c.redrive(s, t, dry_run=args.dry_run)
        verb = "would redrive" if args.dry_run else "redrove"
        out.obj(r, f"{verb} {r['redriven']} dead letters from {args.stream}/{args.topic}"
                   + (f" ({r['skipped']} other messages skipped)" if r["skipped"] else ""))
    elif a == "next":
        await _next(c, args, out, s, t)
    elif a == "sub":
        seen = 0
        with connection_loss_exits():
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


async def _next(c: Client, args: argparse.Namespace, out: Out, s: int | str, t: int | str) -> None:
    """Pull until ``--count`` messages came or ``--wait`` is over: the wait is the
    whole command's, however many pulls it takes (a pull waits for its batch to
    fill, so each one waits only what is left)."""
    got: list[ConsumerMessage] = []
    deadline = trio.current_time() + args.wait
    while len(got) < args.count:
        left = deadline - trio.current_time()
        if left <= 0:
            break
        batch = await c.pull(s, t, args.name, min(args.count - len(got), 1000), expires=left)
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
        raise fail(CliError.NO_MESSAGE, f"no message within {duration(args.wait)}")


async def _edit(c: Client, args: argparse.Namespace, out: Out, s: int | str, t: int | str) -> None:
    changes = _consumer_config(args)
    if not changes:
        raise fail(CliError.BAD_ARGUMENT, "consumer edit needs at least one option to change")
    old = await c.consumer_info(s, t, args.name)
    config = {**old.config, **changes}
    if "backoff" in changes and "ack_wait" not in changes:
        config.pop("ack_wait", None)  # with a backoff the ack wait is its first delay: the broker sets it
    new = await c.update_consumer(s, t, args.name, **config)
    before, after = consumer_fields(old.config), consumer_fields(new.config)
    if out.json:
        out.obj(new.raw)
        return
    if before == after:
        print("No difference in configuration", flush=True)
        return
    was_shown, now_shown = dict(before), dict(after)
    width = max(len(label) for label, _ in before + after)
    print("Differences (-old +new):")
    for label in dict.fromkeys(label for label, _ in before + after):
        was, now = was_shown.get(label), now_shown.get(label)
        if was != now:
            if was is not None:
                print(f"- {label:<{width}}  {was}")
            if now is not None:
                print(f"+ {label:<{width}}  {now}")
    out.blank()
    show_consumer(out, new)
