"""Adversarial review of the day's runtime changes (retention, slot lending, the inlined
fast paths): each test pins a behaviour one of those changes could have broken."""

from __future__ import annotations

import anyio
import pytest

from subagents import (
    Request,
    RunContext,
    SubagentManager,
    Toolset,
    build_tools,
)
from tests.helpers import manager_with, spec

pytestmark = pytest.mark.anyio


def gated_spec(gate: anyio.Event, name: str = "gated") -> object:
    async def gated(request: Request, ctx: RunContext) -> str:
        await gate.wait()
        return request.input

    return spec(name, gated)


def session_state(manager: SubagentManager, session: str) -> list[str]:
    """Which per-session stores still hold ``session``."""
    stores = {"mailbox": manager._mailboxes, "names": manager._names, "live": manager._live}
    return [name for name, store in stores.items() if session in store]


# ---------------------------------------------------------------- session state (_owns_session)


async def test_a_child_cancelled_in_the_queue_releases_the_mailbox_of_its_session() -> None:
    """A queued child's session mailbox (a host watching it, or ``_delivery_mailbox``) is
    released when the child is cancelled before it ran, as for a child that ran: its
    waiters wake, and no mailbox stays behind for the manager's lifetime."""
    gate = anyio.Event()
    async with manager_with(gated_spec(gate), max_concurrent_spawns=1) as manager:
        with anyio.fail_after(5):
            running = manager.spawn("gated")
            queued = manager.spawn("gated")
            mailbox = manager.mailbox(queued.task_id)
            got: list[object] = []

            async def reader() -> None:
                got.append(await mailbox.wait("nothing-will-land"))

            async with anyio.create_task_group() as tg:
                tg.start_soon(reader)
                await anyio.wait_all_tasks_blocked()
                assert manager.cancel(queued.task_id)
            assert got == [None]  # woken by the drop, not left waiting until aclose
            assert mailbox.closed
            assert session_state(manager, queued.task_id) == []
            gate.set()
            await running.wait()


async def test_the_tools_of_a_forgotten_child_cannot_delegate() -> None:
    """A child's tools (``build_tools(manager, ctx.session_id)``) used after the child has
    ended refuse to spawn or delegate, also once retention forgot its record: its id must
    not read as a fresh root session (a child at ``/root`` with the root's permissions)."""
    kept: list[Toolset] = []

    async def parent(request: Request, ctx: RunContext) -> str:
        kept.append(build_tools(ctx._manager, ctx.session_id))
        return "done"

    async def echo(request: Request, ctx: RunContext) -> str:
        return request.input

    async with manager_with(spec("p", parent), spec("e", echo), retain_collected=0) as manager:
        with anyio.fail_after(5):
            child = manager.spawn("p")
            await manager.wait_result(child.task_id)
            assert child not in manager._tasks.values()  # forgotten
            (tools,) = kept
            for tool in ("spawn_agent", "delegate_to_agent"):
                answer = await tools.call(tool, {"agent": "e", "input": "hi"})
                assert answer.is_error, answer
                assert answer.details["reason"] == "session_closed"
            assert manager.tasks(child.task_id) == []
            assert manager.statistics().spawned == 1
