"""Acceptance tests for the LLM tools (issue 3), written from README.tools.md and design/tools.md.

Driven through ``toolset.call`` with valid, invalid and racy inputs, on asyncio and trio.
"""

from __future__ import annotations

import json
import math
import re
import time
from typing import Any

import anyio
import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from subagents import (
    AgentSpec,
    ConfigError,
    Request,
    RunContext,
    Status,
    SubagentConfig,
    SubagentManager,
)
from subagents.testing import ScriptedModel, ScriptError, ToolCall, run_tool_loop
from subagents.tools import Tool, ToolResult, Toolset, build_tools

pytestmark = pytest.mark.anyio

TOOL_NAMES = {"spawn_agent", "wait_agent", "delegate_to_agent", "cancel_agent", "list_agents"}


async def echo(request: Request, ctx: RunContext) -> str:
    return request.input


async def forever(request: Request, ctx: RunContext) -> str:
    ctx.report(output="halfway")
    await anyio.sleep_forever()
    return ""


async def boom(request: Request, ctx: RunContext) -> str:
    raise ValueError("it broke")


class Gate:
    def __init__(self) -> None:
        self.event = anyio.Event()

    async def runner(self, request: Request, ctx: RunContext) -> str:
        await self.event.wait()
        return f"gated {request.input}"


def specs(gate: Gate | None = None) -> list[AgentSpec]:
    out = [
        AgentSpec(name="echo", description="Echoes its input back.", runner=echo),
        AgentSpec(name="forever", description="Never finishes.", runner=forever),
        AgentSpec(name="boom", description="Always fails.", runner=boom),
    ]
    if gate is not None:
        out.append(AgentSpec(name="gated", description="Waits for a gate.", runner=gate.runner))
    return out


def mgr(gate: Gate | None = None, **config: Any) -> SubagentManager:
    return SubagentManager(specs(gate), config=SubagentConfig(**config))


async def spawn(toolset: Toolset, agent: str, text: str = "x", **extra: Any) -> str:
    result = await toolset.call("spawn_agent", {"agent": agent, "input": text, **extra})
    assert not result.is_error, result.content
    task_id = result.details["task_id"]
    assert isinstance(task_id, str)
    return task_id


# --- the tool shape and schemas -----------------------------------------------------------


async def test_toolset_has_the_five_tools_with_valid_schemas() -> None:
    async with mgr() as m:
        toolset = build_tools(m, "root")
        tools = list(toolset)
        assert {t.name for t in tools} == TOOL_NAMES
        for tool in tools:
            assert isinstance(tool, Tool)
            assert len(tool.description) > 40, tool.name
            assert tool.cacheable is False
            schema = tool.input_schema
            assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
            assert schema["type"] == "object"
            assert schema["additionalProperties"] is False
            jsonschema.Draft202012Validator.check_schema(schema)
        by_name = {t.name: t.input_schema for t in tools}
        assert set(by_name["spawn_agent"]["required"]) == {"agent", "input"}
        assert set(by_name["spawn_agent"]["properties"]) == {"agent", "input", "name", "timeout_ms"}
        assert set(by_name["wait_agent"]["required"]) == {"task_ids"}
        assert set(by_name["wait_agent"]["properties"]) == {"task_ids", "mode", "timeout_ms"}
        assert set(by_name["delegate_to_agent"]["required"]) == {"agent", "input"}
        assert set(by_name["cancel_agent"]["required"]) == {"task_id"}
        assert by_name["list_agents"].get("properties", {}) == {}


async def test_schemas_accept_valid_and_reject_extra_fields() -> None:
    async with mgr() as m:
        schemas = {t.name: t.input_schema for t in build_tools(m, "root")}
    validate = jsonschema.Draft202012Validator
    assert validate(schemas["wait_agent"]).is_valid({"task_ids": "abc", "mode": "any"})
    assert validate(schemas["wait_agent"]).is_valid({"task_ids": ["a", "b"], "timeout_ms": 0})
    assert not validate(schemas["wait_agent"]).is_valid({"task_ids": ["a"], "mode": "some"})
    assert not validate(schemas["wait_agent"]).is_valid({"task_ids": ["a"], "extra": 1})
    assert not validate(schemas["spawn_agent"]).is_valid({"agent": "echo"})
    assert validate(schemas["list_agents"]).is_valid({})


async def test_openai_chat_export() -> None:
    async with mgr() as m:
        toolset = build_tools(m, "root")
        exported = toolset.to_openai_chat()
        assert len(exported) == 5
        for entry, tool in zip(exported, toolset, strict=True):
            assert set(entry) == {"type", "function"}
            assert entry["type"] == "function"
            fn = entry["function"]
            assert set(fn) == {"name", "description", "parameters", "strict"}
            assert fn["name"] == tool.name
            assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", fn["name"])
            assert fn["description"] == tool.description
            assert fn["parameters"]["type"] == "object"
            assert fn["strict"] is False
        json.dumps(exported)


async def test_openai_strict_export() -> None:
    async with mgr() as m:
        for entry in build_tools(m, "root").to_openai_chat(strict=True):
            fn = entry["function"]
            params = fn["parameters"]
            assert fn["strict"] is True
            assert params["additionalProperties"] is False
            assert set(params.get("required", [])) == set(params.get("properties", {}))
            assert "$schema" not in params
            jsonschema.Draft202012Validator.check_schema(params)


async def test_openai_responses_export() -> None:
    async with mgr() as m:
        toolset = build_tools(m, "root")
        for entry, tool in zip(toolset.to_openai_responses(), toolset, strict=True):
            assert set(entry) == {"type", "name", "description", "parameters", "strict"}
            assert entry["type"] == "function"
            assert entry["name"] == tool.name
            assert entry["parameters"]["type"] == "object"


async def test_anthropic_export() -> None:
    async with mgr() as m:
        toolset = build_tools(m, "root")
        for entry, tool in zip(toolset.to_anthropic(), toolset, strict=True):
            assert set(entry) == {"name", "description", "input_schema"}
            assert entry["name"] == tool.name
            assert entry["input_schema"]["type"] == "object"
            assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", entry["name"])


async def test_mcp_export() -> None:
    async with mgr() as m:
        exported = {e["name"]: e for e in build_tools(m, "root").to_mcp()}
    assert set(exported) == TOOL_NAMES
    for entry in exported.values():
        assert set(entry) == {
            "name",
            "title",
            "description",
            "inputSchema",
            "outputSchema",
            "annotations",
        }
        assert entry["inputSchema"]["type"] == "object"
        assert entry["outputSchema"]["type"] == "object"
        assert set(entry["annotations"]) <= {
            "title",
            "readOnlyHint",
            "destructiveHint",
            "idempotentHint",
            "openWorldHint",
        }
    assert exported["list_agents"]["annotations"]["readOnlyHint"] is True
    assert exported["wait_agent"]["annotations"]["readOnlyHint"] is False
    assert exported["cancel_agent"]["annotations"]["idempotentHint"] is True
    assert exported["cancel_agent"]["annotations"]["destructiveHint"] is True


def test_tool_result_exports() -> None:
    ok = ToolResult(content="hello", details={"a": 1})
    err = ToolResult(content="bad", is_error=True)
    assert ok.is_error is False
    chat = ok.to_openai_chat("call_1")
    assert chat["role"] == "tool"
    assert chat["tool_call_id"] == "call_1"
    assert chat["content"] == "hello"
    resp = ok.to_openai_responses("call_2")
    assert resp["type"] == "function_call_output"
    assert resp["call_id"] == "call_2"
    assert resp["output"] == "hello"
    anth = err.to_anthropic("toolu_1")
    assert anth["type"] == "tool_result"
    assert anth["tool_use_id"] == "toolu_1"
    assert anth["is_error"] is True
    assert "bad" in json.dumps(anth["content"])
    mcp = err.to_mcp()
    assert mcp["isError"] is True
    assert mcp["content"] == [{"type": "text", "text": "bad"}]
    assert mcp["resultType"] == "complete"
    assert ok.to_mcp()["structuredContent"] == {"a": 1}
    assert ok.to_dict() == {"content": "hello", "details": {"a": 1}, "is_error": False}


# --- timeout layering ---------------------------------------------------------------------


async def test_wait_margin_rule() -> None:
    # The margin is 10 % of the host's timeout and never less than 20 ms.
    async with mgr() as m:
        assert build_tools(m, "root").limits.wait_ceiling == pytest.approx(54.0)
        tight = build_tools(m, "root", engine_tool_timeout=0.1, wait_timeout=0.05)
        assert tight.limits.wait_ceiling == pytest.approx(0.08)


async def test_build_tools_refuses_a_wait_timeout_that_breaks_the_rule() -> None:
    async with mgr() as m:
        build_tools(m, "root")  # defaults: 30 s under 60 s
        build_tools(m, "root", engine_tool_timeout=60.0, wait_timeout=54.0)  # exactly the ceiling
        with pytest.raises(ConfigError):
            build_tools(m, "root", engine_tool_timeout=60.0, wait_timeout=55.0)
        with pytest.raises(ConfigError):
            build_tools(m, "root", engine_tool_timeout=20.0)
        # the per-tool override wins over the engine default, both ways
        build_tools(m, "root", engine_tool_timeout=20.0, tool_timeouts={"wait_agent": 120.0})
        with pytest.raises(ConfigError):
            build_tools(m, "root", engine_tool_timeout=600.0, tool_timeouts={"wait_agent": 10.0})
        for bad in (0.0, -1.0, math.nan):
            with pytest.raises(ConfigError):
                build_tools(m, "root", wait_timeout=bad)


async def test_requested_timeout_is_clamped_and_reported() -> None:
    async with mgr() as m:
        toolset = build_tools(m, "root", engine_tool_timeout=0.5, wait_timeout=0.1)
        tid = await spawn(toolset, "forever")
        start = time.perf_counter()
        result = await toolset.call("wait_agent", {"task_ids": [tid], "timeout_ms": 600_000})
        elapsed = time.perf_counter() - start
        assert not result.is_error
        assert result.details["timed_out"] is True
        assert result.details["completed"] is False
        assert result.details["clamped"] is True
        assert result.details["timeout_ms"] == 450
        assert result.details["requested_timeout_ms"] == 600_000
        assert "clamped" in result.content
        assert "450" in result.content
        assert 0.4 <= elapsed < 0.5


async def test_default_wait_uses_wait_timeout() -> None:
    async with mgr() as m:
        toolset = build_tools(m, "root", engine_tool_timeout=1.0, wait_timeout=0.05)
        tid = await spawn(toolset, "forever")
        start = time.perf_counter()
        result = await toolset.call("wait_agent", {"task_ids": tid})
        assert time.perf_counter() - start < 0.5
        assert result.details["timed_out"] is True
        assert result.details["clamped"] is False


async def test_wait_agent_always_answers_before_the_host_kills_it() -> None:
    host_timeout = 0.3
    async with mgr() as m:
        toolset = build_tools(m, "root", engine_tool_timeout=host_timeout, wait_timeout=0.2)
        tid = await spawn(toolset, "forever")
        for args in (
            {"task_ids": [tid]},
            {"task_ids": [tid], "timeout_ms": 10**12},
            {"task_ids": [tid], "timeout_ms": 290},
            {"task_ids": [tid], "mode": "any", "timeout_ms": 300},
        ):
            answer: ToolResult | None = None
            with anyio.move_on_after(host_timeout):  # a host-like executor
                answer = await toolset.call("wait_agent", args)
            assert answer is not None, f"host killed wait_agent({args})"
            assert answer.details["timed_out"] is True


async def test_delegate_answers_before_the_host_kills_it() -> None:
    host_timeout = 0.3
    async with mgr() as m:
        toolset = build_tools(m, "root", engine_tool_timeout=host_timeout, wait_timeout=0.2)
        answer: ToolResult | None = None
        with anyio.move_on_after(host_timeout):
            answer = await toolset.call("delegate_to_agent", {"agent": "forever", "input": "x"})
        assert answer is not None
        assert "timeout" in answer.content
        assert "halfway" in answer.content


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
async def test_timeout_ms_validation(value: Any, ok: bool) -> None:
    async with mgr() as m:
        toolset = build_tools(m, "root", engine_tool_timeout=2.0, wait_timeout=0.05)
        tid = await spawn(toolset, "echo")
        with anyio.fail_after(3):
            result = await toolset.call("wait_agent", {"task_ids": [tid], "timeout_ms": value})
        if ok:
            assert not result.is_error, result.content
            assert result.details["completed"] is True or result.details["timed_out"] is True
        else:
            assert result.is_error
            assert "timeout_ms" in result.content
            assert "integer" in result.content


async def test_negative_timeout_message_names_field_expectation_and_value() -> None:
    async with mgr() as m:
        toolset = build_tools(m, "root")
        result = await toolset.call("wait_agent", {"task_ids": ["x"], "timeout_ms": -5})
    assert result.is_error
    assert "timeout_ms must be an integer >= 0, got -5" in result.content


async def test_timeout_zero_checks_once() -> None:
    gate = Gate()
    async with mgr(gate) as m:
        toolset = build_tools(m, "root")
        tid = await spawn(toolset, "gated")
        start = time.perf_counter()
        r = await toolset.call("wait_agent", {"task_ids": [tid], "timeout_ms": 0})
        assert time.perf_counter() - start < 0.1
        assert r.details["timed_out"] is True
        gate.event.set()
        await m.handle(tid).done.wait()
        r = await toolset.call("wait_agent", {"task_ids": [tid], "timeout_ms": 0})
        assert r.details["completed"] is True
        assert "gated x" in r.content


# --- spawn_agent --------------------------------------------------------------------------


async def test_spawn_agent_answers_at_once_with_queue_information() -> None:
    gate = Gate()
    async with mgr(gate, max_concurrent_spawns=1) as m:
        toolset = build_tools(m, "root")
        with anyio.fail_after(1):
            first = await toolset.call("spawn_agent", {"agent": "gated", "input": "1"})
            await anyio.wait_all_tasks_blocked()
            second = await toolset.call(
                "spawn_agent", {"agent": "gated", "input": "2", "name": "helper"}
            )
        assert not first.is_error
        assert not second.is_error
        tid = second.details["task_id"]
        assert tid in second.content
        assert second.details["agent_path"] == "/root/helper"
        assert "queued" in second.content
        assert "limit 1" in second.content
        # details spell it status / queue_position / concurrency_limit (not in README)
        assert first.details["status"] == "running"
        assert second.details["status"] == "queued"
        assert second.details["queue_position"] == 1
        assert second.details["concurrency_limit"] == 1
        gate.event.set()


async def test_spawn_agent_timeout_ms_is_the_child_watchdog() -> None:
    async with mgr() as m:
        toolset = build_tools(m, "root")
        tid = await spawn(toolset, "forever", timeout_ms=30)
        with anyio.fail_after(3):
            r = await toolset.call("wait_agent", {"task_ids": [tid], "timeout_ms": 2000})
        assert r.details["completed"] is True
        assert r.details["results"][0]["status"] == "timeout"
        assert "halfway" in r.content


async def test_a_spawn_made_in_a_tool_call_outlives_the_call() -> None:
    gate = Gate()
    async with mgr(gate) as m:
        toolset = build_tools(m, "root")
        async with anyio.create_task_group() as tg:
            tg.start_soon(toolset.call, "spawn_agent", {"agent": "gated", "input": "x"})
        (handle,) = m.tasks("root")
        assert not handle.done.is_set()
        gate.event.set()
        env = await handle.wait()
    assert env.status == Status.COMPLETED


# --- wait_agent ---------------------------------------------------------------------------


async def test_wait_agent_single_id_and_already_collected() -> None:
    async with mgr() as m:
        toolset = build_tools(m, "root")
        tid = await spawn(toolset, "echo", "hello world")
        r = await toolset.call("wait_agent", {"task_ids": tid, "timeout_ms": 2000})
        assert not r.is_error
        assert r.details["completed"] is True
        assert r.details["timed_out"] is False
        assert "hello world" in r.content
        assert r.details["results"][0]["task_id"] == tid
        assert r.details["results"][0]["already_collected"] is False
        assert m.mailbox("root").peek(tid) is None  # consumed
        with anyio.fail_after(1):
            again = await toolset.call("wait_agent", {"task_ids": [tid], "timeout_ms": 60_000})
        assert again.details["completed"] is True
        assert "already collected" in again.content
        assert "hello world" in again.content
        assert again.details["results"][0]["already_collected"] is True


async def test_wait_agent_modes_any_and_all() -> None:
    gate = Gate()
    async with mgr(gate) as m:
        toolset = build_tools(m, "root", engine_tool_timeout=2.0, wait_timeout=0.2)
        fast = await spawn(toolset, "echo", "fast")
        slow = await spawn(toolset, "gated", "slow")
        r = await toolset.call("wait_agent", {"task_ids": [fast, slow], "mode": "any"})
        assert r.details["completed"] is True
        assert r.details["timed_out"] is False
        assert "fast" in r.content
        r = await toolset.call(
            "wait_agent", {"task_ids": [fast, slow], "mode": "all", "timeout_ms": 50}
        )
        assert r.details["completed"] is False
        assert r.details["timed_out"] is True
        pending = json.dumps(r.details["pending"])
        assert slow in pending
        assert "running" in pending
        assert "elapsed" in pending
        gate.event.set()
        r = await toolset.call("wait_agent", {"task_ids": [fast, slow], "timeout_ms": 1000})
        assert r.details["completed"] is True
        assert "gated slow" in r.content


async def test_wait_agent_default_mode_is_all() -> None:
    gate = Gate()
    async with mgr(gate) as m:
        toolset = build_tools(m, "root", engine_tool_timeout=2.0, wait_timeout=0.2)
        fast = await spawn(toolset, "echo")
        slow = await spawn(toolset, "gated")
        r = await toolset.call("wait_agent", {"task_ids": [fast, slow], "timeout_ms": 50})
        assert r.details["mode"] == "all"
        assert r.details["timed_out"] is True
        gate.event.set()


async def test_wait_agent_content_is_bounded_in_total() -> None:
    async with mgr(max_concurrent_spawns=8) as m:
        toolset = build_tools(m, "root")
        ids = [await spawn(toolset, "echo", str(i) * 5000) for i in range(6)]
        for tid in ids:
            await m.handle(tid).done.wait()  # ended, not collected
        r = await toolset.call("wait_agent", {"task_ids": ids, "timeout_ms": 1000})
        assert len(r.content) <= 2000
        fresh = {e["task_id"] for e in r.details["results"] if not e["already_collected"]}
        deferred = set(r.details.get("deferred", []))
        assert fresh | deferred == set(ids)
        assert not fresh & deferred
        # collecting the deferred ones later: every result is delivered fresh exactly once
        seen = set(fresh)
        for _ in range(10):
            if not deferred:
                break
            r = await toolset.call("wait_agent", {"task_ids": sorted(deferred), "timeout_ms": 0})
            assert len(r.content) <= 2000
            got = {e["task_id"] for e in r.details["results"] if not e["already_collected"]}
            assert not got & seen
            seen |= got
            deferred = set(r.details.get("deferred", []))
        assert seen == set(ids)


async def test_truncate_chars_override_bounds_content() -> None:
    async with mgr() as m:
        toolset = build_tools(m, "root", truncate_chars=500)
        tid = await spawn(toolset, "echo", "y" * 5000)
        r = await toolset.call("wait_agent", {"task_ids": [tid], "timeout_ms": 1000})
        assert len(r.content) <= 500
        assert "truncated" in r.content


async def test_full_mailbox_never_hides_a_result() -> None:
    async with mgr(mailbox_capacity=1, max_concurrent_spawns=8) as m:
        toolset = build_tools(m, "root")
        ids = [await spawn(toolset, "echo", f"r{i}") for i in range(4)]
        for tid in ids:
            await m.handle(tid).done.wait()
        r = await toolset.call("wait_agent", {"task_ids": ids, "timeout_ms": 1000})
        assert r.details["completed"] is True
        for i in range(4):
            assert f"r{i}" in r.content


async def test_wait_agent_wakes_early_when_the_session_is_closed() -> None:
    async with mgr() as m:
        toolset = build_tools(m, "s1", engine_tool_timeout=30.0, wait_timeout=20.0)
        tid = await spawn(toolset, "forever")
        results: list[ToolResult] = []

        async def waiter() -> None:
            results.append(await toolset.call("wait_agent", {"task_ids": [tid]}))

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter)
                await anyio.wait_all_tasks_blocked()
                await m.close_session("s1")
    (r,) = results
    assert r.details["session_closed"] is True
    assert "closed" in r.content


async def test_result_at_the_deadline_is_never_lost() -> None:
    """Children finish around the wait deadline; every result is delivered fresh once."""

    async def timed(request: Request, ctx: RunContext) -> str:
        await anyio.sleep(float(request.input))
        return request.input

    m = SubagentManager(
        [AgentSpec(name="timed", description="Sleeps.", runner=timed)],
        config=SubagentConfig(max_concurrent_spawns=64),
    )
    async with m:
        toolset = build_tools(m, "root")
        ids = [await spawn(toolset, "timed", f"{0.02 + i * 0.001:.3f}") for i in range(20)]
        fresh: list[str] = []
        for tid in ids:
            r = await toolset.call("wait_agent", {"task_ids": [tid], "timeout_ms": 1})
            if r.details["completed"]:
                assert r.details["results"][0]["already_collected"] is False
                fresh.append(tid)
            else:
                assert r.details["timed_out"] is True
        r = await toolset.call("wait_agent", {"task_ids": ids, "timeout_ms": 2000})
        assert r.details["completed"] is True
        again = [e["task_id"] for e in r.details["results"] if not e["already_collected"]]
        old = [e["task_id"] for e in r.details["results"] if e["already_collected"]]
        assert sorted(fresh + again + r.details.get("deferred", [])) == sorted(ids)
        # repeats that do not fit the bound are only named in the text, not in details
        assert set(old) <= set(fresh)
        for tid in set(fresh) - set(old):
            assert tid in r.content


async def test_two_concurrent_waits_consume_once() -> None:
    gate = Gate()
    async with mgr(gate) as m:
        toolset = build_tools(m, "root")
        tid = await spawn(toolset, "gated")
        results: list[ToolResult] = []

        async def waiter() -> None:
            results.append(await toolset.call("wait_agent", {"task_ids": [tid]}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            gate.event.set()
    flags = sorted(r.details["results"][0]["already_collected"] for r in results)
    assert flags == [False, True]


async def test_cancelling_a_wait_consumes_nothing() -> None:
    gate = Gate()
    async with mgr(gate) as m:
        toolset = build_tools(m, "root")
        tid = await spawn(toolset, "gated")
        with anyio.move_on_after(0.05):
            await toolset.call("wait_agent", {"task_ids": [tid]})
        gate.event.set()
        await m.handle(tid).done.wait()
        r = await toolset.call("wait_agent", {"task_ids": [tid], "timeout_ms": 0})
        assert r.details["results"][0]["already_collected"] is False


# --- delegate_to_agent --------------------------------------------------------------------


async def test_delegate_envelope_mode() -> None:
    async with mgr() as m:
        toolset = build_tools(m, "root")
        ok = await toolset.call("delegate_to_agent", {"agent": "echo", "input": "sync hi"})
        assert not ok.is_error
        assert "sync hi" in ok.content
        assert "completed" in ok.content
        bad = await toolset.call("delegate_to_agent", {"agent": "boom", "input": "x"})
        assert bad.is_error is False  # a failed child is not a tool error in envelope mode
        assert "error" in bad.content
        assert "it broke" in bad.content


async def test_delegate_string_mode() -> None:
    async with mgr() as m:
        toolset = build_tools(m, "root", return_mode="string")
        ok = await toolset.call("delegate_to_agent", {"agent": "echo", "input": "bare"})
        assert ok.content == "bare"
        assert not ok.is_error
        bad = await toolset.call("delegate_to_agent", {"agent": "boom", "input": "x"})
        assert bad.is_error is True
        assert "it broke" in bad.content


async def test_delegate_invalid_mode_falls_back_to_envelope() -> None:
    async with mgr() as m:
        toolset = build_tools(m, "root", return_mode="bogus")
        r = await toolset.call("delegate_to_agent", {"agent": "echo", "input": "hi"})
        assert not r.is_error
        assert "completed" in r.content
        assert r.content != "hi"


async def test_delegate_timeout_ms() -> None:
    async with mgr() as m:
        toolset = build_tools(m, "root")
        with anyio.fail_after(3):
            r = await toolset.call(
                "delegate_to_agent", {"agent": "forever", "input": "x", "timeout_ms": 30}
            )
        assert "timeout" in r.content
        assert "halfway" in r.content


# --- cancel_agent, list_agents ------------------------------------------------------------


async def test_cancel_agent_reports_previous_status_and_is_idempotent() -> None:
    async with mgr() as m:
        toolset = build_tools(m, "root")
        tid = await spawn(toolset, "forever")
        await anyio.wait_all_tasks_blocked()
        first = await toolset.call("cancel_agent", {"task_id": tid})
        assert not first.is_error
        assert "running" in first.content
        await m.handle(tid).done.wait()
        second = await toolset.call("cancel_agent", {"task_id": tid})
        assert not second.is_error
        assert "cancelled" in second.content
        r = await toolset.call("wait_agent", {"task_ids": [tid], "timeout_ms": 0})
        assert r.details["results"][0]["status"] == "cancelled"


async def test_cancel_agent_of_a_queued_child() -> None:
    gate = Gate()
    async with mgr(gate, max_concurrent_spawns=1) as m:
        toolset = build_tools(m, "root")
        await spawn(toolset, "gated")
        queued = await spawn(toolset, "gated")
        r = await toolset.call("cancel_agent", {"task_id": queued})
        assert "queued" in r.content
        assert m.handle(queued).result.status == Status.CANCELLED
        gate.event.set()


async def test_list_agents() -> None:
    gate = Gate()
    async with mgr(gate) as m:
        toolset = build_tools(m, "root")
        done = await spawn(toolset, "echo", "x", name="finisher")
        await m.handle(done).done.wait()
        running = await spawn(toolset, "gated", "y")
        await anyio.wait_all_tasks_blocked()
        r = await toolset.call("list_agents", {})
        assert not r.is_error
        for needle in ("echo", "Echoes its input back.", "gated", "Waits for a gate."):
            assert needle in r.content
        assert done in r.content
        assert running in r.content
        assert "/root/finisher" in r.content
        assert "running" in r.content
        details = json.dumps(r.details)
        assert done in details
        # "whether their result is waiting"
        waiting = {t["task_id"]: t["result_waiting"] for t in r.details["tasks"]}
        assert waiting == {done: True, running: False}
        assert "result waiting" in r.content
        assert running in details
        gate.event.set()
        # also callable with no arguments at all
        assert not (await toolset.call("list_agents")).is_error


# --- errors a model can act on ------------------------------------------------------------


async def test_unknown_field_lists_the_allowed_ones() -> None:
    async with mgr() as m:
        toolset = build_tools(m, "root")
        r = await toolset.call("wait_agent", {"task_id": "abc"})
    assert r.is_error
    assert "task_id" in r.content
    assert "task_ids" in r.content
    assert "mode" in r.content
    assert "timeout_ms" in r.content
    assert r.details["error"] == "invalid_arguments"


async def test_missing_and_wrong_typed_fields() -> None:
    async with mgr() as m:
        toolset = build_tools(m, "root")
        r = await toolset.call("spawn_agent", {"agent": "echo"})
        assert r.is_error
        assert "input" in r.content
        r = await toolset.call("spawn_agent", {"agent": 5, "input": "x"})
        assert r.is_error
        assert "agent" in r.content
        assert "5" in r.content
        r = await toolset.call("wait_agent", {"task_ids": [], "mode": "all"})
        assert r.is_error
        assert "task_ids" in r.content
        r = await toolset.call("wait_agent", {"task_ids": ["a"], "mode": "some"})
        assert r.is_error
        assert "mode" in r.content
        assert "some" in r.content
        r = await toolset.call("spawn_agent", "not json {")
        assert r.is_error
        r = await toolset.call("spawn_agent", ["a", "list"])
        assert r.is_error


async def test_arguments_as_json_text_and_null_as_omitted() -> None:
    async with mgr() as m:
        toolset = build_tools(m, "root")
        r = await toolset.call(
            "spawn_agent", json.dumps({"agent": "echo", "input": "j", "name": None})
        )
        assert not r.is_error, r.content
        tid = r.details["task_id"]
        r = await toolset.call("wait_agent", {"task_ids": [tid], "mode": None, "timeout_ms": None})
        assert not r.is_error, r.content
        assert "j" in r.content


async def test_unknown_agent_lists_registered_ones() -> None:
    async with mgr() as m:
        toolset = build_tools(m, "root")
        for tool in ("spawn_agent", "delegate_to_agent"):
            r = await toolset.call(tool, {"agent": "nope", "input": "x"})
            assert r.is_error
            assert "nope" in r.content
            for name in ("echo", "forever", "boom"):
                assert name in r.content
            assert r.details["error"] == "unknown_agent"


async def test_unknown_task_id_names_similar_ids_and_live_ones() -> None:
    async with mgr() as m:
        toolset = build_tools(m, "root")
        tid = await spawn(toolset, "forever")
        # (an id of digits only has no upper case: then that variant is the id itself)
        wrongs = [tid[:7], tid + "x"] + ([tid.upper()] if tid.upper() != tid else [])
        for wrong in wrongs:
            r = await toolset.call("wait_agent", {"task_ids": [wrong], "timeout_ms": 0})
            assert r.is_error, wrong
            assert r.details["error"] == "unknown_task"
            assert "did you mean" in r.content
            assert tid in r.content
        r = await toolset.call("cancel_agent", {"task_id": "zzzz"})
        assert r.is_error
        assert tid in r.content  # lists the live ones


async def test_unknown_task_id_of_another_session() -> None:
    async with mgr() as m:
        mine = build_tools(m, "root")
        theirs = build_tools(m, "s2")
        tid = await spawn(theirs, "echo")
        r = await mine.call("wait_agent", {"task_ids": [tid], "timeout_ms": 0})
        assert r.is_error
        assert "another session" in r.content
        assert "s2" in r.content


async def test_unknown_tool_name_is_an_error_result() -> None:
    async with mgr() as m:
        r = await build_tools(m, "root").call("no_such_tool", {})
    assert r.is_error
    assert r.details["error"] == "unknown_tool"
    assert "spawn_agent" in r.content


async def test_depth_refusal_says_do_it_yourself() -> None:
    async with mgr(max_depth=0) as m:
        toolset = build_tools(m, "root")
        r = await toolset.call("spawn_agent", {"agent": "echo", "input": "x"})
        assert r.is_error
        assert r.details["error"] == "spawn_rejected"
        assert "yourself" in r.content
        r = await toolset.call("delegate_to_agent", {"agent": "echo", "input": "x"})
        assert r.is_error
        assert "yourself" in r.content


async def test_tools_inside_a_runner_use_its_session() -> None:
    seen: dict[str, Any] = {}

    async def parent(request: Request, ctx: RunContext) -> str:
        toolset = build_tools(ctx.manager, ctx.session_id)
        r = await toolset.call("spawn_agent", {"agent": "echo", "input": "inner"})
        seen["path"] = r.details["agent_path"]
        w = await toolset.call("wait_agent", {"task_ids": [r.details["task_id"]]})
        return w.content

    m = SubagentManager([*specs(), AgentSpec(name="parent", description="Spawns.", runner=parent)])
    async with m:
        env = await m.spawn("parent", "x").wait()
    assert seen["path"] == "/root/parent/echo"
    assert "inner" in env.output


# --- fuzz ---------------------------------------------------------------------------------


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**15), max_value=10**15)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=10,
)
field_names = st.sampled_from(
    ["agent", "input", "name", "timeout_ms", "task_ids", "mode", "task_id", "x"]
)
arguments = st.one_of(
    json_values,
    st.dictionaries(field_names, json_values, max_size=4),
    st.text(max_size=30),
)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tool=st.sampled_from([*sorted(TOOL_NAMES), "bogus"]), args=arguments)
def test_fuzz_execute_never_raises(backend: str, tool: str, args: Any) -> None:
    async def main() -> None:
        async with mgr() as m:
            toolset = build_tools(m, "root", engine_tool_timeout=0.5, wait_timeout=0.05)
            with anyio.fail_after(2):
                result = await toolset.call(tool, args)
            assert isinstance(result, ToolResult)
            assert isinstance(result.content, str)
            assert result.content
            json.dumps(result.details)

    anyio.run(main, backend=backend)


# --- waking an idle parent ----------------------------------------------------------------


async def test_completions_wakes_without_consuming_and_collects_all_three() -> None:
    async def sleepy(request: Request, ctx: RunContext) -> str:
        await anyio.sleep(float(request.input))
        return f"slept {request.input}"

    m = SubagentManager([AgentSpec(name="sleepy", description="Sleeps.", runner=sleepy)])
    async with m:
        toolset = build_tools(m, "root")
        ids = [await spawn(toolset, "sleepy", d) for d in ("0.01", "0.03", "0.05")]
        woken = 0
        with anyio.fail_after(5):
            while True:
                ready = await m.completions("root")
                if not ready:
                    break
                woken += 1
                for env in ready:
                    assert m.mailbox("root").peek(env.task_id) == env  # not consumed
                if len(ready) == 3:
                    break
                await anyio.sleep(0.005)
        assert woken >= 1
        r = await toolset.call("wait_agent", {"task_ids": ids, "mode": "all", "timeout_ms": 5000})
        assert r.details["completed"] is True
        assert all(not e["already_collected"] for e in r.details["results"])
        assert len(r.details["results"]) == 3
        # nothing unfinished: completions answers [] at once
        with anyio.fail_after(1):
            assert await m.completions("root") == []


async def test_completions_async_for_yields_each_once() -> None:
    async with mgr() as m:
        toolset = build_tools(m, "root")
        ids = [await spawn(toolset, "echo", str(i)) for i in range(3)]
        got: list[str] = []
        with anyio.fail_after(5):
            async for env in m.completions("root"):
                got.append(env.task_id)
        assert sorted(got) == sorted(ids)


async def test_scripted_loop_spawns_three_sleeps_and_collects() -> None:
    async def sleepy(request: Request, ctx: RunContext) -> str:
        await anyio.sleep(0.02)
        return f"done {request.input}"

    m = SubagentManager([AgentSpec(name="sleepy", description="Sleeps.", runner=sleepy)])
    async with m:
        toolset = build_tools(m, "root")
        model = ScriptedModel(
            [
                [ToolCall("spawn_agent", {"agent": "sleepy", "input": str(i)}) for i in range(3)],
                "waiting for my subagents",
                ToolCall("wait_agent", lambda t: {"task_ids": t.task_ids(), "mode": "all"}),
                "all done",
            ]
        )
        with anyio.fail_after(5):
            transcript = await run_tool_loop(model, toolset)
        model.assert_done()
        collected = transcript.collected()
        assert len(collected) == 3


async def test_scripted_model_fails_on_a_leftover_turn() -> None:
    async with mgr() as m:
        toolset = build_tools(m, "root")
        model = ScriptedModel(["first", "leftover"])
        await run_tool_loop(model, toolset)
        with pytest.raises(ScriptError):
            model.assert_done()
