"""Workers run child after child in one task, reusing one cancel scope, under one shared
watchdog: a cancellation, a watchdog or a deadline belongs to one child and never leaks to
the next one in the same worker; every spawn ends in exactly one envelope; the wake paths
still wake; workers started one by one still fill every slot.
"""

from __future__ import annotations

import anyio
import pytest

from subagents import (
    AgentSpec,
    Request,
    RunContext,
    Status,
    SubagentConfig,
    SubagentManager,
)
from tests.helpers import clock_backends, pass_time_without_a_checkpoint

pytestmark = pytest.mark.anyio


class Gate:
    """Runners that block until released, and say when they started."""

    def __init__(self) -> None:
        self.started = anyio.Event()
        self.release = anyio.Event()


def _manager(limit: int = 1, **config: object) -> tuple[SubagentManager, Gate]:
    gate = Gate()

    async def block(request: Request, ctx: RunContext) -> str:
        gate.started.set()
        await gate.release.wait()
        return "released"

    async def forever(request: Request, ctx: RunContext) -> str:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def quick(request: Request, ctx: RunContext) -> str:
        return "quick:" + request.input

    async def nap(request: Request, ctx: RunContext) -> str:
        await anyio.sleep(float(request.input))
        return "napped"

    async def busy(request: Request, ctx: RunContext) -> str:
        # Runs past its deadline without a single checkpoint, then returns a result.
        pass_time_without_a_checkpoint(float(request.input))
        return "too late"

    async def stubborn(request: Request, ctx: RunContext) -> str:
        gate.started.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            return "ignored the cancellation"
        raise AssertionError("unreachable")

    async def boom(request: Request, ctx: RunContext) -> str:
        raise RuntimeError("boom " + request.input)

    specs = [
        AgentSpec(name=name, description=name, runner=runner)
        for name, runner in (
            ("block", block),
            ("forever", forever),
            ("quick", quick),
            ("nap", nap),
            ("busy", busy),
            ("stubborn", stubborn),
            ("boom", boom),
        )
    ]
    return SubagentManager(
        specs, config=SubagentConfig(max_concurrent_spawns=limit, **config)
    ), gate  # type: ignore[arg-type]


async def test_cancelled_child_does_not_cancel_the_next_in_its_worker() -> None:
    manager, gate = _manager(limit=1)
    async with manager:
        a = manager.spawn("block")
        b = manager.spawn("quick", "b")
        await gate.started.wait()
        assert manager.cancel(a.task_id)
        assert (await a.wait()).status is Status.CANCELLED
        envelope = await b.wait()
        assert envelope.status is Status.COMPLETED
        assert envelope.output == "quick:b"


async def test_child_ignoring_cancellation_is_cancelled_and_next_child_runs() -> None:
    manager, gate = _manager(limit=1)
    async with manager:
        a = manager.spawn("stubborn")
        b = manager.spawn("nap", "0.001")
        await gate.started.wait()
        a.cancel()
        assert (await a.wait()).status is Status.CANCELLED
        assert (await b.wait()).status is Status.COMPLETED


@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_watchdog_fires_then_next_child_in_worker_completes() -> None:
    manager, _ = _manager(limit=1)
    with anyio.fail_after(5):
        async with manager:
            a = manager.spawn("forever", timeout=0.02)
            b = manager.spawn("nap", "0.001", timeout=None)
            envelope = await a.wait()
            assert envelope.status is Status.TIMEOUT
            assert (await b.wait()).status is Status.COMPLETED


@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_deadline_of_a_finished_child_does_not_reach_the_next() -> None:
    # a: short watchdog, finishes at once; b: no watchdog, outlives a's deadline.
    manager, _ = _manager(limit=1)
    async with manager:
        a = manager.spawn("quick", "a", timeout=0.02)
        b = manager.spawn("nap", "0.08", timeout=None)
        c = manager.spawn("nap", "0.08", timeout=5)
        assert (await a.wait()).status is Status.COMPLETED
        assert (await b.wait()).status is Status.COMPLETED
        assert (await c.wait()).status is Status.COMPLETED


@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_result_after_the_deadline_is_a_timeout_and_next_child_is_fine() -> None:
    manager, _ = _manager(limit=1)
    async with manager:
        a = manager.spawn("busy", "0.05", timeout=0.01)
        b = manager.spawn("quick", "b", timeout=0.5)
        assert (await a.wait()).status is Status.TIMEOUT
        assert (await b.wait()).status is Status.COMPLETED


@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_exactly_one_envelope_per_spawn_in_a_mixed_batch() -> None:
    manager, _ = _manager(limit=3, mailbox_capacity=1000)
    seen: list[str] = []
    manager.events.subscribe(
        lambda e: seen.append(e.task_id) if e.type == "subagent.completed" else None
    )
    with anyio.fail_after(5):
        await _mixed_batch(manager, seen)


async def _mixed_batch(manager: SubagentManager, seen: list[str]) -> None:
    async with manager:
        handles = []
        for i in range(60):
            kind = ("quick", "boom", "forever", "nap", "stubborn")[i % 5]
            text = "0.001" if kind == "nap" else str(i)
            handles.append(manager.spawn(kind, text, timeout=0.03))
        handles[7].cancel()  # queued at cancel time
        for h in handles:
            await h.done.wait()  # ended, not collected: the mailbox still holds them
        envelopes = [h.result for h in handles if h.result is not None]
        drained = manager.mailbox().drain_all()
    assert len(seen) == len(handles) == len(set(seen))
    assert sorted(e.task_id for e in drained) == sorted(h.task_id for h in handles)
    statuses = [e.status for e in envelopes]
    assert statuses[0] is Status.COMPLETED
    assert statuses[1] is Status.ERROR
    assert statuses[2] is Status.TIMEOUT
    assert statuses[3] is Status.COMPLETED
    assert statuses[4] is Status.TIMEOUT  # stubborn swallowed the watchdog: still a timeout
    assert statuses[7] is Status.CANCELLED
    stats = manager.statistics()
    assert stats.settled == stats.spawned == len(handles)
    assert stats.high_water <= 3


async def test_close_cancels_running_and_queued_children() -> None:
    manager, gate = _manager(limit=1)
    async with manager:
        a = manager.spawn("block")
        b = manager.spawn("quick")
        await gate.started.wait()
    assert a.result is not None
    assert a.result.status is Status.CANCELLED
    assert b.result is not None
    assert b.result.status is Status.CANCELLED


async def test_waiters_wake_on_handle_and_mailbox() -> None:
    manager, gate = _manager(limit=2)
    async with manager:
        a = manager.spawn("block")
        b = manager.spawn("block")
        await gate.started.wait()
        got: dict[str, object] = {}

        async def by_result() -> None:
            got["result"] = await manager.wait_result(a.task_id, timeout=5)

        async def by_mailbox() -> None:
            got["mailbox"] = await manager.mailbox().wait(b.task_id, timeout=5)

        with anyio.fail_after(2):
            async with anyio.create_task_group() as tg:
                tg.start_soon(by_result)
                tg.start_soon(by_mailbox)
                await anyio.wait_all_tasks_blocked()
                gate.release.set()
        assert got == {"result": a.result, "mailbox": b.result}
        assert a.result is not None
        assert a.result.output == "released"


async def test_parent_end_cancels_its_children_reused_worker() -> None:
    order: list[str] = []

    async def parent(request: Request, ctx: RunContext) -> str:
        ctx.spawn("child")
        await anyio.wait_all_tasks_blocked()
        return "parent done"

    async def child(request: Request, ctx: RunContext) -> str:
        try:
            await anyio.sleep_forever()
        finally:
            order.append("child ended")
        raise AssertionError("unreachable")

    async def after(request: Request, ctx: RunContext) -> str:
        await anyio.sleep(0.01)
        return "after"

    specs = [
        AgentSpec(name="parent", description="p", runner=parent),
        AgentSpec(name="child", description="c", runner=child),
        AgentSpec(name="after", description="a", runner=after),
    ]
    async with SubagentManager(specs, config=SubagentConfig(max_concurrent_spawns=2)) as m:
        p = m.spawn("parent")
        envelope = await p.wait()
        assert envelope.status is Status.COMPLETED
        (kid,) = m.tasks(p.task_id)
        assert (await kid.wait()).status is Status.CANCELLED
        # Both workers go on serving children normally afterwards.
        more = [m.spawn("after") for _ in range(4)]
        assert [(await h.wait()).status for h in more] == [Status.COMPLETED] * 4
    assert order == ["child ended"]


async def test_execute_caller_cancelled_still_records_one_envelope() -> None:
    manager, _ = _manager(limit=1)
    async with manager:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: manager.execute("forever", timeout=None))
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()  # the caller of execute is cancelled
        (handle,) = manager.tasks()
        assert handle.result is not None
        assert handle.result.status is Status.CANCELLED
        # Spawned work still runs normally afterwards.
        assert (await manager.spawn("quick").wait()).status is Status.COMPLETED


async def test_workers_started_one_by_one_still_fill_every_slot() -> None:
    running = 0
    peak = 0
    release = anyio.Event()

    async def hold(request: Request, ctx: RunContext) -> str:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await release.wait()
        running -= 1
        return "held"

    spec = AgentSpec(name="hold", description="holds a slot", runner=hold)
    config = SubagentConfig(max_concurrent_spawns=8, mailbox_capacity=100)
    with anyio.fail_after(5):
        async with SubagentManager([spec], config=config) as manager:
            handles = [manager.spawn("hold") for _ in range(20)]
            await anyio.wait_all_tasks_blocked()
            stats = manager.statistics()
            assert (running, stats.running, stats.queued) == (8, 8, 12)
            assert stats.workers == 8
            manager.max_concurrent_spawns = 12  # raising the limit admits at once
            await anyio.wait_all_tasks_blocked()
            assert (running, manager.statistics().queued) == (12, 8)
            release.set()
            for h in handles:
                assert (await h.wait()).status is Status.COMPLETED
    assert peak == 12
    assert manager.statistics().high_water == 12


@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_a_shorter_watchdog_started_later_still_fires_on_time() -> None:
    manager, _ = _manager(limit=2)
    with anyio.fail_after(3):
        async with manager:
            slow = manager.spawn("forever", timeout=30)
            await anyio.wait_all_tasks_blocked()
            fast = manager.spawn("forever", timeout=0.02)
            assert (await fast.wait()).status is Status.TIMEOUT
            assert slow.result is None  # its own, later deadline is still pending
            slow.cancel()
            assert (await slow.wait()).status is Status.CANCELLED


@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_watchdog_rearms_after_the_child_it_waited_for_finished() -> None:
    manager, _ = _manager(limit=1)
    with anyio.fail_after(3):
        async with manager:
            a = manager.spawn("quick", "a", timeout=0.01)  # finishes long before 10 ms
            b = manager.spawn("nap", "5", timeout=0.05)  # outlives its 50 ms
            assert (await a.wait()).status is Status.COMPLETED
            envelope = await b.wait()
            assert envelope.status is Status.TIMEOUT
            assert envelope.error_type == "timeout"


@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_a_deadline_after_the_watchdog_went_idle_still_fires() -> None:
    """Once every watched deadline has passed the watchdog idles with no deadline but keeps
    running; a child started then must wake it with its own deadline, not only store it."""
    manager, _ = _manager(limit=1)
    async with manager:
        with anyio.fail_after(5):
            first = manager.spawn("forever", timeout=0.02)
            assert (await first.wait()).status is Status.TIMEOUT
            await anyio.wait_all_tasks_blocked()
            second = manager.spawn("forever", timeout=0.02)
            assert (await second.wait()).status is Status.TIMEOUT


@pytest.mark.parametrize("anyio_backend", clock_backends()[1:])  # trio's mock clock only
async def test_watchdog_follows_the_event_loop_clock() -> None:
    manager, _ = _manager(limit=2)
    start = anyio.current_time()
    async with manager:
        handles = [manager.spawn("forever", timeout=180) for _ in range(3)]
        for h in handles:
            assert (await h.wait()).status is Status.TIMEOUT
    # Two rounds of 180 s on two slots, in virtual time (autojump), not real time.
    assert 360 <= anyio.current_time() - start < 361
