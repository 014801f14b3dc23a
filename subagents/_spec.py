"""Records users hand to the runtime: agent types, requests, results, options, config."""

from __future__ import annotations

import enum
import functools
import inspect
import os
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, TypeAlias

import attrs

from ._budget import Budget, check_budget
from ._envelope import DEFAULT_TRUNCATE_CHARS, Status, Usage, encodes, plain_str
from ._errors import ConfigError
from ._mailbox import DEFAULT_MAILBOX_CAPACITY
from ._messages import DEFAULT_INBOX_CAPACITY
from ._paths import validate_name
from ._permissions import Ruleset
from ._retry import RetryPolicy
from ._validators import count, seconds

if TYPE_CHECKING:
    # An import back up the graph, for annotations only: a runner takes a RunContext.
    from ._context import RunContext
    from ._messages import Message

__all__ = [
    "DEFAULT_MAX_CONCURRENT_SPAWNS",
    "DEFAULT_MAX_DEPTH",
    "DEFAULT_SPAWN_TIMEOUT",
    "AgentSpec",
    "Durability",
    "Request",
    "Resume",
    "Result",
    "Runner",
    "SpawnOptions",
    "SubagentConfig",
]

DEFAULT_MAX_CONCURRENT_SPAWNS: Final = 4
DEFAULT_SPAWN_TIMEOUT: Final = 180.0
DEFAULT_MAX_DEPTH: Final = 3


class _Unset(enum.Enum):
    """The type of :data:`UNSET`: an argument that was not given.

    ``None`` already means "no limit" for a timeout, so "not given" (use the configured
    default) needs a value of its own. An enum of one member, because mypy narrows
    ``x is UNSET`` for enum members (and not for an instance of a plain class), and a copy
    or an unpickled value stays the same object.
    """

    UNSET = "UNSET"

    def __repr__(self) -> str:
        return "UNSET"  # what signatures and help() show as the default


UNSET: Final = _Unset.UNSET
"""Default of ``timeout`` arguments meaning "not given": the configured default applies."""


def _str_tuple(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    return tuple(value)


@attrs.frozen(kw_only=True)
class Request:
    """What a runner is asked to do."""

    agent: str
    """The agent type's name."""
    input: str = ""
    """The task text."""
    prompt: str | None = None
    """System prompt: the spawn's override, else the agent type's."""
    files: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    """Paths of files handed to the agent."""
    model: str | None = None
    """Model for this run: the spawn's override, else the agent type's (``None``: neither)."""


@attrs.frozen(kw_only=True)
class Result:
    """What a runner returns (a plain ``str`` is wrapped as ``Result(output=...)``)."""

    output: str = ""
    """Final text output."""
    usage: Usage = attrs.field(default=Usage())  # frozen: one shared empty Usage
    """Tokens this run used (not its children's)."""
    iterations: int = 0
    """Iterations (model turns, steps) taken."""
    files_changed: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    """Paths the agent changed."""
    error: str = ""
    """A failure reported without raising; makes the status ``error``."""
    status: Status | None = attrs.field(default=None, converter=attrs.converters.optional(Status))
    """Explicit status; ``None`` means ``error`` if ``error`` is set, else ``completed``."""


Runner: TypeAlias = "Callable[[Request, RunContext], Awaitable[Result | str]]"
"""``async def runner(request, ctx) -> Result | str``: the user's code that does the work."""


def _check_name(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    validate_name(value)


def _keep_plain(instance: object, attribute: attrs.Attribute[Any], given: Any, plain: Any) -> None:
    # A record keeps the plain number the validator made of a value: a subclass's methods
    # (its __format__, its __add__) would otherwise run later, where nothing can blame it.
    if plain is not given:
        object.__setattr__(instance, attribute.name, plain)


def _check_timeout(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    _keep_plain(
        instance, attribute, value, seconds(attribute.name, value, none_ok=True, zero_ok=False)
    )


def _is_coroutine_callable(value: object) -> bool:
    """Whether calling ``value`` runs an ``async def``: a coroutine function or method,
    an object whose class's ``__call__`` is one, or a ``functools.partial`` of either.
    (On Python 3.12+ ``inspect.markcoroutinefunction`` marks any other callable as one.)"""
    while isinstance(value, functools.partial):
        value = value.func
    if inspect.iscoroutinefunction(value):
        return True
    # Not callable(): the class's __call__ itself is needed, to ask whether it is async.
    call = getattr(type(value), "__call__", None)  # noqa: B004
    return not isinstance(value, type) and inspect.iscoroutinefunction(call)


_RUNNER_EXPECTED: Final = (
    "an async function, `async def runner(request, ctx)`; to use a plain function, wrap it: "
    "`async def runner(request, ctx): return fn(request, ctx)`, or, if it blocks, "
    "`return await anyio.to_thread.run_sync(fn, request, ctx)`"
)


def _check_runner(_: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    # A plain def would only fail when the child runs (its result cannot be awaited):
    # refuse it here, where the mistake is made, with the fix in the message.
    if not _is_coroutine_callable(value):
        raise ConfigError(attribute.name, _RUNNER_EXPECTED, value)


Resume: TypeAlias = Literal["interrupt", "rerun"]
"""What a restart does with a journaled spawn of an agent that an ended process left
unfinished: ``"interrupt"`` ends it in an ``Interrupted`` error envelope, ``"rerun"``
runs it again (up to :attr:`AgentSpec.max_attempts` tries in all)."""

Durability: TypeAlias = Literal["sync", "async"]
"""When a manager on a store hands an envelope on: ``"sync"`` once it is committed,
``"async"`` at once, the commit following in the writer's next batch."""


def _one_of(*choices: str) -> Callable[[object, attrs.Attribute[Any], Any], None]:
    def check(_: object, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value not in choices:
            raise ConfigError(attribute.name, " or ".join(repr(c) for c in choices), value)

    return check


def _check_attempts(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    _check_positive_int(instance, attribute, value)


Responder: TypeAlias = "Callable[[Message, RunContext], Awaitable[str | None]]"
"""``async def responder(message, ctx) -> str | None``: an agent's ``on_message``."""


def _check_bool(_: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(attribute.name, "True or False", value)


def _check_responder(_: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not _is_coroutine_callable(value):
        raise ConfigError(
            attribute.name, "None or an async function `async def f(message, ctx)`", value
        )


@attrs.frozen(kw_only=True)
class AgentSpec:
    """A registered agent type.

    The runner does the work (an LLM loop, a subprocess, a function); the library never
    assumes which. It must be a coroutine function (``async def``), a callable
    object whose ``__call__`` is one, or a ``functools.partial`` of those; anything else
    is a :class:`ConfigError` at construction (wrap a plain function in an ``async def``,
    with ``anyio.to_thread.run_sync`` if it blocks).
    """

    name: str = attrs.field(validator=_check_name)
    """Unique name models use to pick this agent (a valid path segment)."""
    runner: Runner = attrs.field(validator=_check_runner)
    """``async def runner(request, ctx) -> Result | str`` (a coroutine function)."""
    description: str = ""
    """What this agent is good at, written for a model choosing among agents."""
    model: str | None = None
    """Default model id (reported in traces)."""
    provider: str | None = None
    """Model provider name (reported in traces as ``gen_ai.provider.name``; ``"subagents"``
    when not given)."""
    prompt: str | None = None
    """Default system prompt, passed to the runner in :class:`Request`."""
    permissions: Ruleset = attrs.field(factory=Ruleset.allow_all)
    """The tools this agent may use; intersected with its parent's at run time."""
    retry: RetryPolicy | None = None
    """Retry policy for transient failures; ``None`` runs once."""
    timeout: float | None = attrs.field(default=None, validator=_check_timeout)
    """Default watchdog for this agent in seconds; ``None`` uses the manager's."""
    resume: Resume = attrs.field(default="interrupt", validator=_one_of("interrupt", "rerun"))
    """With a durable store, what a restart does with a spawn of this agent that an ended
    process left unfinished: ``"interrupt"`` (an ``Interrupted`` error envelope) or
    ``"rerun"`` (run it again, in the manager that recovers it)."""
    max_attempts: int = attrs.field(default=3, validator=_check_attempts)
    """With ``resume="rerun"``: the tries a spawn gets in all, the first included; a spawn
    whose processes ended this many times ends in an ``Interrupted`` error envelope
    instead of running again (a task that kills its process is not retried forever)."""
    budget: Budget | None = attrs.field(default=None, validator=check_budget)
    """What a child of this agent and its subtree may spend; a spawn's own budget and
    what its ancestors have left can only narrow it (design/budgets.md)."""
    resumable: bool = attrs.field(default=False, validator=_check_bool)
    """Whether a message sent to an ended child of this agent revives it: one follow-up
    run under a new task id, whose input is the message and whose
    :attr:`RunContext.previous` is the ended run's envelope (design/messaging.md). A
    broadcast never revives."""
    on_message: Responder | None = attrs.field(default=None, validator=_check_responder)
    """``async def responder(message, ctx) -> str | None``: answers a message whose sender
    awaits a reply (``ask``) while the runner is busy (not waiting in ``recv``), on the
    side, before the sender's timeout; a string is sent back as the reply, ``None`` sends
    none. Each exchange is kept in :meth:`RunContext.asides`."""


class TracerProviderLike(Protocol):
    """An OpenTelemetry ``TracerProvider`` (the core does not import opentelemetry)."""

    def get_tracer(self, instrumenting_module_name: str, /) -> object: ...


class MeterProviderLike(Protocol):
    """An OpenTelemetry ``MeterProvider`` (the core does not import opentelemetry)."""

    def get_meter(self, name: str, /) -> object: ...


def _check_provider(method: str) -> Callable[[object, attrs.Attribute[Any], Any], None]:
    def check(_: object, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is not None and not callable(getattr(value, method, None)):
            raise ConfigError(attribute.name, f"None or an object with {method}()", value)

    return check


def _check_positive_int(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    _keep_plain(instance, attribute, value, count(attribute.name, value, minimum=1))


def _check_depth(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    _keep_plain(instance, attribute, value, count(attribute.name, value, minimum=0))


def _check_optional_count(
    instance: object, attribute: attrs.Attribute[int | None], value: int | None
) -> None:
    plain = count(attribute.name, value, minimum=0, none_ok=True)
    _keep_plain(instance, attribute, value, plain)


@attrs.frozen(kw_only=True)
class SpawnOptions:
    """Per-spawn overrides. Every field left ``None`` takes the default."""

    name: str | None = None
    """Path segment for the child (default: the agent's name); repeats get ``-2``, ``-3``."""
    timeout: float | None = attrs.field(default=None, validator=_check_timeout)
    """Watchdog in seconds for this child; ``None`` uses the agent's or manager's."""
    prompt: str | None = None
    """System prompt override."""
    model: str | None = None
    """Model override."""
    files: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    """Paths of files handed to the agent."""
    budget: Budget | None = attrs.field(default=None, validator=check_budget)
    """What this child and its subtree may spend, within the agent's budget and what its
    ancestors have left; ``None``: those alone."""


MAX_CONVERSATION_ID: Final = 256
"""Characters of ``SubagentConfig.conversation_id``: room for any host's thread id, bounded
because every span of the run carries it."""


def _check_conversation_id(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    plain = plain_str(value)
    if plain is None or not 0 < len(plain) <= MAX_CONVERSATION_ID or not encodes(plain):
        expected = (
            f"None or a non-empty string of at most {MAX_CONVERSATION_ID} characters, "
            "encodable as UTF-8"
        )
        raise ConfigError(attribute.name, expected, value)
    _keep_plain(instance, attribute, value, plain)


def _check_path(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None:
        return
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise ConfigError(attribute.name, "a non-empty str or os.PathLike path, or None", value)


@attrs.frozen(kw_only=True)
class SubagentConfig:
    """Manager-wide settings; every value is validated with a message naming the field."""

    max_concurrent_spawns: int = attrs.field(
        default=DEFAULT_MAX_CONCURRENT_SPAWNS, validator=_check_positive_int
    )
    """How many spawned children run at once (>= 1; a limit of 0 would queue forever)."""
    spawn_timeout: float | None = attrs.field(
        default=DEFAULT_SPAWN_TIMEOUT, validator=_check_timeout
    )
    """Watchdog per spawned child in seconds, counted from when it starts (queue excluded);
    ``None`` disables it."""
    execute_timeout: float | None = attrs.field(
        default=DEFAULT_SPAWN_TIMEOUT, validator=_check_timeout
    )
    """Timeout of a synchronous :meth:`SubagentManager.execute` in seconds."""
    max_depth: int = attrs.field(default=DEFAULT_MAX_DEPTH, validator=_check_depth)
    """Deepest allowed child: 1 lets only the root delegate; 3 allows ``/root/a/b/c``."""
    max_children: int | None = attrs.field(default=None, validator=_check_optional_count)
    """Unfinished children (queued or running) one parent, an agent or a root session,
    may have at once; ``None``: no limit. A spawn past it is refused (``SpawnRejected``,
    reason ``max_children``)."""
    max_agents: int | None = attrs.field(default=None, validator=_check_optional_count)
    """Unfinished agents one tree (everything spawned into a root session, every depth)
    may have at once; ``None``: no limit (reason ``max_agents``)."""
    mailbox_capacity: int = attrs.field(
        default=DEFAULT_MAILBOX_CAPACITY, validator=_check_positive_int
    )
    """Unread envelopes a session's mailbox holds before degrading to events."""
    inbox_capacity: int = attrs.field(default=DEFAULT_INBOX_CAPACITY, validator=_check_positive_int)
    """Unread messages one agent's (or host session's) inbox holds; a send past it fails
    with ``full``, never dropping a message."""
    mailbox_ttl: float | None = attrs.field(default=None, validator=_check_timeout)
    """Seconds an unread envelope stays in the mailbox; ``None`` keeps it until read."""
    retain_collected: int | None = attrs.field(default=None, validator=_check_optional_count)
    """How many collected children's records the manager keeps (the newest by collection):
    ``None`` keeps every record for the manager's lifetime; ``0`` forgets a record once its
    envelope is collected (mailbox, ``wait_result``, ``wait_agent``, or returned by
    ``execute``). A record not yet collected is never forgotten, nor is that of an
    ``execute`` whose caller was cancelled (nobody received its envelope)."""
    truncate_chars: int = attrs.field(default=DEFAULT_TRUNCATE_CHARS, validator=_check_positive_int)
    """Length bound of the compact text view given to models."""
    notify_completion: bool = True
    """Deliver envelopes to mailboxes and publish ``subagent.completed``."""
    settle_timeout: float = attrs.field(default=5.0, validator=_check_timeout)
    """How long cleanup waits for cancelled children to settle before moving on."""
    permissions: Ruleset = attrs.field(factory=Ruleset.allow_all)
    """The root agent's ruleset; every child's effective ruleset lies within it."""
    tracing: bool = True
    """Record OpenTelemetry spans and metrics (``invoke_agent``, ``execute_tool``) when the
    application has installed an SDK; without one this costs nothing either way."""
    capture_content: bool = False
    """Also record prompts and outputs on spans (``gen_ai.input.messages``,
    ``gen_ai.output.messages``, ``input.value``, ``output.value``); off by default, as
    content may be sensitive."""
    conversation_id: str | None = attrs.field(default=None, validator=_check_conversation_id)
    """The ``gen_ai.conversation.id`` (and ``session.id``) of the trees spawned into the
    default session, so a dashboard groups them; ``None``: an id made when the manager is
    entered, unique to that run. A session the caller names is its own conversation."""
    usage_spans: bool = False
    """Also give every child that reported tokens a ``usage {agent}`` span (an OpenInference
    ``LLM`` span with its own tokens, model and provider), the form LLM tracing UIs count
    tokens and cost in. Off by default: a runner whose model client is instrumented
    already has such spans, and they would count twice."""
    tracer_provider: TracerProviderLike | None = attrs.field(
        default=None, validator=_check_provider("get_tracer")
    )
    """An OpenTelemetry ``TracerProvider`` for this manager's spans; ``None``: the global
    one, as it is when the manager is entered."""
    meter_provider: MeterProviderLike | None = attrs.field(
        default=None, validator=_check_provider("get_meter")
    )
    """An OpenTelemetry ``MeterProvider`` for this manager's metrics; ``None``: the global
    one, as it is when the manager is entered."""
    store_path: str | os.PathLike[str] | None = attrs.field(default=None, validator=_check_path)
    """A durable store's file (``subagents.store.SqliteStore``), which the manager opens
    as it is entered and closes as it closes; ``None`` (default): everything in memory."""
    durability: Durability = attrs.field(default="sync", validator=_one_of("sync", "async"))
    """With a durable store, when an envelope is handed to its parent (its mailbox,
    ``wait_result``, ``handle.done``, the ``subagent.completed`` event): ``"sync"``
    (default) only once it is committed, so nothing a parent has seen can be lost;
    ``"async"`` at once, the writer committing it in its next batch (a crash in between
    loses what was handed on). Without a store it changes nothing."""
