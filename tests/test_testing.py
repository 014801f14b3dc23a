"""subagents.testing: the scripted model, the reference loop, and waking an idle parent."""

from __future__ import annotations

import pytest

from subagents import SubagentManager
from subagents.testing import (
    ModelTurn,
    ScriptedModel,
    ScriptError,
    ToolCall,
    Transcript,
    call_with_host_timeout,
    echo_agent,
    run_tool_loop,
)
from subagents.tools import build_tools
from tests.helpers import clock_backends


@pytest.mark.anyio
async def test_scripted_model_fails_on_an_unexpected_call() -> None:
    async with SubagentManager([echo_agent()]) as manager:
        model = ScriptedModel([ToolCall("list_agents")])  # never ends its turn
        with pytest.raises(ScriptError, match="unexpected model call #2"):
            await run_tool_loop(model, build_tools(manager, "root"))


@pytest.mark.anyio
async def test_scripted_model_fails_on_leftover_turns() -> None:
    model = ScriptedModel(["first", "second"])
    transcript = Transcript()
    assert (await model(transcript)).text == "first"
    with pytest.raises(ScriptError, match="1 scripted turn"):
        model.assert_done()
    with pytest.raises(ScriptError), model:
        pass


@pytest.mark.anyio
async def test_scripted_model_fails_on_a_tool_not_offered() -> None:
    model = ScriptedModel([ToolCall("rm_rf")])
    with pytest.raises(ScriptError, match="not offered"):
        await model(Transcript(), ["spawn_agent"])


@pytest.mark.anyio
async def test_a_script_takes_turns_calls_tuples_and_dicts_and_refuses_others() -> None:
    with pytest.raises(TypeError):
        ScriptedModel([42])
    with pytest.raises(TypeError):
        ScriptedModel([[ToolCall("a"), 42]])
    model = ScriptedModel(
        [
            ModelTurn(text="x"),
            [ToolCall("a"), ("b", {"k": 1})],
            ("c", {}),
            {"name": "d", "arguments": {"k": 2}},
        ]
    )
    assert model.remaining == 4
    transcript = Transcript()
    assert (await model(transcript)).text == "x"
    turn = await model(transcript)
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [("a", {}), ("b", {"k": 1})]
    assert (await model(transcript)).tool_calls[0].name == "c"
    assert (await model(transcript)).tool_calls[0].arguments == {"k": 2}
    model.assert_done()


@pytest.mark.anyio
async def test_idle_parent_is_woken_and_collects_all_three() -> None:
    """The issue's scenario: spawn three, end the turn, be woken, collect all three."""
    async with SubagentManager([echo_agent(delay=0.02)]) as manager:
        tools = build_tools(manager, "root")
        with ScriptedModel(
            [
                [ToolCall("spawn_agent", {"agent": "echo", "input": str(i)}) for i in range(3)],
                "I will continue when the results are in.",  # ends the turn: the loop idles
                ToolCall("wait_agent", lambda t: {"task_ids": t.task_ids(), "mode": "all"}),
                "done",
            ]
        ) as model:
            transcript = await run_tool_loop(model, tools)
        assert transcript.wakes == 1
        events = transcript.events
        woken = next(i for i, e in enumerate(events) if e.startswith("woken: "))
        assert events.index("idle") < woken < events.index("call wait_agent")
        # No polling: one wait_agent call collected everything.
        assert len(transcript.results("wait_agent")) == 1
        collected = transcript.collected()
        assert sorted(str(e["output"]) for e in collected.values()) == [  # type: ignore[index]
            "echo: 0",
            "echo: 1",
            "echo: 2",
        ]
        assert all(h.collected for h in manager.tasks("root"))


@pytest.mark.anyio
async def test_loop_without_wake_returns_at_end_of_turn() -> None:
    async with SubagentManager([echo_agent(delay=0.02)]) as manager:
        tools = build_tools(manager, "root")
        model = ScriptedModel([ToolCall("spawn_agent", {"agent": "echo", "input": "x"}), "bye"])
        transcript = await run_tool_loop(model, tools, wake=False)
        assert transcript.wakes == 0
        assert transcript.texts == ["bye"]
        model.assert_done()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_a_call_past_the_host_timeout_answers_host_timeout() -> None:
    async with SubagentManager([echo_agent(delay=5)]) as manager:
        tools = build_tools(manager, "root", engine_tool_timeout=None)
        result = await call_with_host_timeout(
            tools, "delegate_to_agent", {"agent": "echo", "input": "x"}, timeout=0.02
        )
        assert result.is_error
        assert result.details["error"] == "host_timeout"
