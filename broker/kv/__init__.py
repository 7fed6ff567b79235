"""KV buckets: reads and touches that refresh a key's TTL, the list of keys, and the
durable refresh leases.

Owns: :class:`KvReads` (a bucket's get with its visibility and refresh rules,
touch, keys, leases), and the KV commands of the binary protocol (functions
``(kv, session, command) -> Reply``). A bucket is a topic with the ``kv`` option;
its puts and deletes are ordinary publishes of ``broker.core``.

May import: ``broker.core``, ``broker.config``, ``protocol``, ``storage``.

Public names: below, in ``__all__``.
"""

from ._handlers import kv_get as kv_get
from ._handlers import kv_get_frames as kv_get_frames
from ._handlers import kv_keys as kv_keys
from ._handlers import kv_touch as kv_touch
from ._reads import LEASE_PREFIX as LEASE_PREFIX
from ._reads import KvReads as KvReads
from ._reads import load_leases as load_leases

__all__ = ["LEASE_PREFIX", "KvReads", "kv_get", "kv_get_frames", "kv_keys", "kv_touch", "load_leases"]
