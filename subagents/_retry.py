"""Retries: of transient runner failures (async, under a watchdog), and of a blocking call
in a thread (the store's SQLite transactions). The only module that imports tenacity."""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
import attrs
import tenacity

from ._errors import ConfigError, TransientError
from ._validators import count, number

__all__ = ["RetryPolicy", "call_with_retries", "retry_while", "run_with_retries"]

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
        count("attempts", self.attempts, minimum=1)
        for field in ("initial", "maximum", "multiplier", "jitter"):
            number(field, getattr(self, field))


def _backoff(policy: RetryPolicy) -> Callable[[tenacity.RetryCallState], float]:
    """Exponential backoff with additive jitter, capped at ``policy.maximum``.

    Written out rather than using ``tenacity.wait_exponential_jitter``, whose ``initial``
    argument is deprecated in tenacity 9 (a DeprecationWarning on every run) while its
    replacement ``multiplier`` does not exist in tenacity 8.
    """

    def wait(retry_state: tenacity.RetryCallState) -> float:
        try:
            # As floats: an integer product past a float's range would overflow below.
            growth = float(policy.multiplier) ** (retry_state.attempt_number - 1)
            delay = float(policy.initial) * growth
        except OverflowError:
            delay = policy.maximum
        return min(delay + random.uniform(0, policy.jitter), policy.maximum)

    return wait


class _StopAtDeadline(tenacity.stop.stop_base):
    """Stop when the next backoff would reach the watchdog deadline (anyio clock)."""

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        if self.deadline is None:
            return False
        return anyio.current_time() + (retry_state.upcoming_sleep or 0.0) >= self.deadline


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
        wait=_backoff(policy),
        retry=tenacity.retry_if_exception_type(policy.retry_on),
        sleep=anyio.sleep,
        reraise=True,
    )
    async for trial in retrying:
        with trial:
            return await attempt(trial.retry_state.attempt_number)
    raise AssertionError("unreachable: tenacity either returns or re-raises")  # pragma: no cover


def call_with_retries(
    fn: Callable[[], T],
    *,
    retry_if: Callable[[BaseException], bool],
    timeout: float,
    first_wait: float = 0.001,
    max_wait: float = 0.05,
) -> T:
    """Call ``fn()`` until it returns, retrying the exceptions ``retry_if`` accepts.

    Blocking: the backoff between tries (random exponential, from ``first_wait`` up to
    ``max_wait`` seconds) sleeps the calling thread, so this is for worker threads, or for a
    call whose retries are rare and short. Retries stop ``timeout`` seconds after the first
    failure; then, as for an exception ``retry_if`` rejects, the last exception is re-raised
    unchanged. The first try runs outside tenacity's machinery (its setup costs more than a
    short call), so a call that succeeds at once costs nothing extra.
    """
    try:
        return fn()
    except Exception as exc:
        if not retry_if(exc):
            raise
    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_delay(timeout),
        wait=tenacity.wait_random_exponential(multiplier=first_wait, max=max_wait),
        retry=tenacity.retry_if_exception(retry_if),
        sleep=time.sleep,
        reraise=True,
    )
    return retrying(fn)


async def retry_while(
    fn: Callable[[], Awaitable[T]],
    *,
    retry_if: Callable[[BaseException], bool],
    first_wait: float = 0.01,
    max_wait: float = 1.0,
) -> T:
    """Await ``fn()`` until it returns, retrying the exceptions ``retry_if`` accepts, with
    random exponential backoff (``first_wait`` up to ``max_wait`` seconds, slept with
    anyio). No limit of its own: the caller's cancel scope ends it; any other exception
    (cancellation included) is re-raised unchanged."""
    retrying = tenacity.AsyncRetrying(
        stop=tenacity.stop_never,
        wait=tenacity.wait_random_exponential(multiplier=first_wait, max=max_wait),
        retry=tenacity.retry_if_exception(retry_if),
        sleep=anyio.sleep,
        reraise=True,
    )
    async for trial in retrying:
        with trial:
            return await fn()
    raise AssertionError("unreachable: tenacity either returns or re-raises")  # pragma: no cover
