"""``subagents events timeline FILE -o run.html``: one self-contained page per run, checked
as text and in a real headless browser (Debian's ``chromium``, which ``.ci/run`` installs):
one bar per agent with its status class, no network request, a screenshot.

Without ``/usr/bin/chromium`` the browser tests are skipped, except under CI (``CI`` set),
where a missing browser fails them: there they must run.
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest

from subagents._cli import main
from subagents._event_runs import RunLog, TaskRun, read_run
from subagents._event_timeline import CSP, render_timeline
from subagents._events import COMPLETED, SPAWNED, Event
from subagents._jsonl import read_events
from tests import event_logs

pytestmark = pytest.mark.anyio

CHROMIUM = "/usr/bin/chromium"
# Headless as root, and quiet: without the background-networking switches the browser
# itself opens connections (updates, sync) that have nothing to do with the page.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
BROWSER_SECONDS = 120
# The browser tests record their logs on one backend: what they check is the page.
one_backend = pytest.mark.parametrize("anyio_backend", ["asyncio"])


def chromium() -> str:
    """The browser's path; skips the test without it, but not under CI."""
    if os.path.exists(CHROMIUM):
        return CHROMIUM
    if os.environ.get("CI"):
        pytest.fail(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium package")
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium); CI runs this")


def browse(page: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """Open ``page`` in a fresh headless browser profile with ``options``."""
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *options, page.as_uri()],
            capture_output=True,
            text=True,
            timeout=BROWSER_SECONDS,
            check=True,
        )


class Bars(HTMLParser):
    """The bars of a page, as ``(data-path, data-task, class list)``."""

    def __init__(self) -> None:
        super().__init__()
        self.bars: list[tuple[str, str, list[str]]] = []
        self.tags: set[str] = set()
        self.references: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        found = {key: value or "" for key, value in attrs}
        for key in ("src", "href", "srcset", "action", "poster", "data"):
            if key in found:
                self.references.append((tag, key))
        classes = found.get("class", "").split()
        if "bar" in classes:
            self.bars.append((found["data-path"], found["data-task"], classes))


def bars_of(html: str) -> Bars:
    parser = Bars()
    parser.feed(html)
    return parser


async def a_log_with_every_status(tmp_path: Path) -> Path:
    """A run caught going (running, queued) followed by one with failures, in one log."""
    snapshot = tmp_path / "snapshot.jsonl"
    await event_logs.running_log(tmp_path / "whole.jsonl", snapshot)
    failed = await event_logs.failed_log(tmp_path / "failed.jsonl")
    log = tmp_path / "events.jsonl"
    log.write_bytes(snapshot.read_bytes() + failed.read_bytes())
    return log


def expected_statuses(log: Path) -> dict[str, str]:
    """Each task's status, by task id, from the log."""
    return {t.task_id: t.status for t in read_run(read_events(log)).tasks.values()}


async def test_one_bar_per_agent_with_its_status(tmp_path: Path) -> None:
    log = await a_log_with_every_status(tmp_path)
    page = render_timeline(read_run(read_events(log)), title="events.jsonl")
    parsed = bars_of(page)
    statuses = expected_statuses(log)
    assert set(statuses.values()) == {
        "completed",
        "error",
        "timeout",
        "cancelled",
        "running",
        "queued",
    }
    shown = {
        task: [c for c in classes if c.startswith("status-")] for _, task, classes in parsed.bars
    }
    assert shown == {task: [f"status-{status}"] for task, status in statuses.items()}
    assert len(parsed.bars) == len(statuses)
    # The order and nesting of the tree: the lead's child right after it.
    paths = [path for path, _, _ in parsed.bars]
    assert paths[paths.index("/root/lead") + 1] == "/root/lead/held"


async def test_the_page_loads_nothing(tmp_path: Path) -> None:
    log = await a_log_with_every_status(tmp_path)
    page = render_timeline(read_run(read_events(log)), title="events.jsonl")
    parsed = bars_of(page)
    # No address of any kind, nothing that loads: no script, font, image, link, frame.
    assert not re.search(r"(?i)https?:|//[a-z0-9]|url\(|@import|@font-face", page)
    assert parsed.references == []
    assert parsed.tags.isdisjoint({"script", "link", "img", "iframe", "object", "embed", "svg"})
    assert f'<meta http-equiv="Content-Security-Policy" content="{CSP}">' in page
    assert CSP == "default-src 'none'; style-src 'unsafe-inline'"


async def test_the_summary_of_each_envelope_shows_on_hover(tmp_path: Path) -> None:
    log = await event_logs.failed_log(tmp_path / "events.jsonl")
    page = render_timeline(read_run(read_events(log)), title="events.jsonl")
    tip = re.search(r'data-path="/root/broken".*?<div class="tip">(.*?)</div>', page, re.S)
    assert tip is not None
    text = tip.group(1)
    assert "/root/broken" in text
    assert "agent broken · spawn · error" in text
    assert "duration 1.04 s · queue 0 ms" in text
    assert "error: ValueError: disk on fire" in text
    assert ".bar:hover .tip, .bar:target .tip { display: block; }" in page


def test_text_from_the_log_is_escaped() -> None:
    task = TaskRun(
        task_id="t1",
        session_id="root",
        agent_path="/root/x",
        status="error",
        error='<script>alert("x")</script>',
        ended_ms=10,
        duration_ms=10,
    )
    run = RunLog(events=2, tasks={"t1": task}, sessions={"root": [task]}, first_ms=0, last_ms=10)
    page = render_timeline(run, title="<b>log</b>")
    assert "<script>" not in page
    assert "&lt;script&gt;" in page
    assert "<b>log</b>" not in page


def test_a_time_no_calendar_has_is_shown_as_the_number() -> None:
    task = TaskRun(task_id="t1", session_id="root", agent_path="/root/x", spawned_ms=10**17)
    run = RunLog(
        events=1, tasks={"t1": task}, sessions={"root": [task]}, first_ms=10**17, last_ms=10**17
    )
    assert f"from timestamp_ms={10**17}" in render_timeline(run, title="odd.jsonl")


@one_backend
async def test_in_a_browser_one_bar_per_agent_and_no_request(tmp_path: Path) -> None:
    log = await a_log_with_every_status(tmp_path)
    page = tmp_path / "run.html"
    assert main(["events", "timeline", str(log), "-o", str(page)]) == 0
    netlog = tmp_path / "net.json"
    dom = browse(page, f"--log-net-log={netlog}", "--dump-dom").stdout
    # The browser's DOM, after it loaded and applied the page: every bar, its status.
    parsed = bars_of(dom)
    statuses = expected_statuses(log)
    assert len(parsed.bars) == len(statuses)
    for _, task, classes in parsed.bars:
        assert f"status-{statuses[task]}" in classes
    assert page_requests(netlog) == []

    # The check sees a page's requests: one that loads two things shows both.
    leaky = tmp_path / "leaky.html"
    leaky.write_text(
        '<!DOCTYPE html><img src="http://127.0.0.1:9/x.png">'
        '<link rel="stylesheet" href="http://127.0.0.1:9/y.css">',
        encoding="utf-8",
    )
    browse(leaky, f"--log-net-log={netlog}", "--dump-dom")
    assert sorted(page_requests(netlog)) == ["http://127.0.0.1:9/x.png", "http://127.0.0.1:9/y.css"]


def page_requests(netlog: Path) -> list[str]:
    """The URLs a ``file://`` page asked the network for, from Chromium's NetLog: requests
    the browser makes for itself have no page behind them (their isolation key names no
    ``file://`` site)."""
    log = json.loads(netlog.read_text(encoding="utf-8"))
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return [
        str(event["params"]["url"])
        for event in log["events"]
        if event["type"] == start
        and "file://" in str(event.get("params", {}).get("network_isolation_key", ""))
    ]


@one_backend
async def test_in_a_browser_a_screenshot(tmp_path: Path) -> None:
    log = await event_logs.failed_log(tmp_path / "events.jsonl")
    page = tmp_path / "run.html"
    assert main(["events", "timeline", str(log), "-o", str(page)]) == 0
    shot = tmp_path / "run.png"
    browse(page, f"--screenshot={shot}", "--window-size=900,400", "--hide-scrollbars")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (900, 400)
    assert len(data) > 5_000  # bars and text, not a blank page


async def test_the_command_writes_the_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = await event_logs.finished_log(tmp_path / "events.jsonl")
    assert main(["events", "timeline", str(log)]) == 0
    page = tmp_path / "events.html"  # by default, beside the log
    assert capsys.readouterr().out == f"wrote {page} (5 agents)\n"
    assert len(bars_of(page.read_text(encoding="utf-8")).bars) == 5


async def test_the_command_refuses_what_it_cannot_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = await event_logs.finished_log(tmp_path / "events.html")
    assert main(["events", "timeline", str(log)]) == 1
    assert "would overwrite the log" in capsys.readouterr().err
    assert main(["events", "timeline", str(log), "-o", str(tmp_path / "no" / "x.html")]) == 1
    err = capsys.readouterr().err
    assert err == f"subagents events timeline: cannot write {tmp_path / 'no' / 'x.html'}: " + (
        "No such file or directory\n"
    )
    assert main(["events", "timeline", str(tmp_path / "missing.jsonl"), "-o", "x.html"]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_the_readme_screenshot_is_made_by_a_script(tmp_path: Path) -> None:
    shot = tmp_path / "timeline.png"
    script = Path(__file__).parent.parent / "scripts" / "timeline_screenshot.py"
    done = subprocess.run(
        [sys.executable, str(script), "--output", str(shot), "--chromium", chromium()],
        capture_output=True,
        text=True,
        timeout=BROWSER_SECONDS,
        check=True,
    )
    assert done.stdout.startswith("14 agents (")  # the tree README shows beside it
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert 5_000 < shot.stat().st_size < 200_000


def test_the_readme_screenshot_is_small() -> None:
    png = Path(__file__).parent.parent / "docs" / "timeline.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size < 200_000


def test_an_empty_log_names_no_start() -> None:
    run = RunLog(events=0, tasks={}, sessions={}, first_ms=0, last_ms=0)
    page = render_timeline(run, title="empty.jsonl")
    assert "1970" not in page
    assert "no agents" in page


def test_a_bar_is_linked_by_its_task_id_when_that_can_be_an_id() -> None:
    plain = TaskRun(task_id="a1b2-c3", session_id="root", agent_path="/root/x")
    spaced = TaskRun(task_id="a b", session_id="root", agent_path="/root/y")
    run = RunLog(
        events=2,
        tasks={"a1b2-c3": plain, "a b": spaced},
        sessions={"root": [plain, spaced]},
        first_ms=0,
        last_ms=10,
    )
    page = render_timeline(run, title="run.jsonl")
    assert 'id="task-a1b2-c3"' in page
    assert 'id="row-2" data-task="a b"' in page


class Ids(HTMLParser):
    """Every ``id`` attribute of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.ids.extend(value or "" for name, value in attrs if name == "id")


def test_bar_ids_are_valid_html_ids_for_any_task_id() -> None:
    """The page stays valid HTML whatever the log's task ids are: an id attribute must be
    non-empty and hold no ASCII whitespace."""
    events = []
    for seq, task in enumerate(["a b", "a\tb", "a\nb"]):
        events.append(
            Event(
                type=SPAWNED,
                seq=2 * seq,
                timestamp_ms=1000,
                session_id="root",
                task_id=task,
                agent_path=f"/root/x{seq}",
                data={"agent": "x"},
            )
        )
        events.append(
            Event(
                type=COMPLETED,
                seq=2 * seq + 1,
                timestamp_ms=2000,
                session_id="root",
                task_id=task,
                agent_path=f"/root/x{seq}",
                data={"status": "completed", "duration_ms": 1000},
            )
        )
    page = render_timeline(read_run(events), title="events.jsonl")
    parser = Ids()
    parser.feed(page)
    assert len(parser.ids) == 3
    assert len(set(parser.ids)) == 3  # unique
    for value in parser.ids:
        assert value
        assert not re.search(r"[ \t\n\f\r]", value), repr(value)
