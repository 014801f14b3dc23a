"""The durable mailbox's overlay at its edges: a key hidden by a put consumed here or
expired before its commit, against capacity; a take that meets a failing batch; a
``put_durable`` kept in memory after a failure, against its TTL."""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

import pytest

from subagents import MailboxFull
from subagents.store import SqliteStore, StoreError
from subagents.store import _deliveries as deliveries
from tests.store.support import env
from tests.store.test_store_lifecycle import Clock, GateWatched, writer_parked

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("hidden_by", ["claimed", "expired"])
async def test_a_put_into_a_mailbox_whose_only_row_is_hidden_is_accepted(
    tmp_path: Path, hidden_by: str
) -> None:
    """The session's one committed row is hidden by this object's put over it (taken
    here, or past its TTL, before the writer took it): the mailbox is empty (``len`` 0),
    so a put of a new id is accepted, not refused as full."""
    clock = Clock()
    async with SqliteStore(tmp_path / "store.db") as store:
        keeping = store.mailbox("s", capacity=1, clock=clock)
        box = store.mailbox("s", capacity=1, ttl=1.0, clock=clock)
        keeping.put("a", env("a", "first"))
        await keeping.wait_committed()
        with writer_parked(store):
            assert box.put("a", env("a", "second"))  # replaces a: accepted
            if hidden_by == "claimed":
                assert box.drain("a") == env("a", "second")
            else:
                clock.now += 2
            assert len(box) == 0
            assert box.put("b", env("b"))
        await box.wait_committed()
        assert [e.task_id for e in keeping.drain_all()] == ["b"]


@pytest.mark.parametrize("method", ["put", "put_durable"])
async def test_a_put_of_a_hidden_id_into_a_full_mailbox_is_refused(
    tmp_path: Path, method: str
) -> None:
    """An id whose committed row is hidden (this object's put over it was taken here) has
    no entry to replace: into a full mailbox its next put is a new entry, refused."""
    async with SqliteStore(tmp_path / "store.db") as store:
        box = store.mailbox("s", capacity=2)
        box.put("a", env("a", "first"))
        await box.wait_committed()
        with writer_parked(store):
            box.put("a", env("a", "second"))
            assert box.drain("a") == env("a", "second")
            box.put("b", env("b"))
            box.put("c", env("c"))
            assert len(box) == 2  # full
            with pytest.raises(MailboxFull):
                getattr(box, method)("a", env("a", "third"))
            assert len(box) == 2
        await box.wait_committed()
        assert [e.task_id for e in box.drain_all()] == ["b", "c"]


def disk_error(*args: object) -> None:
    raise sqlite3.OperationalError("disk I/O error")


def a_bug(*args: object) -> None:
    raise RuntimeError("a bug in the writer")


@pytest.mark.parametrize("error", [disk_error, a_bug], ids=["sqlite", "bug"])
async def test_a_take_waiting_for_a_failing_batch_gets_the_put_handed_back_not_the_row_it_replaced(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    error: object,
) -> None:
    """``drain`` of an id whose put over a committed row is in the writer's failing batch
    waits for it at the gate; the batch is handed back, never written, so the older row is
    still ``stored``: the take gets the put (the id's entry), not the row it overwrote,
    and the put is not lost."""
    async with SqliteStore(tmp_path / "store.db") as store:
        box = store.mailbox("s")
        box.put("a", env("a", "first"))
        await box.wait_committed()
        writer = store._writer
        failing, go = threading.Event(), threading.Event()
        fail = writer._fail

        def slow_fail(failure: StoreError, batch: list) -> list:  # type: ignore[type-arg]
            failing.set()  # the transaction rolled back; the gate is held
            go.wait(30)
            return fail(failure, batch)

        writer._fail = slow_fail  # type: ignore[method-assign]
        monkeypatch.setattr(deliveries, "insert", error)
        box._conn._gate = GateWatched(box._conn._gate, trying=go)  # type: ignore[arg-type]
        with caplog.at_level(logging.CRITICAL, logger="subagents.store"):
            box.put("a", env("a", "second"))
            assert failing.wait(30)  # the put is in the writer's hands
            try:
                got = box.drain("a")
            finally:
                go.set()
            with pytest.raises(StoreError):
                await box.wait_committed()
        assert got == env("a", "second")
        assert box.peek("a") is None
        assert box.drain_all() == []


async def test_a_durable_put_kept_after_a_failure_expires_in_its_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A ``put_durable`` the store failed to commit, kept here as an entry, expires at its
    own TTL although a later put's entry came before it: past it, ``len`` and
    ``drain_all`` leave it out."""
    clock = Clock()
    async with SqliteStore(tmp_path / "store.db") as store:
        box = store.mailbox("s", ttl=10.0, clock=clock)
        with writer_parked(store):
            box.put_durable("a", env("a"))
            clock.now += 5
            box.put("b", env("b"))
            monkeypatch.setattr(deliveries, "insert", disk_error)
        with caplog.at_level(logging.CRITICAL, logger="subagents.store"), pytest.raises(StoreError):
            await box.wait_committed()
        assert box.peek("a") == env("a")  # kept here
        clock.now += 6  # a's TTL has passed, b's has not
        assert box.peek("a") is None
        assert len(box) == 1
        assert box.drain_all() == [env("b")]


async def test_an_entry_past_its_ttl_out_of_turn_is_neither_counted_nor_drained(
    tmp_path: Path,
) -> None:
    """The clock steps back between two puts, so the later one expires first: while
    neither is committed, ``len`` counts only the live one and ``drain_all`` takes only it."""
    clock = Clock()
    async with SqliteStore(tmp_path / "store.db") as store:
        box = store.mailbox("s", ttl=10.0, clock=clock)
        with writer_parked(store):
            box.put("a", env("a"))  # expires at 1010
            clock.now = 990.0
            box.put("b", env("b"))  # expires at 1000, behind a
            clock.now = 1005.0
            assert len(box) == 1
            assert box.drain_all() == [env("a")]
        await box.wait_committed()
        assert len(box) == 0
        assert box.drain_all() == []
