"""The benchmark workloads W1-W5, each written three times: for ``subagents`` and for the two
floors it is measured against.

- ``asyncio``: plain asyncio, ``create_task`` + ``Semaphore`` + futures.
- ``anyio``: plain anyio, a task group + ``CapacityLimiter`` + events.
- ``subagents``: :class:`subagents.SubagentManager`, results collected through the mailbox.

Children do no model work: a child returns a constant (W1, W3, W5), sleeps (W2) or spawns
and collects its own children (W4). Every function here runs inside an event loop the caller
started; they return raw figures (seconds, samples) and leave the arithmetic to ``run.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from time import perf_counter
from typing import Any

import anyio

from subagents import AgentSpec, BaseMailbox, RunContext, SubagentConfig, SubagentManager
from subagents import Request as _Request

IMPLS = ("asyncio", "anyio", "subagents")

Hook = Callable[[], object] | None

# --------------------------------------------------------------------------- shared helpers

_stamp: list[float] = [0.0]
"""W3: when the child did its last act (``perf_counter``)."""


async def _noop_child() -> str:
    return "ok"


async def _noop_runner(request: _Request, ctx: RunContext) -> str:
    return "ok"


async def _stamp_runner(request: _Request, ctx: RunContext) -> str:
    _stamp[0] = perf_counter()
    return "ok"


def _agents(**extra: Any) -> list[AgentSpec]:
    return [
        AgentSpec(name="noop", description="returns at once", runner=_noop_runner, **extra),
        AgentSpec(name="stamp", description="stamps the time and returns", runner=_stamp_runner),
        AgentSpec(name="sleep", description="sleeps 10 ms", runner=_sleep_runner),
        AgentSpec(name="node", description="a tree node", runner=_node_runner),
    ]


async def _sleep_runner(request: _Request, ctx: RunContext) -> str:
    await anyio.sleep(float(request.input))
    return "ok"


class _Wake:
    """An all-puts mailbox subscription the parent can await again and again."""

    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = anyio.Event()

    def set(self) -> None:
        self.event.set()


async def collect(mailbox: BaseMailbox, n: int) -> int:
    """Drain ``n`` envelopes from ``mailbox`` as they arrive (the batch parent's loop)."""
    wake = _Wake()
    subscription = mailbox.subscribe_all(wake.set)
    got = 0
    try:
        while True:
            event = wake.event = anyio.Event()
            got += len(await mailbox.take_all())
            if got >= n:
                return got
            await event.wait()
    finally:
        mailbox.unsubscribe(subscription)


def manager(limit: int, capacity: int = 64, **config: Any) -> SubagentManager:
    """A manager with the benchmark agents, ``limit`` slots and a mailbox of ``capacity``."""
    agent_extra = config.pop("agent_extra", {})
    manager_extra = config.pop("manager_extra", {})
    return SubagentManager(
        _agents(**agent_extra),
        config=SubagentConfig(
            max_concurrent_spawns=limit, mailbox_capacity=max(capacity, 1), **config
        ),
        **manager_extra,
    )


# --------------------------------------------------------------------------- W1 / W5 fan-out


async def fanout_asyncio(n: int, limit: int, on_queued: Hook = None) -> list[float]:
    """Spawn ``n`` no-op children, collect every result. Returns [spawn seconds per decile]."""
    sem = asyncio.Semaphore(limit)
    loop = asyncio.get_running_loop()

    async def child(fut: asyncio.Future[str]) -> None:
        async with sem:
            result = await _noop_child()
        fut.set_result(result)

    futures: list[asyncio.Future[str]] = []
    tasks: list[asyncio.Task[None]] = []
    chunks = _deciles(n)
    split: list[float] = []
    for chunk in chunks:
        t0 = perf_counter()
        for _ in range(chunk):
            fut = loop.create_future()
            futures.append(fut)
            tasks.append(asyncio.create_task(child(fut)))
        split.append(perf_counter() - t0)
    if on_queued is not None:
        on_queued()
    for fut in futures:
        await fut
    return split


async def fanout_anyio(n: int, limit: int, on_queued: Hook = None) -> list[float]:
    limiter = anyio.CapacityLimiter(limit)
    results: list[str | None] = [None] * n

    async def child(i: int, done: anyio.Event) -> None:
        async with limiter:
            result = await _noop_child()
        results[i] = result
        done.set()

    events: list[anyio.Event] = []
    split: list[float] = []
    async with anyio.create_task_group() as tg:
        i = 0
        for chunk in _deciles(n):
            t0 = perf_counter()
            for _ in range(chunk):
                done = anyio.Event()
                events.append(done)
                tg.start_soon(child, i, done)
                i += 1
            split.append(perf_counter() - t0)
        if on_queued is not None:
            on_queued()
        for done in events:
            await done.wait()
    return split


async def fanout_subagents(
    n: int, limit: int, on_queued: Hook = None, **config: Any
) -> list[float]:
    split: list[float] = []
    async with manager(limit, n, **config) as m:
        mailbox = m.mailbox()
        spawn = m.spawn
        for chunk in _deciles(n):
            t0 = perf_counter()
            for _ in range(chunk):
                spawn("noop")
            split.append(perf_counter() - t0)
        if on_queued is not None:
            on_queued()
        await collect(mailbox, n)
    return split


def _deciles(n: int) -> list[int]:
    base, extra = divmod(n, 10)
    return [base + (1 if i < extra else 0) for i in range(10)]


FANOUT = {"asyncio": fanout_asyncio, "anyio": fanout_anyio, "subagents": fanout_subagents}


# --------------------------------------------------------------------------- W2 I/O-bound


async def io_asyncio(n: int, limit: int, sleep: float) -> None:
    sem = asyncio.Semaphore(limit)
    loop = asyncio.get_running_loop()

    async def child(fut: asyncio.Future[str]) -> None:
        async with sem:
            await asyncio.sleep(sleep)
        fut.set_result("ok")

    futures = [loop.create_future() for _ in range(n)]
    tasks = [asyncio.create_task(child(fut)) for fut in futures]
    for fut in futures:
        await fut
    del tasks


async def io_anyio(n: int, limit: int, sleep: float) -> None:
    limiter = anyio.CapacityLimiter(limit)

    async def child(done: anyio.Event) -> None:
        async with limiter:
            await anyio.sleep(sleep)
        done.set()

    events = [anyio.Event() for _ in range(n)]
    async with anyio.create_task_group() as tg:
        for done in events:
            tg.start_soon(child, done)
        for done in events:
            await done.wait()


async def io_subagents(n: int, limit: int, sleep: float) -> None:
    async with manager(limit, n) as m:
        mailbox = m.mailbox()
        text = repr(sleep)
        for _ in range(n):
            m.spawn("sleep", text)
        await collect(mailbox, n)


IO = {"asyncio": io_asyncio, "anyio": io_anyio, "subagents": io_subagents}


# --------------------------------------------------------------------------- W3 wake latency


async def wake_asyncio(samples: int, limit: int) -> list[float]:
    sem = asyncio.Semaphore(limit)
    loop = asyncio.get_running_loop()
    stamp = _stamp

    async def child(fut: asyncio.Future[str]) -> None:
        async with sem:
            stamp[0] = perf_counter()
            fut.set_result("ok")

    out = []
    for _ in range(samples):
        fut = loop.create_future()
        task = asyncio.create_task(child(fut))
        await fut
        out.append(perf_counter() - stamp[0])
        await task
    return out


async def wake_anyio(samples: int, limit: int) -> list[float]:
    limiter = anyio.CapacityLimiter(limit)
    stamp = _stamp

    async def child(done: anyio.Event) -> None:
        async with limiter:
            stamp[0] = perf_counter()
            done.set()

    out = []
    async with anyio.create_task_group() as tg:
        for _ in range(samples):
            done = anyio.Event()
            tg.start_soon(child, done)
            await done.wait()
            out.append(perf_counter() - stamp[0])
    return out


async def wake_subagents(samples: int, limit: int) -> list[float]:
    """The parent waits for one child with ``wait_result`` (the ``wait_agent`` path)."""
    stamp = _stamp
    out = []
    async with manager(limit) as m:
        for _ in range(samples):
            handle = m.spawn("stamp")
            await m.wait_result(handle.task_id)
            out.append(perf_counter() - stamp[0])
    return out


async def wake_subagents_mailbox(samples: int, limit: int) -> list[float]:
    """The parent waits for one child on its mailbox (``Mailbox.wait``)."""
    stamp = _stamp
    out = []
    async with manager(limit) as m:
        mailbox = m.mailbox()
        for _ in range(samples):
            handle = m.spawn("stamp")
            await mailbox.wait(handle.task_id)
            out.append(perf_counter() - stamp[0])
    return out


WAKE = {"asyncio": wake_asyncio, "anyio": wake_anyio, "subagents": wake_subagents}


# --------------------------------------------------------------------------- W4 nested tree


async def tree_asyncio(depth: int, fanout: int, limit: int) -> int:
    sem = asyncio.Semaphore(limit)
    loop = asyncio.get_running_loop()
    count = [0]

    async def node(level: int, fut: asyncio.Future[str]) -> None:
        async with sem:
            count[0] += 1
            if level < depth:
                await spawn_all(level + 1)
        fut.set_result("ok")

    async def spawn_all(level: int) -> None:
        futures = [loop.create_future() for _ in range(fanout)]
        tasks = [asyncio.create_task(node(level, fut)) for fut in futures]
        for fut in futures:
            await fut
        del tasks

    await spawn_all(1)
    return count[0]


async def tree_anyio(depth: int, fanout: int, limit: int) -> int:
    limiter = anyio.CapacityLimiter(limit)
    count = [0]

    async def node(level: int, done: anyio.Event) -> None:
        async with limiter:
            count[0] += 1
            if level < depth:
                await spawn_all(level + 1)
        done.set()

    async def spawn_all(level: int) -> None:
        events = [anyio.Event() for _ in range(fanout)]
        async with anyio.create_task_group() as tg:
            for done in events:
                tg.start_soon(node, level, done)
            for done in events:
                await done.wait()

    await spawn_all(1)
    return count[0]


_tree: dict[str, int] = {"depth": 3, "fanout": 8, "count": 0}


async def _node_runner(request: _Request, ctx: RunContext) -> str:
    _tree["count"] += 1
    if ctx.agent_path.depth < _tree["depth"]:
        fanout = _tree["fanout"]
        mailbox = ctx.mailbox
        for _ in range(fanout):
            ctx.spawn("node")
        await collect(mailbox, fanout)
    return "ok"


async def tree_subagents(depth: int, fanout: int, limit: int) -> int:
    _tree.update(depth=depth, fanout=fanout, count=0)
    async with manager(limit, fanout, max_depth=depth) as m:
        mailbox = m.mailbox()
        for _ in range(fanout):
            m.spawn("node")
        await collect(mailbox, fanout)
    return _tree["count"]


TREE = {"asyncio": tree_asyncio, "anyio": tree_anyio, "subagents": tree_subagents}


# --------------------------------------------------------------------------- W7 long-lived


async def sustained_asyncio(batches: int, n: int, limit: int) -> int:
    """``batches`` fan-outs of ``n`` one after another (the floor keeps nothing between)."""
    for _ in range(batches):
        await fanout_asyncio(n, limit)
    return 0


async def sustained_subagents(batches: int, n: int, limit: int, **config: Any) -> int:
    """``batches`` fan-outs of ``n`` through one long-lived manager, each collected through
    the mailbox before the next. Returns the records the manager still keeps."""
    async with manager(limit, n, **config) as m:
        mailbox = m.mailbox()
        spawn = m.spawn
        for _ in range(batches):
            for _ in range(n):
                spawn("noop")
            await collect(mailbox, n)
        return len(m.tasks())


# --------------------------------------------------------------------------- running


def run(impl: str, fn: Callable[..., Any], *args: Any, backend: str = "asyncio") -> Any:
    """Run ``fn(*args)`` in a fresh event loop: asyncio for the asyncio floor, else anyio's."""
    if impl == "asyncio":
        return asyncio.run(fn(*args))
    return anyio.run(fn, *args, backend=backend)


def timed(impl: str, fn: Callable[..., Any], *args: Any, backend: str = "asyncio") -> float:
    """Wall seconds of ``fn(*args)`` measured inside the loop (loop start-up excluded)."""

    async def body() -> float:
        t0 = perf_counter()
        await fn(*args)
        return perf_counter() - t0

    if impl == "asyncio":
        return asyncio.run(body())
    return float(anyio.run(body, backend=backend))
