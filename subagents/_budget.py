"""Budget: what a delegation tree may spend (tokens, seconds, spawns). A record only; the
accounting (carving, charging, stopping) is :mod:`._ledger`'s."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from ._errors import ConfigError
from ._json import JSONValue
from ._validators import count, seconds

__all__ = ["BUDGET_FIELDS", "Budget"]

BUDGET_FIELDS: Final = ("tokens", "input_tokens", "output_tokens", "seconds", "spawns")


def _check_count(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    plain = count(f"budget.{attribute.name}", value, minimum=0, none_ok=True)
    if plain is not value:  # keep the plain int, not a subclass whose methods run later
        object.__setattr__(instance, attribute.name, plain)


def _check_seconds(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    plain = seconds(f"budget.{attribute.name}", value, none_ok=True, zero_ok=True)
    if plain is not value:
        object.__setattr__(instance, attribute.name, plain)


def _least(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else min(a, b)


@attrs.frozen(kw_only=True)
class Budget:
    """What a subagent and everything it delegates, together, may spend.

    Every field left ``None`` is unlimited. A child's budget is carved out of what its
    ancestors have left (restrict-only: never more than any of them has), and what it
    spends is charged to each of them too. See design/budgets.md.
    """

    tokens: int | None = attrs.field(default=None, validator=_check_count)
    """Input plus output tokens (>= 0)."""
    input_tokens: int | None = attrs.field(default=None, validator=_check_count)
    """Input tokens (>= 0)."""
    output_tokens: int | None = attrs.field(default=None, validator=_check_count)
    """Output tokens (>= 0)."""
    seconds: float | None = attrs.field(default=None, validator=_check_seconds)
    """Wall time in seconds (>= 0), counted from the start of the agent that holds it (a
    session's from :meth:`SubagentManager.open_session`): no agent of the tree runs past
    it."""
    spawns: int | None = attrs.field(default=None, validator=_check_count)
    """Children the tree may spawn in all, every depth counted (>= 0)."""

    @property
    def unlimited(self) -> bool:
        """True when no field sets a limit."""
        return (
            self.tokens is None
            and self.input_tokens is None
            and self.output_tokens is None
            and self.seconds is None
            and self.spawns is None
        )

    def intersect(self, other: Budget | None) -> Budget:
        """The tighter of the two in every field (``None`` is no limit)."""
        if other is None:
            return self
        return Budget(
            tokens=_least(self.tokens, other.tokens),
            input_tokens=_least(self.input_tokens, other.input_tokens),
            output_tokens=_least(self.output_tokens, other.output_tokens),
            seconds=_least(self.seconds, other.seconds),
            spawns=_least(self.spawns, other.spawns),
        )

    def to_dict(self) -> dict[str, JSONValue]:
        """The limited fields only, e.g. ``{"tokens": 50000}``."""
        values = {name: getattr(self, name) for name in BUDGET_FIELDS}
        return {name: value for name, value in values.items() if value is not None}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Budget:
        """Inverse of :meth:`to_dict`; a missing key is unlimited.

        Raises:
            ConfigError: an unknown key, or a value out of range (naming the field).
        """
        for key in data:
            if key not in BUDGET_FIELDS:
                raise ConfigError("budget", "an object of " + ", ".join(BUDGET_FIELDS), key)
        return cls(**{k: v for k, v in data.items() if v is not None})  # type: ignore[arg-type]


def check_budget(_: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    """attrs validator of an optional :class:`Budget` field."""
    if value is not None and not isinstance(value, Budget):
        raise ConfigError(attribute.name, "a Budget or None", value)
