"""Helpful answers to an unknown task id: the ids probably meant and the live ones.

An unknown id must never look like "no result yet": the error names the closest known ids
(a prefix or truncation, another case, a typo), what was looked in (with a store, its
file, and why a well-formed id is not there) and the session's unfinished tasks. The
answer costs a bounded amount whatever the number of records: candidates come from an
index of the ids by their first and last characters and from a store's few ids next to
the one asked for in key order, at most :data:`MAX_CANDIDATES` of them are compared, and
the unfinished tasks are read from the session's live set.
"""

from __future__ import annotations

import difflib
import itertools
import logging
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Final

from ._errors import UnknownTask

if TYPE_CHECKING:
    from ._journal import Journal
    from ._record import ChildRecord

__all__ = [
    "MAX_CANDIDATES",
    "UNSET_RETAIN",
    "IdIndex",
    "live_ids_sentence",
    "store_sentence",
    "stored_near",
    "unknown_task",
]

logger = logging.getLogger("subagents")

MAX_CANDIDATES: Final = 64
"""Known ids compared with one unknown id, at most."""
_KEY: Final = 3  # characters an index key takes from either end of an id
_MAX_NEEDLE: Final = 64  # longer than any id: comparing it would only cost time
_SHOWN: Final = 10  # unfinished tasks named in a sentence
_TASK_ID: Final = re.compile(r"[0-9a-f]{12}")  # the form of the ids the manager makes


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
        self,
        task_id: str,
        known: Callable[[str], bool],
        prefer: Callable[[str], bool],
        more: Callable[[str], Iterable[str]] | None = None,
    ) -> list[str]:
        """Up to three indexed ids that ``task_id`` was probably meant to be, those for which
        ``prefer(id)`` holds (the caller's session) first. ``known(id)`` tells an exact hit;
        ``more(needle)`` gives a few more candidates (a store's), ranked with the indexed."""
        needle = task_id.strip().lower()
        if not _KEY <= len(needle) <= _MAX_NEEDLE:
            return []  # too short to mean one id rather than many, or too long to be one
        if needle != task_id and known(needle):
            return [needle]  # the same id in another case or with spaces around it
        pool = itertools.chain(
            self._heads.get(needle[:_KEY], ()), self._tails.get(needle[-_KEY:], ())
        )
        indexed = itertools.islice(pool, 2 * MAX_CANDIDATES)
        extra = () if more is None else more(needle)  # first: a few, the nearest by key
        candidates = list(dict.fromkeys(itertools.chain(extra, indexed)))
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


def stored_near(journal: Journal, needle: str) -> dict[str, str]:
    """The store's candidates for ``needle`` with their sessions; none (logged) if it
    cannot answer."""
    try:
        return journal.near(needle)
    except Exception as exc:
        logger.warning("looking for ids like %r in the store failed: %r", needle, exc)
        return {}


def store_sentence(journal: Journal, task_id: str) -> str:
    """What an unknown id's error says of the store: its file, and what it holds of the id
    (one primary-key read)."""
    path = journal.location()
    try:
        state = journal.holds(task_id)
    except Exception as exc:
        return (
            f"Looked in this process's memory; the store {path} could not be read "
            f"({type(exc).__name__}: {exc})."
        )
    if state is None:
        looked = f"No task has this id in this process's memory or in the store {path}"
        if _TASK_ID.fullmatch(task_id):
            return f"{looked}: it is possibly from another store, or already forgotten."
        return f"{looked}."
    if state != "ended":
        return (
            f"The store {path} holds it {state}, not ended: another process runs it (or ran "
            "it and was killed), and it is known here once it has ended."
        )
    return (
        f"The store {path} holds it as spawned through this same store object by another "
        "manager: only that manager knows it."
    )


UNSET_RETAIN: Final = -1
"""``unknown_task``'s ``retain`` when nothing was ever forgotten: nothing to say of it."""


def unknown_task(
    task_id: str,
    session_id: str | None,
    ids: IdIndex,
    tasks: Mapping[str, ChildRecord],
    live: Collection[ChildRecord],
    journal: Journal | None,
    retain: int | None,
) -> UnknownTask:
    """The error for ``task_id``, which neither ``tasks`` nor the store holds: the ids
    probably meant (in memory and, with a ``journal``, the store's), what was looked in,
    why an id may be gone (``retain``: the retention setting, :data:`UNSET_RETAIN` when
    nothing was forgotten), and ``session_id``'s unfinished tasks (``live``)."""
    detail = live_ids_sentence(session_id, live)
    if retain != UNSET_RETAIN:
        detail = f"{_forgotten_sentence(retain)} {detail}".rstrip()
    if journal is not None:  # what was looked in: memory and the store
        detail = f"{store_sentence(journal, task_id)} {detail}".rstrip()
    stored: dict[str, str] = {}  # the store's candidates, by id with their sessions

    def near(needle: str) -> dict[str, str]:
        assert journal is not None
        stored.update(stored_near(journal, needle))
        return stored

    def in_session(candidate: str) -> bool:
        record = tasks.get(candidate)
        session = stored.get(candidate) if record is None else record.session_id
        return session is not None and session == session_id

    more = None if journal is None else near
    return UnknownTask(task_id, ids.similar(task_id, tasks.__contains__, in_session, more), detail)


def _forgotten_sentence(retain: int | None) -> str:
    if retain is None:
        return "Records are forgotten on request (forget), so a forgotten id is unknown."
    return (
        f"Collected results are forgotten (retain_collected={retain}), so an id "
        "already collected may be unknown."
    )
