"""Review of RayBackend on a real local Ray cluster (one for the module): where a child run
through Ray ends in a different envelope than the same child run locally."""

from __future__ import annotations

import os
import pathlib
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

ray = pytest.importorskip("ray")

from subagents import (  # noqa: E402  # after the skip: ray must exist to import these
    AgentSpec,
    Budget,
    Request,
    RunContext,
    Status,
    SubagentManager,
)
from subagents.backends._ray_bridge import settled  # noqa: E402
from subagents.backends.ray import RayBackend  # noqa: E402
from tests.backends.ray import review_runners, runners  # noqa: E402

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
    spec = AgentSpec(name="files", runner=review_runners.reports_many_files)
    here, there = await both(spec, backend)
    assert here.files_changed[-1] == "[… 501 more paths]"
    assert there.files_changed == here.files_changed


async def test_an_exception_class_defined_in_a_closure_keeps_its_type_across_the_wire(
    backend: RayBackend,
) -> None:
    spec = AgentSpec(name="closure", runner=review_runners.a_runner_raising_a_class_of_its_own())
    here, there = await both(spec, backend)
    assert here.status is Status.ERROR
    assert (there.error_type, there.error) == (here.error_type, here.error)


async def test_a_remote_child_over_its_token_budget_is_stopped_before_its_watchdog(
    backend: RayBackend, latch: tuple[str, Any]
) -> None:
    # Locally a report over budget stops the child at once (README, budgets); through Ray
    # the usage is charged only when the attempt ends, here when the watchdog fires.
    spec = AgentSpec(name="spends", runner=review_runners.spends_then_hangs)
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
    # progress. But a worker's first report looks the sink up by name, and fails.
    started, go = f"started-{uuid.uuid4().hex}", f"go-{uuid.uuid4().hex}"
    latches = [await latch_of(started), await latch_of(go)]
    before = set(ray.util.list_named_actors())
    fresh = RayBackend(mode="task")
    spec = AgentSpec(name="late", runner=review_runners.reports_once_let_go)
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
    spec = AgentSpec(name="gpu", runner=review_runners.reports_then_raises_a_worker_only_error)
    try:
        async with SubagentManager([spec], backend=fresh) as m:
            envelope = await m.execute("gpu", module)
    finally:
        fresh.close()
    assert envelope.status is Status.ERROR
    assert (envelope.error_type, envelope.output) == (f"{module}.GpuError", "before the failure"), (
        envelope.error
    )
