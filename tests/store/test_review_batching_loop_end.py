"""Review of the courier once the event loop has ended (a store never closed).

The courier's docstring (and ``test_the_courier_drops_calls_once_the_event_loop_has_ended``)
say queued puts still commit after the loop has ended. But the writer opens a transaction
with fewer than ``eager_batch`` writes queued only once every committed batch's callback
has run, and a callback the courier dropped never runs: ``_unseen`` stays above 0, and
the rest of the queue (below 256 writes) never commits.
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio

from subagents.store import SqliteStore
from tests.store.support import env, sqlite


def _envelopes(path: Path) -> int:
    with sqlite(path) as conn:
        return int(conn.execute("SELECT count(*) FROM envelopes").fetchone()[0])


def test_every_put_commits_after_the_event_loop_has_ended(tmp_path: Path) -> None:
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
