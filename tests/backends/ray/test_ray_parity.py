"""RayBackend on the suite's shared local Ray cluster, against a local run: a child run
through Ray ends in the envelope the same child ends in locally (paths past the cap,
exception types, budgets, runners from a test module or compared by value, retried
attempts' paths, an inbox read), also when it reports after its backend closed; and a
long-lived backend keeps no runner alive past its manager. Run with ``-m ray``."""

from __future__ import annotations

import gc
import os
import pathlib
import uuid
import weakref
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

ray = pytest.importorskip("ray")

from subagents import (  # noqa: E402  # after the skip: ray must exist to import these
    AgentSpec,
    Budget,
    Request,
    RetryPolicy,
    RunContext,
    Status,
    SubagentManager,
)
from subagents.backends._ray_bridge import settled  # noqa: E402
from subagents.backends.ray import RayBackend  # noqa: E402
from tests.backends.ray import runners  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.anyio]

ROOT = pathlib.Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def backend(cluster: None) -> Iterator[RayBackend]:
    made = RayBackend(pool_size=1, force_after=0.5)
    yield made
    made.close()


async def defined_in_a_test_module(request: Request, ctx: RunContext) -> str:
    return "ran"


async def both(spec: AgentSpec, backend: RayBackend, **spawn: Any) -> tuple[Any, Any]:
    """The envelope of ``spec`` run locally, and run through ``backend``."""
    async with SubagentManager([spec]) as local:
        here = await local.execute(spec.name, **spawn)
    async with SubagentManager([spec], backend=backend) as remote:
        there = await remote.execute(spec.name, **spawn)
    return here, there


async def test_files_dropped_past_the_cap_are_counted_as_in_a_local_envelope(
    backend: RayBackend,
) -> None:
    spec = AgentSpec(name="files", runner=runners.reports_many_files)
    here, there = await both(spec, backend)
    assert here.files_changed[-1] == "[… 501 more paths]"
    assert there.files_changed == here.files_changed


async def test_an_exception_class_defined_in_a_closure_keeps_its_type_across_the_wire(
    backend: RayBackend,
) -> None:
    spec = AgentSpec(name="closure", runner=runners.a_runner_raising_a_class_of_its_own())
    here, there = await both(spec, backend)
    assert here.status is Status.ERROR
    assert (there.error_type, there.error) == (here.error_type, here.error)


async def test_a_remote_child_over_its_token_budget_is_stopped_before_its_watchdog(
    backend: RayBackend, latch: tuple[str, Any]
) -> None:
    # Locally a report over budget stops the child at once (README, budgets); through Ray
    # too, not only when the attempt ends (here when the watchdog would fire).
    spec = AgentSpec(name="spends", runner=runners.spends_then_hangs)
    async with SubagentManager([spec], backend=backend) as m:
        handle = m.spawn("spends", latch[0], budget=Budget(tokens=10), timeout=5.0)
        await runners_started(latch)
        envelope = await handle.wait()
    assert (envelope.status, envelope.error_type) == (Status.ERROR, "BudgetExceeded")
    assert envelope.duration_ms < 4000, f"stopped after {envelope.duration_ms} ms, by the watchdog"


async def runners_started(latch: tuple[str, Any]) -> None:
    with anyio.fail_after(60):
        await settled(latch[1].wait.remote().future())


async def test_a_runner_defined_in_a_pytest_test_module_runs_on_a_worker(
    backend: RayBackend,
) -> None:
    # pytest imports this file as a top-level module from a sys.path entry of its own,
    # which the driver has and Ray's workers do not.
    spec = AgentSpec(name="here", runner=defined_in_a_test_module)
    here, there = await both(spec, backend)
    assert here.output == "ran"
    assert (there.status, there.output) == (Status.COMPLETED, "ran"), there.error


async def latch_of(name: str) -> Any:
    actor = ray.remote(runners.Latch).options(name=name, num_cpus=0).remote()
    await settled(actor.ready.remote().future())
    return actor


async def gone(actor: Any) -> None:
    """Once calls to ``actor`` fail because it died (each try is a real call, no sleep)."""
    with anyio.fail_after(30):
        while True:
            try:
                await settled(actor.take.remote("nothing").future())
            except ray.exceptions.RayActorError:
                return


async def test_a_run_that_reports_after_its_backend_closed_still_completes(
    cluster: None,
) -> None:
    # The design note: with the progress sink gone, the envelope only lacks salvaged
    # progress; a worker's first report, which looks the sink up by name, must not fail
    # the run.
    started, go = f"started-{uuid.uuid4().hex}", f"go-{uuid.uuid4().hex}"
    latches = [await latch_of(started), await latch_of(go)]
    before = set(ray.util.list_named_actors())
    fresh = RayBackend(mode="task")
    spec = AgentSpec(name="late", runner=runners.reports_once_let_go)
    try:
        async with SubagentManager([spec], backend=fresh) as m:
            handle = m.spawn("late", f"{started} {go}")
            await settled(latches[0].wait.remote().future())
            [sink_name] = set(ray.util.list_named_actors()) - before
            sink = ray.get_actor(sink_name)
            fresh.close()
            await gone(sink)
            latches[1].set.remote(None)
            envelope = await handle.wait()
        assert envelope.status is Status.COMPLETED, envelope.error
        assert envelope.output == "done"
    finally:
        fresh.close()
        for latch in latches:
            ray.kill(latch)


async def test_an_error_of_a_module_only_the_workers_have_keeps_its_type_and_progress(
    cluster: None, tmp_path: pathlib.Path
) -> None:
    module = f"workeronly_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text("class GpuError(Exception):\n    pass\n")
    paths = os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])
    fresh = RayBackend(mode="task", runtime_env={"env_vars": {"PYTHONPATH": paths}})
    spec = AgentSpec(name="gpu", runner=runners.reports_then_raises_a_worker_only_error)
    try:
        async with SubagentManager([spec], backend=fresh) as m:
            envelope = await m.execute("gpu", module)
    finally:
        fresh.close()
    assert envelope.status is Status.ERROR
    assert (envelope.error_type, envelope.output) == (f"{module}.GpuError", "before the failure"), (
        envelope.error
    )


RETRIED = AgentSpec(
    name="retried",
    runner=runners.reports_its_attempt_file_then_fails,
    retry=RetryPolicy(attempts=2, initial=0.01, maximum=0.01, jitter=0.0),
)


INBOX = AgentSpec(name="inbox", runner=runners.reads_its_inbox)


async def test_a_retried_remote_child_keeps_the_paths_its_earlier_attempts_reported(
    backend: RayBackend,
) -> None:
    """Locally one Progress serves every attempt of a run, so a path reported by a failed
    attempt stays in the envelope; through Ray an attempt's snapshot must not replace the
    earlier ones'."""
    async with SubagentManager([RETRIED]) as local:
        expected = await local.execute("retried", "x")
    assert expected.files_changed == ("attempt1.py", "attempt2.py")
    with anyio.fail_after(30):  # a hang detector: the run takes well under a second
        async with SubagentManager([RETRIED], backend=backend) as remote:
            envelope = await remote.execute("retried", "x")
    assert envelope.status is expected.status is Status.ERROR
    assert envelope.files_changed == expected.files_changed


async def test_a_remote_runner_that_reads_its_inbox_gets_an_answer_not_an_attribute_error(
    backend: RayBackend,
) -> None:
    """Peer messaging keeps each run's inbox on the driver; a remote child shows in
    ``peers()`` and is sent messages, so its ``inbox`` works through the driver or is
    refused as ``spawn`` is (``SpawnRejected``, reason ``remote``), never an
    ``AttributeError``."""
    async with SubagentManager([INBOX]) as local:
        expected = await local.execute("inbox", "x")
    assert expected.status is Status.COMPLETED
    with anyio.fail_after(30):  # a hang detector
        async with SubagentManager([INBOX], backend=backend) as remote:
            envelope = await remote.execute("inbox", "x")
    assert envelope.error_type != "AttributeError", envelope.error


async def test_a_runner_object_that_compares_by_value_runs_on_ray(backend: RayBackend) -> None:
    """AgentSpec accepts any object whose class's ``__call__`` is async; an attrs class
    or a dataclass with ``eq`` (unhashable) is the usual way to write one with settings.
    It runs locally, and through Ray too: a lookup of runners in a dict keyed by the
    runner itself would fail with ``TypeError: unhashable type``."""
    spec = AgentSpec(name="greeter", runner=runners.Greeter("hello"))
    async with SubagentManager([spec]) as local:
        assert (await local.execute("greeter", "ray")).output == "hello, ray"
    with anyio.fail_after(30):  # a hang detector
        async with SubagentManager([spec], backend=backend) as remote:
            envelope = await remote.execute("greeter", "ray")
    assert envelope.status is Status.COMPLETED, envelope.error
    assert envelope.output == "hello, ray"


async def test_the_backend_keeps_no_runner_alive_after_its_manager_is_gone(
    backend: RayBackend,
) -> None:
    """A long-lived backend serves managers and specs made per job, each with a runner of
    its own (a closure over its settings). Keeping every runner it has seen, and what
    it closes over, for the backend's life would grow its memory with each job."""
    runner = runners.closure_runner("done")
    alive = weakref.ref(runner)
    with anyio.fail_after(30):  # a hang detector
        async with SubagentManager([AgentSpec(name="job", runner=runner)], backend=backend) as m:
            assert (await m.execute("job", "x")).output == "done"
    del runner, m
    gc.collect()
    assert alive() is None, "the backend still holds a runner whose manager has ended"


async def test_a_runner_raising_a_base_exception_of_its_own_keeps_its_progress_as_locally(
    backend: RayBackend,
) -> None:
    """Locally a runner's own ``BaseException`` (not an interrupt) is its error, and what
    it reported stays in the envelope; on an actor its run now ends alone, but the driver
    must still salvage the progress the run left in the sink (the run made no reply)."""
    spec = AgentSpec(name="aborts", runner=runners.reports_then_aborts)
    here, there = await both(spec, backend)
    assert here.status is Status.ERROR
    assert (here.output, here.iterations) == ("before the abort", 3)
    assert (there.status, there.error_type) == (here.status, here.error_type), there.error
    assert (there.output, there.iterations) == (here.output, here.iterations)


async def test_a_backend_dropped_without_close_is_freed_while_the_event_loop_runs_on(
    cluster: None,
) -> None:
    """A program that makes a backend per job and drops it (no ``close()``) must not keep
    it for the event loop's life: its channels, kept per loop, must not hold it, nor so its
    pool's actor handles (Ray ends an actor, and frees what it holds of the cluster, once no
    handle to it is left)."""
    made = RayBackend(pool_size=1)
    freed = weakref.ref(made)
    spec = AgentSpec(name="noop", runner=runners.noop)
    with anyio.fail_after(60):  # a hang detector
        async with SubagentManager([spec], backend=made) as m:
            assert (await m.execute("noop")).status is Status.COMPLETED
    del made, m
    gc.collect()
    assert freed() is None, "the event loop's channels keep a dropped backend and its actors"
