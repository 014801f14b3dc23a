"""SubagentManager: spawn (fire-and-forget) and execute (delegate), sessions, results
and shutdown. Admission (queue, workers, slots, watchdog) is in ``_admission.py``; running
one child to its envelope in ``_child_run.py``; unknown-id help in ``_lookup.py``.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
from collections import deque
from collections.abc import Callable, Iterable
from time import perf_counter
from types import TracebackType
from typing import Final, Literal

import anyio
import attrs
from anyio.abc import TaskGroup

from ._admission import Admission
from ._backend import Backend, run_local
from ._child_run import ChildRuns
from ._completions import Completions
from ._envelope import (
    DelegateResult,
    Status,
)
from ._errors import ConfigError, SpawnRejected, UnknownAgent, UnknownTask
from ._events import SPAWNED, EventBus
from ._handle import NO_LEND, QUEUED, SETTLED, SpawnHandle
from ._lookup import IdIndex, live_ids_sentence
from ._mailbox import BaseMailbox, Mailbox, closed_mailbox, release
from ._notifier import CompletionNotifier
from ._paths import AgentPath, NameAllocator, child_path
from ._spec import UNSET, AgentSpec, Request, SpawnOptions, SubagentConfig, _Unset
from ._tracing import Telemetry
from ._validators import count, seconds

__all__ = ["DEFAULT_SESSION", "ManagerStatistics", "SubagentManager"]

DEFAULT_SESSION: Final = "root"
logger = logging.getLogger("subagents")

_ROOT: Final = AgentPath.root()


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


class SubagentManager(Admission, ChildRuns):
    """Runs subagents: fire-and-forget :meth:`spawn` and synchronous :meth:`execute`.

    Use it as an async context manager; children run in its task group, so every one of
    them has ended (in an envelope) when the ``async with`` block exits::

        async with SubagentManager([spec]) as manager:
            handle = manager.spawn("general", "summarise README.md")
            envelope = await handle.wait()

    Args:
        agents: agent types to register.
        config: settings (defaults: 4 concurrent spawns, 180 s watchdog, depth 3,
            mailbox of 64, 2000-character truncation).
        mailbox_factory: ``factory(session_id)`` builds a session's mailbox; default an
            in-memory :class:`Mailbox` with the configured capacity and TTL.
        notifier: delivers envelopes; default puts into the session mailbox and publishes
            ``subagent.completed`` on :attr:`events`.
        events: the lifecycle event bus (a new one by default).
        backend: the function that runs a child (default: the runner, in process).
    """

    def __init__(
        self,
        agents: Iterable[AgentSpec] = (),
        *,
        config: SubagentConfig | None = None,
        mailbox_factory: Callable[[str], BaseMailbox] | None = None,
        notifier: CompletionNotifier | None = None,
        events: EventBus | None = None,
        backend: Backend | None = None,
    ) -> None:
        self.config = config if config is not None else SubagentConfig()
        self.events = events if events is not None else EventBus()
        self._telemetry = Telemetry.from_config(self.config)
        self._specs: dict[str, AgentSpec] = {}
        for spec in agents:
            self.register(spec)
        self._mailbox_factory = mailbox_factory
        self._notifier = (
            notifier
            if notifier is not None
            else CompletionNotifier(
                self._delivery_mailbox,
                self._publish_completed,
                enabled=self.config.notify_completion,
            )
        )
        self._backend: Backend = backend if backend is not None else run_local
        self._tasks: dict[str, SpawnHandle] = {}
        self._ids = IdIndex()  # what an unknown id was probably meant to be
        self._live: dict[str, dict[SpawnHandle, None]] = {}
        # Every recorded child by session, oldest first (a dict: forgetting one is O(1)).
        self._by_session: dict[str, dict[SpawnHandle, None]] = {}
        self._mailboxes: dict[str, BaseMailbox] = {}
        self._names: dict[str, NameAllocator] = {}
        self._closed_sessions: set[str] = set()
        # Closed root sessions with no record left, oldest first: remembered (so spawns into
        # them stay refused) up to _CLOSED_MEMORY of them, so closing sessions stays bounded.
        self._closed_idle: dict[str, None] = {}
        # Retention (see forget()): collected records in collection order, kept at most
        # config.retain_collected of them; None keeps every record.
        self._retain = self.config.retain_collected
        self._retained: dict[SpawnHandle, None] = {}  # oldest first; O(1) removal
        self._forgot = False  # any record forgotten yet (unknown-id messages say so)
        # Sessions of forgotten children that still list children of their own: closed
        # until their listing empties (a late grandchild must not reopen them).
        self._forgotten_sessions: set[str] = set()
        # Callbacks run once when a session starts closing (session_signal: wait_agent).
        self._close_watchers: dict[str, dict[int, Callable[[], object]]] = {}
        self._watch_ids = itertools.count()
        self._queue: deque[SpawnHandle] = deque()
        self._deadlines: dict[SpawnHandle, float] = {}  # running spawns under the watchdog
        self._watch_at = math.inf  # the watchdog wakes then (<= every deadline it holds)
        self._watch_wake: anyio.Event | None = None
        self._queued = 0
        self._active = 0  # slots held (spawned children running, not lending)
        self._workers = 0  # worker tasks alive
        self._busy = 0  # workers inside a child run (holding or lending a slot)
        self._resumers: deque[tuple[SpawnHandle, anyio.Event]] = deque()
        self._borrows = 0
        # Children on a borrowed slot (counted in _active too), oldest first: repaid first.
        self._borrowers: dict[SpawnHandle, None] = {}
        self._high_water = 0
        self._spawned = 0
        self._settled = 0
        self._limit = self.config.max_concurrent_spawns
        self._tg: TaskGroup | None = None
        self._state: Literal["new", "running", "closing", "closed"] = "new"

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> SubagentManager:
        if self._state != "new":
            raise RuntimeError("a SubagentManager can be entered only once")
        self._telemetry.resolve()
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        self._state = "running"
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Cancel every child (queued or running), wait for all to settle, stop the workers.

        Every child ends in an envelope (``cancelled`` unless it finished first). After
        ``config.settle_timeout`` the task group is cancelled; a runner that catches the
        cancellation is cancelled again at its next checkpoint, and parents waiting to take
        back a lent slot add no wait of their own, but a runner that shields itself holds
        ``aclose`` until it ends (nothing can abandon it). Must be called from the task that
        entered the manager. Idempotent.
        """
        if self._state in ("closing", "closed"):
            return
        if self._state == "new":
            self._state = "closed"
            return
        self._state = "closing"
        for session in list(self._close_watchers):
            self._fire_close_watchers(session)
        live = [h for handles in self._live.values() for h in handles]
        for handle in live:
            self._cancel(handle, "the manager was closed")
        tg = self._tg
        assert tg is not None
        try:
            with anyio.CancelScope(shield=True), anyio.move_on_after(self.config.settle_timeout):
                for handle in live:
                    await handle.done.wait()
            # Whatever still runs ignored cancellation for settle_timeout: cut it off.
            tg.cancel_scope.cancel()
            await tg.__aexit__(None, None, None)
        finally:
            self._state = "closed"
            for mailbox in self._mailboxes.values():
                release(mailbox)
            self._mailboxes.clear()

    @property
    def running(self) -> bool:
        """True between entering and closing."""
        return self._state == "running"

    # ------------------------------------------------------------------ registry

    def register(self, spec: AgentSpec) -> None:
        """Add an agent type. Raises :class:`ConfigError` if the name is taken."""
        if not isinstance(spec, AgentSpec):
            raise ConfigError("agents", "AgentSpec instances", spec)
        if spec.name in self._specs:
            raise ConfigError("agents", "unique agent names", spec.name)
        self._specs[spec.name] = spec

    @property
    def agents(self) -> dict[str, AgentSpec]:
        """The registered agent types by name (a copy)."""
        return dict(self._specs)

    def get_agent(self, name: str) -> AgentSpec:
        """The agent type called ``name``; raises :class:`UnknownAgent` listing the known."""
        spec = self._specs.get(name)
        if spec is None:
            raise UnknownAgent(name, self._specs)
        return spec

    # ------------------------------------------------------------------ limiter

    @property
    def max_concurrent_spawns(self) -> int:
        """The concurrency limit for spawned children; settable at run time."""
        return self._limit

    @max_concurrent_spawns.setter
    def max_concurrent_spawns(self, value: int) -> None:
        self.set_max_concurrent_spawns(value)

    def set_max_concurrent_spawns(self, value: int) -> None:
        """Change the limit in place. Raising it starts queued children (and resumes parents
        waiting to take their lent slot back) at once; lowering it lets running children
        finish and admits nobody until below the new limit.

        Raises:
            ConfigError: ``value`` is not an integer >= 1 (0 would queue forever).
        """
        self._limit = count("max_concurrent_spawns", value, minimum=1)
        self._slot_freed()  # borrowed slots are repaid, then resuming parents go first
        if self._state == "running":
            self._pump()

    def statistics(self) -> ManagerStatistics:
        """A snapshot of the admission counters."""
        return ManagerStatistics(
            limit=self._limit,
            running=self._active,
            queued=self._queued,
            high_water=self._high_water,
            borrowed=len(self._borrowers),
            borrows=self._borrows,
            # A notifier subclass that skipped CompletionNotifier.__init__ counts nothing.
            mailbox_overflows=getattr(self._notifier, "overflows", 0),
            spawned=self._spawned,
            settled=self._settled,
            workers=self._workers,
        )

    # ------------------------------------------------------------------ spawn / execute

    def spawn(
        self,
        agent: str,
        input: str = "",
        *,
        session_id: str = DEFAULT_SESSION,
        name: str | None = None,
        timeout: float | _Unset | None = UNSET,
        options: SpawnOptions | None = None,
    ) -> SpawnHandle:
        """Start a child fire-and-forget and return its handle at once. Never blocks.

        The child waits (as a small record) for one of ``max_concurrent_spawns`` slots,
        in FIFO order, then runs under its watchdog. It belongs to ``session_id``, not to
        the calling task: it keeps running after the caller returns, and ends when it
        finishes, is cancelled, its session is closed or the manager closes. Its envelope
        goes to the session's mailbox (and the ``subagent.completed`` event).

        Args:
            agent: a registered agent type.
            input: the task text.
            session_id: the parent session (default ``"root"``; a child's session is its
                task id, which :meth:`RunContext.spawn` uses).
            name: path segment for the child (default: the agent name; repeats get -2, -3).
            timeout: watchdog seconds from the child's start; ``None`` disables it;
                omitted: the spawn option, the agent's, else ``config.spawn_timeout``.
            options: further overrides (prompt, model, files). ``name`` and ``timeout``
                go either here or as arguments: both is a ``ConfigError``.

        Raises:
            UnknownAgent: no such agent type (the message lists the registered ones).
            SpawnRejected: the depth limit, a closed session, or a manager not running.
            ConfigError: a malformed timeout, or one given twice; InvalidName: a
                malformed name.
        """
        handle = self._new_handle(agent, input, session_id, name, timeout, options, sync=False)
        free = self._limit - self._active
        ahead = self._queued
        handle.queue_position = 0 if ahead < free else ahead - free + 1
        self._queue.append(handle)
        self._queued += 1
        if handle._trace is not None:
            self._telemetry.queued(handle)
        if self._workers == self._busy:  # no idle worker will take it: _pump decides
            self._pump()
        return handle

    async def execute(
        self,
        agent: str,
        input: str = "",
        *,
        session_id: str = DEFAULT_SESSION,
        name: str | None = None,
        timeout: float | _Unset | None = UNSET,
        options: SpawnOptions | None = None,
    ) -> DelegateResult:
        """Delegate synchronously: run a child in the calling task and return its envelope.

        It does not take a spawn slot (a parent holding a slot that delegates would
        otherwise deadlock at a limit of 1). ``timeout`` defaults to
        ``config.execute_timeout``; a timeout, error or cancellation of the child is in the
        envelope, never raised. If the *caller* is cancelled, the child is cancelled, its
        envelope (``cancelled``) is still recorded and published, and the cancellation
        propagates.

        Raises:
            UnknownAgent, SpawnRejected, ConfigError: as :meth:`spawn`.
        """
        handle = self._new_handle(agent, input, session_id, name, timeout, options, sync=True)
        await self._run(handle)
        # Collected only once returned: a caller cancelled meanwhile never got the envelope,
        # so it stays uncollected (result(), tasks(), completions(), wait_result collect it).
        self.collect(handle)
        assert handle._envelope is not None
        return handle._envelope

    def _new_handle(
        self,
        agent: str,
        input: str,
        session_id: str,
        name: str | None,
        timeout: float | _Unset | None,
        options: SpawnOptions | None,
        *,
        sync: bool,
    ) -> SpawnHandle:
        if self._state != "running":
            raise SpawnRejected(
                "manager_closed",
                "the subagent manager is not running: enter it with `async with` first "
                "(or it was closed)",
            )
        spec = self._specs.get(agent)
        if spec is None:
            raise UnknownAgent(agent, self._specs)
        if not isinstance(input, str):
            raise ConfigError("input", "a string", input)
        if not isinstance(session_id, str):
            raise ConfigError("session_id", "a string", session_id)
        if session_id in self._closed_sessions:  # a root session or a running agent's
            raise SpawnRejected(
                "session_closed",
                f"session {session_id!r} is closed (close_session, or its agent ended)",
            )
        parent = self._tasks.get(session_id)
        if parent is not None:
            parent._check_can_delegate()
            parent_path = parent.agent_path
            permissions = spec.permissions.intersect(parent._permissions)
            parent._owns_session = True  # its names and live children, released as it ends
        else:
            parent_path = _ROOT
            permissions = spec.permissions.intersect(self.config.permissions)
        depth = 1 if parent is None else parent_path.depth + 1  # /root is at depth 0
        if depth > self.config.max_depth:
            raise SpawnRejected(
                "depth",
                f"delegation depth limit reached: {parent_path} is at depth "
                f"{parent_path.depth} and max_depth is {self.config.max_depth}, so it "
                "cannot have children",
            )
        if options is None:
            options = _NO_OPTIONS
        elif not isinstance(options, SpawnOptions):
            raise ConfigError("options", "a SpawnOptions or None", options)
        elif (twice := _given_twice(timeout, name, options)) is not None:
            raise twice
        if timeout is UNSET:
            if options.timeout is not None:
                timeout = options.timeout
            elif spec.timeout is not None:
                timeout = spec.timeout
            else:
                timeout = self.config.execute_timeout if sync else self.config.spawn_timeout
        elif timeout is not None:
            timeout = seconds("timeout", timeout, none_ok=True, zero_ok=False)
        allocator = self._names.get(session_id)
        if allocator is None:
            allocator = self._names[session_id] = NameAllocator()
        segment = allocator.allocate(name if name is not None else options.name or spec.name)
        task_id = _new_task_id()
        while task_id in self._tasks:  # pragma: no cover - 48 random bits
            task_id = _new_task_id()
        request = Request(
            agent=spec.name,
            input=input,
            prompt=options.prompt if options.prompt is not None else spec.prompt,
            files=options.files,
            model=options.model if options.model is not None else spec.model,
        )
        handle = SpawnHandle(
            self,
            task_id=task_id,
            session_id=session_id,
            spec=spec,
            request=request,
            agent_path=child_path(parent_path, segment),
            parent_path=parent_path,
            timeout=timeout,
            permissions=permissions,
            spawned_at=perf_counter(),
            sync=sync,
        )
        self._tasks[task_id] = handle
        self._ids.add(task_id)
        live = self._live.get(session_id)
        if live is None:
            live = self._live[session_id] = {}
        live[handle] = None
        by_session = self._by_session.get(session_id)
        if by_session is None:
            by_session = self._by_session[session_id] = {}
        by_session[handle] = None
        self._spawned += 1
        if self.events._subscribers:  # .active without the property call, once per spawn
            self.events.publish(
                SPAWNED,
                session_id=session_id,
                task_id=task_id,
                agent_path=handle.agent_path,
                data={
                    "agent": spec.name,
                    "parent_path": parent_path,
                    "mode": "execute" if sync else "spawn",
                    "timeout_s": timeout,
                },
            )
        if self._telemetry.active:
            handle._trace = self._telemetry.start(handle, parent)
        return handle

    # ------------------------------------------------------------------ cancellation

    def cancel(self, task_id: str) -> bool:
        """Ask a child to stop. Never blocks.

        A queued child leaves the queue at once and ends ``cancelled`` (it never takes a
        slot); a running child is cancelled at its next checkpoint. Returns True if this
        call requested the cancellation, False if the child had already ended or was
        already being cancelled.

        Raises:
            UnknownTask: no such task id.
        """
        return self._cancel(self.handle(task_id), "cancelled by request")

    def _cancel(self, handle: SpawnHandle, reason: str = "cancelled by request") -> bool:
        if handle._envelope is not None or handle._cancel_requested or handle._ending:
            return False
        handle._cancel_requested = reason
        if handle.state == QUEUED and not handle.sync:
            self._queued -= 1
            if handle._owns_session:  # a mailbox made for it while queued: as if it ran
                self._release_session(handle.task_id)
            self._finalize(handle, self._ended(handle, Status.CANCELLED, None))
        elif handle._scope is not None:
            handle._scope.cancel()
        return True

    async def close_session(self, session_id: str) -> None:
        """Cancel every unfinished child of ``session_id``, wait until each has settled,
        then release the session's mailbox. Later spawns into it are rejected: while any
        record of it remains, and then among the 1,024 most recently emptied closed
        sessions (its records all forgotten, see ``config.retain_collected``, or it never
        had any); past those its id is forgotten like a name never used, so a long-lived
        manager that closes a session per conversation stays bounded.

        Children that ignore cancellation longer than ``config.settle_timeout`` are left
        to finish on their own (their envelopes stay available from :meth:`result`).
        Idempotent. If the caller is cancelled while waiting, the mailbox is still released.
        """
        self._closed_sessions.add(session_id)
        self._fire_close_watchers(session_id)
        live = list(self._live.pop(session_id, {}))
        try:
            for handle in live:
                self._cancel(handle, "its session was closed")
            with anyio.move_on_after(self.config.settle_timeout):
                async with self.lend_slot():  # a child closing a session lends its slot
                    for handle in live:
                        await handle.done.wait()
        finally:
            mailbox = self._mailboxes.pop(session_id, None)
            if mailbox is not None:
                release(mailbox)
            self._names.pop(session_id, None)
            if not self._by_session.get(session_id):
                self._by_session.pop(session_id, None)
                self._session_emptied(session_id)

    def _watch_close(self, session_id: str, callback: Callable[[], object]) -> int:
        """Run ``callback()`` once when ``session_id`` starts closing (before its children
        have settled). Returns a token for :meth:`_unwatch_close`."""
        watchers = self._close_watchers.setdefault(session_id, {})
        token = next(self._watch_ids)
        watchers[token] = callback
        return token

    def _unwatch_close(self, session_id: str, token: int) -> None:
        watchers = self._close_watchers.get(session_id)
        if watchers is not None:
            watchers.pop(token, None)
            if not watchers:
                del self._close_watchers[session_id]

    def _fire_close_watchers(self, session_id: str) -> None:
        for callback in self._close_watchers.pop(session_id, {}).values():
            try:
                callback()
            except Exception:
                logger.exception("a close watcher of session %r raised; ignored", session_id)

    def session_closed(self, session_id: str) -> bool:
        """True once :meth:`close_session` was called (or the child owning it ended).

        The session of a forgotten child (see :meth:`forget`) stays closed while records of
        its own children remain; after that its id is unknown, like a session name never
        used (its mailbox was released when the child ended, and its :class:`RunContext`
        refuses to delegate on its own).
        """
        if session_id in self._closed_sessions:
            return True
        owner = self._tasks.get(session_id)
        return owner is not None and owner.state == SETTLED

    # ------------------------------------------------------------------ mailboxes & results

    def mailbox(self, session_id: str = DEFAULT_SESSION) -> BaseMailbox:
        """The mailbox of ``session_id`` (created on first use; a dropped one once closed,
        see :meth:`session_closed` for the session of a forgotten child)."""
        mailbox = self._mailboxes.get(session_id)
        if mailbox is None:
            if self.session_closed(session_id) or self._state == "closed":
                return closed_mailbox()
            mailbox = self._new_mailbox(session_id)
            self._mailboxes[session_id] = mailbox
            owner = self._tasks.get(session_id)
            if owner is not None:
                owner._owns_session = True  # released as it ends
        return mailbox

    def _new_mailbox(self, session_id: str) -> BaseMailbox:
        if self._mailbox_factory is not None:
            mailbox = self._mailbox_factory(session_id)
        else:
            mailbox = Mailbox(capacity=self.config.mailbox_capacity, ttl=self.config.mailbox_ttl)
        if mailbox.blocking is None:
            mailbox.blocking = self.lend_slot  # a child waiting here lends its slot
        if mailbox.consumed is None:
            mailbox.consumed = self._mailbox_consumed  # a drained envelope is collected
        return mailbox

    def _mailbox_consumed(self, envelope: DelegateResult) -> None:
        """A session mailbox handed ``envelope`` out: its child counts as collected."""
        handle = self._tasks.get(envelope.task_id)
        if handle is not None and not handle._collected and handle._envelope is not None:
            handle._collected = True
            if self._retain is not None:
                self._retire(handle)

    def _delivery_mailbox(self, session_id: str) -> BaseMailbox | None:
        mailbox = self._mailboxes.get(session_id)
        if mailbox is not None:
            return mailbox
        if self.session_closed(session_id) or self._state != "running":
            return None
        return self.mailbox(session_id)

    def handle(self, task_id: str, *, session_id: str | None = None) -> SpawnHandle:
        """The handle of ``task_id``.

        Raises:
            UnknownTask: no such id (naming similar ids), or, with ``session_id``, the id
                belongs to another session.
        """
        handle = self._tasks.get(task_id) if isinstance(task_id, str) else None
        if handle is None:
            detail = live_ids_sentence(session_id, self._live.get(session_id or "", {}))
            if self._retain is not None or self._forgot:
                detail = f"{self._forgotten_sentence()} {detail}".rstrip()
            raise UnknownTask(str(task_id), self._similar_ids(str(task_id), session_id), detail)
        if session_id is not None and handle.session_id != session_id:
            raise UnknownTask(
                task_id,
                (),
                f"It belongs to another session ({handle.session_id!r}), not {session_id!r}; "
                "only the session that spawned a task can collect it."
                + (" " + live_ids_sentence(session_id, self._live.get(session_id, {}))),
            )
        return handle

    def _forgotten_sentence(self) -> str:
        if self._retain is None:
            return "Records are forgotten on request (forget), so a forgotten id is unknown."
        return (
            f"Collected results are forgotten (retain_collected={self._retain}), so an id "
            "already collected may be unknown."
        )

    def result(self, task_id: str) -> DelegateResult | None:
        """The envelope of ``task_id`` if it has ended, else ``None``. Never consumes.

        This is the record of last resort: it holds every envelope even when the mailbox
        was full or closed, until the envelope has been collected and the record forgotten
        (``config.retain_collected``, :meth:`forget`). Raises :class:`UnknownTask` for an
        unknown (or forgotten) id.
        """
        return self.handle(task_id)._envelope

    def tasks(self, session_id: str = DEFAULT_SESSION) -> list[SpawnHandle]:
        """Every child spawned into ``session_id`` and not forgotten, oldest first."""
        return list(self._by_session.get(session_id, ()))

    def forget(self, task_id: str) -> DelegateResult | None:
        """Drop the record of an ended child and return its envelope. Never blocks.

        If the envelope is still in its session's mailbox it is consumed from there first,
        so nothing is left behind; afterwards the id is unknown (:meth:`result`,
        :meth:`handle` and ``wait_agent`` answer as for any unknown id) and the child is
        no longer listed by :meth:`tasks`. A child that has not ended is left alone and
        ``None`` is returned. ``config.retain_collected`` does the same automatically for
        collected children.

        Raises:
            UnknownTask: no such id (or it was forgotten already).
        """
        handle = self.handle(task_id)
        envelope = handle._envelope
        if envelope is None:
            return None
        mailbox = self._mailboxes.get(handle.session_id)
        if mailbox is not None:
            collected = handle._collected
            handle._collected = True  # so the mailbox hook does not count a collection
            try:
                mailbox.drain(handle.task_id)
            except BaseException:
                handle._collected = collected  # a backend that failed: nothing forgotten
                raise
        handle._collected = True
        self._drop_record(handle)
        return envelope

    def _retire(self, handle: SpawnHandle) -> None:
        """``handle`` was just collected: keep it among the ``retain_collected`` newest
        collected records and forget the oldest beyond them. O(1)."""
        retain = self._retain
        assert retain is not None
        if retain == 0:
            self._drop_record(handle)
            return
        if self._tasks.get(handle.task_id) is not handle:
            return  # forgotten already (with its parent): it takes no place among the kept
        retained = self._retained
        retained[handle] = None
        if len(retained) > retain:
            self._drop_record(next(iter(retained)))

    def _drop_record(self, handle: SpawnHandle) -> None:
        """Forget ``handle``: out of the task index and its session's listing. O(1)."""
        task_id = handle.task_id
        if self._tasks.get(task_id) is not handle:
            return  # forgotten already
        del self._tasks[task_id]
        self._ids.discard(task_id)
        self._retained.pop(handle, None)
        self._forgot = True
        session = handle.session_id
        listing = self._by_session.get(session)
        if listing is not None:
            listing.pop(handle, None)
            if not listing and self.session_closed(session):
                del self._by_session[session]
                self._session_emptied(session)
        children = self._by_session.get(task_id)
        if children is not None:
            # Its ended children go with it, collected or not: their session is over and
            # nobody holds their ids but through this record. Unfinished ones (past
            # settle_timeout) stay until they end, and keep its session closed meanwhile.
            for child in [c for c in children if c._envelope is not None]:
                self._drop_record(child)
            if children:
                self._forgotten_sessions.add(task_id)
                self._closed_sessions.add(task_id)
            elif task_id in self._by_session:
                del self._by_session[task_id]

    def _session_emptied(self, session: str) -> None:
        """The last record of the closed ``session`` is gone. A forgotten child's session
        (a task id, never reused) is forgotten at once; a closed root session is kept among
        the most recent :data:`_CLOSED_MEMORY`, the oldest beyond them forgotten."""
        if session in self._forgotten_sessions:
            self._forgotten_sessions.discard(session)
            self._closed_sessions.discard(session)
            return
        if session not in self._closed_sessions:
            return  # the session of a child that ended: closed by its owner's record
        idle = self._closed_idle
        idle[session] = None
        if len(idle) > _CLOSED_MEMORY:
            oldest = next(iter(idle))
            del idle[oldest]
            self._closed_sessions.discard(oldest)

    async def wait_result(
        self,
        task_id: str,
        *,
        timeout: float | None = None,
        session_id: str | None = None,
    ) -> DelegateResult | None:
        """Wait for ``task_id`` to end, then collect (consume) and return its envelope.

        Returns ``None`` if ``timeout`` seconds pass first; a result landing at the deadline
        is returned. Collecting removes the entry from the session mailbox; the manager's
        record stays, so a second call returns the same envelope at once (see
        :attr:`SpawnHandle.collected`), unless ``config.retain_collected`` has forgotten it
        (then the id is unknown). Works when the mailbox was full.

        Raises:
            UnknownTask: unknown id, or (with ``session_id``) another session's.
            ConfigError: ``timeout`` not a number of seconds >= 0 or None.
        """
        timeout = seconds("timeout", timeout, none_ok=True, zero_ok=True)
        handle = self.handle(task_id, session_id=session_id)
        if handle._envelope is None and timeout != 0:
            lend = self.lend_slot()
            if lend is NO_LEND and timeout is None:
                # A root parent's plain wait (wait_agent's, W3's): neither the no-op context
                # nor a cancel scope; each costs more than the wake-up itself.
                await handle.done.wait()
            elif timeout is None:
                async with lend:
                    await handle.done.wait()
            else:
                # The deadline encloses the lend: taking the slot back never outlasts it.
                with anyio.move_on_after(timeout):
                    async with lend:
                        await handle.done.wait()
        if handle._envelope is None:
            return None
        self.collect(handle)
        return handle._envelope

    def collect(self, handle: SpawnHandle) -> DelegateResult | None:
        """Mark an ended child's envelope as consumed and remove it from its mailbox (the
        record may then be forgotten, see ``config.retain_collected``)."""
        if handle._envelope is None:
            return None
        envelope = handle._envelope
        # An execute()'s envelope never goes to a mailbox (it is returned to its caller).
        mailbox = None if handle.sync else self._mailboxes.get(handle.session_id)
        if mailbox is not None:
            mailbox.drain(handle.task_id)  # if it is there, the hook marks it collected
        if not handle._collected:  # not in the mailbox (full, dropped, or read already)
            handle._collected = True
            if self._retain is not None:
                self._retire(handle)
        return envelope

    def _similar_ids(self, task_id: str, session_id: str | None) -> list[str]:
        tasks = self._tasks

        def in_session(candidate: str) -> bool:
            handle = tasks.get(candidate)
            return handle is not None and handle.session_id == session_id

        return self._ids.similar(task_id, tasks.__contains__, in_session)

    # ------------------------------------------------------------------ waking an idle host
    # (added for the LLM tools, issue 3)

    def completions(self, session_id: str = DEFAULT_SESSION) -> Completions:
        """Wake an idle host loop when children of ``session_id`` end, consuming nothing.

        ``await manager.completions(sid)`` blocks until at least one child has ended with
        a result not yet collected and returns those envelopes (peeked: ``wait_agent``
        still collects them, and until then every call returns them again); it returns
        ``[]`` at once only when no ended child is uncollected and none is unfinished, or
        the session is closed. ``async for envelope in manager.completions(sid)`` yields each
        uncollected envelope once, in completion order, until no child is unfinished.
        Cancelling the waiter changes nothing. See :class:`~subagents.Completions`.
        """
        return Completions(self, session_id)


_NO_OPTIONS: Final = SpawnOptions()
_CLOSED_MEMORY: Final = 1024


def _given_twice(
    timeout: float | _Unset | None, name: str | None, options: SpawnOptions
) -> ConfigError | None:
    """The error for a setting given both as an argument and in ``options`` (neither may
    silently win over the other), or ``None``."""
    if timeout is not UNSET and options.timeout is not None:
        return ConfigError(
            "timeout",
            f"given once: as timeout= or as options.timeout (here {options.timeout!r}), not both",
            timeout,
        )
    if name is not None and options.name is not None:
        return ConfigError(
            "name",
            f"given once: as name= or as options.name (here {options.name!r}), not both",
            name,
        )
    return None


def _new_task_id() -> str:
    """12 random hex digits: 48 bits from the OS."""
    return os.urandom(6).hex()
