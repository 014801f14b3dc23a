"""Small helpers shared by the reliability tests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

from subagents import (
    DEFAULT_SESSION,
    AgentSpec,
    Event,
    Request,
    Result,
    RunContext,
    SpawnHandle,
    SubagentConfig,
    SubagentManager,
)
from subagents._handle import record_of

RunnerFn = Callable[[Request, RunContext], Awaitable[Result | str]]


def make_manager(
    runners: dict[str, RunnerFn], *, limit: int = 4, **config: object
) -> SubagentManager:
    """A manager with one agent type per runner (named by its key)."""
    specs = [AgentSpec(name=name, description=name, runner=fn) for name, fn in runners.items()]
    return SubagentManager(
        specs,
        config=SubagentConfig(max_concurrent_spawns=limit, **config),  # type: ignore[arg-type]
    )


@contextmanager
def recorded(manager: SubagentManager) -> Iterator[list[Event]]:
    """Every event the manager publishes while the block runs."""
    events: list[Event] = []
    unsubscribe = manager.events.subscribe(events.append)
    try:
        yield events
    finally:
        unsubscribe()


def completed_events(events: list[Event], task_id: str) -> list[Event]:
    return [e for e in events if e.type == "subagent.completed" and e.task_id == task_id]


def records(manager: SubagentManager, session_id: str = DEFAULT_SESSION) -> list[SpawnHandle]:
    """Every record the manager keeps under ``session_id``: its children, theirs, and so on
    (through ``tasks()``, which lists execute() delegations too)."""
    found: list[SpawnHandle] = []
    sessions = [session_id]
    while sessions:
        for handle in manager.tasks(sessions.pop()):
            found.append(handle)
            sessions.append(handle.task_id)
    return found


def holds_no_slot(handle: SpawnHandle) -> bool:
    """Whether an ended child's slot bookkeeping is back to rest (no lend, no slot held)."""
    # private: the child's record; statistics() has only the totals.
    record = record_of(handle)
    return record.lends == 0 and not record.holds_slot


def waiting_to_resume(manager: SubagentManager) -> int:
    """How many children wait to take a slot back after a wait (the resumer queue)."""
    return manager.statistics().resuming
