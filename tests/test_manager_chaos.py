"""Randomised runs mixing every way a child can end; the invariants must always hold."""

from __future__ import annotations

import random
from collections import Counter

import anyio
import pytest

from subagents import (
    DelegateResult,
    Event,
    Mailbox,
    Request,
    Result,
    RunContext,
    SpawnHandle,
    SpawnRejected,
    Status,
    SubagentConfig,
    SubagentManager,
)
from tests.helpers import spec


class CountingMailbox(Mailbox):
    def __init__(self, puts: Counter[str]) -> None:
        super().__init__(capacity=8)  # small: some deliveries degrade to the event
        self.puts = puts

    def put(self, task_id: str, envelope: DelegateResult) -> bool:
        stored = super().put(task_id, envelope)
        if stored:
            self.puts[task_id] += 1
        return stored


@pytest.mark.anyio
@pytest.mark.parametrize("seed", range(6))
async def test_random_workload_keeps_every_invariant(seed: int) -> None:
    rng = random.Random(seed)
    alive = 0
    spawned_alive = 0
    over: list[tuple[int, int]] = []
    handles: list[SpawnHandle] = []
    completed: Counter[str] = Counter()
    puts: Counter[str] = Counter()

    manager = SubagentManager(
        config=SubagentConfig(max_concurrent_spawns=3, settle_timeout=2.0),
        mailbox_factory=lambda _session: CountingMailbox(puts),
    )

    def on_event(event: Event) -> None:
        if event.type == "subagent.completed":
            completed[event.task_id] += 1

    manager.events.subscribe(on_event)

    async def runner(request: Request, ctx: RunContext) -> object:
        nonlocal alive, spawned_alive
        sync = request.input.startswith("x-")
        kind = request.input.removeprefix("x-")
        alive += 1
        if not sync:
            # admitted only while fewer than the limit (at this moment) were running
            spawned_alive += 1
            if spawned_alive > manager.max_concurrent_spawns:
                over.append((spawned_alive, manager.max_concurrent_spawns))
        try:
            ctx.report(output=f"partial {kind}")
            for _ in range(rng.randrange(5)):
                await anyio.lowlevel.checkpoint()
            if kind == "nest":
                try:
                    handles.append(ctx.spawn("w", rng.choice(KINDS)))
                    if rng.random() < 0.5:
                        await ctx.execute("w", "x-ok")
                except SpawnRejected:
                    pass
                await anyio.sleep(rng.choice([0, 0.001, 0.01]))
                return "nested"
            if kind == "ok":
                return "fine"
            if kind == "raise":
                raise ValueError("boom")
            if kind == "garbage":
                return 12345
            if kind == "result":
                return Result(output="r", status="completed")  # type: ignore[arg-type]
            if kind == "slow":
                await anyio.sleep(rng.choice([0.001, 0.02, 1.0]))
                return "slow"
            await anyio.sleep_forever()  # "hang": watchdog, cancel or close ends it
            return ""
        finally:
            alive -= 1
            if not sync:
                spawned_alive -= 1

    KINDS = ["ok", "raise", "garbage", "result", "slow", "hang", "nest"]
    manager.register(spec("w", runner))

    async with manager:
        sessions = ["root", "s1", "s2"]
        for _step in range(120):
            action = rng.random()
            if action < 0.55:
                session = rng.choice(sessions)
                try:
                    handles.append(
                        manager.spawn(
                            "w",
                            rng.choice(KINDS),
                            session_id=session,
                            timeout=rng.choice([None, 0.01, 0.05, 5.0]),
                        )
                    )
                except SpawnRejected:
                    assert manager.session_closed(session)
            elif action < 0.7 and handles:
                rng.choice(handles).cancel()
            elif action < 0.75:
                manager.max_concurrent_spawns = rng.randrange(1, 6)
            elif action < 0.77:
                session = rng.choice(sessions[1:])
                await manager.close_session(session)
            else:
                await anyio.sleep(rng.choice([0, 0, 0.001, 0.005]))
        # let some finish normally before closing everything
        with anyio.move_on_after(0.05):
            for h in list(handles):
                await h.wait()

    assert over == []
    assert alive == 0
    stats = manager.statistics()
    assert (stats.running, stats.queued, stats.workers) == (0, 0, 0)
    all_handles = [h for s in ("root", "s1", "s2") for h in manager.tasks(s)]
    for h in handles:
        assert h.done.is_set(), h
        env = h.result
        assert env is not None
        assert completed[h.task_id] == 1, (h, completed[h.task_id])
        assert puts[h.task_id] <= 1
        assert env.status in set(Status)
        assert env.duration_ms >= env.queue_ms >= 0
        env.to_json()
        if env.status is Status.COMPLETED:
            assert env.output in ("fine", "r", "slow", "nested")
    assert stats.spawned == stats.settled
    assert set(all_handles) <= set(handles)
