"""RayBackend on a real local Ray cluster (one for the module): the backend conformance
suite, cancellation and the forced stop, a killed worker, tracing across the wire, and the
remote context. Skipped unless ray (the ``ray`` extra) is installed; run with ``-m ray``."""

from __future__ import annotations

import os
import pathlib
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest

ray = pytest.importorskip("ray")

from subagents import (  # noqa: E402  # after the skip: ray must exist to import these
    AgentSpec,
    ConfigError,
    DelegateResult,
    Ruleset,
    Status,
    SubagentConfig,
    SubagentManager,
)
from subagents.backends._ray_bridge import settled  # noqa: E402
from subagents.backends.ray import RayBackend  # noqa: E402
from subagents.testing import check_backend  # noqa: E402
from tests.backends.ray import runners  # noqa: E402
from tests.otel_support import Otel  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.anyio]

ROOT = pathlib.Path(__file__).resolve().parents[3]
FORCE_AFTER = 0.5
MODES = ["actor", "task"]

AGENTS = [
    AgentSpec(name="hangs", runner=runners.starts_then_hangs),
    AgentSpec(name="blocks", runner=runners.starts_then_blocks),
    AgentSpec(name="noop", runner=runners.noop),
    AgentSpec(name="traced", runner=runners.traced),
    AgentSpec(name="delegates", runner=runners.delegates),
    AgentSpec(
        name="reads-context",
        runner=runners.reads_context,
        permissions=Ruleset(allow=("read_*",)),
        timeout=30.0,
    ),
]


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """A local cluster whose workers import this checkout (they inherit the driver's
    environment when ``ray.init`` starts them)."""
    with pytest.MonkeyPatch.context() as patch:
        paths = [str(ROOT), os.environ.get("PYTHONPATH", "")]
        patch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            yield
        finally:
            ray.shutdown()


@pytest.fixture(scope="module")
def backends(cluster: None) -> Iterator[dict[str, RayBackend]]:
    made = {
        "actor": RayBackend(pool_size=2, force_after=FORCE_AFTER),
        "task": RayBackend(mode="task", force_after=FORCE_AFTER),
    }
    yield made
    for backend in made.values():
        backend.close()


@pytest.fixture
async def latch(cluster: None) -> AsyncIterator[tuple[str, Any]]:
    """A named actor a runner sets once it runs on its worker (with its pid)."""
    name = f"latch-{uuid.uuid4().hex}"
    actor = ray.remote(runners.Latch).options(name=name, num_cpus=0).remote()
    await settled(actor.ready.remote().future())
    yield name, actor
    ray.kill(actor)


async def started(latch: tuple[str, Any]) -> int:
    """The pid of the worker whose runner set ``latch``, once it has (a runner that never
    starts fails the test instead of hanging it)."""
    with anyio.fail_after(60):
        pid = await settled(latch[1].wait.remote().future())
    assert isinstance(pid, int)
    return pid


def manager(backend: RayBackend, **config: Any) -> SubagentManager:
    return SubagentManager(AGENTS, backend=backend, config=SubagentConfig(**config))


async def cancelled_once_started(
    m: SubagentManager, agent: str, latch: tuple[str, Any]
) -> tuple[DelegateResult, float]:
    """Spawn ``agent``, cancel it once its runner runs on its worker: its envelope, and
    the seconds from the cancel to it."""
    handle = m.spawn(agent, latch[0])
    await started(latch)
    start = anyio.current_time()
    assert m.cancel(handle.task_id)
    envelope = await handle.wait()
    return envelope, anyio.current_time() - start


# ---------------------------------------------------------------------- conformance


async def test_the_conformance_suite_passes_with_actors(backends: dict[str, RayBackend]) -> None:
    await check_backend(backends["actor"], watchdog=1.0)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_conformance_suite_passes_with_tasks(backends: dict[str, RayBackend]) -> None:
    await check_backend(backends["task"], watchdog=1.0)


# ---------------------------------------------------------------------- stopping a run


@pytest.mark.parametrize("mode", MODES)
async def test_a_cancelled_async_runner_ends_within_100_ms_keeping_its_progress(
    backends: dict[str, RayBackend], latch: tuple[str, Any], mode: str
) -> None:
    async with manager(backends[mode]) as m:
        envelope, elapsed = await cancelled_once_started(m, "hangs", latch)
    assert envelope.status is Status.CANCELLED
    assert elapsed <= 0.1, f"the envelope came {elapsed:.3f} s after the cancel"
    assert envelope.output == "partial before the hang"
    assert envelope.iterations == 2


@pytest.mark.parametrize("mode", MODES)
async def test_the_watchdog_ends_a_hung_remote_runner_in_timeout_keeping_its_progress(
    backends: dict[str, RayBackend], latch: tuple[str, Any], mode: str
) -> None:
    async with manager(backends[mode]) as m:
        # A warm worker: the watchdog's second must go to the runner, not to a start.
        assert (await m.execute("noop")).status is Status.COMPLETED
        handle = m.spawn("hangs", latch[0], timeout=1.0)
        await started(latch)
        envelope = await handle.wait()
    assert envelope.status is Status.TIMEOUT
    assert envelope.output == "partial before the hang"


@pytest.mark.parametrize("mode", MODES)
async def test_a_blocking_runner_is_stopped_by_force_after_force_after(
    backends: dict[str, RayBackend], latch: tuple[str, Any], mode: str
) -> None:
    async with manager(backends[mode]) as m:
        envelope, elapsed = await cancelled_once_started(m, "blocks", latch)
        assert envelope.status is Status.CANCELLED
        assert elapsed <= FORCE_AFTER + 0.1, f"stopped {elapsed:.3f} s after the cancel"
        # the pool replaced a killed actor; a task's worker was replaced by Ray
        after = await m.execute("noop")
    assert after.status is Status.COMPLETED, after.error


@pytest.mark.parametrize(
    ("mode", "error_type"),
    [("actor", "ray.exceptions.ActorDiedError"), ("task", "ray.exceptions.WorkerCrashedError")],
)
async def test_a_killed_worker_process_ends_the_child_in_an_error_envelope(
    backends: dict[str, RayBackend], latch: tuple[str, Any], mode: str, error_type: str
) -> None:
    async with manager(backends[mode]) as m:
        handle = m.spawn("hangs", latch[0])
        pid = await started(latch)
        start = anyio.current_time()
        os.kill(pid, signal.SIGKILL)
        envelope = await handle.wait()
        elapsed = anyio.current_time() - start
        assert envelope.status is Status.ERROR
        assert envelope.error_type == error_type, envelope.error
        assert elapsed <= 5.0, f"the error envelope came {elapsed:.1f} s after the kill"
        assert envelope.output == "partial before the hang"
        after = await m.execute("noop")
    assert after.status is Status.COMPLETED, after.error


# ---------------------------------------------------------------------- what crosses the wire


async def test_spans_from_a_remote_child_join_the_parents_trace(
    backends: dict[str, RayBackend],
) -> None:
    otel = Otel()
    try:
        config = {"tracer_provider": otel.tracer_provider}
        async with manager(backends["actor"], **config) as m:
            envelope = await m.execute("traced")
        assert envelope.status is Status.COMPLETED, envelope.error
        trace_id, parent_id, task_id = envelope.output.split()
        [span] = [s for s in otel.finished() if s.name == "invoke_agent traced"]
        assert span.context is not None
        assert trace_id == f"{span.context.trace_id:032x}"
        assert parent_id == f"{span.context.span_id:016x}"
        assert task_id == envelope.task_id  # the baggage crossed too
    finally:
        otel.shutdown()


async def test_the_remote_context_carries_identity_attempt_deadline_and_permissions(
    backends: dict[str, RayBackend],
) -> None:
    async with manager(backends["actor"]) as m:
        envelope = await m.execute("reads-context")
    assert envelope.output == (
        f"task={envelope.task_id} path=/root/reads-context attempt=1 remaining=True "
        "read=True write=False"
    )


@pytest.mark.parametrize("mode", MODES)
async def test_a_remote_runner_that_delegates_is_refused_with_spawn_rejected(
    backends: dict[str, RayBackend], mode: str
) -> None:
    async with manager(backends[mode]) as m:
        envelope = await m.execute("delegates")
    assert envelope.status is Status.ERROR
    assert envelope.error_type == "subagents.SpawnRejected"
    assert "from a runner on a Ray worker" in envelope.error


# ---------------------------------------------------------------------- the example


async def test_the_readmes_ray_example_runs_each_child_on_a_worker(
    cluster: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from examples import ray_cluster

    await ray_cluster.main()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" (worker")[0] for line in lines] == [
        f"completed summary of chapter {n}" for n in (1, 2, 3)
    ]
    assert all(f"pid {os.getpid()})" not in line for line in lines)  # not run here


# ---------------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"mode": "threads"}, "mode"),
        ({"pool_size": 0}, "pool_size"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"force_after": -1.0}, "force_after"),
        ({"address": 42}, "address"),
        ({"runtime_env": ["pip"]}, "runtime_env"),
        ({"resources": {"CPU": -1}}, "resources['CPU']"),
        ({"resources": [("CPU", 1)]}, "resources"),
    ],
)
def test_a_bad_argument_is_a_config_error_naming_it(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        RayBackend(**kwargs)
    assert info.value.field == field
