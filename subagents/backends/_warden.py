"""A watchdog process that ends the command runner's process groups if this process dies.

Each command leads a session of its own, so nothing ends it when the process that
started it is killed (SIGKILL runs no handler, no ``finally``). While a warden is
installed, :class:`~subagents.backends.command.CommandRunner` tells it each group it
starts and each it has ended, one short line on a pipe; the warden is a small Python
process in a session of its own that reads the pipe to its end. The end comes when this
process closes it or dies (the kernel closes its descriptors either way): the warden then
signals the groups still listed, ``SIGTERM``, then ``SIGKILL`` after ``grace`` seconds,
and exits.

One process per batch, not one per command (a supervisor per command would cost a
Python start-up per item); two ``write`` calls per command. A SIGKILL in the short window
between a command's fork and its line on the pipe (written by the thread that started it,
as ``Popen`` returns) leaves that one group unlisted; so does a descendant that starts a
group of its own. A group the runner gave up on (its leader never reaped) stays listed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Final

__all__ = ["installed", "started", "ended"]

_SCRIPT: Final = """\
import os, signal, sys, time
groups = set()
for line in sys.stdin.buffer:
    op, pid = line[:1], int(line[1:])
    if op == b"+":
        groups.add(pid)
    else:
        groups.discard(pid)
def signal_all(signum):
    for pgid in list(groups):
        try:
            os.killpg(pgid, signum)
        except OSError:
            groups.discard(pgid)
signal_all(signal.SIGTERM)
if groups:
    time.sleep(float(sys.argv[1]))
    signal_all(signal.SIGKILL)
"""

_fd: int | None = None
"""The pipe to the installed warden, or ``None``."""


def _tell(line: bytes) -> None:
    global _fd
    fd = _fd
    if fd is None:
        return
    try:
        os.write(fd, line)
    except OSError:  # the warden died: nothing more to tell it
        _fd = None


def started(pgid: int) -> None:
    """A command's group started (a no-op without a warden)."""
    _tell(b"+%d\n" % pgid)


def ended(pgid: int) -> None:
    """A command's group was ended and reaped (a no-op without a warden)."""
    _tell(b"-%d\n" % pgid)


@contextmanager
def installed(grace: float) -> Iterator[None]:
    """Run a warden for the block (one at a time: nested, the outer one stays)."""
    global _fd
    if _fd is not None or sys.platform == "win32":
        yield
        return
    # Its own session: a terminal's Ctrl-C reaches the batch, which decides, not the warden.
    warden = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _SCRIPT, repr(grace)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    assert warden.stdin is not None
    _fd = warden.stdin.fileno()
    try:
        yield
    finally:
        _fd = None
        with suppress(OSError):
            warden.stdin.close()
        # The warden exits once it has read to the end; a wait keeps no zombie.
        with suppress(subprocess.TimeoutExpired):
            warden.wait(timeout=5)
