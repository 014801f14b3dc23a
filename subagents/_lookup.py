"""Helpful answers to an unknown task id: the ids probably meant and the live ones.

An unknown id must never look like "no result yet" (reference 004): the error names the
closest known ids (prefix, truncation, case, edit distance) and the session's live tasks.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence

from ._handle import SETTLED, SpawnHandle

__all__ = ["live_ids_sentence", "similar_ids"]


def similar_ids(task_id: str, pool: Sequence[str]) -> list[str]:
    """Up to three ids of ``pool`` that ``task_id`` was probably meant to be."""
    needle = task_id.strip().lower()
    if not needle:
        return []
    close = [t for t in pool if t.lower() == needle or t.startswith(needle) or needle.startswith(t)]
    if len(close) < 3:
        for t in difflib.get_close_matches(needle, pool, n=3, cutoff=0.6):
            if t not in close:
                close.append(t)
    return close[:3]


def live_ids_sentence(session_id: str | None, handles: Iterable[SpawnHandle]) -> str:
    """A sentence listing the unfinished tasks of ``session_id`` (empty without one)."""
    if session_id is None:
        return ""
    live = [h.task_id for h in handles if h.state != SETTLED]
    if not live:
        return f"Session {session_id!r} has no unfinished tasks."
    shown = ", ".join(live[:10]) + (f" (+{len(live) - 10} more)" if len(live) > 10 else "")
    return f"Unfinished tasks of session {session_id!r}: {shown}."
