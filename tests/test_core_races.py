"""Races inside the core run loop that a naive implementation gets wrong."""

from __future__ import annotations

import anyio
import pytest

from subagents import AgentSpec, Request, RunContext, SubagentConfig, SubagentManager

pytestmark = pytest.mark.anyio


async def test_cancel_during_cleanup_does_not_turn_a_success_into_cancelled() -> None:
    grandchild_cancelled = anyio.Event()
    release = anyio.Event()

    async def stubborn(request: Request, ctx: RunContext) -> str:
        try:
            await anyio.sleep_forever()
        finally:
            grandchild_cancelled.set()
            with anyio.CancelScope(shield=True):
                await release.wait()
        return "unreachable"  # pragma: no cover

    async def parent(request: Request, ctx: RunContext) -> str:
        child = ctx.spawn("stubborn")
        while child.state != "running":
            await anyio.lowlevel.checkpoint()
        return "parent done"

    specs = [
        AgentSpec(name="stubborn", runner=stubborn),
        AgentSpec(name="parent", runner=parent),
    ]
    async with SubagentManager(specs, config=SubagentConfig(settle_timeout=10)) as manager:
        handle = manager.spawn("parent")
        with anyio.fail_after(5):
            await grandchild_cancelled.wait()
        # The parent's runner has returned; it is waiting for its subtree to settle.
        assert manager.cancel(handle.task_id) is False
        release.set()
        envelope = await handle.wait()
    assert envelope.status == "completed"
    assert envelope.output == "parent done"


async def test_cancel_from_the_started_event_cancels_before_the_runner_runs() -> None:
    ran = False

    async def runner(request: Request, ctx: RunContext) -> str:
        nonlocal ran
        ran = True
        await anyio.lowlevel.checkpoint()
        return "ran"

    async with SubagentManager([AgentSpec(name="a", runner=runner)]) as manager:
        manager.events.subscribe(
            lambda event: manager.cancel(event.task_id) if event.type.endswith("started") else None
        )
        envelope = await manager.spawn("a").wait()
    assert envelope.status == "cancelled"
    assert envelope.queue_ms >= 0


async def test_error_type_names_library_errors_by_their_public_path() -> None:
    async def wrong(request: Request, ctx: RunContext) -> int:
        return 42

    async with SubagentManager([AgentSpec(name="wrong", runner=wrong)]) as manager:  # type: ignore[arg-type]
        envelope = await manager.spawn("wrong").wait()
    assert envelope.error_type == "subagents.RunnerReturnError"
    assert "int" in envelope.error
