"""Memory returns near its start after a chaos run (tracemalloc, both backends).

Tolerance: 256 KiB of net growth once the manager is dropped, after a run of 800 spawns
(plus their nested children), i.e. about 300 bytes per spawn. A leaked task, cancel scope,
frame or envelope per spawn costs more than a kilobyte each; the run itself holds about
3 KB per spawn while alive (measured: ~3 MB held, under 20 KB left after). A warm-up run
first fills the one-off caches (imports, interned strings, free lists, loop buffers).
"""

from __future__ import annotations

import gc
import logging
import tracemalloc

import pytest

from .chaos import SEED, Chaos

pytestmark = pytest.mark.anyio

TOLERANCE_BYTES = 256 * 1024
SPAWNS = 800


async def test_memory_returns_near_its_start() -> None:
    logging.disable(logging.WARNING)  # captured log records would count as growth
    try:
        await Chaos(spawns=200, seed=SEED).run()
        gc.collect()
        tracemalloc.start()
        try:
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            chaos = Chaos(spawns=SPAWNS, seed=SEED)
            await chaos.run()
            chaos.assert_ok()
            spawns = len(chaos.by_task)
            held = tracemalloc.get_traced_memory()[0] - before
            del chaos
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
            snapshot = tracemalloc.take_snapshot() if grown >= TOLERANCE_BYTES else None
        finally:
            tracemalloc.stop()
    finally:
        logging.disable(logging.NOTSET)
    print(f"{spawns} spawns: {held} bytes held during the run, {grown} bytes after")
    top = snapshot.statistics("lineno")[:10] if snapshot is not None else []
    assert grown < TOLERANCE_BYTES, (SEED, grown, [str(s) for s in top])
