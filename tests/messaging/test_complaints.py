"""What users of the leading agent tools complain about, each as a regression test."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from subagents import Request, RunContext, SubagentConfig, SubagentManager
from tests.messaging.support import Gate, echo_replier, spec

pytestmark = pytest.mark.anyio


async def test_no_message_that_reports_success_is_silently_dropped() -> None:
    """Drop: every queued message is read by its recipient, in order, or fails saying why."""
    got: list[str] = []

    async def reader(request: Request, ctx: RunContext) -> str:
        while (message := await ctx.recv(timeout=5)) is not None:
            if message.body == "end":
                return "ok"
            got.append(message.body)
        return "timed out"

    async with SubagentManager([spec("reader", reader)]) as manager:
        child = manager.spawn("reader")
        receipts = [manager.send(child.task_id, str(i)) for i in range(50)]
        manager.send(child.task_id, "end")
        assert (await child.wait()).output == "ok"
        assert got == [str(i) for i in range(50)]
        assert {r.state for r in receipts} == {"read"}


async def test_a_message_to_an_ended_agent_fails_ended_and_starts_nothing() -> None:
    """Ended peer: not lost quietly, and no duplicate of the agent is started."""
    async with SubagentManager([spec("echo", echo_replier())]) as manager:
        child = manager.spawn("echo")
        manager.send(child.task_id, "stop")
        await child.wait()
        receipt = manager.send(child.task_id, "are you there?")
        assert receipt.state == "failed"
        assert receipt.reason == "ended"
        assert receipt.task_id == child.task_id
        assert child.task_id in receipt.detail
        assert len(manager.tasks()) == 1


async def test_read_is_only_set_once_the_recipient_took_the_message() -> None:
    """Early read: queued while it waits in the inbox; read once the runner took it."""
    go, took, waiting = anyio.Event(), anyio.Event(), anyio.Event()

    async def late_reader(request: Request, ctx: RunContext) -> str:
        waiting.set()
        await go.wait()
        message = await ctx.recv(timeout=0)
        took.set()
        return "none" if message is None else message.body

    async with SubagentManager([spec("r", late_reader)]) as manager:
        child = manager.spawn("r")
        receipt = manager.send(child.task_id, "hello")
        await waiting.wait()
        assert receipt.state == "queued"
        assert receipt.delivery is None
        go.set()
        await took.wait()
        assert receipt.state == "read"
        assert receipt.delivery == "injected"
        assert (await child.wait()).output == "hello"


async def test_peeking_leaves_the_receipt_queued() -> None:
    async def sender(request: Request, ctx: RunContext) -> str:
        return ctx.send("/root", "hi").state

    async with SubagentManager([spec("s", sender)]) as manager:
        await manager.spawn("s").wait()
        events = []
        manager.events.subscribe(lambda e: events.append(e))
        assert [m.body for m in manager.inbox(peek=True)] == ["hi"]
        assert events == []  # nothing moved
        [message] = manager.inbox()
        assert message.body == "hi"


async def test_an_awaited_reply_returns_at_once_when_the_peer_ends() -> None:
    """Hung await: ask returns ended as soon as the peer stops, not after its timeout."""
    gate = Gate()
    async with SubagentManager([spec("p", gate.parked("p"))]) as manager:
        child = manager.spawn("p")
        await gate.started_event("p").wait()
        outcome = []

        async def asker() -> None:
            outcome.append(await manager.ask(child.task_id, "answer me", timeout=3600))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(asker)
                while not any(p.unread for p in manager.peers()):
                    await anyio.lowlevel.checkpoint()  # until the question is in the peer's inbox
                gate.open.set()  # the peer ends without reading
        [reply] = outcome
        assert reply.outcome == "ended"
        assert reply.receipt.state == "failed"
        assert reply.receipt.reason == "ended"


async def test_a_reply_goes_to_the_waiting_ask_never_to_a_concurrent_recv() -> None:
    """Wrong queue: a reply lands with the ask that awaits it, not in the inbox."""

    async def asker(request: Request, ctx: RunContext) -> str:
        peer = next(p.id for p in ctx.peers() if p.agent == "echo")
        other: list[object] = []

        async def reader() -> None:
            other.append(await ctx.recv())

        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            await anyio.lowlevel.checkpoint()
            reply = await ctx.ask(peer, "question", timeout=5)
            tg.cancel_scope.cancel()  # the reader got nothing meanwhile
        left = ctx.inbox()
        return f"{reply.outcome}|{reply.message.body if reply.message else ''}|{other}|{left}"

    specs = [spec("echo", echo_replier()), spec("asker", asker)]
    async with SubagentManager(specs) as manager:
        echo = manager.spawn("echo")
        out = (await manager.spawn("asker").wait()).output
        assert out == "replied|echo:question|[]|[]"
        manager.send(echo.task_id, "stop")


async def test_a_full_inbox_refuses_the_new_message_and_keeps_the_old_ones() -> None:
    """Silent overflow: past the cap the send fails full; nothing already queued is dropped."""
    gate = Gate()
    config = SubagentConfig(inbox_capacity=3)
    async with SubagentManager([spec("p", gate.parked("p"))], config=config) as manager:
        child = manager.spawn("p")
        await gate.started_event("p").wait()
        kept = [manager.send(child.task_id, f"m{i}") for i in range(3)]
        refused = manager.send(child.task_id, "m3")
        assert [r.state for r in kept] == ["queued"] * 3
        assert refused.state == "failed"
        assert refused.reason == "full"
        assert "full" in refused.detail
        assert "nothing was dropped" in refused.detail
        gate.open.set()
