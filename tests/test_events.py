"""Lifecycle events: the schema, the bus, and bounded async streams that report overflow."""

from __future__ import annotations

import itertools
import json

import anyio
import pytest

from subagents import (
    AgentSpec,
    DelegateResult,
    Event,
    EventBus,
    EventStream,
    Request,
    Result,
    RunContext,
    SubagentConfig,
    SubagentManager,
    Usage,
)
from subagents._events import COMPLETED, MISSED, PROGRESS, SPAWNED, STARTED
from subagents._outcome import TRACEBACK_CHARS

LONG = "x" * 5000


async def work(request: Request, ctx: RunContext) -> Result:
    ctx.report(append="partial", iterations=1)
    return Result(output=LONG, usage=Usage(input_tokens=1, output_tokens=2), iterations=2)


def publish(bus: EventBus, n: int, task: str = "t") -> None:
    for _ in range(n):
        bus.publish(PROGRESS, session_id="root", task_id=task, agent_path="/root/a")


def test_an_event_round_trips_and_a_malformed_one_is_refused() -> None:
    event = Event(
        type=COMPLETED,
        seq=3,
        timestamp_ms=1700000000123,
        session_id="root",
        task_id="abc",
        agent_path="/root/a",
        data={"status": "completed", "usage": {"input_tokens": 1}},
    )
    assert Event.from_dict(event.to_dict()) == event
    with pytest.raises(ValueError, match="seq"):
        Event.from_dict({**event.to_dict(), "seq": "3"})
    with pytest.raises(ValueError, match="task_id"):
        Event.from_dict({k: v for k, v in event.to_dict().items() if k != "task_id"})
    with pytest.raises(ValueError, match="data"):
        Event.from_dict({**event.to_dict(), "data": [1]})
    with pytest.raises(ValueError, match="seq"):
        Event.from_dict({**event.to_dict(), "seq": True})


@pytest.mark.anyio
async def test_stream_sees_lifecycle_with_full_envelope() -> None:
    agents = [AgentSpec(name="worker", description="d", runner=work)]
    async with SubagentManager(agents) as manager, manager.events.stream() as events:
        handle = manager.spawn("worker", "go")
        await handle.wait()
        received = []
        while True:
            try:
                received.append(events.receive_nowait())
            except anyio.WouldBlock:
                break
    assert [e.type for e in received] == [SPAWNED, STARTED, PROGRESS, COMPLETED]
    assert [e.seq for e in received] == sorted({e.seq for e in received})
    for e in received:
        assert e.task_id == handle.task_id
        assert e.session_id == "root"
        assert e.agent_path == "/root/worker"
        assert e.timestamp_ms > 0
    completed = received[-1].data
    envelope = await handle.wait()
    assert completed == envelope.to_dict()
    assert completed["output"] == LONG  # untruncated
    assert completed["usage"] == {"input_tokens": 1, "output_tokens": 2}


def test_stream_overflow_reports_missed_count() -> None:
    bus = EventBus()
    stream = bus.stream(max_buffer=2)
    publish(bus, 5)
    first, second, marker = (stream.receive_nowait() for _ in range(3))
    assert (first.seq, second.seq) == (1, 2)
    assert marker.type == MISSED
    assert marker.data == {"missed": 3, "first_seq": 3, "last_seq": 5}
    assert stream.missed == 3
    with pytest.raises(anyio.WouldBlock):
        stream.receive_nowait()
    publish(bus, 1)
    assert stream.receive_nowait().seq == 6
    stream.close()
    with pytest.raises(anyio.EndOfStream):
        stream.receive_nowait()


def test_marker_sits_at_the_gap() -> None:
    bus = EventBus()
    stream = bus.stream(max_buffer=2)
    publish(bus, 3)  # 3 is dropped
    assert stream.receive_nowait().seq == 1
    publish(bus, 1)  # room again: marker for 3, then 4
    got = [stream.receive_nowait() for _ in range(3)]
    assert [(e.type, e.seq) for e in got] == [(PROGRESS, 2), (MISSED, 3), (PROGRESS, 4)]
    assert got[1].data["missed"] == 1


def test_stream_rejects_bad_buffer() -> None:
    bus = EventBus()
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="max_buffer"):
            bus.stream(max_buffer=bad)  # type: ignore[arg-type]
    assert not bus.active


@pytest.mark.anyio
async def test_async_iteration_wakes_and_ends_on_close() -> None:
    bus = EventBus()
    stream: EventStream = bus.stream()
    seen: list[int] = []

    async def consume() -> None:
        async for event in stream:
            seen.append(event.seq)

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        await anyio.wait_all_tasks_blocked()
        publish(bus, 2)
        await anyio.wait_all_tasks_blocked()
        assert seen == [1, 2]
        publish(bus, 1)
        await anyio.wait_all_tasks_blocked()
        await stream.aclose()
    assert seen == [1, 2, 3]
    assert stream.closed
    assert not bus.active  # unsubscribed


@pytest.mark.anyio
async def test_slow_consumer_never_blocks_the_runtime() -> None:
    agents = [AgentSpec(name="worker", description="d", runner=work)]
    config = SubagentConfig(max_concurrent_spawns=8)
    manager = SubagentManager(agents, config=config)
    async with manager, manager.events.stream(max_buffer=4) as events:
        handles = [manager.spawn("worker") for _ in range(50)]
        for handle in handles:
            await handle.wait()  # nobody reads the stream meanwhile
        got = [events.receive_nowait() for _ in range(5)]
        assert [e.type for e in got[:4]] == [SPAWNED] * 4
        assert got[4].type == MISSED
        assert got[4].data["missed"] == 200 - 4
        assert events.missed == 196


@pytest.mark.anyio
async def test_cancelled_receive_loses_nothing() -> None:
    bus = EventBus()
    async with bus.stream() as stream:
        async with anyio.create_task_group() as tg:
            tg.start_soon(stream.receive)
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()  # the receive is cancelled while it waits
        publish(bus, 1)
        assert (await stream.receive()).seq == 1


def test_raising_subscriber_does_not_stop_others(caplog: pytest.LogCaptureFixture) -> None:
    bus = EventBus()

    def boom(event: Event) -> None:
        raise RuntimeError("subscriber bug")

    bus.subscribe(boom)
    stream = bus.stream()
    publish(bus, 1)
    assert stream.receive_nowait().seq == 1
    assert "subscriber" in caplog.text


@pytest.mark.anyio
async def test_a_completed_event_carries_a_bounded_traceback() -> None:
    def deep(n: int) -> None:
        if n:
            deep(n - 1)
        raise ValueError("disk on fire " + "x" * 1_000_000)

    async def failing(request: Request, ctx: RunContext) -> str:
        try:
            deep(200)
        except ValueError as exc:
            raise RuntimeError("the runner gave up") from exc
        return ""

    spec = AgentSpec(name="failing", description="Fails loudly.", runner=failing)
    completed: list[Event] = []
    async with SubagentManager([spec]) as manager:
        manager.events.subscribe(lambda e: completed.append(e) if e.type == COMPLETED else None)
        await manager.spawn("failing").wait()
    (event,) = completed
    traceback = event.data["traceback"]
    assert isinstance(traceback, str)
    assert traceback.startswith("Traceback")
    assert traceback.rstrip().endswith("RuntimeError: the runner gave up")  # the end is kept
    assert len(traceback) <= TRACEBACK_CHARS  # from subagents._outcome


@pytest.mark.anyio
async def test_event_schema_for_one_spawn() -> None:
    async def worker(request: Request, ctx: RunContext) -> str:
        ctx.report(output="half", iterations=1)
        return "full output " + "z" * 3000

    events: list[Event] = []
    m = SubagentManager([AgentSpec(name="worker", description="w", runner=worker)])
    m.events.subscribe(events.append)
    async with m:
        env = await m.spawn("worker", "x", session_id="s7").wait()
    types = [e.type for e in events]
    assert types[0] == "subagent.spawned"
    assert types[1] == "subagent.started"
    assert "subagent.progress" in types
    assert types[-1] == "subagent.completed"
    seqs = [e.seq for e in events]
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == len(seqs)
    for e in events:
        assert isinstance(e.timestamp_ms, int)
        assert e.session_id == "s7"
        assert e.task_id == env.task_id
        assert e.agent_path == "/root/worker"
        line = e.to_dict()
        assert set(line) >= {"type", "seq", "timestamp_ms", "session_id", "task_id", "agent_path"}
        assert json.loads(e.to_json()) == line
    completed = events[-1]
    assert completed.data == env.to_dict()
    assert DelegateResult.from_dict(completed.data) == env
    assert len(completed.data["output"]) > 3000  # untruncated
    spawned = events[0].data
    assert spawned["agent"] == "worker"
    assert spawned["mode"] == "spawn"


@pytest.mark.anyio
async def test_spawned_and_started_event_data() -> None:
    events: list[Event] = []
    m = SubagentManager([AgentSpec(name="worker", description="d", runner=work)])
    m.events.subscribe(events.append)
    async with m:
        await m.spawn("worker", "x", timeout=7.5).wait()
    spawned = next(e for e in events if e.type == "subagent.spawned")
    started = next(e for e in events if e.type == "subagent.started")
    assert spawned.data["parent_path"] == "/root"
    assert spawned.data["timeout_s"] == 7.5
    assert isinstance(started.data["queue_ms"], int)


@pytest.mark.anyio
async def test_seq_strictly_increases_across_many_children() -> None:
    events: list[Event] = []
    agents = [AgentSpec(name="worker", description="d", runner=work)]
    m = SubagentManager(agents, config=SubagentConfig(max_concurrent_spawns=8))
    m.events.subscribe(events.append)
    async with m:
        handles = [m.spawn("worker", str(i)) for i in range(30)]
        for h in handles:
            await h.wait()
    seqs = [e.seq for e in events]
    assert all(a < b for a, b in itertools.pairwise(seqs))
    assert sum(e.type == "subagent.completed" for e in events) == 30


@pytest.mark.anyio
async def test_a_raising_subscriber_never_breaks_the_runtime() -> None:
    def bad(event: Event) -> None:
        raise RuntimeError("subscriber bug")

    m = SubagentManager([AgentSpec(name="worker", description="d", runner=work)])
    m.events.subscribe(bad)
    async with m:
        env = await m.spawn("worker", "x").wait()
    assert env.status == "completed"


@pytest.mark.anyio
async def test_unsubscribing_stops_the_events() -> None:
    events: list[Event] = []
    m = SubagentManager([AgentSpec(name="worker", description="d", runner=work)])
    stop = m.events.subscribe(events.append)
    async with m:
        await m.spawn("worker", "x").wait()
        n = len(events)
        stop()
        await m.spawn("worker", "y").wait()
    assert len(events) == n > 0


@pytest.mark.anyio
async def test_a_child_cancelled_from_its_spawned_event_is_counted_and_traced_once() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from subagents import Status, SubagentConfig

    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    queued: list[int] = []
    config = SubagentConfig(tracer_provider=provider)
    spec = AgentSpec(name="echo", description="Echoes.", runner=_echo_runner)
    async with SubagentManager([spec], config=config) as manager:

        def policy(event: Event) -> None:  # a policy hook: refuse what was just spawned
            if event.type == "subagent.spawned" and event.task_id is not None:
                manager.cancel(event.task_id)
                queued.append(manager.statistics().queued)

        manager.events.subscribe(policy)
        envelope = await manager.spawn("echo", "x").wait()
        assert envelope.status is Status.CANCELLED
    assert queued == [0]
    assert [s.name for s in exported.get_finished_spans()] == ["invoke_agent echo"]


async def _echo_runner(request: Request, ctx: RunContext) -> str:
    return request.input
