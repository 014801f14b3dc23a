"""Cross-process room messages and lease claims on one store file.

    python benchmarks/room.py                 # asyncio, ~15 s
    python benchmarks/room.py --backend trio
    python benchmarks/room.py --quick         # tiny sizes: proves it runs

Figures:

- ``message latency``: a second process waits in ``Room.receive`` (timeout 30 s) while
  this one sends it a message; from just before ``send`` to the receiver resuming with the
  body (``time.monotonic`` is system-wide on Linux, the body carries the send time),
  ``--messages`` samples, one at a time (each sent 5 to 15 ms after the receiver answered
  the last, so it is parked in its wait), p50 and p99. The receiver wakes by polling
  ``PRAGMA data_version`` every 5 ms, so the figure includes half a poll on average.
- ``bridged latency``: the same through ``subagents.room.bridge`` in both processes, in
  the same run: ``manager.send(member, ...)`` here to ``manager.recv()`` in the other
  (its bridge waits in ``Room.peek``, hands the message to the session's inbox, and marks
  it accepted; the local read marks it read after the figure is taken). The difference
  from ``message latency`` is the bridge's own cost: the send's task, the hand-over.
- ``claims/s``: 4 processes, each ``--claims`` times claiming one of 4 paths exclusively
  (TTL 1 s) and releasing it when it got it; every claim is one ``BEGIN IMMEDIATE``
  transaction; total claims (granted or refused) / wall time from the first start to the
  last end, and the share granted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import anyio
import anyio.to_thread

from subagents import SubagentManager
from subagents._json import dumps_str, loads
from subagents.room import Room, bridge


def _reply(line: str) -> None:
    print(line, flush=True)


async def _receiver(path: str, member: str, n: int) -> None:
    """Receive ``n`` messages one at a time; print each latency (ms) after the reply."""
    async with Room(path) as room:
        _reply("ready")
        for _ in range(n):
            got = await room.receive(member, timeout=30, limit=1)
            now = time.monotonic()
            (message,) = got.messages
            _reply(f"{(now - float(message.body)) * 1000:.4f}")


async def _bridged_receiver(path: str, member: str, n: int) -> None:
    """As :func:`_receiver`, through a bridge: ``manager.recv`` of the bridged session."""
    del member
    async with Room(path) as room, SubagentManager() as manager, bridge(room, manager) as link:
        _reply(link.member_id)
        for _ in range(n):
            message = await manager.recv(timeout=30)
            now = time.monotonic()
            assert message is not None
            _reply(f"{(now - float(message.body)) * 1000:.4f}")


async def _bridged_latency(path: str, n: int, backend: str) -> list[float]:
    child = _child("bridged", path, "-", n, backend)
    assert child.stdout is not None
    receiver = child.stdout.readline().strip()
    samples = []
    async with Room(path) as room, SubagentManager() as manager, bridge(room, manager):
        for i in range(n):
            await anyio.sleep(0.005 + 0.01 * ((i * 7919) % 100) / 100)
            manager.send(receiver, repr(time.monotonic()))
            line = await anyio.to_thread.run_sync(child.stdout.readline)
            samples.append(float(line))
    child.wait(timeout=60)
    return samples


async def _claimer(path: str, member: str, n: int) -> None:
    async with Room(path) as room:
        _reply("ready")
        await anyio.to_thread.run_sync(input)  # go
        granted = 0
        started = time.monotonic()
        for i in range(n):
            target = f"/bench/file-{i % 4}"
            got = await room.claim(member, target, ttl=1.0)
            if got.ok:
                granted += 1
                await room.release(member, target)
        _reply(dumps_str({"start": started, "end": time.monotonic(), "granted": granted}))


def _child(kind: str, path: str, member: str, n: int, backend: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, "--child", kind, path, member, str(n), "--backend", backend],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


async def _join(path: str, room: str, count: int) -> list[str]:
    async with Room(path) as rooms:
        return [(await rooms.join(room, pid=None)).member_id for _ in range(count)]


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _latency(path: str, n: int, backend: str) -> list[float]:
    sender, receiver = await _join(path, "bench", 2)
    child = _child("receiver", path, receiver, n, backend)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    samples = []
    async with Room(path) as room:
        for i in range(n):
            # The receiver is parked in its wait by then, not between two receives.
            await anyio.sleep(0.005 + 0.01 * ((i * 7919) % 100) / 100)
            await room.send(sender, receiver, repr(time.monotonic()))
            line = await anyio.to_thread.run_sync(child.stdout.readline)
            samples.append(float(line))
    child.wait(timeout=60)
    return samples


def _contention(path: str, n: int, backend: str) -> tuple[float, float]:
    members = anyio.run(_join, path, "claims", 4)
    children = [_child("claimer", path, m, n, backend) for m in members]
    for child in children:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    results = []
    for child in children:
        assert child.stdout is not None
        results.append(loads(child.stdout.readline()))
        child.wait(timeout=60)
    start = min(float(r["start"]) for r in results)  # type: ignore[arg-type, index]
    end = max(float(r["end"]) for r in results)  # type: ignore[arg-type, index]
    granted = sum(int(r["granted"]) for r in results)  # type: ignore[arg-type, index]
    return 4 * n / (end - start), granted / (4 * n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes")
    parser.add_argument("--messages", type=int, default=500)
    parser.add_argument("--claims", type=int, default=2000, help="per process")
    parser.add_argument("--backend", default="asyncio", choices=("asyncio", "trio"))
    parser.add_argument("--child", nargs=4, metavar=("KIND", "PATH", "MEMBER", "N"))
    args = parser.parse_args()
    if args.child:
        kind, path, member, n = args.child
        runners = {"receiver": _receiver, "bridged": _bridged_receiver, "claimer": _claimer}
        runner = runners[kind]
        anyio.run(runner, path, member, int(n), backend=args.backend)
        return
    messages, claims = (20, 50) if args.quick else (args.messages, args.claims)
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "room.db")
        samples = anyio.run(_latency, path, messages, args.backend, backend=args.backend)
        bridged = anyio.run(_bridged_latency, path, messages, args.backend, backend=args.backend)
        rate, granted = _contention(path, claims, args.backend)
    print(f"room benchmark ({args.backend}, {os.cpu_count()} cores)")
    print(
        f"message latency   p50 {statistics.median(samples):.2f} ms   "
        f"p99 {_percentile(samples, 0.99):.2f} ms   ({messages} messages)"
    )
    print(
        f"bridged latency   p50 {statistics.median(bridged):.2f} ms   "
        f"p99 {_percentile(bridged, 0.99):.2f} ms   (manager.send -> manager.recv)"
    )
    print(f"claims/s          {rate:,.0f}   ({granted:.0%} granted, 4 processes x {claims})")


if __name__ == "__main__":
    main()
