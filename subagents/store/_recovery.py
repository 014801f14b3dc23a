"""Recovery: inside one ``BEGIN IMMEDIATE`` transaction, every task not ``ended`` whose
owning process is gone gets its envelope (the one already written, if the process died
between the put and the end write; else a new ``Interrupted`` one, delivered to its
session's mailbox) and becomes ``ended``, or, a root spawn of a re-runnable agent with
tries left, is claimed for running again: exactly one envelope each, even with several
processes recovering at once.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Final, Self, cast

from .._envelope import DelegateResult, Status, now_ms
from .._journal import SpawnEntry
from .._json import JSONValue, loads
from ._journal_writes import END_TASK, LAST_ENVELOPE, deliver_unread
from ._writer import Write

__all__ = ["INTERRUPTED", "OPEN_ORIGINS", "RecoverWrite", "interrupted_envelope", "owner_alive"]

INTERRUPTED: Final = "Interrupted"
"""The ``error_type`` of the envelope a restart gives a spawn its process never ended."""

_INTERRUPTED_TEXT: Final = (
    "the process running this child ended before the child finished "
    "(its envelope was given by a restart)"
)

OPEN_ORIGINS: set[str] = set()
"""The origins of the stores open in this process: their tasks are not recovered."""


def interrupted_envelope(
    task_id: str, agent: str, agent_path: str, *, tries: int | None = None
) -> DelegateResult:
    """The envelope of a spawn whose process ended before it did; ``tries``: the runs of a
    re-runnable spawn that all ended so (its cap reached)."""
    parent_path, _, _ = agent_path.rpartition("/")
    text = _INTERRUPTED_TEXT
    if tries is not None:
        text = (
            f"the processes running this child ended before it finished, {tries} times "
            "(its agent's max_attempts): it is not run again"
        )
    return DelegateResult(
        agent=agent,
        task_id=task_id,
        status=Status.ERROR,
        error=text,
        error_type=INTERRUPTED,
        agent_path=agent_path,
        parent_path=parent_path,
    )


def owner_alive(owner: str | None) -> bool:
    """Whether the process (and store) that journaled a task may still run it: a store
    open in this process, or another process that exists. A pid reused by an unrelated
    process keeps its tasks unrecovered until that process ends."""
    if not owner:
        return False
    if owner in OPEN_ORIGINS:
        return True
    pid_text, _, _ = owner.partition("-")
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    if pid == os.getpid():
        return False  # this process, but that store is closed
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True  # it exists (another user's)
    except (OSError, OverflowError, ValueError):
        return False
    return True


class RecoverWrite(Write):
    __slots__ = ("claimed", "origin", "recovered", "rerun", "reruns")

    def __init__(self, origin: str, reruns: Mapping[str, int], claimed: list[SpawnEntry]) -> None:
        super().__init__()
        self.origin = origin
        self.reruns = reruns
        self.claimed = claimed
        self.recovered = 0
        self.rerun: list[SpawnEntry] = []

    def done(self) -> None:
        # On commit, whether or not anyone still waits for the recovery: a claim whose
        # waiter was cancelled is handed to the next caller of claimed(), never stranded.
        self.claimed.extend(self.rerun)

    @classmethod
    def apply(cls, conn: sqlite3.Connection, writes: Sequence[Self]) -> None:
        for w in writes:
            w.recovered, w.rerun = _recover(conn, w.origin, w.reruns)


def _recover(
    conn: sqlite3.Connection, origin: str, reruns: Mapping[str, int]
) -> tuple[int, list[SpawnEntry]]:
    """Finish every unfinished task of a process that has ended, or claim it for running
    again (a root spawn of an agent in ``reruns``, under its cap of tries); returns how
    many were finished, and the claimed ones."""
    unfinished = conn.execute(
        "SELECT task_id, session, parent_task, agent, agent_path, request, attempts, owner, "
        "idempotency_key FROM tasks INDEXED BY tasks_unfinished WHERE state <> 'ended'"
    ).fetchall()
    ms = now_ms()
    recovered = 0
    claimed: list[SpawnEntry] = []
    for task_id, session, parent, agent, agent_path, request, attempts, owner, key in unfinished:
        if owner_alive(owner):
            continue
        ((envelope_id,),) = conn.execute(LAST_ENVELOPE, (task_id,)).fetchall()
        if envelope_id is None:  # the usual case: it never ended
            cap = reruns.get(agent)
            # Only a root session's spawn runs again: a child's parent session ended
            # with its process, and a parent run again delegates anew.
            if cap is not None and parent is None and attempts < cap:
                conn.execute(_CLAIM, (origin, ms, task_id))
                claimed.append(_claimed(task_id, session, agent, agent_path, request, key))
                continue
            envelope = interrupted_envelope(
                task_id, agent, agent_path, tries=attempts if cap is not None else None
            )
            envelope_id = deliver_unread(conn, session, task_id, envelope, origin, ms)
        conn.execute(END_TASK, (envelope_id, ms, task_id))
        recovered += 1
    for entry in claimed:
        # A parent run again delegates anew: what its dead try's children left in its
        # session (their envelopes unread, their idempotency keys) is not for it. The
        # rows stay, so their ids still answer; their names stay given out.
        conn.execute(_RETIRE_UNREAD, (f"recovery:{origin}", ms, entry.task_id))
        conn.execute(_RELEASE_KEYS, (entry.task_id,))
    return recovered, claimed


_RETIRE_UNREAD: Final = (
    "UPDATE deliveries INDEXED BY deliveries_live SET state = 'read', consumer = ?, "
    "changed_ms = ? WHERE session = ? AND state = 'stored'"
)
_RELEASE_KEYS: Final = (
    "UPDATE tasks SET idempotency_key = NULL WHERE session = ? AND idempotency_key IS NOT NULL"
)


_CLAIM: Final = (
    "UPDATE tasks SET state = 'queued', owner = ?, updated_ms = ? "
    "WHERE task_id = ? AND state <> 'ended'"
)


def _claimed(
    task_id: str, session: str, agent: str, agent_path: str, request: bytes, key: str | None
) -> SpawnEntry:
    data = loads(request)
    return SpawnEntry(
        task_id=task_id,
        session_id=session,
        parent_task=None,
        agent=agent,
        agent_path=agent_path,
        request=cast("Mapping[str, JSONValue]", data if isinstance(data, dict) else {}),
        idempotency_key=key,
    )
