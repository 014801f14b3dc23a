"""Review of the room (members, wake levels, signals, liveness, bad input): each test
states a behaviour the issue or design/room.md promises and h-room does not keep."""

from __future__ import annotations

import sqlite3
import uuid
from contextlib import closing
from pathlib import Path

import pytest

from subagents import ConfigError
from subagents.room import Room
from tests.room.support import FakeClock, room_worker

pytestmark = pytest.mark.anyio

NO_SUCH_PID = 2**22 + 7
"""Above the kernel's pid_max: no process has it."""


def signals_of(path: Path, recipient: str) -> int:
    """How many wake signals the recipient's one delivery had (read from the file)."""
    with closing(sqlite3.connect(path)) as conn:
        (signals,) = conn.execute(
            "SELECT signals FROM room_deliveries WHERE recipient = ?", (recipient,)
        ).fetchone()
    return int(signals)


async def test_a_rejoin_into_a_capped_room_is_held_to_that_rooms_cap(tmp_path: Path) -> None:
    """design/room.md: the cap "caps every later join and raise"; a member that comes back
    (same harness key) into a room whose operator capped it at ``hold`` must not stay at
    ``wake`` there."""
    key = str(uuid.uuid4())
    async with Room(tmp_path / "s.db") as room:
        await room.set_autonomy_cap("quiet", "hold")
        assert (await room.join("open", harness_key=key)).autonomy == "wake"
        again = await room.join("quiet", harness_key=key)
        assert again.autonomy == "hold"
        # Nor does naming its current level keep it above the cap.
        other = str(uuid.uuid4())
        await room.join("open", harness_key=other)
        assert (await room.join("quiet", harness_key=other, autonomy="wake")).autonomy == "hold"


async def test_wake_signals_are_not_repeated_to_a_member_the_operator_lowered_to_hold(
    tmp_path: Path,
) -> None:
    """``hold`` gets no signal; lowering is the operator's way to stop a member being woken.
    A delivery ``offered`` before the cap must not keep being re-signalled after it."""
    clock = FakeClock()
    async with Room(tmp_path / "s.db", clock=clock, retry_window=10) as room:
        sender = (await room.join("r")).member_id
        woken = (await room.join("r")).member_id
        await room.send(sender, woken, "x")
        assert await room.set_autonomy_cap("r", "hold") == 2
        clock.advance(60)
        await room.sent(sender)  # any member's activity repeats due signals (unread is a look)
        assert signals_of(tmp_path / "s.db", woken) == 1


async def test_wake_signals_are_not_repeated_to_a_pruned_member(tmp_path: Path) -> None:
    """A pruned member has no process and no row: repeating its signal every retry window
    is a commit that wakes every waiter of the file, for ever."""
    clock = FakeClock()
    async with Room(tmp_path / "s.db", clock=clock, retry_window=10) as room:
        sender = (await room.join("r")).member_id
        key = str(uuid.uuid4())
        doomed = (await room.join("r", harness_key=key, pid=None)).member_id
        await room.send(sender, doomed, "x")  # offered: no pid says it cannot be woken
        await room.join("r", harness_key=key, pid=NO_SUCH_PID)  # its process ended since
        clock.advance(100)
        assert await room.prune(silent_for=50) == (doomed,)
        clock.advance(60)
        await room.sent(sender)
        assert signals_of(tmp_path / "s.db", doomed) == 1


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_harness_key_in_upper_case_in_a_running_environment_is_alive(
    tmp_path: Path,
) -> None:
    """join accepts the key in either case (and stores it lower-cased); the process that
    keeps it in its environment keeps it as the harness wrote it. Found there, the member
    is alive, and prune must not remove it."""
    path = tmp_path / "s.db"
    key = str(uuid.uuid4()).upper()
    clock = FakeClock()
    async with Room(path, clock=clock) as room, room_worker(path, env={"HARNESS_SESSION": key}):
        member = (await room.join("r", harness_key=key, pid=NO_SUCH_PID)).member_id
        assert [(m.member_id, m.liveness) for m in await room.who("r")] == [(member, "alive")]
        clock.advance(100)
        assert await room.prune(silent_for=10) == ()


async def test_a_bad_pid_given_to_join_is_a_config_error_naming_pid(tmp_path: Path) -> None:
    """A pid that is not a positive int is refused at join; "abc" must not be stored, where
    it makes every later ``who`` of the room raise ValueError."""
    async with Room(tmp_path / "s.db") as room:
        for bad in ("abc", 2**70, True, -3):
            with pytest.raises(ConfigError, match=r"^pid"):
                await room.join("r", pid=bad)  # type: ignore[arg-type]
        await room.who("r")  # nothing stored that breaks the listing


async def test_bad_cwd_and_extra_rooms_given_to_join_are_config_errors_naming_them(
    tmp_path: Path,
) -> None:
    async with Room(tmp_path / "s.db") as room:
        with pytest.raises(ConfigError, match=r"^cwd"):
            await room.join("r", cwd=5)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=r"^cwd"):
            await room.join("r", cwd="/tmp/a\0b")
        with pytest.raises(ConfigError, match=r"^extra_rooms"):
            await room.join("r", extra_rooms=None)  # type: ignore[arg-type]


async def test_a_bad_synchronous_mode_is_a_config_error_naming_it(tmp_path: Path) -> None:
    """SqliteStore refuses anything but FULL and NORMAL; the room's file must not be opened
    with ``OFF`` (or a typo SQLite reads as some level) without a word."""
    for bad in ("OFF", "bogus"):
        with pytest.raises(ConfigError, match=r"^synchronous"):
            Room(tmp_path / "s.db", synchronous=bad)  # type: ignore[arg-type]


async def test_ack_takes_an_integer_message_id_only(tmp_path: Path) -> None:
    """A message id given as text is bad input: a ConfigError naming message_id, never a
    silent ack of message 1."""
    async with Room(tmp_path / "s.db") as room:
        a = (await room.join("r")).member_id
        b = (await room.join("r")).member_id
        sent = await room.send(a, b, "x")
        with pytest.raises(ConfigError, match=r"^message_id"):
            await room.ack(b, str(sent.message_id))  # type: ignore[arg-type]
        (mine,) = await room.sent(a)
        assert mine.states[b] != "acked"


async def test_listing_a_members_leases_is_not_that_members_activity(tmp_path: Path) -> None:
    """An operator (or the CLI's ``leases --member``) looking at a member's leases reads:
    it must not refresh the member's ``seen_at`` (which keeps a gone member from prune) nor
    move its ``stored`` deliveries to ``accepted`` (a turn that does not run)."""
    clock = FakeClock()
    async with Room(tmp_path / "s.db", clock=clock) as room:
        sender = (await room.join("r")).member_id
        quiet = (await room.join("r", autonomy="notify", pid=NO_SUCH_PID)).member_id
        await room.send(sender, quiet, "x")
        clock.advance(100)
        await room.leases(quiet)
        await room.check("/tmp/somewhere", member=quiet)
        (mine,) = await room.sent(sender)
        assert mine.states[quiet] == "stored"
        assert await room.prune(silent_for=50) == (quiet,)


async def test_a_delivery_past_its_ttl_stays_expired_and_cannot_be_acked(tmp_path: Path) -> None:
    """``sent`` reports a delivery past its TTL ``expired`` (final); an ``ack`` after that
    must answer False and leave it expired, not move the sender's view from expired to
    acked."""
    clock = FakeClock()
    async with Room(tmp_path / "s.db", clock=clock) as room:
        a = (await room.join("r")).member_id
        b = (await room.join("r")).member_id
        sent = await room.send(a, b, "soon stale", ttl=10)
        clock.advance(20)
        (before,) = await room.sent(a)
        assert before.states[b] == "expired"
        assert await room.ack(b, sent.message_id) is False
        (after,) = await room.sent(a)
        assert after.states[b] == "expired"
