"""An unknown task id gets the ids probably meant, at a bounded cost per call."""

from __future__ import annotations

import os

import pytest

from subagents import UnknownTask
from subagents._lookup import MAX_CANDIDATES, IdIndex
from subagents.tools import build_tools
from tests.helpers import echo, manager_with, spec


def _index(ids: list[str]) -> IdIndex:
    index = IdIndex()
    for task_id in ids:
        index.add(task_id)
    return index


def _similar(index: IdIndex, known: set[str], needle: str) -> list[str]:
    return index.similar(needle, known.__contains__, lambda _: False)


@pytest.mark.parametrize(
    ("needle", "why"),
    [
        ("3f9a2c", "a truncated id"),
        ("3f9a2c71b0d4ee", "an id with characters added"),
        ("3F9A2C71B0D4", "another case"),
        (" 3f9a2c71b0d4 ", "spaces around it"),
        ("3f9a2c71b0d5", "a typo at the end"),
        ("4f9a2c71b0d4", "a typo at the start"),
        ("3f9a2d71b0d4", "a typo in the middle"),
    ],
)
def test_the_id_meant_is_suggested(needle: str, why: str) -> None:
    ids = ["3f9a2c71b0d4", *(os.urandom(6).hex() for _ in range(5000))]
    assert _similar(_index(ids), set(ids), needle)[0] == "3f9a2c71b0d4", why


def test_ids_of_the_callers_session_come_first() -> None:
    ids = ["abc123456789", "abc123456780"]
    index = _index(ids)
    ranked = index.similar("abc12345678", set(ids).__contains__, lambda c: c.endswith("0"))
    assert ranked[0] == "abc123456780"


def test_a_forgotten_id_is_no_longer_suggested() -> None:
    index = _index(["abc123456789"])
    index.discard("abc123456789")
    assert _similar(index, set(), "abc1234") == []


def test_suggesting_looks_at_a_bounded_number_of_ids_whatever_the_records() -> None:
    """Every id shares one index bucket: the pool still compared stays bounded."""
    ids = [f"abc{i:09x}" for i in range(100_000)]
    index = _index(ids)
    looked_at = 0

    def prefer(candidate: str) -> bool:
        nonlocal looked_at
        looked_at += 1
        return False

    assert len(index.similar("abcffffffffz", set(ids).__contains__, prefer)) <= 3
    assert looked_at <= 2 * MAX_CANDIDATES


def test_too_short_an_id_suggests_nothing() -> None:
    index = _index(["abc123456789"])
    assert _similar(index, {"abc123456789"}, "ab") == []


@pytest.mark.anyio
async def test_wait_agent_with_many_made_up_ids_among_many_records_names_each() -> None:
    async with manager_with(spec("echo", echo), max_concurrent_spawns=64) as manager:
        handles = [manager.spawn("echo", str(i)) for i in range(5_000)]
        for handle in handles:
            await handle.done.wait()
        tools = build_tools(manager, "root")
        made_up = [f"zz{i:010x}" for i in range(64)]
        answer = await tools.call("wait_agent", {"task_ids": made_up, "timeout_ms": 0})
        assert answer.is_error
        assert answer.details["error"] == "unknown_task"
        assert answer.details["task_ids"] == made_up
        meant = handles[1234].task_id
        with pytest.raises(UnknownTask) as info:
            manager.handle(meant[:8], session_id="root")
        assert meant in str(info.value)


@pytest.mark.anyio
async def test_wait_result_and_result_of_an_unknown_id_raise_naming_it() -> None:
    async with manager_with(spec("echo", echo)) as m:
        h = m.spawn("echo", "x")
        await h.wait()
        assert m.result(h.task_id) is not None
        with pytest.raises(UnknownTask) as info:
            await m.wait_result("no-such-task", timeout=0.01)
        assert "no-such-task" in str(info.value)
        with pytest.raises(UnknownTask):
            m.result("no-such-task")


@pytest.mark.anyio
async def test_wait_result_of_another_sessions_task_names_that_session() -> None:
    async with manager_with(spec("echo", echo)) as m:
        h = m.spawn("echo", "x", session_id="s2")
        await h.wait()
        with pytest.raises(UnknownTask, match="s2"):
            await m.wait_result(h.task_id, session_id="root")


@pytest.mark.anyio
async def test_an_unknown_id_lists_the_sessions_unfinished_tasks_only() -> None:
    async with manager_with(spec("echo", echo)) as manager:
        for handle in [manager.spawn("echo", str(i)) for i in range(20)]:
            await handle.done.wait()
        with pytest.raises(UnknownTask) as info:
            manager.handle("nonexistent-id", session_id="root")
        assert "no unfinished tasks" in str(info.value)


def test_an_id_matching_two_ways_is_named_once() -> None:
    index = _index(["1067edbe08a5"])
    assert _similar(index, {"1067edbe08a5"}, "1067edbe") == ["1067edbe08a5"]


def test_an_id_far_longer_than_any_is_not_compared() -> None:
    index = _index(["abc123456789"])
    assert _similar(index, {"abc123456789"}, "abc" + "x" * 1_000_000) == []
