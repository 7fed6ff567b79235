"""The broker's shared state and its message path.

Owns: the catalog of streams, topics and partitions, routing a subject to its
partition, admission (headers, TTLs, rollups, de-duplication), the group commit,
publishing, reading, removing, retention (per-message TTL, max age, subject delete
markers, the segment cleaner), the deadline structure, sealing, republish, the
per-partition subject index, core subscriptions, the export task, the clock, the
counters and the structured log. The command handlers of those families
(streams and topics, publish, fetch, delete and purge, server info) are here too,
as functions ``(broker, session, command) -> Reply`` that every protocol calls.

May import: ``broker.config``, ``protocol``, ``storage`` (and ``spark_export``'s
pyarrow conversion, lazily, when the export is configured). Nothing of ``broker``
above it: the core never knows its callers; the packages above register
:class:`TopicHooks` for what they keep per topic.

Public names: below, in ``__all__``.
"""

from ._admin import create_stream as create_stream
from ._admin import create_topic as create_topic
from ._admin import delete_stream as delete_stream
from ._admin import delete_topic as delete_topic
from ._admin import get_stream as get_stream
from ._admin import get_topic as get_topic
from ._admin import list_streams as list_streams
from ._admin import list_topics as list_topics
from ._admin import update_stream as update_stream
from ._admin import update_topic as update_topic
from ._broker import Broker as Broker
from ._broker import TopicHooks as TopicHooks
from ._catalog import Catalog as Catalog
from ._clock import Clock as Clock
from ._commit import Committer as Committer
from ._commit import Reply as Reply
from ._commit import SyncSource as SyncSource
from ._expiry import LAG_BUCKETS_NS as LAG_BUCKETS_NS
from ._expiry import ExpiryEngine as ExpiryEngine
from ._expiry import TIMER_NS as TIMER_NS
from ._expiry import fire_time as fire_time
from ._info import VERSION as VERSION
from ._info import export as export
from ._info import info as info
from ._info import ping as ping
from ._info import server_info as server_info
from ._info import stats_values as stats_values
from ._log import StructLogger as StructLogger
from ._log import configure_logging as configure_logging
from ._log import get_logger as get_logger
from ._publishing import Copy as Copy
from ._publishing import Publisher as Publisher
from ._reading import fetch as fetch
from ._reading import get_last as get_last
from ._removing import delete_message as delete_message
from ._removing import matching_subjects as matching_subjects
from ._removing import purge as purge
from ._routing import NO_TOPIC as NO_TOPIC
from ._stats import Counters as Counters
from ._stats import counter_help as counter_help
from ._subject_index import MARKER as MARKER
from ._subject_index import TOMBSTONE as TOMBSTONE
from ._subscriptions import PushTarget as PushTarget
from ._subscriptions import Subscriber as Subscriber
from ._subscriptions import SubscriptionIndex as SubscriptionIndex
from ._subscriptions import subject_too_long as subject_too_long
from ._subscriptions import subscription_footprint as subscription_footprint
from ._topic_config import DEFAULT_DUPLICATE_WINDOW as DEFAULT_DUPLICATE_WINDOW
from ._topic_config import TopicConfig as TopicConfig
from ._topic_config import check_option_types as check_option_types
from ._topic_config import copy_iname as copy_iname
from ._topic_config import resolve as resolve
from ._topics import Partition as Partition
from ._topics import Stream as Stream
from ._topics import Topic as Topic

__all__ = [
    "DEFAULT_DUPLICATE_WINDOW", "LAG_BUCKETS_NS", "MARKER", "NO_TOPIC", "TIMER_NS", "TOMBSTONE",
    "VERSION", "Broker", "Catalog", "Clock", "Committer", "Copy", "Counters", "ExpiryEngine", "Partition", "Publisher", "PushTarget", "Reply",
    "Stream", "StructLogger", "Subscriber", "SubscriptionIndex", "SyncSource", "Topic", "TopicConfig", "TopicHooks",
    "check_option_types", "configure_logging", "copy_iname", "counter_help", "create_stream", "create_topic", "delete_message",
    "delete_stream", "delete_topic", "export", "fetch", "fire_time", "get_last", "get_logger", "get_stream",
    "get_topic", "info", "list_streams", "list_topics", "matching_subjects", "ping", "purge", "resolve",
    "server_info", "stats_values", "subject_too_long", "subscription_footprint", "update_stream", "update_topic",
]
