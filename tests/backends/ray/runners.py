"""Runners for the Ray backend's tests, in a module the Ray workers import by path.

A test names a :class:`Latch` actor in the request's input; a runner sets it once it runs
on its worker (with its process id), so the test waits for that instead of for time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import attrs
import ray
from opentelemetry import baggage
from opentelemetry.sdk.trace import TracerProvider

from subagents import Request, RunContext, TransientError, Usage
from subagents.backends._ray_bridge import settled


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


async def echoes(request: Request, ctx: RunContext) -> str:
    return f"echo {request.input}"


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


async def reports_many_files(request: Request, ctx: RunContext) -> str:
    ctx.report(files_changed=[f"src/f{n}.py" for n in range(1500)])
    return "done"


async def spends_then_hangs(request: Request, ctx: RunContext) -> str:
    ctx.report(usage=Usage(input_tokens=100, output_tokens=0))
    _started(request)
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


def a_runner_raising_a_class_of_its_own() -> Any:
    class QuotaError(Exception):
        pass

    async def raises(request: Request, ctx: RunContext) -> str:
        raise QuotaError("over quota")

    return raises


async def reports_once_let_go(request: Request, ctx: RunContext) -> str:
    """Sets the latch named first in the input, waits for the one named second, then
    reports and returns."""
    started, go = request.input.split()
    ray.get_actor(started).set.remote(0)
    await _await(ray.get_actor(go).wait.remote())
    ctx.report(output="reported late", iterations=1)
    return "done"


async def _await(ref: Any) -> object:
    return await settled(ref.future())


async def reports_then_raises_a_worker_only_error(request: Request, ctx: RunContext) -> str:
    """Raises an exception of a module only the workers have (as a GPU library installed
    on the GPU nodes alone), after reporting progress."""
    import importlib

    ctx.report(output="before the failure", iterations=1)
    module = importlib.import_module(request.input)
    raise module.GpuError("out of device memory")


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


async def reads_budget(request: Request, ctx: RunContext) -> str:
    ctx.report(usage=Usage(input_tokens=100, output_tokens=50))
    left = ctx.remaining_budget()
    seconds = left.seconds is not None and 0 < left.seconds <= 30
    return f"tokens={left.tokens} seconds={seconds}"


async def raises_keyboard_interrupt(request: Request, ctx: RunContext) -> str:
    raise KeyboardInterrupt


async def raises_system_exit(request: Request, ctx: RunContext) -> str:
    raise SystemExit(3)


async def reports_then_interrupts(request: Request, ctx: RunContext) -> str:
    ctx.report(output="before the interrupt", iterations=2)
    if request.input == "exit":
        raise SystemExit(3)
    raise KeyboardInterrupt


class Abort(BaseException):
    """A runner's own exception outside ``Exception`` (some libraries unwind with one)."""


async def reports_then_aborts(request: Request, ctx: RunContext) -> str:
    ctx.report(output="before the abort", iterations=3)
    raise Abort("the runner gave up")
