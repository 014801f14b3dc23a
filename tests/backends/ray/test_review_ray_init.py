"""Review of RayBackend without a cluster: initialising Ray on first use must not stop the
driver's event loop (ray.init takes seconds; every other child, watchdog and cancel waits)."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import anyio.to_thread
import pytest

ray = pytest.importorskip("ray")

from subagents import AgentSpec, Status, SubagentManager  # noqa: E402
from subagents.backends.ray import RayBackend  # noqa: E402
from tests.backends.ray import runners  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.anyio]


async def test_initialising_ray_on_first_use_leaves_the_event_loop_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entered = threading.Event()
    released = threading.Event()
    seen: list[str] = []

    def init(**kwargs: Any) -> None:
        entered.set()
        # Another task of the driver's loop sets ``released`` while init runs, unless init
        # holds the loop.
        seen.append("loop ran" if released.wait(timeout=5) else "loop blocked")
        raise RuntimeError("no cluster in this test")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    spec = AgentSpec(name="noop", runner=runners.noop)
    async with SubagentManager([spec], backend=RayBackend()) as m:
        handle = m.spawn("noop")
        await anyio.to_thread.run_sync(entered.wait)
        released.set()
        envelope = await handle.wait()
    assert envelope.status is Status.ERROR
    assert seen == ["loop ran"]
