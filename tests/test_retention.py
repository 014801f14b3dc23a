"""Collection marks and the retention policy: ``SpawnHandle.collected`` is set however the
envelope is consumed, ``SubagentConfig.retain_collected`` forgets collected records (and only
collected ones), ``SubagentManager.forget`` removes one on request."""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Awaitable, Callable

import anyio
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from subagents import (
    ConfigError,
    DelegateResult,
    Mailbox,
    Request,
    RunContext,
    SpawnHandle,
    SpawnRejected,
    Status,
    SubagentConfig,
    SubagentManager,
    UnknownTask,
)
from subagents.tools import Toolset, build_tools
from tests.helpers import echo, has_listing, has_record, manager_with, session_state, spec

pytestmark = pytest.mark.anyio


async def spawn_ended(manager: SubagentManager, n: int, session_id: str = "root") -> list[str]:
    """Spawn ``n`` echo children into ``session_id`` and wait until each has ended."""
    handles = [manager.spawn("echo", f"job {i}", session_id=session_id) for i in range(n)]
    for handle in handles:
        await handle.done.wait()
    return [h.task_id for h in handles]


# ---------------------------------------------------------------- collected, however consumed


async def test_mailbox_drain_marks_collected() -> None:
    async with manager_with(spec("echo", echo)) as manager:
        a, b = await spawn_ended(manager, 2)
        mailbox = manager.mailbox()
        assert mailbox.peek(a) is not None
        assert not manager.handle(a).collected  # peek never consumes
        assert mailbox.drain(a) is not None
        assert manager.handle(a).collected
        assert not manager.handle(b).collected


async def test_mailbox_drain_all_marks_collected() -> None:
    async with manager_with(spec("echo", echo)) as manager:
        ids = await spawn_ended(manager, 3)
        assert len(manager.mailbox().drain_all()) == 3
        assert all(manager.handle(i).collected for i in ids)


async def test_mailbox_wait_marks_collected() -> None:
    gate = anyio.Event()

    async def gated(request: Request, ctx: RunContext) -> str:
        await gate.wait()
        return "late"

    async with manager_with(spec("gated", gated)) as manager:
        handle = manager.spawn("gated")
        async with anyio.create_task_group() as tg:
            got: list[DelegateResult | None] = []

            async def waiter() -> None:
                got.append(await manager.mailbox().wait(handle.task_id))

            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            assert not handle.collected
            gate.set()
        assert got == [handle.result]
        assert handle.collected


async def test_factory_mailbox_gets_the_hook_and_ttl_expiry_does_not_collect() -> None:
    now = [0.0]
    built: list[Mailbox] = []

    def factory(session_id: str) -> Mailbox:
        built.append(Mailbox(capacity=8, ttl=1.0, clock=lambda: now[0]))
        return built[-1]

    manager = SubagentManager([spec("echo", echo)], mailbox_factory=factory)
    async with manager:
        a, b = await spawn_ended(manager, 2)
        assert built[0].consumed is not None
        now[0] = 5.0  # both entries expire unread
        assert built[0].drain(a) is None
        assert built[0].drain_all() == []
        assert not manager.handle(a).collected
        assert not manager.handle(b).collected


async def test_a_raising_hook_never_loses_the_envelope(caplog: pytest.LogCaptureFixture) -> None:
    box = Mailbox()
    seen: list[str] = []

    def hook(envelope: DelegateResult) -> None:
        seen.append(envelope.task_id)
        raise RuntimeError("boom")

    box.consumed = hook
    for key in ("a", "b", "c"):
        box.put(key, DelegateResult(agent="w", task_id=key, status=Status.COMPLETED))
    with caplog.at_level(logging.ERROR, logger="subagents.mailbox"):
        first = box.drain("a")
        rest = box.drain_all()
    assert first is not None
    assert first.task_id == "a"
    assert [e.task_id for e in rest] == ["b", "c"]
    assert seen == ["a", "b", "c"]
    assert "consumed hook" in caplog.text


# ---------------------------------------------------------------- the setting


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True])
def test_retain_collected_is_validated(bad: object) -> None:
    with pytest.raises(ConfigError) as info:
        SubagentConfig(retain_collected=bad)  # type: ignore[arg-type]
    assert info.value.field == "retain_collected"
    assert "an integer >= 0 or None" in str(info.value)


def test_retain_collected_accepts_none_and_counts() -> None:
    assert SubagentConfig().retain_collected is None
    assert SubagentConfig(retain_collected=0).retain_collected == 0
    assert SubagentConfig(retain_collected=5).retain_collected == 5


async def test_by_default_every_record_is_kept() -> None:
    async with manager_with(spec("echo", echo)) as manager:
        ids = await spawn_ended(manager, 3)
        manager.mailbox().drain_all()
        await manager.wait_result(ids[0])
        assert [h.task_id for h in manager.tasks()] == ids
        assert all(manager.result(i) is not None for i in ids)


async def test_wait_result_consumes_and_a_second_call_returns_it_again() -> None:
    async with manager_with(spec("echo", echo)) as m:
        h = m.spawn("echo", "x")
        env = await m.wait_result(h.task_id, timeout=5)
        assert env is not None
        assert env.output == "x"
        assert m.mailbox("root").peek(h.task_id) is None
        assert h.collected
        again = await m.wait_result(h.task_id, timeout=5)
        assert again == env
        assert m.result(h.task_id) == env


# ---------------------------------------------------------------- retain 0: gone once collected


async def _by_wait_result(manager: SubagentManager, task_id: str) -> None:
    assert await manager.wait_result(task_id) is not None


async def _by_drain(manager: SubagentManager, task_id: str) -> None:
    assert manager.mailbox().drain(task_id) is not None


async def _by_drain_all(manager: SubagentManager, task_id: str) -> None:
    assert [e.task_id for e in manager.mailbox().drain_all()] == [task_id]


async def _by_mailbox_wait(manager: SubagentManager, task_id: str) -> None:
    assert await manager.mailbox().wait(task_id) is not None


async def _by_wait_agent(manager: SubagentManager, task_id: str) -> None:
    result = await build_tools(manager, "root").call("wait_agent", {"task_ids": [task_id]})
    assert not result.is_error, result.content
    assert result.details["completed"] is True


async def _by_collect(manager: SubagentManager, task_id: str) -> None:
    assert manager.collect(manager.handle(task_id)) is not None


COLLECTORS: dict[str, Callable[[SubagentManager, str], Awaitable[None]]] = {
    "wait_result": _by_wait_result,
    "drain": _by_drain,
    "drain_all": _by_drain_all,
    "Mailbox.wait": _by_mailbox_wait,
    "wait_agent": _by_wait_agent,
    "collect": _by_collect,
}


@pytest.mark.parametrize("how", list(COLLECTORS))
async def test_retain_zero_forgets_exactly_after_collection(how: str) -> None:
    async with manager_with(spec("echo", echo), retain_collected=0) as manager:
        (task_id,) = await spawn_ended(manager, 1)
        handle = manager.handle(task_id)
        assert manager.result(task_id) is handle.result  # ended, not collected: kept
        assert manager.tasks() == [handle]
        await COLLECTORS[how](manager, task_id)
        assert handle.collected
        assert manager.tasks() == []
        with pytest.raises(UnknownTask) as info:
            manager.result(task_id)
        assert "retain_collected=0" in str(info.value)
        assert handle.result is not None  # the caller's handle still reads it
        assert not has_record(manager, handle)


async def test_retain_zero_forgets_an_execute_once_it_returns() -> None:
    seen: list[str] = []

    async def peek(request: Request, ctx: RunContext) -> str:
        seen.append(ctx.task_id)
        # Not collected while it runs: a caller cancelled now would never get the envelope.
        assert not ctx.manager.handle(ctx.task_id).collected
        return "done"

    async with manager_with(spec("peek", peek), retain_collected=0) as manager:
        envelope = await manager.execute("peek")
        assert envelope.output == "done"
        assert seen == [envelope.task_id]
        assert manager.tasks() == []
        with pytest.raises(UnknownTask):
            manager.handle(envelope.task_id)


async def test_wait_agent_reports_a_forgotten_id_as_unknown_with_the_reason() -> None:
    async with manager_with(spec("echo", echo), retain_collected=0) as manager:
        tools = build_tools(manager, "root")
        (task_id,) = await spawn_ended(manager, 1)
        first = await tools.call("wait_agent", {"task_ids": [task_id]})
        assert not first.is_error
        again = await tools.call("wait_agent", {"task_ids": [task_id]})
        assert again.is_error
        assert again.details["error"] == "unknown_task"
        assert "retain_collected=0" in again.content


# ---------------------------------------------------------------- retain N


async def test_retain_n_keeps_the_n_latest_collected() -> None:
    async with manager_with(spec("echo", echo), retain_collected=2) as manager:
        ids = await spawn_ended(manager, 5)
        # collect in the order 3, 0, 4, 1: the last two collected (4 and 1) stay
        for i in (3, 0, 4, 1):
            await manager.wait_result(ids[i])
        kept = [h.task_id for h in manager.tasks()]
        assert kept == [ids[1], ids[2], ids[4]]  # 2 never collected: always kept
        assert not manager.handle(ids[2]).collected
        for i in (0, 3):
            with pytest.raises(UnknownTask):
                manager.result(ids[i])
        # collecting again changes nothing: a record is counted once, when collected
        assert await manager.wait_result(ids[4]) is not None
        assert [h.task_id for h in manager.tasks()] == kept


async def test_forgetting_an_uncollected_record_is_not_a_collection() -> None:
    async with manager_with(spec("echo", echo), retain_collected=1) as manager:
        a, b = await spawn_ended(manager, 2)
        await manager.wait_result(a)
        assert manager.forget(b) is not None  # drains b's entry: not counted as collected
        assert [h.task_id for h in manager.tasks()] == [a]


# ---------------------------------------------------------------- never an uncollected record


async def test_uncollected_records_survive_retain_zero_and_a_full_mailbox() -> None:
    async with manager_with(spec("echo", echo), retain_collected=0, mailbox_capacity=1) as manager:
        ids = await spawn_ended(manager, 4)  # only the first fits the mailbox
        box = manager.mailbox()
        assert len(box) == 1
        assert [e.task_id for e in box.drain_all()] == [ids[0]]
        with pytest.raises(UnknownTask):
            manager.result(ids[0])
        # the record of last resort: each overflowed envelope is still there
        for task_id in ids[1:]:
            envelope = manager.result(task_id)
            assert envelope is not None
            assert envelope.status is Status.COMPLETED
        assert [h.task_id for h in manager.tasks()] == ids[1:]
        assert await manager.wait_result(ids[2]) is not None
        assert [h.task_id for h in manager.tasks()] == [ids[1], ids[3]]


async def test_running_children_are_never_forgotten() -> None:
    gate = anyio.Event()

    async def gated(request: Request, ctx: RunContext) -> str:
        await gate.wait()
        return "late"

    async with manager_with(
        spec("gated", gated), spec("echo", echo), retain_collected=0
    ) as manager:
        slow = manager.spawn("gated")
        (fast,) = await spawn_ended(manager, 1)
        manager.mailbox().drain_all()
        assert manager.tasks() == [slow]
        assert manager.forget(slow.task_id) is None  # not ended: nothing forgotten
        assert manager.tasks() == [slow]
        assert manager.result(slow.task_id) is None
        gate.set()
        await slow.done.wait()
        assert manager.tasks() == [slow]  # ended, not collected
        with pytest.raises(UnknownTask):
            manager.result(fast)


class FlakyMailbox(Mailbox):
    """Its next ``drain`` raises (a durable backend that failed), once per ``fail``."""

    fail = 0

    def drain(self, task_id: str) -> DelegateResult | None:
        if self.fail:
            self.fail -= 1
            raise OSError("backend down")
        return super().drain(task_id)


async def test_a_failed_collection_forgets_nothing() -> None:
    boxes: list[FlakyMailbox] = []

    def factory(session_id: str) -> FlakyMailbox:
        boxes.append(FlakyMailbox())
        return boxes[-1]

    manager = SubagentManager(
        [spec("echo", echo)],
        config=SubagentConfig(retain_collected=0),
        mailbox_factory=factory,
    )
    async with manager:
        a, b = await spawn_ended(manager, 2)
        boxes[0].fail = 2
        with pytest.raises(OSError, match="backend down"):
            await manager.wait_result(a)
        with pytest.raises(OSError, match="backend down"):
            manager.forget(b)
        for task_id in (a, b):
            assert not manager.handle(task_id).collected
            assert manager.result(task_id) is not None
        assert await manager.wait_result(a) is not None  # the retry collects, then forgets
        assert manager.forget(b) is not None
        assert manager.tasks() == []
        assert len(boxes[0]) == 0


# ---------------------------------------------------------------- forget()


async def test_forget_consumes_the_mailbox_entry_and_returns_the_envelope() -> None:
    async with manager_with(spec("echo", echo)) as manager:
        a, b = await spawn_ended(manager, 2)
        handle = manager.handle(a)
        box = manager.mailbox()
        assert len(box) == 2
        envelope = manager.forget(a)
        assert envelope is handle.result
        assert handle.collected
        assert len(box) == 1
        assert box.peek(a) is None
        assert [h.task_id for h in manager.tasks()] == [b]
        with pytest.raises(UnknownTask) as info:
            manager.result(a)
        assert "forget" in str(info.value)
        with pytest.raises(UnknownTask):
            manager.forget(a)  # once only


async def test_forget_an_unknown_id_raises() -> None:
    async with manager_with(spec("echo", echo)) as manager:
        with pytest.raises(UnknownTask) as info:
            manager.forget("nope")
        assert "forget" not in str(info.value)  # nothing forgotten yet: no such hint


async def test_tasks_keep_spawn_order_after_removals() -> None:
    async with manager_with(spec("echo", echo)) as manager:
        ids = await spawn_ended(manager, 6)
        for i in (0, 3, 5):
            manager.forget(ids[i])
        more = await spawn_ended(manager, 2)
        assert [h.task_id for h in manager.tasks()] == [ids[1], ids[2], ids[4], *more]
        assert manager.handle(ids[2]).task_id == ids[2]


async def test_a_leaked_context_of_a_forgotten_child_cannot_delegate() -> None:
    leaked: list[RunContext] = []

    async def leaker(request: Request, ctx: RunContext) -> str:
        leaked.append(ctx)
        return "bye"

    async with manager_with(spec("leaker", leaker), spec("echo", echo)) as manager:
        handle = manager.spawn("leaker")
        await handle.done.wait()
        manager.forget(handle.task_id)
        ctx = leaked[0]
        with pytest.raises(SpawnRejected) as info:
            ctx.spawn("echo")
        assert info.value.reason == "session_closed"
        with pytest.raises(SpawnRejected) as info:
            await ctx.execute("echo")
        assert info.value.reason == "session_closed"
        assert ctx.mailbox.closed
        assert session_state(manager, handle.task_id) == []
        assert manager.tasks(handle.task_id) == []
        assert [h.task_id for h in manager.tasks()] == []


async def test_the_tools_of_a_forgotten_child_cannot_delegate() -> None:
    """A child's tools (``build_tools(manager, ctx.session_id)``) used after the child has
    ended refuse to spawn or delegate, also once retention forgot its record: its id must
    not read as a fresh root session (a child at ``/root`` with the root's permissions)."""
    kept: list[Toolset] = []

    async def parent(request: Request, ctx: RunContext) -> str:
        kept.append(build_tools(ctx.manager, ctx.session_id))
        return "done"

    async with manager_with(spec("p", parent), spec("e", echo), retain_collected=0) as manager:
        with anyio.fail_after(5):
            child = manager.spawn("p")
            await manager.wait_result(child.task_id)
            assert not has_record(manager, child)  # forgotten
            (tools,) = kept
            for tool in ("spawn_agent", "delegate_to_agent"):
                answer = await tools.call(tool, {"agent": "e", "input": "hi"})
                assert answer.is_error, answer
                assert answer.details["reason"] == "session_closed"
            assert manager.tasks(child.task_id) == []
            assert manager.statistics().spawned == 1


async def test_a_forgotten_parent_takes_its_ended_uncollected_children_with_it() -> None:
    async def parent(request: Request, ctx: RunContext) -> str:
        ctx.spawn("gated")  # never collected: cancelled when the parent ends
        await anyio.wait_all_tasks_blocked()
        return "parent done"

    async def gated(request: Request, ctx: RunContext) -> str:
        await anyio.sleep_forever()
        return "never"

    async with manager_with(
        spec("parent", parent), spec("gated", gated), retain_collected=0
    ) as manager:
        top = manager.spawn("parent")
        assert await manager.wait_result(top.task_id) is not None
        with pytest.raises(UnknownTask):
            manager.handle(top.task_id)
        # Its ended child went with it, though nobody collected it: its session is over.
        assert manager.tasks(top.task_id) == []
        assert not has_listing(manager, top.task_id)
        assert not manager.session_closed(top.task_id)  # nothing of it is remembered
        assert manager.tasks() == []


async def test_a_closed_root_session_drops_its_listing_once_empty() -> None:
    async with manager_with(spec("echo", echo), retain_collected=0) as manager:
        (task_id,) = await spawn_ended(manager, 1, session_id="s")
        await manager.close_session("s")
        assert has_listing(manager, "s")  # its child is not collected yet
        assert manager.forget(task_id) is not None
        assert not has_listing(manager, "s")
        assert manager.session_closed("s")  # remembered among the recently closed
        assert manager.tasks("s") == []


# ---------------------------------------------------------------- memory


async def test_retain_zero_holds_no_handle_after_many_drained_children() -> None:
    async with manager_with(
        spec("echo", echo), retain_collected=0, max_concurrent_spawns=64, mailbox_capacity=4096
    ) as manager:
        box = manager.mailbox()
        spawned: set[str] = set()
        for _ in range(4):
            handles = [manager.spawn("echo", "x") for _ in range(500)]
            spawned.update(h.task_id for h in handles)
            await handles[-1].done.wait()
            for handle in handles:
                await handle.done.wait()
            del handle, handles
            box.drain_all()
        await anyio.wait_all_tasks_blocked()  # workers gone (one lives on a context copy)
        assert manager.tasks() == []
        assert manager.statistics().settled == 2000
        gc.collect()
        left = [o for o in gc.get_objects() if isinstance(o, SpawnHandle) and o.task_id in spawned]
        assert left == []  # no record, retained one or cache still holds a handle


async def test_a_worker_started_inside_a_child_does_not_pin_that_child() -> None:
    """A spawn from inside a runner can start a worker, which copies the runner's context
    (its slot owner, the runner's handle). That worker lives on with other children; the
    runner's record, once collected and forgotten, must not stay reachable through it."""
    release = anyio.Event()
    started = anyio.Event()

    async def hold(request: Request, ctx: RunContext) -> str:
        started.set()
        await release.wait()
        return "held"

    async def starter(request: Request, ctx: RunContext) -> str:
        ctx.manager.spawn("hold")  # a root-session child: outlives this one
        await started.wait()
        return "ok"

    async with manager_with(
        spec("hold", hold), spec("starter", starter), retain_collected=0, max_concurrent_spawns=2
    ) as manager:
        task_id = manager.spawn("starter").task_id
        assert (await manager.wait_result(task_id)) is not None
        await anyio.wait_all_tasks_blocked()  # the starter's own worker has left
        with pytest.raises(UnknownTask):  # forgotten
            manager.handle(task_id)
        gc.collect()
        alive = [o for o in gc.get_objects() if isinstance(o, SpawnHandle) and o.task_id == task_id]
        release.set()
    assert alive == []


async def test_an_execute_whose_caller_was_cancelled_keeps_its_record() -> None:
    """retain_collected=0 forgets what its caller received; a cancelled caller of execute()
    received nothing, so that envelope stays obtainable."""
    started = anyio.Event()

    async def slow(request: Request, ctx: RunContext) -> str:
        started.set()
        await anyio.sleep_forever()
        return "never"

    async with manager_with(spec("slow", slow), retain_collected=0) as manager:
        async with anyio.create_task_group() as tg:

            async def delegate() -> None:
                await manager.execute("slow")

            tg.start_soon(delegate)
            await started.wait()
            tg.cancel_scope.cancel()
        (handle,) = manager.tasks()
        envelope = manager.result(handle.task_id)
        assert envelope is not None
        assert envelope.status is Status.CANCELLED


# ---------------------------------------------------------------- a property over any sequence

OPS = st.lists(
    st.tuples(
        st.sampled_from(
            # weights: spawn 2, finish 3, drain 2, the rest 1
            [
                "spawn",
                "spawn",
                "finish",
                "finish",
                "finish",
                "wait_result",
                "drain",
                "drain",
                "drain_all",
                "forget",
            ]
        ),
        st.integers(min_value=0, max_value=30),
    ),
    max_size=40,
)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(max_examples=100, deadline=None)
@given(retain=st.sampled_from([None, 0, 1, 3]), ops=OPS)
# Forgetting the newest collected record does not bring back the one it pushed out.
@example(
    retain=1,
    ops=[("spawn", 0)] * 3 + [("finish", 0), ("finish", 1), ("drain_all", 0), ("forget", 1)],
)
def test_records_follow_the_model(
    backend: str, retain: int | None, ops: list[tuple[str, int]]
) -> None:
    """Any sequence of spawn, finish, collect and forget: the manager keeps exactly the
    records the rule says (uncollected always; collected only among the ``retain`` latest
    collections; forgotten never), in spawn order, each with its envelope."""
    anyio.run(_run_model, retain, ops, backend=backend)


async def _run_model(retain: int | None, ops: list[tuple[str, int]]) -> None:
    gates: dict[str, anyio.Event] = {}

    async def gated(request: Request, ctx: RunContext) -> str:
        await gates[request.input].wait()
        return request.input

    handles: list[SpawnHandle] = []
    collected: list[str] = []  # the collection order
    window: list[str] = []  # the collected records still kept, oldest first
    evicted: set[str] = set()  # pushed out of the window by a later collection
    forgotten: set[str] = set()  # by forget()

    def kept(h: SpawnHandle) -> bool:
        return h.task_id not in forgotten and h.task_id not in evicted

    def note_collected(task_id: str) -> None:
        if task_id in collected or task_id in forgotten:
            return
        collected.append(task_id)
        window.append(task_id)
        # The window holds the latest ``retain`` collected records still kept: one pushed
        # out is gone for good, even if a later forget() makes room again.
        while retain is not None and len(window) > retain:
            evicted.add(window.pop(0))

    def note_forgotten(task_id: str) -> None:
        forgotten.add(task_id)
        if task_id in window:
            window.remove(task_id)

    async with manager_with(
        spec("gated", gated), retain_collected=retain, max_concurrent_spawns=64
    ) as manager:
        box = manager.mailbox()
        for op, n in ops:
            target = handles[n % len(handles)] if handles else None
            if op == "spawn" or target is None:
                key = str(len(handles))
                gates[key] = anyio.Event()
                handles.append(manager.spawn("gated", key))
            elif op == "finish":
                gates[target.request.input].set()
                await target.done.wait()
            elif op == "wait_result":
                if not kept(target):
                    with pytest.raises(UnknownTask):
                        await manager.wait_result(target.task_id, timeout=0)
                else:
                    got = await manager.wait_result(target.task_id, timeout=0)
                    assert got is target.result
                    if got is not None:
                        note_collected(target.task_id)
            elif op == "drain":
                got = box.drain(target.task_id)
                fresh = target.result is not None and target.task_id not in collected
                assert got is (target.result if fresh and target.task_id not in forgotten else None)
                if got is not None:
                    note_collected(target.task_id)
            elif op == "drain_all":
                batch = box.drain_all()
                expect = [
                    h.task_id
                    for h in handles
                    if h.result is not None
                    and h.task_id not in collected
                    and h.task_id not in forgotten
                ]
                assert sorted(e.task_id for e in batch) == sorted(expect)
                for envelope in batch:
                    note_collected(envelope.task_id)
            elif op == "forget":
                if not kept(target):
                    with pytest.raises(UnknownTask):
                        manager.forget(target.task_id)
                elif target.result is None:
                    assert manager.forget(target.task_id) is None
                else:
                    assert manager.forget(target.task_id) is target.result
                    note_forgotten(target.task_id)
            expected = [h for h in handles if kept(h)]
            assert manager.tasks() == expected
            assert [h for h in handles if has_record(manager, h)] == expected
            for h in handles:
                if kept(h):
                    assert manager.result(h.task_id) is h.result
                    assert h.collected == (h.task_id in collected)
                else:
                    assert h.collected
                    with pytest.raises(UnknownTask):
                        manager.result(h.task_id)
        for gate in gates.values():
            gate.set()


# ---------------------------------------------------------------- awaiting a handle collects


async def test_awaiting_a_handle_collects_it() -> None:
    async with manager_with(spec("echo", echo)) as manager:
        handle = manager.spawn("echo", "hello")
        envelope = await handle.wait()
        assert handle.collected
        assert manager.mailbox().peek(handle.task_id) is None  # consumed, not delivered twice
        assert await handle.wait() is envelope  # the handle keeps what it returned
        assert manager.result(handle.task_id) is envelope  # the default keeps every record


async def test_retain_zero_keeps_no_record_of_a_batch_awaited_through_its_handles() -> None:
    async with manager_with(spec("echo", echo), retain_collected=0) as manager:
        handles = [manager.spawn("echo", str(i)) for i in range(50)]
        outputs = [(await h.wait()).output for h in handles]
        assert outputs == [str(i) for i in range(50)]
        assert manager.tasks() == []
        assert len(manager.mailbox()) == 0


async def test_an_execute_whose_caller_was_cancelled_is_collected_by_wait_result() -> None:
    entered = anyio.Event()

    async def slow(request: Request, ctx: RunContext) -> str:
        entered.set()
        await anyio.sleep_forever()
        return "never"

    async with manager_with(spec("slow", slow), retain_collected=0) as manager:
        async with anyio.create_task_group() as tg:
            tg.start_soon(manager.execute, "slow")
            await entered.wait()
            tg.cancel_scope.cancel()
        (handle,) = manager.tasks()
        assert not handle.collected  # its caller never got the envelope
        envelope = await manager.wait_result(handle.task_id)
        assert envelope is not None
        assert envelope.status is Status.CANCELLED
        assert manager.tasks() == []  # collected now, so forgotten


# ---------------------------------------------------------------- memory under retain_collected=0


# SUBAGENTS_MEMORY_CYCLES=250000 runs the long version (about 4 minutes a backend).
_MEMORY_CYCLES = int(os.environ.get("SUBAGENTS_MEMORY_CYCLES", "5000"))


async def test_retain_zero_memory_stays_flat_over_many_cycles() -> None:
    """A long-lived manager under ``retain_collected=0``: each cycle spawns a parent that
    leaves a grandchild uncollected, awaits it through its handle, and opens, uses and
    closes a session of its own. Names, closed sessions and orphaned grandchildren must not
    accumulate: growth stays under 10 bytes a cycle once warm."""
    import tracemalloc

    async def parent(request: Request, ctx: RunContext) -> str:
        ctx.spawn("echo", "left behind")
        await anyio.lowlevel.checkpoint()
        return "parent"

    async def cycles(manager: SubagentManager, start: int, count: int) -> None:
        for i in range(start, start + count):
            await manager.spawn("parent").wait()
            session = f"conversation-{i}"
            await manager.spawn("echo", "x", session_id=session).wait()
            await manager.close_session(session)

    logging.disable(logging.WARNING)
    # Traced from the start: what the warm-up allocated and the measured cycles free (the
    # oldest of the recently closed sessions, resized tables) must count as freed.
    tracemalloc.start()
    try:
        async with manager_with(
            spec("echo", echo), spec("parent", parent), retain_collected=0
        ) as manager:
            # Warm-up: free lists, caches, and the recently-closed sessions at their bound.
            await cycles(manager, 0, 1_500)
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            await cycles(manager, 1_500, _MEMORY_CYCLES)
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
            assert manager.tasks() == []
    finally:
        tracemalloc.stop()
        logging.disable(logging.NOTSET)
    print(f"{_MEMORY_CYCLES} cycles: {grown / _MEMORY_CYCLES:.2f} bytes a cycle")
    assert grown / _MEMORY_CYCLES < 10, grown


# ---------------------------------------------------------------- closed sessions and late records


@pytest.mark.parametrize("retain", [None, 0])
async def test_a_closed_session_refuses_spawns_after_its_records_are_forgotten(
    retain: int | None,
) -> None:
    async with manager_with(spec("echo", echo), retain_collected=retain) as manager:
        await manager.spawn("echo", "x", session_id="s").wait()
        await manager.close_session("s")
        assert manager.session_closed("s")
        with pytest.raises(SpawnRejected):
            manager.spawn("echo", session_id="s")


async def test_closed_sessions_with_no_record_are_remembered_up_to_a_bound() -> None:
    async with manager_with(spec("echo", echo), retain_collected=0) as manager:
        for i in range(1025):
            await manager.close_session(f"conversation-{i}")
        assert not manager.session_closed("conversation-0")  # the oldest was let go
        assert manager.session_closed("conversation-1")
        assert manager.session_closed("conversation-1024")


async def test_a_grandchild_ending_after_its_parents_record_went_is_forgotten_too() -> None:
    release = anyio.Event()
    started = anyio.Event()

    async def stubborn(request: Request, ctx: RunContext) -> str:
        started.set()
        with anyio.CancelScope(shield=True):
            await release.wait()
        return "late"

    async def parent(request: Request, ctx: RunContext) -> str:
        ctx.spawn("stubborn")
        await started.wait()  # running, so the parent's end must wait for it to settle
        return "parent"

    async with manager_with(
        spec("parent", parent), spec("stubborn", stubborn), retain_collected=0, settle_timeout=0.01
    ) as manager:
        top = manager.spawn("parent")
        await anyio.wait_all_tasks_blocked()
        (late,) = manager.tasks(top.task_id)
        await top.wait()  # collected: forgotten, its unfinished child kept meanwhile
        assert manager.tasks(top.task_id) == [late]
        release.set()
        await late.done.wait()
        assert manager.tasks(top.task_id) == []
        assert not manager.session_closed(top.task_id)  # nothing of it is left
        with pytest.raises(UnknownTask):
            manager.handle(late.task_id)


async def test_collecting_a_handle_forgotten_with_its_parent_keeps_the_retained_records() -> None:
    async def parent(request: Request, ctx: RunContext) -> str:
        ctx.spawn("echo", "orphan")
        await anyio.wait_all_tasks_blocked()
        return "parent"

    async with manager_with(spec("echo", echo), spec("parent", parent), retain_collected=1) as m:
        top = m.spawn("parent")
        await anyio.wait_all_tasks_blocked()
        (orphan,) = m.tasks(top.task_id)
        await top.wait()
        kept = m.spawn("echo", "kept")
        await kept.wait()  # the one retained record: top is forgotten, orphan with it
        assert m.tasks() == [kept]
        assert (await orphan.wait()).output == "orphan"  # its handle still reads it
        assert m.result(kept.task_id) is not None  # and it took no retained place


async def test_forget_during_a_parents_settle_and_the_chain_after_it() -> None:
    """While a parent settles a stubborn child, neither can be forgotten (both unfinished);
    the child's envelope lands in the parent's mailbox, which is released as the parent
    ends, so under ``retain_collected=0`` collecting the parent forgets the ended child with
    it, and the parent's session with them."""
    release = anyio.Event()
    parent_returned = anyio.Event()

    async def stubborn(request: Request, ctx: RunContext) -> str:
        with anyio.CancelScope(shield=True):
            await release.wait()
        return "late"

    async def parent(request: Request, ctx: RunContext) -> str:
        ctx.spawn("stubborn")
        await anyio.wait_all_tasks_blocked()
        parent_returned.set()
        return "parent"

    async with manager_with(
        spec("parent", parent), spec("stubborn", stubborn), retain_collected=0
    ) as manager:
        with anyio.fail_after(5):
            p = manager.spawn("parent")
            await parent_returned.wait()
            await anyio.wait_all_tasks_blocked()
            (g,) = manager.tasks(p.task_id)
            assert p.result is None  # settling its child
            assert manager.forget(p.task_id) is None
            assert manager.forget(g.task_id) is None
            release.set()
            await manager.wait_result(p.task_id)
            assert not has_record(manager, p)
            assert g.result is not None
            assert not g.collected
            # The parent's record took its ended child along: nobody can collect it now.
            assert not has_record(manager, g)
            assert manager.tasks(p.task_id) == []
            assert not manager.session_closed(p.task_id)  # unknown now, like an unused name
            assert session_state(manager, p.task_id) == []
            assert not has_listing(manager, p.task_id)


def _live_objects(name: str) -> int:
    return sum(1 for o in gc.get_objects() if type(o).__name__ == name)


@pytest.mark.anyio
async def test_forgotten_records_are_freed_by_reference_counting() -> None:
    # A record and its handle point at each other while it is kept; forgetting it must
    # break that, or every forgotten child waits for the cyclic GC.
    async with manager_with(spec("echo", echo), retain_collected=0) as manager:
        for _ in range(10):
            await manager.spawn("echo", "x").wait()
        gc.collect()
        gc.disable()
        try:
            before = _live_objects("ChildRecord") + _live_objects("SpawnHandle")
            for _ in range(300):
                await manager.spawn("echo", "x").wait()
            after = _live_objects("ChildRecord") + _live_objects("SpawnHandle")
        finally:
            gc.enable()
        assert manager.tasks() == []
    assert after - before < 20, (before, after)
