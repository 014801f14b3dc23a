"""What crosses the wire between the driver and a Ray worker, and what a remote runner sees.

Nothing here imports ray: :mod:`subagents.backends.ray` moves these records and calls
:func:`serve` in the worker. The driver ships a :class:`Shipped` context (seconds
remaining, never a deadline: clocks differ between machines) with the ``Request``; the
worker answers with a :class:`Reply` holding the result or the runner's exception, and
the progress the runner reported (the same :class:`~subagents._progress.Progress` a local
run keeps). A runner travels as its import path (``module:name``) when it has one, else as
the function pickled by value (bytes the driver makes once, see :mod:`._ray_targets`); a
path the worker cannot import comes back as :attr:`Reply.missing`, and the driver sends
the function by value instead.
"""

from __future__ import annotations

import importlib
import pickle
import types
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Protocol, TypeAlias

import anyio
import attrs

from .._backend import awaitable, coerce_result
from .._budget import Budget
from .._context import BaseContext
from .._envelope import Usage, describe_exception
from .._errors import SpawnRejected
from .._paths import AgentPath
from .._permissions import Ruleset
from .._progress import Progress, Report
from .._runner_errors import holds_this_cancellation, interrupts, runner_error
from .._tracing import joined

if TYPE_CHECKING:
    from .._spec import Request, Result

__all__ = [
    "CANCELLED",
    "ClusterLostError",
    "FAILED",
    "REPLIED",
    "Completion",
    "Exported",
    "RemoteContext",
    "RemoteRunnerError",
    "Reply",
    "Shipped",
    "Sink",
    "Snapshot",
    "Target",
    "by_value",
    "interrupted_on_actor",
    "portable",
    "revived",
    "serve",
    "target_of",
]

Runner: TypeAlias = "Callable[..., Awaitable[object]]"
Target: TypeAlias = "str | bytes | Runner"
"""A runner as shipped: its import path, a function pickled by value (unpickled once per
worker process), or the callable itself."""
Dumps: TypeAlias = "Callable[[object], bytes]"
"""How the worker pickles what goes back: the same pickler as the reply's."""

REPLIED, FAILED, CANCELLED = 0, 1, 2
"""How an actor's call ended: with a pickled :class:`Reply` (the runner's own errors
included, and on an actor its interrupts); with an exception :func:`serve` did not turn
into one (its payload would not unpickle, its reply would not pickle, an interrupt outside
the runner), pickled by :func:`portable`; or cancelled, as the driver asked, with
nothing."""
Completion: TypeAlias = "tuple[int, int, bytes]"
"""One ended call as an actor hands it back: the call's number, how it ended, and what
it left."""


class ClusterLostError(RuntimeError):
    """Ray shut down (or the driver lost its cluster) while a child ran on it."""


class RemoteRunnerError(Exception):
    """A remote runner raised an exception that could not travel back: it does not pickle
    (the message names its type and text), or the driver cannot unpickle it (its module is
    on the workers only). In the second case the error is an instance of a subclass named
    like the runner's class, so the envelope's ``error_type`` is the runner's."""


def interrupted_on_actor(exc: BaseException) -> RemoteRunnerError:
    """The error of a run on a pool actor that ``exc`` (an interrupt) ended: there it
    stops that run only."""
    return RemoteRunnerError(f"the runner raised {type(exc).__qualname__} on its actor: {exc}")


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
    budget: Budget
    """What the run and its subtree had left to spend when the call was made (in every
    field the least its own budget and each ancestor's had left), ``seconds`` from then."""
    carrier: dict[str, str]
    """W3C trace context and baggage of the child's span."""
    sink: str
    """The name of the actor that keeps reported progress for the driver."""


@attrs.define
class Snapshot:
    """Progress reported so far by one run: its :class:`Progress` (capped and counted as a
    local run's), and its latest usage and iterations."""

    progress: Progress = attrs.Factory(Progress)
    usage: Usage | None = None
    iterations: int | None = None
    replaced: bool = False
    """Whether a report replaced the output (``output=``): what earlier attempts of the
    run reported is then no longer its output."""

    def apply(self, report: Report) -> None:
        """Fold one validated report in, as the local context does."""
        report.fold(self.progress)
        if report.output is not None:
            self.replaced = True
        if report.usage is not None:
            self.usage = report.usage
        if report.iterations is not None:
            self.iterations = report.iterations

    def totals(self) -> Report:
        """The usage and iterations, as one report."""
        return Report(usage=self.usage, iterations=self.iterations)


class Sink(Protocol):
    """Where a remote context sends each report, so the driver can collect it after a
    cancellation, a timeout or a crash (when no reply comes back), or while it runs."""

    def push(self, task_id: str, report: Report) -> None: ...


@attrs.frozen
class Reply:
    """What a remote run hands back: a result or the runner's exception, and its progress."""

    result: Result | None
    error: bytes | None
    """The runner's exception (or an :class:`Exported` copy), pickled on its own: the
    driver may lack its class."""
    error_type: tuple[str, str] | None
    """The exception's ``(error_type, message)``, for a driver that cannot unpickle it."""
    progress: Snapshot | None
    missing: bool = False
    """The worker could not import the runner's path (the driver resends it by value)."""


class RemoteContext(BaseContext):
    """What a runner on a Ray worker receives in place of a :class:`RunContext`.

    It has the run's identity, attempt, permissions, watchdog deadline (in this
    process's clock) and :meth:`remaining_budget`, and :meth:`report`, which reaches the
    driver's envelope with the
    reply, and the driver's budgets and events while it runs (read every quarter of a
    second, for a child with a token budget or progress listeners). It has no manager:
    :meth:`spawn` and :meth:`execute` raise :class:`SpawnRejected` (``remote``), and so do
    the peer-messaging methods (:meth:`send`, :meth:`recv`, :meth:`inbox`, :meth:`peers`,
    :meth:`ask`, :meth:`asides`, :attr:`previous`, :attr:`revived_by`): a run's inbox is
    kept on the driver, where the remote runner cannot read it.
    """

    __slots__ = (
        "_budget_end",
        "_shipped",
        "_sink",
        "attempt",
        "deadline",
        "permissions",
        "progress",
    )

    def __init__(self, shipped: Shipped, sink: Sink) -> None:
        self._shipped = shipped
        self._sink = sink
        self.attempt = shipped.attempt
        """1 for the first try, 2 and up for retries of transient failures."""
        remaining, seconds = shipped.remaining, shipped.budget.seconds
        now = anyio.current_time() if remaining is not None or seconds is not None else 0.0
        self.deadline = None if remaining is None else now + remaining
        """The watchdog deadline in this process's :func:`anyio.current_time`, or ``None``."""
        self._budget_end = None if seconds is None else now + seconds
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

    def remaining_budget(self) -> Budget:
        """What this run may still spend: what its budgets (its own and its ancestors')
        had left when the driver made the call, less the usage this run has reported
        since; ``seconds`` counts down from this run's start on the worker, as
        :attr:`deadline` does (time queued on the cluster is not taken off). What other
        runs of the tree spend meanwhile is not seen here (the driver still stops this
        run when the tree's budget runs out)."""
        budget = self._shipped.budget
        if budget.unlimited:
            return budget
        usage = self.progress.usage if self.progress is not None else None
        spent_in = usage.input_tokens if usage is not None else 0
        spent_out = usage.output_tokens if usage is not None else 0
        end = self._budget_end
        seconds = None if end is None else max(0.0, end - anyio.current_time())
        return Budget(
            tokens=_less(budget.tokens, spent_in + spent_out),
            input_tokens=_less(budget.input_tokens, spent_in),
            output_tokens=_less(budget.output_tokens, spent_out),
            seconds=seconds,
            spawns=budget.spawns,
        )

    def _apply(self, report: Report) -> None:
        if self.progress is None:
            self.progress = Snapshot()
        self.progress.apply(report)
        self._sink.push(self._shipped.task_id, report)

    def spawn(self, agent: str, *args: object, **kwargs: object) -> None:
        """Refused: a remote run has no manager to delegate through."""
        raise _no_delegation(agent)

    async def execute(self, agent: str, *args: object, **kwargs: object) -> None:
        """Refused: a remote run has no manager to delegate through."""
        raise _no_delegation(agent)

    def send(self, *args: object, **kwargs: object) -> None:
        """Refused: peer messaging stays on the driver."""
        raise _no_messaging("send")

    async def recv(self, *args: object, **kwargs: object) -> None:
        """Refused: peer messaging stays on the driver."""
        raise _no_messaging("recv")

    def inbox(self, *args: object, **kwargs: object) -> None:
        """Refused: peer messaging stays on the driver."""
        raise _no_messaging("inbox")

    def peers(self) -> None:
        """Refused: peer messaging stays on the driver."""
        raise _no_messaging("peers")

    async def ask(self, *args: object, **kwargs: object) -> None:
        """Refused: peer messaging stays on the driver."""
        raise _no_messaging("ask")

    def asides(self) -> None:
        """Refused: peer messaging stays on the driver."""
        raise _no_messaging("asides")

    @property
    def previous(self) -> None:
        """Refused: peer messaging stays on the driver."""
        raise _no_messaging("previous")

    @property
    def revived_by(self) -> None:
        """Refused: peer messaging stays on the driver."""
        raise _no_messaging("revived_by")


def _less(cap: int | None, spent: int) -> int | None:
    return None if cap is None else max(0, cap - spent)


def _no_messaging(method: str) -> SpawnRejected:
    return SpawnRejected(
        "remote",
        f"ctx.{method} is not available to a runner on a Ray worker: RayBackend runs leaf "
        "agents only, and peer messages stay with the driver (a message sent to a remote "
        "child is never read by it); run agents that message with the local backend",
    )


def _no_delegation(agent: str) -> SpawnRejected:
    return SpawnRejected(
        "remote",
        f"cannot delegate to {agent!r} from a runner on a Ray worker: RayBackend runs "
        "leaf agents only; spawn from the driver, or run the parent with the local backend",
    )


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


def by_value(runner: Runner) -> Runner:
    """``runner`` as the worker can receive it when it cannot import its module (one on
    the driver's ``sys.path`` only, as a pytest test module): a copy of a plain function
    that claims the driver's ``__main__``, which cloudpickle ships with its code. Globals
    it uses from its own module still travel by reference."""
    if not isinstance(runner, types.FunctionType):
        return runner
    copy = types.FunctionType(
        runner.__code__,
        runner.__globals__,
        runner.__name__,
        runner.__defaults__,
        runner.__closure__,
    )
    copy.__kwdefaults__ = runner.__kwdefaults__
    copy.__qualname__ = runner.__qualname__
    copy.__dict__.update(runner.__dict__)
    copy.__module__ = "__main__"
    return copy


def _import(path: str) -> Runner:
    module, _, qualname = path.partition(":")
    found: object = importlib.import_module(module)
    for name in qualname.split("."):
        found = getattr(found, name)
    if not callable(found):
        raise AttributeError(f"{path} is not callable")
    return found


_CACHED = 256
"""Runners a worker process keeps resolved: a bound, as each closure made per job is
another pickled function."""


def resolve(target: Target, cache: MutableMapping[str | bytes, Runner]) -> Runner:
    """The runner ``target`` names: a path imported, or a pickled function unpickled,
    once per worker process (while it is among the last :data:`_CACHED` resolved)."""
    if not isinstance(target, (str, bytes)):
        return target
    runner = cache.get(target)
    if runner is None:
        runner = _import(target) if isinstance(target, str) else pickle.loads(target)
        if len(cache) >= _CACHED:
            del cache[next(iter(cache))]  # the oldest: dicts keep insertion order
        cache[target] = runner
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


def portable(exc: BaseException, dumps: Dumps) -> bytes:
    """``exc`` pickled by ``dumps`` as it can travel back: itself if it survives, else an
    :class:`Exported` copy, else a :class:`RemoteRunnerError` that says what it was (a
    runner's exception must reach the envelope, never fail the reply)."""
    try:
        blob = dumps(exc)
        pickle.loads(blob)
        return blob
    except Exception:
        pass
    try:
        blob = dumps(Exported(type(exc), exc.args, dict(getattr(exc, "__dict__", {}))))
        pickle.loads(blob).revive()
        return blob
    except Exception:
        error_type, message = describe_exception(exc)
        return dumps(RemoteRunnerError(f"{error_type} (not picklable): {message}"))


def revived(reply: Reply) -> BaseException:
    """The exception ``reply`` carries, as the runner raised it; if the driver cannot
    unpickle it, a :class:`RemoteRunnerError` of a subclass named like the runner's class,
    with its text."""
    assert reply.error is not None
    assert reply.error_type is not None
    try:
        error: BaseException | Exported = pickle.loads(reply.error)
    except Exception:
        error_type, message = reply.error_type
        module, _, qualname = error_type.rpartition(".")
        cls: type[RemoteRunnerError] = type(
            qualname, (RemoteRunnerError,), {"__module__": module, "__qualname__": qualname}
        )
        return cls(message.removeprefix(f"{qualname}: "))
    return error.revive() if isinstance(error, Exported) else error


async def serve(
    target: Target,
    request: Request,
    shipped: Shipped,
    sink: Sink,
    cache: MutableMapping[str | bytes, Runner],
    dumps: Dumps,
    *,
    interrupt_is_error: bool = False,
) -> Reply:
    """Run the runner ``target`` names on ``request``, in the worker, to a :class:`Reply`.

    A cancellation (Ray's cancel of this call) propagates, and so do ``KeyboardInterrupt``
    and ``SystemExit`` unless ``interrupt_is_error`` (a pool actor's run: there one would
    stop the event loop every run shares, and Ray cancels with neither); any other
    exception of the runner (one outside ``Exception`` of its own, or a cancellation
    exception nothing here asked for, included: judged as the engine judges a local
    runner's), or a bad return value, is the reply's error, with what the run reported.
    """
    ctx = RemoteContext(shipped, sink)
    try:
        runner = resolve(target, cache)
    except (ImportError, AttributeError):
        if not isinstance(target, str):
            raise
        return Reply(result=None, error=None, error_type=None, progress=None, missing=True)
    try:
        if shipped.carrier:
            with joined(shipped.carrier):
                value = await awaitable(request.agent, runner(request, ctx))
        else:  # no trace to join (the driver records none)
            value = await awaitable(request.agent, runner(request, ctx))
        result = coerce_result(request.agent, value)
    except BaseException as exc:
        judged = runner_error(exc)
        if judged is None:
            if not (interrupt_is_error and interrupts(exc)) or holds_this_cancellation(exc):
                raise
            judged = interrupted_on_actor(exc)
        error = portable(judged, dumps)
        described = describe_exception(judged)
        return Reply(result=None, error=error, error_type=described, progress=ctx.progress)
    return Reply(result=result, error=None, error_type=None, progress=ctx.progress)
