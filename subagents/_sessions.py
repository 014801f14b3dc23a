"""Sessions: the index of child records, each session's mailbox, names and closing, and
the retention of collected records.

A session is where children report: a root session (``"root"`` or any name a caller
picks) or a running child's own session (its task id). Every operation here is O(1) or
bounded (unknown-id help reads at most a bucket of ids and ten live ones), whatever the
number of records.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Container
from contextlib import AbstractAsyncContextManager
from typing import Final

from ._envelope import DelegateResult
from ._errors import SpawnRejected, UnknownTask
from ._journal import Journal
from ._lookup import UNSET_RETAIN, IdIndex, live_ids_sentence, unknown_task
from ._mailbox import BaseMailbox, closed_mailbox, release
from ._paths import NameAllocator
from ._record import JOURNALED_BEFORE, SETTLED, ChildRecord
from ._task_ids import TaskIds

__all__ = ["CLOSED_MEMORY", "DEFAULT_SESSION", "Sessions"]

logger = logging.getLogger("subagents")

DEFAULT_SESSION: Final = "root"
"""The host session a caller that names none spawns into."""
CLOSED_MEMORY: Final = 1024
"""Closed root sessions with no record left that are still remembered as closed."""

MailboxFactory = Callable[[str], BaseMailbox]


class Sessions:
    """Records by task id and by session; mailboxes, names and the closed set.

    Args:
        new_mailbox: builds the mailbox of a session on first use.
        lend_slot: what a child waiting on a mailbox enters (its slot is lent meanwhile).
        retain: collected records kept (the newest); ``None`` keeps every record.
        journal: where names given out before (in earlier processes) are read from;
            ``None`` without a store.
    """

    def __init__(
        self,
        new_mailbox: MailboxFactory,
        lend_slot: Callable[[], AbstractAsyncContextManager[None]],
        retain: int | None,
        journal: Journal | None = None,
    ) -> None:
        self._new_mailbox = new_mailbox
        self._journal = journal
        self.on_end: Callable[[ChildRecord], None] | None = None
        """A hook: ``record`` has its envelope (its inbox closes)."""
        self.on_close: Callable[[str | None], None] | None = None
        """A hook: a session starts closing (``None``: every session, the owner closes)."""
        self.on_forget: Callable[[str], None] | None = None
        """A hook: the record of this task id was forgotten."""
        self.restore: Callable[[str], ChildRecord | None] | None = None
        """A hook: the record of an id this process has no record of, made from a store
        (an ended child of an earlier process), or ``None``."""
        self._lend_slot = lend_slot
        self._retain = retain
        self.accepting = False
        """The owner runs: it takes spawns, and deliveries may open a session's mailbox."""
        self.shut = False
        """The owner has closed: every mailbox reads as dropped."""
        self._tasks: dict[str, ChildRecord] = {}
        self._ids_drawn = TaskIds(self._tasks, journal)
        # Records by (session, idempotency key): a key is held while its record is kept.
        self._keys: dict[tuple[str, str], ChildRecord] = {}
        self._ids = IdIndex()  # what an unknown id was probably meant to be
        self._live: dict[str, dict[ChildRecord, None]] = {}
        self._trees: dict[str, int] = {}  # unfinished records by the root session of their tree
        # Every recorded child by session, oldest first (a dict: forgetting one is O(1)).
        self._by_session: dict[str, dict[ChildRecord, None]] = {}
        self._mailboxes: dict[str, BaseMailbox] = {}
        self._names: dict[str, NameAllocator] = {}
        self._closed: set[str] = set()
        # Closed root sessions with no record left, oldest first: remembered (so spawns into
        # them stay refused) up to CLOSED_MEMORY of them, so closing sessions stays bounded.
        self._closed_idle: dict[str, None] = {}
        self._retained: dict[ChildRecord, None] = {}  # collected, oldest first
        self._forgot = False  # any record forgotten yet (unknown-id messages say so)
        # Sessions of forgotten children that still list children of their own: closed
        # until their listing empties (a late grandchild must not reopen them).
        self._orphaned: set[str] = set()
        self._watchers: dict[str, dict[int, Callable[[], object]]] = {}
        self._tokens = itertools.count()

    # ------------------------------------------------------------------ records

    def add(self, record: ChildRecord) -> None:
        self._tasks[record.task_id] = record
        self._ids.add(record.task_id)
        session = record.session_id
        live = self._live.get(session)
        if live is None:
            live = self._live[session] = {}
        live[record] = None
        root = record.root_session
        self._trees[root] = self._trees.get(root, 0) + 1
        listing = self._by_session.get(session)
        if listing is None:
            listing = self._by_session[session] = {}
        listing[record] = None
        if record.idempotency_key is not None:
            self._keys[session, record.idempotency_key] = record

    def get(self, task_id: str) -> ChildRecord | None:
        return self._tasks.get(task_id)

    def keyed(self, session_id: str, key: str) -> ChildRecord | None:
        """The kept record of ``session_id`` that holds idempotency key ``key``."""
        return self._keys.get((session_id, key))

    def hold_key(self, record: ChildRecord, key: str) -> None:
        """Index a restored ``record`` (whose row holds ``key``) under its key."""
        record.idempotency_key = key
        self._keys[record.session_id, key] = record

    def new_task_id(self, journaled: bool = True) -> str:
        """A task id no record has (nor, for a ``journaled`` child, the store's rows)."""
        return self._ids_drawn.draw(journaled)

    def require(self, task_id: str, session_id: str | None = None) -> ChildRecord:
        """The record of ``task_id``; raises :class:`UnknownTask` naming the ids probably
        meant (or, with ``session_id``, saying whose it is)."""
        record = self.find(task_id) if isinstance(task_id, str) else None
        live = self._live.get(session_id or "", {})
        if record is None:
            forgetting = self._retain is not None or self._forgot
            raise unknown_task(
                str(task_id),
                session_id,
                self._ids,
                self._tasks,
                live,
                self._journal,
                self._retain if forgetting else UNSET_RETAIN,
            )
        if session_id is not None and record.session_id != session_id:
            raise UnknownTask(
                task_id,
                (),
                f"It belongs to another session ({record.session_id!r}), not {session_id!r}; "
                "only the session that spawned a task can collect it. "
                + live_ids_sentence(session_id, live),
            )
        return record

    def find(self, task_id: str) -> ChildRecord | None:
        """The record of ``task_id``: this process's, else that of an ended child of an
        earlier process, restored and indexed (not listed: a restart lists only what was
        looked up); ``None`` if neither."""
        record = self._tasks.get(task_id)
        if record is not None or self.restore is None:
            return record
        try:
            record = self.restore(task_id)
        except Exception as exc:  # a closed or failed store: the id is unknown here
            logger.warning("reading task %r from the store failed: %r", task_id, exc)
            return None
        if record is not None:
            self._tasks[task_id] = record
            self._ids.add(task_id)
        return record

    def listing(self, session_id: str) -> list[ChildRecord]:
        """Every record of ``session_id`` not forgotten, oldest first."""
        return list(self._by_session.get(session_id, ()))

    def live(self, session_id: str) -> dict[ChildRecord, None] | None:
        """The unfinished children of ``session_id`` (the dict itself; do not keep it)."""
        return self._live.get(session_id)

    def all_live(self) -> list[ChildRecord]:
        return [r for live in self._live.values() for r in live]

    def ended(self, record: ChildRecord) -> None:
        """``record`` has its envelope: it is no longer among its session's unfinished."""
        if self.on_end is not None:
            self.on_end(record)
        live = self._live.get(record.session_id)
        if live is not None:
            live.pop(record, None)
        root = record.root_session
        left = self._trees.pop(root, 1) - 1
        if left:
            self._trees[root] = left

    def tree_size(self, root_session: str) -> int:
        """The unfinished records of the tree hanging from ``root_session``."""
        return self._trees.get(root_session, 0)

    def delivered(self, record: ChildRecord) -> None:
        """``record``'s envelope has been delivered."""
        if record.session_id in self._orphaned:
            # Its parent's record is gone (it outlived settle_timeout): nobody can collect
            # it through the parent, so it goes as its ended siblings went.
            self._drop(record)

    # ------------------------------------------------------------------ closing

    def is_closed(self, session_id: str) -> bool:
        if session_id in self._closed:
            return True
        owner = self._tasks.get(session_id)
        return owner is not None and owner.state == SETTLED

    def check_open(self, session_id: str) -> ChildRecord | None:
        """Raise :class:`SpawnRejected` if ``session_id`` takes no more children; return
        the record of the child that owns it, if any (marked as owning a session)."""
        if session_id in self._closed:  # a root session or a running agent's
            raise SpawnRejected(
                "session_closed",
                f"session {session_id!r} is closed (close_session, or its agent ended)",
            )
        parent = self._tasks.get(session_id)
        if parent is not None:
            parent.check_can_delegate()
            parent.owns_session = True  # its names and live children, released as it ends
        return parent

    def start_closing(self, session_id: str) -> list[ChildRecord]:
        """Close ``session_id`` to new children, wake its close watchers, and return its
        unfinished children (for the caller to cancel and await)."""
        self._closed.add(session_id)
        self.fire_watchers(session_id)
        return list(self._live.pop(session_id, {}))

    def finish_closing(self, session_id: str) -> None:
        """Release a closed session's mailbox and names; remember it among the recently
        emptied closed sessions if no record of it is left."""
        self.release(session_id)
        if not self._by_session.get(session_id):
            self._by_session.pop(session_id, None)
            self._emptied(session_id)

    def end_session_of(self, record: ChildRecord) -> dict[ChildRecord, None] | None:
        """A child's runner is over: release its session (mailbox, names) unless it has
        unfinished children, which it returns so the caller cancels and awaits them."""
        if not record.owns_session:  # most children: no mailbox, names or children
            return None
        live = self._live.pop(record.task_id, None)
        if live:
            return live
        self.release(record.task_id)
        return None

    def release(self, session_id: str) -> None:
        mailbox = self._mailboxes.pop(session_id, None)
        if mailbox is not None:
            release(mailbox)
        self._names.pop(session_id, None)

    def held(self, session_id: str) -> list[str]:
        """Which per-session stores still hold ``session_id`` (``mailbox``, ``names``,
        ``live``): what a session whose agent has ended must not leave behind."""
        stores: dict[str, Container[str]] = {
            "mailbox": self._mailboxes,
            "names": self._names,
            "live": self._live,
        }
        return [name for name, store in stores.items() if session_id in store]

    def has_listing(self, session_id: str) -> bool:
        """Whether a (possibly empty) listing of ``session_id``'s children is kept."""
        return session_id in self._by_session

    @property
    def watching(self) -> int:
        """Sessions with close watchers registered."""
        return len(self._watchers)

    def release_all(self) -> None:
        for mailbox in self._mailboxes.values():
            release(mailbox)
        self._mailboxes.clear()

    def watch_close(self, session_id: str, callback: Callable[[], object]) -> int:
        """Run ``callback()`` once when ``session_id`` starts closing (before its children
        have settled). Returns a token for :meth:`unwatch_close`."""
        token = next(self._tokens)
        self._watchers.setdefault(session_id, {})[token] = callback
        return token

    def unwatch_close(self, session_id: str, token: int) -> None:
        watchers = self._watchers.get(session_id)
        if watchers is not None:
            watchers.pop(token, None)
            if not watchers:
                del self._watchers[session_id]

    def fire_watchers(self, session_id: str | None = None) -> None:
        """Run the close watchers of ``session_id`` (of every session when ``None``)."""
        if self.on_close is not None:
            self.on_close(session_id)
        sessions = list(self._watchers) if session_id is None else [session_id]
        for session in sessions:
            for callback in self._watchers.pop(session, {}).values():
                try:
                    callback()
                except Exception:
                    logger.exception("a close watcher of session %r raised; ignored", session)

    # ------------------------------------------------------------------ names, mailboxes

    def allocate_name(self, session_id: str, wanted: str) -> str:
        allocator = self._names.get(session_id)
        if allocator is None:
            allocator = self._names[session_id] = NameAllocator()
            if self._journal is not None:
                self._seed_names(allocator, session_id)
        return allocator.allocate(wanted)

    def _seed_names(self, allocator: NameAllocator, session_id: str) -> None:
        """Reserve the names earlier processes gave out in ``session_id`` (none for the
        session of a child this process made, unless it is a re-run: its first try's
        children had names)."""
        assert self._journal is not None
        owner = self._tasks.get(session_id)
        if owner is None or owner.restored or owner.journaled == JOURNALED_BEFORE:
            for path in self._journal.names(session_id):
                allocator.allocate(path.rpartition("/")[2])

    def mailbox(self, session_id: str) -> BaseMailbox:
        """The mailbox of ``session_id``, created on first use; a dropped one once closed."""
        mailbox = self._mailboxes.get(session_id)
        if mailbox is None:
            if self.is_closed(session_id) or self.shut:
                return closed_mailbox()
            mailbox = self._new_mailbox(session_id)
            if mailbox.blocking is None:
                mailbox.blocking = self._lend_slot  # a child waiting here lends its slot
            if mailbox.consumed is None:
                mailbox.consumed = self._consumed  # a drained envelope is collected
            self._mailboxes[session_id] = mailbox
            owner = self._tasks.get(session_id)
            if owner is not None:
                owner.owns_session = True  # released as it ends
        return mailbox

    def existing_mailbox(self, session_id: str) -> BaseMailbox | None:
        return self._mailboxes.get(session_id)

    def delivery_mailbox(self, session_id: str) -> BaseMailbox | None:
        """Where a result for ``session_id`` goes: its mailbox, opened if the session is
        open and the owner runs, else ``None`` (the record and the event keep it)."""
        mailbox = self._mailboxes.get(session_id)
        if mailbox is not None:
            return mailbox
        if not self.accepting or self.is_closed(session_id):
            return None
        return self.mailbox(session_id)

    def unclaimed(self, session_id: str) -> bool:
        """Whether a result for ``session_id`` finds no mailbox only because the owner is
        closing: the session is open but its mailbox was never opened (a store delivers
        it durably, for a later process to read)."""
        return not (
            self.accepting
            or self.shut
            or session_id in self._mailboxes
            or self.is_closed(session_id)
        )

    def full_capacity(self, session_id: str, default: int) -> int:
        """The capacity of the session mailbox that was just found full."""
        mailbox = self._mailboxes.get(session_id)
        return default if mailbox is None else mailbox.statistics().capacity

    def _consumed(self, envelope: DelegateResult) -> None:
        """A session mailbox handed ``envelope`` out: its child counts as collected."""
        record = self._tasks.get(envelope.task_id)
        if (
            record is not None
            and not record.collected
            and (record.envelope is not None or record.committing)
        ):
            # A committing record's entry is readable once its put commits, which may be
            # a batch before the end write that hands the record on.
            self._collected(record)

    # ------------------------------------------------------------------ retention

    def collect(self, record: ChildRecord) -> None:
        """Consume an ended child's envelope: out of its mailbox, marked collected, and
        its record kept among the ``retain`` newest collected ones."""
        if record.collected:  # its entry was consumed then, by this or by the mailbox
            return
        # An execute()'s envelope never goes to a mailbox (it is returned to its caller).
        mailbox = None if record.sync else self._mailboxes.get(record.session_id)
        if mailbox is None and record.restored:
            mailbox = self.mailbox(record.session_id)  # its entry is unread in the store
        if mailbox is not None:  # the envelope is in hand: nothing to read back
            mailbox.discard(record.task_id)
        if not record.collected:  # the mailbox's consumed hook may have marked it
            self._collected(record)

    def _collected(self, record: ChildRecord) -> None:
        record.collected = True
        retain = self._retain
        if retain is None:
            return
        if retain == 0:
            self._drop(record)
            return
        if self._tasks.get(record.task_id) is not record:
            return  # forgotten already (with its parent): it takes no place among the kept
        retained = self._retained
        retained[record] = None
        if len(retained) > retain:
            self._drop(next(iter(retained)))

    def forget(self, record: ChildRecord) -> None:
        """Drop an ended child's record, consuming its envelope from the mailbox first (a
        restored one's from the store's mailbox, as :meth:`collect` does); a journaled or
        restored one is forgotten by the store too, so no restart brings it back."""
        mailbox = self._mailboxes.get(record.session_id)
        if mailbox is None and record.restored and not record.collected:
            mailbox = self.mailbox(record.session_id)  # its entry is unread in the store
        if mailbox is not None:
            collected = record.collected
            record.collected = True  # so the mailbox hook does not count a collection
            try:
                mailbox.discard(record.task_id)
            except BaseException:
                record.collected = collected  # a backend that failed: nothing forgotten
                raise
        record.collected = True
        self._drop(record)

    def _drop(self, record: ChildRecord) -> None:
        """Forget ``record``: out of the task index and its session's listing, and out of
        the store (its rows deleted, a journaled or restored one's). O(1)."""
        task_id = record.task_id
        if self._tasks.get(task_id) is not record:
            return  # forgotten already
        del self._tasks[task_id]
        if self.on_forget is not None:
            self.on_forget(task_id)
        if self._journal is not None and (record.journaled or record.restored):
            try:
                self._journal.forgotten(task_id)
            except Exception:  # a failed or closed store: forgotten here all the same
                logger.exception("forgetting task %s in the store failed", task_id)
        record.view = None  # the handle keeps its record; the record lets go of the handle
        self._ids.discard(task_id)
        self._retained.pop(record, None)
        key = record.idempotency_key
        if key is not None and self._keys.get((record.session_id, key)) is record:
            del self._keys[record.session_id, key]  # the key is free again
        self._forgot = True
        session = record.session_id
        listing = self._by_session.get(session)
        if listing is not None:
            listing.pop(record, None)
            if not listing and self.is_closed(session):
                del self._by_session[session]
                self._emptied(session)
        children = self._by_session.get(task_id)
        if children is not None:
            self._drop_children(task_id, children)

    def _drop_children(self, session: str, children: dict[ChildRecord, None]) -> None:
        # The ended children go with their parent, collected or not: their session is over
        # and nobody holds their ids but through its record. Unfinished ones (past
        # settle_timeout) stay until they end, and keep its session closed meanwhile.
        for child in [c for c in children if c.envelope is not None]:
            self._drop(child)
        if children:
            self._orphaned.add(session)
            self._closed.add(session)
        elif session in self._by_session:
            del self._by_session[session]

    def _emptied(self, session: str) -> None:
        """The last record of the closed ``session`` is gone. A forgotten child's session
        (a task id, never reused) is forgotten at once; a closed root session is kept among
        the most recent :data:`CLOSED_MEMORY`, the oldest beyond them forgotten."""
        if session in self._orphaned:
            self._orphaned.discard(session)
            self._closed.discard(session)
            return
        if session not in self._closed:
            return  # the session of a child that ended: closed by its owner's record
        idle = self._closed_idle
        idle[session] = None
        if len(idle) > CLOSED_MEMORY:
            oldest = next(iter(idle))
            del idle[oldest]
            self._closed.discard(oldest)
