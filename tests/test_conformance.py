"""The shipped conformance suites: Mailbox and run_local pass them on asyncio and trio,
and every check can fail: each deliberately broken mailbox or backend below breaks one
promise, and exactly the checks of that promise report it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext

import anyio
import attrs
import pytest

from subagents import (
    AgentSpec,
    Backend,
    BaseMailbox,
    ConfigError,
    DelegateResult,
    Mailbox,
    MailboxFull,
    MailboxStatistics,
    Request,
    Result,
    RunContext,
    run_local,
)
from subagents.testing import (
    Check,
    ConformanceError,
    backend_checks,
    check_backend,
    check_mailbox,
    mailbox_checks,
)


@pytest.fixture(autouse=True)
def _quiet_expected_hook_errors(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """The suites feed mailboxes raising hooks on purpose; their logged tracebacks are
    expected, so they go to caplog only."""
    with caplog.at_level(logging.CRITICAL, logger="subagents.mailbox"):
        yield


Signal = Callable[[], object]


def check_timeout(timeout: float | None) -> float | None:
    """What BaseMailbox.wait promises about its argument, for the waits written here."""
    if timeout is not None and not timeout >= 0:  # NaN fails the comparison too
        raise ConfigError("timeout", "a number of seconds >= 0 or None", timeout)
    return timeout


async def delegating_run_local(spec: AgentSpec, request: Request, ctx: RunContext) -> Result:
    """run_local behind another name: the manager awaits a plain runner in place when the
    backend *is* run_local, so this is how run_local's own code meets every check."""
    return await run_local(spec, request, ctx)


# ---------------------------------------------------------------- the real ones pass


@pytest.mark.anyio
@pytest.mark.parametrize("check", mailbox_checks(Mailbox), ids=lambda check: check.name)
async def test_mailbox_passes(check: Check) -> None:
    await check()


@pytest.mark.anyio
@pytest.mark.parametrize("backend", [run_local, delegating_run_local], ids=["direct", "wrapped"])
@pytest.mark.parametrize("name", [check.name for check in backend_checks(run_local)])
async def test_run_local_passes(name: str, backend: Backend) -> None:
    [check] = [c for c in backend_checks(backend) if c.name == name]
    await check()


@pytest.mark.anyio
async def test_whole_suites_pass_in_one_call() -> None:
    await check_mailbox(Mailbox)
    await check_mailbox(lambda **kwargs: Mailbox(**kwargs), ttl=False)
    await check_backend(delegating_run_local)


def test_check_names_are_unique_and_stable() -> None:
    names = [c.name for c in mailbox_checks(Mailbox)]
    assert len(set(names)) == len(names) >= 20
    assert names[0] == "put_peek_drain"
    assert {"ttl_expiry", "ttl_frees_capacity", "ttl_none_keeps"} <= set(names)
    assert not {n for n in names if n.startswith("ttl")} & {
        c.name for c in mailbox_checks(Mailbox, ttl=False)
    }
    backend = [c.name for c in backend_checks(run_local)]
    assert len(set(backend)) == len(backend) >= 10
    assert all(c.promise for c in [*mailbox_checks(Mailbox), *backend_checks(run_local)])


@pytest.mark.anyio
async def test_skip_leaves_checks_out_and_rejects_unknown_names() -> None:
    order = ["drain_all_arrival_order", "overwrite_is_newest_arrival"]
    await check_mailbox(SortedDrainAll, skip=order)
    with pytest.raises(ValueError, match="drain_all_arival_order"):
        await check_mailbox(Mailbox, skip=["drain_all_arival_order"])
    with pytest.raises(ValueError, match="complete"):
        await check_backend(run_local, skip=["complete"])


@pytest.mark.anyio
async def test_a_hung_check_fails_instead_of_hanging() -> None:
    check = Check(name="hangs", promise="ends", body=anyio.sleep_forever, deadline=0.01)
    with pytest.raises(AssertionError, match=r"^hangs: ends \(the check did not finish"):
        await check()


@pytest.mark.anyio
async def test_an_unexpected_exception_is_reported_as_the_check_failing() -> None:
    async def body() -> None:
        raise KeyError("boom")

    with pytest.raises(AssertionError, match=r"^named: a promise \(raised KeyError: 'boom'\)"):
        await Check(name="named", promise="a promise", body=body)()


# ---------------------------------------------------------------- broken mailboxes


class Delegating(BaseMailbox):
    """A BaseMailbox made of a Mailbox's public methods, keeping its own ``consumed`` hook
    and ``blocking``: the base of the broken variants (and it passes the suite itself)."""

    def __init__(
        self,
        *,
        capacity: int,
        ttl: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner = Mailbox(capacity=capacity, ttl=ttl, clock=clock)
        self.capacity = capacity

    def put(self, task_id: str, envelope: DelegateResult) -> bool:
        return self.inner.put(task_id, envelope)

    def peek(self, task_id: str) -> DelegateResult | None:
        return self.inner.peek(task_id)

    def drain(self, task_id: str) -> DelegateResult | None:
        envelope = self.inner.drain(task_id)
        if envelope is not None:
            self._consumed([envelope])
        return envelope

    def drain_all(self) -> list[DelegateResult]:
        envelopes = self.inner.drain_all()
        self._consumed(envelopes)
        return envelopes

    def _consumed(self, envelopes: Iterable[DelegateResult]) -> None:
        if self.consumed is not None:
            for envelope in envelopes:
                try:
                    self.consumed(envelope)
                except Exception:
                    logging.getLogger("subagents.mailbox").exception("hook raised")

    def __len__(self) -> int:
        return len(self.inner)

    def drop(self) -> None:
        self.inner.drop()

    @property
    def closed(self) -> bool:
        return self.inner.closed

    def subscribe_once(self, task_id: str, callback: Signal) -> str | None:
        return self.inner.subscribe_once(task_id, callback)

    def subscribe_all(self, callback: Signal) -> str:
        return self.inner.subscribe_all(callback)

    def unsubscribe(self, subscription_id: str | None) -> None:
        self.inner.unsubscribe(subscription_id)

    def statistics(self) -> MailboxStatistics:
        return self.inner.statistics()


class OverwriteGrows(Delegating):
    """Counts an overwrite as a new entry: a full mailbox refuses it."""

    def put(self, task_id: str, envelope: DelegateResult) -> bool:
        if not self.closed and len(self) >= self.capacity:
            raise MailboxFull(self.capacity, task_id)
        return super().put(task_id, envelope)


class SortedDrainAll(Delegating):
    """Loses arrival order: drain_all returns entries sorted by task id."""

    def drain_all(self) -> list[DelegateResult]:
        return sorted(super().drain_all(), key=lambda e: e.task_id)


class WindowedSubscribe(Delegating):
    """Checks and subscribes in two steps: its wait yields between the check and the
    subscription, and its subscribe_once only hears later puts, so a put landing in
    between is missed."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.waiting: dict[str, dict[str, Signal]] = {}
        self.ids = iter(range(1, 1 << 30))

    def put(self, task_id: str, envelope: DelegateResult) -> bool:
        stored = super().put(task_id, envelope)
        for callback in self.waiting.pop(task_id, {}).values():
            try:
                callback()
            except Exception:
                logging.getLogger("subagents.mailbox").exception("subscriber raised")
        return stored

    def subscribe_once(self, task_id: str, callback: Signal) -> str | None:
        if self.closed:
            callback()
            return None
        sub_id = f"w{next(self.ids)}"
        self.waiting.setdefault(task_id, {})[sub_id] = callback
        return sub_id

    def unsubscribe(self, subscription_id: str | None) -> None:
        for subs in self.waiting.values():
            subs.pop(subscription_id or "", None)
        super().unsubscribe(subscription_id)

    def drop(self) -> None:
        waiting, self.waiting = self.waiting, {}
        super().drop()
        for subs in waiting.values():
            for callback in subs.values():
                callback()

    def statistics(self) -> MailboxStatistics:
        count = sum(len(subs) for subs in self.waiting.values())
        return attrs.evolve(super().statistics(), task_subscribers=count)

    async def wait(self, task_id: str, timeout: float | None = None) -> DelegateResult | None:
        timeout = check_timeout(timeout)
        envelope = self.drain(task_id)
        if envelope is not None or self.closed or timeout == 0:
            return envelope
        with anyio.move_on_after(timeout) if timeout is not None else nullcontext():
            async with self.blocking() if self.blocking is not None else nullcontext():
                await anyio.lowlevel.checkpoint()  # a round trip to a store: the window
                event = anyio.Event()
                sub = self.subscribe_once(task_id, event.set)
                try:
                    await event.wait()
                finally:
                    self.unsubscribe(sub)
        return self.drain(task_id)


class DropKeepsWaiters(Delegating):
    """drop forgets to wake the one-shot subscriptions, so blocked waits never return."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.once: set[str] = set()

    def subscribe_once(self, task_id: str, callback: Signal) -> str | None:
        sub_id = super().subscribe_once(task_id, callback)
        if sub_id is not None:
            self.once.add(sub_id)
        return sub_id

    def drop(self) -> None:
        for sub_id in self.once:
            self.unsubscribe(sub_id)
        super().drop()


class HookSkipsDrainAll(Delegating):
    """Never calls ``consumed`` for drain_all's envelopes."""

    def drain_all(self) -> list[DelegateResult]:
        return self.inner.drain_all()


def no_ttl(*, capacity: int, ttl: float | None = None, clock: object = None) -> Delegating:
    """A factory that ignores ``ttl``: entries never expire."""
    return Delegating(capacity=capacity)


class DrainsInsideBlocking(Delegating):
    """Its wait consumes the entry before its blocking hook has exited: a caller cancelled
    while taking its slot back loses the envelope."""

    async def wait(self, task_id: str, timeout: float | None = None) -> DelegateResult | None:
        timeout = check_timeout(timeout)
        envelope = self.drain(task_id)
        if envelope is not None or self.closed or timeout == 0:
            return envelope
        with anyio.move_on_after(timeout) if timeout is not None else nullcontext():
            async with self.blocking() if self.blocking is not None else nullcontext():
                while self.peek(task_id) is None and not self.closed:
                    event = anyio.Event()
                    sub = self.subscribe_once(task_id, event.set)
                    try:
                        await event.wait()
                    finally:
                        self.unsubscribe(sub)
                envelope = self.drain(task_id)
            return envelope
        return self.drain(task_id)


@pytest.mark.anyio
async def test_the_delegating_base_of_the_broken_mailboxes_passes() -> None:
    await check_mailbox(Delegating)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("factory", "failing"),
    [
        (OverwriteGrows, {"overwrite_without_growth"}),
        (SortedDrainAll, {"drain_all_arrival_order", "overwrite_is_newest_arrival"}),
        (WindowedSubscribe, {"subscribe_once_when_present", "race_free_subscribe"}),
        (DropKeepsWaiters, {"drop"}),
        (HookSkipsDrainAll, {"consumed_hook", "ttl_expiry"}),
        (no_ttl, {"ttl_expiry", "ttl_frees_capacity"}),
        (DrainsInsideBlocking, {"wait_cancelled_consumes_nothing"}),
    ],
    ids=lambda value: getattr(value, "__name__", ""),
)
async def test_a_broken_mailbox_fails_exactly_its_checks(
    factory: Callable[..., BaseMailbox], failing: set[str]
) -> None:
    with pytest.raises(ConformanceError) as info:
        await check_mailbox(factory, patience=0.2)
    assert set(info.value.failures) == failing, info.value
    for name in failing:
        assert str(info.value.failures[name]).startswith(f"{name}: ")
        assert name in str(info.value)


@pytest.mark.anyio
async def test_an_implementation_without_ttl_passes_with_ttl_false() -> None:
    await check_mailbox(no_ttl, ttl=False)


# ---------------------------------------------------------------- broken backends


async def swallows_exceptions(spec: AgentSpec, request: Request, ctx: RunContext) -> Result:
    """Turns every failure into a success whose output is the error."""
    try:
        return await run_local(spec, request, ctx)
    except Exception as exc:
        return Result(output=f"failed: {exc}")


async def ignores_retries(spec: AgentSpec, request: Request, ctx: RunContext) -> Result:
    """Runs every runner once, whatever its retry policy."""
    return await run_local(attrs.evolve(spec, retry=None), request, ctx)


async def drops_usage(spec: AgentSpec, request: Request, ctx: RunContext) -> Result:
    """Ships back only the output, files, error and status of a Result."""
    result = await run_local(spec, request, ctx)
    return Result(
        output=result.output,
        files_changed=result.files_changed,
        error=result.error,
        status=result.status,
    )


async def loses_exception_type(spec: AgentSpec, request: Request, ctx: RunContext) -> Result:
    """Re-raises every failure as a RuntimeError with the same text."""
    try:
        return await run_local(spec, request, ctx)
    except Exception as exc:
        raise RuntimeError(str(exc)) from exc


async def stringifies_returns(spec: AgentSpec, request: Request, ctx: RunContext) -> Result:
    """Accepts any return value as the output: a runner's bug becomes a success."""

    async def lenient(request: Request, ctx: RunContext) -> Result | str:
        raw: object = await spec.runner(request, ctx)
        return raw if isinstance(raw, (str, Result)) else repr(raw)

    return await run_local(attrs.evolve(spec, runner=lenient), request, ctx)


async def converts_cancellation(spec: AgentSpec, request: Request, ctx: RunContext) -> Result:
    """Reports a cancellation as a failure of its own instead of letting it propagate."""
    try:
        return await run_local(spec, request, ctx)
    except anyio.get_cancelled_exc_class() as exc:
        raise RuntimeError("the remote run was cancelled") from exc


class Coalescing:
    """Shares one run among concurrent requests of the same agent type (a cache keyed too
    coarsely): concurrent children get each other's results."""

    def __init__(self) -> None:
        self.flights: dict[str, tuple[anyio.Event, list[Result | Exception]]] = {}

    async def __call__(self, spec: AgentSpec, request: Request, ctx: RunContext) -> Result:
        flight = self.flights.get(spec.name)
        if flight is None:
            done, outcome = flight = (anyio.Event(), [])
            self.flights[spec.name] = flight
            try:
                outcome.append(await run_local(spec, request, ctx))
            except Exception as exc:
                outcome.append(exc)
            finally:
                del self.flights[spec.name]
                done.set()
        else:
            done, outcome = flight
            await done.wait()
        if not outcome:
            raise RuntimeError("the shared run was cancelled")
        if isinstance(outcome[0], Exception):
            raise outcome[0]
        return outcome[0]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("make", "failing"),
    [
        (
            lambda: swallows_exceptions,
            {"error_status", "exception_text", "retries", "bad_return", "concurrent_runs"},
        ),
        (lambda: ignores_retries, {"retries"}),
        (lambda: drops_usage, {"result_fields"}),
        (lambda: loses_exception_type, {"exception_text", "bad_return"}),
        (lambda: stringifies_returns, {"bad_return"}),
        (lambda: converts_cancellation, {"cancellation"}),
        (Coalescing, {"concurrent_runs"}),
    ],
    ids=[
        "swallows_exceptions",
        "ignores_retries",
        "drops_usage",
        "loses_exception_type",
        "stringifies_returns",
        "converts_cancellation",
        "coalescing",
    ],
)
async def test_a_broken_backend_fails_exactly_its_checks(
    make: Callable[[], Backend], failing: set[str]
) -> None:
    with pytest.raises(ConformanceError) as info:
        await check_backend(make())
    assert set(info.value.failures) == failing, info.value
    for name in failing:
        assert str(info.value.failures[name]).startswith(f"{name}: ")


@pytest.mark.anyio
async def test_a_backend_that_never_answers_fails_within_the_deadline() -> None:
    async def never(spec: AgentSpec, request: Request, ctx: RunContext) -> Result:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    [check] = [c for c in backend_checks(never, deadline=0.1) if c.name == "completed"]
    with pytest.raises(AssertionError, match=r"did not finish within 0\.1 s"):
        await check()
