"""send_message, read_messages, send_input and list_agents' unread counts, as a model uses
them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import anyio
import pytest
from jsonschema import Draft202012Validator

from subagents import ConfigError, Receipt, Request, RunContext, SubagentManager
from subagents.testing import ModelTurn, ScriptedModel, ToolCall, Transcript, run_tool_loop
from subagents.tools import build_tools
from tests.helpers import clock_backends, on_mock_clock
from tests.messaging.support import Gate, echo_replier, spec

pytestmark = pytest.mark.anyio


class Gated:
    """A scripted model whose ``n``-th call first runs ``before[n]`` (1-based)."""

    def __init__(
        self, script: ScriptedModel, before: dict[int, Callable[[Transcript], Awaitable[None]]]
    ) -> None:
        self.script = script
        self.before = before
        self.calls = 0
        self.seen: list[int] = []  # messages the transcript held at each call

    async def __call__(self, transcript: Transcript, tools: Sequence[str] = ()) -> ModelTurn:
        self.calls += 1
        hook = self.before.get(self.calls)
        if hook is not None:
            await hook(transcript)
        self.seen.append(len(transcript.messages))
        return await self.script(transcript, tools)


async def test_the_tools_schemas_are_valid_in_every_export_shape() -> None:
    async with SubagentManager() as manager:
        tools = build_tools(manager, "root", messaging=True)
        assert {"send_message", "read_messages", "send_input"} <= set(tools.names)
        for tool in (tools["send_message"], tools["read_messages"], tools["send_input"]):
            Draft202012Validator.check_schema(tool.input_schema)
            Draft202012Validator.check_schema(tool.output_schema)
            assert tool.to_openai_chat(strict=True)["function"]["strict"] is True  # type: ignore[index]
            assert tool.to_anthropic()["input_schema"]["properties"]  # type: ignore[index]
            assert tool.to_mcp()["outputSchema"]  # type: ignore[index]
        assert "send_message" not in build_tools(manager, "root").names  # opt-in


async def test_a_parent_loop_sends_a_follow_up_that_the_childs_next_model_call_sees() -> None:
    in_model, sent = anyio.Event(), anyio.Event()

    async def child_waits(transcript: Transcript) -> None:
        in_model.set()  # mid-run: inside its first model call
        await sent.wait()

    async def parent_waits(transcript: Transcript) -> None:
        await in_model.wait()

    async def parent_sent(transcript: Transcript) -> None:
        sent.set()

    child_model = Gated(
        ScriptedModel(
            [
                ToolCall("list_agents"),
                ToolCall(
                    "send_message",
                    lambda t: {
                        "to": t.messages[0].from_,
                        "message": "ack: " + t.messages[0].body,
                        "reply_to": t.messages[0].id,
                    },
                ),
                "done",
            ]
        ),
        {1: child_waits},
    )

    async def llm_child(request: Request, ctx: RunContext) -> str:
        tools = build_tools(ctx.manager, ctx.session_id, messaging=True)
        transcript = await run_tool_loop(child_model, tools)
        return ",".join(m.body for m in transcript.messages)

    parent_model = Gated(
        ScriptedModel(
            [
                ToolCall("spawn_agent", {"agent": "llm", "input": "review the patch"}),
                ToolCall(
                    "send_message",
                    lambda t: {"to": t.task_ids()[0], "message": "also check the tests"},
                ),
                ToolCall("wait_agent", lambda t: {"task_ids": t.task_ids(), "timeout_ms": 5000}),
                "done",
            ]
        ),
        {2: parent_waits, 3: parent_sent},
    )
    async with SubagentManager([spec("llm", llm_child)]) as manager:
        with anyio.fail_after(10):
            transcript = await run_tool_loop(
                parent_model, build_tools(manager, "root", messaging=True)
            )
    [child] = transcript.collected().values()
    assert child["output"] == "also check the tests"  # type: ignore[index]
    assert child_model.seen == [0, 1, 1]  # its second model call saw the follow-up
    [sent_result] = transcript.results("send_message")
    assert sent_result.details["receipts"][0]["state"] in ("queued", "read", "replied")  # type: ignore[index]
    assert [m.body for m in transcript.messages] == ["ack: also check the tests"]
    assert transcript.messages[0].reply_to == sent_result.details["message_id"]


async def test_send_message_errors_are_data_naming_the_field() -> None:
    gate = Gate()
    async with SubagentManager([spec("planner", gate.parked("planner"))]) as manager:
        manager.spawn("planner")
        tools = build_tools(manager, "root", messaging=True)
        unknown = await tools.call("send_message", {"to": "planer", "message": "hi"})
        assert unknown.is_error
        assert unknown.details["error"] == "unknown_peer"
        assert unknown.details["suggestions"] == ["/root/planner"]
        empty = await tools.call("send_message", {"to": "planner", "message": ""})
        assert empty.is_error
        assert empty.details["field"] == "message"
        own = await tools.call("send_message", {"to": "root", "message": "me"})
        assert own.is_error
        assert own.details["field"] == "to"
        wake = await tools.call("send_message", {"to": "planner", "message": "x", "wake": "no"})
        assert wake.details == {"error": "invalid_arguments", "field": "wake"}
        gate.open.set()


async def test_read_messages_takes_once_peeks_without_taking_and_filters_by_sender() -> None:
    async def two(request: Request, ctx: RunContext) -> str:
        ctx.send("/root", f"from {request.input}")
        return "ok"

    async with SubagentManager([spec("two", two)]) as manager:
        a, b = manager.spawn("two", "a"), manager.spawn("two", "b")
        await a.wait()
        await b.wait()
        tools = build_tools(manager, "root", messaging=True)
        peeked = await tools.call("read_messages", {"peek": True})
        assert [m["body"] for m in peeked.details["messages"]] == ["from a", "from b"]  # type: ignore[index, union-attr]
        only_b = await tools.call("read_messages", {"from": b.task_id})
        assert [m["body"] for m in only_b.details["messages"]] == ["from b"]  # type: ignore[index, union-attr]
        assert only_b.details["left"] == 0  # none more from b: a's waits for a call without
        rest = await tools.call("read_messages", {})
        assert [m["body"] for m in rest.details["messages"]] == ["from a"]  # type: ignore[index, union-attr]
        none = await tools.call("read_messages", {})
        assert none.details["messages"] == []
        assert "no messages" in none.content


@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_message_waits_answer_before_the_host_tool_timeout(anyio_backend: object) -> None:
    gate = Gate()
    async with SubagentManager([spec("p", gate.parked("p"))]) as manager:
        child = manager.spawn("p")
        await gate.started_event("p").wait()
        host = {"read_messages": 0.2, "send_message": 0.2}
        tools = build_tools(manager, "root", tool_timeouts=host, messaging=True)
        started = anyio.current_time()
        read = await tools.call("read_messages", {"wait_ms": 60_000})
        assert read.details["clamped"] is True
        assert read.details["wait_ms"] == 180
        asked = await tools.call(
            "send_message", {"to": child.task_id, "message": "hi?", "await_reply_ms": 60_000}
        )
        assert asked.details["reply_outcome"] == "timeout"
        assert asked.details["clamped"] is True
        if on_mock_clock(anyio_backend):
            assert anyio.current_time() - started == pytest.approx(0.36, abs=0.001)
        gate.open.set()


async def test_send_message_with_await_returns_the_reply() -> None:
    async with SubagentManager([spec("echo", echo_replier())]) as manager:
        child = manager.spawn("echo")
        tools = build_tools(manager, "root", messaging=True)
        asked = await tools.call(
            "send_message", {"to": child.task_id, "message": "ping", "await_reply_ms": 5000}
        )
        assert asked.details["reply_outcome"] == "replied"
        assert asked.details["reply"]["body"] == "echo:ping"  # type: ignore[index]
        assert "echo:ping" in asked.content
        manager.send(child.task_id, "stop")


async def test_list_agents_shows_unread_counts() -> None:
    gate = Gate()

    async def sender(request: Request, ctx: RunContext) -> str:
        ctx.send("/root", "news")
        return "ok"

    specs = [spec("p", gate.parked("p")), spec("sender", sender)]
    async with SubagentManager(specs) as manager:
        parked = manager.spawn("p")
        await manager.spawn("sender").wait()
        manager.send(parked.task_id, "one")
        manager.send(parked.task_id, "two")
        listed = await build_tools(manager, "root").call("list_agents", {})
        tasks = {t["task_id"]: t for t in listed.details["tasks"]}  # type: ignore[index, union-attr]
        assert tasks[parked.task_id]["unread"] == 2
        assert listed.details["unread"] == 1
        assert "2 unread message(s)" in listed.content
        assert "1 unread message(s): call read_messages" in listed.content
        gate.open.set()


async def test_read_messages_marks_read_only_what_it_showed_whole() -> None:
    async def talker(request: Request, ctx: RunContext) -> str:
        ctx.send("/root", "short one")
        ctx.send("/root", "L" * 3_000)
        ctx.send("/root", "short two")
        return "ok"

    async with SubagentManager([spec("t", talker)]) as manager:
        await manager.spawn("t").wait()
        tools = build_tools(manager, "root", messaging=True, truncate_chars=2_000)
        first = await tools.call("read_messages", {})
        assert [m["body"] for m in first.details["messages"]] == ["short one"]  # type: ignore[index, union-attr]
        assert first.details["left"] == 2
        long = await tools.call("read_messages", {})  # alone too long: shortened, said so
        [shown] = long.details["messages"]  # type: ignore[misc]
        assert shown["body"] == "L" * 3_000  # type: ignore[index]
        assert "shortened from 3000 characters" in long.content
        rest = await tools.call("read_messages", {})
        assert [m["body"] for m in rest.details["messages"]] == ["short two"]  # type: ignore[index, union-attr]


async def test_send_input_gives_a_subagent_follow_up_input_and_never_revives_it() -> None:
    """A running subagent of the session reads the input; an ended one (even resumable)
    is not started again: the receipt fails ``ended``; a task of another session, or an
    empty input, is an error as data naming the field."""
    got: list[str] = []

    async def reader(request: Request, ctx: RunContext) -> str:
        message = await ctx.recv()
        got.append("" if message is None else message.body)
        return "read"

    async with SubagentManager([spec("reader", reader, resumable=True)]) as manager:
        child = manager.spawn("reader")
        other = manager.spawn("reader", session_id="elsewhere")
        tools = build_tools(manager, "root", messaging=True)
        sent = await tools.call("send_input", {"task_id": child.task_id, "message": "also X"})
        assert not sent.is_error
        assert sent.details["receipt"]["to"] == child.task_id  # type: ignore[index, call-overload]
        await child.wait()
        assert got == ["also X"]
        ended = await tools.call("send_input", {"task_id": child.task_id, "message": "more"})
        assert ended.is_error
        assert ended.details["receipt"]["reason"] == "ended"  # type: ignore[index, call-overload]
        assert len(manager.tasks()) == 1  # never revived
        foreign = await tools.call("send_input", {"task_id": other.task_id, "message": "hi"})
        assert foreign.is_error
        assert foreign.details["error"] == "unknown_task"
        empty = await tools.call("send_input", {"task_id": child.task_id, "message": ""})
        assert empty.details["field"] == "message"
        manager.cancel(other.task_id)


async def test_an_own_loop_takes_exactly_the_messages_it_showed() -> None:
    """Peek before the model call, take by id after it: a message that came meanwhile
    stays unread for the next step."""

    async def two(request: Request, ctx: RunContext) -> str:
        ctx.send("/root", f"from {request.input}")
        return "ok"

    async with SubagentManager([spec("two", two)]) as manager:
        first = manager.spawn("two", "a")
        await first.wait()
        shown = manager.inbox(peek=True)
        second = manager.spawn("two", "b")  # arrives during the "model call"
        await second.wait()
        taken = manager.inbox(ids=[m.id for m in shown])
        assert [m.body for m in taken] == ["from a"]
        assert [m.body for m in manager.inbox(peek=True)] == ["from b"]
        assert manager.inbox(ids=[m.id for m in shown]) == []  # each is handed out once
        with pytest.raises(ConfigError) as error:
            manager.inbox(ids="m1")
        assert error.value.field == "ids"


async def test_a_message_handed_to_a_model_call_that_fails_is_not_read() -> None:
    """run_tool_loop takes the waiting messages before the model call; when that call
    raises, the model never saw them, so their receipts must not say ``read``."""
    gate = Gate()
    sent: list[Receipt] = []

    async def sender(request: Request, ctx: RunContext) -> str:
        sent.append(ctx.send("/root", "please look"))
        gate.started_event("sender").set()
        await gate.open.wait()
        return "sent"

    async def failing_model(transcript: Transcript, tools: Sequence[str] = ()) -> ModelTurn:
        raise RuntimeError("the provider is down")

    async with SubagentManager([spec("sender", sender)]) as manager:
        manager.spawn("sender")
        await gate.started_event("sender").wait()
        toolset = build_tools(manager, "root", messaging=True)
        with pytest.raises(RuntimeError):
            await run_tool_loop(failing_model, toolset)
        assert sent[0].state != "read"
        gate.open.set()


async def test_send_message_awaiting_a_reply_keeps_its_reply_to() -> None:
    """A model answering a question and asking back in one call (reply_to with
    await_reply_ms): the answer must still thread to the question."""
    gate = Gate()
    question: list[Receipt] = []
    asked = anyio.Event()

    async def asker(request: Request, ctx: RunContext) -> str:
        question.append(ctx.send("/root", "what next?"))
        asked.set()
        message = await ctx.recv()
        assert message is not None
        await gate.open.wait()
        return message.reply_to or "no reply_to"

    async with SubagentManager([spec("asker", asker)]) as manager:
        child = manager.spawn("asker")
        await asked.wait()
        tools = build_tools(manager, "root", messaging=True)
        args = {
            "to": child.task_id,
            "message": "do B; which file?",
            "reply_to": question[0].message_id,
            "await_reply_ms": 0,
        }
        result = await tools.call("send_message", args)
        assert not result.is_error
        gate.open.set()
        assert (await child.wait()).output == question[0].message_id


async def test_send_message_with_wake_false_never_revives_even_when_awaiting() -> None:
    async def memo(request: Request, ctx: RunContext) -> str:
        return "done"

    async with SubagentManager([spec("memo", memo, resumable=True)]) as manager:
        first = manager.spawn("memo")
        await first.wait()
        tools = build_tools(manager, "root", messaging=True)
        args = {"to": first.task_id, "message": "quiet", "wake": False, "await_reply_ms": 0}
        result = await tools.call("send_message", args)
        assert result.details["receipts"][0]["state"] == "failed"  # type: ignore[index]
        assert len(manager.tasks()) == 1  # nothing revived


async def test_read_messages_peeking_everything_says_nothing_more_is_waiting() -> None:
    async def two(request: Request, ctx: RunContext) -> str:
        ctx.send("/root", f"from {request.input}")
        return "ok"

    async with SubagentManager([spec("two", two)]) as manager:
        a, b = manager.spawn("two", "a"), manager.spawn("two", "b")
        await a.wait()
        await b.wait()
        tools = build_tools(manager, "root", messaging=True)
        peeked = await tools.call("read_messages", {"peek": True})
        assert [m["body"] for m in peeked.details["messages"]] == ["from a", "from b"]  # type: ignore[index, union-attr]
        # Both were shown: none is waiting beyond them.
        assert peeked.details["left"] == 0
        assert "more message(s)" not in peeked.content
