"""Collection marks and the retention policy: ``SpawnHandle.collected`` is set however the
envelope is consumed, ``SubagentConfig.retain_collected`` forgets collected records (and only
collected ones), ``SubagentManager.forget`` removes one on request."""

from __future__ import annotations

import logging

import anyio
import pytest

from subagents import DelegateResult, Mailbox, Request, RunContext, Status, SubagentManager
from tests.helpers import echo, manager_with, spec

pytestmark = pytest.mark.anyio


async def spawn_ended(manager: SubagentManager, n: int, session_id: str = "root") -> list[str]:
    """Spawn ``n`` echo children into ``session_id`` and wait until each has ended."""
    handles = [manager.spawn("echo", f"job {i}", session_id=session_id) for i in range(n)]
    for handle in handles:
        await handle.wait()
    return [h.task_id for h in handles]


# ---------------------------------------------------------------- collected, however consumed


async def test_mailbox_drain_marks_collected() -> None:
    async with manager_with(spec("echo", echo)) as manager:
        a, b = await spawn_ended(manager, 2)
        mailbox = manager.mailbox()
        assert mailbox.peek(a) is not None
        assert not manager.handle(a).collected  # peek never consumes
        assert mailbox.drain(a) is not None
        assert manager.handle(a).collected
        assert not manager.handle(b).collected


async def test_mailbox_drain_all_marks_collected() -> None:
    async with manager_with(spec("echo", echo)) as manager:
        ids = await spawn_ended(manager, 3)
        assert len(manager.mailbox().drain_all()) == 3
        assert all(manager.handle(i).collected for i in ids)


async def test_mailbox_wait_marks_collected() -> None:
    gate = anyio.Event()

    async def gated(request: Request, ctx: RunContext) -> str:
        await gate.wait()
        return "late"

    async with manager_with(spec("gated", gated)) as manager:
        handle = manager.spawn("gated")
        async with anyio.create_task_group() as tg:
            got: list[DelegateResult | None] = []

            async def waiter() -> None:
                got.append(await manager.mailbox().wait(handle.task_id))

            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            assert not handle.collected
            gate.set()
        assert got == [handle.result]
        assert handle.collected


async def test_factory_mailbox_gets_the_hook_and_ttl_expiry_does_not_collect() -> None:
    now = [0.0]
    built: list[Mailbox] = []

    def factory(session_id: str) -> Mailbox:
        built.append(Mailbox(capacity=8, ttl=1.0, clock=lambda: now[0]))
        return built[-1]

    manager = SubagentManager([spec("echo", echo)], mailbox_factory=factory)
    async with manager:
        a, b = await spawn_ended(manager, 2)
        assert built[0].consumed is not None
        now[0] = 5.0  # both entries expire unread
        assert built[0].drain(a) is None
        assert built[0].drain_all() == []
        assert not manager.handle(a).collected
        assert not manager.handle(b).collected


async def test_a_raising_hook_never_loses_the_envelope(caplog: pytest.LogCaptureFixture) -> None:
    box = Mailbox()
    seen: list[str] = []

    def hook(envelope: DelegateResult) -> None:
        seen.append(envelope.task_id)
        raise RuntimeError("boom")

    box.consumed = hook
    for key in ("a", "b", "c"):
        box.put(key, DelegateResult(agent="w", task_id=key, status=Status.COMPLETED))
    with caplog.at_level(logging.ERROR, logger="subagents.mailbox"):
        first = box.drain("a")
        rest = box.drain_all()
    assert first is not None
    assert first.task_id == "a"
    assert [e.task_id for e in rest] == ["b", "c"]
    assert seen == ["a", "b", "c"]
    assert "consumed hook" in caplog.text
