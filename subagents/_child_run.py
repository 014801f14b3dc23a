"""Running one child to its envelope: the watchdog's verdict, cleanup of its own subtree,
the envelope, and delivery. A mixin of :class:`~subagents.SubagentManager`.

``_run`` is the only place a child's outcome is decided and ``_finalize`` the only writer
of its envelope (it ignores later calls): exactly one envelope per spawn, whatever races.
"""

from __future__ import annotations

import asyncio
import logging
import math
import traceback
from contextlib import AbstractAsyncContextManager, nullcontext
from time import perf_counter
from types import CoroutineType
from typing import TYPE_CHECKING, Final, Literal, cast

import anyio

from ._backend import Backend, awaitable, coerce_result, run_local
from ._context import RunContext
from ._envelope import (
    DelegateResult,
    Status,
    Usage,
    bound_text,
    clean_text,
    describe_exception,
    now_ms,
    trusted_envelope,
)
from ._events import COMPLETED, MAILBOX_FULL, STARTED, EventBus
from ._handle import NO_LEND, RUNNING, SETTLED, SpawnHandle
from ._json import JSONValue
from ._mailbox import BaseMailbox, release
from ._notifier import CompletionNotifier
from ._paths import NameAllocator
from ._progress import MAX_FILES, MAX_OUTPUT_CHARS, cap_files, cap_output
from ._spec import Result, SubagentConfig
from ._tracing import Telemetry

if TYPE_CHECKING:
    from ._manager import SubagentManager

__all__ = ["MAX_FILES", "MAX_OUTPUT_CHARS", "MAX_PATH_CHARS", "ChildRuns"]

MAX_PATH_CHARS: Final = 4096  # characters kept of one path (PATH_MAX on Linux)
logger = logging.getLogger("subagents")
_ENTERED: Final = nullcontext()  # a scope the caller has entered already
_ERROR_CHARS: Final = 500  # an envelope's error text, as describe_exception bounds it


def _interrupts(exc: BaseException) -> bool:
    """A KeyboardInterrupt or SystemExit, alone or in an exception group: it must go on
    up and stop the program, as README promises."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup((KeyboardInterrupt, SystemExit)) is not None
    return isinstance(exc, (KeyboardInterrupt, SystemExit))


class ChildRuns:
    """Runs children and delivers their envelopes; state lives on the manager."""

    config: SubagentConfig
    events: EventBus
    _telemetry: Telemetry
    _backend: Backend
    _notifier: CompletionNotifier
    _tasks: dict[str, SpawnHandle]
    _live: dict[str, dict[SpawnHandle, None]]
    _mailboxes: dict[str, BaseMailbox]
    _names: dict[str, NameAllocator]
    _forgotten_sessions: set[str]
    _deadlines: dict[SpawnHandle, float]
    _watch_at: float
    _settled: int
    _state: Literal["new", "running", "closing", "closed"]

    if TYPE_CHECKING:

        def _watch(self, handle: SpawnHandle, deadline: float) -> None: ...

        def _cancel(self, handle: SpawnHandle, reason: str = ...) -> bool: ...

        def lend_slot(self) -> AbstractAsyncContextManager[None]: ...

        def _release_slot(self, handle: SpawnHandle) -> None: ...

        def _pump(self) -> None: ...

        def _drop_record(self, handle: SpawnHandle) -> None: ...

    async def _run(
        self, handle: SpawnHandle, worker_scope: anyio.CancelScope | None = None
    ) -> None:
        """Run one child to its envelope. Only cancellation from outside propagates.

        With ``worker_scope`` (a worker's reused scope, not yet cancelled) the child runs
        under it, its deadline kept by the shared watchdog; its cancellation or timeout then
        propagates out of this call, after the envelope, for the worker's ``with`` to absorb.
        """
        handle.state = RUNNING
        started = handle._started_at = perf_counter()
        if self.events._subscribers:  # .active without the property call
            self.events.publish(
                STARTED,
                session_id=handle.session_id,
                task_id=handle.task_id,
                agent_path=handle.agent_path,
                data={"queue_ms": int((started - handle._spawned_at) * 1000)},
            )
        timeout = handle._timeout
        deadline = math.inf if timeout is None else anyio.current_time() + timeout
        ctx = RunContext(
            cast("SubagentManager", self),
            handle,
            deadline=None if timeout is None else deadline,
            permissions=handle._permissions,
        )
        result: Result | str | None = None
        error: BaseException | None = None
        fatal: BaseException | None = None  # a KeyboardInterrupt or SystemExit of the runner
        try:
            if worker_scope is not None and timeout is not None:
                if deadline < self._watch_at:
                    self._watch(handle, deadline)  # the watchdog must wake earlier
                else:
                    self._deadlines[handle] = deadline
            # On a worker its scope is already entered (by the worker): nothing to enter.
            scope = anyio.CancelScope(deadline=deadline) if worker_scope is None else worker_scope
            with scope if worker_scope is None else _ENTERED:
                handle._scope = scope
                if handle._cancel_requested:
                    scope.cancel()
                try:
                    spec = handle._spec
                    backend = self._backend
                    if handle._trace is None and backend is run_local and spec.retry is None:
                        # run_local inlined (the common case); a str stays a str, which the
                        # envelope takes as the output (no Result record for it).
                        pending = spec.runner(handle._request, ctx)
                        if type(pending) is not CoroutineType:  # rare: check what it is
                            pending = awaitable(spec.name, pending)
                        raw: object = await pending
                        result = raw if type(raw) is str else coerce_result(spec.name, raw)
                    else:
                        if handle._trace is None:
                            raw = await backend(spec, handle._request, ctx)
                        else:
                            raw = await self._telemetry.run(backend, handle, ctx)
                        # run_local checked its return; a custom backend may hand back
                        # anything, and a bad return must end this child in an error envelope.
                        result = raw if backend is run_local else coerce_result(spec.name, raw)
                except Exception as exc:
                    error = exc
                except anyio.get_cancelled_exc_class() as exc:
                    if _being_cancelled():
                        raise  # a real cancellation: the watchdog, a cancel, or from outside
                    # Nothing cancelled us: the runner raised a cancellation of its own (on
                    # asyncio: it awaited a future someone else cancelled). Its error, not ours
                    # to propagate (that would kill this worker and stall the queue).
                    error = RuntimeError(
                        f"the runner raised {type(exc).__qualname__} but nothing cancelled it"
                    )
                    error.__cause__ = exc
                except BaseException as exc:
                    # Not an Exception: KeyboardInterrupt, SystemExit, GeneratorExit, or one of
                    # the runner's own. The envelope names it, whatever happens next.
                    if _interrupts(exc):
                        fatal = exc  # the envelope, then on up: it stops the program
                        raise
                    if (
                        isinstance(exc, BaseExceptionGroup)
                        and exc.subgroup(anyio.get_cancelled_exc_class())
                        and _being_cancelled()
                    ):
                        raise  # holds the cancellation of this task, which is never swallowed
                    error = exc  # the runner's error, like any other: the worker goes on
            # Decided now, before cleanup awaits: a cancel arriving during cleanup is too
            # late to change the outcome. A result after the deadline never counts.
            handle._ending = True
            cancelled = handle._cancel_requested is not None
            timed_out = not cancelled and (scope.cancel_called or anyio.current_time() >= deadline)
        except BaseException:
            handle._ending = True
            # Cancelled from outside (manager shutdown, or the caller of execute): the
            # envelope is still produced, then the cancellation goes on.
            status = Status.CANCELLED
            if fatal is not None:
                status = Status.ERROR  # the runner interrupted the program: say so
            elif handle._cancel_requested is None:
                if worker_scope is not None and worker_scope.cancel_called:
                    status = Status.TIMEOUT  # the watchdog cancelled the worker scope
                else:
                    handle._cancel_requested = "the caller was cancelled"
            live = self._end_session_of(handle)
            if live:
                await self._settle_children(handle, live)
            self._finalize(handle, self._ended(handle, status, ctx, error=fatal))
            raise
        live = self._end_session_of(handle)
        if live:  # only then an await: most children delegate nothing
            await self._settle_children(handle, live)
        if cancelled:
            envelope = self._ended(handle, Status.CANCELLED, ctx)
        elif timed_out:
            envelope = self._ended(handle, Status.TIMEOUT, ctx)
        elif error is not None:
            envelope = self._ended(handle, Status.ERROR, ctx, error=error)
        else:
            assert result is not None
            envelope = self._ended(handle, Status.COMPLETED, ctx, result=result)
        self._finalize(handle, envelope)

    def _end_session_of(self, handle: SpawnHandle) -> dict[SpawnHandle, None] | None:
        """A child has ended: drop its scope and deadline; release its mailbox and names,
        unless it has unfinished children, which it returns for :meth:`_settle_children`."""
        handle._scope = None
        self._deadlines.pop(handle, None)
        if not handle._owns_session:  # most children: no mailbox, names or children
            return None
        session = handle.task_id
        live = self._live.pop(session, None)
        if live:
            return live
        self._release_session(session)
        return None

    async def _settle_children(self, handle: SpawnHandle, live: dict[SpawnHandle, None]) -> None:
        """Cancel the unfinished children of an ended child, wait (bounded) for them to
        settle, then release its mailbox and names."""
        for child in live:
            self._cancel(child, "its parent agent ended")
        # Its slot is not needed to wait, and a cancelled child of a full limit may be
        # waiting for it. A spawned child's runner is over: it gives the slot up for good
        # (no wait to take one back after settle_timeout); an execute() delegate lends
        # the slot of the spawned child it runs in, whose runner goes on.
        if handle._holds_slot:
            self._release_slot(handle)
            if self._state == "running":
                self._pump()
            lend = NO_LEND
        else:
            lend = self.lend_slot()
        # The lend ends inside the bound too: taking the slot back must not outlast it.
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.config.settle_timeout):
            async with lend:
                for child in list(live):
                    await child.done.wait()
        self._release_session(handle.task_id)

    def _release_session(self, session: str) -> None:
        mailbox = self._mailboxes.pop(session, None)
        if mailbox is not None:
            release(mailbox)
        self._names.pop(session, None)

    def _ended(
        self,
        handle: SpawnHandle,
        status: Status,
        ctx: RunContext | None,
        *,
        result: Result | str | None = None,
        error: BaseException | None = None,
    ) -> DelegateResult:
        """The envelope of ``handle``'s outcome; never raises. If what the runner left
        (its result, its exception, its reports) cannot be made into one, the child still
        gets an ``error`` envelope saying so, rather than none."""
        try:
            return self._envelope_of(handle, status, ctx, result=result, error=error)
        except Exception as exc:
            logger.exception("building the envelope of task %s failed", handle.task_id)
            spawned = handle._spawned_at
            return trusted_envelope(
                handle._spec.name,
                handle.task_id,
                Status.ERROR,
                "",
                (),
                f"the outcome of this run could not be recorded ({type(exc).__name__})",
                "EnvelopeError",
                int((perf_counter() - spawned) * 1000),
                0,
                0,
                1,
                Usage(),
                now_ms(),
                handle.agent_path,
                handle.parent_path,
            )

    def _envelope_of(
        self,
        handle: SpawnHandle,
        status: Status,
        ctx: RunContext | None,
        *,
        result: Result | str | None,
        error: BaseException | None,
    ) -> DelegateResult:
        end = perf_counter()
        started = handle._started_at
        progress = handle._progress
        output = "" if progress is None else progress.output()
        usage = handle._usage
        iterations = handle._iterations
        extra_files: tuple[str, ...] = ()
        message = ""
        error_type = ""
        if status is Status.COMPLETED and result is not None:
            if isinstance(result, str):
                output = result  # a runner's plain text: the rest is what it reported
            else:
                output = result.output
                usage = result.usage if result.usage else usage
                iterations = result.iterations or iterations
                extra_files = result.files_changed
                if result.error or result.status is Status.ERROR:
                    status = Status.ERROR
                    message = bound_text(result.error or "the runner reported an error", 500)
                    error_type = "RunnerReportedError"
                elif result.status is not None and result.status is not Status.COMPLETED:
                    status = result.status
                    message = f"the runner reported status {status.value}"
                    error_type = status.value
        elif status is Status.ERROR and error is not None:
            error_type, message = describe_exception(error)
            if not isinstance(error, Exception):  # KeyboardInterrupt and the like
                message = bound_text(f"the runner raised {message}", _ERROR_CHARS)
            if self.events.active:
                handle._traceback = clean_text("".join(traceback.format_exception(error)))
        elif status is Status.TIMEOUT:
            error_type = "timeout"
            message = f"watchdog: no result within {handle._timeout:g} s"
        elif status is Status.CANCELLED:
            error_type = "cancelled"
            reason = handle._cancel_requested
            message = f"cancelled: {reason}" if reason else "cancelled"
        output = cap_output(output)
        # trusted_envelope makes output, error and paths JSON-safe (clean_text).
        files = cap_files(extra_files) if progress is None else progress.files(extra_files)
        if files:
            files = tuple(bound_text(f, MAX_PATH_CHARS) for f in files)
        return trusted_envelope(
            handle._spec.name,
            handle.task_id,
            status,
            output,
            files,
            message,
            error_type,
            int((end - handle._spawned_at) * 1000),
            # never started (cancelled in the queue): all of its time was queue wait
            int(((end if started is None else started) - handle._spawned_at) * 1000),
            iterations,
            ctx.attempt if ctx is not None else 1,
            usage,
            now_ms(),
            handle.agent_path,
            handle.parent_path,
        )

    def _finalize(self, handle: SpawnHandle, envelope: DelegateResult) -> None:
        """Record and deliver the one envelope of ``handle``; later calls do nothing."""
        if handle._envelope is not None:
            return
        handle._envelope = envelope
        handle.state = SETTLED
        handle._scope = None
        self._settled += 1
        live = self._live.get(handle.session_id)
        if live is not None:
            live.pop(handle, None)
        if handle.sync:
            self._publish_completed(COMPLETED, handle.session_id, envelope)
        else:
            self._notifier.notify(handle.session_id, handle.task_id, envelope)
        handle._traceback = None
        if handle._trace is not None:
            self._telemetry.finish(handle, envelope)
        handle._delivered = True
        if handle._done is not None:
            handle._done.set()
            # Waiters hold it; later reads of handle.done get a new, already set event.
            # Keeping it would keep three objects per waited child alive for good.
            handle._done = None
        if handle.session_id in self._forgotten_sessions:
            # Its parent's record is gone (it outlived settle_timeout): nobody can collect
            # it through the parent, so it goes as its ended siblings went.
            self._drop_record(handle)

    def _full_capacity(self, session_id: str) -> int:
        """The capacity of the session mailbox that was just found full."""
        mailbox = self._mailboxes.get(session_id)
        if mailbox is None:
            return self.config.mailbox_capacity
        return mailbox.statistics().capacity

    def _publish_completed(
        self, event_type: str, session_id: str, envelope: DelegateResult
    ) -> None:
        bus = self.events
        if not bus._subscribers:  # not .active: no property call per child
            return
        data: dict[str, JSONValue]
        if event_type == MAILBOX_FULL:
            data = {
                "agent": envelope.agent,
                "status": envelope.status.value,
                "capacity": self._full_capacity(session_id),
            }
        else:
            data = envelope.to_dict()
            handle = self._tasks.get(envelope.task_id)
            if handle is not None and handle._traceback is not None:
                data["traceback"] = handle._traceback
        bus.publish(
            event_type,
            session_id=session_id,
            task_id=envelope.task_id,
            agent_path=envelope.agent_path,
            data=data,
        )


def _being_cancelled() -> bool:
    """Whether the current task is being cancelled, so a cancellation the runner raised is
    this task's to propagate rather than the runner's own error.

    anyio's scopes cover the watchdog, ``cancel`` and a host's anyio or trio timeout. On
    asyncio a host may also cancel natively (``task.cancel()``, ``asyncio.timeout``,
    ``wait_for``), which no anyio scope sees: the task's ``cancelling()`` count says so.
    """
    if anyio.current_effective_deadline() == -math.inf:
        return True
    try:
        task = asyncio.current_task()
    except RuntimeError:  # not on asyncio
        return False
    return task is not None and task.cancelling() > 0
