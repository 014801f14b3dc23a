"""SpawnHandle: the caller's view of one spawned child, and the runtime's record of it."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager, nullcontext
from typing import TYPE_CHECKING, Final, Literal

import anyio

from ._envelope import DelegateResult, Usage
from ._errors import SpawnRejected

if TYPE_CHECKING:
    from ._manager import SubagentManager
    from ._paths import AgentPath
    from ._permissions import Ruleset
    from ._progress import Progress
    from ._spec import AgentSpec, Request

__all__ = ["NO_LEND", "QUEUED", "RUNNING", "SETTLED", "SpawnHandle", "TaskState"]

TaskState = Literal["queued", "running", "done"]
QUEUED: Final = "queued"
RUNNING: Final = "running"
SETTLED: Final = "done"
NO_LEND: Final[AbstractAsyncContextManager[None]] = nullcontext()
"""What ``lend_slot()`` returns when the caller has no slot to lend (a root parent)."""


class SpawnHandle:
    """Returned at once by :meth:`SubagentManager.spawn`; the child runs in the background.

    A queued spawn is only this small record: no task exists for it until a concurrency
    slot frees. ``done`` is set only after the envelope has been delivered (mailbox and
    event), so a waiter woken by it always finds the result.
    """

    __slots__ = (
        "_cancel_requested",
        "_collected",
        "_delivered",
        "_done",
        "_ending",
        "_envelope",
        "_holds_slot",
        "_iterations",
        "_lends",
        "_manager",
        "_owns_session",
        "_permissions",
        "_progress",
        "_request",
        "_scope",
        "_spawned_at",
        "_spec",
        "_started_at",
        "_timeout",
        "_trace",
        "_traceback",
        "_usage",
        "agent_path",
        "parent_path",
        "queue_position",
        "session_id",
        "state",
        "sync",
        "task_id",
    )

    def __init__(
        self,
        manager: SubagentManager,
        *,
        task_id: str,
        session_id: str,
        spec: AgentSpec,
        request: Request,
        agent_path: AgentPath,
        parent_path: AgentPath,
        timeout: float | None,
        permissions: Ruleset,
        spawned_at: float,
        sync: bool,
    ) -> None:
        self._manager = manager
        self.task_id = task_id
        """Unique id; the mailbox key and what ``wait_agent`` takes."""
        self.session_id = session_id
        """The parent session this child reports to."""
        self.agent_path = agent_path
        """The child's place in the tree."""
        self.parent_path = parent_path
        """The delegating agent's path."""
        self.state: TaskState = QUEUED
        """``queued``, ``running`` or ``done``."""
        self.queue_position = 0
        """Position in the FIFO queue at spawn time (0 when it started at once)."""
        self.sync = sync
        """True for a synchronous :meth:`SubagentManager.execute` delegation."""
        self._spec = spec
        self._request = request
        self._timeout = timeout
        self._permissions = permissions
        self._spawned_at = spawned_at
        self._started_at: float | None = None
        self._scope: anyio.CancelScope | None = None
        self._cancel_requested: str | None = None
        self._envelope: DelegateResult | None = None
        self._done: anyio.Event | None = None
        self._delivered = False
        self._collected = False
        self._progress: Progress | None = None  # what ctx.report recorded, once it did
        self._usage = _NO_USAGE
        self._iterations = 0
        self._trace: object = None
        self._holds_slot = False
        self._ending = False
        self._lends = 0
        self._traceback: str | None = None
        # True once its own session has state to release (children, names, a mailbox).
        self._owns_session = False

    @property
    def agent(self) -> str:
        """The agent type's name."""
        return self._spec.name

    @property
    def request(self) -> Request:
        """The request the runner receives."""
        return self._request

    @property
    def result(self) -> DelegateResult | None:
        """The envelope once the child has ended, else ``None``. Never consumes."""
        return self._envelope

    @property
    def done(self) -> anyio.Event:
        """Set once the child has ended and its envelope has been delivered."""
        if self._done is None:
            self._done = anyio.Event()
            if self._delivered:  # not merely ended: first read during delivery stays unset
                self._done.set()
        return self._done

    @property
    def collected(self) -> bool:
        """True once the envelope was consumed: drained from the mailbox (``drain``,
        ``drain_all``, ``wait``), by ``wait_result`` or ``wait_agent``, or returned by
        ``execute``. ``config.retain_collected`` may then forget the manager's record."""
        return self._collected

    async def wait(self) -> DelegateResult:
        """Block until the child has ended, then collect and return its envelope.

        Returning the envelope to its caller is a collection, as :meth:`SubagentManager.
        wait_result`'s: the mailbox entry is consumed, :attr:`collected` becomes true and
        ``config.retain_collected`` may forget the record. Waiting again returns the same
        envelope (this handle keeps it). A spawned child waiting here lends its slot.
        Cancellation: the caller's cancellation does not affect the child and collects
        nothing.
        """
        envelope = self._envelope
        if envelope is None:
            lend = self._manager.lend_slot()
            if lend is NO_LEND:  # a root parent: no context to enter and leave
                await self.done.wait()
            else:
                async with lend:
                    await self.done.wait()
            envelope = self._envelope
            assert envelope is not None
        if not self._collected:
            self._manager.collect(self)
        return envelope

    def _check_can_delegate(self) -> None:
        """Raise :class:`SpawnRejected` unless this child is running (its session open).

        Every way into its session asks its own handle, not the manager's index: once its
        record is forgotten, the manager would take the id for a new root session.
        """
        if self.state != RUNNING or self._scope is None:
            raise SpawnRejected(
                "session_closed",
                f"session {self.task_id!r} has ended; its agent can no longer delegate",
            )

    def cancel(self) -> bool:
        """Ask the child to stop; see :meth:`SubagentManager.cancel`."""
        return self._manager._cancel(self)

    def elapsed(self) -> float:
        """Seconds since the spawn (until the end, once ended)."""
        from time import perf_counter

        if self._envelope is not None:
            return self._envelope.duration_ms / 1000
        return perf_counter() - self._spawned_at

    def __repr__(self) -> str:
        return f"<SpawnHandle {self.task_id} {self.agent_path} {self.state}>"


_NO_USAGE: Final = Usage()
