"""Output schemas: what each tool's :attr:`ToolResult.details` holds, as JSON Schema
(draft 2020-12). MCP sends ``details`` as ``structuredContent`` and the schema as the
tool's ``outputSchema``; a client validates the first against the second.

Each schema is an object that is either the tool's answer or an error
(``{"error": code, ...}``): MCP clients skip validating error results, but a host reading
``details`` sees both. Objects list every property the tools produce and keep
``additionalProperties: true``, so a client written against this version keeps
validating when a later one adds a field; the tests check, with additional properties
forbidden, that the listed properties cover every ``details`` they see.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from .._json import JSONValue
from ._schema import SCHEMA_DIALECT

__all__ = ["ERROR_CODES", "output_schema"]

ERROR_CODES: Final = (
    "invalid_arguments",
    "unknown_tool",
    "unknown_agent",
    "unknown_task",
    "spawn_rejected",
    "unknown_peer",
    "internal",
)
"""The values of ``details["error"]`` of a failed call."""

_STR: Final[dict[str, JSONValue]] = {"type": "string"}
_INT: Final[dict[str, JSONValue]] = {"type": "integer"}
_COUNT: Final[dict[str, JSONValue]] = {"type": "integer", "minimum": 0}
_BOOL: Final[dict[str, JSONValue]] = {"type": "boolean"}
_STRS: Final[dict[str, JSONValue]] = {"type": "array", "items": {"type": "string"}}
_END: Final[list[JSONValue]] = ["completed", "error", "timeout", "cancelled"]
_TASK_STATUS: Final[dict[str, JSONValue]] = {
    "type": "string",
    "enum": ["queued", "running", "cancelling", "done", *_END],
}


def _object(
    properties: dict[str, JSONValue], required: Sequence[str], description: str | None = None
) -> dict[str, JSONValue]:
    names: list[JSONValue] = [name for name in required]
    out: dict[str, JSONValue] = {
        "type": "object",
        "properties": properties,
        "required": names,
        "additionalProperties": True,
    }
    if description is not None:
        out["description"] = description
    return out


_ENVELOPE_PROPERTIES: Final[dict[str, JSONValue]] = {
    "agent": _STR,
    "task_id": _STR,
    "status": {"type": "string", "enum": _END},
    "output": _STR,
    "files_changed": _STRS,
    "error": _STR,
    "error_type": _STR,
    "duration_ms": _COUNT,
    "queue_ms": _COUNT,
    "iterations": _COUNT,
    "attempts": _COUNT,
    "usage": _object({"input_tokens": _COUNT, "output_tokens": _COUNT}, []),
    "tree_usage": _object(
        {"input_tokens": _COUNT, "output_tokens": _COUNT},
        [],
        "Usage of the task and every subagent below it (omitted when equal to usage).",
    ),
    "timestamp_ms": _INT,
    "agent_path": _STR,
    "parent_path": _STR,
}
_ENVELOPE_REQUIRED: Final = ["agent", "task_id", "status", "duration_ms", "iterations", "usage"]


def _envelope(extra: dict[str, JSONValue], description: str) -> dict[str, JSONValue]:
    return _object({**_ENVELOPE_PROPERTIES, **extra}, [*_ENVELOPE_REQUIRED, *extra], description)


_BUDGET: Final = _object(
    {
        "tokens": _COUNT,
        "input_tokens": _COUNT,
        "output_tokens": _COUNT,
        "spawns": _COUNT,
        "time_ms": _COUNT,
    },
    [],
    "What this session's agent has left to spend (only the limited fields; absent "
    "without a budget).",
)

_PENDING: Final = _object(
    {
        "task_id": _STR,
        "agent": _STR,
        "agent_path": _STR,
        "status": _TASK_STATUS,
        "elapsed_ms": _COUNT,
    },
    ["task_id", "agent", "agent_path", "status", "elapsed_ms"],
)

_MESSAGE: Final = _object(
    {
        "id": _STR,
        "from": _STR,
        "to": _STR,
        "body": _STR,
        "reply_to": _STR,
        "subject": _STR,
        "created_ms": _INT,
    },
    ["id", "from", "to", "body", "created_ms"],
    "One message; reply_to is the id of the message it answers; subject only on one "
    "from a bridged room.",
)
_RECEIPT_STATE: Final[dict[str, JSONValue]] = {
    "type": "string",
    "enum": ["queued", "delivered", "read", "replied", "failed"],
}
_RECEIPT: Final = _object(
    {
        "message_id": _STR,
        "to": _STR,
        "state": _RECEIPT_STATE,
        "delivery": {"type": "string", "enum": ["injected", "woken", "revived"]},
        "reason": {"type": "string", "enum": ["unknown", "ended", "full", "closed"]},
        "detail": _STR,
        "task_id": _STR,
    },
    ["message_id", "to", "state"],
    "What became of the message for one recipient.",
)

_ERROR: Final = _object(
    {
        "error": {"type": "string", "enum": list(ERROR_CODES)},
        "field": _STR,
        "agent": _STR,
        "known": _STRS,
        "task_id": _STR,
        "task_ids": _STRS,
        "suggestions": _STRS,
        "reason": _STR,
        "error_type": _STR,
        "tools": _STRS,
    },
    ["error"],
    "A failed call (is_error): the error code and what it is about.",
)

_ANSWERS: Final[dict[str, dict[str, JSONValue]]] = {
    "spawn_agent": _object(
        {
            "task_id": _STR,
            "agent": _STR,
            "agent_path": _STR,
            "status": _TASK_STATUS,
            "existing": _BOOL,
            "queue_position": _COUNT,
            "concurrency_limit": _COUNT,
            "running": _COUNT,
            "queued": _COUNT,
            "budget": _BUDGET,
        },
        [
            "task_id",
            "agent",
            "agent_path",
            "status",
            "existing",
            "queue_position",
            "concurrency_limit",
            "running",
            "queued",
        ],
        "The spawned task: its id (for wait_agent) and where it stands (a new task is "
        "running or queued; existing: an earlier call with the same idempotency_key "
        "started it, and status is its status now).",
    ),
    "wait_agent": _object(
        {
            "completed": _BOOL,
            "timed_out": _BOOL,
            "session_closed": _BOOL,
            "mode": {"type": "string", "enum": ["all", "any"]},
            "timeout_ms": _COUNT,
            "requested_timeout_ms": _COUNT,
            "clamped": _BOOL,
            "waited_ms": _COUNT,
            "results": {
                "type": "array",
                "items": _envelope(
                    {"already_collected": _BOOL}, "A finished task's full envelope."
                ),
            },
            "pending": {"type": "array", "items": _PENDING},
            "deferred": _STRS,
            "task_id": _STR,
            "budget": _BUDGET,
        },
        [
            "completed",
            "timed_out",
            "session_closed",
            "mode",
            "timeout_ms",
            "clamped",
            "waited_ms",
            "results",
            "pending",
            "deferred",
        ],
        "What the wait collected (results), what is still running (pending) and the "
        "finished results kept for a later call (deferred).",
    ),
    "delegate_to_agent": _object(
        {
            "task_id": _STR,
            "status": {"type": "string", "enum": _END},
            "timeout_ms": {"type": ["integer", "null"], "minimum": 0},
            "requested_timeout_ms": _COUNT,
            "clamped": _BOOL,
            "envelope": _envelope({}, "The delegated task's full envelope (envelope mode)."),
            "budget": _BUDGET,
        },
        ["task_id", "status", "timeout_ms", "clamped"],
        "How the delegated task ended; its envelope unless the return mode is string.",
    ),
    "cancel_agent": _object(
        {
            "task_id": _STR,
            "previous_status": _TASK_STATUS,
            "status": _TASK_STATUS,
            "cancel_requested": _BOOL,
        },
        ["task_id", "previous_status", "status", "cancel_requested"],
        "The task's status before and after the request.",
    ),
    "list_agents": _object(
        {
            "agents": {
                "type": "array",
                "items": _object({"name": _STR, "description": _STR}, ["name", "description"]),
            },
            "tasks": {
                "type": "array",
                "items": _object(
                    {
                        "task_id": _STR,
                        "agent": _STR,
                        "agent_path": _STR,
                        "status": _TASK_STATUS,
                        "elapsed_ms": _COUNT,
                        "result_waiting": _BOOL,
                        "unread": _COUNT,
                    },
                    ["task_id", "agent", "agent_path", "status", "elapsed_ms", "result_waiting"],
                ),
            },
            "looked_in": {
                **_STRS,
                "description": "Where the subagents were looked for: memory, and the "
                "store's file if the manager has one.",
            },
            "unread": {
                **_COUNT,
                "description": "Messages waiting in your own inbox (read_messages).",
            },
        },
        ["agents", "tasks"],
        "The registered agent types and this session's subagents.",
    ),
    "send_message": _object(
        {
            "message_id": _STR,
            "receipts": {"type": "array", "items": _RECEIPT},
            "reply": _MESSAGE,
            "reply_outcome": {
                "type": "string",
                "enum": ["replied", "timeout", "unknown", "ended", "full", "closed"],
            },
            "await_ms": _COUNT,
            "clamped": _BOOL,
            "room_recipients": _COUNT,
        },
        ["message_id", "receipts"],
        "One receipt per recipient (state, how it was delivered, why it failed); with "
        "await_reply_ms, the reply or why none came; room_recipients, for a send to a "
        "bridged room, the members its commit reached (0: stored for the room's history "
        "only, the receipt failed unknown).",
    ),
    "send_input": _object(
        {"message_id": _STR, "receipt": _RECEIPT},
        ["message_id", "receipt"],
        "The input's receipt (queued for the subagent, or failed: ended, full).",
    ),
    "read_messages": _object(
        {
            "messages": {"type": "array", "items": _MESSAGE},
            "peeked": _BOOL,
            "left": _COUNT,
            "wait_ms": _COUNT,
            "clamped": _BOOL,
        },
        ["messages", "peeked", "left"],
        "The messages read (or peeked), oldest first, and how many are still waiting.",
    ),
}


def output_schema(tool: str) -> dict[str, JSONValue]:
    """The JSON Schema of ``details`` of ``tool``: its answer or an error.

    Raises:
        KeyError: ``tool`` is not one of the tools.
    """
    return {
        "$schema": SCHEMA_DIALECT,
        "type": "object",
        "anyOf": [_ANSWERS[tool], _ERROR],
    }
