"""Restrict-only permissions: which tools an agent may use."""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase

import attrs

__all__ = ["Ruleset"]


def _patterns(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):  # a bare string is one pattern, not its characters
        return (value,)
    return tuple(value)


@attrs.frozen(kw_only=True)
class Ruleset:
    """Allow and deny patterns (``fnmatch`` style, case-sensitive) over tool names.

    A tool is allowed when it matches an ``allow`` pattern, matches no ``deny`` pattern,
    and is allowed by ``within`` (the parent's ruleset) if there is one. Deny wins.
    ``child & parent`` (or ``child.intersect(parent)``) is never broader than either side:
    this is how a child inherits its parent's limits.
    """

    allow: tuple[str, ...] = attrs.field(default=("*",), converter=_patterns)
    """Patterns of allowed tool names; ``("*",)`` allows everything."""
    deny: tuple[str, ...] = attrs.field(default=(), converter=_patterns)
    """Patterns of denied tool names; they override ``allow``."""
    within: Ruleset | None = None
    """An outer ruleset that must also allow the tool (set by :meth:`intersect`)."""

    @classmethod
    def allow_all(cls) -> Ruleset:
        """A ruleset that allows every tool."""
        return _ALLOW_ALL

    @classmethod
    def deny_all(cls) -> Ruleset:
        """A ruleset that allows no tool."""
        return cls(allow=())

    def allows(self, tool: str) -> bool:
        """True when ``tool`` is permitted by this ruleset and every outer one."""
        rules: Ruleset | None = self
        while rules is not None:
            if not any(fnmatchcase(tool, p) for p in rules.allow):
                return False
            if any(fnmatchcase(tool, p) for p in rules.deny):
                return False
            rules = rules.within
        return True

    def filter(self, tools: Iterable[str]) -> list[str]:
        """The names in ``tools`` that this ruleset allows, in order."""
        return [t for t in tools if self.allows(t)]

    def intersect(self, other: Ruleset) -> Ruleset:
        """A ruleset allowing exactly what both ``self`` and ``other`` allow."""
        if other is _ALLOW_ALL:
            return self
        if self is _ALLOW_ALL:
            return other
        inner = other if self.within is None else self.within.intersect(other)
        return attrs.evolve(self, within=inner)

    def __and__(self, other: Ruleset) -> Ruleset:
        return self.intersect(other)


_ALLOW_ALL = Ruleset()
