"""``subagents batch run --out``: the results file, one ``{"id", "envelope"}`` line per item.

Each line is one ``os.write`` on an ``O_APPEND`` descriptor (:class:`~subagents.JsonlSink`),
so after a kill the file holds whole lines and at most one torn last line, which the
next ``--resume`` drops. A line is written only after its envelope is committed to the
store, so the store always holds at least what the file does; :func:`reconcile` makes the
file agree with the store again before a resumed run appends to it.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Container, Iterator
from contextlib import contextmanager, suppress
from types import FrameType

from ._envelope import DelegateResult
from ._json import dumps, loads
from ._jsonl import JsonlSink

__all__ = ["ResultsFile", "line_of", "read_ids", "reconcile"]


def line_of(item_id: str, envelope: DelegateResult) -> bytes:
    """The results line of an item (without its newline)."""
    return dumps({"id": item_id, "envelope": envelope.to_dict()})


def _lines(path: str) -> Iterator[tuple[bytes, str | None]]:
    """Each line of ``path`` with its id, ``None`` for a line that is not a whole result
    (a torn last line after a kill, or anything else)."""
    with open(path, "rb") as f:
        for raw in f:
            item_id: str | None = None
            if raw.endswith(b"\n"):
                try:
                    value = loads(raw)
                except ValueError:
                    value = None
                if isinstance(value, dict) and isinstance(value.get("id"), str):
                    item_id = value["id"]  # type: ignore[assignment]
            yield raw, item_id


def read_ids(path: str) -> set[str]:
    """The ids with a whole line in ``path`` (empty if there is no such file)."""
    try:
        return {item_id for _, item_id in _lines(path) if item_id is not None}
    except FileNotFoundError:
        return set()


def reconcile(path: str, keep: Container[str]) -> set[str]:
    """Rewrite ``path`` to hold only whole lines of ids in ``keep``, each once (the first),
    and return those ids. The file is replaced atomically (a temporary file beside it,
    then a rename) and only if a line has to go; a missing file stays missing."""
    kept: set[str] = set()
    try:
        # A first pass only decides: the common case (nothing to drop) rewrites nothing,
        # and neither pass holds more than one line in memory. It reads to the end (no
        # any(), which stops at the first drop): ``kept`` must name every kept line.
        dropped = False
        for line in _lines_kept(path, keep, kept):
            dropped = dropped or line is None
    except FileNotFoundError:
        return kept
    if not dropped:
        return kept
    temporary = f"{path}.{os.getpid()}.tmp"
    with _signals_held():
        try:
            with open(temporary, "wb") as f:
                for line in _lines_kept(path, keep, set()):
                    if line is not None:
                        f.write(line)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, path)
        except BaseException:
            with suppress(OSError):
                os.unlink(temporary)
            raise
    return kept


@contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block ends, then act as they would have (the
    batch's own handlers are not installed yet: SIGTERM's default would end the process
    between the temporary file and its rename, and leave the file behind)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers; the CLI rewrites from it
        return
    caught: list[int] = []
    previous: dict[signal.Signals, Callable[[int, FrameType | None], object] | int] = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(signum)
        if handler is not None:  # None: set outside Python, so it could not be put back
            previous[signum] = handler
            signal.signal(signum, lambda received, _: caught.append(received))
    try:
        yield
    finally:
        for held, handler in previous.items():
            signal.signal(held, handler)
        for received in dict.fromkeys(caught):
            signal.raise_signal(received)


def _lines_kept(path: str, keep: Container[str], kept: set[str]) -> Iterator[bytes | None]:
    for raw, item_id in _lines(path):
        if item_id is None or item_id not in keep or item_id in kept:
            yield None
            continue
        kept.add(item_id)
        yield raw


class ResultsFile:
    """Appends result lines; with ``order`` (the ids this run writes, in input order),
    holds each back until every id before it is written (``--keep-order``).

    Args:
        path: the file, created if missing.
        order: ``None`` to write as items finish.
        on_error: called once with the ``OSError`` that stopped the file.
    """

    def __init__(
        self, path: str, *, order: list[str] | None, on_error: Callable[[OSError], None]
    ) -> None:
        self._sink = JsonlSink(path, on_error=on_error)
        self._position = {item_id: i for i, item_id in enumerate(order)} if order else None
        self._order = order
        self._next = 0
        self._held: dict[int, bytes] = {}

    @property
    def written(self) -> int:
        """Lines written so far."""
        return self._sink.written

    def write(self, item_id: str, envelope: DelegateResult) -> None:
        """Write (or, in order, hold) the line of ``item_id``. Never raises."""
        line = line_of(item_id, envelope)
        if self._position is None:
            self._sink.write_line(line)
            return
        self._held[self._position[item_id]] = line
        self._release()

    @property
    def held(self) -> int:
        """Lines held back (``--keep-order``) so far."""
        return len(self._held)

    def _release(self) -> None:
        assert self._order is not None
        while self._next in self._held:
            line = self._held.pop(self._next)
            if line:
                self._sink.write_line(line)
            self._next += 1

    def close(self) -> None:
        """Write whatever is still held (in order) and close the file."""
        for index in sorted(self._held):
            if self._held[index]:
                self._sink.write_line(self._held[index])
        self._held.clear()
        self._sink.close()

    def append(self, line: bytes) -> None:
        """Write an already-encoded line at once (a reconciled one). Never raises."""
        self._sink.write_line(line)
