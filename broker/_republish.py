"""Republish (NATS ADR-28): stored messages published again on a transformed subject.

A topic's ``republish`` option (``src`` filter, ``dest`` template, ``headers_only``)
makes the broker, once a message matching ``src`` is durably appended (under
``fsync = "always"``, after the group commit that covers it; never for a refused
publish), publish it again, at most once, on ``dest`` applied to its subject. The
copy is an ordinary core publish: subscribers get it, and the topic that captures its
subject stores it like any publish (which may republish it in turn).

The copy's headers are the stored ones followed by the server's (``Nats-Stream`` as
``stream/topic``, ``Nats-Subject``, ``Nats-Sequence``, ``Nats-Time-Stamp``,
``Nats-Last-Sequence``, and ``Nats-Msg-Size`` with ``headers_only``), then the hop
count ``TTLB-Hops``. Loops: a configuration that closes one is refused at create and
update (``_catalog.py``); a message that would cross more than
``[limits] max_republish_hops`` hops is dropped and counted (``dropped_loops``). A
transform that yields an invalid subject drops the copy, counted
(``dropped_invalid_subject``) and logged at most once a minute (decision 10.13).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from protocol import BrokerError, encode_body, hops_of, read_record_info, republish_headers, validate_subject
from storage import AppendResult

from ._commit import Committer
from ._log import get_logger
from ._partition import Partition
from ._stats import Counters

__all__ = ["Republisher"]

log = get_logger(__name__)

_LOG_EVERY_SECONDS = 60.0


class Republisher:
    """Args:
    counters: the broker's counters.
    committer: the group committer (copies wait for the append to be durable).
    max_hops: ``[limits] max_republish_hops``.
    publish: the broker's internal publish of message bodies (no acks).
    """

    def __init__(self, counters: Counters, committer: Committer, max_hops: int, publish: Callable[[list[bytes]], None]) -> None:
        self.counters = counters
        self.committer = committer
        self.max_hops = max_hops
        self.publish = publish
        self._last_warning = {"invalid": -_LOG_EVERY_SECONDS, "hops": -_LOG_EVERY_SECONDS}

    def after_append(self, part: Partition, res: AppendResult, last_offsets: list[int], epoch: int) -> None:
        """Republish what an append stored, once it is durable. ``last_offsets`` come
        from :meth:`Partition.last_offsets`, taken before the append."""
        bodies = self._copies(part, res, last_offsets)
        if not bodies:
            return
        if self.committer.acks_wait:
            self.committer.after(epoch, lambda: self._send(bodies))
        else:
            self._send(bodies)

    def _send(self, bodies: list[bytes]) -> None:
        self.counters.republished += len(bodies)
        self.publish(bodies)

    def _copies(self, part: Partition, res: AppendResult, last_offsets: list[int]) -> list[bytes]:
        topic = part.topic
        transform = topic.republisher
        rp = topic.config.republish
        if transform is None or rp is None:
            return []
        headers_only = rp["headers_only"]
        where = topic.full_name
        records = res.records
        out: list[bytes] = []
        # subject -> (its text, the destination or None: no match, or "" invalid)
        dests: dict[bytes, tuple[str, str | None]] = {}
        for k, pos in enumerate(res.positions):
            info = read_record_info(records, pos)
            known = dests.get(info.subject)
            if known is None:
                subject = info.subject.decode()
                dest = transform.apply(subject)
                if dest is not None:
                    try:
                        validate_subject(dest)
                    except BrokerError as err:
                        self._warn("invalid", "republish_dropped", topic=where, subject=subject, reason=err.message)
                        dest = ""
                known = dests[info.subject] = (subject, dest)
            subject, dest = known
            if dest is None:
                continue
            if not dest:
                self.counters.dropped_invalid_subject += 1
                continue
            hops = hops_of(info.headers) + 1
            if hops > self.max_hops:
                self.counters.dropped_loops += 1
                self._warn("hops", "republish_loop_dropped", topic=where, subject=subject, hops=hops, limit=self.max_hops)
                continue
            headers = republish_headers(
                info.headers, where, subject, info.offset, info.timestamp, last_offsets[k],
                info.payload_len if headers_only else None, hops,
            )
            if headers_only:
                payload: bytes | memoryview = b""
            else:
                start = pos + 38 + len(info.subject) + len(info.headers)
                payload = memoryview(records)[start : start + info.payload_len]
            out.append(encode_body(dest, payload, headers))
        return out

    def _warn(self, kind: str, event: str, **fields: object) -> None:
        now = time.monotonic()
        if now - self._last_warning[kind] >= _LOG_EVERY_SECONDS:
            self._last_warning[kind] = now
            log.warning(event, **fields)
