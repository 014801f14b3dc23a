"""Helpers of the room tests: worker processes on one store file, a clock to turn."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from subagents._json import dumps_str, loads
from subagents.room import Room

WORKER = Path(__file__).with_name("worker.py")
BRIDGE_WORKER = Path(__file__).with_name("bridge_worker.py")

NO_SUCH_PID = 2**22 + 7
"""Above the kernel's pid_max: no process has it."""


async def until_committed(room: Room, holds: Callable[[], Awaitable[bool]]) -> None:
    """Return once ``await holds()`` is true, looking again after each commit to
    ``room``'s file by any connection of any process: woken as a waiting
    :meth:`Room.receive` is (the room's watcher of ``PRAGMA data_version``, and its own
    commits), never by a timer. Unbounded: the caller bounds it (``anyio.fail_after``).

    ``Room`` has no public "wait for any change"; its waiters are the hook receive uses.
    """

    async def look(left: float | None) -> bool | None:
        return (await holds()) or None

    await room._waiters.until(False, bool, look, None)


def open_files(under: Path) -> list[str]:
    """The files under ``under`` this process holds open (Linux: ``/proc/self/fd``)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(under)):
            found.append(target)
    return found


class FakeClock:
    """A room's clock that moves only when a test turns it."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class RoomWorker:
    """A running ``worker.py``: one call, one answer."""

    def __init__(self, process: Process) -> None:
        assert process.stdout is not None
        self.process = process
        self._out = BufferedByteReceiveStream(process.stdout)

    async def line(self) -> str:
        return (await self._out.receive_until(b"\n", 1 << 26)).decode()

    async def submit(self, op: str, **args: object) -> None:
        """Send a call without waiting for its answer (read it with :meth:`answer`)."""
        assert self.process.stdin is not None
        await self.process.stdin.send(dumps_str({"op": op, **args}).encode() + b"\n")

    async def answer(self) -> object:
        reply = loads(await self.line())
        assert isinstance(reply, dict)
        if "error" in reply:
            raise AssertionError(f"worker: {reply['error']}: {reply['message']}")
        return reply["ok"]

    async def call(self, op: str, **args: object) -> object:
        await self.submit(op, **args)
        return await self.answer()

    async def error(self, op: str, **args: object) -> dict[str, object]:
        """The error a call answers (it must fail)."""
        await self.submit(op, **args)
        reply = loads(await self.line())
        assert isinstance(reply, dict)
        assert "error" in reply, reply
        return reply


@asynccontextmanager
async def room_worker(
    path: Path,
    *,
    backend: str = "asyncio",
    clock: str = "wall",
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    script: Path = WORKER,
    extra: Sequence[str] = (),
) -> AsyncIterator[RoomWorker]:
    """Start a worker on ``path`` (in ``cwd``, with ``env`` added; ``script``: which, with
    ``extra`` arguments); its stdin is closed at the end and it must exit cleanly, unless
    the test killed it."""
    command = [sys.executable, str(script), str(path), "--backend", backend, *extra]
    if script == WORKER:
        command += ["--clock", clock]
    environment = {**os.environ, **(env or {})}
    async with await anyio.open_process(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=None,
        cwd=cwd,
        env=environment,
    ) as process:
        running = RoomWorker(process)
        try:
            with anyio.fail_after(60):
                assert await running.line() == "ready"
            yield running
        except BaseException:
            process.kill()
            raise
        assert process.stdin is not None
        await process.stdin.aclose()
        with anyio.fail_after(60):
            code = await process.wait()
    assert code in (0, -9), f"the room worker exited with {code}"
