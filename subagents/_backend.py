"""The backend seam: where a child's runner actually runs.

A remote backend replaces :func:`run_local` with a function of the same signature that
ships the request elsewhere; everything around it (queueing, watchdog, cancellation,
envelopes, delivery) stays in the manager. With the default backend, a plain runner (no
retry policy, no trace) is awaited in place by ``_child_run`` with the same checks, to save
a frame and a ``Result`` per child: a change here must be mirrored there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeAlias

from ._envelope import Status, Usage
from ._retry import run_with_retries
from ._spec import AgentSpec, Request, Result

if TYPE_CHECKING:
    from ._context import RunContext

__all__ = ["Backend", "RunnerReturnError", "coerce_result", "run_local"]

# Counts travel as JSON integers; orjson (and most consumers) stop at 64 bits.
_MAX_COUNT = 2**63 - 1

Backend: TypeAlias = "Callable[[AgentSpec, Request, RunContext], Awaitable[Result]]"


class RunnerReturnError(TypeError):
    """A runner returned something other than ``Result`` or ``str``."""


async def run_local(spec: AgentSpec, request: Request, ctx: RunContext) -> Result:
    """Run ``spec.runner`` in this task, retrying transient failures under ``spec.retry``."""
    if spec.retry is None:
        return coerce_result(spec.name, await spec.runner(request, ctx))

    async def attempt(number: int) -> Result:
        ctx.attempt = number
        return coerce_result(spec.name, await spec.runner(request, ctx))

    return await run_with_retries(spec.retry, attempt, deadline=ctx.deadline)


def coerce_result(agent: str, value: object) -> Result:
    """Accept ``Result`` or ``str``; anything else raises :class:`RunnerReturnError`."""
    # Text is made JSON-safe where it lands: DelegateResult's converters (clean_text).
    if type(value) is str:
        return Result(output=value)
    if isinstance(value, Result):
        _check_result(agent, value)
        return value
    if isinstance(value, str):  # a str subclass: keep the text, drop the subclass
        return Result(output=str.__str__(value))
    raise RunnerReturnError(
        f"runner of agent {agent!r} returned {type(value).__qualname__}; expected Result or str"
    )


def _check_result(agent: str, result: Result) -> None:
    problems = []
    if not isinstance(result.output, str):
        problems.append(f"output is {type(result.output).__qualname__}, expected str")
    if not isinstance(result.usage, Usage):
        problems.append(f"usage is {type(result.usage).__qualname__}, expected Usage")
    if isinstance(result.iterations, bool) or not isinstance(result.iterations, int):
        problems.append(f"iterations is {type(result.iterations).__qualname__}, expected int")
    elif not 0 <= result.iterations <= _MAX_COUNT:
        problems.append(f"iterations is {result.iterations}, expected 0 <= n < 2**63")
    if isinstance(result.usage, Usage):
        for field in ("input_tokens", "output_tokens"):
            count = getattr(result.usage, field)
            if isinstance(count, bool) or not isinstance(count, int):
                problems.append(f"usage.{field} is {type(count).__qualname__}, expected int")
            elif not 0 <= count <= _MAX_COUNT:
                problems.append(f"usage.{field} is {count}, expected 0 <= n < 2**63")
    if result.status is not None and not isinstance(result.status, Status):
        problems.append(f"status is {result.status!r}, expected a Status or None")
    if not all(isinstance(f, str) for f in result.files_changed):
        problems.append("files_changed must hold strings")
    if not isinstance(result.error, str):
        problems.append(f"error is {type(result.error).__qualname__}, expected str")
    if problems:
        raise RunnerReturnError(
            f"runner of agent {agent!r} returned a bad Result: " + "; ".join(problems)
        )
