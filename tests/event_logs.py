"""Event logs of real runs, for the pictures of a run (``events tree``, ``events timeline``).

Each log is written by a real manager through a :class:`JsonlSink`; only its clock is then
replaced (:func:`retime`): the wall clock is the one thing in a log that differs from run to
run, so every task gets times from a table keyed by its agent path, and its envelope's
``duration_ms`` / ``queue_ms`` / ``timestamp_ms`` agree with them. Everything else (ids,
sessions, paths, order, statuses, errors, tokens) is as the run wrote it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import anyio

from subagents import (
    AgentSpec,
    JsonlSink,
    Request,
    Result,
    RunContext,
    SubagentConfig,
    SubagentManager,
    Usage,
)
from subagents._json import dumps, loads

T0 = 1_764_000_000_000
"""The retimed run's first moment (unix ms)."""

Timing = Callable[[str], tuple[int, int, int]]
"""Agent path -> (spawn offset from :data:`T0`, queue wait, run time), in ms."""


def retime(path: Path, timing: Timing) -> None:
    """Rewrite the clock fields of the log at ``path`` in place from ``timing``."""
    lines = []
    for raw in path.read_bytes().splitlines():
        event = loads(raw)
        assert isinstance(event, dict)
        data = event["data"]
        assert isinstance(data, dict)
        offset, queue, run = timing(str(event["agent_path"]))
        spawned = T0 + offset
        moment = {
            "subagent.spawned": spawned,
            "subagent.started": spawned + queue,
            "subagent.progress": spawned + queue + run // 2,
            "subagent.completed": spawned + queue + run,
        }.get(str(event["type"]), spawned)
        event["timestamp_ms"] = moment
        if event["type"] == "subagent.started":
            data["queue_ms"] = queue
        if event["type"] == "subagent.completed":
            data["duration_ms"] = queue + run
            data["timestamp_ms"] = moment
            if queue:
                data["queue_ms"] = queue
            else:
                data.pop("queue_ms", None)
        lines.append(dumps(event))
    path.write_bytes(b"".join(line + b"\n" for line in lines))


def index_of(name: str) -> int:
    """1 for ``worker``, 3 for ``worker-3``."""
    stem, _, suffix = name.rpartition("-")
    return int(suffix) if stem and suffix.isdigit() else 1


async def echo(request: Request, ctx: RunContext) -> Result:
    return Result(output=f"done: {request.input}", usage=Usage(input_tokens=40, output_tokens=8))


async def broken(request: Request, ctx: RunContext) -> str:
    raise ValueError("disk on fire")


async def stuck(request: Request, ctx: RunContext) -> str:
    await anyio.sleep_forever()
    raise AssertionError


async def planner(request: Request, ctx: RunContext) -> Result:
    first = ctx.spawn("researcher", "the mailbox")
    second = ctx.spawn("researcher", "the watchdog")
    await first.wait()
    await second.wait()
    await ctx.execute("writer", "the report")
    return Result(output="plan", usage=Usage(input_tokens=300, output_tokens=120))


async def careless(request: Request, ctx: RunContext) -> Result:
    await ctx.spawn("broken", "inner").wait()
    return Result(output="went on", usage=Usage(input_tokens=10, output_tokens=2))


SPECS = [
    AgentSpec(name="researcher", runner=echo),
    AgentSpec(name="writer", runner=echo),
    AgentSpec(name="reviewer", runner=echo),
    AgentSpec(name="planner", runner=planner),
    AgentSpec(name="broken", runner=broken),
    AgentSpec(name="stuck", runner=stuck),
    AgentSpec(name="careless", runner=careless),
]


def small_timing(path: str) -> tuple[int, int, int]:
    """A table for the small logs: by depth and by the name's index."""
    names = path.strip("/").split("/")[1:]
    depth, index = len(names), index_of(names[-1])
    return 100 * depth + 10 * index, 50 * (index - 1), 1000 // depth + 37 * index


async def record(path: Path, run: Callable[[SubagentManager], object], **config: object) -> None:
    """Run ``run(manager)`` (a coroutine function) with every event written to ``path``."""
    manager = SubagentManager(SPECS, config=SubagentConfig(**config))  # type: ignore[arg-type]
    with JsonlSink(path) as sink:
        sink.attach(manager.events)
        async with manager:
            await run(manager)  # type: ignore[misc]


async def finished_log(path: Path) -> Path:
    """A run that ends well: a planner with two researchers and an executed writer, and a
    reviewer."""

    async def run(manager: SubagentManager) -> None:
        await manager.spawn("planner", "plan the release").wait()
        await manager.spawn("reviewer", "review it").wait()

    await record(path, run)
    retime(path, small_timing)
    return path


async def failed_log(path: Path) -> Path:
    """A run with every way to fail: an error, a timeout, a cancellation, and a child that
    failed under a parent that went on."""

    async def run(manager: SubagentManager) -> None:
        await manager.spawn("broken", "x").wait()
        await manager.spawn("stuck", "y", timeout=0.01).wait()
        cancelled = manager.spawn("stuck", "z")
        await anyio.wait_all_tasks_blocked()
        cancelled.cancel()
        await cancelled.wait()
        await manager.spawn("careless", "w").wait()

    await record(path, run)
    retime(path, small_timing)
    return path


async def running_log(path: Path, snapshot: Path) -> Path:
    """A run caught while going: ``snapshot`` is the log as it was with agents running
    (one under a parent that waits for it) and one queued for a slot; ``path`` is the
    whole log. Both retimed."""
    gate = anyio.Event()

    async def held(request: Request, ctx: RunContext) -> Result:
        await gate.wait()
        return Result(output="held", usage=Usage(input_tokens=5, output_tokens=1))

    async def lead(request: Request, ctx: RunContext) -> Result:
        ctx.report(iterations=1, usage=Usage(input_tokens=70, output_tokens=9))
        await ctx.spawn("held", "inner").wait()
        return Result(output="led", usage=Usage(input_tokens=90, output_tokens=12))

    specs = [*SPECS, AgentSpec(name="held", runner=held), AgentSpec(name="lead", runner=lead)]
    manager = SubagentManager(specs, config=SubagentConfig(max_concurrent_spawns=2))
    with JsonlSink(path) as sink:
        sink.attach(manager.events)
        async with manager:
            await manager.spawn("reviewer", "first").wait()
            handles = [manager.spawn("held", "b"), manager.spawn("lead", "a")]
            # The lead waits for its child, lending it its slot: both slots are taken.
            await anyio.wait_all_tasks_blocked()
            handles.append(manager.spawn("reviewer", "waits for a slot"))
            await anyio.wait_all_tasks_blocked()
            shutil.copyfile(path, snapshot)
            gate.set()
            for handle in handles:
                await handle.wait()
    retime(path, small_timing)
    retime(snapshot, small_timing)
    return path


async def big_log(path: Path) -> Path:
    """500 agents: 5 leads, each with 9 teams of 10 leaves; leaf-7 of every team-3 fails."""

    async def leaf(request: Request, ctx: RunContext) -> Result:
        if str(ctx.agent_path).endswith("team-3/leaf-7"):
            raise RuntimeError("leaf failed")
        return Result(output="leaf", usage=Usage(input_tokens=index_of(ctx.agent_path.name)))

    async def team(request: Request, ctx: RunContext) -> Result:
        leaves = [ctx.spawn("leaf", str(i)) for i in range(10)]
        for handle in leaves:
            await handle.wait()
        return Result(output="team", usage=Usage(input_tokens=100, output_tokens=10))

    async def lead(request: Request, ctx: RunContext) -> Result:
        teams = [ctx.spawn("team", str(i)) for i in range(9)]
        for handle in teams:
            await handle.wait()
        return Result(output="lead", usage=Usage(input_tokens=1000, output_tokens=100))

    specs = [
        AgentSpec(name="leaf", runner=leaf),
        AgentSpec(name="team", runner=team),
        AgentSpec(name="lead", runner=lead),
    ]
    manager = SubagentManager(specs, config=SubagentConfig(max_concurrent_spawns=64))
    with JsonlSink(path) as sink:
        sink.attach(manager.events)
        async with manager:
            leads = [manager.spawn("lead", str(i)) for i in range(5)]
            for handle in leads:
                await handle.wait()

    def timing(agent_path: str) -> tuple[int, int, int]:
        names = agent_path.strip("/").split("/")[1:]
        indices = [index_of(name) for name in names] + [0, 0]
        lead_i, team_i, leaf_i = indices[:3]
        offset = 100 * lead_i + 10 * team_i + leaf_i
        run = {1: 9000, 2: 2000 + 50 * team_i, 3: 300 + 20 * leaf_i}[len(names)]
        return offset, 5 * team_i + 3 * leaf_i, run

    retime(path, timing)
    return path


async def deep_log(path: Path) -> Path:
    """A chain seven agents deep: ``/root/d1/d2/.../d7``."""

    async def deep(request: Request, ctx: RunContext) -> Result:
        level = int(request.input)
        if level < 7:
            await ctx.spawn(f"d{level + 1}", str(level + 1)).wait()
        return Result(output="deep", usage=Usage(input_tokens=level, output_tokens=level))

    specs = [AgentSpec(name=f"d{i}", runner=deep) for i in range(1, 8)]
    manager = SubagentManager(specs, config=SubagentConfig(max_depth=7))
    with JsonlSink(path) as sink:
        sink.attach(manager.events)
        async with manager:
            await manager.spawn("d1", "1").wait()
    retime(path, lambda p: (10 * p.count("/"), 0, 1000 - 100 * p.count("/")))
    return path
