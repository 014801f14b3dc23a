"""Each tool's input schema and its validator agree, with jsonschema as the judge: whatever
arguments the schema accepts the tool accepts, and whatever it rejects the tool rejects
with an ``invalid_arguments`` error naming a field the schema blames.

The judge reads ``pattern`` as ECMA-262, the dialect JSON Schema specifies (through
``regress``, the engine jsonschema itself uses for the ``regex`` format): Python's ``re``,
which jsonschema uses for ``pattern``, lets ``$`` match before a final newline, so it
would take ``"a\\n"`` as a name. The arguments are JSON: each example travels through
orjson as a host's would, so lone surrogates (not UTF-8) and non-finite numbers (no JSON
form) are left to the fuzz tests. Top-level ``null`` is "no arguments" (MCP's absent
``arguments``), not an instance of the schema.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from typing import Any

import anyio
import jsonschema
import pytest
import regress
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator, ValidationError

from subagents import SubagentConfig, SubagentManager
from subagents._json import dumps, dumps_str, loads
from subagents.testing import echo_agent
from subagents.tools import Tool, ToolResult, build_tools
from tests.helpers import substitute
from tests.schema_check import details_problems

DONE = "@done"
"""Replaced by the id of a finished task of the session, so a valid wait answers at once."""
TOOLS = ("spawn_agent", "wait_agent", "delegate_to_agent", "cancel_agent", "list_agents")


@functools.cache
def _ecma(pattern: str) -> regress.Regex:
    return regress.Regex(pattern)


def _ecma_pattern(
    validator: Any, pattern: str, instance: object, schema: object
) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and _ecma(pattern).find(instance) is None:
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


Judge = jsonschema.validators.extend(Draft202012Validator, {"pattern": _ecma_pattern})


def judge(tool: Tool) -> Any:
    return Judge(tool.input_schema)


edge_strings = st.sampled_from(
    [
        "",
        " ",
        "a",
        "bad name!",
        "x" * 64,
        "x" * 65,
        "a\n",
        "\na",
        "a b",
        "a/b",
        "é",
        "A-1.b_c",
        "-x",
        ".x",
        "_x",
        "0" * 12,
        "f" * 64,
        "f" * 65,
        "\t",
        "~!",
        "echo",
        "nope",
        "all",
        "any",
        "ALL",
        DONE,
    ]
)
strings = (
    edge_strings
    | st.text(st.characters(codec="ascii"), max_size=70)
    | st.text(max_size=12)
    | st.builds(lambda a, b: a + b, edge_strings, edge_strings)
)
integers = st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.sampled_from(
    [0, 1, -1, 2, 2**53 - 1, 2**53, 2**53 + 1, 2**63 - 1]
)
floats = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(
    [0.0, -0.0, 1.0, 1.5, 1000.0, -1.0, 1e300, 2.0**53]
)
scalars = st.none() | st.booleans() | integers | floats | strings
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(strings, inner, max_size=3),
    max_leaves=8,
)
hex_ids = st.text("0123456789abcdef", min_size=12, max_size=12)
ids = hex_ids | st.just(DONE) | st.from_regex(r"[!-~]{1,64}", fullmatch=True)
names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,70}", fullmatch=True)


PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "agent": st.sampled_from(["echo", "nope", "", "Echo", "echo "]),
    "input": st.text(max_size=20) | edge_strings,
    "name": names | edge_strings | st.none(),
    "timeout_ms": st.integers(-2, 10**6)
    | st.none()
    | st.sampled_from([2**53, 2**60, 1e300, 1000.0, 1.5, -0.0]),
    "task_ids": ids
    | edge_strings
    | st.lists(ids | edge_strings, max_size=4)
    | st.lists(st.just(DONE), min_size=60, max_size=70),
    "mode": st.sampled_from(["all", "any", None, "ALL", "some", ""]),
    "idempotency_key": st.sampled_from(["k1", "", "k" * 256, "k" * 257, None]) | strings,
    "task_id": ids | edge_strings,
    "budget": st.none()
    | st.fixed_dictionaries(
        {},
        optional={
            name: st.none() | st.integers(-2, 10**6) | st.sampled_from([2**60, 1.0, 1.5, "5"])
            for name in ("tokens", "input_tokens", "output_tokens", "spawns", "time_ms")
        },
    )
    | st.dictionaries(strings, json_values, max_size=2)
    | json_values,
}
PARAMS = {
    "spawn_agent": ("agent", "input", "name", "timeout_ms", "budget", "idempotency_key"),
    "wait_agent": ("task_ids", "mode", "timeout_ms"),
    "delegate_to_agent": ("agent", "input", "timeout_ms", "budget"),
    "cancel_agent": ("task_id",),
    "list_agents": (),
}
REQUIRED = {
    "spawn_agent": ("agent", "input"),
    "wait_agent": ("task_ids",),
    "delegate_to_agent": ("agent", "input"),
    "cancel_agent": ("task_id",),
    "list_agents": (),
}


@st.composite
def arguments(draw: st.DrawFn, tool: str) -> Any:
    """Objects with the required fields and plausible values (edge values among them),
    then at most one of: a field made any JSON value, a required field dropped, an extra
    field, or arguments that are not an object at all."""
    params = PARAMS[tool]
    required = {f: PLAUSIBLE[f] for f in REQUIRED[tool]}
    optional = {f: PLAUSIBLE[f] for f in params if f not in required}
    args: dict[str, Any] = draw(st.fixed_dictionaries(required, optional=optional))
    change = draw(st.sampled_from(["none", "none", "value", "drop", "extra", "whole"]))
    if change == "value" and params:
        args[draw(st.sampled_from(params))] = draw(json_values)
    elif change == "drop" and REQUIRED[tool]:
        del args[draw(st.sampled_from(REQUIRED[tool]))]
    elif change == "extra":
        key = draw(strings | st.sampled_from(["task_id", "agents", "timeout"]))
        args[key] = draw(json_values)
    elif change == "whole":
        return draw(json_values.filter(lambda v: v is not None and not isinstance(v, dict)))
    return args


def blamed(tool: Tool, instance: object) -> set[str]:
    """The fields the judge finds fault with (empty: the arguments as a whole)."""
    fields: set[str] = set()
    properties = tool.input_schema["properties"]
    assert isinstance(properties, dict)
    for error in judge(tool).iter_errors(instance):
        path = list(error.absolute_path)
        if path:
            fields.add(str(path[0]))
        elif error.validator == "required" and isinstance(instance, dict):
            fields.update(f for f in error.validator_value if f not in instance)
        elif error.validator == "additionalProperties" and isinstance(instance, dict):
            fields.update(k for k in instance if k not in properties)
    return fields


async def call(tool: str, args: Any, as_text: bool) -> tuple[Tool, Any, ToolResult]:
    config = SubagentConfig(spawn_timeout=2, execute_timeout=2)
    async with SubagentManager([echo_agent()], config=config) as manager:
        tools = build_tools(manager, "root", engine_tool_timeout=1, wait_timeout=0.5)
        done = manager.spawn("echo", "x")
        await done.wait()
        instance = loads(dumps(substitute(args, DONE, done.task_id)))
        # The tools read a str as JSON text: a string instance only travels that way.
        text = as_text or isinstance(instance, str)
        with anyio.fail_after(5):
            result = await tools[tool].execute(dumps_str(instance) if text else instance)
        return tools[tool], instance, result


def check(tool_name: str, args: Any, as_text: bool, backend: str) -> None:
    try:
        dumps(args)
    except TypeError:  # a lone surrogate: no UTF-8 JSON form, outside the judge's domain
        assume(False)
    tool, instance, result = anyio.run(call, tool_name, args, as_text, backend=backend)
    assert not details_problems(tool, result.details, complete=True)
    if judge(tool).is_valid(instance):
        assert result.details.get("error") not in ("invalid_arguments", "internal"), (
            instance,
            result.content,
        )
        return
    assert result.is_error, (instance, result.content)
    assert result.details["error"] == "invalid_arguments", (instance, result.content)
    if isinstance(instance, dict):
        field = result.details.get("field")
        # details bound an unknown field's name to its first 80 characters
        assert field in {f[:80] for f in blamed(tool, instance)}, (instance, result.content)
        if field in PARAMS[tool_name]:
            assert field in result.content


def agreement(tool: str) -> Any:
    @pytest.mark.parametrize("backend", ["asyncio", "trio"])
    @settings(
        max_examples=120,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(args=arguments(tool), as_text=st.booleans())
    def test(args: Any, as_text: bool, backend: str) -> None:
        check(tool, args, as_text, backend)

    return test


test_spawn_agent_schema_and_validator_agree = agreement("spawn_agent")
test_wait_agent_schema_and_validator_agree = agreement("wait_agent")
test_delegate_to_agent_schema_and_validator_agree = agreement("delegate_to_agent")
test_cancel_agent_schema_and_validator_agree = agreement("cancel_agent")
test_list_agents_schema_and_validator_agree = agreement("list_agents")


# The cases that disagreed, named: each is decided the same way by schema and tool.
CASES = [
    ("spawn_agent", {"agent": "echo", "input": "x", "name": "bad name!"}, False),
    ("spawn_agent", {"agent": "echo", "input": "x", "name": "x" * 65}, False),
    ("spawn_agent", {"agent": "echo", "input": "x", "name": "x" * 64}, True),
    ("spawn_agent", {"agent": "echo", "input": "x", "name": ""}, False),
    ("spawn_agent", {"agent": "echo", "input": "x", "name": "a\n"}, False),
    ("spawn_agent", {"agent": "echo", "input": "x", "name": None}, True),
    ("spawn_agent", {"agent": "echo", "input": "x", "timeout_ms": 2**60}, True),
    ("spawn_agent", {"agent": "echo", "input": "x", "idempotency_key": ""}, False),
    ("spawn_agent", {"agent": "echo", "input": "x", "idempotency_key": "k" * 257}, False),
    ("spawn_agent", {"agent": "echo", "input": "x", "idempotency_key": "k" * 256}, True),
    ("spawn_agent", {"agent": "echo", "input": "x", "budget": {}}, True),
    ("spawn_agent", {"agent": "echo", "input": "x", "budget": {"tokens": None}}, True),
    ("spawn_agent", {"agent": "echo", "input": "x", "budget": {"tokens": 2**60}}, True),
    ("spawn_agent", {"agent": "echo", "input": "x", "budget": {"time_ms": 0}}, False),
    ("spawn_agent", {"agent": "echo", "input": "x", "budget": {"spawns": -1}}, False),
    ("spawn_agent", {"agent": "echo", "input": "x", "budget": {"token": 5}}, False),
    ("spawn_agent", {"agent": "echo", "input": "x", "budget": "tokens=5"}, False),
    ("delegate_to_agent", {"agent": "echo", "input": "x", "budget": {"tokens": 1.0}}, True),
    ("wait_agent", {"task_ids": " "}, False),
    ("wait_agent", {"task_ids": [DONE, " "]}, False),
    ("wait_agent", {"task_ids": DONE + " "}, False),
    ("wait_agent", {"task_ids": DONE, "mode": None, "timeout_ms": None}, True),
    ("wait_agent", {"task_ids": DONE, "timeout_ms": 2**53}, True),
    ("cancel_agent", {"task_id": ""}, False),
    ("cancel_agent", {"task_id": " "}, False),
    ("cancel_agent", {"task_id": "f" * 65}, False),
]


@pytest.mark.parametrize(("tool", "args", "valid"), CASES)
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_named_disagreements_are_gone(tool: str, args: Any, valid: bool, backend: str) -> None:
    found, instance, _ = anyio.run(call, tool, args, False, backend=backend)
    assert judge(found).is_valid(instance) is valid
    check(tool, args, False, backend)


def schema_patterns(node: object) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("pattern"), str):
            yield node["pattern"]
        for value in node.values():
            yield from schema_patterns(value)
    elif isinstance(node, list):
        for item in node:
            yield from schema_patterns(item)


@pytest.mark.anyio
async def test_patterns_are_plain_anchored_ecma_regexes(anyio_backend: str) -> None:
    """Every ``pattern`` of every export (the OpenAI strict one too) compiles as ECMA-262,
    is anchored at both ends and uses none of the features some providers refuse
    (lookaround, backreferences, word boundaries)."""
    async with SubagentManager([echo_agent()]) as manager:
        tools = build_tools(manager, "root")
        exports = [
            tools.to_mcp(),
            tools.to_anthropic(),
            tools.to_openai_chat(),
            tools.to_openai_responses(strict=True),
        ]
    patterns = {p for export in exports for p in schema_patterns(export)}
    assert len(patterns) == 2  # the name and the task id
    for pattern in patterns:
        regress.Regex(pattern)
        assert pattern.startswith("^")
        assert pattern.endswith("$")
        assert not re.search(r"\(\?|\\[1-9bBk]", pattern), pattern


def test_python_re_reads_the_name_pattern_differently() -> None:
    """Why the judge reads patterns as ECMA-262: stock jsonschema uses ``re.search``."""
    schema = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]*$"}
    assert Draft202012Validator(schema).is_valid("a\n")
    assert not Judge(schema).is_valid("a\n")
    assert Judge(schema).is_valid("a")
