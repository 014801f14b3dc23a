"""The journal seam: what the engine tells a durable store about its spawns, and what it
asks of one after a restart.

The core defines the seam and a no-op default (:data:`NO_JOURNAL`, the in-memory
behaviour); ``subagents.store`` implements it. The core never imports the store: a store
is handed in (``SubagentManager(store=...)``) or opened by the opener the store package
registers here (``SubagentConfig(store_path=...)``), the way ``mailbox_factory`` is a seam.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar

import anyio
import anyio.lowlevel
import attrs

from ._envelope import DelegateResult
from ._errors import ConfigError
from ._json import JSONValue
from ._mailbox import BaseMailbox

T = TypeVar("T")

__all__ = [
    "NO_JOURNAL",
    "Durability",
    "DurableStore",
    "Journal",
    "KeyedTask",
    "SpawnEntry",
    "StoredTask",
    "open_store",
    "set_store_opener",
]


@attrs.frozen(kw_only=True)
class SpawnEntry:
    """A spawn as the journal records it, the moment ``spawn`` returns."""

    task_id: str
    """The child's id."""
    session_id: str
    """The session it reports to."""
    parent_task: str | None
    """The task id of the child owning that session; ``None`` for a root session."""
    agent: str
    """The agent type's name."""
    agent_path: str
    """Its path (``/root/.../name``); the last segment is the name its session gave out."""
    request: Mapping[str, JSONValue]
    """What it was asked: input, prompt, model, files, timeout (JSON values)."""
    idempotency_key: str | None = None
    """The key it was spawned with (unique in its session), or ``None``."""


@attrs.frozen(kw_only=True)
class StoredTask:
    """What a store knows of an ended task that this process has no record of."""

    task_id: str
    """The task's id."""
    session_id: str
    """The session it reported to."""
    request: Mapping[str, JSONValue]
    """Its :attr:`SpawnEntry.request`."""
    envelope: DelegateResult
    """Its one envelope."""
    unread: bool
    """The envelope is still unread in its session's mailbox."""


@attrs.frozen(kw_only=True)
class KeyedTask:
    """The task holding an idempotency key in a store, journaled by another store (an
    earlier process, or another one still running)."""

    task_id: str
    """The task's id."""
    ended: bool
    """It has its envelope: :meth:`Journal.lookup` restores it."""
    owner_alive: bool
    """The process that journaled it may still run it (see ``owner_alive`` in the store)."""


class Journal(Protocol):
    """Where the engine journals its spawns. Every method but the ``async`` ones never
    blocks (a store queues the write for its writer thread)."""

    def spawned(self, entry: SpawnEntry) -> int:
        """Queue the spawn's row; returns a token for :meth:`wait_journaled` (0: nothing
        to wait for)."""
        ...

    def started(self, task_id: str) -> int:
        """Queue: the child is running (one more try); returns a token for
        :meth:`wait_journaled`."""
        ...

    def ended(
        self,
        task_id: str,
        session_id: str,
        envelope: DelegateResult,
        deliver: bool = False,
        then: Callable[[], object] | None = None,
    ) -> None:
        """Queue: the child ended in ``envelope`` (the mailbox may have written it). With
        ``deliver``, an envelope no mailbox wrote goes to the session's durable mailbox
        (its manager was closing, the session's mailbox never opened). ``then()`` runs on
        the event loop once the write is committed, or once the store failed before it
        was; a write the store refuses at once raises, and ``then`` never runs."""
        ...

    def forgotten(self, task_id: str) -> None:
        """Queue: the ended task ``task_id`` was forgotten: its rows go (its name stays
        taken), and :meth:`lookup` no longer finds it."""
        ...

    def location(self) -> str:
        """The store's file, as messages name it."""
        ...

    def near(self, task_id: str) -> dict[str, str]:
        """Ended tasks :meth:`lookup` would find whose ids come next to ``task_id`` (a
        needle, lower case) in key order and share its first three characters, each with
        its session: what a truncated, extended or mistyped id may have meant. At most a
        few, from two range reads of the tasks' primary key."""
        ...

    def holds(self, task_id: str) -> str | None:
        """The state of the stored task ``task_id`` (``queued``, ``running`` or
        ``ended``); ``None`` if the store has no such task (never journaled in it, or
        forgotten). One primary-key read."""
        ...

    def taken_among(self, task_ids: list[str]) -> set[str]:
        """Those of ``task_ids`` the store holds already (a new id must not clash)."""
        ...

    async def wait_journaled(self, token: int) -> None:
        """Block until the row of :meth:`spawned`'s ``token`` is committed."""
        ...

    async def flush(self) -> None:
        """Block until every :meth:`ended` queued so far is committed (its ``then`` has
        run), or the store has failed; never raises."""
        ...

    def lookup(self, task_id: str) -> StoredTask | None:
        """The ended task ``task_id`` as stored by another process (or an earlier store),
        or ``None``. One indexed read."""
        ...

    def by_key(self, session_id: str, key: str) -> KeyedTask | None:
        """The task another store journaled in ``session_id`` with idempotency key
        ``key`` and that is not forgotten, or ``None``. One indexed read."""
        ...

    def names(self, session_id: str) -> list[str]:
        """Every agent path ``session_id`` gave out before (any process, any run)."""
        ...

    async def recover(self, reruns: Mapping[str, int] | None = None) -> int:
        """Give every journaled spawn that has no envelope and whose process has ended
        exactly one (``Interrupted``), except the root spawns of the agents in
        ``reruns`` (agent name: its cap of tries) with tries left, which it claims for
        running again (:meth:`claimed`); returns how many got an envelope."""
        ...

    def claimed(self) -> list[SpawnEntry]:
        """The spawns the last :meth:`recover` claimed for running again, handed out
        once: this journal's now, for the manager to run under their old task ids."""
        ...


class _NoJournal:
    """The in-memory default: nothing is journaled, nothing is stored."""

    def spawned(self, entry: SpawnEntry) -> int:
        return 0

    def started(self, task_id: str) -> int:
        return 0

    def ended(
        self,
        task_id: str,
        session_id: str,
        envelope: DelegateResult,
        deliver: bool = False,
        then: Callable[[], object] | None = None,
    ) -> None:
        if then is not None:
            then()

    def forgotten(self, task_id: str) -> None:
        pass

    def location(self) -> str:
        return ""

    def near(self, task_id: str) -> dict[str, str]:
        return {}

    def holds(self, task_id: str) -> str | None:
        return None

    def taken_among(self, task_ids: list[str]) -> set[str]:
        return set()

    async def wait_journaled(self, token: int) -> None:
        await anyio.lowlevel.checkpoint()

    async def flush(self) -> None:
        await anyio.lowlevel.checkpoint()

    def lookup(self, task_id: str) -> StoredTask | None:
        return None

    def by_key(self, session_id: str, key: str) -> KeyedTask | None:
        return None

    def names(self, session_id: str) -> list[str]:
        return []

    async def recover(self, reruns: Mapping[str, int] | None = None) -> int:
        return 0

    def claimed(self) -> list[SpawnEntry]:
        return []


NO_JOURNAL: Journal = _NoJournal()
"""The journal of a manager without a store."""


class DurableStore(Protocol):
    """A store the manager can use: its sessions' mailboxes and its journal."""

    @property
    def path(self) -> str:
        """The store's file (what the tools say they looked in)."""
        ...

    def mailbox(self, session_id: str, *, capacity: int, ttl: float | None) -> BaseMailbox:
        """The durable mailbox of ``session_id``."""
        ...

    def journal(self) -> Journal:
        """The journal of spawns kept in this store."""
        ...

    async def __aenter__(self) -> object: ...

    async def aclose(self) -> None: ...


StoreOpener = Callable[[str], DurableStore]

_opener: list[StoreOpener] = []


def set_store_opener(opener: StoreOpener) -> None:
    """Register how ``SubagentConfig(store_path=...)`` makes a store (``subagents.store``
    registers ``SqliteStore`` when imported, which ``import subagents`` does)."""
    _opener[:] = [opener]


def open_store(path: str | os.PathLike[str]) -> DurableStore:
    """A new (not yet opened) store for ``path``, made by the registered opener."""
    if not _opener:  # pragma: no cover - import subagents registers the SQLite store
        raise ConfigError(
            "store_path", "None until a store opener is registered (import subagents.store)", path
        )
    return _opener[0](os.fspath(path))


class Durability:
    """A manager's store, if it has one: the arguments checked, the journal its parts
    write to, the sessions' mailboxes, and the store's opening (with recovery) and
    closing when the manager owns it (``config.store_path``).

    Raises:
        ConfigError: ``store`` with ``mailbox_factory`` (the store makes the mailboxes),
            or with ``store_path``.
    """

    def __init__(
        self,
        store: DurableStore | None,
        store_path: str | os.PathLike[str] | None,
        mailbox_factory: Callable[[str], BaseMailbox] | None,
    ) -> None:
        self.owned = False
        if store_path is not None:
            if store is not None:
                raise ConfigError("store", "None when config.store_path is set", store)
            store = open_store(store_path)
            self.owned = True
        if store is not None and mailbox_factory is not None:
            raise ConfigError(
                "mailbox_factory",
                "None when a store is used (the store makes the mailboxes)",
                mailbox_factory,
            )
        self.store = store
        self.journal: Journal = NO_JOURNAL if store is None else store.journal()
        """Where spawns are journaled (:data:`NO_JOURNAL` without a store)."""
        self.stored: Journal | None = None if store is None else self.journal
        """The journal of a real store, else ``None``: the parts skip a journal of nothing."""

    def mailbox_factory(
        self, capacity: int, ttl: float | None
    ) -> Callable[[str], BaseMailbox] | None:
        """The store's mailbox of each session, or ``None`` without a store."""
        store = self.store
        if store is None:
            return None

        def factory(session_id: str) -> BaseMailbox:
            return store.mailbox(session_id, capacity=capacity, ttl=ttl)

        return factory

    async def open(self, reruns: Mapping[str, int], make: Callable[[SpawnEntry], T]) -> list[T]:
        """Open the store if owned, then recover what earlier processes left unfinished:
        each such spawn gets its one ``Interrupted`` envelope, but the root spawns of the
        agents in ``reruns`` (name: cap of tries) with tries left, which are returned to
        run again, each made by ``make``. A failure closes an owned store again and
        propagates."""
        store = self.store
        if store is None:
            return []
        try:
            if self.owned:
                await store.__aenter__()
            await self.journal.recover(reruns)
            return [make(entry) for entry in self.journal.claimed()]
        except BaseException:
            if self.owned:
                with anyio.CancelScope(shield=True):
                    await store.aclose()
            raise

    async def close(self, bound: float) -> None:
        """Close an owned store (it commits what is queued first, shielded); with a store
        its owner closes, wait up to ``bound`` seconds for the children's ends to commit,
        so that every envelope is handed on when the manager has closed."""
        if self.store is None:
            return
        if self.owned:
            await self.store.aclose()
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(bound):
            await self.journal.flush()
