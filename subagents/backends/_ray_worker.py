"""The worker's side of :mod:`subagents.backends.ray`: the remote functions and actors.

An attempt arrives as one ``bytes`` argument (:func:`pack` of the runner, the ``Request``
and the :class:`~._ray_wire.Shipped` context) and leaves as one ``bytes`` reply; each
report goes to the progress sink actor as well, for the driver to read while the call
runs or to salvage when no reply comes.
"""

from __future__ import annotations

import logging
import pickle
from typing import TYPE_CHECKING, Any, Final

import anyio
import ray

from ._ray_wire import Reply, Runner, Shipped, Snapshot, Target, serve

if TYPE_CHECKING:
    from .._progress import Report
    from .._spec import Request

__all__ = ["Sink", "Worker", "pack", "run_task", "unpack"]

logger = logging.getLogger("subagents.backends.ray")

_TICK: Final = 0.02
"""Seconds between wake-ups of a task's event loop, so a cancel reaches a sleeping runner."""

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


async def _serve(target: Target, request: Request, shipped: Shipped) -> Reply:
    sink = _SINKS.get(shipped.sink)
    if sink is None:
        sink = _SINKS[shipped.sink] = _SinkClient(shipped.sink)
    reply = await serve(target, request, shipped, sink, _RUNNERS, pack)
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
    """An async actor of the pool: each call runs one attempt in the actor's event loop."""

    async def run(self, payload: bytes) -> bytes:
        return pack(await _serve(*unpack(payload)))


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
