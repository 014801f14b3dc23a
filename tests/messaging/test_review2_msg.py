"""Second review of peer messaging: failing tests for bugs found after the fixes."""

from __future__ import annotations

import contextlib

import anyio
import pytest

from subagents import Message, Reply, Request, RunContext, SubagentConfig, SubagentManager
from subagents.tools import build_tools
from tests.helpers import clock_backends
from tests.messaging.support import Gate, spec

pytestmark = pytest.mark.anyio


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


async def test_a_receipt_cannot_be_moved_by_the_caller_holding_it() -> None:
    """Receipt is read-only to its holder: a caller cannot make the manager's receipt
    say ``replied`` (or ``failed``) when that did not happen."""
    gate = Gate()
    async with SubagentManager([spec("p", gate.parked("p"))]) as manager:
        child = manager.spawn("p")
        await gate.started_event("p").wait()
        receipt = manager.send(child.task_id, "hello")
        with contextlib.suppress(AttributeError, TypeError):
            receipt.advance("replied")  # a caller's mistake the receipt must not take
        assert receipt.state == "queued"
        with contextlib.suppress(AttributeError, TypeError):
            receipt.fail("full", "made up by the caller")
        assert receipt.state == "queued"
        gate.open.set()
        await child.wait()


async def test_a_broadcast_to_a_tree_past_max_peers_says_whom_it_left_out() -> None:
    """1,001 live agents (queued behind one slot): the broadcast gives 999 of them a
    receipt and says nothing of the other two, a silent drop."""
    gate = Gate()
    config = SubagentConfig(max_concurrent_spawns=1)
    async with SubagentManager([spec("p", gate.parked("p"))], config=config) as manager:
        handles = [manager.spawn("p") for _ in range(1001)]
        receipt = manager.send("*", "everyone")
        missing = {h.task_id for h in handles} - {r.to for r in receipt.recipients}
        for handle in handles:
            manager.cancel(handle.task_id)
        assert not missing or str(len(missing)) in receipt.detail, (
            f"{len(missing)} live agents got no receipt and the broadcast's says nothing"
        )


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


@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_a_responder_answers_while_its_runner_cannot_take_its_slot_back(
    anyio_backend: object,
) -> None:
    """The recipient waits in ``recv`` (its slot lent) and another child holds that slot:
    the ask goes to the runner, which cannot run until the slot frees, so the responder
    is skipped and the asker waits its whole timeout though the recipient can answer."""
    gate, waiting = Gate(), anyio.Event()

    async def reader(request: Request, ctx: RunContext) -> str:
        waiting.set()
        message = await ctx.recv()
        if message is not None:
            ctx.send(message.from_, "runner's answer", reply_to=message.id)
        return "read"

    async def responder(message: Message, ctx: RunContext) -> str:
        return "responder's answer"

    config = SubagentConfig(max_concurrent_spawns=1)
    agents = [spec("reader", reader, on_message=responder), spec("hog", gate.parked("hog"))]
    async with SubagentManager(agents, config=config) as manager:
        child = manager.spawn("reader")
        await waiting.wait()
        await anyio.wait_all_tasks_blocked()  # in recv, its slot lent
        manager.spawn("hog")
        await gate.started_event("hog").wait()  # the hog runs in the lent slot
        reply = await manager.ask(child.task_id, "status?", timeout=1.5)
        gate.open.set()
        assert reply.outcome == "replied", reply
        assert reply.message is not None
        assert reply.message.body == "responder's answer"
        # The responder took the question: the runner's recv has nothing left to read.
        manager.cancel(child.task_id)
        await child.wait()
