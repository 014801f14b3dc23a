"""What crosses the wire to a Ray worker and what a remote runner sees, without ray: the
remote context, the progress snapshot, exceptions made portable, runners by import path."""

from __future__ import annotations

import pickle

import anyio
import pytest

from subagents import ConfigError, Request, Result, Ruleset, SpawnRejected, Usage
from subagents.backends._ray_wire import (
    Delta,
    Exported,
    RemoteContext,
    RemoteRunnerError,
    Shipped,
    Snapshot,
    portable,
    resolve,
    revived,
    serve,
    target_of,
)

pytestmark = pytest.mark.anyio


class Sink:
    def __init__(self) -> None:
        self.pushed: list[tuple[str, Delta]] = []

    def push(self, task_id: str, delta: Delta) -> None:
        self.pushed.append((task_id, delta))


def shipped(**changes: object) -> Shipped:
    fields: dict[str, object] = {
        "task_id": "t-1",
        "parent_session_id": "default",
        "agent": "worker",
        "agent_path": "/root/worker",
        "parent_path": "/root",
        "attempt": 2,
        "permissions": Ruleset(allow=("read_*",)),
        "remaining": 10.0,
        "carrier": {},
        "sink": "sink",
    }
    fields.update(changes)
    return Shipped(**fields)  # type: ignore[arg-type]


async def reporting(request: Request, ctx: RemoteContext) -> str:
    ctx.report(output="draft", usage=Usage(input_tokens=1, output_tokens=2))
    ctx.report(append=" more", iterations=3, files_changed=["a.py"])
    return f"done {request.input}"


async def failing(request: Request, ctx: RemoteContext) -> str:
    ctx.report(output="before the failure")
    raise ValueError("remote failure")


async def returns_int(request: Request, ctx: RemoteContext) -> int:
    return 42


async def hangs(request: Request, ctx: RemoteContext) -> str:
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


class NeedsTwoArguments(Exception):
    def __init__(self, field: str, detail: str) -> None:
        self.field = field
        super().__init__(f"{field}: {detail}")


def test_a_snapshot_folds_reports_as_the_local_context_does() -> None:
    snapshot = Snapshot()
    snapshot.apply("first", None, None, None, None)
    snapshot.apply(None, " second", Usage(input_tokens=3), 2, ("a.py", "b.py"))
    snapshot.apply(None, None, None, None, ("a.py", "c.py"))
    assert snapshot.output == "first second"
    assert snapshot.usage == Usage(input_tokens=3)
    assert snapshot.iterations == 2
    assert snapshot.files == ["a.py", "b.py", "c.py"]


def test_a_snapshot_keeps_at_most_a_thousand_distinct_paths() -> None:
    snapshot = Snapshot()
    snapshot.apply(None, None, None, None, tuple(f"f{n}" for n in range(1500)))
    assert snapshot.files == [f"f{n}" for n in range(1000)]


async def test_the_remote_context_has_the_runs_identity_and_deadline() -> None:
    ctx = RemoteContext(shipped(), Sink())
    assert (ctx.task_id, ctx.session_id, ctx.parent_session_id) == ("t-1", "t-1", "default")
    assert (ctx.agent, ctx.agent_path, ctx.parent_path) == ("worker", "/root/worker", "/root")
    assert ctx.attempt == 2
    assert ctx.allows("read_file")
    assert not ctx.allows("write_file")
    remaining = ctx.remaining()
    assert remaining is not None
    assert 0 < remaining <= 10.0
    assert RemoteContext(shipped(remaining=None), Sink()).remaining() is None


async def test_report_sends_each_report_to_the_sink_in_order() -> None:
    sink = Sink()
    ctx = RemoteContext(shipped(), sink)
    ctx.report(output="a")
    ctx.report(append="b", iterations=1)
    assert [delta for _, delta in sink.pushed] == [
        ("a", None, None, None, None),
        (None, "b", None, 1, None),
    ]
    assert ctx.progress is not None
    assert ctx.progress.output == "ab"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"iterations": -1}, "iterations"),
        ({"output": 7}, "output"),
        ({"usage": "lots"}, "usage"),
        ({"files_changed": [1]}, "files_changed"),
    ],
)
async def test_a_bad_report_is_a_config_error_and_records_nothing(
    kwargs: dict[str, object], field: str
) -> None:
    sink = Sink()
    ctx = RemoteContext(shipped(), sink)
    with pytest.raises(ConfigError) as info:
        ctx.report(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field
    assert ctx.progress is None
    assert sink.pushed == []


async def test_a_remote_runner_cannot_delegate() -> None:
    ctx = RemoteContext(shipped(), Sink())
    with pytest.raises(SpawnRejected, match="from a runner on a Ray worker") as info:
        ctx.spawn("helper", "x")
    assert info.value.reason == "remote"
    with pytest.raises(SpawnRejected):
        await ctx.execute("helper", "x")


def test_a_picklable_exception_travels_as_itself() -> None:
    exc = ValueError("plain")
    assert portable(exc) is exc


def test_an_exception_whose_init_takes_other_arguments_is_rebuilt_with_its_type() -> None:
    exc = NeedsTwoArguments("mode", "not a mode")
    travelled = pickle.loads(pickle.dumps(portable(exc)))
    assert isinstance(travelled, Exported)
    again = revived(travelled)
    assert type(again) is NeedsTwoArguments
    assert str(again) == "mode: not a mode"
    assert again.field == "mode"


def test_an_exception_that_cannot_travel_becomes_a_remote_runner_error_naming_it() -> None:
    class Local(Exception):  # a local class pickles by reference to nowhere
        pass

    travelled = portable(Local("lost"))
    assert isinstance(travelled, RemoteRunnerError)
    assert "Local" in str(travelled)
    assert "lost" in str(travelled)


def test_a_module_level_runner_travels_by_import_path() -> None:
    target = target_of(reporting)
    assert target == f"{__name__}:reporting"
    cache: dict[str, object] = {}
    assert resolve(target, cache) is reporting  # type: ignore[arg-type]
    assert cache == {target: reporting}


def test_a_runner_without_an_import_path_travels_as_itself() -> None:
    async def local(request: Request, ctx: RemoteContext) -> str:
        return ""

    assert target_of(local) is local
    assert resolve(local, {}) is local


async def test_serve_returns_the_result_and_the_progress() -> None:
    request = Request(agent="worker", input="x")
    reply = await serve(target_of(reporting), request, shipped(), Sink(), {})
    assert reply.error is None
    assert reply.result == Result(output="done x")
    assert reply.progress == Snapshot(
        output="draft more",
        usage=Usage(input_tokens=1, output_tokens=2),
        iterations=3,
        files=["a.py"],
    )


async def test_serve_returns_a_runners_exception_with_its_progress() -> None:
    reply = await serve(failing, Request(agent="worker"), shipped(), Sink(), {})
    assert isinstance(reply.error, ValueError)
    assert str(reply.error) == "remote failure"
    assert reply.progress is not None
    assert reply.progress.output == "before the failure"


async def test_serve_returns_a_bad_return_value_as_a_runner_return_error() -> None:
    reply = await serve(returns_int, Request(agent="worker"), shipped(), Sink(), {})
    assert isinstance(reply.error, Exported)  # its __init__ takes the agent and a message
    error = revived(reply.error)
    assert type(error).__name__ == "RunnerReturnError"
    assert "int" in str(error)


async def test_serve_lets_a_cancellation_propagate() -> None:
    with anyio.move_on_after(0.01) as scope:
        await serve(hangs, Request(agent="worker"), shipped(), Sink(), {})
    assert scope.cancelled_caught
