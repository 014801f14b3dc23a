"""Agent paths (the place of an agent in the delegation tree) and unique naming."""

from __future__ import annotations

import re
from typing import Final

from ._errors import InvalidName

__all__ = ["MAX_NAME_LENGTH", "NAME_PATTERN", "AgentPath", "NameAllocator", "child_path"]

MAX_NAME_LENGTH: Final = 64
NAME_PATTERN: Final = "^[A-Za-z0-9][A-Za-z0-9_.-]*$"
"""A valid segment (with at most :data:`MAX_NAME_LENGTH` characters), as a regex that
means the same in ECMA-262 (JSON Schema's dialect) and, with ``re.fullmatch``, Python."""
_ROOT: Final = "root"
# A segment starts with a letter or digit and continues with letters, digits, '_', '-', '.'.
_SEGMENT: Final = re.compile(NAME_PATTERN)


def validate_name(name: object) -> str:
    """Return ``name`` if it is a valid path segment, else raise :class:`InvalidName`."""
    if not isinstance(name, str):
        raise InvalidName(name, "a name must be a string")
    if not name:
        raise InvalidName(name, "a name must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidName(name, f"a name is at most {MAX_NAME_LENGTH} characters")
    if "/" in name:
        raise InvalidName(name, "a name must not contain '/'")
    if not _SEGMENT.fullmatch(name):
        raise InvalidName(
            name,
            "use letters, digits, '_', '-' and '.', starting with a letter or digit",
        )
    return name


class AgentPath(str):
    """An agent's place in the delegation tree: ``/root``, ``/root/general``, deeper.

    A ``str`` subclass, so it compares equal to its text and serialises as it. Each
    segment matches ``[A-Za-z0-9][A-Za-z0-9_.-]*`` and is at most 64 characters.
    """

    __slots__ = ()

    def __new__(cls, value: str = "/" + _ROOT) -> AgentPath:
        if not isinstance(value, str) or not value.startswith("/"):
            raise InvalidName(value, "an agent path starts with '/', e.g. '/root/general'")
        for segment in value[1:].split("/"):
            validate_name(segment)
        return str.__new__(cls, value)

    @classmethod
    def root(cls) -> AgentPath:
        """The path of the top-level agent, ``/root``."""
        return _ROOT_PATH

    def join(self, name: str) -> AgentPath:  # type: ignore[override]  # the brief's join
        """The path of a child named ``name``. Raises :class:`InvalidName` if malformed."""
        validate_name(name)
        return str.__new__(AgentPath, f"{self}/{name}")

    def parent(self) -> AgentPath | None:
        """The parent path, or ``None`` for a path of one segment."""
        cut = self.rfind("/")
        if cut <= 0:
            return None
        return str.__new__(AgentPath, self[:cut])

    @property
    def name(self) -> str:
        """The last segment (``general`` in ``/root/general``)."""
        return self[self.rfind("/") + 1 :]

    @property
    def segments(self) -> tuple[str, ...]:
        """All segments, ``("root", "general")`` for ``/root/general``."""
        return tuple(self[1:].split("/"))

    @property
    def depth(self) -> int:
        """Number of delegations below the first segment: 0 for ``/root``."""
        return self.count("/") - 1

    def __repr__(self) -> str:
        return f"AgentPath({str(self)!r})"


_ROOT_PATH: Final = str.__new__(AgentPath, "/" + _ROOT)


def child_path(parent: AgentPath, segment: str) -> AgentPath:
    """``parent.join(segment)`` for a segment :class:`NameAllocator` just produced (and so
    validated): skips validating every spawn's unique ``name-N`` a second time."""
    return str.__new__(AgentPath, f"{parent}/{segment}")


class NameAllocator:
    """Gives children of one parent distinct names: ``name``, ``name-2``, ``name-3``...

    Comparison is case-insensitive (``Anna`` then ``anna`` gives ``anna-2``); the spelling
    asked for is kept. Allocation is O(1) amortised per call, and memory grows with the
    distinct names asked for, not with the children named: the suffixed names of a stem are
    the range below its counter, so a thousand ``quick`` children cost one counter.
    """

    __slots__ = ("_next", "_taken")

    def __init__(self) -> None:
        # Lowered names given out as they were asked for (or cut to fit), not from a range.
        self._taken: set[str] = set()
        # Lowered stem -> the next suffix to try: every ``stem-k`` with 2 <= k below it is
        # given out (by this counter, or earlier as a name of its own).
        self._next: dict[str, int] = {}

    def _used(self, lowered: str) -> bool:
        if lowered in self._taken:
            return True
        cut = lowered.rfind("-")
        if cut <= 0:
            return False
        digits = lowered[cut + 1 :]
        # Only the canonical spelling counts: the range holds "x-2", never "x-02".
        if not digits.isdigit() or not digits.isascii() or digits[0] == "0":
            return False
        return 2 <= int(digits) < self._next.get(lowered[:cut], 2)

    def allocate(self, name: str) -> str:
        """Reserve and return a unique spelling of ``name`` (validated first)."""
        validate_name(name)
        key = name.lower()
        if not self._used(key):
            self._taken.add(key)
            return name
        n = self._next.get(key, 2)
        while True:
            suffix = f"-{n}"
            n += 1
            # Names are ASCII (validated), so lowering the stem alone is lowering the whole.
            cut = len(name) + len(suffix) > MAX_NAME_LENGTH
            stem_len = MAX_NAME_LENGTH - len(suffix) if cut else len(name)
            candidate = name[:stem_len] + suffix
            lowered = key[:stem_len] + suffix
            # Not cut, ``key-n`` lies at or past its own range: only a name asked for
            # verbatim can hold it. A cut one may fall in a shorter stem's range.
            taken = self._used(lowered) if cut else lowered in self._taken
            if not taken:
                self._next[key] = n
                if cut:  # not of the form key-k: the range does not cover it
                    self._taken.add(lowered)
                return candidate
