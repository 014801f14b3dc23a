"""Idempotency keys on a durable store: the key is written to the spawn's row, so a repeat
in a later process (a real one, or a manager entered after the first closed) returns the
ended task's restored handle and runs nothing; a key held by an unfinished task of
another process is refused; forgetting frees the key in the store too; and two stores
spawning one key at once both commit (the later row without the key)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from subagents import (
    SpawnRejected,
    Status,
    SubagentConfig,
    SubagentManager,
)
from subagents._journal import SpawnEntry
from subagents._json import loads
from subagents.store import INTERRUPTED, SqliteStore
from tests.store.support import counted_agents, sqlite, worker

pytestmark = pytest.mark.anyio

KEYED_WORKER = Path(__file__).with_name("keyed_worker.py")


def _keys(path: Path) -> dict[str, str | None]:
    """Each task's idempotency key, by task id."""
    with sqlite(path) as conn:
        rows = conn.execute("SELECT task_id, idempotency_key FROM tasks").fetchall()
    return {str(task_id): key for task_id, key in rows}


def _keyed_entry(task_id: str, key: str) -> SpawnEntry:
    return SpawnEntry(
        task_id=task_id,
        session_id="root",
        parent_task=None,
        agent="forever",
        agent_path=f"/root/{task_id}",
        request={"input": "x"},
        idempotency_key=key,
    )


# ---------------------------------------------------------------- across processes


async def test_a_repeat_in_another_process_returns_the_stored_envelope_and_runs_nothing(
    tmp_path: Path, anyio_backend: str
) -> None:
    path = str(tmp_path / "s.db")
    args = ("run", path, "root", "job-1", "hello")
    answers = []
    for _ in range(2):
        async with worker(*args, backend=anyio_backend, script=KEYED_WORKER) as proc:
            answers.append(loads(await proc.line()))
    first, second = answers
    assert first == {
        "task_id": first["task_id"],
        "status": "completed",
        "output": "HELLO",
        "calls": 1,
    }
    assert second == {**first, "calls": 0}  # the same task, its envelope; nothing ran
    task_id = str(first["task_id"])

    calls: list[str] = []
    async with SubagentManager(counted_agents(calls), config=SubagentConfig(store_path=path)) as m:
        handle = m.spawn("echo", "hello", idempotency_key="job-1")
        assert handle.task_id == task_id
        assert handle.state == "done"
        assert handle.result is not None
        assert handle.result.output == "HELLO"
        assert m.spawn("echo", "hello", idempotency_key="job-1") is handle
        assert m.handle(task_id) is handle
        with pytest.raises(SpawnRejected) as caught:
            m.spawn("echo", "something else", idempotency_key="job-1")
        assert caught.value.reason == "idempotency_conflict"
        assert caught.value.task_id == task_id
        other = m.spawn("echo", "hello", session_id="elsewhere", idempotency_key="job-1")
        await other.wait()
    assert calls == ["hello"]  # only the spawn into the other session ran
    assert _keys(Path(path)) == {task_id: "job-1", other.task_id: "job-1"}


async def test_a_key_another_live_process_holds_is_refused_until_its_task_has_ended(
    tmp_path: Path, anyio_backend: str
) -> None:
    path = str(tmp_path / "s.db")
    calls: list[str] = []
    args = ("hold", path, "root", "job-1")
    async with worker(*args, backend=anyio_backend, script=KEYED_WORKER) as proc:
        task_id = (await proc.line()).strip()
        async with SubagentManager(
            counted_agents(calls), config=SubagentConfig(store_path=path)
        ) as m:
            with pytest.raises(SpawnRejected) as caught:
                m.spawn("forever", "held", idempotency_key="job-1")
            assert caught.value.reason == "idempotency_pending"
            assert caught.value.task_id == task_id
            assert f"task {task_id!r}" in str(caught.value)
            assert "another process is running it" in str(caught.value)
        await proc.send("stop")  # its manager closes: the child ends cancelled
    async with SubagentManager(counted_agents(calls), config=SubagentConfig(store_path=path)) as m:
        handle = m.spawn("forever", "held", idempotency_key="job-1")
        assert handle.task_id == task_id
        assert handle.result is not None
        assert handle.result.status is Status.CANCELLED
    assert calls == []


# ---------------------------------------------------------------- managers in sequence


async def test_a_repeat_after_a_restart_returns_the_handle_restored_by_id(tmp_path: Path) -> None:
    config = SubagentConfig(store_path=tmp_path / "s.db")
    calls: list[str] = []
    async with SubagentManager(counted_agents(calls), config=config) as m:
        first = m.spawn("echo", "x", idempotency_key="k")
        await first.wait()
    async with SubagentManager(counted_agents(calls), config=config) as m:
        restored = m.handle(first.task_id)
        assert m.spawn("echo", "x", idempotency_key="k") is restored
    assert calls == ["x"]


async def test_a_key_whose_task_a_dead_process_left_unfinished_returns_its_recovered_envelope(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    async with SqliteStore(path) as store:  # an earlier process, gone mid-run
        journal = store.journal()
        await journal.wait_journaled(journal.spawned(_keyed_entry("aaaaaaaaaaaa", "k")))
    calls: list[str] = []
    async with SubagentManager(counted_agents(calls), config=SubagentConfig(store_path=path)) as m:
        handle = m.spawn("forever", "x", idempotency_key="k")  # recovered on entry
        assert handle.task_id == "aaaaaaaaaaaa"
        assert handle.result is not None
        assert handle.result.error_type == INTERRUPTED
    assert calls == []


async def test_a_key_left_unfinished_by_a_process_gone_since_entry_is_refused(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    calls: list[str] = []
    async with SubagentManager(counted_agents(calls), config=SubagentConfig(store_path=path)) as m:
        async with SqliteStore(path) as store:  # another process, gone after m was entered
            journal = store.journal()
            await journal.wait_journaled(journal.spawned(_keyed_entry("bbbbbbbbbbbb", "k")))
        with pytest.raises(SpawnRejected) as caught:
            m.spawn("forever", "x", idempotency_key="k")
        assert caught.value.reason == "idempotency_pending"
        assert caught.value.task_id == "bbbbbbbbbbbb"
        assert "its process is gone" in str(caught.value)
    assert calls == []


async def test_forgetting_frees_the_key_in_the_store_and_a_restart_finds_the_new_task(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    config = SubagentConfig(store_path=path)
    calls: list[str] = []
    async with SubagentManager(counted_agents(calls), config=config) as m:
        first = m.spawn("echo", "one", idempotency_key="k")
        await first.wait()
        m.forget(first.task_id)
        second = m.spawn("echo", "two", idempotency_key="k")
        await second.wait()
    assert _keys(path) == {second.task_id: "k"}  # a forgotten task's row is deleted
    async with SubagentManager(counted_agents(calls), config=config) as m:
        again = m.spawn("echo", "two", idempotency_key="k")
        assert again.task_id == second.task_id
        m.forget(again.task_id)  # restored here, forgotten here: free at once
        third = m.spawn("echo", "three", idempotency_key="k")
        await third.wait()
    assert calls == ["one", "two", "three"]
    assert _keys(path) == {third.task_id: "k"}


async def test_retention_eviction_deletes_the_row_and_frees_the_key_everywhere(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    config = SubagentConfig(store_path=path, retain_collected=0)
    calls: list[str] = []
    async with SubagentManager(counted_agents(calls), config=config) as m:
        first = m.spawn("echo", "x", idempotency_key="k")
        await first.wait()  # collected, so forgotten at once
        second = m.spawn("echo", "x", idempotency_key="k")
        assert second.task_id != first.task_id
        await second.wait()
    assert _keys(path) == {}  # both collected and let go: their rows are deleted
    async with SubagentManager(counted_agents(calls), config=SubagentConfig(store_path=path)) as m:
        third = m.spawn("echo", "x", idempotency_key="k")
        assert third.task_id not in (first.task_id, second.task_id)
        await third.wait()
    assert calls == ["x", "x", "x"]


# ---------------------------------------------------------------- the lookup-to-commit window


async def test_two_stores_spawning_one_key_at_once_both_commit(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with SqliteStore(path) as one, SqliteStore(path) as two:
        first, second = one.journal(), two.journal()
        # Both found the key free (neither row was committed): both rows are written.
        tokens = (
            first.spawned(_keyed_entry("aaaaaaaaaaaa", "k")),
            second.spawned(_keyed_entry("bbbbbbbbbbbb", "k")),
        )
        await first.wait_journaled(tokens[0])
        await second.wait_journaled(tokens[1])
        # One store, one batch, one key twice: the batch commits all the same.
        await first.wait_journaled(
            max(first.spawned(_keyed_entry(t, "j")) for t in ("cccccccccccc", "dddddddddddd"))
        )
    keys = _keys(path)
    assert sorted(keys) == ["aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc", "dddddddddddd"]
    holders = [task_id for task_id, key in keys.items() if key == "k"]
    assert len(holders) == 1  # the row committed first keeps the key
    assert keys["cccccccccccc"] == "j"
    assert keys["dddddddddddd"] is None
    calls: list[str] = []
    async with SubagentManager(counted_agents(calls), config=SubagentConfig(store_path=path)) as m:
        assert m.spawn("forever", "x", idempotency_key="k").task_id == holders[0]
    assert calls == []


# ---------------------------------------------------------------- the journal's reads


async def test_by_key_finds_another_stores_task_until_it_is_forgotten(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with SubagentManager(counted_agents([]), config=SubagentConfig(store_path=path)) as m:
        handle = m.spawn("echo", "x", idempotency_key="k")
        await handle.wait()
        own = m.store.journal()  # type: ignore[union-attr]
        assert own.by_key("root", "k") is None  # its own task: the record answers
    async with SqliteStore(path) as store:
        journal = store.journal()
        found = journal.by_key("root", "k")
        assert found is not None
        assert (found.task_id, found.ended, found.owner_alive) == (handle.task_id, True, False)
        assert journal.by_key("other", "k") is None
        assert journal.by_key("root", "K") is None
        journal.forgotten(handle.task_id)
        assert journal.by_key("root", "k") is None  # queued, not yet committed
        await store.wait_committed()
        assert journal.by_key("root", "k") is None


def test_the_keys_statements_read_the_idempotency_index(tmp_path: Path) -> None:
    from subagents.store import _journal, _journal_writes

    path = tmp_path / "s.db"
    anyio.run(_open_and_close, path)
    with sqlite(path) as conn:
        for statement, params in [
            (_journal._BY_KEY, ("s", "k", "o")),
            (_journal_writes._RELEASE_KEY, ("s", "k", "o")),
            (
                _journal_writes._INSERT_TASK,
                dict.fromkeys(
                    ("task_id", "session", "parent", "agent", "path", "request", "key"), "x"
                )
                | {"owner": "o", "ms": 0, "attempts": 0},
            ),
        ]:
            plan = " ".join(
                str(row) for row in conn.execute("EXPLAIN QUERY PLAN " + statement, params)
            )
            assert (
                "USING INDEX tasks_idempotency" in plan
                or "COVERING INDEX tasks_idempotency" in plan
            ), plan
            assert "SCAN" not in plan, plan


async def _open_and_close(path: Path) -> None:
    async with SqliteStore(path):
        pass
