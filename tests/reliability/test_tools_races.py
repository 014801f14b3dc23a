"""Named races, driven through the LLM tools (``build_tools`` / ``Toolset.call``).

Each test states the race in its name and checks the invariant that the naive
implementation breaks: a result landing as ``wait_agent`` times out, two waits on one id,
``close_session`` under a blocked wait and admissions, ``cancel_agent`` against completion,
a full mailbox, and the host's per-tool timeout.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from trio.testing import MockClock

from subagents import AgentSpec, Event, Request, RunContext, SubagentConfig, SubagentManager
from subagents._json import dumps
from subagents.testing import call_with_host_timeout, echo_agent
from subagents.tools import ToolResult, Toolset, build_tools
from tests.helpers import clock_backends, on_mock_clock, pass_time_without_a_checkpoint

pytestmark = pytest.mark.anyio


def mock_trio() -> tuple[str, dict[str, object]]:
    """trio on its own mock clock (jumps to the next deadline when all tasks block)."""
    return ("trio", {"clock": MockClock(autojump_threshold=0)})


class Gates:
    """An agent type ``gated`` whose runs block until ``release(input)``."""

    def __init__(self) -> None:
        self.events: dict[str, anyio.Event] = {}
        self.arrived: dict[str, anyio.Event] = {}
        self.spec = AgentSpec(name="gated", description="Blocks until released.", runner=self.run)

    def gate(self, key: str) -> anyio.Event:
        return self.events.setdefault(key, anyio.Event())

    async def at_gate(self, key: str) -> None:
        """Wait until the run of ``key`` waits at its gate."""
        await self.arrived.setdefault(key, anyio.Event()).wait()

    async def run(self, request: Request, ctx: RunContext) -> str:
        self.arrived.setdefault(request.input, anyio.Event()).set()
        await self.gate(request.input).wait()
        return f"gated: {request.input}"

    def release(self, *keys: str) -> None:
        for key in keys:
            self.gate(key).set()


async def _sleeper(request: Request, ctx: RunContext) -> str:
    await anyio.sleep(float(request.input))
    return f"slept {request.input}"


SLEEPER = AgentSpec(name="sleeper", description="Sleeps `input` seconds.", runner=_sleeper)


@asynccontextmanager
async def session(
    *specs: AgentSpec, session_id: str = "root", limit: int = 8, **kwargs: Any
) -> AsyncIterator[Toolset]:
    config_keys = {"mailbox_capacity", "settle_timeout", "spawn_timeout"}
    config = {k: kwargs.pop(k) for k in list(kwargs) if k in config_keys}
    config["max_concurrent_spawns"] = limit
    async with SubagentManager(specs, config=SubagentConfig(**config)) as manager:
        kwargs.setdefault("engine_tool_timeout", 20.0)
        kwargs.setdefault("wait_timeout", 10.0)
        yield build_tools(manager, session_id, **kwargs)


async def spawn(tools: Toolset, agent: str, input: str) -> str:
    result = await tools.call("spawn_agent", {"agent": agent, "input": input})
    assert not result.is_error, result.content
    return str(result.details["task_id"])


async def until_waiting(tools: Toolset, waiters: int = 1) -> None:
    """Until ``waiters`` wait_agent calls are blocked (each holds one session signal).
    Cheaper and more exact than ``wait_all_tasks_blocked``, which polls every 0.1 s on
    asyncio."""
    mailbox = tools.manager.mailbox(tools.session_id)
    for _ in range(1000):
        if mailbox.statistics().all_subscribers >= waiters:
            return
        await anyio.lowlevel.checkpoint()
    raise AssertionError("the wait_agent calls never blocked")


def entries(result: ToolResult) -> list[dict[str, Any]]:
    dumps(result.to_dict())
    found = result.details.get("results", [])
    assert isinstance(found, list)
    return [e for e in found if isinstance(e, dict)]


class Ledger:
    """Every ``wait_agent`` answer, checked as it arrives and counted per task id."""

    def __init__(self, tools: Toolset) -> None:
        self.tools = tools
        self.fresh: Counter[str] = Counter()
        self.repeats: Counter[str] = Counter()
        self.answers: list[ToolResult] = []

    async def wait(self, ids: list[str], **args: Any) -> ToolResult:
        result = await self.tools.call("wait_agent", {"task_ids": ids, **args})
        # No checkpoint between the answer and this check: it sees the state the answer saw.
        self.check(ids, result)
        return result

    def check(self, ids: list[str], result: ToolResult) -> None:
        manager = self.tools.manager
        assert not result.is_error, result.content
        assert len(result.content) <= self.tools.limits.truncate_chars
        self.answers.append(result)
        details = result.details
        delivered = {e["task_id"] for e in entries(result)}
        deferred = set(details["deferred"])  # type: ignore[arg-type]
        pending = {p["task_id"] for p in details["pending"]}  # type: ignore[index,union-attr]
        for task_id in ids:
            handle = manager.handle(task_id)
            ended = handle.result is not None
            # Every id is accounted for: delivered, deferred (kept for later), pending, or
            # a repeat of an already collected one left out for space.
            shown = (task_id in delivered) + (task_id in deferred) + (task_id in pending)
            assert shown == 1 or (shown == 0 and handle.collected), task_id
            # Pending means "not ended when the answer was given", never a lost result.
            assert (task_id in pending) is not ended, (task_id, ended)
        if details["timed_out"]:
            assert pending, "timed_out although every result had landed"
            if details["mode"] == "any":
                assert not delivered
                assert not deferred
        for entry in entries(result):
            (self.repeats if entry["already_collected"] else self.fresh)[entry["task_id"]] += 1

    async def collect_all(self, ids: list[str]) -> None:
        """Wait until every id has been handed out, then check: each exactly once."""
        for _ in range(100):  # bounded even if a call never yields
            if all(self.fresh[i] for i in ids):
                break
            with anyio.fail_after(10):
                await self.wait([i for i in ids if self.fresh[i] == 0][:64])
        assert all(self.fresh[i] == 1 for i in ids), self.fresh
        for task_id in ids:
            assert self.tools.manager.handle(task_id).collected
        stats = self.tools.manager.mailbox(self.tools.session_id).statistics()
        assert stats.task_subscribers == 0
        assert stats.all_subscribers == 0


# ---------------------------------------------------------------- result at the deadline


@pytest.mark.parametrize("anyio_backend", [mock_trio()])
async def test_result_landing_in_the_same_tick_as_the_wait_deadline_counts() -> None:
    """Exact: on a mock clock the runner's sleep and the wait's timeout expire at the same
    instant, in one scheduler tick. The answer must be ``completed`` with the result, never
    ``timed_out`` (the naive ``if scope.cancelled_caught: timed_out`` says timed_out)."""
    async with session(SLEEPER, limit=64) as tools:
        ledger = Ledger(tools)
        ids = [await spawn(tools, "sleeper", "0.05") for _ in range(20)]
        async with anyio.create_task_group() as tg:
            for task_id in ids:
                tg.start_soon(lambda i=task_id: ledger.wait([i], timeout_ms=50))
        for answer in ledger.answers:
            assert answer.details["completed"] is True, answer.content
            assert answer.details["timed_out"] is False
            assert entries(answer)[0]["output"] == "slept 0.05"
        await ledger.collect_all(ids)


@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_result_landing_after_the_deadline_fired_but_before_the_wait_resumed() -> None:
    """Both backends: the deadline passes while the loop is blocked, then the child is
    released in that same tick. The wait resumes after the child has landed: it must
    report it, not time out over it."""
    gates = Gates()
    async with session(gates.spec) as tools:
        ledger = Ledger(tools)
        for round_ in range(5):
            task_id = await spawn(tools, "gated", str(round_))
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda i=task_id: ledger.wait([i], timeout_ms=10))
                await until_waiting(tools)
                pass_time_without_a_checkpoint(0.02)  # the deadline passes, nobody runs
                gates.release(str(round_))  # lands in the tick that delivers the deadline
            answer = ledger.answers[-1]
            assert answer.details["completed"] is True, answer.content
            assert entries(answer)[0]["output"] == f"gated: {round_}"


async def test_results_landing_around_the_deadline_statistically() -> None:
    """Many children finishing at about the wait's deadline, in real time: every answer is
    consistent with the record at the moment it was given (``Ledger.check``) and every
    result is handed out exactly once in the end."""
    rng = random.Random(6)
    async with session(SLEEPER, limit=64) as tools:
        ledger = Ledger(tools)
        ids: list[str] = []
        async with anyio.create_task_group() as tg:
            for _ in range(60):
                delay_ms = rng.choice([1, 2, 3, 5])
                task_id = await spawn(tools, "sleeper", str(delay_ms / 1000))
                ids.append(task_id)
                tg.start_soon(lambda i=task_id, d=delay_ms: ledger.wait([i], timeout_ms=d))
        outcomes = Counter(bool(a.details["completed"]) for a in ledger.answers)
        assert sum(outcomes.values()) == 60
        await ledger.collect_all(ids)


async def test_polling_with_a_zero_timeout_lets_the_children_run() -> None:
    """A host polling ``wait_agent`` with ``timeout_ms: 0`` in a tight loop: each call is a
    checkpoint, so the child (which needs a few scheduler ticks) finishes. Without the
    checkpoint the loop spins forever and nothing else ever runs."""

    async def ticks(request: Request, ctx: RunContext) -> str:
        for _ in range(5):
            await anyio.lowlevel.checkpoint()
        return "done"

    spec = AgentSpec(name="ticks", description="Needs five ticks.", runner=ticks)
    async with session(spec) as tools:
        task_id = await spawn(tools, "ticks", "x")
        for _polls in range(1, 1001):
            result = await tools.call("wait_agent", {"task_ids": task_id, "timeout_ms": 0})
            if result.details["completed"]:
                break
        assert result.details["completed"] is True, f"still pending after {_polls} polls"
        assert entries(result)[0]["output"] == "done"


@pytest.mark.parametrize("anyio_backend", [mock_trio()])
async def test_a_wait_killed_by_the_host_as_the_result_lands_consumes_nothing() -> None:
    """The host's kill and the result land in one tick (mock clock): a killed call never
    consumed the result (it is still there for the next wait); an answered one holds it."""
    async with session(SLEEPER, limit=64) as tools:
        ids = [await spawn(tools, "sleeper", "0.05") for _ in range(20)]
        outcomes: dict[str, ToolResult] = {}

        async def killed_or_answered(task_id: str) -> None:
            args = {"task_ids": task_id, "timeout_ms": 1000}
            result = await call_with_host_timeout(tools, "wait_agent", args, timeout=0.05)
            outcomes[task_id] = result
            # No checkpoint since the call ended: the record is as the call left it.
            if result.details.get("error") == "host_timeout":
                assert not tools.manager.handle(task_id).collected
            else:
                assert tools.manager.handle(task_id).collected
                assert entries(result)[0]["output"] == "slept 0.05"

        async with anyio.create_task_group() as tg:
            for task_id in ids:
                tg.start_soon(killed_or_answered, task_id)
        killed = [i for i, r in outcomes.items() if r.details.get("error") == "host_timeout"]
        ledger = Ledger(tools)
        await ledger.collect_all(killed)


# ---------------------------------------------------------------- modes under concurrency


async def test_wait_any_and_all_while_children_finish_together() -> None:
    gates = Gates()
    async with session(gates.spec) as tools:
        ledger = Ledger(tools)
        keys = [str(i) for i in range(8)]
        ids = [await spawn(tools, "gated", k) for k in keys]
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: ledger.wait(ids, mode="all"))
            tg.start_soon(lambda: ledger.wait(ids, mode="any"))
            tg.start_soon(lambda: ledger.wait(ids[4:], mode="any"))
            tg.start_soon(lambda: ledger.wait(ids[:2], mode="all"))
            await anyio.wait_all_tasks_blocked()
            gates.release(*keys)  # all eight land in one tick
        for answer in ledger.answers:
            assert answer.details["completed"] is True
            assert answer.details["timed_out"] is False
            assert answer.details["pending"] == []
        await ledger.collect_all(ids)
        assert sum(ledger.repeats.values()) > 0  # overlapping waits saw repeats, marked


async def test_repeated_any_waits_while_children_finish_in_random_order() -> None:
    rng = random.Random(7)
    async with session(SLEEPER, limit=16) as tools:
        ledger = Ledger(tools)
        ids = [await spawn(tools, "sleeper", str(rng.random() / 100)) for _ in range(16)]
        rounds = 0
        with anyio.fail_after(10):
            while any(ledger.fresh[i] == 0 for i in ids):
                todo = [i for i in ids if ledger.fresh[i] == 0]
                answer = await ledger.wait(todo, mode="any", timeout_ms=rng.choice([0, 1, 5]))
                assert answer.details["completed"] is bool(entries(answer))
                rounds += 1
        await ledger.collect_all(ids)
        assert rounds >= 2


# ---------------------------------------------------------------- two waits on one id


async def test_two_waits_on_one_id_never_lose_it() -> None:
    """Two concurrent ``wait_agent`` calls on one id, the result landing before, between
    or at their deadlines: exactly one hands it out fresh (or neither, and it is still
    uncollected); the other sees it marked already collected. Never both lost."""
    rng = random.Random(8)
    gates = Gates()
    async with session(gates.spec, SLEEPER, limit=64) as tools:
        ledger = Ledger(tools)
        ids = []
        for round_ in range(40):
            if round_ % 2:
                task_id = await spawn(tools, "sleeper", str(rng.choice([0.001, 0.002, 0.003])))
                timeouts = [2, 2]
            else:
                task_id = await spawn(tools, "gated", str(round_))
                timeouts = [rng.choice([0, 1, 5000]), 5000]
            ids.append(task_id)
            async with anyio.create_task_group() as tg:
                for timeout in timeouts:
                    tg.start_soon(lambda i=task_id, t=timeout: ledger.wait([i], timeout_ms=t))
                for _ in range(5):
                    await anyio.lowlevel.checkpoint()
                gates.release(str(round_))
            first_two = ledger.answers[-2:]
            fresh = [e for a in first_two for e in entries(a) if not e["already_collected"]]
            assert len(fresh) <= 1
            if not fresh:
                assert not tools.manager.handle(task_id).collected  # still there for later
        await ledger.collect_all(ids)


# ---------------------------------------------------------------- close_session


async def test_close_session_under_admissions_and_a_blocked_wait() -> None:
    """``close_session`` while ``spawn_agent`` calls keep arriving (most children queued at
    a limit of 2) and a ``wait_agent`` is blocked on them. The wait wakes at once, says the
    session was closed, and every spawned child ends in exactly one envelope, still
    collectable; spawns after the close are refused as data."""
    gates = Gates()
    async with session(gates.spec, session_id="s1", limit=2) as tools:
        manager = tools.manager
        completed: Counter[str] = Counter()
        manager.events.subscribe(
            lambda e: completed.update([e.task_id]) if e.type == "subagent.completed" else None
        )
        ids = [await spawn(tools, "gated", str(i)) for i in range(6)]
        refused: list[ToolResult] = []
        ledger = Ledger(tools)

        spawning = anyio.Event()

        async def spawner() -> None:
            for i in range(40):
                if i == 5:
                    spawning.set()  # the close comes among the spawns
                result = await tools.call("spawn_agent", {"agent": "gated", "input": f"late{i}"})
                dumps(result.to_dict())
                if result.is_error:
                    refused.append(result)
                else:
                    ids.append(str(result.details["task_id"]))
                await anyio.lowlevel.checkpoint()

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: ledger.wait(ids[:6]))
                await anyio.wait_all_tasks_blocked()
                tg.start_soon(spawner)
                await spawning.wait()
                await manager.close_session("s1")
        result = ledger.answers[0]
        assert result.details["session_closed"] is True
        assert refused, "no spawn_agent call raced the close"
        for refusal in refused:
            assert refusal.details == {"error": "spawn_rejected", "reason": "session_closed"}
            assert "closed" in refusal.content
        for task_id in ids:
            handle = manager.handle(task_id)
            assert handle.result is not None
            assert handle.result.status.value == "cancelled"
            assert completed[task_id] == 1
        assert manager.statistics().running == 0
        assert manager.statistics().queued == 0
        await ledger.collect_all(ids)


@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_a_blocked_wait_wakes_at_once_when_its_session_closes(
    anyio_backend: object,
) -> None:
    """The waited child ignores cancellation (it will settle only after
    ``settle_timeout``): the wait must not sit out the settle time; it answers at once that
    the session was closed."""
    release = anyio.Event()

    async def stubborn(request: Request, ctx: RunContext) -> str:
        with anyio.CancelScope(shield=True):
            await release.wait()
        return "too late"

    spec = AgentSpec(name="stubborn", description="Ignores cancellation.", runner=stubborn)
    async with session(spec, session_id="s1", settle_timeout=3.0) as tools:
        task_id = await spawn(tools, "stubborn", "x")
        answer: list[ToolResult] = []
        answered = anyio.Event()
        closed: list[bool] = []
        close_pending_at_answer: list[bool] = []
        woke_after: list[float] = []

        async def waiter() -> None:
            answer.append(await tools.call("wait_agent", {"task_ids": task_id}))
            close_pending_at_answer.append(not closed)
            answered.set()

        async def closer() -> None:
            await tools.manager.close_session("s1")
            closed.append(True)

        with anyio.fail_after(5):
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(waiter)
                    await until_waiting(tools)
                    start = anyio.current_time()
                    tg.start_soon(closer)
                    await answered.wait()
                    woke_after.append(anyio.current_time() - start)
                    release.set()
            finally:
                release.set()
        result = answer[0]
        assert result.details["session_closed"] is True
        assert result.details["timed_out"] is False
        assert "session was closed" in result.content
        # The close still waits for the stubborn child: the wait did not sit it out.
        assert close_pending_at_answer == [True]
        if on_mock_clock(anyio_backend):
            assert woke_after == [0]


@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_a_blocked_wait_wakes_at_once_when_the_manager_closes(
    anyio_backend: object,
) -> None:
    """``aclose`` with a waited child ignoring cancellation: the wait answers at once that
    the session is closed, it does not sit out the settle time (the child is released
    only after the answer, or after 2 s, when the test fails)."""
    release = anyio.Event()

    async def stubborn(request: Request, ctx: RunContext) -> str:
        with anyio.CancelScope(shield=True):
            await release.wait()
        return "too late"

    spec = AgentSpec(name="stubborn", description="Ignores cancellation.", runner=stubborn)
    config = SubagentConfig(settle_timeout=3.0)
    answer: list[ToolResult] = []
    answered = anyio.Event()
    gave_up: list[bool] = []
    took: list[float] = []
    # The waiter runs outside the manager's own task group; leaving the block closes it.
    async with anyio.create_task_group() as tg, SubagentManager([spec], config=config) as manager:
        tools = build_tools(manager, "root", engine_tool_timeout=20, wait_timeout=10)
        task_id = await spawn(tools, "stubborn", "x")

        async def waiter() -> None:
            answer.append(await tools.call("wait_agent", {"task_ids": task_id}))
            answered.set()

        async def release_after_the_answer(start: float) -> None:
            with anyio.move_on_after(2) as scope:  # the test's failure path only
                await answered.wait()
            gave_up.append(scope.cancelled_caught)
            took.append(anyio.current_time() - start)
            release.set()

        tg.start_soon(waiter)
        await until_waiting(tools)
        tg.start_soon(release_after_the_answer, anyio.current_time())
    assert answer[0].details["session_closed"] is True
    assert "session was closed" in answer[0].content
    assert gave_up == [False], "the wait sat out the settle time"
    if on_mock_clock(anyio_backend):
        assert took == [0]


# ---------------------------------------------------------------- cancel_agent vs completion


def completions_of(manager: SubagentManager) -> Counter[str]:
    seen: Counter[str] = Counter()

    def record(event: Event) -> None:
        if event.type == "subagent.completed":
            seen[event.task_id] += 1

    manager.events.subscribe(record)
    return seen


async def test_cancel_in_the_tick_the_runner_is_released() -> None:
    """Released, then cancelled in the same tick: whichever the scheduler runs first, the
    report agrees with the one envelope (``running`` + requested → cancelled; already
    ``completed`` → nothing to cancel)."""
    gates = Gates()
    outcomes: Counter[str] = Counter()
    async with session(gates.spec) as tools:
        seen = completions_of(tools.manager)
        for round_ in range(10):
            task_id = await spawn(tools, "gated", str(round_))
            await gates.at_gate(str(round_))
            gates.release(str(round_))
            result = await tools.call("cancel_agent", {"task_id": task_id})
            envelope = await tools.manager.handle(task_id).wait()
            outcomes[envelope.status.value] += 1
            if result.details["cancel_requested"]:
                assert result.details["previous_status"] == "running"
                assert envelope.status.value == "cancelled"
            else:
                assert result.details["previous_status"] == envelope.status.value == "completed"
                assert "nothing to cancel" in result.content
            assert seen[task_id] == 1


async def test_cancel_while_a_finished_runner_waits_for_its_own_children() -> None:
    """The runner has returned (its outcome is decided: completed) and is waiting for a
    nested child to settle. ``cancel_agent`` now cannot cancel it and must not say it is
    being cancelled: it ends completed."""
    nested_release = anyio.Event()
    nested_started = anyio.Event()

    async def child(request: Request, ctx: RunContext) -> str:
        nested_started.set()
        with anyio.CancelScope(shield=True):
            await nested_release.wait()
        return "child"

    async def parent(request: Request, ctx: RunContext) -> str:
        ctx.spawn("child", "nested")
        await nested_started.wait()
        return "parent done"

    specs = [
        AgentSpec(name="parent", description="Spawns a nested child.", runner=parent),
        AgentSpec(name="child", description="Settles slowly.", runner=child),
    ]
    async with session(*specs) as tools:
        seen = completions_of(tools.manager)
        task_id = await spawn(tools, "parent", "p")
        handle = tools.manager.handle(task_id)
        await anyio.wait_all_tasks_blocked()
        assert handle.result is None  # returned, settling its child
        try:
            result = await tools.call("cancel_agent", {"task_id": task_id})
        finally:
            nested_release.set()
        assert result.details["cancel_requested"] is False
        assert "being cancelled" not in result.content, result.content
        assert "finishing" in result.content
        envelope = await handle.wait()
        assert envelope.status.value == "completed"
        assert envelope.output == "parent done"
        assert seen[task_id] == 1


async def test_cancel_racing_completion_reports_the_right_previous_status() -> None:
    """Many children ending at random instants, each cancelled at a random instant: what
    ``cancel_agent`` reports always agrees with the one envelope the child ends in."""
    rng = random.Random(9)
    async with session(SLEEPER, limit=64) as tools:
        seen = completions_of(tools.manager)
        reports: dict[str, dict[str, Any]] = {}

        async def race(task_id: str, delay: float) -> None:
            await anyio.sleep(delay)
            result = await tools.call("cancel_agent", {"task_id": task_id})
            assert not result.is_error
            reports[task_id] = dict(result.details)
            again = await tools.call("cancel_agent", {"task_id": task_id})
            assert again.details["cancel_requested"] is False  # idempotent

        ids = []
        async with anyio.create_task_group() as tg:
            for _ in range(80):
                task_id = await spawn(tools, "sleeper", str(rng.choice([0, 0.001, 0.002])))
                ids.append(task_id)
                tg.start_soon(race, task_id, rng.choice([0, 0.001, 0.002]))
        statuses: Counter[str] = Counter()
        for task_id in ids:
            handle = tools.manager.handle(task_id)
            await handle.done.wait()  # ended; the ledger below collects
            envelope = handle.result
            assert envelope is not None
            report = reports[task_id]
            statuses[envelope.status.value] += 1
            assert seen[task_id] == 1
            if report["cancel_requested"]:
                assert report["previous_status"] in ("queued", "running")
                assert envelope.status.value == "cancelled"
            elif report["previous_status"] not in ("queued", "running", "cancelling"):
                assert report["previous_status"] == envelope.status.value
            else:
                assert envelope.status.value == "completed"  # it was finishing
        ledger = Ledger(tools)
        await ledger.collect_all(ids)


# ---------------------------------------------------------------- full mailbox


@pytest.mark.parametrize("blocked", [True, False])
async def test_mailbox_at_capacity_while_several_finish_together(blocked: bool) -> None:
    """Capacity 2, eight children landing in one tick: six never fit in the mailbox. A
    ``wait_agent`` on all of them (blocked before, or called after) still hands out all
    eight from the manager's record, each once, and leaves the mailbox empty."""
    gates = Gates()
    async with session(gates.spec, mailbox_capacity=2) as tools:
        ledger = Ledger(tools)
        keys = [str(i) for i in range(8)]
        ids = [await spawn(tools, "gated", k) for k in keys]
        async with anyio.create_task_group() as tg:
            if blocked:
                tg.start_soon(lambda: ledger.wait(ids))
            await anyio.wait_all_tasks_blocked()
            gates.release(*keys)
        if not blocked:
            await ledger.wait(ids)
        assert ledger.answers[0].details["completed"] is True
        await ledger.collect_all(ids)
        outputs = {tools.manager.handle(i).result.output for i in ids}  # type: ignore[union-attr]
        assert outputs == {f"gated: {k}" for k in keys}
        assert len(tools.manager.mailbox("root")) == 0


# ---------------------------------------------------------------- the host's tool timeout


@pytest.mark.parametrize(
    ("engine", "overrides"),
    # Real time, so the margins must stay well above a loaded machine's scheduling
    # delays: a fresh CI machine once stalled the loop for more than the 200 ms margin
    # of a 2 s engine timeout. The mock-clock test below checks the unscaled numbers
    # exactly; this one checks that the answer beats the host under real load.
    [(5.0, None), (60.0, {"wait_agent": 5.0})],
)
async def test_the_host_never_kills_a_wait_before_it_answers(
    engine: float, overrides: dict[str, float] | None
) -> None:
    """Scaled-down engine timeouts, the wait configured at its ceiling, every kind of
    requested timeout, under load from a fan-out in another session: the host-like
    executor always gets an answer (``timed_out``), never has to kill the call."""
    gates = Gates()
    async with SubagentManager([gates.spec, echo_agent()]) as manager:
        effective = (overrides or {}).get("wait_agent", engine)
        ceiling = effective - max(0.1 * effective, 0.02)  # the documented safety margin
        tools = build_tools(
            manager,
            "root",
            engine_tool_timeout=engine,
            tool_timeouts=overrides,
            wait_timeout=ceiling,
        )
        task_id = await spawn(tools, "gated", "never")
        ceiling_ms = int(ceiling * 1000)
        requests = [None, 0, 1, ceiling_ms - 1, ceiling_ms, ceiling_ms + 1, 10**15]
        answers: list[ToolResult] = []

        async def one(request: int | None) -> None:
            args: dict[str, object] = {"task_ids": task_id}
            if request is not None:
                args["timeout_ms"] = request
            answers.append(await call_with_host_timeout(tools, "wait_agent", args))

        async with anyio.create_task_group() as tg:
            for i in range(200):  # load: children ending all the time in another session
                manager.spawn("echo", str(i), session_id="load")
            for request in requests:
                tg.start_soon(one, request)
        assert len(answers) == len(requests)
        for answer in answers:
            assert answer.details.get("error") != "host_timeout", answer.content
            assert answer.details["timed_out"] is True
            assert int(answer.details["timeout_ms"]) <= ceiling_ms  # type: ignore[call-overload]
        gates.release("never")


@pytest.mark.parametrize(
    ("anyio_backend", "engine"),
    [(mock_trio(), engine) for engine in (30.0, 60.0, 120.0, 600.0, None)],
)
async def test_the_host_never_kills_a_wait_at_real_engine_timeouts(engine: float | None) -> None:
    """The unscaled numbers on a mock clock: every requested timeout answers before the
    host's timeout, and a host without one still gets an answer (the 600 s cap)."""
    gates = Gates()
    config = SubagentConfig(spawn_timeout=10**6)
    async with SubagentManager([gates.spec], config=config) as manager:
        wait = 30.0 if engine is None or engine > 40 else engine / 2
        tools = build_tools(manager, "root", engine_tool_timeout=engine, wait_timeout=wait)
        task_id = await spawn(tools, "gated", "never")
        for request in (None, 10**12, int(tools.limits.wait_ceiling * 1000)):
            args: dict[str, object] = {"task_ids": task_id}
            if request is not None:
                args["timeout_ms"] = request
            started = anyio.current_time()
            answer = await call_with_host_timeout(tools, "wait_agent", args)
            took = anyio.current_time() - started
            assert answer.details.get("error") != "host_timeout"
            assert answer.details["timed_out"] is True
            if engine is not None:
                assert took <= engine - 0.1 * engine + 1e-6
            else:
                assert took <= 600.0 + 1e-6
        gates.release("never")
