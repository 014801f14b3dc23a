"""Run one chaos scenario as a program: the process-level test and the long soak use it.

    PYTHONPATH=.:tests python -X dev -W error -m reliability.scenario --backend trio
    PYTHONPATH=.:tests python -m reliability.scenario --spawns 100000   # the soak

Exits 0 when every invariant held (printing the summary), 1 otherwise.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time

import anyio

from .chaos import SEED, Chaos


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reliability.scenario")
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--spawns", type=int, default=300)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)

    problems: list[str] = []

    async def run() -> None:
        chaos = Chaos(spawns=args.spawns, seed=args.seed, budget=max(60.0, args.spawns / 100))
        summary = await chaos.run()
        problems.extend(chaos.check())
        print(summary.render())

    started = time.perf_counter()
    anyio.run(run, backend=args.backend)
    gc.collect()  # finalizers of anything left behind report now, while we still watch
    print(f"wall time {time.perf_counter() - started:.2f} s")
    for problem in problems[:25]:
        print(f"seed={args.seed}: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
