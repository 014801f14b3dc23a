"""A task's journal writes that meet in one batch are written together: a start counted in
its spawn's row while the writer has not taken it, and, in the writer, a start and an end
written by the spawn (its row inserted ended) or a start by its end. Whatever the mix, the
rows come out as writing each alone, in submission order, would leave them."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar, Self

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from subagents import AgentSpec, RunContext, SubagentConfig, SubagentManager
from subagents.store import SqliteStore
from subagents.store._journal import SqliteJournal
from subagents.store._journal_writes import EndWrite, SpawnWrite, StartWrite
from subagents.store._merging import merge_ends
from subagents.store._writer import Write, _runs
from tests.store.support import env, spawn_entry, sqlite

pytestmark = pytest.mark.anyio


class _Put(Write):
    """A mailbox's put as far as the journal sees it: its task's envelope row."""

    __slots__ = ("task_id",)

    ORDER: ClassVar[int | None] = 2

    def __init__(self, task_id: str) -> None:
        super().__init__()
        self.task_id = task_id

    @classmethod
    def apply(cls, conn: sqlite3.Connection, writes: Sequence[Self]) -> None:
        conn.executemany(
            "INSERT INTO envelopes (session, task_id, body, created_ms) VALUES ('s', ?, ?, 0)",
            [(w.task_id, f"put {w.task_id}".encode()) for w in writes],
        )


class _Barrier(Write):
    """A write that keeps its place (as a keyed spawn, a forget or a recovery does)."""

    @classmethod
    def apply(cls, conn: sqlite3.Connection, writes: Sequence[Self]) -> None:
        pass


def _writes(events: list[tuple[str, str, bool]], *, gather: bool = False) -> list[Write]:
    """The writes of ``events``, each start a write of its own; with ``gather``, as the
    journal submits them: a start whose spawn came before the open start write is added
    to it, a barrier closes it (as a keyed spawn does), and an end whose start is still
    in it withdraws the start and counts the try itself."""
    made: list[Write] = []
    spawned_at: dict[str, int] = {}
    gathering: StartWrite | None = None
    gathering_at = 0
    for kind, task_id, flag in events:
        if kind == "spawn":
            spawned_at[task_id] = len(made)
            made.append(SpawnWrite(spawn_entry(task_id, agent=f"a-{task_id}"), "me"))
        elif kind == "start":
            if gather and gathering is not None and spawned_at[task_id] < gathering_at:
                gathering.add(task_id)
                continue
            write = StartWrite(task_id)
            if gather:
                gathering, gathering_at = write, len(made)
            made.append(write)
        elif kind == "put":
            made.append(_Put(task_id))
        elif kind == "end":
            end = EndWrite(task_id, "s", env(task_id), flag, "me", None)
            if gathering is not None and gathering.withdraw(task_id):
                end.started = True
            made.append(end)
        else:
            gathering = None
            made.append(_Barrier())
    return made


def _rows(conn: sqlite3.Connection) -> dict[str, object]:
    return {
        "tasks": conn.execute(
            "SELECT t.task_id, t.state, t.attempts, e.body FROM tasks t "
            "LEFT JOIN envelopes e ON e.id = t.envelope_id ORDER BY t.task_id"
        ).fetchall(),
        "names": conn.execute("SELECT * FROM names ORDER BY agent_path").fetchall(),
        "envelopes": sorted(conn.execute("SELECT task_id, body FROM envelopes").fetchall()),
        # In arrival order: a session's takes follow it.
        "deliveries": conn.execute("SELECT task_id, state FROM deliveries ORDER BY id").fetchall(),
    }


@st.composite
def _events(draw: st.DrawFn) -> list[tuple[str, str, bool]]:
    """Each task's writes in the order the engine submits them (a spawn, its starts, a
    put only with an end, then the end), tasks interleaved, barriers between."""
    lives: dict[str, list[tuple[str, str, bool]]] = {}
    for i in range(draw(st.integers(1, 4))):
        task_id = f"t{i}"
        life = [("spawn", task_id, False)]
        life.extend([("start", task_id, False)] * draw(st.integers(0, 2)))
        if draw(st.booleans()):
            if draw(st.booleans()):
                life.append(("put", task_id, False))
            life.append(("end", task_id, draw(st.booleans())))
        lives[task_id] = life
    order = draw(st.permutations([t for t, life in lives.items() for _ in life]))
    events: list[tuple[str, str, bool]] = []
    taken = dict.fromkeys(lives, 0)
    for task_id in order:
        events.append(lives[task_id][taken[task_id]])
        taken[task_id] += 1
        if draw(st.integers(0, 5)) == 0:
            events.append(("barrier", "", False))
    return events


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(events=_events(), gather=st.booleans())
def test_a_merged_batch_leaves_the_rows_writing_each_alone_would(
    tmp_path_factory: pytest.TempPathFactory,
    empty_store: Path,
    events: list[tuple[str, str, bool]],
    gather: bool,
) -> None:
    directory = tmp_path_factory.mktemp("merge")
    alone, merged = directory / "alone.db", directory / "merged.db"
    shutil.copy(empty_store, alone)
    shutil.copy(empty_store, merged)
    with sqlite(alone) as conn:
        for write in _writes(events):
            type(write).apply(conn, [write])
        expected = _rows(conn)
    batch = _writes(events, gather=gather)
    merge_ends(batch)
    with sqlite(merged) as conn:
        for kind, run in _runs(batch):
            kind.apply(conn, run)
        assert _rows(conn) == expected


def test_an_end_is_merged_only_within_its_run() -> None:
    spawn, barrier, end = _writes(
        [("spawn", "t", False), ("barrier", "", False), ("end", "t", False)]
    )
    merge_ends([spawn, barrier, end])
    assert isinstance(spawn, SpawnWrite)
    assert isinstance(end, EndWrite)
    assert spawn.end is None
    assert spawn.order() == 0
    assert not end.merged


def test_a_spawn_written_with_its_end_goes_after_the_puts() -> None:
    spawn, start, put, end = _writes(
        [("spawn", "t", False), ("start", "t", False), ("put", "t", False), ("end", "t", False)]
    )
    batch = [spawn, start, put, end]
    merge_ends(batch)
    assert [type(w) for _, run in _runs(batch) for w in run][-1] is SpawnWrite
    assert isinstance(spawn, SpawnWrite)
    assert spawn.started
    assert spawn.end is end


# ---------------------------------------------------------------- through the manager


async def _noop(request: object, ctx: RunContext) -> str:
    return "done"


async def test_a_child_that_ends_before_its_spawn_is_committed_is_one_row_written_once(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    spec = AgentSpec(name="noop", runner=_noop)
    # A long commit delay: the child's spawn, start, put and end all wait for one commit.
    async with (
        SqliteStore(path, commit_delay=0.3) as store,
        SubagentManager([spec], store=store) as m,
    ):
        await store.wait_committed()  # the first write commits at once; now the delay holds
        before = store.statistics().writes
        handle = m.spawn("noop")
        result = await handle.wait()
        assert result.output == "done"
        # The spawn, the put and the end: the start is counted in the spawn's row.
        assert store.statistics().writes - before == 3
    with sqlite(path) as conn:
        ((state, attempts, body),) = conn.execute(
            "SELECT t.state, t.attempts, e.body FROM tasks t JOIN envelopes e "
            "ON e.id = t.envelope_id WHERE t.task_id = ?",
            (handle.task_id,),
        ).fetchall()
    assert (state, attempts) == ("ended", 1)
    assert b'"done"' in bytes(body)


async def test_a_child_started_after_its_spawn_is_committed_writes_its_start(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    release = anyio.Event()

    async def blocker(request: object, ctx: RunContext) -> str:
        await release.wait()
        return "blocked"

    specs = [AgentSpec(name="noop", runner=_noop), AgentSpec(name="blocker", runner=blocker)]
    async with (
        SqliteStore(path) as store,
        SubagentManager(specs, store=store, config=SubagentConfig(max_concurrent_spawns=1)) as m,
    ):
        first = m.spawn("blocker")
        second = m.spawn("noop")  # queued behind the blocker
        await second.journaled()  # the writer has taken and committed its spawn
        journal = m._parts.durability.journal
        assert isinstance(journal, SqliteJournal)
        assert not journal._spawns  # a spawn the writer took is held no longer
        release.set()
        assert (await second.wait()).output == "done"
        await first.wait()
    with sqlite(path) as conn:
        rows = conn.execute(
            "SELECT task_id, state, attempts FROM tasks ORDER BY task_id"
        ).fetchall()
    assert sorted(rows) == sorted([(first.task_id, "ended", 1), (second.task_id, "ended", 1)])
