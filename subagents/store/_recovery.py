"""Recovery: inside one ``BEGIN IMMEDIATE`` transaction, every task not ``ended`` whose
owning process is gone gets its envelope (the one already written, if the process died
between the put and the end write; else a new ``Interrupted`` one, delivered to its
session's mailbox) and becomes ``ended``, or, a root spawn of a re-runnable agent with
tries left, is claimed for running again: exactly one envelope each, even with several
processes recovering at once.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Final, Self, cast

from .._envelope import DelegateResult, Status, now_ms
from .._journal import SpawnEntry
from .._json import JSONValue, loads
from .._paths import AgentPath
from .._processes import pid_running
from ._journal_writes import END_TASK, LAST_ENVELOPE, deliver_unread
from ._writer import Write

__all__ = [
    "INTERRUPTED",
    "OPEN_ORIGINS",
    "RecoverWrite",
    "ReleaseWrite",
    "interrupted_envelope",
    "owner_alive",
]

logger = logging.getLogger("subagents.store")

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
    try:
        AgentPath(agent_path)
    except ValueError:  # a damaged row: an envelope every reader can still decode
        agent_path = "/root"
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
    return pid_running(pid)


class RecoverWrite(Write):
    """One recovery. Its claims are its waiter's; if the waiter is gone (cancelled) before
    they are handed over, they go to the store's unclaimed list (:meth:`abandon`), which
    the next recovery of a manager running their agents takes, and the store's close
    releases (:class:`ReleaseWrite`)."""

    __slots__ = ("committed", "origin", "orphans", "recovered", "rerun", "reruns")

    def __init__(self, origin: str, reruns: Mapping[str, int]) -> None:
        super().__init__()
        self.origin = origin
        self.reruns = reruns
        self.recovered = 0
        self.rerun: list[SpawnEntry] = []
        self.committed = False
        self.orphans: list[SpawnEntry] | None = None

    def abandon(self, orphans: list[SpawnEntry]) -> None:
        """Its waiter is gone: its claims, now or once committed, go to ``orphans``."""
        if self.committed:
            orphans.extend(self.rerun)
            self.rerun = []
        else:
            self.orphans = orphans

    def done(self) -> None:
        self.committed = True
        if self.orphans is not None:
            self.orphans.extend(self.rerun)
            self.rerun = []

    @classmethod
    def apply(cls, conn: sqlite3.Connection, writes: Sequence[Self]) -> None:
        for w in writes:
            w.recovered, w.rerun = _recover(conn, w.origin, w.reruns)


class ReleaseWrite(Write):
    """Claims no manager took, let go as their store closes: owned by nobody, so the next
    recovery, in any process, takes them (their owner's pid still runs)."""

    __slots__ = ("origin", "task_ids")

    def __init__(self, origin: str, task_ids: list[str]) -> None:
        super().__init__()
        self.origin = origin
        self.task_ids = task_ids

    @classmethod
    def apply(cls, conn: sqlite3.Connection, writes: Sequence[Self]) -> None:
        ms = now_ms()
        conn.executemany(
            "UPDATE tasks SET owner = NULL, updated_ms = ? "
            "WHERE task_id = ? AND state = 'queued' AND owner = ?",
            [(ms, task_id, w.origin) for w in writes for task_id in w.task_ids],
        )


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
            entry = None
            if cap is not None and parent is None and attempts < cap:
                entry = _claimed(task_id, session, agent, agent_path, request, key)
            if entry is not None:
                conn.execute(_CLAIM, (origin, ms, task_id))
                claimed.append(entry)
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
) -> SpawnEntry | None:
    """The spawn to run again, or ``None`` if its row cannot make one (a damaged request
    or path): it then ends ``Interrupted`` rather than failing every recovery."""
    try:
        data = loads(request)
        AgentPath(agent_path)
    except ValueError:
        logger.warning("task %s cannot be run again: its row is damaged", task_id)
        return None
    if not isinstance(data, dict):
        return None
    return SpawnEntry(
        task_id=task_id,
        session_id=session,
        parent_task=None,
        agent=agent,
        agent_path=agent_path,
        request=cast("Mapping[str, JSONValue]", data),
        idempotency_key=key,
    )
