"""Review of ``subagents events timeline``: the page stays valid HTML whatever the log's
task ids are (an id attribute must be non-empty and hold no ASCII whitespace)."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from subagents._event_runs import read_run
from subagents._event_timeline import render_timeline
from subagents._events import COMPLETED, SPAWNED, Event


class Ids(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.ids.extend(value or "" for name, value in attrs if name == "id")


def test_bar_ids_are_valid_html_ids_for_any_task_id() -> None:
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
