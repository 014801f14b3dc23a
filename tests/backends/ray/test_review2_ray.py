"""Second review of RayBackend: envelopes and events that differ from a local run's.
Skipped unless ray is installed; run with ``-m ray``."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import anyio
import pytest

ray = pytest.importorskip("ray")

from subagents import (  # noqa: E402  # after the skip
    AgentSpec,
    RetryPolicy,
    Status,
    SubagentManager,
)
from subagents.backends.ray import RayBackend  # noqa: E402
from tests.backends.ray import review2_runners  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.anyio]

RETRIED = AgentSpec(
    name="retried",
    runner=review2_runners.reports_its_attempt_file_then_fails,
    retry=RetryPolicy(attempts=2, initial=0.01, maximum=0.01, jitter=0.0),
)
INBOX = AgentSpec(name="inbox", runner=review2_runners.reads_its_inbox)


@pytest.fixture(scope="module")
def backend(cluster: None) -> Iterator[RayBackend]:
    made = RayBackend(pool_size=1, force_after=0.5)
    yield made
    made.close()


async def test_a_retried_remote_child_keeps_the_paths_its_earlier_attempts_reported(
    backend: RayBackend,
) -> None:
    """Locally one Progress serves every attempt of a run, so a path reported by a failed
    attempt stays in the envelope; through Ray each attempt's snapshot replaces it."""
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
    ``peers()`` and is sent messages, but its context has no ``inbox``/``recv``/``send``,
    and the docs list no such gap. It should work through the driver, or be refused as
    ``spawn`` is (``SpawnRejected``, reason ``remote``), never an ``AttributeError``."""
    async with SubagentManager([INBOX]) as local:
        expected = await local.execute("inbox", "x")
    assert expected.status is Status.COMPLETED
    with anyio.fail_after(30):  # a hang detector
        async with SubagentManager([INBOX], backend=backend) as remote:
            envelope = await remote.execute("inbox", "x")
    assert envelope.error_type != "AttributeError", envelope.error


def test_the_progress_sink_holds_none_of_the_resources_each_child_needs() -> None:
    """``resources`` is what *each* actor or task needs (README: ``{"agent_slot": 1}``, a
    slot per child). The sink is one more actor that lives as long as the backend; given
    the same custom resources it holds a slot for ever. On a cluster started with
    ``resources={"agent_slot": 1}`` every task-mode child then waits for the slot the sink
    holds: each ends in ``timeout`` (without a watchdog it never ends). It should get the
    workers' ``runtime_env`` (and at most a node-placement hint), no amounts of theirs."""
    backend = RayBackend(mode="task", resources={"agent_slot": 1, "CPU": 1})
    held = backend._sink_options.get("resources", {})
    assert "agent_slot" not in held, f"the sink is created with resources={held!r}"


async def test_a_runner_object_that_compares_by_value_runs_on_ray(backend: RayBackend) -> None:
    """AgentSpec accepts any object whose class's ``__call__`` is async; an attrs class
    or a dataclass with ``eq`` (unhashable) is the usual way to write one with settings.
    It runs locally; RayBackend looks runners up in a dict by the runner itself
    (``ray.py`` ``_target``) and fails with ``TypeError: unhashable type``."""
    spec = AgentSpec(name="greeter", runner=review2_runners.Greeter("hello"))
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
    its own (a closure over its settings). ``_targets`` keeps every runner it has seen,
    and what it closes over, for the backend's life: memory grows with each job."""
    runner = review2_runners.closure_runner("done")
    alive = weakref.ref(runner)
    with anyio.fail_after(30):  # a hang detector
        async with SubagentManager([AgentSpec(name="job", runner=runner)], backend=backend) as m:
            assert (await m.execute("job", "x")).output == "done"
    del runner, m
    gc.collect()
    assert alive() is None, "the backend still holds a runner whose manager has ended"
