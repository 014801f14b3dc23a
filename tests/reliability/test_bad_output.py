"""Bad runner output: huge, non-UTF-8, unprintable, wrongly typed. The envelope is still
produced (exactly one, with one completion event), bounded, and serialisable."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

from subagents import DelegateResult, Mailbox, Request, Result, RunContext, Status, Usage
from subagents._progress import MAX_OUTPUT_CHARS

from .support import completed_events, make_manager, recorded

pytestmark = pytest.mark.anyio

MB = 1_000_000
LONE = b"caf\xc3\xa9 \xff\xfe bytes".decode("utf-8", "surrogateescape")  # lone surrogates
# An envelope's text fields are bounded: output by MAX_OUTPUT_CHARS (plus a marker line),
# error by 500 characters, each path and the number of paths by the limits asserted below.
OUTPUT_BOUND = MAX_OUTPUT_CHARS + 100
ERROR_BOUND = 500


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ exploded")

    def __repr__(self) -> str:
        raise RuntimeError("__repr__ exploded")


class NotAStr(Exception):
    def __str__(self) -> str:
        return 42  # type: ignore[return-value]


class Weird(str):
    def __str__(self) -> str:
        raise RuntimeError("str subclass __str__ exploded")


def _returns(value: object) -> Callable[[Request, RunContext], Any]:
    async def runner(request: Request, ctx: RunContext) -> Any:
        return value

    return runner


def _makes(factory: Callable[[], object]) -> Callable[[Request, RunContext], Any]:
    async def runner(request: Request, ctx: RunContext) -> Any:
        return factory()

    return runner


def _raises(exc: BaseException) -> Callable[[Request, RunContext], Any]:
    async def runner(request: Request, ctx: RunContext) -> Any:
        raise exc

    return runner


def _reports(**report: Any) -> Callable[[Request, RunContext], Any]:
    async def runner(request: Request, ctx: RunContext) -> Any:
        ctx.report(**report)
        await anyio.sleep_forever()

    return runner


# name -> (runner, the statuses it may end in)
CASES: dict[str, tuple[Callable[[Request, RunContext], Any], set[Status]]] = {
    "huge_str": (_returns("x" * (5 * MB)), {Status.COMPLETED}),
    "huge_result": (_returns(Result(output="é" * (3 * MB))), {Status.COMPLETED}),
    "huge_partial": (_reports(output="p" * (4 * MB)), {Status.TIMEOUT}),
    "huge_append": (_reports(append="a" * (2 * MB)), {Status.TIMEOUT}),
    "huge_error_message": (_raises(ValueError("e" * (5 * MB))), {Status.ERROR}),
    "huge_result_error": (_returns(Result(error="r" * (5 * MB))), {Status.ERROR}),
    "huge_path": (_returns(Result(output="ok", files_changed=["d/" * MB])), {Status.COMPLETED}),
    "many_paths": (
        _returns(Result(output="ok", files_changed=[f"f{i}" for i in range(200_000)])),
        {Status.COMPLETED},
    ),
    "lone_surrogates_str": (_returns(LONE), {Status.COMPLETED}),
    "lone_surrogates_result": (_returns(Result(output=LONE)), {Status.COMPLETED}),
    "lone_surrogates_error": (_raises(ValueError(LONE)), {Status.ERROR}),
    "lone_surrogates_result_error": (_returns(Result(error=LONE)), {Status.ERROR}),
    "lone_surrogates_paths": (
        _returns(Result(output="ok", files_changed=[LONE])),
        {Status.COMPLETED},
    ),
    "lone_surrogates_partial": (_reports(output=LONE, files_changed=[LONE]), {Status.TIMEOUT}),
    "unprintable_exception": (_raises(Unprintable()), {Status.ERROR}),
    "exception_str_not_str": (_raises(NotAStr()), {Status.ERROR}),
    "str_subclass": (_returns(Weird("subclassed")), {Status.COMPLETED}),
    "bytes": (_returns(b"\xff\xfe raw bytes"), {Status.ERROR}),
    "none": (_returns(None), {Status.ERROR}),
    "output_bytes": (_returns(Result(output=b"raw")), {Status.ERROR}),  # type: ignore[arg-type]
    "usage_dict": (_returns(Result(usage={"input_tokens": 1})), {Status.ERROR}),  # type: ignore[arg-type]
    "iterations_str": (_returns(Result(iterations="3")), {Status.ERROR}),  # type: ignore[arg-type]
    "iterations_huge": (_returns(Result(iterations=10**30)), {Status.ERROR}),
    "iterations_negative": (_returns(Result(iterations=-5)), {Status.ERROR}),
    "usage_field_str": (_returns(Result(usage=Usage(input_tokens="5"))), {Status.ERROR}),  # type: ignore[arg-type]
    "usage_field_huge": (_returns(Result(usage=Usage(output_tokens=2**70))), {Status.ERROR}),
    "paths_not_str": (_returns(Result(files_changed=[1, 2])), {Status.ERROR}),  # type: ignore[list-item]
    "error_none": (_returns(Result(error=None)), {Status.ERROR}),  # type: ignore[arg-type]
    # A plain string status is converted (Result and DelegateResult accept the text).
    "status_str": (_returns(Result(output="x", status="completed")), {Status.COMPLETED}),
    # Result converts its status on construction, so the runner itself raises: still an error.
    "status_int": (_makes(lambda: Result(output="x", status=42)), {Status.ERROR}),  # type: ignore[arg-type]
    "status_timeout": (_returns(Result(output="x", status=Status.TIMEOUT)), {Status.TIMEOUT}),
    "report_output_int": (_reports(output=123), {Status.ERROR, Status.TIMEOUT}),
    "report_iterations_str": (_reports(iterations="many"), {Status.ERROR, Status.TIMEOUT}),
    "report_usage_str": (_reports(usage="lots"), {Status.ERROR, Status.TIMEOUT}),
    "report_paths_not_str": (_reports(files_changed=[1]), {Status.ERROR, Status.TIMEOUT}),
}


def check_bounded(env: DelegateResult) -> None:
    assert len(env.output) <= OUTPUT_BOUND, len(env.output)
    assert len(env.error) <= ERROR_BOUND, len(env.error)
    assert len(env.files_changed) <= 1000, len(env.files_changed)
    assert all(isinstance(f, str) and len(f) <= 4096 for f in env.files_changed)
    assert isinstance(env.output, str)
    assert isinstance(env.error, str)
    assert type(env.iterations) is int
    assert 0 <= env.iterations < 2**63
    for count in (env.usage.input_tokens, env.usage.output_tokens):
        assert type(count) is int
        assert 0 <= count < 2**63
    data = env.to_json()  # raises on lone surrogates or integers beyond 64 bits
    assert len(data) < 5 * OUTPUT_BOUND
    assert len(env.truncated(2000)) <= 2000
    assert DelegateResult.from_dict(env.to_dict()) == env


@pytest.mark.parametrize("case", sorted(CASES))
async def test_bad_output_still_ends_in_one_bounded_envelope(case: str) -> None:
    runner, allowed = CASES[case]
    async with make_manager({"bad": runner, "good": _returns("fine")}) as manager:
        # Only the hanging cases need the watchdog; the others get a generous one, since
        # checking a multi-megabyte result takes tens of ms on a loaded machine.
        timeout = 0.05 if Status.TIMEOUT in allowed else 30.0
        with recorded(manager) as events, anyio.fail_after(60):
            spawned = await manager.spawn("bad", timeout=timeout).wait()
            executed = await manager.execute("bad", timeout=timeout)
            # The manager survived: a sibling after it runs normally.
            after = await manager.spawn("good").wait()
        assert manager.running
    assert after.status is Status.COMPLETED
    for env in (spawned, executed):
        assert env.status in allowed, (case, env)
        check_bounded(env)
        (event,) = completed_events(events, env.task_id)
        event.to_json()


BACKEND_RETURNS: dict[str, object] = {
    "none": None,
    "str": "plain text",
    "dict": {"output": "x"},
    "status_str": Result(output="x", status="completed"),  # type: ignore[arg-type]
    "output_int": Result(output=123),  # type: ignore[arg-type]
    "lone_surrogates": Result(output=LONE, error=LONE),
}


@pytest.mark.parametrize("case", sorted(BACKEND_RETURNS))
async def test_a_custom_backend_returning_garbage_still_ends_in_one_envelope(case: str) -> None:
    """A Backend replaces run_local and skips its checks; the manager must still cope."""
    from subagents import AgentSpec, SubagentConfig, SubagentManager

    async def backend(spec: AgentSpec, request: Request, ctx: RunContext) -> Result:
        return BACKEND_RETURNS[case]  # type: ignore[return-value]

    spec = AgentSpec(name="remote", description="remote", runner=_returns("unused"))
    manager = SubagentManager([spec], config=SubagentConfig(), backend=backend)
    async with manager:
        with recorded(manager) as events, anyio.fail_after(10):
            envs = [await manager.spawn("remote").wait(), await manager.execute("remote")]
            envs.append(await manager.spawn("remote").wait())  # the manager survived
        assert manager.running
    for env in envs:
        check_bounded(env)
        assert len(completed_events(events, env.task_id)) == 1
        if case in ("str", "status_str"):  # text, and a status given as its text
            assert env.status is Status.COMPLETED
        elif case != "lone_surrogates":
            assert env.status is Status.ERROR, env


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_runner_raising_a_cancellation_nobody_requested_is_its_error() -> None:
    """asyncio only (trio's Cancelled cannot be raised by user code): a runner awaiting a
    future someone else cancelled gets CancelledError without being cancelled. That must
    end the child in an error, not kill its worker (which stalled the queue at limit 1)."""
    import asyncio

    async def spurious(request: Request, ctx: RunContext) -> str:
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        future.cancel()
        return await future

    async with make_manager({"spurious": spurious, "good": _returns("fine")}, limit=1) as manager:
        with anyio.fail_after(10):
            handles = [manager.spawn("spurious"), manager.spawn("good"), manager.spawn("good")]
            envs = [await handle.wait() for handle in handles]
            executed = await manager.execute("spurious")
    assert [env.status for env in envs] == [Status.ERROR, Status.COMPLETED, Status.COMPLETED]
    assert executed.status is Status.ERROR
    assert "nothing cancelled it" in envs[0].error


class FailingMailbox(Mailbox):
    """A mailbox backend whose every operation fails (a durable store with a dead disk)."""

    def put(self, task_id: str, envelope: DelegateResult) -> bool:
        raise OSError("disk on fire (put)")

    def drain(self, task_id: str) -> DelegateResult | None:
        raise OSError("disk on fire (drain)")

    def drop(self) -> None:
        super().drop()
        raise OSError("disk on fire (drop)")


async def test_a_failing_mailbox_backend_loses_nothing() -> None:
    """put, drain and drop raising: every child still ends in one envelope, published once
    and recorded; nested sessions still end; the manager keeps running and closes."""
    from subagents import AgentSpec, SubagentConfig, SubagentManager

    async def parent(request: Request, ctx: RunContext) -> str:
        ctx.spawn("leaf")
        await ctx.execute("leaf")
        return "parent done"

    specs = [
        AgentSpec(name="parent", description="p", runner=parent),
        AgentSpec(name="leaf", description="l", runner=_returns("leaf done")),
    ]
    manager = SubagentManager(
        specs, config=SubagentConfig(), mailbox_factory=lambda _session: FailingMailbox()
    )
    with recorded(manager) as events, anyio.fail_after(10):
        async with manager:
            handles = [manager.spawn("parent", session_id="s") for _ in range(3)]
            for handle in handles:
                await handle.done.wait()
                assert handle.result is not None
                assert handle.result.status is Status.COMPLETED
            # Collecting drains the mailbox: its backend's failure reaches the collector.
            with pytest.raises(OSError, match="drain"):
                await manager.wait_result(handles[0].task_id, timeout=0)
            with pytest.raises(OSError, match="drain"):
                await handles[1].wait()
            assert not handles[1].collected  # a failed collection collects nothing
            await manager.close_session("s")
            assert manager.running
            late = manager.spawn("leaf")
            await late.done.wait()
            assert late.result is not None
            assert late.result.status is Status.COMPLETED
    spawned = {e.task_id for e in events if e.type == "subagent.spawned"}
    assert len(spawned) == 3 * 3 + 1
    for task_id in spawned:
        assert manager.result(task_id) is not None
        assert len(completed_events(events, task_id)) == 1
