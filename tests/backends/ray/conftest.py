"""One local Ray cluster for the whole ray suite: a start costs seconds and ~0.6 GB, so
every module shares it. The test that shuts Ray down runs last."""

from __future__ import annotations

import os
import pathlib
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
LAST = "test_ray_shutdown.py"
"""The module whose test shuts the shared cluster down."""


@pytest.fixture(scope="session")
def cluster() -> Iterator[None]:
    """A local cluster whose workers import this checkout (they inherit the driver's
    environment when ``ray.init`` starts them)."""
    ray = pytest.importorskip("ray")
    with pytest.MonkeyPatch.context() as patch:
        paths = [str(ROOT), os.environ.get("PYTHONPATH", "")]
        patch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            yield
        finally:
            ray.shutdown()


@pytest.fixture
async def latch(cluster: None) -> AsyncIterator[tuple[str, Any]]:
    """A named actor a runner sets once it runs on its worker (with its pid)."""
    ray = pytest.importorskip("ray")
    from subagents.backends._ray_bridge import settled
    from tests.backends.ray import runners

    name = f"latch-{uuid.uuid4().hex}"
    actor = ray.remote(runners.Latch).options(name=name, num_cpus=0).remote()
    await settled(actor.ready.remote().future())
    yield name, actor
    ray.kill(actor)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name == LAST)  # stable: the rest keep their order
