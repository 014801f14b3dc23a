"""The lifecycle event log: one JSON object per line, appended as events happen.

Writing: :class:`JsonlSink` is an :class:`EventBus` subscriber that appends each event
with a single ``write`` to a file opened in append mode, so a dashboard can tail the
file and a crash mid-write leaves at most one partial last line. After a failed write
the sink stops (reporting it once) rather than risk a torn line in the middle of the file.

Reading: :func:`read_events` and :class:`EventFollower` parse the file back into
:class:`Event` records; a partial or malformed line is skipped with a logged warning,
never an exception.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path
from types import TracebackType

from ._events import Event, EventBus
from ._json import loads

__all__ = ["EventFollower", "JsonlSink", "parse_event_line", "read_events"]

logger = logging.getLogger("subagents.events")

PathLike = str | os.PathLike[str]


class JsonlSink:
    """Appends every event it is given as one JSON line (``Event.to_dict`` schema).

    Use it as a bus subscriber, and close it (or use ``with``) when done::

        with JsonlSink("events.jsonl") as sink:
            manager.events.subscribe(sink)
            ...

    Each event costs one ``os.write`` on a file descriptor opened with ``O_APPEND``: no
    buffering, so a reader sees every event as soon as it is published. Writes are
    synchronous (a local file; use a :meth:`EventBus.stream` consumer to write elsewhere).

    A failed write (a full disk, a lost mount) stops the sink: :attr:`error` keeps the
    exception, and it is logged once on ``subagents.events`` as one line, or handed to
    ``on_error`` instead.

    Args:
        path: the file; created if missing, appended to if present.
        fsync: also ``fsync`` after each event (durable across power loss; slower).
        on_error: called once with the :class:`OSError` that stopped the log, instead of
            logging it (a command line reports it in its own words). Must not raise.
    """

    def __init__(
        self,
        path: PathLike,
        *,
        fsync: bool = False,
        on_error: Callable[[OSError], None] | None = None,
    ) -> None:
        self.path = Path(path)
        """The file written to."""
        self.fsync = fsync
        self.written = 0
        """Events written so far."""
        self.error: OSError | None = None
        """The error that stopped the log (events after it were not written), or None."""
        self._on_error = on_error
        self._fd: int | None = os.open(
            self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o644
        )
        self._unsubscribers: list[Callable[[], None]] = []

    @property
    def closed(self) -> bool:
        """True once closed, or stopped after a failed write."""
        return self._fd is None

    def attach(self, bus: EventBus) -> Callable[[], None]:
        """Subscribe to ``bus``; returns the unsubscribe function (also run by :meth:`close`)."""
        unsubscribe = bus.subscribe(self)
        self._unsubscribers.append(unsubscribe)
        return unsubscribe

    def __call__(self, event: Event) -> None:
        """Write one event (the bus callback). Never raises."""
        self.write_line(event.to_json())

    def write_line(self, line: bytes) -> None:
        """Append one already-encoded JSON object (without its newline). Never raises."""
        fd = self._fd
        if fd is None:
            return
        view = memoryview(line + b"\n")
        try:
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if self.fsync:
                os.fsync(fd)
        except OSError as exc:
            # Closed before the report, so a raising on_error still leaves the sink stopped;
            # the write's error is the one worth reporting, not a close's after it.
            self._fd = None
            with suppress(OSError):
                os.close(fd)
            self._failed(exc, "writing")
            return
        self.written += 1

    def _failed(self, exc: OSError, doing: str) -> None:
        if self.error is not None:
            return
        self.error = exc
        if self._on_error is not None:
            self._on_error(exc)
        else:
            # The OS's reason is the whole story; a traceback of os.write adds nothing.
            reason = exc.strerror or str(exc)
            logger.error(
                "%s the event log %s failed (%s); the log stops here", doing, self.path, reason
            )

    def _close_fd(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError as exc:  # pragma: no cover - close of a regular file
                self._failed(exc, "closing")

    def close(self) -> None:
        """Unsubscribe from the buses given to :meth:`attach` and close the file. Idempotent."""
        for unsubscribe in self._unsubscribers:
            unsubscribe()
        self._unsubscribers.clear()
        self._close_fd()

    def __enter__(self) -> JsonlSink:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def parse_event_line(line: bytes | str) -> Event:
    """Parse one JSONL line into an :class:`Event`.

    Raises:
        ValueError: not JSON, or not an event.
    """
    return Event.from_dict(_as_object(loads(line)))


def _as_object(value: object) -> dict[str, object]:
    if not isinstance(value, dict):
        raise ValueError(f"an event must be a JSON object, got {type(value).__name__}")
    return value


WARNINGS_KEPT = 5
"""Skipped lines :func:`read_events` warns about one by one."""


def read_events(path: PathLike, *, live: bool = False) -> Iterator[Event]:
    """Yield the events of a JSONL event log, in file order.

    Blank lines are ignored. A line that does not parse (the partial last line a crash
    can leave, or a corrupt one) is skipped with a warning logged on
    ``subagents.events``; reading goes on. Past :data:`WARNINGS_KEPT` such lines, the rest
    are counted in one last warning (a file that is no log at all warns a few times).

    Args:
        path: the log.
        live: the log of a run that may still be going: an unterminated last line is a
            write in progress, left out without a warning.

    Raises:
        OSError: the file cannot be opened.
    """
    skipped = 0
    with open(path, "rb") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            partial = not line.endswith(b"\n")
            if partial and live:
                break
            try:
                yield parse_event_line(line)
            except ValueError as exc:
                skipped += 1
                if skipped <= WARNINGS_KEPT:
                    _warn_skipped(path, number, partial=partial, error=exc)
    if skipped > WARNINGS_KEPT:
        logger.warning("%s: skipped %d more malformed lines", path, skipped - WARNINGS_KEPT)


def _warn_skipped(path: PathLike, number: int, *, partial: bool, error: Exception) -> None:
    if partial:
        logger.warning("%s: skipped a partial last line %d (an interrupted write)", path, number)
    else:
        logger.warning("%s: skipped malformed line %d: %s", path, number, error)


class EventFollower:
    """Reads a JSONL event log incrementally, as ``tail -f`` does.

    Each :meth:`poll` returns the events of the complete lines appended since the last
    call. A line without its newline yet is kept back (a write in progress) until it is
    completed; :meth:`finish` reports it as a partial last line if it never is.

    Args:
        path: the log; it may not exist yet (polls return nothing until it does).
        from_start: read what the file already holds (default); ``False`` starts at its end.
    """

    def __init__(self, path: PathLike, *, from_start: bool = True) -> None:
        self.path = Path(path)
        self._offset = 0
        self._line = 0
        self._partial = b""
        self.missing = False
        """True when the last poll found no file at ``path`` (it may be created later)."""
        if not from_start:
            with suppress(FileNotFoundError):
                self._offset = self.path.stat().st_size

    def poll(self) -> list[Event]:
        """Events completed since the last call (never blocks on anything but the read).

        Raises:
            OSError: the path exists but cannot be read (a directory, no permission).
        """
        try:
            with open(self.path, "rb") as file:
                size = os.fstat(file.fileno()).st_size
                if size < self._offset:  # truncated or replaced: start over
                    self._offset, self._partial = 0, b""
                file.seek(self._offset)
                chunk = file.read()
        except FileNotFoundError:
            self.missing = True
            return []
        self.missing = False
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        events = []
        for line in lines:
            self._line += 1
            if not line.strip():
                continue
            try:
                events.append(parse_event_line(line))
            except ValueError as exc:
                _warn_skipped(self.path, self._line, partial=False, error=exc)
        return events

    def finish(self) -> list[Event]:
        """Like :meth:`poll`, then treat a dangling unterminated line as final."""
        events = self.poll()
        partial, self._partial = self._partial, b""
        if partial.strip():
            self._line += 1
            try:
                events.append(parse_event_line(partial))
            except ValueError as exc:
                _warn_skipped(self.path, self._line, partial=True, error=exc)
        return events
