"""ttlbroker's wire protocol, sans-IO.

Bytes in, typed objects out; objects in, bytes out. Nothing in this package
imports trio, asyncio, sockets, threads, ``os`` or ``time`` (a test parses every
module to make sure). ``docs/protocol.md`` is the normative description of every
layout here.

Layers, bottom up: ``_frames`` (the 16-byte frame header and the incremental
decoder), ``_records`` (message bodies and records, shared with the disk),
``_commands`` / ``_responses`` (one dataclass per request, response and push),
``_state`` + ``_connection`` (the handshake state machine and the object that ties
it together), and the pure helpers ``_names`` (the Iggy name rule, identifiers),
``_subjects`` (subjects, filters, matching, overlap), ``_errors`` (the error
code table) and ``_stamps`` (the time stamp in a benchmark's payloads). The NATS client protocol and the JetStream JSON are the subpackage
``protocol.nats``, which builds on this one (this package never imports it).

Public names: below, in ``__all__``.
"""

from ._codes import HANDSHAKE_MAGIC as HANDSHAKE_MAGIC
from ._codes import PROTOCOL_VERSION as PROTOCOL_VERSION
from ._codes import Command as Command
from ._codes import MarkerReason as MarkerReason
from ._codes import PushKind as PushKind
from ._codes import RemovalReason as RemovalReason
from ._commands import COMMAND_TYPES as COMMAND_TYPES
from ._consumers import ACK_SYNC as ACK_SYNC
from ._consumers import PULL_NO_WAIT as PULL_NO_WAIT
from ._consumers import AckKind as AckKind
from ._consumers import AckMessages as AckMessages
from ._consumers import ConsumerInfoRequest as ConsumerInfoRequest
from ._consumers import CreateConsumer as CreateConsumer
from ._consumers import DeleteConsumer as DeleteConsumer
from ._consumers import JoinGroup as JoinGroup
from ._consumers import EndPulls as EndPulls
from ._consumers import REDRIVE_DRY_RUN as REDRIVE_DRY_RUN
from ._consumers import Redrive as Redrive
from ._consumers import LeaveGroup as LeaveGroup
from ._consumers import ListConsumers as ListConsumers
from ._consumers import Pull as Pull
from ._consumers import PullBatch as PullBatch
from ._consumers import PullEnd as PullEnd
from ._consumers import PulledRun as PulledRun
from ._consumers import PullPart as PullPart
from ._consumers import PulledMessage as PulledMessage
from ._consumers import UpdateConsumer as UpdateConsumer
from ._consumers import encode_pull_batch as encode_pull_batch
from ._consumers import encode_pull_entry as encode_pull_entry
from ._consumers import expand_runs as expand_runs
from ._consumers import pull_entries as pull_entries
from ._commands import EXPIRY_NONE as EXPIRY_NONE
from ._commands import EXPORT_SEAL as EXPORT_SEAL
from ._commands import Export as Export
from ._commands import KvGet as KvGet
from ._commands import KvKeys as KvKeys
from ._commands import KvTouch as KvTouch
from ._commands import PUBLISH_NO_ACK as PUBLISH_NO_ACK
from ._commands import PUBLISH_ONE as PUBLISH_ONE
from ._commands import PUBLISH_REPLY as PUBLISH_REPLY
from ._commands import SUBSCRIBE_REPLIES as SUBSCRIBE_REPLIES
from ._commands import CreateStream as CreateStream
from ._commands import CreateTopic as CreateTopic
from ._commands import DeleteConsumerOffset as DeleteConsumerOffset
from ._commands import DeleteMessage as DeleteMessage
from ._commands import DeleteStream as DeleteStream
from ._commands import DeleteTopic as DeleteTopic
from ._commands import Fetch as Fetch
from ._commands import GetConsumerOffset as GetConsumerOffset
from ._commands import GetLast as GetLast
from ._commands import GetServerInfo as GetServerInfo
from ._commands import GetStats as GetStats
from ._commands import GetStream as GetStream
from ._commands import GetTopic as GetTopic
from ._commands import Handshake as Handshake
from ._commands import ListStreams as ListStreams
from ._commands import ListTopics as ListTopics
from ._commands import Ping as Ping
from ._commands import Publish as Publish
from ._commands import PublishWithReply as PublishWithReply
from ._commands import Purge as Purge
from ._commands import StoreConsumerOffset as StoreConsumerOffset
from ._commands import Subscribe as Subscribe
from ._commands import Unsubscribe as Unsubscribe
from ._commands import UpdateStream as UpdateStream
from ._commands import UpdateTopic as UpdateTopic
from ._connection import NEED_DATA as NEED_DATA
from ._connection import ErrorResponse as ErrorResponse
from ._connection import Event as Event
from ._connection import InvalidRequest as InvalidRequest
from ._connection import ProtocolConnection as ProtocolConnection
from ._connection import Push as Push
from ._connection import Request as Request
from ._connection import Response as Response
from ._errors import ERROR_CLASSES as ERROR_CLASSES
from ._errors import BrokerError as BrokerError
from ._errors import ErrorCode as ErrorCode
from ._errors import LocalProtocolError as LocalProtocolError
from ._errors import ProtocolError as ProtocolError
from ._errors import RemoteProtocolError as RemoteProtocolError
from ._errors import UnknownBrokerError as UnknownBrokerError
from ._errors import error_class as error_class
from ._frames import DEFAULT_MAX_FRAME_SIZE as DEFAULT_MAX_FRAME_SIZE
from ._frames import FLAG_PUSH as FLAG_PUSH
from ._frames import FRAME_HEADER as FRAME_HEADER
from ._frames import FLAG_RESPONSE as FLAG_RESPONSE
from ._frames import Frame as Frame
from ._frames import FrameDecoder as FrameDecoder
from ._frames import encode_frame as encode_frame
from ._names import Identifier as Identifier
from ._names import normalize_name as normalize_name
from ._records import BODY as BODY
from ._records import RECORD_FIXED as RECORD_FIXED
from ._records import FLAG_NO_MARKER as FLAG_NO_MARKER
from ._records import FLAG_TOMBSTONE as FLAG_TOMBSTONE
from ._records import MARKER_MASK as MARKER_MASK
from ._records import BodyFields as BodyFields
from ._records import Message as Message
from ._records import PublishScan as PublishScan
from ._records import body_fields as body_fields
from ._records import build_records as build_records
from ._records import checked_header_values as checked_header_values
from ._records import check_record as check_record
from ._records import decode_headers as decode_headers
from ._records import decode_records as decode_records
from ._records import split_records as split_records
from ._records import body_head as body_head
from ._records import encode_body as encode_body
from ._records import encode_headers as encode_headers
from ._records import encode_record as encode_record
from ._records import find_header as find_header
from ._records import header_values as header_values
from ._records import read_record_info as read_record_info
from ._records import record_spans as record_spans
from ._records import replace_header as replace_header
from ._records import restamp_body as restamp_body
from ._records import resubject_body as resubject_body
from ._records import scan_bodies as scan_bodies
from ._records import validate_header_block as validate_header_block
from ._responses import PUSH_TYPES as PUSH_TYPES
from ._responses import RESPONSE_TYPES as RESPONSE_TYPES
from ._responses import Ack as Ack
from ._responses import Acks as Acks
from ._responses import ConsumerOffset as ConsumerOffset
from ._responses import Delivery as Delivery
from ._responses import Empty as Empty
from ._responses import FetchResult as FetchResult
from ._responses import Goodbye as Goodbye
from ._responses import HandshakeOk as HandshakeOk
from ._responses import InfoMap as InfoMap
from ._responses import PurgeResult as PurgeResult
from ._responses import StreamDetails as StreamDetails
from ._responses import StreamList as StreamList
from ._responses import TopicDetails as TopicDetails
from ._responses import TopicList as TopicList
from ._responses import delivery_entry as delivery_entry
from ._responses import delivery_reply as delivery_reply
from ._stamps import STAMP_SIZE as STAMP_SIZE
from ._stamps import payload_stamp as payload_stamp
from ._stamps import stamped_payload as stamped_payload
from ._responses import encode_delivery as encode_delivery
from ._responses import encode_uniform_acks as encode_uniform_acks
from ._responses import info_map_frame as info_map_frame
from ._responses import uniform_ack_frames as uniform_ack_frames
from ._dead_letters import DLQ_HEADERS as DLQ_HEADERS
from ._dead_letters import DLQ_REASONS as DLQ_REASONS
from ._dead_letters import DeadLetterOrigin as DeadLetterOrigin
from ._dead_letters import dead_letter_body as dead_letter_body
from ._dead_letters import dead_letter_origin as dead_letter_origin
from ._dead_letters import redriven_body as redriven_body
from ._republish import HOPS_HEADER as HOPS_HEADER
from ._republish import copy_plan as copy_plan
from ._republish import hops_of as hops_of
from ._republish import record_keys as record_keys
from ._republish import republish_bodies as republish_bodies
from ._republish import rfc3339_ns as rfc3339_ns
from ._transform import SubjectTransform as SubjectTransform
from ._transform import TransformError as TransformError
from ._transform import fnv1a_32 as fnv1a_32
from ._ttl import TTL_INVALID as TTL_INVALID
from ._ttl import TTL_MAX as TTL_MAX
from ._ttl import TTL_NEVER as TTL_NEVER
from ._ttl import TTL_NONE as TTL_NONE
from ._ttl import format_go_duration as format_go_duration
from ._ttl import format_go_duration_ns as format_go_duration_ns
from ._ttl import parse_go_duration as parse_go_duration
from ._ttl import parse_ttl as parse_ttl
from ._state import Role as Role
from ._state import State as State
from ._subjects import filter_is_subset as filter_is_subset
from ._subjects import filters_overlap as filters_overlap
from ._subjects import is_literal as is_literal
from ._subjects import match_order as match_order
from ._subjects import subject_matches as subject_matches
from ._subjects import validate_filter as validate_filter
from ._subjects import validate_subject as validate_subject
from ._subjects import validate_published_subject as validate_published_subject

# One exception class per error code (StreamNotFoundError, InvalidMsgTtlError, ...).
globals().update({cls.__name__: cls for cls in ERROR_CLASSES.values()})

__all__ = [name for name in dir() if not name.startswith("_")]
