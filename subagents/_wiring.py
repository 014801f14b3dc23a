"""Building a manager's parts from its configuration and connecting them.

:func:`build_parts` makes each part once, hands every part the others it needs and
installs the hooks between them (a record's end closes its inbox, a closing session its
host inbox); :class:`~subagents._manager.SubagentManager` keeps what it returns and
delegates to it.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import attrs
from anyio.abc import TaskGroup

from ._backend import Backend, run_local
from ._child import ChildRunner, CompletionEvents
from ._completions import Completions
from ._context import RunContext
from ._events import EventBus
from ._handle import SpawnHandle, record_of
from ._journal import Durability, DurableStore
from ._lifecycle import start_parts, stop_parts
from ._limiter import SpawnLimiter, start_unowned
from ._mailbox import BaseMailbox, default_mailbox_factory
from ._messaging import Messaging
from ._messenger import Messenger
from ._notifier import CompletionNotifier
from ._record import ChildRecord
from ._sessions import Sessions
from ._spawning import Spawner, publish_spawned
from ._spec import SubagentConfig
from ._statistics import ManagerStatistics, snapshot
from ._tracing import Telemetry, link_reply, link_revival
from ._watchdog import Watchdog

__all__ = ["Parts", "build_parts"]


@attrs.define(kw_only=True)
class Parts:
    """The parts of one manager, each owning its state, and the steps that use several:
    starting and stopping them, and queueing a spawned child."""

    durability: Durability
    telemetry: Telemetry
    watchdog: Watchdog
    limiter: SpawnLimiter
    sessions: Sessions
    spawner: Spawner
    notifier: CompletionNotifier
    messaging: Messaging
    messenger: Messenger
    children: ChildRunner
    events: EventBus
    spawned: int = 0

    async def start(self) -> TaskGroup:
        """Resolve the tracer, open the store, start the workers in a new task group and
        queue what an ended process left unfinished."""
        self.telemetry.resolve()
        spawner = self.spawner
        reruns = await self.durability.open(spawner.reruns(), spawner.rerun)
        tg = await start_parts(self.sessions, self.watchdog, self.limiter, self.children)
        for record in reruns:  # run again
            self.queue(self.traced(record, None))
        return tg

    def traced(self, record: ChildRecord, parent: ChildRecord | None) -> ChildRecord:
        """Count a new child and open its span."""
        self.spawned += 1
        if self.telemetry.active:
            record.trace = self.telemetry.start(record, parent)
        return record

    def queue(self, record: ChildRecord) -> None:
        """Queue a spawned child for a slot, then announce it."""
        self.limiter.submit(record)
        if record.trace is not None:
            self.telemetry.queued(record)
        # Published once the child is queued: a subscriber that cancels it finds it there.
        if self.events.active:
            publish_spawned(self.events, record)

    def statistics(self) -> ManagerStatistics:
        """A snapshot of the admission counters."""
        # A notifier subclass that skipped CompletionNotifier.__init__ counts nothing.
        overflows = getattr(self.notifier, "overflows", 0)
        settled = self.children.settled
        return snapshot(self.limiter, overflows=overflows, spawned=self.spawned, settled=settled)

    async def stop(self, tg: TaskGroup, settle_timeout: float) -> None:
        """Cancel every child, wait (bounded) for all to settle, stop the workers, release
        every session and close the store."""
        try:
            await stop_parts(self.sessions, self.limiter, self.children, tg, settle_timeout)
        finally:
            self.sessions.shut = True
            self.sessions.release_all()
            await self.durability.close(settle_timeout)


def build_parts(
    context: Callable[[Messenger, ChildRecord, float | None], RunContext],
    config: SubagentConfig,
    events: EventBus,
    *,
    mailbox_factory: Callable[[str], BaseMailbox] | None,
    notifier: CompletionNotifier | None,
    backend: Backend | None,
    store: DurableStore | None,
    task_group: Callable[[], TaskGroup | None],
    spawn: Callable[..., SpawnHandle],
    completions: Callable[[str], Completions],
) -> Parts:
    """The parts of a manager, which they call back through its public methods only:
    ``context(messenger, record, deadline)`` makes a child's :class:`RunContext`,
    ``spawn`` starts a follow-up run, ``completions`` is what ``activity`` also waits on;
    ``task_group()`` is the manager's task group once entered."""
    durability = Durability(store, config.store_path, mailbox_factory)
    journal, stored = durability.journal, durability.stored
    limiter = SpawnLimiter(config.max_concurrent_spawns)
    capacity, ttl = config.mailbox_capacity, config.mailbox_ttl
    factory = (
        durability.mailbox_factory(capacity, ttl)
        or mailbox_factory
        or default_mailbox_factory(capacity, ttl)
    )
    sessions = Sessions(factory, limiter.lend_slot, config.retain_collected, stored)
    completion_events = CompletionEvents(events, sessions, config.mailbox_capacity)
    if notifier is None:
        notifier = CompletionNotifier(
            sessions.delivery_mailbox, completion_events, enabled=config.notify_completion
        )

    def follow_up(old: ChildRecord, text: str) -> ChildRecord:
        name = old.agent_path.name
        return record_of(spawn(old.spec.name, text, session_id=old.session_id, name=name))

    def start_task(run: Callable[[], Coroutine[Any, Any, None]]) -> None:
        tg = task_group()
        if tg is not None:
            start_unowned(tg, run)

    messaging = Messaging(
        sessions,
        events,
        config.inbox_capacity,
        capture_content=config.capture_content,
        spawn_follow_up=follow_up,
        start_task=start_task,
        link_reply=link_reply,
        link_revival=link_revival,
        resumes=limiter.resumes,
    )
    sessions.on_end, sessions.on_close = messaging.ended, messaging.closing
    sessions.on_forget = messaging.forgotten
    messenger = Messenger(messaging, sessions, limiter.lend_slot, completions)
    telemetry, watchdog = Telemetry.from_config(config), Watchdog()
    children = ChildRunner(
        backend=backend if backend is not None else run_local,
        make_context=lambda record, deadline: context(messenger, record, deadline),
        sessions=sessions,
        limiter=limiter,
        watchdog=watchdog,
        notifier=notifier,
        completion_events=completion_events,
        events=events,
        telemetry=telemetry,
        settle_timeout=config.settle_timeout,
        journal=journal,
        commit_first=stored is not None and config.durability == "sync",
    )
    spawner = Spawner(sessions, config, stored)
    spawner.budgets.attach(children, watchdog)
    return Parts(
        durability=durability,
        telemetry=telemetry,
        watchdog=watchdog,
        limiter=limiter,
        sessions=sessions,
        spawner=spawner,
        notifier=notifier,
        messaging=messaging,
        messenger=messenger,
        children=children,
        events=events,
    )
