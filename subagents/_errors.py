"""The exception tree of ``subagents``.

Every exception the library raises on purpose derives from :class:`SubagentsError`::

    SubagentsError
    ├── ConfigError(SubagentsError, ValueError)      a setting or argument is out of range
    ├── InvalidName(SubagentsError, ValueError)      an agent-path segment is malformed
    ├── UnknownAgent(SubagentsError, LookupError)    no agent type registered under that name
    ├── UnknownTask(SubagentsError, LookupError)     no task with that id (names close matches)
    ├── UnknownPeer(SubagentsError, LookupError)     no agent at a message's address (likewise)
    ├── SpawnRejected(SubagentsError)                depth limit, closed session, closed manager,
    │                                                an idempotency key held by another spawn
    ├── MailboxFull(SubagentsError)                  a new key beyond the mailbox capacity
    ├── RunnerReturnError(SubagentsError, TypeError) a runner returned no Result (or str),
    │                                                or one with a field of the wrong type
    ├── StoreError(SubagentsError)                   subagents.store: the durable store cannot
    │                                                open, read or write its file (``reason``)
    ├── UnknownMember(SubagentsError, LookupError)   subagents.room: no member with that id
    │                                                (names the id probably meant)
    └── LeaseNotHeld(SubagentsError, LookupError)    subagents.room: a renew of a lease the
                                                     member does not hold

    TransientError(Exception)                        raised by runners, never by the library

``TransientError`` stands apart on purpose: runners raise it (or a subclass) to mark a
failure worth retrying under the agent's :class:`~subagents.RetryPolicy`, so an
``except SubagentsError`` meant for the library's refusals never catches a runner's own
failure. ``RunnerReturnError`` is raised inside a child (by :func:`~subagents.run_local`)
and ends up in its envelope, as ``error_type`` ``subagents.RunnerReturnError``.
``StoreError`` is defined by the store package (an edge the core never imports), so it is
imported from ``subagents.store``; ``UnknownMember`` and ``LeaseNotHeld`` likewise from
``subagents.room``.

Messages are built in ``__init__`` from the data, which stays available on attributes.
They speak to the programmer who called the library; what a model should do about an error
is the tools' to say: they turn each exception into a tool result with a hint of their own
(keyed on the attributes, e.g. ``SpawnRejected.reason``).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from typing import Final

__all__ = [
    "ConfigError",
    "InvalidName",
    "MailboxFull",
    "RunnerReturnError",
    "SpawnRejected",
    "SubagentsError",
    "TransientError",
    "UnknownAgent",
    "UnknownPeer",
    "UnknownTask",
]


_SHOWN_CHARS: Final = 100
"""A name or id given by a caller (a model) is quoted in a message up to this length."""
_LISTED_AGENTS: Final = 10
"""An unknown-agent message lists all registered agents up to this many."""
_NAME_CHARS: Final = 64
"""The longest agent name (``MAX_NAME_LENGTH`` of ``_paths``, which imports this module)."""


def _shown(value: object) -> str:
    """``repr(value)``, cut to ``_SHOWN_CHARS``: a huge bogus id never floods a message, and
    a value whose ``repr`` fails (a hostile ``__repr__``, ``10**5000`` past Python's digit
    limit) is named by its type instead of losing the error."""
    try:
        text = str.__str__(repr(value))
    except Exception:
        return f"<unprintable {type(value).__name__}>"
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 1] + "…"


class SubagentsError(Exception):
    """Base class of every error raised by ``subagents``."""


class ConfigError(SubagentsError, ValueError):
    """A configuration value or argument is invalid.

    Attributes:
        field: the name of the offending setting.
        expected: what would have been accepted.
        got: the value that was given.
    """

    def __init__(self, field: str, expected: str, got: object) -> None:
        self.field = field
        self.expected = expected
        self.got = got
        super().__init__(f"{field} must be {expected}, got {_shown(got)}")


class InvalidName(SubagentsError, ValueError):
    """An agent-path segment is empty, too long or uses a forbidden character."""

    def __init__(self, name: object, reason: str) -> None:
        self.name = name
        self.reason = reason
        super().__init__(f"invalid agent name {name!r}: {reason}")


class UnknownAgent(SubagentsError, LookupError):
    """No agent type is registered under the requested name.

    The message names every registered agent when there are at most ten, else their count
    and the closest few names, so it stays short with any number of agents.

    Attributes:
        name: the name that was asked for.
        known: the registered names, sorted.
        suggestions: the registered names closest to ``name``, best first (at most 3).
    """

    def __init__(self, name: str, known: Iterable[str]) -> None:
        self.name = name
        self.known = tuple(sorted(known))
        self.suggestions = tuple(_closest_names(name, self.known))
        if not self.known:
            listed = "no agents are registered"
        elif len(self.known) <= _LISTED_AGENTS:
            listed = "registered agents: " + ", ".join(self.known)
        else:
            listed = f"{len(self.known)} agents are registered"
            if self.suggestions:
                listed += "; the closest: " + ", ".join(self.suggestions)
            else:
                listed += ", none with a similar name (SubagentManager.agents lists them)"
        super().__init__(f"unknown agent {_shown(name)}; {listed}")


def _closest_names(name: object, known: Sequence[str], n: int = 3) -> list[str]:
    """Up to ``n`` of ``known`` that ``name`` was probably meant to be, best first: the
    same name in another case, then names it begins (or that begin with it), then by
    similarity (difflib; the registry is small)."""
    if not isinstance(name, str) or not known:
        return []
    # Agent names are short path segments: a longer query cannot be close to one, and
    # cutting it keeps difflib's cost bounded whatever a caller sends.
    needle = name[: 2 * _NAME_CHARS].lower()
    if not needle:
        return []
    by_lower: dict[str, str] = {}
    for candidate in known:
        by_lower.setdefault(candidate.lower(), candidate)
    close = [needle] if needle in by_lower else []
    close += [c for c in by_lower if c != needle and (c.startswith(needle) or needle.startswith(c))]
    if len(close) < n:
        close += difflib.get_close_matches(needle, list(by_lower), n=n, cutoff=0.6)
    return [by_lower[c] for c in dict.fromkeys(close)][:n]


class UnknownTask(SubagentsError, LookupError):
    """No task with the given id is known to the manager.

    Attributes:
        task_id: the id that was asked for.
        suggestions: known ids that look like the one meant (prefix, case, truncation).
        detail: an extra sentence, e.g. that the id belongs to another session.
    """

    def __init__(self, task_id: str, suggestions: Sequence[str] = (), detail: str = "") -> None:
        self.task_id = task_id
        self.suggestions = tuple(suggestions)
        self.detail = detail
        message = f"unknown task id {_shown(task_id)}"
        if self.suggestions:
            message += "; did you mean " + ", ".join(repr(s) for s in self.suggestions) + "?"
        if detail:
            message += (" " if self.suggestions else ". ") + detail
        super().__init__(message)


class UnknownPeer(SubagentsError, LookupError):
    """No agent answers to a message's address.

    Attributes:
        address: the address that was given.
        suggestions: the addresses (task ids, agent paths) probably meant, best first.
        hint: what the address looks like when it is not of this tree (a room member's
            id with no room bridged), added to the message.
    """

    def __init__(self, address: str, suggestions: Sequence[str] = (), hint: str = "") -> None:
        self.address = address
        self.suggestions = tuple(suggestions)
        message = f"no agent at address {_shown(address)}"
        if self.suggestions:
            message += "; did you mean " + ", ".join(repr(s) for s in self.suggestions) + "?"
        elif not hint:
            message += " (an address is a task id, an agent path, or '*' for every live peer)"
        if hint:
            message += f"; {hint}"
        super().__init__(message)


class SpawnRejected(SubagentsError):
    """A spawn was refused before any work started.

    The message says why, for a programmer; the tools add what a model should do instead,
    keyed on ``reason``.

    Attributes:
        reason: a short machine-readable reason (``depth``, ``session_closed``,
            ``manager_closed``, ``idempotency_conflict``: the key is held by a spawn of
            another agent or input, ``idempotency_pending``: by a spawn another process
            has not finished).
        task_id: the task the refusal is about (the one holding the key), or ``None``.
    """

    def __init__(self, reason: str, message: str, *, task_id: str | None = None) -> None:
        self.reason = reason
        self.task_id = task_id
        super().__init__(message)


class MailboxFull(SubagentsError):
    """A new task id was put into a mailbox already holding ``capacity`` entries."""

    def __init__(self, capacity: int, task_id: str) -> None:
        self.capacity = capacity
        self.task_id = task_id
        super().__init__(
            f"mailbox full ({capacity} unread results); cannot store result of task {task_id!r}"
        )


class RunnerReturnError(SubagentsError, TypeError):
    """A runner returned something other than ``Result`` or ``str``, or a ``Result`` whose
    fields have the wrong types.

    Attributes:
        agent: the agent whose runner returned it.
        detail: what came back and what was expected.
    """

    def __init__(self, agent: str, detail: str) -> None:
        self.agent = agent
        self.detail = detail
        super().__init__(f"runner of agent {agent!r} returned {detail}")


class TransientError(Exception):
    """Raised by a runner to mark a failure that is worth retrying.

    Only failures of this type (or the types named in a :class:`~subagents.RetryPolicy`)
    are retried; everything else ends the child with ``status=error`` at once.
    """
