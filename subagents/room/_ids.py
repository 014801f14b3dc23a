"""The two kinds of id a room takes, told apart by shape, and the errors that say which is
which.

A **member id** (16 lower-case hex characters, made by :meth:`Room.join`) is the handle
every other call takes back. A **harness key** (a UUID, chosen by the harness and kept in
its process's environment) is given only to ``join``, which then finds the member that
joined with it before. The two look alike to a model holding both, so passing one where
the other is meant is an error naming the right one, never an empty answer.
"""

from __future__ import annotations

import re
import secrets
import sqlite3
from collections.abc import Sequence
from typing import Final

from .._errors import ConfigError, SubagentsError, _shown

__all__ = [
    "MEMBER_ID",
    "HARNESS_KEY",
    "UnknownMember",
    "check_harness_key",
    "new_member_id",
    "resolve_member",
]

MEMBER_ID: Final = re.compile(r"[0-9a-f]{16}")
"""A member id: 16 lower-case hex characters."""
HARNESS_KEY: Final = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)
"""A harness key: a UUID in its 8-4-4-4-12 hex form."""

_SUGGESTIONS: Final = 5
"""Members named by an unknown-id error at most."""
_SHAPES: Final = (
    "member ids are 16 lower-case hex characters (what join returned); harness keys "
    "are UUIDs and go only to join(harness_key=...)"
)


class UnknownMember(SubagentsError, LookupError):
    """No member of the store has the given id.

    Attributes:
        given: the id that was passed.
        suggestions: member ids it was probably meant to be, best first.
        reason: ``harness_key`` (a harness key where a member id goes: ``suggestions``
            holds its member), ``partial`` (a prefix or label of the ``suggestions``),
            ``gone`` (a well-formed member id or harness key with nothing behind it:
            pruned, or another store's) or ``malformed``.
        store: the store's file.
    """

    def __init__(
        self, given: str, *, reason: str, store: str, suggestions: Sequence[str] = ()
    ) -> None:
        self.given = given
        self.reason = reason
        self.store = store
        self.suggestions = tuple(suggestions)
        shown = _shown(given)
        if reason == "harness_key":
            message = (
                f"{shown} is a harness key (a UUID), not a member id; the member that joined "
                f"with it is {self.suggestions[0]!r}: pass that"
            )
        elif reason == "partial":
            listed = ", ".join(repr(s) for s in self.suggestions)
            message = f"unknown member id {shown}; did you mean {listed}? ({_SHAPES})"
        elif reason == "gone" and HARNESS_KEY.fullmatch(given):
            message = (
                f"{shown} is a harness key (a UUID), not a member id, and no member of the "
                f"store {store!r} joined with it: it is gone (pruned) or from another store "
                "(join(harness_key=...) to get a member id here)"
            )
        elif reason == "gone":
            message = (
                f"no member {shown} in the store {store!r}: it left or was pruned, or it "
                "is a member of another store (join again to get a member id here)"
            )
        else:
            message = f"{shown} is not a member id: {_SHAPES}"
        super().__init__(message)


def new_member_id() -> str:
    """A fresh member id (64 random bits)."""
    return secrets.token_hex(8)


def check_harness_key(value: object) -> str | None:
    """``value`` as a harness key (``None`` stays ``None``).

    Raises:
        ConfigError: not a UUID; a member id is named as one.
    """
    if value is None:
        return None
    if isinstance(value, str) and HARNESS_KEY.fullmatch(value):
        return value.lower()
    if isinstance(value, str) and MEMBER_ID.fullmatch(value):
        raise ConfigError(
            "harness_key",
            "the harness's UUID (this is a member id, 16 hex: pass it as member instead)",
            value,
        )
    raise ConfigError("harness_key", "a UUID such as 2b50133e-6f0c-4a8e-9d3b-1c2d3e4f5a6b", value)


def resolve_member(conn: sqlite3.Connection, given: object, store: str) -> str:
    """The member id ``given`` names, checked to exist.

    Raises:
        UnknownMember: no such member; the error names the id probably meant.
    """
    if not isinstance(given, str):
        raise UnknownMember(_shown(given), reason="malformed", store=store)
    if MEMBER_ID.fullmatch(given):
        row = conn.execute("SELECT 1 FROM room_members WHERE member_id = ?", (given,)).fetchone()
        if row is not None:
            return given
        raise UnknownMember(given, reason="gone", store=store)
    if HARNESS_KEY.fullmatch(given):
        row = conn.execute(
            "SELECT member_id FROM room_members WHERE harness_key = ?", (given.lower(),)
        ).fetchone()
        if row is not None:
            raise UnknownMember(given, reason="harness_key", store=store, suggestions=[row[0]])
        raise UnknownMember(given, reason="gone", store=store)
    return _partial(conn, given, store)


def _partial(conn: sqlite3.Connection, given: str, store: str) -> str:
    needle = given.strip()[:64]
    found: list[str] = []
    if needle:
        low = needle.lower()
        # Prefix ranges over the primary key and the label index: bounded by LIMIT.
        found += [
            str(r[0])
            for r in conn.execute(
                "SELECT member_id FROM room_members WHERE member_id >= ? AND member_id < ? "
                "ORDER BY member_id LIMIT ?",
                (low, low + "\uffff", _SUGGESTIONS),
            )
        ]
        found += [
            str(r[0])
            for r in conn.execute(
                "SELECT member_id FROM room_members WHERE label >= ? AND label < ? "
                "ORDER BY label, member_id LIMIT ?",
                (needle, needle + "\uffff", _SUGGESTIONS),
            )
        ]
    if found:
        unique = list(dict.fromkeys(found))[:_SUGGESTIONS]
        raise UnknownMember(given, reason="partial", store=store, suggestions=unique)
    raise UnknownMember(given, reason="malformed", store=store)
