"""The seconds budget: a child's deadline is the earlier of its own timeout and the end of
every seconds budget above it; running out ends it ``timeout`` naming the budget, and a
spawn once the time is up is refused. On trio's mock clock, so no test waits in real time
and the times asserted are exact."""

from __future__ import annotations

import anyio
import pytest
from trio.testing import MockClock

from subagents import (
    Budget,
    DelegateResult,
    Request,
    RunContext,
    SpawnRejected,
    Status,
    SubagentConfig,
    SubagentManager,
)
from tests.helpers import spec

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize(
        "anyio_backend",
        [pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}), id="trio-mock")],
    ),
]

ended_at: dict[str, float] = {}
watchdog_left: dict[str, float | None] = {}


async def sleeper(request: Request, ctx: RunContext) -> str:
    watchdog_left[request.input] = ctx.remaining()
    try:
        await anyio.sleep(float(request.input) if request.input.isdigit() else 1000)
    finally:
        ended_at[request.input] = anyio.current_time()
    return "slept"


def manager(*agents: object, **config: object) -> SubagentManager:
    return SubagentManager(
        [spec("sleep", sleeper), *agents],  # type: ignore[list-item]
        config=SubagentConfig(**config),  # type: ignore[arg-type]
    )


async def test_a_seconds_budget_times_the_child_out_naming_the_budget() -> None:
    async with manager(spawn_timeout=60) as m:
        start = anyio.current_time()
        envelope = await m.spawn("sleep", budget=Budget(seconds=5)).wait()
        assert anyio.current_time() - start == pytest.approx(5)
    assert envelope.status is Status.TIMEOUT
    assert envelope.error_type == "BudgetExceeded"
    assert envelope.error == "budget of 5 s of /root/sleep ran out"


async def test_an_own_timeout_shorter_than_the_budget_is_a_plain_timeout() -> None:
    async with manager() as m:
        envelope = await m.spawn("sleep", timeout=2, budget=Budget(seconds=5)).wait()
    assert (envelope.status, envelope.error_type) == (Status.TIMEOUT, "timeout")


async def test_a_descendant_ends_when_its_ancestors_time_is_up() -> None:
    left: list[float | None] = []

    async def parent(request: Request, ctx: RunContext) -> str:
        await anyio.sleep(3)
        left.append(ctx.remaining_budget().seconds)
        await ctx.execute("sleep", "nested", timeout=60)
        return "unreachable in time"

    async with manager(spec("parent", parent)) as m:
        start = anyio.current_time()
        handle = m.spawn("parent", budget=Budget(seconds=10))
        envelope = await handle.wait()
        # Both deadlines are at 10: the parent's cancellation may reach the execute()
        # first, so its envelope is read from the record, not from the call.
        (nested,) = [h.result for h in m.tasks(handle.task_id)]
    assert left == [pytest.approx(7)]
    assert watchdog_left["nested"] == pytest.approx(7)  # not its own 60
    assert ended_at["nested"] - start == pytest.approx(10)
    assert isinstance(nested, DelegateResult)
    # Stopped with its parent: cancelled as the parent ended, or timed out by the same
    # budget if its own watchdog fired first.
    assert nested.status is Status.CANCELLED or (
        nested.error == "budget of 10 s of /root/parent ran out"
    )
    assert envelope.status is Status.TIMEOUT
    assert envelope.error_type == "BudgetExceeded"


async def test_a_session_budget_counts_from_its_opening() -> None:
    async with manager(spawn_timeout=None) as m:
        m.open_session("conv", budget=Budget(seconds=5))
        start = anyio.current_time()
        await anyio.sleep(4)
        envelope = await m.spawn("sleep", "late", session_id="conv").wait()
        assert ended_at["late"] - start == pytest.approx(5)
        assert envelope.error == "budget of 5 s of session 'conv' ran out"
        with pytest.raises(SpawnRejected) as caught:
            m.spawn("sleep", session_id="conv")
    assert caught.value.reason == "budget_exhausted"
    assert "its time is up" in str(caught.value)


async def test_a_child_done_in_time_is_untouched() -> None:
    async with manager() as m:
        envelope = await m.spawn("sleep", "1", budget=Budget(seconds=5)).wait()
    assert envelope.ok


async def test_a_sessions_time_ends_each_of_its_queued_children_and_nothing_else() -> None:
    async with manager(max_concurrent_spawns=1, spawn_timeout=None) as m:
        start = anyio.current_time()
        blocker = m.spawn("sleep", "100", session_id="other")  # the one slot, for 100 s
        m.open_session("conv", budget=Budget(seconds=5))
        queued = [m.spawn("sleep", "1", session_id="conv") for _ in range(2)]
        first = await queued[0].wait()
        assert anyio.current_time() - start == pytest.approx(5)
        second = await queued[1].wait()
        assert blocker.result is None  # another session's child runs on
        await blocker.wait()
    for envelope in (first, second):
        assert (envelope.status, envelope.error_type) == (Status.TIMEOUT, "BudgetExceeded")
        assert envelope.error == "budget of 5 s of session 'conv' ran out"
    assert blocker.result is not None
    assert blocker.result.ok


async def test_a_queued_child_of_a_session_ends_when_the_sessions_time_is_up() -> None:
    """A session's seconds budget counts from its opening, so the tree is over when it
    runs out, even for a child still waiting in the queue for a slot."""
    async with manager(max_concurrent_spawns=1, spawn_timeout=None) as m:
        start = anyio.current_time()
        m.spawn("sleep", "100", session_id="other")  # holds the one slot for 100 s
        m.open_session("conv", budget=Budget(seconds=5))
        envelope = await m.spawn("sleep", "1", session_id="conv").wait()
        ended = anyio.current_time() - start
    assert envelope.status is Status.TIMEOUT
    assert envelope.error_type == "BudgetExceeded"
    assert ended == pytest.approx(5)  # not when the slot frees, 95 s past the budget
