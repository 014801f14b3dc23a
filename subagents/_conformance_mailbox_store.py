"""The mailbox checks of storage, consumption, subscriptions, statistics and TTL.

Their helpers (an envelope per id, a hand-moved clock, a bounded wait for the suite's own
waiter tasks) serve the wait checks too.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import anyio

from ._conformance import require
from ._envelope import DelegateResult, Status
from ._errors import MailboxFull
from ._mailbox import BaseMailbox, MailboxStatistics

__all__ = ["Arrivals", "ManualClock", "MailboxFactory", "StoreChecks", "SuiteBase", "env"]

MailboxFactory = Callable[..., BaseMailbox]
"""``factory(*, capacity, ttl=None, clock=None) -> BaseMailbox``: see :func:`mailbox_checks`."""


def env(task_id: str, output: str = "") -> DelegateResult:
    return DelegateResult(
        agent="conformance",
        task_id=task_id,
        status=Status.COMPLETED,
        output=output or f"output of {task_id}",
        timestamp_ms=1,
    )


class ManualClock:
    """A clock the TTL checks move by hand, so expiry takes no wall time."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Arrivals:
    """What the suite's own waiter tasks returned, and a bounded wait for the n-th.

    The wait first lets every task of this loop run, then allows ``patience`` more: an
    implementation may wake its waiters from a thread or another process, which no task
    of this loop sees, while a loaded machine must not turn a slow wake-up into a lost one.
    """

    def __init__(self, patience: float) -> None:
        self.patience = patience
        self.items: list[tuple[str, DelegateResult | None]] = []
        self._wanted = 0
        self._reached = anyio.Event()

    def add(self, key: str, envelope: DelegateResult | None) -> None:
        self.items.append((key, envelope))
        if len(self.items) >= self._wanted:
            self._reached.set()

    def envelopes(self) -> list[DelegateResult | None]:
        return [envelope for _, envelope in self.items]

    async def reached(self, count: int) -> bool:
        """Wait until ``count`` waiters have returned; False if they still have not after
        ``patience``, then every task running, then ``patience`` again."""
        for settle in (False, True):
            if len(self.items) >= count:
                return True
            if settle:  # costly on asyncio (anyio polls), so only once patience ran out
                await anyio.wait_all_tasks_blocked()
            self._wanted = count
            self._reached = anyio.Event()
            with anyio.move_on_after(self.patience):
                await self._reached.wait()
        return len(self.items) >= count


class SuiteBase:
    """What every mailbox check reads: the factory and how long to wait for a wake-up."""

    def __init__(self, factory: MailboxFactory, patience: float) -> None:
        self.factory = factory
        self.patience = patience

    def new(self, capacity: int = 8) -> BaseMailbox:
        return self.factory(capacity=capacity)

    def arrivals(self) -> Arrivals:
        return Arrivals(self.patience)


class StoreChecks(SuiteBase):
    """The checks that need no waiting task: each method is one check, named as it is."""

    # ------------------------------------------------------------ storage

    async def put_peek_drain(self) -> None:
        box = self.new()
        require(len(box) == 0, f"a new mailbox has len {len(box)}, not 0")
        require(box.put("a", env("a")) is True, "put did not return True")
        require(len(box) == 1, f"len is {len(box)} after one put")
        require(box.peek("a") == env("a"), "peek did not return the envelope put")
        require(box.drain("a") == env("a"), "drain did not return the envelope put")
        require(box.drain("a") is None, "a second drain returned the envelope again")
        require(box.peek("a") is None, "peek found an envelope already drained")
        require(len(box) == 0, f"len is {len(box)} after draining the only entry")
        require(box.peek("missing") is None, "peek of an unknown id did not return None")
        require(box.drain("missing") is None, "drain of an unknown id did not return None")

    async def overwrite_without_growth(self) -> None:
        box = self.new(capacity=2)
        box.put("a", env("a", "first"))
        box.put("b", env("b"))
        try:
            box.put("a", env("a", "second"))
        except MailboxFull as full:
            raise AssertionError("overwriting an id of a full mailbox raised MailboxFull") from full
        require(len(box) == 2, f"len is {len(box)} after overwriting, not 2")
        require(box.peek("a") == env("a", "second"), "peek did not return the overwrite")
        got = [e.output for e in box.drain_all()]
        require("first" not in got, f"the overwritten envelope is still there: {got}")

    async def overwrite_is_newest_arrival(self) -> None:
        box = self.new()
        for key in ("a", "b", "c"):
            box.put(key, env(key))
        box.put("a", env("a", "again"))
        got = [e.output for e in box.drain_all()]
        expected = [env("b").output, env("c").output, "again"]
        require(got == expected, f"drain_all after an overwrite returned {got}, not {expected}")

    async def capacity(self) -> None:
        box = self.new(capacity=3)
        for key in "abc":
            box.put(key, env(key))
        try:
            box.put("d", env("d"))
        except MailboxFull as full:
            require(full.capacity == 3, f"MailboxFull.capacity is {full.capacity}, not 3")
            require(full.task_id == "d", f"MailboxFull.task_id is {full.task_id!r}, not 'd'")
        else:
            raise AssertionError("a put of a new id into a full mailbox did not raise")
        require(len(box) == 3, f"a refused put changed len to {len(box)}")
        require(box.peek("d") is None, "a refused put stored its envelope")
        require(all(box.peek(k) == env(k) for k in "abc"), "a refused put lost an entry")
        box.drain("a")
        require(box.put("d", env("d")) is True, "no room after draining a full mailbox")

    async def drain_all_arrival_order(self) -> None:
        box = self.new(capacity=64)
        keys = [f"task-{n}" for n in random.Random(7).sample(range(1000), 40)]
        for key in keys:
            box.put(key, env(key))
        got = [e.task_id for e in box.drain_all()]
        require(got == keys, f"drain_all order {got[:6]}... is not arrival order {keys[:6]}...")
        require(len(box) == 0, f"len is {len(box)} after drain_all")
        require(box.drain_all() == [], "a second drain_all returned envelopes")

    async def take_all_as_drain_all(self) -> None:
        box = self.new(capacity=64)
        consumed: list[str] = []
        box.consumed = lambda envelope: consumed.append(envelope.task_id)
        keys = [f"task-{n}" for n in random.Random(11).sample(range(1000), 20)]
        for key in keys:
            box.put(key, env(key))
        box.put(keys[0], env(keys[0], "again"))  # an overwrite is the newest arrival
        expected = [*keys[1:], keys[0]]
        got = await box.take_all()
        order = [e.task_id for e in got]
        require(order == expected, f"take_all order {order[:4]}... is not {expected[:4]}...")
        require(got[-1] == env(keys[0], "again"), "take_all returned the overwritten envelope")
        require(consumed == expected, f"take_all: the hook saw {consumed[:4]}...")
        require(len(box) == 0, f"len is {len(box)} after take_all")
        require(await box.take_all() == [], "a second take_all returned envelopes")
        require(box.drain_all() == [], "drain_all after take_all returned envelopes")
        box.put("late", env("late"))
        box.drop()
        require(await box.take_all() == [], "take_all after drop returned envelopes")

    async def take_all_cancelled_loses_nothing(self) -> None:
        box = self.new()
        for key in "abc":
            box.put(key, env(key))
        got: list[DelegateResult] = []
        with anyio.CancelScope() as scope:
            scope.cancel()
            got = await box.take_all()
        left = await box.take_all()  # after whatever the cancelled one left under way
        require(
            sorted(e.task_id for e in got + left) == list("abc"),
            f"a cancelled take_all returned {got} and left {left}",
        )

    async def consumed_never_again(self) -> None:
        box = self.new()
        for key in "abc":
            box.put(key, env(key))
        require(await box.wait("a", timeout=0) == env("a"), "wait missed a present entry")
        require(box.drain("b") == env("b"), "drain missed a present entry")
        require(box.drain_all() == [env("c")], "drain_all did not return the rest")
        for key in "abc":
            require(box.peek(key) is None, f"peek returned {key!r} after it was consumed")
            require(box.drain(key) is None, f"drain returned {key!r} after it was consumed")
            again = await box.wait(key, timeout=0)
            require(again is None, f"wait returned {key!r} after it was consumed")

    async def discard_consumes(self) -> None:
        box = self.new(capacity=2)
        for key in "ab":
            box.put(key, env(key))
        box.discard("a")
        box.discard("d")  # no entry: nothing happens
        require(box.peek("a") is None, "peek returned an entry after its discard")
        require(box.drain("a") is None, "drain returned an entry after its discard")
        require(len(box) == 1, f"len is {len(box)} after discarding one of two entries")
        try:
            box.put("c", env("c"))
        except MailboxFull as full:
            raise AssertionError("a discarded entry still took its place") from full
        got = sorted(box.drain_all(), key=lambda e: e.task_id)  # the order is checked apart
        require(got == [env("b"), env("c")], f"drain_all after a discard gave {got}")
        box.put("a", env("a", "again"))
        box.put("d", env("d"))
        require(box.peek("a") == env("a", "again"), "a put after a discard was not read")
        require(box.peek("d") == env("d"), "a put after a discard of nothing was not read")
        box.discard("b")  # consumed already: nothing happens
        require(len(box) == 2, f"len is {len(box)} after discarding a consumed entry")

    async def peek_never_consumes(self) -> None:
        box = self.new()
        consumed: list[DelegateResult] = []
        box.consumed = consumed.append
        box.put("a", env("a"))
        for _ in range(3):
            require(box.peek("a") == env("a"), "a repeated peek lost the entry")
        box.unsubscribe(box.subscribe_once("a", lambda: None))
        require(len(box) == 1, f"len is {len(box)} after peeks, not 1")
        require(consumed == [], "peek or subscribe_once called the consumed hook")
        require(box.drain("a") == env("a"), "the entry was gone after peeks")

    async def consumed_hook(self) -> None:
        box = self.new()
        consumed: list[str] = []
        box.consumed = lambda envelope: consumed.append(envelope.task_id)
        for key in "abcd":
            box.put(key, env(key))
        box.peek("a")
        box.drain("missing")
        require(consumed == [], f"the hook fired without a consumption: {consumed}")
        box.drain("a")
        require(consumed == ["a"], f"drain: the hook saw {consumed}, not ['a']")
        box.drain_all()
        require(consumed == list("abcd"), f"drain_all: the hook saw {consumed}")
        box.put("e", env("e"))
        await box.wait("e", timeout=0)
        require(consumed == list("abcde"), f"wait on a present entry: the hook saw {consumed}")
        async with anyio.create_task_group() as tg:
            tg.start_soon(box.wait, "f", None)
            await anyio.wait_all_tasks_blocked()
            box.put("f", env("f"))
        require(consumed == list("abcdef"), f"a blocked wait: the hook saw {consumed}")
        box.put("g", env("g"))
        box.drop()
        require(consumed == list("abcdef"), f"drop called the hook: {consumed}")
        # A hook that raises must not cost the caller its envelope.
        box = self.new()

        def broken(envelope: DelegateResult) -> None:
            raise RuntimeError("a consumed hook that fails")

        box.consumed = broken
        box.put("a", env("a"))
        box.put("b", env("b"))
        require(box.drain("a") == env("a"), "a raising hook lost drain's envelope")
        require(box.drain_all() == [env("b")], "a raising hook lost drain_all's envelopes")
        require(len(box) == 0, "a raising hook left consumed entries behind")

    # ------------------------------------------------------------ subscriptions

    async def subscribe_once_when_present(self) -> None:
        box = self.new()
        box.put("a", env("a"))
        calls: list[str] = []
        sub = box.subscribe_once("a", lambda: calls.append("a"))
        require(sub is None, f"subscribe_once on a present entry returned {sub!r}, not None")
        require(calls == ["a"], f"subscribe_once on a present entry fired {len(calls)} times")
        require(box.statistics().task_subscribers == 0, "a fired subscription stays registered")
        require(box.peek("a") == env("a"), "subscribe_once consumed the entry")

    async def subscribe_once_one_shot(self) -> None:
        box = self.new()
        calls: list[str] = []
        sub = box.subscribe_once("a", lambda: calls.append("a"))
        require(isinstance(sub, str), f"subscribe_once on an absent entry returned {sub!r}")
        box.put("b", env("b"))
        require(calls == [], "a put of another id fired the subscription")
        box.put("a", env("a"))
        require(calls == ["a"], f"the put of its id fired the subscription {len(calls)} times")
        box.put("a", env("a", "again"))
        require(calls == ["a"], "an overwrite fired a one-shot subscription again")
        require(box.statistics().task_subscribers == 0, "a fired subscription stays registered")
        require(box.peek("a") == env("a", "again"), "the subscription consumed the entry")

    async def subscribe_all_only_signals(self) -> None:
        box = self.new()
        seen: list[int] = []
        sub = box.subscribe_all(lambda: seen.append(len(box)))
        box.put("a", env("a"))
        box.put("b", env("b"))
        box.put("a", env("a", "again"))
        require(seen == [1, 2, 2], f"the callback saw lens {seen}, not [1, 2, 2] (after puts)")
        require(len(box) == 2, "an all-puts subscription consumed entries")
        box.unsubscribe(sub)
        box.put("c", env("c"))
        require(seen == [1, 2, 2], "an unsubscribed callback was still called")

    async def unsubscribe(self) -> None:
        box = self.new()
        calls: list[str] = []
        once = box.subscribe_once("a", lambda: calls.append("once"))
        every = box.subscribe_all(lambda: calls.append("all"))
        box.unsubscribe(once)
        box.unsubscribe(every)
        box.unsubscribe(once)  # twice, unknown ids and None are all ignored
        box.unsubscribe("no-such-subscription")
        box.unsubscribe(None)
        box.put("a", env("a"))
        require(calls == [], f"unsubscribed callbacks ran: {calls}")
        stats = box.statistics()
        require(
            stats.task_subscribers == 0 and stats.all_subscribers == 0,
            f"unsubscribed subscriptions are still counted: {stats}",
        )

    async def callback_errors_isolated(self) -> None:
        box = self.new()
        calls: list[str] = []

        def broken() -> None:
            raise RuntimeError("a subscriber that fails")

        box.subscribe_once("a", broken)
        box.subscribe_once("a", lambda: calls.append("once"))
        box.subscribe_all(broken)
        box.subscribe_all(lambda: calls.append("all"))
        require(box.put("a", env("a")) is True, "a raising subscriber broke put")
        require(box.peek("a") == env("a"), "a raising subscriber lost the envelope")
        require(
            sorted(calls) == ["all", "once"], f"a raising subscriber stopped the others: {calls}"
        )
        box.unsubscribe(box.subscribe_once("a", broken))  # must not raise either

    async def reentrant_callbacks(self) -> None:
        box = self.new()
        drained: list[str] = []
        calls: list[str] = []
        box.subscribe_all(lambda: drained.extend(e.task_id for e in box.drain_all()))
        box.subscribe_once("a", lambda: box.put("b", env("b")))
        require(box.put("a", env("a")) is True, "a put whose callbacks re-enter failed")
        require(sorted(drained) == ["a", "b"], f"re-entrant drains saw {drained}")
        require(len(box) == 0, f"len is {len(box)} after callbacks drained everything")
        subs: list[str] = []
        subs.append(box.subscribe_all(lambda: box.unsubscribe(subs[1])))
        subs.append(box.subscribe_all(lambda: calls.append("second")))
        box.put("c", env("c"))
        calls.clear()
        box.put("d", env("d"))
        require(calls == [], "a callback unsubscribed by another during a put still runs")

    async def statistics(self) -> None:
        box = self.new(capacity=5)
        stats = box.statistics()
        require(isinstance(stats, MailboxStatistics), f"statistics() returned {stats!r}")
        expected = MailboxStatistics(
            entries=0, capacity=5, task_subscribers=0, all_subscribers=0, closed=False
        )
        require(stats == expected, f"a new mailbox: {stats}, expected {expected}")
        box.put("a", env("a"))
        box.put("b", env("b"))
        once = box.subscribe_once("c", lambda: None)
        every = box.subscribe_all(lambda: None)
        stats = box.statistics()
        require(stats.entries == 2, f"entries is {stats.entries} with 2 unread, not 2")
        require(stats.task_subscribers == 1, f"task_subscribers is {stats.task_subscribers}")
        require(stats.all_subscribers == 1, f"all_subscribers is {stats.all_subscribers}")
        box.drain("a")
        box.unsubscribe(once)
        box.unsubscribe(every)
        stats = box.statistics()
        expected = MailboxStatistics(
            entries=1, capacity=5, task_subscribers=0, all_subscribers=0, closed=False
        )
        require(stats == expected, f"after a drain and unsubscribes: {stats}")

    # ------------------------------------------------------------ TTL

    async def ttl_expiry(self) -> None:
        clock = ManualClock()
        box = self.factory(capacity=2, ttl=10.0, clock=clock)
        consumed: list[DelegateResult] = []
        box.consumed = consumed.append
        box.put("a", env("a"))
        clock.now += 5
        box.put("b", env("b"))
        clock.now += 4.5
        require(box.peek("a") == env("a"), "an entry expired before its TTL")
        clock.now += 1  # "a" is 10.5 s old, "b" 5.5 s
        require(box.peek("a") is None, "an entry is still readable past its TTL")
        require(len(box) == 1, f"len is {len(box)}, counting an expired entry")
        require(box.statistics().entries == 1, "statistics().entries counts an expired entry")
        require(box.put("c", env("c")) is True, "an expired entry still takes capacity")
        require(box.drain_all() == [env("b"), env("c")], "drain_all returned expired entries")
        box.put("d", env("d"))
        clock.now += 100
        require(box.drain("d") is None, "drain returned an expired entry")
        require(await box.wait("d", timeout=0) is None, "wait returned an expired entry")
        sub = box.subscribe_once("d", lambda: None)
        require(sub is not None, "subscribe_once fired at once for an expired entry")
        box.unsubscribe(sub)
        require(consumed == [env("b"), env("c")], "an expiry called the consumed hook")
        box.put("e", env("e", "first"))
        clock.now += 8
        box.put("e", env("e", "second"))
        clock.now += 8
        require(box.peek("e") == env("e", "second"), "an overwrite did not restart its TTL")

    async def ttl_frees_capacity(self) -> None:
        clock = ManualClock()
        box = self.factory(capacity=1, ttl=1.0, clock=clock)
        box.put("a", env("a"))
        try:
            box.put("b", env("b"))
        except MailboxFull:
            pass
        else:
            raise AssertionError("a full mailbox with a TTL took a new id")
        clock.now += 1.5
        require(box.put("b", env("b")) is True, "an expired entry kept the mailbox full")
        require(box.statistics().entries == 1, "an expired entry is still counted")

    async def ttl_none_keeps(self) -> None:
        clock = ManualClock()
        box = self.factory(capacity=2, ttl=None, clock=clock)
        box.put("a", env("a"))
        clock.now += 1e9
        require(box.peek("a") == env("a"), "ttl=None let an entry expire")
