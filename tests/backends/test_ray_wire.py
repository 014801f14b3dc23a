"""What crosses the wire to a Ray worker and what a remote runner sees, without ray: the
remote context, the progress snapshot, exceptions made portable, runners by import path."""

from __future__ import annotations

import pickle

import anyio
import pytest

from subagents import Budget, ConfigError, Request, Result, Ruleset, SpawnRejected, Usage
from subagents._envelope import describe_exception
from subagents._progress import MAX_OUTPUT_CHARS, Report
from subagents.backends._ray_wire import (
    Exported,
    RemoteContext,
    RemoteRunnerError,
    Reply,
    Shipped,
    Snapshot,
    by_value,
    portable,
    resolve,
    revived,
    serve,
    target_of,
)

pytestmark = pytest.mark.anyio


class Sink:
    def __init__(self) -> None:
        self.pushed: list[tuple[str, Report]] = []

    def push(self, task_id: str, report: Report) -> None:
        self.pushed.append((task_id, report))


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
        "budget": Budget(),
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
    snapshot.apply(Report(output="first"))
    snapshot.apply(Report(append=" second", usage=Usage(input_tokens=3), iterations=2))
    snapshot.apply(Report(files=("a.py", "b.py")))
    snapshot.apply(Report(files=("a.py", "c.py")))
    assert snapshot.progress.output() == "first second"
    assert snapshot.usage == Usage(input_tokens=3)
    assert snapshot.iterations == 2
    assert snapshot.progress.files() == ("a.py", "b.py", "c.py")


def test_a_snapshot_counts_the_paths_past_a_thousand_as_an_envelope_does() -> None:
    snapshot = Snapshot()
    snapshot.apply(Report(files=tuple(f"f{n}" for n in range(1500))))
    files = pickle.loads(pickle.dumps(snapshot)).progress.files()
    assert files == (*(f"f{n}" for n in range(999)), "[… 501 more paths]")


def test_a_snapshot_says_whether_a_report_replaced_the_output() -> None:
    snapshot = Snapshot()
    snapshot.apply(Report(append="more", files=("a.py",)))
    assert not snapshot.replaced
    snapshot.apply(Report(output="fresh"))
    assert snapshot.replaced


def test_the_remote_snapshot_keeps_no_more_output_than_an_envelope_holds() -> None:
    # Locally, output past MAX_OUTPUT_CHARS is counted, not kept, and each append costs
    # what it appends; a remote snapshot that concatenated everything would copy all
    # before it at each append and ship it all back in the reply.
    ctx = RemoteContext(shipped(remaining=None), Sink())  # no deadline: no event loop needed
    chunk = "x" * 100_000
    for _ in range(3 * MAX_OUTPUT_CHARS // len(chunk)):
        ctx.report(append=chunk)
    assert ctx.progress is not None
    assert len(pickle.dumps(ctx.progress)) < 2 * MAX_OUTPUT_CHARS


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


async def test_the_remote_budget_is_what_was_left_at_the_call_less_what_the_run_reported() -> None:
    budget = Budget(tokens=100, input_tokens=80, seconds=10.0, spawns=3)
    ctx = RemoteContext(shipped(budget=budget), Sink())
    before = ctx.remaining_budget()
    assert (before.tokens, before.input_tokens, before.output_tokens) == (100, 80, None)
    ctx.report(usage=Usage(input_tokens=30, output_tokens=20))
    ctx.report(usage=Usage(input_tokens=90, output_tokens=20))  # a running total
    after = ctx.remaining_budget()
    assert (after.tokens, after.input_tokens, after.output_tokens) == (0, 0, None)
    assert after.spawns == 3
    assert after.seconds is not None
    assert 0.0 <= after.seconds <= 10.0


async def test_an_unlimited_remote_budget_stays_unlimited() -> None:
    ctx = RemoteContext(shipped(), Sink())
    ctx.report(usage=Usage(input_tokens=5, output_tokens=5))
    assert ctx.remaining_budget() == Budget()


async def test_report_sends_each_report_to_the_sink_in_order() -> None:
    sink = Sink()
    ctx = RemoteContext(shipped(), sink)
    ctx.report(output="a")
    ctx.report(append="b", iterations=1)
    assert [report for _, report in sink.pushed] == [
        Report(output="a"),
        Report(append="b", iterations=1),
    ]
    assert ctx.progress is not None
    assert ctx.progress.progress.output() == "ab"


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


async def test_a_remote_runner_is_refused_peer_messaging_as_delegation_is() -> None:
    ctx = RemoteContext(shipped(), Sink())
    calls = {
        "send": lambda: ctx.send("peer", "hi"),
        "inbox": ctx.inbox,
        "peers": ctx.peers,
        "asides": ctx.asides,
        "previous": lambda: ctx.previous,
        "revived_by": lambda: ctx.revived_by,
    }
    for name, call in calls.items():
        with pytest.raises(SpawnRejected, match=rf"ctx\.{name} is not available") as info:
            call()
        assert info.value.reason == "remote"
    with pytest.raises(SpawnRejected, match=r"ctx\.recv"):
        await ctx.recv(timeout=1)
    with pytest.raises(SpawnRejected, match=r"ctx\.ask"):
        await ctx.ask("peer", "hi")


def reply_of(exc: BaseException) -> Reply:
    return Reply(
        result=None,
        error=portable(exc, pickle.dumps),
        error_type=describe_exception(exc),
        progress=None,
    )


def test_a_picklable_exception_travels_as_itself() -> None:
    again = revived(reply_of(ValueError("plain")))
    assert type(again) is ValueError
    assert str(again) == "plain"


def test_an_exception_whose_init_takes_other_arguments_is_rebuilt_with_its_type() -> None:
    exc = NeedsTwoArguments("mode", "not a mode")
    assert isinstance(pickle.loads(portable(exc, pickle.dumps)), Exported)
    again = revived(reply_of(exc))
    assert type(again) is NeedsTwoArguments
    assert str(again) == "mode: not a mode"
    assert again.field == "mode"


def test_an_exception_that_cannot_travel_becomes_a_remote_runner_error_naming_it() -> None:
    class Local(Exception):  # a local class pickles by reference to nowhere
        pass

    travelled = revived(reply_of(Local("lost")))
    assert isinstance(travelled, RemoteRunnerError)
    assert "Local" in str(travelled)
    assert "lost" in str(travelled)


def test_an_exception_the_driver_cannot_unpickle_keeps_its_type_name_and_text() -> None:
    reply = Reply(
        result=None,
        error=b"not a pickle",
        error_type=("gpu_only.GpuError", "GpuError: out of memory"),
        progress=None,
    )
    again = revived(reply)
    assert isinstance(again, RemoteRunnerError)
    assert describe_exception(again) == ("gpu_only.GpuError", "GpuError: out of memory")


def test_a_copy_shipped_by_value_claims_main_and_runs_the_same_code() -> None:
    copy = by_value(reporting)
    assert copy is not reporting
    assert copy.__module__ == "__main__"
    assert copy.__qualname__ == reporting.__qualname__
    assert copy.__code__ is reporting.__code__


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
    reply = await serve(target_of(reporting), request, shipped(), Sink(), {}, pickle.dumps)
    assert reply.error is None
    assert reply.result == Result(output="done x")
    assert reply.progress is not None
    assert reply.progress.progress.output() == "draft more"
    assert reply.progress.progress.files() == ("a.py",)
    assert reply.progress.totals() == Report(
        usage=Usage(input_tokens=1, output_tokens=2), iterations=3
    )


async def test_serve_answers_missing_for_a_path_the_worker_cannot_import() -> None:
    request = Request(agent="worker")
    target = "nowhere_on_this_worker:runner"
    reply = await serve(target, request, shipped(), Sink(), {}, pickle.dumps)
    assert reply.missing
    assert (reply.result, reply.error) == (None, None)


async def test_serve_returns_a_runners_exception_with_its_progress() -> None:
    reply = await serve(failing, Request(agent="worker"), shipped(), Sink(), {}, pickle.dumps)
    error = revived(reply)
    assert isinstance(error, ValueError)
    assert str(error) == "remote failure"
    assert reply.progress is not None
    assert reply.progress.progress.output() == "before the failure"


async def test_serve_returns_a_bad_return_value_as_a_runner_return_error() -> None:
    reply = await serve(returns_int, Request(agent="worker"), shipped(), Sink(), {}, pickle.dumps)
    assert reply.error is not None
    assert isinstance(pickle.loads(reply.error), Exported)  # its __init__ takes other args
    error = revived(reply)
    assert type(error).__name__ == "RunnerReturnError"
    assert "int" in str(error)


async def test_serve_lets_a_cancellation_propagate() -> None:
    with anyio.move_on_after(0.01) as scope:
        await serve(hangs, Request(agent="worker"), shipped(), Sink(), {}, pickle.dumps)
    assert scope.cancelled_caught


async def interrupts_in_a_group_with_its_cancellation(request: Request, ctx: RemoteContext) -> str:
    raise BaseExceptionGroup("x", [KeyboardInterrupt(), anyio.get_cancelled_exc_class()()])


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit])
async def test_serve_on_an_actor_makes_an_interrupt_the_replys_error_with_its_progress(
    raised: type[BaseException],
) -> None:
    async def interrupts(request: Request, ctx: RemoteContext) -> str:
        ctx.report(output="before the interrupt")
        raise raised()

    sink = Sink()
    reply = await serve(
        interrupts,
        Request(agent="worker"),
        shipped(),
        sink,
        {},
        pickle.dumps,
        interrupt_is_error=True,
    )
    assert f"the runner raised {raised.__name__} on its actor" in str(revived(reply))
    assert reply.progress is not None
    assert reply.progress.progress.output() == "before the interrupt"
    with pytest.raises(raised):  # elsewhere (a task, whose cancel it may be) it goes on up
        await serve(interrupts, Request(agent="worker"), shipped(), sink, {}, pickle.dumps)


# An actor's event loop is asyncio's (and trio's Cancelled has no public constructor).
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_serve_on_an_actor_lets_a_group_holding_its_cancellation_propagate() -> None:
    """An interrupt in a group with the cancellation of a run being cancelled is not
    the run's error: the cancellation must go on up."""
    with anyio.CancelScope() as scope:
        scope.cancel()
        with pytest.raises(BaseExceptionGroup) as raised:
            await serve(
                interrupts_in_a_group_with_its_cancellation,
                Request(agent="worker"),
                shipped(),
                Sink(),
                {},
                pickle.dumps,
                interrupt_is_error=True,
            )
    assert raised.group_contains(anyio.get_cancelled_exc_class())
