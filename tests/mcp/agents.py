"""Agent specs for ``subagents mcp serve --agents tests.mcp.agents:...`` in the tests."""

from __future__ import annotations

import anyio

from subagents import AgentSpec, Request, RunContext
from subagents.testing import echo_agent


async def _sleep(request: Request, ctx: RunContext) -> str:
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


SLEEPER = AgentSpec(name="sleeper", description="Runs until it is cancelled.", runner=_sleep)
SPECS = [echo_agent(), SLEEPER]
BY_NAME = {spec.name: spec for spec in SPECS}
NOT_SPECS = 3
MIXED = [echo_agent(), "sleeper"]
NONE: list[AgentSpec] = []


def make() -> list[AgentSpec]:
    """A factory: the specs are built when the command runs."""
    return SPECS


def broken() -> list[AgentSpec]:
    raise RuntimeError("no agents today")


async def make_async() -> list[AgentSpec]:
    """An async factory: refused, since the specs are built before any event loop runs."""
    return SPECS


def returns_awaitable() -> object:
    """A plain function handing back an awaitable: refused the same way."""
    return make_async()


def noisy() -> list[AgentSpec]:
    print("building the specs")  # over stdio, stdout is the protocol's
    return SPECS
