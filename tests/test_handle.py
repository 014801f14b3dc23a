"""SpawnHandle: a read-only view of a child's record, with no public constructor."""

from __future__ import annotations

import pytest

from subagents import Request, RunContext, SpawnHandle
from tests.helpers import echo, manager_with, spec

pytestmark = pytest.mark.anyio


def test_the_class_has_no_public_constructor() -> None:
    with pytest.raises(TypeError, match="no public constructor"):
        SpawnHandle()


async def test_a_handle_reads_the_child_and_cannot_be_written() -> None:
    async with manager_with(spec("general", echo)) as manager:
        handle = manager.spawn("general", "hello", name="greeter")
        assert (handle.agent, handle.state, handle.sync) == ("general", "queued", False)
        assert handle.agent_path == "/root/greeter"
        assert handle.request.input == "hello"
        with pytest.raises(AttributeError):
            handle.state = "done"  # type: ignore[misc]
        with pytest.raises(AttributeError):
            handle.task_id = "x"  # type: ignore[misc]
        envelope = await handle.wait()
        assert handle.state == "done"
        assert handle.result is envelope
        assert handle.collected


async def test_one_child_has_one_handle() -> None:
    async with manager_with(spec("general", echo)) as manager:
        handle = manager.spawn("general")
        assert manager.handle(handle.task_id) is handle
        assert manager.tasks() == [handle]
        await handle.wait()


async def test_cancel_called_is_true_from_the_request_on() -> None:
    async def waits(request: Request, ctx: RunContext) -> str:
        await ctx.mailbox.wait("never", timeout=None)
        return ""

    async with manager_with(spec("slow", waits)) as manager:
        handle = manager.spawn("slow")
        assert not handle.cancel_called
        assert handle.cancel()
        assert handle.cancel_called
        assert (await handle.wait()).status == "cancelled"
        assert not handle.cancel()  # ended: nothing to ask
