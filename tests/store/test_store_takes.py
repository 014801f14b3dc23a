"""``SqliteMailbox.take_all``: the take is a write of the writer thread's batch, so the
event loop goes on while it waits; it takes the puts submitted before it and none after,
other processes' committed ones too, and needs nothing of the database once committed
(cancellation: ``test_store_takes_cancel.py``)."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from subagents import DelegateResult
from subagents.store import SqliteStore
from subagents.store import _deliveries as deliveries
from subagents.store import _store as store_module
from subagents.store import _writer as writer_module
from tests.store.support import env, write_locked
from tests.store.test_store_lifecycle import writer_parked
from tests.store.test_store_overlay import disk_error

pytestmark = pytest.mark.anyio


async def test_a_take_waits_for_the_writer_while_the_event_loop_goes_on(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("s")
        box.put("a", env("a"))
        got: list[DelegateResult] = []
        ran = anyio.Event()

        async def take() -> None:
            got.extend(await box.take_all())

        async def other() -> None:
            ran.set()

        async with anyio.create_task_group() as tg:
            with writer_parked(store):
                tg.start_soon(take)
                await anyio.wait_all_tasks_blocked()
                tg.start_soon(other)  # another task runs while the take waits
                await ran.wait()
                assert got == []  # the writer has not committed the take
        assert got == [env("a")]
        assert box.drain_all() == []


async def test_a_take_takes_the_puts_before_it_and_none_after(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("s")
        box.put("a", env("a"))
        got: list[DelegateResult] = []

        async def take() -> None:
            got.extend(await box.take_all())

        async with anyio.create_task_group() as tg:
            with writer_parked(store):
                tg.start_soon(take)
                await anyio.wait_all_tasks_blocked()  # the take is queued
                box.put("b", env("b"))  # after it, in the same batch
        assert got == [env("a")]
        assert box.drain_all() == [env("b")]


async def test_a_take_committed_after_its_store_gave_up_closing_still_returns_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "s.db"
    async with SqliteStore(path) as theirs:
        theirs.mailbox("s").put("a", env("a", "from the other store"))
    monkeypatch.setattr(store_module, "_CLOSE_MARGIN", 0.0)
    store = SqliteStore(path, busy_timeout=0.05)
    await store.__aenter__()
    box = store.mailbox("s")
    got: list[DelegateResult] = []
    ended = anyio.Event()

    async def take() -> None:
        got.extend(await box.take_all())
        ended.set()

    with caplog.at_level(logging.CRITICAL, logger="subagents.store"):
        async with anyio.create_task_group() as tg:
            with write_locked(path):
                tg.start_soon(take)
                await anyio.wait_all_tasks_blocked()
                await store.aclose()  # gives up on the writer, closes its connection
                assert got == []
            with anyio.fail_after(10):  # the writer commits the take once the lock is free
                await ended.wait()
    assert got == [env("a", "from the other store")]
    async with SqliteStore(path) as again:
        assert again.mailbox("s").drain_all() == []


async def test_a_put_replaced_after_a_take_was_submitted_is_taken_as_it_was(
    tmp_path: Path,
) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("s")
        box.put("a", env("a", "old"))
        await box.wait_committed()
        got: list[DelegateResult] = []

        async def take() -> None:
            got.extend(await box.take_all())

        async with anyio.create_task_group() as tg:
            with writer_parked(store):
                box.put("a", env("a", "new"))  # replaces old
                tg.start_soon(take)
                await anyio.wait_all_tasks_blocked()  # the take is queued
                box.put("a", env("a", "newest"))  # after the take: not what it takes
                assert box.peek("a") == env("a", "newest")
        assert got == [env("a", "new")]
        assert box.drain_all() == [env("a", "newest")]


async def test_a_take_decodes_what_another_store_committed(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with SqliteStore(path) as mine, SqliteStore(path) as theirs:
        put = theirs.mailbox("s")
        put.put("a", env("a", "from the other store"))
        await put.wait_committed()
        taker = mine.mailbox("s")
        consumed: list[str] = []
        taker.consumed = lambda envelope: consumed.append(envelope.task_id)
        assert await taker.take_all() == [env("a", "from the other store")]
        assert consumed == ["a"]
        assert await put.take_all() == []


async def test_a_durable_put_is_taken_with_its_commit(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("s")
        with writer_parked(store):
            box.put_durable("a", env("a"))
            assert box.drain_all() == []  # not readable before its commit
        assert await box.take_all() == [env("a")]
        assert box.drain_all() == []


async def test_a_take_after_the_store_failed_takes_what_it_kept_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("s")
        monkeypatch.setattr(deliveries, "insert", disk_error)
        with caplog.at_level(logging.CRITICAL, logger="subagents.store"):
            got: list[DelegateResult] = []

            async def take() -> None:
                got.extend(await box.take_all())

            async with anyio.create_task_group() as tg:
                with writer_parked(store):
                    box.put("a", env("a"))  # its batch fails, the take's with it
                    tg.start_soon(take)
                    await anyio.wait_all_tasks_blocked()
            assert got == [env("a")]
            assert await box.take_all() == []  # refused at once: drain_all answers


async def test_a_take_in_a_retried_transaction_takes_the_rows_of_the_try_that_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy answer rolls back the take's batch after a put's insert; another process
    commits a row, with the delivery id that put had, before the retry: the take hands on
    the other process's row, not the put (still to be written after it)."""
    path = tmp_path / "s.db"
    async with SqliteStore(path) as store:
        box = store.mailbox("s")
        box.put("seed", env("seed"))
        await box.wait_committed()
        assert box.drain_all() == [env("seed")]
        state = {"inserts": 0, "begins": 0, "armed": False}
        real_insert = deliveries.insert
        real_immediate = writer_module.immediate

        def insert(conn: sqlite3.Connection, entries: Any, ms: int) -> None:
            real_insert(conn, entries, ms)
            if state["armed"] and state["inserts"] == 0:
                state["inserts"] += 1
                exc = sqlite3.OperationalError("database is locked")
                exc.sqlite_errorcode = sqlite3.SQLITE_BUSY  # type: ignore[attr-defined]
                raise exc

        @contextmanager
        def immediate(raw: sqlite3.Connection) -> Iterator[None]:
            if state["armed"]:
                state["begins"] += 1
                if state["begins"] == 2:  # between the two attempts: another process commits
                    other = sqlite3.connect(path, isolation_level=None)
                    body = env("a", "foreign").to_json()
                    cur = other.execute(
                        "INSERT INTO envelopes (session, task_id, body, created_ms) "
                        "VALUES ('s', 'a', ?, 0)",
                        (body,),
                    )
                    other.execute(
                        "INSERT INTO deliveries (envelope_id, session, recipient, task_id, state,"
                        " stored_at, expires_at, origin, consumer, changed_ms)"
                        " VALUES (?, 's', '', 'a', 'stored', 0, NULL, 'other', NULL, 0)",
                        (cur.lastrowid,),
                    )
                    other.close()
            with real_immediate(raw):
                yield

        monkeypatch.setattr(deliveries, "insert", insert)
        monkeypatch.setattr(writer_module, "immediate", immediate)
        got: list[DelegateResult] = []

        async def take() -> None:
            got.extend(await box.take_all())

        async with anyio.create_task_group() as tg:
            with writer_parked(store):
                tg.start_soon(take)
                await anyio.wait_all_tasks_blocked()
                box.put("a", env("a", "after"))  # after the take's call, same batch
                state["armed"] = True
        await box.wait_committed()
        assert [envelope.output for envelope in got] == ["foreign"]
        assert [envelope.output for envelope in box.drain_all()] == ["after"]
