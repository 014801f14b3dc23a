"""Runners for the Ray backend's tests, in a module the Ray workers import by path.

A test names a :class:`Latch` actor in the request's input; a runner sets it once it runs
on its worker (with its process id), so the test waits for that instead of for time.
"""

from __future__ import annotations

import os
import time

import anyio
import ray
from opentelemetry import baggage
from opentelemetry.sdk.trace import TracerProvider

from subagents import Request, RunContext


class Latch:
    """An async actor's body: each ``set`` records a value; ``wait(n)`` waits for the
    ``n``-th (from 0) and returns it, so one latch serves a run of samples."""

    def __init__(self) -> None:
        self._values: list[object] = []
        self._changed = anyio.Event()

    def ready(self) -> None:
        """Answers once the actor exists (and its name can be looked up)."""

    def set(self, value: object) -> None:
        self._values.append(value)
        self._changed.set()
        self._changed = anyio.Event()

    async def wait(self, index: int = 0) -> object:
        while len(self._values) <= index:
            await self._changed.wait()
        return self._values[index]


def _started(request: Request) -> None:
    ray.get_actor(request.input).set.remote(os.getpid())


async def starts_then_hangs(request: Request, ctx: RunContext) -> str:
    ctx.report(output="partial before the hang", iterations=2)
    _started(request)
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


async def starts_then_blocks(request: Request, ctx: RunContext) -> str:
    _started(request)
    # Blocks the worker's event loop on purpose: only a forced stop ends it.
    time.sleep(60)  # noqa: ASYNC251
    return "slept through"


async def noop(request: Request, ctx: RunContext) -> str:
    return "ok"


async def traced(request: Request, ctx: RunContext) -> str:
    """Opens a span under the context the driver sent; returns its trace id, its parent's
    span id and the task id the baggage carried."""
    tracer = TracerProvider().get_tracer("tests.ray")
    with tracer.start_as_current_span("remote work") as span:
        parent = span.parent  # type: ignore[attr-defined]  # an SDK span's parent
        task = baggage.get_baggage("subagents.task_id")
        context = span.get_span_context()
        return f"{context.trace_id:032x} {parent.span_id:016x} {task}"


async def delegates(request: Request, ctx: RunContext) -> str:
    ctx.spawn("anything", "from a worker")
    return "spawned"


async def reads_context(request: Request, ctx: RunContext) -> str:
    remaining = ctx.remaining()
    return (
        f"task={ctx.task_id} path={ctx.agent_path} attempt={ctx.attempt} "
        f"remaining={remaining is not None and 0 < remaining <= 30} "
        f"read={ctx.allows('read_file')} write={ctx.allows('write_file')}"
    )
