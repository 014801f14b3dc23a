"""wait_agent: modes, bounds, consumption, races, the layering rule under a host-like
executor, the mailbox-full fallback, session close, and manager.completions."""

from __future__ import annotations

import anyio
import pytest
from test_tools import gated, toolset

from subagents import (
    AgentSpec,
    ConfigError,
    Request,
    RunContext,
    SpawnHandle,
    SubagentConfig,
    SubagentManager,
    _completions,
)
from subagents._json import dumps
from subagents.testing import call_with_host_timeout, echo_agent
from subagents.tools import ToolResult, Toolset, build_tools
from tests.helpers import clock_backends, on_mock_clock


async def spawn(tools: Toolset, agent: str, input: str) -> str:
    result = await tools.call("spawn_agent", {"agent": agent, "input": input})
    assert not result.is_error, result.content
    return str(result.details["task_id"])


def results_of(result: ToolResult) -> list[dict[str, object]]:
    dumps(result.details)
    entries = result.details["results"]
    assert isinstance(entries, list)
    return [e for e in entries if isinstance(e, dict)]


# ---------------------------------------------------------------- modes and consumption


@pytest.mark.anyio
async def test_wait_all_and_any() -> None:
    spec, release = gated()
    async with toolset(spec) as tools:
        a = await spawn(tools, "gated", "a")
        b = await spawn(tools, "gated", "b")
        release("a")
        first = await tools.call("wait_agent", {"task_ids": [a, b], "mode": "any"})
        assert first.details["completed"] is True
        assert first.details["timed_out"] is False
        assert [e["task_id"] for e in results_of(first)] == [a]
        pending = first.details["pending"]
        assert isinstance(pending, list)
        assert pending[0]["task_id"] == b  # type: ignore[index,call-overload]
        assert pending[0]["status"] == "running"  # type: ignore[index,call-overload]
        assert "still pending" in first.content
        release("b")
        rest = await tools.call("wait_agent", {"task_ids": [a, b]})  # mode all by default
        assert rest.details["mode"] == "all"
        assert rest.details["completed"] is True
        entries = {str(e["task_id"]): e for e in results_of(rest)}
        assert entries[a]["already_collected"] is True
        assert entries[b]["already_collected"] is False
        assert entries[b]["output"] == "gated: b"


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_timeout_reports_pending_and_keeps_the_child() -> None:
    spec, release = gated()
    async with toolset(spec) as tools:
        a = await spawn(tools, "gated", "a")
        result = await tools.call("wait_agent", {"task_ids": a, "timeout_ms": 20})
        assert result.details["timed_out"] is True
        assert result.details["completed"] is False
        assert result.details["task_id"] == a
        assert "timed_out after 20 ms" in result.content
        assert a in result.content
        release("a")
        later = await tools.call("wait_agent", {"task_ids": a, "timeout_ms": 5000})
        assert results_of(later)[0]["output"] == "gated: a"


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_requested_timeout_is_clamped_and_reported(anyio_backend: object) -> None:
    spec, release = gated()
    async with toolset(spec, engine_tool_timeout=0.5, wait_timeout=0.1) as tools:
        a = await spawn(tools, "gated", "a")
        start = anyio.current_time()
        result = await tools.call("wait_agent", {"task_ids": [a], "timeout_ms": 600_000})
        waited = anyio.current_time() - start
        assert not result.is_error
        assert result.details["timed_out"] is True
        assert result.details["completed"] is False
        assert result.details["clamped"] is True
        assert result.details["timeout_ms"] == 450
        assert result.details["requested_timeout_ms"] == 600_000
        assert "clamped" in result.content
        assert "450" in result.content
        if on_mock_clock(anyio_backend):
            assert waited == pytest.approx(0.45)
        release("a")


@pytest.mark.anyio
async def test_zero_timeout_checks_without_waiting() -> None:
    spec, release = gated()
    async with toolset(spec, echo_agent()) as tools:
        live = await spawn(tools, "gated", "a")
        with anyio.fail_after(1):
            result = await tools.call("wait_agent", {"task_ids": live, "timeout_ms": 0})
        assert result.details["timed_out"] is True
        done = await spawn(tools, "echo", "x")
        await tools.manager.handle(done).done.wait()
        result = await tools.call("wait_agent", {"task_ids": done, "timeout_ms": 0})
        assert results_of(result)[0]["output"] == "echo: x"
        release("a")


@pytest.mark.anyio
async def test_each_result_is_consumed_once() -> None:
    async with toolset() as tools:
        a = await spawn(tools, "echo", "x")
        first = await tools.call("wait_agent", {"task_ids": a})
        assert results_of(first)[0]["already_collected"] is False
        assert tools.manager.mailbox("root").peek(a) is None  # drained from the mailbox
        with anyio.fail_after(1):
            again = await tools.call("wait_agent", {"task_ids": a, "timeout_ms": 20_000})
        assert again.details["completed"] is True
        assert results_of(again)[0]["already_collected"] is True
        assert "already collected" in again.content
        assert "echo: x" in again.content


@pytest.mark.anyio
async def test_cancelled_wait_consumes_nothing() -> None:
    spec, release = gated()
    async with toolset(spec) as tools:
        a = await spawn(tools, "gated", "a")
        scopes: list[anyio.CancelScope] = []
        caught: list[bool] = []

        async def waiter() -> None:
            with anyio.CancelScope() as scope:
                scopes.append(scope)
                await tools.call("wait_agent", {"task_ids": a, "timeout_ms": 10_000})
            caught.append(scope.cancelled_caught)

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            scopes[0].cancel()
        assert caught == [True]  # the caller's cancellation went through, not swallowed
        release("a")
        await tools.manager.handle(a).done.wait()
        assert not tools.manager.handle(a).collected
        result = await tools.call("wait_agent", {"task_ids": a})
        assert results_of(result)[0]["already_collected"] is False


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_result_landing_at_the_deadline_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wake-up for a result is lost in the deadline's instant: the record decides."""
    spec, release = gated()

    async def wake_lost(handles: list[SpawnHandle], mode: str, wake: object = None) -> None:
        release("a")
        await handles[0].done.wait()
        await anyio.sleep_forever()  # as if the deadline fired before the wake-up

    async with toolset(spec) as tools:
        a = await spawn(tools, "gated", "a")
        # private: no public way to lose a wake-up in the deadline's instant.
        monkeypatch.setattr(_completions, "wait_handles", wake_lost)
        result = await tools.call("wait_agent", {"task_ids": a, "timeout_ms": 50})
        assert result.details["completed"] is True
        assert result.details["timed_out"] is False
        assert results_of(result)[0]["output"] == "gated: a"


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_results_landing_around_the_wait_deadline_are_each_delivered_fresh_once() -> None:
    """Children finish around the wait deadline; every result is delivered fresh once."""

    async def timed(request: Request, ctx: RunContext) -> str:
        await anyio.sleep(float(request.input))
        return request.input

    m = SubagentManager(
        [AgentSpec(name="timed", description="Sleeps.", runner=timed)],
        config=SubagentConfig(max_concurrent_spawns=64),
    )
    async with m:
        tools = build_tools(m, "root")
        ids = [await spawn(tools, "timed", f"{0.02 + i * 0.001:.3f}") for i in range(20)]
        fresh: list[str] = []
        for tid in ids:
            r = await tools.call("wait_agent", {"task_ids": [tid], "timeout_ms": 1})
            if r.details["completed"]:
                assert results_of(r)[0]["already_collected"] is False
                fresh.append(tid)
            else:
                assert r.details["timed_out"] is True
        r = await tools.call("wait_agent", {"task_ids": ids, "timeout_ms": 2000})
        assert r.details["completed"] is True
        entries = results_of(r)
        again = [str(e["task_id"]) for e in entries if not e["already_collected"]]
        old = [str(e["task_id"]) for e in entries if e["already_collected"]]
        deferred = r.details.get("deferred", [])
        assert isinstance(deferred, list)
        assert sorted(fresh + again + [str(d) for d in deferred]) == sorted(ids)
        # repeats that do not fit the bound are only named in the text, not in details
        assert set(old) <= set(fresh)
        for tid in set(fresh) - set(old):
            assert tid in r.content


# ---------------------------------------------------------------- unknown ids


@pytest.mark.anyio
async def test_unknown_ids_are_errors_not_empty_answers() -> None:
    spec, release = gated()
    async with toolset(spec) as tools:
        a = await spawn(tools, "gated", "a")
        result = await tools.call("wait_agent", {"task_ids": a[:-2]})
        assert result.is_error
        assert f"did you mean '{a}'" in result.content
        assert a in result.content  # listed among the live ones too
        other = tools.manager.spawn("gated", "b", session_id="elsewhere")
        foreign = await tools.call("wait_agent", {"task_ids": [a, other.task_id]})
        assert foreign.is_error
        assert "another session" in foreign.content
        both = await tools.call("wait_agent", {"task_ids": ["nope1", "nope2"]})
        assert both.is_error
        assert "nope1" in both.content
        assert "nope2" in both.content
        assert "Nothing was collected" in both.content
        assert both.details == {"error": "unknown_task", "task_ids": ["nope1", "nope2"]}
        assert not tools.manager.handle(a).collected
        release("a")
        release("b")


# ---------------------------------------------------------------- bounds


async def long_output(request: Request, ctx: RunContext) -> str:
    return request.input * 5000


@pytest.mark.anyio
async def test_results_are_bounded_in_total_and_none_is_lost() -> None:
    spec = AgentSpec(name="long", description="Writes a lot.", runner=long_output)
    config = SubagentConfig(max_concurrent_spawns=8)
    async with toolset(spec, config=config) as tools:
        ids = [await spawn(tools, "long", letter) for letter in "abcdefgh"]
        for task_id in ids:
            await tools.manager.handle(task_id).done.wait()
        seen: list[str] = []
        for _ in range(len(ids)):
            result = await tools.call("wait_agent", {"task_ids": ids})
            assert len(result.content) <= tools.limits.truncate_chars
            assert result.details["completed"] is True
            fresh = [str(e["task_id"]) for e in results_of(result) if not e["already_collected"]]
            seen += fresh
            deferred = result.details["deferred"]
            assert isinstance(deferred, list)
            if not deferred:
                break
            assert "did not fit" in result.content
        assert sorted(seen) == sorted(ids)  # every result delivered, exactly once


@pytest.mark.anyio
async def test_short_results_all_fit_in_one_answer() -> None:
    async with toolset(config=SubagentConfig(max_concurrent_spawns=10)) as tools:
        ids = [await spawn(tools, "echo", str(i)) for i in range(10)]
        result = await tools.call("wait_agent", {"task_ids": ids})
        assert len(results_of(result)) == 10
        assert result.details["deferred"] == []
        assert len(result.content) <= tools.limits.truncate_chars


# ---------------------------------------------------------------- mailbox full, session closed


@pytest.mark.anyio
async def test_full_mailbox_never_hides_a_result() -> None:
    config = SubagentConfig(mailbox_capacity=1, max_concurrent_spawns=3)
    async with toolset(config=config) as tools:
        ids = [await spawn(tools, "echo", str(i)) for i in range(3)]
        for task_id in ids:
            await tools.manager.handle(task_id).done.wait()
        assert len(tools.manager.mailbox("root")) == 1  # two results never made it in
        result = await tools.call("wait_agent", {"task_ids": ids})
        assert sorted(str(e["output"]) for e in results_of(result)) == [
            "echo: 0",
            "echo: 1",
            "echo: 2",
        ]
        assert len(tools.manager.mailbox("root")) == 0


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_wait_wakes_early_when_the_session_closes(anyio_backend: object) -> None:
    gate: list[anyio.Event] = []

    async def stubborn(request: Request, ctx: RunContext) -> str:
        gate.append(anyio.Event())
        with anyio.CancelScope(shield=True):
            await gate[0].wait()
        return "too late"

    spec = AgentSpec(name="stubborn", description="Ignores cancellation.", runner=stubborn)
    config = SubagentConfig(settle_timeout=0.05)
    async with SubagentManager([spec], config=config) as manager:
        tools = build_tools(manager, "s1", engine_tool_timeout=20, wait_timeout=10)
        a = await spawn(tools, "stubborn", "x")
        answer: list[ToolResult] = []

        async def waiter() -> None:
            answer.append(await tools.call("wait_agent", {"task_ids": a}))

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter)
                await anyio.wait_all_tasks_blocked()
                await manager.close_session("s1")
        result = answer[0]
        assert result.details["session_closed"] is True
        assert result.details["completed"] is False
        assert result.details["timed_out"] is False
        assert "session was closed" in result.content
        if on_mock_clock(anyio_backend):  # woken as the close began, not by wait_timeout
            assert result.details["waited_ms"] == 0
        gate[0].set()


# ---------------------------------------------------------------- timeout layering


@pytest.mark.anyio
# Trio's mock clock only: the 50 ms margin of a 0.5 s host timeout is a duration claim a
# loaded machine's real clock breaks; the real-time race of tests/reliability covers asyncio.
@pytest.mark.parametrize("anyio_backend", clock_backends()[1:])
@pytest.mark.parametrize(
    ("engine", "overrides", "wait"),
    [(0.5, None, 0.2), (60.0, {"wait_agent": 0.5}, 0.3)],
)
async def test_wait_answers_timed_out_before_the_host_kills_it(
    engine: float, overrides: dict[str, float] | None, wait: float
) -> None:
    spec, release = gated()
    async with SubagentManager([spec]) as manager:
        tools = build_tools(
            manager, "root", engine_tool_timeout=engine, tool_timeouts=overrides, wait_timeout=wait
        )
        a = await spawn(tools, "gated", "a")
        for request in (None, 10**12):
            args: dict[str, object] = {"task_ids": a}
            if request is not None:
                args["timeout_ms"] = request
            result = await call_with_host_timeout(tools, "wait_agent", args)
            assert result.details.get("error") != "host_timeout", result.content
            assert result.details["timed_out"] is True
            assert result.details["clamped"] is (request is not None)
        assert "clamped to 450" in result.content
        # The executor does kill a tool that overruns its timeout: the check above can fail.
        killed = await call_with_host_timeout(
            tools, "wait_agent", {"task_ids": a, "timeout_ms": 400}, timeout=0.05
        )
        assert killed.details["error"] == "host_timeout"
        release("a")


# ---------------------------------------------------------------- waking an idle parent


@pytest.mark.anyio
async def test_completions_peek_without_consuming() -> None:
    spec, release = gated()
    async with toolset(spec) as tools:
        manager = tools.manager
        with anyio.fail_after(1):
            assert await manager.completions("root") == []  # nothing to wait for
        a = await spawn(tools, "gated", "a")
        b = await spawn(tools, "gated", "b")
        woken: list[list[str]] = []

        async def sleeper() -> None:
            ready = await manager.completions("root")
            woken.append([e.task_id for e in ready])

        async with anyio.create_task_group() as tg:
            tg.start_soon(sleeper)
            await anyio.wait_all_tasks_blocked()
            assert woken == []
            release("b")
        assert woken == [[b]]
        assert not manager.handle(b).collected
        assert manager.mailbox("root").peek(b) is not None
        result = await tools.call("wait_agent", {"task_ids": b})
        assert results_of(result)[0]["already_collected"] is False
        release("a")
        async with manager.completions("root") as completions:
            seen = [envelope.task_id async for envelope in completions]
        assert seen == [a]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_completions_end_when_the_session_closes() -> None:
    spec, release = gated()
    async with SubagentManager([spec], config=SubagentConfig(settle_timeout=0.05)) as manager:
        manager.spawn("gated", "a", session_id="s2")
        async with anyio.create_task_group() as tg:
            ready: list[object] = []

            async def sleeper() -> None:
                ready.extend(await manager.completions("s2"))

            tg.start_soon(sleeper)
            await anyio.wait_all_tasks_blocked()
            await manager.close_session("s2")
        # The cancelled child's envelope is what woke the sleeper.
        assert len(ready) == 1
        with anyio.fail_after(1):
            assert await manager.completions("s2") == ready  # peeked, still there
        release("a")


@pytest.mark.anyio
async def test_completions_see_a_child_spawned_during_the_wait() -> None:
    spec, release = gated()
    async with toolset(spec, echo_agent()) as tools:
        manager = tools.manager
        await spawn(tools, "gated", "slow")
        ready: list[str] = []

        async def sleeper() -> None:
            ready.extend(e.task_id for e in await manager.completions("root"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(sleeper)
            await anyio.wait_all_tasks_blocked()
            quick = await spawn(tools, "echo", "x")
        assert ready == [quick]
        release("slow")


@pytest.mark.anyio
async def test_completions_return_when_the_manager_closes() -> None:
    spec, _ = gated()
    ready: list[object] = ["sentinel"]
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg, SubagentManager([spec]) as manager:
            manager.spawn("gated", "never")

            async def sleeper() -> None:
                ready[:] = await manager.completions("root")

            tg.start_soon(sleeper)
            await anyio.wait_all_tasks_blocked()
    # Woken by the cancelled child's envelope (or the close), never left spinning.
    assert all(getattr(e, "status", None) == "cancelled" for e in ready)


@pytest.mark.anyio
async def test_two_concurrent_waits_share_one_result_without_loss() -> None:
    spec, release = gated()
    async with toolset(spec) as tools:
        a = await spawn(tools, "gated", "a")
        answers: list[ToolResult] = []

        async def waiter() -> None:
            answers.append(await tools.call("wait_agent", {"task_ids": a, "timeout_ms": 5000}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            release("a")
        flags = sorted(bool(results_of(r)[0]["already_collected"]) for r in answers)
        assert flags == [False, True]  # consumed once, the other sees it marked
        assert all(results_of(r)[0]["output"] == "gated: a" for r in answers)


@pytest.mark.anyio
async def test_small_budget_keeps_the_notes() -> None:
    long = AgentSpec(name="long", description="Writes a lot.", runner=long_output)
    spec, release = gated()
    config = SubagentConfig(max_concurrent_spawns=40)
    async with toolset(long, spec, config=config, truncate_chars=600) as tools:
        done = [await spawn(tools, "long", str(i % 10)) for i in range(30)]
        live = [await spawn(tools, "gated", str(i)) for i in range(5)]
        for task_id in done:
            await tools.manager.handle(task_id).done.wait()
        result = await tools.call("wait_agent", {"task_ids": done + live, "mode": "any"})
        assert len(result.content) <= 600
        assert "did not fit" in result.content
        assert "still pending" in result.content
        assert len(results_of(result)) >= 1
        for i in range(5):
            release(str(i))


@pytest.mark.anyio
@pytest.mark.parametrize("bad", ["1", float("nan"), -1.0, True])
async def test_completions_wait_for_refuses_a_malformed_timeout(bad: object) -> None:
    async with SubagentManager([echo_agent()]) as manager:
        handle = manager.spawn("echo", "x")
        with pytest.raises(ConfigError, match="timeout"):
            await manager.completions().wait_for([handle], timeout=bad)  # type: ignore[arg-type]
        await handle.wait()
