"""SubagentManager: admission (FIFO, limit), watchdog, ownership, cancel, close, envelopes."""

from __future__ import annotations

import random
from collections import Counter

import anyio
import pytest

from subagents import (
    AgentSpec,
    ConfigError,
    DelegateResult,
    Event,
    Mailbox,
    Request,
    RunContext,
    SpawnHandle,
    SpawnRejected,
    Status,
    SubagentConfig,
    SubagentManager,
    UnknownTask,
    Usage,
)
from tests.helpers import Tracker, clock_backends, echo, manager_with, on_mock_clock, spec


async def forever(request: Request, ctx: RunContext) -> str:
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


# ---------------------------------------------------------------- admission


@pytest.mark.anyio
async def test_spawn_returns_at_once_with_10000_queued() -> None:
    """10,000 spawns in one synchronous stretch: each returns a queued handle without
    starting anything, and a queued spawn is a record, not a task. (What a spawn costs is
    measured by benchmarks/run.py, not timed here.)"""
    tracker = Tracker()
    async with manager_with(spec("w", tracker.runner), mailbox_capacity=20_000) as manager:
        handles = [manager.spawn("w", str(i)) for i in range(10_000)]
        assert tracker.started == []  # no spawn awaited: nothing ran in between
        assert all(h.state == "queued" for h in handles)
        await anyio.wait_all_tasks_blocked()
        stats = manager.statistics()
        assert stats.limit == 4
        assert stats.running == 4
        assert stats.queued == 10_000 - 4
        assert stats.workers <= 4  # a queued spawn is a record, not a task
        assert tracker.alive == 4
        assert tracker.started == ["0", "1", "2", "3"]
        for h in handles[4:]:
            h.cancel()
        tracker.open()
    assert all(h.done.is_set() for h in handles)
    assert tracker.started == ["0", "1", "2", "3"]
    assert {h.result.status for h in handles[4:]} == {Status.CANCELLED}  # type: ignore[union-attr]


@pytest.mark.anyio
async def test_spawn_returns_a_pending_handle_whose_wait_gives_the_envelope() -> None:
    tracker = Tracker()
    async with manager_with(spec("slow", tracker.runner)) as m:
        handle = m.spawn("slow", "x")
        assert isinstance(handle, SpawnHandle)
        assert isinstance(handle.task_id, str)
        assert handle.task_id
        assert handle.agent_path == "/root/slow"
        assert isinstance(handle.done, anyio.Event)
        assert not handle.done.is_set()
        assert handle.result is None
        tracker.open()
        env = await handle.wait()
        assert handle.done.is_set()
        assert env.status == Status.COMPLETED
        assert env.output == "done x"
        assert handle.result == env
        assert m.result(handle.task_id) == env


@pytest.mark.anyio
async def test_children_start_in_fifo_order() -> None:
    started: list[int] = []
    rng = random.Random(7)

    async def runner(request: Request, ctx: RunContext) -> str:
        started.append(int(request.input))
        for _ in range(rng.randrange(6)):
            await anyio.lowlevel.checkpoint()
        return ""

    async with manager_with(spec("w", runner), max_concurrent_spawns=3) as manager:
        handles = [manager.spawn("w", str(i)) for i in range(60)]
        for h in handles:
            await h.done.wait()
    assert started == list(range(60))
    assert manager.statistics().high_water == 3


@pytest.mark.anyio
async def test_cancel_while_queued_leaves_queue_and_never_runs() -> None:
    tracker = Tracker()
    async with manager_with(spec("w", tracker.runner), max_concurrent_spawns=1) as manager:
        h1 = manager.spawn("w", "1")
        h2 = manager.spawn("w", "2")
        h3 = manager.spawn("w", "3")
        await anyio.wait_all_tasks_blocked()
        assert manager.statistics().queued == 2
        assert h2.cancel() is True
        assert h2.cancel() is False
        # ended at once, without taking a slot
        assert h2.done.is_set()
        assert h2.result is not None
        assert h2.result.status is Status.CANCELLED
        assert h2.result.error_type == "cancelled"
        assert manager.statistics().queued == 1
        assert manager.mailbox().peek(h2.task_id) == h2.result
        tracker.open()
        assert (await h3.wait()).status is Status.COMPLETED
        assert (await h1.wait()).status is Status.COMPLETED
    assert tracker.started == ["1", "3"]
    assert manager.statistics().high_water == 1


@pytest.mark.anyio
async def test_raising_the_limit_admits_queued_children_at_once() -> None:
    tracker = Tracker()
    async with manager_with(spec("w", tracker.runner), max_concurrent_spawns=1) as manager:
        for i in range(5):
            manager.spawn("w", str(i))
        await anyio.wait_all_tasks_blocked()
        assert tracker.alive == 1
        manager.max_concurrent_spawns = 3
        await anyio.wait_all_tasks_blocked()
        assert tracker.alive == 3
        assert manager.statistics().queued == 2
        tracker.open()


@pytest.mark.anyio
async def test_lowering_the_limit_admits_nobody_until_below_it() -> None:
    gates = [anyio.Event() for _ in range(6)]
    alive: list[int] = []

    async def runner(request: Request, ctx: RunContext) -> str:
        alive.append(int(request.input))
        try:
            await gates[int(request.input)].wait()
        finally:
            alive.remove(int(request.input))
        return ""

    async with manager_with(spec("w", runner), max_concurrent_spawns=4) as manager:
        for i in range(6):
            manager.spawn("w", str(i))
        await anyio.wait_all_tasks_blocked()
        assert sorted(alive) == [0, 1, 2, 3]
        manager.set_max_concurrent_spawns(2)
        gates[0].set()
        await anyio.wait_all_tasks_blocked()
        assert sorted(alive) == [1, 2, 3]  # 3 running > 2: nobody admitted
        gates[1].set()
        await anyio.wait_all_tasks_blocked()
        assert sorted(alive) == [2, 3]
        gates[2].set()
        await anyio.wait_all_tasks_blocked()
        assert sorted(alive) == [3, 4]  # below the limit again: the next one starts
        for g in gates:
            g.set()


@pytest.mark.anyio
async def test_limit_changed_at_run_time_never_over_admits() -> None:
    rng = random.Random(99)
    tracker_alive = 0
    violations: list[tuple[int, int]] = []
    high = 0
    manager = manager_with(max_concurrent_spawns=2)

    async def runner(request: Request, ctx: RunContext) -> str:
        nonlocal tracker_alive, high
        tracker_alive += 1
        high = max(high, tracker_alive)
        if tracker_alive > manager.max_concurrent_spawns:
            violations.append((tracker_alive, manager.max_concurrent_spawns))
        try:
            for _ in range(rng.randrange(1, 8)):
                await anyio.lowlevel.checkpoint()
        finally:
            tracker_alive -= 1
        return ""

    manager.register(spec("w", runner))
    async with manager:
        handles = [manager.spawn("w", str(i)) for i in range(300)]
        for limit in [5, 1, 3, 6, 2, 1, 4] * 4:
            for _ in range(rng.randrange(1, 10)):
                await anyio.lowlevel.checkpoint()
            manager.max_concurrent_spawns = limit
        for h in handles:
            assert (await h.wait()).status is Status.COMPLETED
    assert violations == []
    assert high >= 5  # raising the limit did admit more
    assert manager.statistics().high_water == high


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_max_concurrent_spawns_below_one_is_a_config_error(bad: object) -> None:
    with pytest.raises(ConfigError, match="max_concurrent_spawns"):
        SubagentConfig(max_concurrent_spawns=bad)  # type: ignore[arg-type]
    manager = SubagentManager()
    with pytest.raises(ConfigError, match="max_concurrent_spawns"):
        manager.max_concurrent_spawns = bad  # type: ignore[assignment]
    assert manager.max_concurrent_spawns == 4


def test_config_defaults_are_the_documented_ones() -> None:
    config = SubagentConfig()
    assert config.max_concurrent_spawns == 4
    assert config.spawn_timeout == 180.0
    assert config.execute_timeout == 180.0
    assert config.mailbox_capacity == 64
    assert config.mailbox_ttl is None
    assert config.truncate_chars == 2000
    assert config.max_depth == 3
    assert config.settle_timeout == 5


# ---------------------------------------------------------------- watchdog


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_watchdog_times_out_with_partial_output() -> None:
    async def runner(request: Request, ctx: RunContext) -> str:
        ctx.report(output="step 1 done", usage=Usage(input_tokens=3, output_tokens=4))
        ctx.report(append="; step 2", iterations=2, files_changed=["a.py"])
        await anyio.sleep_forever()
        return "never"

    async with manager_with(spec("w", runner)) as manager:
        handle = manager.spawn("w", timeout=0.05)
        env = await handle.wait()
    assert env.status is Status.TIMEOUT
    assert env.output == "step 1 done; step 2"
    assert env.usage == Usage(input_tokens=3, output_tokens=4)
    assert env.iterations == 2
    assert env.files_changed == ("a.py",)
    assert env.error_type == "timeout"
    assert "0.05" in env.error
    assert env.truncated().splitlines()[-1].startswith("hint:")


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_success_after_the_watchdog_fired_stays_timeout() -> None:
    async def runner(request: Request, ctx: RunContext) -> str:
        ctx.report(output="partial")
        with anyio.CancelScope(shield=True):
            await anyio.sleep(0.15)  # ignores the watchdog...
        return "late success"  # ...and returns after it fired

    async with manager_with(spec("w", runner)) as manager:
        env = await manager.spawn("w", timeout=0.03).wait()
    assert env.status is Status.TIMEOUT
    assert env.output == "partial"


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_per_spawn_and_per_agent_timeouts_override_config() -> None:
    async with manager_with(
        spec("slow", forever, timeout=0.03), spec("slow2", forever), spawn_timeout=30
    ) as manager:
        with anyio.fail_after(5):
            a = await manager.spawn("slow").wait()
            b = await manager.spawn("slow2", timeout=0.03).wait()
    assert a.status is Status.TIMEOUT
    assert b.status is Status.TIMEOUT


@pytest.mark.anyio
@pytest.mark.parametrize("bad", [0, -1, float("nan"), "1"])
async def test_bad_timeout_is_rejected_and_queues_nothing(bad: object) -> None:
    async with manager_with(spec("w", echo)) as manager:
        with pytest.raises(ConfigError, match="timeout"):
            manager.spawn("w", timeout=bad)  # type: ignore[arg-type]
        assert manager.statistics().spawned == 0
        assert manager.tasks() == []


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_duration_from_spawn_queue_separate_watchdog_from_start(
    anyio_backend: object,
) -> None:
    tracker = Tracker()

    async def quick(request: Request, ctx: RunContext) -> str:
        return "ok"

    async with manager_with(
        spec("block", tracker.runner), spec("quick", quick), max_concurrent_spawns=1
    ) as manager:
        blocker = manager.spawn("block")
        # queued for 0.2 s, longer than its own 0.1 s watchdog
        queued = manager.spawn("quick", timeout=0.1)
        await anyio.sleep(0.2)
        tracker.open()
        env = await queued.wait()
        await blocker.wait()
    assert env.status is Status.COMPLETED  # queue time does not count toward the watchdog
    assert env.duration_ms >= env.queue_ms
    if not on_mock_clock(anyio_backend):  # the envelope's times are wall-clock ones
        assert env.queue_ms > 0


# ---------------------------------------------------------------- ownership


@pytest.mark.anyio
async def test_spawn_inside_short_lived_task_keeps_running() -> None:
    tracker = Tracker()
    handles = []
    async with manager_with(spec("w", tracker.runner)) as manager:

        async def tool_call() -> None:
            handles.append(manager.spawn("w", "x"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(tool_call)
        # the calling task has ended; a cancelled caller does not matter either
        with anyio.CancelScope() as scope:
            handles.append(manager.spawn("w", "y"))
            scope.cancel()
            await anyio.lowlevel.checkpoint()
        await anyio.wait_all_tasks_blocked()
        assert tracker.alive == 2
        assert all(h.state == "running" for h in handles)
        tracker.open()
        envs = [await h.wait() for h in handles]
    assert [e.status for e in envs] == [Status.COMPLETED, Status.COMPLETED]
    assert [e.output for e in envs] == ["done x", "done y"]


# ---------------------------------------------------------------- cancel, close


@pytest.mark.anyio
async def test_cancel_by_task_id() -> None:
    tracker = Tracker()
    async with manager_with(spec("w", tracker.runner), spec("e", echo)) as manager:
        handle = manager.spawn("w", "x")
        await tracker.entered.wait()
        assert manager.cancel(handle.task_id) is True
        env = await handle.wait()
        assert env.status is Status.CANCELLED
        assert env.error_type == "cancelled"
        assert manager.cancel(handle.task_id) is False
        finished = manager.spawn("e", "y")
        first = await finished.wait()
        assert manager.cancel(finished.task_id) is False
        assert finished.result is first
        assert first.status is Status.COMPLETED
        with pytest.raises(UnknownTask):
            manager.cancel("no-such-task")
    assert tracker.alive == 0


@pytest.mark.anyio
async def test_close_session_cancels_waits_releases_and_rejects() -> None:
    tracker = Tracker()
    cleaned: list[str] = []
    released_early: list[bool] = []
    boxes: list[Mailbox] = []

    async def slow_cleanup(request: Request, ctx: RunContext) -> str:
        try:
            await tracker.runner(request, ctx)
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.sleep(0.02)  # settling takes a moment
            cleaned.append(request.input)
            released_early.append(boxes[0].closed if boxes else False)
        return ""

    async with manager_with(
        spec("w", slow_cleanup), spec("e", echo), max_concurrent_spawns=3
    ) as manager:
        doomed = [manager.spawn("w", f"s{i}", session_id="s") for i in range(5)]
        keeper = manager.spawn("w", "other", session_id="other")
        await anyio.wait_all_tasks_blocked()
        box = manager.mailbox("s")
        boxes.append(box)  # type: ignore[arg-type]
        await manager.close_session("s")
        assert released_early == [False, False, False]  # released only once all settled
        # every child has settled by the time close_session returns
        assert all(h.done.is_set() for h in doomed)
        assert {h.result.status for h in doomed} == {Status.CANCELLED}  # type: ignore[union-attr]
        assert sorted(cleaned) == ["s0", "s1", "s2"]  # the running ones, cleaned up
        assert sorted(tracker.started) == ["other", "s0", "s1", "s2"]  # queued never ran
        assert tracker.alive == 1  # only the other session's child
        assert box.closed
        assert manager.mailbox("s").closed
        assert manager.session_closed("s")
        with pytest.raises(SpawnRejected) as info:
            manager.spawn("e", session_id="s")
        assert info.value.reason == "session_closed"
        await manager.close_session("s")  # idempotent
        assert keeper.state == "running"
        tracker.open()
        assert (await keeper.wait()).status is Status.COMPLETED
        assert manager.result(doomed[0].task_id) == doomed[0].result
    assert tracker.alive == 0
    assert manager.statistics().workers == 0


@pytest.mark.anyio
async def test_aclose_cancels_everything_and_leaves_nothing_running() -> None:
    tracker = Tracker()
    manager = manager_with(spec("w", tracker.runner), max_concurrent_spawns=2)
    async with manager:
        handles = [manager.spawn("w", str(i), session_id=f"s{i % 3}") for i in range(6)]
        await anyio.wait_all_tasks_blocked()
        assert tracker.alive == 2
    assert all(h.done.is_set() for h in handles)
    assert {h.result.status for h in handles} == {Status.CANCELLED}  # type: ignore[union-attr]
    assert tracker.alive == 0
    stats = manager.statistics()
    assert (stats.running, stats.queued, stats.workers) == (0, 0, 0)
    assert stats.settled == 6
    assert not manager.running
    with pytest.raises(SpawnRejected) as info:
        manager.spawn("w")
    assert info.value.reason == "manager_closed"
    assert manager.mailbox("s0").closed
    await manager.aclose()  # idempotent


@pytest.mark.anyio
async def test_aclose_without_async_with_cancels_a_running_child() -> None:
    m = manager_with(spec("f", forever))
    await m.__aenter__()
    handle = m.spawn("f", "x")
    await anyio.wait_all_tasks_blocked()
    await m.aclose()
    assert handle.result is not None
    assert handle.result.status == Status.CANCELLED


@pytest.mark.anyio
async def test_aclose_cancels_an_in_flight_execute() -> None:
    tracker = Tracker()
    got: list[DelegateResult] = []
    manager = manager_with(spec("w", tracker.runner))

    async def delegate() -> None:
        got.append(await manager.execute("w", "x"))

    async with anyio.create_task_group() as tg:
        async with manager:
            tg.start_soon(delegate)
            await tracker.entered.wait()
        # leaving the manager cancelled the delegation running in another task
        assert [e.status for e in got] == [Status.CANCELLED]
    assert [e.status for e in got] == [Status.CANCELLED]
    assert tracker.alive == 0


# ---------------------------------------------------------------- exactly one envelope


class CountingMailbox(Mailbox):
    def __init__(self, puts: Counter[str]) -> None:
        super().__init__(capacity=1000)
        self.puts = puts

    def put(self, task_id: str, envelope: DelegateResult) -> bool:
        self.puts[task_id] += 1
        return super().put(task_id, envelope)


CASES = [
    "success",
    "exception",
    "wrong_type",
    "watchdog",
    "cancel_queued",
    "cancel_running",
    "session_close",
    "manager_close",
]
EXPECTED = {
    "success": Status.COMPLETED,
    "exception": Status.ERROR,
    "wrong_type": Status.ERROR,
    "watchdog": Status.TIMEOUT,
    "cancel_queued": Status.CANCELLED,
    "cancel_running": Status.CANCELLED,
    "session_close": Status.CANCELLED,
    "manager_close": Status.CANCELLED,
}


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", clock_backends())
@pytest.mark.parametrize("case", CASES)
async def test_every_ending_delivers_exactly_one_envelope(case: str) -> None:
    tracker = Tracker()

    async def runner(request: Request, ctx: RunContext) -> object:
        if case == "success":
            return "ok"
        if case == "exception":
            raise ValueError("boom")
        if case == "wrong_type":
            return 42
        return await tracker.runner(request, ctx)

    puts: Counter[str] = Counter()
    completed: Counter[str] = Counter()
    manager = SubagentManager(
        [spec("w", runner), spec("block", tracker.runner)],
        config=SubagentConfig(max_concurrent_spawns=1),
        mailbox_factory=lambda _session: CountingMailbox(puts),
    )
    manager.events.subscribe(
        lambda e: completed.update([e.task_id]) if e.type == "subagent.completed" else None
    )
    async with manager:
        blocker = None
        if case == "cancel_queued":
            blocker = manager.spawn("block", session_id="s")
        handle = manager.spawn("w", session_id="s", timeout=0.05 if case == "watchdog" else None)
        await anyio.wait_all_tasks_blocked()
        if case in ("cancel_queued", "cancel_running"):
            handle.cancel()
        elif case == "session_close":
            await manager.close_session("s")
        if case != "manager_close":
            await handle.done.wait()
            if blocker is not None:
                blocker.cancel()
        await anyio.wait_all_tasks_blocked()
    env = handle.result
    assert env is not None
    assert env.status is EXPECTED[case]
    assert completed[handle.task_id] == 1
    if case in ("session_close", "manager_close"):
        assert puts[handle.task_id] <= 1  # the session's mailbox is being released
    else:
        assert puts[handle.task_id] == 1
    assert manager.statistics().settled == (2 if blocker is not None else 1)
    if case == "wrong_type":
        assert "int" in env.error
    assert tracker.alive == 0


@pytest.mark.anyio
async def test_done_is_set_only_after_delivery() -> None:
    seen: list[tuple[str, bool, bool]] = []

    async with manager_with(spec("w", echo)) as manager:
        handle = manager.spawn("w", "x")
        done = handle.done  # created before delivery
        box = manager.mailbox()
        box.subscribe_once(
            handle.task_id,
            lambda: seen.append(("put", done.is_set(), handle.result is not None)),
        )
        manager.events.subscribe(
            lambda e: (
                seen.append(("event", done.is_set(), handle.result is not None))
                if e.type == "subagent.completed"
                else None
            )
        )
        await done.wait()
        assert box.peek(handle.task_id) == handle.result
    assert seen == [("put", False, True), ("event", False, True)]


# ---------------------------------------------------------------- mailbox full


@pytest.mark.anyio
async def test_full_mailbox_loses_nothing() -> None:
    events: list[str] = []
    async with manager_with(spec("w", echo), mailbox_capacity=2) as manager:
        manager.events.subscribe(
            lambda e: events.append(e.task_id) if e.type == "subagent.completed" else None
        )
        handles = [manager.spawn("w", str(i)) for i in range(5)]
        for h in handles:
            await h.done.wait()
        assert len(manager.mailbox()) == 2
        for h in handles:
            env = manager.result(h.task_id)
            assert env is not None
            assert env.output == h.request.input
            assert h.result == env
        late = handles[-1]
        assert manager.mailbox().peek(late.task_id) is None  # it degraded to the event...
        assert await manager.wait_result(late.task_id, timeout=0) == late.result  # ...not lost
    assert sorted(events) == sorted(h.task_id for h in handles)


@pytest.mark.anyio
async def test_an_expired_mailbox_entry_is_still_in_the_record() -> None:
    now = [0.0]

    def factory(session_id: str) -> Mailbox:
        return Mailbox(ttl=0.01, clock=lambda: now[0])

    async with SubagentManager([spec("echo", echo)], mailbox_factory=factory) as m:
        h = m.spawn("echo", "x")
        await h.done.wait()
        now[0] += 0.03
        assert m.mailbox("root").peek(h.task_id) is None  # expired
        env = await m.wait_result(h.task_id, timeout=0)
        assert env is not None
        assert env.output == "x"


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_wait_result_of_an_unfinished_child_times_out_with_none() -> None:
    async with manager_with(spec("f", forever)) as m:
        h = m.spawn("f", "x")
        assert await m.wait_result(h.task_id, timeout=0.02) is None
        assert h.result is None
        h.cancel()


# ---------------------------------------------------------------- misbehaving runners


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_stray_cancelled_error_from_a_runner_is_its_own_failure() -> None:
    """On asyncio a runner can raise CancelledError without being cancelled (it awaited a
    future someone else cancelled). That is the runner's failure: it must end in an error
    envelope and must not kill the worker, the queue behind it, or the manager's host."""
    import asyncio

    async def stray(request: Request, ctx: RunContext) -> str:
        future = asyncio.get_running_loop().create_future()
        future.cancel()
        await future
        return "unreachable"

    async with manager_with(spec("stray", stray), spec("e", echo), max_concurrent_spawns=1) as m:
        bad = m.spawn("stray")
        good = m.spawn("e", "after")
        with anyio.fail_after(5):
            bad_env = await bad.wait()
            good_env = await good.wait()
        assert bad_env.status is Status.ERROR
        assert "CancelledError" in bad_env.error
        assert good_env.status is Status.COMPLETED
        # the manager still works
        assert (await m.spawn("e", "again").wait()).output == "again"
    assert m.statistics().workers == 0


@pytest.mark.anyio
async def test_done_first_looked_at_during_delivery_is_not_yet_set() -> None:
    """``done`` is created lazily; looking at it for the first time from a mailbox or event
    subscriber (during delivery) must not report it set before delivery has finished."""
    seen: list[tuple[str, bool]] = []
    handles: list[SpawnHandle] = []
    delivered = anyio.Event()

    def on_event(event: Event) -> None:
        if event.type == "subagent.completed":
            seen.append(("event", handles[0].done.is_set()))
            delivered.set()

    async with manager_with(spec("w", echo)) as manager:
        handle = manager.spawn("w", "x")
        handles.append(handle)
        manager.mailbox().subscribe_once(
            handle.task_id, lambda: seen.append(("put", handles[0].done.is_set()))
        )
        manager.events.subscribe(on_event)
        await delivered.wait()  # handle.done itself is never touched before delivery
        assert handle.done.is_set()
        assert seen == [("put", False), ("event", False)]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_queue_ms_of_a_child_cancelled_in_the_queue_is_its_whole_wait(
    anyio_backend: object,
) -> None:
    tracker = Tracker()
    async with manager_with(spec("w", tracker.runner), max_concurrent_spawns=1) as manager:
        manager.spawn("w", "runs")
        queued = manager.spawn("w", "waits")
        await anyio.sleep(0.1)
        queued.cancel()
        env = await queued.wait()
        tracker.open()
    assert env.status is Status.CANCELLED
    assert env.queue_ms == env.duration_ms  # all of it was spent waiting for a slot
    if not on_mock_clock(anyio_backend):  # the envelope's times are wall-clock ones
        assert env.duration_ms > 0


@pytest.mark.anyio
async def test_aclose_ends_a_whole_nested_tree() -> None:
    tracker = Tracker()
    handles: list[SpawnHandle] = []

    async def level(request: Request, ctx: RunContext) -> str:
        depth = int(request.input)
        if depth < 3:
            handles.append(ctx.spawn("level", str(depth + 1)))
        return await tracker.runner(request, ctx)

    manager = manager_with(spec("level", level), max_concurrent_spawns=10)
    async with manager:
        handles.append(manager.spawn("level", "1"))
        await anyio.wait_all_tasks_blocked()
        assert tracker.alive == 3
    paths = sorted(str(h.agent_path) for h in handles)
    assert paths == ["/root/level", "/root/level/level", "/root/level/level/level"]
    assert [h.result.status for h in handles] == [Status.CANCELLED] * 3  # type: ignore[union-attr]
    assert tracker.alive == 0
    assert manager.statistics().workers == 0
    assert manager.statistics().settled == 3


@pytest.mark.anyio
async def test_exception_or_cancel_in_the_async_with_body_still_ends_every_child() -> None:
    tracker = Tracker()
    manager = manager_with(spec("w", tracker.runner))
    handles: list[SpawnHandle] = []

    async def body() -> None:
        async with manager:
            handles.append(manager.spawn("w"))
            await tracker.entered.wait()
            raise KeyError("body failed")

    with pytest.raises(KeyError, match="body failed"):
        await body()
    (handle,) = handles
    assert handle.result is not None
    assert handle.result.status is Status.CANCELLED
    assert tracker.alive == 0

    tracker2 = Tracker()
    manager2 = manager_with(spec("w", tracker2.runner))
    with anyio.CancelScope() as scope:
        async with manager2:
            handle2 = manager2.spawn("w")
            await tracker2.entered.wait()
            scope.cancel()  # the host cancels the body while the child runs
            await anyio.sleep_forever()
    assert scope.cancelled_caught
    assert handle2.result is not None
    assert handle2.result.status is Status.CANCELLED
    assert tracker2.alive == 0
    assert manager2.statistics().workers == 0


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


@pytest.mark.anyio
async def test_a_manager_closed_without_being_entered_hands_out_dropped_mailboxes() -> None:
    manager = SubagentManager([spec("echo", echo)])
    await manager.aclose()
    assert manager.mailbox("root").closed
