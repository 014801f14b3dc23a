"""Starting the command's process on the pidfd path: what a cancellation waiting for the
start still gets."""

from __future__ import annotations

import threading

import anyio
import anyio.to_thread
import pytest

from subagents.backends import _spawn
from subagents.backends.command import CommandRunner

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not _spawn.AVAILABLE, reason="no pidfds on this platform"),
]


async def test_a_run_cancelled_while_the_default_thread_limiter_is_full_returns_at_once() -> None:
    # A runner's blocking work in anyio.to_thread (as AgentSpec's docs advise) can hold
    # every token of the default limiter; a command's watchdog must still end its run.
    limiter = anyio.to_thread.current_default_thread_limiter()
    release = threading.Event()
    returned = anyio.Event()
    scope = anyio.CancelScope()
    runner = CommandRunner(["true"])

    async def run() -> None:
        with scope:
            await runner.run(runner.argv({}), b"")
        returned.set()

    async with anyio.create_task_group() as tg:
        try:
            for _ in range(int(limiter.total_tokens)):
                tg.start_soon(anyio.to_thread.run_sync, release.wait)
            await anyio.wait_all_tasks_blocked()
            assert limiter.available_tokens == 0
            tg.start_soon(run)
            await anyio.wait_all_tasks_blocked()
            scope.cancel()
            with anyio.move_on_after(1):  # bounds the failure only: the pass is immediate
                await returned.wait()
            assert returned.is_set(), "the cancelled run waited for another task's thread"
        finally:
            release.set()
