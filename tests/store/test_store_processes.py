"""Several processes, one store file: each envelope taken exactly once, writes that wait
for each other's locks instead of failing, and waiters woken by another process's commit.

Real processes (``worker.py``) and real files; no sleeps: the processes say what they are
doing on stdout, and the tests wait for those lines.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import anyio
import pytest

from subagents import DelegateResult
from subagents._json import loads
from subagents.store import SqliteStore
from tests.store.support import env, sqlite, worker

pytestmark = pytest.mark.anyio

DRAIN_N = int(os.environ.get("SUBAGENTS_STORE_DRAIN_N", "10000"))
"""Envelopes the 8 drainers share (the issue's size by default)."""
DRAINERS = 8


async def test_eight_processes_drain_one_session_each_envelope_exactly_once(
    tmp_path: Path, anyio_backend: str
) -> None:
    path = str(tmp_path / "drain.db")
    async with SqliteStore(path, synchronous="NORMAL") as store:
        box = store.mailbox("shared", capacity=DRAIN_N)
        for i in range(DRAIN_N):
            box.put(f"t{i}", env(f"t{i}"))
        await box.wait_committed()
    taken: dict[int, list[str]] = {}

    async def drainer(n: int) -> None:
        async with worker(
            "drain", path, "shared", str(DRAIN_N), str(n), backend=anyio_backend
        ) as proc:
            assert await proc.line() == "ready"
            ready.append(proc)
            if len(ready) == DRAINERS:
                go.set()
            await go.wait()
            await proc.send("go")  # all eight start together
            taken[n] = [str(task_id) for task_id in loads(await proc.line())]  # type: ignore[union-attr]

    ready: list[object] = []
    go = anyio.Event()
    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            for n in range(DRAINERS):
                tg.start_soon(drainer, n)
    counts = Counter(task_id for ids in taken.values() for task_id in ids)
    twice = [task_id for task_id, times in counts.items() if times > 1]
    assert not twice, f"{len(twice)} envelopes were taken more than once: {twice[:5]}"
    lost = {f"t{i}" for i in range(DRAIN_N)} - set(counts)
    assert not lost, f"{len(lost)} envelopes were never taken: {sorted(lost)[:5]}"
    assert sum(len(ids) for ids in taken.values()) == DRAIN_N
    assert sum(1 for ids in taken.values() if ids) >= 2, "one process took everything"
    with sqlite(path) as conn:
        states = dict(conn.execute("SELECT state, count(*) FROM deliveries GROUP BY state"))
        consumers = conn.execute("SELECT count(DISTINCT consumer) FROM deliveries").fetchall()
    assert states == {"read": DRAIN_N}
    assert consumers[0][0] == sum(1 for ids in taken.values() if ids)


async def test_four_processes_writing_at_once_all_commit(
    tmp_path: Path, anyio_backend: str
) -> None:
    """Every writer's ``BEGIN IMMEDIATE`` waits its turn: none fails, none is lost."""
    path = str(tmp_path / "writers.db")
    async with SqliteStore(path):
        pass  # create it, so the writers only open it

    async def writer(n: int) -> None:
        async with worker("put", path, "shared", "500", f"w{n}-", backend=anyio_backend) as proc:
            assert await proc.line() == "done"

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for n in range(4):
                tg.start_soon(writer, n)
    async with SqliteStore(path) as store:
        box = store.mailbox("shared", capacity=10_000)
        assert len(box) == 2_000
        got = box.drain_all()
    assert sorted(e.task_id for e in got) == sorted(
        f"w{n}-{i}" for n in range(4) for i in range(500)
    )
    # Each writer's own puts arrive in the order it made them.
    for n in range(4):
        mine = [e.task_id for e in got if e.task_id.startswith(f"w{n}-")]
        assert mine == [f"w{n}-{i}" for i in range(500)]


def test_read_then_write_transactions_across_processes_lose_no_update(tmp_path: Path) -> None:
    """Four processes increment one counter 250 times each, reading it and writing it back
    inside ``BEGIN IMMEDIATE`` with a busy timeout far shorter than the contention: the
    retry loop around the read and the write makes every increment count."""
    path = str(tmp_path / "counter.db")
    with sqlite(path) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE counter (value INTEGER NOT NULL)")
        conn.execute("INSERT INTO counter VALUES (0)")

    async def main() -> None:
        async def counter() -> None:
            async with worker("count", path, "250") as proc:
                assert await proc.line() == "ok"

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for _ in range(4):
                    tg.start_soon(counter)

    anyio.run(main)
    with sqlite(path) as conn:
        assert conn.execute("SELECT value FROM counter").fetchall() == [(1000,)]


async def test_a_waiter_here_is_woken_by_a_commit_in_another_process(
    tmp_path: Path, anyio_backend: str
) -> None:
    path = str(tmp_path / "wake.db")
    async with SqliteStore(path) as store:
        box = store.mailbox("s")
        got: list[DelegateResult | None] = []
        signals: list[int] = []
        box.subscribe_all(lambda: signals.append(1))

        async def waiter() -> None:
            got.append(await box.wait("w0", timeout=30))

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            assert store.statistics().watching == 1
            polls = store.statistics().polls
            async with worker("put", path, "s", "1", "w", backend=anyio_backend) as proc:
                assert await proc.line() == "done"
        assert got == [env("w0")]
        assert signals, "an all-puts subscription missed another process's put"
        assert store.statistics().polls > polls
        assert box.peek("w0") is None, "the wait did not consume what it returned"


async def test_a_waiter_in_another_process_is_woken_by_a_commit_here(
    tmp_path: Path, anyio_backend: str
) -> None:
    path = str(tmp_path / "wake.db")
    async with SqliteStore(path) as store:
        async with worker("wait", path, "s", "x", backend=anyio_backend) as proc:
            assert await proc.line() == "waiting"
            box = store.mailbox("s")
            box.put("x", env("x", "from the parent"))
            await box.wait_committed()
            with anyio.fail_after(30):
                assert await proc.line() == "from the parent"
        assert len(box) == 0, "the other process's wait did not consume the envelope"
