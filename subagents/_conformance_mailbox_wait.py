"""The mailbox checks of ``wait`` and ``drop``: blocking, timeouts, cancellation, the
blocking hook, and puts racing waits."""

from __future__ import annotations

import math
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from ._conformance import require
from ._conformance_mailbox_store import SuiteBase, env
from ._envelope import DelegateResult
from ._errors import ConfigError

__all__ = ["WaitChecks"]


class WaitChecks(SuiteBase):
    """The checks that run waiting tasks: each method is one check, named as it is."""

    # ------------------------------------------------------------ wait

    async def wait_present(self) -> None:
        box = self.new()
        box.put("a", env("a"))
        require(await box.wait("a", timeout=1) == env("a"), "wait missed a present entry")
        require(box.peek("a") is None, "wait did not consume the entry it returned")
        box.put("b", env("b"))
        require(await box.wait("b", timeout=0) == env("b"), "wait(timeout=0) missed an entry")

    async def wait_blocks_until_put(self) -> None:
        box = self.new()
        arrivals = self.arrivals()

        async def waiter() -> None:
            arrivals.add("a", await box.wait("a", timeout=None))

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            require(not arrivals.items, "wait returned before anything was put")
            subscribers = box.statistics().task_subscribers
            require(subscribers == 1, f"a blocked wait counts {subscribers} task subscribers")
            box.put("b", env("b"))
            await anyio.wait_all_tasks_blocked()
            require(not arrivals.items, "a put of another id ended the wait")
            box.put("a", env("a"))
            woken = await arrivals.reached(1)
            if not woken:
                tg.cancel_scope.cancel()
        got = arrivals.envelopes()
        require(woken, f"the put of its id did not wake a blocked wait in {self.patience} s")
        require(got == [env("a")], f"the blocked wait returned {got}, not the envelope put")
        require(box.peek("a") is None, "the wait did not consume its envelope")
        require(box.peek("b") == env("b"), "the wait consumed another id's envelope")
        require(box.statistics().task_subscribers == 0, "the ended wait stays subscribed")

    async def wait_timeout(self) -> None:
        box = self.new()
        timeout = 0.05
        start = anyio.current_time()
        got = await box.wait("a", timeout=timeout)
        elapsed = anyio.current_time() - start
        require(got is None, f"wait on an absent entry returned {got}")
        require(
            timeout * 0.8 <= elapsed <= timeout + self.patience,
            f"wait(timeout={timeout}) returned after {elapsed} s",
        )
        require(box.statistics().task_subscribers == 0, "a timed-out wait stays subscribed")
        require(await box.wait("a", timeout=0) is None, "wait(timeout=0) invented an entry")
        # A put due at the wait's own deadline: returned, or left for the next reader.
        got = None

        async def put_at_deadline() -> None:
            await anyio.sleep(timeout)
            box.put("b", env("b"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(put_at_deadline)
            got = await box.wait("b", timeout=timeout)
        left = box.drain("b")
        require(
            (got, left) in ((env("b"), None), (None, env("b"))),
            f"a put at the deadline: wait returned {got}, the mailbox kept {left}",
        )
        for bad in (-1.0, math.nan):
            try:
                await box.wait("a", timeout=bad)
            except ConfigError:
                continue
            raise AssertionError(f"wait(timeout={bad}) did not raise ConfigError")

    async def wait_cancelled_consumes_nothing(self) -> None:
        box = self.new()
        consumed: list[DelegateResult] = []
        box.consumed = consumed.append
        async with anyio.create_task_group() as tg:
            tg.start_soon(box.wait, "a", None)
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
        box.put("a", env("a"))
        require(box.peek("a") == env("a"), "a cancelled wait took the envelope put after it")
        require(box.statistics().task_subscribers == 0, "a cancelled wait stays subscribed")
        # Cancelled after the put woke it, while its blocking hook is still exiting (a slot
        # being taken back): the entry must stay for the next reader.
        box = self.new()
        box.consumed = consumed.append
        release = anyio.Event()
        exiting = anyio.Event()

        @asynccontextmanager
        async def blocking() -> AsyncIterator[None]:
            yield
            exiting.set()
            await release.wait()

        box.blocking = blocking
        async with anyio.create_task_group() as tg:
            tg.start_soon(box.wait, "a", None)
            await anyio.wait_all_tasks_blocked()
            box.put("a", env("a"))
            await anyio.wait_all_tasks_blocked()
            with anyio.move_on_after(self.patience):
                await exiting.wait()
            tg.cancel_scope.cancel()
        require(exiting.is_set(), "the put did not wake the wait out of its blocking hook")
        require(box.peek("a") == env("a"), "a wait cancelled in its blocking hook consumed")
        require(consumed == [], "a cancelled wait called the consumed hook")

    async def blocking_hook(self) -> None:
        box = self.new()
        log: list[str] = []

        @asynccontextmanager
        async def blocking() -> AsyncIterator[None]:
            log.append("enter")
            await anyio.lowlevel.checkpoint()
            yield
            await anyio.lowlevel.checkpoint()
            log.append("exit")

        box.blocking = blocking
        arrivals = self.arrivals()

        async def waiter() -> None:
            envelope = await box.wait("a", timeout=None)
            log.append("returned")
            arrivals.add("a", envelope)

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            require(log == ["enter"], f"a blocked wait has not entered blocking(): {log}")
            box.put("a", env("a"))
            if not await arrivals.reached(1):
                tg.cancel_scope.cancel()
        got = arrivals.envelopes()
        require(got == [env("a")], f"a wait with a blocking hook returned {got}")
        require(log == ["enter", "exit", "returned"], f"the hook ran as {log}")

    async def two_waiters_one_entry(self) -> None:
        box = self.new()
        arrivals = self.arrivals()

        async def waiter() -> None:
            arrivals.add("a", await box.wait("a", timeout=None))

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            box.put("a", env("a"))
            await arrivals.reached(1)
            await anyio.wait_all_tasks_blocked()
            box.drop()  # releases the waiter that lost the race
            if not await arrivals.reached(2):
                tg.cancel_scope.cancel()  # drop is broken: its own check says so
        got = arrivals.envelopes()
        winners = [e for e in got if e is not None]
        require(winners == [env("a")], f"two waiters on one put received {got}")

    async def race_free_subscribe(self) -> None:
        for yielding_hook in (False, True):
            await self._put_wait_pairs(yielding_hook)

    async def _put_wait_pairs(self, yielding_hook: bool) -> None:
        pairs = 200
        box = self.new(capacity=pairs)
        if yielding_hook:

            @asynccontextmanager
            async def blocking() -> AsyncIterator[None]:
                await anyio.lowlevel.checkpoint()  # puts land between check and block
                yield
                await anyio.lowlevel.checkpoint()

            box.blocking = blocking
        rng = random.Random(1234)
        arrivals = self.arrivals()

        async def pause(turns: int) -> None:
            for _ in range(turns):
                await anyio.lowlevel.checkpoint()

        async def waiter(key: str, turns: int) -> None:
            await pause(turns)
            arrivals.add(key, await box.wait(key, timeout=None))

        async def putter(key: str, turns: int) -> None:
            await pause(turns)
            box.put(key, env(key))

        async with anyio.create_task_group() as tg:
            for n in range(pairs):
                # The put lands before, while or after its waiter checks and subscribes.
                tg.start_soon(waiter, f"t{n}", rng.randrange(4))
                tg.start_soon(putter, f"t{n}", rng.randrange(4))
            await arrivals.reached(pairs)
            box.drop()  # wakes any waiter that missed its put, so the check ends
            if not await arrivals.reached(pairs):
                tg.cancel_scope.cancel()  # drop is broken: its own check says so
        results = dict(arrivals.items)
        how = "with a yielding blocking hook" if yielding_hook else "plainly"
        lost = sorted(k for k in (f"t{n}" for n in range(pairs)) if results.get(k) is None)
        require(not lost, f"waiting {how}, {len(lost)} waiters missed their put: {lost[:5]}")
        wrong = [k for k, e in results.items() if e != env(k)]
        require(not wrong, f"waiting {how}, waiters got another id's envelope: {wrong[:5]}")

    # ------------------------------------------------------------ drop

    async def drop(self) -> None:
        box = self.new()
        consumed: list[DelegateResult] = []
        box.consumed = consumed.append
        box.put("x", env("x"))
        signals: list[str] = []
        box.subscribe_all(lambda: signals.append("all"))
        box.subscribe_once("b", lambda: signals.append("once"))
        arrivals = self.arrivals()

        async def waiter() -> None:
            arrivals.add("a", await box.wait("a", timeout=None))

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            box.drop()
            if not await arrivals.reached(2):
                tg.cancel_scope.cancel()
        got = arrivals.envelopes()
        require(got == [None, None], f"drop woke its waiters with {got}, not [None, None]")
        require(sorted(signals) == ["all", "once"], f"drop signalled {signals}")
        require(box.closed, "closed is False after drop")
        stats = box.statistics()
        require(stats.closed, "statistics().closed is False after drop")
        require(stats.entries == 0 and len(box) == 0, "drop kept entries")
        require(stats.task_subscribers == 0, "drop kept one-shot subscriptions")
        require(stats.all_subscribers == 0, "drop kept all-puts subscriptions")
        require(box.peek("x") is None and box.drain("x") is None, "drop kept an entry")
        require(box.drain_all() == [], "drain_all returned entries after drop")
        require(box.put("a", env("a")) is False, "put after drop did not return False")
        require(box.peek("a") is None and len(box) == 0, "put after drop stored its envelope")
        require(sorted(signals) == ["all", "once"], "a put after drop signalled")
        require(consumed == [], "drop or a put after it called the consumed hook")
        box.drop()  # idempotent
        require(sorted(signals) == ["all", "once"], "a second drop signalled again")
        calls: list[str] = []
        sub = box.subscribe_once("a", lambda: calls.append("once"))
        require(sub is None and calls == ["once"], "subscribe_once after drop did not fire")
        box.subscribe_all(lambda: calls.append("all"))
        require(calls == ["once", "all"], "subscribe_all after drop did not fire at once")

    async def wait_after_drop_never_blocks(self) -> None:
        box = self.new()
        box.drop()
        finished = False
        with anyio.move_on_after(self.patience):
            result = await box.wait("a", timeout=None)
            finished = True
        require(finished, f"wait on a dropped mailbox blocked for {self.patience} s")
        require(result is None, f"wait on a dropped mailbox returned {result}")
