"""The command runner's process on Linux: its whole life in one worker thread.

:func:`run_command` starts the child with ``subprocess.Popen`` in a worker thread, and
that thread stays with it to its end: it feeds stdin, reads stdout and stderr, and waits
for the exit through a pidfd (Linux 5.3: a descriptor readable once the child has exited),
all in one ``poll`` wait, then reaps the child and ends what the command left in its
process group. The event loop does one thing per command: it awaits the thread. So the
loop neither forks, nor waits for an ``exec``, nor runs a step per pipe, and a batch has
one event loop for all of its commands, its manager and its store (design/batch.md has
the measurements).

A thread per running command (not one per start): a command's threads are the worker
threads of a limiter of their own, so the default thread limiter (which a runner's own
blocking work may fill) never holds a command back, and ``-j N`` running commands are N
threads, each blocked in the kernel.

Cut short (a cancellation: the watchdog's, a caller's), :func:`run_command` tells the
thread through an eventfd; the thread sends the group ``SIGTERM``, then ``SIGKILL``
``grace`` seconds later; the cancelled caller waits (shielded) for the thread to end,
which is bounded once the child has started (a ``Popen`` whose ``exec`` never returns, as
on a hung network mount, is not): past ``SIGKILL`` it gives the exit :data:`REAP_TIMEOUT` seconds (a
process in uninterruptible sleep is left unreaped), and a run cut short stops reading
the pipes once the command has exited. Past a normal exit the pipes get
:data:`REAP_TIMEOUT` seconds (a descendant that left the group may hold them). A run cut
short before its thread began starts nothing.

The child starts as ``anyio.open_process(..., start_new_session=True)`` would start it:
``subprocess``'s own semantics (its ``PATH`` search in ``env``, ``close_fds``,
``restore_signals``, ``cwd``, its errors), in a session and process group of its own.
``anyio.open_process`` stays the runner's path where pidfds are missing (:data:`AVAILABLE`).

``os.posix_spawn`` (cheaper in CPU) was measured here and not kept: it holds the GIL until
the child has called ``exec``, so on a loaded machine, where the new child waits for a
CPU, the whole process waits with it. ``subprocess`` waits for the ``exec`` without it.
"""

from __future__ import annotations

import errno
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import suppress
from typing import Final

import anyio
import anyio.to_thread
import attrs
from anyio.lowlevel import RunVar

from . import _warden

__all__ = [
    "AVAILABLE",
    "REAP_TIMEOUT",
    "Outcome",
    "keep_tail",
    "reaped",
    "run_command",
    "signal_group",
]


def reaped(pid: int, pidfd: int) -> int:
    """Reap the exited child ``pid`` (its pidfd ``pidfd``) and return its exit code, as
    ``subprocess`` gives it (``-N`` for signal ``N``). Through the pidfd where the kernel
    takes one (Linux 5.4): exactly that process, even if something else in this process
    reaped it and its pid went to another child of ours; by the pid where not.

    Raises:
        ChildProcessError: the child was reaped already.
    """
    global _waitid_pidfd
    if _waitid_pidfd:
        try:
            result = os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
        except OSError as exc:
            if exc.errno != errno.EINVAL:  # EINVAL: a kernel without P_PIDFD (5.3)
                raise
            _waitid_pidfd = False
        else:
            assert result is not None  # no WNOHANG: it waited for the exit
            return result.si_status if result.si_code == os.CLD_EXITED else -result.si_status
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


_waitid_pidfd = hasattr(os, "P_PIDFD") and hasattr(os, "waitid")
"""Whether :func:`reaped` goes through ``waitid(P_PIDFD)``: not where ``os`` lacks it, and
not after its first ``EINVAL`` (a 5.3 kernel has pidfds, but not this)."""


def _pidfds_work() -> bool:
    if sys.platform != "linux":
        return False
    if not all(hasattr(os, name) for name in ("pidfd_open", "eventfd", "eventfd_write")):
        return False
    if not hasattr(signal, "pidfd_send_signal") or not hasattr(select, "poll"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:  # a kernel before 5.3, or a sandbox that refuses the call
        return False
    return True


AVAILABLE: Final = _pidfds_work()
"""Whether :func:`run_command` can run here (Linux 5.3 or later, pidfds allowed)."""
REAP_TIMEOUT: Final = 5.0
"""How long a SIGKILLed process may take to be reaped, and its pipes to close after its
exit, before the run gives up on it (a process in uninterruptible sleep, a descendant that
left the group holding stdout)."""
_READ_CHUNK: Final = 65536

Outcome = tuple[bytes, int, bytes, bool]
"""``(stdout, exit code, the tail of stderr, cut)``: ``cut`` when stdout was still open
:data:`REAP_TIMEOUT` seconds after the exit, so what was read may be only part of it."""


def keep_tail(buffer: bytearray, keep: int | None) -> None:
    """Trim ``buffer`` to its last ``keep`` bytes once it holds twice as many (``None``:
    keep everything), so a chatty stderr costs bounded memory and amortised O(1) a byte."""
    if keep is not None and len(buffer) > 2 * keep:
        del buffer[: len(buffer) - keep]


def signal_group(pgid: int, signum: int) -> bool:
    """Send ``signum`` to the process group; False if the group is gone.

    After the leader has exited this still reaches what is left of the group: the kernel
    hands out no pid that is still in use as a group's id."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member changed its credentials: nothing more we may do
        return False
    return True


async def run_command(
    argv: Sequence[str],
    stdin: bytes,
    *,
    cwd: str | os.PathLike[str] | None,
    env: Mapping[str, str] | None,
    stderr_keep: int | None,
    grace: float,
) -> Outcome:
    """Run ``argv`` with ``stdin`` to its end in a worker thread (module doc).

    Cancellation ends the process group (``SIGTERM``, then ``SIGKILL`` after ``grace``
    seconds), waits shielded for the thread to end (bounded), then propagates.

    Raises:
        FileNotFoundError: no executable ``argv[0]`` (on the ``PATH`` of ``env``).
        OSError: the start failed (as ``subprocess.Popen`` raises it).
    """
    if not AVAILABLE:
        raise RuntimeError("pidfds are not available on this platform")
    job = _Job(_Command(list(argv), memoryview(stdin), cwd, env, stderr_keep, grace))
    threads = _threads()
    try:
        return await anyio.to_thread.run_sync(job.run, abandon_on_cancel=True, limiter=threads)
    except anyio.get_cancelled_exc_class():
        if job.stop():
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(job.ended.wait, limiter=threads)
        raise


_THREADS: RunVar[anyio.CapacityLimiter] = RunVar("command threads")


def _threads() -> anyio.CapacityLimiter:
    """This event loop's limiter for the commands' threads: unbounded (the manager's
    admission bounds the commands), and never the default one."""
    try:
        return _THREADS.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(math.inf)
        _THREADS.set(limiter)
        return limiter


class _GivenUp(Exception):
    """The thread's answer to a run cut short before its start, or whose exit never came
    (in uninterruptible sleep past ``SIGKILL``: left unreaped). Nobody reads it: the
    cancelled caller has stopped waiting for the thread's answer."""


@attrs.frozen
class _Command:
    """What one run of :func:`run_command` was asked to run."""

    argv: list[str]
    stdin: memoryview
    cwd: str | os.PathLike[str] | None
    env: Mapping[str, str] | None
    stderr_keep: int | None
    grace: float


class _Job:
    """One command, run to its end by :meth:`run` in a worker thread; :meth:`stop`, from
    the event loop, cuts it short."""

    def __init__(self, command: _Command) -> None:
        self.command = command
        self._lock = threading.Lock()
        self._state = "new"  # new -> running -> ended; or new -> ended (stopped first)
        self._wake = -1  # the eventfd that tells the thread to stop (while running)
        self.ended = threading.Event()
        """Set once the thread is done with the process (or will never start one)."""

    def stop(self) -> bool:
        """Cut the run short; True if a thread runs it (wait for :attr:`ended`), False if
        none ever will."""
        with self._lock:
            if self._state == "new":
                self._state = "ended"
                self.ended.set()
                return False
            if self._state == "running":
                os.eventfd_write(self._wake, 1)
            return True

    # ------------------------------------------------------------ the thread

    def run(self) -> Outcome:
        with self._lock:
            if self._state != "new":  # stopped before the thread began: start nothing
                raise _GivenUp
            try:
                self._wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
            except BaseException:  # out of descriptors: nothing started, nothing to wait for
                self._state = "ended"
                self.ended.set()
                raise
            self._state = "running"
        try:
            return _Process(self).run()
        finally:
            with self._lock:
                os.close(self._wake)
                self._wake = -1
                self._state = "ended"
            self.ended.set()


class _Process:
    """What the thread of one :class:`_Job` holds: the child, its descriptors, one poll."""

    def __init__(self, job: _Job) -> None:
        self.job = job
        self.fds: list[int] = []  # every descriptor of ours still open
        self.out = bytearray()
        self.err = bytearray()
        self.pipes: dict[int, bytearray] = {}  # stdout's and stderr's read ends still open
        self.stdin = job.command.stdin  # what is left to write
        self.stdin_w = -1
        self.pid = 0
        self.pidfd = -1
        self.code: int | None = None
        self.popen: subprocess.Popen[bytes] | None = None
        self.killed = False  # the group was sent SIGKILL
        self.stopped = False  # the run was cut short: its pipes are left at the exit
        self.deadline = math.inf  # the next step of an end: SIGKILL, or giving up

    def run(self) -> Outcome:
        try:
            return self._run()
        finally:
            for fd in self.fds:
                os.close(fd)

    def _run(self) -> Outcome:
        command = self.job.command
        stdin_r, self.stdin_w = self._pipe()
        stdout_r, stdout_w = self._pipe()
        stderr_r, stderr_w = self._pipe()
        self.popen = subprocess.Popen(
            command.argv,
            stdin=stdin_r,
            stdout=stdout_w,
            stderr=stderr_w,
            cwd=command.cwd,
            env=command.env,
            start_new_session=True,
        )
        self.pid = self.popen.pid
        _warden.started(self.pid)
        try:
            # Only once the warden lists its group does the child get its item: a command
            # cannot act on it in the window a SIGKILL of this process leaves unguarded.
            # What fits in the pipe is written at once (our read end still open, so no
            # EPIPE): most items never need a wait for stdin. Up to PIPE_BUF bytes always
            # fit in an empty pipe; beyond, the write end is made non-blocking and fed as
            # the child reads.
            if len(self.stdin) > select.PIPE_BUF:
                os.set_blocking(self.stdin_w, False)
            if not self._feed():
                self._stdin_done()
            for fd in (stdin_r, stdout_w, stderr_w):
                self._close(fd)
            self.pidfd = os.pidfd_open(self.pid)
            self.fds.append(self.pidfd)
            # Left blocking: each is read once for each time poll finds it readable.
            self.pipes = {stdout_r: self.out, stderr_r: self.err}
            code = self._wait()
            return bytes(self.out), code, bytes(self.err), stdout_r in self.pipes
        except _GivenUp:
            raise
        except BaseException:  # an error here: never leave the child running unreaped
            if self.code is None:
                signal_group(self.pid, signal.SIGKILL)
                with suppress(subprocess.TimeoutExpired):
                    self.popen.wait(REAP_TIMEOUT)
            raise
        finally:
            if self.popen.returncode is not None:  # reaped; else the warden keeps it listed
                _warden.ended(self.pid)

    def _wait(self) -> int:
        """Until the child has exited and its pipes are closed, or their bounds passed;
        the exit code."""
        poll = select.poll()  # poll(2): its registrations are no system calls
        for fd in (self.job._wake, self.pidfd, *self.pipes):
            poll.register(fd, select.POLLIN)
        if self.stdin_w >= 0:
            poll.register(self.stdin_w, select.POLLOUT)
        # A stop that came while the child was starting finds the eventfd readable.
        while self.pipes or self.code is None:
            if time.monotonic() >= self.deadline:
                if self.code is not None or self.killed:
                    break  # the pipes outlived their bound, or the exit never came
                self._kill()
            timeout = self.deadline - time.monotonic()
            for fd, _ in poll.poll(None if timeout == math.inf else max(0.0, timeout) * 1000):
                self._ready(poll, fd)
        if self.code is None:
            raise _GivenUp
        return self.code

    def _ready(self, poll: select.poll, fd: int) -> None:
        if fd in self.pipes:
            self._drain(poll, fd)
        elif fd == self.pidfd:
            poll.unregister(fd)
            self._exited()
        elif fd == self.stdin_w:
            if not self._feed():
                poll.unregister(fd)
                self._stdin_done()
        else:
            poll.unregister(fd)
            self._stopped()

    def _drain(self, poll: select.poll, fd: int) -> None:
        chunk = os.read(fd, _READ_CHUNK)  # readable: this read does not block
        if not chunk:
            poll.unregister(fd)
            del self.pipes[fd]
            return
        into = self.pipes[fd]
        into += chunk
        if into is self.err:
            keep_tail(into, self.job.command.stderr_keep)

    def _exited(self) -> None:
        # What is left of the group is what the command left in the background: it ends
        # now, or a child holding stdout would keep the run from ending. Signalled before
        # the reap: while the leader is a zombie no other process can get its id. A
        # descendant that left the group may hold a pipe still: bounded.
        self._kill()
        self._reap()
        if self.stopped:  # a run cut short reads no more once its command has exited
            self.deadline = -math.inf

    def _stopped(self) -> None:
        self.stopped = True
        if self.code is not None:  # cut short while its pipes drain: they are left
            self.deadline = -math.inf
        elif not self.killed:
            self._terminate()

    def _terminate(self) -> None:
        """``SIGTERM`` to the group, ``SIGKILL`` due ``grace`` seconds later."""
        signal_group(self.pid, signal.SIGTERM)
        self.deadline = time.monotonic() + self.job.command.grace

    def _kill(self) -> None:
        """``SIGKILL`` to the group; the exit (or, once exited, the pipes) given a bound."""
        signal_group(self.pid, signal.SIGKILL)
        self.killed = True
        self.deadline = time.monotonic() + REAP_TIMEOUT

    def _reap(self) -> None:
        assert self.popen is not None
        try:
            self.code = reaped(self.pid, self.pidfd)  # the pidfd is readable: it has exited
        except ChildProcessError:  # reaped by someone else (a process-wide child reaper)
            self.code = 255
        self.popen.returncode = self.code  # reaped: subprocess must not wait for it

    def _feed(self) -> bool:
        """Write what the stdin pipe takes now; False once there is no more to write
        (everything written, or the child closed its stdin without reading it all: its
        choice)."""
        try:
            while self.stdin:
                self.stdin = self.stdin[os.write(self.stdin_w, self.stdin) :]
        except BlockingIOError:
            return True
        except BrokenPipeError:
            pass
        return False

    def _stdin_done(self) -> None:
        self._close(self.stdin_w)
        self.stdin_w = -1

    def _pipe(self) -> tuple[int, int]:
        """A close-on-exec pipe (``subprocess`` makes the child's ends its stdio)."""
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        self.fds += (read_end, write_end)
        return read_end, write_end

    def _close(self, fd: int) -> None:
        self.fds.remove(fd)
        os.close(fd)
