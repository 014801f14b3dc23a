"""MCP round trip: ``spawn_agent`` then ``wait_agent`` of a no-op child through the SDK's
in-memory client and :func:`subagents.mcp.build_server`, against a bare ``Toolset.call``
of the same tools on the same manager, in the same run.

    python benchmarks/mcp_roundtrip.py                  # asyncio, 2,000 round trips x 3
    python benchmarks/mcp_roundtrip.py --backend trio -n 5000
    python benchmarks/mcp_roundtrip.py --quick          # tiny sizes: proves it runs (CI)

One sample is one round trip: ``spawn_agent`` of the ``noop`` agent, then ``wait_agent``
on its task id until the envelope is back (collected), timed with ``perf_counter``. Three
paths, each on one manager (``retain_collected=0``, so records do not pile up):

- ``Toolset.call``: the bare toolset, built as the server builds it (``wait_agent``
  bounded by the 45 s cap alone); no protocol at all: the floor;
- ``MCP 2026-07-28``: ``Client(server)`` in its default mode: the SDK dispatches each
  request to the server's handlers in process (no JSON-RPC framing, no handshake), and
  validates the result against the protocol schema and ``structuredContent`` against the
  tool's ``outputSchema``;
- ``MCP 2025-11-25``: ``Client(server, mode="legacy")``: the initialize handshake, then
  JSON-RPC messages over in-memory streams, as a stdio host would see them minus the pipe.

Repetitions are interleaved (the order rotates each round) after a warm-up; the table
gives the median and the 99th percentile over every sample of every repetition, and each
path's median as a multiple of the bare call's.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from time import perf_counter
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # measure this checkout, not an installed subagents

import anyio  # noqa: E402
from mcp import Client  # noqa: E402

from subagents import AgentSpec, Request, RunContext, SubagentConfig, SubagentManager  # noqa: E402
from subagents.mcp import build_server  # noqa: E402
from subagents.tools import Toolset, build_tools  # noqa: E402

SESSION = "root"
PATHS = ("Toolset.call", "MCP 2026-07-28", "MCP 2025-11-25")
WARMUP = 50


async def _noop(request: Request, ctx: RunContext) -> str:
    return "ok"


NOOP = AgentSpec(name="noop", description="returns at once", runner=_noop)
SPAWN = {"agent": "noop", "input": ""}

RoundTrip = Callable[[], Awaitable[None]]


def bare(toolset: Toolset) -> RoundTrip:
    async def once() -> None:
        spawned = await toolset.call("spawn_agent", SPAWN)
        waited = await toolset.call("wait_agent", {"task_ids": spawned.details["task_id"]})
        assert waited.details["completed"] is True, waited.content

    return once


def over_mcp(client: Client) -> RoundTrip:
    async def once() -> None:
        spawned = await client.call_tool("spawn_agent", SPAWN)
        task_id = spawned.structured_content["task_id"]  # type: ignore[index]
        waited = await client.call_tool("wait_agent", {"task_ids": task_id})
        assert waited.structured_content["completed"] is True  # type: ignore[index]

    return once


async def sample(path: str, n: int) -> list[float]:
    """``n`` round trips on ``path`` (after a warm-up), each in seconds."""
    config = SubagentConfig(retain_collected=0)
    async with SubagentManager([NOOP], config=config) as manager:
        if path == "Toolset.call":
            toolset = build_tools(
                manager, SESSION, tool_timeouts={"wait_agent": None}, wait_cap=45.0
            )
            return await _timed(bare(toolset), n)
        mode = "auto" if path == "MCP 2026-07-28" else "legacy"
        async with Client(build_server(manager, SESSION), mode=mode) as client:
            return await _timed(over_mcp(client), n)


async def _timed(once: RoundTrip, n: int) -> list[float]:
    for _ in range(WARMUP):
        await once()
    times = []
    for _ in range(n):
        start = perf_counter()
        await once()
        times.append(perf_counter() - start)
    return times


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=2_000, help="round trips per repetition")
    parser.add_argument("-r", "--reps", type=int, default=3)
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    parser.add_argument("--quick", action="store_true", help="tiny sizes")
    args = parser.parse_args()
    if args.quick:
        args.n, args.reps = 50, 1
    run = functools.partial(anyio.run, backend=args.backend)
    samples: dict[str, list[float]] = {path: [] for path in PATHS}
    for rep in range(args.reps):
        for path in PATHS[rep % len(PATHS) :] + PATHS[: rep % len(PATHS)]:
            samples[path].extend(run(sample, path, args.n))
    report(args, samples)


def report(args: Any, samples: dict[str, list[float]]) -> None:
    print(
        f"MCP round trip (spawn_agent + wait_agent of a no-op child): {args.backend}, "
        f"n={args.n:,} x {args.reps} reps, Python {sys.version.split()[0]}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    floor = statistics.median(samples["Toolset.call"])
    print("| path | p50 (µs) | p99 (µs) | p50 x Toolset.call |")
    print("|---|---|---|---|")
    for path in PATHS:
        values = samples[path]
        p50, p99 = statistics.median(values), percentile(values, 0.99)
        print(f"| {path} | {p50 * 1e6:,.0f} | {p99 * 1e6:,.0f} | {p50 / floor:.1f} |")


if __name__ == "__main__":
    main()
