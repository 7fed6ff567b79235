"""ttlbroker's storage: a segmented log per partition, and the data directory.

Storage stores what it is told and remembers deletions; it knows nothing of the
network, of subjects' meaning, or of TTL policy. The record layout it writes is
``protocol._records`` (the same bytes as on the wire).

Public surface: :class:`DataDir` (layout, lock, catalog), :class:`PartitionLog`
(append, read, delete, purge, recovery) and :class:`MemoryPartitionLog` (the same
in memory, bounded by a :class:`MemoryBudget`), :class:`Segment` (one segment's files, for
the cleaner and the exporter) and the states of its records (:data:`RecordState`:
``LIVE``, ``DELETED``, ``CORRUPT``), :class:`ConsumerOffsets`, the fsync policy and
:func:`sync_fds`, the file primitives (:func:`atomic_write`, :func:`makedirs`,
:func:`read_if_exists`, :func:`file_names`, :func:`remove_file`; the command line
keeps its contexts with them too), and the errors.
"""

from ._copies import Copies as Copies
from ._copies import CopiesUnreadable as CopiesUnreadable
from ._check import CheckSummary as CheckSummary
from ._check import check_data_dir as check_data_dir
from ._damage import Damage as Damage
from ._damage import Report as Report
from ._damage import ignore_damage as ignore_damage
from ._datadir import ConsumerOffsets as ConsumerOffsets
from ._datadir import DataDir as DataDir
from ._journal import Journal as Journal
from ._durability import FsyncPolicy as FsyncPolicy
from ._durability import deferred_dir_syncs as deferred_dir_syncs
from ._durability import fsync_dir as fsync_dir
from ._durability import parse_duration_ms as parse_duration_ms
from ._durability import sync_fds as sync_fds
from ._errors import CorruptedRecord as CorruptedRecord
from ._files import atomic_write as atomic_write
from ._files import keep_aside as keep_aside
from ._files import makedirs as makedirs
from ._files import file_names as file_names
from ._files import open_file as open_file
from ._files import read_if_exists as read_if_exists
from ._files import remove_file as remove_file
from ._files import set_modes as set_modes
from ._files import write_all as write_all
from ._errors import StorageFailure as StorageFailure
from ._partition_reads import SCAN_LIMIT as SCAN_LIMIT
from ._partition_log import AppendResult as AppendResult
from ._partition_log import PartitionLog as PartitionLog
from ._memory import MemoryBudget as MemoryBudget
from ._memory import MemoryPartitionLog as MemoryPartitionLog
from ._partition_reads import ReadResult as ReadResult
from ._partition_recovery import LiveRecords as LiveRecords
from ._deletions import read_deletion_tags as read_deletion_tags
from ._log import CORRUPT as CORRUPT
from ._log import DELETED as DELETED
from ._log import LIVE as LIVE
from ._log import RecordState as RecordState
from ._recovery import RecoveryReport as RecoveryReport
from ._segment import Segment as Segment
from ._sources import SourceMark as SourceMark
from ._segment import segment_name as segment_name

__all__ = [name for name in dir() if not name.startswith("_")]
