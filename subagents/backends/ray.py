"""RayBackend: each child's runner runs on a Ray cluster; the manager keeps the rest.

This module and :mod:`._ray_worker` (the worker's side) import ray (the ``subagents[ray]``
extra). Admission, the watchdog, sessions, mailboxes, retries and envelopes stay in the
driver's manager; this backend
ships each attempt (the ``Request`` and a small context, :mod:`._ray_wire`) to an async
actor of a pool, batched with the others of the same turn of the event loop
(:mod:`._ray_channel`), or to a task, whose ``ObjectRef.future()`` it waits on; completions
reach the event loop through :mod:`._ray_bridge`, so the driver may run on asyncio or
trio. See ``design/backends.md``.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Mapping
from concurrent.futures import Future
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Protocol

import anyio
import anyio.to_thread
import ray
import ray.exceptions

from .._errors import ConfigError
from .._retry import run_with_retries
from .._thread_owner import ThreadOwner
from .._tracing import trace_carrier
from .._validators import count, seconds, text
from ._ray_bridge import done_event, settled
from ._ray_channel import Slot
from ._ray_options import placement
from ._ray_progress import Reported, mark, watched
from ._ray_targets import Targets
from ._ray_wire import (
    ClusterLostError,
    RemoteContext,
    RemoteRunnerError,
    Reply,
    Shipped,
    Snapshot,
    Target,
    revived,
)
from ._ray_worker import Sink as _Sink
from ._ray_worker import Worker as _Worker
from ._ray_worker import pack as _pack
from ._ray_worker import run_task as _run_task
from ._ray_worker import unpack as _unpack

if TYPE_CHECKING:
    from .._context import RunContext
    from .._spec import AgentSpec, Request, Result

__all__ = ["ClusterLostError", "RayBackend", "RemoteContext", "RemoteRunnerError"]

# Public here, where users import them (and where envelopes name them).
ClusterLostError.__module__ = __name__
RemoteContext.__module__ = __name__
RemoteRunnerError.__module__ = __name__

logger = logging.getLogger("subagents.backends.ray")

_MODES: Final = ("actor", "task")
_SETTLE: Final = 5.0
"""Seconds to wait for Ray to confirm a forced stop (a killed actor, a forced cancel)."""
_COLLECT: Final = 2.0
"""Seconds to wait for the progress sink to hand over a run's reported progress."""
_POLL: Final = 0.25
"""Seconds between the driver's checks on a running call: that Ray is still up, and (for a
child with a token budget or progress listeners) what it has reported."""
_INIT_LOCK = threading.Lock()
_ACTOR_CALLS: Final = 256
"""Ray calls one actor of the pool takes at once: its ``serve``, one collect per driver
loop (a ``collect``, or a ``submit`` that collects, held up to 30 s), and the other
``submit`` and ``cancel`` calls, which return once their runs are started or cancelled.
Runs are not Ray calls there: the actor's own limiter holds them to ``max_concurrency``."""


# ------------------------------------------------------------------ the driver's side


class _Call(Protocol):
    """One attempt on Ray, as the driver waits on it: a task, or a call of a channel."""

    @property
    def done(self) -> anyio.Event: ...

    def result(self) -> bytes: ...

    def reply(self) -> bytes | None: ...

    def cancel(self) -> None: ...


class _TaskCall:
    """One attempt as a Ray task: its reference and its future."""

    __slots__ = ("_future", "_ref", "done")

    def __init__(self, ref: Any) -> None:
        self._ref = ref
        self._future: Future[bytes] = ref.future()
        self.done = done_event(self._future)

    def result(self) -> bytes:
        return self._future.result()

    def reply(self) -> bytes | None:
        future = self._future
        return future.result() if future.done() and future.exception() is None else None

    def cancel(self) -> None:
        ray.cancel(self._ref)

    def force(self) -> None:
        ray.cancel(self._ref, force=True)


class RayBackend:
    """A :data:`~subagents.Backend` that runs each child's runner on a Ray cluster.

    Pass it as ``SubagentManager(agents, backend=RayBackend())``. Each attempt ships the
    ``Request`` and a :class:`RemoteContext` (task id, agent path, attempt, permissions,
    seconds remaining, the budget left, a W3C trace carrier); the runner is found in the
    worker by its import path (a module-level function), or shipped by value (a closure,
    a function of ``__main__``, or one whose module the workers cannot import).
    ``ctx.report()`` in the worker reaches the envelope. The runner cannot delegate:
    ``ctx.spawn`` and ``ctx.execute`` raise :class:`~subagents.SpawnRejected` (``remote``).

    One backend serves one thread's event loop at a time: while children of one thread
    run on it, a child run from another thread ends in an ``error`` envelope
    (``RuntimeError``, naming both threads) instead of sharing the pool with no lock. Once
    they have ended, any thread may use it. Make one backend per thread to run children
    from several at once. :meth:`close` may be called from any thread.

    A cancellation or the watchdog cancels the run (in actor mode the actor cancels it in
    its event loop, as ``ray.cancel`` of an async actor call would; a task gets
    ``ray.cancel``); a run still going ``force_after`` seconds later is stopped by force:
    its task cancelled with ``force=True``, or (actor mode) its actor killed, which ends
    every run on that actor in an error envelope (so ``force_after=0`` there kills an
    actor at every cancel). A dead
    worker or actor ends the child in an ``error`` envelope whose ``error_type`` is Ray's
    (``ray.exceptions.ActorDiedError``, ``ray.exceptions.WorkerCrashedError``). Ray's own
    retries are off; the agent's ``RetryPolicy`` decides, each attempt a new call.

    Ray is initialised on first use (``ray.init(address=address)``, in a worker thread, so
    the event loop keeps running) unless the program did so already; once it has shut
    down, the backend starts no cluster (only the program does: an attempt before that
    ends in :class:`ClusterLostError`). A child running when
    Ray shuts down ends in an ``error`` envelope (:class:`ClusterLostError`) within a
    quarter of a second.

    Args:
        address: the cluster to join when this backend initialises Ray (``None``: a local
            one, or ``RAY_ADDRESS``).
        mode: ``"actor"`` (default) runs attempts as calls to a pool of async actors,
            concurrently in each actor's event loop; ``"task"`` runs each as a Ray task in
            an event loop of its own (one worker process per running child; for runners
            that block).
        pool_size: actors in the pool (actor mode), started as children first need them.
        max_concurrency: attempts one actor runs at once (actor mode); more wait in it.
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
        options = placement(resources)
        if runtime_env is not None:
            if not isinstance(runtime_env, Mapping):
                raise ConfigError("runtime_env", "a mapping (Ray's runtime_env)", runtime_env)
            options["runtime_env"] = dict(runtime_env)
        # The sink needs the workers' environment (it imports this package), but none of
        # what each child needs: one long-lived actor holding a child's slot for the
        # backend's life would leave every child waiting on a cluster of one slot.
        self._sink_options: dict[str, Any] = {
            "num_cpus": 0,
            **({"runtime_env": options["runtime_env"]} if "runtime_env" in options else {}),
        }
        self._max_concurrency = count("max_concurrency", max_concurrency, minimum=1)
        self._actor_options = {
            **options,
            "max_concurrency": _ACTOR_CALLS,
            "max_restarts": 0,
            "max_task_retries": 0,
        }
        self._task = _run_task.options(**options, max_retries=0)
        self._pool: list[Slot] = []
        self._joined: tuple[str, str] | None = None
        """The cluster the pool and the sink belong to (see :func:`_cluster`)."""
        self._sink: Any = None
        self._sink_name = ""
        self._targets = Targets(partial(_pack, by_value=True))
        # The pool, the sink and each slot's count of runs change without a lock.
        self._owner = ThreadOwner("RayBackend")

    @property
    def mode(self) -> str:
        """``"actor"`` or ``"task"``."""
        return self._mode

    def close(self) -> None:
        """End this backend's actors (the pool and the progress sink); a later run
        starts new ones (a new sink under a new name). Runs still going on them end in
        error envelopes."""
        up = self._up()
        pool, sink = self._forget()
        if not up:  # nothing to kill, and no new cluster to start
            return
        for actor in [slot.actor for slot in pool] + ([sink] if sink is not None else []):
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already gone, or Ray shut down
                logger.debug("killing a Ray actor failed", exc_info=True)

    def _forget(self) -> tuple[list[Slot], Any]:
        pool, self._pool = self._pool, []
        sink, self._sink = self._sink, None
        return pool, sink

    async def __call__(self, spec: AgentSpec, request: Request, ctx: RunContext) -> Result:
        """Run ``spec``'s runner on the cluster, retrying under ``spec.retry``."""
        with self._owner.using():
            reported = Reported(ctx)
            if spec.retry is None:
                return await self._attempt(spec, request, reported)

            async def attempt(number: int) -> Result:
                ctx.attempt = number
                reported.earlier = reported.latest
                return await self._attempt(spec, request, reported)

            return await run_with_retries(spec.retry, attempt, deadline=ctx.deadline)

    async def _ready(self) -> tuple[str, str]:
        """The cluster the next attempt runs on, this backend's pool and sink made there.
        Ray is initialised on the backend's first use only: once Ray has shut down, only
        the program starts it again (an attempt before that is ``ClusterLostError``)."""
        if not ray.is_initialized():
            if self._joined is not None:
                raise ClusterLostError(
                    "Ray was shut down, and this backend starts no new cluster: "
                    "call ray.init() again (or use a new RayBackend)"
                )
            await anyio.to_thread.run_sync(self._init)
        cluster = _cluster()
        if cluster is None:  # shut down meanwhile, from another thread
            raise ClusterLostError("Ray shut down as this backend joined it")
        if cluster != self._joined:  # first use, or Ray was shut down and started again
            self._forget()  # their handles belong to a cluster that is gone
            self._joined = cluster
        if self._sink is None:
            self._sink_name = f"subagents-progress-{uuid.uuid4().hex}"
            self._sink = _Sink.options(name=self._sink_name, **self._sink_options).remote()
        return cluster

    def _up(self) -> bool:
        """Whether Ray is up, on the cluster this backend's actors belong to."""
        return _on(self._joined)

    def _init(self) -> None:
        with _INIT_LOCK:  # two first children, one cluster
            if not ray.is_initialized():
                ray.init(address=self._address)

    def _slot(self) -> Slot:
        """The actor for the next call: a new one while the pool is short, else the
        least busy. An actor that takes no more runs (its ``serve`` ended) leaves the
        pool first."""
        for ended in [slot for slot in self._pool if slot.ended]:
            self._retire(ended)
        if len(self._pool) < self._pool_size:
            actor = _Worker.options(**self._actor_options).remote(self._max_concurrency)
            # Up on the cluster the actor was made on (a closure over that, not over the
            # backend, which the channels kept for the loop's life would keep alive).
            slot = Slot(actor, partial(_on, self._joined))
            self._pool.append(slot)
            return slot
        return min(self._pool, key=_busy)

    def _retire(self, slot: Slot) -> None:
        """Take an actor out of the pool, and kill it (it may be alive but unable to
        serve, or unreachable for now): the next call starts another."""
        try:
            self._pool.remove(slot)
        except ValueError:  # retired already, or close() (from any thread) emptied the pool
            return
        if slot.up():  # a kill with Ray down would start a new cluster
            try:
                ray.kill(slot.actor, no_restart=True)
            except Exception:  # dead already
                logger.debug("killing a retired Ray actor failed", exc_info=True)

    async def _attempt(self, spec: AgentSpec, request: Request, reported: Reported) -> Result:
        cluster = await self._ready()
        reply = await self._call(self._targets.target(spec.runner), request, reported, cluster)
        if reply.missing:  # the workers cannot import the runner's module: send its code
            if not _on(cluster):  # gone since: no call, which would start a cluster
                raise ClusterLostError(f"Ray shut down before {reported.ctx.task_id!r} ran")
            target = self._targets.copy(spec.runner)
            reply = await self._call(target, request, reported, cluster)
            if reply.missing:
                raise RemoteRunnerError(f"the Ray workers cannot import {spec.runner!r}")
        if reply.progress is not None:
            reported.absorb(reply.progress)
        if reply.error is not None:
            raise revived(reply)
        assert reply.result is not None
        return reply.result

    async def _call(
        self, target: Target, request: Request, reported: Reported, cluster: tuple[str, str]
    ) -> Reply:
        """One Ray call running ``target`` on ``cluster`` (up: just checked): its reply,
        or the error that ended it."""
        ctx = reported.ctx
        shipped = Shipped(
            task_id=ctx.task_id,
            parent_session_id=ctx.parent_session_id,
            agent=ctx.agent,
            agent_path=str(ctx.agent_path),
            parent_path=str(ctx.parent_path),
            attempt=ctx.attempt,
            permissions=ctx.permissions,
            remaining=ctx.remaining(),
            budget=ctx.remaining_budget(),
            carrier=trace_carrier(),
            sink=self._sink_name,
        )
        payload = _pack((target, request, shipped), by_value=not isinstance(target, (str, bytes)))
        slot = None
        call: _Call
        if self._mode == "task":
            call = _TaskCall(self._task.remote(payload))
        else:
            slot = self._slot()
            slot.busy += 1  # given back in the finally below: the call cannot raise
            call = await slot.channel().call(payload)
        try:
            reply: Reply = _unpack(await self._settle(call, reported, cluster))
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self._stop(call, slot, cluster)
                await self._salvage(reported, call, cluster)
            raise
        except Exception as exc:  # the worker, the actor, the reply or the cluster was lost
            if slot is not None and isinstance(exc, ray.exceptions.RayActorError):
                self._retire(slot)
            with anyio.CancelScope(shield=True):
                await self._salvage(reported, None, cluster)
            if not isinstance(exc, ClusterLostError) and not _on(cluster):
                # Ray shutting down may fail the call first (its actors "died"): a loss.
                raise ClusterLostError(f"Ray shut down while child {ctx.task_id!r} ran") from exc
            raise
        finally:
            if slot is not None:
                slot.busy -= 1
        return reply

    async def _settle(self, call: _Call, reported: Reported, cluster: tuple[str, str]) -> bytes:
        """The call's reply. Every :data:`_POLL` seconds meanwhile: whether Ray is still
        up (Ray never completes a call's future after ``ray.shutdown()``), and, for a child
        with a token budget or progress listeners, its progress from the sink, so a budget
        stops it mid-run and ``subagent.progress`` events flow as it reports."""
        ctx = reported.ctx
        done = call.done
        live = watched(ctx)
        seen: object = None
        while True:
            with anyio.move_on_after(_POLL):
                await done.wait()
            if done.is_set():
                return call.result()
            if not _on(cluster):  # shut down (and maybe started again: another cluster)
                if self._joined == cluster:
                    self._forget()  # its actors went with the cluster
                raise ClusterLostError(f"Ray shut down while child {ctx.task_id!r} ran")
            if live:
                snapshot = await self._peek(ctx.task_id)
                if snapshot is not None and mark(snapshot) != seen:
                    seen = mark(snapshot)
                    reported.absorb(snapshot)

    async def _peek(self, task_id: str) -> Snapshot | None:
        sink = self._sink
        if sink is None:
            return None
        with anyio.move_on_after(_COLLECT):
            try:
                snapshot: Snapshot | None = await settled(sink.peek.remote(task_id).future())
            except Exception:  # Ray's errors, or a handle of a cluster that is gone
                logger.debug("reading the progress of child %r failed", task_id, exc_info=True)
                return None
            return snapshot
        return None

    async def _stop(self, call: _Call, slot: Slot | None, cluster: tuple[str, str]) -> None:
        """The call cancelled (Ray's cancel of a task, the actor's of its run); if it
        still runs ``force_after`` seconds later, the forced stop: a forced cancel of its
        task, or its actor killed. Never with Ray shut down: its calls would start a new
        local cluster."""
        if not _on(cluster) or call.done.is_set():
            return
        try:
            call.cancel()
        except Exception:
            logger.exception("cancelling a child's call failed")
        with anyio.move_on_after(self._force_after):
            await call.done.wait()
            return
        if not _on(cluster):
            return
        try:
            if slot is None:
                assert isinstance(call, _TaskCall)
                call.force()
            else:
                self._retire(slot)  # which kills it
        except Exception:
            logger.exception("stopping a child's call by force failed")
        with anyio.move_on_after(_SETTLE):
            await call.done.wait()

    async def _salvage(
        self, reported: Reported, call: _Call | None, cluster: tuple[str, str]
    ) -> None:
        """Bring what a run without a usable reply reported into its envelope: from a
        reply that came after all, else from the sink."""
        task_id = reported.ctx.task_id
        progress = None
        reply_blob = call.reply() if call is not None else None
        if reply_blob is not None:
            reply: Reply = _unpack(reply_blob)
            progress = reply.progress
        if progress is None and self._sink is not None and self._joined == cluster and _on(cluster):
            with anyio.move_on_after(_COLLECT):
                try:
                    progress = await settled(self._sink.take.remote(task_id).future())
                except Exception:  # Ray's errors, or a handle of a cluster that is gone
                    logger.warning("the progress of child %r was lost", task_id)
        if progress is not None:
            reported.absorb(progress)


def _cluster() -> tuple[str, str] | None:
    """The cluster this driver is on (its node and its job), ``None`` with Ray down. A
    cluster shut down and started again is another one: Ray never completes the old
    one's calls, and the old handles cannot make new ones."""
    if not ray.is_initialized():
        return None
    try:
        context = ray.get_runtime_context()
        return context.get_node_id(), context.get_job_id()
    except Exception:  # shutting down in another thread
        return None


def _on(cluster: tuple[str, str] | None) -> bool:
    """Whether Ray is up on ``cluster`` (not down, nor up on another one)."""
    return cluster is not None and _cluster() == cluster


def _busy(slot: Slot) -> int:
    return slot.busy
