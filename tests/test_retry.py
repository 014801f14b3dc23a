"""RetryPolicy: transient failures are retried, attempts counted, never past the watchdog."""

from __future__ import annotations

import anyio
import pytest
from trio.testing import MockClock

from subagents import (
    ConfigError,
    Request,
    RetryPolicy,
    RunContext,
    Status,
    TransientError,
)
from subagents._retry import run_with_retries
from tests.helpers import clock_backends, manager_with, spec

FAST = RetryPolicy(attempts=3, initial=0.001, maximum=0.002, jitter=0)


def mock_trio() -> list[object]:
    """Trio only, with a clock that jumps whenever every task is blocked (no wall time)."""
    return [pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}), id="trio-mock")]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"attempts": 0},
        {"attempts": True},
        {"initial": -1},
        {"maximum": float("nan")},
        {"retry_on": (KeyboardInterrupt,)},
        {"retry_on": ("TransientError",)},
    ],
)
def test_bad_policy_is_a_config_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_default_policy_retries_transient_error() -> None:
    policy = RetryPolicy()
    assert policy.retry_on == (TransientError,)
    assert policy.attempts >= 2


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_transient_failures_are_retried_and_counted() -> None:
    attempts_seen: list[int] = []

    async def flaky(request: Request, ctx: RunContext) -> str:
        attempts_seen.append(ctx.attempt)
        if ctx.attempt < 3:
            raise TransientError("rate limited")
        return "finally"

    async with manager_with(spec("w", flaky, retry=FAST)) as manager:
        env = await manager.spawn("w").wait()
    assert env.status is Status.COMPLETED
    assert env.output == "finally"
    assert env.attempts == 3
    assert env.to_dict()["attempts"] == 3
    assert attempts_seen == [1, 2, 3]
    assert "3 attempts" in env.truncated()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_exhausted_retries_end_in_the_last_error() -> None:
    async def always(request: Request, ctx: RunContext) -> str:
        raise TransientError(f"try {ctx.attempt}")

    async with manager_with(spec("w", always, retry=FAST)) as manager:
        env = await manager.spawn("w").wait()
    assert env.status is Status.ERROR
    assert env.attempts == 3
    assert "try 3" in env.error


@pytest.mark.anyio
async def test_other_errors_and_no_policy_are_not_retried() -> None:
    calls: list[str] = []

    async def fails(request: Request, ctx: RunContext) -> str:
        calls.append(request.agent)
        if request.agent == "plain":
            raise ValueError("not transient")
        raise TransientError("transient but no policy")

    async with manager_with(spec("plain", fails, retry=FAST), spec("nopolicy", fails)) as manager:
        a = await manager.spawn("plain").wait()
        b = await manager.spawn("nopolicy").wait()
    assert (a.status, a.attempts) == (Status.ERROR, 1)
    assert (b.status, b.attempts) == (Status.ERROR, 1)
    assert calls == ["plain", "nopolicy"]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_custom_retry_on_types() -> None:
    async def flaky(request: Request, ctx: RunContext) -> str:
        if ctx.attempt == 1:
            raise ConnectionError("reset")
        return "ok"

    policy = RetryPolicy(attempts=2, initial=0.001, jitter=0, retry_on=ConnectionError)
    async with manager_with(spec("w", flaky, retry=policy)) as manager:
        env = await manager.spawn("w").wait()
    assert (env.status, env.attempts) == (Status.COMPLETED, 2)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", mock_trio())
async def test_backoff_that_would_pass_the_watchdog_is_not_slept() -> None:
    starts: list[float] = []

    async def always(request: Request, ctx: RunContext) -> str:
        starts.append(anyio.current_time())
        raise TransientError("down")

    policy = RetryPolicy(attempts=10, initial=10, maximum=10, multiplier=1, jitter=0)
    async with manager_with(spec("w", always, retry=policy)) as manager:
        begin = anyio.current_time()
        env = await manager.spawn("w", timeout=25).wait()
        end = anyio.current_time()
    # tries at 0, 10, 20; a fourth would start at 30, past the 25 s watchdog
    assert [round(t - begin) for t in starts] == [0, 10, 20]
    assert env.status is Status.ERROR
    assert env.attempts == 3
    assert end - begin < 25


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", mock_trio())
async def test_watchdog_cuts_a_retrying_run() -> None:
    async def slow_then_fail(request: Request, ctx: RunContext) -> str:
        ctx.report(output=f"attempt {ctx.attempt}")
        await anyio.sleep(8)
        raise TransientError("down")

    policy = RetryPolicy(attempts=10, initial=1, maximum=1, multiplier=1, jitter=0)
    async with manager_with(spec("w", slow_then_fail, retry=policy)) as manager:
        begin = anyio.current_time()
        env = await manager.spawn("w", timeout=20).wait()
        end = anyio.current_time()
    # 0-8 fail, 9-17 fail, 18-20 cut by the watchdog
    assert env.status is Status.TIMEOUT
    assert env.attempts == 3
    assert env.output == "attempt 3"
    assert end - begin == pytest.approx(20, abs=0.01)


@pytest.mark.anyio
async def test_run_with_retries_respects_the_deadline_directly() -> None:
    calls = 0

    async def attempt(n: int) -> str:
        nonlocal calls
        calls += 1
        raise TransientError(str(n))

    policy = RetryPolicy(attempts=5, initial=5, jitter=0)
    with pytest.raises(TransientError, match="1"):
        await run_with_retries(policy, attempt, deadline=anyio.current_time() + 1)
    assert calls == 1
