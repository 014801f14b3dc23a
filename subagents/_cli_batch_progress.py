"""``subagents batch run --progress``: a bar on a terminal, a line every 10 s elsewhere.

Written here rather than taken from ``rich`` (or ``tqdm``): one line of counts redrawn
with a carriage return is all it needs, the batch's own counters are the source (no
iterator to wrap), and the command line stays free of an extra to install.
"""

from __future__ import annotations

import os
import time
from typing import Final, Literal, TextIO

import anyio

__all__ = ["Counters", "Mode", "Progress", "choose_mode", "clock", "render"]

Mode = Literal["auto", "bar", "lines", "none"]
_BAR_EVERY: Final = 0.2
_LINES_EVERY: Final = 10.0
_WIDTH: Final = 24


class Counters:
    """What the progress shows; the run updates it, the progress reads it."""

    def __init__(self, total: int, done_before: int = 0, failed_before: int = 0) -> None:
        self.total = total
        """Items of the batch."""
        self.done = done_before
        """Items with an envelope (earlier runs' included)."""
        self.failed = failed_before
        """Of those, not completed."""
        self.running = 0
        self.started = time.monotonic()
        self._done_before = done_before

    def rate(self) -> float:
        """Items per second this run."""
        elapsed = time.monotonic() - self.started
        return (self.done - self._done_before) / elapsed if elapsed > 0 else 0.0

    def eta(self) -> float | None:
        rate = self.rate()
        return (self.total - self.done) / rate if rate > 0 else None


def choose_mode(mode: Mode, stream: TextIO) -> Literal["bar", "lines", "none"]:
    """``auto``: a bar when ``stream`` is a terminal and ``CI`` is unset, else lines."""
    if mode != "auto":
        return mode
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return "bar" if tty and not os.environ.get("CI") else "lines"


def clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def render(c: Counters, *, bar: bool) -> str:
    share = c.done / c.total if c.total else 1.0
    counts = (
        f"{c.done}/{c.total} failed {c.failed} running {c.running} "
        f"{c.rate():.1f}/s ETA {clock(c.eta())}"
    )
    if not bar:
        return f"batch: {counts}"
    filled = int(share * _WIDTH)
    return f"[{'#' * filled}{'.' * (_WIDTH - filled)}] {share:4.0%} {counts}"


class Progress:
    """Draws ``counters`` on ``stream`` until :meth:`stop`; ``run`` is its task."""

    def __init__(
        self, counters: Counters, mode: Literal["bar", "lines", "none"], stream: TextIO
    ) -> None:
        self.counters = counters
        self.mode = mode
        self._stream = stream
        self._drawn = False

    def draw(self) -> None:
        if self.mode == "none":
            return
        if self.mode == "bar":
            self._stream.write(f"\r{render(self.counters, bar=True)}\x1b[K")
            self._drawn = True
        else:
            self._stream.write(render(self.counters, bar=False) + "\n")
        self._stream.flush()

    async def run(self) -> None:
        """Redraw every 0.2 s (bar) or 10 s (lines) until cancelled."""
        if self.mode == "none":
            return
        every = _BAR_EVERY if self.mode == "bar" else _LINES_EVERY
        while True:
            await anyio.sleep(every)
            self.draw()

    def finish(self) -> None:
        """The last state, and the bar's line ended, before the summary."""
        if self.mode == "bar":
            self.draw()
            self._stream.write("\n")
            self._stream.flush()
