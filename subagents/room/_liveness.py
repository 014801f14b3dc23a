"""Whether a member's process still runs: by its harness key in a running process's
environment, or by its pid.

A harness keeps its key across a restart of the process that joined (an MCP server it
restarts gets a new pid), so the key is looked for first: one scan of ``/proc/*/environ``
answers for every member of a :meth:`Room.who`. A pid is checked with ``kill(pid, 0)``
and, where ``/proc`` exists, against the start time recorded at join, so a pid the system
gave to another process since reads as gone. Processes of other users whose environment
cannot be read are skipped (they cannot hold this user's keys anyway).
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path
from typing import Final

from .._processes import pid_running
from ._records import Liveness

__all__ = ["liveness", "running_keys"]

_PROC: Final = Path("/proc")


def running_keys(keys: Collection[str]) -> set[str]:
    """Those of ``keys`` (lower-case) that are the value of some variable in a running
    process's environment, in either case (one pass over ``/proc``; empty where there is
    none)."""
    if not keys:
        return set()
    # Keys are stored lower-cased; a harness may keep its key in either case.
    wanted = {k.lower().encode() for k in keys}
    found: set[bytes] = set()
    try:
        entries = list(os.scandir(_PROC))
    except OSError:
        return set()
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
        except OSError:
            continue
        for variable in environ.split(b"\0"):
            _, sep, value = variable.partition(b"=")
            if sep and len(value) == 36 and value.lower() in wanted:
                found.add(value.lower())
        if found == wanted:
            break
    return {k.decode() for k in found}


def liveness(
    pid: int | None, start: int | None, harness_key: str | None, keys_found: Collection[str]
) -> Liveness:
    """``alive`` when the harness key is among ``keys_found`` or the pid runs; ``unknown``
    without a pid (and no key found); else ``gone``."""
    if harness_key is not None and harness_key in keys_found:
        return "alive"
    if pid is None:
        return "unknown"
    return "alive" if pid_running(pid, start) else "gone"
