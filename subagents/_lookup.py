"""Helpful answers to an unknown task id: the ids probably meant and the live ones.

An unknown id must never look like "no result yet": the error names the closest known ids
(a prefix or truncation, another case, a typo) and the session's unfinished tasks. The
answer costs a bounded amount whatever the number of records: candidates come from an
index of the ids by their first and last characters, at most :data:`MAX_CANDIDATES` of
them are compared, and the unfinished tasks are read from the session's live set.
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from ._record import ChildRecord

__all__ = ["MAX_CANDIDATES", "IdIndex", "live_ids_sentence"]

MAX_CANDIDATES: Final = 64
"""Known ids compared with one unknown id, at most."""
_KEY: Final = 3  # characters an index key takes from either end of an id
_MAX_NEEDLE: Final = 64  # longer than any id: comparing it would only cost time
_SHOWN: Final = 10  # unfinished tasks named in a sentence


class IdIndex:
    """Task ids bucketed by their first and by their last three characters.

    A mistyped id usually keeps one end: a truncated or extended id keeps its start, a typo
    near the start keeps the end. Adding and discarding are O(1) (ids are indexed as given:
    the manager's are lower-case hex, and a needle is lowered before it is looked up);
    :meth:`similar` looks at two buckets and compares at most :data:`MAX_CANDIDATES` ids.
    """

    __slots__ = ("_heads", "_tails")

    def __init__(self) -> None:
        self._heads: dict[str, set[str]] = {}
        self._tails: dict[str, set[str]] = {}

    def add(self, task_id: str) -> None:
        head = task_id[:_KEY]
        bucket = self._heads.get(head)
        if bucket is None:
            self._heads[head] = {task_id}
        else:
            bucket.add(task_id)
        tail = task_id[-_KEY:]
        bucket = self._tails.get(tail)
        if bucket is None:
            self._tails[tail] = {task_id}
        else:
            bucket.add(task_id)

    def discard(self, task_id: str) -> None:
        for buckets, key in ((self._heads, task_id[:_KEY]), (self._tails, task_id[-_KEY:])):
            bucket = buckets.get(key)
            if bucket is not None:
                bucket.discard(task_id)
                if not bucket:
                    del buckets[key]

    def similar(
        self, task_id: str, known: Callable[[str], bool], prefer: Callable[[str], bool]
    ) -> list[str]:
        """Up to three indexed ids that ``task_id`` was probably meant to be, those for which
        ``prefer(id)`` holds (the caller's session) first. ``known(id)`` tells an exact hit."""
        needle = task_id.strip().lower()
        if not _KEY <= len(needle) <= _MAX_NEEDLE:
            return []  # too short to mean one id rather than many, or too long to be one
        if needle != task_id and known(needle):
            return [needle]  # the same id in another case or with spaces around it
        pool = itertools.chain(
            self._heads.get(needle[:_KEY], ()), self._tails.get(needle[-_KEY:], ())
        )
        candidates = list(dict.fromkeys(itertools.islice(pool, 2 * MAX_CANDIDATES)))
        preferred = [c for c in candidates if prefer(c)]
        ranked: list[str] = []
        for group in (preferred, candidates):
            group = group[:MAX_CANDIDATES]
            close = [c for c in group if c.startswith(needle) or needle.startswith(c)]
            close += difflib.get_close_matches(needle, group, n=3, cutoff=0.6)
            ranked += [c for c in dict.fromkeys(close) if c not in ranked]
            if len(ranked) >= 3:
                break
        return ranked[:3]


def live_ids_sentence(session_id: str | None, live: Collection[ChildRecord]) -> str:
    """A sentence naming the unfinished tasks of ``session_id`` (empty without one).

    ``live`` holds only unfinished tasks (the manager's live set of the session), so ten
    are read whatever the number of records.
    """
    if session_id is None:
        return ""
    if not live:
        return f"Session {session_id!r} has no unfinished tasks."
    shown = [r.task_id for r in itertools.islice(live, _SHOWN)]
    more = f" (+{len(live) - len(shown)} more)" if len(live) > len(shown) else ""
    return f"Unfinished tasks of session {session_id!r}: {', '.join(shown)}{more}."
