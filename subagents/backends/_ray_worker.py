"""The worker's side of :mod:`subagents.backends.ray`: the remote functions and actors.

An attempt travels as one ``bytes`` payload (:func:`pack` of the runner, the ``Request``
and the :class:`~._ray_wire.Shipped` context) and leaves as one ``bytes`` reply: a task's
argument and return value, or, on a pool actor, an entry of a batch that a channel submits
and of what it collects (:mod:`._ray_channel`). Each report goes to the progress sink
actor as well, for the driver to read while the call runs or to salvage when no reply
comes.
"""

from __future__ import annotations

import logging
import pickle
from typing import TYPE_CHECKING, Any, Final

import anyio
import ray

from .._runner_errors import being_cancelled, runner_error
from ._ray_wire import (
    CANCELLED,
    FAILED,
    REPLIED,
    Completion,
    RemoteRunnerError,
    Reply,
    Runner,
    Shipped,
    Snapshot,
    Target,
    interrupted_on_actor,
    portable,
    serve,
)

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from .._progress import Report
    from .._spec import Request

__all__ = ["Sink", "Worker", "pack", "run_task", "unpack"]

logger = logging.getLogger("subagents.backends.ray")

_TICK: Final = 0.02
"""Seconds between wake-ups of a task's event loop, so a cancel reaches a sleeping runner."""
_IDLE: Final = 30.0
"""Seconds an actor's collect waits for an ended run before it answers with none."""
_ABANDONED: Final = 600.0
"""Seconds ended runs of a channel wait for a collect before the actor drops them: a
driver's live event loop keeps a collect pending while any of its calls runs, each back
within :data:`_IDLE`, so that long without one means the loop has ended."""
_DROPPED_KEPT: Final = 1024
"""Channels whose dropped runs the actor remembers, to fail them if a collect comes late."""
_CANCELLED_EARLY: Final = 4096
"""Cancels of runs not yet arrived that an actor keeps; past them it forgets the oldest
(such a run then goes on until the driver stops it by force, which kills the actor and
ends every other run on it)."""

_RUNNERS: dict[str | bytes, Runner] = {}
"""Runners resolved by this worker process, by import path or pickled code."""


class _SinkClient:
    """A worker's way to the progress sink actor, looked up by name on the first report
    (a run that never reports never pays for it). Reports are fire-and-forget calls from
    one process to one actor, so the sink applies them in the order they were made. A sink
    that is gone (its backend closed, its node lost) costs the driver only the salvaged
    progress: a report never fails the runner."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._actor: Any = None
        self._gone = False

    def _handle(self) -> Any:
        if self._actor is None and not self._gone:
            try:
                self._actor = ray.get_actor(self._name)
            except Exception:
                self._gone = True
                logger.warning(
                    "progress sink %r is gone: reports travel with replies only", self._name
                )
        return self._actor

    def push(self, task_id: str, report: Report) -> None:
        self._call("push", task_id, report)

    def drop(self, task_id: str) -> None:
        self._call("drop", task_id)

    def _call(self, method: str, *args: object) -> None:
        actor = self._handle()
        if actor is None:
            return
        try:
            getattr(actor, method).remote(*args)
        except Exception:
            logger.warning("a call to progress sink %r failed", self._name, exc_info=True)


_SINKS: dict[str, _SinkClient] = {}


async def _serve(
    target: Target, request: Request, shipped: Shipped, *, on_actor: bool = False
) -> Reply:
    sink = _SINKS.get(shipped.sink)
    if sink is None:
        sink = _SINKS[shipped.sink] = _SinkClient(shipped.sink)
    # On an actor an interrupt ends its run alone, and its reply keeps what the run
    # reported: the sink's copy may reach the driver after the driver has looked.
    reply = await serve(target, request, shipped, sink, _RUNNERS, pack, interrupt_is_error=on_actor)
    if reply.progress is not None:  # the reply carries it: the sink's copy is not needed
        sink.drop(shipped.task_id)
    return reply


def pack(value: object, *, by_value: bool = False) -> bytes:
    """``value`` pickled: by the standard pickler when it can, else (or ``by_value``: a
    runner shipped as itself, which the worker cannot import) by Ray's cloudpickle.

    Each attempt crosses as one ``bytes`` argument and returns one: Ray's cost grows with
    every argument, and its cloudpickle is slower than the standard pickler's C code."""
    if not by_value:
        try:
            return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # a class the worker has by value only (the driver's __main__)
            pass
    return bytes(ray.cloudpickle.dumps(value))


def unpack(blob: bytes) -> Any:
    return pickle.loads(blob)


class _WorkerActor:
    """An async actor of the pool, running attempts in its event loop for the driver's
    channels (:mod:`._ray_channel`), each known by its name: :meth:`submit` hands over a
    batch of attempts, :meth:`collect` takes what the ones ended since the last left (a
    submit may collect too), and :meth:`cancel` cancels some. Every run belongs to one
    task group, which :meth:`serve` (the first call the driver makes) holds open for the
    actor's life; at most ``max_concurrency`` runs go at once, the rest wait in turn.
    What a channel leaves uncollected for :data:`_ABANDONED` seconds is dropped."""

    def __init__(self, max_concurrency: int) -> None:
        self._max_concurrency = max_concurrency
        self._started: anyio.Event | None = None
        self._group: TaskGroup | None = None
        self._limiter: anyio.CapacityLimiter | None = None
        self._scopes: dict[tuple[str, int], anyio.CancelScope] = {}
        """The runs not yet ended, by channel and number."""
        self._ended: dict[str, list[Completion]] = {}
        """What ended runs left, by channel, until it collects them."""
        self._waiting_since: dict[str, float] = {}
        """When the oldest of each channel's uncollected ends came."""
        self._dropped: dict[str, list[int]] = {}
        """The runs of channels whose ends waited too long, oldest channel first."""
        self._collectors: dict[str, anyio.Event] = {}
        self._cancelled_early: dict[tuple[str, int], None] = {}
        """Runs cancelled before they arrived, oldest first."""

    def _start(self) -> anyio.Event:
        # Made in the actor's loop: an anyio event needs one.
        if self._started is None:
            self._started = anyio.Event()
        return self._started

    async def serve(self) -> None:
        async with anyio.create_task_group() as group:
            self._limiter = anyio.CapacityLimiter(self._max_concurrency)
            self._group = group
            self._start().set()
            swept = anyio.current_time()
            while True:
                await anyio.sleep(_IDLE)  # as often as a live driver's collects come back
                now = anyio.current_time()
                lost = now - swept - _IDLE
                if lost > _IDLE:
                    # This loop was held up (a runner blocking it) and no collect could
                    # come in meanwhile: that time is not the drivers' silence.
                    self._waiting_since = {
                        channel: min(since + lost, now)
                        for channel, since in self._waiting_since.items()
                    }
                swept = now
                self._drop_abandoned(now - _ABANDONED)

    def _drop_abandoned(self, before: float) -> None:
        """Drop what ended runs left on channels nobody has collected from since
        ``before``: their driver's event loop has ended, and the replies would stay in
        this actor for its life. A collect that comes after all fails those runs."""
        for channel, since in list(self._waiting_since.items()):
            if since > before:  # (a channel with ends waiting has no collect pending)
                continue
            del self._waiting_since[channel]
            numbers = [number for number, _, _ in self._ended.pop(channel, [])]
            logger.warning(
                "dropped %d ended runs of channel %s: no collect came for %g s",
                len(numbers),
                channel,
                _ABANDONED,
            )
            self._dropped.setdefault(channel, []).extend(numbers)
            while len(self._dropped) > _DROPPED_KEPT:
                del self._dropped[next(iter(self._dropped))]

    async def submit(self, blob: bytes) -> bytes | None:
        """Start the runs of a batch (``blob``: the channel, whether this call collects,
        and the runs, pickled as one argument: Ray's cost grows with each); if it
        collects, then answer as :meth:`collect`."""
        channel, collects, batch = unpack(blob)
        await self._start().wait()
        assert self._group is not None
        for number, payload in batch:
            key = (channel, number)
            if key in self._cancelled_early:
                del self._cancelled_early[key]
                self._end(channel, (number, CANCELLED, b""))
                continue
            scope = self._scopes[key] = anyio.CancelScope()
            self._group.start_soon(self._run, channel, number, payload, scope)
        return await self.collect(channel) if collects else None

    async def _run(
        self, channel: str, number: int, payload: bytes, scope: anyio.CancelScope
    ) -> None:
        assert self._limiter is not None
        ended: Completion = (number, CANCELLED, b"")
        try:
            with scope:
                async with self._limiter:
                    reply = await _serve(*unpack(payload), on_actor=True)
                ended = (number, REPLIED, pack(reply))
        except BaseException as exc:
            # Let into the task group, it would end every run of the actor; out of the
            # event loop (an interrupt), it would end Ray's thread running that loop and
            # leave the actor alive and deaf. Only the group's own cancellation goes on.
            if being_cancelled():
                raise
            if not scope.cancel_called:  # else cancelled, whatever it raised on the way out
                error = runner_error(exc)
                if error is None:  # an interrupt: on an actor, it stops this run only
                    error = interrupted_on_actor(exc)
                ended = (number, FAILED, portable(error, pack))
        finally:
            del self._scopes[(channel, number)]
            self._end(channel, ended)

    def _end(self, channel: str, ended: Completion) -> None:
        self._ended.setdefault(channel, []).append(ended)
        self._waiting_since.setdefault(channel, anyio.current_time())
        collector = self._collectors.pop(channel, None)
        if collector is not None:
            collector.set()

    async def collect(self, channel: str) -> bytes:
        """What the runs of ``channel`` that ended since the last collect left; none after
        :data:`_IDLE` seconds (a collect whose driver is gone does not wait forever). Runs
        whose ends were dropped (:meth:`_drop_abandoned`) come back failed."""
        try:
            with anyio.move_on_after(_IDLE):
                while channel not in self._ended and channel not in self._dropped:
                    collector = self._collectors[channel] = anyio.Event()
                    await collector.wait()
        finally:
            self._collectors.pop(channel, None)
        self._waiting_since.pop(channel, None)
        ended = self._ended.pop(channel, [])
        dropped = self._dropped.pop(channel, None)
        if dropped:
            error = RemoteRunnerError(
                f"the run ended, but its actor dropped its result after {_ABANDONED:g} s "
                f"with no collect from this event loop"
            )
            blob = portable(error, pack)
            ended.extend((number, FAILED, blob) for number in dropped)
        return pack(ended)

    async def cancel(self, channel: str, numbers: list[int]) -> None:
        for number in numbers:
            key = (channel, number)
            scope = self._scopes.get(key)
            if scope is not None:
                scope.cancel()
            elif not any(ended[0] == number for ended in self._ended.get(channel, ())):
                # Not arrived yet (or ended and already collected: then a stale entry
                # that the bound drops in time).
                self._cancelled_early[key] = None
                if len(self._cancelled_early) > _CANCELLED_EARLY:
                    del self._cancelled_early[next(iter(self._cancelled_early))]


async def _ticking(target: Target, request: Request, shipped: Shipped) -> Reply:
    # Ray cancels a normal task by interrupting its Python code, and an event loop asleep
    # in its selector runs none: a tick every _TICK seconds lets the interrupt land.
    async with anyio.create_task_group() as tg:
        tg.start_soon(_tick)
        reply = await _serve(target, request, shipped)
        tg.cancel_scope.cancel()
    return reply


async def _tick() -> None:
    while True:  # noqa: ASYNC110  # waking the loop is the point, there is no event to await
        await anyio.sleep(_TICK)


def _task_body(payload: bytes) -> bytes:
    """One attempt as a normal Ray task, in an event loop of its own."""
    return pack(anyio.run(_ticking, *unpack(payload)))


class _SinkActor:
    """Keeps the progress runners report, for the driver to take when no reply comes (a
    cancellation, a timeout, a dead worker)."""

    def __init__(self) -> None:
        self._progress: dict[str, Snapshot] = {}

    def push(self, task_id: str, report: Report) -> None:
        snapshot = self._progress.get(task_id)
        if snapshot is None:
            snapshot = self._progress[task_id] = Snapshot()
        snapshot.apply(report)

    def drop(self, task_id: str) -> None:
        self._progress.pop(task_id, None)

    def peek(self, task_id: str) -> Snapshot | None:
        return self._progress.get(task_id)

    def take(self, task_id: str) -> Snapshot | None:
        return self._progress.pop(task_id, None)


# Built by call, not as decorators: ray is untyped for the type checker.
Worker: Any = ray.remote(_WorkerActor)
Sink: Any = ray.remote(_SinkActor)
run_task: Any = ray.remote(_task_body)
