"""Durable envelopes per second through ``SqliteMailbox``, against a raw ``sqlite3``
group-commit loop writing the same rows in the same run, and cross-process wake latency.

    python benchmarks/store_throughput.py                     # asyncio, FULL, ~20 s
    python benchmarks/store_throughput.py --backend trio
    python benchmarks/store_throughput.py --sync NORMAL -n 20000 -r 5
    python benchmarks/store_throughput.py --quick             # tiny sizes: proves it runs

Figures (medians over ``-r`` interleaved repetitions, each in a fresh database file):

- ``raw loop``: one thread, ``BEGIN IMMEDIATE``, the rows of ``--batch`` puts (an envelope
  and a delivery each, by ``executemany``, into the store's own schema), ``COMMIT``; no
  event loop, no objects beyond the parameters: the floor.
- ``mailbox burst``: one task puts N envelopes (1,000 sessions of capacity 64, as a fan-out
  lands in many parents), then awaits ``wait_committed()``; N / wall time.
- ``mailbox hooked``: 256 tasks, finishing children, put N envelopes in all and go on;
  each is acknowledged by the mailbox's ``committed`` hook (how the manager would mark a
  handle done once its envelope is durable); N / time until the last acknowledgement.
- ``mailbox acked``: the same 256 tasks, each awaiting ``wait_committed()`` after its put
  before it goes on: an event and a task wake-up per envelope.
- ``wake``: a second process puts an envelope while this one waits for it in
  ``SqliteMailbox.wait`` (no subscription in the putting process); latency from just
  before the put to the waiter resuming (``time.monotonic`` is system-wide on Linux), and
  back the other way (a ping-pong), ``--samples`` of each.
- ``loop ops``: how long ``put``, ``peek`` and ``len`` hold the event loop (inline SQLite
  reads), and ``drain`` (an inline write transaction), p50/p99.
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # measure this checkout, not an installed subagents

import anyio  # noqa: E402
import anyio.lowlevel  # noqa: E402

from subagents import DelegateResult, Status  # noqa: E402
from subagents.store import SqliteStore  # noqa: E402
from subagents.store._schema import migrate  # noqa: E402

SESSIONS = 1_000
OUTPUT = "x" * 400  # an envelope of about 600 bytes of JSON


def envelope(task_id: str, output: str = OUTPUT) -> DelegateResult:
    return DelegateResult(
        agent="bench", task_id=task_id, status=Status.COMPLETED, output=output, timestamp_ms=1
    )


def fresh(directory: str, name: str) -> str:
    path = os.path.join(directory, name)
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    return path


# ---------------------------------------------------------------- the floor


RAW_ENVELOPE = (
    "INSERT INTO envelopes (id, session, task_id, body, created_ms) VALUES (?, ?, ?, ?, ?)"
)
RAW_DELIVERY = (
    "INSERT INTO deliveries (envelope_id, session, recipient, task_id, state, stored_at, "
    "expires_at, origin, consumer, changed_ms) VALUES (?, ?, '', ?, 'stored', 0, NULL, 'raw', "
    "NULL, 1)"
)


def raw_connection(path: str, sync: str) -> sqlite3.Connection:
    """A plain connection to a new store file: WAL, ``synchronous``, the store's schema."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {sync}")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("BEGIN IMMEDIATE")
    migrate(conn, path)
    conn.execute("COMMIT")
    return conn


def raw_loop(
    path: str, n: int, batch: int, sync: str, make: Callable[[str], DelegateResult] = envelope
) -> float:
    """Envelopes per second of a plain group-commit loop writing the rows a put writes
    (the same schema, so the same indexes and overwrite trigger), with executemany;
    ``make(task_id)`` is the envelope."""
    conn = raw_connection(path, sync)
    bodies = [make(f"t{i}").to_json() for i in range(n)]
    start = time.perf_counter()
    for first in range(0, n, batch):
        ids = range(first, min(n, first + batch))
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            RAW_ENVELOPE, [(i + 1, f"s{i % SESSIONS}", f"t{i}", bodies[i], 1) for i in ids]
        )
        conn.executemany(RAW_DELIVERY, [(i + 1, f"s{i % SESSIONS}", f"t{i}") for i in ids])
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return n / elapsed


# ---------------------------------------------------------------- through the mailbox


async def mailbox_burst(path: str, n: int, sync: str) -> tuple[float, float]:
    async with SqliteStore(path, synchronous=sync) as store:  # type: ignore[arg-type]
        boxes = [store.mailbox(f"s{s}") for s in range(SESSIONS)]
        envelopes = [envelope(f"t{i}") for i in range(n)]
        start = time.perf_counter()
        for i, env in enumerate(envelopes):
            boxes[i % SESSIONS].put(env.task_id, env)
        await store.wait_committed()
        elapsed = time.perf_counter() - start
        stats = store.statistics()
    return n / elapsed, stats.writes / max(stats.batches, 1)


async def mailbox_acked(path: str, n: int, sync: str, tasks: int = 256) -> tuple[float, float]:
    async with SqliteStore(path, synchronous=sync) as store:  # type: ignore[arg-type]
        boxes = [store.mailbox(f"s{s}") for s in range(SESSIONS)]
        envelopes = [envelope(f"t{i}") for i in range(n)]

        async def child(first: int) -> None:
            for i in range(first, n, tasks):
                box = boxes[i % SESSIONS]
                box.put(envelopes[i].task_id, envelopes[i])
                await box.wait_committed()

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for first in range(tasks):
                tg.start_soon(child, first)
        elapsed = time.perf_counter() - start
        stats = store.statistics()
    return n / elapsed, stats.writes / max(stats.batches, 1)


async def mailbox_hooked(path: str, n: int, sync: str, tasks: int = 256) -> tuple[float, float]:
    """256 tasks (finishing children) each put and go on; each envelope is acknowledged
    by the mailbox's ``committed`` hook, as the manager would mark a handle done."""
    async with SqliteStore(path, synchronous=sync) as store:  # type: ignore[arg-type]
        boxes = [store.mailbox(f"s{s}") for s in range(SESSIONS)]
        envelopes = [envelope(f"t{i}") for i in range(n)]
        acknowledged = 0
        everything = anyio.Event()

        def committed(envelope: DelegateResult) -> None:
            nonlocal acknowledged
            acknowledged += 1
            if acknowledged == n:
                everything.set()

        for box in boxes:
            box.committed = committed

        async def child(first: int) -> None:
            for i in range(first, n, tasks):
                boxes[i % SESSIONS].put(envelopes[i].task_id, envelopes[i])
                await anyio.lowlevel.checkpoint()

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for first in range(tasks):
                tg.start_soon(child, first)
        await everything.wait()
        elapsed = time.perf_counter() - start
        stats = store.statistics()
    return n / elapsed, stats.writes / max(stats.batches, 1)


async def loop_ops(path: str, samples: int, sync: str) -> dict[str, list[float]]:
    """Seconds each call holds the event loop, on a mailbox of 32 committed entries."""
    times: dict[str, list[float]] = {"put": [], "peek": [], "len": [], "drain": []}
    async with SqliteStore(path, synchronous=sync) as store:  # type: ignore[arg-type]
        box = store.mailbox("ops", capacity=samples + 64)
        for i in range(32):
            box.put(f"base{i}", envelope(f"base{i}"))
        for i in range(samples):
            key = f"k{i}"
            start = time.perf_counter()
            box.put(key, envelope(key))
            times["put"].append(time.perf_counter() - start)
            await box.wait_committed()  # from now on every read goes to SQLite
            start = time.perf_counter()
            box.peek(key)
            times["peek"].append(time.perf_counter() - start)
            start = time.perf_counter()
            len(box)
            times["len"].append(time.perf_counter() - start)
            start = time.perf_counter()
            box.drain(key)
            times["drain"].append(time.perf_counter() - start)
    return times


# ---------------------------------------------------------------- cross-process wake


async def wake_peer(path: str, samples: int, backend: str) -> None:
    """The other process: put ping i (stamped), then wait for pong i."""
    rng = random.Random(5)
    async with SqliteStore(path) as store:
        pings, pongs = store.mailbox("pings"), store.mailbox("pongs")
        latencies = []
        for i in range(samples):
            await anyio.sleep(rng.uniform(0, 0.005))  # spread puts over the poll phase
            pings.put(f"p{i}", envelope(f"p{i}", output=repr(time.monotonic())))
            pong = await pongs.wait(f"p{i}", timeout=10)
            if pong is None:
                raise SystemExit(f"pong {i} never came")
            latencies.append(time.monotonic() - float(pong.output))
        print(" ".join(f"{x:.6f}" for x in latencies), flush=True)


async def wake(path: str, samples: int, backend: str) -> tuple[list[float], list[float]]:
    command = [sys.executable, __file__, "--peer", path, "--samples", str(samples)]
    async with (
        SqliteStore(path) as store,
        await anyio.open_process([*command, "--backend", backend], stderr=None) as peer,
    ):
        assert peer.stdout is not None
        pings, pongs = store.mailbox("pings"), store.mailbox("pongs")
        latencies = []
        rng = random.Random(6)
        for i in range(samples):
            ping = await pings.wait(f"p{i}", timeout=10)
            if ping is None:
                raise SystemExit(f"ping {i} never came")
            latencies.append(time.monotonic() - float(ping.output))
            await anyio.sleep(rng.uniform(0, 0.005))
            pongs.put(f"p{i}", envelope(f"p{i}", output=repr(time.monotonic())))
        out = b"".join([chunk async for chunk in peer.stdout])
        if await peer.wait():
            raise SystemExit(f"the peer process failed ({peer.returncode})")
    return latencies, [float(x) for x in out.split()]


# ---------------------------------------------------------------- report


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=50_000, help="envelopes per run")
    parser.add_argument("-r", "--reps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=512, help="rows per raw transaction")
    parser.add_argument("--sync", default="FULL", choices=["FULL", "NORMAL"])
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    parser.add_argument("--samples", type=int, default=300, help="wake samples each way")
    parser.add_argument("--quick", action="store_true", help="tiny sizes")
    parser.add_argument("--peer", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer:
        anyio.run(wake_peer, args.peer, args.samples, args.backend, backend=args.backend)
        return
    if args.quick:
        args.n, args.reps, args.samples = 2_000, 1, 20
    run = lambda fn, *a: anyio.run(fn, *a, backend=args.backend)  # noqa: E731
    raw: list[float] = []
    kinds = {"burst": mailbox_burst, "hooked": mailbox_hooked, "acked": mailbox_acked}
    rates: dict[str, list[float]] = {kind: [] for kind in kinds}
    batches: dict[str, list[float]] = {kind: [] for kind in kinds}
    with tempfile.TemporaryDirectory(prefix="store-bench-") as tmp:
        for _ in range(args.reps):
            raw.append(raw_loop(fresh(tmp, "raw.db"), args.n, args.batch, args.sync))
            for kind, fn in kinds.items():
                rate, batch = run(fn, fresh(tmp, f"{kind}.db"), args.n, args.sync)
                rates[kind].append(rate)
                batches[kind].append(batch)
        ops = run(loop_ops, fresh(tmp, "ops.db"), max(args.samples, 200), args.sync)
        there, back = run(wake, fresh(tmp, "wake.db"), args.samples, args.backend)
    floor = statistics.median(raw)
    python = sys.version.split()[0]
    print(
        f"store throughput: {args.backend}, synchronous={args.sync}, n={args.n}, "
        f"reps={args.reps}, SQLite {sqlite3.sqlite_version}, Python {python}"
    )
    print(f"  raw loop ({args.batch}/txn)   {floor:>9,.0f} envelopes/s")
    for kind in kinds:
        rate = statistics.median(rates[kind])
        print(
            f"  mailbox {kind:<14} {rate:>9,.0f} envelopes/s  {rate / floor:.2f}x raw  "
            f"(mean batch {statistics.median(batches[kind]):,.0f})"
        )
    both = there + back
    print(
        f"  wake across processes  p50 {pct(both, 0.5) * 1e3:.1f} ms  "
        f"p99 {pct(both, 0.99) * 1e3:.1f} ms  max {max(both) * 1e3:.1f} ms  "
        f"({len(both)} samples, poll every 5 ms)"
    )
    for op, values in ops.items():
        print(
            f"  loop held by {op:<6}     p50 {pct(values, 0.5) * 1e6:6.1f} us  "
            f"p99 {pct(values, 0.99) * 1e6:6.1f} us"
        )


if __name__ == "__main__":
    main()
