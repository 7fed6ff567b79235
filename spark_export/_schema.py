"""The Parquet schema of exported segments, and its version.

One row per record of a sealed segment (removed ones included, flagged), in offset
order. ``stream``, ``topic`` and ``partition`` are not columns: they are the Hive
partition folders of the layout (``stream=<name>/topic=<name>/partition=<n>/``), which
Spark, pandas, pyarrow and DuckDB all read back as columns.

The version is written into every file's key-value metadata
(``ttlbroker.schema_version``); readers refuse a version they do not know. A change
that removes or retypes a column takes a new version; adding a nullable column does
too, so that every reader knows exactly what it reads.

Timestamps are microseconds, the finest Spark's ``TimestampType`` holds (Spark
refuses Parquet's nanosecond timestamps); ``timestamp_ns`` keeps the broker's exact
nanoseconds.
"""

from __future__ import annotations

import pyarrow as pa

__all__ = ["SCHEMA", "SCHEMA_VERSION", "VERSION_KEY", "COLUMNS"]

SCHEMA_VERSION = 1
VERSION_KEY = b"ttlbroker.schema_version"

SCHEMA = pa.schema(
    [
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("timestamp_ns", pa.int64(), nullable=False),  # exact: the broker's nanoseconds
        pa.field("subject", pa.string(), nullable=False),
        pa.field("headers", pa.map_(pa.string(), pa.string()), nullable=False),
        pa.field("payload", pa.binary(), nullable=False),
        pa.field("ttl_seconds", pa.int64()),  # null: no TTL of its own, or never
        pa.field("ttl_never", pa.bool_(), nullable=False),
        pa.field("expires_at", pa.timestamp("us", tz="UTC")),  # the earlier of TTL and max age; null: never
        pa.field("is_marker", pa.bool_(), nullable=False),
        pa.field("marker_reason", pa.string()),  # MaxAge, Remove, Purge; null for other messages
        pa.field("removed", pa.bool_(), nullable=False),
        pa.field("removed_reason", pa.string()),  # ttl, max_age, delete, purge, rollup, max_msgs_per_subject, acked, damaged, unknown
    ],
    metadata={VERSION_KEY: str(SCHEMA_VERSION).encode()},
)

COLUMNS = tuple(SCHEMA.names)
