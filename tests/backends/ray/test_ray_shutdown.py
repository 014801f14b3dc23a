"""RayBackend when Ray goes away under a running child (``ray.shutdown()``, as
when the driver loses its cluster): the child must end in an envelope, and stopping it must
not start a new local cluster. It shuts the suite's shared cluster down, so it runs last
(tests/backends/ray/conftest.py)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import anyio
import pytest

ray = pytest.importorskip("ray")

from subagents import (  # noqa: E402
    AgentSpec,
    DelegateResult,
    RetryPolicy,
    SpawnHandle,
    Status,
    SubagentManager,
)
from subagents._thread_owner import ThreadOwner  # noqa: E402
from subagents.backends import _ray_channel  # noqa: E402
from subagents.backends._ray_bridge import settled  # noqa: E402
from subagents.backends.ray import ClusterLostError, RayBackend  # noqa: E402
from tests.backends.ray import runners  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.anyio]


def _latch() -> tuple[str, Any]:
    name = f"latch-{uuid.uuid4().hex}"
    return name, ray.remote(runners.Latch).options(name=name, num_cpus=0).remote()


def _up() -> None:
    """The suite's cluster, again (a test before shut it down). A test that starts Ray
    again itself leaves that cluster up for the next: each start costs seconds."""
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)


HANGS = AgentSpec(name="hangs", runner=runners.starts_then_hangs)
NOOP = AgentSpec(name="noop", runner=runners.noop)


@contextlib.asynccontextmanager
async def _ray_down_under_a_hung_child(
    specs: Sequence[AgentSpec] = (HANGS,),
) -> AsyncIterator[tuple[SubagentManager, SpawnHandle, RayBackend]]:
    """A manager of ``specs`` on a new backend (one actor) whose ``hangs`` child has
    started, then Ray shut down under it, without yielding to the loop."""
    _up()
    name, latch = _latch()
    await settled(latch.ready.remote().future())
    backend = RayBackend(pool_size=1, force_after=0.5)
    async with SubagentManager(specs, backend=backend) as m:
        handle = m.spawn("hangs", name)
        await settled(latch.wait.remote().future())
        ray.shutdown()
        yield m, handle, backend


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_child_running_when_ray_shuts_down_ends_without_a_new_cluster(
    cluster: None,
) -> None:
    try:
        envelope = None
        async with _ray_down_under_a_hung_child() as (_, handle, _):
            with anyio.move_on_after(5):  # a hang: Ray may never complete the call's future
                envelope = await handle.wait()
        restarted = ray.is_initialized()  # the stop's ray.cancel/ray.kill auto-init Ray
        assert envelope is not None, "no envelope 5 s after ray.shutdown()"
        assert envelope.status is Status.ERROR
        assert not restarted, "stopping the child started a new local Ray cluster"
    finally:
        ray.shutdown()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_answer_that_reaches_the_driver_after_ray_shut_down_starts_no_new_cluster(
    cluster: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child's end, answered by the actor just before ``ray.shutdown()`` and handed to the
    loop just after, while another child still runs on the actor."""
    _up()  # the test above shut the suite's cluster down
    try:
        awaited: list[Future[Any]] = []  # what the channels wait on, in order
        original = _ray_channel.when_done

        def recording(future: Future[Any], call: Any, into: Any) -> None:
            awaited.append(future)
            original(future, call, into)

        monkeypatch.setattr(_ray_channel, "when_done", recording)
        (hung, hung_latch), (started, started_latch), (go, go_latch) = (_latch() for _ in "abc")
        for latch in (hung_latch, started_latch, go_latch):
            await settled(latch.ready.remote().future())
        specs = [
            AgentSpec(name="hangs", runner=runners.starts_then_hangs),
            AgentSpec(name="let_go", runner=runners.reports_once_let_go),
        ]
        backend = RayBackend(pool_size=1, force_after=0.5)
        async with SubagentManager(specs, backend=backend) as m:
            hangs = m.spawn("hangs", hung)
            await settled(hung_latch.wait.remote().future())
            m.spawn("let_go", f"{started} {go}")
            await settled(started_latch.wait.remote().future())
            collecting = awaited[0]  # the first submit, which collects while "hangs" runs
            assert not collecting.done()
            # Without yielding to the loop: the actor answers that "let_go" ended, and Ray
            # shuts down before the loop takes the answer.
            go_latch.set.remote("go")
            collecting.result(timeout=30)
            ray.shutdown()
            with anyio.move_on_after(5):
                await hangs.wait()
        restarted = ray.is_initialized()
        assert not restarted, "the channel's next collect started a new local Ray cluster"
    finally:
        ray.shutdown()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_child_running_when_ray_restarts_ends_in_cluster_lost_instead_of_waiting_forever(
    cluster: None,
) -> None:
    """``ray.shutdown()`` then ``ray.init()`` before the driver's next look at Ray (a program
    reconnecting): the child's call belongs to the cluster that went, whose futures Ray never
    completes, and "Ray is initialised" no longer says that its cluster is up."""
    envelope = await _restarted_under_a_hung_child(lambda backend: None)
    _assert_cluster_lost(envelope, "no envelope 5 s after Ray restarted under the child")


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_backend_whose_child_was_stopped_while_ray_was_down_runs_children_once_it_is_back(
    cluster: None,
) -> None:
    """A child cancelled before the driver's next look at Ray: its stop makes no Ray call,
    and the backend must not keep the actors (and the sink) of the cluster that went."""
    try:
        async with _ray_down_under_a_hung_child([HANGS, NOOP]) as (m, handle, _):
            assert m.cancel(handle.task_id)
            with anyio.fail_after(5):
                stopped = await handle.wait()
            assert stopped.status is Status.CANCELLED
            _up()
            with anyio.fail_after(60):
                after = await m.execute("noop")
        assert after.status is Status.COMPLETED, f"{after.error_type}: {after.error}"
    finally:
        ray.shutdown()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_child_retried_after_ray_shut_down_starts_no_new_cluster(cluster: None) -> None:
    """An agent that retries ``ClusterLostError``: the retry must fail as the first attempt
    did, not make an actor through Ray's auto-init (a new local cluster, whatever
    ``address`` the backend was given)."""
    try:
        policy = RetryPolicy(attempts=2, initial=0.0, jitter=0.0, retry_on=(ClusterLostError,))
        spec = AgentSpec(name="hangs", runner=runners.starts_then_hangs, retry=policy)
        envelope = None
        async with _ray_down_under_a_hung_child([spec]) as (_, handle, _):
            with anyio.move_on_after(10):
                envelope = await handle.wait()
            restarted = ray.is_initialized()
        assert not restarted, "the retry started a new local Ray cluster"
        assert envelope is not None
        assert envelope.status is Status.ERROR
    finally:
        ray.shutdown()


async def _restarted_under_a_hung_child(
    meanwhile: Callable[[RayBackend], None],
) -> DelegateResult | None:
    """A hung child of a new backend, Ray shut down and started again under it, then
    ``meanwhile(backend)``, all without yielding to the loop: the child's envelope, or
    ``None`` if none came within 5 s. Ray is left up, on the new cluster."""
    envelope = None
    async with _ray_down_under_a_hung_child() as (_, handle, backend):
        _up()
        meanwhile(backend)
        with anyio.move_on_after(5):
            envelope = await handle.wait()
    return envelope


def _assert_cluster_lost(envelope: DelegateResult | None, missing: str) -> None:
    assert envelope is not None, missing
    assert envelope.status is Status.ERROR
    assert (envelope.error_type or "").endswith("ClusterLostError"), envelope.error


def _noop_in_another_loop(backend: RayBackend) -> DelegateResult:
    """A ``noop`` child of ``backend`` run to its end in an event loop of another thread,
    while this one waits (blocked: its own children get no turn meanwhile). That loop
    stands in for a second child of this one, the race made certain; a backend refuses a
    thread while another's children run on it, so the hung child's use is set aside
    first (it ends on the owner it began with)."""
    backend._owner = ThreadOwner("RayBackend")

    async def run() -> DelegateResult:
        async with SubagentManager([NOOP], backend=backend) as m:
            with anyio.fail_after(60):
                return await m.execute("noop")

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(anyio.run, run).result()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_child_of_the_cluster_that_went_ends_though_another_started_on_the_new_one(
    cluster: None,
) -> None:
    """Ray shut down and started again, and another child of the backend (of another event
    loop here; of the same one it is a race) starts on the new cluster before the running
    child's next look at Ray: the backend now belongs to the new cluster, but the running
    child's call belongs to the one that went, whose futures Ray never completes."""

    def another_child(backend: RayBackend) -> None:
        other = _noop_in_another_loop(backend)
        assert other.status is Status.COMPLETED, f"{other.error_type}: {other.error}"

    envelope = await _restarted_under_a_hung_child(another_child)
    _assert_cluster_lost(envelope, "the child of the cluster that went waits for ever")


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_child_spawned_after_ray_shut_down_starts_no_new_local_cluster(
    cluster: None,
) -> None:
    """The program initialised Ray itself (its own cluster; here the suite's), so the
    backend has no address; once Ray has shut down, a new child must not ``ray.init()`` a
    new local cluster (the children would run on this machine, not on the cluster the
    program chose, as a retry's auto-init would have): it ends in ``ClusterLostError``."""
    _up()
    try:
        backend = RayBackend(pool_size=1, force_after=0.5)
        after = None
        async with SubagentManager([NOOP], backend=backend) as m:
            with anyio.fail_after(60):
                first = await m.execute("noop")
            assert first.status is Status.COMPLETED, f"{first.error_type}: {first.error}"
            ray.shutdown()
            with anyio.move_on_after(60):
                after = await m.execute("noop")
            restarted = ray.is_initialized()
        assert not restarted, "a child spawned after ray.shutdown() started a local cluster"
        assert after is not None
        assert after.status is Status.ERROR
        assert (after.error_type or "").endswith("ClusterLostError"), after.error
    finally:
        ray.shutdown()
