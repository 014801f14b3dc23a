"""Fuzzing every tool's input through ``Toolset.call``: random JSON values, huge strings,
deep nesting, unicode with lone surrogates, NaN and infinities, negative and enormous
numbers, wrong types for every field, extra fields, and arguments given as JSON text
(valid or not), ``None``, a list or bytes.

The contract checked on every call: it never raises, never hangs, and returns a
:class:`ToolResult` whose ``content`` is a ``str`` within the toolset's bound and whose
whole ``to_dict()`` (content and details) serialises with orjson (``subagents._json``), so
a host can always send it on. One long-lived manager per backend (an anyio blocking
portal) takes every example, so state builds up as it would in a real session.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from subagents import AgentSpec, Request, RunContext, SubagentConfig, SubagentManager
from subagents._json import dumps, dumps_str
from subagents.testing import echo_agent
from subagents.tools import ToolResult, Toolset, build_tools

TRUNCATE = 2000
FIELDS = {
    "spawn_agent": ("agent", "input", "name", "timeout_ms", "idempotency_key"),
    "wait_agent": ("task_ids", "mode", "timeout_ms"),
    "delegate_to_agent": ("agent", "input", "timeout_ms"),
    "cancel_agent": ("task_id",),
    "list_agents": (),
}
# Placeholders replaced by real ids of the fuzzed session (or of another one).
LIVE, DONE, FOREIGN = "@live", "@done", "@foreign"
HUGE = ["x" * 1_000_000, "é" * 200_000, "\ud800" * 50_000, "a\x00b" * 100_000]
SURROGATES = ["\ud800", "\udfff", "a\udc80b", "\ud83d", "\U0001f600\ud800"]


def nested(depth: int, kind: str) -> object:
    value: object = "leaf"
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    return value


unicode_text = st.text(
    st.characters(categories=["L", "M", "N", "P", "S", "Z", "C"]), max_size=40
) | st.sampled_from(SURROGATES)
numbers = (
    st.integers(min_value=-(2**80), max_value=2**80)
    | st.sampled_from([0, -1, 1, 2**53, 2**53 + 1, 2**63, -(2**63), 10**40, -(10**40)])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([float("nan"), float("inf"), float("-inf"), -0.0, 1e308, 5e-324, 1.5])
)
scalars = (
    st.none()
    | st.booleans()
    | numbers
    | unicode_text
    | st.sampled_from(HUGE)
    | st.sampled_from([LIVE, DONE, FOREIGN, "echo", "slow", "all", "any", "", " ", "a/b"])
)
deep = st.builds(nested, st.integers(1, 300), st.sampled_from(["list", "dict"]))
json_values = (
    st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=5)
            | st.dictionaries(
                unicode_text | st.sampled_from(["agent", "task_ids"]), inner, max_size=4
            )
        ),
        max_leaves=10,
    )
    | deep
)
PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "agent": st.sampled_from(["echo", "slow", "nope", "ECHO", "echo "]),
    "input": unicode_text | st.sampled_from(["hello", *HUGE]),
    "name": st.sampled_from(["n1", "a/b", "", "x" * 70, "..", "-", "ok.name"]) | unicode_text,
    "timeout_ms": numbers,
    "idempotency_key": st.sampled_from(["k1", "", *HUGE]) | unicode_text,
    "task_ids": st.sampled_from([LIVE, DONE, FOREIGN, [LIVE, DONE], [DONE, DONE], [], [""]])
    | st.lists(st.sampled_from([LIVE, DONE, FOREIGN, "nope", " "]), max_size=70),
    "mode": st.sampled_from(["any", "all", "ALL", "some", ""]),
    "task_id": st.sampled_from([LIVE, DONE, FOREIGN, "nope", " "]),
}


def arguments(tool: str) -> st.SearchStrategy[Any]:
    """Objects whose fields are each plausible, wild or absent, with extra fields."""
    fields = FIELDS[tool]
    field = {f: PLAUSIBLE[f] | json_values for f in fields}
    objects = st.fixed_dictionaries({}, optional=field)
    extra = st.dictionaries(unicode_text | st.sampled_from(HUGE), json_values, max_size=3)
    with_extra = st.builds(lambda a, b: {**b, **a}, objects, extra)
    return st.one_of(objects, objects, with_extra, json_values)


def as_form(value: Any, form: str) -> Any:
    """The same arguments as a host might hand them over."""
    if form == "json":
        try:
            return dumps_str(value)
        except Exception:
            return value
    if form == "bad_json":
        return "{" + str(value)[:200]
    if form == "bytes":
        try:
            return dumps(value)
        except Exception:
            return b"\xff\xfe{"
    if form == "none":
        return None
    if form == "list":
        return [value]
    return value


FORMS = st.sampled_from(["object"] * 6 + ["json", "json", "bad_json", "bytes", "none", "list"])


def substitute(value: Any, ids: dict[str, str], depth: int = 0) -> Any:
    if isinstance(value, str):
        return ids.get(value, value)
    if depth > 3:  # placeholders only matter near the top; deep values pass unchanged
        return value
    if isinstance(value, list):
        return [substitute(v, ids, depth + 1) for v in value]
    if isinstance(value, dict):
        return {k: substitute(v, ids, depth + 1) for k, v in value.items()}
    return value


def check_result(tool: str, result: object) -> ToolResult:
    """The contract of every answer."""
    assert isinstance(result, ToolResult), result
    assert isinstance(result.content, str)
    assert isinstance(result.is_error, bool)
    assert isinstance(result.details, dict)
    limit = 2 * TRUNCATE if tool == "list_agents" else TRUNCATE
    assert len(result.content) <= limit, (tool, len(result.content), result.content[:300])
    dumps(result.to_dict())  # content and details both travel as JSON
    return result


async def _slow(request: Request, ctx: RunContext) -> str:
    await anyio.sleep(0.01)
    return "slow done"


class Session:
    """One manager and toolset living in a portal's event loop for the whole test."""

    def __init__(self, manager: SubagentManager) -> None:
        self.manager = manager
        self.tools: Toolset = build_tools(
            manager, "root", engine_tool_timeout=0.1, wait_timeout=0.05
        )
        self.gate = anyio.Event()
        self.ids: dict[str, str] = {}

    async def setup(self) -> None:
        manager = self.manager
        live = manager.spawn("gate", "hold")
        done = manager.spawn("echo", "x")
        await done.wait()
        other = manager.spawn("echo", "y", session_id="other")
        self.ids = {LIVE: live.task_id, DONE: done.task_id, FOREIGN: other.task_id}

    async def call(self, tool: str, args: Any) -> tuple[ToolResult, str]:
        args = substitute(args, self.ids)
        with anyio.fail_after(5):
            result = await self.tools.call(tool, args)
        # Leave nothing running between examples (a spawned echo or slow child).
        for handle in self.manager.tasks("root"):
            if handle.task_id != self.ids[LIVE] and handle.result is None:
                with anyio.fail_after(5):
                    await handle.wait()
        return result, self.ids[LIVE]


@contextmanager
def fuzz_session(backend: str) -> Iterator[tuple[BlockingPortal, Session]]:
    async def gate_runner(request: Request, ctx: RunContext) -> str:
        await anyio.sleep_forever()
        return "never"

    specs = [
        echo_agent(),
        AgentSpec(name="slow", description="Sleeps 10 ms.", runner=_slow),
        AgentSpec(name="gate", description="Never ends on its own.", runner=gate_runner),
    ]
    config = SubagentConfig(spawn_timeout=0.5, execute_timeout=0.5, max_concurrent_spawns=8)
    with start_blocking_portal(backend) as portal:
        manager = SubagentManager(specs, config=config)
        with portal.wrap_async_context_manager(manager):
            session = Session(manager)
            portal.call(session.setup)
            yield portal, session


SETTINGS = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("tool", list(FIELDS))
def test_every_tool_survives_any_input(tool: str, backend: str) -> None:
    with fuzz_session(backend) as (portal, session):

        @SETTINGS
        @given(args=arguments(tool), form=FORMS)
        def one(args: Any, form: str) -> None:
            result, _ = portal.call(session.call, tool, as_form(args, form))
            check_result(tool, result)

        one()
        stats = session.manager.mailbox("root").statistics()
        assert stats.task_subscribers == 0
        assert stats.all_subscribers == 0


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_unknown_tool_names_and_odd_call_ids(backend: str) -> None:
    with fuzz_session(backend) as (portal, session):

        @settings(max_examples=60, deadline=None, database=None)
        @given(name=json_values, call_id=st.none() | unicode_text)
        def one(name: Any, call_id: str | None) -> None:
            async def call() -> ToolResult:
                return await session.tools.call(name, {}, call_id=call_id)

            result = portal.call(call)
            check_result("?", result)
            if not (isinstance(name, str) and name in FIELDS):
                assert result.is_error
                assert result.details["error"] == "unknown_tool"

        one()


# ---------------------------------------------------------------- found by the fuzzer

NASTY: list[tuple[str, object, str]] = [
    # A lone surrogate in an unknown field's name went into details["field"] verbatim:
    # the answer could not be serialised.
    ("wait_agent", {"\ud800": 1}, "invalid_arguments"),
    ("spawn_agent", {"agent": "echo", "input": "x", "a\udc80b": None}, "invalid_arguments"),
    # A huge unknown agent name or task id was echoed in full: 100,000 characters of
    # content for a model to read. (A task id longer than the schema's maxLength is an
    # invalid argument.)
    ("spawn_agent", {"agent": "x" * 100_000, "input": "a"}, "unknown_agent"),
    ("delegate_to_agent", {"agent": "é" * 100_000, "input": "a"}, "unknown_agent"),
    ("cancel_agent", {"task_id": "x" * 100_000}, "invalid_arguments"),
    ("wait_agent", {"task_ids": "x" * 100_000}, "invalid_arguments"),
    ("wait_agent", {"task_ids": "[" * 100_000}, "invalid_arguments"),
    # Deep nesting as objects and as text.
    ("wait_agent", nested(5000, "list"), "invalid_arguments"),
    ("spawn_agent", {"agent": "echo", "input": nested(5000, "dict")}, "invalid_arguments"),
    ("spawn_agent", '{"agent": ' + "[" * 5000 + "]" * 5000 + "}", "invalid_arguments"),
    # Non-finite and enormous numbers.
    ("wait_agent", {"task_ids": DONE, "timeout_ms": float("nan")}, "invalid_arguments"),
    ("wait_agent", {"task_ids": DONE, "timeout_ms": float("-inf")}, "invalid_arguments"),
    ("spawn_agent", {"agent": "echo", "input": "x", "timeout_ms": -(10**40)}, "invalid_arguments"),
]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_nasty_inputs_get_a_clear_bounded_error(backend: str) -> None:
    with fuzz_session(backend) as (portal, session):
        for tool, args, error in NASTY:
            result, _ = portal.call(session.call, tool, args)
            check_result(tool, result)
            assert result.is_error, (tool, result.content[:200])
            assert result.details["error"] == error, (tool, result.content[:200])


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_enormous_values_that_are_valid_still_work(backend: str) -> None:
    """The fuzzer's valid corner: huge input, huge timeouts are clamped, not errors."""
    with fuzz_session(backend) as (portal, session):
        spawned, _ = portal.call(
            session.call,
            "spawn_agent",
            {"agent": "echo", "input": "x" * 1_000_000, "timeout_ms": 10**40},
        )
        check_result("spawn_agent", spawned)
        assert not spawned.is_error, spawned.content
        task_id = spawned.details["task_id"]
        waited, _ = portal.call(
            session.call, "wait_agent", f'{{"task_ids": ["{task_id}"], "timeout_ms": 1e300}}'
        )
        check_result("wait_agent", waited)
        assert waited.details["completed"] is True
        assert waited.details["clamped"] is True
        delegated, _ = portal.call(
            session.call, "delegate_to_agent", {"agent": "echo", "input": "é" * 200_000}
        )
        check_result("delegate_to_agent", delegated)
        assert not delegated.is_error
