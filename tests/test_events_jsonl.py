"""The JSONL event log: writing, reading back, partial last lines, following."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from subagents import (
    AgentSpec,
    Event,
    EventBus,
    JsonlSink,
    Request,
    RunContext,
    SubagentManager,
    read_events,
)
from subagents._events import PROGRESS
from subagents._jsonl import EventFollower


async def ok(request: Request, ctx: RunContext) -> str:
    return "é" * 3000 + "\u2028"


async def bad(request: Request, ctx: RunContext) -> str:
    raise RuntimeError("no")


def line(seq: int) -> bytes:
    return Event(
        type=PROGRESS, seq=seq, timestamp_ms=1, session_id="s", task_id="t", agent_path="/root/a"
    ).to_json()


@pytest.mark.anyio
async def test_sink_round_trips_manager_events(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    seen: list[Event] = []
    agents = [
        AgentSpec(name="ok", description="d", runner=ok),
        AgentSpec(name="bad", description="d", runner=bad),
    ]
    with JsonlSink(path) as sink:
        async with SubagentManager(agents) as manager:
            sink.attach(manager.events)
            manager.events.subscribe(seen.append)
            await manager.spawn("ok").wait()
            await manager.execute("bad")
        assert sink.written == len(seen) == 6
    assert sink.closed
    raw = path.read_bytes()
    assert raw.endswith(b"\n")
    assert raw.count(b"\n") == 6
    assert list(read_events(path)) == seen


@pytest.mark.anyio
async def test_sink_writes_each_event_at_once_and_nothing_after_close(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    async with SubagentManager([AgentSpec(name="ok", description="d", runner=ok)]) as m:
        with JsonlSink(path) as sink:
            sink.attach(m.events)
            env = await m.spawn("ok", "x").wait()
            size = path.stat().st_size
            assert size > 0  # written at once, no buffering
        await m.spawn("ok", "after close").wait()
    lines = path.read_bytes().splitlines()  # bytes: U+2028 in the output is not a line end
    assert all(json.loads(line) for line in lines)
    events = list(read_events(path))
    assert [e.to_dict() for e in events] == [json.loads(line) for line in lines]
    assert events[-1].type == "subagent.completed"
    assert events[-1].data == env.to_dict()
    assert path.stat().st_size == size  # nothing written after the sink closed


@pytest.mark.anyio
async def test_sink_works_as_a_plain_subscriber(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    async with SubagentManager([AgentSpec(name="ok", description="d", runner=ok)]) as m:
        with JsonlSink(str(path)) as sink:
            m.events.subscribe(sink)
            await m.spawn("ok", "x").wait()
    assert len(list(read_events(path))) >= 3


def test_sink_appends_and_stops_after_close(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(line(1) + b"\n")
    bus = EventBus()
    sink = JsonlSink(path, fsync=True)
    sink.attach(bus)
    bus.publish(PROGRESS, session_id="s", task_id="t", agent_path="/root/a")
    sink.close()
    assert not bus.active
    sink(Event(type=PROGRESS, seq=9, timestamp_ms=1, session_id="s", task_id="t", agent_path=""))
    assert [e.seq for e in read_events(path)] == [1, 1]


def test_failed_write_stops_the_log(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sink = JsonlSink(tmp_path / "events.jsonl")
    # private: no public way to make a sink's next write fail (a full disk, a revoked
    # file); closing its descriptor under it makes the next write fail with EBADF.
    assert sink._fd is not None
    os.close(sink._fd)
    sink.write_line(line(1))
    assert sink.closed
    assert isinstance(sink.error, OSError)
    [record] = caplog.records
    assert "the log stops here" in record.getMessage()
    assert "Bad file descriptor" in record.getMessage()
    assert record.exc_info is None  # one line: the reason, not a traceback of os.write
    sink.write_line(line(2))  # no second error, no exception
    assert sink.written == 0
    assert len(caplog.records) == 1


def test_failed_write_goes_to_on_error_instead_of_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    errors: list[OSError] = []
    sink = JsonlSink(tmp_path / "events.jsonl", on_error=errors.append)
    sink.write_line(line(1))
    # private: no public way to make the next write fail (see above).
    assert sink._fd is not None
    os.close(sink._fd)
    sink.write_line(line(2))
    sink.write_line(line(3))
    sink.close()
    assert sink.written == 1
    assert errors == [sink.error]
    assert isinstance(sink.error, OSError)
    assert caplog.records == []


def test_partial_last_line_is_skipped_with_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(line(1) + b"\n" + line(2) + b"\n" + line(3)[:17])
    with caplog.at_level(logging.WARNING, logger="subagents.events"):
        events = list(read_events(path))
    assert [e.seq for e in events] == [1, 2]
    assert "partial last line 3" in caplog.text


def test_malformed_middle_line_is_skipped_with_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(line(1) + b"\n\n[1, 2]\n" + b"\xff\xfe\n" + line(2) + b"\n")
    with caplog.at_level(logging.WARNING, logger="subagents.events"):
        events = list(read_events(path))
    assert [e.seq for e in events] == [1, 2]
    assert "malformed line 3" in caplog.text
    assert "malformed line 4" in caplog.text


def test_follower_holds_back_an_incomplete_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "events.jsonl"
    follower = EventFollower(path)
    assert follower.poll() == []  # no file yet
    full = line(2)
    path.write_bytes(line(1) + b"\n" + full[:10])
    assert [e.seq for e in follower.poll()] == [1]
    assert follower.poll() == []
    with path.open("ab") as f:
        f.write(full[10:] + b"\n" + line(3)[:5])
    assert [e.seq for e in follower.poll()] == [2]
    with caplog.at_level(logging.WARNING, logger="subagents.events"):
        assert follower.finish() == []
    assert "partial last line 3" in caplog.text


def test_follower_from_end_and_truncation(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(line(1) + b"\n")
    follower = EventFollower(path, from_start=False)
    assert follower.poll() == []
    with path.open("ab") as f:
        f.write(line(2) + b"\n")
    assert [e.seq for e in follower.poll()] == [2]
    path.write_bytes(line(7) + b"\n")  # replaced by a shorter file: start over
    assert [e.seq for e in follower.poll()] == [7]
