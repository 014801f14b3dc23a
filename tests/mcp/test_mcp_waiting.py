"""``wait_agent`` over MCP: a cancelled call ends only the wait (the children run on and
stay collectable), progress while it waits (strictly increasing, "n of m finished", none
after the result), and no call outlasting ``wait_cap``. Durations are asserted on trio's
mock clock only (see ``tests.helpers.clock_backends``)."""

from __future__ import annotations

import itertools
from typing import Any

import anyio
import pytest

from subagents import SubagentConfig
from tests.helpers import clock_backends, on_mock_clock
from tests.mcp.support import MODES, Gates, connected, spawn, structured

pytestmark = pytest.mark.anyio

CHILDREN = 8


@pytest.mark.parametrize("mode", MODES)
async def test_a_cancelled_wait_leaves_every_child_running_and_collectable(mode: str) -> None:
    gates = Gates()
    keys = [f"task {i}" for i in range(CHILDREN)]
    config = SubagentConfig(max_concurrent_spawns=CHILDREN)
    async with connected(mode, gates.spec, config=config, progress_every=0.05) as (
        manager,
        client,
    ):
        ids = [await spawn(client, "gated", key) for key in keys]
        waiting = anyio.Event()

        async def progress(value: float, total: float | None, message: str | None) -> None:
            waiting.set()  # the server is waiting on the children

        async def wait() -> None:
            arguments = {"task_ids": ids, "timeout_ms": 60_000}
            await client.call_tool("wait_agent", arguments, progress_callback=progress)
            raise AssertionError("the cancelled wait answered")

        async with anyio.create_task_group() as group:
            group.start_soon(wait)
            await waiting.wait()
            group.cancel_scope.cancel()
        # One more round trip: over JSON-RPC the server has read the cancellation by now.
        await client.list_tools()
        handles = [manager.handle(task_id) for task_id in ids]
        assert [(h.state, h.result, h.cancel_called) for h in handles] == [
            ("running", None, False)
        ] * CHILDREN
        assert manager.statistics().running == CHILDREN
        gates.open(*keys)
        waited = await client.call_tool("wait_agent", {"task_ids": ids, "timeout_ms": 60_000})
    details = structured(waited)
    assert details["completed"] is True
    results = details["results"]
    assert sorted(r["task_id"] for r in results) == sorted(ids)
    assert [r["already_collected"] for r in results] == [False] * CHILDREN
    assert sorted(r["output"] for r in results) == sorted(f"opened {key}" for key in keys)


@pytest.mark.parametrize("anyio_backend", clock_backends())
@pytest.mark.parametrize("mode", MODES)
async def test_progress_strictly_increases_counts_the_finished_and_stops_at_the_result(
    anyio_backend: Any, mode: str
) -> None:
    gates = Gates()
    keys = ["a", "b", "c"]
    every = 5.0 if on_mock_clock(anyio_backend) else 0.05
    seen: list[tuple[float, float | None, str | None]] = []
    late: list[float] = []
    answered = False
    async with connected(mode, gates.spec, progress_every=every) as (_, client):
        ids = [await spawn(client, "gated", key) for key in keys]

        async def progress(value: float, total: float | None, message: str | None) -> None:
            if answered:
                late.append(value)
            seen.append((value, total, message))
            if len(seen) <= len(keys):
                gates.open(keys[len(seen) - 1])  # one more child ends after each report

        arguments = {"task_ids": ids, "timeout_ms": 60_000}
        result = await client.call_tool("wait_agent", arguments, progress_callback=progress)
        answered = True
        await client.call_tool("list_agents", {})  # a round trip after the result
        if on_mock_clock(anyio_backend):
            await anyio.sleep(10 * every)  # mock time: any tick left running would be due
    assert structured(result)["completed"] is True
    assert late == []
    values = [value for value, _, _ in seen]
    assert all(a < b for a, b in itertools.pairwise(values)), values
    finished = [int(message.split(" of ")[0]) for _, _, message in seen if message]
    assert len(finished) == len(seen) >= len(keys)
    assert finished == sorted(finished)
    assert finished[0] == 0
    assert all(message and message.endswith(" of 3 finished") for _, _, message in seen)
    if on_mock_clock(anyio_backend):
        assert seen == [
            (5.0, None, "0 of 3 finished"),
            (10.0, None, "1 of 3 finished"),
            (15.0, None, "2 of 3 finished"),
        ]


@pytest.mark.parametrize("anyio_backend", clock_backends())
@pytest.mark.parametrize("mode", MODES)
async def test_a_wait_never_outlasts_the_cap(anyio_backend: Any, mode: str) -> None:
    mock = on_mock_clock(anyio_backend)
    cap = 45.0 if mock else 0.05
    gates = Gates()
    async with connected(mode, gates.spec, wait_cap=cap) as (manager, client):
        task_id = await spawn(client, "gated", "x")
        for requested in (None, 45_001, 600_000, 10**12):
            arguments: dict[str, Any] = {"task_ids": task_id}
            if requested is not None:
                arguments["timeout_ms"] = requested
            started = anyio.current_time()
            result = await client.call_tool("wait_agent", arguments)
            elapsed = anyio.current_time() - started
            details = structured(result)
            assert (details["timed_out"], details["completed"]) == (True, False)
            bound = min(30.0, cap) if requested is None else cap
            assert details["timeout_ms"] == int(bound * 1000)
            assert details["clamped"] is (requested is not None and requested > cap * 1000)
            if mock:
                assert bound <= elapsed <= cap + 1
            assert manager.handle(task_id).result is None  # the child runs on
        gates.open("x")
