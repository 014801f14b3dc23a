"""Shared helpers for the tests: agent specs, a manager factory, a tracker, the backends
that run timeouts on trio's mock clock, and the few reads of private state that no public
API covers yet (each says why)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
import trio
from trio.testing import MockClock

from subagents import (
    AgentSpec,
    Request,
    RunContext,
    SpawnHandle,
    SubagentConfig,
    SubagentManager,
    UnknownTask,
)

RunnerFn = Callable[[Request, RunContext], Awaitable[Any]]


def spec(name: str, runner: RunnerFn, **kw: Any) -> AgentSpec:
    """An AgentSpec with a throwaway description."""
    return AgentSpec(name=name, description=f"test agent {name}", runner=runner, **kw)


def manager_with(*specs: AgentSpec, **config: Any) -> SubagentManager:
    """A manager registering ``specs`` with ``SubagentConfig(**config)``."""
    return SubagentManager(specs, config=SubagentConfig(**config))


async def echo(request: Request, ctx: RunContext) -> str:
    """Returns its input."""
    return request.input


class Tracker:
    """Counts runners alive at once (entered and not yet left, whatever the exit).

    ``gate`` holds every tracked runner until it is set; ``started`` is the start order
    (the request inputs) and ``high_water`` the most runners alive at once.
    """

    def __init__(self) -> None:
        self.alive = 0
        self.high_water = 0
        self.started: list[str] = []
        self.finished: list[str] = []
        self.gate = anyio.Event()
        self.entered = anyio.Event()

    async def runner(self, request: Request, ctx: RunContext) -> str:
        self.alive += 1
        self.high_water = max(self.high_water, self.alive)
        self.started.append(request.input)
        self.entered.set()
        try:
            await self.gate.wait()
            return f"done {request.input}"
        finally:
            self.alive -= 1
            self.finished.append(request.input)

    def open(self) -> None:
        self.gate.set()


def clock_backends() -> list[Any]:
    """``anyio_backend`` params for a test that lets a watchdog, TTL or backoff run out.

    Trio runs on ``MockClock(autojump_threshold=0)``: whenever every task is blocked its
    clock jumps to the next deadline, so the test takes no wall time and may assert how
    long something took in that clock. asyncio has no such clock: there the same test runs
    in real time and must assert nothing about durations (see :func:`on_mock_clock`).
    """
    return [
        pytest.param("asyncio", id="asyncio"),
        pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}), id="trio-mockclock"),
    ]


def on_mock_clock(anyio_backend: object) -> bool:
    """Whether the test runs on trio's mock clock (see :func:`clock_backends`)."""
    return isinstance(anyio_backend, tuple)


def pass_time_without_a_checkpoint(seconds: float) -> None:
    """Let ``seconds`` go by while no other task can run, so a deadline passes "at the same
    instant" as whatever the caller does next: on trio's mock clock by jumping it, anywhere
    else by blocking the thread (real time, like a runner busy on the CPU)."""
    try:
        clock = trio.lowlevel.current_clock()
    except RuntimeError:  # not inside trio
        clock = None
    if isinstance(clock, MockClock):
        clock.jump(seconds)
    else:
        time.sleep(seconds)


def substitute(value: Any, marker: str, replacement: str) -> Any:
    """``value`` (JSON-like) with every ``marker`` string replaced by ``replacement``: a
    generated argument names a real task id only once one exists."""
    if value == marker:
        return replacement
    if isinstance(value, list):
        return [substitute(v, marker, replacement) for v in value]
    if isinstance(value, dict):
        return {k: substitute(v, marker, replacement) for k, v in value.items()}
    return value


def has_record(manager: SubagentManager, handle: SpawnHandle) -> bool:
    """Whether ``manager`` still keeps the record of ``handle`` (not forgotten)."""
    try:
        return manager.handle(handle.task_id) is handle
    except UnknownTask:
        return False


def session_state(manager: SubagentManager, session_id: str) -> list[str]:
    """Which of the manager's per-session stores still hold ``session_id``: a session whose
    agent has ended must leave nothing behind (its mailbox, child names, live children)."""
    # private: the sessions part; no public view of the per-session stores. mailbox() makes
    # one on first use, tasks() and session_closed() answer for records, not for state held.
    return manager._sessions.held(session_id)


def has_listing(manager: SubagentManager, session_id: str) -> bool:
    """Whether the manager still keeps a (possibly empty) listing of ``session_id``'s
    children: one left behind for every session ever used would grow without bound."""
    # private: the sessions part; tasks(session_id) reads [] whether or not a listing is kept.
    return manager._sessions.has_listing(session_id)
