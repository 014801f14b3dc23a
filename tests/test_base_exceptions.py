"""A runner raising a BaseException that is not a cancellation: the envelope names it.

KeyboardInterrupt and SystemExit end the child ``error`` ("the runner raised
KeyboardInterrupt") and then go on up, stopping the program as before; GeneratorExit and
the runner's own BaseException subclasses are its error like any other: the child ends
``error`` and the manager goes on. Before, each got ``cancelled: the caller was cancelled``.
"""

from __future__ import annotations

import gc
import warnings
from typing import Any

import anyio
import pytest

from subagents import (
    DelegateResult,
    Event,
    Request,
    RetryPolicy,
    RunContext,
    Status,
    SubagentManager,
)
from tests.helpers import echo, manager_with, spec


class RunnerStop(BaseException):
    """A runner's own BaseException (used to get past ``except Exception``)."""


def _raising(exc: BaseException) -> Any:
    async def runner(request: Request, ctx: RunContext) -> str:
        ctx.report(output="partial")
        raise exc

    return runner


def _completions(manager: SubagentManager) -> list[DelegateResult]:
    seen: list[DelegateResult] = []

    def on_event(event: Event) -> None:
        if event.type == "subagent.completed":
            seen.append(DelegateResult.from_dict(event.data))

    manager.events.subscribe(on_event)
    return seen


SWALLOWED: dict[str, tuple[BaseException, str, str]] = {
    "GeneratorExit": (GeneratorExit(), "GeneratorExit", "the runner raised GeneratorExit"),
    "custom": (
        RunnerStop("stop here"),
        f"{RunnerStop.__module__}.RunnerStop",
        "the runner raised RunnerStop: stop here",
    ),
    "group of custom": (
        BaseExceptionGroup("inner", [RunnerStop("a"), GeneratorExit()]),
        "BaseExceptionGroup",
        "the runner raised BaseExceptionGroup: inner",
    ),
}
WAYS = ["spawn", "spawn with retry", "execute"]


@pytest.mark.anyio
@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("case", list(SWALLOWED))
async def test_a_runners_own_base_exception_is_its_error_and_the_manager_goes_on(
    case: str, way: str
) -> None:
    exc, error_type, message = SWALLOWED[case]
    retry = {"retry": RetryPolicy(attempts=2)} if way == "spawn with retry" else {}
    agents = [spec("raiser", _raising(exc), **retry), spec("echo", echo)]
    async with manager_with(*agents, max_concurrent_spawns=1) as manager:
        seen = _completions(manager)
        with anyio.fail_after(5):
            if way == "execute":
                envelope = await manager.execute("raiser")
            else:
                envelope = await manager.spawn("raiser").wait()
            # the same worker (limit 1) runs the next child
            assert (await manager.spawn("echo", "next").wait()).output == "next"
    assert envelope.status == Status.ERROR, envelope
    assert envelope.error_type == error_type
    assert envelope.error.startswith(message), envelope.error
    assert envelope.output == "partial"
    assert envelope.attempts == 1  # never retried: not a transient failure
    assert [e.task_id for e in seen].count(envelope.task_id) == 1


INTERRUPTS: dict[str, tuple[BaseException, str]] = {
    "KeyboardInterrupt": (KeyboardInterrupt(), "KeyboardInterrupt"),
    "SystemExit": (SystemExit(3), "SystemExit"),
    "group with KeyboardInterrupt": (
        BaseExceptionGroup("inner", [KeyboardInterrupt()]),
        "KeyboardInterrupt",
    ),
}


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("case", list(INTERRUPTS))
def test_keyboard_interrupt_and_system_exit_name_themselves_then_stop_the_program(
    case: str, way: str, backend: str
) -> None:
    exc, error_type = INTERRUPTS[case]
    retry = {"retry": RetryPolicy(attempts=2)} if way == "spawn with retry" else {}
    agents = [spec("raiser", _raising(exc), **retry), spec("echo", echo)]
    seen: list[list[DelegateResult]] = []

    async def main() -> None:
        with anyio.fail_after(5):  # nothing hangs on the way out
            async with manager_with(*agents) as manager:
                seen.append(_completions(manager))
                if way == "execute":
                    await manager.execute("raiser")
                else:
                    await manager.spawn("raiser").wait()

    # On asyncio an interrupt raised in a task stops the loop at once, before the
    # manager's watchdog task ever ran: its coroutine is destroyed never awaited, when the
    # last reference to the stopped loop's tasks goes (here, not in a later test).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "coroutine .* was never awaited", RuntimeWarning)
        escaped: BaseException | None = None
        try:
            anyio.run(main, backend=backend)
        except BaseException as exc:
            escaped = exc
            while isinstance(escaped, BaseExceptionGroup) and len(escaped.exceptions) == 1:
                escaped = escaped.exceptions[0]
        kind = type(escaped)
        del escaped
        gc.collect()
    assert issubclass(kind, (KeyboardInterrupt, SystemExit)), kind
    (envelope,) = seen[0]
    assert envelope.status == Status.ERROR, envelope
    assert envelope.error_type.endswith(error_type)
    assert envelope.error.startswith("the runner raised "), envelope.error
    assert "caller was cancelled" not in envelope.error
    assert envelope.output == "partial"


# ---------------------------------------------------------------- asyncio's own cancellation


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_asyncio_native_cancellation_of_execute_propagates() -> None:
    """A host loop that times a tool out with asyncio itself (``asyncio.timeout``,
    ``wait_for``, ``task.cancel()``) cancels no anyio scope: the runner's CancelledError is
    still that cancellation, not the runner's own error, and it reaches the host."""
    import asyncio

    entered = anyio.Event()

    async def slow(request: Request, ctx: RunContext) -> str:
        entered.set()
        await anyio.sleep_forever()
        return "never"

    async with manager_with(spec("slow", slow)) as manager:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.01):
                await manager.execute("slow", "timeout")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(manager.execute("slow", "wait_for"), 0.01)
        task = asyncio.create_task(manager.execute("slow", "cancel"))
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        envelopes = [h.result for h in manager.tasks()]
        assert [e.status for e in envelopes if e is not None] == [Status.CANCELLED] * 3


@pytest.mark.anyio
async def test_a_group_holding_a_cancellation_nobody_asked_for_is_the_runners_error() -> None:
    """A runner raising a group with a cancellation in it while nothing cancels its task:
    its error, not a cancellation that would take the worker (and its siblings) down."""

    async def bad(request: Request, ctx: RunContext) -> str:
        cancelled = anyio.get_cancelled_exc_class()
        try:
            raise cancelled()
        except cancelled as exc:  # trio's Cancelled cannot be made: reuse a caught one
            raise BaseExceptionGroup("g", [exc, ValueError("boom")]) from None

    async with manager_with(spec("bad", bad), spec("echo", echo)) as manager:
        handles = [manager.spawn("bad"), manager.spawn("echo", "sibling")]
        envelopes = [await h.wait() for h in handles]
    assert envelopes[0].status is Status.ERROR
    assert envelopes[1].status is Status.COMPLETED
