"""The LLM tools through ``toolset.call``: spawn, delegate, cancel, list, validation, errors."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import pytest

from subagents import AgentSpec, ConfigError, Request, RunContext, SubagentConfig, SubagentManager
from subagents._json import dumps
from subagents.testing import echo_agent
from subagents.tools import Tool, ToolResult, Toolset, build_tools
from tests.helpers import clock_backends


def gated(name: str = "gated") -> tuple[AgentSpec, Callable[[str], None]]:
    """An agent that blocks until ``release(input)`` is called."""
    gates: dict[str, anyio.Event] = {}

    async def runner(request: Request, ctx: RunContext) -> str:
        await gates.setdefault(request.input, anyio.Event()).wait()
        return f"{name}: {request.input}"

    def release(key: str) -> None:
        gates.setdefault(key, anyio.Event()).set()

    return AgentSpec(name=name, description="Blocks until released.", runner=runner), release


@asynccontextmanager
async def toolset(
    *specs: AgentSpec, config: SubagentConfig | None = None, **kwargs: object
) -> AsyncIterator[Toolset]:
    async with SubagentManager(specs or [echo_agent()], config=config) as manager:
        yield build_tools(manager, "root", **kwargs)  # type: ignore[arg-type]


def check(result: ToolResult) -> ToolResult:
    assert isinstance(result, ToolResult)
    dumps(result.details)  # always JSON-serialisable
    return result


# ---------------------------------------------------------------- the shape


@pytest.mark.anyio
async def test_the_toolset_holds_five_tools_with_closed_object_schemas() -> None:
    async with toolset() as tools:
        names = [tool.name for tool in tools]
        assert names == [
            "spawn_agent",
            "wait_agent",
            "delegate_to_agent",
            "cancel_agent",
            "list_agents",
        ]
        assert len(tools) == 5
        assert "wait_agent" in tools
        assert tools.tools == list(tools)
        assert tools.get("wait_agent") is tools["wait_agent"]
        assert tools.get("nope") is None
        for tool in tools:
            assert isinstance(tool, Tool)
            assert tool.cacheable is False
            assert tool.input_schema["additionalProperties"] is False
            assert tool.input_schema["type"] == "object"
            assert len(tool.description) > 80


@pytest.mark.anyio
async def test_unknown_tool_is_an_error_result() -> None:
    async with toolset() as tools:
        result = check(await tools.call("wait_agents", {}))
        assert result.is_error
        assert "wait_agent" in result.content
        assert result.details["error"] == "unknown_tool"


# ---------------------------------------------------------------- spawn_agent


@pytest.mark.anyio
async def test_spawn_returns_at_once_with_queue_facts() -> None:
    spec, release = gated()
    config = SubagentConfig(max_concurrent_spawns=1)
    async with toolset(spec, config=config) as tools:
        first = check(await tools.call("spawn_agent", {"agent": "gated", "input": "a"}))
        second = check(await tools.call("spawn_agent", {"agent": "gated", "input": "b"}))
        assert not first.is_error
        assert first.details["status"] == "running"
        assert first.details["queue_position"] == 0
        assert first.details["concurrency_limit"] == 1
        assert first.details["agent_path"] == "/root/gated"
        assert second.details["status"] == "queued"
        assert second.details["queue_position"] == 1
        assert second.details["agent_path"] == "/root/gated-2"
        assert "queued" in second.content
        assert "limit 1" in second.content
        assert str(second.details["task_id"]) in second.content
        release("a")
        release("b")


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_spawn_name_and_timeout() -> None:
    spec, _ = gated()
    async with toolset(spec) as tools:
        result = check(
            await tools.call(
                "spawn_agent", {"agent": "gated", "input": "x", "name": "scout", "timeout_ms": 30}
            )
        )
        assert result.details["agent_path"] == "/root/scout"
        waited = check(await tools.call("wait_agent", {"task_ids": result.details["task_id"]}))
        assert waited.details["completed"] is True
        results = waited.details["results"]
        assert isinstance(results, list)
        assert results[0]["status"] == "timeout"  # type: ignore[index,call-overload]


@pytest.mark.anyio
async def test_spawn_unknown_agent_lists_registered() -> None:
    async with toolset(echo_agent("alpha"), echo_agent("beta")) as tools:
        result = check(await tools.call("spawn_agent", {"agent": "gamma", "input": "x"}))
        assert result.is_error
        assert "alpha" in result.content
        assert "beta" in result.content
        assert result.details == {
            "error": "unknown_agent",
            "agent": "gamma",
            "known": ["alpha", "beta"],
        }
        delegated = check(await tools.call("delegate_to_agent", {"agent": "gamma", "input": "x"}))
        assert delegated.is_error
        assert delegated.details["error"] == "unknown_agent"
        assert "alpha" in delegated.content


@pytest.mark.anyio
async def test_spawn_bad_name_names_the_field() -> None:
    async with toolset() as tools:
        result = check(
            await tools.call("spawn_agent", {"agent": "echo", "input": "x", "name": "a/b"})
        )
        assert result.is_error
        assert result.content.startswith("invalid arguments: name")
        assert result.details["field"] == "name"


@pytest.mark.anyio
async def test_depth_refusal_says_do_it_yourself() -> None:
    async with toolset(config=SubagentConfig(max_depth=0)) as tools:
        for name in ("spawn_agent", "delegate_to_agent"):
            result = check(await tools.call(name, {"agent": "echo", "input": "x"}))
            assert result.is_error
            assert "yourself" in result.content
            assert result.details["reason"] == "depth"


# ---------------------------------------------------------------- validation


INT = "timeout_ms must be an integer >= 0, got"
VALIDATION_CASES = [
    ("wait_agent", {"task_ids": "x", "timeout_ms": -5}, f"{INT} -5"),
    ("wait_agent", {"task_ids": "x", "timeout_ms": 1.5}, f"{INT} 1.5"),
    ("wait_agent", {"task_ids": "x", "timeout_ms": math.nan}, f"{INT} nan"),
    ("wait_agent", {"task_ids": "x", "timeout_ms": "100"}, f'{INT} "100" (a string)'),
    ("wait_agent", {"task_ids": "x", "timeout_ms": True}, f"{INT} true (a boolean)"),
    ("wait_agent", {"task_ids": []}, "task_ids must be a task id string or a non-empty array"),
    ("wait_agent", {"task_ids": [1]}, "task_ids must be a task id string"),
    (
        "wait_agent",
        {"task_ids": "x", "mode": "some"},
        "mode must be one of 'all', 'any', got \"some\"",
    ),
    ("wait_agent", {}, "task_ids is required"),
    (
        "wait_agent",
        {"task_id": "x"},
        "unknown field 'task_id' for wait_agent (did you mean 'task_ids'?); "
        "allowed fields: task_ids, mode, timeout_ms",
    ),
    ("spawn_agent", {"agent": "echo"}, "input is required"),
    ("spawn_agent", {"agent": 3, "input": "x"}, "agent must be a string, got 3"),
    (
        "spawn_agent",
        {"agent": "echo", "input": "x", "timeout_ms": 0},
        "timeout_ms must be an integer >= 1, got 0",
    ),
    ("spawn_agent", {"agent": "echo", "input": "\ud800"}, "input must be valid Unicode text"),
    (
        "delegate_to_agent",
        {"agent": "echo", "input": "x", "name": "n"},
        "allowed fields: agent, input, timeout_ms",
    ),
    ("cancel_agent", {"task_id": ["x"]}, 'task_id must be a string, got ["x"] (an array)'),
    ("list_agents", {"all": True}, "allowed fields: (none"),
    ("list_agents", [1, 2], "list_agents arguments must be a JSON object, got [1,2] (an array)"),
    ("list_agents", "{not json", "must be a JSON object, got text that is not JSON"),
]


@pytest.mark.anyio
@pytest.mark.parametrize(("tool", "args", "expected"), VALIDATION_CASES)
async def test_invalid_arguments_get_a_message_naming_the_field(
    tool: str, args: object, expected: str
) -> None:
    async with toolset() as tools:
        result = check(await tools.call(tool, args))
        assert result.is_error, result
        assert expected in result.content, result.content
        assert result.details["error"] == "invalid_arguments"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (0, True),
        (1000.0, True),
        (-5, False),
        (1.5, False),
        ("100", False),
        (math.nan, False),
        (math.inf, False),
        (True, False),
        (None, True),
    ],
)
async def test_wait_timeout_ms_accepts_whole_numbers_and_null_only(value: object, ok: bool) -> None:
    async with toolset(engine_tool_timeout=2.0, wait_timeout=0.05) as tools:
        spawned = check(await tools.call("spawn_agent", {"agent": "echo", "input": "x"}))
        task_id = spawned.details["task_id"]
        with anyio.fail_after(3):
            result = check(
                await tools.call("wait_agent", {"task_ids": [task_id], "timeout_ms": value})
            )
        if ok:
            assert not result.is_error, result.content
            assert result.details["completed"] is True or result.details["timed_out"] is True
        else:
            assert result.is_error
            assert "timeout_ms" in result.content
            assert "integer" in result.content


@pytest.mark.anyio
async def test_arguments_as_json_text_and_nulls() -> None:
    async with toolset() as tools:
        listed = check(await tools.call("list_agents", ""))
        assert not listed.is_error
        spawned = check(
            await tools.call(
                "spawn_agent", '{"agent": "echo", "input": "hi", "name": null, "timeout_ms": null}'
            )
        )
        assert not spawned.is_error, spawned.content
        waited = check(
            await tools.call("wait_agent", {"task_ids": spawned.details["task_id"], "mode": None})
        )
        assert waited.details["completed"] is True


# ---------------------------------------------------------------- delegate_to_agent


@pytest.mark.anyio
async def test_delegate_returns_envelope() -> None:
    async with toolset() as tools:
        result = check(await tools.call("delegate_to_agent", {"agent": "echo", "input": "hi"}))
        assert not result.is_error
        assert "echo: hi" in result.content
        assert "status: completed" in result.content
        envelope = result.details["envelope"]
        assert isinstance(envelope, dict)
        assert envelope["output"] == "echo: hi"
        # A delegation is its own answer: it is never handed out again as a spawn result.
        again = check(await tools.call("wait_agent", {"task_ids": result.details["task_id"]}))
        assert "already collected" in again.content


async def failing(request: Request, ctx: RunContext) -> str:
    raise RuntimeError("disk on fire")


FAILING = AgentSpec(name="failing", description="Always fails.", runner=failing)


@pytest.mark.anyio
async def test_delegate_failure_is_folded_into_the_envelope() -> None:
    async with toolset(FAILING) as tools:
        result = check(await tools.call("delegate_to_agent", {"agent": "failing", "input": "x"}))
        assert not result.is_error
        assert "status: error" in result.content
        assert "disk on fire" in result.content
        assert "hint:" in result.content


@pytest.mark.anyio
async def test_delegate_string_mode() -> None:
    async with toolset(echo_agent(), FAILING, return_mode="string") as tools:
        ok = check(await tools.call("delegate_to_agent", {"agent": "echo", "input": "hi"}))
        assert ok.content == "echo: hi"
        assert not ok.is_error
        bad = check(await tools.call("delegate_to_agent", {"agent": "failing", "input": "x"}))
        assert bad.is_error
        assert "disk on fire" in bad.content


@pytest.mark.anyio
async def test_delegate_invalid_mode_falls_back_to_envelope() -> None:
    async with toolset(return_mode="bogus") as tools:
        assert tools.limits.return_mode == "envelope"
        result = check(await tools.call("delegate_to_agent", {"agent": "echo", "input": "hi"}))
        assert "status: completed" in result.content


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_delegate_is_stopped_before_its_host_timeout() -> None:
    spec, _ = gated()
    async with toolset(
        spec, engine_tool_timeout=60.0, tool_timeouts={"delegate_to_agent": 0.2}, wait_timeout=1
    ) as tools:
        # The margin is 10 % of the host timeout, at least 20 ms: 0.2 - 0.02.
        assert tools.limits.delegate_ceiling == pytest.approx(0.18)
        with anyio.fail_after(1):
            result = check(
                await tools.call(
                    "delegate_to_agent", {"agent": "gated", "input": "x", "timeout_ms": 10_000}
                )
            )
        assert result.details["status"] == "timeout"
        assert result.details["clamped"] is True
        assert "lowered" in result.content


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_delegate_timeout_ms_is_the_childs_watchdog() -> None:
    async def halfway(request: Request, ctx: RunContext) -> str:
        ctx.report(output="halfway")
        await anyio.sleep_forever()
        return ""

    spec = AgentSpec(name="forever", description="Never finishes.", runner=halfway)
    async with toolset(spec) as tools:
        with anyio.fail_after(3):
            result = check(
                await tools.call(
                    "delegate_to_agent", {"agent": "forever", "input": "x", "timeout_ms": 30}
                )
            )
        assert "timeout" in result.content
        assert "halfway" in result.content


# ---------------------------------------------------------------- cancel_agent


@pytest.mark.anyio
async def test_cancel_reports_previous_status_and_is_idempotent() -> None:
    spec, release = gated()
    async with toolset(spec, config=SubagentConfig(max_concurrent_spawns=1)) as tools:
        running = check(await tools.call("spawn_agent", {"agent": "gated", "input": "a"}))
        queued = check(await tools.call("spawn_agent", {"agent": "gated", "input": "b"}))
        await anyio.wait_all_tasks_blocked()
        first = check(await tools.call("cancel_agent", {"task_id": queued.details["task_id"]}))
        assert first.details["previous_status"] == "queued"
        assert first.details["status"] == "cancelled"
        assert first.details["cancel_requested"] is True
        again = check(await tools.call("cancel_agent", {"task_id": queued.details["task_id"]}))
        assert not again.is_error
        assert again.details["cancel_requested"] is False
        assert "already ended (cancelled)" in again.content
        live = check(await tools.call("cancel_agent", {"task_id": running.details["task_id"]}))
        assert live.details["previous_status"] == "running"
        waited = check(await tools.call("wait_agent", {"task_ids": running.details["task_id"]}))
        results = waited.details["results"]
        assert isinstance(results, list)
        assert results[0]["status"] == "cancelled"  # type: ignore[index,call-overload]
        release("a")


@pytest.mark.anyio
async def test_cancel_unknown_id_suggests() -> None:
    spec, release = gated()
    async with toolset(spec) as tools:
        spawned = check(await tools.call("spawn_agent", {"agent": "gated", "input": "a"}))
        task_id = str(spawned.details["task_id"])
        result = check(await tools.call("cancel_agent", {"task_id": task_id[:5].upper()}))
        assert result.is_error
        assert task_id in result.content
        assert result.details["suggestions"] == [task_id]
        release("a")


# ---------------------------------------------------------------- list_agents


@pytest.mark.anyio
async def test_list_agents_names_the_agents_and_the_sessions_tasks() -> None:
    spec, release = gated()
    async with toolset(spec, echo_agent()) as tools:
        done = check(await tools.call("spawn_agent", {"agent": "echo", "input": "x"}))
        live = check(await tools.call("spawn_agent", {"agent": "gated", "input": "a"}))
        await tools.manager.handle(str(done.details["task_id"])).done.wait()
        await anyio.wait_all_tasks_blocked()  # the gated child has left the queue
        result = check(await tools.call("list_agents", {}))
        assert "gated: Blocks until released." in result.content
        assert "echo: Echoes its input." in result.content
        tasks = {t["task_id"]: t for t in result.details["tasks"]}  # type: ignore[union-attr,index]
        assert tasks[done.details["task_id"]]["result_waiting"] is True
        assert tasks[done.details["task_id"]]["status"] == "completed"
        assert tasks[live.details["task_id"]]["status"] == "running"
        assert tasks[live.details["task_id"]]["agent_path"] == "/root/gated"
        assert "result waiting" in result.content
        assert not check(await tools.call("list_agents")).is_error  # no arguments at all
        release("a")


# ---------------------------------------------------------------- build_tools config


@pytest.mark.anyio
async def test_layering_rule_is_enforced() -> None:
    async with SubagentManager([echo_agent()]) as manager:
        assert build_tools(manager, "root").limits.wait_ceiling == pytest.approx(54.0)
        # The margin is 10 % of the host's timeout and never less than 20 ms.
        tight = build_tools(manager, "root", engine_tool_timeout=0.1, wait_timeout=0.05)
        assert tight.limits.wait_ceiling == pytest.approx(0.08)
        build_tools(manager, "root", engine_tool_timeout=60.0, wait_timeout=54.0)  # the ceiling
        with pytest.raises(ConfigError, match="wait_timeout"):
            build_tools(manager, "root", engine_tool_timeout=60, wait_timeout=60)
        with pytest.raises(ConfigError, match="safety margin"):
            build_tools(manager, "root", wait_timeout=30, tool_timeouts={"wait_agent": 20})
        with pytest.raises(ConfigError, match="wait_timeout"):
            build_tools(manager, "root", engine_tool_timeout=33, wait_timeout=30)
        wide = build_tools(manager, "root", wait_timeout=100, tool_timeouts={"wait_agent": 200})
        assert wide.limits.wait_ceiling == pytest.approx(180.0)
        assert wide.timeout_for("wait_agent") == 200
        assert wide.timeout_for("spawn_agent") == 60
        unbounded = build_tools(manager, "root", engine_tool_timeout=None)
        assert unbounded.limits.wait_ceiling == 600.0
        for bad in (0, -1, math.nan, "60", True):
            with pytest.raises(ConfigError):
                build_tools(manager, "root", engine_tool_timeout=bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigError):
            build_tools(manager, "", wait_timeout=1)
        with pytest.raises(ConfigError):
            build_tools(manager, "root", wait_timeout=0)


@pytest.mark.anyio
async def test_a_wait_cap_lowers_the_ceiling_and_never_raises_it() -> None:
    async with SubagentManager([echo_agent()]) as manager:
        capped = build_tools(manager, "root", wait_cap=20.0, wait_timeout=10.0)
        assert capped.limits.wait_ceiling == 20.0  # below the 54 s of a 60 s host timeout
        above = build_tools(manager, "root", wait_cap=100.0)
        assert above.limits.wait_ceiling == pytest.approx(54.0)  # the layering rule wins
        alone = build_tools(manager, "root", tool_timeouts={"wait_agent": None}, wait_cap=45)
        assert alone.limits.wait_ceiling == 45.0  # no host timeout: the cap, not 600 s
        with pytest.raises(ConfigError, match=r"wait_timeout.*wait_cap of 5 s"):
            build_tools(manager, "root", wait_cap=5.0)  # the default wait_timeout is 30 s
        for bad in (0, -1, math.nan, math.inf, "45", True):
            with pytest.raises(ConfigError, match="wait_cap"):
                build_tools(manager, "root", wait_cap=bad, wait_timeout=0.01)  # type: ignore[arg-type]
        toolset = build_tools(manager, "root", wait_cap=0.5, wait_timeout=0.25)
        result = await toolset.call("wait_agent", {"task_ids": "0123456789ab", "timeout_ms": 9})
        assert result.details["error"] == "unknown_task"  # the cap changes no checks
        schema = toolset["wait_agent"].input_schema["properties"]["timeout_ms"]  # type: ignore[index]
        assert "clamped to 500" in schema["description"]  # type: ignore[index,call-overload]


# ---------------------------------------------------------------- public names, tracing, nesting


def test_the_tool_names_are_exported() -> None:
    import subagents
    import subagents.tools

    for name in ("Tool", "ToolResult", "Toolset", "ToolLimits", "build_tools"):
        assert name in subagents.tools.__all__
    assert "Completions" in subagents.__all__


@pytest.mark.anyio
async def test_every_call_runs_in_a_tool_span(monkeypatch: pytest.MonkeyPatch) -> None:
    from contextlib import contextmanager

    from subagents.tools import _tool

    calls: list[tuple[str, str | None, str | None]] = []
    links: list[list[str]] = []

    class Span:
        def set_attribute(self, key: str, value: object) -> None:
            pass

        def link_tasks(self, handles: object) -> None:
            links.append([h.task_id for h in handles])  # type: ignore[attr-defined]

        def set_error(self, error_type: str, message: str = "") -> None:
            pass

    @contextmanager
    def recording_span(
        tool: str,
        *,
        call_id: str | None = None,
        transfer_target: str | None = None,
        **other: object,
    ):  # type: ignore[no-untyped-def]
        calls.append((tool, call_id, transfer_target))
        yield Span()

    # private: no public hook to observe each call's span arguments without an SDK
    # provider, and the global one can be set once per process (the tracing tests set it).
    monkeypatch.setattr(_tool, "tool_span", recording_span)
    async with toolset() as tools:
        spawned = await tools.call("spawn_agent", {"agent": "echo", "input": "x"}, call_id="c1")
        await tools.call("wait_agent", {"task_ids": spawned.details["task_id"]}, call_id="c2")
        await tools.call("delegate_to_agent", {"agent": "echo", "input": "y"})
        await tools.call("list_agents", {"bad": 1})
        await tools.call("no_such_tool", {})
    assert calls == [
        ("spawn_agent", "c1", "echo"),
        ("wait_agent", "c2", None),
        ("delegate_to_agent", None, "echo"),
        ("list_agents", None, None),
        ("no_such_tool", None, None),
    ]
    assert links == [[spawned.details["task_id"]]]


@pytest.mark.anyio
async def test_a_runner_uses_the_tools_for_its_own_children() -> None:
    async def lead(request: Request, ctx: RunContext) -> str:
        tools = build_tools(ctx.manager, ctx.session_id, engine_tool_timeout=10, wait_timeout=5)
        spawned = await tools.call("spawn_agent", {"agent": "echo", "input": request.input})
        waited = await tools.call("wait_agent", {"task_ids": spawned.details["task_id"]})
        results = waited.details["results"]
        assert isinstance(results, list)
        return str(results[0]["output"])  # type: ignore[index,call-overload]

    spec = AgentSpec(name="lead", description="Delegates.", runner=lead)
    async with toolset(spec, echo_agent()) as tools:
        result = await tools.call("delegate_to_agent", {"agent": "lead", "input": "deep"})
        envelope = result.details["envelope"]
        assert isinstance(envelope, dict)
        assert envelope["output"] == "echo: deep"


@pytest.mark.anyio
async def test_an_internal_failure_is_an_error_result(monkeypatch: pytest.MonkeyPatch) -> None:
    from subagents.tools import _handlers

    def broken(self: object) -> None:
        raise KeyError("boom")

    async with toolset() as tools:
        # private: no public way to make a tool fail inside (a bug in the library).
        monkeypatch.setattr(_handlers.SessionTools, "_wait_ms", lambda self, r: broken(self))
        spawned = await tools.call("spawn_agent", {"agent": "echo", "input": "x"})
        result = check(await tools.call("wait_agent", {"task_ids": spawned.details["task_id"]}))
        assert result.is_error
        assert result.details == {"error": "internal", "error_type": "KeyError"}
        assert "not caused by your arguments" in result.content


@pytest.mark.anyio
@pytest.mark.parametrize("where", ["enter", "exit"])
async def test_a_broken_tracer_never_breaks_a_call(
    monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    from contextlib import contextmanager

    from subagents._tool_tracing import ToolSpan
    from subagents.tools import _tool

    @contextmanager
    def broken_span(tool: str, **kwargs: object):  # type: ignore[no-untyped-def]
        if where == "enter":
            raise RuntimeError("no exporter")
        yield ToolSpan()
        raise RuntimeError("exporter died")

    # private: no public way to make the tracing itself raise around a call.
    monkeypatch.setattr(_tool, "tool_span", broken_span)
    async with toolset() as tools:
        result = check(await tools.call("spawn_agent", {"agent": "echo", "input": "x"}))
        assert not result.is_error
        assert result.details["status"] == "running"


@pytest.mark.anyio
async def test_spawn_agent_counters_agree_with_its_status() -> None:
    """A child that starts at once is counted as running, not queued, in the same answer."""
    release = anyio.Event()

    async def held(request: Request, ctx: RunContext) -> str:
        await release.wait()
        return "done"

    config = SubagentConfig(max_concurrent_spawns=2)
    async with SubagentManager([AgentSpec(name="held", runner=held)], config=config) as m:
        toolset = build_tools(m, "root")
        answers = [
            await toolset.call("spawn_agent", {"agent": "held", "input": "x"}) for _ in range(3)
        ]
        first, second, third = (a.details for a in answers)
        assert all(isinstance(d, dict) for d in (first, second, third))
        assert (first["status"], first["running"], first["queued"]) == ("running", 1, 0)
        assert (second["status"], second["running"], second["queued"]) == ("running", 2, 0)
        assert (third["status"], third["running"], third["queued"]) == ("queued", 2, 1)
        release.set()


@pytest.mark.anyio
async def test_a_late_tool_call_of_an_ending_agent_is_refused_before_its_arguments() -> None:
    # The agent's runner has returned and it is settling its children: a tool call of its
    # session is refused as session_closed whatever its arguments (the hint a model needs).
    answers: list[dict[str, object]] = []
    started = anyio.Event()
    parent_returned = anyio.Event()
    toolsets: dict[str, Toolset] = {}

    async def grandchild(request: Request, ctx: RunContext) -> str:
        started.set()
        await parent_returned.wait()
        with anyio.CancelScope(shield=True):  # finishes its step although cancelled
            for agent in ("nope", "grandchild"):
                result = await toolsets["parent"].call(
                    "delegate_to_agent", {"agent": agent, "input": "x"}
                )
                answers.append(dict(result.details))
        return "g"

    async def parent(request: Request, ctx: RunContext) -> str:
        toolsets["parent"] = build_tools(ctx.manager, ctx.session_id)
        ctx.spawn("grandchild")
        await started.wait()
        parent_returned.set()  # returns with no checkpoint in between: now it is ending
        return "p"

    specs = [
        AgentSpec(name="parent", description="d", runner=parent),
        AgentSpec(name="grandchild", description="d", runner=grandchild),
    ]
    async with SubagentManager(specs, config=SubagentConfig(settle_timeout=5.0)) as manager:
        await manager.spawn("parent").wait()
    assert [a.get("reason") for a in answers] == ["session_closed", "session_closed"]
