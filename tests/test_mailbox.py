"""Mailbox: put/peek/drain, capacity, TTL, wait without a race, subscriptions, drop."""

from __future__ import annotations

import logging
import random

import anyio
import pytest

from subagents import ConfigError, DelegateResult, Mailbox, MailboxFull, Status
from tests.helpers import clock_backends, on_mock_clock


def env(task_id: str, output: str = "") -> DelegateResult:
    return DelegateResult(
        agent="worker",
        task_id=task_id,
        status=Status.COMPLETED,
        output=output or task_id,
        timestamp_ms=1,
    )


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# ---------------------------------------------------------------- basic operations


def test_put_peek_drain_len() -> None:
    box = Mailbox()
    assert len(box) == 0
    assert box.put("a", env("a")) is True
    assert len(box) == 1
    assert box.peek("a") == env("a")
    assert box.peek("a") == env("a")  # peek never consumes
    assert len(box) == 1
    assert box.drain("a") == env("a")
    assert box.drain("a") is None
    assert box.peek("a") is None
    assert len(box) == 0
    assert box.peek("missing") is None
    assert box.drain("missing") is None


def test_drain_all_is_arrival_order() -> None:
    box = Mailbox()
    for key in ["c", "a", "b", "z", "m"]:
        box.put(key, env(key))
    assert [e.task_id for e in box.drain_all()] == ["c", "a", "b", "z", "m"]
    assert len(box) == 0
    assert box.drain_all() == []


def test_overwrite_does_not_grow_and_counts_as_newest() -> None:
    box = Mailbox(capacity=2)
    box.put("a", env("a", "first"))
    box.put("b", env("b"))
    box.put("a", env("a", "second"))  # full, but an existing key: allowed
    assert len(box) == 2
    assert box.peek("a") == env("a", "second")
    assert [e.output for e in box.drain_all()] == ["b", "second"]


def test_full_raises_and_keeps_old_entries() -> None:
    box = Mailbox(capacity=3)
    for key in "abc":
        box.put(key, env(key))
    with pytest.raises(MailboxFull) as info:
        box.put("d", env("d"))
    assert info.value.capacity == 3
    assert info.value.task_id == "d"
    assert len(box) == 3
    assert box.peek("d") is None
    assert [e.task_id for e in box.drain_all()] == ["a", "b", "c"]
    box.put("d", env("d"))  # room again after reading


def test_default_capacity_is_64() -> None:
    box = Mailbox()
    assert box.capacity == 64
    for i in range(64):
        box.put(str(i), env(str(i)))
    with pytest.raises(MailboxFull):
        box.put("64", env("64"))


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3"])
def test_a_bad_capacity_is_a_config_error(bad: object) -> None:
    with pytest.raises(ConfigError):
        Mailbox(capacity=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), "1"])
def test_a_bad_ttl_is_a_config_error(bad: object) -> None:
    with pytest.raises(ConfigError):
        Mailbox(ttl=bad)  # type: ignore[arg-type]


def test_ttl_entries_expire_lazily_and_free_capacity() -> None:
    clock = FakeClock()
    box = Mailbox(capacity=2, ttl=10.0, clock=clock)
    box.put("a", env("a"))
    clock.now += 5
    box.put("b", env("b"))
    clock.now += 5  # "a" expires exactly now
    assert box.peek("a") is None
    assert len(box) == 1
    box.put("c", env("c"))  # "a" does not count toward the cap
    assert [e.task_id for e in box.drain_all()] == ["b", "c"]
    box.put("d", env("d"))
    clock.now += 100
    assert box.drain("d") is None
    assert box.drain_all() == []
    assert len(box) == 0


def test_ttl_expired_entries_do_not_block_new_keys_when_full() -> None:
    clock = FakeClock()
    box = Mailbox(capacity=1, ttl=1.0, clock=clock)
    box.put("a", env("a"))
    with pytest.raises(MailboxFull):
        box.put("b", env("b"))
    clock.now += 1.5
    assert box.put("b", env("b"))
    assert box.statistics().entries == 1


# ---------------------------------------------------------------- wait


@pytest.mark.anyio
async def test_wait_returns_present_entry_and_consumes() -> None:
    box = Mailbox()
    box.put("a", env("a"))
    assert await box.wait("a", timeout=1) == env("a")
    assert box.peek("a") is None
    assert await box.wait("a", timeout=0) is None


@pytest.mark.anyio
async def test_wait_blocks_until_put() -> None:
    box = Mailbox()
    got: list[DelegateResult | None] = []

    async def waiter() -> None:
        got.append(await box.wait("a", timeout=10))

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        assert got == []
        assert box.statistics().task_subscribers == 1
        box.put("b", env("b"))  # another key does not wake it for good
        await anyio.wait_all_tasks_blocked()
        assert got == []
        box.put("a", env("a"))
    assert got == [env("a")]
    assert box.peek("a") is None  # consumed
    assert box.peek("b") == env("b")
    assert box.statistics().task_subscribers == 0


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_wait_times_out_with_none(anyio_backend: object) -> None:
    box = Mailbox()
    start = anyio.current_time()
    assert await box.wait("a", timeout=0.05) is None
    if on_mock_clock(anyio_backend):
        assert anyio.current_time() - start == pytest.approx(0.05)
    assert box.statistics().task_subscribers == 0  # no leaked subscription
    assert await box.wait("a", timeout=0) is None


@pytest.mark.anyio
async def test_wait_rejects_bad_timeout() -> None:
    with pytest.raises(ConfigError):
        await Mailbox().wait("a", timeout=-1)


@pytest.mark.anyio
async def test_cancelled_wait_consumes_nothing() -> None:
    box = Mailbox()
    async with anyio.create_task_group() as tg:
        tg.start_soon(box.wait, "a", None)
        await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()
    box.put("a", env("a"))
    assert box.peek("a") == env("a")
    assert box.statistics().task_subscribers == 0


@pytest.mark.anyio
async def test_many_concurrent_put_wait_pairs_lose_nothing() -> None:
    box = Mailbox(capacity=1000)
    rng = random.Random(1234)
    n = 400
    results: dict[str, DelegateResult | None] = {}

    async def waiter(key: str, delay: int) -> None:
        for _ in range(delay):
            await anyio.lowlevel.checkpoint()
        # a missed wake-up would sit out the 30 s timeout; fail_after below catches that
        results[key] = await box.wait(key, timeout=30)

    async def putter(key: str, delay: int) -> None:
        for _ in range(delay):
            await anyio.lowlevel.checkpoint()
        box.put(key, env(key))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for i in range(n):
                key = f"t{i}"
                # the put lands before, during or after the waiter registers
                tg.start_soon(waiter, key, rng.randrange(4))
                tg.start_soon(putter, key, rng.randrange(4))
    assert len(results) == n
    assert all(results[f"t{i}"] == env(f"t{i}") for i in range(n))
    assert len(box) == 0  # every result consumed exactly once
    assert box.statistics().task_subscribers == 0


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_two_waiters_on_one_key_only_one_gets_it() -> None:
    box = Mailbox()
    got: list[DelegateResult | None] = []

    async def waiter() -> None:
        got.append(await box.wait("a", timeout=0.2))

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        tg.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        box.put("a", env("a"))
    assert sorted(got, key=lambda e: e is None) == [env("a"), None]


# ---------------------------------------------------------------- subscriptions


def test_subscribe_once_fires_at_once_if_present() -> None:
    box = Mailbox()
    box.put("a", env("a"))
    calls: list[str] = []
    assert box.subscribe_once("a", lambda: calls.append("a")) is None
    assert calls == ["a"]
    assert box.peek("a") == env("a")  # a signal, not a read


def test_subscribe_once_fires_once_on_put() -> None:
    box = Mailbox()
    calls: list[str] = []
    sub = box.subscribe_once("a", lambda: calls.append("a"))
    assert sub is not None
    box.put("b", env("b"))
    assert calls == []
    box.put("a", env("a"))
    box.put("a", env("a", "again"))
    assert calls == ["a"]
    assert box.peek("a") == env("a", "again")


def test_subscribe_all_only_signals() -> None:
    box = Mailbox()
    calls: list[int] = []
    sub = box.subscribe_all(lambda: calls.append(len(box)))
    box.put("a", env("a"))
    box.put("b", env("b"))
    assert calls == [1, 2]
    assert len(box) == 2  # nothing consumed
    box.unsubscribe(sub)
    box.put("c", env("c"))
    assert calls == [1, 2]


def test_unsubscribe_once_and_unknown_ids() -> None:
    box = Mailbox()
    calls: list[str] = []
    sub = box.subscribe_once("a", lambda: calls.append("a"))
    box.unsubscribe(sub)
    box.unsubscribe(sub)  # twice: ignored
    box.unsubscribe("nope")
    box.unsubscribe(None)
    box.put("a", env("a"))
    assert calls == []
    assert box.statistics().task_subscribers == 0


def test_raising_callback_is_isolated_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    box = Mailbox()
    calls: list[str] = []

    def bad() -> None:
        raise RuntimeError("subscriber bug")

    box.subscribe_once("a", bad)
    box.subscribe_once("a", lambda: calls.append("once"))
    box.subscribe_all(bad)
    box.subscribe_all(lambda: calls.append("all"))
    with caplog.at_level(logging.ERROR, logger="subagents.mailbox"):
        assert box.put("a", env("a")) is True
    assert box.peek("a") == env("a")
    assert calls == ["once", "all"]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 2
    assert all("subscriber bug" in (r.exc_text or "") for r in errors)
    # subscribe_once on a present entry with a raising callback does not raise either
    with caplog.at_level(logging.ERROR, logger="subagents.mailbox"):
        assert box.subscribe_once("a", bad) is None


# ---------------------------------------------------------------- drop


@pytest.mark.anyio
async def test_drop_wakes_waiters_with_none_and_discards_later_puts() -> None:
    box = Mailbox()
    box.put("x", env("x"))
    got: list[DelegateResult | None] = []
    signals: list[str] = []
    box.subscribe_all(lambda: signals.append("all"))

    async def waiter() -> None:
        got.append(await box.wait("a", timeout=None))

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        tg.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        box.drop()
    assert got == [None, None]
    assert signals == ["all"]
    assert box.closed
    assert box.statistics().closed
    assert len(box) == 0
    assert box.peek("x") is None
    assert box.put("a", env("a")) is False  # discarded without error
    assert box.peek("a") is None
    assert len(box) == 0
    assert await box.wait("a", timeout=None) is None  # never blocks once dropped
    box.drop()  # idempotent
    calls: list[str] = []
    assert box.subscribe_once("a", lambda: calls.append("x")) is None
    assert calls == ["x"]


# ---------------------------------------------------------------- consumption


@pytest.mark.anyio
async def test_consumed_results_are_never_returned_again() -> None:
    box = Mailbox()
    box.put("a", env("a"))
    box.put("b", env("b"))
    box.put("c", env("c"))
    assert await box.wait("a", timeout=0) == env("a")
    assert box.drain("b") == env("b")
    assert box.drain_all() == [env("c")]
    for key in "abc":
        assert box.peek(key) is None
        assert box.drain(key) is None
        assert await box.wait(key, timeout=0) is None
    assert box.drain_all() == []


@pytest.mark.anyio
async def test_subscribe_all_after_drop_signals_at_once() -> None:
    """A reader that subscribes to a mailbox already released must not sleep forever."""
    box = Mailbox()
    box.drop()
    woke = anyio.Event()
    box.subscribe_all(woke.set)
    with anyio.fail_after(1):
        await woke.wait()
    assert box.statistics().all_subscribers == 0
