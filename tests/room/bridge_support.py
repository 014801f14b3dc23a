"""Helpers of the bridge tests: two bridged managers on one store file, room states."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import anyio
import attrs

from subagents import AgentSpec, Event, Receipt, SubagentConfig, SubagentManager
from subagents._events import MESSAGE
from subagents.room import Room, RoomLink, SentMessage, bridge
from tests.room.support import until_committed


@attrs.define
class Side:
    """One bridged manager: its room (own connection), manager and link."""

    room: Room
    manager: SubagentManager
    link: RoomLink


@asynccontextmanager
async def bridged(
    path: Path,
    specs: Sequence[AgentSpec] = (),
    *,
    tags: Sequence[str] | None = None,
    harness_key: str | None = None,
    inbox_capacity: int = 100,
) -> AsyncIterator[Side]:
    """A manager whose ``root`` session is bridged to room ``default`` of ``path``."""
    async with AsyncExitStack() as stack:
        room = await stack.enter_async_context(Room(path))
        config = SubagentConfig(inbox_capacity=inbox_capacity)
        manager = await stack.enter_async_context(SubagentManager(list(specs), config=config))
        link = await stack.enter_async_context(
            bridge(room, manager, tags=tags, harness_key=harness_key)
        )
        yield Side(room, manager, link)


async def state_of(side: Side, message_id: int, recipient: str, state: str) -> None:
    """Wait until ``recipient``'s delivery of ``message_id`` (sent by ``side``) is in
    ``state``: another process's commit, looked at until it lands (bounded)."""

    async def holds() -> bool:
        return any(
            sent.message.message_id == message_id and sent.states.get(recipient) == state
            for sent in await side.room.sent(side.link.member_id, limit=50)
        )

    with anyio.fail_after(30):
        await until_committed(side.room, holds)


async def failed(manager: SubagentManager, receipt: Receipt) -> None:
    """Wait until ``receipt`` (of a message the bridge carries) has failed."""
    done = anyio.Event()

    def seen(event: Event) -> None:
        if event.type == MESSAGE and receipt.failed:
            done.set()

    unsubscribe = manager.events.subscribe(seen)
    try:
        if not receipt.failed:
            with anyio.fail_after(30):
                await done.wait()
    finally:
        unsubscribe()


async def room_ids(side: Side, count: int) -> list[int]:
    """The room ids of the ``count`` messages ``side`` sent, oldest first, once the
    bridge committed them all (bounded)."""
    found: tuple[SentMessage, ...] = ()

    async def holds() -> bool:
        nonlocal found
        found = await side.link.sent(limit=count)
        return len(found) == count

    with anyio.fail_after(30):
        await until_committed(side.room, holds)
    return [s.message.message_id for s in reversed(found)]
