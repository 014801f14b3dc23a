"""``subagents store status|export|vacuum``: on real store files, in process (``main``
with argv) and as a real subprocess; bad files refused in one line with nothing created;
reads that change nothing, also while another process holds the store open; export's
filters and pages; vacuum shrinking a file, and giving up on a lock held elsewhere."""

from __future__ import annotations

import os
import re
import shlex
import sqlite3
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from subagents import AgentSpec, DelegateResult, Request, RunContext, SubagentManager
from subagents._cli import main
from subagents._journal import SpawnEntry
from subagents._json import loads
from subagents.store import APPLICATION_ID, SCHEMA_VERSION, SqliteStore
from subagents.store._inspect import export
from subagents.store._readonly import ReadOnlyStore
from tests.store.support import env, foreign_wal_database, snapshot, sqlite, worker

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
Capture = pytest.CaptureFixture[bytes]


def run(capture: Capture, *argv: str) -> tuple[int, bytes, str]:
    """``subagents store *argv`` in process: exit status, stdout, stderr."""
    code = main(["store", *argv])
    out, err = capture.readouterr()
    return code, out, err.decode()


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def contents(directory: Path, *names: str) -> dict[str, bytes]:
    return {name: (directory / name).read_bytes() for name in names}


def lines(out: bytes) -> list[dict[str, Any]]:
    """The JSON objects of JSON lines."""
    return [_object(line) for line in out.splitlines()]


def _object(text: bytes) -> dict[str, Any]:
    found = loads(text)
    assert isinstance(found, dict), text
    return found


async def _echo(request: Request, ctx: RunContext) -> str:
    return request.input.upper()


def _entry(task_id: str) -> SpawnEntry:
    return SpawnEntry(
        task_id=task_id,
        session_id="root",
        parent_task=None,
        agent="echo",
        agent_path=f"/root/{task_id}",
        request={"input": "x"},
    )


async def make_sample(path: Path) -> None:
    """Session ``root``: 2 children ended and collected, 1 spawn queued, 1 running.
    Session ``inbox``: ``a`` put twice (the first replaced), ``b`` past its TTL when put
    again (the first expired), ``c`` taken: a, b unread."""
    async with SqliteStore(path) as store:
        async with SubagentManager([AgentSpec(name="echo", runner=_echo)], store=store) as m:
            for handle in [m.spawn("echo", "one"), m.spawn("echo", "two")]:
                await m.wait_result(handle.task_id)
        journal = store.journal()
        tokens = [journal.spawned(_entry("queued0")), journal.spawned(_entry("running0"))]
        journal.started("running0")
        await journal.wait_journaled(max(tokens))
        now = [0.0]
        box = store.mailbox("inbox", ttl=10, clock=lambda: now[0])
        for task_id, output in [("a", "first a"), ("a", "second a"), ("b", "first b")]:
            box.put(task_id, env(task_id, output))
            await box.wait_committed()
        now[0] = 20.0
        box.put("b", env("b", "second b"))
        box.put("c", env("c"))
        await box.wait_committed()
        assert box.drain("c") is not None
        await store.wait_committed()


SAMPLE_TASKS = {"queued": 1, "running": 1, "ended": 2}
SAMPLE_DELIVERIES = {"stored": 2, "read": 3, "expired": 1, "replaced": 1}


async def make_entries(path: Path, n: int, session: str = "s") -> None:
    async with SqliteStore(path) as store:
        box = store.mailbox(session, capacity=max(n, 1))
        for i in range(n):
            box.put(f"t{i}", env(f"t{i}", "x" * 500))
        await box.wait_committed()


# ---------------------------------------------------------------- status


async def test_status_counts_every_state(tmp_path: Path, capsysbinary: Capture) -> None:
    path = tmp_path / "runs.db"
    await make_sample(path)
    code, out, err = run(capsysbinary, "status", str(path), "--json")
    assert (code, err) == (0, "")
    report = _object(out)
    assert report == {
        "path": str(path),
        "bytes": {"db": path.stat().st_size, "wal": 0, "total": path.stat().st_size},
        "schema_version": SCHEMA_VERSION,
        "schema_supported": SCHEMA_VERSION,
        "application_id": APPLICATION_ID,
        "sessions": 2,
        "tasks": SAMPLE_TASKS,
        "envelopes": 7,
        "deliveries": SAMPLE_DELIVERIES,
    }


async def test_status_prints_aligned_lines(tmp_path: Path, capsysbinary: Capture) -> None:
    path = tmp_path / "runs.db"
    await make_sample(path)
    code, out, _ = run(capsysbinary, "status", str(path))
    assert code == 0
    text = out.decode().splitlines()
    assert [line.split()[0] for line in text] == [
        "store", "size", "schema", "sessions", "tasks", "envelopes", "deliveries",
    ]  # fmt: skip
    assert len({len(re.sub(r"^(\S+\s+).*$", r"\1", line)) for line in text}) == 1
    assert text[0].endswith(str(path))
    assert "application_id 0x73756261" in text[2]
    assert text[4].endswith("4 (queued 1, running 1, ended 2)")
    assert text[6].endswith("7 (stored 2, read 3, expired 1, replaced 1)")


async def test_status_and_export_change_nothing_on_disk(
    tmp_path: Path, capsysbinary: Capture
) -> None:
    """A closed store has no -wal: a read-only connection would create -wal and -shm."""
    path = tmp_path / "runs.db"
    await make_sample(path)
    before = snapshot(tmp_path)
    assert sorted(before) == ["runs.db"]
    for argv in [("status", str(path)), ("export", str(path)), ("export", str(path), "--unread")]:
        assert run(capsysbinary, *argv)[0] == 0
    assert snapshot(tmp_path) == before


async def test_status_as_a_subprocess(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    await make_sample(path)
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database at all" * 100)
    command = [sys.executable, "-m", "subagents", "store", "status"]
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = await anyio.run_process([*command, str(path), "--json"], env=environment)
    report = _object(done.stdout)
    assert (report["tasks"], report["deliveries"]) == (SAMPLE_TASKS, SAMPLE_DELIVERIES)
    failed = await anyio.run_process([*command, str(garbage)], env=environment, check=False)
    assert failed.returncode == 1
    assert failed.stdout == b""
    assert failed.stderr.decode() == (
        f"subagents store status: store {str(garbage)!r}: not a SQLite database "
        f"(no SQLite header)\n"
    )


# ---------------------------------------------------------------- files that are not stores


def _garbage(path: Path) -> None:
    path.write_bytes(os.urandom(4096))


def _short(path: Path) -> None:
    path.write_bytes(b"SQLite format 3\x00" + b"\x00" * 20)


def _cut(path: Path, size: int) -> None:
    path.write_bytes(path.read_bytes()[:size])


async def _truncated(path: Path) -> None:
    await make_entries(path, 200)
    _cut(path, 3 * 4096)


def _other_program(path: Path) -> None:
    with sqlite(path) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")


async def _newer_schema(path: Path) -> None:
    await make_entries(path, 3)
    with sqlite(path) as conn:
        conn.execute("INSERT INTO schema_version VALUES (99, 0, 'from the future')")
        conn.execute("PRAGMA user_version = 99")


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _directory(path: Path) -> None:
    path.mkdir()


BAD: dict[str, tuple[Callable[[Path], object], str]] = {
    "garbage": (_garbage, "not a SQLite database (no SQLite header)"),
    "short": (_short, "not a SQLite database (too short for a SQLite header)"),
    "truncated": (_truncated, "truncated: the header declares"),
    "other program": (_other_program, "its application_id is 0x0"),
    "newer schema": (_newer_schema, "the store has schema version 99"),
    "missing": (lambda path: None, "no store here: no such file"),
    "empty": (_empty, "no store here: the file is empty"),
    "directory": (_directory, "the path exists and is not a regular file"),
}


@pytest.mark.parametrize("command", ["status", "export", "vacuum"])
@pytest.mark.parametrize("bad", sorted(BAD))
async def test_a_file_that_is_not_a_store_is_one_line_and_nothing_is_created(
    tmp_path: Path, capsysbinary: Capture, command: str, bad: str
) -> None:
    path = tmp_path / "runs.db"
    make, message = BAD[bad]
    made = make(path)
    if isinstance(made, Awaitable):
        await made
    before = snapshot(tmp_path)
    code, out, err = run(capsysbinary, command, str(path))
    assert code == 1
    assert out == b""
    assert err.startswith(f"subagents store {command}: store {str(path)!r}: "), err
    assert message in err
    assert err.count("\n") == 1, err
    assert snapshot(tmp_path) == before
    assert path.exists() is (bad != "missing")


async def test_a_missing_directory(tmp_path: Path, capsysbinary: Capture) -> None:
    path = tmp_path / "nowhere" / "runs.db"
    code, _, err = run(capsysbinary, "status", str(path))
    assert code == 1
    assert "does not exist" in err
    assert not path.parent.exists()


async def test_another_programs_wal_database_held_open(
    tmp_path: Path, capsysbinary: Capture
) -> None:
    """Beside a live -wal the header decides nothing: SQLite's own read of the schema
    refuses it."""
    path = tmp_path / "other.db"
    with foreign_wal_database(path):
        for command in ["status", "export"]:
            code, _, err = run(capsysbinary, command, str(path))
            assert code == 1
            assert "its application_id is 0x0" in err


# ---------------------------------------------------------------- a store another process has open


async def test_a_store_held_open_by_another_process(
    tmp_path: Path, capsysbinary: Capture, anyio_backend: str
) -> None:
    """The rows are in the other process's WAL, not in the file yet: status and export
    read them through it, and create nothing; vacuum works beside it."""
    path = tmp_path / "runs.db"
    async with worker("hold", str(path), "s", "20", backend=anyio_backend) as holder:
        assert await holder.line() == "ready"
        names = listing(tmp_path)
        assert names == ["runs.db", "runs.db-shm", "runs.db-wal"]
        on_disk = contents(tmp_path, "runs.db", "runs.db-wal")
        file_alone = f"{path.absolute().as_uri()}?mode=ro&immutable=1"
        with sqlite(file_alone, uri=True) as conn:  # the rows are not in the file yet
            assert conn.execute("SELECT count(*) FROM envelopes").fetchall() == [(0,)]
        code, out, _ = run(capsysbinary, "status", str(path), "--json")
        assert code == 0
        report = _object(out)
        assert report["envelopes"] == 20
        assert report["deliveries"] == {"stored": 20, "read": 0, "expired": 0, "replaced": 0}
        assert report["bytes"] == {
            "db": len(on_disk["runs.db"]),
            "wal": len(on_disk["runs.db-wal"]),
            "total": len(on_disk["runs.db"]) + len(on_disk["runs.db-wal"]),
        }
        code, out, _ = run(capsysbinary, "export", str(path))
        assert code == 0
        assert [line["task_id"] for line in lines(out)] == [f"h{i}" for i in range(20)]
        assert listing(tmp_path) == names
        assert contents(tmp_path, *on_disk) == on_disk
        code, out, err = run(capsysbinary, "vacuum", str(path))
        assert (code, err) == (0, "")
        await holder.send("go")  # the holder writes again, after the vacuum
        assert await holder.line() == "done"
    code, out, _ = run(capsysbinary, "status", str(path), "--json")
    report = _object(out)
    assert report["envelopes"] == 40
    with sqlite(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


async def test_a_store_whose_process_was_killed(
    tmp_path: Path, capsysbinary: Capture, anyio_backend: str
) -> None:
    """A killed writer leaves its -wal: the committed rows are read from it."""
    path = tmp_path / "runs.db"
    async with worker("hold", str(path), "s", "5", backend=anyio_backend) as holder:
        assert await holder.line() == "ready"
        holder.killed = True
        holder.process.kill()
        await holder.process.wait()
    assert (tmp_path / "runs.db-wal").stat().st_size > 0
    on_disk = contents(tmp_path, "runs.db", "runs.db-wal")
    code, out, _ = run(capsysbinary, "export", str(path), "--unread")
    assert code == 0
    assert [line["task_id"] for line in lines(out)] == [f"h{i}" for i in range(5)]
    assert contents(tmp_path, *on_disk) == on_disk


@pytest.mark.parametrize("writer_stays", [False, True])
async def test_a_read_spoiled_by_a_writer_is_made_again(tmp_path: Path, writer_stays: bool) -> None:
    """An immutable read (no -wal when it began) during which another connection wrote
    and checkpointed is thrown away and made again: through the WAL if the writer is
    still there, immutable again if it has gone."""
    path = tmp_path / "runs.db"
    await make_entries(path, 3)
    writer = sqlite3.connect(path, isolation_level=None)
    calls = []

    def count(conn: sqlite3.Connection) -> int:
        calls.append(conn)
        ((n,),) = conn.execute("SELECT count(*) FROM envelopes").fetchall()
        if len(calls) == 1:  # another process's write, while this read runs
            writer.execute(
                "INSERT INTO envelopes (session, task_id, body, created_ms) VALUES (?, ?, ?, 0)",
                ("s", "big", env("big", "x" * 100_000).to_json()),
            )
            writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            if not writer_stays:
                writer.close()
        return int(n)

    try:
        with ReadOnlyStore(path, busy_timeout=1.0) as store:
            assert store.read(count) == 4
            assert len(calls) == 2
            # With the writer there the second read went through its WAL; without, a
            # second immutable read left nothing behind.
            assert (tmp_path / "runs.db-wal").exists() is writer_stays
    finally:
        writer.close()
    assert listing(tmp_path) == ["runs.db"]


# ---------------------------------------------------------------- export


async def test_export_gives_every_delivery_of_every_envelope(
    tmp_path: Path, capsysbinary: Capture
) -> None:
    path = tmp_path / "runs.db"
    await make_sample(path)
    code, out, err = run(capsysbinary, "export", str(path))
    assert (code, err) == (0, "")
    found = lines(out)
    assert all(
        set(line) == {"session", "task_id", "envelope_id", "recipient", "state", "envelope"}
        for line in found
    )
    inbox = [(line["task_id"], line["state"]) for line in found if line["session"] == "inbox"]
    assert inbox == [("a", "replaced"), ("a", "stored"), ("b", "expired"), ("b", "stored"),
                     ("c", "read")]  # fmt: skip
    assert [line["state"] for line in found if line["session"] == "root"] == ["read", "read"]
    assert [line["envelope_id"] for line in found] == list(range(1, 8))
    for line in found:
        assert isinstance(line["envelope"], dict)
        envelope = DelegateResult.from_dict(line["envelope"])
        assert envelope.task_id == line["task_id"]
    outputs = [line["envelope"]["output"] for line in found if line["session"] == "inbox"]
    assert outputs == ["first a", "second a", "first b", "second b", "output of c"]


async def test_export_filters(tmp_path: Path, capsysbinary: Capture) -> None:
    path = tmp_path / "runs.db"
    await make_sample(path)

    def exported(*options: str) -> list[tuple[object, object, object]]:
        code, out, err = run(capsysbinary, "export", str(path), *options)
        assert (code, err) == (0, "")
        return [(line["session"], line["task_id"], line["state"]) for line in lines(out)]

    unread = [("inbox", "a", "stored"), ("inbox", "b", "stored")]
    assert exported("--unread") == unread
    assert exported("--unread", "--session", "inbox") == unread
    assert exported("--unread", "--session", "root") == []
    assert [state for _, _, state in exported("--session", "root")] == ["read", "read"]
    assert exported("--session", "nobody") == []


async def test_export_of_no_rows(tmp_path: Path, capsysbinary: Capture) -> None:
    path = tmp_path / "runs.db"
    await make_entries(path, 0)
    assert run(capsysbinary, "export", str(path)) == (0, b"", "")
    assert run(capsysbinary, "export", str(path), "--unread") == (0, b"", "")


async def test_export_to_a_file(tmp_path: Path, capsysbinary: Capture) -> None:
    path = tmp_path / "runs.db"
    await make_sample(path)
    target = tmp_path / "out.jsonl"
    target.write_text("old\n")
    assert run(capsysbinary, "export", str(path), "-o", str(target)) == (0, b"", "")
    assert len(lines(target.read_bytes())) == 7
    assert listing(tmp_path) == ["out.jsonl", "runs.db"]

    code, _, err = run(capsysbinary, "export", str(path), "-o", str(tmp_path / "no" / "x"))
    assert code == 1
    assert err.startswith("subagents store export: cannot write ")
    for over in ("", "-wal", "-shm", "-journal"):  # the store and its side files
        code, _, err = run(capsysbinary, "export", str(path), "-o", f"{path}{over}")
        assert code == 1
        assert "over the store" in err
    assert listing(tmp_path) == ["out.jsonl", "runs.db"]
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(os.urandom(4096))
    assert run(capsysbinary, "export", str(garbage), "-o", str(target))[0] == 1
    assert len(lines(target.read_bytes())) == 7, "a failed export replaced the file"
    assert listing(tmp_path) == ["garbage.db", "out.jsonl", "runs.db"]


async def test_export_pages_give_each_row_once(tmp_path: Path) -> None:
    """Pages of 1, 2 and 3 rows give what one page does, across an envelope with two
    deliveries (a page boundary between them) and one with none."""
    path = tmp_path / "runs.db"
    await make_sample(path)
    with sqlite(path) as conn:
        conn.execute(
            "INSERT INTO deliveries (envelope_id, session, recipient, task_id, stored_at, "
            "origin, changed_ms) VALUES (5, 'inbox', 'peer', 'b', 0, 'x', 0)"
        )
        conn.execute(
            "INSERT INTO envelopes (session, task_id, body, created_ms) VALUES (?, ?, ?, 0)",
            ("root", "lonely", env("lonely").to_json()),
        )
    for unread in [False, True]:
        whole = list(export(path, unread=unread, busy_timeout=1.0))
        assert len(whole) == (9 if not unread else 3)
        for chunk in [1, 2, 3]:
            assert list(export(path, unread=unread, busy_timeout=1.0, chunk=chunk)) == whole
        for session in ["inbox", "root"]:
            alone = [line for line in whole if _object(line)["session"] == session]
            assert (
                list(export(path, session=session, unread=unread, busy_timeout=1.0, chunk=1))
                == alone
            )
    lonely = _object(list(export(path, busy_timeout=1.0))[-1])
    assert lonely == {
        "session": "root",
        "task_id": "lonely",
        "envelope_id": 8,
        "recipient": None,
        "state": None,
        "envelope": env("lonely").to_dict(),
    }


async def test_an_envelope_that_is_not_json(tmp_path: Path, capsysbinary: Capture) -> None:
    path = tmp_path / "runs.db"
    await make_entries(path, 3)
    with sqlite(path) as conn:
        conn.execute("UPDATE envelopes SET body = x'7b6e6f' WHERE id = 2")
    code, out, err = run(capsysbinary, "export", str(path))
    assert code == 1
    assert len(lines(out)) == 1
    assert err.startswith(f"subagents store export: store {str(path)!r}: envelope 2 is not JSON")
    assert err.count("\n") == 1


# ---------------------------------------------------------------- vacuum


async def test_vacuum_shrinks_a_file_after_many_forgotten_rows(
    tmp_path: Path, capsysbinary: Capture
) -> None:
    path = tmp_path / "runs.db"
    await make_entries(path, 2000)
    with sqlite(path) as conn:
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("DELETE FROM envelopes WHERE id > 10")  # the deliveries cascade
    before = path.stat().st_size
    code, out, err = run(capsysbinary, "vacuum", str(path))
    assert (code, err) == (0, "")
    after = path.stat().st_size
    assert after < before / 10
    assert re.fullmatch(
        r"before  \S+ \S+ \(db .*\)\nafter   \S+ \S+ \(db .*, wal 0 B\)\n", out.decode()
    )
    with sqlite(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    code, out, _ = run(capsysbinary, "status", str(path), "--json")
    report = _object(out)
    assert (report["envelopes"], report["bytes"]["db"]) == (10, after)


async def test_vacuum_gives_up_on_a_lock_held_elsewhere(
    tmp_path: Path, capsysbinary: Capture
) -> None:
    path = tmp_path / "runs.db"
    await make_entries(path, 50)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        holder.execute("DELETE FROM deliveries")
        started = time.monotonic()
        code, out, err = run(capsysbinary, "vacuum", str(path), "--busy-timeout", "0.2")
        waited = time.monotonic() - started
        assert (code, out) == (1, b"")
        assert err == (
            f"subagents store vacuum: store {str(path)!r}: another connection held the "
            f"database for over 0.2 s (the busy timeout); nothing was vacuumed: try again "
            f"when it is idle\n"
        )
        assert waited >= 0.2  # it waited for the lock, and then gave up
        holder.execute("ROLLBACK")
    finally:
        holder.close()
    assert run(capsysbinary, "vacuum", str(path), "--busy-timeout", "0.2")[0] == 0
    code, out, _ = run(capsysbinary, "status", str(path), "--json")
    assert _object(out)["deliveries"]["stored"] == 50


@pytest.mark.parametrize("value", ["0", "-1", "soon", "inf"])
async def test_a_bad_busy_timeout_is_a_usage_error(
    tmp_path: Path, capsysbinary: Capture, value: str
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["store", "vacuum", str(tmp_path / "runs.db"), "--busy-timeout", value])
    assert info.value.code == 2
    assert "--busy-timeout" in capsysbinary.readouterr().err.decode()


# ---------------------------------------------------------------- README


async def test_the_readme_store_commands_run(
    tmp_path: Path, capsysbinary: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    commands = re.findall(r"^subagents store .*$", (ROOT / "README.md").read_text(), re.M)
    assert len(commands) >= 3
    monkeypatch.chdir(tmp_path)
    await make_sample(tmp_path / "runs.db")
    for command in commands:
        argv = shlex.split(command, comments=True)
        assert main(argv[1:]) == 0, command
        assert capsysbinary.readouterr().err == b"", command
