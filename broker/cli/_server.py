"""``ttlbroker server info`` and ``ttlbroker server ping``, as the ``nats`` CLI has
``nats server info`` and ``nats server ping`` / ``nats rtt``.

``server info`` reads the broker's SERVER_INFO (its identity, version, limits and the
addresses it listens on) and its STATS (uptime, connections, traffic, storage) and
shows them in titled sections, natscli's order: the process, its listeners and
connections, its limits, its traffic, its storage. ``--json`` gives one object, the
two merged (SERVER_INFO's keys win).

``server ping`` sends ``--count`` PINGs one after the other and prints each round
trip, then natscli's summary: ``---- ping statistics ----`` and ``N replies max: ..
min: .. avg: ..`` in milliseconds.
"""

from __future__ import annotations

import argparse
import datetime as dt
from typing import TYPE_CHECKING, Any

from ._output import Out, count, duration, flag, size
from ._request import go_duration
from broker.client import Client

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = ["add_server_commands", "cmd_server"]


def add_server_commands(sub: Subparsers, g: list[argparse.ArgumentParser]) -> None:
    """``server info`` and ``server ping`` on the main parser's subparsers."""
    helptext = "the broker's identity, listeners and state (info), or round trips to it (ping)"
    ss = sub.add_parser("server", parents=g, help=helptext, description=helptext).add_subparsers(
        dest="action", required=True, metavar="ACTION",
    )
    ss.add_parser("info", parents=g, help="the broker's identity, version, uptime, listeners, connections and storage")
    p = ss.add_parser("ping", parents=g, help="measure round trips to the broker (PING), with a min/avg/max summary")
    p.add_argument("--count", type=int, default=5, metavar="N", help="how many round trips (default 5)")


async def cmd_server(c: Client, args: argparse.Namespace, out: Out) -> None:
    if args.action == "info":
        await _info(c, out)
    else:
        await _ping(c, args, out)


# -- info ----------------------------------------------------------------------------


async def _info(c: Client, out: Out) -> None:
    info = await c.info()
    stats = await c.stats()
    if out.json:
        out.obj({**stats, **info})
        return
    listeners: dict[str, str] = info.get("listeners") or {}
    started = info.get("started_at")
    out.fields(f"Server {info.get('name', '?')}", [
        ("version", str(info.get("version", "?"))),
        ("protocol version", str(info.get("protocol_version", "?"))),
        ("start time", _rfc3339(started) if isinstance(started, (int, float)) else "-"),
        ("uptime", duration(round(stats.get("uptime_seconds", 0)))),
    ])
    out.blank()
    conns = stats.get("connections", 0)
    nats = stats.get("nats_connections", 0)
    out.fields("Connections", [
        ("ttlbroker", listeners.get("ttlbroker", "-")),
        ("nats", listeners.get("nats", "off")),
        ("monitoring", listeners.get("http", "off")),
        ("auth required", flag(info.get("auth_required"))),
        ("tls required", flag(info.get("tls_required"))),
        ("connections", f"{count(conns)} ({count(conns - nats)} ttlbroker, {count(nats)} nats)"),
        ("subscriptions", count(stats.get("subscriptions", 0))),
        ("slow consumers", count(stats.get("slow_consumers", 0))),
    ])
    out.blank()
    out.fields("Limits", [
        ("max frame", size(info.get("max_frame_bytes", 0))),
        ("max payload", size(info.get("max_payload_bytes", 0))),
        ("max fetch", size(info.get("max_fetch_bytes", 0))),
    ])
    out.blank()
    out.fields("Statistics", [
        ("messages", f"{count(stats.get('messages_in', 0))} in, {count(stats.get('messages_out', 0))} out"),
        ("bytes", f"{size(stats.get('bytes_in', 0))} in, {size(stats.get('bytes_out', 0))} out"),
        ("unrouted", count(stats.get("messages_unrouted", 0))),
        ("no responders", count(stats.get("no_responders", 0))),
        ("request errors", count(stats.get("request_errors", 0))),
    ])
    out.blank()
    out.fields("Storage", [
        ("fsync", str(info.get("fsync", stats.get("fsync", "?")))),
        ("streams", count(stats.get("streams", 0))),
        ("topics", count(stats.get("topics", 0))),
        ("partitions", count(stats.get("partitions", 0))),
        ("messages", count(stats.get("messages", 0))),
        ("bytes in logs", size(stats.get("bytes_in_logs", 0))),
        ("bytes on disk", size(stats.get("bytes_on_disk", 0))),
        ("memory storage", f"{size(stats.get('memory_storage_bytes', 0))} of {size(stats.get('memory_storage_limit_bytes', 0))}"),
    ])


def _rfc3339(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


# -- ping ----------------------------------------------------------------------------


async def _ping(c: Client, args: argparse.Namespace, out: Out) -> None:
    name = str(c.server_info.get("name", "ttlbroker"))
    times: list[float] = []
    for seq in range(1, max(args.count, 1) + 1):
        rtt = await c.ping()
        times.append(rtt)
        if out.json:
            out.obj({"server": name, "seq": seq, "rtt_ms": round(rtt * 1000, 3)})
        else:
            print(f"{name:<30} seq={seq:<4} rtt={go_duration(rtt)}", flush=True)
    ms = [t * 1000 for t in times]
    summary: dict[str, Any] = {
        "replies": len(ms), "min_ms": round(min(ms), 3), "avg_ms": round(sum(ms) / len(ms), 3), "max_ms": round(max(ms), 3),
    }
    if out.json:
        out.obj(summary)
        return
    print(flush=True)
    print("---- ping statistics ----", flush=True)
    print(f"{len(ms)} replies max: {max(ms):.2f} min: {min(ms):.2f} avg: {sum(ms) / len(ms):.2f}", flush=True)
