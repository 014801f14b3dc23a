"""How the store batches: the writer's reordering of a batch by class, whole lists in one
statement (every byte kept, NULs too, a batch never failing where its rows alone would
be written), and its hand-off that never waits for the event loop, nor for one that has
ended. What the mailbox keeps in memory is ``test_store_mailbox_memory.py``."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Self

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from subagents import AgentSpec, ConfigError, Request, RunContext, SubagentConfig, SubagentManager
from subagents._journal import SpawnEntry
from subagents.store import SqliteStore, _writer
from subagents.store._bulk import has_nul
from subagents.store._journal import _TAKEN
from subagents.store._journal_writes import _END_LINKED, _INSERT_TASKS, _START_TASKS, _UNENDED
from subagents.store._writer import Write, _runs
from tests.store.support import block_the_loop_until_committed, env, query_plan, sqlite

pytestmark = pytest.mark.anyio


# ---------------------------------------------------------------- reordering a batch


class _Probe(Write):
    """A write that only says who it is; subclasses set the order."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    @classmethod
    def apply(cls, conn: sqlite3.Connection, writes: Sequence[Self]) -> None:
        raise AssertionError("not applied here")


class _First(_Probe):
    ORDER: ClassVar[int | None] = 0


class _Second(_Probe):
    ORDER: ClassVar[int | None] = 1


class _Third(_Probe):
    ORDER: ClassVar[int | None] = 2


class _InPlace(_Probe):
    pass


_KINDS: dict[str, type[_Probe]] = {"a": _First, "b": _Second, "c": _Third, "x": _InPlace}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(sorted(_KINDS)), max_size=40))
def test_a_batch_runs_by_class_between_writes_that_keep_their_place(kinds: list[str]) -> None:
    batch: list[Write] = [_KINDS[kind](f"{kind}{i}") for i, kind in enumerate(kinds)]
    runs = list(_runs(batch))
    applied = [write for _, run in runs for write in run]
    # Every write once.
    assert sorted(id(w) for w in applied) == sorted(id(w) for w in batch)
    for kind, run in runs:
        assert run
        assert all(type(w) is kind for w in run)
    # A write with no order keeps its place: everything before it is applied before it.
    position = {id(w): i for i, w in enumerate(applied)}
    for i, write in enumerate(batch):
        if write.order() is None:
            assert {id(w) for w in applied[: position[id(write)]]} == {id(w) for w in batch[:i]}
    # Between two of them each class runs once, in increasing order, its writes in order.
    segments: list[list[Write]] = [[]]
    for write in batch:
        if write.order() is None:
            segments.append([])
        else:
            segments[-1].append(write)
    movable_runs = [run for kind, run in runs if kind.ORDER is not None]
    expected = []
    for segment in segments:
        for kind in (_First, _Second, _Third):
            run = [w for w in segment if type(w) is kind]
            if run:
                expected.append(run)
    assert movable_runs == expected
    # Consecutive writes without an order, of one class, make one run.
    for _kind, run in runs:
        if run[0].order() is None:
            at = [batch.index(w) for w in run]
            assert at == list(range(at[0], at[0] + len(at)))


def test_a_keyed_spawn_keeps_its_place() -> None:
    from subagents.store._journal_writes import SpawnWrite

    def entry(key: str | None) -> SpawnEntry:
        return SpawnEntry(
            task_id="t",
            session_id="root",
            parent_task=None,
            agent="a",
            agent_path="/root/a",
            request={},
            idempotency_key=key,
        )

    assert SpawnWrite(entry(None), "me").order() == 0
    assert SpawnWrite(entry("k"), "me").order() is None


def test_the_whole_list_statements_read_by_index(tmp_path: Path) -> None:
    """Each runs one step over the JSON list and finds every row by an index."""
    for name, statement, params in (
        ("end", _END_LINKED, {"ids": '["a"]', "started": '["a"]', "ms": 1}),
        ("start", _START_TASKS, {"ids": '["a"]', "ms": 1}),
        ("unended", _UNENDED, {"ids": '["a"]'}),
        (
            "spawn ended",
            _INSERT_TASKS,
            {"rows": '[["a","s",null,"x","x","{}",1]]', "owner": "o", "ms": 1, "ended": 1},
        ),
        ("taken", _TAKEN, {"ids": '["a"]'}),
    ):
        plan = query_plan(tmp_path / f"{name}.db", statement, params)
        scans = [step for step in plan if step.startswith("SCAN")]
        assert scans
        assert all("VIRTUAL TABLE" in step for step in scans), plan  # json_each alone


# ---------------------------------------------------------------- what the rows hold

_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=60)


@settings(max_examples=60, deadline=None)
@given(outputs=st.lists(_TEXT, min_size=1, max_size=8), prompt=_TEXT)
def test_bodies_and_requests_written_as_lists_keep_every_byte(
    tmp_path_factory: pytest.TempPathFactory, outputs: list[str], prompt: str
) -> None:
    """Texts travel to SQLite inside one JSON list and back as blobs: what another
    mailbox object reads (decoding the row) is what was put, byte for byte."""
    path = tmp_path_factory.mktemp("bytes") / "s.db"
    entry = SpawnEntry(
        task_id="t0",
        session_id="root",
        parent_task=None,
        agent="a",
        agent_path="/root/a",
        request={"input": prompt},
    )

    async def main() -> list[bytes]:
        async with SqliteStore(path) as store:
            journal = store.journal()
            await journal.wait_journaled(journal.spawned(entry))
            box = store.mailbox("root", capacity=64)
            for i, output in enumerate(outputs):
                box.put(f"t{i}", env(f"t{i}", output))
            await box.wait_committed()
            other = store.mailbox("root", capacity=64)  # holds none of them in memory
            got = other.drain_all()
            assert [e.output for e in got] == [
                e or f"output of t{i}" for i, e in enumerate(outputs)
            ]
            return [e.to_json() for e in got]

    bodies = anyio.run(main)
    expected = [env(f"t{i}", output).to_json() for i, output in enumerate(outputs)]
    assert bodies == expected
    with sqlite(path) as conn:
        stored = [bytes(b) for (b,) in conn.execute("SELECT body FROM envelopes ORDER BY id")]
        ((request,),) = conn.execute("SELECT request FROM tasks").fetchall()
    assert stored == expected
    from subagents._json import dumps

    assert bytes(request) == dumps({"input": prompt})


# The whole-list statements read their rows with ``json_each``. SQLite's ``json_extract``
# ends a string at an escaped NUL (``"a\u0000b"`` gives ``'a'``) where a bound parameter
# keeps every character; and one JSON parameter for a whole batch meets
# ``SQLITE_LIMIT_LENGTH`` (default 1e9 bytes) at the batch's total size, where each row
# alone meets it at its own body's.


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
    """A task id SQLite cannot encode is refused by the put (as a ``ConfigError`` naming
    the field), the store left working: reaching the writer thread, it would crash it, and
    the store would take no more writes."""
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("root")
        with pytest.raises(ConfigError, match="task_id"):
            box.put("x\ud800", env("t"))
        box.put("ok", env("ok"))
        await box.wait_committed()


# ---------------------------------------------------------------- the hand-off


async def test_the_writer_commits_while_the_event_loop_is_busy(tmp_path: Path) -> None:
    """The writer hands each batch's callback to the courier and goes on: with the event
    loop thread blocked (a runner that never yields, a long computation), several batches
    still commit, and their callbacks run, in order, once the loop is back."""
    path = tmp_path / "s.db"
    async with SqliteStore(path) as store:
        box = store.mailbox("root", capacity=10_000)
        order: list[str] = []
        box.committed = lambda envelope: order.append(envelope.task_id)
        box.put("first", env("first"))
        await box.wait_committed()
        order.clear()
        # From here the loop thread does not return to the event loop until a second
        # connection sees every one of 2,000 puts committed, in batches of at most 1,024.
        for i in range(2_000):
            box.put(f"t{i}", env(f"t{i}"))
        block_the_loop_until_committed(path, 2_001, store)
        assert order == []  # no callback ran: the loop was busy all along
        await box.wait_committed()
        assert store.statistics().batches >= 3
        assert order == [f"t{i}" for i in range(2_000)]


async def test_journaled_children_run_back_to_back_yield_to_the_event_loop(
    tmp_path: Path,
) -> None:
    """A worker running queued journaled children that never yield still lets other
    tasks (and the store's callbacks) run every few children."""
    ran: list[int] = []
    seen: list[int] = []

    async def noop(request: Request, ctx: RunContext) -> str:
        ran.append(1)
        return "ok"

    config = SubagentConfig(store_path=tmp_path / "s.db", max_concurrent_spawns=1)
    async with SubagentManager([AgentSpec(name="noop", runner=noop)], config=config) as m:
        handles = [m.spawn("noop", "") for _ in range(64)]

        async def watch() -> None:
            while len(ran) < 64:
                seen.append(len(ran))
                await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
        for handle in handles:
            await handle.wait()
    assert any(0 < count < 64 for count in seen), seen


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("start", ["a-batch-in-flight", "the-writer-idle"])
def test_a_busy_event_loop_putting_lets_the_writer_commit(
    tmp_path: Path, backend: str, start: str
) -> None:
    """Between two SQLite calls, and to return from its wait for work, the writer thread
    needs the GIL. A thread that only releases it for moments (as an event loop does at
    each checkpoint) wakes that wait for the GIL over and over without giving it up for
    long, so the writer can starve for as long as the loop stays busy; ``submit`` pauses
    every so many writes while the writer may want the GIL, and the writer commits.
    (``busy_worker.py --no-make-way`` starves for its whole 10 s here: a check by hand,
    not asserted, since whether the GIL changes hands without the pause depends on the
    machine.)"""
    worker = Path(__file__).with_name("busy_worker.py")
    argv = [sys.executable, str(worker), str(tmp_path / "s.db"), "--backend", backend]
    if start == "the-writer-idle":
        argv.append("--idle-first")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("committed "), done.stdout


async def test_submit_pauses_while_the_writer_works_and_not_while_it_idles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One pause in 64 writes while the writer thread may want the GIL (here, woken by
    the first of them, it waits at the gate, which a take would hold); none from a
    writer that has had nothing to do."""
    paused: list[float] = []
    monkeypatch.setattr(_writer, "_pause", paused.append)
    async with SqliteStore(tmp_path / "idle.db") as store:
        assert store._writer.submitted == 0
        store._writer._make_way()
        assert paused == []
    async with SqliteStore(tmp_path / "s.db") as store:
        box = store.mailbox("root", capacity=1_000)
        box.put("first", env("first"))
        await box.wait_committed()  # the writer is awake, or waits for the next put
        paused.clear()
        store._writer.gate.acquire()  # the writer, woken, waits here with its batch
        try:
            for i in range(_writer._HANDOFF_EVERY - 1):  # the 64th write, counting "first"
                box.put(f"t{i}", env(f"t{i}"))
        finally:
            store._writer.gate.release()
        await box.wait_committed()
    assert paused == [_writer._GIL_HANDOFF]


def unstarted_writer(path: Path, **options: Any) -> _writer.Writer:
    """A writer whose thread never runs: its hints are what the test sets them to."""
    raw = sqlite3.connect(path, check_same_thread=False)
    return _writer.Writer(
        raw,
        path=str(path),
        busy_timeout=1.0,
        token=anyio.lowlevel.current_token(),
        on_batch=lambda *args: None,
        on_stopped=lambda: None,
        **options,
    )


@pytest.mark.parametrize(
    "state",
    ["woken-for-work", "its-wait-run-out", "a-full-batch-queued", "its-wait-running"],
)
async def test_the_pause_comes_when_the_writer_may_want_the_gil(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str
) -> None:
    """Each reason the writer thread may want the GIL makes the 64th write pause; a
    writer not woken, with its wait still running and no full batch, makes none."""
    paused: list[float] = []
    monkeypatch.setattr(_writer, "_pause", paused.append)
    full = state == "a-full-batch-queued"
    writer = unstarted_writer(
        tmp_path / "w.db", eager_batch=_writer._HANDOFF_EVERY if full else 256
    )
    if state == "woken-for-work":
        writer._want = 1  # as its thread sets it to wait for one write: the first wakes it
    elif state == "its-wait-run-out":
        writer._wait_ends = time.monotonic() - 1
    else:
        writer._wait_ends = time.monotonic() + 3600
    for n in range(_writer._HANDOFF_EVERY):
        writer.submit(_InPlace(f"w{n}"))
    writer._raw.close()
    assert paused == ([] if state == "its-wait-running" else [_writer._GIL_HANDOFF])


def test_the_courier_drops_calls_once_the_event_loop_has_ended(tmp_path: Path) -> None:
    """A store never closed: the put still commits after the event loop has ended, and
    the writer and courier threads end when stopped, with nobody left to tell."""
    stores: list[SqliteStore] = []

    async def main() -> None:
        store = SqliteStore(tmp_path / "s.db")
        await store.__aenter__()
        stores.append(store)
        store._writer.gate.acquire()  # the put commits only after the loop has ended
        store.mailbox("root").put("a", env("a"))

    anyio.run(main)
    (store,) = stores
    store._writer.gate.release()
    store._writer.stop()
    store._watcher.stop()
    try:
        assert store._writer.join(30)
        assert store._writer._courier.join(30)
        assert store._watcher.join(30)
    finally:
        store._conn.close()
    with sqlite(tmp_path / "s.db") as conn:
        assert conn.execute("SELECT task_id FROM envelopes").fetchall() == [("a",)]


def _envelopes(path: Path) -> int:
    with sqlite(path) as conn:
        return int(conn.execute("SELECT count(*) FROM envelopes").fetchone()[0])


def test_every_put_commits_after_the_event_loop_has_ended(tmp_path: Path) -> None:
    """A store never closed, more puts queued than one batch: the writer opens a
    transaction with fewer than ``eager_batch`` writes queued only once every committed
    batch's callback has run, and the courier drops the callbacks once the loop has
    ended; the rest of the queue must commit all the same."""
    path = tmp_path / "s.db"
    stores: list[SqliteStore] = []

    async def main() -> None:
        store = SqliteStore(path)
        await store.__aenter__()
        stores.append(store)
        store._writer.gate.acquire()  # nothing commits before the loop has ended
        box = store.mailbox("root", capacity=2_000)
        for i in range(1_100):  # one batch of 1,024 (max_batch), then 76
            box.put(f"t{i}", env(f"t{i}"))

    anyio.run(main)
    (store,) = stores
    store._writer.gate.release()
    try:
        deadline = time.monotonic() + 30
        while _envelopes(path) < 1_100 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _envelopes(path) == 1_100, "queued puts never committed"
    finally:
        store._writer.stop()
        store._watcher.stop()
        store._writer.join(30)
        courier = getattr(store._writer, "_courier", None)
        if courier is not None:
            courier.join(30)
        store._watcher.join(30)
        store._conn.close()


async def test_a_commit_delay_gathers_writes_that_trickle_in_into_one_commit(
    tmp_path: Path,
) -> None:
    """With ``commit_delay`` the writer opens no transaction sooner than that after its
    last commit: puts that arrive one by one in the meantime share one commit (and one
    fsync), where without it the first would be committed alone at once."""
    delay = 1.0  # far beyond the puts' own 40 ms, so a loaded machine keeps them in it
    async with SqliteStore(tmp_path / "s.db", commit_delay=delay) as store:
        box = store.mailbox("root")
        box.put("first", env("first"))
        await box.wait_committed()
        committed = time.monotonic()
        before = store.statistics().batches
        for i in range(4):
            box.put(f"t{i}", env(f"t{i}"))
            await anyio.sleep(0.01)  # passes time: each put comes alone, as a batch's do
        await box.wait_committed()
        assert time.monotonic() - committed >= delay * 0.9
        assert store.statistics().batches == before + 1
        assert all(box.peek(f"t{i}") is not None for i in range(4))


async def test_closing_a_store_commits_what_waits_out_a_commit_delay_at_once(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    async with SqliteStore(path, commit_delay=60.0) as store:
        box = store.mailbox("root")
        box.put("first", env("first"))
        await box.wait_committed()
        box.put("second", env("second"))  # its commit is 60 s away
        with anyio.fail_after(30):  # bounds the failure only: the close commits at once
            await store.aclose()
    async with SqliteStore(path) as store:
        assert store.mailbox("root").peek("second") is not None


@pytest.mark.parametrize("field", ["busy_timeout", "poll_interval", "commit_delay"])
def test_a_wait_longer_than_a_thread_can_wait_is_a_config_error_naming_it(
    tmp_path: Path, field: str
) -> None:
    # Beyond threading.TIMEOUT_MAX the store's writer or watcher would die on its first
    # wait, and every write with it.
    with pytest.raises(ConfigError, match=f"^{field}"):
        SqliteStore(tmp_path / "s.db", **{field: threading.TIMEOUT_MAX * 2})  # type: ignore[arg-type]


@pytest.mark.parametrize("delay", [-1.0, float("nan"), "0.1"])
def test_a_commit_delay_out_of_range_is_a_config_error_naming_it(
    tmp_path: Path, delay: object
) -> None:
    with pytest.raises(ConfigError, match="commit_delay"):
        SqliteStore(tmp_path / "s.db", commit_delay=delay)  # type: ignore[arg-type]


async def test_the_first_write_after_opening_commits_at_once_whatever_the_commit_delay(
    tmp_path: Path,
) -> None:
    # The delay counts from the last commit; before the first there is none, so the
    # first write must not wait (a delay longer than the clock's count since boot did).
    delay = time.monotonic() + 600.0
    async with SqliteStore(tmp_path / "s.db", commit_delay=delay) as store:
        box = store.mailbox("root")
        box.put("first", env("first"))
        with anyio.fail_after(10):  # bounds the failure only: the commit comes at once
            await box.wait_committed()


def test_has_nul_finds_a_nul_in_any_text_and_skips_none() -> None:
    assert not has_nul([])
    assert not has_nul(["a", None, "", "b"])
    assert has_nul([None, "a\x00b"])
    assert has_nul(["a", "\x00"])
