"""Review: the tools' budget answers with a large (valid) seconds budget. A Budget takes
any finite number of seconds, so the tools' answers must still be a success, and what
they report must stay a JSON integer the tools' other fields stay within (2**53 - 1)."""

from __future__ import annotations

import anyio
import orjson
import pytest

from subagents import Budget, Request, RunContext, SubagentConfig, SubagentManager
from subagents.tools import build_tools
from subagents.tools._schema import MAX_INT
from tests.helpers import spec

pytestmark = pytest.mark.anyio


async def idle(request: Request, ctx: RunContext) -> str:
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


def manager() -> SubagentManager:
    return SubagentManager([spec("idle", idle)], config=SubagentConfig(spawn_timeout=None))


async def test_spawn_agent_under_a_huge_seconds_budget_answers_with_the_spawned_task() -> None:
    async with manager() as m:
        m.open_session("conv", budget=Budget(seconds=1.7e308))
        answer = await build_tools(m, "conv").call("spawn_agent", {"agent": "idle", "input": "x"})
        spawned = m.statistics().spawned
    # The child was spawned; an answer saying the call failed invites a second spawn.
    assert spawned == 1
    assert not answer.is_error, answer.content


async def test_the_budget_left_in_an_answer_is_a_bounded_json_integer() -> None:
    async with manager() as m:
        m.open_session("conv", budget=Budget(seconds=1e300))
        answer = await build_tools(m, "conv").call("spawn_agent", {"agent": "idle", "input": "x"})
    assert not answer.is_error
    left = answer.details["budget"]
    assert isinstance(left, dict)
    time_ms = left["time_ms"]
    assert isinstance(time_ms, int)
    assert time_ms <= MAX_INT
    orjson.dumps(answer.details)  # JSON integers stop at 64 bits
