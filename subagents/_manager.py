"""SubagentManager: the facade that wires the engine's parts.

The parts each own their state: :class:`~subagents._limiter.SpawnLimiter` (queue, slots,
lending, workers), :class:`~subagents._watchdog.Watchdog` (deadlines),
:class:`~subagents._sessions.Sessions` (records, mailboxes, names, closing, retention) and
:class:`~subagents._child.ChildRunner` (one child to its one envelope). The manager checks
a spawn's arguments, makes its record and hands it to them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Literal

from anyio.abc import TaskGroup

from ._backend import Backend, run_local
from ._budget import Budget
from ._child import ChildRunner, CompletionEvents
from ._context import RunContext
from ._envelope import DelegateResult, Usage
from ._events import EventBus
from ._handle import SpawnHandle, handle_of, record_of
from ._journal import Durability, DurableStore
from ._ledger import Ledger, usage_of, with_budget
from ._lifecycle import start_parts, stop_parts
from ._limiter import SpawnLimiter, start_unowned
from ._mailbox import BaseMailbox, default_mailbox_factory
from ._manager_messages import ManagerMessaging
from ._messaging import Messaging
from ._notifier import CompletionNotifier
from ._record import ChildRecord
from ._sessions import DEFAULT_SESSION, Sessions
from ._spawning import Spawner, publish_spawned
from ._spec import UNSET, AgentSpec, SpawnOptions, SubagentConfig, _Unset
from ._statistics import ManagerStatistics, snapshot
from ._tracing import Telemetry
from ._watchdog import Watchdog

__all__ = [
    "DEFAULT_SESSION",
    "ManagerStatistics",
    "SubagentManager",
    "budgets_of",
    "messaging_of",
    "telemetry_of",
]


class SubagentManager(ManagerMessaging):
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
        store: an open durable store (``subagents.store.SqliteStore``): it makes the
            sessions' mailboxes and journals every spawn; entering recovers what an earlier
            process left unfinished (design/store.md). ``config.store_path`` opens one.

    Raises:
        ConfigError: ``store`` with ``mailbox_factory`` (the store makes the mailboxes),
            or with ``config.store_path``.
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
        store: DurableStore | None = None,
    ) -> None:
        config = self.config = config if config is not None else SubagentConfig()
        durability = self._durability = Durability(store, config.store_path, mailbox_factory)
        journal, stored = durability.journal, durability.stored
        self.events = events if events is not None else EventBus()
        self._telemetry = Telemetry.from_config(config)
        self._watchdog = Watchdog()
        self._limiter = SpawnLimiter(config.max_concurrent_spawns)
        capacity, ttl = config.mailbox_capacity, config.mailbox_ttl
        mailbox_factory = (
            durability.mailbox_factory(capacity, ttl)
            or mailbox_factory
            or default_mailbox_factory(capacity, ttl)
        )
        self._sessions = sessions = Sessions(
            mailbox_factory, self._limiter.lend_slot, config.retain_collected, stored
        )
        self._spawner = Spawner(sessions, config, stored)
        for spec in agents:
            self.register(spec)
        completion_events = CompletionEvents(self.events, self._sessions, config.mailbox_capacity)
        if notifier is None:
            notifier = CompletionNotifier(
                sessions.delivery_mailbox, completion_events, enabled=config.notify_completion
            )
        self._notifier = notifier
        messaging = self._messaging = Messaging(
            sessions,
            self.events,
            config.inbox_capacity,
            capture_content=config.capture_content,
            spawn_follow_up=lambda old, text: record_of(
                self.spawn(old.spec.name, text, session_id=old.session_id, name=old.agent_path.name)
            ),
            start_task=lambda run: start_unowned(self._tg, run) if self._tg else None,
        )
        sessions.on_end, sessions.on_close = messaging.ended, messaging.closing
        self._children = ChildRunner(
            backend=backend if backend is not None else run_local,
            make_context=functools.partial(RunContext, self),
            sessions=self._sessions,
            limiter=self._limiter,
            watchdog=self._watchdog,
            notifier=self._notifier,
            completion_events=completion_events,
            events=self.events,
            telemetry=self._telemetry,
            settle_timeout=config.settle_timeout,
            journal=journal,
            commit_first=stored is not None and config.durability == "sync",
        )
        self._spawner.budgets.attach(self._children, self._watchdog)
        self._spawned = 0
        self._tg: TaskGroup | None = None
        self._state: Literal["new", "running", "closing", "closed"] = "new"

    async def __aenter__(self) -> SubagentManager:
        if self._state != "new":
            raise RuntimeError("a SubagentManager can be entered only once")
        self._telemetry.resolve()
        try:
            spawner = self._spawner
            reruns = await self._durability.open(spawner.reruns(), spawner.rerun)
        except BaseException:
            self._state = "closed"
            raise
        parts = self._sessions, self._watchdog, self._limiter, self._children
        self._tg = await start_parts(*parts)
        self._state = "running"
        for record in reruns:  # what an ended process left unfinished, run again
            self._queue(self._traced(record, None))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
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
            self._sessions.shut = True
            return
        self._state = "closing"
        assert self._tg is not None
        try:
            parts = self._sessions, self._limiter, self._children, self._tg
            await stop_parts(*parts, self.config.settle_timeout)
        finally:
            self._state = "closed"
            self._sessions.shut = True
            self._sessions.release_all()
            await self._durability.close(self.config.settle_timeout)

    @property
    def running(self) -> bool:
        """True between entering and closing."""
        return self._state == "running"

    def register(self, spec: AgentSpec) -> None:
        """Add an agent type. Raises :class:`ConfigError` if the name is taken."""
        self._spawner.register(spec)

    @property
    def agents(self) -> dict[str, AgentSpec]:
        """The registered agent types by name (a copy)."""
        return dict(self._spawner.specs)

    def get_agent(self, name: str) -> AgentSpec:
        """The agent type called ``name``; raises :class:`UnknownAgent` listing the known."""
        return self._spawner.agent(name)

    @property
    def max_concurrent_spawns(self) -> int:
        """The concurrency limit for spawned children; settable at run time."""
        return self._limiter.limit

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
        self._limiter.set_limit(value)

    def statistics(self) -> ManagerStatistics:
        """A snapshot of the admission counters."""
        # A notifier subclass that skipped CompletionNotifier.__init__ counts nothing.
        overflows = getattr(self._notifier, "overflows", 0)
        settled = self._children.settled
        return snapshot(self._limiter, overflows=overflows, spawned=self._spawned, settled=settled)

    def spawn(
        self,
        agent: str,
        input: str = "",
        *,
        session_id: str = DEFAULT_SESSION,
        name: str | None = None,
        timeout: float | _Unset | None = UNSET,
        options: SpawnOptions | None = None,
        idempotency_key: str | None = None,
        budget: Budget | None = None,
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
            idempotency_key: a repeat with this key in ``session_id`` returns the first
                spawn's handle (live or ended; after a restart, from the store) and runs
                nothing, until that record is forgotten (README, "Idempotency keys").
            budget: what the child and its subtree may spend, within the agent's budget
                and what its ancestors have left (here or in ``options``, not both).

        Raises:
            UnknownAgent: no such agent type (the message lists the registered ones).
            SpawnRejected: the depth limit, a fan-out limit, an exhausted budget, a closed
                session, a manager not running; the key held for another agent or input,
                or by another process's live spawn.
            ConfigError: a malformed timeout, or one given twice, or a malformed key;
                InvalidName: a malformed name.
            StoreError: its store has failed; anyio.ClosedResourceError: it was closed.
        """
        held = self._spawner.held(agent, input, session_id, idempotency_key)
        if held is not None:
            return handle_of(held, self)
        new, options = self._spawner.new_record, with_budget(options, budget)
        made = new(agent, input, session_id, name, timeout, options, idempotency_key, False)
        record = self._traced(*made)
        self._queue(record)
        return handle_of(record, self)

    def _queue(self, record: ChildRecord) -> None:
        self._limiter.submit(record)
        if record.trace is not None:
            self._telemetry.queued(record)
        # Published once the child is queued: a subscriber that cancels it finds it there.
        if self.events.active:
            publish_spawned(self.events, record)

    async def execute(
        self,
        agent: str,
        input: str = "",
        *,
        session_id: str = DEFAULT_SESSION,
        name: str | None = None,
        timeout: float | _Unset | None = UNSET,
        options: SpawnOptions | None = None,
        budget: Budget | None = None,
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
        new, options = self._spawner.new_record, with_budget(options, budget)
        record = self._traced(*new(agent, input, session_id, name, timeout, options, None, True))
        if self.events.active:
            publish_spawned(self.events, record)
        await self._children.run(record)
        # Collected only once returned: a caller cancelled meanwhile never got the envelope,
        # so it stays uncollected (result(), tasks(), completions(), wait_result collect it).
        self._sessions.collect(record)
        assert record.envelope is not None
        return record.envelope

    def _traced(self, record: ChildRecord, parent: ChildRecord | None) -> ChildRecord:
        self._spawned += 1
        if self._telemetry.active:
            record.trace = self._telemetry.start(record, parent)
        return record

    def cancel(self, task_id: str) -> bool:
        """Ask a child to stop. Never blocks.

        A queued child leaves the queue at once and ends ``cancelled`` (it never takes a
        slot); a running child is cancelled at its next checkpoint. Returns True if this
        call requested the cancellation, False if the child had already ended or was
        already being cancelled.

        Raises:
            UnknownTask: no such task id.
        """
        return self._children.cancel(self._sessions.require(task_id), "cancelled by request")

    async def close_session(self, session_id: str) -> None:
        """Cancel every unfinished child of ``session_id``, wait until each has settled,
        then release the session's mailbox. Later spawns into it are rejected while any
        record of it remains, then while it is among the 1,024 most recently emptied
        closed sessions; past those its id is forgotten like a name never used, so a
        long-lived manager that closes a session per conversation stays bounded.

        Children ignoring cancellation past ``config.settle_timeout`` finish on their own
        (their envelopes stay in :meth:`result`). Idempotent; a cancelled caller still
        releases the mailbox.
        """
        self._spawner.budgets.close_session(session_id)
        await self._children.close_session(session_id)

    def open_session(self, session_id: str, *, budget: Budget) -> None:
        """Give root session ``session_id`` a :class:`Budget` that every tree spawned into
        it from now on shares (``seconds`` count from now), until :meth:`close_session`.

        Raises:
            ConfigError: not a Budget; the session has one or unfinished children already,
                or is a child's own. SpawnRejected: the session is closed.
        """
        self._spawner.budgets.open_session(session_id, budget)

    def usage(self, task_id: str, *, tree: bool = False) -> Usage:
        """The tokens ``task_id`` has used (its envelope's once ended); with ``tree``, its
        own and every subagent's below it. Raises :class:`UnknownTask` for an unknown id."""
        return usage_of(self._sessions.require(task_id), tree)

    def session_closed(self, session_id: str) -> bool:
        """True once :meth:`close_session` was called (or the child owning it ended).

        The session of a forgotten child (see :meth:`forget`) stays closed while records of
        its own children remain; after that its id is unknown, like a session name never
        used (its mailbox was released when the child ended, and its :class:`RunContext`
        refuses to delegate on its own).
        """
        return self._sessions.is_closed(session_id)

    def mailbox(self, session_id: str = DEFAULT_SESSION) -> BaseMailbox:
        """The mailbox of ``session_id`` (created on first use; a dropped one once closed,
        see :meth:`session_closed` for the session of a forgotten child)."""
        return self._sessions.mailbox(session_id)

    def handle(self, task_id: str, *, session_id: str | None = None) -> SpawnHandle:
        """The handle of ``task_id``.

        Raises:
            UnknownTask: no such id (naming similar ids), or, with ``session_id``, the id
                belongs to another session.
        """
        return handle_of(self._sessions.require(task_id, session_id), self)

    def result(self, task_id: str) -> DelegateResult | None:
        """The envelope of ``task_id`` if it has ended, else ``None``. Never consumes.

        This is the record of last resort: it holds every envelope even when the mailbox
        was full or closed, until the envelope has been collected and the record forgotten
        (``config.retain_collected``, :meth:`forget`). Raises :class:`UnknownTask` for an
        unknown (or forgotten) id.
        """
        return self._sessions.require(task_id).envelope

    def tasks(self, session_id: str = DEFAULT_SESSION) -> list[SpawnHandle]:
        """Every child spawned into ``session_id`` and not forgotten, oldest first."""
        return [handle_of(record, self) for record in self._sessions.listing(session_id)]

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
        record = self._sessions.require(task_id)
        envelope = record.envelope
        if envelope is not None:
            self._sessions.forget(record)
        return envelope

    async def wait_journaled(self, handle: SpawnHandle) -> None:
        """Block until ``handle``'s spawn is committed (:meth:`SpawnHandle.journaled`)."""
        await self._durability.journal.wait_journaled(record_of(handle).journaled)

    @property
    def store(self) -> DurableStore | None:
        """The durable store (given, or opened from ``config.store_path``), or ``None``."""
        return self._durability.store

    def collect(self, handle: SpawnHandle) -> DelegateResult | None:
        """Mark an ended child's envelope as consumed and remove it from its mailbox (the
        record may then be forgotten, see ``config.retain_collected``)."""
        record = record_of(handle)
        if record.envelope is None:
            return None
        self._sessions.collect(record)
        return record.envelope


def budgets_of(manager: SubagentManager) -> Ledger:
    """The ledger of ``manager``'s budgets: the tools read a session's remaining budget."""
    return manager._spawner.budgets


def telemetry_of(manager: SubagentManager) -> Telemetry:
    """The telemetry ``manager`` traces with (its providers, resolved as it is entered):
    the tools trace their calls with it."""
    return manager._telemetry


def messaging_of(manager: SubagentManager) -> Messaging:
    """The messaging of ``manager``: the tools send and read through it."""
    return manager._messaging
