"""Review of peer messaging: receipts, waits, responders, revival, addressing, spans."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest

from subagents import (
    ConfigError,
    Message,
    Receipt,
    Reply,
    Request,
    RunContext,
    SubagentConfig,
    SubagentManager,
    UnknownPeer,
)
from subagents._manager import messaging_of
from subagents.testing import ModelTurn, Transcript, run_tool_loop
from subagents.tools import build_tools
from tests.helpers import clock_backends, on_mock_clock
from tests.messaging.support import Gate, spec
from tests.otel_support import Otel

pytestmark = pytest.mark.anyio


async def test_a_reply_sent_to_a_third_agent_does_not_mark_the_question_replied() -> None:
    """`replied` means the asker got an answer: a message with `reply_to` the question's id
    sent to somebody else is not one (a receipt never says more than happened)."""
    gate = Gate()
    took = anyio.Event()

    async def reader(request: Request, ctx: RunContext) -> str:
        message = await ctx.recv()
        assert message is not None
        took.set()
        await gate.open.wait()
        return "read"

    async with SubagentManager([spec("p", gate.parked("p")), spec("r", reader)]) as manager:
        asker = manager.spawn("p")
        replier = manager.spawn("r")
        await gate.started_event("p").wait()
        receipt = messaging_of(manager).send(asker.task_id, replier.task_id, "question")
        await took.wait()
        assert receipt.state == "read"
        messaging_of(manager).send(
            replier.task_id, "root", "aside to the host", reply_to=receipt.message_id
        )
        assert receipt.state == "read"  # the asker got nothing back
        gate.open.set()


async def test_a_revived_runs_reply_marks_the_message_that_revived_it_replied() -> None:
    gate = anyio.Event()
    reviving: list[Receipt] = []

    async def memo(request: Request, ctx: RunContext) -> str:
        if ctx.previous is not None:
            await gate.wait()
            ctx.send("/root", "the answer", reply_to=reviving[0].message_id)
        return "done"

    async with SubagentManager([spec("memo", memo, resumable=True)]) as manager:
        first = manager.spawn("memo")
        await first.wait()
        receipt = manager.send(first.task_id, "a follow-up")
        assert receipt.delivery == "revived"
        assert receipt.task_id is not None
        reviving.append(receipt)
        gate.set()
        await manager.handle(receipt.task_id).wait()
        [reply] = manager.inbox()
        assert reply.reply_to == receipt.message_id
        assert receipt.state == "replied"


async def test_an_ask_that_fails_at_once_leaves_nothing_waiting_for_a_reply() -> None:
    """Each failed ask (here: a full inbox) must not leave its expectation behind: the
    maps grow by one entry per failed ask otherwise."""
    gate = Gate()
    config = SubagentConfig(inbox_capacity=1)
    async with SubagentManager([spec("p", gate.parked("p"))], config=config) as manager:
        child = manager.spawn("p")
        await gate.started_event("p").wait()
        manager.send(child.task_id, "fills the inbox")
        for n in range(3):
            reply = await manager.ask(child.task_id, f"question {n}", timeout=5)
            assert reply.outcome == "full"
        messaging = messaging_of(manager)
        assert messaging._expecting == {}
        assert messaging._awaited == {}
        gate.open.set()


async def test_a_host_session_cannot_message_another_sessions_agents() -> None:
    """Sessions are isolated everywhere else (wait_result, wait_agent, peers() list only
    the sender's tree); a send by task id or session id crosses into another tree."""
    gate = Gate()
    async with SubagentManager([spec("p", gate.parked("p"))]) as manager:
        theirs = manager.spawn("p", session_id="b")
        await gate.started_event("p").wait()
        assert manager.peers(session_id="a") == []
        with pytest.raises(UnknownPeer):
            manager.send(theirs.task_id, "injected into another tree", session_id="a")
        gate.open.set()


async def test_a_responder_stops_once_its_asker_is_gone_and_its_agent_ended() -> None:
    gate = Gate()
    started, stopped = anyio.Event(), anyio.Event()

    async def responder(message: Message, ctx: RunContext) -> str:
        started.set()
        try:
            await anyio.sleep_forever()
        finally:
            stopped.set()
        raise AssertionError("unreachable")

    async with SubagentManager(
        [spec("busy", gate.parked("busy"), on_message=responder)]
    ) as manager:
        child = manager.spawn("busy")
        await gate.started_event("busy").wait()
        async with anyio.create_task_group() as tg:

            async def ask() -> None:
                await manager.ask(child.task_id, "status?")

            tg.start_soon(ask)
            await started.wait()
            tg.cancel_scope.cancel()  # the asker gives up
        gate.open.set()
        await child.wait()  # the agent ended: nobody can use an answer now
        await anyio.wait_all_tasks_blocked()
        assert stopped.is_set()


async def test_a_body_stays_out_of_the_tool_span_without_capture_content(otel: Otel) -> None:
    gate = Gate()
    manager = otel.install(SubagentManager([spec("p", gate.parked("p"))]))
    async with manager:
        child = manager.spawn("p")
        await gate.started_event("p").wait()
        tools = build_tools(manager, "root", messaging=True)
        body = "SECRET-" + "x" * 16_000  # one character too many
        result = await tools.call("send_message", {"to": child.task_id, "message": body})
        assert result.is_error
        gate.open.set()
    for span in otel.finished():
        texts = [str(span.attributes), str(span.status.description)]
        texts += [str(e.attributes) for e in span.events]
        assert not any("SECRET" in t for t in texts), span.name


@pytest.mark.parametrize("reply_to", ["   ", "\n"])
async def test_a_blank_reply_to_is_an_error_naming_the_field(reply_to: str) -> None:
    gate = Gate()
    async with SubagentManager([spec("p", gate.parked("p"))]) as manager:
        child = manager.spawn("p")
        await gate.started_event("p").wait()
        with pytest.raises(ConfigError) as caught:
            manager.send(child.task_id, "hello", reply_to=reply_to)
        assert caught.value.field == "reply_to"
        gate.open.set()


@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_a_responder_answers_while_its_runner_waits_for_another_sender(
    anyio_backend: object,
) -> None:
    """A runner blocked in ``recv(from_=X)`` cannot take a question from Y: it is as busy
    as one blocked in a delegation, so its responder must answer Y's ask."""
    gate = Gate()

    async def waits_for_the_other(request: Request, ctx: RunContext) -> str:
        other = next(p.id for p in ctx.peers() if p.agent == "p")
        gate.started_event("busy").set()
        message = await ctx.recv(from_=other)
        return "got one" if message else "none"

    async def responder(message: Message, ctx: RunContext) -> str:
        return "busy waiting for someone else"

    agents = [spec("p", gate.parked("p")), spec("busy", waits_for_the_other, on_message=responder)]
    async with SubagentManager(agents) as manager:
        manager.spawn("p")
        await gate.started_event("p").wait()
        child = manager.spawn("busy")
        await gate.started_event("busy").wait()
        await anyio.wait_all_tasks_blocked()
        started = anyio.current_time()
        reply = await manager.ask(child.task_id, "status?", timeout=1)
        assert reply.outcome == "replied"
        if on_mock_clock(anyio_backend):
            assert anyio.current_time() - started < 0.5
        gate.open.set()
        manager.cancel(child.task_id)


async def test_a_message_handed_to_a_model_call_that_fails_is_not_read() -> None:
    """run_tool_loop takes the waiting messages (receipts ``read``) before the model call;
    when that call raises, the model never saw them, yet they are gone and marked read."""
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


async def test_forgetting_a_revived_agents_runs_leaves_no_forwarding_behind() -> None:
    async def memo(request: Request, ctx: RunContext) -> str:
        return "done"

    async with SubagentManager([spec("memo", memo, resumable=True)]) as manager:
        first = manager.spawn("memo")
        await first.wait()
        receipt = manager.send(first.task_id, "again")
        assert receipt.task_id is not None
        await manager.handle(receipt.task_id).wait()
        manager.forget(receipt.task_id)
        manager.forget(first.task_id)
        assert messaging_of(manager)._forward == {}


async def test_a_message_to_a_long_revived_agent_reaches_its_live_run_not_a_duplicate() -> None:
    """Messages to the first run's id follow the chain of follow-up runs; past 1,000
    revivals the walk stops at an ended run and revives it again beside the live one."""
    gate = anyio.Event()
    park = False

    async def memo(request: Request, ctx: RunContext) -> str:
        if park:
            await gate.wait()
        return "ok"

    async with SubagentManager([spec("memo", memo, resumable=True)]) as manager:
        first = manager.spawn("memo")
        await first.wait()
        for n in range(1001):
            receipt = manager.send(first.task_id, f"again {n}")
            assert receipt.task_id is not None
            await manager.handle(receipt.task_id).wait()
        park = True
        live = manager.send(first.task_id, "the live run")
        assert live.delivery == "revived"
        later = manager.send(first.task_id, "for the live run")
        assert (later.state, later.to) == ("queued", live.task_id)
        gate.set()


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


async def test_a_reply_refused_by_a_full_inbox_does_not_mark_the_question_replied() -> None:
    gate = Gate()
    took = anyio.Event()

    async def reader(request: Request, ctx: RunContext) -> str:
        message = await ctx.recv()
        assert message is not None
        took.set()
        await gate.open.wait()
        return "read"

    config = SubagentConfig(inbox_capacity=1)
    async with SubagentManager([spec("r", reader)], config=config) as manager:
        child = manager.spawn("r")
        question = manager.send(child.task_id, "question")
        await took.wait()
        messaging_of(manager).send(child.task_id, "root", "fills the host's inbox")
        reply = messaging_of(manager).send(
            child.task_id, "root", "the answer", reply_to=question.message_id
        )
        assert reply.reason == "full"
        assert question.state == "read"  # the answer never reached the host
        gate.open.set()


@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_a_responder_answering_too_long_does_not_crash_the_manager(
    anyio_backend: object,
) -> None:
    """The responder runs in the manager's task group: its over-long answer must not
    raise there (that cancels every child and raises out of ``async with manager``)."""
    gate = Gate()

    async def responder(message: Message, ctx: RunContext) -> str:
        return "x" * 16_001  # one character past MAX_MESSAGE_CHARS

    async with SubagentManager(
        [spec("busy", gate.parked("busy"), on_message=responder)]
    ) as manager:
        child = manager.spawn("busy")
        await gate.started_event("busy").wait()
        reply = await manager.ask(child.task_id, "status?", timeout=0.2)
        assert reply.outcome != "replied"
        gate.open.set()
        assert (await child.wait()).status == "completed"


async def test_a_cancelled_asks_reply_is_read_before_the_peers_later_message() -> None:
    """FIFO per (sender, recipient): an ask cancelled while it takes its slot back puts
    the reply that came at the end of the inbox, behind the peer's later message."""
    gate = Gate()
    scopes: list[anyio.CancelScope] = []
    answers: list[Reply] = []

    async def asker(request: Request, ctx: RunContext) -> str:
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            answers.append(await ctx.ask("/root", "q"))
        return ",".join(m.body for m in ctx.inbox())

    config = SubagentConfig(max_concurrent_spawns=1)
    agents = [spec("a", asker), spec("hog", gate.parked("hog"))]
    async with SubagentManager(agents, config=config) as manager:
        child = manager.spawn("a")
        question = await manager.recv()
        assert question is not None
        manager.spawn("hog")  # runs on the slot the asker lends
        await gate.started_event("hog").wait()
        manager.send(child.task_id, "answer", reply_to=question.id)
        manager.send(child.task_id, "later")
        await anyio.wait_all_tasks_blocked()  # the asker waits to take a slot back
        scopes[0].cancel()
        out = (await child.wait()).output
        if answers:
            assert out == "later"
        else:
            assert out == "answer,later"
        gate.open.set()
