"""The batch in the durable store: each item's final envelope, keyed by the item's id.

A batch is a session of the store's mailbox, named for the results file (its path from
the store's directory, so moving both together keeps it): ``batch:<out>#<generation>``.
Each item's envelope is an unread entry under the item's id (``put_durable``): looking an
item up is one read of the mailbox's unique index (session, recipient, task id), never a
scan, and a re-run item's new envelope replaces the old one (the store's overwrite
trigger). A fresh run (no ``--resume``) starts the next generation, so what an earlier
run left is never read as this run's.

Beside it, ``batch:<out>`` holds one entry, ``manifest``: the batch's total, its
generation, when it started and how far it got, rewritten as it goes (``batch status``
reads it). It is an envelope of the agent ``batch`` whose ``output`` is that JSON, since
the store holds envelopes and nothing else.
"""

from __future__ import annotations

import os
import time

from ._envelope import DelegateResult
from ._json import dumps_str, loads
from ._processes import process_start
from ._validators import MAX_COUNT
from .store import SqliteMailbox, SqliteStore

__all__ = [
    "MANIFEST",
    "BatchJournal",
    "batch_name",
    "items_session",
    "manifest_session",
]

MANIFEST = "manifest"
"""The manifest's key in its session."""
_PREFIX = "batch:"


def batch_name(out: str, store_path: str) -> str:
    """The batch's name: the results file's path relative to the store's directory."""
    # Real paths: the same file reached through a symbolic link is the same batch.
    base = os.path.dirname(os.path.realpath(store_path))
    return os.path.relpath(os.path.realpath(out), base)


def manifest_session(name: str) -> str:
    return f"{_PREFIX}{name}"


def items_session(name: str, generation: int) -> str:
    return f"{_PREFIX}{name}#{generation}"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class BatchJournal:
    """A batch's entries in an open store (see the module docstring).

    Args:
        store: the open store.
        name: :func:`batch_name`.
        fresh: start the next generation (a new run) rather than go on with the last.
    """

    def __init__(self, store: SqliteStore, name: str, *, fresh: bool) -> None:
        self.name = name
        self._meta = store.mailbox(manifest_session(name), capacity=MAX_COUNT)
        previous = self.manifest()
        self.found: bool = previous is not None
        """An earlier run of this batch left its manifest."""
        last = previous.get("generation") if previous else None
        generation = last if isinstance(last, int) and last >= 1 else 0
        self.generation: int = generation + 1 if fresh or generation == 0 else generation
        self._items: SqliteMailbox = store.mailbox(
            items_session(name, self.generation), capacity=MAX_COUNT
        )
        self.started_ms = now_ms()

    def manifest(self) -> dict[str, object] | None:
        """The last manifest written, or ``None``."""
        envelope = self._meta.peek(MANIFEST)
        return None if envelope is None else parse_manifest(envelope)

    def envelope(self, item_id: str) -> DelegateResult | None:
        """The item's committed envelope (one indexed read), or ``None``."""
        return self._items.peek(item_id)

    def record(self, item_id: str, envelope: DelegateResult) -> None:
        """Put the item's envelope (durable once :meth:`wait_committed` returns)."""
        self._items.put_durable(item_id, envelope)

    def write_manifest(self, **fields: object) -> None:
        """Rewrite the manifest (the generation, pid and time are added)."""
        body: dict[str, object] = {
            "generation": self.generation,
            "pid": os.getpid(),
            "pid_start": process_start(os.getpid()),
            "updated_ms": now_ms(),
        }
        body.update(fields)
        self._meta.put(
            MANIFEST,
            DelegateResult(
                agent="batch", task_id=MANIFEST, status="completed", output=dumps_str(body)
            ),
        )

    async def wait_committed(self) -> None:
        """Block until every envelope recorded so far (and the manifest) is committed.

        Raises:
            StoreError: the store failed first.
        """
        await self._items.wait_committed()
        await self._meta.wait_committed()


def parse_manifest(envelope: DelegateResult) -> dict[str, object] | None:
    try:
        value = loads(envelope.output)
    except ValueError:
        return None
    return dict(value) if isinstance(value, dict) else None
