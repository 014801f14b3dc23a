"""Every timeout entry point goes through one validator: the same values are refused the
same way (a ConfigError naming the field, which is a ValueError), never an OverflowError."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from subagents import (
    AgentSpec,
    ConfigError,
    Mailbox,
    Request,
    RetryPolicy,
    RunContext,
    SpawnOptions,
    SubagentConfig,
    SubagentsError,
    UnknownTask,
)
from subagents.tools import build_tools
from tests.helpers import echo, manager_with, spec

pytestmark = pytest.mark.anyio

Entry = Callable[[Any], Awaitable[object]]


async def _spawn(value: Any) -> object:
    async with manager_with(spec("echo", echo)) as manager:
        return manager.spawn("echo", timeout=value)


async def _execute(value: Any) -> object:
    async with manager_with(spec("echo", echo)) as manager:
        return await manager.execute("echo", timeout=value)


async def _wait_result(value: Any) -> object:
    async with manager_with(spec("echo", echo)) as manager:
        handle = manager.spawn("echo")
        return await manager.wait_result(handle.task_id, timeout=value)


def _in_child(call: Callable[[RunContext, Any], Awaitable[object]]) -> Entry:
    """An entry point called by a running child; what it raised is raised to the test."""

    async def entry(value: Any) -> object:
        raised: list[BaseException] = []

        async def parent(request: Request, ctx: RunContext) -> str:
            try:
                await call(ctx, value)
            except Exception as exc:
                raised.append(exc)
            return "done"

        async with manager_with(spec("echo", echo), spec("parent", parent)) as manager:
            await manager.execute("parent")
        if raised:
            raise raised[0]
        return None

    return entry


async def _ctx_spawn(ctx: RunContext, value: Any) -> object:
    return ctx.spawn("echo", timeout=value)


async def _ctx_execute(ctx: RunContext, value: Any) -> object:
    return await ctx.execute("echo", timeout=value)


async def _ctx_wait(ctx: RunContext, value: Any) -> object:
    return await ctx.wait(ctx.spawn("echo").task_id, timeout=value)


async def _mailbox_wait(value: Any) -> object:
    return await Mailbox().wait("missing", timeout=value)


def _sync(make: Callable[[Any], object]) -> Entry:
    async def entry(value: Any) -> object:
        return make(value)

    return entry


async def _tools(keyword: str, value: Any) -> object:
    async with manager_with(spec("echo", echo)) as manager:
        if keyword == "tool_timeouts":
            return build_tools(manager, "root", tool_timeouts={"wait_agent": value})
        return build_tools(manager, "root", **{keyword: value})


def _tool(keyword: str) -> Entry:
    async def entry(value: Any) -> object:
        return await _tools(keyword, value)

    return entry


# name: (entry point, the field its error names, whether 0 is a valid value)
ENTRY_POINTS: dict[str, tuple[Entry, str, bool]] = {
    "spawn": (_spawn, "timeout", False),
    "execute": (_execute, "timeout", False),
    "wait_result": (_wait_result, "timeout", True),
    "ctx.spawn": (_in_child(_ctx_spawn), "timeout", False),
    "ctx.execute": (_in_child(_ctx_execute), "timeout", False),
    "ctx.wait": (_in_child(_ctx_wait), "timeout", True),
    "Mailbox.wait": (_mailbox_wait, "timeout", True),
    "Mailbox(ttl)": (_sync(lambda v: Mailbox(ttl=v)), "ttl", False),
    "SpawnOptions": (_sync(lambda v: SpawnOptions(timeout=v)), "timeout", False),
    "AgentSpec": (_sync(lambda v: AgentSpec(name="a", runner=echo, timeout=v)), "timeout", False),
    **{
        f"SubagentConfig.{field}": (
            _sync(lambda v, field=field: SubagentConfig(**{field: v})),
            field,
            False,
        )
        for field in ("spawn_timeout", "execute_timeout", "mailbox_ttl", "settle_timeout")
    },
    "build_tools(engine_tool_timeout)": (
        _tool("engine_tool_timeout"),
        "engine_tool_timeout",
        False,
    ),
    "build_tools(wait_timeout)": (_tool("wait_timeout"), "wait_timeout", False),
    "build_tools(tool_timeouts)": (
        _tool("tool_timeouts"),
        "tool_timeouts['wait_agent']",
        False,
    ),
    **{
        f"RetryPolicy.{field}": (
            _sync(lambda v, field=field: RetryPolicy(**{field: v})),
            field,
            True,
        )
        for field in ("initial", "maximum", "multiplier", "jitter")
    },
}

BAD_VALUES: dict[str, object] = {
    "huge_int": 10**400,  # math.isnan raised OverflowError on it
    "negative": -1,
    "nan": math.nan,
    "inf": math.inf,  # None is the one spelling of "no limit"
    "bool": True,
    "text": "3",
}


@pytest.mark.parametrize("value", list(BAD_VALUES.values()), ids=list(BAD_VALUES))
@pytest.mark.parametrize("entry", list(ENTRY_POINTS), ids=list(ENTRY_POINTS))
async def test_every_timeout_entry_point_refuses_a_bad_value_naming_its_field(
    entry: str, value: object
) -> None:
    call, field, _ = ENTRY_POINTS[entry]
    with pytest.raises(ConfigError) as raised, anyio.fail_after(5):
        await call(value)
    assert isinstance(raised.value, ValueError)
    assert raised.value.field == field
    assert str(raised.value).startswith(f"{field} must be a finite number")
    assert len(str(raised.value)) < 200  # 10**400 is not spelled out in full


@pytest.mark.parametrize("entry", list(ENTRY_POINTS), ids=list(ENTRY_POINTS))
async def test_every_timeout_entry_point_takes_a_good_value_and_zero_where_documented(
    entry: str,
) -> None:
    call, field, zero_ok = ENTRY_POINTS[entry]
    await call(0.5 if "wait_timeout" in entry else 60 if "build_tools" in entry else 2.5)
    if zero_ok:
        await call(0)
    else:
        with pytest.raises(ConfigError, match=field.replace("[", r"\[")):
            await call(0)


async def test_a_value_whose_repr_fails_still_gives_a_config_error() -> None:
    class Hostile(float):
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    with pytest.raises(ConfigError, match="unprintable Hostile"):
        SpawnOptions(timeout=Hostile(-1.0))


# --- a setting given twice ------------------------------------------------------------


async def _both_in_child(manager: Any, how: str, **kw: Any) -> BaseException:
    raised: list[BaseException] = []

    async def parent(request: Request, ctx: RunContext) -> str:
        try:
            if how == "ctx.spawn":
                ctx.spawn("echo", **kw)
            else:
                await ctx.execute("echo", **kw)
        except Exception as exc:
            raised.append(exc)
        return "done"

    manager.register(spec(f"parent-{how}", parent))
    await manager.execute(f"parent-{how}")
    (error,) = raised
    return error


@pytest.mark.parametrize("how", ["spawn", "execute", "ctx.spawn", "ctx.execute"])
@pytest.mark.parametrize(
    ("field", "kw"),
    [
        ("timeout", {"timeout": 5.0, "options": SpawnOptions(timeout=3.0)}),
        ("timeout", {"timeout": None, "options": SpawnOptions(timeout=3.0)}),
        ("timeout", {"timeout": 3.0, "options": SpawnOptions(timeout=3.0)}),
        ("name", {"name": "a", "options": SpawnOptions(name="b")}),
    ],
)
async def test_a_setting_given_as_argument_and_in_options_is_refused(
    how: str, field: str, kw: dict[str, Any]
) -> None:
    """Before, the argument silently won over the option."""
    async with manager_with(spec("echo", echo)) as manager:
        if how == "spawn":
            with pytest.raises(ConfigError) as raised:
                manager.spawn("echo", **kw)
            error: BaseException = raised.value
        elif how == "execute":
            with pytest.raises(ConfigError) as raised:
                await manager.execute("echo", **kw)
            error = raised.value
        else:
            error = await _both_in_child(manager, how, **kw)
        assert manager.statistics().spawned == (0 if how in ("spawn", "execute") else 1)
    assert isinstance(error, ConfigError)
    assert error.field == field
    assert f"options.{field}" in str(error)
    assert "not both" in str(error)


async def test_options_that_are_not_spawn_options_are_refused() -> None:
    async with manager_with(spec("echo", echo)) as manager:
        with pytest.raises(ConfigError, match="options"):
            manager.spawn("echo", options={"timeout": 3})  # type: ignore[arg-type]


async def test_bad_spawn_arguments_are_clear_errors() -> None:
    async with manager_with(spec("echo", echo)) as m:
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
