"""Retention across the whole state space: any sequence of spawns (root or nested),
finishes, cancels, collections, forgets, session closes and executes keeps exactly the
records the retention rule says, one envelope per spawn, and no state of an ended child."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from subagents import Event, Request, RunContext, SpawnHandle, SpawnRejected, UnknownTask
from tests.helpers import has_record, manager_with, session_state, spec

pytestmark = pytest.mark.anyio


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
    cancelled: set[str] = set()
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

    def records() -> set[SpawnHandle]:
        """Every record the manager keeps (execute()s too), whichever session lists it."""
        used = {*sessions, *(h.task_id for h in handles)}
        return {h for session in used for h in manager.tasks(session)}

    def ending(h: SpawnHandle | None) -> bool:
        """Whether ``h`` has ended or is ending: its runner was let go, or it or an ancestor
        was cancelled or its session closed (then its session refuses new children)."""
        by_id = {h.task_id: h for h in handles}
        while h is not None:
            if h.result is not None or h.task_id in cancelled or h.session_id in closed:
                return True
            if gates[h.request.input].is_set():
                return True
            h = by_id.get(h.session_id)
        return False

    def ancestor_forgotten(h: SpawnHandle) -> bool:
        """Whether a record above ``h`` is gone (it takes its ended children along)."""
        known = records()
        by_id = {h.task_id: h for h in handles}
        parent = by_id.get(h.session_id)
        while parent is not None:
            if parent not in known:
                return True
            parent = by_id.get(parent.session_id)
        return False

    def check() -> None:
        known = records()
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
                if op == "nest" and target is not None and not has_record(manager, target):
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
                    except SpawnRejected as rejected:
                        parent = target if op == "nest" else None
                        if rejected.reason == "depth":
                            assert parent is not None
                            assert parent.agent_path.depth == 3  # max_depth
                        else:
                            assert session in closed or (
                                parent is not None and (parent.state != "running" or ending(parent))
                            )
                elif op == "finish":
                    gates[target.request.input].set()
                elif op == "cancel":
                    if has_record(manager, target):
                        manager.cancel(target.task_id)
                        cancelled.add(target.task_id)
                    else:
                        assert target.result is not None
                elif op == "collect":
                    if has_record(manager, target):
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
                    if has_record(manager, target):
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
