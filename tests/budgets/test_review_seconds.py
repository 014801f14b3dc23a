"""Review: a session's seconds budget counts from its opening, so the tree is over when it
runs out, even for a child still waiting in the queue for a slot. On trio's mock clock."""

from __future__ import annotations

import anyio
import pytest
from trio.testing import MockClock

from subagents import Budget, Request, RunContext, Status, SubagentConfig, SubagentManager
from tests.helpers import spec

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize(
        "anyio_backend",
        [pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}), id="trio-mock")],
    ),
]


async def sleeper(request: Request, ctx: RunContext) -> str:
    await anyio.sleep(float(request.input))
    return "slept"


async def test_a_queued_child_of_a_session_ends_when_the_sessions_time_is_up() -> None:
    config = SubagentConfig(max_concurrent_spawns=1, spawn_timeout=None)
    async with SubagentManager([spec("sleep", sleeper)], config=config) as m:
        start = anyio.current_time()
        m.spawn("sleep", "100", session_id="other")  # holds the one slot for 100 s
        m.open_session("conv", budget=Budget(seconds=5))
        envelope = await m.spawn("sleep", "1", session_id="conv").wait()
        ended = anyio.current_time() - start
    assert envelope.status is Status.TIMEOUT
    assert envelope.error_type == "BudgetExceeded"
    assert ended == pytest.approx(5)  # not when the slot frees, 95 s past the budget
