"""ManagerStatistics: a snapshot of a manager's counters."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from ._limiter import SpawnLimiter

__all__ = ["ManagerStatistics", "snapshot"]


@attrs.frozen(kw_only=True)
class ManagerStatistics:
    """A snapshot of the manager's admission counters."""

    limit: int
    """Current concurrency limit for spawned children."""
    running: int
    """Spawned children holding a slot now (borrowed slots included)."""
    queued: int
    """Spawned children waiting for a slot."""
    high_water: int
    """Most slots ever held at once, borrowed ones not counted: never above the limit
    (unless the limit was lowered while they ran)."""
    borrowed: int
    """Slots in use beyond the limit now: children whose wait to take back a lent slot
    timed out or was cancelled, so they run on without one. ``running - borrowed`` never
    exceeds the limit; the next slots to free repay these before anyone queued starts."""
    borrows: int
    """How many times a child ever ran on a borrowed slot."""
    resuming: int
    """Children waiting to take back the slot they lent (their wait is over; the next slots
    to free go to them before anyone queued)."""
    mailbox_overflows: int
    """Results that found their session's mailbox full (``mailbox_capacity`` unread): each
    went by the ``subagent.completed`` event alone and stays collectable by ``wait_result``
    and ``wait_agent`` (a ``subagent.mailbox_full`` event marks it)."""
    spawned: int
    """Children ever created (spawns and executes)."""
    settled: int
    """Children that have ended in an envelope."""
    workers: int
    """Worker tasks alive."""


def snapshot(
    limiter: SpawnLimiter, *, overflows: int, spawned: int, settled: int
) -> ManagerStatistics:
    """The statistics of a manager with this limiter and these counts."""
    return ManagerStatistics(
        limit=limiter.limit,
        running=limiter.active,
        queued=limiter.queued,
        high_water=limiter.high_water,
        borrowed=limiter.borrowed,
        borrows=limiter.borrows,
        resuming=limiter.resuming,
        mailbox_overflows=overflows,
        spawned=spawned,
        settled=settled,
        workers=limiter.workers,
    )
