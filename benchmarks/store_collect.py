"""Children collected one by one (``await handle.wait()`` in spawn order), in memory and on a
store, in the same run: what the manager's own collection costs with the store.

    python benchmarks/store_collect.py                 # asyncio, 5,000 children, 5 rounds
    python benchmarks/store_collect.py --backend trio -n 2000 -r 3
    python benchmarks/store_collect.py --quick         # tiny sizes: proves it runs (CI)

Each run spawns ``n`` no-op children (``-l`` slots, a mailbox that holds them all), then
waits for each handle in turn: µs per child from the first spawn to the last ``wait()``
returned, and (on the store) to every write committed, the collections' included. The
figure with the store is against the same loop in memory, interleaved round by round.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
from pathlib import Path
from time import perf_counter
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # measure this checkout, not an installed subagents
sys.path.insert(1, str(Path(__file__).resolve().parent))

import anyio  # noqa: E402
import run as bench  # noqa: E402
import store_throughput as st  # noqa: E402
import workloads as wl  # noqa: E402


async def one_by_one(n: int, limit: int, store_path: str | None) -> tuple[float, float]:
    """Seconds to the last ``wait()`` returned, and to every write committed."""
    config: dict[str, Any] = {} if store_path is None else {"store_path": store_path}
    async with wl.manager(limit, n, **config) as m:
        start = perf_counter()
        handles = [m.spawn("noop") for _ in range(n)]
        for handle in handles:
            await handle.wait()
        collected = perf_counter() - start
        if m.store is not None:
            await m.store.wait_committed()
        return collected, perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=5_000, help="children per run")
    parser.add_argument("-l", "--limit", type=int, default=64, help="slots")
    parser.add_argument("-r", "--reps", type=int, default=5)
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    parser.add_argument("--quick", action="store_true", help="tiny sizes")
    args = parser.parse_args()
    if args.quick:
        args.n, args.reps = 200, 1
    with tempfile.TemporaryDirectory(prefix="store-collect-") as tmp:

        def measure(kind: str) -> tuple[float, float]:
            path = None if kind == "memory" else st.fresh(tmp, "collect.db")
            run = functools.partial(one_by_one, args.n, args.limit, path)
            return anyio.run(run, backend=args.backend)

        runs = bench.interleaved(args.reps, ("memory", "store"), measure)
    print(
        f"children collected one by one: {args.backend}, n={args.n:,}, limit {args.limit}, "
        f"reps={args.reps}, synchronous=FULL, durability sync"
    )

    def us(kind: str, clock: int) -> float:
        return statistics.median(r[clock] for r in runs[kind]) / args.n * 1e6

    memory, store = us("memory", 0), us("store", 0)
    print(f"| in memory | {memory:.1f} us/child |")
    print(f"| store: last wait() returned | {store:.1f} us/child ({store / memory:.2f}x) |")
    print(f"| store: everything committed | {us('store', 1):.1f} us/child |")


if __name__ == "__main__":
    main()
