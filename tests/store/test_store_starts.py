"""The starts of tasks whose spawn rows are written already are gathered into one write
while the writer has not taken it: one write and one statement for a batch's starts, and
an end that meets its task's start still there counts the try in its own update."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from subagents.store import SqliteStore
from subagents.store._journal import SqliteJournal
from tests.store.support import env, spawn_entry, sqlite

pytestmark = pytest.mark.anyio


def _tasks(path: Path) -> dict[str, tuple[str, int]]:
    with sqlite(path) as conn:
        rows = conn.execute("SELECT task_id, state, attempts FROM tasks").fetchall()
    return {task_id: (state, attempts) for task_id, state, attempts in rows}


async def _spawned(store: SqliteStore, *task_ids: str) -> SqliteJournal:
    """A journal of ``store`` whose spawns of ``task_ids`` are committed."""
    journal = store.journal()
    for task_id in task_ids:
        journal.spawned(spawn_entry(task_id))
    await store.wait_committed()
    return journal


async def test_the_starts_the_writer_has_not_reached_are_one_write(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with SqliteStore(path) as store:
        journal = await _spawned(store, "a", "b", "c")
        before = store.statistics().writes
        store._writer.gate.acquire()  # the writer takes nothing meanwhile
        try:
            tokens = {journal.started(task_id) for task_id in ("a", "b", "c")}
        finally:
            store._writer.gate.release()
        (token,) = tokens  # each start is carried by the same write
        await journal.wait_journaled(token)
        assert _tasks(path) == {"a": ("running", 1), "b": ("running", 1), "c": ("running", 1)}
        assert store.statistics().writes - before == 1


async def test_an_end_that_meets_its_start_unwritten_counts_the_try(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with SqliteStore(path) as store:
        journal = await _spawned(store, "a", "b")
        before = store.statistics().writes
        store._writer.gate.acquire()
        try:
            journal.started("a")
            journal.started("b")
            journal.ended("a", "root", env("a"))
        finally:
            store._writer.gate.release()
        await journal.flush()
        assert _tasks(path) == {"a": ("ended", 1), "b": ("running", 1)}
        assert store.statistics().writes - before == 2  # b's start, a's end


async def test_an_end_whose_start_is_the_only_one_leaves_no_start_to_write(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    async with SqliteStore(path) as store:
        journal = await _spawned(store, "a")
        before = store.statistics().writes
        store._writer.gate.acquire()
        try:
            journal.started("a")
            journal.ended("a", "root", env("a"))
        finally:
            store._writer.gate.release()
        await journal.flush()
        assert _tasks(path) == {"a": ("ended", 1)}
        assert store.statistics().writes - before == 1  # the end alone


async def test_a_start_after_the_writer_took_the_gathered_starts_is_a_new_write(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    async with SqliteStore(path) as store:
        journal = await _spawned(store, "a", "b")
        first = journal.started("a")
        await journal.wait_journaled(first)
        second = journal.started("b")
        assert second > first
        await journal.wait_journaled(second)
        assert _tasks(path) == {"a": ("running", 1), "b": ("running", 1)}


async def test_a_start_after_a_keyed_spawn_is_written_after_that_spawn(tmp_path: Path) -> None:
    """A keyed spawn keeps its place in a batch (it may free its key from an ended task),
    so a start gathered into a write queued before it would update a row not yet there:
    the keyed task's start goes into a write of its own, after its spawn."""
    path = tmp_path / "s.db"
    async with SqliteStore(path) as store:
        journal = await _spawned(store, "a")
        keyed = attrs.evolve(spawn_entry("k"), idempotency_key="key")
        store._writer.gate.acquire()
        try:
            first = journal.started("a")
            journal.spawned(keyed)
            second = journal.started("k")
        finally:
            store._writer.gate.release()
        assert second > first
        await store.wait_committed()
        assert _tasks(path) == {"a": ("running", 1), "k": ("running", 1)}
