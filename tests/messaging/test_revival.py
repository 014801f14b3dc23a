"""Ended resumable agents revived by a message: one follow-up run, messages forwarded to it,
replies threaded, cancelled agents left ended."""

from __future__ import annotations

import anyio
import pytest

from subagents import Receipt, Reply, Request, RunContext, SubagentManager
from subagents._manager import messaging_of
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


async def test_an_ask_that_revives_an_ending_agent_waits_for_the_follow_ups_answer() -> None:
    """The ask was unread when its resumable recipient ended: the message revives it
    (receipt ``revived``), so the ask must not return ``ended`` at once; it gets the
    follow-up run's answer."""
    gate = Gate()

    async def memo(request: Request, ctx: RunContext) -> str:
        if ctx.previous is None:
            gate.started_event("memo").set()
            await gate.open.wait()
            return "first"
        for message in ctx.revived_by:
            ctx.send(message.from_, f"answer to {message.body}", reply_to=message.id)
        return "follow-up"

    async with SubagentManager([spec("memo", memo, resumable=True)]) as manager:
        first = manager.spawn("memo")
        await gate.started_event("memo").wait()
        replies: list[Reply] = []
        async with anyio.create_task_group() as tg:

            async def ask() -> None:
                replies.append(await manager.ask(first.task_id, "status?", timeout=10))

            tg.start_soon(ask)
            await anyio.wait_all_tasks_blocked()
            gate.open.set()
        [reply] = replies
        assert reply.receipt.delivery == "revived"
        assert reply.outcome == "replied"
        assert reply.message is not None
        assert reply.message.body == "answer to status?"


async def test_a_cancelled_resumable_agent_is_not_revived_by_its_unread_messages() -> None:
    """Cancelling an agent stops it: the messages it had not read fail ``ended`` (naming
    it) rather than starting a new run the caller did not ask for."""
    gate = Gate()
    async with SubagentManager([spec("memo", gate.parked("memo"), resumable=True)]) as manager:
        first = manager.spawn("memo")
        await gate.started_event("memo").wait()
        receipt = manager.send(first.task_id, "please also check the tests")
        manager.cancel(first.task_id)
        await first.wait()
        assert len(manager.tasks()) == 1  # no follow-up run
        assert (receipt.state, receipt.reason) == ("failed", "ended")


async def test_recv_from_a_revived_agent_takes_what_its_follow_up_run_sent() -> None:
    """A message to the agent's first id reaches its follow-up run (forwarded); a recv
    from that id must likewise take what the follow-up sends back, not wait past it."""

    async def memo(request: Request, ctx: RunContext) -> str:
        if ctx.previous is not None:
            ctx.send("root", f"follow-up says: {request.input}")
        return "done"

    async with SubagentManager([spec("memo", memo, resumable=True)]) as manager:
        first = manager.spawn("memo")
        await first.wait()
        receipt = manager.send(first.task_id, "more")
        assert receipt.task_id is not None
        await manager.handle(receipt.task_id).wait()
        message = await manager.recv(from_=first.task_id, timeout=0)
        assert message is not None
        assert message.body == "follow-up says: more"
