"""Ended resumable agents revived by a message; busy agents answering on the side."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from subagents import Message, Reply, Request, RunContext, SubagentConfig, SubagentManager
from subagents._manager import messaging_of
from tests.helpers import clock_backends, on_mock_clock
from tests.messaging.support import Gate, spec

pytestmark = pytest.mark.anyio

seen: list[tuple[str, str, str | None]] = []


async def _remembering(request: Request, ctx: RunContext) -> str:
    previous = ctx.previous
    seen.append((ctx.task_id, request.input, None if previous is None else previous.task_id))
    return f"answered {request.input!r}" + (
        "" if previous is None else f" after {previous.output!r}"
    )


@pytest.fixture(autouse=True)
def _clear() -> None:
    seen.clear()


async def test_a_message_to_an_ended_resumable_agent_starts_exactly_one_follow_up() -> None:
    async with SubagentManager([spec("memo", _remembering, resumable=True)]) as manager:
        first = manager.spawn("memo", "first task")
        await first.wait()
        receipt = manager.send(first.task_id, "a follow-up question")
        assert receipt.state == "delivered"
        assert receipt.delivery == "revived"
        follow_up_id = receipt.task_id
        assert follow_up_id is not None
        assert follow_up_id != first.task_id
        envelope = await manager.handle(follow_up_id).wait()
        assert envelope.output == "answered 'a follow-up question' after \"answered 'first task'\""
        assert receipt.state == "read"  # the revived runner took it as its input
        assert seen == [
            (first.task_id, "first task", None),
            (follow_up_id, "a follow-up question", first.task_id),
        ]
        assert len(manager.tasks()) == 2


async def test_messages_to_a_revived_agent_reach_its_live_follow_up_not_a_new_one() -> None:
    gate = Gate()

    async def slow(request: Request, ctx: RunContext) -> str:
        if ctx.previous is not None:
            await gate.open.wait()
            return "; ".join([request.input, *(m.body for m in ctx.inbox())])
        return "first"

    async with SubagentManager([spec("slow", slow, resumable=True)]) as manager:
        first = manager.spawn("slow")
        await first.wait()
        one = manager.send(first.task_id, "one")
        two = manager.send(first.task_id, "two")
        assert one.delivery == "revived"
        assert two.state == "queued"
        assert two.to == one.task_id
        gate.open.set()
        assert one.task_id is not None
        assert (await manager.handle(one.task_id).wait()).output == "one; two"
        assert len(manager.tasks()) == 2


async def test_an_ended_agent_that_is_not_resumable_is_never_revived() -> None:
    async with SubagentManager([spec("memo", _remembering)]) as manager:
        first = manager.spawn("memo", "x")
        await first.wait()
        receipt = manager.send(first.task_id, "hello?")
        assert (receipt.state, receipt.reason, receipt.task_id) == (
            "failed",
            "ended",
            first.task_id,
        )
        assert len(manager.tasks()) == 1


async def test_a_broadcast_never_revives_and_wake_false_never_revives() -> None:
    async def sender(request: Request, ctx: RunContext) -> str:
        return repr(ctx.send("*", "everyone").recipients)

    specs = [spec("memo", _remembering, resumable=True), spec("sender", sender)]
    async with SubagentManager(specs) as manager:
        ended = manager.spawn("memo", "x")
        await ended.wait()
        out = (await manager.spawn("sender").wait()).output
        assert ended.task_id not in out
        quiet = manager.send(ended.task_id, "no wake", wake=False)
        assert quiet.reason == "ended"
        assert len(manager.tasks()) == 2  # memo and sender: nothing revived


async def test_follow_up_input_to_an_ended_resumable_child_fails_ended() -> None:
    async with SubagentManager([spec("memo", _remembering, resumable=True)]) as manager:
        first = manager.spawn("memo", "x")
        await first.wait()
        assert manager.send_input(first.task_id, "more").reason == "ended"
        assert len(manager.tasks()) == 1


@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_a_busy_recipients_responder_answers_before_the_senders_timeout(
    anyio_backend: object,
) -> None:
    gate = Gate()

    async def busy(request: Request, ctx: RunContext) -> str:
        gate.started_event("busy").set()
        await gate.open.wait()  # blocked: it never reaches a delivery point meanwhile
        return f"asides: {[(m.body, r.body if r else None) for m, r in ctx.asides()]}"

    async def responder(message: Message, ctx: RunContext) -> str:
        return f"busy right now; got {message.body!r}"

    async with SubagentManager([spec("busy", busy, on_message=responder)]) as manager:
        child = manager.spawn("busy")
        await gate.started_event("busy").wait()
        started = anyio.current_time()
        reply = await manager.ask(child.task_id, "status?", timeout=30)
        assert reply.outcome == "replied"
        assert reply.message is not None
        assert reply.message.body == "busy right now; got 'status?'"
        assert reply.receipt.state == "replied"
        if on_mock_clock(anyio_backend):
            assert anyio.current_time() - started < 1
        gate.open.set()
        out = (await child.wait()).output
        assert out == "asides: [('status?', \"busy right now; got 'status?'\")]"


async def test_a_responder_leaves_unawaited_messages_to_the_runner() -> None:
    calls: list[str] = []

    async def reader(request: Request, ctx: RunContext) -> str:
        message = await ctx.recv(timeout=10)
        return "none" if message is None else message.body

    async def responder(message: Message, ctx: RunContext) -> str:
        calls.append(message.body)
        return "auto"

    async with SubagentManager([spec("r", reader, on_message=responder)]) as manager:
        child = manager.spawn("r")
        manager.send(child.task_id, "plain")
        assert (await child.wait()).output == "plain"
        assert calls == []


@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_a_responder_that_answers_nothing_leaves_the_asker_to_its_timeout(
    anyio_backend: object,
) -> None:
    gate = Gate()

    async def busy(request: Request, ctx: RunContext) -> str:
        gate.started_event("busy").set()
        await gate.open.wait()
        return repr([(m.body, r) for m, r in ctx.asides()])

    async def silent(message: Message, ctx: RunContext) -> None:
        return None

    async with SubagentManager([spec("busy", busy, on_message=silent)]) as manager:
        child = manager.spawn("busy")
        await gate.started_event("busy").wait()
        reply = await manager.ask(child.task_id, "anyone?", timeout=0.2)
        assert reply.outcome == "timeout"
        assert reply.receipt.state == "read"  # the responder read it, and said nothing
        gate.open.set()
        assert (await child.wait()).output == "[('anyone?', None)]"


async def test_an_awaited_message_to_a_recipient_waiting_in_recv_reaches_its_runner() -> None:
    calls: list[str] = []

    async def reader(request: Request, ctx: RunContext) -> str:
        message = await ctx.recv(timeout=10)
        assert message is not None
        ctx.send(message.from_, "from the runner", reply_to=message.id)
        return message.body

    async def responder(message: Message, ctx: RunContext) -> str:
        calls.append(message.body)
        return "from the responder"

    async with SubagentManager([spec("r", reader, on_message=responder)]) as manager:
        child = manager.spawn("r")
        while not messaging_of(manager).postbox.reading(child.task_id, "root"):
            await anyio.lowlevel.checkpoint()  # until the runner waits in recv
        reply = await manager.ask(child.task_id, "question", timeout=10)
        assert reply.message is not None
        assert reply.message.body == "from the runner"
        assert calls == []


async def test_two_agents_asking_each_other_are_answered_by_their_responders() -> None:
    """Each is blocked in its own ask, which waits for its reply only: neither runner can
    read the other's question, so each one's responder answers it."""
    running: list[str] = []
    both = anyio.Event()

    async def asker(request: Request, ctx: RunContext) -> str:
        running.append(ctx.task_id)
        if len(running) == 2:
            both.set()
        await both.wait()
        peer = next(p.id for p in ctx.peers() if p.agent == "asker")
        reply = await ctx.ask(peer, f"hi from {ctx.task_id}", timeout=10)
        return reply.message.body if reply.message else reply.outcome

    async def responder(message: Message, ctx: RunContext) -> str:
        return "busy asking you"

    async with SubagentManager([spec("asker", asker, on_message=responder)]) as manager:
        first = manager.spawn("asker")
        second = manager.spawn("asker")
        outputs = [(await first.wait()).output, (await second.wait()).output]
        assert outputs == ["busy asking you", "busy asking you"]


async def test_an_ask_to_an_ended_resumable_agent_is_answered_by_its_follow_up() -> None:
    """The follow-up run's context names the messages that revived it, so it can thread
    its answer: the asker's ``ask`` gets it and the receipt says ``replied``."""

    async def answering(request: Request, ctx: RunContext) -> str:
        for message in ctx.revived_by:
            ctx.send(message.from_, f"answer to {message.body}", reply_to=message.id)
        return "done"

    async with SubagentManager([spec("memo", answering, resumable=True)]) as manager:
        first = manager.spawn("memo")
        await first.wait()
        reply = await manager.ask(first.task_id, "what did you find?", timeout=10)
        assert reply.outcome == "replied"
        assert reply.message is not None
        assert reply.message.body == "answer to what did you find?"
        assert (reply.receipt.state, reply.receipt.delivery) == ("replied", "revived")


async def test_unread_messages_of_a_resumable_agent_that_ends_revive_it_once() -> None:
    gate = Gate()
    inputs: list[tuple[str, list[str]]] = []

    async def memo(request: Request, ctx: RunContext) -> str:
        if ctx.previous is None:
            gate.started_event("memo").set()
            await gate.open.wait()
            return "first"
        inputs.append((request.input, [m.body for m in ctx.revived_by]))
        return "follow-up"

    agents = [spec("memo", memo, resumable=True), spec("p", gate.parked("p"))]
    async with SubagentManager(agents) as manager:
        first = manager.spawn("memo")
        manager.spawn("p")
        await gate.started_event("memo").wait()
        one, two = manager.send(first.task_id, "one"), manager.send(first.task_id, "two")
        broadcast = manager.send("*", "to everyone")
        gate.open.set()
        await first.wait()
        assert one.delivery == two.delivery == "revived"
        assert one.task_id == two.task_id is not None
        follow_up = manager.handle(one.task_id)
        await follow_up.wait()
        [copy] = [r for r in broadcast.recipients if r.to == first.task_id]
        assert (copy.state, copy.reason) == ("failed", "ended")  # a broadcast never revives
        [(text, bodies)] = inputs
        assert bodies == ["one", "two"]
        assert "one" in text
        assert "two" in text
        assert len(manager.tasks()) == 3  # the two first runs and exactly one follow-up


async def test_an_awaited_message_to_a_queued_recipient_goes_to_its_responder_at_start() -> None:
    gate, busy = Gate(), Gate()

    async def responder(message: Message, ctx: RunContext) -> str:
        return f"busy; got {message.body}"

    config = SubagentConfig(max_concurrent_spawns=1)
    agents = [
        spec("hog", gate.parked("hog")),
        spec("busy", busy.parked("busy"), on_message=responder),
    ]
    async with SubagentManager(agents, config=config) as manager:
        manager.spawn("hog")
        await gate.started_event("hog").wait()
        queued = manager.spawn("busy")  # waits for the hog's slot
        async with anyio.create_task_group() as tg:
            replies: list[Reply] = []

            async def ask() -> None:
                replies.append(await manager.ask(queued.task_id, "status?", timeout=10))

            tg.start_soon(ask)
            await anyio.wait_all_tasks_blocked()
            gate.open.set()  # the hog ends; the busy one starts, parked
        [reply] = replies
        assert reply.outcome == "replied"
        assert reply.message is not None
        assert reply.message.body == "busy; got status?"
        busy.open.set()
