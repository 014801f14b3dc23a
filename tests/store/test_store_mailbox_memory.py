"""What the durable mailbox keeps in memory to spare the event loop reads, and what that
memory must never get wrong: new ids checked 64 at a time, the capacity tally (exact
within a process, whichever object of it put), and takes that hand on from memory the
envelopes put (never one of a forgotten row whose id was reused, never kept after)."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest

from subagents import AgentSpec, MailboxFull, Request, RunContext, SubagentConfig, SubagentManager
from subagents.store import SqliteStore
from subagents.store._sqlite import Connection
from tests.store.support import block_the_loop_until_committed, env, spawn_entry, sqlite

pytestmark = pytest.mark.anyio


# ---------------------------------------------------------------- reads on the loop


def _counting_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    reads: list[int] = []
    original = Connection.read

    def read(self: Connection, query):  # type: ignore[no-untyped-def]
        reads.append(1)
        return original(self, query)

    monkeypatch.setattr(Connection, "read", read)
    return reads


async def test_new_ids_are_checked_against_the_store_64_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def noop(request: Request, ctx: RunContext) -> str:
        return "ok"

    config = SubagentConfig(store_path=tmp_path / "s.db", mailbox_capacity=1_000)
    async with SubagentManager([AgentSpec(name="noop", runner=noop)], config=config) as m:
        reads = _counting_reads(monkeypatch)
        ids = [m.spawn("noop", "").task_id for _ in range(640)]
    assert len(set(ids)) == 640
    assert 10 <= len(reads) <= 12  # 10 checks of 64 ids (and the names read, once)


async def test_puts_far_below_capacity_read_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A put counts the live entries only once its mailbox's tally (the last count plus
    the puts since) reaches capacity; the count then is exact, so capacity still holds."""
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("root", capacity=100)
        reads = _counting_reads(monkeypatch)
        for i in range(99):
            box.put(f"t{i}", env(f"t{i}"))
        assert len(reads) == 1  # the first put's count (nothing was counted before)
        box.put("t99", env("t99"))
        with pytest.raises(MailboxFull):
            box.put("t100", env("t100"))
        assert len(box.drain_all()) == 100
        reads.clear()
        box.put("again", env("again"))  # counted once more: the tally had reached capacity
        box.put("again2", env("again2"))
        assert len(reads) == 1


# ---------------------------------------------------------------- the capacity tally


async def test_a_put_into_a_mailbox_filled_by_another_object_of_the_process_is_refused(
    tmp_path: Path,
) -> None:
    """design/store.md: capacity counts the committed live entries plus this process's
    pending puts, "exact within a process"; ``store.mailbox`` makes a new object over the
    session's rows, and the entries another object of the process committed since the
    last count fill the mailbox too."""
    async with SqliteStore(tmp_path / "s.db") as store:
        first = store.mailbox("root", capacity=2)
        second = store.mailbox("root", capacity=2)
        first.put("t1", env("t1"))
        await first.wait_committed()
        second.put("t2", env("t2"))
        await second.wait_committed()
        assert len(first) == 2  # full, and both entries committed
        with pytest.raises(MailboxFull):
            first.put("t3", env("t3"))


async def test_capacity_holds_after_another_object_fills_the_rest(tmp_path: Path) -> None:
    """The same with a larger capacity: one object puts a few, another fills the rest,
    every put committed; the first object's next new id must be refused."""
    async with SqliteStore(tmp_path / "s.db") as store:
        mine = store.mailbox("root", capacity=10)
        theirs = store.mailbox("root", capacity=10)
        for i in range(3):
            mine.put(f"m{i}", env(f"m{i}"))
        await mine.wait_committed()
        for i in range(7):
            theirs.put(f"o{i}", env(f"o{i}"))
        await theirs.wait_committed()
        assert len(mine) == 10
        with pytest.raises(MailboxFull):
            mine.put("one-too-many", env("one-too-many"))


# ---------------------------------------------------------------- takes from memory


async def test_a_take_hands_on_the_envelope_put_not_a_decoded_copy(tmp_path: Path) -> None:
    """Envelopes this mailbox put are taken from the database (exactly once, with other
    processes) but handed on from memory; one another mailbox object put is decoded."""
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("root", capacity=64)
        other = store.mailbox("root", capacity=64)
        mine, durable, theirs = env("mine"), env("durable"), env("theirs")
        box.put("mine", mine)
        box.put_durable("durable", durable)
        other.put("theirs", theirs)
        await store.wait_committed()
        got = {e.task_id: e for e in box.drain_all()}
    assert got["mine"] is mine
    assert got["durable"] is durable
    assert got["theirs"] == theirs
    assert got["theirs"] is not theirs


async def test_a_durable_put_taken_before_its_commit_is_reported_is_taken_once(
    tmp_path: Path,
) -> None:
    """The writer committed it; the take (through the gate) finds the row before the
    batch's callback reveals it: it is handed on once, and its late report adds nothing
    readable."""
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("root", capacity=64)
        reported: list[str] = []
        box.committed = lambda envelope: reported.append(envelope.task_id)
        sent = env("d")
        box.put_durable("d", sent)
        # Wait for the commit from another connection, without letting the loop run.
        block_the_loop_until_committed(tmp_path / "s.db", 1, store)
        assert reported == []
        (got,) = box.drain_all()
        assert got is sent
        await store.wait_committed()
        assert reported == ["d"]
        assert box.drain_all() == []
        assert box.peek("d") is None


# Envelope row ids are ``max(id) + 1`` (no AUTOINCREMENT), so a forgotten task's envelope
# row frees its id for the next put: a mailbox still holding the forgotten envelope under
# that id would hand it on for the new row, the new envelope never delivered and the old
# one delivered a second time.


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
        block_the_loop_until_committed(path, 1, store)
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
