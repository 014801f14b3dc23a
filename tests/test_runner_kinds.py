"""Which callables a runner may be: async ones are accepted, a plain function is refused
when the AgentSpec is built (not when the child runs), with a message saying how to wrap
it; a runner that still returns something that cannot be awaited ends in an error."""

from __future__ import annotations

import functools
from typing import Any

import anyio
import attrs
import pytest

from subagents import AgentSpec, ConfigError, Request, RetryPolicy, RunContext, Status
from tests.helpers import manager_with

pytestmark = pytest.mark.anyio


def plain(request: Request, ctx: RunContext) -> str:
    return "plain"


async def coroutine_function(request: Request, ctx: RunContext, suffix: str = "") -> str:
    return "async" + suffix


class SyncCall:
    def __call__(self, request: Request, ctx: RunContext) -> str:
        return "sync"


class AsyncCall:
    async def __call__(self, request: Request, ctx: RunContext) -> str:
        return "async object"

    async def method(self, request: Request, ctx: RunContext) -> str:
        return "async method"


REFUSED: dict[str, object] = {
    "plain def": plain,
    "lambda": lambda request, ctx: "lambda",
    "builtin": print,
    "object with a sync __call__": SyncCall(),
    "partial of a plain def": functools.partial(plain),
    "a class": AsyncCall,  # calling it makes an instance, not a coroutine
    "not callable": "not a function",
    "None": None,
}

ACCEPTED: dict[str, tuple[Any, str]] = {
    "async def": (coroutine_function, "async"),
    "async method": (AsyncCall().method, "async method"),
    "object with an async __call__": (AsyncCall(), "async object"),
    "partial of an async def": (functools.partial(coroutine_function, suffix="!"), "async!"),
    "partial of an async object": (functools.partial(AsyncCall()), "async object"),
    "partial of a partial": (
        functools.partial(functools.partial(coroutine_function), suffix="?"),
        "async?",
    ),
}


@pytest.mark.parametrize("runner", list(REFUSED.values()), ids=list(REFUSED))
def test_a_runner_that_is_not_async_is_refused_with_how_to_wrap_it(runner: Any) -> None:
    with pytest.raises(ConfigError) as raised:
        AgentSpec(name="a", runner=runner)
    assert raised.value.field == "runner"
    message = str(raised.value)
    assert "async def runner(request, ctx)" in message
    assert "anyio.to_thread.run_sync" in message


@pytest.mark.parametrize("way", ["inline", "run_local"])
@pytest.mark.parametrize("runner", list(ACCEPTED), ids=list(ACCEPTED))
async def test_async_callables_are_accepted_and_run(runner: str, way: str) -> None:
    function, output = ACCEPTED[runner]
    retry = {"retry": RetryPolicy(attempts=1)} if way == "run_local" else {}
    async with manager_with(AgentSpec(name="a", runner=function, **retry)) as manager:
        with anyio.fail_after(5):
            envelope = await manager.spawn("a").wait()
    assert envelope.status == Status.COMPLETED, envelope
    assert envelope.output == output


@pytest.mark.parametrize("way", ["inline", "run_local"])
async def test_a_runner_returning_a_plain_value_ends_in_a_clear_error(way: str) -> None:
    """A runner that gets past the check (swapped in after construction, or marked as a
    coroutine function) and returns a str: an error envelope saying so, not the
    interpreter's "object str can't be used in 'await' expression"."""
    retry = {"retry": RetryPolicy(attempts=1)} if way == "run_local" else {}
    spec = AgentSpec(name="a", runner=coroutine_function, **retry)
    object.__setattr__(spec, "runner", plain)  # as a test double or a monkeypatch would
    async with manager_with(spec, AgentSpec(name="b", runner=coroutine_function)) as manager:
        with anyio.fail_after(5):
            envelope = await manager.spawn("a").wait()
            assert (await manager.execute("b")).status == Status.COMPLETED
    assert envelope.status == Status.ERROR
    assert envelope.error_type == "subagents.RunnerReturnError"
    assert "returned str when called, not an awaitable" in envelope.error
    assert "await' expression" not in envelope.error


def test_evolve_keeps_checking_the_runner() -> None:
    spec = AgentSpec(name="a", runner=coroutine_function)
    with pytest.raises(ConfigError, match="runner"):
        attrs.evolve(spec, runner=plain)
