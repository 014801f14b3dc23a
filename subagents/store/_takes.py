"""A mailbox's take of every unread envelope as a write of the writer thread's batch.

``SqliteMailbox.take_all`` submits a :class:`TakeAll` instead of opening a transaction of
its own on the event loop's connection. The event loop's take must first wait, blocked,
for the writer's transaction in flight (the gate): in a fan-out on the store that was a
sixth of the loop's time, the loop idle while the writer worked. Applied in its place in
the writer's batch (it has no order, so nothing moves across it), the take sees every put
submitted before it, committed with it or earlier, and none submitted after; other
processes' rows it sees as any transaction does. Its callback runs on the event loop after
the callbacks of the puts before it, so the envelopes this process put are in hand by then
and are handed on without decoding their rows.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Self

import anyio

from .._envelope import now_ms
from . import _deliveries as rows
from ._writer import Write, Writer

__all__ = ["TakeAll", "TakenRow"]

TakenRow = tuple[str, int, int]
"""A taken entry: ``(task_id, delivery_id, envelope_id)``, in arrival order."""


class TakeAll(Write):
    """Take every live entry of one mailbox (past their TTL at ``now``: expired)."""

    __slots__ = ("_done", "consumer", "now", "recipient", "session", "taken")

    def __init__(self, session: str, recipient: str, consumer: str, now: float) -> None:
        super().__init__()
        self.session = session
        self.recipient = recipient
        self.consumer = consumer
        self.now = now
        self._done = anyio.Event()
        self.taken: list[TakenRow] | None = None
        """The rows taken, once applied; ``None`` if the store failed first."""

    async def through(self, writer: Writer) -> list[TakenRow] | None:
        """Submit this take and wait for its commit; the rows it took, or ``None`` if the
        store failed first. The wait is shielded: a take committed is never lost to its
        caller's cancellation, which lands at the caller's next checkpoint.

        Raises:
            StoreError: the store failed earlier (nothing submitted).
            anyio.ClosedResourceError: the store is closing.
        """
        writer.submit(self)
        with anyio.CancelScope(shield=True):
            await self._done.wait()
        return self.taken

    @classmethod
    def apply(cls, conn: sqlite3.Connection, writes: Sequence[Self]) -> None:
        for w in writes:
            # No body is read here: which envelopes the mailbox holds is for the event
            # loop to look up (its memory is not this thread's), and reads the others.
            w.taken = rows.claim_ids(
                conn, w.session, w.recipient, consumer=w.consumer, now=w.now, ms=now_ms()
            )

    def release(self) -> None:
        self.taken = None  # rolled back: nothing was taken

    def done(self) -> None:
        self._done.set()

    def failed(self) -> None:
        self._done.set()
