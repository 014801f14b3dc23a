"""The child runner on its own: one record run to exactly one envelope, delivered once.

The runner is wired to real parts (sessions, limiter, watchdog, notifier) but no
manager: the context factory hands the runner a stand-in (an attempt number), which
these runners ignore.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager, nullcontext
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from subagents import AgentSpec, CompletionNotifier, EventBus, Request, Result, RunContext
from subagents._backend import run_local
from subagents._child import ChildRunner, CompletionEvents
from subagents._envelope import DelegateResult, Status
from subagents._limiter import SpawnLimiter
from subagents._mailbox import Mailbox
from subagents._paths import AgentPath
from subagents._permissions import Ruleset
from subagents._record import ChildRecord
from subagents._sessions import Sessions
from subagents._spec import SubagentConfig
from subagents._tracing import Telemetry
from subagents._watchdog import Watchdog

pytestmark = pytest.mark.anyio


def _no_lend() -> AbstractAsyncContextManager[None]:
    return nullcontext()


def wired() -> tuple[ChildRunner, Sessions, EventBus]:
    events = EventBus()
    sessions = Sessions(lambda sid: Mailbox(capacity=8), _no_lend, None)
    sessions.accepting = True
    completion_events = CompletionEvents(events, sessions, 8)
    runner = ChildRunner(
        backend=run_local,
        make_context=lambda record, deadline: SimpleNamespace(attempt=1),  # type: ignore[arg-type,return-value]
        sessions=sessions,
        limiter=SpawnLimiter(1),
        watchdog=Watchdog(),
        notifier=CompletionNotifier(sessions.delivery_mailbox, completion_events),
        completion_events=completion_events,
        events=events,
        telemetry=Telemetry.from_config(SubagentConfig(tracing=False)),
        settle_timeout=1.0,
    )
    return runner, sessions, events


def record(runner_fn: Any, *, timeout: float | None = None, sync: bool = True) -> ChildRecord:
    spec = AgentSpec(name="child", description="A child.", runner=runner_fn)
    return ChildRecord(
        task_id="c00001",
        session_id="root",
        root_session="root",
        spec=spec,
        request=Request(agent="child", input="x"),
        agent_path=AgentPath("/root/child"),
        parent_path=AgentPath.root(),
        timeout=timeout,
        permissions=Ruleset(),
        spawned_at=0.0,
        sync=sync,
    )


async def test_a_run_ends_in_one_delivered_envelope() -> None:
    async def works(request: Request, ctx: RunContext) -> Result:
        return Result(output="done " + request.input)

    runner, sessions, events = wired()
    completed: list[str] = []
    events.subscribe(lambda e: completed.append(e.task_id or ""))
    r = record(works, sync=False)
    sessions.add(r)
    await runner.run(r)
    assert r.envelope is not None
    assert r.envelope.output == "done x"
    assert r.done.is_set()
    assert sessions.mailbox("root").peek("c00001") is r.envelope
    assert completed.count("c00001") == 2  # started, completed
    assert runner.settled == 1


async def test_a_second_envelope_is_ignored() -> None:
    async def works(request: Request, ctx: RunContext) -> str:
        return "first"

    runner, sessions, _ = wired()
    r = record(works)
    sessions.add(r)
    await runner.run(r)
    first = r.envelope
    runner.finalize(r, DelegateResult(agent="child", task_id="c00001", status=Status.ERROR))
    assert r.envelope is first
    assert runner.settled == 1


async def test_a_runner_past_its_deadline_times_out() -> None:
    async def stuck(request: Request, ctx: RunContext) -> str:
        await anyio.sleep_forever()
        return ""

    runner, sessions, _ = wired()
    r = record(stuck, timeout=0.01)
    sessions.add(r)
    await runner.run(r)
    assert r.envelope is not None
    assert r.envelope.status is Status.TIMEOUT


async def test_cancelling_a_queued_child_ends_it_at_once_and_only_once() -> None:
    async def never(request: Request, ctx: RunContext) -> str:
        raise AssertionError("a cancelled queued child never runs")

    runner, sessions, _ = wired()
    r = record(never, sync=False)
    sessions.add(r)
    assert runner.cancel(r, "by request")
    assert not runner.cancel(r, "again")
    assert r.envelope is not None
    assert r.envelope.error == "cancelled: by request"
