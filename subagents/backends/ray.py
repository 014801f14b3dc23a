"""RayBackend: each child's runner runs on a Ray cluster; the manager keeps the rest.

The one module that imports ray (the ``subagents[ray]`` extra). Admission, the watchdog,
sessions, mailboxes, retries and envelopes stay in the driver's manager; this backend
ships each attempt (the ``Request`` and a small context, :mod:`._ray_wire`) to an async
actor of a pool, or to a task, and waits on its ``ObjectRef.future()`` through
:mod:`._ray_bridge`, so the driver may run on asyncio or trio. See ``design/backends.md``.
"""

from __future__ import annotations

import logging
import pickle
import uuid
from collections.abc import Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Final

import anyio
import ray
import ray.exceptions

from .._errors import ConfigError
from .._retry import run_with_retries
from .._tracing import trace_carrier
from .._validators import count, number, seconds, text
from ._ray_bridge import finished, settled
from ._ray_wire import (
    Delta,
    Reply,
    Runner,
    Shipped,
    Snapshot,
    Target,
    revived,
    serve,
    target_of,
)

if TYPE_CHECKING:
    from .._context import RunContext
    from .._spec import AgentSpec, Request, Result

__all__ = ["RayBackend"]

logger = logging.getLogger("subagents.backends.ray")

_MODES: Final = ("actor", "task")
_SETTLE: Final = 5.0
"""Seconds to wait for Ray to confirm a forced stop (a killed actor, a forced cancel)."""
_COLLECT: Final = 2.0
"""Seconds to wait for the progress sink to hand over a run's reported progress."""
_TICK: Final = 0.02
"""Seconds between wake-ups of a task's event loop, so a cancel reaches a sleeping runner."""


# ------------------------------------------------------------------ the worker's side

_RUNNERS: dict[str, Runner] = {}
"""Runners imported by this worker process, by import path."""


class _SinkClient:
    """A worker's way to the progress sink actor, looked up by name on the first report
    (a run that never reports never pays for it). Reports are fire-and-forget calls from
    one process to one actor, so the sink applies them in the order they were made."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._actor: Any = None

    def _handle(self) -> Any:
        if self._actor is None:
            self._actor = ray.get_actor(self._name)
        return self._actor

    def push(self, task_id: str, delta: Delta) -> None:
        self._handle().push.remote(task_id, delta)

    def drop(self, task_id: str) -> None:
        self._handle().drop.remote(task_id)


_SINKS: dict[str, _SinkClient] = {}


async def _serve(target: Target, request: Request, shipped: Shipped) -> Reply:
    sink = _SINKS.get(shipped.sink)
    if sink is None:
        sink = _SINKS[shipped.sink] = _SinkClient(shipped.sink)
    reply = await serve(target, request, shipped, sink, _RUNNERS)
    if reply.progress is not None:  # the reply carries it: the sink's copy is not needed
        sink.drop(shipped.task_id)
    return reply


def _pack(value: object, *, by_value: bool = False) -> bytes:
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


def _unpack(blob: bytes) -> Any:
    return pickle.loads(blob)


class _WorkerActor:
    """An async actor of the pool: each call runs one attempt in the actor's event loop."""

    async def run(self, payload: bytes) -> bytes:
        return _pack(await _serve(*_unpack(payload)))


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
    return _pack(anyio.run(_ticking, *_unpack(payload)))


class _SinkActor:
    """Keeps the progress runners report, for the driver to take when no reply comes (a
    cancellation, a timeout, a dead worker)."""

    def __init__(self) -> None:
        self._progress: dict[str, Snapshot] = {}

    def push(self, task_id: str, delta: Delta) -> None:
        snapshot = self._progress.get(task_id)
        if snapshot is None:
            snapshot = self._progress[task_id] = Snapshot()
        snapshot.apply(*delta)

    def drop(self, task_id: str) -> None:
        self._progress.pop(task_id, None)

    def take(self, task_id: str) -> Snapshot | None:
        return self._progress.pop(task_id, None)


# Built by call, not as decorators: ray is untyped for the type checker.
_Worker: Any = ray.remote(_WorkerActor)
_Sink: Any = ray.remote(_SinkActor)
_run_task: Any = ray.remote(_task_body)


# ------------------------------------------------------------------ the driver's side


class _Slot:
    """One actor of the pool and the calls it is running."""

    __slots__ = ("actor", "busy")

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self.busy = 0


def _placement(resources: Mapping[str, object] | None) -> dict[str, Any]:
    """Ray's options for ``resources``: ``CPU`` and ``GPU`` as Ray's own arguments."""
    if resources is None:
        return {}
    if not isinstance(resources, Mapping):
        raise ConfigError("resources", "a mapping of resource names to amounts", resources)
    options: dict[str, Any] = {}
    custom: dict[str, float] = {}
    for name, amount in resources.items():
        key = text("resources", name)
        value = number(f"resources[{key!r}]", amount)
        if key == "CPU":
            options["num_cpus"] = value
        elif key == "GPU":
            options["num_gpus"] = value
        else:
            custom[key] = value
    if custom:
        options["resources"] = custom
    return options


class RayBackend:
    """A :data:`~subagents.Backend` that runs each child's runner on a Ray cluster.

    Pass it as ``SubagentManager(agents, backend=RayBackend())``. Each attempt ships the
    ``Request`` and a :class:`~subagents.backends._ray_wire.RemoteContext` (task id, agent
    path, attempt, permissions, seconds remaining, a W3C trace carrier); the runner is
    found in the worker by its import path (a module-level function), or shipped by value.
    ``ctx.report()`` in the worker reaches the envelope. The runner cannot delegate:
    ``ctx.spawn`` and ``ctx.execute`` raise :class:`~subagents.SpawnRejected` (``remote``).

    A cancellation or the watchdog calls ``ray.cancel``; a run still going ``force_after``
    seconds later is stopped by force: its task cancelled with ``force=True``, or (actor
    mode) its actor killed, which ends every run on that actor in an error envelope. A dead
    worker or actor ends the child in an ``error`` envelope whose ``error_type`` is Ray's
    (``ray.exceptions.ActorDiedError``, ``ray.exceptions.WorkerCrashedError``). Ray's own
    retries are off; the agent's ``RetryPolicy`` decides, each attempt a new call.

    Ray is initialised on first use (``ray.init(address=address)``, blocking) unless the
    program did so already.

    Args:
        address: the cluster to join when this backend initialises Ray (``None``: a local
            one, or ``RAY_ADDRESS``).
        mode: ``"actor"`` (default) runs attempts as calls to a pool of async actors,
            concurrently in each actor's event loop; ``"task"`` runs each as a Ray task in
            an event loop of its own (one worker process per running child; for runners
            that block).
        pool_size: actors in the pool (actor mode), started as children first need them.
        max_concurrency: concurrent calls one actor runs (actor mode).
        force_after: seconds from a cancel to the forced stop.
        runtime_env: Ray's ``runtime_env`` for the actors or tasks.
        resources: what each actor (actor mode) or task needs, e.g. ``{"CPU": 1}`` or
            ``{"agent_slot": 1}``.

    Raises:
        ConfigError: an argument of the wrong type or range, naming it.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        mode: str = "actor",
        pool_size: int = 4,
        max_concurrency: int = 1000,
        force_after: float = 5.0,
        runtime_env: Mapping[str, object] | None = None,
        resources: Mapping[str, float] | None = None,
    ) -> None:
        if address is not None:
            address = text("address", address)
        if mode not in _MODES:
            raise ConfigError("mode", "'actor' or 'task'", mode)
        self._address = address
        self._mode = mode
        self._pool_size = count("pool_size", pool_size, minimum=1)
        self._force_after = seconds("force_after", force_after, none_ok=False, zero_ok=True)
        options = _placement(resources)
        if runtime_env is not None:
            if not isinstance(runtime_env, Mapping):
                raise ConfigError("runtime_env", "a mapping (Ray's runtime_env)", runtime_env)
            options["runtime_env"] = dict(runtime_env)
        concurrency = count("max_concurrency", max_concurrency, minimum=1)
        self._actor_options = {
            **options,
            "max_concurrency": concurrency,
            "max_restarts": 0,
            "max_task_retries": 0,
        }
        self._task = _run_task.options(**options, max_retries=0)
        self._pool: list[_Slot] = []
        self._sink: Any = None
        self._sink_name = f"subagents-progress-{uuid.uuid4().hex}"
        self._targets: dict[Runner, Target] = {}

    @property
    def mode(self) -> str:
        """``"actor"`` or ``"task"``."""
        return self._mode

    def close(self) -> None:
        """End this backend's actors (the pool and the progress sink); a later run
        starts new ones. Runs still going on them end in error envelopes."""
        pool, self._pool = self._pool, []
        sink, self._sink = self._sink, None
        for actor in [slot.actor for slot in pool] + ([sink] if sink is not None else []):
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already gone, or Ray shut down
                logger.debug("killing a Ray actor failed", exc_info=True)

    async def __call__(self, spec: AgentSpec, request: Request, ctx: RunContext) -> Result:
        """Run ``spec``'s runner on the cluster, retrying under ``spec.retry``."""
        self._ready()
        if spec.retry is None:
            return await self._attempt(spec, request, ctx)

        async def attempt(number: int) -> Result:
            ctx.attempt = number
            return await self._attempt(spec, request, ctx)

        return await run_with_retries(spec.retry, attempt, deadline=ctx.deadline)

    def _ready(self) -> None:
        if not ray.is_initialized():
            ray.init(address=self._address)
        if self._sink is None:
            self._sink = _Sink.options(name=self._sink_name, num_cpus=0).remote()

    def _target(self, runner: Runner) -> Target:
        target = self._targets.get(runner)
        if target is None:
            target = self._targets[runner] = target_of(runner)
        return target

    def _slot(self) -> _Slot:
        """The actor for the next call: a new one while the pool is short, else the
        least busy."""
        if len(self._pool) < self._pool_size:
            slot = _Slot(_Worker.options(**self._actor_options).remote())
            self._pool.append(slot)
            return slot
        return min(self._pool, key=_busy)

    def _retire(self, slot: _Slot) -> None:
        """Take a dead (or killed) actor out of the pool; the next call starts another."""
        if slot in self._pool:
            self._pool.remove(slot)

    async def _attempt(self, spec: AgentSpec, request: Request, ctx: RunContext) -> Result:
        shipped = Shipped(
            task_id=ctx.task_id,
            parent_session_id=ctx.parent_session_id,
            agent=ctx.agent,
            agent_path=str(ctx.agent_path),
            parent_path=str(ctx.parent_path),
            attempt=ctx.attempt,
            permissions=ctx.permissions,
            remaining=ctx.remaining(),
            carrier=trace_carrier(),
            sink=self._sink_name,
        )
        target = self._target(spec.runner)
        payload = _pack((target, request, shipped), by_value=not isinstance(target, str))
        slot = None
        if self._mode == "task":
            ref = self._task.remote(payload)
        else:
            slot = self._slot()
            ref = slot.actor.run.remote(payload)
        future: Future[bytes] = ref.future()
        if slot is not None:
            slot.busy += 1
        try:
            reply: Reply = _unpack(await settled(future))
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self._stop(ref, future, slot)
                await self._salvage(ctx, future)
            raise
        except ray.exceptions.RayError as exc:  # the worker, the actor or the reply was lost
            if slot is not None and isinstance(exc, ray.exceptions.RayActorError):
                self._retire(slot)
            with anyio.CancelScope(shield=True):
                await self._salvage(ctx, None)
            raise
        finally:
            if slot is not None:
                slot.busy -= 1
        if reply.progress is not None:
            _report(ctx, reply.progress)
        if reply.error is not None:
            raise revived(reply.error)
        assert reply.result is not None
        return reply.result

    async def _stop(self, ref: Any, future: Future[bytes], slot: _Slot | None) -> None:
        """Ray's cancel of ``ref``; if it still runs ``force_after`` seconds later, the
        forced stop: a forced cancel of its task, or its actor killed."""
        try:
            ray.cancel(ref)
        except Exception:
            logger.exception("ray.cancel of a child's call failed")
        with anyio.move_on_after(self._force_after):
            await finished(future)
            return
        try:
            if slot is None:
                ray.cancel(ref, force=True)
            else:
                self._retire(slot)
                ray.kill(slot.actor, no_restart=True)
        except Exception:
            logger.exception("stopping a child's call by force failed")
        with anyio.move_on_after(_SETTLE):
            await finished(future)

    async def _salvage(self, ctx: RunContext, future: Future[bytes] | None) -> None:
        """Bring what a run without a usable reply reported into its envelope: from a
        reply that came after all, else from the sink."""
        progress = None
        if future is not None and future.done() and future.exception() is None:
            reply: Reply = _unpack(future.result())
            progress = reply.progress
        if progress is None and self._sink is not None:
            with anyio.move_on_after(_COLLECT):
                try:
                    progress = await settled(self._sink.take.remote(ctx.task_id).future())
                except ray.exceptions.RayError:
                    logger.warning("the progress of child %r was lost", ctx.task_id)
        if progress is not None:
            _report(ctx, progress)


def _busy(slot: _Slot) -> int:
    return slot.busy


def _report(ctx: RunContext, progress: Snapshot) -> None:
    ctx.report(
        output=progress.output,
        usage=progress.usage,
        iterations=progress.iterations,
        files_changed=progress.files or None,
    )
