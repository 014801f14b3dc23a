"""peek (a non-marking take), mark_read and accept by ids: what a bridge needs to keep the
room's states honest about what a local recipient did."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from subagents import ConfigError
from subagents.room import Message, Room
from tests.room.support import FakeClock

pytestmark = pytest.mark.anyio


async def _pair(room: Room) -> tuple[str, str]:
    a = (await room.join("r")).member_id
    b = (await room.join("r")).member_id
    return a, b


async def test_peek_returns_the_unread_in_order_and_marks_nothing(tmp_path: Path) -> None:
    async with Room(tmp_path / "s.db") as room:
        a, b = await _pair(room)
        ids = [(await room.send(a, b, f"m{i}")).message_id for i in range(3)]
        peeked = await room.peek(b)
        assert [m.message_id for m in peeked] == ids
        assert [m.body for m in await room.peek(b, after=ids[0])] == ["m1", "m2"]
        assert [m.body for m in await room.peek(b, limit=1)] == ["m0"]
        assert await room.unread(b) == 3
        newest = (await room.sent(a))[0]
        assert newest.states == {b: "offered"}  # a peek is no turn: nothing accepted


async def test_accept_by_ids_then_mark_read_moves_only_those(tmp_path: Path) -> None:
    async with Room(tmp_path / "s.db") as room:
        a, b = await _pair(room)
        first, second = [(await room.send(a, b, t)).message_id for t in ("x", "y")]
        assert await room.accept(b, [first]) == 1
        states = {s.message.message_id: s.states[b] for s in await room.sent(a)}
        assert states == {first: "accepted", second: "offered"}
        assert await room.mark_read(b, [first]) == 1
        assert await room.mark_read(b, [first]) == 0  # read already: nothing moves back
        assert await room.accept(b, [first]) == 0
        states = {s.message.message_id: s.states[b] for s in await room.sent(a)}
        assert states == {first: "read", second: "offered"}
        assert [m.body for m in await room.peek(b)] == ["y"]
        received = await room.receive(b)
        assert received.inbox is None
        assert [m.body for m in received.messages] == ["y"]
        empty = await room.receive(b)
        assert empty.inbox is not None
        assert empty.inbox.read == 2  # mark_read counts in the inbox block


async def test_mark_read_skips_another_members_deliveries_and_expired_ones(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    async with Room(tmp_path / "s.db", clock=clock) as room:
        a, b = await _pair(room)
        to_a = (await room.send(b, a, "for a")).message_id
        late = (await room.send(a, b, "short", ttl=1)).message_id
        clock.advance(2)
        assert await room.mark_read(b, [to_a, late]) == 0
        (sent,) = await room.sent(a)
        assert sent.states == {b: "expired"}
        assert await room.peek(b) == ()


async def test_peek_waits_for_a_send_of_another_connection(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with Room(path) as mine, Room(path) as theirs:
        a, b = await _pair(mine)
        got: list[tuple[Message, ...]] = []
        waiting = anyio.Event()

        async def wait() -> None:
            waiting.set()
            got.append(await mine.peek(b, timeout=None))

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await waiting.wait()
            await theirs.send(a, b, "wake up")
        assert [m.body for m in got[0]] == ["wake up"]
        assert await mine.peek(b, timeout=0.01, after=got[0][0].message_id) == ()


async def test_bad_arguments_name_their_field(tmp_path: Path) -> None:
    async with Room(tmp_path / "s.db") as room:
        a, b = await _pair(room)
        sent = await room.send(a, b, "x")
        with pytest.raises(ConfigError, match="message_ids"):
            await room.mark_read(b, "1")  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="message_ids"):
            await room.accept(b, [0])
        with pytest.raises(ConfigError, match="message_ids"):
            await room.mark_read(b, list(range(1, 1002)))
        with pytest.raises(ConfigError, match="after"):
            await room.peek(a, after=sent.message_id)  # delivered to b, not to a
