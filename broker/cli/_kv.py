"""``ttlbroker kv ...``: KV buckets (the client's ``KeyValue``, ``broker/client/_kv.py``).

A bucket is the topic ``kv/<bucket>`` and a key the subject ``$KV.<bucket>.<key>``;
that is the broker's business, so the errors people see name the key and the
bucket (``error: key not found: alice``), never the subject.

``kv rm BUCKET`` removes the bucket (its topic) and ``kv rm BUCKET KEY`` deletes a
key, as natscli's ``nats kv rm`` does; both ask first on a terminal
(``_confirm.py``). ``kv delete BUCKET KEY`` deletes a key without asking, as before.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from protocol import BrokerError, ErrorCode, rfc3339_ns

from ._exits import fail
from ._output import Out
from ._tables import EMPTY, show_bucket, show_buckets
from broker.client import KV_STREAM, Client, Entry, KeyValue

__all__ = ["cmd_kv"]


def _entry_json(e: Entry) -> dict[str, object]:
    out: dict[str, object] = {
        "bucket": e.bucket, "key": e.key, "revision": e.revision, "operation": e.operation,
        "created": rfc3339_ns(e.created), "ttl_remaining": e.ttl_remaining,
    }
    try:
        out["value"] = e.value.decode()
    except UnicodeDecodeError:
        out["value"] = base64.b64encode(e.value).decode()
        out["value_encoding"] = "base64"
    return out


@contextlib.contextmanager
def _key_errors(key: str, revision: int = 0) -> Iterator[None]:
    """MESSAGE_NOT_FOUND from a key's read as ``error: key not found: KEY``."""
    try:
        yield
    except BrokerError as exc:
        if exc.code != ErrorCode.MESSAGE_NOT_FOUND:
            raise
        msg = exc.message  # the broker's or the client's (which ends with the tombstone's operation)
        why = "expired" if "expired" in msg else "deleted" if msg.endswith("(del)") else "purged" if msg.endswith("(purge)") else ""
        detail = [f"revision {revision}"] if revision else []
        detail += [why] if why else []
        raise fail(f"key not found: {key}" + (f" ({', '.join(detail)})" if detail else "")) from None


async def _bucket(c: Client, name: str) -> KeyValue:
    try:
        return await c.kv(name)
    except BrokerError as exc:
        if exc.code in (ErrorCode.STREAM_NOT_FOUND, ErrorCode.TOPIC_NOT_FOUND):
            raise fail(f"bucket not found: {name}") from None
        raise


async def _buckets(c: Client) -> list[dict[str, Any]]:
    try:
        topics = await c.list_topics(KV_STREAM)
    except BrokerError as exc:
        if exc.code == ErrorCode.STREAM_NOT_FOUND:  # no bucket was ever made
            return []
        raise
    return [await (await c.kv(t.name)).status() for t in topics if t.options.get("kv")]


async def cmd_kv(c: Client, args: argparse.Namespace, out: Out) -> None:
    a = args.action
    if a == "add":
        kv = await c.kv_create(args.bucket, history=args.history, ttl=args.ttl, refresh=args.refresh,
                               visibility=args.visibility, marker_ttl=args.marker_ttl)
        out.obj(await kv.status(), f"created bucket {kv.bucket}")
        return
    if a == "ls":
        show_buckets(out, await _buckets(c))
        return
    kv = await _bucket(c, args.bucket)
    if a == "rm" and args.key is None:
        await c.delete_topic(KV_STREAM, kv.bucket)
        out.obj({"deleted": kv.bucket}, f"deleted bucket {kv.bucket}")
    elif a in ("put", "create", "update"):
        value = args.value.encode() if args.value is not None else sys.stdin.buffer.read()
        ttl: int | str | None = int(args.ttl) if args.ttl and args.ttl.isdigit() else args.ttl
        if a == "put":
            rev = await kv.put(args.key, value, ttl=ttl)
        elif a == "create":
            rev = await kv.create(args.key, value, ttl=ttl)
        else:
            rev = await kv.update(args.key, value, args.revision, ttl=ttl)
        out.obj({"bucket": kv.bucket, "key": args.key, "revision": rev}, f"{args.key} revision {rev}")
    elif a == "get":
        with _key_errors(args.key, args.revision):
            e = await kv.get(args.key, revision=args.revision)
        if out.json:
            out.obj(_entry_json(e))
        else:
            sys.stdout.buffer.write(e.value + b"\n")
    elif a in ("delete", "rm", "purge"):
        op = "purge" if a == "purge" else "delete"
        rev = await (kv.purge(args.key) if op == "purge" else kv.delete(args.key))
        out.obj({"bucket": kv.bucket, "key": args.key, "revision": rev, "operation": op.upper()}, f"{op}d {args.key}")
    elif a == "touch":
        with _key_errors(args.key):
            left = await kv.touch(args.key)
        out.obj({"bucket": kv.bucket, "key": args.key, "ttl_remaining": left},
                f"{args.key}: {'no TTL' if left is None else f'{left:.3f} s left'}")
    elif a == "keys":
        keys = await kv.keys(args.pattern)
        if out.json:
            out.obj({"keys": keys})
        elif not keys:  # on stderr: a script reading the keys from stdout reads none
            print(EMPTY["keys"], file=sys.stderr)
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
        show_bucket(out, await kv.status())
