"""Storage errors. They carry the wire codes of ``protocol`` so the broker can
answer with them unchanged."""

from __future__ import annotations

from protocol import ErrorCode, error_class

__all__ = ["CorruptedRecord", "StorageFailure"]


class CorruptedRecord(error_class(ErrorCode.CORRUPTED_RECORD)):  # type: ignore[misc]  # a base made by a call: mypy sees no class
    """A record failed its checksum, is truncated, or is missing from its file.

    Attributes:
        offset: the record's offset.
    """

    def __init__(self, message: str, offset: int = 0) -> None:
        super().__init__(message)
        self.offset = offset

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.message, self.offset))


class StorageFailure(error_class(ErrorCode.STORAGE_FAILURE)):  # type: ignore[misc]  # a base made by a call: mypy sees no class
    """The operating system refused a file operation (disk full, I/O error, ...)."""
