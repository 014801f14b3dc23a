"""A manager on a durable store: its configuration, the journal of its spawns, what a
restart finds (recovery, old ids, names, new ids drawn clear of the store's), and the
children a close cancels (delivered once, kept from another manager's recovery). In
process, on both backends: an "earlier process" is a store opened, journaled into and
closed without the children ending (its tasks are then an ended store's, as a killed
process's are); the kill -9 harness with real processes is
``test_store_journal_crash.py``."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from subagents import (
    AgentSpec,
    ConfigError,
    Mailbox,
    Request,
    RunContext,
    Status,
    SubagentConfig,
    SubagentManager,
    UnknownTask,
)
from subagents._journal import SpawnEntry
from subagents.store import INTERRUPTED, SqliteMailbox, SqliteStore, StoreError
from tests.store.support import env, sqlite

pytestmark = pytest.mark.anyio


async def _echo(request: Request, ctx: RunContext) -> str:
    return request.input.upper()


async def _forever(request: Request, ctx: RunContext) -> str:
    await anyio.sleep_forever()
    raise AssertionError  # pragma: no cover


AGENTS = [AgentSpec(name="echo", runner=_echo), AgentSpec(name="forever", runner=_forever)]


def _entry(task_id: str, session: str = "root", path: str | None = None) -> SpawnEntry:
    return SpawnEntry(
        task_id=task_id,
        session_id=session,
        parent_task=None,
        agent="forever",
        agent_path=path or f"/root/{task_id}",
        request={"input": "x"},
    )


async def _journal_and_abandon(path: Path, entries: list[SpawnEntry], start: int = 0) -> None:
    """An earlier process: spawns journaled (the first ``start`` of them running), then
    gone without any of them ending."""
    async with SqliteStore(path) as store:
        journal = store.journal()
        tokens = [journal.spawned(entry) for entry in entries]
        for entry in entries[:start]:
            journal.started(entry.task_id)
        await journal.wait_journaled(max(tokens))
        await store.wait_committed()


def _envelope_counts(path: Path) -> dict[str, int]:
    with sqlite(path) as conn:
        rows = conn.execute("SELECT task_id, count(*) FROM envelopes GROUP BY task_id").fetchall()
    return {str(task_id): int(n) for task_id, n in rows}


# ---------------------------------------------------------------- configuration


async def test_store_with_a_mailbox_factory_is_a_config_error(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        with pytest.raises(ConfigError, match="mailbox_factory"):
            SubagentManager(AGENTS, store=store, mailbox_factory=lambda sid: Mailbox())
        config = SubagentConfig(store_path=tmp_path / "t.db")
        with pytest.raises(ConfigError, match="store"):
            SubagentManager(AGENTS, store=store, config=config)


def test_store_path_is_checked() -> None:
    with pytest.raises(ConfigError, match="store_path"):
        SubagentConfig(store_path=3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="store_path"):
        SubagentConfig(store_path="")


async def test_a_given_store_makes_the_session_mailboxes(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        config = SubagentConfig(mailbox_capacity=7)
        async with SubagentManager(AGENTS, store=store, config=config) as m:
            box = m.mailbox("s")
            assert isinstance(box, SqliteMailbox)
            assert box.capacity == 7
            assert m.store is store
        assert not store.closed  # the manager leaves a store it was given open


async def test_store_path_is_opened_and_closed_by_the_manager(tmp_path: Path) -> None:
    manager = SubagentManager(AGENTS, config=SubagentConfig(store_path=tmp_path / "s.db"))
    async with manager as m:
        handle = m.spawn("echo", "hi")
        await handle.journaled()
        assert (await handle.wait()).output == "HI"
        store = m.store
        assert isinstance(store, SqliteStore)
        assert not store.closed
    assert store.closed
    with sqlite(tmp_path / "s.db") as conn:
        rows = conn.execute("SELECT task_id, state, attempts, envelope_id FROM tasks").fetchall()
    assert rows == [(handle.task_id, "ended", 1, 1)]


async def test_a_store_path_that_is_no_store_fails_the_entry(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(b"not a database at all" * 10)
    manager = SubagentManager(AGENTS, config=SubagentConfig(store_path=path))
    with pytest.raises(StoreError, match=r"not_sqlite|SQLite"):
        async with manager:
            pass  # pragma: no cover
    assert not manager.running
    assert path.read_bytes() == b"not a database at all" * 10  # left as it was


async def test_journaled_returns_at_once_without_a_store() -> None:
    async with SubagentManager(AGENTS) as m:
        handle = m.spawn("echo", "hi")
        with anyio.fail_after(1):
            await handle.journaled()


def test_mailbox_factory_with_a_store_names_the_factory(tmp_path: Path) -> None:
    factory = lambda sid: None  # noqa: E731
    store = SqliteStore(tmp_path / "s.db")
    with pytest.raises(ConfigError) as info:
        SubagentManager(AGENTS, store=store, mailbox_factory=factory)
    assert (info.value.field, info.value.got) == ("mailbox_factory", factory)
    assert "SqliteStore" not in str(info.value)


async def test_spawn_on_a_closed_given_store_raises_closed_resource_error(
    tmp_path: Path,
) -> None:
    """A given store closed under a running manager: spawn raises what its docstring says
    (the store's closed convention, anyio.ClosedResourceError), not a failure."""
    store = SqliteStore(tmp_path / "s.db")
    async with store:
        m = SubagentManager(AGENTS, store=store)
        await m.__aenter__()
    try:
        with pytest.raises(anyio.ClosedResourceError):
            m.spawn("echo", "x")
    finally:
        await m.aclose()


# ---------------------------------------------------------------- the journal


async def test_each_spawn_is_one_row_with_its_request_and_one_envelope(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with SubagentManager(AGENTS, config=SubagentConfig(store_path=path)) as m:
        done = m.spawn("echo", "a", session_id="s", name="first")
        stopped = m.spawn("forever", "b", session_id="s", timeout=None)
        queued_then_cancelled = m.spawn("forever", "c", session_id="s")
        m.cancel(queued_then_cancelled.task_id)
        await done.wait()
        await stopped.journaled()
        run = await m.execute("echo", "sync")  # an execute() is not journaled
    with sqlite(path) as conn:
        tasks = conn.execute(
            "SELECT task_id, session, agent, agent_path, request, state FROM tasks"
        ).fetchall()
        names = conn.execute("SELECT session, agent_path FROM names").fetchall()
    by_id = {row[0]: row for row in tasks}
    assert set(by_id) == {done.task_id, stopped.task_id, queued_then_cancelled.task_id}
    assert run.task_id not in by_id
    assert by_id[done.task_id][1:4] == ("s", "echo", "/root/first")
    assert b'"input":"a"' in by_id[done.task_id][4]
    assert {row[5] for row in tasks} == {"ended"}
    assert sorted(names) == [("s", "/root/first"), ("s", "/root/forever"), ("s", "/root/forever-2")]
    counts = _envelope_counts(path)
    assert counts == {t: 1 for t in by_id}  # the mailbox's row, never written twice


async def test_an_envelope_no_mailbox_took_is_written_by_the_journal(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    config = SubagentConfig(store_path=path, notify_completion=False)
    async with SubagentManager(AGENTS, config=config) as m:
        handle = m.spawn("echo", "a")
        await handle.wait()
    assert _envelope_counts(path) == {handle.task_id: 1}


def _ids(*chunks: bytes) -> Callable[[int], bytes]:
    """An ``os.urandom`` that draws ``chunks`` (6 bytes each: task ids) first, then
    ``cc``-bytes ids."""
    draws = itertools.chain(chunks, itertools.repeat(b"\xcc" * 6))
    return lambda n: b"".join(next(draws) for _ in range(n // 6))


async def test_a_task_id_the_store_holds_is_drawn_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """New ids are checked against the store, not only this process's records: an id an
    earlier process used (48 random bits over a store's whole life) is drawn again, so
    the acknowledged spawn has its own row."""
    path = tmp_path / "s.db"
    config = SubagentConfig(store_path=path)
    monkeypatch.setattr("subagents._task_ids.os.urandom", _ids(b"\xaa" * 6))
    async with SubagentManager(AGENTS, config=config) as m:
        first = m.spawn("echo", "first")
        await first.wait()
    monkeypatch.setattr("subagents._task_ids.os.urandom", _ids(b"\xaa" * 6, b"\xbb" * 6))
    async with SubagentManager(AGENTS, config=config) as m:
        second = m.spawn("echo", "second")
        await second.journaled()
        await second.wait()
    assert (first.task_id, second.task_id) == ("aaaaaaaaaaaa", "bbbbbbbbbbbb")
    with sqlite(path) as conn:
        rows = conn.execute("SELECT task_id, request FROM tasks ORDER BY task_id").fetchall()
    assert [task_id for task_id, _ in rows] == ["aaaaaaaaaaaa", "bbbbbbbbbbbb"]
    assert b'"second"' in bytes(rows[1][1])


async def test_a_task_id_clashing_with_a_concurrent_row_fails_the_spawn_loudly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process writes a row of the same id between spawn's check and the commit
    (the writer held back meanwhile): the spawn row is a plain INSERT, so journaled()
    raises instead of acknowledging a spawn with no row of its own."""
    path = tmp_path / "s.db"
    config = SubagentConfig(store_path=path)
    monkeypatch.setattr("subagents._task_ids.os.urandom", _ids(b"\xaa" * 6))
    async with SubagentManager(AGENTS, config=config) as m:
        gate = m.store._writer.gate  # type: ignore[union-attr]
        gate.acquire()  # hold the writer back
        try:
            h = m.spawn("forever", "x")
            with sqlite(path) as conn:
                conn.execute(
                    "INSERT INTO tasks (task_id, session, agent, agent_path, request, state, "
                    "owner, created_ms, updated_ms) VALUES "
                    "(?, 'other', 'forever', '/root/forever', x'7b7d', 'ended', 'x', 0, 0)",
                    (h.task_id,),
                )
        finally:
            gate.release()
        with pytest.raises(StoreError):
            await h.journaled()


# ---------------------------------------------------------------- restart


async def test_restart_gives_each_unfinished_spawn_exactly_one_interrupted_envelope(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    entries = [_entry(f"t{i}", session="s") for i in range(6)]
    await _journal_and_abandon(path, entries, start=3)
    config = SubagentConfig(store_path=path)
    async with SubagentManager(AGENTS, config=config) as m:
        got = {e.task_id: e for e in m.mailbox("s").drain_all()}
        assert set(got) == {e.task_id for e in entries}  # delivered to their session
        for envelope in got.values():
            assert envelope.status is Status.ERROR
            assert envelope.error_type == INTERRUPTED
            assert "process" in envelope.error
            assert "ended" in envelope.error
        assert (await m.wait_result("t0", timeout=0)) == got["t0"]
        assert m.result("t5") == got["t5"]
    async with SubagentManager(AGENTS, config=config) as m:  # a second restart adds none
        assert m.mailbox("s").drain_all() == []
        assert m.result("t1") == got["t1"]
    assert _envelope_counts(path) == {e.task_id: 1 for e in entries}


async def test_two_stores_recovering_at_once_give_one_envelope_each(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    entries = [_entry(f"t{i}") for i in range(50)]
    await _journal_and_abandon(path, entries)
    async with SqliteStore(path) as a, SqliteStore(path) as b:
        counts: list[int] = []

        async def recover(store: SqliteStore) -> None:
            counts.append(await store.journal().recover())

        async with anyio.create_task_group() as tg:
            tg.start_soon(recover, a)
            tg.start_soon(recover, b)
    assert sum(counts) == 50
    assert _envelope_counts(path) == {e.task_id: 1 for e in entries}


async def test_an_envelope_committed_before_the_end_was_journaled_is_not_doubled(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    await _journal_and_abandon(path, [_entry("t0"), _entry("t1")], start=2)
    async with SqliteStore(path) as store:  # t0's put committed, the process gone before "ended"
        box = store.mailbox("root")
        box.put("t0", env("t0", "finished"))
        await box.wait_committed()
    async with SubagentManager(AGENTS, config=SubagentConfig(store_path=path)) as m:
        assert (await m.wait_result("t0", timeout=0)).output == "finished"  # type: ignore[union-attr]
        assert m.result("t1").error_type == INTERRUPTED  # type: ignore[union-attr]
    assert _envelope_counts(path) == {"t0": 1, "t1": 1}


async def test_a_live_stores_spawns_are_not_recovered(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with SubagentManager(AGENTS, config=SubagentConfig(store_path=path)) as first:
        running = first.spawn("forever", timeout=None)
        await running.journaled()
        async with SubagentManager(AGENTS, config=SubagentConfig(store_path=path)) as second:
            with pytest.raises(UnknownTask):
                second.result(running.task_id)  # running elsewhere: nothing to answer yet
        assert running.result is None
    assert running.result is not None
    assert running.result.status is Status.CANCELLED
    assert _envelope_counts(path) == {running.task_id: 1}


async def test_old_ids_answer_after_a_restart_and_are_collected_once(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    config = SubagentConfig(store_path=path)
    async with SubagentManager(AGENTS, config=config) as m:
        read = m.spawn("echo", "read")
        unread = m.spawn("echo", "unread")
        await read.wait()
        await unread.done.wait()
    async with SubagentManager(AGENTS, config=config) as m:
        assert m.result(unread.task_id).output == "UNREAD"  # type: ignore[union-attr]
        assert not m.handle(unread.task_id).collected
        assert m.handle(read.task_id).collected
        assert (await m.wait_result(unread.task_id)).output == "UNREAD"  # type: ignore[union-attr]
        assert m.mailbox().drain_all() == []  # collected: out of the mailbox too
        with pytest.raises(UnknownTask):
            m.result("0123456789ab")
    async with SubagentManager(AGENTS, config=config) as m:
        assert m.mailbox().drain_all() == []
        assert m.handle(unread.task_id).collected


async def test_envelopes_never_read_stay_in_their_sessions_mailbox(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    config = SubagentConfig(store_path=path)
    async with SubagentManager(AGENTS, config=config) as m:
        handles = [m.spawn("echo", str(i), session_id="s") for i in range(3)]
        for handle in handles:
            await handle.done.wait()  # ended, never collected
    async with SubagentManager(AGENTS, config=config) as m:
        got = m.mailbox("s").drain_all()
        assert [e.task_id for e in got] == [h.task_id for h in handles]  # arrival order
        assert [e.output for e in got] == ["0", "1", "2"]
    async with SubagentManager(AGENTS, config=config) as m:
        assert m.mailbox("s").drain_all() == []  # read once


async def test_names_go_on_from_the_names_in_the_store(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    config = SubagentConfig(store_path=path)
    async with SubagentManager(AGENTS, config=config) as m:
        paths = [m.spawn("echo", session_id="s", name="w").agent_path for _ in range(3)]
        m.spawn("echo", session_id="other", name="w")
    assert paths == ["/root/w", "/root/w-2", "/root/w-3"]
    async with SubagentManager(AGENTS, config=config) as m:
        assert m.spawn("echo", session_id="s", name="w").agent_path == "/root/w-4"
        assert m.spawn("echo", session_id="s", name="w").agent_path == "/root/w-5"
        assert m.spawn("echo", session_id="other", name="w").agent_path == "/root/w-2"
        assert m.spawn("echo", session_id="new", name="w").agent_path == "/root/w"


# ---------------------------------------------------------------- children cancelled by close


async def test_a_child_cancelled_by_close_is_delivered_to_its_unopened_mailbox(
    tmp_path: Path,
) -> None:
    config = SubagentConfig(store_path=tmp_path / "s.db")
    async with SubagentManager(AGENTS, config=config) as m:
        h = m.spawn("forever", "x", session_id="s")
        await h.journaled()
    assert h.done.is_set()
    async with SubagentManager(AGENTS, config=config) as m:
        got = m.mailbox("s").drain_all()
        assert [e.task_id for e in got] == [h.task_id]


async def test_a_child_cancelled_by_close_is_delivered_to_its_open_mailbox(tmp_path: Path) -> None:
    config = SubagentConfig(store_path=tmp_path / "s.db")
    async with SubagentManager(AGENTS, config=config) as m:
        m.mailbox("s")
        h = m.spawn("forever", "x", session_id="s")
        await h.journaled()
    async with SubagentManager(AGENTS, config=config) as m:
        got = m.mailbox("s").drain_all()
        assert [e.task_id for e in got] == [h.task_id]


async def test_a_child_closed_under_notify_completion_false_is_not_delivered(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    config = SubagentConfig(store_path=path, notify_completion=False)
    async with SubagentManager(AGENTS, config=config) as manager:
        manager.spawn("forever")
        await anyio.wait_all_tasks_blocked()
    async with SqliteStore(path) as store:
        assert store.mailbox("root").drain_all() == []


async def test_a_closing_store_keeps_its_tasks_from_recovery_until_committed(
    tmp_path: Path,
) -> None:
    """A store's origin stays among the open ones until its writer has committed its queue
    (the cancelled child's put and end): a manager entered meanwhile in the same process
    recovers nothing of it, and the child has exactly one envelope, not ``Interrupted``."""
    path = tmp_path / "s.db"
    config = SubagentConfig(store_path=path, settle_timeout=0.2)  # A waits it out
    a = SubagentManager(AGENTS, config=config)
    ready = anyio.Event()
    closing = anyio.Event()
    ids: list[str] = []

    async def run_a() -> None:
        async with a:
            a.mailbox()  # a reader has opened the session's mailbox
            h = a.spawn("forever", "x")
            await h.journaled()
            await a.store.wait_committed()  # type: ignore[union-attr]
            ids.append(h.task_id)
            a.store._writer.gate.acquire()  # type: ignore[union-attr]  # stall A's writer
            writer = a.store._writer  # type: ignore[union-attr]
            stop = writer.stop

            def stopping() -> None:  # A's aclose tells its writer to stop: it is closing
                closing.set()
                stop()

            writer.stop = stopping
            ready.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run_a)
        await ready.wait()
        await closing.wait()
        assert a.store._state == "closing"  # type: ignore[union-attr]
        async with SubagentManager(AGENTS, config=config):
            pass  # its recovery runs while A's queue is stalled
        a.store._writer.gate.release()  # type: ignore[union-attr]
    with sqlite(path) as conn:
        ((n,),) = conn.execute(
            "SELECT count(*) FROM envelopes WHERE task_id = ?", (ids[0],)
        ).fetchall()
        ((d,),) = conn.execute(
            "SELECT count(*) FROM deliveries d JOIN envelopes e ON e.id = d.envelope_id "
            "WHERE e.task_id = ?",
            (ids[0],),
        ).fetchall()
        ((body,),) = conn.execute(
            "SELECT body FROM envelopes WHERE task_id = ?", (ids[0],)
        ).fetchall()
    assert (n, d) == (1, 1)
    assert b'"Interrupted"' not in body  # the process is alive; aclose cancelled the child
