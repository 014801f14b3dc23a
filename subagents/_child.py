"""Running one child to its one envelope: the runner call, the watchdog's verdict, cleanup
of the child's own subtree, and delivery.

:meth:`ChildRunner.run` is the only place a child's outcome is decided and
:meth:`ChildRunner.finalize` the only writer of its envelope (it ignores later calls):
exactly one envelope per spawn, whatever races.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Awaitable, Callable
from contextlib import nullcontext
from time import perf_counter
from typing import TYPE_CHECKING, Final, cast

import anyio

from ._backend import Backend, awaitable, coerce_result, run_local
from ._envelope import DelegateResult, Status
from ._events import COMPLETED, MAILBOX_FULL, STARTED, EventBus
from ._journal import NO_JOURNAL, Journal
from ._json import JSONValue
from ._ledger import charge_result
from ._limiter import SpawnLimiter
from ._notifier import CompletionNotifier
from ._outcome import envelope_for
from ._record import NO_LEND, QUEUED, RUNNING, SETTLED, ChildRecord
from ._runner_errors import interrupts, runner_error
from ._sessions import Sessions
from ._spec import Result
from ._tracing import Telemetry
from ._watchdog import Watchdog

if TYPE_CHECKING:
    from ._context import RunContext

__all__ = ["ChildRunner", "CompletionEvents", "ContextFactory"]

ContextFactory = Callable[[ChildRecord, "float | None"], "RunContext"]
"""``make(record, deadline)``: the :class:`RunContext` a child's runner receives."""

logger = logging.getLogger("subagents")

_ENTERED: Final = nullcontext()  # a scope the caller has entered already


class CompletionEvents:
    """Publishes ``subagent.completed`` (and ``subagent.mailbox_full``) for an envelope:
    the notifier's ``publish``."""

    def __init__(self, events: EventBus, sessions: Sessions, default_capacity: int) -> None:
        self._events = events
        self._sessions = sessions
        self._default_capacity = default_capacity

    def __call__(self, event_type: str, session_id: str, envelope: DelegateResult) -> None:
        bus = self._events
        if not bus.active:
            return
        data: dict[str, JSONValue]
        if event_type == MAILBOX_FULL:
            capacity = self._sessions.full_capacity(session_id, self._default_capacity)
            data = {"agent": envelope.agent, "status": envelope.status.value, "capacity": capacity}
        else:
            data = envelope.to_dict()
            record = self._sessions.get(envelope.task_id)
            if record is not None and record.traceback is not None:
                data["traceback"] = record.traceback
        bus.publish(
            event_type,
            session_id=session_id,
            task_id=envelope.task_id,
            agent_path=envelope.agent_path,
            data=data,
        )


class ChildRunner:
    """Runs children and delivers their envelopes."""

    def __init__(
        self,
        *,
        backend: Backend,
        make_context: ContextFactory,
        sessions: Sessions,
        limiter: SpawnLimiter,
        watchdog: Watchdog,
        notifier: CompletionNotifier,
        completion_events: CompletionEvents,
        events: EventBus,
        telemetry: Telemetry,
        settle_timeout: float,
        journal: Journal = NO_JOURNAL,
        commit_first: bool = False,
    ) -> None:
        self._backend = backend
        self._journal = journal
        self._commit_first = commit_first
        self._make_context = make_context
        self._sessions = sessions
        self._limiter = limiter
        self._watchdog = watchdog
        self._notifier = notifier
        self._completion_events = completion_events
        self._events = events
        self._telemetry = telemetry
        self._settle_timeout = settle_timeout
        self.settled = 0
        """Children that have ended in an envelope."""
        # Bound once: each sync child's callback lives until its commit, through
        # several collections, so it is a partial of this, not a closure of its own.
        self._on_committed = self._committed

    async def run(self, record: ChildRecord, worker_scope: anyio.CancelScope | None = None) -> None:
        """Run one child to its envelope. Only cancellation from outside propagates.

        With ``worker_scope`` (a worker's reused scope, not yet cancelled) the child runs
        under it, its deadline kept by the watchdog; its cancellation or timeout then
        propagates out of this call, after the envelope, for the worker's ``with`` to absorb.
        """
        counted = self._starting(record)
        timeout = record.timeout
        deadline = math.inf if timeout is None else anyio.current_time() + timeout
        ctx = self._make_context(record, None if timeout is None else deadline)
        result: Result | str | None = None
        error: BaseException | None = None
        try:
            if worker_scope is None:
                scope = anyio.CancelScope(deadline=deadline)
            else:
                scope = worker_scope
                if timeout is not None:
                    self._watchdog.arm(scope, deadline)
            # On a worker its scope is already entered (by the worker): nothing to enter.
            with scope if worker_scope is None else _ENTERED:
                record.scope = scope
                if record.cancel_reason:
                    scope.cancel()
                try:
                    if counted:  # a re-runnable try is durably counted before it runs
                        await self._journal.wait_journaled(counted)
                    pending, check = self._start_runner(record, ctx)
                    result = check(record.spec.name, await pending)
                except BaseException as exc:
                    error = runner_error(exc)
                    if error is None:
                        raise
            # Decided now, before cleanup awaits: a cancel arriving during cleanup is too
            # late to change the outcome. A result after the deadline never counts.
            record.ending = True
            if record.cancel_reason is not None:
                status = Status.CANCELLED
            elif scope.cancel_called or anyio.current_time() >= deadline:
                status = Status.TIMEOUT
            else:
                status = Status.COMPLETED if error is None else Status.ERROR
        except BaseException as exc:
            # Cancelled from outside (manager shutdown, or the caller of execute), or the
            # runner interrupted the program: the envelope is still produced, then the
            # exception goes on.
            record.ending = True
            fatal = exc if interrupts(exc) else None
            status = self._interrupted(record, worker_scope, fatal)
            live = self._runner_over(record, worker_scope)
            if live:
                await self._settle(record, live)
            self._finish(record, ctx.attempt, status, None, fatal)
            raise
        live = self._runner_over(record, worker_scope)
        if live:  # only then an await: most children delegate nothing
            await self._settle(record, live)
        self._finish(record, ctx.attempt, status, result, error)

    def _starting(self, record: ChildRecord) -> int:
        """The child takes its turn: running from now, journaled and evented so. Returns
        the start's journal token when the try must be committed before the runner runs
        (a re-runnable agent's, so that its cap of tries counts every one), else 0."""
        record.state = RUNNING
        if record.account is not None:  # a seconds budget above it may end it sooner
            record.timeout = record.account.start(record.timeout, anyio.current_time())
        started = record.started_at = perf_counter()
        counted = 0
        if record.journaled:
            try:
                token = self._journal.started(record.task_id)
            except Exception:
                logger.exception("journaling the start of child %r failed", record.task_id)
            else:
                counted = token if record.spec.resume == "rerun" else 0
        if self._events.active:
            self._events.publish(
                STARTED,
                session_id=record.session_id,
                task_id=record.task_id,
                agent_path=record.agent_path,
                data={"queue_ms": int((started - record.spawned_at) * 1000)},
            )
        return counted

    def _start_runner(
        self, record: ChildRecord, ctx: RunContext
    ) -> tuple[Awaitable[object], Check]:
        """What to await for ``record``'s result, and the check its return value gets."""
        spec = record.spec
        backend = self._backend
        if record.trace is None and backend is run_local and spec.retry is None:
            # The plain runner is awaited in place: run_local's own awaitable check, no
            # retry wrapper, and a str kept as the output (no Result made of it).
            return awaitable(spec.name, spec.runner(record.request, ctx)), _plain_or_result
        if record.trace is None:
            pending = backend(spec, record.request, ctx)
        else:
            pending = self._telemetry.run(backend, record, ctx)
        # run_local checked its return; a custom backend may hand back anything, and a
        # bad return must end this child in an error envelope.
        return pending, _checked if backend is run_local else coerce_result

    def _interrupted(
        self,
        record: ChildRecord,
        worker_scope: anyio.CancelScope | None,
        fatal: BaseException | None,
    ) -> Status:
        """The status of a run that an exception ended: an interrupt of the program is the
        runner's error, a cancelled worker scope the watchdog's timeout (unless a cancel
        was requested), anything else a cancellation of the caller."""
        if fatal is not None:
            return Status.ERROR
        if record.cancel_reason is not None:
            return Status.CANCELLED
        if worker_scope is not None and worker_scope.cancel_called:
            return Status.TIMEOUT
        record.cancel_reason = "the caller was cancelled"
        return Status.CANCELLED

    def _runner_over(
        self, record: ChildRecord, worker_scope: anyio.CancelScope | None
    ) -> dict[ChildRecord, None] | None:
        """The runner is over: off the watchdog, its session released unless it has
        unfinished children, which are returned for :meth:`_settle`."""
        record.scope = None
        if worker_scope is not None and record.timeout is not None:
            self._watchdog.disarm(worker_scope)
        if not record.owns_session:  # most children have no mailbox, names or children
            return None
        return self._sessions.end_session_of(record)

    def _finish(
        self,
        record: ChildRecord,
        attempt: int,
        status: Status,
        result: Result | str | None,
        error: BaseException | None,
    ) -> None:
        keep_traceback = self._events.active
        if record.account is not None:
            charge_result(record, status, result, attempt)
        envelope = envelope_for(
            record, status, attempt, result=result, error=error, keep_traceback=keep_traceback
        )
        self.finalize(record, envelope)

    async def _settle(self, record: ChildRecord, live: dict[ChildRecord, None]) -> None:
        """Cancel the unfinished children of an ended child, wait (bounded) for them to
        settle, then release its session."""
        for child in live:
            self.cancel(child, "its parent agent ended")
        # Its slot is not needed to wait, and a cancelled child of a full limit may be
        # waiting for it. A spawned child's runner is over: it gives the slot up for good
        # (no wait to take one back after settle_timeout); an execute() delegate lends
        # the slot of the spawned child it runs in, whose runner goes on.
        if record.holds_slot:
            self._limiter.give_up_slot(record)
            lend = NO_LEND
        else:
            lend = self._limiter.lend_slot()
        # The lend ends inside the bound too: taking the slot back must not outlast it.
        with anyio.CancelScope(shield=True), anyio.move_on_after(self._settle_timeout):
            async with lend:
                for child in list(live):
                    await child.done.wait()
        self._sessions.release(record.task_id)

    async def close_session(self, session_id: str) -> None:
        """Cancel the unfinished children of ``session_id``, wait (bounded by
        ``settle_timeout``, the caller's slot lent) until each has settled, then release
        the session, even if the caller is cancelled."""
        sessions = self._sessions
        live = sessions.start_closing(session_id)
        try:
            for record in live:
                self.cancel(record, "its session was closed")
            with anyio.move_on_after(self._settle_timeout):
                async with self._limiter.lend_slot():  # a child closing one lends its slot
                    for record in live:
                        await record.done.wait()
        finally:
            sessions.finish_closing(session_id)

    def cancel(self, record: ChildRecord, reason: str) -> bool:
        """Ask a child to stop: a queued one ends at once, a running one is cancelled at
        its next checkpoint. False if it had ended, was being cancelled or is finishing."""
        if record.envelope is not None or record.cancel_reason or record.ending:
            return False
        record.cancel_reason = reason
        if record.state == QUEUED and not record.sync:
            self._dequeue(record, Status.CANCELLED)
        elif record.scope is not None:
            record.scope.cancel()
        return True

    def time_out(self, record: ChildRecord) -> bool:
        """End a child still waiting in the queue whose time ran out before it could start
        (a session's seconds budget): its envelope is ``timeout``, as if its watchdog had
        fired at once. False if it is not waiting in the queue, or is ending already."""
        if record.state != QUEUED or record.sync or record.envelope is not None:
            return False
        if record.cancel_reason or record.ending:
            return False
        record.ending = True  # decided: a cancel arriving now is too late
        self._dequeue(record, Status.TIMEOUT)
        return True

    def _dequeue(self, record: ChildRecord, status: Status) -> None:
        """End a queued child now: out of the queue, its envelope made with ``status``."""
        self._limiter.withdraw(record)
        if record.owns_session:  # a mailbox made for it while queued: as if it ran
            self._sessions.release(record.task_id)
        self.finalize(record, envelope_for(record, status))

    def finalize(self, record: ChildRecord, envelope: DelegateResult) -> None:
        """Record and deliver the one envelope of ``record``; later calls do nothing.

        A journaled child of a manager whose durability is ``"sync"`` is handed on (its
        envelope readable in the mailbox, ``done`` set, the completed event) only once the
        store has committed its end; every other child at once.
        """
        if record.envelope is not None or record.committing:
            return
        record.scope = None
        if record.journaled and self._commit_first:
            self._finalize_after_commit(record, envelope)
            return
        self._settle_record(record, envelope)
        overflowed = False
        if not record.sync:
            overflowed = self._notifier.put(record.session_id, record.task_id, envelope) is None
        if record.journaled:  # after the mailbox's put, whose envelope row it links
            self._journal_end(record, envelope)
        self._hand_on(record, envelope, overflowed)

    def _finalize_after_commit(self, record: ChildRecord, envelope: DelegateResult) -> None:
        record.committing = True
        delivered = self._notifier.put(record.session_id, record.task_id, envelope, durable=True)
        committed = functools.partial(self._on_committed, record, envelope, delivered is None)
        if not self._journal_end(record, envelope, committed):
            committed()  # the store refused the write: handed on from memory, now

    def _committed(self, record: ChildRecord, envelope: DelegateResult, overflowed: bool) -> None:
        record.committing = False
        self._settle_record(record, envelope)
        self._hand_on(record, envelope, overflowed)

    def _journal_end(
        self,
        record: ChildRecord,
        envelope: DelegateResult,
        then: Callable[[], object] | None = None,
    ) -> bool:
        """Journal ``record``'s end; False if the store refused it (logged)."""
        enabled = getattr(self._notifier, "enabled", True)
        deliver = enabled and self._sessions.unclaimed(record.session_id)
        try:
            self._journal.ended(record.task_id, record.session_id, envelope, deliver, then)
        except Exception:
            logger.exception("journaling the end of child %r failed", record.task_id)
            return False
        return True

    def _settle_record(self, record: ChildRecord, envelope: DelegateResult) -> None:
        record.envelope = envelope
        record.state = SETTLED
        self.settled += 1
        self._sessions.ended(record)

    def _hand_on(self, record: ChildRecord, envelope: DelegateResult, overflowed: bool) -> None:
        """The envelope's events, then wake the waiters (even if a custom notifier raises:
        its error goes on, and no waiter is left waiting)."""
        try:
            if record.sync:
                self._completion_events(COMPLETED, record.session_id, envelope)
            else:
                self._notifier.announce(
                    record.session_id, record.task_id, envelope, overflowed=overflowed
                )
            record.traceback = None
            if record.trace is not None:
                self._telemetry.finish(record, envelope)
        finally:
            record.mark_delivered()
            self._sessions.delivered(record)


Check = Callable[[str, object], "Result | str"]
"""``check(agent, returned)``: what a run returned, as the envelope takes it."""


def _plain_or_result(agent: str, returned: object) -> Result | str:
    """A plain runner's return: a str stays a str (the envelope takes it as the output)."""
    return returned if type(returned) is str else coerce_result(agent, returned)


def _checked(agent: str, returned: object) -> Result | str:
    """What run_local returned: checked already."""
    return cast("Result | str", returned)
