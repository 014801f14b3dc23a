"""Messages, addresses and receipts through the host session's API."""

from __future__ import annotations

import contextlib

import anyio
import anyio.lowlevel
import pytest

import subagents
from subagents import (
    MAX_MESSAGE_CHARS,
    ConfigError,
    Message,
    Receipt,
    Request,
    RunContext,
    SpawnRejected,
    SubagentConfig,
    SubagentManager,
    UnknownPeer,
)
from subagents._manager import messaging_of
from subagents._messages import MessageIds
from subagents._messages import advance as advance_receipt
from subagents._messages import fail as fail_receipt
from tests.messaging.support import Gate, echo_replier, spec

pytestmark = pytest.mark.anyio


def test_message_ids_are_unique_and_sort_by_creation() -> None:
    ids = MessageIds()
    made = [ids.next()[0] for _ in range(2000)]
    assert len(set(made)) == len(made)
    assert made == sorted(made)


def test_a_receipt_never_moves_backwards_nor_out_of_failed() -> None:
    receipt = Receipt("m1", "t1")
    assert advance_receipt(receipt, "read", "injected")
    assert not advance_receipt(receipt, "delivered", "woken")
    assert receipt.state == "read"
    assert receipt.delivery == "injected"
    assert not fail_receipt(receipt, "ended")  # past queued: it keeps what happened
    assert advance_receipt(receipt, "replied")
    failed = Receipt("m2", "t1")
    assert fail_receipt(failed, "full", "no room")
    assert not advance_receipt(failed, "delivered")
    assert failed.state == "failed"
    assert failed.reason == "full"


async def test_send_queues_and_recv_reads_in_fifo_order() -> None:
    gate = Gate()
    async with SubagentManager([spec("p", gate.parked("p"))]) as manager:
        child = manager.spawn("p")
        await gate.started_event("p").wait()
        # The child sends to the host; the host reads them in order.
        ctx_sent = [manager.send(child.task_id, f"to child {i}") for i in range(5)]
        assert all(r.state == "queued" for r in ctx_sent)
        assert [p.unread for p in manager.peers() if p.id == child.task_id] == [5]
        gate.open.set()
        await child.wait()
        # Ended before reading: each fails naming the task whose envelope holds its result.
        assert {(r.state, r.reason, r.task_id) for r in ctx_sent} == {
            ("failed", "ended", child.task_id)
        }


async def test_a_childs_messages_reach_the_host_in_order_and_are_read_once() -> None:
    async def chatty(request, ctx) -> str:  # type: ignore[no-untyped-def]
        receipts = [ctx.send("/root", f"n{i}") for i in range(20)]
        assert all(r.state == "queued" for r in receipts)
        return "sent"

    async with SubagentManager([spec("chatty", chatty)]) as manager:
        await manager.spawn("chatty").wait()
        peeked = manager.inbox(peek=True)
        assert [m.body for m in peeked] == [f"n{i}" for i in range(20)]
        taken = manager.inbox()
        assert taken == peeked
        assert manager.inbox() == []
        assert [m.id for m in taken] == sorted(m.id for m in taken)


async def test_bad_messages_are_refused_naming_the_field() -> None:
    gate = Gate()
    async with SubagentManager([spec("p", gate.parked("p"))]) as manager:
        child = manager.spawn("p")
        with pytest.raises(ConfigError, match="body"):
            manager.send(child.task_id, "")
        with pytest.raises(ConfigError, match="body"):
            manager.send(child.task_id, "   ")
        with pytest.raises(ConfigError, match=f"at most {MAX_MESSAGE_CHARS}"):
            manager.send(child.task_id, "x" * (MAX_MESSAGE_CHARS + 1))
        with pytest.raises(ConfigError, match="to must be another agent"):
            manager.send("root", "hello me")
        with pytest.raises(ConfigError, match="broadcast cannot await"):
            await manager.ask("*", "anyone?", timeout=1)
        with pytest.raises(ConfigError, match="wake"):
            manager.send(child.task_id, "x", wake="yes")  # type: ignore[arg-type]
        assert manager.send(child.task_id, "x" * MAX_MESSAGE_CHARS).state == "queued"
        gate.open.set()


async def test_an_unknown_address_names_the_one_probably_meant() -> None:
    gate = Gate()
    async with SubagentManager([spec("planner", gate.parked("planner"))]) as manager:
        child = manager.spawn("planner")
        with pytest.raises(UnknownPeer, match="/root/planner") as caught:
            manager.send("planer", "hi")
        assert caught.value.suggestions == ("/root/planner",)
        with pytest.raises(UnknownPeer, match=child.task_id):
            manager.send(child.task_id[:-1] + "z", "hi")
        # Relative and absolute paths resolve to the same agent.
        assert manager.send("planner", "a").to == child.task_id
        assert manager.send("/root/planner", "b").to == child.task_id
        gate.open.set()


async def test_peers_list_the_tree_with_states_and_unread_counts() -> None:
    gate = Gate()
    specs = [spec("a", gate.parked("a")), spec("b", gate.parked("b"))]
    async with SubagentManager(specs, config=SubagentConfig(max_concurrent_spawns=1)) as manager:
        a = manager.spawn("a")
        b = manager.spawn("b")  # queued behind a
        await gate.started_event("a").wait()
        manager.send(b.task_id, "for later")
        peers = {p.id: p for p in manager.peers()}
        assert peers[a.task_id].state == "running"
        assert peers[b.task_id].state == "queued"
        assert peers[b.task_id].unread == 1
        assert peers[a.task_id].agent_path == "/root/a"
        gate.open.set()
        await b.wait()
        assert {p.state for p in manager.peers()} == {"ended"}


async def test_a_broadcast_reaches_every_live_peer_but_the_sender() -> None:
    async def shouter(request, ctx) -> str:  # type: ignore[no-untyped-def]
        while len(ctx.peers()) < 4:  # the host and three listeners
            await anyio.lowlevel.checkpoint()
        receipt = ctx.send("*", "hello all")
        assert receipt.to == "*"
        return ",".join(sorted(r.to for r in receipt.recipients))

    async def listener(request, ctx) -> str:  # type: ignore[no-untyped-def]
        message = await ctx.recv(timeout=10)
        return "none" if message is None else message.body

    specs = [spec("shouter", shouter), spec("listener", listener)]
    async with SubagentManager(specs) as manager:
        listeners = [manager.spawn("listener") for _ in range(3)]
        shouter_handle = manager.spawn("shouter")
        with anyio.fail_after(10):
            reached = (await shouter_handle.wait()).output
            outputs = [(await h.wait()).output for h in listeners]
        assert set(reached.split(",")) == {"root", *(h.task_id for h in listeners)}
        assert outputs == ["hello all"] * 3
        assert [m.body for m in manager.inbox()] == ["hello all"]


async def test_a_closed_session_fails_what_waits_in_its_inbox_with_closed() -> None:
    async def sender(request, ctx) -> str:  # type: ignore[no-untyped-def]
        ctx.send("/root", "for the host")
        return "ok"

    async with SubagentManager([spec("s", sender)]) as manager:
        await manager.spawn("s", session_id="conv").wait()
        [message] = manager.inbox(peek=True, session_id="conv")
        assert isinstance(message, Message)
        await manager.close_session("conv")
        with pytest.raises(SpawnRejected):
            manager.inbox(session_id="conv")


async def test_ask_gets_the_reply_and_marks_the_receipt_replied() -> None:
    async with SubagentManager([spec("echo", echo_replier())]) as manager:
        child = manager.spawn("echo")
        with anyio.fail_after(10):
            reply = await manager.ask(child.task_id, "ping", timeout=10)
        assert reply.outcome == "replied"
        assert reply.message is not None
        assert reply.message.body == "echo:ping"
        assert reply.message.reply_to == reply.receipt.message_id
        assert reply.receipt.state == "replied"
        manager.send(child.task_id, "stop")
        assert (await child.wait()).output == "stopped after 1"


def test_a_receipt_is_read_only_to_its_holder() -> None:
    receipt = Receipt("m1", "a")
    for name, value in [("to", "b"), ("message_id", "m2"), ("recipients", ()), ("state", "read")]:
        with pytest.raises(AttributeError):
            setattr(receipt, name, value)
    assert (receipt.to, receipt.message_id, receipt.state) == ("a", "m1", "queued")


def test_the_message_bounds_are_public() -> None:
    assert subagents.MAX_MESSAGE_CHARS == 16_000
    assert subagents.DEFAULT_INBOX_CAPACITY == SubagentConfig().inbox_capacity == 100


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


async def test_a_host_session_cannot_message_another_sessions_agents() -> None:
    """Sessions are isolated everywhere else (wait_result, wait_agent, peers() list only
    the sender's tree); a send by task id or session id must not cross into another tree."""
    gate = Gate()
    async with SubagentManager([spec("p", gate.parked("p"))]) as manager:
        theirs = manager.spawn("p", session_id="b")
        await gate.started_event("p").wait()
        assert manager.peers(session_id="a") == []
        with pytest.raises(UnknownPeer):
            manager.send(theirs.task_id, "injected into another tree", session_id="a")
        gate.open.set()


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
    """1,001 live agents (queued behind one slot): past ``max_peers`` the broadcast gives
    999 of them a receipt, and must say how many it left out rather than drop them
    silently."""
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
