"""The loop's clock that wakes the Ray backend's waiting children (its bridge), without
ray: what it does when its thread cannot be started."""

from __future__ import annotations

import threading

import anyio
import pytest

from subagents.backends import _ray_bridge

pytestmark = pytest.mark.anyio


async def test_a_clock_whose_thread_failed_to_start_starts_one_for_the_next_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A process out of threads refuses one start; the next wait must still get its tick
    # (it is how a child notices that Ray shut down), not wait on a clock marked running
    # that has no thread.
    real_start = threading.Thread.start
    refused: list[threading.Thread] = []
    started: list[threading.Thread] = []

    def start_once_refused(thread: threading.Thread) -> None:
        if thread.name == "subagents-ray-clock":
            if not refused:
                refused.append(thread)
                raise RuntimeError("can't start new thread")
            started.append(thread)
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start_once_refused)
    clock = _ray_bridge._Clock(_ray_bridge._doorbell())  # this test's own, idle
    with pytest.raises(RuntimeError, match="can't start new thread"):
        await _ray_bridge.Waiter(clock).wait()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_ray_bridge.Waiter(clock).wait)
        await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()
    assert started, "a wait with no clock thread to tick it"
