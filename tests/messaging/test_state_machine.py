"""A generated program of send / broadcast / recv / inbox / peek / reply / ask / cancel /
end / close_session, run against the manager on asyncio and on trio, with the receipt
rules checked after every step:

* a receipt never moves backwards, and ``failed`` only ever follows ``queued``;
* a queued message is in its recipient's inbox exactly once; any other is in none;
* every message is read at most once, and in order per (sender, recipient);
* an inbox holds at most its capacity, and ``full`` is said only when it did;
* once a recipient has ended, nothing of it is left queued.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from subagents import (
    ConfigError,
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


class Program:
    def __init__(self, manager: SubagentManager, gates: list[anyio.Event]) -> None:
        self.manager = manager
        self.gates = gates
        self.messaging = messaging_of(manager)
        self.handles = [manager.spawn("peer", str(i)) for i in range(CHILDREN)]
        self.receipts: dict[str, Receipt] = {}  # message id -> its (direct) receipt
        self.seen: dict[str, list[str]] = {}  # message id -> the states seen, in order
        self.read: set[str] = set()
        self.last_read: dict[tuple[str, str], str] = {}
        self.full_ok: dict[str, int] = {}

    def address(self, index: int) -> str:
        return "root" if index < 0 else self.handles[index].task_id

    def keep(self, receipt: Receipt) -> None:
        for one in receipt.recipients or (receipt,):
            self.receipts[one.message_id] = one

    def took(self, address: str, messages: list[Any]) -> None:
        for message in messages:
            assert message.id not in self.read, "read twice"
            assert message.to == address, "read from the wrong inbox"
            self.read.add(message.id)
            pair = (message.from_, message.to)
            assert message.id > self.last_read.get(pair, ""), "out of order"
            self.last_read[pair] = message.id

    async def run(self, op: tuple[Any, ...]) -> None:
        kind, m = op[0], self.messaging
        try:
            if kind == "send":
                src, dst = self.address(op[1]), self.address(op[2])
                before = m.postbox.unread(dst)
                receipt = m.send(src, dst, f"{src}->{dst}", wake=op[3])
                if receipt.reason == "full":
                    assert before >= CAPACITY
                self.keep(receipt)
            elif kind == "broadcast":
                self.keep(m.send(self.address(op[1]), "*", "all"))
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
                    self.keep(m.send(address, message.from_, "re", reply_to=message.id))
            elif kind == "ask":
                src, dst = self.address(op[1]), self.address(op[2])
                answer = await ask(m, src, dst, "q?", 0, self.manager.lend_slot)
                self.keep(answer.receipt)
                assert answer.outcome != "replied"
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
            if receipt.state == "queued":
                assert places == [receipt.to], (receipt, places)
            else:
                assert places == [], (receipt, places)
        for handle in self.handles:
            if handle.result is not None:
                assert postbox.peek(handle.task_id, None) == []


async def _program(steps: list[tuple[Any, ...]]) -> None:
    gates = [anyio.Event() for _ in range(CHILDREN)]

    async def peer(request: Request, ctx: RunContext) -> str:
        await gates[int(request.input)].wait()
        return "ended"

    config = SubagentConfig(inbox_capacity=CAPACITY, max_concurrent_spawns=CHILDREN)
    async with SubagentManager([spec("peer", peer)], config=config) as manager:
        program = Program(manager, gates)
        while not all(h.state == "running" for h in program.handles):
            await anyio.lowlevel.checkpoint()
        for step in steps:
            await program.run(step)
            program.check()
        for gate in gates:
            gate.set()
    program.check()
    for receipt in program.receipts.values():
        assert receipt.state != "queued" or receipt.to == "root"


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(ops, min_size=5, max_size=40))
def test_receipts_follow_their_rules_under_any_program(backend: str, steps: list[Any]) -> None:
    anyio.run(_program, steps, backend=backend)
