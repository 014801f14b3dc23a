"""Tool chaos: a scripted model drives ``subagents.testing.run_tool_loop`` through a few
hundred random ``spawn_agent`` / ``wait_agent`` (tiny timeouts) / ``cancel_agent`` /
``list_agents`` / ``delegate_to_agent`` calls, with bad calls mixed in, over children
whose runners succeed, raise, hang past their watchdog, report partial output then hang,
return a wrong type or spawn nested children through their own toolset.

The seed is fixed and printed (``SUBAGENTS_TOOL_CHAOS_SEED`` overrides it,
``SUBAGENTS_TOOL_CHAOS_SPAWNS`` scales the run). Checked at the end: every spawned id is
handed out fresh by ``wait_agent`` exactly once (and marked already collected when asked
again), its status matches the injected fault, every tool answer is well-formed and none
was killed by the host, exactly one ``subagent.completed`` event per child, no child left
running or queued, no waiter left registered, the limiter never exceeded.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from collections.abc import Sequence
from typing import Any

import anyio
import pytest

from subagents import AgentSpec, Event, Request, RunContext, SubagentConfig, SubagentManager
from subagents._json import dumps
from subagents.testing import (
    ModelTurn,
    ToolCall,
    Transcript,
    call_with_host_timeout,
    run_tool_loop,
)
from subagents.tools import ToolResult, build_tools

pytestmark = pytest.mark.anyio

SEED = int(os.environ.get("SUBAGENTS_TOOL_CHAOS_SEED", "20261130"))
SPAWNS = int(os.environ.get("SUBAGENTS_TOOL_CHAOS_SPAWNS", "300"))
LIMIT = 6
TRUNCATE = 2000
FAULTS = ("ok", "boom", "hang", "partial", "wrong", "nest")
# What each fault ends in when nobody cancels it.
EXPECTED = {
    "ok": "completed",
    "boom": "error",
    "hang": "timeout",
    "partial": "timeout",
    "wrong": "error",
    "nest": "completed",
}


async def ok(request: Request, ctx: RunContext) -> str:
    await anyio.sleep(3 * int(request.input) / 1000)
    return f"ok {request.input}"


async def boom(request: Request, ctx: RunContext) -> str:
    await anyio.sleep(int(request.input) / 1000)
    raise RuntimeError(f"boom {request.input}")


async def hang(request: Request, ctx: RunContext) -> str:
    await anyio.sleep_forever()
    return "never"


async def partial(request: Request, ctx: RunContext) -> str:
    ctx.report(output=f"partial {request.input}")
    await anyio.sleep_forever()
    return "never"


async def wrong(request: Request, ctx: RunContext) -> Any:
    await anyio.lowlevel.checkpoint()
    return {"not": "a result"}


async def nest(request: Request, ctx: RunContext) -> str:
    """Spawns nested children through its own toolset and waits a little for them."""
    rng = random.Random(request.input)
    tools = build_tools(ctx.manager, ctx.session_id, engine_tool_timeout=1.0, wait_timeout=0.5)
    ids = []
    for _ in range(rng.randint(1, 2)):
        agent = rng.choice(["ok", "boom", "nest", "hang"])
        spawned = await tools.call(
            "spawn_agent", {"agent": agent, "input": str(rng.randint(0, 3)), "timeout_ms": 30}
        )
        check(spawned, tools.limits.truncate_chars)
        if not spawned.is_error:  # the depth limit refuses deep nests, as data
            ids.append(spawned.details["task_id"])
    if ids:
        waited = await tools.call("wait_agent", {"task_ids": ids, "timeout_ms": rng.choice([0, 2])})
        check(waited, tools.limits.truncate_chars)
    return f"nest {len(ids)}"


SPECS = [
    AgentSpec(name=name, description=f"chaos {name}", runner=fn)
    for name, fn in [
        ("ok", ok),
        ("boom", boom),
        ("hang", hang),
        ("partial", partial),
        ("wrong", wrong),
        ("nest", nest),
    ]
]


def check(result: ToolResult, limit: int) -> ToolResult:
    assert isinstance(result, ToolResult)
    assert isinstance(result.content, str)
    assert isinstance(result.is_error, bool)
    assert len(result.content) <= 2 * limit
    assert result.details.get("error") not in ("host_timeout", "internal"), result.content
    dumps(result.to_dict())
    return result


class ChaosModel:
    """A model making random tool calls for ``spawns`` spawns, then collecting everything."""

    def __init__(self, seed: int, spawns: int, manager: SubagentManager) -> None:
        self.manager = manager
        self.rng = random.Random(seed)
        self.spawns_left = spawns
        self.faults: dict[str, str] = {}  # task id -> agent
        self.cancelled: set[str] = set()
        self.repeated = False

    def _uncollected(self, transcript: Transcript) -> list[str]:
        # The record, not the transcript: the side host collects results too.
        return [i for i in transcript.task_ids() if not self.manager.handle(i).collected]

    def _record(self, transcript: Transcript) -> None:
        for step in transcript.steps:
            result = step.result
            if step.name == "spawn_agent" and not result.is_error:
                self.faults[str(result.details["task_id"])] = str(result.details["agent"])
            if step.name == "cancel_agent" and result.details.get("cancel_requested"):
                self.cancelled.add(str(result.details["task_id"]))

    def _random_call(self) -> ToolCall:
        rng = self.rng
        kind = rng.choices(
            ["spawn", "wait", "cancel", "list", "delegate", "bad"], [8, 5, 3, 1, 1, 1]
        )[0]
        if kind == "spawn" and self.spawns_left > 0:
            self.spawns_left -= 1
            agent = rng.choice(FAULTS)
            args: dict[str, object] = {"agent": agent, "input": str(rng.randint(0, 3))}
            if agent in ("hang", "partial"):
                args["timeout_ms"] = rng.choice([5, 10, 20])  # the watchdog ends them
            elif rng.random() < 0.2:
                args["timeout_ms"] = 2000  # given, but never reached
            return ToolCall("spawn_agent", args)
        if kind in ("wait", "spawn"):
            seed = rng.random()

            def wait_args(t: Transcript) -> object:
                r = random.Random(seed)
                ids = t.task_ids() or ["nothing-yet"]
                chosen = r.sample(ids, min(len(ids), r.randint(1, 5)))
                return {
                    "task_ids": chosen,
                    "mode": r.choice(["any", "all"]),
                    "timeout_ms": r.choice([0, 1, 2, 5]),
                }

            return ToolCall("wait_agent", wait_args)
        if kind == "cancel":
            seed = rng.random()

            def cancel_args(t: Transcript) -> object:
                ids = t.task_ids() or ["nothing-yet"]
                return {"task_id": random.Random(seed).choice(ids)}

            return ToolCall("cancel_agent", cancel_args)
        if kind == "list":
            return ToolCall("list_agents", {})
        if kind == "delegate":
            agent = rng.choice(["ok", "boom", "wrong", "hang"])
            return ToolCall("delegate_to_agent", {"agent": agent, "input": "1", "timeout_ms": 10})
        return ToolCall(
            rng.choice(["wait_agent", "cancel_agent", "spawn_agent"]),
            rng.choice(
                [{"task_ids": "nope"}, {"task_id": 5}, {"agent": "nope", "input": "x"}, "{"]
            ),
        )

    async def __call__(self, transcript: Transcript, tools: Sequence[str] = ()) -> ModelTurn:
        await anyio.lowlevel.checkpoint()
        self._record(transcript)
        if self.spawns_left > 0:
            calls = tuple(self._random_call() for _ in range(self.rng.randint(1, 4)))
            return ModelTurn(tool_calls=calls)
        left = self._uncollected(transcript)
        if left:
            return ModelTurn(
                tool_calls=(ToolCall("wait_agent", {"task_ids": left[:64], "timeout_ms": 500}),)
            )
        if not self.repeated:  # asking again for collected ids: marked, never lost
            self.repeated = True
            ids = self.rng.sample(transcript.task_ids(), min(64, len(transcript.task_ids())))
            return ModelTurn(tool_calls=(ToolCall("wait_agent", {"task_ids": ids}),))
        return ModelTurn(text="all collected")


async def test_tool_chaos_keeps_every_invariant() -> None:
    print(f"tool chaos seed {SEED} (SUBAGENTS_TOOL_CHAOS_SEED), {SPAWNS} spawns")
    config = SubagentConfig(
        max_concurrent_spawns=LIMIT, spawn_timeout=2.0, execute_timeout=2.0, settle_timeout=1.0
    )
    events: Counter[str] = Counter()

    def on_event(event: Event) -> None:
        if event.type == "subagent.completed":
            events[event.task_id] += 1

    side: list[ToolResult] = []
    async with SubagentManager(SPECS, config=config) as manager:
        model = ChaosModel(SEED, SPAWNS, manager)
        manager.events.subscribe(on_event)
        tools = build_tools(manager, "root", engine_tool_timeout=2.0, wait_timeout=1.0)
        done = anyio.Event()

        async def side_host(rng: random.Random) -> None:
            """A second caller on the same session: concurrent cancels, waits and lists."""
            while not done.is_set():
                ids = [h.task_id for h in manager.tasks("root") if not h.sync]
                if ids:
                    name, args = rng.choice(
                        [
                            ("cancel_agent", {"task_id": rng.choice(ids)}),
                            (
                                "wait_agent",
                                {
                                    "task_ids": rng.sample(ids, min(3, len(ids))),
                                    "mode": rng.choice(["any", "all"]),
                                    "timeout_ms": rng.choice([0, 1, 3]),
                                },
                            ),
                            ("list_agents", {}),
                        ]
                    )
                    result = await call_with_host_timeout(tools, name, args)
                    side.append(result)
                    if name == "cancel_agent" and result.details.get("cancel_requested"):
                        model.cancelled.add(str(result.details["task_id"]))
                await anyio.sleep(0.002)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(side_host, random.Random(SEED + 1))
                transcript = await run_tool_loop(model, tools, max_turns=20 * SPAWNS)
                done.set()
        context = f"(seed {SEED})"

        # Every answer well-formed, none killed by the host.
        for step in transcript.steps:
            check(step.result, TRUNCATE)
        for result in side:
            check(result, TRUNCATE)
        ids = transcript.task_ids()
        assert len(ids) >= SPAWNS * 0.8, context

        # Each spawned id handed out fresh exactly once; repeats are marked.
        fresh: Counter[str] = Counter()
        repeats: Counter[str] = Counter()
        waits = [r for r in side if "mode" in r.details] + transcript.results("wait_agent")
        for result in waits:
            for entry in result.details.get("results", []):  # type: ignore[union-attr]
                target = repeats if entry["already_collected"] else fresh  # type: ignore[index]
                target[entry["task_id"]] += 1  # type: ignore[index]
        for task_id in ids:
            assert fresh[task_id] == 1, (task_id, fresh[task_id], context)
        last = transcript.results("wait_agent")[-1]
        assert last.details["results"], context
        assert all(e["already_collected"] for e in last.details["results"]), context  # type: ignore[union-attr,index]

        # Status matches the injected fault (cancelled only when cancel_agent said so).
        statuses: Counter[str] = Counter()
        for task_id in ids:
            handle = manager.handle(task_id)
            envelope = handle.result
            assert envelope is not None
            assert handle.collected
            fault = model.faults[task_id]
            status = envelope.status.value
            statuses[f"{fault}:{status}"] += 1
            if task_id in model.cancelled:
                assert status == "cancelled", (task_id, fault, status, context)
            else:
                assert status == EXPECTED[fault], (task_id, fault, status, context)
            if fault == "partial" and status == "timeout":
                assert envelope.output.startswith("partial"), context
        print("outcomes:", dict(sorted(statuses.items())))

        # Nothing left running, queued or registered; one completion event per child.
        everything = [manager.handle(i) for i in ids]
        nested = [h for parent in ids for h in manager.tasks(parent)]
        assert nested, "no nested spawn happened " + context
        for handle in everything + nested:
            assert handle.result is not None, (handle, context)
            assert events[handle.task_id] == 1, (handle.task_id, events[handle.task_id])
        stats = manager.statistics()
        assert stats.running == 0, context
        assert stats.queued == 0, context
        assert stats.high_water <= LIMIT, context
        mailbox = manager.mailbox("root").statistics()
        assert mailbox.task_subscribers == 0, context
        assert mailbox.all_subscribers == 0, context
        assert mailbox.entries == 0, context  # everything collected came out of it
        # private: the sessions part; no public view of the wake-ups registered for session
        # closes (a leak).
        assert manager._sessions.watching == 0, context
