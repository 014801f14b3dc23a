"""Named races: each test builds one interleaving on purpose and would fail on the naive code.

Time is used only where the race is about a deadline; the interleaving itself is built with
events, ``wait_all_tasks_blocked`` and ``pass_time_without_a_checkpoint`` (which lets a
deadline pass while no other task can run, so "at the same instant" is exact, not
probabilistic). Those tests run on asyncio in real time and on trio's mock clock, where the
deadline passes by jumping the clock and takes no wall time.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from subagents import (
    AgentSpec,
    DelegateResult,
    Event,
    Mailbox,
    Request,
    Result,
    RetryPolicy,
    RunContext,
    SpawnRejected,
    Status,
    SubagentManager,
    TransientError,
)
from tests.helpers import clock_backends, on_mock_clock, pass_time_without_a_checkpoint

from .support import completed_events, make_manager, recorded

pytestmark = pytest.mark.anyio


async def _forever(request: Request, ctx: RunContext) -> str:
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


# ---------------------------------------------------------------- result vs wait timeout


@pytest.mark.parametrize("anyio_backend", clock_backends())
@pytest.mark.parametrize("via", ["wait_result", "mailbox"])
async def test_result_landing_as_the_wait_times_out_counts_as_completed(via: str) -> None:
    """The runner returns while the loop is blocked past the waiter's deadline: both the
    deadline and the result are pending when the waiter resumes; the result wins."""
    go = anyio.Event()

    async def late(request: Request, ctx: RunContext) -> str:
        await go.wait()
        pass_time_without_a_checkpoint(0.3)  # the waiter's 0.2 s deadline passes meanwhile
        return "landed"

    got: list[DelegateResult | None] = []
    async with make_manager({"late": late}) as manager:
        handle = manager.spawn("late", timeout=None)

        async def waiter() -> None:
            if via == "wait_result":
                got.append(await manager.wait_result(handle.task_id, timeout=0.2))
            else:
                got.append(await manager.mailbox().wait(handle.task_id, timeout=0.2))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter)
                await anyio.wait_all_tasks_blocked()
                go.set()
    assert got == [handle.result]
    assert got[0] is not None
    assert got[0].status is Status.COMPLETED


@pytest.mark.parametrize("anyio_backend", clock_backends())
@pytest.mark.parametrize("via", ["wait_result", "mailbox"])
async def test_envelope_landing_between_the_timeout_and_the_waiters_wakeup_is_returned(
    via: str,
) -> None:
    """The deadline fires (the waiter is cancelled, not yet resumed), then the envelope lands
    (a queued child is cancelled: its envelope exists at once), then the waiter resumes.
    A wait that returns None must mean the result had not landed when it returned; the
    naive ``if scope.cancelled_caught: return None`` breaks that. On asyncio this order is
    exact; trio shuffles its run queue, so the round is repeated and the invariant is
    checked whichever order each round took."""
    async with make_manager({"forever": _forever}, limit=1) as manager:
        manager.spawn("forever", timeout=None)  # holds the only slot
        returned_envelope = 0
        for _ in range(20):
            queued = manager.spawn("forever", timeout=None)
            seen: list[tuple[DelegateResult | None, DelegateResult | None]] = []

            async def waiter(task_id: str = queued.task_id, seen: list[Any] = seen) -> None:
                if via == "wait_result":
                    got = await manager.wait_result(task_id, timeout=0.01)
                    seen.append((got, manager.result(task_id)))
                else:
                    got = await manager.mailbox().wait(task_id, timeout=0.01)
                    seen.append((got, got or manager.mailbox().peek(task_id)))

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(waiter)
                    await anyio.wait_all_tasks_blocked()
                    pass_time_without_a_checkpoint(0.02)  # the deadline passes, nobody runs
                    await anyio.lowlevel.checkpoint()  # the deadline is processed
                    assert manager.cancel(queued.task_id)  # the envelope lands now
            ((got, present),) = seen
            assert got is present, "the wait returned None although the envelope had landed"
            returned_envelope += got is not None
        assert returned_envelope > 0  # the race happened at least once
        assert manager.mailbox().statistics().task_subscribers == 0


# ---------------------------------------------------------------- close_session vs admission


async def test_close_session_while_spawns_are_being_admitted() -> None:
    """Spawns whose workers were started but have not run yet are cancelled by the close
    and never run; spawns after the close are rejected; nothing is left behind."""
    ran: list[str] = []

    async def record(request: Request, ctx: RunContext) -> str:
        ran.append(ctx.task_id)
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async with make_manager({"record": record}, limit=8) as manager:
        with recorded(manager) as events:
            handles = [manager.spawn("record", session_id="s", timeout=None) for _ in range(5)]
            # No checkpoint yet: worker tasks exist but none has taken its child.
            await manager.close_session("s")
            with pytest.raises(SpawnRejected):
                manager.spawn("record", session_id="s")
            await anyio.wait_all_tasks_blocked()
            assert ran == []
            for handle in handles:
                assert handle.result is not None
                assert handle.result.status is Status.CANCELLED, handle.result
                assert len(completed_events(events, handle.task_id)) == 1
            stats = manager.statistics()
            assert (stats.running, stats.queued, stats.workers) == (0, 0, 0), stats


async def test_close_session_while_a_spawner_keeps_admitting() -> None:
    """One task spawns into a session in a loop while another closes it: every accepted
    spawn ends in exactly one envelope, every later spawn is rejected."""
    async with make_manager({"forever": _forever}, limit=2) as manager:
        accepted = []
        rejected = 0
        closed = anyio.Event()
        enough = anyio.Event()

        async def spawner() -> None:
            nonlocal rejected
            while rejected < 3:
                try:
                    accepted.append(manager.spawn("forever", session_id="s", timeout=None))
                    if len(accepted) >= 10:
                        enough.set()
                except SpawnRejected:
                    assert closed.is_set() or manager.session_closed("s")
                    rejected += 1
                await anyio.lowlevel.checkpoint()

        with recorded(manager) as events, anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(spawner)
                await enough.wait()
                await manager.close_session("s")
                closed.set()
        assert len(accepted) >= 10
        for handle in accepted:
            assert handle.result is not None
            assert handle.result.status is Status.CANCELLED
            assert len(completed_events(events, handle.task_id)) == 1
        assert manager.statistics().running == 0


@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_close_child_session_rejects_the_childs_later_spawns() -> None:
    """close_session on a running agent's session (its task id) cancels its children and
    rejects what it spawns or executes afterwards, as for any closed session."""
    closed = anyio.Event()
    outcome: list[str] = []

    async def parent(request: Request, ctx: RunContext) -> str:
        first = ctx.spawn("forever", timeout=None)
        await closed.wait()
        assert first.result is not None
        assert first.result.status is Status.CANCELLED
        try:
            ctx.spawn("forever", timeout=None).cancel()
            outcome.append("spawn accepted")
        except SpawnRejected:
            outcome.append("spawn rejected")
        try:
            await ctx.execute("forever", timeout=0.01)
            outcome.append("execute accepted")
        except SpawnRejected:
            outcome.append("execute rejected")
        return "done"

    async with make_manager({"parent": parent, "forever": _forever}) as manager:
        with anyio.fail_after(10):
            handle = manager.spawn("parent", timeout=None)
            await anyio.wait_all_tasks_blocked()
            await manager.close_session(handle.task_id)
            assert manager.session_closed(handle.task_id)
            closed.set()
            assert (await handle.wait()).status is Status.COMPLETED
    assert outcome == ["spawn rejected", "execute rejected"]


# ---------------------------------------------------------------- cancel vs start


async def test_cancel_from_the_started_event_is_not_lost() -> None:
    """Cancel lands after the child took its slot but before its cancel scope exists."""
    async with make_manager({"forever": _forever}) as manager:
        cancelled: list[bool] = []

        def on_event(event: Event) -> None:
            if event.type == "subagent.started":
                cancelled.append(manager.cancel(event.task_id))

        unsubscribe = manager.events.subscribe(on_event)
        with anyio.fail_after(5):
            handle = manager.spawn("forever", timeout=None)
            envelope = await handle.wait()
            executed = await manager.execute("forever", timeout=None)
        unsubscribe()
    assert cancelled == [True, True]
    for env in (envelope, executed):
        assert env.status is Status.CANCELLED
        assert "cancelled by request" in env.error


async def test_cancel_before_the_runners_first_checkpoint_wins() -> None:
    """A runner that requests its own cancellation, then returns without a checkpoint:
    cancel() said True, so the envelope must say cancelled, not completed."""
    answers: list[bool] = []

    async def quitter(request: Request, ctx: RunContext) -> str:
        answers.append(ctx.manager.cancel(ctx.task_id))
        return "finished anyway"

    async with make_manager({"quitter": quitter}) as manager:
        with anyio.fail_after(5):
            spawned = await manager.spawn("quitter").wait()
            executed = await manager.execute("quitter")
    assert answers == [True, True]
    assert spawned.status is Status.CANCELLED
    assert executed.status is Status.CANCELLED


async def test_cancel_from_the_spawned_event_keeps_the_queue_accounting() -> None:
    """A cancel inside ``subagent.spawned`` hits a child not yet in the queue."""
    async with make_manager({"quick": _quick}, limit=1) as manager:
        victim: list[str] = []

        def on_event(event: Event) -> None:
            if event.type == "subagent.spawned" and not victim:
                victim.append(event.task_id)
                assert manager.cancel(event.task_id)

        unsubscribe = manager.events.subscribe(on_event)
        first = manager.spawn("quick")
        others = [manager.spawn("quick") for _ in range(3)]
        unsubscribe()
        with anyio.fail_after(5):
            assert (await first.wait()).status is Status.CANCELLED
            for handle in others:
                assert (await handle.wait()).status is Status.COMPLETED
        await anyio.wait_all_tasks_blocked()
        stats = manager.statistics()
        assert (stats.queued, stats.running, stats.workers) == (0, 0, 0), stats
        assert stats.spawned == stats.settled == 4


async def _quick(request: Request, ctx: RunContext) -> str:
    await anyio.lowlevel.checkpoint()
    return "quick"


# ---------------------------------------------------------------- watchdog vs success


@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_watchdog_firing_while_the_runner_returns_a_success_stays_timeout() -> None:
    """The deadline passes inside a stretch with no checkpoint (or a shielded one) and the
    runner then returns a success: the verdict is timeout, with exactly one envelope."""

    async def blocking(request: Request, ctx: RunContext) -> str:
        pass_time_without_a_checkpoint(0.12)  # no checkpoint while the deadline passes
        return "too late"

    async def shielded(request: Request, ctx: RunContext) -> Result:
        with anyio.CancelScope(shield=True):
            await anyio.sleep(0.12)
        return Result(output="too late")

    runners = {"blocking": blocking, "shielded": shielded}
    async with make_manager(runners) as manager:
        with recorded(manager) as events, anyio.fail_after(10):
            envs = [await manager.spawn(name, timeout=0.05).wait() for name in runners]
            envs += [await manager.execute(name, timeout=0.05) for name in runners]
    for env in envs:
        assert env.status is Status.TIMEOUT, env
        assert env.error_type == "timeout"
        assert len(completed_events(events, env.task_id)) == 1


@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_success_returned_before_the_deadline_stays_completed() -> None:
    """The converse: a runner that returned in time stays completed even when settling its
    children (which ignore cancellation for a while) runs past its deadline."""
    deadline: list[float | None] = []
    settled_at: list[float] = []

    async def stubborn(request: Request, ctx: RunContext) -> str:
        with anyio.CancelScope(shield=True):
            await anyio.sleep(0.4)
        settled_at.append(anyio.current_time())
        return "stubborn"

    async def parent(request: Request, ctx: RunContext) -> str:
        deadline.append(ctx.deadline)
        ctx.spawn("stubborn", timeout=None)
        await anyio.wait_all_tasks_blocked()  # the child is inside its shielded sleep
        return "in time"

    async with make_manager({"parent": parent, "stubborn": stubborn}) as manager:
        with anyio.fail_after(10):
            env = await manager.spawn("parent", timeout=0.2).wait()
    assert env.status is Status.COMPLETED
    assert env.output == "in time"
    (parent_deadline,) = deadline
    assert parent_deadline is not None
    assert settled_at[0] > parent_deadline  # it did settle past the deadline


# ---------------------------------------------------------------- mailbox subscribers


def test_subscriber_that_raises_breaks_nothing(caplog: pytest.LogCaptureFixture) -> None:
    mailbox = Mailbox()
    fired: list[str] = []

    def boom() -> None:
        fired.append("boom")
        raise RuntimeError("subscriber bug")

    mailbox.subscribe_once("t1", boom)
    mailbox.subscribe_once("t1", lambda: fired.append("once"))
    mailbox.subscribe_all(boom)
    mailbox.subscribe_all(lambda: fired.append("all"))
    env = _env("t1")
    with caplog.at_level(logging.ERROR, logger="subagents.mailbox"):
        assert mailbox.put("t1", env) is True
    assert fired == ["boom", "once", "boom", "all"]
    assert mailbox.peek("t1") is env
    assert mailbox.statistics().task_subscribers == 0
    assert sum("subscriber bug" in r.getMessage() or r.exc_info is not None for r in caplog.records)


def test_subscriber_that_reenters_the_mailbox() -> None:
    """Callbacks that drain, put, subscribe and drop from inside ``put``."""
    mailbox = Mailbox(capacity=2)
    drained: list[DelegateResult | None] = []
    mailbox.subscribe_once("t1", lambda: drained.append(mailbox.drain("t1")))
    mailbox.subscribe_once(
        "t1", lambda: mailbox.subscribe_once("t1", lambda: drained.append(mailbox.drain("t1")))
    )
    first = _env("t1")
    assert mailbox.put("t1", first)
    assert drained == [first]  # consumed once, by the first callback; never twice
    assert len(mailbox) == 0
    assert mailbox.statistics().task_subscribers == 1  # the one re-registered inside

    chained: list[str] = []

    def chain() -> None:
        if "t3" not in chained:
            chained.append("t3")
            mailbox.put("t3", _env("t3"))  # re-entrant put of another key

    sub = mailbox.subscribe_all(chain)
    assert mailbox.put("t2", _env("t2"))
    assert len(mailbox) == 2
    assert mailbox.peek("t3") is not None
    mailbox.unsubscribe(sub)
    mailbox.subscribe_all(mailbox.drop)  # drop from inside a put (an overwrite of t2)
    assert mailbox.put("t2", _env("t2")) is True
    assert mailbox.closed
    assert len(mailbox) == 0
    stats = mailbox.statistics()
    assert (stats.task_subscribers, stats.all_subscribers) == (0, 0)
    assert drained == [first, None]  # drop woke the re-registered subscriber; nothing left


@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_wait_with_a_draining_subscriber_times_out_cleanly() -> None:
    """A subscriber consumes the entry a blocked ``wait`` was woken for: the waiter goes
    back to waiting, times out with None and leaves no registration behind."""
    mailbox = Mailbox()
    mailbox.subscribe_all(lambda: mailbox.drain("t1"))
    got: list[DelegateResult | None] = []

    async def waiter() -> None:
        got.append(await mailbox.wait("t1", timeout=0.05))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            mailbox.put("t1", _env("t1"))
    assert got == [None]
    assert mailbox.statistics().task_subscribers == 0


async def test_raising_and_reentrant_subscribers_inside_the_manager() -> None:
    """Subscribers on the session mailbox and the event bus that raise, drain, spawn and
    cancel while a child is being finalized: every envelope is still recorded, delivered
    once and obtainable with wait_result."""
    async with make_manager({"quick": _quick, "forever": _forever}, limit=4) as manager:
        mailbox = manager.mailbox("s")
        stolen: list[DelegateResult] = []
        spawned_more: list[str] = []

        def steal() -> None:
            stolen.extend(mailbox.drain_all())

        def boom() -> None:
            raise RuntimeError("mailbox subscriber bug")

        mailbox.subscribe_all(boom)
        mailbox.subscribe_all(steal)
        victim = manager.spawn("forever", session_id="s", timeout=None)

        def on_event(event: Event) -> None:
            if event.type != "subagent.completed":
                return
            if event.task_id != victim.task_id and not spawned_more:
                spawned_more.append(manager.spawn("quick", session_id="s").task_id)
                manager.cancel(victim.task_id)  # re-entrant finalization of another child
            raise RuntimeError("event subscriber bug")

        with recorded(manager) as events:
            unsubscribe = manager.events.subscribe(on_event)
            with anyio.fail_after(5):
                first = manager.spawn("quick", session_id="s")
                await first.wait()
                await victim.wait()
                await manager.handle(spawned_more[0]).wait()
            unsubscribe()
        ids = [first.task_id, victim.task_id, spawned_more[0]]
        for task_id in ids:
            env = await manager.wait_result(task_id, timeout=0)
            assert env is not None
            assert env is manager.result(task_id)
            assert len(completed_events(events, task_id)) == 1
        assert sorted(e.task_id for e in stolen) == sorted(ids)
        assert manager.result(victim.task_id).status is Status.CANCELLED  # type: ignore[union-attr]


# ---------------------------------------------------------------- mailbox at capacity


async def test_mailbox_at_capacity_when_many_children_finish_together() -> None:
    release = anyio.Event()

    async def together(request: Request, ctx: RunContext) -> str:
        await release.wait()
        return f"out {request.input}"

    async with make_manager({"together": together}, limit=8, mailbox_capacity=3) as manager:
        with recorded(manager) as events:
            handles = [manager.spawn("together", str(i)) for i in range(8)]
            await anyio.wait_all_tasks_blocked()
            assert manager.statistics().running == 8
            release.set()
            with anyio.fail_after(5):
                for handle in handles:
                    await handle.done.wait()
        mailbox = manager.mailbox()
        assert len(mailbox) == 3
        for i, handle in enumerate(handles):
            env = manager.result(handle.task_id)
            assert env is not None
            assert env.output == f"out {i}"
            assert len(completed_events(events, handle.task_id)) == 1
            assert await manager.wait_result(handle.task_id, timeout=0) is env
        assert len(mailbox) == 0
        # The mailbox works again once drained.
        again = manager.spawn("together", "again")
        with anyio.fail_after(5):
            await again.done.wait()
        assert mailbox.drain(again.task_id) is again.result


# ---------------------------------------------------------------- sibling isolation


@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_failing_and_hanging_siblings_never_cancel_or_delay_the_others(
    anyio_backend: object,
) -> None:
    async def boom(request: Request, ctx: RunContext) -> str:
        raise RuntimeError("sibling failed")

    async def garbage(request: Request, ctx: RunContext) -> str:
        return 42  # type: ignore[return-value]

    runners = {"boom": boom, "garbage": garbage, "forever": _forever, "quick": _quick}
    async with make_manager(runners, limit=8) as manager:
        hanger = manager.spawn("forever", session_id="s", timeout=None)
        slow = manager.spawn("forever", session_id="s", timeout=30)  # hangs past nothing yet
        bad = [manager.spawn(n, session_id="s") for n in ("boom", "garbage")]
        good = [manager.spawn("quick", str(i), session_id="s") for i in range(4)]
        started = anyio.current_time()
        with anyio.fail_after(5):
            for handle in good:
                env = await manager.wait_result(handle.task_id, timeout=5)
                assert env is not None
                assert env.status is Status.COMPLETED
            for handle in bad:
                env = await manager.wait_result(handle.task_id, timeout=5)
                assert env is not None
                assert env.status is Status.ERROR
        if on_mock_clock(anyio_backend):
            assert anyio.current_time() == started  # nobody waited for any deadline
        assert hanger.state == "running"
        assert slow.state == "running"
        hanger.cancel()
        slow.cancel()


def _env(task_id: str) -> DelegateResult:
    return DelegateResult(agent="a", task_id=task_id, status=Status.COMPLETED, output=task_id)


# ---------------------------------------------------------------- limiter resizes


async def test_limiter_resizes_admit_at_once_and_never_overshoot() -> None:
    """Raising the limit starts queued children without waiting for a spawn; lowering it
    lets running children finish and admits nobody until running is below the new limit."""
    release = anyio.Event()
    running = 0
    peak_after_lowering = 0
    lowered = False

    async def held(request: Request, ctx: RunContext) -> str:
        nonlocal running, peak_after_lowering
        running += 1
        if lowered:
            peak_after_lowering = max(peak_after_lowering, running)
        await release.wait()
        running -= 1
        return "held"

    async with make_manager({"held": held}, limit=1) as manager:
        handles = [manager.spawn("held") for _ in range(8)]
        await anyio.wait_all_tasks_blocked()
        assert manager.statistics().running == 1
        manager.set_max_concurrent_spawns(5)
        await anyio.wait_all_tasks_blocked()
        assert manager.statistics().running == 5, manager.statistics()
        lowered = True
        manager.set_max_concurrent_spawns(2)
        release.set()
        with anyio.fail_after(5):
            for handle in handles:
                assert (await handle.wait()).status is Status.COMPLETED
        stats = manager.statistics()
        assert stats.high_water == 5
        assert peak_after_lowering <= 2


# ---------------------------------------------------------------- bounded settling


@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_close_session_is_bounded_by_settle_timeout_for_a_stubborn_child(
    anyio_backend: object,
) -> None:
    """A child that ignores cancellation for a while does not hold close_session past
    ``settle_timeout``; it still ends in exactly one (cancelled) envelope when it stops."""

    async def stubborn(request: Request, ctx: RunContext) -> str:
        with anyio.CancelScope(shield=True):
            await anyio.sleep(0.5)
        return "finished late"

    async with make_manager({"stubborn": stubborn}, settle_timeout=0.05) as manager:
        with recorded(manager) as events:
            handle = manager.spawn("stubborn", session_id="s", timeout=None)
            await anyio.wait_all_tasks_blocked()
            started = anyio.current_time()
            await manager.close_session("s")
            if on_mock_clock(anyio_backend):
                assert anyio.current_time() - started == pytest.approx(0.05)  # settle_timeout
            assert handle.result is None  # close returned while the child still runs
            with anyio.fail_after(5):
                env = await handle.wait()
        assert env.status is Status.CANCELLED
        assert len(completed_events(events, handle.task_id)) == 1


async def test_cancelled_execute_caller_still_records_one_envelope() -> None:
    """The caller of execute() is cancelled: the child is cancelled, its envelope recorded
    and published once, and the caller's cancellation goes on (caught by its own scope)."""
    async with make_manager({"forever": _forever}) as manager:
        with recorded(manager) as events:
            ids: list[str] = []
            manager.events.subscribe(
                lambda e: ids.append(e.task_id) if e.type == "subagent.spawned" else None
            )

            async def cancel_once_blocked(scope: anyio.CancelScope) -> None:
                await anyio.wait_all_tasks_blocked()
                scope.cancel()

            async with anyio.create_task_group() as tg:
                with anyio.CancelScope() as scope:
                    tg.start_soon(cancel_once_blocked, scope)
                    await manager.execute("forever", timeout=None)
            assert scope.cancelled_caught
            (task_id,) = ids
            env = manager.result(task_id)
            assert env is not None
            assert env.status is Status.CANCELLED
            assert len(completed_events(events, task_id)) == 1
            assert manager.statistics().running == 0


# ---------------------------------------------------------------- shutdown under load


async def test_aclose_with_queued_running_nested_and_blocked_waiters() -> None:
    """aclose() while children are queued, running, nested and executing, and waiters are
    blocked: every child ends in one envelope, wait_result waiters get it, mailbox
    waiters are released with None, and later spawns are rejected."""

    async def nested(request: Request, ctx: RunContext) -> str:
        ctx.spawn("forever", timeout=None)
        await ctx.execute("forever", timeout=None)
        return "unreachable"

    waited: list[DelegateResult | None] = []
    mailbox_waited: list[DelegateResult | None] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:  # the waiters outlive the manager
            manager = make_manager({"forever": _forever, "nested": nested}, limit=3)
            async with manager:
                with recorded(manager) as events:
                    handles = [manager.spawn("nested") for _ in range(2)]
                    handles += [manager.spawn("forever", session_id="s") for _ in range(6)]

                    async def wait_one(task_id: str) -> None:
                        waited.append(await manager.wait_result(task_id))

                    async def wait_mailbox(task_id: str) -> None:
                        mailbox_waited.append(await manager.mailbox("s").wait(task_id))

                    for handle in handles:
                        tg.start_soon(wait_one, handle.task_id)
                    tg.start_soon(wait_mailbox, "no-such-task")
                    await anyio.wait_all_tasks_blocked()
                    assert manager.statistics().running == 3
                    await manager.aclose()
    with pytest.raises(SpawnRejected):
        manager.spawn("forever")
    spawned = {e.task_id for e in events if e.type == "subagent.spawned"}
    assert len(spawned) == 8 + 2 * 2  # each nested parent added two children
    for task_id in spawned:
        env = manager.result(task_id)
        assert env is not None
        assert env.status is Status.CANCELLED
        assert len(completed_events(events, task_id)) == 1
    assert sorted(id(e) for e in waited) == sorted(id(h.result) for h in handles)
    assert mailbox_waited == [None]
    stats = manager.statistics()
    assert (stats.running, stats.queued, stats.workers) == (0, 0, 0), stats


# ---------------------------------------------------------------- retries


@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_retries_under_warnings_as_errors_cancel_and_watchdog(
    anyio_backend: object,
) -> None:
    """Transient failures are retried (no library warning escapes under -W error); a cancel
    during a backoff ends the child at once; a backoff never outlives the watchdog."""
    attempts: list[int] = []

    async def flaky(request: Request, ctx: RunContext) -> str:
        attempts.append(ctx.attempt)
        if request.input == "once" and ctx.attempt == 1:
            raise TransientError("try again")
        if request.input == "once":
            return "second time lucky"
        raise TransientError("never works")

    quick = RetryPolicy(attempts=3, initial=0.001, maximum=0.002, jitter=0.0)
    slow = RetryPolicy(attempts=3, initial=30.0, maximum=30.0, jitter=0.0)
    specs = [
        AgentSpec(name="quick", description="q", runner=flaky, retry=quick),
        AgentSpec(name="slow", description="s", runner=flaky, retry=slow),
    ]
    async with SubagentManager(specs) as manager:
        with anyio.fail_after(10):
            env = await manager.spawn("quick", "once").wait()
            assert env.status is Status.COMPLETED
            assert env.attempts == 2
            env = await manager.spawn("quick", "always").wait()
            assert env.status is Status.ERROR
            assert env.attempts == 3
            assert env.error_type.endswith("TransientError")
            handle = manager.spawn("slow", "always", timeout=None)
            await anyio.wait_all_tasks_blocked()  # sleeping its 30 s backoff
            assert handle.cancel()
            assert (await handle.wait()).status is Status.CANCELLED
            # A 30 s backoff would pass the 0.2 s watchdog: not slept, the error ends it.
            started = anyio.current_time()
            env = await manager.spawn("slow", "always", timeout=0.2).wait()
            if on_mock_clock(anyio_backend):
                assert anyio.current_time() - started <= 0.2
            assert env.status in (Status.ERROR, Status.TIMEOUT)
