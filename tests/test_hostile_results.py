"""A runner's hostile return values and progress reports (subclasses of str, Usage or
Result whose methods raise) end in one envelope and leave the manager running."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from subagents import (
    AgentSpec,
    ConfigError,
    DelegateResult,
    Request,
    Result,
    RetryPolicy,
    RunContext,
    SpawnOptions,
    Status,
    SubagentManager,
    Usage,
)
from tests.helpers import clock_backends, echo, manager_with, spec

pytestmark = pytest.mark.anyio


class BadLen(str):
    def __len__(self) -> int:
        raise RuntimeError("__len__ is hostile")


class BadAscii(str):
    def isascii(self) -> bool:
        raise RuntimeError("isascii is hostile")


class BadEq(str):
    def __eq__(self, other: object) -> bool:
        raise RuntimeError("__eq__ is hostile")

    __hash__ = str.__hash__


class BadUsage(Usage):
    def __bool__(self) -> bool:
        raise RuntimeError("__bool__ is hostile")


class BadInt(int):
    def __le__(self, other: object) -> bool:
        raise RuntimeError("__le__ is hostile")

    def __bool__(self) -> bool:
        raise RuntimeError("__bool__ is hostile")


class UnreadableResult(Result):
    def __getattribute__(self, name: str) -> Any:
        if name == "output":
            raise RuntimeError("the output property is hostile")
        return super().__getattribute__(name)


HOSTILE_STRINGS = [BadLen, BadAscii, BadEq]

# name: (what the runner returns, the status and what the envelope must say)
RETURNS: dict[str, tuple[Callable[[], object], Status, Callable[[DelegateResult], bool]]] = {
    **{
        f"output {cls.__name__}": (
            lambda cls=cls: Result(output=cls("the text")),
            Status.COMPLETED,
            lambda e: e.output == "the text",
        )
        for cls in HOSTILE_STRINGS
    },
    **{
        f"error {cls.__name__}": (
            lambda cls=cls: Result(error=cls("it broke")),
            Status.ERROR,
            lambda e: e.error == "it broke" and e.error_type == "RunnerReportedError",
        )
        for cls in HOSTILE_STRINGS
    },
    **{
        f"path {cls.__name__}": (
            lambda cls=cls: Result(output="o", files_changed=(cls("a.py"), "b.py")),
            Status.COMPLETED,
            lambda e: e.files_changed == ("a.py", "b.py"),
        )
        for cls in HOSTILE_STRINGS
    },
    **{
        f"returned {cls.__name__}": (
            lambda cls=cls: cls("plain"),
            Status.COMPLETED,
            lambda e: e.output == "plain",
        )
        for cls in HOSTILE_STRINGS
    },
    "usage subclass": (
        lambda: Result(output="o", usage=BadUsage(input_tokens=3, output_tokens=4)),
        Status.COMPLETED,
        lambda e: e.usage == Usage(input_tokens=3, output_tokens=4),
    ),
    "int subclass counts": (
        lambda: Result(output="o", iterations=BadInt(2), usage=Usage(input_tokens=BadInt(5))),
        Status.COMPLETED,
        lambda e: e.iterations == 2 and e.usage.input_tokens == 5,
    ),
    "unreadable field": (
        lambda: UnreadableResult(),
        Status.ERROR,
        lambda e: (
            e.error_type == "subagents.RunnerReturnError"
            and "output could not be read" in e.error
            and "the output property is hostile" in e.error
        ),
    ),
}

WAYS = {
    "inline": {},  # the plain runner, awaited in place by the manager
    "run_local": {"retry": RetryPolicy(attempts=1)},  # through the default backend
}


def _check(
    envelope: DelegateResult, status: Status, says: Callable[[DelegateResult], bool]
) -> None:
    assert envelope.status == status, envelope
    assert says(envelope), envelope
    assert all(type(f) is str for f in envelope.files_changed)
    assert type(envelope.output) is str
    assert type(envelope.error) is str
    envelope.to_json()
    envelope.truncated()


async def _one_envelope(manager: SubagentManager, agent: str) -> DelegateResult:
    with anyio.fail_after(5):
        envelope = await manager.spawn(agent).wait()
        assert (await manager.execute("echo", "still running")).output == "still running"
    return envelope


@pytest.mark.parametrize("way", list(WAYS))
@pytest.mark.parametrize("case", list(RETURNS))
async def test_a_hostile_result_ends_in_one_envelope(case: str, way: str) -> None:
    make, status, says = RETURNS[case]

    async def runner(request: Request, ctx: RunContext) -> Any:
        return make()

    async with manager_with(spec("hostile", runner, **WAYS[way]), spec("echo", echo)) as m:
        envelope = await _one_envelope(m, "hostile")
    _check(envelope, status, says)


@pytest.mark.parametrize("case", list(RETURNS))
async def test_a_custom_backends_hostile_result_ends_in_one_envelope(case: str) -> None:
    make, status, says = RETURNS[case]

    async def backend(spec: AgentSpec, request: Request, ctx: RunContext) -> Any:
        return make()

    specs = [spec("hostile", echo), spec("echo", echo)]
    async with SubagentManager(specs, backend=backend) as m:
        with anyio.fail_after(5):
            envelope = await m.spawn("hostile").wait()
    _check(envelope, status, says)


async def test_a_custom_backend_returning_garbage_ends_in_an_error_envelope() -> None:
    async def garbage_backend(agent_spec: AgentSpec, request: Request, ctx: RunContext) -> Any:
        return 3.14

    async def bad_result_backend(agent_spec: AgentSpec, request: Request, ctx: RunContext) -> Any:
        return Result(output="x", usage={"input_tokens": 1})  # type: ignore[arg-type]

    for backend in (garbage_backend, bad_result_backend):
        async with SubagentManager([spec("echo", echo)], backend=backend) as m:
            env = await m.spawn("echo", "x").wait()
            assert env.status == Status.ERROR
            sync = await m.execute("echo", "x")
            assert sync.status == Status.ERROR
        json.loads(env.to_json())


# name: (the report, then what the envelope must say)
REPORTS: dict[str, tuple[dict[str, Any], Callable[[DelegateResult], bool]]] = {
    **{
        f"output {cls.__name__}": ({"output": cls("partial")}, lambda e: e.output == "partial")
        for cls in HOSTILE_STRINGS
    },
    **{
        f"append {cls.__name__}": ({"append": cls("more")}, lambda e: e.output == "more")
        for cls in HOSTILE_STRINGS
    },
    **{
        f"files {cls.__name__}": (
            {"files_changed": [cls("x.py")]},
            lambda e: e.files_changed == ("x.py",),
        )
        for cls in HOSTILE_STRINGS
    },
    **{
        f"one path {cls.__name__}": (
            {"files_changed": cls("y.py")},
            lambda e: e.files_changed == ("y.py",),
        )
        for cls in HOSTILE_STRINGS
    },
    "usage subclass": (
        {"usage": BadUsage(input_tokens=1)},
        lambda e: e.usage == Usage(input_tokens=1),
    ),
    "iterations subclass": ({"iterations": BadInt(7)}, lambda e: e.iterations == 7),
}


@pytest.mark.parametrize("anyio_backend", clock_backends())
@pytest.mark.parametrize("case", list(REPORTS))
async def test_a_hostile_progress_report_is_kept_as_plain_values(case: str) -> None:
    """The report lands in the envelope of a runner that then times out (the partial
    output is all there is), and in that of one that returns no text of its own."""
    report, says = REPORTS[case]
    gate = anyio.Event()

    async def stuck(request: Request, ctx: RunContext) -> str:
        ctx.report(**report)
        await gate.wait()
        return "never"

    # What the runner returns as its own output: the plain text of what it reported.
    own_output = {"output": "partial", "append": "more"}.get(next(iter(report)), "")

    async def done(request: Request, ctx: RunContext) -> Result:
        ctx.report(**report)
        return Result(output=own_output)

    agents = [spec("stuck", stuck, timeout=0.05), spec("done", done), spec("echo", echo)]
    async with manager_with(*agents) as m:
        timed_out = await _one_envelope(m, "stuck")
        completed = await _one_envelope(m, "done")
    _check(timed_out, Status.TIMEOUT, says)
    _check(completed, Status.COMPLETED, says)


@pytest.mark.parametrize(
    "report",
    [
        {"usage": {"input_tokens": 1}},
        {"output": 123},
        {"append": b"bytes"},
        {"iterations": "3"},
        {"files_changed": [1, 2]},
    ],
)
async def test_a_progress_report_of_the_wrong_type_ends_in_an_error_naming_the_field(
    report: dict[str, Any],
) -> None:
    async def reporter(request: Request, ctx: RunContext) -> str:
        ctx.report(**report)
        return "unreachable"

    events: list[Any] = []
    m = manager_with(spec("r", reporter))
    m.events.subscribe(events.append)
    async with m:
        env = await m.spawn("r", "x").wait()
    assert env.status == Status.ERROR
    assert next(iter(report)) in env.error  # names the field
    json.loads(env.to_json())
    assert [e.type for e in events].count("subagent.completed") == 1


async def test_a_report_whose_paths_cannot_be_iterated_is_a_config_error() -> None:
    class Unlistable:
        def __iter__(self) -> Any:
            raise RuntimeError("no iteration")

    raised: list[Exception] = []

    async def runner(request: Request, ctx: RunContext) -> str:
        try:
            ctx.report(files_changed=Unlistable())  # type: ignore[arg-type]
        except ConfigError as exc:
            raised.append(exc)
        return "ok"

    async with manager_with(spec("r", runner)) as m:
        assert (await m.execute("r")).output == "ok"
    (error,) = raised
    assert isinstance(error, ConfigError)
    assert error.field == "files_changed"


# ---------------------------------------------------------------- hostile exceptions and numbers


class _RaisingBool(str):
    def __bool__(self) -> bool:
        raise RuntimeError("bool")

    def __format__(self, spec: str) -> str:
        raise RuntimeError("format")


class _StrReturnsHostile(Exception):
    def __str__(self) -> str:
        return _RaisingBool("hello")


class _ModuleNotAString(Exception):
    pass


_ModuleNotAString.__module__ = 5  # type: ignore[assignment]


@pytest.mark.parametrize("exc_type", [_StrReturnsHostile, _ModuleNotAString])
async def test_a_hostile_exception_ends_in_one_error_envelope(exc_type: type[Exception]) -> None:
    async def runner(request: Request, ctx: RunContext) -> str:
        raise exc_type("x")

    async with manager_with(spec("bad", runner), spec("echo", echo)) as m:
        handles = [m.spawn("bad"), m.spawn("echo", "sibling")]
        envelopes = [await h.wait() for h in handles]
        executed = await m.execute("bad")
    assert envelopes[0].status is Status.ERROR
    assert exc_type.__qualname__ in envelopes[0].error
    assert type(envelopes[0].error) is str
    assert envelopes[1].status is Status.COMPLETED
    assert executed.status is Status.ERROR


class _HostileFloat(float):
    def __format__(self, spec: str) -> str:
        raise RuntimeError("format")

    def __add__(self, other: object) -> float:
        raise RuntimeError("add")


@pytest.mark.parametrize("anyio_backend", clock_backends())
@pytest.mark.parametrize("where", ["options", "spec", "config"])
async def test_a_hostile_timeout_number_is_kept_as_a_plain_float(where: str) -> None:
    async def stuck(request: Request, ctx: RunContext) -> str:
        await anyio.sleep_forever()
        return "never"

    hostile = _HostileFloat(0.01)
    spec_kw = {"timeout": hostile} if where == "spec" else {}
    config_kw = {"spawn_timeout": hostile} if where == "config" else {}
    options = SpawnOptions(timeout=hostile) if where == "options" else None
    async with manager_with(spec("stuck", stuck, **spec_kw), **config_kw) as m:
        envelope = await m.spawn("stuck", options=options).wait()
    assert envelope.status is Status.TIMEOUT
    assert "0.01 s" in envelope.error
