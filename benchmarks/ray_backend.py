"""RayBackend against bare Ray on a local cluster, in the same run: per-child overhead, and
the cancellation and watchdog latencies.

    python benchmarks/ray_backend.py                  # asyncio, 1,000 children x 3 rounds
    python benchmarks/ray_backend.py --backend trio -n 2000
    python benchmarks/ray_backend.py --quick          # tiny sizes: proves it runs

Needs the ``ray`` extra. Starts ``ray.init(num_cpus=2, include_dashboard=False)`` and
shuts it down at the end.

- **no-op children**: ``n`` children of a runner that returns at once, spawned together
  into a ``SubagentManager(backend=RayBackend(pool_size=P))`` and each waited for, against
  ``n`` calls of a no-op method on ``P`` bare async actors (round robin), submitted
  together and collected with one ``ray.get``: Ray's own pipelined floor, once with no
  argument and once carrying the child's ``Request`` (Ray's cost grows with each argument,
  and a child has to ship one); and the same calls carrying the ``Request`` awaited one
  by one, each in a task of its own through ``ObjectRef.future()`` and the backend's
  bridge: what an async driver pays Ray per call, before the manager and the backend do
  anything; and the requests sent in calls of 64 to a ``run_many`` method, collected with
  one ``ray.get``: the floor of a driver that batches by hand, as the backend's channel
  does. Rounds alternate the paths after a warm-up; the table gives the median
  round's milliseconds per child, every round's, and the ratios of the medians.
- **one child at a time**: ``n // 10`` children, each spawned once the one before has
  ended, against as many bare calls awaited one after the other: a lone child's round
  trip (the channel's submit and collect against one call).
- **cancel**: an async runner that hangs, cancelled once it runs: seconds from
  ``manager.cancel`` to its envelope.
- **watchdog**: the same runner under a 0.5 s watchdog: how long after the watchdog's
  deadline the envelope came (a sample whose runner had not run when the watchdog fired,
  a task waiting for a worker process on a loaded machine, is left out and counted).
- **forced stop**: a runner blocked in ``time.sleep`` (it ignores Ray's cancel), cancelled:
  seconds to its envelope with ``force_after=0.5`` (the actor is killed; in task mode the
  task is cancelled with ``force=True``).
- **following running children**: ``n // 10`` children that report once and sleep 2 s,
  run together, once plain and once followed (an event subscriber makes the driver read
  each one's progress from the sink every 0.25 s): the driver's CPU seconds and the wall
  time of each.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import statistics
import sys
import time
from pathlib import Path
from time import perf_counter
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # measure this checkout, not an installed subagents
# Ray's workers inherit the environment: they import this checkout too.
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
)

import anyio  # noqa: E402
import ray  # noqa: E402

from subagents import AgentSpec, Request, RunContext, SubagentConfig, SubagentManager  # noqa: E402
from subagents.backends._ray_bridge import settled  # noqa: E402
from subagents.backends.ray import RayBackend  # noqa: E402

FORCE_AFTER = 0.5
WATCHDOG = 0.5


class Noop:
    async def run(self, request: Request | None = None) -> str:
        return "ok"

    async def run_many(self, requests: list[Request]) -> list[str]:
        return ["ok"] * len(requests)


class Latch:
    """Set by a runner once it runs on its worker; awaited by the benchmark."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def ready(self) -> None:
        """Answers once the actor exists (and its name can be looked up)."""

    def set(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()


async def noop(request: Request, ctx: RunContext) -> str:
    return "ok"


async def hangs(request: Request, ctx: RunContext) -> str:
    ray.get_actor(request.input).set.remote()
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


async def blocks(request: Request, ctx: RunContext) -> str:
    ray.get_actor(request.input).set.remote()
    time.sleep(60)  # noqa: ASYNC251  # the point: a runner that ignores Ray's cancel
    return "slept"


async def sleeps(request: Request, ctx: RunContext) -> str:
    ctx.report(output="working", iterations=1)
    await anyio.sleep(2.0)
    return "ok"


AGENTS = [
    AgentSpec(name="noop", runner=noop),
    AgentSpec(name="sleeps", runner=sleeps),
    AgentSpec(name="hangs", runner=hangs),
    AgentSpec(name="blocks", runner=blocks),
]


def make_manager(backend: RayBackend) -> SubagentManager:
    config = SubagentConfig(max_concurrent_spawns=10_000, retain_collected=0)
    return SubagentManager(AGENTS, backend=backend, config=config)


async def through_backend(manager: SubagentManager, n: int) -> float:
    start = perf_counter()
    handles = [manager.spawn("noop") for _ in range(n)]
    for handle in handles:
        envelope = await handle.wait()
        assert envelope.output == "ok", envelope.error
    return (perf_counter() - start) / n


def bare_ray(actors: list[Any], n: int, request: Request | None) -> float:
    """``n`` calls, each carrying ``request`` (or nothing), submitted together."""
    args = () if request is None else (request,)
    start = perf_counter()
    results = ray.get([actors[i % len(actors)].run.remote(*args) for i in range(n)])
    assert results == ["ok"] * n
    return (perf_counter() - start) / n


def bare_batched(actors: list[Any], n: int, request: Request) -> float:
    """``n`` requests in calls of 64 (as the backend's channel batches them), round robin,
    collected with one ``ray.get``: Ray's floor for a driver that batches by hand."""
    start = perf_counter()
    refs = [
        actors[i % len(actors)].run_many.remote([request] * min(64, n - first))
        for i, first in enumerate(range(0, n, 64))
    ]
    results = [result for batch in ray.get(refs) for result in batch]
    assert results == ["ok"] * n
    return (perf_counter() - start) / n


async def one_at_a_time(manager: SubagentManager, actors: list[Any], n: int) -> tuple[float, float]:
    """Seconds per child when each is spawned only once the one before has ended, and per
    bare call awaited the same way: the round trip of a lone child."""
    start = perf_counter()
    for _ in range(n):
        assert (await manager.execute("noop")).output == "ok"
    through = (perf_counter() - start) / n
    request = Request(agent="noop")
    start = perf_counter()
    for i in range(n):
        assert await settled(actors[i % len(actors)].run.remote(request).future()) == "ok"
    return through, (perf_counter() - start) / n


async def bare_awaited(actors: list[Any], n: int, request: Request) -> float:
    """``n`` calls carrying ``request``, each awaited in a task of its own through its
    ``ObjectRef.future()``, as the backend waits on a child's call."""

    async def call(i: int) -> None:
        assert await settled(actors[i % len(actors)].run.remote(request).future()) == "ok"

    start = perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(call, i)
    return (perf_counter() - start) / n


async def run(args: argparse.Namespace) -> None:
    pool = args.pool_size
    actors = [ray.remote(Noop).options(max_concurrency=1000).remote() for _ in range(pool)]
    ray.get([a.run.remote() for a in actors])
    backend = RayBackend(pool_size=pool, force_after=FORCE_AFTER)
    task_backend = RayBackend(mode="task", force_after=FORCE_AFTER)
    request = Request(agent="noop")
    async with make_manager(backend) as manager:
        await through_backend(manager, min(args.n, 100))  # warm-up: actors and paths
        bare_ray(actors, min(args.n, 100), request)
        await bare_awaited(actors, min(args.n, 100), request)
        paths: dict[str, list[float]] = {"bare, no argument": [], "bare, the Request": []}
        paths["bare, awaited"] = []
        paths["bare, batched"] = []
        paths["RayBackend"] = []
        for _ in range(args.rounds):
            # Each path starts with no garbage of the one before it to collect.
            gc.collect()
            paths["bare, no argument"].append(bare_ray(actors, args.n, None))
            gc.collect()
            paths["bare, the Request"].append(bare_ray(actors, args.n, request))
            gc.collect()
            paths["bare, awaited"].append(await bare_awaited(actors, args.n, request))
            gc.collect()
            paths["bare, batched"].append(bare_batched(actors, args.n, request))
            gc.collect()
            paths["RayBackend"].append(await through_backend(manager, args.n))
        print(f"no-op children: n={args.n}, pool_size={pool}, rounds={args.rounds}, {args.backend}")
        medians = {name: statistics.median(samples) for name, samples in paths.items()}
        for name, samples in paths.items():
            rounds = ", ".join(f"{s * 1e3:.3f}" for s in samples)
            print(f"  {name:18} median {medians[name] * 1e3:.3f} ms/child ({rounds})")
        for bare in ("bare, no argument", "bare, the Request", "bare, awaited", "bare, batched"):
            print(f"  RayBackend / {bare}: {medians['RayBackend'] / medians[bare]:.2f}x")
        lone = max(args.n // 10, 1)
        through, bare_lone = await one_at_a_time(manager, actors, lone)
        print(
            f"one child at a time ({lone}): RayBackend {through * 1e3:.2f} ms/child, "
            f"a bare call awaited {bare_lone * 1e3:.2f} ms ({through / bare_lone:.2f}x)"
        )
        await latencies(manager, "actor", args.samples)
    await following(backend, max(args.n // 10, 1))
    async with make_manager(task_backend) as manager:
        await latencies(manager, "task", args.samples)
    backend.close()
    task_backend.close()
    for actor in actors:
        ray.kill(actor)


async def following(backend: RayBackend, n: int) -> None:
    print(f"following {n} running children (2 s each, run together):")
    for followed in (False, True):
        async with make_manager(backend) as manager:
            if followed:
                manager.events.subscribe(lambda event: None)
            cpu, start = time.process_time(), perf_counter()
            handles = [manager.spawn("sleeps") for _ in range(n)]
            for handle in handles:
                assert (await handle.wait()).output == "ok"
            cpu, wall = time.process_time() - cpu, perf_counter() - start
        label = "followed (progress read every 0.25 s)" if followed else "plain"
        print(f"  {label:38} driver CPU {cpu:.2f} s, wall {wall:.2f} s")


async def started_child(manager: SubagentManager, agent: str, **spawn: Any) -> Any:
    """The child's handle, its latch, when it was spawned, and whether its runner ran
    before the child ended (under a watchdog, a task that waits long for a worker process
    on a loaded machine is timed out before it runs)."""
    name = f"latch-{time.monotonic_ns()}"
    latch = ray.remote(Latch).options(name=name, num_cpus=0).remote()
    await settled(latch.ready.remote().future())
    spawned = perf_counter()
    handle = manager.spawn(agent, name, **spawn)
    ran = False

    async def runs(scope: anyio.CancelScope) -> None:
        nonlocal ran
        await settled(latch.wait.remote().future())
        ran = True
        scope.cancel()

    async def ends(scope: anyio.CancelScope) -> None:
        await handle.done.wait()
        scope.cancel()

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(runs, tg.cancel_scope)
            tg.start_soon(ends, tg.cancel_scope)
    return handle, latch, spawned, ran


async def latencies(manager: SubagentManager, mode: str, samples: int) -> None:
    cancels = []
    overruns = []
    for _ in range(samples):
        handle, latch, _, _ = await started_child(manager, "hangs")
        start = perf_counter()
        manager.cancel(handle.task_id)
        envelope = await handle.wait()
        cancels.append(perf_counter() - start)
        assert envelope.status.value == "cancelled", envelope
        ray.kill(latch)
        handle, latch, spawned, ran = await started_child(manager, "hangs", timeout=WATCHDOG)
        envelope = await handle.wait()
        if ran:  # else the watchdog fired before the runner ran: no overrun to measure
            overruns.append(perf_counter() - spawned - WATCHDOG)
        assert envelope.status.value == "timeout", envelope
        ray.kill(latch)
    handle, latch, _, _ = await started_child(manager, "blocks")
    start = perf_counter()
    manager.cancel(handle.task_id)
    envelope = await handle.wait()
    forced = perf_counter() - start
    ray.kill(latch)
    print(f"{mode} mode ({samples} sample(s) each):")
    print(
        f"  cancel -> envelope: median {statistics.median(cancels) * 1e3:.1f} ms, "
        f"max {max(cancels) * 1e3:.1f} ms"
    )
    unstarted = samples - len(overruns)
    late = f" ({unstarted} not started in time, left out)" if unstarted else ""
    print(
        f"  watchdog {WATCHDOG} s -> envelope: median overrun "
        f"{statistics.median(overruns or [math.nan]) * 1e3:.1f} ms, "
        f"max {max(overruns or [math.nan]) * 1e3:.1f} ms{late}"
    )
    print(
        f"  blocking runner, force_after={FORCE_AFTER} s: cancel -> envelope {forced * 1e3:.0f} ms"
        f" ({envelope.status.value})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=1000, help="no-op children per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=10, help="latency samples per mode")
    parser.add_argument("--pool-size", type=int, default=2)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: proves it runs")
    args = parser.parse_args()
    if args.quick:
        args.n, args.rounds, args.samples = 50, 1, 2
    start = perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    print(f"ray {ray.__version__}: local cluster up in {perf_counter() - start:.1f} s")
    try:
        anyio.run(run, args, backend=args.backend)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
