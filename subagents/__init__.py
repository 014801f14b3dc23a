"""subagents: a subagent orchestration runtime on anyio (asyncio and trio).

Spawn subagents fire-and-forget behind a concurrency limit and a watchdog, keep working,
and collect each one's :class:`DelegateResult` from a task-keyed :class:`Mailbox`.
"""

from ._backend import Backend, RunnerReturnError, run_local
from ._context import RunContext
from ._envelope import DelegateResult, Status, Usage
from ._errors import (
    ConfigError,
    InvalidName,
    MailboxFull,
    SpawnRejected,
    SubagentsError,
    TransientError,
    UnknownAgent,
    UnknownTask,
)
from ._events import Event, EventBus, EventStream
from ._handle import SpawnHandle
from ._jsonl import JsonlSink, read_events
from ._mailbox import BaseMailbox, Mailbox, MailboxStatistics
from ._manager import DEFAULT_SESSION, ManagerStatistics, SubagentManager
from ._notifier import CompletionNotifier
from ._paths import AgentPath
from ._permissions import Ruleset
from ._retry import RetryPolicy
from ._spec import AgentSpec, Request, Result, Runner, SpawnOptions, SubagentConfig
from ._tool_wait import Completions
from ._tools import (
    NO_HOST_TIMEOUT_WAIT_CAP,
    WAIT_MARGIN_MIN,
    WAIT_MARGIN_RATIO,
    Tool,
    ToolLimits,
    ToolResult,
    Toolset,
    build_tools,
    wait_margin,
)

__all__ = [
    "DEFAULT_SESSION",
    "NO_HOST_TIMEOUT_WAIT_CAP",
    "WAIT_MARGIN_MIN",
    "WAIT_MARGIN_RATIO",
    "AgentPath",
    "AgentSpec",
    "Backend",
    "BaseMailbox",
    "CompletionNotifier",
    "Completions",
    "ConfigError",
    "DelegateResult",
    "Event",
    "EventBus",
    "EventStream",
    "InvalidName",
    "JsonlSink",
    "Mailbox",
    "MailboxFull",
    "MailboxStatistics",
    "ManagerStatistics",
    "Request",
    "Result",
    "RetryPolicy",
    "RunContext",
    "Runner",
    "RunnerReturnError",
    "Ruleset",
    "SpawnHandle",
    "SpawnOptions",
    "SpawnRejected",
    "Status",
    "SubagentConfig",
    "SubagentManager",
    "SubagentsError",
    "Tool",
    "ToolLimits",
    "ToolResult",
    "Toolset",
    "TransientError",
    "UnknownAgent",
    "UnknownTask",
    "Usage",
    "build_tools",
    "read_events",
    "run_local",
    "wait_margin",
]
