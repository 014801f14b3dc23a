"""The shipped conformance suites: Mailbox and run_local pass them on asyncio and trio,
and every check can fail. Curated broken mailboxes and backends each break one promise and
fail exactly the checks of that promise; beyond them, every check has a variant that breaks
it (and the sound base the variant is made from passes that check)."""

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
from subagents.typing import Backend


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
    order = ["drain_all_arrival_order", "overwrite_is_newest_arrival", "take_all_as_drain_all"]
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


class TakesThenYields(Delegating):
    """Its take_all drains first and checkpoints after: a caller cancelled at that
    checkpoint loses what was taken."""

    async def take_all(self) -> list[DelegateResult]:
        taken = self.drain_all()
        await anyio.lowlevel.checkpoint()
        return taken


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
        (
            SortedDrainAll,
            {"drain_all_arrival_order", "overwrite_is_newest_arrival", "take_all_as_drain_all"},
        ),
        (WindowedSubscribe, {"subscribe_once_when_present", "race_free_subscribe"}),
        (DropKeepsWaiters, {"drop"}),
        (HookSkipsDrainAll, {"consumed_hook", "ttl_expiry", "take_all_as_drain_all"}),
        (TakesThenYields, {"take_all_cancelled_loses_nothing"}),
        (no_ttl, {"ttl_expiry", "ttl_frees_capacity"}),
        (DrainsInsideBlocking, {"wait_cancelled_consumes_nothing"}),
    ],
    ids=lambda value: getattr(value, "__name__", ""),
)
async def test_a_broken_mailbox_fails_exactly_its_checks(
    factory: Callable[..., BaseMailbox], failing: set[str]
) -> None:
    with pytest.raises(ConformanceError) as info:
        # Real time: a correct check's margin must stay above a loaded machine's delays.
        await check_mailbox(factory, patience=0.25)
    assert set(info.value.failures) == failing, info.value
    for name in failing:
        assert str(info.value.failures[name]).startswith(f"{name}: ")
        assert name in str(info.value)


@pytest.mark.anyio
async def test_an_implementation_without_ttl_passes_with_ttl_false() -> None:
    await check_mailbox(no_ttl, ttl=False)


# Every check can fail: one variant per check, each breaking that check's promise (the
# variant may break others too; the exact-set tests above pin down the curated ones).


class PutReturnsNone(Delegating):
    def put(self, task_id: str, envelope: DelegateResult) -> bool:
        super().put(task_id, envelope)
        return None  # type: ignore[return-value]  # the broken promise


class EvictsOldest(Delegating):
    """Makes room for a new id by dropping the oldest entry instead of refusing it."""

    def put(self, task_id: str, envelope: DelegateResult) -> bool:
        if self.peek(task_id) is None and len(self) >= self.capacity:
            oldest = self.inner.drain_all()
            for kept in oldest[1:]:
                self.inner.put(kept.task_id, kept)
        return super().put(task_id, envelope)


class DrainKeeps(Delegating):
    def drain(self, task_id: str) -> DelegateResult | None:
        envelope = self.peek(task_id)
        if envelope is not None:
            self._consumed([envelope])
        return envelope


class DiscardConsumesTheNextPut(Delegating):
    """A discard that waits for the id's entry and consumes the next put of it too."""

    discarding: frozenset[str] = frozenset()  # each instance's own once it discards

    def put(self, task_id: str, envelope: DelegateResult) -> bool:
        if task_id in self.discarding:
            self.discarding -= {task_id}
            return True
        return super().put(task_id, envelope)

    def discard(self, task_id: str) -> None:
        if self.drain(task_id) is None:
            self.discarding |= {task_id}


class PeekConsumes(Delegating):
    def peek(self, task_id: str) -> DelegateResult | None:
        return self.inner.drain(task_id)


class FiresOnAnyPut(Delegating):
    """A one-shot subscription made of an all-puts one: any id's put fires it."""

    def subscribe_once(self, task_id: str, callback: Signal) -> str | None:
        if self.closed or self.peek(task_id) is not None:
            callback()
            return None
        sub: list[str] = []

        def once() -> None:
            self.unsubscribe(sub[0])
            callback()

        sub.append(self.subscribe_all(once))
        return sub[0]


class IgnoresUnsubscribeAll(Delegating):
    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.all_ids: set[str] = set()

    def subscribe_all(self, callback: Signal) -> str:
        sub_id = super().subscribe_all(callback)
        self.all_ids.add(sub_id)
        return sub_id

    def unsubscribe(self, subscription_id: str | None) -> None:
        if subscription_id not in self.all_ids:
            super().unsubscribe(subscription_id)


class PropagatesCallbackErrors(Delegating):
    """Re-raises, after the put, what a subscriber raised."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.errors: list[Exception] = []

    def guard(self, callback: Signal) -> Signal:
        def guarded() -> None:
            try:
                callback()
            except Exception as exc:
                self.errors.append(exc)

        return guarded

    def put(self, task_id: str, envelope: DelegateResult) -> bool:
        stored = super().put(task_id, envelope)
        if self.errors:
            raise self.errors.pop()
        return stored

    def subscribe_once(self, task_id: str, callback: Signal) -> str | None:
        return super().subscribe_once(task_id, self.guard(callback))

    def subscribe_all(self, callback: Signal) -> str:
        return super().subscribe_all(self.guard(callback))


class RejectsReentrantPut(Delegating):
    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.putting = False

    def put(self, task_id: str, envelope: DelegateResult) -> bool:
        if self.putting:
            raise RuntimeError("put re-entered from a callback")
        self.putting = True
        try:
            return super().put(task_id, envelope)
        finally:
            self.putting = False


class ZeroTimeoutNeverLooks(Delegating):
    async def wait(self, task_id: str, timeout: float | None = None) -> DelegateResult | None:
        if timeout == 0:
            return None
        return await super().wait(task_id, timeout)


class WakesOnAnyPut(Delegating):
    """Returns whatever its id holds after the first put of any id."""

    async def wait(self, task_id: str, timeout: float | None = None) -> DelegateResult | None:
        timeout = check_timeout(timeout)
        envelope = self.drain(task_id)
        if envelope is not None or self.closed or timeout == 0:
            return envelope
        with anyio.move_on_after(timeout) if timeout is not None else nullcontext():
            event = anyio.Event()
            subs = [self.subscribe_once(task_id, event.set), self.subscribe_all(event.set)]
            try:
                await event.wait()
            finally:
                for sub in subs:
                    self.unsubscribe(sub)
        return self.drain(task_id)


class ReturnsEarly(Delegating):
    # At once, not at a fraction of the timeout: a loaded machine's real clock could stretch
    # a short wait past the check's lower bound and hide the early return.
    async def wait(self, task_id: str, timeout: float | None = None) -> DelegateResult | None:
        return await super().wait(task_id, 0 if timeout else timeout)


class IgnoresBlocking(Delegating):
    async def wait(self, task_id: str, timeout: float | None = None) -> DelegateResult | None:
        blocking, self.blocking = self.blocking, None
        try:
            return await super().wait(task_id, timeout)
        finally:
            self.blocking = blocking


class PeeksThenDrains(Delegating):
    """Reads the entry, yields, then removes it: two waiters both get it."""

    async def wait(self, task_id: str, timeout: float | None = None) -> DelegateResult | None:
        timeout = check_timeout(timeout)
        with anyio.move_on_after(timeout) if timeout is not None else nullcontext():
            while self.peek(task_id) is None and not self.closed:
                event = anyio.Event()
                sub = self.subscribe_once(task_id, event.set)
                try:
                    await event.wait()
                finally:
                    self.unsubscribe(sub)
            envelope = self.peek(task_id)
            await anyio.lowlevel.checkpoint()
            self.drain(task_id)
            return envelope
        return self.drain(task_id)


class BlocksWhenDropped(Delegating):
    async def wait(self, task_id: str, timeout: float | None = None) -> DelegateResult | None:
        if self.closed:
            await anyio.sleep_forever()
        return await super().wait(task_id, timeout)


class MisreportsCapacity(Delegating):
    def statistics(self) -> MailboxStatistics:
        return attrs.evolve(super().statistics(), capacity=self.capacity + 1)


def default_ttl(
    *, capacity: int, ttl: float | None = None, clock: Callable[[], float] = time.monotonic
) -> Delegating:
    """Takes ``ttl=None`` for "the default TTL" instead of "no expiry"."""
    return Delegating(capacity=capacity, ttl=3600.0 if ttl is None else ttl, clock=clock)


BREAKS_MAILBOX_CHECK: dict[str, Callable[..., BaseMailbox]] = {
    "put_peek_drain": PutReturnsNone,
    "overwrite_without_growth": OverwriteGrows,
    "overwrite_is_newest_arrival": SortedDrainAll,
    "capacity": EvictsOldest,
    "drain_all_arrival_order": SortedDrainAll,
    "take_all_as_drain_all": SortedDrainAll,
    "take_all_cancelled_loses_nothing": TakesThenYields,
    "discard_consumes": DiscardConsumesTheNextPut,
    "consumed_never_again": DrainKeeps,
    "peek_never_consumes": PeekConsumes,
    "consumed_hook": HookSkipsDrainAll,
    "subscribe_once_when_present": WindowedSubscribe,
    "subscribe_once_one_shot": FiresOnAnyPut,
    "subscribe_all_only_signals": IgnoresUnsubscribeAll,
    "unsubscribe": IgnoresUnsubscribeAll,
    "callback_errors_isolated": PropagatesCallbackErrors,
    "reentrant_callbacks": RejectsReentrantPut,
    "wait_present": ZeroTimeoutNeverLooks,
    "wait_blocks_until_put": WakesOnAnyPut,
    "wait_timeout": ReturnsEarly,
    "wait_cancelled_consumes_nothing": DrainsInsideBlocking,
    "blocking_hook": IgnoresBlocking,
    "two_waiters_one_entry": PeeksThenDrains,
    "race_free_subscribe": WindowedSubscribe,
    "drop": DropKeepsWaiters,
    "wait_after_drop_never_blocks": BlocksWhenDropped,
    "statistics": MisreportsCapacity,
    "ttl_expiry": no_ttl,
    "ttl_frees_capacity": no_ttl,
    "ttl_none_keeps": default_ttl,
}


def test_every_mailbox_check_has_a_variant_that_breaks_it() -> None:
    assert set(BREAKS_MAILBOX_CHECK) == {check.name for check in mailbox_checks(Mailbox)}


@pytest.mark.anyio
@pytest.mark.parametrize("name", list(BREAKS_MAILBOX_CHECK))
async def test_every_mailbox_check_can_fail(name: str) -> None:
    broken = BREAKS_MAILBOX_CHECK[name]
    [check] = [c for c in mailbox_checks(broken, patience=0.05) if c.name == name]
    with pytest.raises(AssertionError, match=rf"^{name}: "):
        await check()
    # and the same check passes on the sound base the variant breaks
    [sound] = [c for c in mailbox_checks(Delegating) if c.name == name]
    await sound()


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
        if not outcome:  # the shared run was cancelled (its own watchdog): run this one
            return await run_local(spec, request, ctx)
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
        await check_backend(make(), watchdog=0.02)
    assert set(info.value.failures) == failing, info.value
    for name in failing:
        assert str(info.value.failures[name]).startswith(f"{name}: ")


async def decorates_output(spec: AgentSpec, request: Request, ctx: RunContext) -> Result:
    result = await run_local(spec, request, ctx)
    return attrs.evolve(result, output=f"[remote] {result.output}")


async def drops_prompt(spec: AgentSpec, request: Request, ctx: RunContext) -> Result:
    return await run_local(spec, attrs.evolve(request, prompt=None), ctx)


class WithoutReport:
    """A stand-in context whose ``report`` goes nowhere (a remote side that cannot reach
    the manager)."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.attempt = 1

    def __getattr__(self, name: str) -> object:
        return getattr(self.ctx, name)

    def report(self, **progress: object) -> None:
        pass


async def drops_reports(spec: AgentSpec, request: Request, ctx: RunContext) -> Result:
    return await run_local(spec, request, WithoutReport(ctx))  # type: ignore[arg-type]


async def own_short_timeout(spec: AgentSpec, request: Request, ctx: RunContext) -> Result:
    """Gives up on a run after 10 ms of its own, as an error, before any watchdog."""
    with anyio.move_on_after(0.01):
        return await run_local(spec, request, ctx)
    raise TimeoutError("the backend gave up")


BREAKS_BACKEND_CHECK: dict[str, Callable[[], Backend]] = {
    "completed": lambda: decorates_output,
    "request_and_context": lambda: drops_prompt,
    "result_fields": lambda: drops_usage,
    "reported_progress": lambda: drops_reports,
    "error_status": lambda: swallows_exceptions,
    "exception_text": lambda: loses_exception_type,
    "timeout": lambda: own_short_timeout,
    "cancellation": lambda: converts_cancellation,
    "retries": lambda: ignores_retries,
    "bad_return": lambda: stringifies_returns,
    "concurrent_runs": Coalescing,
}


def test_every_backend_check_has_a_variant_that_breaks_it() -> None:
    assert set(BREAKS_BACKEND_CHECK) == {check.name for check in backend_checks(run_local)}


@pytest.mark.anyio
@pytest.mark.parametrize("name", list(BREAKS_BACKEND_CHECK))
async def test_every_backend_check_can_fail(name: str) -> None:
    [check] = [c for c in backend_checks(BREAKS_BACKEND_CHECK[name]()) if c.name == name]
    with pytest.raises(AssertionError, match=rf"^{name}: "):
        await check()


@pytest.mark.anyio
async def test_a_backend_that_never_answers_fails_within_the_deadline() -> None:
    async def never(spec: AgentSpec, request: Request, ctx: RunContext) -> Result:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    [check] = [c for c in backend_checks(never, deadline=0.1) if c.name == "completed"]
    with pytest.raises(AssertionError, match=r"did not finish within 0\.1 s"):
        await check()
