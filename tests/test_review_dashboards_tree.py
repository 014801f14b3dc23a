"""Review of ``subagents events tree`` on hostile logs: events out of order, control
characters in names and errors, a circle of sessions under a deep chain, a stdout that is
not UTF-8, and what one task keeps of a huge error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from subagents._cli import main
from subagents._event_runs import TaskRun, _nest, read_run
from subagents._events import COMPLETED, SPAWNED, Event
from subagents._jsonl import parse_event_line

ROOT = Path(__file__).resolve().parent.parent


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


def write_log(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_an_execute_whose_end_is_logged_before_its_spawn_stays_completed() -> None:
    # Two writers (or a copied log) can put the end first; the end is what happened.
    lines = [
        line(
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
        ),
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
            line(
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
            ),
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
