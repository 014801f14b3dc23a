"""The command runner's process on Linux: started by ``posix_spawn``, awaited through a pidfd.

``subprocess.Popen`` (under ``anyio.open_process``) forks this process, whose page tables
grow with everything it has mapped, then waits for the child's ``exec``; on Python 3.11
asyncio also starts a thread per child to wait for its exit. glibc's ``posix_spawn`` starts
the child with ``clone(CLONE_VM | CLONE_VFORK)``, at a cost that does not depend on this
process's size, and a pidfd (Linux 5.3) is a descriptor the event loop watches like a
pipe: readable once the child has exited. So a command costs three pipes, a pidfd and
the loop's waits on them, no fork of the parent and no thread.

:func:`spawn` starts the child as the runner's ``anyio.open_process(...,
start_new_session=True)`` did: in a session (and process group) of its own, stdin, stdout
and stderr pipes to this process, ``SIGPIPE`` and ``SIGXFSZ`` back to their defaults
(``subprocess``'s ``restore_signals``), no descriptor but the three inherited
(``close_fds``), the executable found on the ``PATH`` of ``env`` as ``subprocess`` finds it.
:class:`SpawnedProcess` is an :class:`anyio.abc.Process` over those descriptors, so the
runner drives either kind the same way.

Python's ``posix_spawn`` has no working-directory action, so a runner with a
``cwd`` still goes through ``anyio.open_process``; so does any platform without
``posix_spawn`` or pidfds (:data:`AVAILABLE`).
"""

from __future__ import annotations

import errno
import os
import signal
import signal as signal_module  # send_signal's parameter is named ``signal``, as anyio's is
import stat
import sys
from collections.abc import Mapping, Sequence
from contextlib import suppress
from typing import Final

import anyio
import anyio.abc

if sys.platform != "win32":
    import fcntl

__all__ = ["AVAILABLE", "SpawnedProcess", "spawn"]


def _pidfds_work() -> bool:
    if sys.platform != "linux" or not hasattr(os, "posix_spawn"):
        return False
    if not hasattr(os, "pidfd_open") or not hasattr(signal, "pidfd_send_signal"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:  # a kernel before 5.3, or a sandbox that refuses the call
        return False
    return True


AVAILABLE: Final = _pidfds_work()
"""Whether :func:`spawn` can run here (Linux, ``posix_spawn``, pidfds)."""
_DEFAULT_SIGNALS: Final = tuple(
    getattr(signal, name) for name in ("SIGPIPE", "SIGXFSZ") if hasattr(signal, name)
)
"""Signals this interpreter ignores that the child gets back at their default, as
``subprocess``'s ``restore_signals`` does (an ignored signal stays ignored across exec)."""
_READ_CHUNK: Final = 65536


class SpawnedProcess(anyio.abc.Process):
    """A child started by :func:`spawn`: its pid, its pidfd and this side of its pipes.

    :meth:`wait` blocks until the child has exited (the pidfd becomes readable) and reaps
    it. :meth:`aclose` closes the pipes and the pidfd and never blocks: a child that has
    not exited is left running (the runner ends its group before it closes the process).
    """

    def __init__(self, pid: int, pidfd: int, stdin: int, stdout: int, stderr: int) -> None:
        self._pid = pid
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


def spawn(argv: Sequence[str], env: Mapping[str, str] | None = None) -> SpawnedProcess:
    """Start ``argv`` in a session of its own with pipes for stdin, stdout and stderr.

    Does not block beyond the kernel's start of the child (the caller's thread waits for
    the child's ``exec``, as ``subprocess`` does).

    Raises:
        FileNotFoundError: no executable ``argv[0]`` on the ``PATH`` of ``env``.
        OSError: the start failed (``posix_spawn``'s error, e.g. ``EACCES``, ``ENOEXEC``).
    """
    if not AVAILABLE:
        raise RuntimeError("posix_spawn with pidfds is not available on this platform")
    executable = _executable(argv[0], env)
    opened: list[int] = []
    try:
        stdin_r, stdin_w = _pipe(opened)
        stdout_r, stdout_w = _pipe(opened)
        stderr_r, stderr_w = _pipe(opened)
        actions: list[tuple[int, ...]] = [
            (os.POSIX_SPAWN_DUP2, stdin_r, 0),
            (os.POSIX_SPAWN_DUP2, stdout_w, 1),
            (os.POSIX_SPAWN_DUP2, stderr_w, 2),
        ]
        actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in _inheritable_fds(set(opened))]
        pid = os.posix_spawn(
            executable,
            list(argv),
            # A plain copy: the C side reads it faster than os.environ's mapping.
            dict(os.environb) if env is None else env,
            file_actions=actions,
            setsid=True,
            setsigdef=_DEFAULT_SIGNALS,
        )
        for fd in (stdin_r, stdout_w, stderr_w):
            opened.remove(fd)
            os.close(fd)
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:  # out of descriptors: end the child rather than lose it
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise
    except BaseException:
        for fd in opened:
            os.close(fd)
        raise
    for fd in (stdin_w, stdout_r, stderr_r):
        os.set_blocking(fd, False)
    return SpawnedProcess(pid, pidfd, stdin_w, stdout_r, stderr_r)


def _pipe(opened: list[int]) -> tuple[int, int]:
    """A close-on-exec pipe, neither end below 3: a ``dup2`` onto 0, 1 or 2 must not
    overwrite another of the child's ends (this process may have closed its stdio)."""
    ends: list[int] = []
    for fd in os.pipe2(os.O_CLOEXEC):
        opened.append(fd)
        if fd < 3:
            moved = _dup_above_stdio(fd)
            opened.append(moved)
            opened.remove(fd)
            os.close(fd)
            fd = moved
        ends.append(fd)
    return ends[0], ends[1]


def _dup_above_stdio(fd: int) -> int:
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)


def _inheritable_fds(skip: set[int]) -> list[int]:
    """This process's inheritable descriptors above stdio (``close_fds``: the child gets
    none of them). Python opens every descriptor non-inheritable, so this is usually
    empty: it lists those a caller made inheritable or that this process inherited."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd < 3 or fd in skip:
            continue
        try:
            if os.get_inheritable(fd):
                found.append(fd)
        except OSError:  # the listing's own descriptor, closed by now
            continue
    return found


def _executable(name: str, env: Mapping[str, str] | None) -> str:
    """``name`` as ``exec`` would find it: a path as given, else the first executable
    regular file of that name on the ``PATH`` of ``env`` (this process's if ``None``)."""
    if os.path.dirname(name):
        return name
    for directory in os.get_exec_path(env):
        candidate = os.path.join(directory, name)
        try:
            mode = os.stat(candidate).st_mode
        except OSError:
            continue
        if stat.S_ISREG(mode) and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), name)
