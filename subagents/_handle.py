"""SpawnHandle: the caller's read-only view of one child.

The runtime's mutable state lives in an internal :class:`~subagents._record.ChildRecord`;
a handle reads it and asks its manager to act (trio's ``Nursery`` and ``CancelScope`` have
no public constructor either).
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from time import perf_counter
from typing import TYPE_CHECKING, NoReturn, Protocol, cast

from ._record import ChildRecord, TaskState, wait_for_record

if TYPE_CHECKING:
    import anyio

    from ._envelope import DelegateResult
    from ._paths import AgentPath
    from ._spec import Request

__all__ = ["HandleOwner", "SpawnHandle", "handle_of", "record_of"]


class HandleOwner(Protocol):
    """What a handle asks of the manager that made it."""

    def lend_slot(self) -> AbstractAsyncContextManager[None]: ...

    def collect(self, handle: SpawnHandle) -> DelegateResult | None: ...

    def cancel(self, task_id: str) -> bool: ...

    async def wait_journaled(self, handle: SpawnHandle) -> None: ...


class _NoPublicConstructor(type):
    """Calling the class raises; the runtime makes instances with :func:`handle_of`."""

    def __call__(cls, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError(
            f"{cls.__module__}.{cls.__qualname__} has no public constructor: "
            "SubagentManager.spawn returns one"
        )


class SpawnHandle(metaclass=_NoPublicConstructor):
    """Returned at once by :meth:`SubagentManager.spawn`; the child runs in the background.

    A read-only view: it reads the child's state and asks the manager to wait, collect or
    cancel. ``done`` is set only after the envelope has been delivered (mailbox and event),
    so a waiter woken by it always finds the result.
    """

    __slots__ = ("_owner", "_record")
    _record: ChildRecord
    _owner: HandleOwner

    @property
    def task_id(self) -> str:
        """Unique id; the mailbox key and what ``wait_agent`` takes."""
        return self._record.task_id

    @property
    def session_id(self) -> str:
        """The parent session this child reports to."""
        return self._record.session_id

    @property
    def agent_path(self) -> AgentPath:
        """The child's place in the tree."""
        return self._record.agent_path

    @property
    def parent_path(self) -> AgentPath:
        """The delegating agent's path."""
        return self._record.parent_path

    @property
    def agent(self) -> str:
        """The agent type's name."""
        return self._record.spec.name

    @property
    def request(self) -> Request:
        """The request the runner receives."""
        return self._record.request

    @property
    def state(self) -> TaskState:
        """``queued``, ``running`` or ``done``."""
        return self._record.state

    @property
    def queue_position(self) -> int:
        """Position in the FIFO queue at spawn time (0 when it started at once)."""
        return self._record.queue_position

    @property
    def sync(self) -> bool:
        """True for a synchronous :meth:`SubagentManager.execute` delegation."""
        return self._record.sync

    @property
    def cancel_called(self) -> bool:
        """True once a cancellation was requested (by :meth:`cancel`, a closed session, an
        ended parent or the manager's close), even before the child has ended."""
        return self._record.cancel_reason is not None

    @property
    def result(self) -> DelegateResult | None:
        """The envelope once the child has ended, else ``None``. Never consumes."""
        return self._record.envelope

    @property
    def done(self) -> anyio.Event:
        """Set once the child has ended and its envelope has been delivered."""
        return self._record.done

    @property
    def collected(self) -> bool:
        """True once the envelope was consumed: drained from the mailbox (``drain``,
        ``drain_all``, ``wait``), by ``wait_result`` or ``wait_agent``, or returned by
        ``execute``. ``config.retain_collected`` may then forget the manager's record."""
        return self._record.collected

    async def wait(self) -> DelegateResult:
        """Block until the child has ended, then collect and return its envelope.

        Returning the envelope to its caller is a collection, as :meth:`SubagentManager.
        wait_result`'s: the mailbox entry is consumed, :attr:`collected` becomes true and
        ``config.retain_collected`` may forget the record. Waiting again returns the same
        envelope (this handle keeps it). A spawned child waiting here lends its slot.
        Cancellation: the caller's cancellation does not affect the child and collects
        nothing.
        """
        record = self._record
        envelope = record.envelope
        if envelope is None:
            await wait_for_record(record, None, self._owner.lend_slot())
            envelope = record.envelope
            assert envelope is not None
        if not record.collected:
            self._owner.collect(self)
        return envelope

    async def journaled(self) -> None:
        """Block until the spawn's row is committed to the manager's store: from then on
        the spawn is durable (a restart after a crash gives it its one envelope, see
        ``design/store.md``). Returns at once without a store, for an ``execute`` child
        and for a child restored from the store. Cancellation stops the wait, not the
        write.

        Raises:
            StoreError: the store failed before committing the row.
        """
        await self._owner.wait_journaled(self)

    def cancel(self) -> bool:
        """Ask the child to stop; see :meth:`SubagentManager.cancel`."""
        if self._record.envelope is not None:
            return False  # ended (and maybe forgotten): nothing to ask the manager
        return self._owner.cancel(self._record.task_id)

    def elapsed(self) -> float:
        """Seconds since the spawn (until the end, once ended)."""
        record = self._record
        if record.envelope is not None:
            return record.envelope.duration_ms / 1000
        return perf_counter() - record.spawned_at

    def __repr__(self) -> str:
        record = self._record
        return f"<SpawnHandle {record.task_id} {record.agent_path} {record.state}>"


def handle_of(record: ChildRecord, owner: HandleOwner) -> SpawnHandle:
    """The one handle of ``record`` (made on first request)."""
    view = record.view
    if view is None:
        # Not through the class (it has no public constructor): one allocation per spawn.
        view = record.view = object.__new__(SpawnHandle)
        view._record = record
        view._owner = owner
    return cast("SpawnHandle", view)


def record_of(handle: SpawnHandle) -> ChildRecord:
    """The record ``handle`` views."""
    if not isinstance(handle, SpawnHandle):
        raise TypeError(f"expected a SpawnHandle, got {type(handle).__name__}")
    return handle._record
