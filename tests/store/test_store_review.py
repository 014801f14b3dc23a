"""A review's findings on the engine over the durable store: forgotten ids, a closing
store's recovery window, id clashes, children cancelled by close, error messages."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from subagents import AgentSpec, Request, RunContext, SubagentConfig, SubagentManager, UnknownTask
from subagents.store import SqliteStore
from tests.store.support import sqlite

pytestmark = pytest.mark.anyio


async def _echo(request: Request, ctx: RunContext) -> str:
    return request.input.upper()


async def _blocker(request: Request, ctx: RunContext) -> str:
    await anyio.sleep_forever()
    return ""


AGENTS = [AgentSpec(name="echo", runner=_echo)]
AGENTS_WITH_BLOCKER = [*AGENTS, AgentSpec(name="blocker", runner=_blocker)]


async def test_a_forgotten_id_is_not_restored_from_its_own_store(tmp_path: Path) -> None:
    config = SubagentConfig(store_path=tmp_path / "s.db")
    async with SubagentManager(AGENTS, config=config) as m:
        h = m.spawn("echo", "x")
        await h.wait()
        assert m.forget(h.task_id) is not None
        await m.store.wait_committed()  # type: ignore[union-attr]
        with pytest.raises(UnknownTask):
            m.result(h.task_id)  # the documented contract of forget


async def test_an_evicted_id_is_not_restored_from_its_own_store(tmp_path: Path) -> None:
    config = SubagentConfig(store_path=tmp_path / "s.db", retain_collected=0)
    async with SubagentManager(AGENTS, config=config) as m:
        h = m.spawn("echo", "x")
        await h.wait()  # collected -> evicted at once
        await m.store.wait_committed()  # type: ignore[union-attr]
        with pytest.raises(UnknownTask):
            m.result(h.task_id)


async def test_forgetting_a_restored_id_consumes_its_unread_envelope(tmp_path: Path) -> None:
    config = SubagentConfig(store_path=tmp_path / "s.db")
    async with SubagentManager(AGENTS, config=config) as m:
        h = m.spawn("echo", "x", session_id="s")
        await h.done.wait()  # unread
    async with SubagentManager(AGENTS, config=config) as m:
        assert m.forget(h.task_id) is not None
        # forget: "If the envelope is still in its session's mailbox it is consumed from
        # there first": the store's mailbox, for a restored record
        assert m.mailbox("s").drain_all() == []


async def test_a_restored_id_forgotten_stays_unknown_now_and_after_a_restart(
    tmp_path: Path,
) -> None:
    config = SubagentConfig(store_path=tmp_path / "s.db")
    async with SubagentManager(AGENTS, config=config) as m:
        h = m.spawn("echo", "x")
        await h.wait()
    async with SubagentManager(AGENTS, config=config) as m:
        m.forget(h.task_id)
        with pytest.raises(UnknownTask):
            m.forget(h.task_id)
    async with SubagentManager(AGENTS, config=config) as m:
        with pytest.raises(UnknownTask):  # the store forgot it too
            m.result(h.task_id)


async def _forever(request: Request, ctx: RunContext) -> str:
    await anyio.sleep_forever()
    raise AssertionError


FOREVER = [AgentSpec(name="forever", runner=_forever)]


async def test_a_closing_store_keeps_its_tasks_from_recovery_until_committed(
    tmp_path: Path,
) -> None:
    """A store's origin stays among the open ones until its writer has committed its queue
    (the cancelled child's put and end): a manager entered meanwhile in the same process
    recovers nothing of it, and the child has exactly one envelope, not ``Interrupted``."""
    path = tmp_path / "s.db"
    config = SubagentConfig(store_path=path)
    a = SubagentManager(FOREVER, config=config)
    ready = anyio.Event()
    ids: list[str] = []

    async def run_a() -> None:
        async with a:
            a.mailbox()  # a reader has opened the session's mailbox
            h = a.spawn("forever", "x")
            await h.journaled()
            await a.store.wait_committed()  # type: ignore[union-attr]
            ids.append(h.task_id)
            a.store._writer.gate.acquire()  # type: ignore[union-attr]  # stall A's writer
            ready.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run_a)
        await ready.wait()
        while a.store._state != "closing":  # type: ignore[union-attr]  # noqa: ASYNC110
            await anyio.sleep(0.01)
        async with SubagentManager(FOREVER, config=config):
            pass  # its recovery runs while A's queue is stalled
        a.store._writer.gate.release()  # type: ignore[union-attr]
    with sqlite(path) as conn:
        ((n,),) = conn.execute(
            "SELECT count(*) FROM envelopes WHERE task_id = ?", (ids[0],)
        ).fetchall()
        ((d,),) = conn.execute(
            "SELECT count(*) FROM deliveries d JOIN envelopes e ON e.id = d.envelope_id "
            "WHERE e.task_id = ?",
            (ids[0],),
        ).fetchall()
        ((body,),) = conn.execute(
            "SELECT body FROM envelopes WHERE task_id = ?", (ids[0],)
        ).fetchall()
    assert (n, d) == (1, 1)
    assert b'"Interrupted"' not in body  # the process is alive; aclose cancelled the child


async def test_a_child_cancelled_by_close_is_delivered_to_its_unopened_mailbox(
    tmp_path: Path,
) -> None:
    config = SubagentConfig(store_path=tmp_path / "s.db")
    async with SubagentManager(FOREVER, config=config) as m:
        h = m.spawn("forever", "x", session_id="s")
        await h.journaled()
    assert h.done.is_set()
    async with SubagentManager(FOREVER, config=config) as m:
        got = m.mailbox("s").drain_all()
        assert [e.task_id for e in got] == [h.task_id]


async def test_a_child_cancelled_by_close_is_delivered_to_its_open_mailbox(tmp_path: Path) -> None:
    config = SubagentConfig(store_path=tmp_path / "s.db")
    async with SubagentManager(FOREVER, config=config) as m:
        m.mailbox("s")
        h = m.spawn("forever", "x", session_id="s")
        await h.journaled()
    async with SubagentManager(FOREVER, config=config) as m:
        got = m.mailbox("s").drain_all()
        assert [e.task_id for e in got] == [h.task_id]


def _ids(*chunks: bytes) -> Callable[[int], bytes]:
    """An ``os.urandom`` that draws ``chunks`` (6 bytes each: task ids) first, then
    ``cc``-bytes ids."""
    draws = itertools.chain(chunks, itertools.repeat(b"\xcc" * 6))
    return lambda n: b"".join(next(draws) for _ in range(n // 6))


async def test_a_task_id_the_store_holds_is_drawn_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """New ids are checked against the store, not only this process's records: an id an
    earlier process used (48 random bits over a store's whole life) is drawn again, so
    the acknowledged spawn has its own row."""
    path = tmp_path / "s.db"
    config = SubagentConfig(store_path=path)
    monkeypatch.setattr("subagents._task_ids.os.urandom", _ids(b"\xaa" * 6))
    async with SubagentManager(AGENTS, config=config) as m:
        first = m.spawn("echo", "first")
        await first.wait()
    monkeypatch.setattr("subagents._task_ids.os.urandom", _ids(b"\xaa" * 6, b"\xbb" * 6))
    async with SubagentManager(AGENTS, config=config) as m:
        second = m.spawn("echo", "second")
        await second.journaled()
        await second.wait()
    assert (first.task_id, second.task_id) == ("aaaaaaaaaaaa", "bbbbbbbbbbbb")
    with sqlite(path) as conn:
        rows = conn.execute("SELECT task_id, request FROM tasks ORDER BY task_id").fetchall()
    assert [task_id for task_id, _ in rows] == ["aaaaaaaaaaaa", "bbbbbbbbbbbb"]
    assert b'"second"' in bytes(rows[1][1])


async def test_spawn_on_a_closed_given_store_raises_closed_resource_error(
    tmp_path: Path,
) -> None:
    """A given store closed under a running manager: spawn raises what its docstring says
    (the store's closed convention, anyio.ClosedResourceError), not a failure."""
    store = SqliteStore(tmp_path / "s.db")
    async with store:
        m = SubagentManager(AGENTS, store=store)
        await m.__aenter__()
    try:
        with pytest.raises(anyio.ClosedResourceError):
            m.spawn("echo", "x")
    finally:
        await m.aclose()


def test_mailbox_factory_with_a_store_names_the_factory(tmp_path: Path) -> None:
    from subagents import ConfigError

    factory = lambda sid: None  # noqa: E731
    store = SqliteStore(tmp_path / "s.db")
    with pytest.raises(ConfigError) as info:
        SubagentManager(AGENTS, store=store, mailbox_factory=factory)
    assert (info.value.field, info.value.got) == ("mailbox_factory", factory)
    assert "SqliteStore" not in str(info.value)


async def test_a_task_id_clashing_with_a_concurrent_row_fails_the_spawn_loudly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process writes a row of the same id between spawn's check and the commit
    (the writer held back meanwhile): the spawn row is a plain INSERT, so journaled()
    raises instead of acknowledging a spawn with no row of its own."""
    from subagents.store import StoreError

    path = tmp_path / "s.db"
    config = SubagentConfig(store_path=path)
    monkeypatch.setattr("subagents._task_ids.os.urandom", _ids(b"\xaa" * 6))
    async with SubagentManager(FOREVER, config=config) as m:
        gate = m.store._writer.gate  # type: ignore[union-attr]
        gate.acquire()  # hold the writer back
        try:
            h = m.spawn("forever", "x")
            with sqlite(path) as conn:
                conn.execute(
                    "INSERT INTO tasks (task_id, session, agent, agent_path, request, state, "
                    "owner, created_ms, updated_ms) VALUES "
                    "(?, 'other', 'forever', '/root/forever', x'7b7d', 'ended', 'x', 0, 0)",
                    (h.task_id,),
                )
        finally:
            gate.release()
        with pytest.raises(StoreError):
            await h.journaled()


async def test_forget_on_a_closed_store_still_forgets_and_returns_the_envelope(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path / "s.db")
    async with store, SubagentManager(AGENTS, store=store) as manager:
        handle = manager.spawn("echo", "x")
        envelope = await handle.wait()
        await store.aclose()  # the store goes away under the running manager
        assert manager.forget(handle.task_id) == envelope  # not the store's error
        assert manager.tasks() == []


async def test_a_child_closed_under_notify_completion_false_is_not_delivered(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    config = SubagentConfig(store_path=path, notify_completion=False)
    async with SubagentManager(AGENTS_WITH_BLOCKER, config=config) as manager:
        manager.spawn("blocker")
        await anyio.wait_all_tasks_blocked()
    async with SqliteStore(path) as store:
        assert store.mailbox("root").drain_all() == []
