"""``subagents events tree FILE``: the delegation tree of recorded runs, compared with the
text expected of it (finished, failed, still running, 500 agents, deeper than the nesting),
and hostile logs: events out of order, control characters in names and errors, a circle of
sessions under a deep chain, a stdout that is not UTF-8, a huge error.

The logs are written by real managers (``tests/event_logs.py``), their clocks then replaced
from a table so the durations are the same on every run.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from subagents._cli import main
from subagents._event_runs import TaskRun, _nest, read_run
from subagents._event_tree import format_duration, render_tree
from subagents._events import COMPLETED, SPAWNED, Event
from subagents._jsonl import parse_event_line, read_events
from tests import event_logs

pytestmark = pytest.mark.anyio

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parent.parent
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def tree(path: Path, capsys: pytest.CaptureFixture[str], *options: str) -> str:
    assert main(["events", "tree", str(path), *options]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return out


FINISHED = """\
5 agents (5 completed) · tokens in 460 / out 152 · 1.04 s

session root
├── planner           ✓ completed   1.04 s  queue    0 ms  tokens 300/120
│   ├── researcher    ✓ completed   537 ms  queue    0 ms  tokens 40/8
│   ├── researcher-2  ✓ completed   624 ms  queue   50 ms  tokens 40/8
│   └── writer        ✓ completed   537 ms  queue    0 ms  tokens 40/8
└── reviewer          ✓ completed   1.04 s  queue    0 ms  tokens 40/8
"""


async def test_a_finished_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = await event_logs.finished_log(tmp_path / "events.jsonl")
    assert tree(log, capsys) == FINISHED


FAILED = """\
5 agents (1 completed, 2 error, 1 timeout, 1 cancelled) · tokens in 10 / out 2 · 1.13 s

session root
├── broken      ✗ error       1.04 s  queue    0 ms  tokens 0/0  ValueError: disk on fire
├── stuck       ✗ timeout     1.04 s  queue    0 ms  tokens 0/0  watchdog: no result within 0.01 s
├── stuck-2     - cancelled   1.12 s  queue   50 ms  tokens 0/0  cancelled: cancelled by request
└── careless    ✓ completed   1.04 s  queue    0 ms  tokens 10/2
    └── broken  ✗ error       537 ms  queue    0 ms  tokens 0/0  ValueError: disk on fire
"""


async def test_a_run_with_failures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = await event_logs.failed_log(tmp_path / "events.jsonl")
    assert tree(log, capsys) == FAILED


async def test_failures_are_coloured_only_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = await event_logs.failed_log(tmp_path / "events.jsonl")
    coloured = tree(log, capsys, "--color=always")
    assert ANSI.sub("", coloured) == FAILED
    line = next(line for line in coloured.splitlines() if "ValueError" in line)
    assert "\x1b[1;31m✗ error" in line  # the status, bold red
    assert "\x1b[31mValueError: disk on fire\x1b[0m" in line
    assert "\x1b[32m✓ completed" in coloured
    assert "\x1b[33m- cancelled" in coloured
    # Not a terminal (captured): plain, unless asked.
    assert tree(log, capsys) == tree(log, capsys, "--color=never") == FAILED


RUNNING = """\
5 agents (1 completed, 3 running, 1 queued) · tokens in 110 / out 17 · 1.04 s so far \
(unfinished agents are timed to the log's last event)

session root
├── reviewer    ✓ completed   1.04 s  queue    0 ms  tokens 40/8
├── held        … running     1.04 s  queue    0 ms  tokens 0/0
├── lead        … running     1.04 s  queue    0 ms  tokens 70/9
│   └── held    … running     937 ms  queue    0 ms  tokens 0/0
└── reviewer-2  · queued      1.03 s  queue  1.03 s  tokens 0/0
"""

RUNNING_DONE = """\
5 agents (5 completed) · tokens in 180 / out 30 · 1.13 s

session root
├── reviewer    ✓ completed   1.04 s  queue    0 ms  tokens 40/8
├── held        ✓ completed   1.04 s  queue    0 ms  tokens 5/1
├── lead        ✓ completed   1.04 s  queue    0 ms  tokens 90/12
│   └── held    ✓ completed   537 ms  queue    0 ms  tokens 5/1
└── reviewer-2  ✓ completed   1.12 s  queue   50 ms  tokens 40/8
"""


async def test_a_run_still_going(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    snapshot = tmp_path / "snapshot.jsonl"
    log = await event_logs.running_log(tmp_path / "events.jsonl", snapshot)
    assert tree(snapshot, capsys) == RUNNING
    # A line being written as the tree reads the log is left out, without a warning.
    with snapshot.open("ab") as file:
        file.write(b'{"type": "subagent.completed", "seq": 99, "timest')
    with caplog.at_level(logging.WARNING, logger="subagents.events"):
        assert tree(snapshot, capsys) == RUNNING
    assert caplog.records == []
    assert tree(log, capsys) == RUNNING_DONE


async def test_five_hundred_agents(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = await event_logs.big_log(tmp_path / "events.jsonl")
    out = tree(log, capsys)
    expected = (DATA / "events_tree_500.txt").read_text(encoding="utf-8")
    assert out == expected
    lines = out.splitlines()
    assert len(lines) == 3 + 500  # the headline, a blank line, the session, one per agent
    assert sum("✗ error" in line for line in lines) == 5


DEEP = """\
7 agents (7 completed) · tokens in 28 / out 28 · 800 ms

session root
└── d1                        ✓ completed   800 ms  queue    0 ms  tokens 1/1
    └── d2                    ✓ completed   700 ms  queue    0 ms  tokens 2/2
        └── d3                ✓ completed   600 ms  queue    0 ms  tokens 3/3
            └── d4            ✓ completed   500 ms  queue    0 ms  tokens 4/4
                ├── d5        ✓ completed   400 ms  queue    0 ms  tokens 5/5
                ├── d5>d6     ✓ completed   300 ms  queue    0 ms  tokens 6/6
                └── d5>d6>d7  ✓ completed   200 ms  queue    0 ms  tokens 7/7
"""


async def test_deep_paths_become_breadcrumbs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Below four levels the tree stops indenting: the seed's parent>child breadcrumb.
    log = await event_logs.deep_log(tmp_path / "events.jsonl")
    assert tree(log, capsys) == DEEP


async def test_a_log_that_begins_mid_run(tmp_path: Path) -> None:
    # Its first lines lost (a tail started late): a task whose parent the log never names
    # hangs from its session, under its whole path; one known only by its end is timed
    # from its envelope.
    log = await event_logs.deep_log(tmp_path / "events.jsonl")
    events = list(read_events(log))
    d4 = next(e for e in events if e.agent_path.endswith("/d4"))
    late = [e for e in events if e.seq > d4.seq or e.type == "subagent.completed"]
    late = [e for e in late if not e.agent_path.endswith(("/d1", "/d2", "/d3"))]
    lines = render_tree(read_run(late)).splitlines()
    assert lines[2] == f"session {d4.session_id}"
    assert lines[3].startswith("└── d1>d2>d3>d4  ")
    assert "500 ms" in lines[3]


def test_an_empty_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    assert tree(empty, capsys) == f"no agents in {empty}\n"


def test_an_unreadable_log_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["events", "tree", str(tmp_path / "missing.jsonl")]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"subagents events tree: cannot read {tmp_path / 'missing.jsonl'}: " + (
        "No such file or directory\n"
    )


class _Once:
    """An iterable that can be read once: the run is built in one pass."""

    def __init__(self, events: list[Event]) -> None:
        self.events = events
        self.reads = 0

    def __iter__(self) -> Iterator[Event]:
        self.reads += 1
        assert self.reads == 1, "read a second time"
        return iter(self.events)


async def test_the_log_is_read_once(tmp_path: Path) -> None:
    log = await event_logs.big_log(tmp_path / "events.jsonl")
    events: Iterable[Event] = _Once(list(read_events(log)))
    run = read_run(events)
    assert len(run.tasks) == 500
    assert [t.agent_path for t in run.walk()][:3] == [
        "/root/lead",
        "/root/lead/team",
        "/root/lead/team/leaf",
    ]


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0 ms"),
        (999, "999 ms"),
        (1000, "1.00 s"),
        (59_994, "59.99 s"),
        (59_995, "1m00s"),
        (59_999, "1m00s"),
        (125_000, "2m05s"),
    ],
)
def test_durations_read_at_a_glance(ms: int, text: str) -> None:
    assert format_duration(ms) == text


def test_hours() -> None:
    assert format_duration(3_720_000) == "1h02m"


def spawned(task: str, session: str, path: str) -> Event:
    return Event(
        type=SPAWNED,
        seq=0,
        timestamp_ms=1000,
        session_id=session,
        task_id=task,
        agent_path=path,
        data={"agent": path.rsplit("/", 1)[-1]},
    )


def test_a_circle_is_cut_once_and_what_hangs_below_it_stays_nested() -> None:
    # x and y name each other as their sessions; z is x's child, w is z's.
    run = read_run(
        [
            spawned("x", "y", "/root/x"),
            spawned("y", "x", "/root/y"),
            spawned("z", "x", "/root/x/z"),
            spawned("w", "z", "/root/x/z/w"),
        ]
    )
    tops = [task.task_id for tasks in run.sessions.values() for task in tasks]
    assert tops == ["x"]  # the circle's member named first
    assert [t.task_id for t in run.tasks["x"].children] == ["y", "z"]
    assert [t.task_id for t in run.tasks["z"].children] == ["w"]
    assert sorted(t.task_id for t in run.walk()) == ["w", "x", "y", "z"]


def test_a_tree_deeper_than_the_recursion_limit_has_a_repr_and_compares() -> None:
    events = [spawned("t0", "root", "/root/a")]
    events += [spawned(f"t{i}", f"t{i - 1}", f"/root/a{i}") for i in range(1, 5000)]
    first = read_run(events).tasks["t0"]
    assert "t0" in repr(first)
    assert first == read_run(events).tasks["t0"]
    assert first != TaskRun(task_id="t1", session_id="root", agent_path="/root/a")


def test_a_file_that_is_no_log_warns_a_few_times(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    junk = tmp_path / "picture.png"
    junk.write_bytes(b"\x89PNG not json\n" * 1000)
    with caplog.at_level(logging.WARNING, logger="subagents.events"):
        assert list(read_events(junk)) == []
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 6, messages
    assert messages[-1].endswith("skipped 995 more malformed lines")


def test_a_failure_whose_status_holds_control_characters_prints_them_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "events.jsonl"
    end = Event(
        type=COMPLETED,
        seq=1,
        timestamp_ms=2000,
        session_id="root",
        task_id="t1",
        agent_path="/root/a",
        data={"status": "odd\x1b[2J", "error_type": "Bad\x07Type", "duration_ms": 5},
    )
    log.write_bytes(end.to_json() + b"\n")
    out = tree(log, capsys, "--color=never")
    assert "\x1b" not in out
    assert "\x07" not in out
    assert "odd\\x1b[2J" in out
    assert "Bad\\x07Type" in out


def line(type_: str, seq: int, ts: int, session: str, task: str, path: str, **data: Any) -> str:
    event = {
        "type": type_,
        "seq": seq,
        "timestamp_ms": ts,
        "session_id": session,
        "task_id": task,
        "agent_path": path,
        "data": data,
    }
    return orjson.dumps(event).decode()


A_COMPLETED = line(
    COMPLETED,
    2,
    2000,
    "root",
    "t1",
    "/root/a",
    status="completed",
    agent="a",
    duration_ms=1000,
    timestamp_ms=2000,
)
"""The log line of ``t1`` (``/root/a``) completed at 2,000 ms, after 1,000 ms."""


def write_log(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_an_execute_whose_end_is_logged_before_its_spawn_stays_completed() -> None:
    # Two writers (or a copied log) can put the end first; the end is what happened.
    lines = [
        A_COMPLETED,
        line(SPAWNED, 1, 1000, "root", "t1", "/root/a", agent="a", mode="execute"),
    ]
    run = read_run(parse_event_line(text) for text in lines)
    assert run.tasks["t1"].status == "completed"


def test_tree_lines_carry_no_terminal_control_characters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A log is any file: a name or error must not clear the screen, retitle the terminal
    # or start a line that looks like another agent's.
    log = write_log(
        tmp_path / "events.jsonl",
        [
            line(
                SPAWNED,
                1,
                1000,
                "root\x1b]0;pwned\x07",
                "t1",
                "/root/a\x1b[2J\nFAKE  ✓ completed",
                agent="a",
                mode="spawn",
            ),
            line(
                COMPLETED,
                2,
                2000,
                "root",
                "t1",
                "/root/a",
                status="error",
                agent="a",
                duration_ms=1000,
                error="boom \x1b[2J\x1b]0;title\x07",
                error_type="X",
                timestamp_ms=2000,
            ),
        ],
    )
    assert main(["events", "tree", str(log), "--color=never"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert "\x07" not in out
    # headline, blank, session line, one agent line
    assert len(out.splitlines()) == 4, out


class CountingTasks(dict[str, TaskRun]):
    """Counts every lookup the nesting makes."""

    lookups = 0

    def __contains__(self, key: object) -> bool:
        CountingTasks.lookups += 1
        return super().__contains__(key)

    def __getitem__(self, key: str) -> TaskRun:
        CountingTasks.lookups += 1
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        CountingTasks.lookups += 1
        return super().get(key, default)


def test_nesting_a_deep_chain_beside_a_circle_is_linear() -> None:
    # One circle of two sessions anywhere in a log must not make the walk up every task's
    # ancestors: a 3,000-deep chain would cost ~4.5 million lookups.
    n = 3000
    tasks = CountingTasks()
    previous = "root"
    for i in range(n):
        tasks[f"t{i}"] = TaskRun(task_id=f"t{i}", session_id=previous, agent_path=f"/root/a{i}")
        previous = f"t{i}"
    tasks["x"] = TaskRun(task_id="x", session_id="y", agent_path="/root/x")
    tasks["y"] = TaskRun(task_id="y", session_id="x", agent_path="/root/y")
    CountingTasks.lookups = 0
    sessions = _nest(tasks)
    assert sum(len(tops) for tops in sessions.values()) >= 2
    assert CountingTasks.lookups <= 20 * len(tasks), CountingTasks.lookups


def test_tree_on_a_stdout_that_is_not_utf8_prints_no_traceback(tmp_path: Path) -> None:
    # `subagents events tree run.jsonl > tree.txt` on a Windows console code page, or with
    # PYTHONIOENCODING set: the marks and box lines are not encodable there.
    log = write_log(
        tmp_path / "events.jsonl",
        [
            line(SPAWNED, 1, 1000, "root", "t1", "/root/a", agent="a", mode="spawn"),
            A_COMPLETED,
        ],
    )
    env = dict(os.environ, PYTHONIOENCODING="cp1252", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "subagents", "events", "tree", str(log)],
        capture_output=True,
        env=env,
        timeout=60,
    )
    stderr = done.stderr.decode(errors="replace")
    assert "Traceback" not in stderr, stderr
    assert len(stderr.splitlines()) <= 1, stderr


def test_a_task_keeps_a_bounded_error() -> None:
    # read_run promises memory in the number of tasks; the output is cut to a summary's
    # length, and the error (shown cut to a line) must be too.
    error = "E" * 1_000_000
    events = [
        Event(
            type=COMPLETED,
            seq=1,
            timestamp_ms=2000,
            session_id="root",
            task_id="t1",
            agent_path="/root/a",
            data={"status": "error", "error": error, "duration_ms": 5},
        ),
    ]
    run = read_run(events)
    assert len(run.tasks["t1"].error) <= 10_000
