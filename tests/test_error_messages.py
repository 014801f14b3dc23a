"""Exception messages are for programmers and bounded; the tools say what a model should
do. An unknown agent among hundreds names the closest few and the count."""

from __future__ import annotations

import time

import pytest

from subagents import SubagentManager, UnknownAgent, build_tools
from subagents.testing import echo_agent

pytestmark = pytest.mark.anyio

MANY = [f"agent-{i:03d}" for i in range(200)] + ["researcher", "reviewer"]


def _manager(names: list[str]) -> SubagentManager:
    return SubagentManager([echo_agent(name) for name in names])


async def test_an_unknown_agent_among_hundreds_names_the_closest_and_the_count() -> None:
    """Before: every registered name, 2,306 characters for 200 agents."""
    async with _manager(MANY) as manager:
        with pytest.raises(UnknownAgent) as raised:
            manager.spawn("agent-07")
    error = raised.value
    message = str(error)
    assert len(message) < 200, message
    assert "202 agents are registered" in message
    assert error.suggestions
    assert all(s.startswith("agent-0") for s in error.suggestions)
    assert len(error.suggestions) <= 3
    assert all(s in message for s in error.suggestions)
    assert error.known == tuple(sorted(MANY))  # the data stays whole


@pytest.mark.parametrize(
    ("asked", "meant"),
    [("Researcher", "researcher"), ("reseacher", "researcher"), ("reviewr", "reviewer")],
)
async def test_the_closest_name_comes_first(asked: str, meant: str) -> None:
    async with _manager(MANY) as manager:
        with pytest.raises(UnknownAgent) as raised:
            await manager.execute(asked)
    assert raised.value.suggestions[0] == meant
    assert meant in str(raised.value)


async def test_a_name_close_to_nothing_says_where_the_list_is() -> None:
    async with _manager(MANY) as manager:
        with pytest.raises(UnknownAgent) as raised:
            manager.get_agent("zzzzzzzzzzzzzzzzzz")
    assert raised.value.suggestions == ()
    assert "SubagentManager.agents" in str(raised.value)


async def test_a_huge_unknown_name_is_cheap_and_bounded() -> None:
    async with _manager(MANY) as manager:
        started = time.perf_counter()
        with pytest.raises(UnknownAgent) as raised:
            manager.spawn("agent-" + "x" * 1_000_000)
        assert time.perf_counter() - started < 1.0
    assert len(str(raised.value)) < 300


async def test_a_few_agents_are_all_listed() -> None:
    async with _manager(["beta", "alpha"]) as manager:
        with pytest.raises(UnknownAgent, match=r"registered agents: alpha, beta$"):
            manager.spawn("gamma")
    async with _manager([]) as manager:
        with pytest.raises(UnknownAgent, match=r"no agents are registered$"):
            manager.spawn("gamma")


async def test_the_tools_unknown_agent_error_stays_bounded_and_actionable() -> None:
    async with _manager(MANY) as manager:
        tools = build_tools(manager, "root")
        result = await tools.call("spawn_agent", {"agent": "agent-07", "input": "x"})
    assert result.is_error
    assert len(result.content) < 400, result.content
    assert "list_agents" in result.content
    assert "202" in result.content
    assert "agent-0" in result.content
    assert result.details["registered"] == 202
    known = result.details["known"]
    assert isinstance(known, list)
    assert len(known) <= 50


async def test_the_tools_list_every_agent_of_a_moderate_registry() -> None:
    names = [f"worker-{i}" for i in range(30)]
    async with _manager(names) as manager:
        tools = build_tools(manager, "root")
        result = await tools.call("spawn_agent", {"agent": "nobody", "input": "x"})
    assert result.is_error
    assert all(name in result.content for name in names)
    assert result.details["known"] == sorted(names)
