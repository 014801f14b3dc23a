"""Fuzz every tool's execute with hypothesis-generated JSON: it never raises and always
returns a ToolResult whose details serialise, and what ``Tool.parse_arguments`` refuses
execute answers ``invalid_arguments`` to."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from subagents import SubagentConfig, SubagentManager
from subagents._json import dumps
from subagents.testing import echo_agent
from subagents.tools import ToolResult, build_tools
from tests.helpers import substitute

VALID_ID = "@valid-id"
FIELDS = {
    "spawn_agent": ["agent", "input", "name", "timeout_ms", "budget", "idempotency_key"],
    "wait_agent": ["task_ids", "mode", "timeout_ms"],
    "delegate_to_agent": ["agent", "input", "timeout_ms", "budget"],
    "cancel_agent": ["task_id"],
    "list_agents": [],
}

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from([VALID_ID, "echo", "all", "any", "", "a/b", "\ud800"])
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "agent": st.sampled_from(["echo", "nope", "Echo"]) | json_values,
    "input": st.text(max_size=30) | json_values,
    "name": st.sampled_from(["n1", "a/b", "", "x" * 70]) | st.text(max_size=8),
    "timeout_ms": st.integers(min_value=-10, max_value=10**13) | json_values,
    "idempotency_key": st.sampled_from(["k1", "", "k" * 257]) | st.text(max_size=8),
    "task_ids": st.sampled_from([VALID_ID, [VALID_ID], [VALID_ID, "x"], "abc", [], [""]])
    | json_values,
    "mode": st.sampled_from(["any", "all", "x"]) | json_values,
    "task_id": st.sampled_from([VALID_ID, "abc", VALID_ID.upper()]) | json_values,
    "budget": st.dictionaries(
        st.sampled_from(["tokens", "spawns", "time_ms", "x"]), json_values, max_size=3
    )
    | json_values,
}


def arguments(tool: str) -> st.SearchStrategy[Any]:
    keys = st.sampled_from(FIELDS[tool]) if FIELDS[tool] else st.text(max_size=6)
    plausible = st.fixed_dictionaries({}, optional={f: PLAUSIBLE[f] for f in FIELDS[tool]})
    return st.one_of(
        plausible,
        plausible,
        json_values,
        st.dictionaries(keys, json_values, max_size=4),
        st.dictionaries(keys | st.text(max_size=6), json_values, max_size=4),
        st.text(max_size=20),
    )


async def run_one(tool: str, args: Any) -> ToolResult:
    result, _ = await parse_and_run(tool, args)
    return result


async def parse_and_run(tool: str, args: Any) -> tuple[ToolResult, bool]:
    """The result of ``execute``, and whether ``parse_arguments`` accepted the arguments."""
    config = SubagentConfig(spawn_timeout=0.5, execute_timeout=0.5)
    async with SubagentManager([echo_agent()], config=config) as manager:
        tools = build_tools(manager, "root", engine_tool_timeout=0.4, wait_timeout=0.05)
        done = manager.spawn("echo", "x")
        await done.wait()
        args = substitute(args, VALID_ID, done.task_id)
        try:
            tools[tool].parse_arguments(args)
        except ValueError:
            accepted = False
        else:
            accepted = True
        with anyio.fail_after(2):
            return await tools[tool].execute(args), accepted


def check(tool: str, args: Any, backend: str) -> None:
    result, accepted = anyio.run(parse_and_run, tool, args, backend=backend)
    assert isinstance(result, ToolResult)
    assert isinstance(result.content, str)
    assert isinstance(result.is_error, bool)
    dumps(result.details)
    if not accepted:  # the tool may refuse more (a name's grammar), never less
        assert result.details.get("error") == "invalid_arguments", result.content


def fuzz(tool: str) -> Any:
    @pytest.mark.parametrize("backend", ["asyncio", "trio"])
    @settings(
        max_examples=40,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(args=arguments(tool))
    def test(args: Any, backend: str) -> None:
        check(tool, args, backend)

    return test


test_fuzz_spawn_agent = fuzz("spawn_agent")
test_fuzz_wait_agent = fuzz("wait_agent")
test_fuzz_delegate_to_agent = fuzz("delegate_to_agent")
test_fuzz_cancel_agent = fuzz("cancel_agent")
test_fuzz_list_agents = fuzz("list_agents")


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_valid_calls_succeed(backend: str) -> None:
    """The fuzz harness itself can tell success from failure."""
    check("wait_agent", {"task_ids": VALID_ID}, backend)
    result = anyio.run(run_one, "wait_agent", {"task_ids": [VALID_ID]}, backend=backend)
    assert not result.is_error
    assert result.details["completed"] is True
    bad = anyio.run(run_one, "wait_agent", {"task_ids": 5}, backend=backend)
    assert bad.is_error
