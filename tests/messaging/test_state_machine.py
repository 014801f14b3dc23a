"""A generated program of send / broadcast / recv / inbox / peek / reply / reply elsewhere
/ ask / blocking recv and ask in the background / time passing / cancelling the waits /
cancel / end / close_session, run against the manager on asyncio and on trio's mock clock
(where the waits have real timeouts and every agent has an ``on_message`` responder), with
the receipt rules checked after every step:

* a receipt never moves backwards, and ``failed`` only ever follows ``queued``;
* a queued message is in its recipient's inbox exactly once (or, a reply, in the slot of
  the ask waiting for it); any other is in none;
* every message is read at most once, and in order per (sender, recipient) from the inbox;
* an inbox holds at most its capacity, and ``full`` is said only when it did;
* a question is ``replied`` only once a reply to it reached its sender;
* an ask that says ``replied`` returns the message answering its question, from its peer;
* once a recipient has ended, nothing of it is left queued.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trio.testing import MockClock

from subagents import (
    ConfigError,
    Message,
    Receipt,
    Request,
    RunContext,
    SpawnRejected,
    SubagentConfig,
    SubagentManager,
)
from subagents._manager import messaging_of
from subagents._message_waits import ask, recv, take
from tests.messaging.support import spec

CAPACITY = 3
CHILDREN = 3
_RANK = {"queued": 0, "delivered": 1, "read": 2, "replied": 3}

who = st.integers(min_value=-1, max_value=CHILDREN - 1)  # -1: the host session
sends = st.tuples(st.just("send"), who, who, st.booleans())
ops = st.one_of(
    st.tuples(st.just("recv_wait"), who),
    st.tuples(st.just("ask_wait"), who, who),
    st.tuples(st.just("pass_time"), st.sampled_from([0.0, 0.5, 2.0])),
    st.tuples(st.just("stop_waits")),
    st.tuples(st.just("reply_elsewhere"), who, who),
    sends,
    sends,
    sends,
    st.tuples(st.just("recv"), who, st.booleans()),
    st.tuples(st.just("inbox"), who, st.booleans()),
    st.tuples(st.just("reply"), who),
    st.tuples(st.just("broadcast"), who),
    st.tuples(st.just("recv"), who, st.booleans()),
    st.tuples(st.just("inbox"), who, st.booleans()),
    st.tuples(st.just("reply"), who),
    st.tuples(st.just("ask"), who, who),
    st.tuples(st.just("cancel"), st.integers(0, CHILDREN - 1)),
    st.tuples(st.just("end"), st.integers(0, CHILDREN - 1)),
    st.tuples(st.just("close_session")),
)


WAIT = 1.0
"""The timeout of a background wait (mock clock seconds)."""


class Program:
    def __init__(
        self,
        manager: SubagentManager,
        gates: list[anyio.Event],
        waits: anyio.abc.TaskGroup,
        timeout: float,
    ) -> None:
        self.manager = manager
        self.gates = gates
        self.waits = waits  # the background recv and ask calls
        self.timeout = timeout
        self.scopes: list[anyio.CancelScope] = []
        self.sender: dict[str, str] = {}  # message id -> who sent it
        # question -> each reply's recipient, and whether it was refused as it was sent
        self.replies: dict[str, list[tuple[str, bool]]] = {}
        self.answering: dict[str, str] = {}  # the program's replies -> their question
        self.asked: set[str] = set()  # questions of an ask (a responder may answer them)
        self.asking: dict[str, int] = {}  # address -> its asks running in the background
        self.messaging = messaging_of(manager)
        self.handles = [manager.spawn("peer", str(i)) for i in range(CHILDREN)]
        self.receipts: dict[str, Receipt] = {}  # message id -> its (direct) receipt
        self.seen: dict[str, list[str]] = {}  # message id -> the states seen, in order
        self.read: set[str] = set()
        self.last_read: dict[tuple[str, str], str] = {}
        self.full_ok: dict[str, int] = {}

    def address(self, index: int) -> str:
        return "root" if index < 0 else self.handles[index].task_id

    def keep(self, receipt: Receipt, src: str, reply_to: str | None = None) -> None:
        for one in receipt.recipients or (receipt,):
            self.receipts[one.message_id] = one
            self.sender[one.message_id] = src
            if reply_to is not None:
                self.replies.setdefault(reply_to, []).append((one.to, one.failed))
                self.answering[one.message_id] = reply_to

    def took(self, address: str, messages: list[Any], *, inbox: bool = True) -> None:
        for message in messages:
            assert message.id not in self.read, "read twice"
            assert message.to == address, "read from the wrong inbox"
            self.read.add(message.id)
            if inbox:  # an ask's reply comes to its slot, ahead of the inbox
                pair = (message.from_, message.to)
                assert message.id > self.last_read.get(pair, ""), "out of order"
                self.last_read[pair] = message.id

    async def settle(self) -> None:
        """Let the background waits run until they block (on asyncio, whose
        ``wait_all_tasks_blocked`` polls every 0.1 s, a few checkpoints do: its waits
        time out at once)."""
        if self.timeout:
            await anyio.wait_all_tasks_blocked()
        else:
            for _ in range(5):
                await anyio.lowlevel.checkpoint()

    def background(self, run: Any) -> None:
        scope = anyio.CancelScope()
        self.scopes.append(scope)

        async def wait() -> None:
            with scope:
                await run()

        self.waits.start_soon(wait)

    async def recv_wait(self, address: str) -> None:
        try:
            got = await self.manager.recv(timeout=self.timeout, session_id=address)
        except SpawnRejected:
            return
        self.took(address, [] if got is None else [got])

    async def ask_wait(self, src: str, dst: str) -> None:
        m = self.messaging
        self.asking[src] = self.asking.get(src, 0) + 1
        try:
            answer = await ask(m, src, dst, "q?", self.timeout, self.manager.lend_slot)
        except (ConfigError, SpawnRejected):
            return
        finally:
            self.asking[src] -= 1
        self.keep(answer.receipt, src)
        self.asked.add(answer.receipt.message_id)
        if answer.outcome == "replied":
            reply = answer.message
            assert isinstance(reply, Message)
            assert reply.reply_to == answer.receipt.message_id
            assert reply.from_ == answer.receipt.to
            self.took(src, [reply], inbox=False)

    async def run(self, op: tuple[Any, ...]) -> None:
        kind, m = op[0], self.messaging
        try:
            if kind == "send":
                src, dst = self.address(op[1]), self.address(op[2])
                before = m.postbox.unread(dst)
                receipt = m.send(src, dst, f"{src}->{dst}", wake=op[3])
                if receipt.reason == "full":
                    assert before >= CAPACITY
                self.keep(receipt, src)
            elif kind == "broadcast":
                src = self.address(op[1])
                self.keep(m.send(src, "*", "all"), src)
            elif kind == "recv":
                address = self.address(op[1])
                got = await recv(m, address, None, 0, self.manager.lend_slot)
                self.took(address, [] if got is None else [got])
            elif kind == "inbox":
                address = self.address(op[1])
                got = take(m, address, peek=op[2])
                if not op[2]:
                    self.took(address, got)
            elif kind == "reply":
                address = self.address(op[1])
                got = take(m, address, peek=False, limit=1)
                self.took(address, got)
                for message in got:
                    sent = m.send(address, message.from_, "re", reply_to=message.id)
                    self.keep(sent, address, message.id)
            elif kind == "reply_elsewhere":  # answers it, to someone else than its sender
                address, other = self.address(op[1]), self.address(op[2])
                got = take(m, address, peek=False, limit=1)
                self.took(address, got)
                for message in got:
                    sent = m.send(address, other, "aside", reply_to=message.id)
                    self.keep(sent, address, message.id)
            elif kind == "ask":
                src, dst = self.address(op[1]), self.address(op[2])
                answer = await ask(m, src, dst, "q?", 0, self.manager.lend_slot)
                self.keep(answer.receipt, src)
                self.asked.add(answer.receipt.message_id)
            elif kind == "recv_wait":
                address = self.address(op[1])
                self.background(lambda: self.recv_wait(address))
                await self.settle()
            elif kind == "ask_wait":
                src, dst = self.address(op[1]), self.address(op[2])
                self.background(lambda: self.ask_wait(src, dst))
                await self.settle()
            elif kind == "pass_time":
                await anyio.sleep(op[1] if self.timeout else 0)
                await self.settle()
            elif kind == "stop_waits":
                for scope in self.scopes:
                    scope.cancel()
                self.scopes.clear()
                await self.settle()
            elif kind == "cancel":
                handle = self.handles[op[1]]
                handle.cancel()
                await handle.wait()
            elif kind == "end":
                self.gates[op[1]].set()
                await self.handles[op[1]].wait()
            else:
                await self.manager.close_session("root")
        except (ConfigError, SpawnRejected):
            pass  # self-sends, and anything from a closed session or an ended child

    def check(self) -> None:
        postbox = self.messaging.postbox
        addresses = ["root", *(h.task_id for h in self.handles)]
        where: dict[str, list[str]] = {}
        for address in addresses:
            queued = postbox.peek(address, None)
            assert len(queued) <= CAPACITY
            assert postbox.unread(address) == len(queued)
            for message in queued:
                where.setdefault(message.id, []).append(address)
        for message_id, receipt in self.receipts.items():
            states = self.seen.setdefault(message_id, [])
            if not states or states[-1] != receipt.state:
                states.append(receipt.state)
            ranks = [_RANK.get(s, -1) for s in states]
            if "failed" in states:
                assert states[-1] == "failed"
                assert states.count("failed") == 1
                assert ranks[:-1] == [0] * (len(states) - 1), states  # only from queued
            else:
                assert ranks == sorted(ranks), states
            places = where.get(message_id, [])
            # A reply may sit in the slot of an ask of its recipient instead of its inbox.
            slot = self.asking.get(receipt.to, 0) > 0 and message_id in self.answering
            if receipt.state == "queued" and not (slot and places == []):
                assert places == [receipt.to], (receipt, places)
            elif receipt.state != "queued":
                assert places == [], (receipt, places)
            if receipt.state == "replied" and message_id not in self.asked:
                sent = self.replies.get(message_id, [])
                reached = [to == self.sender[message_id] and not refused for to, refused in sent]
                assert any(reached), (receipt, sent)
        for handle in self.handles:
            if handle.result is not None:
                assert postbox.peek(handle.task_id, None) == []


async def _program(steps: list[tuple[Any, ...]], timeout: float) -> None:
    gates = [anyio.Event() for _ in range(CHILDREN)]

    async def peer(request: Request, ctx: RunContext) -> str:
        await gates[int(request.input)].wait()
        return "ended"

    async def responder(message: Message, ctx: RunContext) -> str | None:
        if message.body == "q?" and len(message.id) % 2:  # answers about half the asks
            await anyio.sleep(0.1 if timeout else 0)
            return "answered on the side"
        return None

    agent = spec("peer", peer, on_message=responder if timeout else None)
    config = SubagentConfig(inbox_capacity=CAPACITY, max_concurrent_spawns=CHILDREN)
    async with SubagentManager([agent], config=config) as manager:
        async with anyio.create_task_group() as waits:
            program = Program(manager, gates, waits, timeout)
            while not all(h.state == "running" for h in program.handles):
                await anyio.lowlevel.checkpoint()
            for step in steps:
                await program.run(step)
                program.check()
            waits.cancel_scope.cancel()
        program.asking.clear()
        program.check()
        for gate in gates:
            gate.set()
    program.check()
    for receipt in program.receipts.values():
        assert receipt.state != "queued" or receipt.to == "root"


@pytest.mark.parametrize("backend", ["asyncio", "trio-mockclock"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(ops, min_size=5, max_size=40))
def test_receipts_follow_their_rules_under_any_program(backend: str, steps: list[Any]) -> None:
    if backend == "asyncio":  # real time: the waits time out at once
        anyio.run(_program, steps, 0.0, backend="asyncio")
    else:  # the mock clock jumps to the next deadline: real timeouts, no wall time
        options = {"clock": MockClock(autojump_threshold=0)}
        anyio.run(_program, steps, WAIT, backend="trio", backend_options=options)
