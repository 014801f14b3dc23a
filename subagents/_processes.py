"""Whether a process still runs, by pid and, where ``/proc`` tells it, its start time.

A pid is reused once its process has ended and been reaped, so a pid alone may name a
later, unrelated process; a pid and the start time recorded beside it name one. The
durable store's recovery, the batch's status and the room's liveness all ask this.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

__all__ = ["pid_running", "process_start"]

_PROC: Final = Path("/proc")


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name, or ``None``."""
    try:
        stat = (_PROC / str(pid) / "stat").read_bytes()
    except (OSError, ValueError):
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ")": split
    # after the last one.
    return stat[stat.rfind(b")") + 2 :].split()


def process_start(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot, or ``None`` where that
    is unknown (no ``/proc``, no such process)."""
    fields = _stat_fields(pid)
    try:
        return None if fields is None else int(fields[19])  # field 22 of proc_pid_stat(5)
    except (IndexError, ValueError):
        return None


def pid_running(pid: int, start: int | None = None) -> bool:
    """Whether process ``pid`` runs (a zombie has ended) and, when ``start`` is known, is
    the one that started then. A process of another user counts as running."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:
        pass  # it exists, owned by someone else
    except (OSError, OverflowError, ValueError):
        return False
    fields = _stat_fields(pid)
    if fields and fields[0] in (b"Z", b"X"):
        return False
    if start is not None:
        now = process_start(pid)
        if now is not None and now != start:
            return False
    return True
