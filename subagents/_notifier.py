"""Delivery of a finished child's envelope to its parent: mailbox first, event always."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ._envelope import DelegateResult
from ._errors import MailboxFull
from ._events import COMPLETED, MAILBOX_FULL
from ._mailbox import BaseMailbox

__all__ = ["CompletionNotifier", "Publish"]

logger = logging.getLogger("subagents.notifier")

Publish = Callable[[str, str, DelegateResult], object]
"""``publish(event_type, session_id, envelope)``: sends a side-channel event; must not block."""


class CompletionNotifier:
    """Hands a finished child's envelope to its parent session. Never blocks, never raises.

    ``notify`` does two things: it puts the envelope into the parent session's mailbox
    (what ``wait_agent`` reads) and publishes ``subagent.completed`` with the full envelope
    (what dashboards read). If the mailbox is full, delivery degrades to the event alone
    and ``subagent.mailbox_full`` is published first; the manager still keeps the envelope,
    so ``wait_agent`` and ``SubagentManager.result`` can always obtain it. That is ordinary
    in a large fan-out collected by id, so it is counted (:attr:`overflows`) and logged at
    DEBUG, not warned about. A mailbox that fails otherwise is logged as an error.

    Args:
        get_mailbox: the mailbox of a session id, or ``None`` if it has none.
        publish: the event publisher; ``None`` publishes nothing.
        enabled: when ``False`` the notifier does neither.
    """

    def __init__(
        self,
        get_mailbox: Callable[[str], BaseMailbox | None],
        publish: Publish | None = None,
        *,
        enabled: bool = True,
    ) -> None:
        self._get_mailbox = get_mailbox
        self._publish = publish
        self.enabled = enabled
        self.overflows = 0
        """Envelopes that found their mailbox full and went by the event alone."""

    def notify(self, parent_session_id: str, task_id: str, envelope: DelegateResult) -> bool:
        """Deliver ``envelope``; returns True when it landed in the parent's mailbox."""
        if not self.enabled:
            return False
        delivered = self.put(parent_session_id, task_id, envelope)
        self.announce(parent_session_id, task_id, envelope, overflowed=delivered is None)
        return bool(delivered)

    def put(
        self,
        parent_session_id: str,
        task_id: str,
        envelope: DelegateResult,
        *,
        durable: bool = False,
    ) -> bool | None:
        """The mailbox half of :meth:`notify` (with ``durable``, through
        :meth:`BaseMailbox.put_durable`: readable once committed). Returns True when it
        landed in the mailbox, ``None`` when the mailbox was full (``announce`` then says
        so), False otherwise."""
        if not self.enabled:
            return False
        try:
            mailbox = self._get_mailbox(parent_session_id)
            if mailbox is None:
                return False
            if durable:
                return mailbox.put_durable(task_id, envelope)
            return mailbox.put(task_id, envelope)
        except MailboxFull as exc:
            self.overflows += 1
            logger.debug(
                "session %r: %s; delivered by the completion event", parent_session_id, exc
            )
            return None
        except Exception:
            logger.exception("mailbox put for task %s failed; degraded to the event", task_id)
            return False

    def announce(
        self, parent_session_id: str, task_id: str, envelope: DelegateResult, *, overflowed: bool
    ) -> None:
        """The event half of :meth:`notify`: ``subagent.mailbox_full`` first if the put
        ``overflowed``, then ``subagent.completed``."""
        if not self.enabled or self._publish is None:
            return
        try:
            if overflowed:
                self._publish(MAILBOX_FULL, parent_session_id, envelope)
            self._publish(COMPLETED, parent_session_id, envelope)
        except Exception:
            logger.exception("publishing completion of task %s failed", task_id)
