"""The ``subagent.message`` events of one manager's messaging: a send, and each receipt
that moved (design/messaging.md)."""

from __future__ import annotations

from typing import Any

from ._events import MESSAGE, EventBus
from ._messages import Message, Receipt
from ._peers import Peer

__all__ = ["MessageEvents"]


class MessageEvents:
    """Publishes the messaging's events on ``events`` (bodies only if ``capture``)."""

    def __init__(self, events: EventBus, capture: bool) -> None:
        self._events = events
        self._capture = capture

    @property
    def active(self) -> bool:
        """Whether anyone listens (an event costs nothing otherwise)."""
        return self._events.active

    def publish(self, action: str, peer: Peer, message: Message | None, receipt: Receipt) -> None:
        """One event: ``action`` (``send``, ``receipt``) by or for ``peer``."""
        if not self._events.active:
            return
        record = peer.record
        data: dict[str, Any] = {"action": action, "receipt": receipt.to_dict()}
        if message is not None:
            data["message"] = message.to_dict(body=self._capture)
        self._events.publish(
            MESSAGE,
            session_id=peer.address if record is None else record.session_id,
            task_id=peer.address,
            agent_path=peer.path,
            data=data,
        )
