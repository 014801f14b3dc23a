"""``subagents events tail`` and ``subagents events summary``."""

from __future__ import annotations

import io
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from subagents import DelegateResult, Event, Status, Usage
from subagents._cli import main
from subagents._cli_events import format_event, tail
from subagents._event_summary import percentile, summarize_events
from subagents._events import COMPLETED, MISSED, SPAWNED, STARTED
from subagents._json import loads

ROOT = Path(__file__).resolve().parents[1]
_seq = iter(range(1, 10_000))


def ev(type: str, task: str, data: dict[str, object] | None = None, path: str = "") -> Event:
    return Event(
        type=type,
        seq=next(_seq),
        timestamp_ms=1_700_000_000_000,
        session_id="root",
        task_id=task,
        agent_path=path or f"/root/{task}",
        data=data or {},  # type: ignore[arg-type]
    )


def done(task: str, agent: str, status: Status, ms: int, tokens: int = 0) -> Event:
    envelope = DelegateResult(
        agent=agent,
        task_id=task,
        status=status,
        output="out",
        error="" if status is Status.COMPLETED else f"{status.value} happened\nsecond line",
        error_type="" if status is Status.COMPLETED else f"{status.value}-type",
        duration_ms=ms,
        usage=Usage(input_tokens=tokens, output_tokens=2 * tokens),
        agent_path=f"/root/{task}",
        parent_path="/root",
    )
    return ev(COMPLETED, task, envelope.to_dict())


def write_log(path: Path, events: list[Event], tail_bytes: bytes = b"") -> None:
    path.write_bytes(b"".join(e.to_json() + b"\n" for e in events) + tail_bytes)


def sample() -> list[Event]:
    events = [ev(SPAWNED, f"a{i}", {"agent": "alpha", "mode": "spawn"}) for i in range(10)]
    events.append(ev(SPAWNED, "b0", {"agent": "beta", "mode": "spawn"}))
    events.append(ev(SPAWNED, "lost", {"agent": "beta", "mode": "spawn"}))
    events.append(ev(STARTED, "a0", {"queue_ms": 3}))
    for i in range(10):
        status = Status.COMPLETED if i < 8 else Status.ERROR
        events.append(done(f"a{i}", "alpha", status, ms=10 * (i + 1), tokens=i))
    events.append(done("b0", "beta", Status.TIMEOUT, ms=500, tokens=100))
    events.append(ev(MISSED, "", {"missed": 4, "first_seq": 1, "last_seq": 4}, path="-"))
    return events


def test_percentile_nearest_rank() -> None:
    assert percentile([], 50) == 0
    assert percentile([7], 95) == 7
    values = list(range(10, 101, 10))
    assert percentile(values, 50) == 50
    assert percentile(values, 95) == 100
    assert percentile(list(range(1, 101)), 95) == 95


def test_summary_counts_statuses_latencies_tokens_and_failures() -> None:
    summary = summarize_events(sample(), slowest=3)
    assert summary.completed == 11
    assert summary.unfinished == ["lost"]
    assert summary.missed == 4
    assert summary.by_status == {"completed": 8, "error": 2, "timeout": 1}
    assert summary.by_agent == {"alpha": {"completed": 8, "error": 2}, "beta": {"timeout": 1}}
    alpha = summary.latency_by_agent["alpha"]
    assert (alpha.p50_ms, alpha.p95_ms, alpha.max_ms, alpha.count) == (50, 100, 100, 10)
    assert summary.latency.max_ms == 500
    assert summary.tokens_by_agent["alpha"] == {"input_tokens": 45, "output_tokens": 90}
    assert summary.tokens_by_agent["beta"] == {"input_tokens": 100, "output_tokens": 200}
    assert [t.task_id for t in summary.slowest] == ["b0", "a9", "a8"]
    assert [(t.task_id, t.status) for t in summary.failed] == [
        ("a8", "error"),
        ("a9", "error"),
        ("b0", "timeout"),
    ]
    assert summary.failed[2].error_type == "timeout-type"


def test_cli_summary_text_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "events.jsonl"
    write_log(path, sample(), tail_bytes=b'{"type": "subagent.comp')
    assert main(["events", "summary", str(path)]) == 0
    text = capsys.readouterr().out
    assert "completed 8, error 2, timeout 1" in text
    assert "alpha: completed 8, error 2 · p50 50 ms · p95 100 ms · max 100 ms" in text
    assert "tokens in 45 / out 90" in text
    assert "b0  /root/b0  timeout (timeout-type)  timeout happened second line" in text
    assert "unfinished: lost" in text
    assert main(["events", "summary", str(path), "--json", "--slowest", "1"]) == 0
    data = loads(capsys.readouterr().out)
    assert isinstance(data, dict)
    assert data["by_status"] == {"completed": 8, "error": 2, "timeout": 1}
    assert data["latency"] == {"count": 11, "p50_ms": 60, "p95_ms": 500, "max_ms": 500}
    assert data["slowest"] == [
        {
            "task_id": "b0",
            "agent": "beta",
            "agent_path": "/root/b0",
            "status": "timeout",
            "duration_ms": 500,
            "error_type": "timeout-type",
            "error": "timeout happened\nsecond line",
        }
    ]


def test_cli_summary_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["events", "summary", str(tmp_path / "nope.jsonl")]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_cli_tail_no_follow(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "events.jsonl"
    events = sample()
    write_log(path, events, tail_bytes=b'{"type"')
    assert main(["events", "tail", str(path), "--no-follow"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(events)
    assert "spawned" in lines[0]
    assert "/root/a0 [a0]" in lines[0]
    assert "agent=alpha" in lines[0]
    assert "queued 3 ms" in lines[12]
    assert "completed in 10 ms" in lines[13]
    last_done = lines[-2]
    assert "timeout in 500 ms tokens 100/200" in last_done
    assert "timeout happened second line" in last_done
    assert "4 events dropped" in lines[-1]
    assert main(["events", "tail", str(tmp_path / "nope"), "--no-follow"]) == 1


def test_tail_follows_appended_lines(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    first = ev(SPAWNED, "x", {"agent": "alpha", "mode": "spawn"})
    later = [ev(STARTED, "x", {"queue_ms": 0}), done("x", "alpha", Status.COMPLETED, 5)]
    write_log(path, [first])
    pending = later[1].to_json() + b"\n"
    polls: list[float] = []

    def fake_sleep(seconds: float) -> None:
        # Each poll interval, the "runtime" appends a little more: a line, then half a line.
        polls.append(seconds)
        with path.open("ab") as f:
            if len(polls) == 1:
                f.write(later[0].to_json() + b"\n" + pending[:8])
            elif len(polls) == 2:
                f.write(pending[8:])

    out = io.StringIO()
    printed = tail(str(path), out=out, follow=True, interval=0.5, max_events=3, sleep=fake_sleep)
    assert printed == 3
    assert polls == [0.5, 0.5]
    lines = out.getvalue().splitlines()
    assert [line.split()[2] for line in lines] == ["spawned", "started", "completed"]


def test_format_event_unknown_type() -> None:
    text = format_event(ev("custom.kind", "z", {"k": 1}))
    assert '{"k":1}' in text


def test_summary_into_a_closed_pipe_exits_quietly(tmp_path: Path) -> None:
    """`subagents events summary FILE | head -1`: the reader left; exit 0, no traceback."""
    log = tmp_path / "events.jsonl"
    assert main(["demo", "--events", str(log)]) == 0
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has left before the first line is written
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "subagents", "events", "summary", str(log)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr) == (0, "")


# --- errors are one line, never a traceback ------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "subagents", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.mark.parametrize("follow", [True, False])
def test_tail_of_a_directory_is_a_one_line_error(tmp_path: Path, follow: bool) -> None:
    proc = run_cli("events", "tail", str(tmp_path), *([] if follow else ["--no-follow"]))
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [
        f"subagents events tail: cannot read {tmp_path}: Is a directory"
    ]


def test_tail_and_summary_show_a_time_out_of_datetime_range_as_its_number(
    tmp_path: Path,
) -> None:
    """Past year 9999 or before year 1 there is no clock time to print: the line shows the
    raw number, the other lines print as usual, and neither command prints a traceback."""
    path = tmp_path / "events.jsonl"
    odd = [
        Event(
            type=COMPLETED,
            seq=seq,
            timestamp_ms=timestamp_ms,
            session_id="root",
            task_id=f"t{seq}",
            agent_path=f"/root/t{seq}",
            data={"agent": "a", "status": "completed", "duration_ms": 5},
        )
        for seq, timestamp_ms in [(1, 10**18), (2, -(10**18)), (3, 1_700_000_000_123)]
    ]
    write_log(path, odd)
    proc = run_cli("events", "tail", "--no-follow", str(path))
    assert (proc.returncode, proc.stderr) == (0, "")
    lines = proc.stdout.splitlines()
    assert len(lines) == 3, proc.stdout
    assert lines[0].startswith(f"timestamp_ms={10**18} #1 ")
    assert lines[1].startswith(f"timestamp_ms={-(10**18)} #2 ")
    assert lines[2].startswith("22:13:20.123 #3 ")
    assert all("completed in 5 ms" in line for line in lines)
    for extra in ([], ["--json"]):
        proc = run_cli("events", "summary", *extra, str(path))
        assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
        assert "completed" in proc.stdout


def test_tail_of_a_missing_file_says_it_is_waiting_then_follows(tmp_path: Path) -> None:
    path = tmp_path / "later.jsonl"
    args = ["events", "tail", str(path), "--max-events", "1", "--interval", "0.01"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "subagents", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    stderr = proc.stderr
    assert stderr is not None
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in stderr:
            lines.put(line)

    reader = threading.Thread(target=pump)
    reader.start()
    try:
        # The notice is the signal that tail has looked once and found nothing.
        notice = lines.get(timeout=30)
    except queue.Empty:
        notice = ""
    finally:
        if not notice:
            proc.kill()
    assert notice == f"subagents events tail: waiting for {path} to be created (Ctrl-C to stop)\n"
    write_log(path, [ev(SPAWNED, "late", {"agent": "alpha", "mode": "spawn"})])
    out, _ = proc.communicate(timeout=30)
    reader.join()
    assert proc.returncode == 0
    assert "/root/late [late]" in out
    assert lines.empty()  # said once, and nothing else


def test_tail_of_a_missing_file_without_following_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "nope.jsonl"
    assert main(["events", "tail", str(path), "--no-follow"]) == 1
    assert capsys.readouterr().err == (
        f"subagents events tail: cannot read {path}: No such file or directory\n"
    )


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--max-events", "0"),
        ("--max-events", "-1"),
        ("--max-events", "many"),
        ("--interval", "0"),
        ("--interval", "-0.5"),
        ("--interval", "nan"),
    ],
)
def test_tail_rejects_bad_numbers_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str
) -> None:
    path = tmp_path / "events.jsonl"
    write_log(path, sample())
    with pytest.raises(SystemExit) as exit_info:
        main(["events", "tail", str(path), "--no-follow", f"{option}={value}"])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no event printed
    [line] = captured.err.splitlines()
    assert line.startswith(f"subagents events tail: error: argument {option}: ")
    assert value in line


def test_summary_rejects_a_negative_slowest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "events.jsonl"
    write_log(path, sample())
    with pytest.raises(SystemExit) as exit_info:
        main(["events", "summary", str(path), "--slowest=-1"])
    assert exit_info.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert "argument --slowest: must be 0 or more, got -1" in line


def test_summary_of_an_empty_log_says_there_are_no_events(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"")
    assert main(["events", "summary", str(path)]) == 0
    assert capsys.readouterr().out == f"no events in {path}\n"


def test_summary_with_no_ended_task_shows_no_durations() -> None:
    text = summarize_events([ev(SPAWNED, "s", {"agent": "alpha", "mode": "spawn"})]).format()
    assert "durations: none (no task ended)" in text
    assert "p50" not in text
    assert "by agent: none" in text
    assert "unfinished: s" in text
    assert summarize_events([]).format() == "no events"


def test_summary_of_a_directory_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["events", "summary", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (
        f"subagents events summary: cannot read {tmp_path}: Is a directory\n"
    )


@pytest.mark.parametrize(
    ("raised", "status", "err"),
    [
        (KeyboardInterrupt(), 130, ""),
        (
            PermissionError(13, "Permission denied"),
            1,
            "subagents events: [Errno 13] Permission denied\n",
        ),
    ],
    ids=["ctrl-c", "os-error"],
)
def test_main_turns_interrupts_and_stray_os_errors_into_a_status(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    raised: BaseException,
    status: int,
    err: str,
) -> None:
    import subagents._cli_events as cli_events

    def fails(args: object) -> int:
        raise raised

    # private: no public way to make the summary raise these from inside main().
    monkeypatch.setattr(cli_events, "_run_summary", fails)
    assert main(["events", "summary", str(tmp_path / "x.jsonl")]) == status
    assert capsys.readouterr().err == err


def test_tail_and_summary_show_control_characters_as_escapes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A name or error holding terminal controls (an ANSI escape, a carriage return, a
    line separator) is printed as escapes: it neither restyles the terminal nor starts a
    line of its own."""
    path = tmp_path / "events.jsonl"
    hostile = "x\x1b[2J\r\u2028y"
    events = [
        ev(SPAWNED, "t1", {"agent": hostile, "mode": "spawn"}, path=f"/root/{hostile}"),
        done("t1", hostile, Status.ERROR, ms=5),
    ]
    write_log(path, events)
    assert main(["events", "tail", str(path), "--no-follow"]) == 0
    tail_out = capsys.readouterr().out
    assert main(["events", "summary", str(path)]) == 0
    summary_out = capsys.readouterr().out
    for out in (tail_out, summary_out):
        assert not {"\x1b", "\r", "\u2028"} & set(out)
        assert "x\\x1b[2J\\x0d\\u2028y" in out
    assert len(tail_out.splitlines()) == len(events)
