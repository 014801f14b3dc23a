"""Small helpers shared by the reliability tests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

from subagents import AgentSpec, Event, Request, Result, RunContext, SubagentConfig, SubagentManager

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
