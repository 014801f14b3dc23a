"""Responders (``on_message``): a busy agent answering an ask on the side, the messages it
leaves to its runner, and what it must never do to the manager or the asker."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from subagents import Message, Reply, Request, RunContext, SubagentConfig, SubagentManager
from subagents._manager import messaging_of
from tests.helpers import clock_backends, on_mock_clock
from tests.messaging.support import Gate, spec

pytestmark = pytest.mark.anyio


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


@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_a_responder_answers_while_its_runner_cannot_take_its_slot_back(
    anyio_backend: object,
) -> None:
    """The recipient waits in ``recv`` (its slot lent) and another child holds that slot:
    the runner cannot run until the slot frees, so the responder answers the ask; handing
    it to the runner leaves the asker waiting its whole timeout though the recipient can
    answer."""
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
