"""Retries of transient runner failures: the only module that imports tenacity."""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
import attrs
import tenacity

from ._errors import ConfigError, TransientError

__all__ = ["RetryPolicy", "run_with_retries"]

T = TypeVar("T")


def _exception_types(
    value: type[BaseException] | tuple[type[BaseException], ...],
) -> tuple[type[Exception], ...]:
    types = value if isinstance(value, tuple) else (value,)
    for t in types:
        # Never retry cancellation or interpreter exits: only Exception subclasses.
        if not (isinstance(t, type) and issubclass(t, Exception)):
            raise ConfigError("retry_on", "Exception subclasses", t)
    return types  # type: ignore[return-value]


@attrs.frozen(kw_only=True)
class RetryPolicy:
    """How an agent's transient failures are retried (exponential backoff with jitter).

    Only exceptions of the ``retry_on`` types are retried (default: :class:`TransientError`).
    Retrying never outlives the watchdog: a backoff that would end past the child's deadline
    is not slept; the last error ends the run instead.
    """

    attempts: int = 3
    """Total tries including the first; must be >= 1."""
    initial: float = 0.1
    """First backoff in seconds."""
    maximum: float = 5.0
    """Upper bound of one backoff in seconds."""
    multiplier: float = 2.0
    """Backoff growth factor per attempt."""
    jitter: float = 0.1
    """Up to this many random seconds are added to each backoff."""
    retry_on: tuple[type[Exception], ...] = attrs.field(
        default=(TransientError,), converter=_exception_types
    )
    """Exception types that count as transient."""

    def __attrs_post_init__(self) -> None:
        if (
            isinstance(self.attempts, bool)
            or not isinstance(self.attempts, int)
            or self.attempts < 1
        ):
            raise ConfigError("attempts", "an integer >= 1", self.attempts)
        for field in ("initial", "maximum", "multiplier", "jitter"):
            value = getattr(self, field)
            if not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
                raise ConfigError(field, "a number >= 0", value)


class _StopAtDeadline(tenacity.stop.stop_base):
    """Stop when the next backoff would reach the watchdog deadline (anyio clock)."""

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        if self.deadline is None:
            return False
        return anyio.current_time() + (retry_state.upcoming_sleep or 0.0) >= self.deadline


class _Backoff(tenacity.wait.wait_base):
    """``min(initial * multiplier**(n-1) + uniform(0, jitter), maximum)`` before retry n.

    Written out rather than ``wait_exponential_jitter(initial=...)``: tenacity 9.2
    deprecated ``initial`` (a DeprecationWarning on every retry, an error under ``-W
    error``) while the ``multiplier`` spelling does not exist in older tenacity.
    """

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        p = self.policy
        try:
            backoff = p.initial * p.multiplier ** (retry_state.attempt_number - 1)
        except OverflowError:
            backoff = p.maximum
        return max(0.0, min(backoff + random.uniform(0, p.jitter), p.maximum))


async def run_with_retries(
    policy: RetryPolicy,
    attempt: Callable[[int], Awaitable[T]],
    *,
    deadline: float | None = None,
) -> T:
    """Call ``attempt(n)`` for n = 1, 2, ... until it succeeds or the policy gives up.

    ``deadline`` is in :func:`anyio.current_time` units; a retry whose backoff would reach
    it is not started. The last exception is re-raised unchanged.
    """

    retrying = tenacity.AsyncRetrying(
        stop=tenacity.stop_after_attempt(policy.attempts) | _StopAtDeadline(deadline),
        wait=_Backoff(policy),
        retry=tenacity.retry_if_exception_type(policy.retry_on),
        sleep=anyio.sleep,
        reraise=True,
    )
    async for trial in retrying:
        with trial:
            return await attempt(trial.retry_state.attempt_number)
    raise AssertionError("unreachable: tenacity either returns or re-raises")  # pragma: no cover
