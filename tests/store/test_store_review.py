"""A review's findings on the engine over the durable store: forgotten ids, a closing
store's recovery window, id clashes, children cancelled by close, error messages."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from subagents import AgentSpec, Request, RunContext, SubagentConfig, SubagentManager, UnknownTask
from subagents.store import SqliteStore
from tests.store.support import sqlite

pytestmark = pytest.mark.anyio


async def _echo(request: Request, ctx: RunContext) -> str:
    return request.input.upper()


AGENTS = [AgentSpec(name="echo", runner=_echo)]


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


def _ids(*chunks: bytes) -> Iterator[bytes]:
    yield from chunks
    while True:
        yield b"\xcc" * 6


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
