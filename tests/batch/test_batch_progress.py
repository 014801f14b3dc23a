"""``subagents batch run --progress``: which display, and what it shows."""

from __future__ import annotations

import io

import pytest

from subagents._cli_batch_progress import Counters, Progress, choose_mode, clock, render


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_auto_draws_a_bar_on_a_terminal_unless_ci_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    assert choose_mode("auto", _Terminal()) == "bar"
    assert choose_mode("auto", io.StringIO()) == "lines"
    monkeypatch.setenv("CI", "true")
    assert choose_mode("auto", _Terminal()) == "lines"
    assert choose_mode("none", _Terminal()) == "none"


def test_the_bar_shows_done_total_failed_running_rate_and_eta() -> None:
    counters = Counters(200, done_before=50, failed_before=2)
    counters.running = 3
    line = render(counters, bar=True)
    assert line.startswith("[######")
    assert "50/200 failed 2 running 3" in line
    assert "ETA ?" in line, "no rate yet this run: no ETA"
    assert clock(61.5) == "1m01s"
    assert clock(3 * 3600 + 120) == "3h02m"


def test_a_bar_is_redrawn_in_place_and_ended_before_the_summary() -> None:
    stream = _Terminal()
    progress = Progress(Counters(4), "bar", stream)
    progress.draw()
    progress.finish()
    text = stream.getvalue()
    assert text.count("\r") == 2
    assert text.endswith("\n")
    quiet = io.StringIO()
    Progress(Counters(4), "none", quiet).finish()
    assert quiet.getvalue() == ""
