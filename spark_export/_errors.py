"""The one error of the jobs (imports nothing, so that the commands' arguments can
be built without pyarrow or pyspark)."""

from __future__ import annotations

__all__ = ["JobError"]


class JobError(Exception):
    """A job cannot run; the message is the one line the user sees."""
