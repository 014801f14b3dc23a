"""Starting and stopping the engine's parts: the task group the workers and the watchdog
live in, and at close every child cancelled, awaited (bounded) and the group cut off."""

from __future__ import annotations

import anyio
from anyio.abc import TaskGroup

from ._child import ChildRunner
from ._limiter import SpawnLimiter
from ._sessions import Sessions
from ._watchdog import Watchdog

__all__ = ["start_parts", "stop_parts"]


async def start_parts(
    sessions: Sessions, watchdog: Watchdog, limiter: SpawnLimiter, children: ChildRunner
) -> TaskGroup:
    """Enter a new task group, start the watchdog and the workers in it, and let the
    sessions take spawns. Returns the group (the manager exits it at close)."""
    tg = anyio.create_task_group()
    await tg.__aenter__()
    sessions.accepting = True
    watchdog.start(tg)
    limiter.start(tg, children.run)
    return tg


async def stop_parts(
    sessions: Sessions,
    limiter: SpawnLimiter,
    children: ChildRunner,
    tg: TaskGroup,
    settle_timeout: float,
) -> None:
    """Refuse spawns, cancel every child (queued or running), wait up to
    ``settle_timeout`` (shielded) for each to settle, then cancel and exit ``tg``."""
    sessions.accepting = False
    limiter.stop()
    sessions.fire_watchers()
    live = sessions.all_live()
    for record in live:
        children.cancel(record, "the manager was closed")
    with anyio.CancelScope(shield=True), anyio.move_on_after(settle_timeout):
        for record in live:
            await record.done.wait()
    # Whatever still runs ignored cancellation for settle_timeout: cut it off.
    tg.cancel_scope.cancel()
    await tg.__aexit__(None, None, None)
