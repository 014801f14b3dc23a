"""``Room``: coordination across the processes sharing one store file.

The public methods check their arguments (each bad value a ``ConfigError`` naming its
field) and run the SQL of ``_members``, ``_messages``, ``_leases`` and ``_who`` through
the room's connection (``_db.Database``: one transaction per call, the clock read inside
it); the store's watcher thread polls ``PRAGMA data_version`` while a receive waits
(``_waiting``).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence
from typing import Final, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread

from .._processes import process_start
from .._validators import count, seconds
from ..store._errors import StoreError
from . import _leases, _members, _messages, _who
from ._checks import (
    absolute,
    check_body,
    check_cwd,
    check_ids,
    check_limit,
    check_mode,
    check_path,
    check_pid,
    check_rooms,
    check_selector,
    check_subject,
    check_tags,
    check_ttl,
)
from ._ids import check_harness_key
from ._lifecycle import RoomBase
from ._members import check_autonomy, check_name
from ._records import (
    Autonomy,
    Claim,
    Drift,
    Joined,
    Lease,
    LeaseCheck,
    LeaseMode,
    Member,
    Message,
    Received,
    Sent,
    SentMessage,
)

__all__ = ["DEFAULT_LEASE_TTL", "Room"]

T = TypeVar("T")

DEFAULT_LEASE_TTL: Final = 300.0
"""Seconds a lease lasts unless claimed or renewed with another ``ttl``."""
_OWN_PID: Final = -1
_PRUNE_BATCH: Final = 1000
"""Members one prune looks at, the longest silent first."""


class Room(RoomBase):
    """Members, messages, file leases and drift checks in the store file at ``path``.

    ``async with Room(path) as room:`` opens (creating or migrating the store) and closes
    it; a room is entered once at a time. Every call but :meth:`history`, :meth:`check`
    and :meth:`who` takes a member id (from :meth:`join`) as its first argument; those
    that write count as that member's activity, the looks (:meth:`unread`,
    :meth:`leases`, :meth:`check`, :meth:`drift_check`) do not and write nothing. A call
    on a closed room, and a receive waiting as it closes, raise
    ``anyio.ClosedResourceError``.

    Every method blocks its task (never the event loop: the work runs in a worker thread)
    for one transaction, waiting up to ``busy_timeout`` for a lock another process holds
    (then ``StoreError(reason="locked")``, nothing changed). Cancelled while that
    transaction runs, it waits for the transaction to end (microseconds) and then raises
    the cancellation: what it wrote stays written. Only :meth:`receive` waits longer, and
    only with a ``timeout``.

    Args:
        path: the store's file (the same file a :class:`~subagents.store.SqliteStore`
            opens; the room's tables are beside the mailbox's).
        clock: seconds, read inside each transaction: lease and TTL times, ``seen_at``.
            Every process sharing the file must use the same clock.
        retry_window: a wake signal still ``offered`` after this many seconds is repeated
            on the next call of any member.
        poll_interval: how often a waiting receive looks at ``PRAGMA data_version``.
        synchronous: ``NORMAL`` (default: a commit survives a process crash) or ``FULL``
            (and a power loss).
        read_only: open the file read-only: nothing is created or migrated (a missing or
            empty file, or an older store, is ``StoreError(not_a_store)``) and every call
            that writes raises ``StoreError(unwritable)``; the looks work, and a timed
            one is woken by other processes' sends as in a writable room.
    """

    # ------------------------------------------------------------------ members

    async def join(
        self,
        room: str = "default",
        *,
        extra_rooms: Sequence[str] = (),
        label: str | None = None,
        tags: Sequence[str] | None = None,
        autonomy: Autonomy | None = None,
        harness_key: str | None = None,
        cwd: str | None = None,
        pid: int | None = _OWN_PID,
    ) -> Joined:
        """Join ``room`` and ``extra_rooms``; the member id every other call takes.

        With a ``harness_key`` (a UUID) that joined before, the same member comes back
        (its rooms kept, these added, its pid and directory updated) and its wake level
        stays unless ``autonomy`` raises it (up to the rooms' cap); a lower one is refused
        with :attr:`Joined.warning` naming the level that stays. ``pid`` defaults to this
        process (``None``: none recorded, so liveness reads ``unknown``); ``cwd`` to this
        process's directory: relative lease paths and ``file:`` selectors are read
        against it.
        """
        rooms = check_rooms(room, extra_rooms)
        key = check_harness_key(harness_key)
        level = None if autonomy is None else check_autonomy("autonomy", autonomy)
        named = None if label is None else check_name("label", label)
        tagged = check_tags(tags)
        where = await anyio.to_thread.run_sync(_members.directory, check_cwd(cwd))
        process = os.getpid() if pid == _OWN_PID else check_pid(pid)
        start = None if process is None else process_start(process)
        return await self._db().write(
            lambda raw, now: _members.join(
                raw,
                rooms=rooms,
                label=named,
                tags=tagged,
                autonomy=level,
                harness_key=key,
                cwd=where,
                pid=process,
                pid_start=start,
                now=now,
            )
        )

    async def leave(self, member: str, room: str | None = None) -> tuple[str, ...]:
        """Leave ``room``, or every room (``None``); the rooms the member is still in. Out
        of its last room, its leases are released. The member id stays valid."""
        where = None if room is None else check_name("room", room)

        def body(raw: sqlite3.Connection, found: str, now: float) -> tuple[str, ...]:
            left = _members.leave(raw, found, where)
            if not left:
                _leases.release_all(raw, found, now)
            return left

        return await self._db().act(member, body)

    async def set_autonomy_cap(self, room: str, autonomy: Autonomy) -> int:
        """The operator's one way to lower wake levels: cap ``room`` at ``autonomy``
        (members above it are lowered now; later raises stop there). How many were lowered."""
        where = check_name("room", room)
        level = check_autonomy("autonomy", autonomy)
        return await self._db().write(lambda raw, now: _members.set_cap(raw, where, level))

    async def who(self, room: str | None = None, *, limit: int = 1000) -> tuple[Member, ...]:
        """The members of ``room`` (``None``: of the store), each with its liveness."""
        where = None if room is None else check_name("room", room)
        cap = check_limit(limit)
        found = await self._db().read(lambda raw, now: _who.rows(raw, where, cap))
        return await anyio.to_thread.run_sync(_who.with_liveness, found)  # scans /proc

    async def prune(self, *, silent_for: float, room: str | None = None) -> tuple[str, ...]:
        """Remove the members (of ``room``, or the store) silent for over ``silent_for``
        seconds *and* gone; the ids removed. A member whose liveness is ``unknown`` (no
        pid) or ``alive`` stays however long it was silent."""
        threshold = seconds("silent_for", silent_for, none_ok=False, zero_ok=True)
        where = None if room is None else check_name("room", room)
        found = await self._db().read(
            lambda raw, now: _who.silent_rows(raw, where, now - threshold, _PRUNE_BATCH)
        )
        members = await anyio.to_thread.run_sync(_who.with_liveness, found)
        gone = [m.member_id for m in members if m.liveness == "gone"]
        if not gone:
            return ()
        return await self._db().write(lambda raw, now: _who.prune(raw, gone, threshold, now))

    # ------------------------------------------------------------------ messages

    async def send(
        self,
        member: str,
        to: str,
        body: str,
        *,
        subject: str | None = None,
        ttl: float | None = None,
        reply_to: int | None = None,
        room: str | None = None,
    ) -> Sent:
        """Send ``body`` to the members selector ``to`` resolves to, among the members of
        the sender's rooms (``room``: of that one only): ``*`` (all but the sender), a
        member id, ``file:<glob>`` (holders of a live lease matching the glob as a full
        path, relative to the holder's directory, or a bare file name) or ``tag:<tag>``.
        Nobody found is a legal send: :attr:`Sent.recipients` is empty and
        :attr:`Sent.warning` says so. ``ttl``: seconds until an untaken delivery expires."""
        selector = check_selector(to)
        text = check_body(body)
        title = check_subject(subject)
        lifetime = check_ttl("ttl", ttl, none_ok=True)
        where = None if room is None else check_name("room", room)
        answering = count("reply_to", reply_to, minimum=1, none_ok=True)
        return await self._db().act(
            member,
            lambda raw, found, now: _messages.send(
                raw,
                sender=found,
                to=selector,
                body=text,
                subject=title,
                ttl=lifetime,
                reply_to=answering,
                room=where,
                now=now,
                store=self.path,
            ),
        )

    async def _take(
        self, member: str, limit: int, *, if_any: bool = False, timeout: float | None = None
    ) -> Received | None:
        """Take as :meth:`receive` does; with ``if_any``, only when the inbox index holds a
        delivery not yet read (else ``None``, with nothing written: a waiting receive that
        wrote on every wake-up would wake itself, and every waiter of the file, again).
        ``timeout``: the most seconds it waits for a lock (then ``None``, nothing taken)."""

        def body(raw: sqlite3.Connection, found: str, now: float) -> Received:
            messages = _messages.receive(raw, found, limit, now)
            if messages:
                return Received(messages=tuple(messages))
            return Received(messages=(), inbox=_messages.inbox(raw, found))

        db = self._db()
        precheck = (lambda raw: _messages.has_live(raw, member)) if if_any else None
        try:
            return await db.maybe_write(db.acting(member, body), precheck, timeout=timeout)
        except StoreError as exc:
            if timeout is None or exc.reason != "locked":
                raise
            return None  # the deadline came while another connection held the lock

    async def receive(
        self, member: str, *, limit: int = 50, timeout: float | None = 0.0
    ) -> Received:
        """Take up to ``limit`` messages for ``member`` (marked ``read``), waiting up to
        ``timeout`` seconds for one (``None``: without end) if there is none: a send from
        any process wakes the wait. Empty, it carries :attr:`Received.inbox` (as the first
        look found it). With a ``timeout`` above 0 it returns by its deadline: every take
        waits for a lock only as long as the time left, and one that could not get it
        takes nothing (the first then answers with the inbox, read without the write lock;
        ``StoreError(locked)`` if this process's other room call still holds its
        connection). ``timeout=0`` waits for a lock as every call does (``busy_timeout``).
        Cancelled while waiting it has taken nothing, cancelled
        during a take (a transaction) the messages are taken all the same and lost to the
        caller. The room closing while it waits raises ``anyio.ClosedResourceError``."""
        cap = check_limit(limit)
        wait = seconds("timeout", timeout, none_ok=True, zero_ok=True)
        deadline = None if wait is None else anyio.current_time() + wait
        got = await self._take(member, cap, timeout=wait or None)
        if got is None:  # the lock stayed held past the deadline: nothing taken
            box = await self._db().look(
                member, lambda raw, found, now: _messages.inbox(raw, found), timeout=0.0
            )
            return Received(messages=(), inbox=box)
        return await self._waiters.until(
            got,
            lambda received: bool(received.messages),
            lambda left: self._take(member, cap, if_any=True, timeout=left),
            deadline,
        )

    async def peek(
        self,
        member: str,
        *,
        after: int | None = None,
        limit: int = 50,
        timeout: float | None = 0.0,
    ) -> tuple[Message, ...]:
        """Up to ``limit`` messages waiting for ``member`` (not read, not past their TTL),
        oldest first, after message ``after`` (one delivered to the member) if given,
        marking nothing: a look, not the member's activity. With a ``timeout`` it waits
        (``None``: without end) for one, woken as :meth:`receive` is; at the deadline,
        empty. What a bridge hands on before the local recipient reads it
        (:meth:`mark_read` once it has)."""
        cap = check_limit(limit)
        start = count("after", after, minimum=1, none_ok=True)
        wait = seconds("timeout", timeout, none_ok=True, zero_ok=True)
        deadline = None if wait is None else anyio.current_time() + wait

        async def look(left: float | None) -> tuple[Message, ...] | None:
            found = await self._db().look(
                member,
                lambda raw, who, now: _messages.peek(raw, who, start, cap, now),
                timeout=left,
            )
            return tuple(found) or None

        got = await look(None)
        if got is not None or wait == 0:
            return got or ()
        return await self._waiters.until((), bool, look, deadline)

    async def mark_read(self, member: str, message_ids: Sequence[int]) -> int:
        """Mark ``member``'s deliveries of ``message_ids`` read (those not read yet, nor
        past their TTL unless ``accepted``: a bridge handed them on before it): their
        bodies were taken some other way than :meth:`receive` (a bridge's local recipient
        read them). How many moved."""
        ids = check_ids(message_ids)
        return await self._db().act(
            member, lambda raw, found, now: _messages.mark(raw, found, ids, "read", now)
        )

    async def accept(self, member: str, message_ids: Sequence[int] | None = None) -> int:
        """The member's harness took its wake signals and a turn runs: its ``offered``
        deliveries become ``accepted`` (a signal is never repeated past that). How many.
        With ``message_ids``, only the deliveries of those messages not taken yet move
        (``stored`` and ``undeliverable`` ones too): a bridge handed them on."""
        if message_ids is not None:
            ids = check_ids(message_ids)
            return await self._db().act(
                member, lambda raw, found, now: _messages.mark(raw, found, ids, "accepted", now)
            )
        return await self._db().act(
            member, lambda raw, found, now: _messages.accept(raw, found, now)
        )

    async def ack(self, member: str, message_id: int) -> bool:
        """Confirm a message delivered to ``member``; ``False`` if already acked or expired
        (a delivery past its TTL whose body was not taken is expired now)."""
        which = count("message_id", message_id, minimum=1)
        return await self._db().act(
            member, lambda raw, found, now: _messages.ack(raw, found, which, now)
        )

    async def unread(self, member: str) -> int:
        """Deliveries waiting for ``member`` (not taken, not expired), counted up to 1,000
        (1,000: that many or more); a look: not the member's activity."""
        return await self._db().look(member, _messages.unread)

    async def sent(self, member: str, *, limit: int = 20) -> tuple[SentMessage, ...]:
        """``member``'s newest messages, newest first, with each recipient's state."""
        cap = check_limit(limit)
        return tuple(
            await self._db().act(
                member, lambda raw, found, now: _messages.sent(raw, found, cap, now)
            )
        )

    async def history(
        self, room: str, *, limit: int = 50, before: int | None = None
    ) -> tuple[Message, ...]:
        """The messages sent while their sender was in ``room`` (to whomever, so a member
        that joined later reads them too), oldest first; marks nothing read."""
        where = check_name("room", room)
        cap = check_limit(limit)
        older = count("before", before, minimum=1, none_ok=True)
        return tuple(
            await self._db().read(lambda raw, now: _messages.history(raw, where, cap, older))
        )

    # ------------------------------------------------------------------ leases

    async def claim(
        self,
        member: str,
        path: str,
        *,
        mode: LeaseMode = "exclusive",
        ttl: float = DEFAULT_LEASE_TTL,
    ) -> Claim:
        """Claim a lease on ``path`` (made absolute against the member's directory),
        atomically across processes: ``exclusive`` blocks every other claim, ``shared``
        blocks exclusive ones. Refused, :attr:`Claim.holder` is the lease in the way."""
        where = check_path(path)
        how = check_mode(mode)
        lifetime = check_ttl("ttl", ttl, none_ok=False)
        assert lifetime is not None
        full = await self._full(member, where)
        return await self._db().act(
            member, lambda raw, found, now: _leases.claim(raw, found, full, how, lifetime, now)
        )

    async def renew(self, member: str, path: str, *, ttl: float = DEFAULT_LEASE_TTL) -> Lease:
        """Extend ``member``'s live lease on ``path`` to ``ttl`` seconds from now.

        Raises:
            LeaseNotHeld: no live lease of the member's there.
        """
        where = check_path(path)
        lifetime = check_ttl("ttl", ttl, none_ok=False)
        assert lifetime is not None
        full = await self._full(member, where)
        return await self._db().act(
            member, lambda raw, found, now: _leases.renew(raw, found, full, lifetime, now)
        )

    async def release(self, member: str, path: str) -> bool:
        """Release ``member``'s lease on ``path``; whether a live one was held."""
        full = await self._full(member, check_path(path))
        return await self._db().act(
            member, lambda raw, found, now: _leases.release(raw, found, full, now)
        )

    async def check(self, path: str, *, member: str | None = None) -> LeaseCheck:
        """The live leases on ``path`` (relative: against ``member``'s directory, or this
        process's); :attr:`LeaseCheck.free` when there are none."""
        where = check_path(path)
        if member is not None:
            return await self._db().look(
                member, lambda raw, found, now: _leases.check_as(raw, found, where, now)
            )
        full = await anyio.to_thread.run_sync(absolute, where, os.getcwd())
        return LeaseCheck(
            path=full,
            leases=tuple(await self._db().read(lambda raw, now: _leases.check(raw, full, now))),
        )

    async def leases(self, member: str) -> tuple[Lease, ...]:
        """``member``'s live leases, by path (a look: not the member's activity)."""
        return tuple(await self._db().look(member, _leases.member_leases))

    # ------------------------------------------------------------------ drift

    async def _full(self, member: str, path: str, *, looked: bool = False) -> str:
        """``path`` made absolute for ``member``, outside the write transaction that uses
        it: resolving symlinks touches the filesystem, and a slow mount must not hold the
        store's write lock. A relative path (or ``looked``: the member checked first, an
        ``UnknownMember`` before any file is read) reads the member's directory by a look;
        an absolute one needs none, and the write that follows checks the member."""
        cwd = "/"
        if looked or not os.path.isabs(path):
            cwd = await self._db().look(member, lambda raw, found, now: _members.cwd_of(raw, found))
        return await anyio.to_thread.run_sync(absolute, path, cwd)

    async def _hash(self, member: str, path: str) -> tuple[str, str | None]:
        """``path`` made absolute for ``member``, and the file's hash (``None``: no file),
        read outside any transaction (a large file must not hold the database)."""
        full = await self._full(member, check_path(path), looked=True)
        return full, await anyio.to_thread.run_sync(_leases.sha256_of, full)

    async def note_read(self, member: str, path: str) -> str:
        """Record the SHA-256 of the file at ``path`` as ``member`` reads it now: the
        baseline of :meth:`drift_check`. The hex digest.

        Raises:
            OSError: the file cannot be read.
        """
        full, digest = await self._hash(member, path)
        if digest is None:
            raise FileNotFoundError(full)
        await self._db().act(
            member, lambda raw, found, now: _leases.note_read(raw, found, full, digest, now)
        )
        return digest

    async def drift_check(self, member: str, path: str) -> Drift:
        """Whether the file at ``path`` changed since ``member``'s :meth:`note_read`:
        ``SAFE`` (unchanged, or no baseline), ``MINOR`` (changed, no other member held a
        lease on it) or ``CRITICAL`` (changed while another member held one: who, since).
        A look: it writes nothing."""
        full, digest = await self._hash(member, path)
        return await self._db().look(
            member, lambda raw, found, now: _leases.drift(raw, found, full, digest, now)
        )
