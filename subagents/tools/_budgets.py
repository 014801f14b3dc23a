"""Budgets as the tools speak of them: the ``budget`` argument of ``spawn_agent`` and
``delegate_to_agent`` (times in milliseconds, as every tool argument), and what a
session has left, reported in their answers so a model can plan with it."""

from __future__ import annotations

from typing import Final

from .._account import remaining
from .._budget import Budget
from .._handle import SpawnHandle, record_of
from .._json import JSONValue
from .._manager import SubagentManager, budgets_of
from ._schema import Param, ms

__all__ = ["BUDGET", "budget_arg", "budget_field", "budget_left", "budget_sentence"]

_TOKENS: Final = "tokens"

BUDGET: Final = Param(
    name="budget",
    kind="object",
    description="Optional limits for the subagent and everything it delegates, within "
    "what you have left (larger values are lowered to that): tokens (input plus output), "
    "input_tokens, output_tokens, spawns (subagents it may start, every depth) and "
    "time_ms (wall time from its start). Past a token budget it is stopped and ends "
    "with error_type BudgetExceeded; past its time it ends with status timeout.",
    fields=(
        Param(name="tokens", kind="integer", description="Input plus output tokens."),
        Param(name="input_tokens", kind="integer", description="Input tokens."),
        Param(name="output_tokens", kind="integer", description="Output tokens."),
        Param(name="spawns", kind="integer", description="Subagents it may start."),
        Param(
            name="time_ms", kind="integer", minimum=1, description="Milliseconds from its start."
        ),
    ),
)


def budget_arg(value: object) -> Budget | None:
    """The :class:`Budget` of a checked ``budget`` argument (``None`` when omitted)."""
    if not isinstance(value, dict):
        return None
    time_ms = value.get("time_ms")
    return Budget(
        tokens=value.get("tokens"),
        input_tokens=value.get("input_tokens"),
        output_tokens=value.get("output_tokens"),
        spawns=value.get("spawns"),
        seconds=None if not isinstance(time_ms, int) else time_ms / 1000,
    )


def budget_left(
    manager: SubagentManager, session_id: str, owner: SpawnHandle | None
) -> dict[str, JSONValue] | None:
    """What the agent of ``session_id`` (its ``owner``, or the root session) has left,
    in the tools' units; ``None`` when no budget limits it."""
    account = (
        budgets_of(manager).session_budget(session_id)
        if owner is None
        else record_of(owner).account
    )
    left = remaining(account)
    if left.unlimited:
        return None
    out: dict[str, JSONValue] = {}
    for name in ("tokens", "input_tokens", "output_tokens", "spawns"):
        value = getattr(left, name)
        if value is not None:
            out[name] = value
    if left.seconds is not None:
        out["time_ms"] = ms(left.seconds)
    return out


def budget_field(left: dict[str, JSONValue] | None) -> dict[str, JSONValue]:
    """``{"budget": left}`` for an answer's details, or ``{}`` without a budget."""
    return {} if left is None else {"budget": left}


def budget_sentence(left: dict[str, JSONValue] | None) -> str:
    """`` Your budget left: 12,000 tokens, 3 spawns.`` (empty without a budget)."""
    if not left:
        return ""
    words = {
        _TOKENS: "tokens",
        "input_tokens": "input tokens",
        "output_tokens": "output tokens",
        "spawns": "spawns",
        "time_ms": "ms",
    }
    parts = [f"{value:,} {words[name]}" for name, value in left.items()]
    return " Your budget left: " + ", ".join(parts) + "."
