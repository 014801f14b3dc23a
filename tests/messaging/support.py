"""Agents the messaging tests share: runners that park until told to stop."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

from subagents import AgentSpec, Message, Request, RunContext

Runner = Callable[[Request, RunContext], Awaitable[str]]


def spec(name: str, runner: Runner, **kwargs: object) -> AgentSpec:
    return AgentSpec(name=name, description=f"test agent {name}", runner=runner, **kwargs)  # type: ignore[arg-type]


class Gate:
    """Runners that wait on one event: ``parked`` until the test opens it."""

    def __init__(self) -> None:
        self.open = anyio.Event()
        self.started: dict[str, anyio.Event] = {}

    def started_event(self, name: str) -> anyio.Event:
        return self.started.setdefault(name, anyio.Event())

    def parked(self, name: str) -> Runner:
        async def run(request: Request, ctx: RunContext) -> str:
            self.started_event(name).set()
            await self.open.wait()
            return f"{name} done"

        return run


def echo_replier(stop: str = "stop") -> Runner:
    """Answers every message with ``echo:<body>`` (``reply_to`` set) until ``stop``."""

    async def run(request: Request, ctx: RunContext) -> str:
        seen: list[Message] = []
        while True:
            message = await ctx.recv()
            if message is None:
                return f"closed after {len(seen)}"
            if message.body == stop:
                return f"stopped after {len(seen)}"
            seen.append(message)
            ctx.send(message.from_, "echo:" + message.body, reply_to=message.id)

    return run
