"""A publish in flight: one batch of message bodies and what each step of the
publish path learns about each of its messages (``_publishing.py`` runs the steps;
``_admission.py`` holds the checking, admitting and de-duplicating ones).

Like the messages batch of Apache Iggy's server (one buffer holding the messages
and the positions of each in it), a :class:`Batch` keeps the bodies where they
arrived, in one ``bytes``, and its per-message state as *columns*: a list or a
dict per kind of fact, indexed by the message's position in the batch, a dict where
few messages have the fact (an error, an admission, a stamp). There is no object
per message: the common batch (plain messages, one partition) costs a few list
operations per message and one object for the whole batch.

The steps, in order, and what each fills in:

1. **scan** (``protocol.scan_bodies``, the constructor's argument): ``data``, ``count``,
   ``subjects``, ``starts``, ``ends`` and the marks ``special``, ``ttl_only``,
   ``headed``;
2. **check** (``_admission.check``): ``fields``, ``hvs`` and ``failed`` for the
   bodies with flags, headers or a big payload;
3. **route**: ``groups`` (partition -> its messages, in batch order), ``unrouted``,
   more ``failed``;
4. **admit** (``_admission.admit_batch``): ``admitted``, ``stamps``, rewritten
   bodies, ``any_rollup``, ``any_msg_id``, more ``failed``;
5. **dedupe** (``_admission.dedupe``) at ``now``, the broker clock read once the
   batch is admitted (the timestamp its appends are given): ``duplicates`` and
   ``fresh``;
6. **append**: ``epoch`` and either ``whole`` with ``first_offset`` (the whole batch
   went, in order, into one partition) or the ack columns (``stream_ids`` ...
   ``errors``), ``appended`` and ``rollups``;
7. the limits, rollups, republish and delivery, which read what the append wrote.

The entry points make their answer from it (``whole`` and ``first_offset``, or
:meth:`Batch.acks`; :meth:`Batch.ack_frames` for a run of requests).
"""

from __future__ import annotations

from typing import NamedTuple

import protocol as P
from protocol import BrokerError, PublishScan
from storage import AppendResult

from ._dedup import Original
from ._topics import Partition, Topic

__all__ = ["Admission", "Appended", "Batch", "RequestBatch"]

_PUBLISH = int(P.Command.PUBLISH)


class Admission(NamedTuple):
    """What the broker stores for an admitted message (``_admission.admit``); one
    is shared by every message of a batch that admission treats alike.

    Attributes:
        ttl: the effective TTL field (seconds, ``TTL_NONE`` or ``TTL_NEVER``).
        rollup: ``ROLLUP_NONE``, ``ROLLUP_SUB`` or ``ROLLUP_ALL`` (``_admission.py``).
        flags: the record flags the broker sets (``FLAG_NO_MARKER``, ``FLAG_TOMBSTONE``).
        body: the body to store when it differs from the one sent, else None.
        expected_last: the subject's last offset the publisher expects
            (``Nats-Expected-Last-Subject-Sequence``; 0 = none stored), or None.
        msg_id: the ``Nats-Msg-Id`` to de-duplicate on, or None (no header, an empty
            one, a topic with ``duplicate_window`` 0, or a republished copy).
        expects: JetStream's other compare-and-set headers, ``(Nats-Expected-Stream,
            Nats-Expected-Last-Sequence, Nats-Expected-Last-Msg-Id)`` (None where
            absent), checked by the publish path against the topic; None if none.
    """

    ttl: int
    rollup: int
    flags: int
    body: bytes | None
    expected_last: int | None = None
    msg_id: bytes | None = None
    expects: tuple[bytes | None, int | None, bytes | None] | None = None
    #: A message schedule's part (``_admission.SCHEDULE`` ...): 0 for none.
    schedule: int = 0


class Appended(NamedTuple):
    """One partition's share of a batch, as appended (the general path).

    Attributes:
        partition: where it went.
        indexes: its messages' positions in the batch, in order.
        subjects: their subjects.
        result: the append's result (records, first offset, timestamp).
        last_offsets: for a topic that republishes, each message's subject's last
            offset before it (``Partition.last_offsets``), else None.
        epoch: the group-commit epoch of the append.
    """

    partition: Partition
    indexes: list[int]
    subjects: list[bytes]
    result: AppendResult
    last_offsets: list[int] | None
    epoch: int


class Batch:
    """The messages of one publish, in the order sent, and their state (see the
    module docstring for which step fills in what).

    Args:
        data: the bytes holding the bodies.
        scan: ``protocol.scan_bodies`` of them.
        trusted: bodies the broker built itself (republished copies), whose flags,
            sizes and headers need no checking and whose ids are not de-duplicated.
    """

    __slots__ = (
        "data", "count", "subjects", "starts", "ends", "special", "ttl_only", "headed", "trusted",
        "fields", "hvs", "failed", "groups", "unrouted", "admitted", "stamps", "any_rollup", "any_msg_id", "schedules", "quiet",
        "duplicates", "fresh", "now", "epoch", "whole", "first_offset",
        "stream_ids", "topic_ids", "partitions", "offsets", "statuses", "errors", "appended", "rollups",
        "originals",
    )

    #: The bodies' bytes; bodies admission rewrote are appended at the end, their
    #: ``starts`` and ``ends`` moved there.
    data: bytes
    count: int
    subjects: list[bytes]
    starts: list[int]
    ends: list[int]
    #: Bodies with a TTL field, flags, headers or a big payload (``PublishScan``).
    special: list[int]
    #: Those marked only by a TTL field: index -> the field.
    ttl_only: dict[int, int] | None
    #: Those with a header block (no flags, a payload within the limit): index ->
    #: ``(TTL field, header block)``.
    headed: dict[int, tuple[int, bytes]] | None
    trusted: bool
    #: index -> the decoded fields of a body the check step looked into.
    fields: dict[int, P.BodyFields]
    #: index -> the values of the headers admission reads (``_admission.WANTED``).
    hvs: dict[int, dict[bytes, bytes]]
    #: index -> why the message is refused (it is neither stored nor delivered).
    failed: dict[int, BrokerError]
    #: partition -> the indexes of the messages it stores, in batch order.
    groups: dict[Partition, list[int]]
    #: Valid subjects no topic captures (acked NO_TOPIC_FOR_SUBJECT, delivered).
    unrouted: list[int]
    admitted: dict[int, Admission]
    #: index -> ``(ttl, flags)`` to write into the record as it is built (admission
    #: changed only those fields of the body).
    stamps: dict[int, tuple[int, int]]
    any_rollup: bool
    any_msg_id: bool
    #: index -> ``(topic, the original)``: a duplicate (the original stored earlier,
    #: or the index of this batch's earlier message with its id); it left its group.
    duplicates: dict[int, tuple[Topic, Original | int]] | None
    #: ``(topic, id)`` -> index: the ids to register once the batch is appended.
    fresh: dict[tuple[Topic, bytes], int] | None
    #: The broker clock when the batch was appended (ns).
    now: int
    #: The group-commit epoch the answer must wait for (0: none).
    epoch: int
    #: The partition that stored the whole batch, in order (message k at
    #: ``first_offset + k``), or None: then the ack columns hold the outcome.
    whole: Partition | None
    first_offset: int
    # The ack columns (``protocol.Acks``), filled in by the general append step.
    stream_ids: list[int]
    topic_ids: list[int]
    partitions: list[int]
    offsets: list[int]
    statuses: list[int]
    errors: dict[int, str]
    #: Each partition's share, as appended (general path).
    appended: list[Appended]
    #: ``(index, partition, offset, ROLLUP_SUB or ROLLUP_ALL)`` of each stored rollup.
    rollups: list[tuple[int, Partition, int, int]]
    #: index -> the subject as published, for the messages a topic's subject
    #: transform stores under another (``subjects`` holds the stored one; core
    #: subscribers get the message on this one), or None.
    originals: dict[int, bytes] | None
    #: The reply subject every message carries to the core subscribers: None but in
    #: a :class:`RequestBatch` (a class attribute here, so a plain publish sets nothing).
    reply: bytes | None = None

    def __init__(self, data: bytes, scan: PublishScan, trusted: bool = False) -> None:
        self.data = data
        self.subjects = subjects = scan.subjects
        self.count = len(subjects)
        self.starts = scan.starts
        self.ends = scan.ends
        self.special = scan.special
        self.ttl_only = scan.ttl_only
        self.headed = scan.headed
        self.trusted = trusted
        #: Stored without a copy to the core subscriptions (a message schedule's
        #: produced messages: nats-server stores them into the stream, it does not publish them).
        self.quiet = False
        self.fields = {}
        self.hvs = {}
        self.failed = {}
        self.groups = {}
        self.unrouted = []
        self.admitted = {}
        self.stamps = {}
        self.any_rollup = self.any_msg_id = False
        #: Stored messages admission marked as schedule messages (``_schedules.py``).
        self.schedules: list[tuple[Partition, int, bytes, int, int]] = []
        self.duplicates = self.fresh = None
        self.now = self.epoch = self.first_offset = 0
        self.whole = None
        self.originals = None

    def framed(self, counts: list[int], positions: list[int]) -> bool:
        """Read as the bodies of consecutive requests of ``counts`` messages whose
        bodies begin at ``positions``: does each request's first body begin where
        its bytes do (so no body of one request was read out of another's bytes)?"""
        starts = self.starts
        i = 0
        for count, pos in zip(counts, positions):
            if not count or starts[i] != pos:
                return False
            i += count
        return True

    def one_partition(self) -> Partition | None:
        """The partition the whole batch goes to, in order, when nothing else is
        to be done per message (nothing refused or unrouted, no rollup, no id to
        de-duplicate, no republish): the common case. Else None."""
        groups = self.groups
        if len(groups) != 1 or self.failed or self.unrouted or self.any_rollup or self.any_msg_id or self.originals:
            return None
        (part,) = groups
        return part if part.topic.republisher is None else None

    def open_acks(self) -> None:
        """Start the ack columns: every message unanswered (stream, topic,
        partition, offset and status 0)."""
        n = self.count
        self.stream_ids = [0] * n
        self.topic_ids = [0] * n
        self.partitions = [0] * n
        self.offsets = [0] * n
        self.statuses = [0] * n
        self.errors = {}

    def refuse(self, i: int, status: int, message: str) -> None:
        """Message ``i``'s ack: not stored, ``status`` with ``message``."""
        self.statuses[i] = status
        self.errors[i] = message

    # -- answers ---------------------------------------------------------------------

    def acks(self) -> P.Acks:
        """The acks of the whole batch, from the ack columns (the general path; with
        ``whole`` set, ``protocol.encode_uniform_acks`` encodes them without a
        per-message loop)."""
        return P.Acks(self.stream_ids, self.topic_ids, self.partitions, self.offsets, self.statuses, self.errors)

    def ack_frames(self, corrs: list[int], counts: list[int]) -> bytes:
        """The batch read as consecutive requests (correlation ids ``corrs``, of
        ``counts`` messages each): each one's PUBLISH response frame, joined. A
        request's acks are what it would get alone: its messages' columns, its
        errors under its own message indexes."""
        part = self.whole
        if part is not None:
            topic = part.topic
            return P.uniform_ack_frames(zip(corrs, counts), topic.stream.id, topic.id, part.number, self.first_offset)
        errors = self.errors
        out = []
        a = 0
        for corr, count in zip(corrs, counts):
            b = a + count
            errs = {i - a: e for i, e in errors.items() if a <= i < b} if errors else {}
            payload = P.Acks(
                self.stream_ids[a:b], self.topic_ids[a:b], self.partitions[a:b], self.offsets[a:b],
                self.statuses[a:b], errs,
            ).encode()
            out.append(P.encode_frame(_PUBLISH, P.FLAG_RESPONSE, corr, 0, payload))
            a = b
        return b"".join(out)


class RequestBatch(Batch):
    """The batch of a PUBLISH with a reply subject (a request): delivered with
    ``reply``, and ``reached`` counts the core subscriptions that took it (none: the
    publisher is told there are no responders, ``Publisher.request``)."""

    __slots__ = ("reply", "reached")

    def __init__(self, data: bytes, scan: PublishScan, reply: bytes) -> None:
        super().__init__(data, scan)
        self.reply = reply
        self.reached = 0
