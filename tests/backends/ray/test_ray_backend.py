"""RayBackend on a real local Ray cluster (the suite's shared one): the backend conformance
suite, cancellation and the forced stop, a killed worker, tracing across the wire, and the
remote context. Skipped unless ray (the ``ray`` extra) is installed; run with ``-m ray``."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.to_thread
import pytest

ray = pytest.importorskip("ray")

from subagents import (  # noqa: E402  # after the skip: ray must exist to import these
    AgentSpec,
    Budget,
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

FORCE_AFTER = 0.5
MODES = ["actor", "task"]

AGENTS = [
    AgentSpec(name="hangs", runner=runners.starts_then_hangs),
    AgentSpec(name="blocks", runner=runners.starts_then_blocks),
    AgentSpec(name="noop", runner=runners.noop),
    AgentSpec(name="traced", runner=runners.traced),
    AgentSpec(name="delegates", runner=runners.delegates),
    AgentSpec(name="reads-budget", runner=runners.reads_budget),
    AgentSpec(
        name="reads-context",
        runner=runners.reads_context,
        permissions=Ruleset(allow=("read_*",)),
        timeout=30.0,
    ),
]


@pytest.fixture(scope="module")
def backends(cluster: None) -> Iterator[dict[str, RayBackend]]:
    made = {
        "actor": RayBackend(pool_size=2, force_after=FORCE_AFTER),
        "task": RayBackend(mode="task", force_after=FORCE_AFTER),
    }
    yield made
    for backend in made.values():
        backend.close()


async def started(latch: tuple[str, Any], index: int = 0) -> int:
    """The pid of the worker whose runner set ``latch`` (the ``index``-th time), once it
    has (a runner that never starts fails the test instead of hanging it)."""
    with anyio.fail_after(60):
        pid = await settled(latch[1].wait.remote(index).future())
    assert isinstance(pid, int)
    return pid


def manager(backend: RayBackend, **config: Any) -> SubagentManager:
    return SubagentManager(AGENTS, backend=backend, config=SubagentConfig(**config))


async def cancelled_once_started(
    m: SubagentManager, agent: str, latch: tuple[str, Any], index: int = 0
) -> tuple[DelegateResult, float]:
    """Spawn ``agent``, cancel it once its runner runs on its worker (the ``index``-th
    run on ``latch``): its envelope, and the seconds from the cancel to it."""
    handle = m.spawn(agent, latch[0])
    await started(latch, index)
    start = anyio.current_time()
    assert m.cancel(handle.task_id)
    envelope = await handle.wait()
    return envelope, anyio.current_time() - start


async def cancelled_samples(
    m: SubagentManager, agent: str, latch: tuple[str, Any], samples: int
) -> list[tuple[DelegateResult, float]]:
    """:func:`cancelled_once_started` ``samples`` times, one after the other."""
    return [await cancelled_once_started(m, agent, latch, n) for n in range(samples)]


# ---------------------------------------------------------------------- conformance


async def test_the_conformance_suite_passes_with_actors(backends: dict[str, RayBackend]) -> None:
    await check_backend(backends["actor"], watchdog=1.0)


async def test_the_conformance_suite_passes_with_tasks(backends: dict[str, RayBackend]) -> None:
    await check_backend(backends["task"], watchdog=1.0)


# ---------------------------------------------------------------------- stopping a run


@pytest.mark.parametrize("mode", MODES)
async def test_a_cancelled_async_runner_ends_within_100_ms_keeping_its_progress(
    backends: dict[str, RayBackend], latch: tuple[str, Any], mode: str
) -> None:
    """The issue's 100 ms, as the median of five cancellations (one slow scheduling on a
    loaded CI machine must not fail it), each within a generous second."""
    async with manager(backends[mode]) as m:
        samples = await cancelled_samples(m, "hangs", latch, 5)
    for envelope, _ in samples:
        assert envelope.status is Status.CANCELLED
        assert envelope.output == "partial before the hang"
        assert envelope.iterations == 2
    elapsed = sorted(seconds for _, seconds in samples)
    assert elapsed[2] <= 0.1, f"median {elapsed[2]:.3f} s from the cancel to the envelope"
    assert elapsed[-1] <= 1.0, f"the slowest envelope came {elapsed[-1]:.3f} s after the cancel"


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
    """The issue's ``force_after`` + 100 ms, as the median of three forced stops (each
    starts a new worker, so five would cost the suite seconds), each within a generous
    ``force_after`` + 1 s."""
    async with manager(backends[mode]) as m:
        samples = await cancelled_samples(m, "blocks", latch, 3)
        # the pool replaced a killed actor; a task's worker was replaced by Ray
        after = await m.execute("noop")
    assert after.status is Status.COMPLETED, after.error
    assert all(envelope.status is Status.CANCELLED for envelope, _ in samples)
    elapsed = sorted(seconds for _, seconds in samples)
    assert elapsed[1] <= FORCE_AFTER + 0.1, f"median stop {elapsed[1]:.3f} s after the cancel"
    assert elapsed[-1] <= FORCE_AFTER + 1.0, f"slowest stop {elapsed[-1]:.3f} s after the cancel"


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
async def test_the_remote_context_has_the_budget_left_less_what_the_run_reported(
    backends: dict[str, RayBackend], mode: str
) -> None:
    async with manager(backends[mode]) as m:
        envelope = await m.execute("reads-budget", budget=Budget(tokens=1000, seconds=30))
    assert envelope.status is Status.COMPLETED, envelope.error
    assert envelope.output == "tokens=850 seconds=True"


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


# ---------------------------------------------------------------------- one thread


async def test_a_backend_in_use_by_one_thread_refuses_another_until_its_children_end(
    cluster: None, latch: tuple[str, Any]
) -> None:
    """The pool and the sink change without a lock: a second thread's loop must not
    share them while the first thread's child runs, and may use them once it has ended."""
    backend = RayBackend(pool_size=1)
    running = threading.Event()
    release = threading.Event()
    seen: list[DelegateResult] = []

    async def hold() -> None:
        try:
            async with manager(backend) as m:
                handle = m.spawn("hangs", latch[0])
                await started(latch)
                running.set()
                await anyio.to_thread.run_sync(release.wait, 60)
                m.cancel(handle.task_id)
                seen.append(await handle.wait())
        finally:
            running.set()

    owner = threading.Thread(target=anyio.run, args=(hold,), name="owner")
    owner.start()
    try:
        assert await anyio.to_thread.run_sync(running.wait, 60)
        async with manager(backend) as m:
            refused = await m.spawn("noop").wait()
    finally:
        release.set()
        await anyio.to_thread.run_sync(owner.join, 60)
    async with manager(backend) as m:
        afterwards = await m.spawn("noop").wait()
    backend.close()
    assert [envelope.status for envelope in seen] == [Status.CANCELLED]
    assert refused.status is Status.ERROR
    assert refused.error_type == "RuntimeError"
    assert "thread 'owner'" in refused.error
    assert "needs a RayBackend of its own" in refused.error
    assert afterwards.status is Status.COMPLETED


# ---------------------------------------------------------------------- public names


@pytest.mark.parametrize(
    "name", ["ClusterLostError", "RayBackend", "RemoteContext", "RemoteRunnerError"]
)
def test_the_names_users_meet_live_in_subagents_backends_ray(name: str) -> None:
    import subagents.backends.ray as public

    assert name in public.__all__
    assert getattr(public, name).__module__ == "subagents.backends.ray"


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


def test_the_progress_sink_holds_none_of_the_resources_each_child_needs() -> None:
    """``resources`` is what *each* actor or task needs (README: ``{"agent_slot": 1}``, a
    slot per child). The sink is one more actor that lives as long as the backend; given
    the same custom resources it would hold a slot for ever, and on a cluster started
    with ``resources={"agent_slot": 1}`` every task-mode child would wait for it, ending
    in ``timeout`` (without a watchdog, never). It gets the workers' ``runtime_env`` (and
    at most a node-placement hint), no amounts of theirs."""
    backend = RayBackend(mode="task", resources={"agent_slot": 1, "CPU": 1})
    held = backend._sink_options.get("resources", {})
    assert "agent_slot" not in held, f"the sink is created with resources={held!r}"


# ---------------------------------------------------------------------- starting Ray


async def test_initialising_ray_on_first_use_leaves_the_event_loop_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a cluster, ``ray.init`` on first use takes seconds: it must not stop the
    driver's event loop, where every other child, watchdog and cancel waits."""
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
