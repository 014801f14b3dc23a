"""A process of its own on a room's store file, driven by JSON lines.

    python tests/room/worker.py PATH [--clock wall|monotonic] [--backend asyncio|trio]

Each line on stdin is ``{"op": NAME, ...arguments}``: a :class:`~subagents.room.Room`
method called with the arguments, or ``contend`` (claims and releases at random, answering
the intervals held). Each answer is one line, ``{"ok": result}`` or ``{"error": class,
"message": text}``; ``"ready"`` comes first. End of stdin ends the process.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import anyio
import anyio.to_thread
import attrs

from subagents._json import dumps_str, loads
from subagents.room import Room


def plain(value: object) -> object:
    if attrs.has(type(value)):
        return {k: plain(v) for k, v in attrs.asdict(value, recurse=False).items()}  # type: ignore[arg-type]
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


class Clock:
    """The room's clock, remembering its last reading (taken inside a transaction)."""

    def __init__(self, source: str) -> None:
        self.read = time.monotonic if source == "monotonic" else time.time
        self.last = 0.0

    def __call__(self) -> float:
        self.last = self.read()
        return self.last


async def contend(
    room: Room, clock: Clock, member: str, paths: list[str], claims: int, seed: int
) -> list[dict[str, object]]:
    """``claims`` random claims (random path, mode, TTL), each followed by a release at
    random; every interval a lease was held, in the room's clock inside the transactions."""
    rng = random.Random(seed)
    held: dict[str, tuple[str, float, float]] = {}
    spans: list[dict[str, object]] = []

    def end(path: str, at: float) -> None:
        mode, start, expires = held.pop(path)
        spans.append(
            {"path": path, "member": member, "mode": mode, "start": start, "end": min(at, expires)}
        )

    for _ in range(claims):
        path = rng.choice(paths)
        if path in held:
            await room.release(member, path)
            end(path, clock.last)
            continue
        mode = rng.choice(["exclusive", "shared"])
        got = await room.claim(member, path, mode=mode, ttl=rng.uniform(0.002, 0.03))  # type: ignore[arg-type]
        if got.ok:
            assert got.lease is not None
            held[path] = (mode, got.at, got.lease.expires_at)
        spans.append({"claim": got.ok})
    for path in list(held):
        await room.release(member, path)
        end(path, clock.last)
    return spans


async def answer_lines(call: Callable[[str, dict[str, Any]], Awaitable[object]]) -> None:
    """Print ``ready``, then answer each line of stdin with ``call(op, arguments)`` until
    stdin ends (what another worker of the room tests runs too)."""
    print("ready", flush=True)
    while True:
        line = await anyio.to_thread.run_sync(sys.stdin.buffer.readline)
        if not line:
            return
        request = loads(line)
        assert isinstance(request, dict)
        op = str(request.pop("op"))
        try:
            answer = {"ok": plain(await call(op, request))}
        except Exception as exc:
            answer = {"error": type(exc).__name__, "message": str(exc)}
        print(dumps_str(answer), flush=True)


async def main(path: str, source: str) -> None:
    clock = Clock(source)
    async with Room(path, clock=clock) as room:

        async def call(op: str, request: dict[str, Any]) -> object:
            if op == "contend":
                return await contend(room, clock, **request)
            return await getattr(room, op)(**request)

        await answer_lines(call)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("--clock", default="wall")
    parser.add_argument("--backend", default="asyncio")
    ns = parser.parse_args()
    anyio.run(main, ns.path, ns.clock, backend=ns.backend)
