"""The spawn limiter on its own: FIFO admission, the slot count, lending and borrowing.

The limiter runs whatever it admits with the ``run`` function it was started with; here
that is a function that parks each child on an event, so a test decides when a child
ends and reads the limiter's counters in between.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import pytest

from subagents import AgentSpec, Request, RunContext
from subagents._limiter import SpawnLimiter
from subagents._paths import AgentPath
from subagents._permissions import Ruleset
from subagents._record import RUNNING, SETTLED, ChildRecord

pytestmark = pytest.mark.anyio


async def _never(request: Request, ctx: RunContext) -> str:
    raise AssertionError("the limiter never calls a runner itself")


_SPEC = AgentSpec(name="child", description="A record for the limiter.", runner=_never)


def record(n: int) -> ChildRecord:
    return ChildRecord(
        task_id=f"t{n}",
        session_id="root",
        root_session="root",
        spec=_SPEC,
        request=Request(agent="child", input=str(n)),
        agent_path=AgentPath(f"/root/child-{n}"),
        parent_path=AgentPath.root(),
        timeout=None,
        permissions=Ruleset(),
        spawned_at=0.0,
        sync=False,
    )


class Parked:
    """A ``run`` function: each child is running until :meth:`finish` is called for it."""

    def __init__(self, limiter: SpawnLimiter) -> None:
        self.limiter = limiter
        self.started: list[str] = []
        self.gates: dict[str, anyio.Event] = {}
        self.inside: Callable[[ChildRecord], object] | None = None

    async def __call__(self, child: ChildRecord, scope: anyio.CancelScope) -> None:
        child.state = RUNNING
        self.started.append(child.task_id)
        gate = self.gates.setdefault(child.task_id, anyio.Event())
        await gate.wait()
        child.state = SETTLED

    def finish(self, task_id: str) -> None:
        self.gates.setdefault(task_id, anyio.Event()).set()


@asynccontextmanager
async def running(limit: int) -> AsyncIterator[tuple[SpawnLimiter, Parked]]:
    limiter = SpawnLimiter(limit)
    parked = Parked(limiter)
    async with anyio.create_task_group() as tg:
        limiter.start(tg, parked)
        yield limiter, parked
        for gate in parked.gates.values():
            gate.set()
        tg.cancel_scope.cancel()


async def test_children_are_admitted_oldest_first_up_to_the_limit() -> None:
    async with running(2) as (limiter, parked):
        records = [record(i) for i in range(5)]
        for r in records:
            limiter.submit(r)
        await anyio.wait_all_tasks_blocked()
        assert parked.started == ["t0", "t1"]
        assert (limiter.active, limiter.queued) == (2, 3)
        assert [r.queue_position for r in records] == [0, 0, 1, 2, 3]
        parked.finish("t1")
        await anyio.wait_all_tasks_blocked()
        assert parked.started == ["t0", "t1", "t2"]
        assert limiter.high_water == 2


async def test_a_withdrawn_child_is_skipped_and_never_takes_a_slot() -> None:
    async with running(1) as (limiter, parked):
        first, second, third = record(0), record(1), record(2)
        for r in (first, second, third):
            limiter.submit(r)
        await anyio.wait_all_tasks_blocked()
        limiter.withdraw(second)
        second.state = SETTLED  # what ending it in the queue does
        parked.finish("t0")
        await anyio.wait_all_tasks_blocked()
        assert parked.started == ["t0", "t2"]
        assert limiter.queued == 0


async def test_raising_the_limit_admits_at_once_and_lowering_it_admits_nobody() -> None:
    async with running(1) as (limiter, parked):
        for i in range(4):
            limiter.submit(record(i))
        await anyio.wait_all_tasks_blocked()
        limiter.set_limit(3)
        await anyio.wait_all_tasks_blocked()
        assert parked.started == ["t0", "t1", "t2"]
        limiter.set_limit(1)
        parked.finish("t0")
        await anyio.wait_all_tasks_blocked()
        assert parked.started == ["t0", "t1", "t2"]  # two still run: above the new limit
        assert limiter.active == 2


async def test_a_lent_slot_runs_a_queued_child_and_is_taken_back_first() -> None:
    limiter = SpawnLimiter(1)
    order: list[str] = []
    lent = anyio.Event()
    resume = anyio.Event()

    async def run(child: ChildRecord, scope: anyio.CancelScope) -> None:
        child.state = RUNNING
        order.append(f"start {child.task_id}")
        if child.task_id == "t0":
            async with limiter.lend_slot():
                lent.set()
                await resume.wait()
            order.append("t0 took its slot back")
        child.state = SETTLED

    async with anyio.create_task_group() as tg:
        limiter.start(tg, run)
        limiter.submit(record(0))
        limiter.submit(record(1))
        await lent.wait()
        await anyio.wait_all_tasks_blocked()
        assert order == ["start t0", "start t1"]  # t1 ran on the lent slot
        resume.set()
    assert order[-1] == "t0 took its slot back"
    assert limiter.active == 0
    assert limiter.borrowed == 0


async def test_a_cancelled_wait_for_the_slot_runs_on_a_borrowed_one() -> None:
    limiter = SpawnLimiter(1)
    holding = anyio.Event()
    release = anyio.Event()
    seen: dict[str, int] = {}

    async def run(child: ChildRecord, scope: anyio.CancelScope) -> None:
        child.state = RUNNING
        if child.task_id == "t0":
            with anyio.CancelScope() as wait:
                async with limiter.lend_slot():
                    await holding.wait()  # t1 now holds the only slot
                    wait.cancel()  # as a deadline would: the wait to take it back ends
            seen["borrowed"] = limiter.borrowed
            seen["active"] = limiter.active
        else:
            holding.set()
            await release.wait()
        child.state = SETTLED

    async with anyio.create_task_group() as tg:
        limiter.start(tg, run)
        limiter.submit(record(0))
        limiter.submit(record(1))
        await anyio.wait_all_tasks_blocked()
        release.set()
    assert seen == {"borrowed": 1, "active": 2}
    assert limiter.borrows == 1
    assert (limiter.active, limiter.borrowed) == (0, 0)


async def test_outside_a_child_lending_does_nothing() -> None:
    limiter = SpawnLimiter(1)
    async with limiter.lend_slot():
        assert limiter.active == 0
