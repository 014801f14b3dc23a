"""Exception messages are for programmers and bounded; the tools say what a model should
do. An unknown agent among hundreds names the closest few and the count."""

from __future__ import annotations

import ast
import time
from pathlib import Path

import pytest

import subagents
from subagents import SpawnRejected, SubagentConfig, SubagentManager, UnknownAgent
from subagents.testing import echo_agent
from subagents.tools import build_tools
from subagents.tools._tool import error_result

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


# --- exceptions speak to programmers, tool results to models ----------------------------

MODEL_SPEAK = ("yourself", "you ", "your ")


async def _rejections() -> dict[str, SpawnRejected]:
    """One SpawnRejected of each reason, as a Python caller gets it."""
    rejected: dict[str, SpawnRejected] = {}
    manager = SubagentManager([echo_agent("echo")], config=SubagentConfig(max_depth=0))
    with pytest.raises(SpawnRejected) as raised:
        manager.spawn("echo")  # not entered yet
    rejected["manager_closed"] = raised.value
    async with manager:
        with pytest.raises(SpawnRejected) as raised:
            manager.spawn("echo")
        rejected["depth"] = raised.value
        await manager.close_session("gone")
        with pytest.raises(SpawnRejected) as raised:
            await manager.execute("echo", session_id="gone")
        rejected["session_closed"] = raised.value
    return rejected


async def test_spawn_rejections_raised_to_python_do_not_address_a_model() -> None:
    """Before: "... do this task yourself instead of delegating it"."""
    for reason, error in (await _rejections()).items():
        assert error.reason == reason
        message = str(error)
        assert not any(word in message for word in MODEL_SPEAK), message
    rejected = await _rejections()
    assert "max_depth is 0" in str(rejected["depth"])
    assert "async with" in str(rejected["manager_closed"])
    assert "'gone' is closed" in str(rejected["session_closed"])


@pytest.mark.parametrize("reason", ["depth", "session_closed", "manager_closed"])
async def test_the_tools_add_the_model_hint_for_each_rejection(reason: str) -> None:
    error = (await _rejections())[reason]
    result = error_result(error, "spawn_agent")
    assert result.is_error
    assert result.details == {"error": "spawn_rejected", "reason": reason}
    assert str(error) in result.content
    assert "do this task yourself" in result.content or "do the task yourself" in result.content


def _raised_texts(path: Path) -> list[tuple[int, str]]:
    """The string constants in the arguments of every ``raise`` in a module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Raise) and node.exc is not None:
            for part in ast.walk(node.exc):
                if isinstance(part, ast.Constant) and isinstance(part.value, str):
                    found.append((node.lineno, part.value))
    return found


def test_no_exception_the_library_raises_addresses_a_model() -> None:
    package = Path(subagents.__file__).parent
    offenders = [
        f"{path.name}:{line}: {text!r}"
        for path in sorted(package.glob("*.py"))
        for line, text in _raised_texts(path)
        if any(word in text.lower() for word in MODEL_SPEAK)
    ]
    assert not offenders, offenders
