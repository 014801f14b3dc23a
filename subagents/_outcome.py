"""The envelope of a child's outcome: what its runner returned, raised or reported, the
watchdog's verdict or the cancellation, made into one :class:`DelegateResult`."""

from __future__ import annotations

import logging
import traceback
from time import perf_counter
from typing import Final

from ._envelope import (
    DelegateResult,
    Status,
    Usage,
    bound_text,
    clean_text,
    cut_middle,
    describe_exception,
    now_ms,
    trusted_envelope,
)
from ._ledger import budget_outcome, tree_usage
from ._progress import cap_files, cap_output
from ._record import ChildRecord
from ._spec import Result

__all__ = ["MAX_PATH_CHARS", "TRACEBACK_CHARS", "envelope_for"]

MAX_PATH_CHARS: Final = 4096  # characters kept of one path (PATH_MAX on Linux)
ERROR_CHARS: Final = 500  # an envelope's error text, as describe_exception bounds it
TRACEBACK_CHARS: Final = 20_000  # a completed event's traceback: its start and its end
logger = logging.getLogger("subagents")


def envelope_for(
    record: ChildRecord,
    status: Status,
    attempt: int = 1,
    *,
    result: Result | str | None = None,
    error: BaseException | None = None,
    keep_traceback: bool = False,
) -> DelegateResult:
    """The envelope of ``record``'s outcome; never raises. If what the runner left (its
    result, its exception, its reports) cannot be made into one, the child still gets an
    ``error`` envelope saying so, rather than none. With ``keep_traceback`` an error's
    traceback is kept on the record for the completed event."""
    try:
        return _envelope(record, status, attempt, result, error, keep_traceback)
    except Exception as exc:
        logger.exception("building the envelope of task %s failed", record.task_id)
        return trusted_envelope(
            record.spec.name,
            record.task_id,
            Status.ERROR,
            "",
            (),
            f"the outcome of this run could not be recorded ({type(exc).__name__})",
            "EnvelopeError",
            int((perf_counter() - record.spawned_at) * 1000),
            0,
            0,
            1,
            Usage(),
            now_ms(),
            record.agent_path,
            record.parent_path,
            Usage(),
        )


def _from_result(result: Result) -> tuple[Status, str, str]:
    """The status, error text and error type a runner's :class:`Result` reports."""
    if result.error or result.status is Status.ERROR:
        message = bound_text(result.error or "the runner reported an error", ERROR_CHARS)
        return Status.ERROR, message, "RunnerReportedError"
    if result.status is not None and result.status is not Status.COMPLETED:
        return (
            result.status,
            f"the runner reported status {result.status.value}",
            (result.status.value),
        )
    return Status.COMPLETED, "", ""


def _problem(
    record: ChildRecord, status: Status, error: BaseException | None, keep_traceback: bool
) -> tuple[str, str]:
    """The error text and type of an outcome that is not a runner's result."""
    if status is Status.ERROR and error is not None:
        error_type, message = describe_exception(error)
        if not isinstance(error, Exception):  # KeyboardInterrupt and the like
            message = bound_text(f"the runner raised {message}", ERROR_CHARS)
        if keep_traceback:
            text = clean_text("".join(traceback.format_exception(error)))
            # The end names the error, the start where it began: the middle goes.
            if len(text) > TRACEBACK_CHARS:
                text = cut_middle(text, TRACEBACK_CHARS)
            record.traceback = text
        return message, error_type
    if status is Status.TIMEOUT:
        return f"watchdog: no result within {record.timeout:g} s", "timeout"
    if status is Status.CANCELLED:
        reason = record.cancel_reason
        return (f"cancelled: {reason}" if reason else "cancelled"), "cancelled"
    return "", ""


def _envelope(
    record: ChildRecord,
    status: Status,
    attempt: int,
    result: Result | str | None,
    error: BaseException | None,
    keep_traceback: bool,
) -> DelegateResult:
    end = perf_counter()
    started = record.started_at
    progress = record.progress
    output = "" if progress is None else progress.output()
    usage = record.usage
    iterations = record.iterations
    extra_files: tuple[str, ...] = ()
    if status is Status.COMPLETED and isinstance(result, str):
        message = error_type = ""
        output = result  # a runner's plain text: the rest is what it reported
    elif status is Status.COMPLETED and isinstance(result, Result):
        output = result.output
        usage = result.usage if result.usage else usage
        iterations = result.iterations or iterations
        extra_files = result.files_changed
        status, message, error_type = _from_result(result)
    else:
        message, error_type = _problem(record, status, error, keep_traceback)
    stopped = None if record.account is None else budget_outcome(record, status)
    if stopped is not None:  # a budget that stopped it names itself
        status, message, error_type = stopped
    # trusted_envelope makes output, error and paths JSON-safe (clean_text).
    files = cap_files(extra_files) if progress is None else progress.files(extra_files)
    if files:
        files = tuple(bound_text(f, MAX_PATH_CHARS) for f in files)
    return trusted_envelope(
        record.spec.name,
        record.task_id,
        status,
        cap_output(output),
        files,
        message,
        error_type,
        int((end - record.spawned_at) * 1000),
        # never started (cancelled in the queue): all of its time was queue wait
        int(((end if started is None else started) - record.spawned_at) * 1000),
        iterations,
        attempt,
        usage,
        now_ms(),
        record.agent_path,
        record.parent_path,
        tree_usage(record, usage),
    )
