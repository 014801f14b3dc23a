"""Runners for the review tests of RayBackend, in a module the Ray workers import by path."""

from __future__ import annotations

from typing import Any

import anyio
import ray

from subagents import Request, RunContext, Usage
from subagents.backends._ray_bridge import settled
from tests.backends.ray import runners


async def reports_many_files(request: Request, ctx: RunContext) -> str:
    ctx.report(files_changed=[f"src/f{n}.py" for n in range(1500)])
    return "done"


async def spends_then_hangs(request: Request, ctx: RunContext) -> str:
    ctx.report(usage=Usage(input_tokens=100, output_tokens=0))
    runners._started(request)
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
