"""Review of the takes that hand on envelopes from memory (``SqliteMailbox._held``).

Envelope row ids are ``max(id) + 1`` (no AUTOINCREMENT), so a forgotten task's envelope
row frees its id for the next put. A mailbox that still holds the forgotten row's
envelope under that id hands it on for the new row: the new envelope is never delivered,
and the old one is delivered a second time.
"""

from __future__ import annotations

import gc
import time
import weakref
from pathlib import Path

import pytest

from subagents.store import SqliteStore
from tests.store.support import env, spawn_entry, sqlite

pytestmark = pytest.mark.anyio


def _block_the_loop_until_committed(path: Path, envelopes: int) -> None:
    """Keep the event loop's thread until another connection sees ``envelopes`` envelope
    rows committed (the commit's callback cannot run meanwhile)."""
    deadline = time.monotonic() + 60
    with sqlite(path) as conn:
        while conn.execute("SELECT count(*) FROM envelopes").fetchone()[0] < envelopes:
            assert time.monotonic() < deadline, "the writer waited for the event loop"
            time.sleep(0.001)


async def _collect_and_forget_a_child(store: SqliteStore, path: Path) -> None:
    """What the manager does for a journaled child collected with ``wait_result`` and
    then forgotten (``forget``, or ``retain_collected``): spawn, start, put, end, take it
    alone, forget it. Its envelope row (id 1, the newest) is deleted."""
    journal = store.journal()
    box = store.mailbox("root", capacity=64)
    first = env("t1", "the first child's output")
    await journal.wait_journaled(journal.spawned(spawn_entry("t1")))
    journal.started("t1")
    box.put("t1", first)
    journal.ended("t1", "root", first)
    await store.wait_committed()
    got = box.drain("t1")
    assert got is not None
    assert got.task_id == "t1"
    journal.forgotten("t1")
    await store.wait_committed()
    with sqlite(path) as conn:
        assert conn.execute("SELECT count(*) FROM envelopes").fetchone()[0] == 0
    store.box = box  # type: ignore[attr-defined]  # the test's handle on it


async def test_a_reused_envelope_id_put_by_another_mailbox_is_taken_as_its_own(
    tmp_path: Path,
) -> None:
    """Another mailbox object of the session (or another process) puts the next envelope:
    it gets the freed id 1, and the first mailbox's take must hand on that envelope, not
    the forgotten child's it still holds under id 1."""
    path = tmp_path / "s.db"
    async with SqliteStore(path) as store:
        await _collect_and_forget_a_child(store, path)
        box = store.box  # type: ignore[attr-defined]
        other = store.mailbox("root", capacity=64)
        second = env("t2", "the second envelope")
        other.put("t2", second)
        await other.wait_committed()
        got = box.drain_all()
        assert [(e.task_id, e.output) for e in got] == [("t2", "the second envelope")]


async def test_a_reused_envelope_id_taken_before_its_commit_is_reported(tmp_path: Path) -> None:
    """One mailbox, one process: its next put gets the freed id 1, and a take between
    the commit and its callback (the courier's window, wide while the loop is busy) must
    hand on that put's envelope, not the forgotten child's."""
    path = tmp_path / "s.db"
    async with SqliteStore(path) as store:
        await _collect_and_forget_a_child(store, path)
        box = store.box  # type: ignore[attr-defined]
        second = env("t2", "the second envelope")
        box.put("t2", second)
        _block_the_loop_until_committed(path, 1)
        got = box.drain_all()
        assert [(e.task_id, e.output) for e in got] == [("t2", "the second envelope")]


async def test_an_envelope_taken_alone_is_not_kept_in_memory(tmp_path: Path) -> None:
    """``drain(task_id)`` takes the row from the database; the mailbox must not go on
    holding the envelope (up to ``capacity`` of them: a manager collecting children with
    ``wait_result`` and forgetting them would keep every one alive)."""
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("root", capacity=1_000)
        refs = []
        for i in range(100):
            envelope = env(f"t{i}")
            refs.append(weakref.ref(envelope))
            box.put(f"t{i}", envelope)
            del envelope
        await box.wait_committed()
        for i in range(100):
            assert box.drain(f"t{i}") is not None
        gc.collect()
        alive = sum(ref() is not None for ref in refs)
        assert alive == 0, f"{alive} envelopes taken stay referenced by the mailbox"
