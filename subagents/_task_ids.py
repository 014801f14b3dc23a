"""Task ids: 12 random hex digits, 48 bits from the OS, unique among the records and, for a
journaled child, among the store's rows.

Checking a new id against the store is a read on the event loop's connection, and every
such read lets the store's writer thread take the GIL, so ids for journaled children are
drawn :data:`DRAWN_AT_ONCE` at a time and checked in one read. One drawn long before its
use may meet another process's new row of the same id meanwhile, as one drawn just
before it may: 48 random bits make either a one-in-trillions event, and the spawn's row
then fails loudly.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Container
from typing import Final

from ._journal import Journal

__all__ = ["DRAWN_AT_ONCE", "TaskIds"]

logger = logging.getLogger("subagents")

DRAWN_AT_ONCE: Final = 64
_BYTES: Final = 6


class TaskIds:
    """Draws the task ids of one manager."""

    def __init__(self, held: Container[str], journal: Journal | None) -> None:
        self._held = held  # the ids records have
        self._journal = journal
        self._checked: deque[str] = deque()  # drawn, and not in the store when checked

    def draw(self, journaled: bool = True) -> str:
        """A task id no record has (nor, for a ``journaled`` child, the store's rows)."""
        if self._journal is None or not journaled:
            task_id = os.urandom(_BYTES).hex()
            while task_id in self._held:
                task_id = os.urandom(_BYTES).hex()
            return task_id
        checked = self._checked
        while True:
            while checked:
                task_id = checked.popleft()
                if task_id not in self._held:
                    return task_id
            checked.extend(self._draw_checked(self._journal))

    def _draw_checked(self, journal: Journal) -> list[str]:
        data = os.urandom(_BYTES * DRAWN_AT_ONCE).hex()
        width = 2 * _BYTES
        drawn = [data[i : i + width] for i in range(0, len(data), width)]
        try:
            taken = journal.taken_among(drawn)
        except Exception:
            # A store that cannot answer: the spawn's own row then fails loudly on a clash
            # (journaled() raises), so nothing is lost by drawing on.
            logger.exception("checking new task ids against the store failed")
            taken = set()
        return [task_id for task_id in drawn if task_id not in taken]
