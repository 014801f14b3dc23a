"""ChildRecord: the runtime's mutable record of one child, shared by the engine's parts.

Callers never see it: :class:`~subagents.SpawnHandle` is a read-only view of one. Who
writes what: the limiter the slot fields (``holds_slot``, ``lends``); the child runner the
run fields (``state``, ``scope``, ``ending``, ``envelope``, ``done``), with the runner's
:class:`~subagents.RunContext` writing what ``ctx.report`` records (``progress``,
``usage``, ``iterations``); the sessions part the index fields (``collected``,
``owns_session``; ``view`` is made by ``handle_of`` and let go when the record is
forgotten); the manager the ``trace`` it starts; the ledger the ``account`` of its
subtree's spending (charged by ``ctx.report`` and the child runner). Everything else is set
when the record is made and never changes.
"""

from __future__ import annotations

from collections.abc import Awaitable
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import TYPE_CHECKING, Final, Literal

import anyio

from ._envelope import DelegateResult, Usage
from ._errors import SpawnRejected

if TYPE_CHECKING:
    from ._account import Account
    from ._paths import AgentPath
    from ._permissions import Ruleset
    from ._progress import Progress
    from ._spec import AgentSpec, Request

__all__ = [
    "JOURNALED_BEFORE",
    "NO_LEND",
    "QUEUED",
    "RUNNING",
    "SETTLED",
    "ChildRecord",
    "TaskState",
    "wait_for_record",
]

TaskState = Literal["queued", "running", "done"]
QUEUED: Final = "queued"
RUNNING: Final = "running"
SETTLED: Final = "done"

_NO_USAGE: Final = Usage()
JOURNALED_BEFORE: Final = 1
"""The journal token of a re-run's record, whose row an earlier process journaled: the
store's first write, committed before any recovery returns."""
NO_LEND: Final[AbstractAsyncContextManager[None]] = nullcontext()
"""What ``lend_slot()`` returns when the caller has no slot to lend (a root parent)."""


class ChildRecord:
    """Everything the runtime keeps about one child, from spawn to forgetting.

    A queued spawn is only this record (and its handle): no task exists for it until a
    concurrency slot frees.
    """

    __slots__ = (
        "_done",
        "account",
        "agent_path",
        "cancel_reason",
        "collected",
        "committing",
        "delivered",
        "ending",
        "envelope",
        "holds_slot",
        "idempotency_key",
        "iterations",
        "journaled",
        "lends",
        "owns_session",
        "parent_path",
        "permissions",
        "progress",
        "queue_position",
        "request",
        "restored",
        "root_session",
        "scope",
        "session_id",
        "spawned_at",
        "spec",
        "started_at",
        "state",
        "sync",
        "task_id",
        "timeout",
        "trace",
        "traceback",
        "usage",
        "view",
    )

    def __init__(
        self,
        *,
        task_id: str,
        session_id: str,
        root_session: str,
        spec: AgentSpec,
        request: Request,
        agent_path: AgentPath,
        parent_path: AgentPath,
        timeout: float | None,
        permissions: Ruleset,
        spawned_at: float,
        sync: bool,
    ) -> None:
        self.task_id = task_id
        self.session_id = session_id
        self.root_session = root_session  # the root session its tree hangs from
        self.spec = spec
        self.request = request
        self.agent_path = agent_path
        self.parent_path = parent_path
        self.timeout = timeout
        self.permissions = permissions
        self.spawned_at = spawned_at
        self.sync = sync  # an execute() delegation: run in its caller's task, no slot
        self.state: TaskState = QUEUED
        self.queue_position = 0
        self.started_at: float | None = None
        # Run fields (the child runner's).
        self.scope: anyio.CancelScope | None = None  # set while the runner may be cancelled
        self.cancel_reason: str | None = None  # set once a cancellation was requested
        self.ending = False  # the outcome is decided; cleanup (its own children) remains
        self.envelope: DelegateResult | None = None
        self.delivered = False  # the envelope went to the mailbox and the events
        self.committing = False  # ended; its envelope is handed on once the store commits it
        self._done: anyio.Event | None = None
        self.progress: Progress | None = None  # what ctx.report recorded, once it did
        self.usage = _NO_USAGE
        self.iterations = 0
        self.trace: object = None  # the tracing state, when a tracer records
        self.traceback: str | None = None  # until the completed event has carried it
        # Slot fields (the limiter's).
        self.holds_slot = False
        self.lends = 0  # its tasks inside a lend of its slot
        # Index fields (the sessions').
        self.collected = False
        self.owns_session = False  # its own session has state to release as it ends
        self.view: object = None  # its SpawnHandle, made on first request
        # Journal and key fields (the spawner's).
        self.journaled = 0  # the journal's token for its row; 0: not journaled
        self.restored = False  # made from a store's row: it ran in an earlier process
        self.idempotency_key: str | None = None  # the key it holds in its session, if any
        # Budget field (the ledger's; charged by the runner's RunContext and its result).
        self.account: Account | None = None  # what its subtree spent, if anything counts it

    @property
    def done(self) -> anyio.Event:
        """Set once the child has ended and its envelope has been delivered."""
        if self._done is None:
            self._done = anyio.Event()
            if self.delivered:  # not merely ended: first read during delivery stays unset
                self._done.set()
        return self._done

    def mark_delivered(self) -> None:
        """The envelope is delivered: wake the waiters, then drop the event they hold (later
        reads of :attr:`done` get a new, already set one), so an ended child keeps no event
        alive."""
        self.delivered = True
        if self._done is not None:
            self._done.set()
            self._done = None

    def check_can_delegate(self) -> None:
        """Raise :class:`SpawnRejected` unless this child's runner still runs.

        Every way into its session asks this record, not the sessions' index: once the
        record is forgotten, the index would take the id for a new root session.
        """
        if self.state != RUNNING or self.scope is None:
            raise SpawnRejected(
                "session_closed",
                f"session {self.task_id!r} has ended; its agent can no longer delegate",
            )


def wait_for_record(
    record: ChildRecord, timeout: float | None, lend: AbstractAsyncContextManager[None]
) -> Awaitable[None]:
    """What to await until ``record`` has ended or ``timeout`` seconds pass, inside
    ``lend`` (the waiting child's slot lent meanwhile)."""
    if lend is NO_LEND and timeout is None:
        # A root parent's plain wait: the event itself, with no context, cancel scope or
        # frame of ours around it.
        return record.done.wait()
    return _wait_lending(record, timeout, lend)


async def _wait_lending(
    record: ChildRecord, timeout: float | None, lend: AbstractAsyncContextManager[None]
) -> None:
    # The deadline encloses the lend: taking the slot back never outlasts it.
    if timeout is None:
        async with lend:
            await record.done.wait()
    else:
        with anyio.move_on_after(timeout):
            async with lend:
                await record.done.wait()
