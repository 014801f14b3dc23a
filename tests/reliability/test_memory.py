"""Memory returns near its start after a chaos run (tracemalloc, both backends).

Tolerance: 256 KiB of net growth once the manager is dropped, after a run of 800 spawns
(plus their nested children), i.e. about 300 bytes per spawn. A leaked task, cancel scope,
frame or envelope per spawn costs more than a kilobyte each; the run itself holds about
3 KB per spawn while alive (measured: ~3 MB held, under 20 KB left after). A warm-up run
first fills the one-off caches (imports, interned strings, free lists, loop buffers).

Each run has an event loop of its own and memory is measured once ``anyio.run`` has
returned. Measured inside the loop, a just-closed manager is still alive on Python 3.12+:
the ``CancelledError`` that cancelled the manager's task group is held by asyncio's
``task_wakeup`` (a C local) until the host task's current step ends, and its traceback's
finished ``TaskGroup.__aexit__`` frame keeps ``f_back`` on 3.12+, so the frames of
``SubagentManager.aclose`` and of the caller (holding the manager) live on until the task
next yields. That is the interpreter holding one step's frames, not a leak; outside the
loop nothing of the run is referenced by the loop any more.
"""

from __future__ import annotations

import gc
import logging
import tracemalloc
import weakref

import anyio

from subagents import SubagentManager

from .chaos import SEED, Chaos

TOLERANCE_BYTES = 256 * 1024
SPAWNS = 800


def run_chaos(spawns: int, backend: str) -> Chaos:
    """One chaos run on an event loop of its own; the loop is gone when this returns."""
    chaos = Chaos(spawns=spawns, seed=SEED)
    anyio.run(chaos.run, backend=backend)
    return chaos


def test_memory_returns_near_its_start(anyio_backend: str) -> None:
    logging.disable(logging.WARNING)  # captured log records would count as growth
    try:
        run_chaos(200, anyio_backend)
        gc.collect()
        tracemalloc.start()
        try:
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            chaos = run_chaos(SPAWNS, anyio_backend)
            chaos.assert_ok()
            spawns = len(chaos.by_task)
            manager = chaos.manager
            assert manager is not None
            closed: weakref.ref[SubagentManager] = weakref.ref(manager)
            del chaos, manager
            gc.collect()
            current, peak = tracemalloc.get_traced_memory()
            grown, held = current - before, peak - before
            snapshot = tracemalloc.take_snapshot() if grown >= TOLERANCE_BYTES else None
        finally:
            tracemalloc.stop()
    finally:
        logging.disable(logging.NOTSET)
    print(f"{spawns} spawns: {held} bytes at the peak of the run, {grown} bytes after")
    assert held > 4 * TOLERANCE_BYTES, "the run itself was not measured"
    assert closed() is None, "the closed manager is still referenced after its loop ended"
    top = snapshot.statistics("lineno")[:10] if snapshot is not None else []
    assert grown < TOLERANCE_BYTES, (SEED, grown, [str(s) for s in top])
