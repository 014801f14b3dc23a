"""The pool actor's side of a channel, as a plain object in this process (no cluster):
batches submitted and their replies collected, cancels before and after a run arrives,
payloads that fail, the concurrency limit, channels kept apart, the idle collect, what a
channel leaves uncollected dropped in time.
Skipped unless ray is installed (its module imports it); run with ``-m ray``."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
from trio.testing import MockClock

pytest.importorskip("ray")

from subagents import Budget, Request, Ruleset
from subagents.backends import _ray_worker
from subagents.backends._ray_wire import (
    CANCELLED,
    FAILED,
    REPLIED,
    Reply,
    Shipped,
    revived,
)
from tests.helpers import pass_time_without_a_checkpoint

pytestmark = [pytest.mark.ray, pytest.mark.anyio]

HERE = __name__


class Gate:
    """Runners of this module wait here; it counts how many run at once."""

    running = 0
    most = 0
    opened: anyio.Event | None = None


async def echo(request: Request, ctx: object) -> str:
    return f"echo {request.input}"


async def hangs(request: Request, ctx: object) -> str:
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


async def waits_at_the_gate(request: Request, ctx: object) -> str:
    Gate.running += 1
    Gate.most = max(Gate.most, Gate.running)
    try:
        assert Gate.opened is not None
        await Gate.opened.wait()
    finally:
        Gate.running -= 1
    return "through"


async def interrupts_when_cancelled(request: Request, ctx: object) -> str:
    try:
        await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class() as exc:
        raise BaseExceptionGroup("on the way out", [KeyboardInterrupt(), exc]) from None
    raise AssertionError("unreachable")


async def raises_cancelled_error(request: Request, ctx: object) -> str:
    # Asyncio code does this when a task it awaits was cancelled by someone else.
    raise asyncio.CancelledError("a task this runner awaited was cancelled")


def payload(runner: str, text: str = "") -> bytes:
    shipped = Shipped(
        task_id=f"t-{text}",
        parent_session_id="default",
        agent="worker",
        agent_path="/root/worker",
        parent_path="/root",
        attempt=1,
        permissions=Ruleset(),
        remaining=None,
        budget=Budget(),
        carrier={},
        sink="no-sink",
    )
    path = runner if ":" in runner else f"{HERE}:{runner}"  # else one of this module's
    return pickle.dumps((path, Request(agent="worker", input=text), shipped))


def batch(channel: str, *payloads: tuple[int, bytes], collects: bool = False) -> bytes:
    """A submit's one argument: the channel, whether it collects, the runs."""
    return pickle.dumps((channel, collects, list(payloads)))


@asynccontextmanager
async def serving(max_concurrency: int = 1000) -> AsyncIterator[_ray_worker._WorkerActor]:
    actor = _ray_worker._WorkerActor(max_concurrency)
    async with anyio.create_task_group() as tg:
        tg.start_soon(actor.serve)
        yield actor
        tg.cancel_scope.cancel()


async def collected(
    actor: _ray_worker._WorkerActor, channel: str, n: int
) -> dict[int, tuple[int, bytes]]:
    """What ``n`` ended runs of ``channel`` left, by number, over as many collects as it
    takes."""
    ended: dict[int, tuple[int, bytes]] = {}
    with anyio.fail_after(10):
        while len(ended) < n:
            for number, how, blob in pickle.loads(await actor.collect(channel)):
                assert number not in ended, f"run {number} ended twice"
                ended[number] = (how, blob)
    return ended


def runner_error_of(ended: tuple[int, bytes]) -> BaseException:
    """The runner's error a run ended with: in its reply, with its progress, as a local
    run's would be."""
    how, blob = ended
    assert how == REPLIED, "the run ended without its reply (cancelled, or failed outside)"
    reply: Reply = pickle.loads(blob)
    assert reply.error is not None, reply
    return revived(reply)


def output(blob: bytes) -> str | None:
    reply: Reply = pickle.loads(blob)
    assert reply.result is not None
    return reply.result.output


async def test_a_submitted_batch_runs_and_collect_hands_back_each_reply() -> None:
    async with serving() as actor:
        await actor.submit(batch("c", (0, payload("echo", "a")), (1, payload("echo", "b"))))
        ended = await collected(actor, "c", 2)
    assert {number: how for number, (how, _) in ended.items()} == {0: REPLIED, 1: REPLIED}
    assert output(ended[0][1]) == "echo a"
    assert output(ended[1][1]) == "echo b"


async def test_a_submit_that_collects_answers_with_what_ended_as_collect_does() -> None:
    async with serving() as actor:
        with anyio.fail_after(10):
            answer = pickle.loads(
                await actor.submit(batch("c", (0, payload("echo", "x")), collects=True))
            )
    assert [(number, how) for number, how, _ in answer] == [(0, REPLIED)]
    assert output(answer[0][2]) == "echo x"


async def test_a_submit_that_arrives_before_serve_waits_for_it() -> None:
    actor = _ray_worker._WorkerActor(10)
    async with anyio.create_task_group() as tg:
        tg.start_soon(actor.submit, batch("c", (0, payload("echo", "early"))))
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(actor.serve)
        ended = await collected(actor, "c", 1)
        tg.cancel_scope.cancel()
    assert output(ended[0][1]) == "echo early"


async def test_a_cancel_ends_that_run_as_cancelled_and_no_other() -> None:
    async with serving() as actor:
        await actor.submit(batch("c", (0, payload("hangs")), (1, payload("hangs"))))
        await anyio.wait_all_tasks_blocked()
        await actor.cancel("c", [0])
        ended = await collected(actor, "c", 1)
        assert ended == {0: (CANCELLED, b"")}
        await actor.cancel("c", [1])
        assert await collected(actor, "c", 1) == {1: (CANCELLED, b"")}


async def test_a_cancel_that_comes_before_its_run_ends_it_on_arrival_unrun() -> None:
    async with serving() as actor:
        await actor.cancel("c", [7])
        await actor.submit(batch("c", (7, payload("hangs")), (8, payload("echo", "x"))))
        ended = await collected(actor, "c", 2)
    assert ended[7] == (CANCELLED, b"")
    assert output(ended[8][1]) == "echo x"


async def test_a_cancel_of_a_run_that_ended_uncollected_is_not_kept() -> None:
    async with serving() as actor:
        await actor.submit(batch("c", (0, payload("echo", "done"))))
        await anyio.wait_all_tasks_blocked()
        await actor.cancel("c", [0])
        ended = await collected(actor, "c", 1)
        assert ended[0][0] == REPLIED
        assert actor._cancelled_early == {}


async def test_cancels_kept_for_runs_not_arrived_are_bounded_oldest_first() -> None:
    bound = _ray_worker._CANCELLED_EARLY
    async with serving() as actor:
        await actor.cancel("c", list(range(bound + 10)))
        assert len(actor._cancelled_early) == bound
        assert ("c", 0) not in actor._cancelled_early
        assert ("c", bound + 9) in actor._cancelled_early


async def test_a_payload_that_does_not_unpickle_ends_failed_with_its_error() -> None:
    async with serving() as actor:
        await actor.submit(batch("c", (0, b"not a pickle"), (1, payload("echo", "fine"))))
        ended = await collected(actor, "c", 2)
    how, blob = ended[0]
    assert how == FAILED
    assert isinstance(pickle.loads(blob), pickle.UnpicklingError)
    assert output(ended[1][1]) == "echo fine"


async def test_runs_past_max_concurrency_wait_their_turn() -> None:
    Gate.running = Gate.most = 0
    Gate.opened = anyio.Event()
    async with serving(max_concurrency=2) as actor:
        await actor.submit(batch("c", *((i, payload("waits_at_the_gate")) for i in range(5))))
        await anyio.wait_all_tasks_blocked()
        assert Gate.running == 2
        Gate.opened.set()
        ended = await collected(actor, "c", 5)
    assert Gate.most == 2
    assert {how for how, _ in ended.values()} == {REPLIED}


async def test_each_channel_collects_only_its_own_runs() -> None:
    async with serving() as actor:
        await actor.submit(batch("one", (0, payload("echo", "for one"))))
        await actor.submit(batch("two", (0, payload("echo", "for two"))))
        one = await collected(actor, "one", 1)
        two = await collected(actor, "two", 1)
    assert output(one[0][1]) == "echo for one"
    assert output(two[0][1]) == "echo for two"


# Trio's mock clock only: the idle wait is 30 s of real time anywhere else.
@pytest.mark.parametrize(
    "anyio_backend", [pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}))]
)
async def test_a_collect_with_nothing_ended_answers_empty_after_the_idle_wait() -> None:
    async with serving() as actor:
        start = anyio.current_time()
        assert pickle.loads(await actor.collect("nobody")) == []
        assert anyio.current_time() - start == pytest.approx(_ray_worker._IDLE)
        assert actor._collectors == {}


@pytest.mark.parametrize(
    "anyio_backend", [pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}))]
)
async def test_ends_no_collect_takes_for_ten_minutes_are_dropped_and_a_late_collect_fails_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A channel whose driver's event loop has ended never collects again: what its runs
    left goes once nobody collected it for ``_ABANDONED`` seconds, and a collect that
    comes after all gets those runs back failed, at once, then nothing more."""
    async with serving() as actor:
        await actor.submit(batch("gone", (0, payload("echo", "a")), (1, payload("echo", "b"))))
        await anyio.wait_all_tasks_blocked()
        assert len(actor._ended["gone"]) == 2
        await anyio.sleep(_ray_worker._ABANDONED - _ray_worker._IDLE)
        assert "gone" in actor._ended  # not yet
        await anyio.sleep(2 * _ray_worker._IDLE)
        assert "gone" not in actor._ended
        assert "dropped 2 ended runs of channel gone" in caplog.text
        start = anyio.current_time()
        late = pickle.loads(await actor.collect("gone"))
        assert anyio.current_time() == start
        assert sorted((number, how) for number, how, _ in late) == [(0, FAILED), (1, FAILED)]
        error = pickle.loads(late[0][2])
        assert "dropped its result" in str(error), error
        assert pickle.loads(await actor.collect("gone")) == []  # after the idle wait


@pytest.mark.parametrize(
    "anyio_backend", [pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}))]
)
async def test_a_collect_starts_the_wait_over_for_the_next_ends_of_its_channel() -> None:
    """What waited almost ``_ABANDONED`` seconds and was collected does not count against
    the channel's next ends: they get the whole wait again."""
    async with serving() as actor:
        for text in ("first", "second"):
            await actor.submit(batch("slow", (0, payload("echo", text))))
            await anyio.wait_all_tasks_blocked()
            await anyio.sleep(_ray_worker._ABANDONED * 0.9)
            ended = await collected(actor, "slow", 1)
            assert output(ended[0][1]) == f"echo {text}"


@pytest.mark.parametrize(
    "anyio_backend", [pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}))]
)
async def test_a_stall_of_the_actor_loop_itself_does_not_count_as_the_drivers_silence() -> None:
    """While a runner blocks the actor's event loop no collect can come in, so the time
    the loop lost is not time the channel's driver was silent; the silence before and
    after it still counts."""
    async with serving() as actor:
        await actor.submit(batch("held", (0, payload("echo", "kept"))))
        await anyio.wait_all_tasks_blocked()
        await anyio.sleep(_ray_worker._ABANDONED - 100)  # silent for 500 s
        pass_time_without_a_checkpoint(_ray_worker._ABANDONED * 2)  # the loop held up
        await anyio.sleep(_ray_worker._IDLE)  # the late sweep, and one on time
        assert "held" in actor._ended  # the stall did not count
        await anyio.sleep(_ray_worker._ABANDONED / 2)
        assert "held" not in actor._ended  # 500 s before it and 330 s after it did


@pytest.mark.parametrize(
    "anyio_backend", [pytest.param(("trio", {"clock": MockClock(autojump_threshold=0)}))]
)
async def test_the_channels_whose_ends_were_dropped_are_remembered_up_to_a_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_ray_worker, "_DROPPED_KEPT", 2)
    async with serving() as actor:
        for channel in ("one", "two", "three"):
            await actor.submit(batch(channel, (0, payload("echo", channel))))
            await anyio.wait_all_tasks_blocked()
            await anyio.sleep(_ray_worker._IDLE)  # dropped one sweep apart, oldest first
        await anyio.sleep(_ray_worker._ABANDONED + _ray_worker._IDLE)
        assert list(actor._dropped) == ["two", "three"]


# The actor's loop is asyncio; a stray CancelledError is an asyncio runner's.
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_runner_raising_cancelled_error_ends_only_its_run_and_the_actor_serves_on() -> None:
    Gate.opened = anyio.Event()
    async with serving() as actor:
        await actor.submit(
            batch("c", (0, payload("waits_at_the_gate")), (1, payload("raises_cancelled_error")))
        )
        first = await collected(actor, "c", 1)
        error = runner_error_of(first[1])
        assert isinstance(error, RuntimeError), error  # what a local runner's would be
        assert "raised CancelledError but nothing cancelled it" in str(error)
        await anyio.wait_all_tasks_blocked()
        try:
            await actor.submit(batch("c", (2, payload("echo", "after"))))
        except RuntimeError as exc:
            pytest.fail(f"the actor takes no more runs: {exc}")
        ended = {**first, **await collected(actor, "c", 1)}
        assert 0 not in ended, "a runner's own CancelledError ended another run"
        assert output(ended[2][1]) == "echo after"
        Gate.opened.set()
        assert output((await collected(actor, "c", 1))[0][1]) == "through"


class Abort(BaseException):
    """A runner's own exception outside ``Exception`` (some libraries unwind with one)."""


async def raises_a_base_exception(request: Request, ctx: object) -> str:
    raise Abort("the runner gave up")


@asynccontextmanager
async def serving_watched(
    stopped: list[BaseException],
) -> AsyncIterator[_ray_worker._WorkerActor]:
    """:func:`serving`, with what ended the actor's ``serve`` call (other than the test's
    own cancellation at the end) kept in ``stopped`` rather than failing the test's group."""
    actor = _ray_worker._WorkerActor(1000)

    async def serve() -> None:
        try:
            await actor.serve()
        except anyio.get_cancelled_exc_class():
            raise
        except BaseException as exc:  # the point: whatever ended it
            stopped.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve)
        yield actor
        tg.cancel_scope.cancel()


async def test_a_runner_raising_a_base_exception_of_its_own_ends_only_its_run() -> None:
    # Locally such an exception is the runner's error and the worker goes on
    # (subagents._runner_errors.runner_error); on an actor it must not reach the task group every
    # run belongs to, which would end every other run as "cancelled" and stop the actor.
    Gate.opened = anyio.Event()
    stopped: list[BaseException] = []
    async with serving_watched(stopped) as actor:
        await actor.submit(
            batch("c", (0, payload("waits_at_the_gate")), (1, payload("raises_a_base_exception")))
        )
        first = await collected(actor, "c", 1)
        assert 0 not in first, "a runner's BaseException ended another run of its actor"
        assert stopped == [], "a runner's BaseException stopped the actor serving"
        error = runner_error_of(first[1])
        assert isinstance(error, Abort), error
        assert "the runner gave up" in str(error)
        Gate.opened.set()
        assert output((await collected(actor, "c", 1))[0][1]) == "through"


@pytest.mark.parametrize("how", ["interrupt", "exit"])
async def test_an_interrupt_ends_its_run_with_a_reply_that_keeps_what_it_reported(
    how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupt on an actor would stop the event loop every run shares: it ends its
    run alone, as the reply's error, and the reply keeps the run's progress (the sink's
    copy may reach the driver only after the driver has looked)."""
    no_sink = _ray_worker._SinkClient("no-sink")
    no_sink._gone = True  # its reports go nowhere, and no Ray call starts a cluster here
    monkeypatch.setitem(_ray_worker._SINKS, "no-sink", no_sink)
    stopped: list[BaseException] = []
    async with serving_watched(stopped) as actor:
        interrupts = payload("tests.backends.ray.runners:reports_then_interrupts", how)
        await actor.submit(batch("c", (0, interrupts)))
        (ended,) = (await collected(actor, "c", 1)).values()
        error = runner_error_of(ended)
        raised = "SystemExit" if how == "exit" else "KeyboardInterrupt"
        assert f"the runner raised {raised} on its actor" in str(error), error
        reply: Reply = pickle.loads(ended[1])
        assert reply.progress is not None
        progress = reply.progress
        assert (progress.progress.output(), progress.iterations) == ("before the interrupt", 2)
        await actor.submit(batch("c", (1, payload("echo", "after"))))
        assert output((await collected(actor, "c", 1))[1][1]) == "echo after"
        assert stopped == []


# The actor's loop is asyncio's.
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_cancelled_run_ends_cancelled_whatever_it_raises_on_the_way_out() -> None:
    """The driver cancelled the run: an interrupt its runner raises with the cancellation
    (in one group) does not turn that end into a failure."""
    stopped: list[BaseException] = []
    async with serving_watched(stopped) as actor:
        await actor.submit(batch("c", (0, payload("interrupts_when_cancelled"))))
        await anyio.wait_all_tasks_blocked()
        await actor.cancel("c", [0])
        ended = await collected(actor, "c", 1)
        assert ended[0] == (CANCELLED, b"")
        assert stopped == []
