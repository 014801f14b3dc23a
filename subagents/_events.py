"""Lifecycle events: one schema for ``subagent.spawned/started/progress/completed``.

The bus is synchronous and never blocks the runtime: a subscriber is a plain callback
that must return quickly; one that raises is logged and ignored. When nobody listens,
publishing costs one attribute check.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import Final

import attrs

from ._envelope import now_ms
from ._json import JSONValue, dumps

__all__ = [
    "COMPLETED",
    "PROGRESS",
    "SPAWNED",
    "STARTED",
    "Event",
    "EventBus",
]

SPAWNED: Final = "subagent.spawned"
STARTED: Final = "subagent.started"
PROGRESS: Final = "subagent.progress"
COMPLETED: Final = "subagent.completed"

logger = logging.getLogger("subagents.events")


@attrs.frozen(kw_only=True)
class Event:
    """One lifecycle event."""

    type: str
    """``subagent.spawned``, ``subagent.started``, ``subagent.progress`` or
    ``subagent.completed``."""
    seq: int
    """Strictly increasing per bus, starting at 1."""
    timestamp_ms: int
    """Unix milliseconds when it was published."""
    session_id: str
    """The parent session the task belongs to."""
    task_id: str
    """The task the event is about."""
    agent_path: str
    """The task's agent path."""
    data: dict[str, JSONValue] = attrs.field(factory=dict)
    """Payload; for ``subagent.completed`` the full, untruncated envelope."""

    def to_dict(self) -> dict[str, JSONValue]:
        """A JSON-ready dict (the JSONL line schema)."""
        return {
            "type": self.type,
            "seq": self.seq,
            "timestamp_ms": self.timestamp_ms,
            "session_id": self.session_id,
            "task_id": self.task_id,
            "agent_path": self.agent_path,
            "data": self.data,
        }

    def to_json(self) -> bytes:
        """Compact JSON bytes of :meth:`to_dict`."""
        return dumps(self.to_dict())


EventCallback = Callable[[Event], object]


class EventBus:
    """Fans lifecycle events out to synchronous subscribers."""

    def __init__(self) -> None:
        self._subscribers: dict[int, EventCallback] = {}
        self._ids = itertools.count(1)
        self._seq = 0

    @property
    def active(self) -> bool:
        """True when at least one subscriber listens (publishing is skipped otherwise)."""
        return bool(self._subscribers)

    def subscribe(self, callback: EventCallback) -> Callable[[], None]:
        """Call ``callback(event)`` for every event; returns a function that unsubscribes.

        The callback runs inside the publishing task and must not block.
        """
        key = next(self._ids)
        self._subscribers[key] = callback

        def unsubscribe() -> None:
            self._subscribers.pop(key, None)

        return unsubscribe

    def publish(
        self,
        type: str,
        *,
        session_id: str,
        task_id: str,
        agent_path: str,
        data: dict[str, JSONValue] | None = None,
    ) -> Event | None:
        """Build and deliver one event; returns it, or ``None`` when nobody listens."""
        if not self._subscribers:
            return None
        self._seq += 1
        event = Event(
            type=type,
            seq=self._seq,
            timestamp_ms=now_ms(),
            session_id=session_id,
            task_id=task_id,
            agent_path=agent_path,
            data=data if data is not None else {},
        )
        for callback in list(self._subscribers.values()):
            try:
                callback(event)
            except Exception:
                logger.exception("event subscriber %r raised; ignored", callback)
        return event
