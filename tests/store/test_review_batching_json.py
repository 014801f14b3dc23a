"""Review of the whole-list statements (``json_each``): texts must come back exactly, and
a batch must not fail where each of its rows alone would be written.

SQLite's ``json_extract`` ends a string at an escaped NUL (``"a\\u0000b"`` gives ``'a'``),
where a bound parameter keeps every character; and one JSON parameter for a whole batch
meets ``SQLITE_LIMIT_LENGTH`` (default 1e9 bytes) at the batch's total size, where
``executemany`` met it at each body's.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from subagents import ConfigError
from subagents.store import SqliteStore
from tests.store.support import env, sqlite

pytestmark = pytest.mark.anyio


async def test_a_session_id_with_a_nul_keeps_its_rows(tmp_path: Path) -> None:
    """A session id is any ``str``; another object of the same session finds the put."""
    path = tmp_path / "s.db"
    async with SqliteStore(path) as store:
        box = store.mailbox("team\x00a")
        box.put("t", env("t"))
        await box.wait_committed()
        other = store.mailbox("team\x00a")
        assert [e.task_id for e in other.drain_all()] == ["t"]
    with sqlite(path) as conn:
        assert conn.execute("SELECT session FROM deliveries").fetchall() == [("team\x00a",)]


async def test_two_sessions_that_differ_after_a_nul_stay_apart(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        a = store.mailbox("team\x00a")
        b = store.mailbox("team\x00b")
        a.put("t", env("t", "for a"))
        b.put("t", env("t", "for b"))
        await store.wait_committed()
        reader_a = store.mailbox("team\x00a")
        reader_b = store.mailbox("team\x00b")
        assert [e.output for e in reader_a.drain_all()] == ["for a"]
        assert [e.output for e in reader_b.drain_all()] == ["for b"]


async def test_a_task_id_with_a_nul_is_found_by_another_object(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("root")
        box.put("x\x00y", env("x\x00y"))
        await box.wait_committed()
        other = store.mailbox("root")
        found = other.peek("x\x00y")
        assert found is not None


async def test_a_batch_of_bodies_each_below_the_length_limit_commits(tmp_path: Path) -> None:
    """Each body is far below SQLITE_LIMIT_LENGTH (lowered here to 100 kB so that the
    test stays small: at the default 1e9 bytes, 1,024 puts of ~1 MB, or 256 of ~4 MB,
    in one batch do the same); their batch together is above it. The store must not
    fail (a failure fails every later write too)."""
    path = tmp_path / "s.db"
    async with SqliteStore(path) as store:
        store._writer._raw.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 100_000)
        box = store.mailbox("root", capacity=64)
        store._writer.gate.acquire()  # every put below lands in one batch
        try:
            for i in range(8):
                box.put(f"t{i}", env(f"t{i}", "x" * 20_000))
        finally:
            store._writer.gate.release()
        await box.wait_committed()
    with sqlite(path) as conn:
        assert conn.execute("SELECT count(*) FROM envelopes").fetchone()[0] == 8


async def test_a_task_id_with_a_lone_surrogate_is_refused_by_the_put(tmp_path: Path) -> None:
    """Not new in this change (``executemany`` failed the same way): a task id SQLite
    cannot encode reaches the writer thread, which crashes, and the store takes no more
    writes. It should be refused by the put (as a ``ConfigError`` naming the field), the
    store left working."""
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("root")
        with pytest.raises(ConfigError, match="task_id"):
            box.put("x\ud800", env("t"))
        box.put("ok", env("ok"))
        await box.wait_committed()
