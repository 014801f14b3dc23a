"""What crosses the wire between the driver and a Ray worker, and what a remote runner sees.

Nothing here imports ray: :mod:`subagents.backends.ray` moves these records and calls
:func:`serve` in the worker. The driver ships a :class:`Shipped` context (seconds
remaining, never a deadline: clocks differ between machines) with the ``Request``; the
worker answers with a :class:`Reply` holding the result or the runner's exception, and
the progress the runner reported. A runner travels as its import path (``module:name``)
when it has one, else as the function itself (pickled by value).
"""

from __future__ import annotations

import importlib
import pickle
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import TYPE_CHECKING, Protocol, TypeAlias

import anyio
import attrs

from .._backend import awaitable, coerce_result
from .._envelope import Usage, clean_text, describe_exception
from .._errors import ConfigError, SpawnRejected
from .._paths import AgentPath
from .._permissions import Ruleset
from .._tracing import joined
from .._validators import count, plain_usage, text, texts

if TYPE_CHECKING:
    from .._spec import Request, Result

__all__ = [
    "Delta",
    "Exported",
    "RemoteContext",
    "RemoteRunnerError",
    "Reply",
    "Shipped",
    "Sink",
    "Snapshot",
    "Target",
    "revived",
    "serve",
    "target_of",
]

Runner: TypeAlias = "Callable[..., Awaitable[object]]"
Target: TypeAlias = "str | Runner"
"""A runner as shipped: its import path, or the callable itself."""

_MAX_FILES = 1000  # as many distinct paths as a local envelope keeps


class RemoteRunnerError(Exception):
    """A remote runner raised an exception that cannot travel back (it does not pickle);
    the message names its type and text."""


@attrs.frozen
class Shipped:
    """The remote context as it crosses the wire."""

    task_id: str
    parent_session_id: str
    agent: str
    agent_path: str
    parent_path: str
    attempt: int
    permissions: Ruleset
    remaining: float | None
    """Seconds before the driver's watchdog fires, measured when the call was made."""
    carrier: dict[str, str]
    """W3C trace context and baggage of the child's span."""
    sink: str
    """The name of the actor that keeps reported progress for the driver."""


@attrs.define
class Snapshot:
    """Progress reported so far by one run: the state ``ctx.report`` builds up."""

    output: str | None = None
    usage: Usage | None = None
    iterations: int | None = None
    files: list[str] = attrs.Factory(list)

    def apply(
        self,
        output: str | None,
        append: str | None,
        usage: Usage | None,
        iterations: int | None,
        files: tuple[str, ...] | None,
    ) -> None:
        """Fold one report (already validated) into the snapshot, as the local context
        folds it into its progress."""
        if output is not None:
            self.output = output
        if append:
            self.output = (self.output or "") + append
        if usage is not None:
            self.usage = usage
        if iterations is not None:
            self.iterations = iterations
        if files:
            known = set(self.files)
            for path in files:
                if path not in known and len(self.files) < _MAX_FILES:
                    known.add(path)
                    self.files.append(path)


Delta: TypeAlias = "tuple[str | None, str | None, Usage | None, int | None, tuple[str, ...] | None]"
"""One report's arguments, in :meth:`Snapshot.apply`'s order."""


class Sink(Protocol):
    """Where a remote context sends each report, so the driver can collect it after a
    cancellation, a timeout or a crash (when no reply comes back)."""

    def push(self, task_id: str, delta: Delta) -> None: ...


@attrs.frozen
class Reply:
    """What a remote run hands back: a result or the runner's exception, and its progress."""

    result: Result | None
    error: BaseException | Exported | None
    progress: Snapshot | None


class RemoteContext:
    """What a runner on a Ray worker receives in place of a :class:`RunContext`.

    It has the run's identity, attempt, permissions and watchdog deadline (in this
    process's clock), and :meth:`report`, which reaches the driver's envelope. It has no
    manager: :meth:`spawn` and :meth:`execute` raise :class:`SpawnRejected` (``remote``).
    """

    __slots__ = ("_shipped", "_sink", "attempt", "deadline", "permissions", "progress")

    def __init__(self, shipped: Shipped, sink: Sink) -> None:
        self._shipped = shipped
        self._sink = sink
        self.attempt = shipped.attempt
        """1 for the first try, 2 and up for retries of transient failures."""
        remaining = shipped.remaining
        self.deadline = None if remaining is None else anyio.current_time() + remaining
        """The watchdog deadline in this process's :func:`anyio.current_time`, or ``None``."""
        self.permissions: Ruleset = shipped.permissions
        """The effective ruleset, as the driver computed it."""
        self.progress: Snapshot | None = None
        """What the runner reported, ``None`` until it reports."""

    @property
    def task_id(self) -> str:
        """This run's task id."""
        return self._shipped.task_id

    @property
    def session_id(self) -> str:
        """The session this run's own children would belong to (its task id)."""
        return self._shipped.task_id

    @property
    def parent_session_id(self) -> str:
        """The session that spawned this run."""
        return self._shipped.parent_session_id

    @property
    def agent(self) -> str:
        """The agent type's name."""
        return self._shipped.agent

    @property
    def agent_path(self) -> AgentPath:
        """This run's place in the tree."""
        return AgentPath(self._shipped.agent_path)

    @property
    def parent_path(self) -> AgentPath:
        """The path of the agent that delegated this run."""
        return AgentPath(self._shipped.parent_path)

    def remaining(self) -> float | None:
        """Seconds left before the watchdog fires, or ``None`` without a watchdog."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - anyio.current_time())

    def allows(self, tool: str) -> bool:
        """Whether this agent may use ``tool`` under its effective permissions."""
        return self.permissions.allows(tool)

    def report(
        self,
        *,
        output: str | None = None,
        append: str | None = None,
        usage: Usage | None = None,
        iterations: int | None = None,
        files_changed: Iterable[str] | None = None,
    ) -> None:
        """Record progress so far, as :meth:`RunContext.report` does; it reaches the
        driver's envelope with the result, or after a cancellation, timeout or crash.

        Raises:
            ConfigError: a value of the wrong type or range (nothing is recorded then).
        """
        delta: Delta = (
            None if output is None else clean_text(text("output", output)),
            None if append is None else clean_text(text("append", append)),
            None if usage is None else _plain_usage(usage),
            None if iterations is None else count("iterations", iterations, minimum=0),
            None if files_changed is None else texts("files_changed", files_changed),
        )
        if self.progress is None:
            self.progress = Snapshot()
        self.progress.apply(*delta)
        self._sink.push(self._shipped.task_id, delta)

    def spawn(self, agent: str, *args: object, **kwargs: object) -> None:
        """Refused: a remote run has no manager to delegate through."""
        raise _no_delegation(agent)

    async def execute(self, agent: str, *args: object, **kwargs: object) -> None:
        """Refused: a remote run has no manager to delegate through."""
        raise _no_delegation(agent)


def _no_delegation(agent: str) -> SpawnRejected:
    return SpawnRejected(
        "remote",
        f"cannot delegate to {agent!r} from a runner on a Ray worker: RayBackend runs "
        "leaf agents only; spawn from the driver, or run the parent with the local backend",
    )


def _plain_usage(usage: object) -> Usage:
    plain = plain_usage(usage)
    if plain is None:
        raise ConfigError("usage", "a Usage with token counts 0 <= n < 2**63", usage)
    return plain


def target_of(runner: Runner) -> Target:
    """How ``runner`` travels: its import path when importing that path gives it back
    (a module-level function), else the callable itself."""
    module = getattr(runner, "__module__", None)
    qualname = getattr(runner, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and module != "__main__":
        path = f"{module}:{qualname}"
        try:
            if _import(path) is runner:
                return path
        except (ImportError, AttributeError):
            pass
    return runner


def _import(path: str) -> Runner:
    module, _, qualname = path.partition(":")
    found: object = importlib.import_module(module)
    for name in qualname.split("."):
        found = getattr(found, name)
    if not callable(found):
        raise AttributeError(f"{path} is not callable")
    return found


def resolve(target: Target, cache: MutableMapping[str, Runner]) -> Runner:
    """The runner ``target`` names, imported once per worker process."""
    if not isinstance(target, str):
        return target
    runner = cache.get(target)
    if runner is None:
        runner = cache[target] = _import(target)
    return runner


@attrs.frozen
class Exported:
    """An exception whose class cannot be rebuilt from its ``args`` (its ``__init__``
    takes other arguments), as it travels: its class, ``args`` and attributes."""

    cls: type[BaseException]
    args: tuple[object, ...]
    state: dict[str, object]

    def revive(self) -> BaseException:
        """The exception again, made without calling its ``__init__``."""
        exc = self.cls.__new__(self.cls, *self.args)
        exc.args = self.args
        exc.__dict__.update(self.state)
        return exc


def portable(exc: BaseException) -> BaseException | Exported:
    """``exc`` as it can travel back: itself if it survives pickling, else an
    :class:`Exported` copy, else a :class:`RemoteRunnerError` that says what it was (a
    runner's exception must reach the envelope, never fail the reply)."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        pass
    try:
        exported = Exported(type(exc), exc.args, dict(getattr(exc, "__dict__", {})))
        pickle.loads(pickle.dumps(exported)).revive()
        return exported
    except Exception:
        error_type, message = describe_exception(exc)
        return RemoteRunnerError(f"{error_type} (not picklable): {message}")


def revived(error: BaseException | Exported) -> BaseException:
    """The exception a :class:`Reply` carries, as the runner raised it."""
    return error.revive() if isinstance(error, Exported) else error


async def serve(
    target: Target,
    request: Request,
    shipped: Shipped,
    sink: Sink,
    cache: MutableMapping[str, Runner],
) -> Reply:
    """Run the runner ``target`` names on ``request``, in the worker, to a :class:`Reply`.

    A cancellation (Ray's cancel of this call) propagates; any exception of the runner,
    or a bad return value, is the reply's error.
    """
    ctx = RemoteContext(shipped, sink)
    try:
        runner = resolve(target, cache)
        if shipped.carrier:
            with joined(shipped.carrier):
                value = await awaitable(request.agent, runner(request, ctx))
        else:  # no trace to join (the driver records none)
            value = await awaitable(request.agent, runner(request, ctx))
        result = coerce_result(request.agent, value)
    except Exception as exc:
        return Reply(result=None, error=portable(exc), progress=ctx.progress)
    return Reply(result=result, error=None, progress=ctx.progress)
