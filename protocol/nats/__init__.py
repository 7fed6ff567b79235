"""The NATS side of the wire, sans-IO: the NATS client protocol as a server reads
and writes it (``INFO``, ``CONNECT``, ``PUB``/``HPUB``, ``SUB``, ``MSG``/``HMSG``, ...),
NATS header blocks and their conversion to and from ttlbroker's record headers
(``_wire.py``), the JSON of the JetStream API: requests, responses, errors, PubAcks
and stream configurations (``_jetstream.py``), and JetStream's consumers: their
configurations, pull requests, ack subjects and deliveries (``_consumers.py``),
and the JetStream advisories' subjects and JSON (``_advisories.py``).

It builds on the binary protocol's records (``protocol``), which stays apart from it:
``protocol`` never imports this package.

Public names: below, in ``__all__``.
"""

from ._consumers import ACK_NEXT as ACK_NEXT
from ._consumers import AckReply as AckReply
from ._consumers import NextRequest as NextRequest
from ._consumers import PushSettings as PushSettings
from ._consumers import ack_subject as ack_subject
from ._consumers import consumer_config_from_nats as consumer_config_from_nats
from ._consumers import consumer_config_to_nats as consumer_config_to_nats
from ._consumers import idle_heartbeat as idle_heartbeat
from ._consumers import js_delivery as js_delivery
from ._consumers import js_delivery_frames as js_delivery_frames
from ._consumers import parse_ack_body as parse_ack_body
from ._consumers import term_reason as term_reason
from ._consumers import parse_ack_subject as parse_ack_subject
from ._consumers import parse_next_request as parse_next_request
from ._consumers import parse_pause_until as parse_pause_until
from ._consumers import parse_rfc3339 as parse_rfc3339
from ._consumers import with_header as with_header
from ._consumers import ack_metric as ack_metric
from ._consumers import check_group_name as check_group_name
from ._consumers import sample_percent as sample_percent
from ._consumers import status_message as status_message
from . import _advisories as advisories
from . import _schedule as schedule
from ._jetstream import ACK_PREFIX as ACK_PREFIX
from ._jetstream import nats_hash as nats_hash
from ._jetstream import source_info as source_info
from ._jetstream import API_PREFIX as API_PREFIX
from ._jetstream import API_LEVEL as API_LEVEL
from ._jetstream import NATS_VERSION as NATS_VERSION
from ._jetstream import BAD_REQUEST as BAD_REQUEST
from ._jetstream import FC_PREFIX as FC_PREFIX
from ._jetstream import INVALID_JSON as INVALID_JSON
from ._jetstream import JSError as JSError
from ._jetstream import MSG_DELETE_FAILED as MSG_DELETE_FAILED
from ._jetstream import MEMORY_RESOURCES_EXCEEDED as MEMORY_RESOURCES_EXCEEDED
from ._jetstream import NATS_ERRORS as NATS_ERRORS
from ._jetstream import NATS_SETTINGS as NATS_SETTINGS
from ._jetstream import NO_MESSAGE_FOUND as NO_MESSAGE_FOUND
from ._jetstream import NS as NS
from ._jetstream import PURGE_FAILED as PURGE_FAILED
from ._jetstream import SEQUENCE_NOT_FOUND as SEQUENCE_NOT_FOUND
from ._jetstream import STORE_FAILED as STORE_FAILED
from ._jetstream import STREAM_INVALID_CONFIG as STREAM_INVALID_CONFIG
from ._jetstream import STREAM_MISMATCH as STREAM_MISMATCH
from ._jetstream import STREAM_NAME_EXIST as STREAM_NAME_EXIST
from ._jetstream import STREAM_NOT_FOUND as STREAM_NOT_FOUND
from ._jetstream import STREAM_SEALED as STREAM_SEALED
from ._jetstream import REQUIRED_API_LEVEL as REQUIRED_API_LEVEL
from ._jetstream import STREAM_FEATURE_LEVELS as STREAM_FEATURE_LEVELS
from ._jetstream import api_level_refused as api_level_refused
from ._jetstream import required_level as required_level
from ._jetstream import api_error as api_error
from ._jetstream import api_response as api_response
from ._jetstream import check_stream_name as check_stream_name
from ._jetstream import js_error as js_error
from ._jetstream import last_by_subj_of as last_by_subj_of
from ._jetstream import msg_get_response as msg_get_response
from ._jetstream import nats_error as nats_error
from ._jetstream import parse_request as parse_request
from ._json import loads as json_loads
from ._jetstream import pub_ack as pub_ack
from ._jetstream import pub_ack_format as pub_ack_format
from ._jetstream import pub_error as pub_error
from ._jetstream import rfc3339 as rfc3339
from ._jetstream import stream_config as stream_config
from ._jetstream import stream_config_to_topic as stream_config_to_topic
from ._wire import ACK_RUN_LIMIT as ACK_RUN_LIMIT
from ._wire import pub_payload as pub_payload
from ._wire import AckRun as AckRun
from ._wire import MAX_CONTROL_LINE as MAX_CONTROL_LINE
from ._wire import NATS_NEED_DATA as NATS_NEED_DATA
from ._wire import Event as NatsEvent
from ._wire import NatsConnect as NatsConnect
from ._wire import NatsErr as NatsErr
from ._wire import NatsInfo as NatsInfo
from ._wire import NatsMsg as NatsMsg
from ._wire import NatsOk as NatsOk
from ._wire import NatsParser as NatsParser
from ._wire import NatsPing as NatsPing
from ._wire import NatsPong as NatsPong
from ._wire import NatsProtocolError as NatsProtocolError
from ._wire import NatsPub as NatsPub
from ._wire import NatsSub as NatsSub
from ._wire import NatsUnsub as NatsUnsub
from ._wire import OK as OK
from ._wire import PING as PING
from ._wire import PONG as PONG
from ._wire import decode_nats_headers as decode_nats_headers
from ._wire import encode_connect as encode_connect
from ._wire import encode_err as encode_err
from ._wire import encode_info as encode_info
from ._wire import encode_msg as encode_msg
from ._wire import encode_nats_headers as encode_nats_headers
from ._wire import encode_pub as encode_pub
from ._wire import encode_sub as encode_sub
from ._wire import encode_unsub as encode_unsub
from ._wire import nats_message_of_record as nats_message_of_record
from ._wire import nats_to_record_headers as nats_to_record_headers
from ._wire import no_responders_status as no_responders_status
from ._wire import record_to_nats_headers as record_to_nats_headers
from ._wire import valid_nats_subject as valid_nats_subject

__all__ = [
    "advisories", "schedule",
    "ACK_NEXT", "ACK_PREFIX", "ACK_RUN_LIMIT", "API_LEVEL", "API_PREFIX", "NATS_VERSION", "AckReply", "AckRun", "BAD_REQUEST", "FC_PREFIX",
    "INVALID_JSON", "JSError", "MAX_CONTROL_LINE", "MSG_DELETE_FAILED", "NATS_ERRORS", "NATS_NEED_DATA",
    "NATS_SETTINGS", "nats_hash", "source_info", "NO_MESSAGE_FOUND", "NS", "NatsConnect", "NatsErr", "NatsEvent", "NatsInfo", "NatsMsg", "NatsOk",
    "NatsParser", "NatsPing", "NatsPong", "NatsProtocolError", "NatsPub", "NatsSub", "NatsUnsub", "NextRequest",
    "OK", "PING", "PONG", "PURGE_FAILED", "PushSettings", "SEQUENCE_NOT_FOUND", "STORE_FAILED", "STREAM_INVALID_CONFIG",
    "STREAM_MISMATCH", "STREAM_NAME_EXIST", "STREAM_NOT_FOUND", "ack_subject", "api_error", "api_response",
    "check_stream_name", "consumer_config_from_nats", "consumer_config_to_nats", "decode_nats_headers",
    "encode_connect", "encode_err", "encode_info", "encode_msg", "encode_nats_headers", "encode_pub", "encode_sub",
    "encode_unsub", "idle_heartbeat", "js_delivery", "json_loads", "js_delivery_frames", "js_error", "last_by_subj_of",
    "msg_get_response", "nats_error", "nats_message_of_record", "nats_to_record_headers", "no_responders_status",
    "parse_ack_body", "term_reason", "parse_ack_subject", "parse_next_request", "parse_pause_until", "parse_request", "parse_rfc3339", "with_header", "ack_metric", "sample_percent", "check_group_name", "pub_ack", "pub_ack_format",
    "pub_error", "record_to_nats_headers", "rfc3339", "status_message", "stream_config", "stream_config_to_topic",
    "valid_nats_subject", "pub_payload", "STREAM_SEALED", "REQUIRED_API_LEVEL", "STREAM_FEATURE_LEVELS", "api_level_refused",
    "required_level",
]
