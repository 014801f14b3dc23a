"""Delivery of a finished child's envelope to its parent: mailbox first, event always."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable

from ._envelope import DelegateResult
from ._errors import MailboxFull
from ._mailbox import BaseMailbox

__all__ = ["CompletionNotifier", "Publish"]

logger = logging.getLogger("subagents.notifier")

Publish = Callable[[str, str, DelegateResult], object]
"""``publish(event_type, session_id, envelope)``: sends a side-channel event; must not block."""


class CompletionNotifier:
    """Hands a finished child's envelope to its parent session. Never blocks, never raises.

    ``notify`` does two things: it puts the envelope into the parent session's mailbox
    (what ``wait_agent`` reads) and publishes ``subagent.completed`` with the full envelope
    (what dashboards read). If the mailbox is full or gone, delivery degrades to the event
    alone; the manager still keeps the envelope, so ``wait_agent`` and
    ``SubagentManager.result`` can always obtain it.

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
        # One warning per full mailbox, not one per envelope: a fan-out of 10,000 children
        # nobody reads would otherwise flood the log (and cost time).
        self._warned: weakref.WeakSet[BaseMailbox] = weakref.WeakSet()

    def notify(self, parent_session_id: str, task_id: str, envelope: DelegateResult) -> bool:
        """Deliver ``envelope``; returns True when it landed in the parent's mailbox."""
        if not self.enabled:
            return False
        delivered = False
        mailbox = None
        try:
            mailbox = self._get_mailbox(parent_session_id)
            if mailbox is not None:
                delivered = mailbox.put(task_id, envelope)
        except MailboxFull as exc:
            if mailbox is not None and mailbox not in self._warned:
                self._warned.add(mailbox)
                logger.warning(
                    "session %r: %s; degrading to the completion event (the manager keeps "
                    "every envelope; further overflows of this mailbox are logged at DEBUG)",
                    parent_session_id,
                    exc,
                )
            else:
                logger.debug("%s; degraded to the completion event", exc)
        except Exception:
            logger.exception("mailbox put for task %s failed; degraded to the event", task_id)
        if self._publish is not None:
            try:
                self._publish("subagent.completed", parent_session_id, envelope)
            except Exception:
                logger.exception("publishing completion of task %s failed", task_id)
        return delivered
