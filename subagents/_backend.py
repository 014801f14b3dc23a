"""The backend seam: where a child's runner actually runs.

A remote backend replaces :func:`run_local` with a function of the same signature that
ships the request elsewhere; everything around it (queueing, watchdog, cancellation,
envelopes, delivery) stays in the manager. With the default backend, a plain runner (no
retry policy, no trace) is awaited in place by ``ChildRunner``, through the same
:func:`awaitable` and :func:`coerce_result` as :func:`run_local` uses, saving a frame and,
for a ``str``, a ``Result`` per child.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from types import CoroutineType
from typing import TYPE_CHECKING, Final, TypeAlias, TypeVar, cast

from ._envelope import Status, Usage, describe_exception
from ._errors import RunnerReturnError
from ._retry import run_with_retries
from ._spec import AgentSpec, Request, Result
from ._validators import as_count, as_int, as_str, plain_usage

if TYPE_CHECKING:
    from ._context import RunContext

__all__ = ["Backend", "awaitable", "coerce_result", "run_local"]

T = TypeVar("T")

Backend: TypeAlias = "Callable[[AgentSpec, Request, RunContext], Awaitable[Result]]"


async def run_local(spec: AgentSpec, request: Request, ctx: RunContext) -> Result:
    """Run ``spec.runner`` in this task, retrying transient failures under ``spec.retry``."""
    if spec.retry is None:
        return coerce_result(spec.name, await awaitable(spec.name, spec.runner(request, ctx)))

    async def attempt(number: int) -> Result:
        ctx.attempt = number
        return coerce_result(spec.name, await awaitable(spec.name, spec.runner(request, ctx)))

    return await run_with_retries(spec.retry, attempt, deadline=ctx.deadline)


def awaitable(agent: str, value: T) -> T:
    """``value``, the call of a runner, if it can be awaited; else RunnerReturnError.

    AgentSpec refuses a plain function, but a callable marked as a coroutine function, or
    one swapped in later, may still return a plain value: its error then says so, rather
    than "object str can't be used in 'await' expression".
    """
    if type(value) is CoroutineType or inspect.isawaitable(value):
        return value
    raise RunnerReturnError(
        agent,
        f"{type(value).__qualname__} when called, not an awaitable: a runner must be an "
        "async function (async def runner(request, ctx))",
    )


def coerce_result(agent: str, value: object) -> Result:
    """Accept ``Result`` or ``str``, returned as a :class:`Result` of plain built-in values;
    anything else raises :class:`RunnerReturnError`.

    Plain values (a ``str`` subclass copied to ``str``, a ``Usage`` subclass rebuilt) keep
    a subclass's overrides (``__len__``, ``isascii``, ``__bool__``) from running when the
    envelope is built, outside the guard that turns a runner's failure into an envelope.
    Reading a field that raises (a ``Result`` subclass's property) is a RunnerReturnError
    naming the field.
    """
    # Text is made JSON-safe where it lands: DelegateResult's converters (clean_text).
    if type(value) is str:
        return Result(output=value)
    if isinstance(value, Result):
        return _plain_result(agent, value)
    text = as_str(value)
    if text is not None:  # a str subclass: keep the text, drop the subclass
        return Result(output=text)
    raise RunnerReturnError(agent, f"{type(value).__qualname__}; expected Result or str")


_UNREADABLE: Final = object()
_ALL: Final = slice(None)
_COUNT: Final = "an int 0 <= n < 2**63"


class _Fields:
    """Reads the fields of one ``Result`` once each, collecting every problem in order."""

    def __init__(self, result: Result) -> None:
        self.result = result
        self.problems: list[str] = []

    def read(self, owner: object, field: str) -> object:
        """``owner.field``, or ``_UNREADABLE`` (the problem noted) if reading it raises."""
        try:
            return getattr(owner, field)
        except Exception as exc:  # a property of a subclass, or a field deleted
            self.problems.append(f"{field} could not be read ({describe_exception(exc)[1]})")
            return _UNREADABLE

    def wrong(self, field: str, value: object, expected: str) -> None:
        """Note that ``field`` holds ``value``, not ``expected`` (an unreadable one is
        already noted)."""
        if value is _UNREADABLE:
            return
        number = as_int(value)
        if number is None:
            got = type(value).__qualname__
        else:  # str() of a huge int may exceed Python's digit limit
            got = str(number) if number.bit_length() <= 64 else f"{number.bit_length()} bits"
        self.problems.append(f"{field} is {got}, expected {expected}")

    def plain(self, field: str, convert: Callable[[object], T | None], expected: str) -> T | None:
        """The field as ``convert`` makes it plain, or ``None`` (the problem noted)."""
        value = self.read(self.result, field)
        plain = convert(value)
        if plain is None:
            self.wrong(field, value, expected)
        return plain

    def usage(self) -> Usage | None:
        """A plain ``Usage``; for a bad ``Usage`` subclass, each bad count is named."""
        value = self.read(self.result, "usage")
        usage = plain_usage(value)
        if usage is not None:
            return usage
        if not issubclass(type(value), Usage):
            self.wrong("usage", value, "Usage")
            return None
        for field in ("input_tokens", "output_tokens"):
            count = self.read(value, field)
            if as_count(count) is None:
                self.wrong(f"usage.{field}", count, _COUNT)
        return None

    def status(self) -> object:
        """The status: a ``Status``, ``None``, or anything else (the problem noted)."""
        status = self.read(self.result, "status")
        if status is not None and type(status) is not Status:
            self.wrong("status", status, "a Status or None")
        return status

    def files(self) -> list[str | None]:
        """The paths, read through tuple's own slice (a subclass's ``__iter__`` or
        ``__getitem__`` does not run); ``None`` stands for an item that is no string."""
        value = self.read(self.result, "files_changed")
        if not issubclass(type(value), tuple):  # type(): an object can claim a __class__
            self.wrong("files_changed", value, "a tuple of str")
            return []
        files = [as_str(f) for f in tuple.__getitem__(cast("tuple[object, ...]", value), _ALL)]
        if None in files:
            self.problems.append("files_changed must hold strings")
        return files


def _plain_result(agent: str, result: Result) -> Result:
    """``result`` rebuilt from plain values, or RunnerReturnError listing every bad field."""
    fields = _Fields(result)
    output = fields.plain("output", as_str, "str")
    error = fields.plain("error", as_str, "str")
    iterations = fields.plain("iterations", as_count, _COUNT)
    usage = fields.usage()
    status = fields.status()
    files = fields.files()
    if fields.problems:
        raise RunnerReturnError(agent, "a bad Result: " + "; ".join(fields.problems))
    # Without problems every field was read and is plain.
    assert output is not None
    assert error is not None
    assert iterations is not None
    assert usage is not None
    return Result(
        output=output,
        usage=usage,
        iterations=iterations,
        files_changed=cast("list[str]", files),
        error=error,
        status=cast("Status | None", status),
    )
