"""The mailbox conformance suite: every promise of :class:`BaseMailbox`, as named checks.

The checks use only the interface: the abstract methods, ``wait``, ``statistics()`` and the
documented ``blocking`` and ``consumed`` attributes. Envelopes are compared by equality,
never identity, so an implementation that stores them elsewhere and reads them back passes.
"""

from __future__ import annotations

from collections.abc import Iterable

from ._conformance import Check, run_checks, select
from ._conformance_mailbox_store import MailboxFactory, StoreChecks
from ._conformance_mailbox_wait import WaitChecks

__all__ = ["MailboxFactory", "check_mailbox", "mailbox_checks"]

_CHECKS: tuple[tuple[str, str, bool], ...] = (
    # (name, promise, needs TTL support)
    ("put_peek_drain", "put stores, peek reads, drain removes; unknown ids give None", False),
    ("overwrite_without_growth", "a put of a stored id replaces it without growing", False),
    ("overwrite_is_newest_arrival", "an overwritten entry drains as the newest arrival", False),
    ("capacity", "a new id in a full mailbox raises MailboxFull and changes nothing", False),
    ("drain_all_arrival_order", "drain_all returns every unread envelope in arrival order", False),
    ("take_all_as_drain_all", "take_all takes what drain_all would, in arrival order", False),
    ("take_all_cancelled_loses_nothing", "a cancelled take_all returns or leaves each", False),
    ("discard_consumes", "discard consumes an entry for nobody; a later put is new", False),
    ("consumed_never_again", "a consumed envelope is never returned again", False),
    ("peek_never_consumes", "peek and subscriptions never consume", False),
    ("consumed_hook", "consumed fires once per consumed envelope, never otherwise", False),
    ("subscribe_once_when_present", "subscribe_once on a present entry fires at once", False),
    ("subscribe_once_one_shot", "subscribe_once fires once, on its own id's put", False),
    ("subscribe_all_only_signals", "subscribe_all signals after every put, consumes none", False),
    ("unsubscribe", "unsubscribed callbacks never run; unknown ids are ignored", False),
    ("callback_errors_isolated", "a raising callback breaks neither put nor the others", False),
    ("reentrant_callbacks", "callbacks may put, drain and unsubscribe during a put", False),
    ("wait_present", "wait returns and consumes a present entry", False),
    ("wait_blocks_until_put", "wait blocks until its id is put, then consumes it", False),
    ("wait_timeout", "wait returns None on time and rejects bad timeouts", False),
    ("wait_cancelled_consumes_nothing", "a cancelled wait consumes nothing", False),
    ("blocking_hook", "wait blocks inside blocking() and leaves it before returning", False),
    ("two_waiters_one_entry", "one put wakes exactly one of two waiters with it", False),
    ("race_free_subscribe", "a put at any moment around a wait is never missed", False),
    ("drop", "drop wakes waiters with None, discards later puts, is idempotent", False),
    ("wait_after_drop_never_blocks", "wait on a dropped mailbox returns None at once", False),
    ("statistics", "statistics() counts entries, subscriptions and closed", False),
    ("ttl_expiry", "entries vanish past their TTL, unconsumed; overwrites restart it", True),
    ("ttl_frees_capacity", "expired entries do not count toward capacity", True),
    ("ttl_none_keeps", "ttl=None keeps entries however the clock moves", True),
)


def mailbox_checks(
    factory: MailboxFactory,
    *,
    ttl: bool = True,
    patience: float = 5.0,
    deadline: float = 30.0,
) -> list[Check]:
    """The mailbox conformance checks, one per promise of :class:`BaseMailbox`.

    Args:
        factory: makes a new, empty mailbox for each call. It is called with keyword
            arguments only: always ``capacity=`` (an int >= 1); the TTL checks also pass
            ``ttl=`` (float seconds, or ``None`` for no expiry) and ``clock=`` (a
            zero-argument callable returning seconds, which expiry must read instead of
            the real clock). ``Mailbox`` itself is such a factory; for a durable mailbox
            pass e.g. ``lambda **kw: SqliteMailbox(new_temp_path(), **kw)``.
        ttl: False for an implementation without expiry: the TTL checks are left out and
            the factory never receives ``ttl`` or ``clock``.
        patience: seconds a check allows, beyond letting every task of the loop run, for
            something that should follow at once (a waiter woken by a put or a drop)
            before calling it lost.
        deadline: seconds one check may take before it counts as hung.

    Returns:
        :class:`Check` objects in a stable order; run each with ``await check()``, or
        parametrize a pytest test over them (``ids=lambda check: check.name``).
    """
    store, wait = StoreChecks(factory, patience), WaitChecks(factory, patience)
    return [
        Check(
            name=name,
            promise=promise,
            body=getattr(store if hasattr(store, name) else wait, name),
            deadline=deadline,
        )
        for name, promise, needs_ttl in _CHECKS
        if ttl or not needs_ttl
    ]


async def check_mailbox(
    factory: MailboxFactory,
    *,
    ttl: bool = True,
    skip: Iterable[str] = (),
    patience: float = 5.0,
    deadline: float = 30.0,
) -> None:
    """Run every mailbox check against ``factory``'s mailboxes; see :func:`mailbox_checks`.

    Runs in the caller's anyio event loop (asyncio or trio) and blocks until every check
    has run; each check is bounded by ``deadline``. ``skip`` names checks to leave out.

    Raises:
        ConformanceError: one or more checks failed; its ``failures`` maps each failed
            check's name to its :class:`AssertionError`.
        ValueError: ``skip`` names a check that does not exist.
    """
    checks = mailbox_checks(factory, ttl=ttl, patience=patience, deadline=deadline)
    await run_checks("mailbox", select(checks, skip))
