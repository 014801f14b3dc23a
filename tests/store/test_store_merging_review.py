"""Faults a review of 7b5352e (a task's journal writes that meet in one batch are written
together) found, each a case where a merged batch left other rows than writing each
write alone, in submission order, would."""

from __future__ import annotations

from pathlib import Path

import pytest

from subagents.store import SqliteStore
from subagents.store._journal_writes import EndWrite, SpawnWrite, StartWrite
from subagents.store._merging import merge_ends
from subagents.store._writer import Write, _runs
from tests.store.support import env, spawn_entry, sqlite

pytestmark = pytest.mark.anyio


async def _empty_store(path: Path) -> None:
    async with SqliteStore(path):
        pass


def _apply_alone(path: Path, writes: list[Write]) -> None:
    with sqlite(path) as conn:
        for write in writes:
            type(write).apply(conn, [write])


def _apply_merged(path: Path, writes: list[Write]) -> None:
    merge_ends(writes)
    with sqlite(path) as conn:
        for kind, run in _runs(writes):
            kind.apply(conn, run)


def _tasks(path: Path) -> list[tuple[object, ...]]:
    with sqlite(path) as conn:
        return conn.execute(
            "SELECT task_id, state, attempts FROM tasks ORDER BY task_id"
        ).fetchall()


def _arrivals(path: Path) -> list[tuple[object, ...]]:
    with sqlite(path) as conn:
        return conn.execute("SELECT task_id, state FROM deliveries ORDER BY id").fetchall()


# ------------------------------------------------- 1. two starts counted as two tries


async def test_a_second_start_that_meets_the_spawn_is_not_a_second_try(tmp_path: Path) -> None:
    """Written alone, a start only moves a *queued* task (``_START_TASK``): a second start
    of a running task changes nothing, attempts stay 1. merge_ends adds every StartWrite
    of the run into its spawn's ``starts`` (and count_start has counted one already),
    so the row is inserted with attempts = 2: a try that never ran is counted, which a
    re-runnable agent's cap of tries (``attempts < cap`` in recovery) then pays for."""
    alone, merged = tmp_path / "alone.db", tmp_path / "merged.db"
    await _empty_store(alone)
    await _empty_store(merged)

    def writes() -> list[Write]:
        return [SpawnWrite(spawn_entry("t"), "me"), StartWrite("t"), StartWrite("t")]

    _apply_alone(alone, writes())
    _apply_merged(merged, writes())
    assert _tasks(alone) == [("t", "running", 1)]
    assert _tasks(merged) == _tasks(alone)


async def test_two_starts_of_an_untaken_spawn_count_one_try(
    tmp_path: Path,
) -> None:
    """The same through the store's journal: the first start is counted in the untaken
    spawn (count_start), the second is a StartWrite that merge_ends counts in it again."""
    path = tmp_path / "s.db"
    async with SqliteStore(path, commit_delay=0.5) as store:
        journal = store.journal()
        journal.spawned(spawn_entry("first"))
        await store.wait_committed()  # the first commit is at once; now the delay holds
        journal.spawned(spawn_entry("t"))
        journal.started("t")
        journal.started("t")
        await store.wait_committed()
    assert ("t", "running", 1) in _tasks(path)


# ------------------------------------- 2. ends delivered by the journal change arrival


async def test_ends_delivered_by_the_journal_arrive_in_the_order_they_were_submitted(
    tmp_path: Path,
) -> None:
    """``deliveries.id`` is a mailbox's arrival order (schema; ``claim_ids`` takes in it).
    Two ends with ``deliver`` and no put (their manager closing): A's, then B's. Alone
    (and before 7b5352e, the ends being one class applied in submission order) A's
    envelope arrives first. Merged, A's spawn is in the run, so A's end is written by
    the spawn at order 4, after every end of order 3: B's envelope arrives first."""
    alone, merged = tmp_path / "alone.db", tmp_path / "merged.db"
    await _empty_store(alone)
    await _empty_store(merged)
    for path in (alone, merged):  # B was spawned in an earlier batch
        _apply_alone(path, [SpawnWrite(spawn_entry("b", agent="b"), "me")])

    def writes() -> list[Write]:
        return [
            SpawnWrite(spawn_entry("a", agent="a"), "me"),
            EndWrite("a", "root", env("a"), True, "me", None),
            EndWrite("b", "root", env("b"), True, "me", None),
        ]

    _apply_alone(alone, writes())
    _apply_merged(merged, writes())
    assert [t for t, _ in _arrivals(alone)] == ["a", "b"]
    assert _arrivals(merged) == _arrivals(alone)


async def test_a_store_delivers_ends_of_a_closing_manager_in_end_order(tmp_path: Path) -> None:
    """The same through the journal of a store: after a restart the session's unread
    envelopes are taken in arrival order, which no longer is the order the tasks ended."""
    path = tmp_path / "s.db"
    async with SqliteStore(path, commit_delay=0.5) as store:
        journal = store.journal()
        journal.spawned(spawn_entry("b", agent="b"))
        await store.wait_committed()  # B's spawn committed; the delay holds from now
        journal.spawned(spawn_entry("a", agent="a"))
        journal.ended("a", "root", env("a"), deliver=True)
        journal.ended("b", "root", env("b"), deliver=True)
        await store.wait_committed()
    assert [t for t, _ in _arrivals(path)] == ["a", "b"]


# ------------------------------ 3. (pre-existing, shared by the new statement) NUL ids


async def test_an_end_of_an_id_with_a_nul_never_ends_another_task(tmp_path: Path) -> None:
    """Mostly not introduced by 7b5352e, but its new ``_END_LINKED_STARTED`` copies it:
    the bulk end statements pass ids through ``json_each``, which cuts ``"a\\x00b"`` to
    ``"a"`` (StartWrite.apply guards this with has_nul; EndWrite.apply does not). Task
    ``a`` (queued, an envelope already put for it) is ended, and its attempts bumped, by
    the end of ``a\\x00b``; the rowcount matching (1 == 1) hides that ``a\\x00b`` itself
    stays unended, and its start, folded into that end, is lost too (alone, the
    StartWrite's row-by-row path would have counted it)."""
    path = tmp_path / "s.db"
    await _empty_store(path)
    nul = "a\x00b"
    with sqlite(path) as conn:
        for spawn in (
            SpawnWrite(spawn_entry("a", agent="a"), "me"),
            SpawnWrite(spawn_entry(nul, agent="n"), "me"),
        ):
            SpawnWrite.apply(conn, [spawn])
        conn.execute(
            "INSERT INTO envelopes (session, task_id, body, created_ms) "
            "VALUES ('root', 'a', 'put of a', 0)"
        )
    batch: list[Write] = [StartWrite(nul), EndWrite(nul, "root", env(nul), False, "me", None)]
    _apply_merged(path, batch)
    # a: untouched (queued, no try); a\x00b: its one try counted, ended.
    assert _tasks(path) == [("a", "queued", 0), (nul, "ended", 1)]
