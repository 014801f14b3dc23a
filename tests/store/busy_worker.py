"""A process of its own whose event loop stays busy while its store's writer commits.

    python tests/store/busy_worker.py PATH [--backend asyncio|trio] [--idle-first]
                                           [--no-make-way]

It queues 3,000 puts (or, ``--idle-first``, commits one and lets the writer go idle), then
runs Python on the event loop's thread the way a loop running children back to back does:
the GIL released only for moments (a ``select`` with no timeout every 16 steps), and a put
there too (as each child's end is). It prints ``committed MS`` once the queued puts are
committed (or, idle first, 1,000 of those the loop made), or ``starved`` after 10 s (exit
status 1). ``--no-make-way`` turns off the pause the writer's ``submit`` makes for the
store's threads, to show what it is for. A process of its own: the threads of a test
runner's worker (xdist's) take the GIL now and then themselves, which hides the starving.
"""

from __future__ import annotations

import argparse
import selectors
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import anyio

from subagents import DelegateResult, Status
from subagents.store import SqliteStore
from subagents.store._writer import Writer

FIRST = 3_000
MOST = 20_000


def envelope(task_id: str) -> DelegateResult:
    return DelegateResult(agent="a", task_id=task_id, status=Status.COMPLETED, output="x")


async def main(path: str, idle_first: bool) -> int:
    async with SqliteStore(path) as store:
        box = store.mailbox("root", capacity=MOST)
        if idle_first:  # the writer waits for work when the loop gets busy
            box.put("t0", envelope("t0"))
            await box.wait_committed()
            puts, wanted = 1, 1_001
        else:  # a batch in flight when the loop gets busy
            for i in range(FIRST):  # three batches at least, one write a put
                box.put(f"t{i}", envelope(f"t{i}"))
            puts, wanted = FIRST, FIRST
        start = time.monotonic()
        with selectors.DefaultSelector() as selector:
            while store.statistics().writes < wanted:  # no I/O: it keeps the GIL
                if time.monotonic() - start > 10:
                    print("starved", flush=True)
                    return 1
                for _ in range(16):
                    sum(range(2_000))  # some microseconds of Python
                if puts < MOST:
                    box.put(f"t{puts}", envelope(f"t{puts}"))
                    puts += 1
                selector.select(0)
        print(f"committed {(time.monotonic() - start) * 1e3:.0f}", flush=True)
        await box.wait_committed()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("--backend", default="asyncio", choices=("asyncio", "trio"))
    parser.add_argument("--idle-first", action="store_true")
    parser.add_argument("--no-make-way", action="store_true")
    args = parser.parse_args()
    if args.no_make_way:
        Writer._make_way = lambda self: None  # type: ignore[method-assign]
    sys.exit(anyio.run(main, args.path, args.idle_first, backend=args.backend))
