"""A session's capacity tally: what a process's mailbox objects of one session know of its
live entries, so that a put need not count them (design/store.md, "Capacity and TTL
across processes")."""

from __future__ import annotations

__all__ = ["Tally"]


class Tally:
    """What this process's mailbox objects of one session know of its live entries: an
    upper bound of them when last counted (``None``: count at the next put), and the puts
    any of them accepted since."""

    __slots__ = ("bound", "since")

    def __init__(self) -> None:
        self.bound: int | None = None
        self.since = 0

    def stale(self) -> None:
        """Entries arrived that no put here counted (another process's, the journal's)."""
        self.bound = None
