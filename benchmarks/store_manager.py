"""Durable envelopes per second through ``SubagentManager`` on a store, against raw
``sqlite3`` group-commit loops in the same run; W1 with the store against W1 in memory;
the ``durability="async"`` commit window; cross-process wake latency.

    python benchmarks/store_manager.py                    # asyncio, FULL, about a minute
    python benchmarks/store_manager.py --backend trio -r 5
    python benchmarks/store_manager.py --quick            # tiny sizes: proves it runs (CI)
    python benchmarks/store_manager.py --where            # also: where the writer's time goes

Every figure but the floors runs ``SubagentManager(..., config=SubagentConfig(store_path=
<fresh file>, durability=...))`` (``synchronous=FULL``, the store's default) with the
benchmark agents of ``workloads.py``; medians over ``-r`` interleaved repetitions, each in
a fresh database file.

- ``raw loop, journal rows``: one thread, ``BEGIN IMMEDIATE``, then for ``--batch``
  children the rows the store writes per child, by ``executemany``: the ``tasks`` row
  (queued), its ``names`` row, the start (``running``, ``attempts + 1``), the envelope and
  its delivery, the end (``ended``, linked to the envelope); ``COMMIT``. No event loop, no
  objects beyond the parameters: the floor the throughput target is against.
- ``raw loop, envelope rows``: ``store_throughput.py``'s floor (an envelope and its
  delivery a child, nothing else), with the same envelope bodies.
- ``through the manager``: one parent spawns N no-op children (``-l`` slots) and collects
  every envelope through its mailbox as it arrives (W1's loop: ``subscribe_all`` +
  ``take_all``). N / time from the first ``spawn`` to the last envelope drained: with
  ``"sync"`` an entry is readable only once its commit is, so that is N envelopes handed on
  durably. With ``"async"`` envelopes are handed on at once: ``handed on`` is the same
  clock, ``committed`` runs on until ``wait_committed()`` returns (every row on disk).
  The store's open and close are outside this clock (W1 below includes them).
- ``W1``: ``workloads.fanout_subagents`` (what ``run.py``'s W1 times: the manager entered,
  N no-op children spawned and collected, the manager closed) at ``run.py``'s two limits
  (4 and 1,024), in memory and with the store, µs per child = wall / N.
- ``commit window`` (``"async"``): from an envelope handed on (the ``subagent.completed``
  event) to its commit (the mailbox's ``committed`` hook), p50 and p99 of each repetition:
  for the N children of a burst, and for ``--samples`` children spawned one at a time
  (each awaited with ``wait_result``, 4 slots).
- ``wake``: ``store_throughput.py``'s cross-process ping-pong through ``SqliteMailbox.wait``.
- ``--where``: one more run of each durability (and of the one-at-a-time window) timing
  the spawn calls, the reads on the event loop's connection, the writer thread's
  transactions, how long a committed batch waits for its callback on the event loop (the
  courier's calls) and running them, and the parent's takes. It wraps private methods of
  the store, so it is a diagnostic of this checkout, not a figure.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from time import perf_counter
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # measure this checkout, not an installed subagents
sys.path.insert(1, str(Path(__file__).resolve().parent))

import anyio  # noqa: E402
import orjson  # noqa: E402
import run as bench  # noqa: E402
import store_throughput as st  # noqa: E402
import workloads as wl  # noqa: E402

from subagents import DelegateResult, Status  # noqa: E402

SESSION = "root"
COMPLETED = "subagent.completed"  # the event of an envelope handed on
REQUEST = orjson.dumps({"input": "", "prompt": None, "model": None, "files": [], "timeout": 180.0})
"""A no-op child's ``tasks.request``, as the manager encodes it."""


def child_envelope(task_id: str) -> DelegateResult:
    """A no-op child's envelope, the fields the manager fills (about 250 bytes of JSON)."""
    return DelegateResult(
        agent="noop",
        task_id=task_id,
        status=Status.COMPLETED,
        output="ok",
        duration_ms=1,
        queue_ms=1,
        timestamp_ms=1,
        agent_path="/root/noop",
        parent_path="/root",
    )


# ---------------------------------------------------------------- the floors

RAW_TASK = (
    "INSERT INTO tasks (task_id, session, parent_task, agent, agent_path, request, "
    "idempotency_key, state, attempts, owner, created_ms, updated_ms) "
    "VALUES (?, ?, NULL, 'noop', ?, ?, NULL, 'queued', 0, 'raw', 1, 1)"
)
RAW_NAME = "INSERT INTO names (session, agent_path, task_id) VALUES (?, ?, ?)"
RAW_START = (
    "UPDATE tasks SET state = 'running', attempts = attempts + 1, updated_ms = 2 "
    "WHERE task_id = ? AND state = 'queued'"
)
RAW_END = (
    "UPDATE tasks SET state = 'ended', envelope_id = ?, updated_ms = 3 "
    "WHERE task_id = ? AND state <> 'ended'"
)


def raw_journal_loop(path: str, n: int, batch: int, sync: str) -> float:
    """Children per second of a plain group-commit loop writing every row the store
    writes per child (spawn, name, start, envelope, delivery, end), ``batch`` children a
    transaction, into the store's own schema (its indexes and triggers)."""
    conn = st.raw_connection(path, sync)
    ids = [f"{i:012x}" for i in range(n)]
    paths = [f"/root/noop-{i + 1}" for i in range(n)]
    bodies = [child_envelope(task_id).to_json() for task_id in ids]
    start = perf_counter()
    for first in range(0, n, batch):
        chunk = range(first, min(n, first + batch))
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(RAW_TASK, [(ids[i], SESSION, paths[i], REQUEST) for i in chunk])
        conn.executemany(RAW_NAME, [(SESSION, paths[i], ids[i]) for i in chunk])
        conn.executemany(RAW_START, [(ids[i],) for i in chunk])
        conn.executemany(st.RAW_ENVELOPE, [(i + 1, SESSION, ids[i], bodies[i], 1) for i in chunk])
        conn.executemany(st.RAW_DELIVERY, [(i + 1, SESSION, ids[i]) for i in chunk])
        conn.executemany(RAW_END, [(i + 1, ids[i]) for i in chunk])
        conn.execute("COMMIT")
    elapsed = perf_counter() - start
    conn.close()
    return n / elapsed


# ---------------------------------------------------------------- through the manager


async def through_manager(n: int, limit: int, path: str, durability: str) -> dict[str, Any]:
    """One fan-out of ``n`` no-op children on a fresh store: seconds from the first spawn
    to the last envelope drained (``handed_on``) and to everything committed, and the
    store's counters."""
    async with wl.manager(limit, n, store_path=path, durability=durability) as m:
        store: Any = m.store
        mailbox = m.mailbox()
        spawn = m.spawn
        start = perf_counter()
        for _ in range(n):
            spawn("noop")
        spawned = perf_counter() - start
        await wl.collect(mailbox, n)
        handed_on = perf_counter() - start
        await store.wait_committed()
        committed = perf_counter() - start
        stats = store.statistics()
    return {
        "spawned": spawned,
        "handed_on": handed_on,
        "committed": committed,
        "writes": stats.writes,
        "batches": stats.batches,
        "largest_batch": stats.largest_batch,
        "trips": store._writer.trips,  # the courier's calls into the loop
    }


def w1(n: int, limit: int, variant: str, path: str, backend: str) -> float:
    """µs per child of ``run.py``'s W1 (``fanout_subagents``), in memory or on a store."""
    config: dict[str, Any] = {}
    if variant != "memory":
        config = {"store_path": st.fresh(path, "w1.db"), "durability": variant}
    fanout = functools.partial(wl.fanout_subagents, **config)
    return wl.timed("subagents", fanout, n, limit, backend=backend) / n * 1e6


# ---------------------------------------------------------------- the async commit window


class Window:
    """Seconds from each child's envelope handed on to its commit."""

    def __init__(self) -> None:
        self.handed: dict[str, float] = {}
        self.samples: list[float] = []

    def on_event(self, event: Any) -> None:
        if event.type == COMPLETED:
            self.handed[event.task_id] = perf_counter()

    def on_committed(self, envelope: DelegateResult) -> None:
        handed = self.handed.pop(envelope.task_id, None)
        if handed is not None:
            self.samples.append(perf_counter() - handed)


async def commit_window(
    n: int, limit: int, path: str, one_at_a_time: bool
) -> tuple[list[float], Any]:
    """The commit window of each of ``n`` children (``"async"``), and the store's counters."""
    window = Window()
    async with wl.manager(limit, n, store_path=path, durability="async") as m:
        store: Any = m.store
        m.events.subscribe(window.on_event)
        mailbox: Any = m.mailbox()
        mailbox.committed = window.on_committed
        if one_at_a_time:
            for _ in range(n):
                await m.wait_result(m.spawn("noop").task_id)
        else:
            for _ in range(n):
                m.spawn("noop")
            await wl.collect(mailbox, n)
        await store.wait_committed()
        stats = store.statistics()
    if len(window.samples) != n:
        raise SystemExit(f"commit window: {len(window.samples)} of {n} commits seen")
    return window.samples, stats


# ---------------------------------------------------------------- where the time goes


@contextlib.contextmanager
def writer_timing() -> Iterator[dict[str, list[float]]]:
    """Time, per batch, the writer's transaction and its callback on the event loop; each
    take of the parent (``take_all``: its part on the event loop, once committed), and each
    read on the event loop's connection. The
    ``ends`` list holds when each transaction ended, the ``starts`` list when each callback
    began (both ``perf_counter``), so their difference is how long a committed batch waits
    for the event loop."""
    from subagents.store._in_hand import InHand
    from subagents.store._sqlite import Connection
    from subagents.store._store import SqliteStore
    from subagents.store._writer import Writer

    originals = {
        (Writer, "_commit_under_gate"): "transaction",
        (SqliteStore, "_on_batch"): "on_batch",
        (InHand, "handed"): "take",
        (Connection, "read"): "read",
    }
    times: dict[str, list[float]] = {
        figure + cpu: [] for figure in originals.values() for cpu in ("", " cpu", " start")
    }

    def timed(fn: Callable[..., Any], figure: str) -> Callable[..., Any]:
        into, cpu, began = times[figure], times[figure + " cpu"], times[figure + " start"]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start, thread = perf_counter(), time.thread_time()
            began.append(start)
            try:
                return fn(*args, **kwargs)
            finally:
                into.append(perf_counter() - start)
                cpu.append(time.thread_time() - thread)  # the calling thread's CPU time

        return wrapper

    saved = {key: getattr(*key) for key in originals}
    try:
        for (cls, name), figure in originals.items():
            setattr(cls, name, timed(saved[cls, name], figure))
        yield times
    finally:
        for (cls, name), fn in saved.items():
            setattr(cls, name, fn)


def where(n: int, limit: int, directory: str, durability: str, backend: str) -> str:
    """One more fan-out on a store, timed in its parts (see the module docstring)."""
    with writer_timing() as times:
        result = anyio.run(
            through_manager, n, limit, st.fresh(directory, "where.db"), durability, backend=backend
        )
    writes, batches, wall = result["writes"], result["batches"], result["committed"]
    # How long each committed batch waits for its callback to begin on the event loop.
    ended = [b + t for b, t in zip(times["transaction start"], times["transaction"], strict=True)]
    waits = [c - e for e, c in zip(ended, times["on_batch start"], strict=False)]
    transactions, takes, reads = times["transaction"], times["take"], times["read"]
    return (
        f"where the time goes ({durability}, {n:,} children, limit {limit:,}, "
        f"{wall * 1e3:,.0f} ms to the last commit):\n"
        f"  the spawn calls: {result['spawned'] * 1e3:,.0f} ms "
        f"({result['spawned'] / n * 1e6:.1f} us each); reads on the loop's connection: "
        f"{len(reads) / n:.2f} a child, {sum(reads) / n * 1e6:.1f} us a child\n"
        f"  {writes / n:.2f} writes a child; {batches} transactions of {writes / batches:,.0f} "
        f"writes on average (largest {result['largest_batch']:,}), "
        f"{result['trips']:,} calls into the loop\n"
        f"  writer in transactions: {sum(transactions) * 1e3:,.0f} ms "
        f"({statistics.mean(transactions) * 1e3:.1f} ms each, "
        f"{sum(transactions) / n * 1e6:.1f} us a child, of which the writer thread ran "
        f"{sum(times['transaction cpu']) / n * 1e6:.1f})\n"
        f"  a committed batch waiting for its callback: mean {statistics.mean(waits) * 1e3:.1f}"
        f" ms, longest {max(waits) * 1e3:.0f} ms; the first began "
        f"{(times['on_batch start'][0] - times['transaction start'][0]) * 1e3:.0f} ms after "
        f"the first transaction; running them: {sum(times['on_batch']) * 1e3:.0f} ms\n"
        f"  the parent's takes (take_all, the loop's part after the commit): {len(takes)}, "
        f"{sum(takes) * 1e3:.0f} ms in all, of which the loop thread ran "
        f"{sum(times['take cpu']) * 1e3:.0f} (longest {max(takes) * 1e3:.1f} ms)"
    )


def where_window(samples: int, directory: str, backend: str) -> str:
    """The one-at-a-time commit window's run, its writer timed."""
    with writer_timing() as times:
        start = perf_counter()
        window, stats = anyio.run(
            commit_window, samples, 4, st.fresh(directory, "where.db"), True, backend=backend
        )
        wall = perf_counter() - start
    transactions = times["transaction"]
    return (
        f"where the time goes (async, {samples:,} children one at a time, {wall * 1e3:,.0f} ms "
        f"with the store's open and close; window p50 {st.pct(window, 0.5) * 1e3:.1f} ms):\n"
        f"  {stats.batches} transactions of {stats.writes / stats.batches:,.0f} writes on "
        f"average (largest {stats.largest_batch:,}); writer in transactions: "
        f"{sum(transactions) * 1e3:,.0f} ms "
        f"({sum(transactions) / samples * 1e6:.1f} us a child, of which the writer thread ran "
        f"{sum(times['transaction cpu']) / samples * 1e6:.1f})"
    )


# ---------------------------------------------------------------- report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=10_000, help="children per run")
    parser.add_argument("-l", "--limit", type=int, default=1_024, help="slots (throughput)")
    parser.add_argument("-r", "--reps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=512, help="children per raw transaction")
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    parser.add_argument("--samples", type=int, default=1_000, help="one-at-a-time window")
    parser.add_argument("--wake", type=int, default=300, help="wake samples each way")
    parser.add_argument("--where", action="store_true", help="time the writer's parts too")
    parser.add_argument("--quick", action="store_true", help="tiny sizes")
    args = parser.parse_args()
    limits: tuple[int, ...] = bench.FULL["w1_limits"]
    if args.quick:
        args.n, args.reps, args.samples, args.wake = 500, 1, 50, 20
        limits = bench.QUICK["w1_limits"]
    n, backend, sync = args.n, args.backend, "FULL"
    run = functools.partial(anyio.run, backend=backend)
    with tempfile.TemporaryDirectory(prefix="store-manager-") as tmp:

        def throughput(kind: str) -> Any:
            path = st.fresh(tmp, f"{kind}.db")
            if kind == "raw journal":
                return raw_journal_loop(path, n, args.batch, sync)
            if kind == "raw envelopes":
                return st.raw_loop(path, n, args.batch, sync, child_envelope)
            return run(through_manager, n, args.limit, path, kind)

        kinds = ("raw journal", "raw envelopes", "sync", "async")
        rates = bench.interleaved(args.reps, kinds, throughput)
        per_child: dict[int, dict[str, list[float]]] = {}
        for limit in limits:
            per_child[limit] = bench.interleaved(
                args.reps,
                ("memory", "sync", "async"),
                functools.partial(w1, n, limit, path=tmp, backend=backend),
            )

        def window(kind: str) -> list[float]:
            path = st.fresh(tmp, "window.db")
            children, slots, one_at_a_time = (
                (n, args.limit, False) if kind == "burst" else (args.samples, 4, True)
            )
            samples, _ = run(commit_window, children, slots, path, one_at_a_time)
            return samples

        windows = bench.interleaved(args.reps, ("burst", "one"), window)
        there, back = run(st.wake, st.fresh(tmp, "wake.db"), args.wake, backend)
        diagnosis = [
            where(n, args.limit, tmp, durability, backend)
            for durability in (("sync", "async") if args.where else ())
        ]
        if args.where:
            diagnosis.append(where_window(args.samples, tmp, backend))
    report(args, rates, per_child, windows, there + back)
    if args.where:
        print("\n".join(diagnosis))


def spread(values: list[float], fmt: str) -> str:
    """The median, and the range of the repetitions when there are several."""
    median = format(statistics.median(values), fmt)
    if len(values) < 2:
        return median
    return f"{median} ({min(values):{fmt}}-{max(values):{fmt}})"


def report(
    args: argparse.Namespace,
    rates: dict[str, list[Any]],
    per_child: dict[int, dict[str, list[float]]],
    windows: dict[str, list[list[float]]],
    wake: list[float],
) -> None:
    n, judge = args.n, not args.quick
    python = sys.version.split()[0]
    print(
        f"store through the manager: {args.backend}, synchronous=FULL, n={n:,}, "
        f"limit {args.limit:,}, reps={args.reps}, SQLite {sqlite3.sqlite_version}, "
        f"Python {python}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    journal = statistics.median(rates["raw journal"])
    envelopes = statistics.median(rates["raw envelopes"])

    def row(
        figure: str,
        value: str,
        rate: float | None = None,
        target: str = "",
        ok: bool | None = None,
    ) -> None:
        ratios = ["", ""] if rate is None else [f"{rate / journal:.2f}", f"{rate / envelopes:.2f}"]
        mark = "" if ok is None or not judge else ("ok" if ok else "MISS")
        print(f"| {figure} | {value} | {' | '.join(ratios)} | {target} | {mark} |")

    print("| figure | median (range) | x journal floor | x envelope floor | target | |")
    print("|---|---|---|---|---|---|")
    row(
        f"raw loop, journal rows, {args.batch} children a transaction (children/s)",
        spread(rates["raw journal"], ",.0f"),
        journal,
    )
    row(
        f"raw loop, envelope rows only, {args.batch} a transaction (envelopes/s)",
        spread(rates["raw envelopes"], ",.0f"),
        envelopes,
    )
    for durability, clock, label in (
        ("sync", "handed_on", "handed on (each once committed)"),
        ("async", "handed_on", "handed on"),
        ("async", "committed", "committed"),
    ):
        runs = rates[durability]
        per_second = [n / r[clock] for r in runs]
        rate = statistics.median(per_second)
        writes = statistics.median(r["writes"] / n for r in runs)
        batch = statistics.median(r["writes"] / r["batches"] for r in runs)
        sync = durability == "sync"
        row(
            f"manager, {durability}: envelopes {label} (envelopes/s; {writes:.1f} writes a "
            f"child, mean batch {batch:,.0f} writes)",
            spread(per_second, ",.0f"),
            rate,
            ">= 0.5x journal floor and >= 20,000/s" if sync else "",
            rate >= 0.5 * journal and rate >= 20_000 if sync else None,
        )
    for limit, variants in per_child.items():
        memory = statistics.median(variants["memory"])
        row(f"W1 {n:,}, limit {limit:,}: in memory (us/child)", spread(variants["memory"], ".1f"))
        for variant in ("sync", "async"):
            us = statistics.median(variants[variant])
            sync = variant == "sync"
            row(
                f"W1 {n:,}, limit {limit:,}: store, {variant} (us/child)",
                f"{spread(variants[variant], '.1f')}: {us / memory:.2f}x in memory",
                target="<= 3x in memory" if sync else "",
                ok=us <= 3 * memory if sync else None,
            )
    for kind, label in (("burst", f"a burst of {n:,}"), ("one", f"{args.samples:,} one at a time")):
        p50s = [st.pct(samples, 0.5) * 1e3 for samples in windows[kind]]
        p99s = [st.pct(samples, 0.99) * 1e3 for samples in windows[kind]]
        row(
            f"async commit window, {label}: p50 / p99 (ms)",
            f"{spread(p50s, '.1f')} / {spread(p99s, '.1f')}",
        )
    row(
        f"wake across processes, {len(wake)} samples: p50 / p99 (ms)",
        f"{st.pct(wake, 0.5) * 1e3:.1f} / {st.pct(wake, 0.99) * 1e3:.1f}",
        target="<= 20 / <= 100",
        ok=st.pct(wake, 0.5) <= 0.020 and st.pct(wake, 0.99) <= 0.100,
    )


if __name__ == "__main__":
    main()
