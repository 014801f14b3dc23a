"""Helpers of the store tests: envelopes, spawn entries, query plans, and worker processes
opening the same store."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import anyio
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from subagents import AgentSpec, DelegateResult, Request, RunContext, Status
from subagents._journal import SpawnEntry
from subagents.store import SqliteMailbox, SqliteStore

WORKER = Path(__file__).with_name("worker.py")


def env(task_id: str, output: str = "") -> DelegateResult:
    return DelegateResult(
        agent="worker",
        task_id=task_id,
        status=Status.COMPLETED,
        output=output or f"output of {task_id}",
        timestamp_ms=1,
    )


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file of ``directory`` and its bytes."""
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def spawn_entry(task_id: str, agent: str = "echo") -> SpawnEntry:
    """A spawn into the root session, as the journal records it."""
    return SpawnEntry(
        task_id=task_id,
        session_id="root",
        parent_task=None,
        agent=agent,
        agent_path=f"/root/{agent}",
        request={"input": "x"},
    )


def query_plan(path: Path, statement: str, params: object = ()) -> list[str]:
    """The steps of ``statement``'s plan in a new store at ``path``, foreign keys on (so a
    delete's checks and cascades are planned too)."""

    async def create() -> None:
        async with SqliteStore(path):
            pass

    anyio.run(create)
    with sqlite(path) as conn:
        conn.execute("PRAGMA foreign_keys = ON")
        plan = conn.execute(f"EXPLAIN QUERY PLAN {statement}", params)  # type: ignore[arg-type]
        return [str(row[3]) for row in plan]


def counted_agents(calls: list[str]) -> list[AgentSpec]:
    """``echo`` (returns its input in capitals) and ``forever``; each run appends its
    input to ``calls``."""

    async def echo(request: Request, ctx: RunContext) -> str:
        calls.append(request.input)
        return request.input.upper()

    async def forever(request: Request, ctx: RunContext) -> str:
        calls.append(request.input)
        await anyio.sleep_forever()
        raise AssertionError("unreachable")  # pragma: no cover

    return [AgentSpec(name="echo", runner=echo), AgentSpec(name="forever", runner=forever)]


@contextmanager
def sqlite(path: str | Path, **kwargs: object) -> Iterator[sqlite3.Connection]:
    """A plain connection to ``path``, committed (or rolled back) and closed at the end
    (``sqlite3.connect`` as a context manager does not close)."""
    conn = sqlite3.connect(path, **kwargs)  # type: ignore[arg-type]
    try:
        with conn:
            yield conn
    finally:
        conn.close()


class Worker:
    """A running ``worker.py``: read its lines, write to its stdin."""

    def __init__(self, process: Process) -> None:
        assert process.stdout is not None
        self.process = process
        self.killed = False
        """Set by a test that killed it: any exit code is then expected."""
        self._out = BufferedByteReceiveStream(process.stdout)

    async def line(self) -> str:
        return (await self._out.receive_until(b"\n", 1 << 26)).decode()

    async def send(self, line: str) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send(line.encode() + b"\n")


@asynccontextmanager
async def worker(
    *args: str, backend: str = "asyncio", script: Path = WORKER
) -> AsyncIterator[Worker]:
    """Start ``script *args`` (``worker.py`` by default); on exit wait for it and require
    a clean exit."""
    command = [sys.executable, str(script), *args, "--backend", backend]
    async with await anyio.open_process(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None
    ) as process:
        running = Worker(process)
        try:
            yield running
        except BaseException:
            # A failing test must fail, not hang in the process's close waiting for a
            # worker that would run forever.
            process.kill()
            running.killed = True
            raise
        with anyio.fail_after(60):
            code = await process.wait()
    assert running.killed or code == 0, f"worker {args[0]} exited with {code}"


@contextmanager
def write_locked(path: Path) -> Iterator[None]:
    """Hold the database's write lock from another connection (readers go on)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield
        conn.execute("ROLLBACK")
    finally:
        conn.close()


@contextmanager
def foreign_wal_database(path: Path) -> Iterator[sqlite3.Connection]:
    """Another program's database in WAL mode, held open with its table and row still in
    its ``-wal`` (the header on disk is stale beside it); the open connection."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.execute("INSERT INTO notes VALUES ('mine')")
        assert path.with_name(path.name + "-wal").stat().st_size > 0
        yield conn
    finally:
        conn.close()


def block_the_loop_until_committed(
    path: Path, envelopes: int, store: SqliteStore | None = None
) -> None:
    """Keep the calling thread (the event loop's, on purpose) until another connection
    sees ``envelopes`` envelope rows committed, and, given ``store``, until its writer has
    also moved its watermark past them (the writer sets it after its COMMIT returns, once
    it has the GIL back: until then this process's overlay still takes them for
    uncommitted)."""
    deadline = time.monotonic() + 60
    with sqlite(path) as conn:
        while conn.execute("SELECT count(*) FROM envelopes").fetchone()[0] < envelopes:
            assert time.monotonic() < deadline, "the writer waited for the event loop"
            time.sleep(0.001)
    if store is not None:
        block_the_loop_until_the_watermark_moves(store)


def block_the_loop_until_the_watermark_moves(store: SqliteStore) -> None:
    """Keep the calling thread (the event loop's) until the store's writer has committed
    every write submitted, by its watermark: no commit's callback has run on the loop."""
    writer = store._writer
    deadline = time.monotonic() + 60
    while writer.committed < writer.submitted:
        assert time.monotonic() < deadline, "the writer did not move its watermark"
        time.sleep(0.001)


async def committed_mailbox(store: SqliteStore, *task_ids: str) -> SqliteMailbox:
    """``store``'s mailbox of session ``s`` holding ``env(task_id)`` for each id, committed."""
    box = store.mailbox("s")
    for task_id in task_ids:
        box.put(task_id, env(task_id))
    await box.wait_committed()
    return box
