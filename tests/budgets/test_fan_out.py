"""max_children and max_agents hold on every spawn path, like max_depth: a manager's
spawn and execute, the tools, and a runner's nested ctx.spawn and ctx.execute. The tools
turn each refusal (and an exhausted budget) into a result a model can act on, and answer
with the budget left as a bounded JSON integer however large the budget."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import orjson
import pytest
from jsonschema import Draft202012Validator

from subagents import (
    Budget,
    Request,
    RunContext,
    SpawnRejected,
    SubagentConfig,
    SubagentManager,
    Usage,
)
from subagents.tools import build_tools
from subagents.tools._schema import MAX_INT
from tests.helpers import spec

pytestmark = pytest.mark.anyio

Make = Callable[[SubagentManager, str], Awaitable[None]]


async def idle(request: Request, ctx: RunContext) -> str:
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


async def by_spawn(m: SubagentManager, session: str) -> None:
    m.spawn("idle", session_id=session)


async def by_execute(m: SubagentManager, session: str) -> None:
    # execute() blocks for its child: a task of the test holds the call (cancelled as
    # the test ends), and the refusal, raised before anything runs, comes back here.
    failure: list[BaseException] = []

    async def run() -> None:
        try:
            await m.execute("idle", session_id=session)
        except SpawnRejected as exc:
            failure.append(exc)

    TASKS.start_soon(run)
    await anyio.wait_all_tasks_blocked()
    if failure:
        raise failure[0]


async def by_tool(m: SubagentManager, session: str) -> None:
    result = await build_tools(m, session).call("spawn_agent", {"agent": "idle", "input": "x"})
    if result.is_error:
        raise SpawnRejected(str(result.details.get("reason")), result.content)


PATHS = {"spawn": by_spawn, "execute": by_execute, "tool": by_tool}
TASKS: anyio.abc.TaskGroup


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("nested", [False, True], ids=["root", "nested"])
async def test_max_children_holds_on_every_path(path: str, nested: bool) -> None:
    global TASKS
    made: list[BaseException | None] = []

    async def parent(request: Request, ctx: RunContext) -> str:
        for _ in range(3):
            try:
                await PATHS[path](ctx.manager, ctx.session_id)
                made.append(None)
            except SpawnRejected as exc:
                made.append(exc)
        done.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    done = anyio.Event()
    config = SubagentConfig(max_children=2, spawn_timeout=None, execute_timeout=None)
    async with (
        SubagentManager([spec("idle", idle), spec("parent", parent)], config=config) as m,
        anyio.create_task_group() as TASKS,
    ):  # the tasks close first: their execute() calls end before the manager does
        if nested:
            m.spawn("parent")
            await done.wait()
        else:
            for _ in range(3):
                try:
                    await PATHS[path](m, "root")
                    made.append(None)
                except SpawnRejected as exc:
                    made.append(exc)
        TASKS.cancel_scope.cancel()
    assert made[:2] == [None, None]
    assert isinstance(made[2], SpawnRejected)
    assert made[2].reason == "max_children"
    assert "max_children is 2" in str(made[2])


@pytest.mark.parametrize("path", list(PATHS))
async def test_max_agents_counts_every_depth_of_a_tree(path: str) -> None:
    global TASKS
    made: list[BaseException | None] = []

    async def parent(request: Request, ctx: RunContext) -> str:
        try:
            await PATHS[path](ctx.manager, ctx.session_id)
            made.append(None)
        except SpawnRejected as exc:
            made.append(exc)
        done.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    done = anyio.Event()
    config = SubagentConfig(max_agents=2, spawn_timeout=None, execute_timeout=None)
    async with (
        SubagentManager([spec("idle", idle), spec("parent", parent)], config=config) as m,
        anyio.create_task_group() as TASKS,
    ):  # the tasks close first: their execute() calls end before the manager does
        m.spawn("parent")
        m.spawn("idle")  # the tree of "root" has 2 agents now
        await done.wait()
        m.spawn("idle", session_id="other")  # another tree: its own count
        TASKS.cancel_scope.cancel()
    assert isinstance(made[0], SpawnRejected)
    assert made[0].reason == "max_agents"
    assert "the tree of session 'root' has 2 unfinished agents" in str(made[0])


async def test_an_ended_child_frees_its_place() -> None:
    async def quick(request: Request, ctx: RunContext) -> str:
        return "ok"

    config = SubagentConfig(max_children=1, max_agents=1)
    async with SubagentManager([spec("quick", quick)], config=config) as m:
        for _ in range(3):
            assert (await m.spawn("quick").wait()).ok
            assert (await m.execute("quick")).ok


async def test_the_tools_answer_a_refusal_with_what_to_do() -> None:
    config = SubagentConfig(max_children=1, spawn_timeout=None)
    async with SubagentManager([spec("idle", idle)], config=config) as m:
        tools = build_tools(m, "root")
        first = await tools.call("spawn_agent", {"agent": "idle", "input": "x"})
        assert not first.is_error
        second = await tools.call("spawn_agent", {"agent": "idle", "input": "x"})
    assert second.is_error
    assert second.details == {"error": "spawn_rejected", "reason": "max_children"}
    assert "wait for one of your subagents to finish" in second.content


async def test_an_exhausted_budget_tells_the_model_to_do_the_rest_itself() -> None:
    async def spender(request: Request, ctx: RunContext) -> str:
        ctx.report(usage=Usage(input_tokens=50_000))
        result = await build_tools(ctx.manager, ctx.session_id).call(
            "spawn_agent", {"agent": "idle", "input": "x"}
        )
        answers.append(result.content)
        return "ok"

    answers: list[str] = []
    async with SubagentManager([spec("idle", idle), spec("spender", spender)]) as m:
        await m.execute("spender", budget=Budget(tokens=50_000))
    assert answers == [
        "spawn_agent refused: budget of 50,000 tokens of /root/spender exhausted "
        "(50,000 used); do the rest yourself."
    ]


async def test_spawn_agent_takes_a_budget_and_answers_with_what_is_left() -> None:
    seen: list[Budget] = []

    async def look(request: Request, ctx: RunContext) -> str:
        seen.append(ctx.remaining_budget())
        return "ok"

    async with SubagentManager([spec("look", look)]) as m:
        m.open_session("conv", budget=Budget(tokens=1000, spawns=5, seconds=100))
        tools = build_tools(m, "conv")
        answer = await tools.call(
            "spawn_agent",
            {"agent": "look", "input": "x", "budget": {"tokens": 300, "time_ms": 2000}},
        )
        waited = await tools.call("wait_agent", {"task_ids": answer.details["task_id"]})
        delegated = await tools.call(
            "delegate_to_agent", {"agent": "look", "input": "x", "budget": {"spawns": 1}}
        )
        plain = await build_tools(m, "root").call("spawn_agent", {"agent": "look", "input": "x"})
    assert answer.details["budget"]["tokens"] == 1000  # type: ignore[index]
    assert answer.details["budget"]["spawns"] == 4  # type: ignore[index]
    assert "Your budget left: 1,000 tokens, 4 spawns" in answer.content
    assert waited.details["budget"]["spawns"] == 4  # type: ignore[index]
    assert delegated.details["budget"]["spawns"] == 3  # type: ignore[index]
    assert seen[0].tokens == 300
    assert seen[0].spawns == 4
    assert seen[0].seconds is not None
    assert seen[0].seconds <= 2
    assert seen[1].spawns == 1
    assert "budget" not in plain.details
    assert "budget" not in plain.content


async def test_delegate_and_wait_answer_a_huge_time_as_a_bounded_json_integer() -> None:
    async def quick(request: Request, ctx: RunContext) -> str:
        return "ok"

    config = SubagentConfig(execute_timeout=1.7e308)  # seconds * 1000 is infinite
    async with SubagentManager([spec("quick", quick)], config=config) as m:
        m.open_session("conv", budget=Budget(seconds=1.7e308))
        tools = build_tools(m, "conv", engine_tool_timeout=None)
        delegated = await tools.call("delegate_to_agent", {"agent": "quick", "input": "x"})
        spawned = await tools.call("spawn_agent", {"agent": "quick", "input": "x"})
        waited = await tools.call("wait_agent", {"task_ids": spawned.details["task_id"]})
    for answer in (delegated, waited):
        assert not answer.is_error, answer.content
        assert answer.details["budget"] == {"time_ms": 2**53 - 1}
        orjson.dumps(answer.details)
    assert delegated.details["timeout_ms"] == 2**53 - 1


def manager() -> SubagentManager:
    return SubagentManager([spec("idle", idle)], config=SubagentConfig(spawn_timeout=None))


async def test_spawn_agent_under_a_huge_seconds_budget_answers_with_the_spawned_task() -> None:
    """A Budget takes any finite number of seconds, so the tools' answers under a large
    (valid) one must still be a success."""
    async with manager() as m:
        m.open_session("conv", budget=Budget(seconds=1.7e308))
        answer = await build_tools(m, "conv").call("spawn_agent", {"agent": "idle", "input": "x"})
        spawned = m.statistics().spawned
    # The child was spawned; an answer saying the call failed invites a second spawn.
    assert spawned == 1
    assert not answer.is_error, answer.content


async def test_the_budget_left_in_an_answer_is_a_bounded_json_integer() -> None:
    """What the answer reports must stay a JSON integer the tools' other fields stay
    within (2**53 - 1)."""
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


async def test_openai_strict_mode_lists_every_budget_field_as_required() -> None:
    async with SubagentManager([spec("idle", idle)]) as m:
        tools = build_tools(m, "root")
        strict = tools["spawn_agent"].to_openai_responses(strict=True)["parameters"]
    choices = strict["properties"]["budget"]["anyOf"]  # type: ignore[index, call-overload]
    (budget,) = [p for p in choices if p.get("type") == "object"]
    assert budget["required"] == list(budget["properties"])
    validator = Draft202012Validator(strict)
    fields = dict.fromkeys(("tokens", "input_tokens", "output_tokens", "spawns", "time_ms"))
    base = {"agent": "idle", "input": "x", "name": None, "timeout_ms": None}
    validator.validate({**base, "idempotency_key": None, "budget": {**fields, "tokens": 5}})
    assert not validator.is_valid({**base, "idempotency_key": None, "budget": {"tokens": 5}})
