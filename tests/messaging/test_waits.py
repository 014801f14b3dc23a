"""recv, ask and activity: on time, lending the slot, losing nothing when cancelled."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from subagents import Receipt, Reply, Request, RunContext, SubagentConfig, SubagentManager
from subagents._manager import messaging_of
from tests.helpers import clock_backends, on_mock_clock
from tests.messaging.support import Gate, echo_replier, spec

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_recv_and_ask_return_on_time_with_nothing(anyio_backend: object) -> None:
    gate = Gate()
    async with SubagentManager([spec("p", gate.parked("p"))]) as manager:
        child = manager.spawn("p")
        await gate.started_event("p").wait()
        started = anyio.current_time()
        assert await manager.recv(timeout=0.25) is None
        reply = await manager.ask(child.task_id, "hello?", timeout=0.15)
        assert reply.outcome == "timeout"
        assert reply.message is None
        assert reply.receipt.state == "queued"
        if on_mock_clock(anyio_backend):
            assert anyio.current_time() - started == pytest.approx(0.4, abs=0.001)
        gate.open.set()


@pytest.mark.parametrize("wait", ["recv", "ask"])
async def test_a_child_waiting_for_a_message_lends_its_slot(wait: str) -> None:
    """At a limit of one, the child that will send the message can only run on the slot
    the waiting child lends."""

    async def waiter(request: Request, ctx: RunContext) -> str:
        ctx.spawn("sender", ctx.task_id)
        if wait == "recv":
            message = await ctx.recv(timeout=10)
            return "none" if message is None else message.body
        sender = next(p.id for p in ctx.peers() if p.agent == "sender")
        reply = await ctx.ask(sender, "ping", timeout=10)
        return reply.message.body if reply.message else reply.outcome

    async def sender(request: Request, ctx: RunContext) -> str:
        if wait == "recv":
            ctx.send(request.input, "from the grandchild")
            return "sent"
        question = await ctx.recv(timeout=10)
        assert question is not None
        ctx.send(question.from_, "pong", reply_to=question.id)
        return "answered"

    config = SubagentConfig(max_concurrent_spawns=1)
    specs = [spec("waiter", waiter), spec("sender", sender)]
    async with SubagentManager(specs, config=config) as manager:
        with anyio.fail_after(10):
            envelope = await manager.spawn("waiter").wait()
        assert envelope.output == ("from the grandchild" if wait == "recv" else "pong")
        assert manager.statistics().high_water == 1


async def test_a_recv_cancelled_as_its_message_arrives_returns_it_or_leaves_it() -> None:
    gate = Gate()
    async with SubagentManager([spec("p", gate.parked("p"))]) as manager:
        child = manager.spawn("p")
        await gate.started_event("p").wait()
        postbox = messaging_of(manager).postbox
        got: list[object] = []
        async with anyio.create_task_group() as tg:

            async def receive() -> None:
                got.append(await manager.recv())

            tg.start_soon(receive)
            while not postbox.waiting("root"):
                await anyio.lowlevel.checkpoint()
            # In one step: the message wakes the waiter, and the waiter is cancelled.
            receipt = messaging_of(manager).send(child.task_id, "root", "kept")
            tg.cancel_scope.cancel()
        # Never both, never neither: handed to the waiter, or still in the inbox.
        left = manager.inbox()
        assert [m.body for m in [*got, *left]] == ["kept"]  # type: ignore[attr-defined]
        assert receipt.state == "read"
        gate.open.set()


async def test_activity_wakes_an_idle_host_on_a_message_or_a_finished_child() -> None:
    gate = Gate()
    speak = anyio.Event()

    async def talker(request: Request, ctx: RunContext) -> str:
        await speak.wait()
        ctx.send("/root", "news")
        await gate.open.wait()
        return "bye"

    async with SubagentManager([spec("talker", talker)]) as manager:
        child = manager.spawn("talker")
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: _set_soon(speak))
            with anyio.fail_after(10):
                woke = await manager.activity()
        assert [m.body for m in woke.messages] == ["news"]
        assert woke.results == []
        assert [m.body for m in manager.inbox()] == ["news"]
        gate.open.set()
        with anyio.fail_after(10):
            woke = await manager.activity()
        assert [e.task_id for e in woke.results] == [child.task_id]
        assert woke.messages == []
        manager.collect(child)
        assert not await manager.activity()  # nothing left: it returns at once, empty


async def _set_soon(event: anyio.Event) -> None:
    await anyio.lowlevel.checkpoint()
    event.set()


async def test_a_message_sent_without_wake_does_not_wake_an_idle_host() -> None:
    gate = Gate()

    async def quiet(request: Request, ctx: RunContext) -> str:
        ctx.send("/root", "fyi", wake=False)
        await gate.open.wait()
        return "done"

    async with SubagentManager([spec("quiet", quiet)]) as manager:
        child = manager.spawn("quiet")

        async def release() -> None:
            while not manager.inbox(peek=True):
                await anyio.lowlevel.checkpoint()
            gate.open.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(release)
            with anyio.fail_after(10):
                woke = await manager.activity()
        # Woken by the child's end, not by the quiet message (which it lists all the same).
        assert [e.task_id for e in woke.results] == [child.task_id]
        assert [m.body for m in woke.messages] == ["fyi"]


async def test_follow_up_input_reaches_a_queued_child_when_it_starts_and_a_running_one() -> None:
    async def reader(request: Request, ctx: RunContext) -> str:
        message = await ctx.recv(timeout=10)
        return "none" if message is None else f"{message.from_}:{message.body}"

    gate = Gate()
    config = SubagentConfig(max_concurrent_spawns=1)
    specs = [spec("p", gate.parked("p")), spec("reader", reader)]
    async with SubagentManager(specs, config=config) as manager:
        blocker = manager.spawn("p")
        queued = manager.spawn("reader")
        await gate.started_event("p").wait()
        receipt = manager.send_input(queued.task_id, "start with this")
        assert receipt.state == "queued"
        gate.open.set()
        await blocker.wait()
        assert (await queued.wait()).output == "root:start with this"
        assert receipt.state == "read"
        running = manager.spawn("reader")
        assert manager.send_input(running.task_id, "now").state == "queued"
        assert (await running.wait()).output == "root:now"
        assert manager.send_input(running.task_id, "too late").reason == "ended"


async def test_a_cancelled_ask_leaves_its_reply_to_the_inbox() -> None:
    async with SubagentManager([spec("echo", echo_replier())]) as manager:
        child = manager.spawn("echo")
        returned = []
        with anyio.CancelScope() as scope:
            scope.cancel()
            returned.append(await manager.ask(child.task_id, "q", timeout=10))
        # The question went out; the reply is the ask's if it returned, else the inbox's.
        if not returned:
            with anyio.fail_after(10):
                late = await manager.recv()
            assert late is not None
            assert late.body == "echo:q"
            assert late.reply_to is not None
        else:
            assert returned[0].message is not None
            assert returned[0].message.body == "echo:q"
        assert manager.inbox() == []
        manager.send(child.task_id, "stop")


async def test_a_delegated_childs_inbox_closes_when_it_ends() -> None:
    async def reader(request: Request, ctx: RunContext) -> str:
        ctx.send("/root", ctx.task_id)
        message = await ctx.recv(timeout=10)
        return "none" if message is None else message.body

    async with SubagentManager([spec("reader", reader)]) as manager:
        async with anyio.create_task_group() as tg:

            async def answer() -> None:
                question = await manager.recv(timeout=10)
                assert question is not None
                manager.send(question.body, "for the delegate")

            tg.start_soon(answer)
            envelope = await manager.execute("reader")
        assert envelope.output == "for the delegate"
        late = manager.send(envelope.task_id, "too late")
        assert late.reason == "ended"
        assert messaging_of(manager).postbox.is_open(envelope.task_id) is False


async def test_a_recv_for_one_sender_is_not_woken_by_another() -> None:
    """Y's message neither wakes a ``recv(from_=X)`` nor says ``woken``: it stays queued
    until something takes it, and then says how it really was delivered."""
    gate = Gate()
    got: list[str] = []
    receipts: dict[str, Receipt] = {}

    async def waiting(request: Request, ctx: RunContext) -> str:
        message = await ctx.recv(from_="/root/x", timeout=10)
        assert message is not None
        got.append(message.body)
        gate.started_event("taken").set()
        await gate.open.wait()
        return ",".join(m.body for m in ctx.inbox())

    async def sender(request: Request, ctx: RunContext) -> str:
        await gate.started_event(request.input).wait()
        receipts[request.input] = ctx.send("/root/w", f"from {request.input}")
        return "sent"

    agents = [spec("w", waiting), spec("x", sender), spec("y", sender)]
    async with SubagentManager(agents) as manager:
        child = manager.spawn("w")
        manager.spawn("x", "x")
        manager.spawn("y", "y")
        await anyio.wait_all_tasks_blocked()
        gate.started_event("y").set()
        await anyio.wait_all_tasks_blocked()
        assert got == []  # Y's message did not end the wait
        gate.started_event("x").set()
        await gate.started_event("taken").wait()
        assert got == ["from x"]
        gate.open.set()
        assert (await child.wait()).output == "from y"
    assert receipts["x"].delivery == "woken"
    assert receipts["y"].delivery == "injected"  # taken by inbox(), never by the wake


async def test_an_arbitrary_session_id_opens_no_host_inbox() -> None:
    async with SubagentManager([spec("p", Gate().parked("p"))]) as manager:
        assert manager.peers(session_id="nobody") == []
        assert manager.inbox(session_id="nobody") == []
        assert not await manager.activity("nobody")
        assert await manager.recv(session_id="nobody") is None  # at once: nobody can send
        assert not messaging_of(manager).postbox.is_open("nobody")


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


async def test_a_cancelled_asks_reply_is_read_before_the_peers_later_message() -> None:
    """FIFO per (sender, recipient): an ask cancelled while it takes its slot back leaves
    the reply that came to the inbox in its place, ahead of the peer's later message."""
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
