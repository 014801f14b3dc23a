"""The remote context's budget on a real local Ray cluster (the suite's shared one): what
its seconds count from. Run with ``-m ray``."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

ray = pytest.importorskip("ray")

from subagents import AgentSpec, Budget, Status, SubagentManager  # noqa: E402
from subagents.backends._ray_bridge import settled  # noqa: E402
from subagents.backends.ray import RayBackend  # noqa: E402
from tests.backends.ray import runners  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.anyio]

QUEUED = 1.0
"""Seconds the second call waits behind the first for the actor's only slot."""


async def test_a_queued_calls_budget_seconds_count_down_from_the_call(
    latch: tuple[str, Any],
) -> None:
    # The driver starts the child's seconds budget when it makes the call; a call that
    # then waits for a slot on the cluster has spent that wait, as a local child has
    # spent the time since it started.
    backend = RayBackend(pool_size=1, max_concurrency=1, force_after=0.5)
    agents = [
        AgentSpec(name="hangs", runner=runners.starts_then_hangs),
        AgentSpec(name="seconds-left", runner=runners.returns_seconds_left),
    ]
    try:
        async with SubagentManager(agents, backend=backend) as m:
            first = m.spawn("hangs", latch[0])
            await settled(latch[1].wait.remote(0).future())
            queued = m.spawn("seconds-left", budget=Budget(seconds=30))
            await anyio.sleep(QUEUED)  # time passing, not a hand-off: the call waits
            assert m.cancel(first.task_id)
            envelope = await queued.wait()
    finally:
        backend.close()
    assert envelope.status is Status.COMPLETED, envelope.error
    left = float(envelope.output)
    assert left <= 30 - QUEUED, f"{left:.3f} s left after waiting {QUEUED} s in the queue"
