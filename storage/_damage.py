"""Damage found in the data directory, as storage reports it.

Storage never decides alone to hide damage: every check that fails produces one
:class:`Damage` handed to the ``report`` callable the caller gave (the broker logs
it once with the file and position and counts it; ``ttlbroker check`` prints it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Damage", "Report", "ignore_damage"]


@dataclass(frozen=True, slots=True)
class Damage:
    """One piece of damage.

    Attributes:
        kind: the file kind: ``catalog``, ``partition_state``, ``deletions``,
            ``offset_index``, ``time_index``, ``segment``, ``consumer_offsets``,
            ``sources_state``, ``export_manifest``, ``unknown_path``.
        path: the file (or directory) concerned.
        position: the byte position of the damage in the file, when known.
        detail: what is wrong, in words.
        action: what was done about it (``rebuilt from the segment``, ``used the
            previous generation``, ``kept aside in quarantine/...``, ``reported``).
        offsets: the range of message offsets affected, ``(first, last)``, if any.
    """

    kind: str
    path: str
    position: int | None
    detail: str
    action: str
    offsets: tuple[int, int] | None = None

    def line(self) -> str:
        where = self.path if self.position is None else f"{self.path} at byte {self.position}"
        rng = ""
        if self.offsets is not None:
            a, b = self.offsets
            rng = f" (offset {a})" if a == b else f" (offsets {a}..{b})"
        return f"{self.kind}: {where}: {self.detail}{rng}; {self.action}"


Report = Callable[[Damage], None]


def ignore_damage(damage: Damage) -> None:
    """A ``report`` that drops what it is given (tests of unrelated behaviour)."""
