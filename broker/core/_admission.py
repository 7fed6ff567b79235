"""Admission of one message into one topic: TTL, rollup and marker-related headers.

Only messages that the publish scan marks *special* (a TTL field, flags, headers or
a big payload) come here; plain messages go straight to storage. The checks run in
the NATS server's order (``processJetStreamMsg``; SEMANTICS 2.2) with our decisions
(SEMANTICS 10):

1. a TTL (field or ``Nats-TTL`` header) on a topic without ``allow_msg_ttl``:
   MSG_TTL_DISABLED, before the value is even looked at (decision 10.2);
2. a ``Nats-Rollup`` header on a topic without ``allow_rollup``: ROLLUP_DENIED; a
   value other than ``sub`` or ``all``: INVALID_ROLLUP;
3. an unparsable or sub-second ``Nats-TTL``: INVALID_MSG_TTL; so is a TTL field and
   a header that disagree (a client can send both; they must say the same thing);
4. the minimum-TTL rule (SEMANTICS 2.3, decision 10.8): with subject delete markers
   on and ``max_msgs_per_subject`` other than 1, a TTL below the marker TTL is raised
   to it, and a ``Nats-TTL`` header is replaced by one with the integer seconds,
   appended at the end of the header block.

Then, for a topic with a ``duplicate_window``, the message's ``Nats-Msg-Id`` is
returned for the publish path to look up (``_dedup.py``): only a message that passes
every check above can be a duplicate or register its id. A message carrying
``TTLB-Hops`` (a republished copy) registers no id.

The effective TTL is written into the record's TTL field, so storage, recovery and
the export read one field and never parse headers again. Headers are stored as sent
(or as rewritten by rule 4).
"""

from __future__ import annotations

import json
from typing import NamedTuple

from protocol import (
    FLAG_NO_MARKER,
    HOPS_HEADER,
    FLAG_TOMBSTONE,
    TTL_INVALID,
    TTL_NEVER,
    TTL_NONE,
    ErrorCode,
    error_class,
    header_values,
    parse_ttl,
    replace_header,
    restamp_body,
)

from ._dedup import MSG_ID
from ._topic_config import TopicConfig

__all__ = ["Admission", "admit", "WANTED", "SELF_CONTAINED", "ROLLUP_NONE", "ROLLUP_SUB", "ROLLUP_ALL"]

ROLLUP_NONE = 0
ROLLUP_SUB = 1
ROLLUP_ALL = 2

_TTL = b"Nats-TTL"
_ROLLUP = b"Nats-Rollup"
_KV_OP = b"KV-Operation"
_MARKER_REASON = b"Nats-Marker-Reason"
_EXPECTED_LAST = b"Nats-Expected-Last-Subject-Sequence"
_EXPECTED_STREAM = b"Nats-Expected-Stream"
_EXPECTED_SEQ = b"Nats-Expected-Last-Sequence"
_EXPECTED_MSG_ID = b"Nats-Expected-Last-Msg-Id"
_HOPS = HOPS_HEADER.encode()
_WANTED = frozenset(
    (_TTL, _ROLLUP, _KV_OP, _MARKER_REASON, _EXPECTED_LAST, MSG_ID, _HOPS, _EXPECTED_STREAM, _EXPECTED_SEQ, _EXPECTED_MSG_ID)
)
#: The headers admission reads.
WANTED = _WANTED
#: Those of them whose effect depends on nothing but the message and its topic (not
#: on what the messages before it in the same batch wrote, as a compare-and-set, a
#: rollup or a de-duplication id does): requests whose messages carry no others may
#: be joined into one batch (``_publishing.publish_frames``).
SELF_CONTAINED = frozenset((_TTL, _KV_OP, _MARKER_REASON))
_ROLLUPS = {b"sub": ROLLUP_SUB, b"all": ROLLUP_ALL}

_Disabled = error_class(ErrorCode.MSG_TTL_DISABLED)
_Invalid = error_class(ErrorCode.INVALID_MSG_TTL)
_RollupDenied = error_class(ErrorCode.ROLLUP_DENIED)
_RollupInvalid = error_class(ErrorCode.INVALID_ROLLUP)
_WrongLast = error_class(ErrorCode.WRONG_LAST_SEQUENCE)


class Admission(NamedTuple):
    """What the broker stores for an admitted message.

    Attributes:
        ttl: the effective TTL field (seconds, ``TTL_NONE`` or ``TTL_NEVER``).
        rollup: ``ROLLUP_NONE``, ``ROLLUP_SUB`` or ``ROLLUP_ALL``.
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


def admit(
    body: bytes | memoryview, field_ttl: int, block: bytes, cfg: TopicConfig, hv: dict[bytes, bytes] | None = None,
    restamp: bool = True,
) -> Admission:
    """Check one message for a topic; see the module docstring. ``field_ttl`` and
    ``block`` are the body's TTL field and header block.

    ``hv``: the values of the headers admission reads (``WANTED``), when the caller
    has them already (``checked_header_values``). ``restamp=False``: when only the
    TTL field or the flags change, ``body`` is None and the caller writes the new
    ``ttl`` and ``flags`` into the record (``build_records``'s stamps) instead of
    copying the body here.

    Raises:
        MsgTtlDisabledError, RollupDeniedError, InvalidRollupError, InvalidMsgTtlError.
    """
    if hv is None:
        hv = header_values(block, _WANTED) if block else {}
    raw_ttl = hv.get(_TTL)
    header_ttl = parse_ttl(raw_ttl) if raw_ttl else TTL_NONE
    if not cfg.allow_msg_ttl and (field_ttl != TTL_NONE or header_ttl != TTL_NONE):
        raise _Disabled("per-message TTL is disabled")
    rollup = ROLLUP_NONE
    raw_rollup = hv.get(_ROLLUP)
    if raw_rollup:
        if not cfg.allow_rollup:
            raise _RollupDenied("rollup not permitted")
        rollup = _ROLLUPS.get(raw_rollup, -1)
        if rollup < 0:
            # The server's %q: the value double-quoted, quotes and backslashes escaped.
            raise _RollupInvalid(f"rollup value invalid: {json.dumps(raw_rollup.decode(errors='replace'), ensure_ascii=False)}")
    if header_ttl == TTL_INVALID:
        raise _Invalid("invalid per-message TTL")
    if field_ttl != TTL_NONE and header_ttl != TTL_NONE and field_ttl != header_ttl:
        raise _Invalid(
            f"invalid per-message TTL: the TTL field ({_ttl_text(field_ttl)}) and the Nats-TTL header "
            f"({raw_ttl.decode(errors='replace')!r}) disagree"  # type: ignore[union-attr]
        )
    ttl = field_ttl or header_ttl
    if ttl == TTL_NONE and cfg.kv and cfg.kv.get("ttl"):
        ttl = cfg.kv["ttl"]  # a KV bucket's default TTL for a key put without one
    headers = block
    sdm = cfg.subject_delete_marker_ttl
    if sdm and ttl != TTL_NEVER and 0 < ttl < sdm and cfg.max_msgs_per_subject != 1:
        ttl = sdm
        if raw_ttl is not None:
            headers = replace_header(headers, "Nats-TTL", str(sdm))
    kv_op = hv.get(_KV_OP)
    flags = FLAG_NO_MARKER if kv_op == b"PURGE" or hv.get(_MARKER_REASON) else 0
    if kv_op in (b"DEL", b"PURGE"):
        flags |= FLAG_TOMBSTONE
    expected = None
    raw_expected = hv.get(_EXPECTED_LAST)
    if raw_expected:
        if not raw_expected.isdigit():
            raise _WrongLast(f"invalid Nats-Expected-Last-Subject-Sequence {raw_expected.decode(errors='replace')!r}")
        expected = int(raw_expected)
    expects = None
    raw_stream, raw_seq, raw_id = hv.get(_EXPECTED_STREAM), hv.get(_EXPECTED_SEQ), hv.get(_EXPECTED_MSG_ID)
    if raw_stream or raw_seq or raw_id:
        if raw_seq and not raw_seq.isdigit():
            raise _WrongLast(f"invalid Nats-Expected-Last-Sequence {raw_seq.decode(errors='replace')!r}")
        expects = (raw_stream or None, int(raw_seq) if raw_seq else None, raw_id or None)
    changed = headers is not block or (restamp and (ttl != field_ttl or flags))
    msg_id = (hv.get(MSG_ID) or None) if cfg.duplicate_window and _HOPS not in hv else None
    return Admission(
        ttl, rollup, flags, restamp_body(body, ttl, flags, headers) if changed else None, expected, msg_id, expects
    )


def _ttl_text(ttl: int) -> str:
    return "never" if ttl == TTL_NEVER else f"{ttl}s"
