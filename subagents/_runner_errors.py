"""What a runner's exception makes of its run: the run's error, or an exception that must
go on up (a real cancellation of the task running it, an interrupt of the program).

Shared by the engine (:mod:`._child`, around every runner) and by a pool actor of the Ray
backend, which runs many runners in one task group: both must tell a runner's own
cancellation exception (asyncio code raises one when a task it awaited was cancelled)
from their task's cancellation, and must never let a runner's exception end other runs.
"""

from __future__ import annotations

import asyncio
import math

import anyio

__all__ = ["being_cancelled", "holds_this_cancellation", "interrupts", "runner_error"]


def runner_error(exc: BaseException) -> BaseException | None:
    """What the runner's exception ``exc`` makes of the child: its error (the envelope
    names it), or ``None`` when it must propagate: a real cancellation of this task, or an
    interrupt of the program (it goes on up after the envelope)."""
    if isinstance(exc, Exception):
        return exc
    if isinstance(exc, anyio.get_cancelled_exc_class()):
        if being_cancelled():
            return None  # a real cancellation: the watchdog, a cancel, or from outside
        # Nothing cancelled us: the runner raised a cancellation of its own (on asyncio: it
        # awaited a future someone else cancelled). Its error, not ours to propagate (that
        # would kill this worker and stall the queue).
        error = RuntimeError(f"the runner raised {type(exc).__qualname__} but nothing cancelled it")
        error.__cause__ = exc
        return error
    # Not an Exception: KeyboardInterrupt, SystemExit, GeneratorExit, or one of the
    # runner's own; a group holding this task's cancellation is never swallowed.
    if interrupts(exc) or holds_this_cancellation(exc):
        return None
    return exc  # the runner's error, like any other: the worker goes on


def holds_this_cancellation(exc: BaseException) -> bool:
    """Whether ``exc`` is a group holding a cancellation while this task is being
    cancelled: whatever else it holds, it must propagate."""
    return (
        isinstance(exc, BaseExceptionGroup)
        and exc.subgroup(anyio.get_cancelled_exc_class()) is not None
        and being_cancelled()
    )


def interrupts(exc: BaseException) -> bool:
    """A KeyboardInterrupt or SystemExit, alone or in an exception group: it must go on
    up and stop the program, as README promises."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup((KeyboardInterrupt, SystemExit)) is not None
    return isinstance(exc, (KeyboardInterrupt, SystemExit))


def being_cancelled() -> bool:
    """Whether the current task is being cancelled, so a cancellation the runner raised is
    this task's to propagate rather than the runner's own error.

    anyio's scopes cover the watchdog, ``cancel`` and a host's anyio or trio timeout. On
    asyncio a host may also cancel natively (``task.cancel()``, ``asyncio.timeout``,
    ``wait_for``), which no anyio scope sees: the task's ``cancelling()`` count says so.
    """
    if anyio.current_effective_deadline() == -math.inf:
        return True
    try:
        task = asyncio.current_task()
    except RuntimeError:  # not on asyncio
        return False
    return task is not None and task.cancelling() > 0
