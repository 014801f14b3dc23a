"""Agent specs the batch tests run through ``--agent tests.batch.agents:NAME``.

Every run appends its item id to the file ``$BATCH_RUNS`` (one ``os.write`` per line), so
a test can tell what ran, and how often, after the process was killed.
"""

from __future__ import annotations

import os

import anyio
import attrs

from subagents import AgentSpec, Request, Result, RunContext, Usage
from subagents._json import loads


def _record(request: Request) -> dict[str, object]:
    item = loads(request.input)
    assert isinstance(item, dict)
    path = os.environ.get("BATCH_RUNS")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{item.get('id', '')}\n".encode())
        finally:
            os.close(fd)
    return dict(item)


async def _echo(request: Request, ctx: RunContext) -> Result:
    item = _record(request)
    if item.get("fail"):
        return Result(error=f"asked to fail: {item['fail']}")
    if item.get("raise"):
        raise RuntimeError(f"raised for {item.get('id')}")
    delay = item.get("sleep")
    if isinstance(delay, (int, float)) and delay > 0:
        await anyio.sleep(delay)
    return Result(output=f"echo {item.get('id')}", usage=Usage(input_tokens=3, output_tokens=2))


async def _noop(request: Request, ctx: RunContext) -> str:
    return ""


async def _prompted(request: Request, ctx: RunContext) -> str:
    return request.input.upper()


ECHO = AgentSpec(name="echo", runner=_echo)
NOOP = AgentSpec(name="noop", runner=_noop)
TWO = [ECHO, AgentSpec(name="shout", runner=_prompted)]


SHORT = attrs.evolve(ECHO, name="short", timeout=0.2)
"""``--agent tests.batch.agents:SHORT``: echo with a watchdog of its own."""
