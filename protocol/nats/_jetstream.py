"""JetStream's JSON, sans-IO: API responses, errors, PubAcks, and stream configs.

What the NATS listener's JetStream API (in ``broker.nats``) says on the wire,
with the NATS server's field names (``server/stream.go`` ``StreamConfig``,
``StreamInfo``, ``PubAck``; ``server/store.go`` ``StreamState``) and its numbers
(``server/errors.json``):

* :data:`NATS_ERRORS` maps each of our :class:`ErrorCode` values to the server's
  ``{code, err_code, description}``; :func:`nats_error` applies it. A fixed server
  description replaces ours; where the server's text is ``{err}`` (a reason), ours
  is the reason (our texts already follow the server's where it has one).
* :func:`stream_config_to_topic` turns a JetStream stream config into a topic's
  options, refusing what ttlbroker does not have (replicas > 1, mirrors, sources,
  work-queue and interest retention, memory storage, message limits, ...) with the
  server's error shape and a description that says so; :func:`stream_config` is the
  way back.

Durations are integer nanoseconds in JetStream's JSON and whole seconds in a
topic's options: a duration that is not a whole number of seconds is refused, never
rounded.
"""

from __future__ import annotations

import functools
import json
import re
from binascii import b2a_base64
from json.encoder import encode_basestring_ascii
from typing import Any

from .._errors import BrokerError, ErrorCode
from .._transform import SubjectTransform, TransformError
from ._json import loads as json_loads
from ._wire import decode_nats_headers, valid_nats_subject

__all__ = [
    "API_PREFIX", "ACK_PREFIX", "FC_PREFIX", "NS", "JSError", "NATS_ERRORS", "nats_error", "api_response",
    "api_error", "pub_ack", "pub_ack_format", "pub_error", "rfc3339", "stream_config_to_topic", "stream_config", "NATS_SETTINGS",
    "check_stream_name", "parse_request", "js_error", "BAD_REQUEST", "INVALID_JSON", "MSG_DELETE_FAILED",
    "MEMORY_RESOURCES_EXCEEDED",
    "NO_MESSAGE_FOUND", "PURGE_FAILED", "SEQUENCE_NOT_FOUND", "STREAM_INVALID_CONFIG", "STREAM_MISMATCH",
    "STREAM_NAME_EXIST", "STREAM_NOT_FOUND", "last_by_subj_of", "msg_get_response",
    "NATS_VERSION", "API_LEVEL", "versioned_metadata", "user_metadata", "STREAM_SEALED", "REQUIRED_API_LEVEL",
    "required_level", "api_level_refused", "STREAM_FEATURE_LEVELS", "REQUIRED_LEVEL_HEADER", "nats_hash",
    "source_info",
]

#: The nats-server version the NATS listener reports (INFO, ``_nats.ver``): the first
#: release with API level 2, whose features (per-message TTLs and markers, priority
#: groups and pausing; message schedules) ttlbroker has, but for those it refuses
#: (ADR-49 counters, ADR-50 atomic batches: ``docs/semantics.md``).
NATS_VERSION = "2.12.0"
#: The JetStream API level reported (ADR-44): ``$JS.API.INFO``'s ``api.level``,
#: ``_nats.level``, and the highest ``Nats-Required-Api-Level`` a request may ask for.
API_LEVEL = 2
#: ADR-44: the API level a stream needs for each feature it uses, by the stream
#: config field that turns it on (any value but off), as nats-server's
#: ``setStaticStreamMetadata``: one line per feature.
STREAM_FEATURE_LEVELS: dict[str, int] = {
    "allow_msg_ttl": 1,
    "subject_delete_marker_ttl": 1,
    "allow_msg_schedules": 2,
}
#: The request header that asks for a minimum API level (nats-server's
#: ``JSRequiredApiLevel``).
REQUIRED_LEVEL_HEADER = "Nats-Required-Api-Level"
#: ADR-44's metadata keys, the server's own: the level an asset requires (stored
#: with it), and the server's version and level (added to every answer).
_REQUIRED_LEVEL, _SERVER_VERSION, _SERVER_LEVEL = "_nats.req.level", "_nats.ver", "_nats.level"


def user_metadata(meta: dict[str, str] | None) -> dict[str, str]:
    """A stream's or consumer's ``metadata`` as the client sent it, without the
    server's versioning keys (a config read back from an info and sent again has
    them; nats-server sets them itself)."""
    if not meta:
        return {}
    return {k: v for k, v in meta.items() if k not in (_REQUIRED_LEVEL, _SERVER_VERSION, _SERVER_LEVEL)}


def versioned_metadata(meta: dict[str, str] | None, required_level: int) -> dict[str, str]:
    """The ``metadata`` an info reports, as nats-server's ``setStaticStreamMetadata``
    and ``setDynamicStreamMetadata`` (and their consumer twins) make it: the
    client's keys, the API level the asset's features require, and this server's
    version and API level."""
    return {
        **user_metadata(meta), _REQUIRED_LEVEL: str(required_level), _SERVER_VERSION: NATS_VERSION,
        _SERVER_LEVEL: str(API_LEVEL),
    }

def required_level(cfg: dict[str, Any]) -> int:
    """The API level a stream config (as :func:`stream_config` renders it) requires."""
    return max((level for key, level in STREAM_FEATURE_LEVELS.items() if cfg.get(key)), default=0)


def api_level_refused(headers: bytes | None) -> bool:
    """Does a request's NATS header block carry a ``Nats-Required-Api-Level`` above
    :data:`API_LEVEL`, or one that is not an integer (nats-server's
    ``errorOnRequiredApiLevel``: both are refused)? A block that does not parse asks
    for nothing."""
    if not headers or REQUIRED_LEVEL_HEADER.encode() not in headers:
        return False
    try:
        _, _, pairs = decode_nats_headers(headers)
    except BrokerError:
        return False
    value = next((v for k, v in pairs if k == REQUIRED_LEVEL_HEADER), "")
    if not value:
        return False
    try:
        return int(value) > API_LEVEL
    except ValueError:
        return True


API_PREFIX = "$JS.API."
ACK_PREFIX = "$JS.ACK."
FC_PREFIX = "$JS.FC."
NS = 1_000_000_000


class JSError(Exception):
    """A JetStream API error with the server's numbers.

    Attributes:
        code: the HTTP-like status (400, 404, 500, 503).
        err_code: the server's ``err_code`` (``10059`` = stream not found).
        description: the text.
    """

    def __init__(self, code: int, err_code: int, description: str) -> None:
        super().__init__(description)
        self.code = code
        self.err_code = err_code
        self.description = description

    def as_json(self) -> dict[str, Any]:
        return {"code": self.code, "err_code": self.err_code, "description": self.description}

    def __repr__(self) -> str:
        return f"JSError({self.code}, {self.err_code}, {self.description!r})"


# The server's errors by name (errors.json), for the refusals built here and in the
# API module: (code, err_code, fixed description or None for "{err}").
STREAM_NOT_FOUND = (404, 10059, "stream not found")
STREAM_NAME_EXIST = (400, 10058, "stream name already in use with a different configuration")
STREAM_INVALID_CONFIG = (500, 10052, None)
STREAM_REPLICAS_NOT_SUPPORTED = (500, 10074, "replicas > 1 not supported in non-clustered mode")
REPLICAS_NEGATIVE = (400, 10133, "replicas count cannot be negative")
STREAM_MISMATCH = (400, 10056, "stream name in subject does not match request")
STREAM_NAME_PATH_SEPARATORS = (400, 10128, "Stream name can not contain path separators")
NO_MESSAGE_FOUND = (404, 10037, "no message found")
BAD_REQUEST = (400, 10003, "bad request")
INVALID_JSON = (400, 10025, None)  # "invalid JSON: {err}"
MSG_DELETE_FAILED = (500, 10057, None)
SEQUENCE_NOT_FOUND = (400, 10043, None)  # "sequence {seq} not found"
PURGE_FAILED = (500, 10110, None)
STREAM_NOT_MATCH = (400, 10060, "expected stream does not match")
WRONG_LAST_MSG_ID = (400, 10070, None)  # "wrong last msg ID: {id}"
STORE_FAILED = (503, 10077, None)
NOT_EMPTY_REQUEST = (400, 10038, "expected an empty request payload")
MEMORY_RESOURCES_EXCEEDED = (500, 10028, "insufficient memory resources available")
STREAM_SEALED = (400, 10109, "invalid operation on sealed stream")
REQUIRED_API_LEVEL = (412, 10185, "JetStream minimum api level required")
TRANSFORM_INVALID_SOURCE = (400, 10155, None)  # "stream transform source: {err}"
TRANSFORM_INVALID_DESTINATION = (400, 10156, None)  # "stream transform: {err}"
PEDANTIC = (400, 10157, None)  # "pedantic mode: {err}"


def js_error(entry: tuple[int, int, str | None], reason: str = "") -> JSError:
    code, err_code, fixed = entry
    return JSError(code, err_code, fixed if fixed is not None else reason)


#: Our error codes as the server reports the same condition: (code, err_code,
#: fixed description or None = our message, which is the server's reason text).
NATS_ERRORS: dict[ErrorCode, tuple[int, int, str | None]] = {
    ErrorCode.STREAM_NOT_FOUND: STREAM_NOT_FOUND,
    ErrorCode.TOPIC_NOT_FOUND: STREAM_NOT_FOUND,
    ErrorCode.TOPIC_NAME_EXISTS: STREAM_NAME_EXIST,
    ErrorCode.INVALID_TOPIC_CONFIG: STREAM_INVALID_CONFIG,
    ErrorCode.INVALID_OPTIONS: STREAM_INVALID_CONFIG,
    ErrorCode.INVALID_NAME: STREAM_INVALID_CONFIG,
    ErrorCode.INVALID_PARTITIONS_COUNT: STREAM_INVALID_CONFIG,
    ErrorCode.INVALID_SUBJECT_FILTER: STREAM_INVALID_CONFIG,
    ErrorCode.REPUBLISH_CYCLE: STREAM_INVALID_CONFIG,
    ErrorCode.INVALID_TRANSFORM: STREAM_INVALID_CONFIG,
    ErrorCode.PEDANTIC: PEDANTIC,  # "pedantic mode: {err}" (ours carries the prefix)
    ErrorCode.SUBJECTS_OVERLAP: (400, 10065, "subjects overlap with an existing stream"),
    ErrorCode.MESSAGE_NOT_FOUND: NO_MESSAGE_FOUND,
    ErrorCode.PARTITION_NOT_FOUND: NO_MESSAGE_FOUND,
    ErrorCode.WRONG_LAST_SEQUENCE: (400, 10071, None),  # "wrong last sequence: {seq}"
    ErrorCode.WRONG_EXPECTED_STREAM: STREAM_NOT_MATCH,
    ErrorCode.WRONG_LAST_MSG_ID: WRONG_LAST_MSG_ID,  # "wrong last msg ID: {id}"
    ErrorCode.MSG_TTL_DISABLED: (400, 10166, "per-message TTL is disabled"),
    ErrorCode.INVALID_MSG_TTL: (400, 10165, "invalid per-message TTL"),
    ErrorCode.ROLLUP_DENIED: (500, 10111, None),  # "rollup not permitted"
    ErrorCode.INVALID_ROLLUP: (500, 10111, None),  # "rollup value invalid: ..."
    ErrorCode.PAYLOAD_TOO_LARGE: (400, 10054, "message size exceeds maximum allowed"),
    ErrorCode.PURGE_DENIED: PURGE_FAILED,
    ErrorCode.MALFORMED_PAYLOAD: BAD_REQUEST,
    ErrorCode.STORAGE_FAILURE: STORE_FAILED,
    ErrorCode.CORRUPTED_RECORD: STORE_FAILED,  # our message, naming the damaged record (docs/semantics.md §18.31)
    ErrorCode.MEMORY_STORAGE_FULL: (503, 10023, "insufficient resources"),  # JSInsufficientResourcesErr
    ErrorCode.SHUTTING_DOWN: STORE_FAILED,
    ErrorCode.NO_TOPIC_FOR_SUBJECT: STORE_FAILED,
    ErrorCode.CONSUMER_NOT_FOUND: (404, 10014, "consumer not found"),
    ErrorCode.CONSUMER_EXISTS: (400, 10148, "consumer already exists"),
    ErrorCode.CONSUMER_FILTERS_OVERLAP: (400, 10138, "consumer subject filters cannot overlap"),
    ErrorCode.INVALID_CONSUMER_CONFIG: (500, 10012, None),  # JSConsumerCreateErrF "{err}"
    ErrorCode.CONSUMER_UPDATE_DENIED: (500, 10012, None),
    ErrorCode.SCHEDULES_DISABLED: (400, 10188, "message schedules is disabled"),
    ErrorCode.INVALID_SCHEDULE_PATTERN: (400, 10189, "message schedules pattern is invalid"),
    ErrorCode.INVALID_SCHEDULE_TARGET: (400, 10190, "message schedules target is invalid"),
    ErrorCode.INVALID_SCHEDULE_TTL: (400, 10191, "message schedules invalid per-message TTL"),
    ErrorCode.INVALID_SCHEDULE_ROLLUP: (400, 10192, "message schedules invalid rollup"),
    ErrorCode.INVALID_SCHEDULE_SOURCE: (400, 10203, "message schedules source is invalid"),
    ErrorCode.INVALID_SCHEDULER: (400, 10212, "message schedules invalid scheduler"),
    ErrorCode.INVALID_SCHEDULE_TIME_ZONE: (400, 10223, "message schedules time zone is invalid"),
    ErrorCode.TOPIC_SEALED: STREAM_SEALED,
    ErrorCode.MSG_COUNTER_DISABLED: (400, 10168, "message counters is disabled"),
    ErrorCode.ATOMIC_PUBLISH_DISABLED: (400, 10174, "atomic publish is disabled"),
    ErrorCode.MAX_MSGS_EXCEEDED: (503, 10077, "maximum messages exceeded"),
    ErrorCode.MAX_BYTES_EXCEEDED: (503, 10077, "maximum bytes exceeded"),
    ErrorCode.MAX_MSGS_PER_SUBJECT_EXCEEDED: (503, 10077, "maximum messages per subject exceeded"),
    ErrorCode.MESSAGE_TOO_LARGE: (400, 10054, "message size exceeds maximum allowed"),
    ErrorCode.MAX_CONSUMERS_REACHED: (400, 10026, "maximum consumers limit reached"),
    ErrorCode.MIRROR_WITH_SUBJECTS: (400, 10034, "stream mirrors can not contain subjects"),
    ErrorCode.MIRROR_WITH_SOURCES: (400, 10031, "stream mirrors can not also contain other sources"),
    ErrorCode.MIRROR_NOT_UPDATABLE: (400, 10055, "stream mirror configuration can not be updated"),
    ErrorCode.MIRROR_WITH_FIRST_SEQ: (400, 10143, "stream mirrors can not have first sequence configured"),
    ErrorCode.INVALID_MIRROR: (400, 10142, None),  # the number by the description: _COPY_ERRORS
    ErrorCode.INVALID_SOURCE: (400, 10141, None),
    ErrorCode.ORIGIN_NOT_COPYABLE: STREAM_INVALID_CONFIG,
    ErrorCode.UNKNOWN_DOMAIN: STREAM_INVALID_CONFIG,
    ErrorCode.INVALID_EXTERNAL_API: STREAM_INVALID_CONFIG,
}

#: INVALID_MIRROR and INVALID_SOURCE stand for several of the server's errors: the
#: description (the server's own text, or its prefix before the reason) picks the number.
_COPY_ERRORS: dict[str, int] = {
    "mirrored stream name is invalid": 10142,
    "stream mirrors can not have both start seq and start time configured": 10032,
    "mirror with multiple subject transforms cannot also have a single subject filter": 10150,
    "mirror transform source: ": 10151,
    "mirror subject filters can not overlap": 10152,
    "mirror transform: ": 10154,
    "stream mirror must have max message size >= source": 10030,
    "stream mirrors can not also schedule messages": 10186,
    "sourced stream name is invalid": 10141,
    "duplicate source configuration detected": 10140,
    "source with multiple subject transforms cannot also have a single subject filter": 10144,
    "source transform source: ": 10145,
    "source transform: ": 10146,
    "source filters can not overlap": 10147,
    "stream source must have max message size >= target": 10046,
    "stream source can not also schedule messages": 10187,
}


_HASH_DIGITS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def nats_hash(name: str, size: int = 8) -> str:
    """nats-server's ``getHash``: the first ``size`` bytes of SHA-256, each as one of 62 digits."""
    import hashlib

    digest = hashlib.sha256(name.encode()).digest()
    return "".join(_HASH_DIGITS[b % 62] for b in digest[:size])


def nats_error(err: BrokerError | JSError) -> JSError:
    """The server's error for one of ours (a code without an entry: 400 10003 with our
    message as the description)."""
    if isinstance(err, JSError):
        return err
    code, err_code, fixed = NATS_ERRORS.get(err.code, (400, 10003, None))
    if err.code in (ErrorCode.INVALID_MIRROR, ErrorCode.INVALID_SOURCE):
        err_code = next((n for text, n in _COPY_ERRORS.items() if err.message.startswith(text)), err_code)
    return JSError(code, err_code, fixed if fixed is not None else err.message)


def parse_request(payload: bytes) -> dict[str, Any]:
    """An API request's JSON object (an empty payload is ``{}``).

    Raises:
        JSError: 400 10025 ``invalid JSON: ...`` for anything but a JSON object.
    """
    m = _ONE_STRING.fullmatch(payload)
    if m is not None:  # {"last_by_subj": "..."}: a KV get of nats-py, and the like
        try:
            return {m.group(1).decode(): m.group(2).decode()}
        except UnicodeDecodeError:
            pass  # json.loads says what is wrong
    if not payload.strip():
        return {}
    try:
        req = json_loads(payload)
    except ValueError as exc:  # a nesting too deep too: "invalid JSON: exceeded max depth", as nats-server
        raise js_error(INVALID_JSON, f"invalid JSON: {exc}") from None
    if not isinstance(req, dict):
        raise js_error(INVALID_JSON, "invalid JSON: the request must be an object")
    return req


def last_by_subj_of(payload: bytes) -> str | None:
    """The subject of a request :func:`parse_request` reads as exactly
    ``{"last_by_subj": <subject>}`` from its one-member form (nats-py's KV get),
    or None for any other request."""
    m = _ONE_STRING.fullmatch(payload)
    if m is None or m.group(1) != b"last_by_subj":
        return None
    try:
        return m.group(2).decode()
    except UnicodeDecodeError:
        return None


#: A JSON object of one string member whose name and value need no unescaping
#: (JSON's whitespace only: space, tab, LF, CR): what ``json.loads`` gives for it is
#: the two texts, read without the decoder's layers.
_ONE_STRING = re.compile(rb'[ \t\n\r]*\{[ \t\n\r]*"([a-z_]+)"[ \t\n\r]*:[ \t\n\r]*"([^"\\\x00-\x1f]*)"[ \t\n\r]*\}[ \t\n\r]*')


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def api_response(kind: str, body: dict[str, Any]) -> bytes:
    """``{"type": "io.nats.jetstream.api.v1.<kind>_response", ...body}``."""
    return _dumps({"type": f"io.nats.jetstream.api.v1.{kind}_response", **body})


def msg_get_response(subject: str, seq: int, headers: bytes | None, payload: bytes | memoryview, time: str) -> bytes:
    """``STREAM.MSG.GET``'s answer, byte for byte what :func:`api_response` gives for
    ``{"message": {"subject", "seq", "hdrs" (when any), "data" (when any), "time"}}``,
    without building and encoding the dictionaries."""
    if payload and not headers:  # a KV value: one formatting
        return b'%s%s,"seq":%d,"data":"%s","time":%s}}' % (
            _MSG_GET_HEAD, encode_basestring_ascii(subject).encode(), seq, b2a_base64(payload, newline=False),
            encode_basestring_ascii(time).encode(),
        )
    out = [_MSG_GET_HEAD, encode_basestring_ascii(subject).encode(), b',"seq":%d' % seq]
    if headers:
        out += [b',"hdrs":"', b2a_base64(headers, newline=False), b'"']  # base64.b64encode's own call
    if payload:
        out += [b',"data":"', b2a_base64(payload, newline=False), b'"']
    out += [b',"time":', encode_basestring_ascii(time).encode(), b"}}"]
    return b"".join(out)


_MSG_GET_HEAD = b'{"type":"io.nats.jetstream.api.v1.stream_msg_get_response","message":{"subject":'


#: The paged responses (the server's ``ApiPaged``, whose fields have no
#: ``omitempty``): what their error responses carry after the error.
_PAGED_ERROR_TAIL: dict[str, dict[str, Any]] = {
    "stream_info": {},
    "stream_names": {"streams": None},
    "stream_list": {"streams": []},
    "consumer_names": {"consumers": []},
    "consumer_list": {"consumers": []},
}


def api_error(kind: str, err: BrokerError | JSError) -> bytes:
    """The API's error response: ``{"type": ..., "error": {code, err_code,
    description}}``, then, for a paged response, ``total``, ``offset`` and ``limit``
    at 0 and its empty list, as the server writes them."""
    body: dict[str, Any] = {"error": nats_error(err).as_json()}
    tail = _PAGED_ERROR_TAIL.get(kind)
    if tail is not None:
        body.update(total=0, offset=0, limit=0, **tail)
    return api_response(kind, body)


def pub_ack(stream: str, seq: int, duplicate: bool = False) -> bytes:
    """A PubAck: ``{"stream": .., "seq": ..}`` plus ``"duplicate": true`` for a
    de-duplicated publish (the server's ``omitempty``), from the stream's cached
    prefix."""
    if duplicate:
        return _pub_ack_prefix(stream) + b'%d,"duplicate":true}' % seq
    return pub_ack_format(stream) % seq


@functools.lru_cache(maxsize=1024)
def _pub_ack_prefix(stream: str) -> bytes:
    return b'{"stream":' + _dumps(stream) + b',"seq":'


@functools.lru_cache(maxsize=1024)
def pub_ack_format(stream: str) -> bytes:
    """:func:`pub_ack` of a stream as a format: ``pub_ack_format(stream) % seq``
    is ``pub_ack(stream, seq)`` in one step (the PubAcks of a group commit)."""
    return _pub_ack_prefix(stream).replace(b"%", b"%%") + b"%d}"


def pub_error(err: BrokerError | JSError, stream: str | None = None) -> bytes:
    """A refused publish: ``{"error": {..}, "stream": .., "seq": 0}`` (stream and seq
    only when the message reached a stream, as the server's ``JSPubAckResponse``)."""
    body: dict[str, Any] = {"error": nats_error(err).as_json()}
    if stream is not None:
        body["stream"] = stream
        body["seq"] = 0
    return _dumps(body)


def rfc3339(ns: int) -> str:
    """Go's ``time.Time`` JSON (UTC, nanoseconds, trailing zeros trimmed); 0 is Go's
    zero time ``0001-01-01T00:00:00Z``, which the server reports for an empty stream."""
    if ns <= 0:
        return "0001-01-01T00:00:00Z"
    secs, frac = divmod(ns, NS)
    text = _civil_seconds(secs)
    if frac:
        text += "." + f"{frac:09d}".rstrip("0")
    return text + "Z"


@functools.lru_cache(maxsize=256)
def _civil_seconds(secs: int) -> str:
    """``YYYY-MM-DDTHH:MM:SS`` (UTC) of seconds since the epoch: messages stored
    close together share it."""
    days, rem = divmod(secs, 86400)
    # Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    y = yoe + era * 400 + (1 if m <= 2 else 0)
    hh, rem = divmod(rem, 3600)
    mm, ss = divmod(rem, 60)
    return f"{y:04d}-{m:02d}-{d:02d}T{hh:02d}:{mm:02d}:{ss:02d}"


# -- stream configs ----------------------------------------------------------------

#: What a NATS stream has that a topic's options do not: kept in the topic's ``nats``
#: option and shown back in the stream config. ``deny_delete`` is enforced by the
#: NATS API's MSG.DELETE (a topic's ``deny_purge`` refuses deletes everywhere).
NATS_SETTINGS: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "description": (str,),
    "deny_delete": (bool,),
    "allow_direct": (bool,),
    "mirror_direct": (bool,),
    "metadata": (dict,),
}

_PATH_SEPARATORS = "/\\"
_NOT_IN_NAMES = " \t\r\n\f.*>"


def check_stream_name(name: Any) -> str:
    """The server's stream-name rules (``isValidName``, path separators)."""
    if not isinstance(name, str) or not name:
        raise js_error(STREAM_INVALID_CONFIG, "stream name is required")
    if any(c in _PATH_SEPARATORS for c in name):
        raise js_error(STREAM_NAME_PATH_SEPARATORS)
    if any(c in _NOT_IN_NAMES for c in name):
        raise js_error(STREAM_INVALID_CONFIG, "stream name can not contain whitespace, '.', '*' or '>'")
    return name


def _refuse(what: str) -> JSError:
    return js_error(STREAM_INVALID_CONFIG, f"{what} is not supported by ttlbroker")


def _seconds(cfg: dict[str, Any], key: str) -> int:
    """A duration field (ns) as whole seconds; refuses fractions and non-integers."""
    v = cfg.get(key) or 0
    if not isinstance(v, int) or isinstance(v, bool):
        raise js_error(INVALID_JSON, f"invalid JSON: {key} must be an integer of nanoseconds")
    if v < 0:
        return -1
    if v % NS:
        raise js_error(
            STREAM_INVALID_CONFIG, f"{key} must be a whole number of seconds in ttlbroker, not {v} ns"
        )
    return v // NS


# Fields the server has and ttlbroker accepts only at their "off" value: key ->
# (values accepted, the refusal's wording).
_OFF_ONLY: dict[str, tuple[tuple[Any, ...], str]] = {
    "no_ack": ((False, None), "no_ack"),
    "placement": ((None, {}), "placement"),
    "compression": (("none", "", None), "compression {v!r}"),
    "allow_msg_counter": ((False, None), "allow_msg_counter (ADR-49 message counters)"),
    "allow_atomic": ((False, None), "allow_atomic (ADR-50 atomic batch publishing)"),
    "allow_batched": ((False, None), "allow_batched (batch publishing)"),
    "persist_mode": (("default", "", None), "persist_mode {v!r}"),
    "consumer_limits": ((None, {}), "consumer_limits"),
    "template_owner": ((None, ""), "template_owner"),
}
_MAPPED = {
    "name", "description", "subjects", "max_age", "max_msgs_per_subject", "discard", "num_replicas", "duplicate_window",
    "deny_delete", "deny_purge", "allow_rollup_hdrs", "republish", "allow_direct", "allow_msg_ttl",
    "subject_delete_marker_ttl", "metadata", "retention", "storage", "subject_transform", "first_seq", "sealed",
    "allow_msg_schedules",
    "max_msgs", "max_bytes", "max_msg_size", "max_consumers", "discard_new_per_subject", "mirror", "sources",
    "mirror_direct",
}


#: The server's limit fields: -1 (and 0, and a missing one) is unlimited, which a
#: topic's option says with 0; below -1 the server sets -1, or refuses in pedantic
#: mode (``checkStreamCfg``). ``max_msg_size`` is a Go ``int32``.
_LIMIT_FIELDS = ("max_msgs", "max_bytes", "max_msg_size", "max_consumers")


def _limit(cfg: dict[str, Any], key: str, pedantic: bool) -> int:
    v = cfg.get(key)
    if v is None:
        return 0
    if not isinstance(v, int) or isinstance(v, bool):
        raise js_error(INVALID_JSON, f"invalid JSON: {key} must be an integer")
    bits = 32 if key == "max_msg_size" else 64
    if not -(2 ** (bits - 1)) <= v < 2 ** (bits - 1):
        raise js_error(
            INVALID_JSON,
            f"invalid JSON: json: cannot unmarshal number {v} into Go struct field StreamConfig.{key} of type int{bits}",
        )
    if v < -1 and pedantic:
        raise js_error(PEDANTIC, f"pedantic mode: {key} must be set to -1")
    return v if v > 0 else 0


def stream_config_to_topic(cfg: dict[str, Any], pedantic: bool = False) -> tuple[dict[str, Any], int]:
    """A JetStream stream config as a topic's options and its max age in seconds
    (0 = none). Raises :class:`JSError` for what ttlbroker does not have, with the
    server's error numbers (``num_replicas`` > 1: 10074; the rest: 10052 naming the
    field), and for the server's own rules that we check here (max age >= 100 ms,
    marker TTL >= 1 s); the topic rules (``broker.core``, ``_topic_config.resolve``) do
    the rest."""
    if not isinstance(cfg, dict):
        raise js_error(INVALID_JSON, "invalid JSON: the stream config must be an object")
    name = check_stream_name(cfg.get("name"))
    replicas = cfg.get("num_replicas") or 1
    if not isinstance(replicas, int) or isinstance(replicas, bool):
        raise js_error(INVALID_JSON, "invalid JSON: num_replicas must be an integer")
    if replicas < 0:
        raise js_error(REPLICAS_NEGATIVE)
    if replicas > 1:
        raise js_error(STREAM_REPLICAS_NOT_SUPPORTED)
    for key, (accepted, what) in _OFF_ONLY.items():
        v = cfg.get(key)
        if v not in accepted:
            raise _refuse(what.format(v=v))
    for key, v in cfg.items():
        if key not in _MAPPED and key not in _OFF_ONLY and v not in (None, False, 0, "", [], {}):
            raise _refuse(f"stream config field {key!r}")
    raw_age = cfg.get("max_age") or 0
    if isinstance(raw_age, int) and 0 < raw_age < NS // 10:
        raise js_error(STREAM_INVALID_CONFIG, "max age needs to be >= 100ms")
    max_age = _seconds(cfg, "max_age")
    if max_age < 0:
        raise js_error(STREAM_INVALID_CONFIG, "max age can not be negative")
    sdm_raw = cfg.get("subject_delete_marker_ttl") or 0
    if isinstance(sdm_raw, int) and not isinstance(sdm_raw, bool):
        if sdm_raw < 0:
            raise js_error(STREAM_INVALID_CONFIG, "subject delete marker TTL must not be negative")
        if 0 < sdm_raw < NS:
            raise js_error(STREAM_INVALID_CONFIG, "subject delete marker TTL must be at least 1 second")
    sdm = _seconds(cfg, "subject_delete_marker_ttl")
    window = _seconds(cfg, "duplicate_window")
    if window < 0:
        raise js_error(STREAM_INVALID_CONFIG, "duplicates window can not be negative")
    per_subject = cfg.get("max_msgs_per_subject")
    if per_subject is None or per_subject == -1:
        per_subject = 0
    if not isinstance(per_subject, int) or isinstance(per_subject, bool) or per_subject < 0:
        raise js_error(STREAM_INVALID_CONFIG, f"max_msgs_per_subject must be -1 or more, not {per_subject!r}")
    retention = cfg.get("retention") or "limits"
    if retention not in ("limits", "workqueue", "interest"):
        raise js_error(INVALID_JSON, f"invalid JSON: can not unmarshal {retention!r} into RetentionPolicy")
    storage = cfg.get("storage") or "file"
    if storage not in ("file", "memory"):
        raise js_error(INVALID_JSON, f"invalid JSON: can not unmarshal {storage!r} into StorageType")
    discard = cfg.get("discard") or "old"
    if discard not in ("old", "new"):
        raise js_error(INVALID_JSON, f"invalid JSON: can not unmarshal {discard!r} into DiscardPolicy")
    mirror, sources = cfg.get("mirror") or None, cfg.get("sources") or None
    subjects = cfg.get("subjects") or ([] if mirror or sources else [name])
    if not isinstance(subjects, list) or not all(isinstance(s, str) for s in subjects):
        raise js_error(INVALID_JSON, "invalid JSON: subjects must be a list of strings")
    nats: dict[str, Any] = {"name": name}
    if cfg.get("description"):
        nats["description"] = cfg["description"]
    if cfg.get("metadata"):
        if not isinstance(cfg["metadata"], dict):
            raise js_error(INVALID_JSON, "invalid JSON: metadata must be dict")
        meta = user_metadata(cfg["metadata"])
        if meta:
            nats["metadata"] = meta
    for key in ("deny_delete", "allow_direct"):
        nats[key] = bool(cfg.get(key))
    if cfg.get("mirror"):
        nats["mirror_direct"] = bool(cfg.get("mirror_direct"))
    for key, types in NATS_SETTINGS.items():
        if key in nats and not isinstance(nats[key], types):
            raise js_error(INVALID_JSON, f"invalid JSON: {key} must be {types[0].__name__}")
    options: dict[str, Any] = {
        "subjects": list(subjects),
        "max_msgs_per_subject": per_subject,
        "deny_purge": bool(cfg.get("deny_purge")),
        "allow_rollup": bool(cfg.get("allow_rollup_hdrs")),
        "allow_msg_ttl": bool(cfg.get("allow_msg_ttl")),
        "subject_delete_marker_ttl": sdm,
        "retention": retention,
        "nats": nats,
        "allow_msg_schedules": bool(cfg.get("allow_msg_schedules")),
        "storage": storage,
        "discard": discard,
        "discard_new_per_subject": bool(cfg.get("discard_new_per_subject")),
        **{key: _limit(cfg, key, pedantic) for key in _LIMIT_FIELDS},
    }
    if window:
        options["duplicate_window"] = window
    rp = cfg.get("republish")
    if rp:
        if not isinstance(rp, dict):
            raise js_error(INVALID_JSON, "invalid JSON: republish must be an object")
        options["republish"] = {k: rp[k] for k in ("src", "dest", "headers_only") if k in rp}
    st = cfg.get("subject_transform")
    if st is not None:
        options["subject_transform"] = _subject_transform(st)
    first_seq = cfg.get("first_seq") or 0
    if not isinstance(first_seq, int) or isinstance(first_seq, bool) or not 0 <= first_seq < 2**64:
        raise js_error(INVALID_JSON, "invalid JSON: first_seq must be an unsigned integer")
    options["first_seq"] = first_seq
    options["sealed"] = _flag(cfg, "sealed")
    options["mirror"] = _copy_of(mirror, "mirror") if mirror else None
    if sources is not None and not isinstance(sources, list):
        raise js_error(INVALID_JSON, "invalid JSON: sources must be a list of objects")
    options["sources"] = [_copy_of(s, "sources") for s in sources] if sources else None
    return options, max_age


def _copy_of(src: Any, what: str) -> dict[str, Any]:
    """A ``StreamSource`` as a topic's copy option: the server's keys, only those set
    (its ``omitempty``); ``subject_transforms`` as ``{src, dest}``. A ``consumer``
    (a durable sourcing consumer) is refused: ttlbroker's copies keep no consumer."""
    if not isinstance(src, dict):
        raise js_error(INVALID_JSON, f"invalid JSON: {what} must be an object")
    if src.get("consumer"):
        raise _refuse(f"{what} consumer")
    out: dict[str, Any] = {"name": src.get("name") if isinstance(src.get("name"), str) else ""}
    for key in ("opt_start_seq", "opt_start_time", "filter_subject", "external", "domain"):
        if src.get(key) not in (None, "", 0, {}):
            out[key] = src[key]
    trs = src.get("subject_transforms")
    if trs:
        if not isinstance(trs, list) or not all(isinstance(t, dict) for t in trs):
            raise js_error(INVALID_JSON, f"invalid JSON: {what} subject_transforms must be a list of objects")
        out["subject_transforms"] = [{"src": t.get("src", ""), "dest": t.get("dest", "")} for t in trs]
    return out


def _copy_config(copy: dict[str, Any]) -> dict[str, Any]:
    """A copy option as the server's ``StreamSource`` JSON."""
    out: dict[str, Any] = {"name": copy.get("name", "")}
    for key in ("opt_start_seq", "opt_start_time", "filter_subject"):
        if copy.get(key):
            out[key] = copy[key]
    if copy.get("subject_transforms"):
        out["subject_transforms"] = [{"src": t.get("src", ""), "dest": t.get("dest", "")} for t in copy["subject_transforms"]]
    if copy.get("external") is not None:
        ext = copy["external"]
        out["external"] = {"api": ext.get("api", ""), "deliver": ext.get("deliver", "")}
    if copy.get("domain"):
        out["domain"] = copy["domain"]
    return out


def source_info(
    copy: dict[str, Any], lag: int, active_ns: int, error: tuple[int, int, str] | None,
) -> dict[str, Any]:
    """nats-server's ``StreamSourceInfo`` of one copy (``sourceInfo``): ``active`` is
    ns since the origin was last heard from, -1 for never; ``subject_transforms``
    lists the transforms (or, with none, none)."""
    out: dict[str, Any] = {"name": copy.get("name", "")}
    if copy.get("external") is not None:
        ext = copy["external"]
        out["external"] = {"api": ext.get("api", ""), "deliver": ext.get("deliver", "")}
    out["lag"] = lag
    out["active"] = active_ns
    if error is not None:
        out["error"] = {"code": error[0], "err_code": error[1], "description": error[2]}
    if copy.get("filter_subject"):
        out["filter_subject"] = copy["filter_subject"]
    if copy.get("subject_transforms"):
        out["subject_transforms"] = [{"src": t.get("src", ""), "dest": t.get("dest", "")} for t in copy["subject_transforms"]]
    return out


def _flag(cfg: dict[str, Any], key: str) -> bool:
    v = cfg.get(key)
    if v is not None and not isinstance(v, bool):
        raise js_error(INVALID_JSON, f"invalid JSON: {key} must be a boolean")
    return bool(v)


def _subject_transform(st: Any) -> dict[str, str]:
    """A stream's ``subject_transform`` checked as nats-server's ``checkStreamCfg``
    checks it: a ``src`` that is not a valid subject is 10155, a ``dest`` that is not
    a valid transform of it 10156, in the server's words. An empty ``dest`` is no
    transform (kept and reported as given)."""
    if not isinstance(st, dict) or not all(isinstance(st.get(k, ""), str) for k in ("src", "dest")):
        raise js_error(INVALID_JSON, "invalid JSON: subject_transform must be an object of strings src and dest")
    src, dest = st.get("src", ""), st.get("dest", "")
    if src and not valid_nats_subject(src, wildcards=True):
        raise js_error(TRANSFORM_INVALID_SOURCE, f"stream transform source: invalid subject {src}")
    if dest:
        try:
            SubjectTransform(src, dest)
        except TransformError as err:
            raise js_error(TRANSFORM_INVALID_DESTINATION, f"stream transform: {err}") from None
    return {"src": src, "dest": dest}


def stream_config(options: dict[str, Any], max_age: int, fallback_name: str) -> dict[str, Any]:
    """A topic's options (``TopicConfig.options()``) and max age (seconds) as the
    JetStream stream config the server would report."""
    nats = options.get("nats") or {}
    out: dict[str, Any] = {"name": nats.get("name", fallback_name)}
    if nats.get("description"):
        out["description"] = nats["description"]
    out.update(
        subjects=list(options["subjects"]),
        retention=options.get("retention", "limits"),
        max_consumers=options.get("max_consumers") or -1,
        max_msgs=options.get("max_msgs") or -1,
        max_bytes=options.get("max_bytes") or -1,
        max_age=max_age * NS,
        max_msgs_per_subject=options["max_msgs_per_subject"] or -1,
        max_msg_size=options.get("max_msg_size") or -1,
        discard=options.get("discard", "old"),
        storage=options.get("storage", "file"),
        num_replicas=1,
        **({"first_seq": options["first_seq"]} if options.get("first_seq") else {}),
        duplicate_window=options["duplicate_window"] * NS,
        compression="none",
        allow_direct=bool(nats.get("allow_direct", False)),
        mirror_direct=bool(options.get("mirror")) and bool(nats.get("mirror_direct", False)),
        sealed=bool(options.get("sealed")),
        deny_delete=bool(nats.get("deny_delete", False)),
        deny_purge=options["deny_purge"],
        allow_rollup_hdrs=options["allow_rollup"],
        allow_msg_ttl=options["allow_msg_ttl"],
        consumer_limits={},
    )
    if options.get("mirror"):
        out["mirror"] = _copy_config(options["mirror"])
    if options.get("sources"):
        out["sources"] = [_copy_config(s) for s in options["sources"]]
    if options.get("allow_msg_schedules"):
        out["allow_msg_schedules"] = True
    if options.get("discard_new_per_subject"):
        out["discard_new_per_subject"] = True  # omitempty
    if options["subject_delete_marker_ttl"]:
        out["subject_delete_marker_ttl"] = options["subject_delete_marker_ttl"] * NS
    st = options.get("subject_transform")
    if st is not None:
        out["subject_transform"] = {"src": st.get("src", ""), "dest": st.get("dest", "")}
    rp = options.get("republish")
    if rp:
        # The server's RePublish: src and headers_only are omitempty, dest is not.
        out["republish"] = {k: v for k, v in (("src", rp.get("src")), ("dest", rp.get("dest", "")),
                                              ("headers_only", rp.get("headers_only"))) if v or k == "dest"}
    out["metadata"] = versioned_metadata(nats.get("metadata"), required_level(out))
    return out
