"""``subagents batch run``: the tally of a batch, its summary, its exit status, ``--halt``.

Exit status, as GNU parallel's: 0 when every item of the results file completed, else
the number that did not (a malformed input line counts as one), 101 past 100; 2 is a
usage error, 130 a run stopped by Ctrl-C, 143 by SIGTERM (even if a write failed as well;
1 for such a failure otherwise). The count is of the whole
results file, earlier runs' lines included, so ``0`` always means "every id completed".
"""

from __future__ import annotations

import argparse
import math
import re
from typing import Final, TextIO

import attrs

from ._envelope import DelegateResult

__all__ = ["Halt", "Tally", "exit_status", "halt_rule", "print_summary"]

_SHOWN_FAILURES: Final = 5
"""The summary quotes the first failures up to this many."""
_ERROR_CHARS: Final = 200
_FAILED_MAX: Final = 100
"""Past this many failures the exit status is 101."""
EXIT_USAGE: Final = 2


@attrs.frozen
class Halt:
    """``--halt fail=N`` (``percent`` False) or ``fail=N%``."""

    threshold: float
    percent: bool

    def reached(self, failed: int, total: int) -> bool:
        """True once ``failed`` of this run's ``total`` items reach the threshold."""
        if self.percent:
            return failed > 0 and failed * 100 >= self.threshold * total
        return failed >= self.threshold


def halt_rule(text: str) -> Halt:
    """An argparse ``type`` for ``--halt``: ``fail=N`` (N >= 1) or ``fail=N%`` (0 < N <= 100)."""
    match = re.fullmatch(r"fail=(\d+(?:\.\d+)?)(%?)", text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"expected fail=N or fail=N%, got {text!r}")
    value, percent = float(match.group(1)), bool(match.group(2))
    if (percent and not 0 < value <= 100) or (not percent and (value < 1 or value % 1)):
        raise argparse.ArgumentTypeError(
            f"{text!r}: N is a whole number >= 1, or a percentage in (0, 100]"
        )
    return Halt(value, percent)


@attrs.define
class Tally:
    """What the results file holds, and what this run did."""

    total: int = 0
    """Items of the input (well-formed ones)."""
    malformed: int = 0
    by_status: dict[str, int] = attrs.Factory(dict)
    durations: list[int] = attrs.Factory(list)
    input_tokens: int = 0
    output_tokens: int = 0
    failures: list[tuple[str, str]] = attrs.Factory(list)
    """The first ``(id, error)`` of items that did not complete."""
    ran: int = 0
    """Envelopes this run made."""
    failed_here: int = 0
    """Of those, not completed."""

    def add(self, item_id: str, envelope: DelegateResult, *, here: bool) -> None:
        status = envelope.status.value
        self.by_status[status] = self.by_status.get(status, 0) + 1
        self.durations.append(envelope.duration_ms)
        self.input_tokens += envelope.usage.input_tokens
        self.output_tokens += envelope.usage.output_tokens
        failed = status != "completed"
        if failed and len(self.failures) < _SHOWN_FAILURES:
            text = envelope.error or status
            self.failures.append((item_id, text[:_ERROR_CHARS]))
        if here:
            self.ran += 1
            self.failed_here += failed

    @property
    def done(self) -> int:
        return sum(self.by_status.values())

    @property
    def failed(self) -> int:
        return self.done - self.by_status.get("completed", 0)


def exit_status(tally: Tally, *, interrupted: int | None) -> int:
    """The command's exit status (module docstring); ``interrupted``: the signal that
    stopped the run (128 + its number, as a shell reports it: 130 SIGINT, 143 SIGTERM)."""
    if interrupted is not None:
        return 128 + interrupted
    failed = tally.failed + tally.malformed
    return min(failed, _FAILED_MAX + 1)


def _percentile(ordered: list[int], q: float) -> int:
    if not ordered:
        return 0
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def print_summary(tally: Tally, out: TextIO, *, seconds: float, stopped: str | None) -> None:
    """The end-of-run summary, a few lines on ``out``."""
    statuses = ", ".join(f"{n} {status}" for status, n in sorted(tally.by_status.items()))
    missing = tally.total - tally.done
    parts = [f"{tally.done}/{tally.total} done ({statuses or 'none'})"]
    if missing:
        parts.append(f"{missing} not run")
    if tally.malformed:
        parts.append(f"{tally.malformed} malformed input lines")
    print(f"batch: {'; '.join(parts)}; {tally.ran} run in {seconds:.1f} s", file=out)
    ordered = sorted(tally.durations)
    print(
        f"batch: duration p50 {_percentile(ordered, 0.5)} ms, p95 {_percentile(ordered, 0.95)}"
        f" ms; tokens {tally.input_tokens} in, {tally.output_tokens} out",
        file=out,
    )
    for item_id, error in tally.failures:
        print(f"batch: failed {item_id}: {error}", file=out)
    if tally.failed > len(tally.failures):
        print(f"batch: ... and {tally.failed - len(tally.failures)} more failed", file=out)
    if stopped:
        print(f"batch: {stopped}", file=out)
