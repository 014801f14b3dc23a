"""RayBackend when Ray goes away under a running child (``ray.shutdown()``, as
when the driver loses its cluster): the child must end in an envelope, and stopping it must
not start a new local cluster. It shuts the suite's shared cluster down, so it runs last
(tests/backends/ray/conftest.py)."""

from __future__ import annotations

import uuid

import anyio
import pytest

ray = pytest.importorskip("ray")

from subagents import AgentSpec, Status, SubagentManager  # noqa: E402
from subagents.backends._ray_bridge import settled  # noqa: E402
from subagents.backends.ray import RayBackend  # noqa: E402
from tests.backends.ray import runners  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.anyio]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_child_running_when_ray_shuts_down_ends_without_a_new_cluster(
    cluster: None,
) -> None:
    try:
        name = f"latch-{uuid.uuid4().hex}"
        latch = ray.remote(runners.Latch).options(name=name, num_cpus=0).remote()
        await settled(latch.ready.remote().future())
        backend = RayBackend(pool_size=1, force_after=0.5)
        spec = AgentSpec(name="hangs", runner=runners.starts_then_hangs)
        envelope = None
        async with SubagentManager([spec], backend=backend) as m:
            handle = m.spawn("hangs", name)
            await settled(latch.wait.remote().future())
            ray.shutdown()
            with anyio.move_on_after(5):  # a hang: Ray may never complete the call's future
                envelope = await handle.wait()
        restarted = ray.is_initialized()  # the stop's ray.cancel/ray.kill auto-init Ray
        assert envelope is not None, "no envelope 5 s after ray.shutdown()"
        assert envelope.status is Status.ERROR
        assert not restarted, "stopping the child started a new local Ray cluster"
    finally:
        ray.shutdown()
