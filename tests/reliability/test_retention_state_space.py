"""Adversarial review of the day's runtime changes (retention, slot lending, the inlined
fast paths): each test pins a behaviour one of those changes could have broken."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from subagents import (
    DelegateResult,
    Event,
    Mailbox,
    Request,
    RunContext,
    SpawnRejected,
    Status,
    SubagentManager,
    UnknownTask,
)
from subagents._handle import SpawnHandle
from subagents.tools import Toolset, build_tools
from tests.helpers import manager_with, spec

pytestmark = pytest.mark.anyio


def gated_spec(gate: anyio.Event, name: str = "gated") -> object:
    async def gated(request: Request, ctx: RunContext) -> str:
        await gate.wait()
        return request.input

    return spec(name, gated)


def session_state(manager: SubagentManager, session: str) -> list[str]:
    """Which per-session stores still hold ``session``."""
    stores = {"mailbox": manager._mailboxes, "names": manager._names, "live": manager._live}
    return [name for name, store in stores.items() if session in store]


# ---------------------------------------------------------------- session state (_owns_session)


async def test_a_child_cancelled_in_the_queue_releases_the_mailbox_of_its_session() -> None:
    """A queued child's session mailbox (a host watching it, or ``_delivery_mailbox``) is
    released when the child is cancelled before it ran, as for a child that ran: its
    waiters wake, and no mailbox stays behind for the manager's lifetime."""
    gate = anyio.Event()
    async with manager_with(gated_spec(gate), max_concurrent_spawns=1) as manager:
        with anyio.fail_after(5):
            running = manager.spawn("gated")
            queued = manager.spawn("gated")
            mailbox = manager.mailbox(queued.task_id)
            got: list[object] = []

            async def reader() -> None:
                got.append(await mailbox.wait("nothing-will-land"))

            async with anyio.create_task_group() as tg:
                tg.start_soon(reader)
                await anyio.wait_all_tasks_blocked()
                assert manager.cancel(queued.task_id)
            assert got == [None]  # woken by the drop, not left waiting until aclose
            assert mailbox.closed
            assert session_state(manager, queued.task_id) == []
            gate.set()
            await running.wait()


async def test_the_tools_of_a_forgotten_child_cannot_delegate() -> None:
    """A child's tools (``build_tools(manager, ctx.session_id)``) used after the child has
    ended refuse to spawn or delegate, also once retention forgot its record: its id must
    not read as a fresh root session (a child at ``/root`` with the root's permissions)."""
    kept: list[Toolset] = []

    async def parent(request: Request, ctx: RunContext) -> str:
        kept.append(build_tools(ctx._manager, ctx.session_id))
        return "done"

    async def echo(request: Request, ctx: RunContext) -> str:
        return request.input

    async with manager_with(spec("p", parent), spec("e", echo), retain_collected=0) as manager:
        with anyio.fail_after(5):
            child = manager.spawn("p")
            await manager.wait_result(child.task_id)
            assert child not in manager._tasks.values()  # forgotten
            (tools,) = kept
            for tool in ("spawn_agent", "delegate_to_agent"):
                answer = await tools.call(tool, {"agent": "e", "input": "hi"})
                assert answer.is_error, answer
                assert answer.details["reason"] == "session_closed"
            assert manager.tasks(child.task_id) == []
            assert manager.statistics().spawned == 1


# ---------------------------------------------------------------- the retention state space

_OPS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "spawn",
                "spawn",
                "nest",
                "finish",
                "finish",
                "cancel",
                "collect",
                "drain_all",
                "forget",
                "close",
                "execute",
            ]
        ),
        st.integers(min_value=0, max_value=40),
    ),
    max_size=30,
)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(retain=st.sampled_from([None, 0, 2]), ops=_OPS)
def test_retention_under_spawn_cancel_collect_forget_close(
    backend: str, retain: int | None, ops: list[tuple[str, int]]
) -> None:
    """Any sequence of spawn (root or nested), finish, cancel, collect, forget, close_session
    and execute, at a limit of 2 (children queue): every spawn ends in exactly one envelope,
    an uncollected envelope is never forgotten (but by ``forget``), ``tasks()`` lists
    exactly the records the manager knows, at most ``retain`` collected ones are kept, and at
    rest no slot is held and no ended child keeps session state."""
    anyio.run(_run_retention_model, retain, ops, backend=backend)


async def _run_retention_model(retain: int | None, ops: list[tuple[str, int]]) -> None:
    gates: dict[str, anyio.Event] = {}

    async def gated(request: Request, ctx: RunContext) -> str:
        await gates[request.input].wait()
        return request.input

    async def echo(request: Request, ctx: RunContext) -> str:
        return request.input

    handles: list[SpawnHandle] = []
    explicitly_forgotten: set[str] = set()
    closed: set[str] = set()
    sessions = ["root", "side"]
    completed: dict[str, int] = {}

    def on_event(event: Event) -> None:
        if event.type == "subagent.completed":
            completed[event.task_id] = completed.get(event.task_id, 0) + 1

    manager = manager_with(
        spec("gated", gated),
        spec("echo", echo),
        retain_collected=retain,
        max_concurrent_spawns=2,
        max_depth=3,
        settle_timeout=5.0,
    )
    manager.events.subscribe(on_event)

    def ancestor_forgotten(h: SpawnHandle) -> bool:
        """Whether a record above ``h`` is gone (it takes its ended children along)."""
        known = set(manager._tasks.values())
        by_id = {h.task_id: h for h in handles}
        parent = by_id.get(h.session_id)
        while parent is not None:
            if parent not in known:
                return True
            parent = by_id.get(parent.session_id)
        return False

    def check() -> None:
        known = set(manager._tasks.values())
        for session in {*sessions, *(h.task_id for h in handles)}:
            listed = [h for h in manager.tasks(session) if not h.sync]  # execute()s aside
            assert listed == [h for h in handles if h.session_id == session and h in known]
            if retain == 0:
                assert not [h for h in manager.tasks(session) if h.sync], "execute() kept"
        for h in handles:
            if h.task_id in explicitly_forgotten:
                assert h not in known
            elif h.result is not None and ancestor_forgotten(h):
                assert h not in known, "an ended child outlived its parent's record"
            elif not h.collected:
                assert h in known, "an uncollected record was forgotten"
            elif retain == 0:
                assert h not in known
            elif retain is None:
                assert h in known
        if retain:
            kept = [h for h in known if h.collected and h.task_id not in explicitly_forgotten]
            assert len(kept) <= retain

    with anyio.fail_after(20):
        async with manager:
            for op, n in ops:
                target = handles[n % len(handles)] if handles else None
                if op == "nest" and target is not None and target not in manager._tasks.values():
                    continue  # a forgotten child's id names no session (a root one if used)
                if op in ("spawn", "nest") or target is None:
                    key = str(len(gates))
                    if op == "nest" and target is not None:
                        session = target.task_id
                    else:
                        session = sessions[n % 2]
                    gates[key] = anyio.Event()
                    try:
                        handles.append(manager.spawn("gated", key, session_id=session))
                    except SpawnRejected:
                        parent = manager._tasks.get(session)
                        assert session in closed or (
                            parent is not None and (parent.state != "running" or parent._ending)
                        )
                elif op == "finish":
                    gates[target.request.input].set()
                elif op == "cancel":
                    if target in manager._tasks.values():
                        manager.cancel(target.task_id)
                    else:
                        assert target.result is not None
                elif op == "collect":
                    if target in manager._tasks.values():
                        got = await manager.wait_result(target.task_id, timeout=0)
                        assert got is target.result
                    else:
                        assert target.collected or ancestor_forgotten(target)
                        with pytest.raises(UnknownTask):
                            await manager.wait_result(target.task_id, timeout=0)
                elif op == "drain_all":
                    for envelope in manager.mailbox(sessions[n % 2]).drain_all():
                        assert completed.get(envelope.task_id) == 1
                elif op == "forget":
                    if target in manager._tasks.values():
                        if manager.forget(target.task_id) is not None:
                            explicitly_forgotten.add(target.task_id)
                    else:
                        with pytest.raises(UnknownTask):
                            manager.forget(target.task_id)
                elif op == "close":
                    session = target.task_id if n % 3 == 0 else sessions[n % 2]
                    closed.add(session)
                    await manager.close_session(session)
                elif op == "execute":
                    try:
                        envelope = await manager.execute("echo", "sync", session_id=sessions[n % 2])
                    except SpawnRejected:
                        assert sessions[n % 2] in closed
                    else:
                        assert envelope.output == "sync"
                await anyio.wait_all_tasks_blocked()
                check()
            for gate in gates.values():
                gate.set()
            for h in handles:
                await h.done.wait()
            await anyio.wait_all_tasks_blocked()
            check()
            stats = manager.statistics()
            assert stats.running == 0
            assert stats.queued == 0
            assert stats.spawned == stats.settled
            for h in handles:
                assert completed.get(h.task_id) == 1, "not exactly one envelope"
                assert session_state(manager, h.task_id) == []


# ---------------------------------------------------------------- watchdog entry inlined in _run


async def test_a_deadline_after_the_watchdog_went_idle_still_fires() -> None:
    """Once every watched deadline has passed the watchdog sleeps with no deadline
    (``_watch_at`` is inf) but keeps running; a child started then enters its deadline
    through ``_run``'s inlined check and must wake it (not only be stored)."""

    async def forever(request: Request, ctx: RunContext) -> str:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async with manager_with(spec("forever", forever), max_concurrent_spawns=1) as manager:
        with anyio.fail_after(5):
            first = manager.spawn("forever", timeout=0.02)
            assert (await first.wait()).status is Status.TIMEOUT
            await anyio.wait_all_tasks_blocked()
            assert manager._watch_wake is not None  # the watchdog is idle, not gone
            second = manager.spawn("forever", timeout=0.02)
            assert (await second.wait()).status is Status.TIMEOUT


# ---------------------------------------------------------------- Mailbox: TTL and the hook

_MAILBOX_OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["put", "put", "put", "tick", "tick", "peek", "drain", "drain_all", "wait", "len"]
        ),
        st.sampled_from(["a", "b", "c"]),
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(ops=_MAILBOX_OPS, drop_at=st.none() | st.integers(min_value=0, max_value=30))
@example(ops=[("put", "a"), ("tick", "a"), ("tick", "a"), ("drain_all", "a")], drop_at=None)
@example(
    ops=[("put", "a"), ("tick", "a"), ("put", "a"), ("tick", "a"), ("drain", "a")], drop_at=None
)
def test_the_consumed_hook_sees_exactly_what_is_handed_out(
    ops: list[tuple[str, str]], drop_at: int | None
) -> None:
    """With a TTL, overwrites of the same id, expiry and a drop: ``consumed`` is called once
    for each envelope ``drain``/``drain_all``/``wait`` return and never otherwise (not on
    peek, expiry, an overwrite or the drop), and ``len`` counts the unexpired entries."""
    now = [0.0]
    box = Mailbox(capacity=8, ttl=2.0, clock=lambda: now[0])
    hooked: list[DelegateResult] = []
    box.consumed = hooked.append
    handed: list[DelegateResult] = []
    model: dict[str, tuple[DelegateResult, float]] = {}
    for i, (op, key) in enumerate(ops):
        if i == drop_at:
            box.drop()
            model.clear()
        model = {k: v for k, v in model.items() if v[1] > now[0]}
        if op == "put":
            envelope = DelegateResult(
                agent="w", task_id=key, status=Status.COMPLETED, output=str(i)
            )
            assert box.put(key, envelope) is not box.closed
            if not box.closed:
                model.pop(key, None)
                model[key] = (envelope, now[0] + 2.0)
        elif op == "peek":
            assert box.peek(key) is (model[key][0] if key in model else None)
        elif op == "drain":
            got = box.drain(key)
            assert got is (model.pop(key)[0] if key in model else None)
            if got is not None:
                handed.append(got)
        elif op == "drain_all":
            got_all = box.drain_all()
            assert got_all == [envelope for envelope, _ in model.values()]
            model.clear()
            handed.extend(got_all)
        elif op == "wait":
            got = anyio.run(box.wait, key, 0)
            assert got is (model.pop(key)[0] if key in model else None)
            if got is not None:
                handed.append(got)
        elif op == "tick":
            now[0] += 1.5
        else:
            assert len(box) == len(model)
        assert hooked == handed


# ---------------------------------------------------------------- forget() during a settle


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
            assert p not in manager._tasks.values()
            assert g.result is not None
            assert not g.collected
            # The parent's record took its ended child along: nobody can collect it now.
            assert g not in manager._tasks.values()
            assert manager.tasks(p.task_id) == []
            assert not manager.session_closed(p.task_id)  # unknown now, like an unused name
            assert session_state(manager, p.task_id) == []
            assert p.task_id not in manager._by_session
