"""Guarantees the performance work (issue 5) must not break.

Workers run many children one after another in the same task and may reuse one cancel scope
for them; these tests pin what that must never change: a cancellation, a watchdog or a
deadline belongs to one child and never leaks to the next one in the same worker; every
spawn ends in exactly one envelope; the wake paths still wake.
"""

from __future__ import annotations

import time

import anyio
import pytest
from trio.testing import MockClock

from subagents import (
    AgentSpec,
    Request,
    RunContext,
    SpawnHandle,
    Status,
    SubagentConfig,
    SubagentManager,
)

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
        end = time.monotonic() + float(request.input)
        while time.monotonic() < end:
            pass
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


async def test_watchdog_fires_then_next_child_in_worker_completes() -> None:
    manager, _ = _manager(limit=1)
    with anyio.fail_after(5):
        async with manager:
            a = manager.spawn("forever", timeout=0.02)
            b = manager.spawn("nap", "0.001", timeout=None)
            envelope = await a.wait()
            assert envelope.status is Status.TIMEOUT
            assert (await b.wait()).status is Status.COMPLETED


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


async def test_result_after_the_deadline_is_a_timeout_and_next_child_is_fine() -> None:
    manager, _ = _manager(limit=1)
    async with manager:
        a = manager.spawn("busy", "0.05", timeout=0.01)
        b = manager.spawn("quick", "b", timeout=0.5)
        assert (await a.wait()).status is Status.TIMEOUT
        assert (await b.wait()).status is Status.COMPLETED


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
        with anyio.move_on_after(0.02):
            await manager.execute("forever", timeout=None)
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


@pytest.mark.parametrize(
    "anyio_backend",
    [pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}), id="trio-mockclock")],
)
async def test_watchdog_follows_the_event_loop_clock() -> None:
    manager, _ = _manager(limit=2)
    start = anyio.current_time()
    async with manager:
        handles = [manager.spawn("forever", timeout=180) for _ in range(3)]
        for h in handles:
            assert (await h.wait()).status is Status.TIMEOUT
    # Two rounds of 180 s on two slots, in virtual time (autojump), not real time.
    assert 360 <= anyio.current_time() - start < 361


async def test_a_plain_text_result_keeps_what_the_runner_reported() -> None:
    """A runner returning a str ends like Result(output=...): the text (cleaned, a str
    subclass made a str) with the usage, iterations and paths it reported on the way."""
    from subagents import Usage

    class Text(str):
        pass

    async def texty(request: Request, ctx: RunContext) -> str:
        ctx.report(usage=Usage(input_tokens=2, output_tokens=3), iterations=4)
        ctx.report(files_changed=["a.py"])
        return Text("done \udcff") if request.input == "sub" else "done"

    spec = AgentSpec(name="texty", description="d", runner=texty)
    async with SubagentManager([spec]) as manager:
        for text in ("plain", "sub"):
            handle = manager.spawn("texty", text)
            envelope = await handle.wait()
            assert envelope.status is Status.COMPLETED
            assert type(envelope.output) is str
            assert envelope.output == ("done" if text == "plain" else "done ?")
            assert envelope.usage == Usage(input_tokens=2, output_tokens=3)
            assert envelope.iterations == 4
            assert envelope.files_changed == ("a.py",)
            assert envelope.attempts == 1
            assert envelope.agent_path == handle.agent_path
            assert 0 <= envelope.queue_ms <= envelope.duration_ms


async def test_an_oversized_plain_text_is_still_bounded() -> None:
    """A plain text past the output bound is cut, with a marker saying how much."""
    from subagents._child_run import MAX_OUTPUT_CHARS

    async def huge(request: Request, ctx: RunContext) -> str:
        return "x" * (MAX_OUTPUT_CHARS + 10)

    spec = AgentSpec(name="huge", description="d", runner=huge)
    async with SubagentManager([spec]) as manager:
        envelope = await manager.spawn("huge").wait()
    assert envelope.output.startswith("x" * MAX_OUTPUT_CHARS)
    assert envelope.output.endswith("[… 10 characters dropped …]")


def test_a_handle_read_after_its_run_works_under_another_backend() -> None:
    """A handle read after the run (here under trio, the run was asyncio) gets an event of
    the reader's backend."""

    async def quick(request: Request, ctx: RunContext) -> str:
        return "ok"

    spec = AgentSpec(name="quick", description="d", runner=quick)

    async def run_one() -> SpawnHandle:
        async with SubagentManager([spec]) as manager:
            handle = manager.spawn("quick")
            await handle.done.wait()
            return handle

    handle = anyio.run(run_one, backend="asyncio")

    async def read_later() -> bool:
        with anyio.fail_after(5):
            await handle.done.wait()
        return handle.done.is_set()

    assert anyio.run(read_later, backend="trio")


async def test_a_child_session_is_released_when_it_ends() -> None:
    """A child that only opened its mailbox, or only delegated, has its session state
    (mailbox, names, live children) released as it ends; one that did neither has none."""
    mailboxes: list[object] = []

    async def opens_mailbox(request: Request, ctx: RunContext) -> str:
        mailboxes.append(ctx.mailbox)
        return "ok"

    async def delegates(request: Request, ctx: RunContext) -> str:
        await ctx.spawn("plain").wait()
        mailboxes.append(ctx.mailbox)
        return "ok"

    async def plain(request: Request, ctx: RunContext) -> str:
        return "ok"

    specs = [
        AgentSpec(name="opens", description="d", runner=opens_mailbox),
        AgentSpec(name="delegates", description="d", runner=delegates),
        AgentSpec(name="plain", description="d", runner=plain),
    ]
    async with SubagentManager(specs) as manager:
        for agent in ("opens", "delegates", "plain"):
            handle = manager.spawn(agent)
            await handle.done.wait()
            session = handle.task_id
            assert session not in manager._mailboxes
            assert session not in manager._names
            assert session not in manager._live
        assert len(mailboxes) == 2
        assert all(mailbox.closed for mailbox in mailboxes)  # type: ignore[attr-defined]
