"""Acceptance tests for the core runtime (issue 2), written from README.md and design/ only.

Every test uses public names (``from subagents import ...``) and runs on asyncio and trio.
Where the docs leave a spelling open, the obvious alternatives a tester would try are
tested too (marked "alternative spelling").
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from subagents import (
    AgentPath,
    AgentSpec,
    CompletionNotifier,
    ConfigError,
    DelegateResult,
    Mailbox,
    MailboxFull,
    Request,
    Result,
    RetryPolicy,
    Ruleset,
    RunContext,
    SpawnHandle,
    SpawnOptions,
    SpawnRejected,
    Status,
    SubagentConfig,
    SubagentManager,
    SubagentsError,
    TransientError,
    UnknownAgent,
    UnknownTask,
    Usage,
)

pytestmark = pytest.mark.anyio


# --- helpers -----------------------------------------------------------------------------


async def echo(request: Request, ctx: RunContext) -> str:
    return request.input


async def forever(request: Request, ctx: RunContext) -> str:
    ctx.report(output="partial work")
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


def spec(name: str, runner: Any, **kw: Any) -> AgentSpec:
    return AgentSpec(name=name, description=f"{name} agent", runner=runner, **kw)


def manager(*specs: AgentSpec, **config: Any) -> SubagentManager:
    return SubagentManager(list(specs), config=SubagentConfig(**config))


def envelope(**kw: Any) -> DelegateResult:
    fields: dict[str, Any] = {
        "agent": "general",
        "task_id": "t1",
        "status": Status.COMPLETED,
        "output": "done",
        "duration_ms": 12,
        "agent_path": "/root/general",
        "parent_path": "/root",
        "usage": Usage(input_tokens=10, output_tokens=5),
    }
    fields.update(kw)
    return DelegateResult(**fields)


class Live:
    """Counts runners alive; holds them on a gate."""

    def __init__(self) -> None:
        self.alive = 0
        self.peak = 0
        self.started: list[str] = []
        self.gate = anyio.Event()

    async def runner(self, request: Request, ctx: RunContext) -> str:
        self.alive += 1
        self.peak = max(self.peak, self.alive)
        self.started.append(request.input)
        try:
            await self.gate.wait()
            return f"ok {request.input}"
        finally:
            self.alive -= 1


# --- public names, defaults ----------------------------------------------------------------


def test_exception_tree() -> None:
    for exc in (UnknownAgent, UnknownTask, SpawnRejected, ConfigError, MailboxFull):
        assert issubclass(exc, SubagentsError), exc
    assert issubclass(SubagentsError, Exception)


def test_status_is_a_str_enum() -> None:
    assert {s.value for s in Status} == {"completed", "error", "timeout", "cancelled"}
    assert Status.COMPLETED == "completed"
    assert Status("timeout") is Status.TIMEOUT
    assert isinstance(Status.ERROR, str)


def test_documented_defaults() -> None:
    config = SubagentConfig()
    assert config.max_concurrent_spawns == 4
    assert config.spawn_timeout == 180
    assert config.execute_timeout == 180
    assert config.max_depth == 3
    assert config.mailbox_capacity == 64
    assert config.mailbox_ttl is None
    assert config.truncate_chars == 2000
    assert config.settle_timeout == 5
    assert Mailbox().capacity == 64


def test_default_mailbox_cap_is_64() -> None:
    box = Mailbox()
    for i in range(64):
        box.put(f"t{i}", envelope(task_id=f"t{i}"))
    with pytest.raises(MailboxFull):
        box.put("t64", envelope(task_id="t64"))


def test_default_truncation_is_2000() -> None:
    text = envelope(output="x" * 10_000).truncated()
    assert 1500 < len(text) <= 2000


@pytest.mark.parametrize("bad", [0, -1])
def test_zero_or_negative_concurrency_is_a_config_error(bad: int) -> None:
    with pytest.raises(ConfigError):
        SubagentManager([spec("echo", echo)], config=SubagentConfig(max_concurrent_spawns=bad))


async def test_set_max_concurrent_spawns_zero_is_a_config_error() -> None:
    async with manager(spec("echo", echo)) as m:
        with pytest.raises(ConfigError):
            m.set_max_concurrent_spawns(0)
        assert m.max_concurrent_spawns == 4


# --- envelope ------------------------------------------------------------------------------


def test_to_dict_omits_empty_optional_fields() -> None:
    env = envelope(output="", files_changed=(), error="")
    data = env.to_dict()
    for key in ("files_changed", "error", "error_type", "output"):
        assert key not in data, key
    for key in ("agent", "task_id", "status", "duration_ms", "timestamp_ms"):
        assert key in data, key
    assert data["status"] == "completed"
    assert isinstance(data["timestamp_ms"], int)
    assert isinstance(data["duration_ms"], int)
    # times are unix milliseconds (today, not seconds or nanoseconds)
    assert abs(data["timestamp_ms"] - time.time() * 1000) < 60_000


def test_to_dict_keeps_present_fields_and_round_trips() -> None:
    env = envelope(
        status=Status.ERROR,
        error="ValueError: bad",
        error_type="ValueError",
        files_changed=["a.py", "b.py"],
        iterations=3,
        queue_ms=7,
        attempts=2,
    )
    data = env.to_dict()
    assert data["files_changed"] == ["a.py", "b.py"]
    assert data["error"] == "ValueError: bad"
    assert data["status"] == "error"
    assert DelegateResult.from_dict(data) == env
    # through JSON text (orjson bytes)
    raw = env.to_json()
    assert json.loads(raw) == data
    assert DelegateResult.from_dict(json.loads(raw)) == env


def test_round_trip_of_a_minimal_envelope() -> None:
    env = DelegateResult(agent="a", task_id="t", status=Status.CANCELLED)
    assert DelegateResult.from_dict(env.to_dict()) == env
    assert DelegateResult.from_dict(json.loads(env.to_json())) == env


def test_status_given_as_text() -> None:
    env = DelegateResult(agent="a", task_id="t", status="timeout")
    assert env.status == Status.TIMEOUT
    assert env.to_dict()["status"] == "timeout"


def test_truncated_has_header_lines_and_output() -> None:
    env = envelope(output="the answer is 42")
    text = env.truncated()
    for needle in ("general", "t1", "/root/general", "completed", "the answer is 42"):
        assert needle in text, needle
    # usage and duration appear in the header
    assert "15" in text or "10" in text
    assert "12" in text


@pytest.mark.parametrize("max_chars", [40, 120, 200, 300, 1000, 2000])
@pytest.mark.parametrize("status", list(Status))
def test_truncated_never_exceeds_max_chars(max_chars: int, status: Status) -> None:
    env = envelope(
        status=status,
        output="😀" * 5000,
        error="E" * 5000 if status != Status.COMPLETED else "",
    )
    text = env.truncated(max_chars)
    assert len(text) <= max_chars
    # the docstring (not README) says marker and hint stay visible down to ~200 chars
    if max_chars >= 200:
        assert "truncated" in text


def test_truncation_marker_says_how_much_was_left_out() -> None:
    import re

    env = envelope(output="😀" * 6000)
    text = env.truncated(1000)
    match = re.search(r"(\d[\d,]*) characters truncated", text)
    assert match, text
    left_out = int(match.group(1).replace(",", ""))
    assert text.count("😀") + left_out == 6000
    # cut by code points: nothing but whole emoji from the output survives
    assert "\ufffd" not in text


def test_short_output_is_not_truncated() -> None:
    text = envelope(output="short").truncated(2000)
    assert "truncated" not in text
    assert "short" in text


@pytest.mark.parametrize("status", [Status.ERROR, Status.TIMEOUT])
def test_error_and_timeout_views_end_with_a_hint(status: Status) -> None:
    short = envelope(status=status, output="", error="boom").truncated(2000)
    long = envelope(status=status, output="o" * 9000, error="boom " * 2000).truncated(400)
    hint = short.rstrip("\n").splitlines()[-1]
    assert hint.strip()
    assert "boom" not in hint
    assert long.rstrip("\n").splitlines()[-1] == hint
    ok = envelope(status=Status.COMPLETED, output="fine").truncated(2000)
    assert hint not in ok


# --- paths ---------------------------------------------------------------------------------


def test_agent_path_api() -> None:
    root = AgentPath.root()
    assert root == "/root"
    assert str(root) == "/root"
    assert root.depth == 0
    child = root.join("general")
    assert child == "/root/general"
    assert isinstance(child, AgentPath)
    assert child.depth == 1
    assert child.name == "general"
    assert child.parent() == root
    deep = child.join("reviewer").join("x_1.v-2")
    assert deep == "/root/general/reviewer/x_1.v-2"
    assert deep.depth == 3
    assert deep.parent().parent() == child
    assert root.join("A" * 64).name == "A" * 64


@pytest.mark.parametrize("bad", ["", "a/b", "/", "has space", "-lead", ".hidden", "x" * 65, "é"])
def test_agent_path_join_rejects_bad_segments(bad: str) -> None:
    with pytest.raises((SubagentsError, ValueError)) as info:
        AgentPath.root().join(bad)
    assert str(info.value)


async def test_repeated_names_get_suffixes_case_insensitive() -> None:
    async with manager(spec("echo", echo)) as m:
        a = m.spawn("echo", "1", name="worker")
        b = m.spawn("echo", "2", name="worker")
        c = m.spawn("echo", "3", name="Worker")
        d = m.spawn("echo", "4")
        e = m.spawn("echo", "5")
        assert a.agent_path == "/root/worker"
        assert b.agent_path == "/root/worker-2"
        assert c.agent_path.lower() == "/root/worker-3"
        assert d.agent_path == "/root/echo"
        assert e.agent_path == "/root/echo-2"
        # alternative spelling: the name through SpawnOptions
        f = m.spawn("echo", "6", options=SpawnOptions(name="worker"))
        assert f.agent_path == "/root/worker-4"


# --- mailbox -------------------------------------------------------------------------------


def test_mailbox_put_peek_drain() -> None:
    box = Mailbox()
    env = envelope(task_id="a")
    box.put("a", env)
    assert len(box) == 1
    assert box.peek("a") == env
    assert box.peek("a") == env  # peek does not consume
    assert box.drain("a") == env
    assert box.drain("a") is None
    assert box.peek("a") is None
    assert len(box) == 0


def test_mailbox_drain_all_in_arrival_order() -> None:
    box = Mailbox()
    for tid in ("c", "a", "b"):
        box.put(tid, envelope(task_id=tid))
    assert [e.task_id for e in box.drain_all()] == ["c", "a", "b"]
    assert box.drain_all() == []
    assert len(box) == 0


def test_mailbox_full_keeps_old_entries_and_overwrite_does_not_grow() -> None:
    box = Mailbox(capacity=2)
    box.put("a", envelope(task_id="a", output="1"))
    box.put("b", envelope(task_id="b"))
    with pytest.raises(MailboxFull):
        box.put("c", envelope(task_id="c"))
    assert len(box) == 2
    assert box.peek("c") is None
    box.put("a", envelope(task_id="a", output="2"))
    assert len(box) == 2
    assert box.peek("a").output == "2"
    assert box.peek("b") is not None


def test_mailbox_ttl_with_injected_clock() -> None:
    now = [1000.0]
    box = Mailbox(capacity=1, ttl=10.0, clock=lambda: now[0])
    box.put("a", envelope(task_id="a"))
    now[0] += 5
    assert box.peek("a") is not None
    now[0] += 6
    assert box.peek("a") is None
    assert len(box) == 0
    # an expired entry does not count toward the capacity
    box.put("b", envelope(task_id="b"))
    assert box.peek("b") is not None


async def test_mailbox_wait_consumes_and_times_out() -> None:
    box = Mailbox()
    assert await box.wait("a", 0.01) is None
    env = envelope(task_id="a")
    async with anyio.create_task_group() as tg:

        async def later() -> None:
            await anyio.wait_all_tasks_blocked()
            box.put("a", env)

        tg.start_soon(later)
        assert await box.wait("a", 5) == env
    assert box.peek("a") is None
    assert await box.wait("a", 0) is None


async def test_mailbox_wait_for_an_entry_already_there() -> None:
    box = Mailbox()
    env = envelope(task_id="a")
    box.put("a", env)
    assert await box.wait("a", 0) == env
    assert len(box) == 0


async def test_mailbox_put_wait_stress() -> None:
    box = Mailbox(capacity=1000)
    rng = random.Random(5)
    n = 400
    got: dict[str, DelegateResult | None] = {}

    async def waiter(tid: str) -> None:
        for _ in range(rng.randrange(3)):
            await anyio.lowlevel.checkpoint()
        got[tid] = await box.wait(tid, 5)

    async def putter(tid: str) -> None:
        for _ in range(rng.randrange(3)):
            await anyio.lowlevel.checkpoint()
        box.put(tid, envelope(task_id=tid))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for i in range(n):
                tid = f"t{i}"
                if rng.random() < 0.5:
                    tg.start_soon(waiter, tid)
                    tg.start_soon(putter, tid)
                else:
                    tg.start_soon(putter, tid)
                    tg.start_soon(waiter, tid)
    assert len(got) == n
    assert all(env is not None and env.task_id == tid for tid, env in got.items())
    assert len(box) == 0


def test_subscribe_once_fires_at_once_if_present_and_once_only() -> None:
    box = Mailbox()
    calls: list[str] = []
    box.put("a", envelope(task_id="a"))
    box.subscribe_once("a", lambda: calls.append("a"))
    assert calls == ["a"]
    box.subscribe_once("b", lambda: calls.append("b"))
    assert calls == ["a"]
    box.put("b", envelope(task_id="b"))
    box.put("b", envelope(task_id="b"))
    assert calls == ["a", "b"]
    # signalling does not consume
    assert box.peek("b") is not None


def test_subscribe_all_signals_never_consumes_and_unsubscribe() -> None:
    box = Mailbox()
    calls: list[int] = []
    sub = box.subscribe_all(lambda: calls.append(1))
    box.put("a", envelope(task_id="a"))
    box.put("b", envelope(task_id="b"))
    assert len(calls) == 2
    assert len(box) == 2
    box.unsubscribe(sub)
    box.put("c", envelope(task_id="c"))
    assert len(calls) == 2
    once = box.subscribe_once("zzz", lambda: calls.append(2))
    box.unsubscribe(once)
    box.put("zzz", envelope(task_id="zzz"))
    assert len(calls) == 2


def test_a_raising_callback_never_breaks_put(caplog: pytest.LogCaptureFixture) -> None:
    box = Mailbox()
    seen: list[str] = []

    def bad() -> None:
        raise RuntimeError("callback bug")

    box.subscribe_all(bad)
    box.subscribe_once("a", bad)
    box.subscribe_all(lambda: seen.append("ok"))
    box.put("a", envelope(task_id="a"))
    assert box.peek("a") is not None
    assert seen == ["ok"]
    assert "callback bug" in caplog.text or any(r.exc_info for r in caplog.records)


async def test_drop_wakes_waiters_with_none_and_discards_later_puts() -> None:
    box = Mailbox()
    results: list[DelegateResult | None] = []

    async def waiter() -> None:
        results.append(await box.wait("a", 30))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            box.drop()
    assert results == [None]
    box.put("a", envelope(task_id="a"))  # no error
    assert box.peek("a") is None
    assert len(box) == 0
    assert await box.wait("a", 1) is None  # at once, not after a second
    box.drop()  # idempotent


# --- manager: spawn, admission -------------------------------------------------------------


async def test_spawn_returns_a_handle_at_once() -> None:
    live = Live()
    async with manager(spec("slow", live.runner)) as m:
        handle = m.spawn("slow", "x")
        assert isinstance(handle, SpawnHandle)
        assert isinstance(handle.task_id, str)
        assert handle.task_id
        assert handle.agent_path == "/root/slow"
        assert isinstance(handle.done, anyio.Event)
        assert not handle.done.is_set()
        assert handle.result is None
        live.gate.set()
        env = await handle.wait()
        assert handle.done.is_set()
        assert env.status == Status.COMPLETED
        assert env.output == "ok x"
        assert handle.result == env
        assert m.result(handle.task_id) == env


async def test_ten_thousand_queued_spawns_never_block() -> None:
    live = Live()
    async with manager(spec("slow", live.runner), max_concurrent_spawns=1) as m:
        start = time.perf_counter()
        handles = [m.spawn("slow", str(i)) for i in range(10_000)]
        elapsed = time.perf_counter() - start
        assert elapsed < 2.0
        await anyio.wait_all_tasks_blocked()
        assert live.alive == 1
        assert handles[-1].state == "queued"
        assert handles[0].state == "running"
        m.set_max_concurrent_spawns(10_000)  # let them all finish quickly
        live.gate.set()
        with anyio.fail_after(20):
            await handles[-1].wait()
    assert all(h.result is not None for h in handles)


async def test_default_limit_is_four_and_fifo() -> None:
    live = Live()
    async with manager(spec("slow", live.runner)) as m:
        handles = [m.spawn("slow", str(i)) for i in range(10)]
        await anyio.wait_all_tasks_blocked()
        assert live.alive == 4
        assert live.started == ["0", "1", "2", "3"]
        live.gate.set()
        for h in handles:
            await h.wait()
    assert live.peak == 4
    assert live.started == [str(i) for i in range(10)]


async def test_fifo_start_order_at_limit_one() -> None:
    order: list[str] = []
    gates = {str(i): anyio.Event() for i in range(5)}

    async def runner(request: Request, ctx: RunContext) -> str:
        order.append(request.input)
        await gates[request.input].wait()
        return request.input

    async with manager(spec("r", runner), max_concurrent_spawns=1) as m:
        handles = [m.spawn("r", str(i)) for i in range(5)]
        for i in range(5):
            await anyio.wait_all_tasks_blocked()
            assert order == [str(j) for j in range(i + 1)]
            gates[str(i)].set()
            await handles[i].wait()


async def test_cancel_while_queued_never_runs() -> None:
    live = Live()
    async with manager(spec("slow", live.runner), max_concurrent_spawns=1) as m:
        first = m.spawn("slow", "first")
        queued = m.spawn("slow", "queued")
        await anyio.wait_all_tasks_blocked()
        assert queued.state == "queued"
        queued.cancel()
        with anyio.fail_after(5):
            env = await queued.wait()
        assert env.status == Status.CANCELLED
        assert queued.done.is_set()
        live.gate.set()
        await first.wait()
        await anyio.wait_all_tasks_blocked()
    assert live.started == ["first"]


async def test_manager_cancel_by_task_id_while_running() -> None:
    async with manager(spec("f", forever)) as m:
        handle = m.spawn("f", "x")
        await anyio.wait_all_tasks_blocked()
        m.cancel(handle.task_id)
        with anyio.fail_after(5):
            env = await handle.wait()
    assert env.status == Status.CANCELLED


async def test_limit_changes_at_run_time() -> None:
    live = Live()
    async with manager(spec("slow", live.runner), max_concurrent_spawns=1) as m:
        handles = [m.spawn("slow", str(i)) for i in range(6)]
        await anyio.wait_all_tasks_blocked()
        assert live.alive == 1
        m.set_max_concurrent_spawns(3)
        await anyio.wait_all_tasks_blocked()
        assert live.alive == 3
        assert m.max_concurrent_spawns == 3
        live.gate.set()
        for h in handles:
            await h.wait()
    assert live.peak == 3


# --- watchdog ------------------------------------------------------------------------------


async def test_watchdog_times_out_with_partial_output() -> None:
    async with manager(spec("f", forever)) as m:
        with anyio.fail_after(5):
            env = await m.spawn("f", "x", timeout=0.05).wait()
    assert env.status == Status.TIMEOUT
    assert "partial work" in env.output
    assert env.duration_ms >= 40


async def test_spawn_timeout_from_config_and_options() -> None:
    async with manager(spec("f", forever), spawn_timeout=0.05) as m:
        with anyio.fail_after(5):
            env = await m.spawn("f", "x").wait()
            assert env.status == Status.TIMEOUT
            # alternative spelling: SpawnOptions(timeout=...)
            env2 = await m.spawn("f", "x", options=SpawnOptions(timeout=0.05)).wait()
    assert env2.status == Status.TIMEOUT


async def test_success_after_watchdog_never_counts() -> None:
    async def stubborn(request: Request, ctx: RunContext) -> str:
        with anyio.CancelScope(shield=True):
            await anyio.sleep(0.15)
        return "late success"

    async with manager(spec("s", stubborn)) as m:
        env = await m.spawn("s", "x", timeout=0.03).wait()
    assert env.status == Status.TIMEOUT


async def test_queue_time_does_not_count_toward_watchdog() -> None:
    async def quick(request: Request, ctx: RunContext) -> str:
        await anyio.sleep(0.01)
        return "quick"

    async def slow(request: Request, ctx: RunContext) -> str:
        await anyio.sleep(0.2)
        return "slow"

    async with manager(spec("quick", quick), spec("slow", slow), max_concurrent_spawns=1) as m:
        first = m.spawn("slow", "x")
        second = m.spawn("quick", "y", timeout=0.1)
        env = await second.wait()
        await first.wait()
    assert env.status == Status.COMPLETED
    assert env.queue_ms >= 150
    assert env.duration_ms >= env.queue_ms


async def test_watchdog_uses_agent_spec_timeout() -> None:
    async with SubagentManager([spec("f", forever, timeout=0.05)]) as m:
        with anyio.fail_after(5):
            env = await m.spawn("f", "x").wait()
    assert env.status == Status.TIMEOUT


# --- ownership, sessions, close ------------------------------------------------------------


async def test_spawn_in_a_short_lived_task_keeps_running() -> None:
    live = Live()
    async with manager(spec("slow", live.runner)) as m:
        handles: list[SpawnHandle] = []

        async def tool_call() -> None:
            handles.append(m.spawn("slow", "x"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(tool_call)
        await anyio.wait_all_tasks_blocked()
        assert live.alive == 1
        assert not handles[0].done.is_set()
        live.gate.set()
        env = await handles[0].wait()
    assert env.status == Status.COMPLETED


async def test_close_session_cancels_settles_and_releases() -> None:
    live = Live()
    async with manager(spec("slow", live.runner), max_concurrent_spawns=2) as m:
        handles = [m.spawn("slow", str(i), session_id="s1") for i in range(4)]
        other = m.spawn("slow", "other", session_id="s2")
        await anyio.wait_all_tasks_blocked()
        with anyio.fail_after(5):
            await m.close_session("s1")
        assert all(h.done.is_set() for h in handles)
        assert all(h.result.status == Status.CANCELLED for h in handles)
        await anyio.wait_all_tasks_blocked()
        assert live.alive == 1  # only the s2 child, which took a freed slot
        assert live.started[-1] == "other"
        with pytest.raises(SpawnRejected):
            m.spawn("slow", "late", session_id="s1")
        assert not other.done.is_set()
        live.gate.set()
        await other.wait()


async def test_close_session_leaves_no_child_running() -> None:
    async with manager(spec("f", forever)) as m:
        handles = [m.spawn("f", str(i), session_id="s") for i in range(6)]
        await anyio.wait_all_tasks_blocked()
        await m.close_session("s")
        assert all(h.result is not None for h in handles)
        assert m.statistics().running == 0
        assert m.statistics().queued == 0


async def test_aclose_cancels_everything_and_nothing_runs_after() -> None:
    live = Live()
    m = manager(spec("slow", live.runner))
    async with m:
        handles = [m.spawn("slow", str(i)) for i in range(8)]
        await anyio.wait_all_tasks_blocked()
        assert live.alive == 4
    assert live.alive == 0
    assert all(h.done.is_set() for h in handles)
    assert {h.result.status for h in handles} == {Status.CANCELLED}


async def test_explicit_aclose() -> None:
    m = manager(spec("f", forever))
    await m.__aenter__()
    handle = m.spawn("f", "x")
    await anyio.wait_all_tasks_blocked()
    await m.aclose()
    assert handle.result is not None
    assert handle.result.status == Status.CANCELLED


async def test_exactly_one_envelope_for_every_ending() -> None:
    async def boom(request: Request, ctx: RunContext) -> str:
        raise ValueError("nope")

    async def garbage(request: Request, ctx: RunContext) -> Any:
        return 42

    completed: list[str] = []
    live = Live()
    m = manager(
        spec("echo", echo),
        spec("boom", boom),
        spec("garbage", garbage),
        spec("f", forever),
        spec("slow", live.runner),
        max_concurrent_spawns=6,
    )
    m.events.subscribe(
        lambda ev: completed.append(ev.task_id) if ev.type == "subagent.completed" else None
    )
    async with m:
        handles = [
            m.spawn("echo", "x"),
            m.spawn("boom", "x"),
            m.spawn("garbage", "x"),
            m.spawn("f", "x", timeout=0.02),
            m.spawn("slow", "cancel-me"),
            m.spawn("slow", "session", session_id="s"),
            m.spawn("slow", "manager-close"),
        ]
        queued = m.spawn("slow", "queued")
        m.set_max_concurrent_spawns(6)
        await anyio.wait_all_tasks_blocked()
        queued.cancel()
        handles[4].cancel()
        for h in handles[:5]:
            await h.wait()
        await m.close_session("s")
        handles.append(queued)
    statuses = [h.result.status for h in handles]
    assert statuses == [
        Status.COMPLETED,
        Status.ERROR,
        Status.ERROR,
        Status.TIMEOUT,
        Status.CANCELLED,
        Status.CANCELLED,
        Status.CANCELLED,
        Status.CANCELLED,
    ]
    assert sorted(completed) == sorted(h.task_id for h in handles)


async def test_done_is_set_only_after_delivery() -> None:
    async with manager(spec("echo", echo)) as m:
        handle = m.spawn("echo", "x")
        await handle.done.wait()
        assert handle.result is not None
        assert m.mailbox("root").peek(handle.task_id) == handle.result


async def test_done_after_delivery_seen_from_a_subscription() -> None:
    """When the mailbox signals, the record is there; when done fires, the mailbox is."""
    async with manager(spec("echo", echo)) as m:
        box = m.mailbox("root")
        seen: list[bool] = []
        handle = m.spawn("echo", "x")
        box.subscribe_once(handle.task_id, lambda: seen.append(handle.result is not None))
        await handle.done.wait()
    assert seen == [True]


# --- runner contract -----------------------------------------------------------------------


async def test_runner_exception_is_a_short_error() -> None:
    async def boom(request: Request, ctx: RunContext) -> str:
        raise ValueError("bad input " + "z" * 10_000)

    events: list[Any] = []
    m = manager(spec("boom", boom))
    m.events.subscribe(events.append)
    async with m:
        env = await m.spawn("boom", "x").wait()
    assert env.status == Status.ERROR
    assert "ValueError" in env.error
    assert "bad input" in env.error
    assert len(env.error) < 2000
    view = env.truncated()
    assert "Traceback" not in view
    assert "Traceback" not in env.error
    done = [e for e in events if e.type == "subagent.completed"]
    assert len(done) == 1
    assert "Traceback" in json.dumps(done[0].data)


async def test_runner_returning_a_wrong_type_names_it() -> None:
    async def bad(request: Request, ctx: RunContext) -> Any:
        return {"not": "a result"}

    async with manager(spec("bad", bad)) as m:
        env = await m.spawn("bad", "x").wait()
    assert env.status == Status.ERROR
    assert "dict" in env.error


async def test_runner_str_and_result_returns() -> None:
    async def full(request: Request, ctx: RunContext) -> Result:
        return Result(
            output="out",
            usage=Usage(input_tokens=3, output_tokens=4),
            iterations=2,
            files_changed=["f.py"],
        )

    async with manager(spec("echo", echo), spec("full", full)) as m:
        a = await m.spawn("echo", "hello").wait()
        b = await m.spawn("full", "x").wait()
    assert a.status == Status.COMPLETED
    assert a.output == "hello"
    assert b.usage == Usage(input_tokens=3, output_tokens=4)
    assert b.iterations == 2
    assert list(b.files_changed) == ["f.py"]


async def test_run_context_exposes_documented_fields() -> None:
    seen: dict[str, Any] = {}

    async def probe(request: Request, ctx: RunContext) -> str:
        seen.update(
            task_id=ctx.task_id,
            session_id=ctx.session_id,
            parent_session_id=ctx.parent_session_id,
            agent_path=ctx.agent_path,
            parent_path=ctx.parent_path,
            attempt=ctx.attempt,
            deadline=ctx.deadline,
            remaining=ctx.remaining(),
            request=request,
        )
        ctx.report(output="so far", usage=Usage(input_tokens=1), iterations=1)
        ctx.report(append=" more", files_changed=["a.txt"])
        return "done"

    async with manager(spec("probe", probe)) as m:
        handle = m.spawn("probe", "in", session_id="s9", timeout=30)
        await handle.wait()
    assert seen["task_id"] == handle.task_id
    assert seen["session_id"] == handle.task_id
    assert seen["parent_session_id"] == "s9"
    assert seen["agent_path"] == "/root/probe"
    assert seen["parent_path"] == "/root"
    assert seen["attempt"] == 1
    assert seen["deadline"] is not None
    assert 0 < seen["remaining"] <= 30
    assert seen["request"].input == "in"
    assert seen["request"].agent == "probe"


async def test_partial_report_survives_timeout() -> None:
    async def worker(request: Request, ctx: RunContext) -> str:
        ctx.report(output="step 1", usage=Usage(input_tokens=7, output_tokens=2), iterations=1)
        ctx.report(append="; step 2", iterations=2, files_changed=["x.py"])
        await anyio.sleep_forever()
        return ""

    async with manager(spec("w", worker)) as m:
        env = await m.spawn("w", "x", timeout=0.03).wait()
    assert env.status == Status.TIMEOUT
    assert env.output == "step 1; step 2"
    assert env.iterations == 2
    assert env.usage.input_tokens == 7
    assert list(env.files_changed) == ["x.py"]


# --- nested delegation ---------------------------------------------------------------------


async def test_nested_spawn_and_execute_paths_and_sessions() -> None:
    info: dict[str, Any] = {}

    async def leaf(request: Request, ctx: RunContext) -> str:
        return f"leaf:{request.input}:{ctx.agent_path}:{ctx.parent_session_id}"

    async def mid(request: Request, ctx: RunContext) -> str:
        h = ctx.spawn("leaf", "a")
        info["spawned_path"] = h.agent_path
        env = await h.wait()
        sync = await ctx.execute("leaf", "b")
        info["mid_task"] = ctx.task_id
        return f"{env.output}|{sync.output}"

    async with manager(spec("mid", mid), spec("leaf", leaf)) as m:
        env = await m.spawn("mid", "x").wait()
    assert env.status == Status.COMPLETED
    assert info["spawned_path"] == "/root/mid/leaf"
    tid = info["mid_task"]
    assert env.output == f"leaf:a:/root/mid/leaf:{tid}|leaf:b:/root/mid/leaf-2:{tid}"


async def test_ctx_wait_collects_a_grandchild() -> None:
    async def leaf(request: Request, ctx: RunContext) -> str:
        return "leaf done"

    async def mid(request: Request, ctx: RunContext) -> str:
        h = ctx.spawn("leaf", "a")
        env = await ctx.wait(h.task_id, timeout=5)
        assert env is not None
        # ctx.mailbox is a property (manager.mailbox(sid) is a method)
        assert ctx.mailbox.peek(h.task_id) is None  # consumed
        return env.output

    async with manager(spec("mid", mid), spec("leaf", leaf)) as m:
        env = await m.spawn("mid", "x").wait()
    assert env.output == "leaf done"


async def test_parent_end_cancels_unfinished_grandchildren() -> None:
    grandchildren: list[SpawnHandle] = []

    async def mid(request: Request, ctx: RunContext) -> str:
        grandchildren.append(ctx.spawn("f", "a"))
        grandchildren.append(ctx.spawn("f", "b"))
        await anyio.wait_all_tasks_blocked()
        return "mid done"

    async with manager(spec("mid", mid), spec("f", forever)) as m:
        env = await m.spawn("mid", "x").wait()
        assert env.status == Status.COMPLETED
        assert len(grandchildren) == 2
        for g in grandchildren:
            assert g.done.is_set()
            assert g.result.status == Status.CANCELLED


async def test_three_levels_with_a_limit_of_one_does_not_deadlock() -> None:
    async def level(request: Request, ctx: RunContext) -> str:
        depth = int(request.input)
        if depth == 3:
            return "bottom"
        env = await ctx.spawn("lvl", str(depth + 1)).wait()
        return f"{depth}>{env.output}"

    async with manager(spec("lvl", level), max_concurrent_spawns=1) as m:
        with anyio.fail_after(5):
            env = await m.spawn("lvl", "1").wait()
    assert env.output == "1>2>bottom"


async def test_max_depth_default_three_rejects_deeper_spawns() -> None:
    errors: list[str] = []
    paths: list[str] = []

    async def level(request: Request, ctx: RunContext) -> str:
        paths.append(str(ctx.agent_path))
        try:
            h = ctx.spawn("lvl", "deeper")
        except SpawnRejected as exc:
            errors.append(str(exc))
            return "refused"
        return (await h.wait()).output

    async with manager(spec("lvl", level)) as m:
        with anyio.fail_after(5):
            env = await m.spawn("lvl", "x").wait()
    assert env.output == "refused"
    assert paths == ["/root/lvl", "/root/lvl/lvl", "/root/lvl/lvl/lvl"]
    assert len(errors) == 1
    assert "max_depth is 3" in errors[0]


async def test_max_depth_zero_rejects_top_level_spawn() -> None:
    async with manager(spec("echo", echo), max_depth=0) as m:
        with pytest.raises(SpawnRejected, match="max_depth is 0") as raised:
            m.spawn("echo", "x")
        assert raised.value.reason == "depth"


# --- nothing lost --------------------------------------------------------------------------


async def test_full_mailbox_loses_nothing() -> None:
    events: list[Any] = []
    m = manager(spec("echo", echo), mailbox_capacity=2, max_concurrent_spawns=8)
    m.events.subscribe(events.append)
    async with m:
        handles = [m.spawn("echo", str(i)) for i in range(6)]
        for h in handles:
            await h.done.wait()
        assert len(m.mailbox("root")) == 2
        for i, h in enumerate(handles):
            assert m.result(h.task_id).output == str(i)
            assert h.result.output == str(i)
        for i, h in enumerate(handles):
            env = await m.wait_result(h.task_id, timeout=1)
            assert env is not None
            assert env.output == str(i)
    completed = [e for e in events if e.type == "subagent.completed"]
    assert len(completed) == 6


async def test_wait_result_consumes_and_a_second_call_returns_it_again() -> None:
    async with manager(spec("echo", echo)) as m:
        h = m.spawn("echo", "x")
        env = await m.wait_result(h.task_id, timeout=5)
        assert env is not None
        assert env.output == "x"
        assert m.mailbox("root").peek(h.task_id) is None
        assert h.collected
        again = await m.wait_result(h.task_id, timeout=5)
        assert again == env
        assert m.result(h.task_id) == env


async def test_wait_result_times_out_with_none() -> None:
    async with manager(spec("f", forever)) as m:
        h = m.spawn("f", "x")
        assert await m.wait_result(h.task_id, timeout=0.02) is None
        h.cancel()


# --- execute -------------------------------------------------------------------------------


async def test_execute_returns_envelope_and_takes_no_slot() -> None:
    live = Live()
    async with manager(spec("slow", live.runner), spec("echo", echo), max_concurrent_spawns=1) as m:
        blocker = m.spawn("slow", "x")
        await anyio.wait_all_tasks_blocked()
        with anyio.fail_after(5):
            env = await m.execute("echo", "sync")
        assert isinstance(env, DelegateResult)
        assert env.status == Status.COMPLETED
        assert env.output == "sync"
        assert env.agent_path == "/root/echo"
        live.gate.set()
        await blocker.wait()


async def test_execute_under_its_own_timeout() -> None:
    async with manager(spec("f", forever)) as m:
        with anyio.fail_after(5):
            env = await m.execute("f", "x", timeout=0.03)
    assert env.status == Status.TIMEOUT
    assert "partial work" in env.output


async def test_execute_timeout_from_config() -> None:
    async with manager(spec("f", forever), execute_timeout=0.03) as m:
        with anyio.fail_after(5):
            env = await m.execute("f", "x")
    assert env.status == Status.TIMEOUT


# --- unknown names -------------------------------------------------------------------------


async def test_unknown_agent_names_the_registered_ones() -> None:
    async with manager(spec("alpha", echo), spec("beta", echo)) as m:
        with pytest.raises(UnknownAgent) as info:
            m.spawn("gamma", "x")
        assert "alpha" in str(info.value)
        assert "beta" in str(info.value)
        assert "gamma" in str(info.value)
        assert isinstance(info.value, LookupError)
        with pytest.raises(UnknownAgent):
            await m.execute("gamma", "x")


async def test_unknown_task_id() -> None:
    async with manager(spec("echo", echo)) as m:
        h = m.spawn("echo", "x")
        await h.wait()
        assert m.result(h.task_id) is not None
        with pytest.raises(UnknownTask) as info:
            await m.wait_result("no-such-task", timeout=0.01)
        assert "no-such-task" in str(info.value)
        # alternative: result() of an unknown id
        with pytest.raises(UnknownTask):
            m.result("no-such-task")


# --- retries -------------------------------------------------------------------------------


async def test_transient_errors_are_retried_and_attempts_counted() -> None:
    calls: list[int] = []

    async def flaky(request: Request, ctx: RunContext) -> str:
        calls.append(ctx.attempt)
        if len(calls) < 3:
            raise TransientError("rate limited")
        return "finally"

    policy = RetryPolicy(attempts=3, initial=0.001, maximum=0.002, jitter=0)
    async with manager(spec("flaky", flaky, retry=policy)) as m:
        env = await m.spawn("flaky", "x").wait()
    assert env.status == Status.COMPLETED
    assert env.attempts == 3
    assert calls == [1, 2, 3]


async def test_non_transient_errors_are_not_retried() -> None:
    calls: list[int] = []

    async def broken(request: Request, ctx: RunContext) -> str:
        calls.append(1)
        raise KeyError("x")

    policy = RetryPolicy(attempts=5, initial=0.001, maximum=0.002)
    async with manager(spec("b", broken, retry=policy)) as m:
        env = await m.spawn("b", "x").wait()
    assert env.status == Status.ERROR
    assert calls == [1]


async def test_retry_on_a_listed_type() -> None:
    calls: list[int] = []

    async def flaky(request: Request, ctx: RunContext) -> str:
        calls.append(1)
        if len(calls) < 2:
            raise ConnectionError("reset")
        return "ok"

    policy = RetryPolicy(attempts=3, initial=0.001, maximum=0.002, retry_on=ConnectionError)
    async with manager(spec("f", flaky, retry=policy)) as m:
        env = await m.spawn("f", "x").wait()
    assert env.status == Status.COMPLETED
    assert env.attempts == 2


async def test_retrying_never_outlives_the_watchdog() -> None:
    async def always(request: Request, ctx: RunContext) -> str:
        raise TransientError("down")

    policy = RetryPolicy(attempts=50, initial=1.0, maximum=5.0)
    async with manager(spec("a", always, retry=policy)) as m:
        start = time.perf_counter()
        env = await m.spawn("a", "x", timeout=0.2).wait()
        elapsed = time.perf_counter() - start
    assert env.status in (Status.ERROR, Status.TIMEOUT)
    assert elapsed < 0.6


# --- permissions ---------------------------------------------------------------------------


def test_ruleset_allow_deny() -> None:
    rules = Ruleset(allow=["read_*", "grep"], deny=["read_secret*"])
    assert rules.allows("read_file")
    assert rules.allows("grep")
    assert not rules.allows("read_secret_key")
    assert not rules.allows("write_file")
    assert Ruleset().allows("anything")


tool_names = st.sampled_from(
    ["read_file", "read_secret", "write_file", "grep", "bash", "spawn_agent", "web_fetch"]
)
patterns = st.sampled_from(["*", "read_*", "write_*", "grep", "*_file", "b*", "spawn_agent", "*e*"])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(patterns, max_size=3),
    st.lists(patterns, max_size=3),
    st.lists(patterns, max_size=3),
    st.lists(patterns, max_size=3),
    tool_names,
)
def test_intersection_is_never_broader(
    a_allow: list[str], a_deny: list[str], b_allow: list[str], b_deny: list[str], tool: str
) -> None:
    a = Ruleset(allow=a_allow, deny=a_deny)
    b = Ruleset(allow=b_allow, deny=b_deny)
    both = a & b
    assert both.allows(tool) == (a.allows(tool) and b.allows(tool))
    assert a.intersect(b).allows(tool) == both.allows(tool)


async def test_child_permissions_are_restricted_by_parent() -> None:
    seen: dict[str, dict[str, bool]] = {}
    tools = ["read_file", "write_file", "bash"]

    async def leaf(request: Request, ctx: RunContext) -> str:
        seen["leaf"] = {t: ctx.allows(t) for t in tools}
        return ""

    async def mid(request: Request, ctx: RunContext) -> str:
        seen["mid"] = {t: ctx.allows(t) for t in tools}
        await ctx.spawn("leaf", "x").wait()
        return ""

    async with manager(
        spec("mid", mid, permissions=Ruleset(allow=["read_*", "write_*"])),
        spec("leaf", leaf, permissions=Ruleset(allow=["*"], deny=["read_*"])),
    ) as m:
        await m.spawn("mid", "x").wait()
    assert seen["mid"] == {"read_file": True, "write_file": True, "bash": False}
    assert seen["leaf"] == {"read_file": False, "write_file": True, "bash": False}


# --- notifier ------------------------------------------------------------------------------


def test_completion_notifier_puts_and_publishes() -> None:
    box = Mailbox()
    published: list[Any] = []
    # publish(event_type, parent_session_id, envelope): undocumented (Publish alias only)
    notifier = CompletionNotifier(
        lambda sid: box if sid == "root" else None, lambda *a: published.append(a)
    )
    env = envelope(task_id="t1")
    assert notifier.notify("root", "t1", env) is True
    assert box.peek("t1") == env
    assert published == [("subagent.completed", "root", env)]


def test_completion_notifier_degrades_when_full_and_never_raises() -> None:
    box = Mailbox(capacity=1)
    box.put("other", envelope(task_id="other"))
    published: list[Any] = []
    notifier = CompletionNotifier(lambda sid: box, lambda *a: published.append(a))
    assert notifier.notify("root", "t1", envelope(task_id="t1")) is False
    assert [p[0] for p in published] == ["subagent.mailbox_full", "subagent.completed"]
    assert box.peek("t1") is None
    # no mailbox at all: not an overflow, just the event
    gone = CompletionNotifier(lambda sid: None, lambda *a: published.append(a))
    assert gone.notify("root", "t2", envelope(task_id="t2")) is False
    assert [p[0] for p in published[2:]] == ["subagent.completed"]


def test_completion_notifier_disabled_does_neither() -> None:
    box = Mailbox()
    published: list[Any] = []
    notifier = CompletionNotifier(lambda sid: box, lambda *a: published.append(a), enabled=False)
    notifier.notify("root", "t1", envelope(task_id="t1"))
    assert len(box) == 0
    assert published == []


async def test_notify_completion_false_still_keeps_results() -> None:
    async with manager(spec("echo", echo), notify_completion=False) as m:
        h = m.spawn("echo", "x")
        env = await h.wait()
        assert len(m.mailbox("root")) == 0
        assert m.result(h.task_id) == env


async def test_event_payload_is_the_full_envelope() -> None:
    events: list[Any] = []
    m = manager(spec("echo", echo))
    m.events.subscribe(events.append)
    async with m:
        env = await m.spawn("echo", "y" * 5000).wait()
    done = [e for e in events if e.type == "subagent.completed"]
    assert len(done) == 1
    assert (
        DelegateResult.from_dict({k: v for k, v in done[0].data.items() if k != "traceback"}) == env
    )
    assert len(done[0].data["output"]) == 5000


def test_nan_never_sneaks_in() -> None:
    assert not math.isnan(SubagentConfig().spawn_timeout or 0)


# --- bad input gets a clear error ----------------------------------------------------------


async def test_bad_spawn_arguments_are_clear_errors() -> None:
    async with manager(spec("echo", echo)) as m:
        for bad in (-1, 0, float("nan")):
            with pytest.raises(ConfigError, match="timeout"):
                m.spawn("echo", "x", timeout=bad)
        for inp in (123, b"\xff\xfe", None):
            with pytest.raises(SubagentsError, match="input"):
                m.spawn("echo", inp)  # type: ignore[arg-type]
        with pytest.raises((SubagentsError, ValueError), match="bad name"):
            m.spawn("echo", "x", name="bad name")
        with pytest.raises(ConfigError):
            await m.wait_result(m.spawn("echo", "x").task_id, timeout=-1)
        with pytest.raises(UnknownTask):
            m.cancel("no-such-task")


async def test_timeout_none_means_no_watchdog() -> None:
    async def probe(request: Request, ctx: RunContext) -> str:
        return repr(ctx.remaining())

    async with manager(spec("p", probe)) as m:
        env = await m.spawn("p", "x", timeout=None).wait()
    assert env.output == "None"


async def test_another_sessions_task_is_named_as_such() -> None:
    async with manager(spec("echo", echo)) as m:
        h = m.spawn("echo", "x", session_id="s2")
        await h.wait()
        with pytest.raises(UnknownTask, match="s2"):
            await m.wait_result(h.task_id, session_id="root")


async def test_spawn_after_manager_close_is_rejected() -> None:
    m = manager(spec("echo", echo))
    async with m:
        pass
    with pytest.raises(SpawnRejected):
        m.spawn("echo", "x")


def test_root_parent_is_none() -> None:
    assert AgentPath.root().parent() is None
    assert AgentPath("/root/a/b").parent() == "/root/a"


# --- the README's first command: `subagents demo` -------------------------------------------


def _demo(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.Popen(
        [sys.executable, "-m", "subagents", "demo", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_demo_matches_the_issue() -> None:
    proc = _demo()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    lines = out.splitlines()
    landed = [
        line
        for line in lines
        if line.split(" ", 1)[0] in {s.value for s in Status} and " /root" in line
    ]
    assert len(landed) == 14  # twelve spawns and two grandchildren, one line each
    statuses = Counter(line.split(" ", 1)[0] for line in landed)
    assert statuses["error"] == 1
    assert statuses["timeout"] == 1
    assert statuses["cancelled"] == 1
    assert statuses["completed"] == 11
    grandchildren = [line for line in landed if line.split()[1].count("/") == 3]
    assert len(grandchildren) == 2
    assert "total" in out  # the summary table
    assert "Traceback" not in err


def test_demo_json_lines_are_envelopes() -> None:
    proc = _demo("--json", "--backend", "trio")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    envelopes = [DelegateResult.from_dict(json.loads(line)) for line in out.splitlines()]
    assert len(envelopes) == 14
    assert len({e.task_id for e in envelopes}) == 14


def test_demo_piped_into_head_does_not_spew_tracebacks() -> None:
    proc = _demo("--json")
    assert proc.stdout is not None
    proc.stdout.readline()
    proc.stdout.close()  # the reader leaves, like `subagents demo | head -1`
    proc.wait(timeout=60)
    assert proc.stderr is not None
    err = proc.stderr.read()
    proc.stderr.close()
    assert "Traceback" not in err
    assert "BrokenPipe" not in err


# --- more endings --------------------------------------------------------------------------


async def test_close_session_cancels_the_whole_subtree() -> None:
    grandchildren: list[SpawnHandle] = []

    async def mid(request: Request, ctx: RunContext) -> str:
        grandchildren.append(ctx.spawn("f", "a"))
        await anyio.sleep_forever()
        return ""

    async with manager(spec("mid", mid), spec("f", forever)) as m:
        parent = m.spawn("mid", "x", session_id="s")
        await anyio.wait_all_tasks_blocked()
        with anyio.fail_after(5):
            await m.close_session("s")
        assert parent.result.status == Status.CANCELLED
        (g,) = grandchildren
        assert g.done.is_set()
        assert g.result.status == Status.CANCELLED
        assert m.statistics().running == 0


async def test_expired_mailbox_entry_is_still_in_the_record() -> None:
    async with manager(spec("echo", echo), mailbox_ttl=0.01) as m:
        h = m.spawn("echo", "x")
        await h.done.wait()
        await anyio.sleep(0.03)
        assert m.mailbox("root").peek(h.task_id) is None  # expired
        env = await m.wait_result(h.task_id, timeout=0)
        assert env is not None
        assert env.output == "x"


async def test_execute_in_flight_when_the_manager_closes() -> None:
    results: list[DelegateResult] = []
    m = manager(spec("f", forever))

    async def caller() -> None:
        results.append(await m.execute("f", "x"))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg, m:
            tg.start_soon(caller)
            await anyio.wait_all_tasks_blocked()
            # the manager closed while the caller's execute was running
    assert [r.status for r in results] == [Status.CANCELLED]


async def test_execute_caller_cancelled_propagates_and_records() -> None:
    events: list[Any] = []
    m = manager(spec("f", forever))
    m.events.subscribe(events.append)
    async with m:
        with anyio.move_on_after(0.03) as scope:
            await m.execute("f", "x")
        assert scope.cancelled_caught
    done = [e for e in events if e.type == "subagent.completed"]
    assert len(done) == 1
    assert done[0].data["status"] == "cancelled"


async def test_lowering_the_limit_lets_running_children_finish_first() -> None:
    gates = {str(i): anyio.Event() for i in range(5)}
    running: set[str] = set()
    peak_after_lowering = 0
    lowered = False

    async def runner(request: Request, ctx: RunContext) -> str:
        nonlocal peak_after_lowering
        running.add(request.input)
        if lowered:
            peak_after_lowering = max(peak_after_lowering, len(running))
        try:
            await gates[request.input].wait()
        finally:
            running.discard(request.input)
        return request.input

    async with manager(spec("r", runner), max_concurrent_spawns=3) as m:
        handles = [m.spawn("r", str(i)) for i in range(5)]
        await anyio.wait_all_tasks_blocked()
        assert running == {"0", "1", "2"}
        m.set_max_concurrent_spawns(1)
        lowered = True
        gates["0"].set()
        await handles[0].wait()
        await anyio.wait_all_tasks_blocked()
        assert running == {"1", "2"}  # nothing new starts while above the new limit
        gates["1"].set()
        gates["2"].set()
        await handles[2].wait()
        await anyio.wait_all_tasks_blocked()
        assert running == {"3"}
        gates["3"].set()
        gates["4"].set()
        await handles[4].wait()
    assert peak_after_lowering <= 2


async def test_request_carries_the_effective_prompt_and_model() -> None:
    """One generic runner serves several agent types: it reads both from the request."""

    async def probe(request: Request, ctx: RunContext) -> str:
        return f"{request.prompt}|{request.model}|{','.join(request.files)}"

    async with SubagentManager(
        [spec("p", probe, prompt="spec prompt", model="spec-model"), spec("bare", probe)]
    ) as m:
        assert (await m.spawn("p", "x").wait()).output == "spec prompt|spec-model|"
        options = SpawnOptions(prompt="P", model="M", files=["a.py"])
        assert (await m.spawn("p", "x", options=options).wait()).output == "P|M|a.py"
        assert (await m.execute("bare", "x")).output == "None|None|"


@pytest.mark.parametrize("bad", [0, -5, float("nan"), "10", True])
def test_agent_spec_timeout_is_validated(bad: Any) -> None:
    # a NaN or text timeout used to crash the manager's task group at spawn time
    with pytest.raises(ConfigError, match="timeout"):
        AgentSpec(name="a", runner=echo, timeout=bad)
    assert AgentSpec(name="a", runner=echo, timeout=2.5).timeout == 2.5


def test_agent_spec_runner_must_be_callable() -> None:
    with pytest.raises(ConfigError, match="runner"):
        AgentSpec(name="a", runner="not a function")


# --- garbage from a runner's progress reports or a custom backend -------------------------


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
async def test_bad_progress_reports_end_in_an_error_envelope(report: dict[str, Any]) -> None:
    async def reporter(request: Request, ctx: RunContext) -> str:
        ctx.report(**report)
        return "unreachable"

    events: list[Any] = []
    m = manager(spec("r", reporter))
    m.events.subscribe(events.append)
    async with m:
        env = await m.spawn("r", "x").wait()
    assert env.status == Status.ERROR
    assert next(iter(report)) in env.error  # names the field
    json.loads(env.to_json())
    assert [e.type for e in events].count("subagent.completed") == 1


async def test_reported_text_with_lone_surrogates_still_serialises() -> None:
    async def reporter(request: Request, ctx: RunContext) -> str:
        ctx.report(output="bytes \udcff here", files_changed="one/path.py")
        await anyio.sleep_forever()
        return ""

    async with manager(spec("r", reporter)) as m:
        env = await m.spawn("r", "x", timeout=0.02).wait()
    assert env.status == Status.TIMEOUT
    assert env.output.startswith("bytes ")
    assert list(env.files_changed) == ["one/path.py"]  # a str is one path, not characters
    json.loads(env.to_json())


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


# --- the README quick start runs as written --------------------------------------------------


def _readme_block(heading: str) -> str:
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = text.split(heading, 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_readme_quick_start_runs(tmp_path: Path, backend: str) -> None:
    code = _readme_block("## Quick start")
    assert len(code.strip().splitlines()) <= 20
    if backend == "trio":
        code = code.replace("anyio.run(main)", 'anyio.run(main, backend="trio")')
    script = tmp_path / "quick_start.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env
    )
    assert out.returncode == 0, out.stderr
    for topic in ("anyio", "trio", "attrs"):
        assert f"notes on {topic}" in out.stdout
    assert out.stdout.count("status: completed") == 3


# --- the mailbox against a simple model ----------------------------------------------------


class MailboxModel(RuleBasedStateMachine):
    """put/peek/drain/drain_all/len/TTL/drop against a dict in arrival order."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.box = Mailbox(capacity=3, ttl=10.0, clock=lambda: self.now)
        self.model: dict[str, tuple[float, str]] = {}  # id -> (put time, output)
        self.dropped = False
        self.counter = 0

    def _live(self) -> dict[str, tuple[float, str]]:
        # The same float expression as the documented rule (expires at put time + ttl), so
        # rounding cannot make the model and the mailbox disagree at the boundary.
        return {k: v for k, v in self.model.items() if v[0] + 10.0 > self.now}

    @rule(tid=st.sampled_from("abcde"))
    def put(self, tid: str) -> None:
        self.counter += 1
        output = f"v{self.counter}"
        env = envelope(task_id=tid, output=output)
        live = self._live()
        if self.dropped:
            self.box.put(tid, env)
            return
        if tid not in live and len(live) >= 3:
            with pytest.raises(MailboxFull):
                self.box.put(tid, env)
            return
        self.box.put(tid, env)
        # an overwrite is a new arrival: a fresh TTL, last in drain_all order
        # (observed behaviour; README does not say)
        self.model = {k: v for k, v in live.items() if k != tid}
        self.model[tid] = (self.now, output)

    @rule(tid=st.sampled_from("abcde"))
    def peek(self, tid: str) -> None:
        got = self.box.peek(tid)
        live = self._live()
        assert (got.output if got else None) == (live[tid][1] if tid in live else None)

    @rule(tid=st.sampled_from("abcde"))
    def drain(self, tid: str) -> None:
        got = self.box.drain(tid)
        live = self._live()
        assert (got.output if got else None) == (live[tid][1] if tid in live else None)
        self.model = {k: v for k, v in live.items() if k != tid}

    @rule()
    def drain_all(self) -> None:
        got = [e.output for e in self.box.drain_all()]
        assert got == [v[1] for v in self._live().values()]  # arrival order
        self.model = {}

    @rule(dt=st.sampled_from([0.5, 3.0, 9.9, 10.0, 20.0]))
    def advance(self, dt: float) -> None:
        self.now += dt

    @precondition(lambda self: not self.dropped)
    @rule()
    def drop(self) -> None:
        self.box.drop()
        self.dropped = True
        self.model = {}

    @invariant()
    def length(self) -> None:
        assert len(self.box) == len(self._live())


TestMailboxModel = MailboxModel.TestCase
TestMailboxModel.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)


async def test_an_error_inside_a_runners_task_group_is_described_by_the_error() -> None:
    async def grouped(request: Request, ctx: RunContext) -> str:
        async def fail() -> None:
            raise KeyError("missing-key")

        async with anyio.create_task_group() as tg:
            tg.start_soon(fail)
            await anyio.sleep_forever()
        return ""

    async with manager(spec("g", grouped)) as m:
        env = await m.spawn("g", "x").wait()
    assert env.status == Status.ERROR
    assert env.error.startswith("KeyError")
    assert "missing-key" in env.error
    assert env.error_type == "KeyError"
