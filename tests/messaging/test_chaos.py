"""Chaos: 100 agents exchange 100,000 messages while some are cancelled and some end
early. Every message is read exactly once or its sender holds a failed receipt saying
why; no receipt ever moves backwards."""

from __future__ import annotations

import random

import anyio
import pytest

from subagents import Event, Receipt, Request, RunContext, SubagentConfig, SubagentManager
from subagents._events import MESSAGE
from tests.messaging.support import spec

pytestmark = pytest.mark.anyio

AGENTS = 100
PER_AGENT = 1200
_RANK = {"queued": 0, "delivered": 1, "read": 2, "replied": 3, "failed": 4}


async def test_no_message_is_lost_or_duplicated_under_cancellations_and_ends() -> None:
    rng = random.Random(1313)
    ids: list[str] = []
    sent: list[Receipt] = []
    read: dict[str, int] = {}
    stop = anyio.Event()
    sent_done = [anyio.Event() for _ in range(AGENTS)]

    def took(messages: list) -> None:  # type: ignore[type-arg]
        for message in messages:
            read[message.id] = read.get(message.id, 0) + 1

    async def agent(request: Request, ctx: RunContext) -> str:
        me = int(request.input)
        quits_at = PER_AGENT * 2 if me % 10 else rng.randrange(PER_AGENT)  # a tenth end early
        try:
            for i in range(PER_AGENT):
                if i == quits_at:
                    took(ctx.inbox())
                    return "ended early"
                to = (
                    "*"
                    if i == PER_AGENT // 2
                    else ids[(me + 1 + rng.randrange(AGENTS - 1)) % AGENTS]
                )
                sent.append(ctx.send(to, f"{me}:{i}"))
                if i % 8 == 0:
                    took(ctx.inbox())
                    await anyio.lowlevel.checkpoint()
        finally:
            sent_done[me].set()
        async with anyio.create_task_group() as tg:

            async def stopper() -> None:
                await stop.wait()
                tg.cancel_scope.cancel()  # a recv cancelled mid-wait takes nothing

            tg.start_soon(stopper)
            while True:
                message = await ctx.recv()
                took([] if message is None else [message])
        took(ctx.inbox())
        return "done"

    seen: dict[str, tuple[str, int]] = {}  # (message id, recipient) -> last rank seen
    backwards: list[str] = []

    def watch(event: Event) -> None:
        receipt = event.data["receipt"]
        assert isinstance(receipt, dict)
        for one in [receipt, *receipt.get("recipients", [])]:  # type: ignore[list-item]
            key = f"{one['message_id']}>{one['to']}"
            rank = _RANK[str(one["state"])]
            if key in seen and seen[key][1] > rank:
                backwards.append(key)
            seen[key] = (str(one["state"]), rank)

    config = SubagentConfig(max_concurrent_spawns=AGENTS)
    async with SubagentManager([spec("agent", agent)], config=config) as manager:
        manager.events.subscribe(lambda e: watch(e) if e.type == MESSAGE else None)
        handles = [manager.spawn("agent", str(i)) for i in range(AGENTS)]
        ids.extend(h.task_id for h in handles)
        for victim in rng.sample(handles, 15):  # cancelled at random points of their run
            for _ in range(rng.randrange(50)):
                await anyio.lowlevel.checkpoint()
            victim.cancel()
        with anyio.fail_after(60):
            for i, handle in enumerate(handles):
                if not handle.cancel_called:
                    await sent_done[i].wait()
            stop.set()
            for handle in handles:
                await handle.wait()
        took(manager.inbox())

    receipts = [r for receipt in sent for r in (receipt.recipients or (receipt,))]
    assert len(receipts) >= 100_000
    duplicated = [m for m, n in read.items() if n > 1]
    lost = [r for r in receipts if not r.failed and r.message_id not in read]
    unaccounted = [r for r in receipts if r.failed and r.reason is None]
    assert duplicated == []
    assert lost == []
    assert unaccounted == []
    assert backwards == []
    assert {r.state for r in receipts if not r.failed} <= {"read"}
    assert len(read) == sum(not r.failed for r in receipts)
    reasons = {r.reason for r in receipts if r.failed}
    assert reasons == {"ended", "full"}  # the two ways a send fails here, each seen
