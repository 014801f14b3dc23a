"""kill -9 loses nothing acknowledged: a process puts envelopes and prints each id once
``wait_committed`` says it is durable; it is SIGKILLed at random points of that stream;
every id it printed is in the store afterwards, once, and the file passes
``PRAGMA integrity_check``. (The issue's harness, over spawns and the journal, comes with
the engine's integration; this is its mailbox half.)"""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import anyio
import pytest

from subagents.store import SqliteStore
from tests.store.support import sqlite, worker

pytestmark = pytest.mark.anyio

KILLS = int(os.environ.get("SUBAGENTS_STORE_KILLS", "15"))
"""SIGKILLs per backend: 30 in all by default, as the issue asks."""


async def test_kill_9_loses_no_acknowledged_envelope(tmp_path: Path, anyio_backend: str) -> None:
    path = str(tmp_path / "crash.db")
    rng = random.Random(2024)
    acknowledged: set[str] = set()
    for seed in range(KILLS):
        wanted = rng.randint(1, 400)  # the kill lands after this many acknowledgements
        async with worker("ack", path, "s", str(seed), backend=anyio_backend) as proc:
            with anyio.fail_after(60):
                for _ in range(wanted):
                    acknowledged.add(await proc.line())
            proc.process.send_signal(signal.SIGKILL)
            proc.killed = True
    with sqlite(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        rows = conn.execute("SELECT task_id FROM deliveries WHERE state = 'stored'").fetchall()
    stored = [task_id for (task_id,) in rows]
    assert len(stored) == len(set(stored)), "an envelope is in the store twice"
    missing = acknowledged - set(stored)
    assert not missing, f"{len(missing)} acknowledged envelopes were lost: {sorted(missing)[:5]}"
    async with SqliteStore(path) as store:  # and the store opens and reads them
        box = store.mailbox("s", capacity=1_000_000)
        assert {e.task_id for e in box.drain_all()} == set(stored)
