"""The driver's batched calls to one actor (the Ray backend's channel), without ray: a fake
actor handle whose calls return plain concurrent futures, completed by the test as Ray's
thread completes ``ObjectRef.future()``."""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import anyio
import pytest

from subagents.backends._ray_channel import _BATCH, Call, Channel, Slot
from subagents.backends._ray_wire import (
    CANCELLED,
    FAILED,
    REPLIED,
    ClusterLostError,
    Exported,
    RemoteRunnerError,
    portable,
)

pytestmark = pytest.mark.anyio


class _Ref:
    def __init__(self, future: Future[Any]) -> None:
        self._future = future

    def future(self) -> Future[Any]:
        return self._future


class _Method:
    """One method of the fake actor: records each call and the future it returned, and
    the futures of calls that collect in ``collecting``."""

    def __init__(
        self,
        collecting: list[Future[Any]],
        collects: Callable[[tuple[Any, ...]], bool] = lambda args: False,
        fails: BaseException | None = None,
    ) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.futures: list[Future[Any]] = []
        self._collecting = collecting
        self._collects = collects
        self._fails = fails
        self._awaited: dict[int, anyio.Event] = {}

    async def called(self, times: int) -> None:
        """Return once this method has been called ``times`` times."""
        if len(self.calls) < times:
            event = self._awaited[times] = anyio.Event()
            await event.wait()

    def remote(self, *args: Any) -> _Ref:
        if self._fails is not None:
            raise self._fails
        self.calls.append(args)
        future: Future[Any] = Future()
        self.futures.append(future)
        if self._collects(args):
            self._collecting.append(future)
        awaited = self._awaited.pop(len(self.calls), None)
        if awaited is not None:
            awaited.set()
        return _Ref(future)


class FakeActor:
    def __init__(self, *, submit_raises: BaseException | None = None) -> None:
        self.collecting: list[Future[Any]] = []
        """The futures of the calls that collect (a submit that does, or a collect)."""
        self.serve = _Method(self.collecting)
        self.submit = _Method(self.collecting, lambda args: pickle.loads(args[0])[1], submit_raises)
        self.collect = _Method(self.collecting, lambda args: True)
        self.cancel = _Method(self.collecting)

    def batches(self) -> list[list[tuple[int, bytes]]]:
        return [batch for _, _, batch in self.submitted()]

    def submitted(self) -> list[tuple[str, bool, list[tuple[int, bytes]]]]:
        """Each submit's one argument: its channel, whether it collects, its runs."""
        return [pickle.loads(blob) for (blob,) in self.submit.calls]


def up() -> bool:
    """Ray is up."""
    return True


def from_ray_thread(
    future: Future[Any], value: object = None, error: BaseException | None = None
) -> None:
    """Complete ``future`` in a thread of its own, as Ray does."""

    def complete() -> None:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    thread = threading.Thread(target=complete)
    thread.start()
    thread.join()


def answer(actor: FakeActor, index: int, *ended: tuple[int, int, bytes]) -> None:
    """The actor's answer to the ``index``-th call that collects: these calls ended."""
    from_ray_thread(actor.collecting[index], pickle.dumps(list(ended)))


async def calls(channel: Channel, n: int) -> list[Call]:
    """``n`` calls made together, as many children reaching the backend at once."""
    made: list[Call] = []

    async def one(i: int) -> None:
        made.append(await channel.call(f"payload-{i}".encode()))

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    return sorted(made, key=lambda call: call.number)


async def test_calls_made_together_travel_in_one_submit_that_collects() -> None:
    actor = FakeActor()
    channel = Channel(actor, up)
    made = await calls(channel, 10)
    (batch,) = actor.batches()
    assert sorted(payload for _, payload in batch) == sorted(
        f"payload-{i}".encode() for i in range(10)
    )
    assert sorted(number for number, _ in batch) == [call.number for call in made]
    assert actor.submitted()[0][0] == channel.name
    assert actor.submitted()[0][1] is True, "the one Ray call of the batch collects"
    assert actor.collect.calls == []
    assert not any(call.done.is_set() for call in made)


async def test_a_large_batch_travels_in_submits_of_at_most_the_batch_size() -> None:
    actor = FakeActor()
    made = await calls(Channel(actor, up), 3 * _BATCH + 1)
    batches = actor.batches()
    assert [len(batch) for batch in batches] == [_BATCH, _BATCH, _BATCH, 1]
    sent = sorted(number for batch in batches for number, _ in batch)
    assert sent == [call.number for call in made]
    assert [collects for _, collects, _ in actor.submitted()] == [True, False, False, False]
    assert actor.collect.calls == []


async def test_a_lone_call_is_sent_without_waiting_for_company() -> None:
    actor = FakeActor()
    channel = Channel(actor, up)
    with anyio.fail_after(5):
        call = await channel.call(b"alone")
    assert actor.batches() == [[(call.number, b"alone")]]


async def test_a_collect_wakes_only_the_calls_it_names_and_the_next_collect_follows() -> None:
    actor = FakeActor()
    first, second, third = await calls(Channel(actor, up), 3)
    answer(actor, 0, (first.number, REPLIED, b"reply-0"))
    with anyio.fail_after(5):
        await first.done.wait()
    assert first.result() == b"reply-0"
    assert first.reply() == b"reply-0"
    assert not second.done.is_set()
    assert not third.done.is_set()
    assert len(actor.collect.calls) == 1, "no collect pending while calls still run"
    answer(actor, 1, (second.number, REPLIED, b"reply-1"), (third.number, REPLIED, b"reply-2"))
    with anyio.fail_after(5):
        await third.done.wait()
    assert (second.result(), third.result()) == (b"reply-1", b"reply-2")
    assert len(actor.collect.calls) == 1, "a collect left pending with no call running"


async def test_a_collect_that_answers_nothing_is_followed_by_another() -> None:
    actor = FakeActor()
    (call,) = await calls(Channel(actor, up), 1)
    answer(actor, 0)  # the actor's idle timeout
    with anyio.fail_after(5):
        await actor.collect.called(1)
    answer(actor, 1, (call.number, REPLIED, b"late"))
    with anyio.fail_after(5):
        await call.done.wait()
    assert call.result() == b"late"


async def test_a_new_call_after_all_ended_starts_a_new_collect() -> None:
    actor = FakeActor()
    channel = Channel(actor, up)
    (first,) = await calls(channel, 1)
    answer(actor, 0, (first.number, REPLIED, b"one"))
    with anyio.fail_after(5):
        await first.done.wait()
    second = await channel.call(b"two")
    assert [collects for _, collects, _ in actor.submitted()] == [True, True]
    answer(actor, 1, (second.number, REPLIED, b"two"))
    with anyio.fail_after(5):
        await second.done.wait()


async def test_a_failed_collect_ends_every_call_of_the_channel_with_its_error() -> None:
    actor = FakeActor()
    channel = Channel(actor, up)
    made = await calls(channel, 3)
    made += await calls(channel, 2)  # sent while the first submit collects
    assert [collects for _, collects, _ in actor.submitted()] == [True, False]
    from_ray_thread(actor.collecting[0], error=ConnectionError("the actor died"))
    with anyio.fail_after(5):
        for call in made:
            await call.done.wait()
    errors = []
    for call in made:
        with pytest.raises(ConnectionError, match="the actor died") as caught:
            call.result()
        errors.append(caught.value)
        assert call.reply() is None
    assert len({id(error) for error in errors}) == 5, "each call raises an error of its own"


async def test_a_failed_submit_that_does_not_collect_ends_the_calls_it_carried() -> None:
    actor = FakeActor()
    channel = Channel(actor, up)
    first = await calls(channel, 2)
    second = await calls(channel, 3)
    from_ray_thread(actor.submit.futures[1], error=OSError("the batch was lost"))
    with anyio.fail_after(5):
        for call in second:
            await call.done.wait()
            with pytest.raises(OSError, match="the batch was lost"):
                call.result()
    assert not any(call.done.is_set() for call in first)


async def test_a_submit_that_raises_at_once_ends_its_calls_instead_of_raising() -> None:
    actor = FakeActor(submit_raises=RuntimeError("Ray is shut down"))
    made = await calls(Channel(actor, up), 2)
    for call in made:
        assert call.done.is_set()
        with pytest.raises(RuntimeError, match="Ray is shut down"):
            call.result()


async def test_a_call_the_actor_failed_or_cancelled_raises_what_it_sent() -> None:
    actor = FakeActor()
    failed, cancelled = await calls(Channel(actor, up), 2)
    error = portable(ValueError("the payload did not unpickle"), pickle.dumps)
    answer(actor, 0, (failed.number, FAILED, error), (cancelled.number, CANCELLED, b""))
    with anyio.fail_after(5):
        await cancelled.done.wait()
    with pytest.raises(ValueError, match="the payload did not unpickle"):
        failed.result()
    with pytest.raises(RemoteRunnerError, match="cancelled on its actor"):
        cancelled.result()
    assert cancelled.reply() is None


async def test_an_answer_for_a_call_already_ended_is_ignored() -> None:
    actor = FakeActor()
    first, second = await calls(Channel(actor, up), 2)
    answer(actor, 0, (first.number, REPLIED, b"one"), (first.number, REPLIED, b"again"))
    with anyio.fail_after(5):
        await first.done.wait()
    assert first.result() == b"one"
    assert not second.done.is_set()


async def test_cancel_asks_the_actor_to_cancel_the_calls_number() -> None:
    actor = FakeActor()
    channel = Channel(actor, up)
    _, second = await calls(channel, 2)
    second.cancel()
    assert actor.cancel.calls == [(channel.name, [second.number])]


def test_each_event_loop_has_a_channel_of_its_own_to_an_actor(anyio_backend: str) -> None:
    slot = Slot(FakeActor(), up)

    async def names() -> tuple[str, str]:
        return slot.channel().name, slot.channel().name

    first = anyio.run(names, backend=anyio_backend)
    second = anyio.run(names, backend=anyio_backend)
    assert first[0] == first[1], "one channel per loop"
    assert first[0] != second[0], "a later loop gets a new one"


class _Unrevivable(Exception):
    """An exception class the driver's copy of which cannot be made from what the worker
    sent (as when the driver and the workers run different versions of its module)."""

    def __new__(cls, *args: object) -> _Unrevivable:
        raise TypeError("this version of the class takes other arguments")


async def test_an_error_that_does_not_revive_ends_its_call_and_the_others_still_end() -> None:
    actor = FakeActor()
    channel = Channel(actor, up)
    broken, replied, later = await calls(channel, 3)
    error = pickle.dumps(Exported(_Unrevivable, ("from the worker",), {}))
    answer(actor, 0, (broken.number, FAILED, error), (replied.number, REPLIED, b"reply"))
    with anyio.fail_after(5):
        await replied.done.wait()
        await broken.done.wait()
    assert replied.result() == b"reply"
    with pytest.raises(Exception, match=r"from the worker|did not travel|other arguments"):
        broken.result()
    with anyio.fail_after(5):
        await actor.collect.called(1)  # the channel still collects for the call running
    answer(actor, 1, (later.number, REPLIED, b"later"))
    with anyio.fail_after(5):
        await later.done.wait()


async def test_no_call_goes_out_once_ray_is_down_and_the_calls_end_cluster_lost() -> None:
    # A Ray call made after ray.shutdown() would start a new local cluster.
    actor = FakeActor()
    running = True
    channel = Channel(actor, lambda: running)
    first, second = await calls(channel, 2)
    running = False
    answer(actor, 0, (first.number, REPLIED, b"one"))
    with anyio.fail_after(5):
        await second.done.wait()
    assert first.result() == b"one"
    with pytest.raises(ClusterLostError):
        second.result()
    assert actor.collect.calls == [], "a collect went out with Ray down"
    late = await channel.call(b"late")
    assert late.done.is_set()
    with pytest.raises(ClusterLostError):
        late.result()
    late.cancel()
    assert len(actor.submit.calls) == 1
    assert actor.cancel.calls == []


async def test_an_answer_that_does_not_unpickle_ends_every_call_of_the_channel() -> None:
    actor = FakeActor()
    made = await calls(Channel(actor, up), 2)
    from_ray_thread(actor.collecting[0], b"not a pickle")
    with anyio.fail_after(5):
        for call in made:
            await call.done.wait()
            with pytest.raises(pickle.UnpicklingError):
                call.result()


async def test_a_way_of_ending_the_driver_does_not_know_is_an_error_naming_it() -> None:
    actor = FakeActor()
    (call,) = await calls(Channel(actor, up), 1)
    answer(actor, 0, (call.number, 9, b""))
    with anyio.fail_after(5):
        await call.done.wait()
    with pytest.raises(RemoteRunnerError, match="unknown way: 9"):
        call.result()


def test_a_slot_whose_actor_stops_serving_says_so() -> None:
    actor = FakeActor()
    slot = Slot(actor, up)
    assert not slot.ended
    from_ray_thread(actor.serve.futures[0], error=ConnectionError("the actor died"))
    assert slot.ended


async def test_an_answer_whose_entries_do_not_read_strands_no_call() -> None:
    # An actor of another version of this package may answer with entries of another shape:
    # the actor has handed those completions over, so no later collect brings them, and a
    # call left waiting is a spawn that never gets its envelope (as an answer that does not
    # unpickle at all ends every call of the channel).
    actor = FakeActor()
    made = await calls(Channel(actor, up), 2)
    from_ray_thread(actor.collecting[0], pickle.dumps([(made[0].number, REPLIED)]))
    with anyio.fail_after(5):
        await actor.collect.called(1)  # the answer was handled: the next collect went out
    assert made[0].done.is_set(), "the call the answer named never ends"
