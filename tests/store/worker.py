"""A process of its own that opens a store the tests share with it.

    python tests/store/worker.py put PATH SESSION N PREFIX
    python tests/store/worker.py hold PATH SESSION N            # put N, "ready"; a line: N more
    python tests/store/worker.py drain PATH SESSION N SEED      # "ready", then "go" on stdin
    python tests/store/worker.py wait PATH SESSION TASK_ID      # "waiting", then the output
    python tests/store/worker.py count PATH INCREMENTS          # read-then-write in BEGIN IMMEDIATE
    python tests/store/worker.py ack PATH SESSION SEED          # put forever, print the durable
    python tests/store/worker.py rerun PATH spawn|wait CAP      # a re-runnable child never ending
    python tests/store/worker.py parent PATH                    # a re-runnable parent delegating
    python tests/store/worker.py spawn PATH SESSION SEED        # spawn forever, print the journaled

Every command takes ``--backend asyncio|trio``; lines on stdout are the protocol, anything
unexpected goes to stderr and a non-zero exit.
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import anyio

from subagents import (
    AgentSpec,
    DelegateResult,
    Request,
    RunContext,
    SpawnHandle,
    Status,
    SubagentConfig,
    SubagentManager,
)
from subagents._json import dumps_str
from subagents.store import SqliteStore
from subagents.store._sqlite import Connection, connect


def envelope(task_id: str, output: str = "") -> DelegateResult:
    return DelegateResult(
        agent="worker",
        task_id=task_id,
        status=Status.COMPLETED,
        output=output or f"output of {task_id}",
        timestamp_ms=1,
    )


def say(line: str) -> None:
    print(line, flush=True)


async def put(path: str, session: str, n: int, prefix: str) -> None:
    async with SqliteStore(path) as store:
        box = store.mailbox(session, capacity=1_000_000)  # the session may be shared
        for i in range(n):
            box.put(f"{prefix}{i}", envelope(f"{prefix}{i}"))
        await box.wait_committed()
    say("done")


async def hold(path: str, session: str, n: int) -> None:
    """Put ``n`` envelopes, commit, say "ready" and keep the store open (its rows in the
    WAL, not checkpointed) until a line on stdin; then put ``n`` more, commit, say "done"."""
    async with SqliteStore(path) as store:
        box = store.mailbox(session, capacity=2 * n)
        for i in range(n):
            box.put(f"h{i}", envelope(f"h{i}"))
        await box.wait_committed()
        say("ready")
        await anyio.to_thread.run_sync(sys.stdin.readline)
        for i in range(n, 2 * n):
            box.put(f"h{i}", envelope(f"h{i}"))
        await box.wait_committed()
    say("done")


async def drain(path: str, session: str, n: int, seed: int) -> None:
    # NORMAL: taking exactly once is a matter of locking, not of fsync.
    async with SqliteStore(path, synchronous="NORMAL") as store:
        box = store.mailbox(session, capacity=max(n, 1))
        ids = [f"t{i}" for i in range(n)]
        random.Random(seed).shuffle(ids)
        say("ready")
        line = await anyio.to_thread.run_sync(sys.stdin.readline)
        if line.strip() != "go":
            raise SystemExit(f"expected 'go', got {line!r}")
        taken = []
        for i, task_id in enumerate(ids):
            # Odd seeds also take everything now and then through the writer (take_all),
            # racing the other processes' drains.
            if seed % 2 and i % 257 == 256:
                taken.extend(e.task_id for e in await box.take_all())
            got = box.drain(task_id)
            if got is not None:
                if got.task_id != task_id:
                    raise SystemExit(f"drain({task_id!r}) returned {got.task_id!r}")
                taken.append(task_id)
            if len(taken) % 64 == 0:
                await anyio.lowlevel.checkpoint()
        taken.extend(e.task_id for e in box.drain_all())  # nothing should be left by now
        say(dumps_str(taken))


async def wait(path: str, session: str, task_id: str) -> None:
    async with SqliteStore(path) as store:
        box = store.mailbox(session)
        got: list[DelegateResult | None] = []

        async def waiter() -> None:
            got.append(await box.wait(task_id, timeout=30))

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            say("waiting")
        say("none" if got[0] is None else got[0].output)


async def ack(path: str, session: str, seed: int) -> None:
    """Put envelopes in batches of 1 to 32, forever; after each commit print the ids it
    made durable, one line each (the line is the acknowledgement)."""
    rng = random.Random(seed)
    async with SqliteStore(path) as store:
        box = store.mailbox(session, capacity=1_000_000)
        n = 0
        while True:
            batch = [f"{seed}-{n + i}" for i in range(rng.randint(1, 32))]
            n += len(batch)
            for task_id in batch:
                box.put(task_id, envelope(task_id, "x" * rng.randint(0, 2000)))
            await box.wait_committed()
            sys.stdout.write("".join(f"{task_id}\n" for task_id in batch))
            sys.stdout.flush()


async def spawn(path: str, session: str, seed: int) -> None:
    """A manager on the store spawns children forever (some end at once, some after a
    while, some never); ``J <task id>`` is printed the moment ``journaled()`` returns for
    it (the acknowledgement of the spawn), ``D <task id>`` the moment its envelope is
    handed on (``handle.wait()`` returns: the acknowledgement of the envelope)."""
    rng = random.Random(seed)

    async def child(request: Request, ctx: RunContext) -> str:
        delay = float(request.input)
        if delay < 0:
            await anyio.sleep_forever()
        await anyio.sleep(delay)
        return f"slept {delay}"

    async def acknowledge(handle: SpawnHandle) -> None:
        await handle.journaled()
        sys.stdout.write(f"J {handle.task_id}\n")
        sys.stdout.flush()
        await handle.wait()
        sys.stdout.write(f"D {handle.task_id}\n")
        sys.stdout.flush()

    config = SubagentConfig(store_path=path, max_concurrent_spawns=16, mailbox_capacity=1 << 20)
    async with (
        SubagentManager([AgentSpec(name="child", runner=child)], config=config) as manager,
        anyio.create_task_group() as tg,
    ):
        while True:
            for _ in range(rng.randint(1, 16)):
                delay = rng.choice([0.0, 0.0, 0.001, 0.01, 0.05, -1.0])
                tg.start_soon(acknowledge, manager.spawn("child", str(delay), session_id=session))
            await anyio.sleep(rng.choice([0, 0.001, 0.005]))


async def rerun(path: str, spawn_one: bool, max_attempts: int) -> None:
    """A manager on the store whose agent ``stuck`` re-runs after a restart and never
    ends: with ``spawn_one`` it spawns one (``J <task id>`` once journaled); each run of
    one prints ``S <task id>`` as it starts (its try durably counted by then)."""

    async def stuck(request: Request, ctx: RunContext) -> str:
        say(f"S {ctx.task_id}")
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    spec = AgentSpec(name="stuck", runner=stuck, resume="rerun", max_attempts=max_attempts)
    async with SubagentManager([spec], config=SubagentConfig(store_path=path)) as manager:
        if spawn_one:
            handle = manager.spawn("stuck", "the input", timeout=None, idempotency_key="k")
            await handle.journaled()
            say(f"J {handle.task_id}")
        await anyio.sleep_forever()


async def rerun_parent(path: str) -> None:
    """A re-runnable ``parent`` that delegates one ``child`` (idempotency key ``ck``) and
    never ends; ``P <parent id> <child id>`` once the child's spawn is journaled and it
    runs."""
    started = anyio.Event()

    async def child(request: Request, ctx: RunContext) -> str:
        started.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def parent(request: Request, ctx: RunContext) -> str:
        handle = ctx.spawn("child", "work", idempotency_key="ck")
        await handle.journaled()
        await started.wait()
        say(f"P {ctx.task_id} {handle.task_id}")
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    agents = [
        AgentSpec(name="parent", runner=parent, resume="rerun"),
        AgentSpec(name="child", runner=child),
    ]
    async with SubagentManager(agents, config=SubagentConfig(store_path=path)) as manager:
        handle = manager.spawn("parent", "go", timeout=None)
        await handle.journaled()
        await anyio.sleep_forever()


def count(path: str, increments: int) -> None:
    """Increment a counter, each time reading it and writing it back in one transaction."""
    raw = connect(path, synchronous="NORMAL", busy_timeout=0.05)  # short: retries do the rest
    conn = Connection(raw, path=path, busy_timeout=30.0, retry_timeout=30.0)
    raw.execute("PRAGMA journal_mode = WAL")
    for _ in range(increments):

        def bump(raw: sqlite3.Connection) -> None:
            ((value,),) = raw.execute("SELECT value FROM counter").fetchall()
            raw.execute("UPDATE counter SET value = ?", (value + 1,))

        conn.write(bump)
    conn.close()
    say("ok")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command")
    parser.add_argument("args", nargs="*")
    parser.add_argument("--backend", default="asyncio")
    ns = parser.parse_args()
    args = ns.args
    if ns.command == "put":
        anyio.run(put, args[0], args[1], int(args[2]), args[3], backend=ns.backend)
    elif ns.command == "hold":
        anyio.run(hold, args[0], args[1], int(args[2]), backend=ns.backend)
    elif ns.command == "drain":
        anyio.run(drain, args[0], args[1], int(args[2]), int(args[3]), backend=ns.backend)
    elif ns.command == "wait":
        anyio.run(wait, args[0], args[1], args[2], backend=ns.backend)
    elif ns.command == "ack":
        anyio.run(ack, args[0], args[1], int(args[2]), backend=ns.backend)
    elif ns.command == "spawn":
        anyio.run(spawn, args[0], args[1], int(args[2]), backend=ns.backend)
    elif ns.command == "rerun":
        anyio.run(rerun, args[0], args[1] == "spawn", int(args[2]), backend=ns.backend)
    elif ns.command == "parent":
        anyio.run(rerun_parent, args[0], backend=ns.backend)
    elif ns.command == "count":
        count(args[0], int(args[1]))
    else:
        raise SystemExit(f"unknown command {ns.command!r}")


if __name__ == "__main__":
    main()
