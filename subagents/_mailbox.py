"""The task-keyed mailbox a parent session collects its children's envelopes from.

``BaseMailbox`` is the interface (a durable backend implements it too); ``Mailbox`` is the
in-memory default. All methods but :meth:`BaseMailbox.wait` are synchronous and never
block: the notifier calls ``put`` from a finishing child and must never wait. Instances
are not thread-safe; use one from the event loop that owns it.
"""

from __future__ import annotations

import itertools
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Final, TypeVar

import anyio
import anyio.lowlevel
import attrs

from ._envelope import DelegateResult
from ._errors import MailboxFull
from ._validators import count, seconds

__all__ = [
    "DEFAULT_MAILBOX_CAPACITY",
    "BaseMailbox",
    "Mailbox",
    "MailboxStatistics",
    "Signal",
    "closed_mailbox",
    "default_mailbox_factory",
    "release",
    "report_consumed",
]

DEFAULT_MAILBOX_CAPACITY: Final = 64
logger = logging.getLogger("subagents.mailbox")

Signal = Callable[[], object]
"""A subscription callback: called with no arguments, must not block; its return is ignored."""


@attrs.frozen(kw_only=True)
class MailboxStatistics:
    """A snapshot of a mailbox's state."""

    entries: int
    """Unread, unexpired envelopes."""
    capacity: int
    """Maximum number of distinct unread task ids."""
    task_subscribers: int
    """Registered one-shot per-task subscriptions (including blocked ``wait`` calls)."""
    all_subscribers: int
    """Registered all-puts subscriptions."""
    closed: bool
    """True after :meth:`BaseMailbox.drop`."""


class BaseMailbox(ABC):
    """The mailbox interface: one per parent session, keyed by task id.

    Consumption rule: an envelope taken by :meth:`drain`, :meth:`drain_all` or
    :meth:`wait` is never returned by this mailbox again. :meth:`peek` and the
    subscriptions never consume.

    ``blocking`` is how :meth:`wait` blocks: a factory of an async context manager entered
    around the blocking part. The manager sets it to ``SubagentManager.lend_slot`` on the
    mailboxes it creates, so a child blocked in ``ctx.mailbox.wait(...)`` lends its
    concurrency slot (nested trees cannot deadlock); ``None`` blocks plainly.

    ``consumed`` is called with each envelope the mailbox hands out consumingly (by
    :meth:`drain`, :meth:`drain_all` and so :meth:`wait`; never by :meth:`peek`, a TTL
    expiry or :meth:`drop`). The manager sets it on the mailboxes it creates, to mark that
    child's handle collected (:attr:`SpawnHandle.collected`, which the retention policy
    ``SubagentConfig.retain_collected`` acts on). A custom implementation must call it
    (when not ``None``) for every envelope its ``drain`` and ``drain_all`` return; the
    default :meth:`wait` consumes through ``drain``. A hook that raises is logged and
    ignored: the envelope is still returned.
    """

    blocking: Callable[[], AbstractAsyncContextManager[None]] | None = None
    consumed: Callable[[DelegateResult], object] | None = None

    @abstractmethod
    def put(self, task_id: str, envelope: DelegateResult) -> bool:
        """Store ``envelope`` under ``task_id`` and signal subscribers.

        Overwriting an existing key replaces it without growing the mailbox. Returns
        ``False`` (and stores nothing) after :meth:`drop`.

        Raises:
            MailboxFull: ``task_id`` is new and the mailbox already holds ``capacity``
                unexpired entries; the existing entries are untouched.
        """

    def put_durable(self, task_id: str, envelope: DelegateResult) -> bool:
        """:meth:`put`, with the entry readable, waitable and consumable only once it is
        durable. A mailbox kept in memory has nothing more durable to wait for: this is
        :meth:`put`. A durable one (``subagents.store.SqliteMailbox``) makes the entry
        visible when the transaction holding it commits, so that nobody reads an envelope
        a crash could still take back.

        Raises:
            MailboxFull: as :meth:`put`.
        """
        return self.put(task_id, envelope)

    @abstractmethod
    def peek(self, task_id: str) -> DelegateResult | None:
        """The envelope under ``task_id`` without consuming it, or ``None``."""

    @abstractmethod
    def drain(self, task_id: str) -> DelegateResult | None:
        """Remove and return the envelope under ``task_id``, or ``None``; calls
        ``consumed`` with it."""

    @abstractmethod
    def drain_all(self) -> list[DelegateResult]:
        """Remove and return every unread envelope, in arrival order; calls ``consumed``
        with each."""

    def discard(self, task_id: str) -> None:
        """Consume the entry under ``task_id``, if there is one, handing it to nobody: for a
        caller that has the envelope already (the manager collecting a child it holds the
        result of). From the call on, this mailbox never returns that entry (a durable
        one's ``take_all`` already in its transaction has it); a put of the id after it is
        a new entry. A durable mailbox may finish the consumption after
        returning (``SqliteMailbox`` marks the row read in its writer's next transaction)
        instead of blocking the event loop on the database. ``consumed`` may be called
        with the entry or not (the caller asked for nothing back). The default is
        :meth:`drain`."""
        self.drain(task_id)

    async def take_all(self) -> list[DelegateResult]:
        """:meth:`drain_all`, for a caller that can wait: a durable mailbox takes through
        its store's writer (in its next transaction) instead of blocking the event loop on
        a transaction of its own. What it returns is what :meth:`drain_all` would at the
        call, plus what other processes committed before the take. A mailbox kept in
        memory has nothing to wait for: this is a checkpoint, then :meth:`drain_all`.

        Cancellation: once the take is under way it finishes, and its envelopes are
        returned (the caller's next checkpoint raises); none is lost.
        """
        await anyio.lowlevel.checkpoint()
        return self.drain_all()

    @abstractmethod
    def __len__(self) -> int:
        """Number of unread, unexpired envelopes."""

    @abstractmethod
    def drop(self) -> None:
        """Release the mailbox: discard entries, wake every waiter. Idempotent.

        Blocked :meth:`wait` calls return ``None``; later ``put`` calls are discarded
        without error (a child finishing after its session closed is not a failure; the
        manager keeps its envelope).
        """

    @property
    @abstractmethod
    def closed(self) -> bool:
        """True after :meth:`drop`."""

    @abstractmethod
    def subscribe_once(self, task_id: str, callback: Signal) -> str | None:
        """Call ``callback()`` once, when ``task_id`` has an entry or the mailbox is dropped.

        If the entry is already present the callback runs at once and ``None`` is returned;
        otherwise a subscription id for :meth:`unsubscribe`. Checking and registering happen
        with no window between them. A callback that raises is logged and ignored.
        """

    @abstractmethod
    def subscribe_all(self, callback: Signal) -> str:
        """Call ``callback()`` after every ``put`` (and once on ``drop``) until unsubscribed.

        It only signals and never consumes. On a mailbox already dropped the callback runs
        once at once (so a reader never sleeps on a released mailbox). Returns the
        subscription id.
        """

    @abstractmethod
    def unsubscribe(self, subscription_id: str | None) -> None:
        """Remove a subscription; unknown ids and ``None`` are ignored."""

    @abstractmethod
    def statistics(self) -> MailboxStatistics:
        """A snapshot of the mailbox's counters."""

    async def wait(self, task_id: str, timeout: float | None = None) -> DelegateResult | None:
        """Block until ``task_id`` has an entry, then consume and return it.

        Returns ``None`` when ``timeout`` seconds pass first or the mailbox is dropped. A
        result put at the very moment the timeout fires is returned, not left behind.
        ``timeout=0`` checks once without blocking.

        Cancellation: if the caller is cancelled, nothing is consumed; the envelope stays
        for the next reader.

        Raises:
            ConfigError: ``timeout`` is not a number of seconds >= 0 or None.
        """
        timeout = seconds("timeout", timeout, none_ok=True, zero_ok=True)
        envelope = self.drain(task_id)
        if envelope is not None or self.closed or timeout == 0:
            return envelope
        blocking = self.blocking
        # The deadline encloses the blocking hook: a slot lent while waiting is taken back
        # within it. The entry is consumed only once the hook has exited, so a caller
        # cancelled while taking its slot back consumes nothing.
        with anyio.move_on_after(timeout) if timeout is not None else nullcontext():
            while True:
                async with blocking() if blocking is not None else _PLAIN:
                    while self.peek(task_id) is None and not self.closed:
                        event = anyio.Event()
                        subscription = self.subscribe_once(task_id, event.set)
                        try:
                            await event.wait()
                        finally:
                            self.unsubscribe(subscription)
                envelope = self.drain(task_id)
                if envelope is not None or self.closed:
                    return envelope
                # Another reader took it while this one took its slot back: wait again.
        # The deadline fired: a put that landed in the same instant still counts.
        return self.drain(task_id)


_PLAIN: AbstractAsyncContextManager[None] = nullcontext()

E = TypeVar("E", bound="Sequence[DelegateResult]")


def report_consumed(mailbox: BaseMailbox, envelopes: E) -> E:
    """Call ``mailbox.consumed`` (if set) with each of ``envelopes``, which it returns; a
    hook that raises is logged and ignored (the envelopes are handed out all the same)."""
    hook = mailbox.consumed
    if hook is not None:
        for envelope in envelopes:
            try:
                hook(envelope)
            except Exception:
                logger.exception("mailbox consumed hook %r raised; ignored", hook)
    return envelopes


class Mailbox(BaseMailbox):
    """The in-memory mailbox.

    Args:
        capacity: maximum distinct unread task ids (default 64).
        ttl: seconds an entry stays readable; ``None`` keeps entries until read. Expired
            entries vanish lazily and do not count toward ``capacity``.
        clock: monotonic time source in seconds, injectable for tests.
    """

    def __init__(
        self,
        *,
        capacity: int = DEFAULT_MAILBOX_CAPACITY,
        ttl: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        capacity = count("capacity", capacity, minimum=1)
        ttl = seconds("ttl", ttl, none_ok=True, zero_ok=False)
        self._capacity = capacity
        self._ttl = ttl
        self._clock = clock
        # dict order is arrival order. Expiry times live apart, and only with a TTL: an
        # (envelope, expiry) pair per entry would be one more GC-tracked object per unread
        # envelope (100,000 of them in a big fan-out).
        self._entries: dict[str, DelegateResult] = {}
        self._expiry: dict[str, float] = {}
        self._task_subs: dict[str, dict[str, Signal]] = {}
        self._sub_task: dict[str, str] = {}
        self._all_subs: dict[str, Signal] = {}
        # What a put fires: the all-puts callbacks as of the last (un)subscribe, so a put
        # does not copy them (a callback may unsubscribe while they run).
        self._all_fire: tuple[Signal, ...] = ()
        self._ids = itertools.count(1)
        self._closed = False

    @property
    def capacity(self) -> int:
        """Maximum distinct unread task ids."""
        return self._capacity

    @property
    def closed(self) -> bool:
        return self._closed

    def put(self, task_id: str, envelope: DelegateResult) -> bool:
        if self._closed:
            return False
        entries = self._entries
        if task_id in entries:
            del entries[task_id]  # an overwrite is the newest arrival
        else:
            if self._ttl is not None:
                self._purge_expired()
            if len(entries) >= self._capacity:
                raise MailboxFull(self._capacity, task_id)
        entries[task_id] = envelope
        if self._ttl is not None:
            self._expiry[task_id] = self._clock() + self._ttl
        waiting = self._task_subs.pop(task_id, None)
        if waiting:
            for sub_id in waiting:
                del self._sub_task[sub_id]
            _fire(waiting.values())
        if self._all_fire:
            _fire(self._all_fire)
        return True

    def peek(self, task_id: str) -> DelegateResult | None:
        return self._live(task_id)

    def drain(self, task_id: str) -> DelegateResult | None:
        envelope = self._live(task_id)
        if envelope is None:
            return None
        del self._entries[task_id]
        if self._ttl is not None:
            self._expiry.pop(task_id, None)
        if self.consumed is not None:
            report_consumed(self, (envelope,))
        return envelope

    def drain_all(self) -> list[DelegateResult]:
        if self._ttl is not None:
            self._purge_expired()
        envelopes = list(self._entries.values())
        self._entries.clear()
        self._expiry.clear()
        return report_consumed(self, envelopes)

    def __len__(self) -> int:
        if self._ttl is not None:
            self._purge_expired()
        return len(self._entries)

    def drop(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._entries.clear()
        self._expiry.clear()
        callbacks: list[Signal] = []
        for subs in self._task_subs.values():
            callbacks.extend(subs.values())
        callbacks.extend(self._all_subs.values())
        self._task_subs.clear()
        self._sub_task.clear()
        self._all_subs.clear()
        self._all_fire = ()
        _fire(callbacks)

    def subscribe_once(self, task_id: str, callback: Signal) -> str | None:
        if self._closed or self._live(task_id) is not None:
            _fire((callback,))
            return None
        sub_id = f"t{next(self._ids)}"
        self._task_subs.setdefault(task_id, {})[sub_id] = callback
        self._sub_task[sub_id] = task_id
        return sub_id

    def subscribe_all(self, callback: Signal) -> str:
        sub_id = f"a{next(self._ids)}"
        if self._closed:
            _fire((callback,))  # the drop signal, as subscribe_once gives it
        else:
            self._all_subs[sub_id] = callback
            self._all_fire = tuple(self._all_subs.values())
        return sub_id

    def unsubscribe(self, subscription_id: str | None) -> None:
        if subscription_id is None:
            return
        if self._all_subs.pop(subscription_id, None) is not None:
            self._all_fire = tuple(self._all_subs.values())
            return
        task_id = self._sub_task.pop(subscription_id, None)
        if task_id is None:
            return
        subs = self._task_subs.get(task_id)
        if subs is not None:
            subs.pop(subscription_id, None)
            if not subs:
                del self._task_subs[task_id]

    def statistics(self) -> MailboxStatistics:
        return MailboxStatistics(
            entries=len(self),
            capacity=self._capacity,
            task_subscribers=len(self._sub_task),
            all_subscribers=len(self._all_subs),
            closed=self._closed,
        )

    def _live(self, task_id: str) -> DelegateResult | None:
        envelope = self._entries.get(task_id)
        if envelope is not None and self._ttl is not None:
            expiry = self._expiry.get(task_id)
            if expiry is not None and expiry <= self._clock():
                del self._entries[task_id]
                del self._expiry[task_id]
                return None
        return envelope

    def _purge_expired(self) -> None:
        now = self._clock()
        expired = [key for key, expiry in self._expiry.items() if expiry <= now]
        for key in expired:
            del self._entries[key]
            del self._expiry[key]

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._entries)}/{self._capacity}"
        return f"<Mailbox {state}>"


def closed_mailbox() -> Mailbox:
    """A new mailbox, dropped already: what the mailbox of a closed session reads as."""
    mailbox = Mailbox(capacity=1)
    mailbox.drop()
    return mailbox


def default_mailbox_factory(capacity: int, ttl: float | None) -> Callable[[str], BaseMailbox]:
    """The in-memory :class:`Mailbox` of the configured capacity and TTL, per session."""

    def factory(session_id: str) -> BaseMailbox:
        return Mailbox(capacity=capacity, ttl=ttl)

    return factory


def release(mailbox: BaseMailbox) -> None:
    """Drop a session's mailbox; a backend that fails to is logged, never propagated (it
    would otherwise kill the worker ending a child, or abort a close half-way)."""
    try:
        mailbox.drop()
    except Exception:
        logger.exception("releasing mailbox %r failed; ignored", mailbox)


def _fire(callbacks: Iterable[Signal]) -> None:
    """Run callbacks in order; one that raises is logged and never breaks the caller."""
    for callback in callbacks:
        try:
            callback()
        except Exception:
            logger.exception("mailbox subscriber %r raised; ignored", callback)
