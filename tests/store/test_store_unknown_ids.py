"""An unknown id on a store: the store's ids probably meant (a prefix, a typo past the
start), "possibly from another store, or already forgotten" for a well-formed id neither
memory nor the store holds, what was looked in (the store's file), and the tools' answers
as data. Real store files; a restart is a second manager on the same file."""

from __future__ import annotations

from pathlib import Path

import pytest

from subagents import AgentSpec, Request, RunContext, SubagentConfig, SubagentManager, UnknownTask
from subagents.store import SqliteStore
from subagents.store._journal import _NEAR, _NEAR_ABOVE, _NEAR_BELOW
from subagents.tools import build_tools
from tests.store.support import query_plan, spawn_entry, sqlite

pytestmark = pytest.mark.anyio

FORGOTTEN = "possibly from another store, or already forgotten"


async def _echo(request: Request, ctx: RunContext) -> str:
    return request.input.upper()


AGENTS = [AgentSpec(name="echo", runner=_echo)]


async def _earlier_run(config: SubagentConfig, n: int = 3, session: str = "root") -> list[str]:
    """An earlier process: ``n`` children ended (unread); their ids."""
    async with SubagentManager(AGENTS, config=config) as m:
        handles = [m.spawn("echo", str(i), session_id=session) for i in range(n)]
        for handle in handles:
            await handle.done.wait()
    return [handle.task_id for handle in handles]


def _typo(task_id: str, at: int) -> str:
    return task_id[:at] + ("0" if task_id[at] != "0" else "1") + task_id[at + 1 :]


@pytest.mark.parametrize(
    ("meant", "why"),
    [
        (lambda t: t[:6], "a prefix"),
        (lambda t: t[:-1], "a truncation"),
        (lambda t: t + "a0", "an extension"),
        (lambda t: _typo(t, 11), "a typo at the end"),
        (lambda t: _typo(t, 5), "a typo in the middle"),
        (lambda t: t.upper(), "another case"),
    ],
)
async def test_the_stored_id_meant_is_suggested_after_a_restart(
    tmp_path: Path, meant: object, why: str
) -> None:
    config = SubagentConfig(store_path=tmp_path / "s.db")
    first, second, third = await _earlier_run(config)
    # An id of digits only is its own upper case (one id in about 280): one that differs.
    task_id = next(t for t in (second, first, third) if meant(t) != t)  # type: ignore[operator]
    async with SubagentManager(AGENTS, config=config) as m:
        asked = meant(task_id)  # type: ignore[operator]
        with pytest.raises(UnknownTask) as info:
            m.handle(asked)
        assert info.value.suggestions[0] == task_id, why
        assert f"did you mean {task_id!r}" in str(info.value)
        # The suggestion answers: the stored task is restored by it.
        assert m.result(info.value.suggestions[0]) is not None


async def test_a_well_formed_id_the_store_does_not_hold_may_be_another_stores_or_forgotten(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    config = SubagentConfig(store_path=path)
    await _earlier_run(config)
    async with SubagentManager(AGENTS, config=config) as m:
        with pytest.raises(UnknownTask) as info:
            m.result("0123456789ab")
        message = str(info.value)
        assert FORGOTTEN in message
        assert f"in this process's memory or in the store {path}: it is" in message
        # Not well-formed: only what was looked in, no guess about where it came from.
        with pytest.raises(UnknownTask) as info:
            m.result("no-such-task")
        assert f"in this process's memory or in the store {path}." in str(info.value)
        assert FORGOTTEN not in str(info.value)


async def test_a_task_still_running_in_another_process_is_not_ended_yet(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    entry = spawn_entry("a1b2c3d4e5f6")
    async with SqliteStore(path) as other:  # open: its owner is alive
        journal = other.journal()
        await journal.wait_journaled(journal.spawned(entry))
        journal.started(entry.task_id)
        await other.wait_committed()
        async with SubagentManager(AGENTS, config=SubagentConfig(store_path=path)) as m:
            with pytest.raises(UnknownTask) as info:
                m.handle(entry.task_id)
            assert f"The store {path} holds it running, not ended" in str(info.value)
            assert "known here once it has ended" in str(info.value)


async def test_an_id_of_another_manager_on_the_same_store_object_is_not_suggested(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    async with SqliteStore(path) as store:
        async with SubagentManager(AGENTS, store=store) as first:
            handle = first.spawn("echo", "x")
            await handle.wait()
        async with SubagentManager(AGENTS, store=store) as second:
            with pytest.raises(UnknownTask) as info:
                second.handle(handle.task_id[:8])
            assert info.value.suggestions == ()  # it could not be restored here
            with pytest.raises(UnknownTask) as info:
                second.handle(handle.task_id)
            assert "by another manager: only that manager knows it" in str(info.value)


async def test_an_unknown_id_after_the_store_closed_is_still_unknown_task(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    config = SubagentConfig(store_path=path)
    async with SubagentManager(AGENTS, config=config) as m:
        handle = m.spawn("echo", "x")
        await handle.wait()
    assert m.result(handle.task_id) is not None  # its own record still answers
    with pytest.raises(UnknownTask) as info:  # not the closed store's error
        m.result("0123456789ab")
    assert f"the store {path} could not be read" in str(info.value)


async def test_suggestions_from_the_store_read_a_bounded_range_of_rows(tmp_path: Path) -> None:
    """Thousands of stored ids share the first characters of the one asked for: the store
    reads a few on either side of it, and the one meant is among them."""
    path = tmp_path / "s.db"
    config = SubagentConfig(store_path=path)
    meant = (await _earlier_run(config, n=1))[0]
    with sqlite(path) as conn:
        conn.executemany(
            "INSERT INTO envelopes (id, session, task_id, body, created_ms) "
            "VALUES (?, 'root', ?, x'7b7d', 0)",
            [(100 + i, f"{meant[:3]}{i:09x}") for i in range(5_000)],
        )
        conn.executemany(
            "INSERT INTO tasks (task_id, session, agent, agent_path, request, state, owner, "
            "envelope_id, created_ms, updated_ms) "
            "VALUES (?, 'root', 'echo', '/root/x', x'7b7d', 'ended', 'gone', ?, 0, 0)",
            [(f"{meant[:3]}{i:09x}", 100 + i) for i in range(5_000)],
        )
    async with SqliteStore(path) as store:
        near = store.journal().near(meant[:-1])
        assert meant in near
        assert len(near) <= 2 * _NEAR
    async with SubagentManager(AGENTS, config=config) as m:
        with pytest.raises(UnknownTask) as info:
            m.handle(meant[:-1])
        assert info.value.suggestions[0] == meant


def test_the_stores_suggestions_are_range_reads_of_the_primary_key(tmp_path: Path) -> None:
    for statement in (_NEAR_ABOVE, _NEAR_BELOW):
        assert query_plan(tmp_path / "s.db", statement, ("a", "b", 8)) == [
            "SEARCH tasks USING INDEX sqlite_autoindex_tasks_1 (task_id>? AND task_id<?)"
        ]


# ---------------------------------------------------------------- the tools


async def test_wait_agent_answers_an_unknown_id_with_the_stores_suggestions_as_data(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    config = SubagentConfig(store_path=path)
    task_id = (await _earlier_run(config))[0]
    async with SubagentManager(AGENTS, config=config) as m:
        tools = build_tools(m, "root")
        answer = await tools.call("wait_agent", {"task_ids": [task_id[:7]], "timeout_ms": 0})
        assert answer.is_error
        assert answer.details["error"] == "unknown_task"
        assert answer.details["suggestions"] == [task_id]
        assert f"did you mean {task_id!r}" in answer.content
        answer = await tools.call("wait_agent", {"task_ids": ["0123456789ab"], "timeout_ms": 0})
        assert answer.is_error
        assert FORGOTTEN in answer.content
        assert str(path) in answer.content
        collected = await tools.call("wait_agent", {"task_ids": [task_id], "timeout_ms": 0})
        assert not collected.is_error
        results = collected.details["results"]
        assert isinstance(results, list)
        assert results[0]["output"] == "0"  # type: ignore[index,call-overload]


async def test_list_agents_with_nothing_to_show_says_what_it_looked_in(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    config = SubagentConfig(store_path=path)
    await _earlier_run(config)
    async with SubagentManager(AGENTS, config=config) as m:
        answer = await build_tools(m, "root").call("list_agents", {})
        assert not answer.is_error
        assert answer.details["tasks"] == []
        assert answer.details["looked_in"] == ["memory", str(path)]
        assert "your subagents: none in this process's memory" in answer.content
        assert f"the store {path}" in answer.content
        m.spawn("echo", "x")
        answer = await build_tools(m, "root").call("list_agents", {})
        assert "your subagents (1):" in answer.content


async def test_list_agents_without_a_store_looked_in_memory_only() -> None:
    async with SubagentManager(AGENTS) as m:
        answer = await build_tools(m, "root").call("list_agents", {})
        assert answer.details["looked_in"] == ["memory"]
        assert "your subagents: none" in answer.content
