"""subagents: a subagent orchestration runtime on anyio (asyncio and trio).

Spawn subagents fire-and-forget behind a concurrency limit and a watchdog, keep working,
and collect each one's :class:`DelegateResult` from a task-keyed :class:`Mailbox`.

The LLM tools live in :mod:`subagents.tools`, type aliases in :mod:`subagents.typing`,
test helpers in :mod:`subagents.testing`.
"""

from typing import TYPE_CHECKING

from ._backend import run_local
from ._budget import Budget
from ._completions import Completions
from ._context import RunContext
from ._envelope import DelegateResult, Status, Usage
from ._errors import (
    ConfigError,
    InvalidName,
    MailboxFull,
    RunnerReturnError,
    SpawnRejected,
    SubagentsError,
    TransientError,
    UnknownAgent,
    UnknownPeer,
    UnknownTask,
)
from ._events import Event, EventBus, EventStream
from ._handle import SpawnHandle
from ._jsonl import JsonlSink, read_events
from ._mailbox import BaseMailbox, Mailbox, MailboxStatistics
from ._manager import DEFAULT_SESSION, ManagerStatistics, SubagentManager
from ._messages import (
    DEFAULT_INBOX_CAPACITY,
    MAX_MESSAGE_CHARS,
    Activity,
    Message,
    PeerInfo,
    Receipt,
    Reply,
)
from ._notifier import CompletionNotifier
from ._paths import AgentPath
from ._permissions import Ruleset
from ._retry import RetryPolicy
from ._spec import AgentSpec, Request, Result, SpawnOptions, SubagentConfig

# Re-exported for code written before the tools had a package of their own; new code
# imports them from subagents.tools, where they are documented.
from .tools import Tool as Tool
from .tools import ToolResult as ToolResult
from .tools import Toolset as Toolset
from .tools import build_tools as build_tools

# The durable store edge registers its opener (SubagentConfig(store_path=...)) on import.
from . import store as store  # isort: skip

if not TYPE_CHECKING:
    # Old names that moved warn and still work; type checkers see only the new ones.
    # Python looks the module __getattr__ up by name (PEP 562): used, though never called.
    from ._moved import moved_attribute as __getattr__  # noqa: F401

__all__ = [
    # the manager
    "DEFAULT_SESSION",
    "Completions",
    "ManagerStatistics",
    "SpawnHandle",
    "SpawnOptions",
    "SubagentConfig",
    "SubagentManager",
    # agents and their runs
    "AgentPath",
    "AgentSpec",
    "Budget",
    "Request",
    "Result",
    "RetryPolicy",
    "RunContext",
    "Ruleset",
    "run_local",
    # results and their delivery
    "BaseMailbox",
    "CompletionNotifier",
    "DelegateResult",
    "Mailbox",
    "MailboxStatistics",
    "Status",
    "Usage",
    # messages between agents
    "DEFAULT_INBOX_CAPACITY",
    "MAX_MESSAGE_CHARS",
    "Activity",
    "Message",
    "PeerInfo",
    "Receipt",
    "Reply",
    # lifecycle events
    "Event",
    "EventBus",
    "EventStream",
    "JsonlSink",
    "read_events",
    # errors (the tree is drawn in subagents._errors)
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

# Objects name the module a user imports them from, not the private one defining them
# (reprs, pickles, tracebacks and error_type read __module__).
for _name in __all__:
    _object = globals()[_name]
    if hasattr(_object, "__qualname__"):
        _object.__module__ = __name__
del _name, _object
