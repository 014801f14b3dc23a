"""The command runner's process on Linux: started off the event loop, its exit read from a pidfd.

``anyio.open_process`` on asyncio forks in the event loop's thread and waits there for the
child's ``exec``, then (Python 3.11) starts a thread per child to wait for its exit; on trio
it starts the child in a worker thread and waits for the exit through a pidfd. Here, on
either backend, :func:`spawn` starts the child with ``subprocess.Popen`` in a worker thread
(the event loop runs on while the child reaches its ``exec``, and several children start
at once), and the exit is awaited through a pidfd (Linux 5.3): a descriptor the loop
watches like a pipe, readable once the child has exited; the pipes are this module's own,
non-blocking, behind ``anyio.wait_readable`` and ``wait_writable``. No thread waits for a
child, and no asyncio transport or protocol objects are built per command.

``os.posix_spawn`` (``clone(CLONE_VM | CLONE_VFORK)``, cheaper in CPU) was measured here
and not kept: it holds the GIL until the child has called ``exec``, so on a loaded machine,
where the new child waits for a CPU, the whole process (event loop included) waits with it.
``subprocess`` waits for the ``exec`` without the GIL.

:func:`spawn` starts the child as the runner's ``anyio.open_process(...,
start_new_session=True)`` did: ``subprocess``'s own semantics (its ``PATH`` search in
``env``, ``close_fds``, ``restore_signals``, ``cwd``, its errors), in a session and process
group of its own. :class:`SpawnedProcess` is an :class:`anyio.abc.Process` over its
descriptors, so the runner drives either kind the same way. ``anyio.open_process`` stays
the path where pidfds are missing (:data:`AVAILABLE`).
"""

from __future__ import annotations

import math
import os
import signal
import signal as signal_module  # send_signal's parameter is named ``signal``, as anyio's is
import subprocess
import sys
from collections.abc import Mapping, Sequence
from contextlib import suppress
from typing import Final

import anyio
import anyio.abc
import anyio.to_thread
from anyio.lowlevel import RunVar

__all__ = ["AVAILABLE", "SpawnedProcess", "spawn"]


def _pidfds_work() -> bool:
    if sys.platform != "linux":
        return False
    if not hasattr(os, "pidfd_open") or not hasattr(signal, "pidfd_send_signal"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:  # a kernel before 5.3, or a sandbox that refuses the call
        return False
    return True


AVAILABLE: Final = _pidfds_work()
"""Whether :func:`spawn` can run here (Linux 5.3 or later, pidfds allowed)."""
_READ_CHUNK: Final = 65536


class SpawnedProcess(anyio.abc.Process):
    """A child started by :func:`spawn`: its pid, its pidfd and this side of its pipes.

    :meth:`wait` blocks until the child has exited (the pidfd becomes readable) and reaps
    it. :meth:`aclose` closes the pipes and the pidfd and never blocks: a child that has
    not exited is left running (the runner ends its group before it closes the process).
    """

    def __init__(
        self, popen: subprocess.Popen[bytes], pidfd: int, stdin: int, stdout: int, stderr: int
    ) -> None:
        # Held until reaped: a Popen collected unreaped joins subprocess's list of
        # children to reap, and another Popen could reap this one before its wait.
        self._popen = popen
        self._pid = popen.pid
        self._pidfd = pidfd
        self._returncode: int | None = None
        self._waiter: anyio.Event | None = None
        self._stdin = _FdSendStream(stdin)
        self._stdout = _FdReceiveStream(stdout)
        self._stderr = _FdReceiveStream(stderr)

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def returncode(self) -> int | None:
        return self._returncode

    @property
    def stdin(self) -> anyio.abc.ByteSendStream:
        return self._stdin

    @property
    def stdout(self) -> anyio.abc.ByteReceiveStream:
        return self._stdout

    @property
    def stderr(self) -> anyio.abc.ByteReceiveStream:
        return self._stderr

    async def wait(self) -> int:
        """Block until the child exits; its exit code (negative: the signal that killed it).

        One task waits on the pidfd; any other waits for that one. Cancellation leaves the
        child running and unreaped (a later ``wait`` reaps it).
        """
        while self._returncode is None:
            waiter = self._waiter
            if waiter is not None:
                await waiter.wait()
                continue
            if self._pidfd < 0:
                raise anyio.ClosedResourceError
            self._waiter = waiter = anyio.Event()
            try:
                await anyio.wait_readable(self._pidfd)
                self._reap()
            finally:
                self._waiter = None
                waiter.set()
        return self._returncode

    def _reap(self) -> None:
        try:
            _, status = os.waitpid(self._pid, 0)  # the pidfd is readable: it has exited
        except ChildProcessError:  # reaped by someone else (a process-wide child reaper)
            self._returncode = 255
        else:
            self._returncode = os.waitstatus_to_exitcode(status)
        self._popen.returncode = self._returncode  # reaped: subprocess must not wait for it

    def send_signal(self, signal: int) -> None:
        """Signal the child itself (through its pidfd: never another process with a
        reused pid); nothing once it has been reaped."""
        if self._returncode is None and self._pidfd >= 0:
            with suppress(ProcessLookupError):  # it has exited, and is not reaped yet
                signal_module.pidfd_send_signal(self._pidfd, signal)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    async def aclose(self) -> None:
        """Close the pipes and the pidfd (reaping the child if it has exited). Never blocks."""
        await self._stdin.aclose()
        await self._stdout.aclose()
        await self._stderr.aclose()
        pidfd, self._pidfd = self._pidfd, -1
        if pidfd >= 0:
            self._reap_if_exited()
            anyio.notify_closing(pidfd)
            os.close(pidfd)

    def _reap_if_exited(self) -> None:
        if self._returncode is None:
            with suppress(ChildProcessError):
                pid, status = os.waitpid(self._pid, os.WNOHANG)
                if pid:
                    self._returncode = os.waitstatus_to_exitcode(status)
                    self._popen.returncode = self._returncode


class _FdReceiveStream(anyio.abc.ByteReceiveStream):
    """This side of a child's stdout or stderr pipe (non-blocking)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    async def receive(self, max_bytes: int = _READ_CHUNK) -> bytes:
        while True:
            fd = self._fd
            if fd < 0:
                raise anyio.ClosedResourceError
            # Waited for first, even when data is there: the wait is the checkpoint that
            # keeps a fast writer from holding the event loop.
            await anyio.wait_readable(fd)
            try:
                data = os.read(fd, max_bytes)
            except BlockingIOError:
                continue
            if not data:
                raise anyio.EndOfStream
            return data

    async def aclose(self) -> None:
        _close(self)


class _FdSendStream(anyio.abc.ByteSendStream):
    """This side of a child's stdin pipe (non-blocking): what fits in the pipe is written
    at once, the rest as the child reads it."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    async def send(self, item: bytes) -> None:
        view = memoryview(item)
        while view:
            fd = self._fd
            if fd < 0:
                raise anyio.ClosedResourceError
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                await anyio.wait_writable(fd)
            except BrokenPipeError:  # the child closed stdin (or exited) without reading it
                raise anyio.BrokenResourceError from None

    async def send_eof(self) -> None:
        _close(self)

    async def aclose(self) -> None:
        _close(self)


def _close(stream: _FdReceiveStream | _FdSendStream) -> None:
    fd, stream._fd = stream._fd, -1
    if fd >= 0:
        anyio.notify_closing(fd)  # a task waiting on it wakes with ClosedResourceError
        os.close(fd)


async def spawn(
    argv: Sequence[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> SpawnedProcess:
    """Start ``argv`` in a session of its own with pipes for stdin, stdout and stderr.

    Waits for one of this loop's :data:`_STARTS` turns (a cancellation there starts
    nothing), then blocks until the child has started (``exec`` called), in a worker
    thread. That part is shielded: a cancellation waits for the start to finish, then hits
    the caller's next checkpoint, with the process returned for the caller to end
    (cancelled mid-start, it would have no owner to end it).

    Raises:
        FileNotFoundError: no executable ``argv[0]`` (on the ``PATH`` of ``env``).
        OSError: the start failed (as ``subprocess.Popen`` raises it).
    """
    if not AVAILABLE:
        raise RuntimeError("pidfds are not available on this platform")
    gate, threads = _starters()
    # The wait for a turn is outside the shield, so a run cancelled before its start has
    # a thread starts nothing; once it has one, the thread is never waited on for a token.
    async with gate:
        return await _start(argv, cwd, env, threads)


async def _start(
    argv: Sequence[str],
    cwd: str | os.PathLike[str] | None,
    env: Mapping[str, str] | None,
    threads: anyio.CapacityLimiter,
) -> SpawnedProcess:
    opened: list[int] = []
    try:
        stdin_r, stdin_w = _pipe(opened)
        stdout_r, stdout_w = _pipe(opened)
        stderr_r, stderr_w = _pipe(opened)

        def start() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                list(argv),
                stdin=stdin_r,
                stdout=stdout_w,
                stderr=stderr_w,
                cwd=cwd,
                env=env,
                start_new_session=True,
            )

        with anyio.CancelScope(shield=True):
            popen = await anyio.to_thread.run_sync(start, limiter=threads)
        for fd in (stdin_r, stdout_w, stderr_w):
            opened.remove(fd)
            os.close(fd)
        try:
            pidfd = os.pidfd_open(popen.pid)
        except OSError:  # out of descriptors: end the child rather than lose it
            os.killpg(popen.pid, signal.SIGKILL)
            with anyio.CancelScope(shield=True):  # reaped in a thread: never on the loop
                await anyio.to_thread.run_sync(popen.wait, limiter=threads)
            raise
    except BaseException:
        for fd in opened:
            os.close(fd)
        raise
    for fd in (stdin_w, stdout_r, stderr_r):
        os.set_blocking(fd, False)
    return SpawnedProcess(popen, pidfd, stdin_w, stdout_r, stderr_r)


_STARTS: Final = 8
"""Processes started at once, each in a worker thread of its own (a fork needs little
parallelism: the interpreter lock is held for most of it)."""
_STARTERS: RunVar[tuple[anyio.CapacityLimiter, anyio.CapacityLimiter]] = RunVar("starters")


def _starters() -> tuple[anyio.CapacityLimiter, anyio.CapacityLimiter]:
    """This event loop's gate for starts and the threads behind it: the starts never
    wait for the default thread limiter, which a runner's blocking work may hold."""
    try:
        return _STARTERS.get()
    except LookupError:
        pair = (anyio.CapacityLimiter(_STARTS), anyio.CapacityLimiter(math.inf))
        _STARTERS.set(pair)
        return pair


def _pipe(opened: list[int]) -> tuple[int, int]:
    """A close-on-exec pipe (``subprocess`` makes the child's ends its stdio)."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    opened += (read_end, write_end)
    return read_end, write_end
