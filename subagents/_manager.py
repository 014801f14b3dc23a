"""SubagentManager: the facade over the engine's parts, which :mod:`._wiring` builds.

Each part owns its state: the limiter (queue, slots, lending, workers), the watchdog, the
sessions (records, mailboxes, names, closing, retention), the child runner (one child to
its one envelope), the messenger (a host session's messages). The manager hands them work.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Literal

from anyio.abc import TaskGroup

from ._backend import Backend
from ._budget import Budget
from ._completions import Completions
from ._context import RunContext
from ._envelope import DelegateResult, Usage
from ._events import EventBus
from ._handle import SpawnHandle, handle_of, record_of
from ._journal import DurableStore
from ._ledger import Ledger, usage_of, with_budget
from ._mailbox import BaseMailbox
from ._messages import Activity, Message, PeerInfo, Receipt, Reply
from ._messaging import Messaging
from ._messenger import Messenger
from ._notifier import CompletionNotifier
from ._record import wait_for_record
from ._sessions import DEFAULT_SESSION
from ._spawning import publish_spawned
from ._spec import UNSET, AgentSpec, SpawnOptions, SubagentConfig, _Unset
from ._statistics import ManagerStatistics
from ._tracing import Telemetry
from ._validators import seconds
from ._wiring import build_parts

__all__ = [
    "DEFAULT_SESSION",
    "ManagerStatistics",
    "SubagentManager",
    "budgets_of",
    "messaging_of",
    "messenger_of",
    "telemetry_of",
]


class SubagentManager:
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
        self.events = events if events is not None else EventBus()
        p = self._parts = build_parts(
            functools.partial(RunContext, self), config, self.events, spawn=self.spawn,
            mailbox_factory=mailbox_factory, notifier=notifier, backend=backend, store=store,
            task_group=lambda: self._tg, completions=self.completions,
        )  # fmt: skip
        self._durability, self._limiter, self._spawner = p.durability, p.limiter, p.spawner
        self._sessions, self._children, self._messenger = p.sessions, p.children, p.messenger
        for spec in agents:
            self.register(spec)
        self._tg: TaskGroup | None = None
        self._state: Literal["new", "running", "closing", "closed"] = "new"

    async def __aenter__(self) -> SubagentManager:
        if self._state != "new":
            raise RuntimeError("a SubagentManager can be entered only once")
        try:
            self._tg = await self._parts.start()
        except BaseException:
            self._state = "closed"
            raise
        self._state = "running"
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
            await self._parts.stop(self._tg, self.config.settle_timeout)
        finally:
            self._state = "closed"

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
        return self._parts.statistics()

    def lend_slot(self) -> AbstractAsyncContextManager[None]:
        """Release the calling child's slot while the block runs, so queued children (its
        own among them) can run; take one back on exit, ahead of the queue, or a *borrowed*
        one (``statistics().borrowed``) if the block's deadline or cancellation ends that
        wait. A no-op outside a child; every wait a child can reach uses it (design/core.md)."""
        return self._limiter.lend_slot()

    async def wait_result(
        self, task_id: str, *, timeout: float | None = None, session_id: str | None = None
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
        record = self._sessions.require(task_id, session_id)
        if record.envelope is None and timeout != 0:
            await wait_for_record(record, timeout, self.lend_slot())
        if record.envelope is None:
            return None
        self._sessions.collect(record)
        return record.envelope

    def completions(self, session_id: str = DEFAULT_SESSION) -> Completions:
        """Wake an idle host loop when children of ``session_id`` end, consuming nothing.

        ``await manager.completions(sid)`` blocks until at least one child has ended with
        a result not yet collected and returns those envelopes (peeked: ``wait_agent``
        still collects them, and until then every call returns them again); it returns
        ``[]`` at once only when no ended child is uncollected and none is unfinished, or
        the session is closed. ``async for envelope in manager.completions(sid)`` yields each
        uncollected envelope once, in completion order, until no child is unfinished.
        Cancelling the waiter changes nothing. See :class:`~subagents.Completions`.
        Messages do not wake it: :meth:`activity` wakes on either.
        """
        return Completions(self._sessions, self.lend_slot, lambda: self.running, session_id)

    def send(
        self,
        to: str,
        body: str,
        *,
        reply_to: str | None = None,
        wake: bool = True,
        session_id: str = DEFAULT_SESSION,
    ) -> Receipt:
        """Send from host session ``session_id``; never blocks (see :meth:`RunContext.send`)."""
        return self._messenger.send(session_id, to, body, reply_to=reply_to, wake=wake)

    async def recv(
        self,
        *,
        from_: str | None = None,
        timeout: float | None = None,
        session_id: str = DEFAULT_SESSION,
    ) -> Message | None:
        """Take a message for host session ``session_id`` (see :meth:`RunContext.recv`)."""
        return await self._messenger.recv(session_id, from_=from_, timeout=timeout)

    def inbox(
        self,
        *,
        peek: bool = False,
        from_: str | None = None,
        session_id: str = DEFAULT_SESSION,
        ids: Iterable[str] | None = None,
    ) -> list[Message]:
        """What waits for host session ``session_id`` (see :meth:`RunContext.inbox`)."""
        return self._messenger.inbox(session_id, peek=peek, from_=from_, ids=ids)

    def peers(self, *, session_id: str = DEFAULT_SESSION) -> list[PeerInfo]:
        """Every agent of ``session_id``'s tree (see :meth:`RunContext.peers`)."""
        return self._messenger.peers(session_id)

    async def ask(
        self, to: str, body: str, *, timeout: float | None = None, session_id: str = DEFAULT_SESSION
    ) -> Reply:
        """Ask one agent from host session ``session_id`` (see :meth:`RunContext.ask`)."""
        return await self._messenger.ask(session_id, to, body, timeout=timeout)

    def send_input(self, task_id: str, text: str) -> Receipt:
        """Follow-up input for child ``task_id`` from its parent session (design/messaging.md)."""
        return self._messenger.send_input(task_id, text)

    async def activity(
        self, session_id: str = DEFAULT_SESSION, *, timeout: float | None = None
    ) -> Activity:
        """Wake an idle host loop on a finished child or a message (design/messaging.md)."""
        return await self._messenger.activity(session_id, timeout)

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
        record = self._parts.traced(*made)
        self._parts.queue(record)
        return handle_of(record, self)

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
        made = new(agent, input, session_id, name, timeout, options, None, True)
        record = self._parts.traced(*made)
        if self.events.active:
            publish_spawned(self.events, record)
        await self._children.run(record)
        # Collected only once returned: a caller cancelled meanwhile never got the envelope,
        # so it stays uncollected (result(), tasks(), completions(), wait_result collect it).
        self._sessions.collect(record)
        assert record.envelope is not None
        return record.envelope

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
        refuses to delegate on its own)."""
        return self._sessions.is_closed(session_id)

    def mailbox(self, session_id: str = DEFAULT_SESSION) -> BaseMailbox:
        """The mailbox of ``session_id`` (created on first use; a dropped one once closed,
        see :meth:`session_closed` for the session of a forgotten child)."""
        return self._sessions.mailbox(session_id)

    def handle(self, task_id: str, *, session_id: str | None = None) -> SpawnHandle:
        """The handle of ``task_id``; :class:`UnknownTask` for no such id (naming similar
        ids), or, with ``session_id``, an id of another session."""
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
    """The telemetry ``manager`` traces with (resolved as it is entered), for the tools."""
    return manager._parts.telemetry


def messaging_of(manager: SubagentManager) -> Messaging:
    """The messaging of ``manager`` (its postbox and what a send does)."""
    return manager._parts.messaging


def messenger_of(manager: SubagentManager) -> Messenger:
    """The messaging part of ``manager``: the tools send and read through it."""
    return manager._messenger
