"""Lifecycle events: one schema for ``subagent.spawned/started/progress/completed``.

The bus is synchronous and never blocks the runtime: a subscriber is a plain callback
that must return quickly; one that raises is logged and ignored. When nobody listens,
publishing costs one attribute check.

Async consumers use :meth:`EventBus.stream`: an async iterator over a bounded buffer.
A slow consumer never slows the runtime down: when its buffer is full, new events are
dropped for it and counted, and the next item it receives is a ``subagent.missed``
marker saying how many it lost and which sequence numbers (never a silent gap).
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Final, TypeVar

import anyio
import attrs

from ._envelope import now_ms
from ._json import JSONValue, dumps

__all__ = [
    "COMPLETED",
    "DEFAULT_STREAM_BUFFER",
    "MAILBOX_FULL",
    "MESSAGE",
    "MISSED",
    "PROGRESS",
    "SPAWNED",
    "STARTED",
    "Event",
    "EventBus",
    "EventStream",
]

SPAWNED: Final = "subagent.spawned"
STARTED: Final = "subagent.started"
PROGRESS: Final = "subagent.progress"
COMPLETED: Final = "subagent.completed"
MAILBOX_FULL: Final = "subagent.mailbox_full"
"""A result found its session's mailbox full: the completed event and the manager's record
carry it (``wait_result`` and ``wait_agent`` still collect it); nothing is lost."""
MESSAGE: Final = "subagent.message"
"""A message was sent, or its receipt moved (delivered, read, replied, failed): ``data``
carries ``action`` (``send`` or ``receipt``), the ``receipt`` and, for a send, the
``message`` (its body only under ``capture_content``)."""
MISSED: Final = "subagent.missed"
"""Not published on the bus: the marker an :class:`EventStream` yields after an overflow."""
DEFAULT_STREAM_BUFFER: Final = 1024

logger = logging.getLogger("subagents.events")
_T = TypeVar("_T")


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

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Event:
        """Inverse of :meth:`to_dict` (a parsed JSONL line).

        Raises:
            ValueError: a field is missing or has the wrong type.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"an event must be a JSON object, got {type(data).__name__}")
        payload = data.get("data", {})
        if not isinstance(payload, dict):
            raise ValueError(f"event field 'data' must be an object, got {payload!r}")
        return cls(
            type=_field(data, "type", str),
            seq=_field(data, "seq", int),
            timestamp_ms=_field(data, "timestamp_ms", int),
            session_id=_field(data, "session_id", str),
            task_id=_field(data, "task_id", str),
            agent_path=_field(data, "agent_path", str),
            data=payload,
        )


def _field(data: Mapping[str, object], key: str, kind: type[_T]) -> _T:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ValueError(f"event field {key!r} must be {kind.__name__}, got {value!r}")
    return value


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

    def stream(self, max_buffer: int = DEFAULT_STREAM_BUFFER) -> EventStream:
        """An async iterator over the events published from now on.

        Subscribes at once (nothing published after this call is lost to a late
        ``async for``). At most ``max_buffer`` events wait for the consumer; past that
        they are dropped for this stream only and reported by a ``subagent.missed``
        marker. Close it (``async with`` or :meth:`EventStream.aclose`) to unsubscribe.

        Raises:
            ValueError: ``max_buffer`` is not an integer >= 1.
        """
        return EventStream(self, max_buffer)

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


class EventStream:
    """Events of one :class:`EventBus` for an async consumer, through a bounded buffer.

    ``async for event in stream`` blocks until an event arrives and ends once the stream
    is closed. After an overflow, the consumer first receives the events buffered before
    it, then one :data:`MISSED` event whose ``data`` is ``{"missed": n, "first_seq": a,
    "last_seq": b}``, then the events that fit again. :attr:`missed` counts every dropped
    event. Publishing into a stream is O(1) and never waits.

    Use from the thread running the event loop that publishes (the bus is not
    thread-safe).
    """

    def __init__(self, bus: EventBus, max_buffer: int = DEFAULT_STREAM_BUFFER) -> None:
        if isinstance(max_buffer, bool) or not isinstance(max_buffer, int) or max_buffer < 1:
            raise ValueError(f"max_buffer must be an integer >= 1, got {max_buffer!r}")
        self.max_buffer = max_buffer
        """How many undelivered events are kept before new ones are dropped."""
        self.missed = 0
        """Events dropped for this stream so far, in total."""
        self._buffer: deque[Event] = deque()
        self._pending = 0
        self._first = 0
        self._last = 0
        self._wakeup: anyio.Event | None = None
        self._closed = False
        self._unsubscribe = bus.subscribe(self._push)

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` was called."""
        return self._closed

    def _push(self, event: Event) -> None:
        if self._closed:
            return
        buffer = self._buffer
        if len(buffer) >= self.max_buffer:
            if not self._pending:
                self._first = event.seq
            self._pending += 1
            self._last = event.seq
            self.missed += 1
        else:
            if self._pending:
                buffer.append(self._marker())
            buffer.append(event)
        wakeup = self._wakeup
        if wakeup is not None:
            self._wakeup = None
            wakeup.set()

    def _marker(self) -> Event:
        marker = Event(
            type=MISSED,
            seq=self._last,
            timestamp_ms=now_ms(),
            session_id="",
            task_id="",
            agent_path="",
            data={"missed": self._pending, "first_seq": self._first, "last_seq": self._last},
        )
        self._pending = 0
        return marker

    def receive_nowait(self) -> Event:
        """The next event if one is ready.

        Raises:
            anyio.WouldBlock: nothing is buffered.
            anyio.EndOfStream: the stream is closed and drained.
        """
        if self._buffer:
            return self._buffer.popleft()
        if self._pending:
            return self._marker()
        if self._closed:
            raise anyio.EndOfStream
        raise anyio.WouldBlock

    async def receive(self) -> Event:
        """Wait for the next event. Cancellation loses nothing.

        Raises:
            anyio.EndOfStream: the stream is closed and drained.
        """
        while True:
            try:
                return self.receive_nowait()
            except anyio.WouldBlock:
                pass
            wakeup = self._wakeup
            if wakeup is None:
                wakeup = self._wakeup = anyio.Event()
            await wakeup.wait()

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Event:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        """Unsubscribe and drop what is buffered; a waiting consumer's loop ends."""
        self.close()

    def close(self) -> None:
        """Synchronous :meth:`aclose`."""
        if self._closed:
            return
        self._closed = True
        self._unsubscribe()
        self._buffer.clear()
        self._pending = 0
        wakeup = self._wakeup
        if wakeup is not None:
            self._wakeup = None
            wakeup.set()

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
