"""Runners for test_review2_ray.py, in a module the Ray workers import by path."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import attrs

from subagents import Request, RunContext, TransientError


async def reports_its_attempt_file_then_fails(request: Request, ctx: RunContext) -> str:
    """Each attempt reports a path of its own, then fails transiently."""
    ctx.report(files_changed=[f"attempt{ctx.attempt}.py"])
    raise TransientError(f"attempt {ctx.attempt} failed")


async def reads_its_inbox(request: Request, ctx: RunContext) -> str:
    """A peer-messaging runner's step boundary: take the messages sent to it."""
    return f"{len(ctx.inbox())} messages"


@attrs.define
class Greeter:
    """A runner object (an async ``__call__``, which AgentSpec accepts); attrs makes it
    compare by value, and so unhashable, as a dataclass with ``eq`` is."""

    greeting: str

    async def __call__(self, request: Request, ctx: RunContext) -> str:
        return f"{self.greeting}, {request.input}"


def closure_runner(reply: str) -> Callable[[Request, RunContext], Awaitable[str]]:
    """A runner made per configuration, as programs build one spec per job."""

    async def runner(request: Request, ctx: RunContext) -> str:
        return reply

    return runner
