"""``ttlbroker kv ...``: KV buckets (the client's ``KeyValue``, ``broker/client/_kv.py``).

A bucket is the topic ``kv/<bucket>`` and a key the subject ``$KV.<bucket>.<key>``;
that is the broker's business, so the errors people see speak of buckets, keys and
revisions (``error: MESSAGE_NOT_FOUND (6004): key 'alice' not found in bucket
'sessions' (deleted)``), never of the topic or the subject; their names and codes
are the broker's. A permission error keeps the subject: permissions are written in
subjects.

``kv rm BUCKET`` removes the bucket (its topic) and ``kv rm BUCKET KEY`` deletes a
key, as natscli's ``nats kv rm`` does; both ask first on a terminal
(``_confirm.py``). ``kv delete BUCKET KEY`` deletes a key without asking, as before.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import re
import sys
from collections.abc import Iterator
from typing import Any

from protocol import BrokerError, ErrorCode, rfc3339_ns

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


def _kv_text(exc: BrokerError, bucket: str, key: str | None, revision: int, last: int | None) -> str:
    """``exc``'s message in a bucket's words (see the module's docstring)."""
    msg = exc.message
    if exc.code == ErrorCode.MESSAGE_NOT_FOUND and key is not None:
        # The broker's words, or the client's (which end with the tombstone's operation).
        why = "expired" if "expired" in msg else "deleted" if msg.endswith("(del)") else "purged" if msg.endswith("(purge)") else ""
        what = f"revision {revision} of key {key!r}" if revision else f"key {key!r}"
        return f"{what} not found in bucket {bucket!r}" + (f" ({why})" if why else "")
    if exc.code == ErrorCode.WRONG_LAST_SEQUENCE and last is not None:  # update: "wrong last sequence: N"
        at = re.search(r"(\d+)$", msg)
        if at is not None:
            now = int(at.group(1))
            where = f"is at revision {now}" if now else "has no revision yet"
            return f"key {key!r} of bucket {bucket!r} {where}, not {last}"
    msg = re.sub(rf"'\$KV\.{re.escape(bucket)}\.([^']*)'", r"'\1'", msg)  # a key's subject: the key
    return msg.replace("subject filter", "key pattern")


@contextlib.contextmanager
def _kv_words(bucket: str, key: str | None = None, revision: int = 0, last: int | None = None) -> Iterator[None]:
    """The broker's errors about ``bucket`` (``key``, at ``revision``; ``last``: the
    revision an update expected) raised again in a bucket's words, with the same
    code."""
    try:
        yield
    except BrokerError as exc:
        if exc.code == ErrorCode.PERMISSION_DENIED:
            raise
        raise BrokerError.from_code(int(exc.code), _kv_text(exc, bucket, key, revision, last)) from None


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
    kv = await c.kv(args.bucket)
    if a == "rm" and args.key is None:
        with _kv_words(kv.bucket):
            await c.delete_topic(KV_STREAM, kv.bucket)
        out.obj({"deleted": kv.bucket}, f"deleted bucket {kv.bucket}")
        return
    read = args.revision if a == "get" else 0
    with _kv_words(kv.bucket, getattr(args, "key", None), read, args.revision if a == "update" else None):
        await _key_command(kv, args, out)


async def _key_command(kv: KeyValue, args: argparse.Namespace, out: Out) -> None:
    a = args.action
    if a in ("put", "create", "update"):
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
