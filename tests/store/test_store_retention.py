"""Retention on a store: ``forget`` and ``retain_collected`` delete a task's rows (its
``tasks`` row, its envelopes and their deliveries) and keep its name; a restart then finds
the id unknown, possibly forgotten. Real store files, checked with a plain connection."""

from __future__ import annotations

from pathlib import Path

import pytest

from subagents import (
    AgentSpec,
    Request,
    RunContext,
    SubagentConfig,
    SubagentManager,
    UnknownTask,
)
from subagents._events import COMPLETED, Event
from subagents.store import SqliteStore
from subagents.store._journal_writes import _DELETE_ENVELOPES, _DELETE_TASK
from tests.store.support import query_plan, spawn_entry, sqlite

pytestmark = pytest.mark.anyio

FORGOTTEN = "possibly from another store, or already forgotten"


async def _echo(request: Request, ctx: RunContext) -> str:
    return request.input.upper()


async def _parent(request: Request, ctx: RunContext) -> str:
    children = [ctx.spawn("echo", str(i)) for i in range(2)]
    for child in children:
        await child.done.wait()  # ended, never collected
    return ",".join(child.task_id for child in children)


AGENTS = [AgentSpec(name="echo", runner=_echo), AgentSpec(name="parent", runner=_parent)]


def _rows(path: Path, task_id: str) -> dict[str, int]:
    """How many rows of each table ``task_id`` has."""
    with sqlite(path) as conn:
        return {
            table: int(
                conn.execute(
                    f"SELECT count(*) FROM {table} WHERE task_id = ?", (task_id,)
                ).fetchall()[0][0]
            )
            for table in ("tasks", "envelopes", "deliveries", "names")
        }


GONE = {"tasks": 0, "envelopes": 0, "deliveries": 0, "names": 1}


def _sound(path: Path) -> None:
    with sqlite(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []


async def test_forget_deletes_the_tasks_rows_keeps_its_name_and_leaves_the_others(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    config = SubagentConfig(store_path=path)
    async with SubagentManager(AGENTS, config=config) as m:
        forgotten = m.spawn("echo", "a", session_id="s")
        kept = m.spawn("echo", "b", session_id="s")
        await forgotten.done.wait()
        await kept.done.wait()  # both unread in the session's durable mailbox
        await m.store.wait_committed()  # type: ignore[union-attr]
        assert _rows(path, forgotten.task_id) == {
            "tasks": 1,
            "envelopes": 1,
            "deliveries": 1,
            "names": 1,
        }
        assert m.forget(forgotten.task_id) is not None
        await m.store.wait_committed()  # type: ignore[union-attr]
        assert _rows(path, forgotten.task_id) == GONE
        with sqlite(path) as conn:
            states = conn.execute(
                "SELECT state FROM deliveries WHERE task_id = ?", (kept.task_id,)
            ).fetchall()
        assert states == [("stored",)]  # the other task's unread delivery is untouched
    _sound(path)
    async with SubagentManager(AGENTS, config=config) as m:
        with pytest.raises(UnknownTask, match=FORGOTTEN):
            m.result(forgotten.task_id)
        envelope = await m.wait_result(kept.task_id, timeout=0)
        assert envelope is not None
        assert envelope.output == "B"
        # The name of the deleted task is still taken: echo, echo-2 were given out.
        assert str(m.spawn("echo", "c", session_id="s").agent_path) == "/root/echo-3"


async def test_retain_collected_deletes_the_rows_of_the_records_it_lets_go(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    config = SubagentConfig(store_path=path, retain_collected=2)
    async with SubagentManager(AGENTS, config=config) as m:
        handles = [m.spawn("echo", str(i)) for i in range(5)]
        for handle in handles:
            await handle.wait()  # collected in order: the first three are let go
        await m.store.wait_committed()  # type: ignore[union-attr]
        for handle in handles[:3]:
            assert _rows(path, handle.task_id) == GONE
        for handle in handles[3:]:
            assert _rows(path, handle.task_id)["tasks"] == 1
            assert m.result(handle.task_id) is not None
    _sound(path)
    async with SubagentManager(AGENTS, config=config) as m:
        with pytest.raises(UnknownTask, match=FORGOTTEN):
            m.result(handles[0].task_id)
        assert m.result(handles[4].task_id) is not None


async def test_retain_collected_zero_deletes_every_collected_task(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    config = SubagentConfig(store_path=path, retain_collected=0)
    async with SubagentManager(AGENTS, config=config) as m:
        handles = [m.spawn("echo", str(i)) for i in range(3)]
        for handle in handles:
            await handle.wait()
        await m.store.wait_committed()  # type: ignore[union-attr]
    with sqlite(path) as conn:
        counts = [
            conn.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]
            for table in ("tasks", "envelopes", "deliveries", "names")
        ]
    assert counts == [0, 0, 0, 3]
    _sound(path)


async def test_the_children_of_a_forgotten_parent_are_deleted_with_it(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    config = SubagentConfig(store_path=path)
    async with SubagentManager(AGENTS, config=config) as m:
        parent = m.spawn("parent")
        envelope = await parent.wait()
        children = envelope.output.split(",")
        await m.store.wait_committed()  # type: ignore[union-attr]
        assert all(_rows(path, child)["envelopes"] == 1 for child in children)
        m.forget(parent.task_id)
        await m.store.wait_committed()  # type: ignore[union-attr]
        for task_id in [parent.task_id, *children]:
            assert _rows(path, task_id) == GONE
    _sound(path)
    async with SubagentManager(AGENTS, config=config) as m:
        for child in children:
            with pytest.raises(UnknownTask, match=FORGOTTEN):
                m.result(child)


async def test_a_restored_task_forgotten_is_deleted_for_every_later_process(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    config = SubagentConfig(store_path=path)
    async with SubagentManager(AGENTS, config=config) as m:
        handle = m.spawn("echo", "x", session_id="s")
        await handle.done.wait()  # left unread
    async with SubagentManager(AGENTS, config=config) as m:
        assert m.forget(handle.task_id) is not None  # restored, its entry taken, deleted
        await m.store.wait_committed()  # type: ignore[union-attr]
        assert _rows(path, handle.task_id) == GONE
    async with SubagentManager(AGENTS, config=config) as m:
        with pytest.raises(UnknownTask, match=FORGOTTEN):
            m.result(handle.task_id)
        assert m.mailbox("s").drain_all() == []
    _sound(path)


async def test_a_forget_leaves_another_processs_unread_delivery_alone(tmp_path: Path) -> None:
    """Two stores on one file (two processes' origins) share a session: one forgets its
    task; the other's unread delivery of its own task stays, and is still read once."""
    path = tmp_path / "s.db"
    async with (
        SqliteStore(path) as a,
        SqliteStore(path) as b,
        SubagentManager(AGENTS, store=a) as ma,
        SubagentManager(AGENTS, store=b) as mb,
    ):
        mine = ma.spawn("echo", "a", session_id="shared")
        theirs = mb.spawn("echo", "b", session_id="shared", name="other")
        await mine.done.wait()
        await theirs.done.wait()
        await a.wait_committed()
        await b.wait_committed()
        ma.forget(mine.task_id)
        await a.wait_committed()
        assert _rows(path, mine.task_id) == GONE
        assert _rows(path, theirs.task_id) == {
            "tasks": 1,
            "envelopes": 1,
            "deliveries": 1,
            "names": 1,
        }
        envelope = await mb.wait_result(theirs.task_id, timeout=0)
        assert envelope is not None
        assert envelope.output == "B"
    _sound(path)


async def test_a_forget_before_the_end_is_written_deletes_the_task_after_it(
    tmp_path: Path,
) -> None:
    """A subscriber of the completion forgets the task while it is being delivered, before
    its end write is queued: the forget meets the task not ended, and deletes it once the
    end is written."""
    path = tmp_path / "s.db"
    config = SubagentConfig(store_path=path)
    async with SubagentManager(AGENTS, config=config) as m:
        forgotten: list[str] = []

        def on_event(event: Event) -> None:
            if event.type == COMPLETED and event.task_id:
                m.forget(event.task_id)
                forgotten.append(event.task_id)

        m.events.subscribe(on_event)
        handle = m.spawn("echo", "x")
        await handle.done.wait()
        assert forgotten == [handle.task_id]
        store = m.store
        assert store is not None
        await store.wait_committed()  # the forget (the task not ended yet) and the end
        await store.wait_committed()  # the forget once more, after the end
        assert _rows(path, handle.task_id) == GONE
    _sound(path)


async def test_only_an_ended_task_is_deleted(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    entry = spawn_entry("a1b2c3d4e5f6")
    async with SqliteStore(path) as store:
        journal = store.journal()
        await journal.wait_journaled(journal.spawned(entry))
        journal.forgotten(entry.task_id)  # never ended: nothing goes
        await store.wait_committed()
        await store.wait_committed()  # and its one retry
    with sqlite(path) as conn:
        assert conn.execute("SELECT state FROM tasks").fetchall() == [("queued",)]
    _sound(path)


def test_the_deletes_read_by_index_never_by_scan(tmp_path: Path) -> None:
    for statement, params in ((_DELETE_TASK, ("x",)), (_DELETE_ENVELOPES, {"task_id": "x"})):
        plan = query_plan(tmp_path / "s.db", statement, params)
        assert plan
        assert not [step for step in plan if step.startswith("SCAN")], plan


async def test_a_forgotten_id_is_not_restored_from_its_own_store(tmp_path: Path) -> None:
    config = SubagentConfig(store_path=tmp_path / "s.db")
    async with SubagentManager(AGENTS, config=config) as m:
        h = m.spawn("echo", "x")
        await h.wait()
        assert m.forget(h.task_id) is not None
        await m.store.wait_committed()  # type: ignore[union-attr]
        with pytest.raises(UnknownTask):
            m.result(h.task_id)  # the documented contract of forget


async def test_an_evicted_id_is_not_restored_from_its_own_store(tmp_path: Path) -> None:
    config = SubagentConfig(store_path=tmp_path / "s.db", retain_collected=0)
    async with SubagentManager(AGENTS, config=config) as m:
        h = m.spawn("echo", "x")
        await h.wait()  # collected -> evicted at once
        await m.store.wait_committed()  # type: ignore[union-attr]
        with pytest.raises(UnknownTask):
            m.result(h.task_id)


async def test_forgetting_a_restored_id_consumes_its_unread_envelope(tmp_path: Path) -> None:
    config = SubagentConfig(store_path=tmp_path / "s.db")
    async with SubagentManager(AGENTS, config=config) as m:
        h = m.spawn("echo", "x", session_id="s")
        await h.done.wait()  # unread
    async with SubagentManager(AGENTS, config=config) as m:
        assert m.forget(h.task_id) is not None
        # forget: "If the envelope is still in its session's mailbox it is consumed from
        # there first": the store's mailbox, for a restored record
        assert m.mailbox("s").drain_all() == []


async def test_a_restored_id_forgotten_stays_unknown_now_and_after_a_restart(
    tmp_path: Path,
) -> None:
    config = SubagentConfig(store_path=tmp_path / "s.db")
    async with SubagentManager(AGENTS, config=config) as m:
        h = m.spawn("echo", "x")
        await h.wait()
    async with SubagentManager(AGENTS, config=config) as m:
        m.forget(h.task_id)
        with pytest.raises(UnknownTask):
            m.forget(h.task_id)
    async with SubagentManager(AGENTS, config=config) as m:
        with pytest.raises(UnknownTask):  # the store forgot it too
            m.result(h.task_id)


async def test_forget_on_a_closed_store_still_forgets_and_returns_the_envelope(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path / "s.db")
    async with store, SubagentManager(AGENTS, store=store) as manager:
        handle = manager.spawn("echo", "x")
        envelope = await handle.wait()
        await store.aclose()  # the store goes away under the running manager
        assert manager.forget(handle.task_id) == envelope  # not the store's error
        assert manager.tasks() == []
