"""Whole lists in one statement: which rows may travel as one JSON parameter, in how many.

A class's writes go to SQLite as one JSON array (``json_each``), stepped once instead of
once a row. Two things a bound parameter takes and a JSON list does not:

- **NUL.** ``json_extract`` ends a string at an escaped NUL (``"a\\u0000b"`` gives
  ``'a'``), so a row whose short texts (ids, names) hold one goes by ``executemany``.
  Bodies and requests are JSON texts themselves: a NUL in them is escaped already.
- **Length.** SQLite refuses a value longer than ``SQLITE_LIMIT_LENGTH`` (1e9 bytes by
  default), and one JSON parameter for a batch meets it at the batch's total. So a list
  is cut into parts of at most a quarter of the connection's limit (JSON escaping can
  double a text), and a row too long for a part of its own goes by ``executemany``.

Rows keep their order across the parts: a put overwrites the unread entry of its key, so
of two puts of one key the later must be written last.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

__all__ = ["has_nul", "segments"]

T = TypeVar("T")


def has_nul(texts: Iterable[str | None]) -> bool:
    """Whether any of ``texts`` holds a NUL character (one pass in C: the writer calls this
    for every row it writes)."""
    return "\x00" in "".join(filter(None, texts))


def segments(
    conn: sqlite3.Connection,
    rows: Sequence[T],
    *,
    size: Callable[[T], int],
    nul: Callable[[T], bool],
) -> Iterator[tuple[bool, list[T]]]:
    """``rows`` in order as consecutive ``(as_json, rows)`` segments: ``True`` for a list
    one JSON parameter carries on ``conn``, ``False`` for rows to write one by one
    (``nul(row)``, or longer than a part may be)."""
    budget = conn.getlimit(sqlite3.SQLITE_LIMIT_LENGTH) // 4
    current: list[T] = []
    as_json = True
    used = 0
    for row in rows:
        length = size(row)
        fits = length <= budget and not nul(row)
        if current and (fits != as_json or (fits and used + length > budget)):
            yield as_json, current
            current, used = [], 0
        as_json = fits
        current.append(row)
        used += length
    if current:
        yield as_json, current
