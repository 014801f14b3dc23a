"""Children that reach an actor together share its Ray calls (the channel), and each still
ends on its own: its own reply, its own cancel, and an error for each when the actor dies.
Skipped unless ray is installed; run with ``-m ray``."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import anyio
import pytest

pytest.importorskip("ray")

from subagents import AgentSpec, Status, SubagentConfig, SubagentManager
from subagents.backends._ray_bridge import settled
from subagents.backends.ray import RayBackend
from tests.backends.ray import runners

pytestmark = [pytest.mark.ray, pytest.mark.anyio]

AGENTS = [
    AgentSpec(name="echoes", runner=runners.echoes),
    AgentSpec(name="hangs", runner=runners.starts_then_hangs),
    AgentSpec(name="noop", runner=runners.noop),
]


@pytest.fixture(scope="module")
def backend(cluster: None) -> Iterator[RayBackend]:
    """One actor, so every child of a test shares its channel."""
    made = RayBackend(pool_size=1, force_after=0.5)
    yield made
    made.close()


def manager(backend: RayBackend) -> SubagentManager:
    return SubagentManager(
        AGENTS, backend=backend, config=SubagentConfig(max_concurrent_spawns=100)
    )


async def all_started(latch: tuple[str, Any], n: int) -> list[int]:
    """The worker pids of the first ``n`` runs that set ``latch``, once all have."""
    with anyio.fail_after(60):
        return [await settled(latch[1].wait.remote(i).future()) for i in range(n)]


async def test_children_spawned_together_each_get_their_own_reply(backend: RayBackend) -> None:
    async with manager(backend) as m:
        handles = [m.spawn("echoes", f"item-{i}") for i in range(300)]
        envelopes = [await handle.wait() for handle in handles]
    assert [envelope.output for envelope in envelopes] == [f"echo item-{i}" for i in range(300)]
    assert {envelope.status for envelope in envelopes} == {Status.COMPLETED}


async def test_one_child_cancelled_among_many_running_ends_alone_in_cancelled(
    backend: RayBackend, latch: tuple[str, Any]
) -> None:
    async with manager(backend) as m:
        handles = [m.spawn("hangs", latch[0]) for _ in range(20)]
        await all_started(latch, 20)
        start = anyio.current_time()
        assert m.cancel(handles[7].task_id)
        envelope = await handles[7].wait()
        elapsed = anyio.current_time() - start
        assert envelope.status is Status.CANCELLED
        assert envelope.output == "partial before the hang"
        assert elapsed <= 1.0, f"the cancelled child's envelope came {elapsed:.3f} s after"
        assert not any(handle.done.is_set() for i, handle in enumerate(handles) if i != 7)
        assert (await m.execute("echoes", "still served")).output == "echo still served"
    assert all(handle.result.status is Status.CANCELLED for handle in handles)


async def test_a_killed_actor_ends_every_child_it_ran_in_an_error_envelope(
    backend: RayBackend, latch: tuple[str, Any]
) -> None:
    async with manager(backend) as m:
        handles = [m.spawn("hangs", latch[0]) for _ in range(10)]
        pids = await all_started(latch, 10)
        assert len(set(pids)) == 1, "one actor ran them all"
        start = anyio.current_time()
        os.kill(pids[0], signal.SIGKILL)
        envelopes = [await handle.wait() for handle in handles]
        elapsed = anyio.current_time() - start
        assert elapsed <= 5.0, f"the last error envelope came {elapsed:.1f} s after the kill"
        after = await m.execute("noop")
    assert {envelope.status for envelope in envelopes} == {Status.ERROR}
    assert {envelope.error_type for envelope in envelopes} == {"ray.exceptions.ActorDiedError"}
    assert {envelope.output for envelope in envelopes} == {"partial before the hang"}
    assert after.status is Status.COMPLETED, after.error


class _FakeActor:
    """An actor handle whose ``serve`` call the test ends."""

    def __init__(self) -> None:
        self.serving: Future[None] = Future()
        self.serve = self

    def remote(self) -> _FakeActor:
        return self

    def future(self) -> Future[None]:
        return self.serving


class _FakeWorker:
    def __init__(self) -> None:
        self.made: list[_FakeActor] = []

    def options(self, **options: object) -> _FakeWorker:
        return self

    def remote(self, max_concurrency: int) -> _FakeActor:
        self.made.append(_FakeActor())
        return self.made[-1]


def test_an_actor_that_stops_serving_leaves_the_pool_killed_and_the_next_call_gets_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Its serve call holds the task group of its runs: once it has ended the actor takes
    # no more, whether it died or not.
    from subagents.backends import ray as ray_backend

    worker, killed = _FakeWorker(), []
    monkeypatch.setattr(ray_backend, "_Worker", worker)
    monkeypatch.setattr(ray_backend, "_cluster", lambda: ("node", "job"))
    monkeypatch.setattr(ray_backend.ray, "kill", lambda actor, **_: killed.append(actor))
    backend = RayBackend(pool_size=1)
    backend._joined = ("node", "job")  # as its first child's _ready() leaves it
    first = backend._slot()
    assert backend._slot() is first
    first.actor.serving.set_exception(RuntimeError("serve ended"))
    second = backend._slot()
    assert second is not first
    assert killed == [first.actor]
    assert worker.made == [first.actor, second.actor]


INTERRUPTING = [
    AgentSpec(name="hangs", runner=runners.starts_then_hangs),
    AgentSpec(name="interrupts", runner=runners.raises_keyboard_interrupt),
    AgentSpec(name="exits", runner=runners.raises_system_exit),
    AgentSpec(name="noop", runner=runners.noop),
]


# The actor's loop is Ray's, whatever the driver runs on.
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("how", ["interrupt", "exit"])
async def test_an_interrupt_on_an_actor_keeps_what_the_run_reported(
    cluster: None, how: str
) -> None:
    """An interrupt on an actor ends its run alone, as its reply's error: what the run
    reported before it reaches the envelope with that reply, every time (the progress
    sink's copy could reach the driver only after the driver had looked)."""
    fresh = RayBackend(pool_size=1)
    spec = AgentSpec(name="interrupts", runner=runners.reports_then_interrupts)
    try:
        async with SubagentManager([spec], backend=fresh) as m:
            with anyio.fail_after(30):
                ended = await m.execute("interrupts", how)
    finally:
        fresh.close()
    assert ended.status is Status.ERROR
    assert (ended.output, ended.iterations) == ("before the interrupt", 2), ended


# The actor's loop is Ray's, whatever the driver runs on.
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("agent", ["interrupts", "exits"])
async def test_a_runner_raising_an_interrupt_on_an_actor_strands_no_child_of_it(
    cluster: None, latch: tuple[str, Any], agent: str
) -> None:
    """A pool actor's runs are tasks of an event loop Ray runs in a thread of its own; a
    ``KeyboardInterrupt`` or ``SystemExit`` let out of a run's task stops that loop (which
    is why Ray's ``exit_actor()`` raises neither in an async actor), and the actor, alive,
    answers nothing again: not the run that raised it, not the others on it, and its
    ``serve`` never ends, so it stays in the pool and takes the next children too."""
    fresh = RayBackend(pool_size=1, force_after=0.5)
    try:
        async with SubagentManager(INTERRUPTING, backend=fresh) as m:
            hangs = m.spawn("hangs", latch[0])
            await all_started(latch, 1)
            raised = after = None
            with anyio.move_on_after(20):
                raised = await m.execute(agent)
            assert raised is not None, f"the child whose runner raised ({agent}) never ended"
            assert raised.status is Status.ERROR
            with anyio.move_on_after(20):
                after = await m.execute("noop")
            assert after is not None, "the next child went to the actor that stopped answering"
            assert after.status is Status.COMPLETED, f"{after.error_type}: {after.error}"
            assert m.cancel(hangs.task_id)
    finally:
        fresh.close()
