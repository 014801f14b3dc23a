"""Messages: selectors, delivery states, TTL, unread, ack, sent, the inbox block, history,
wake signals, and receives that wait for a send from another process."""

from __future__ import annotations

import os
import sqlite3
import time
import uuid
from contextlib import closing
from pathlib import Path

import anyio
import pytest

from subagents import ConfigError
from subagents.room import Room
from subagents.store._schema import MIGRATIONS
from tests.room.support import NO_SUCH_PID, FakeClock, room_worker, until_committed

pytestmark = pytest.mark.anyio


async def test_selectors_resolve_among_the_senders_rooms(tmp_path: Path) -> None:
    async with Room(tmp_path / "s.db") as room:
        a = (await room.join("r", label="a")).member_id
        b = (await room.join("r", tags=["py", "review"])).member_id
        c = (await room.join("r", extra_rooms=["other"], tags=["py"])).member_id
        d = (await room.join("other", tags=["py"])).member_id
        assert (await room.send(a, "*", "all")).recipients == tuple(sorted([b, c]))
        assert (await room.send(a, "tag:py", "py")).recipients == tuple(sorted([b, c]))
        assert (await room.send(a, "tag:review", "r")).recipients == (b,)
        assert (await room.send(a, d, "direct")).recipients == (d,)
        # The sender's rooms bound '*': c is in 'other' too, so c reaches d.
        assert (await room.send(c, "*", "x", room="other")).recipients == (d,)
        with pytest.raises(ConfigError, match=r"^room"):
            await room.send(a, "*", "x", room="other")
        with pytest.raises(ConfigError, match=r"^reply_to"):
            await room.send(a, "*", "x", reply_to=0)
        with pytest.raises(ConfigError, match=r"^before"):
            await room.history("r", before=-1)
        with pytest.raises(ConfigError, match=r"^to"):
            await room.send(a, "file:", "x")


async def test_a_selector_that_finds_nobody_reports_zero_recipients(tmp_path: Path) -> None:
    async with Room(tmp_path / "s.db") as room:
        a = (await room.join("alone")).member_id
        for selector in ("*", "tag:none", "file:*.py"):
            sent = await room.send(a, selector, "anyone?")
            assert sent.recipients == ()
            assert sent.warning is not None
        (mine,) = await room.sent(a, limit=1)
        assert mine.states == {}
        assert mine.pending == 0
        assert len(await room.history("alone")) == 3


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_file_selector_matches_full_relative_and_bare_forms_from_each_holders_directory(
    tmp_path: Path,
) -> None:
    """The holders are processes of their own, one on each backend."""
    repo_one, repo_two = tmp_path / "one", tmp_path / "two"
    for repo in (repo_one, repo_two):
        (repo / "src").mkdir(parents=True)
    path = tmp_path / "s.db"
    async with Room(path) as room:
        sender = (await room.join("r")).member_id
        # Holders in other processes, each joined in its own directory.
        async with (
            room_worker(path, backend="asyncio", cwd=repo_one) as one,
            room_worker(path, backend="trio", cwd=repo_two) as two,
        ):
            first = (await one.call("join", room="r"))["member_id"]  # type: ignore[index]
            second = (await two.call("join", room="r"))["member_id"]  # type: ignore[index]
            assert (await one.call("claim", member=first, path="src/wire.go"))["ok"]  # type: ignore[index]
            assert (await two.call("claim", member=second, path="src/main.go"))["ok"]  # type: ignore[index]
            full = str(repo_one / "src" / "wire.go")
            assert (await room.send(sender, f"file:{full}", "m")).recipients == (first,)
            assert (await room.send(sender, "file:src/wire.go", "m")).recipients == (first,)
            assert (await room.send(sender, "file:wire.go", "m")).recipients == (first,)
            both = (await room.send(sender, "file:src/*.go", "m")).recipients
            assert set(both) == {first, second}
            assert (await room.send(sender, "file:*.py", "m")).recipients == ()
            assert (await room.send(sender, "file:src/main.go", "m")).recipients == (second,)


async def test_receive_marks_read_and_an_empty_one_carries_the_inbox(tmp_path: Path) -> None:
    async with Room(tmp_path / "s.db") as room:
        a = (await room.join("r")).member_id
        b = (await room.join("r", extra_rooms=["s"])).member_id
        empty = await room.receive(b)
        assert empty.messages == ()
        assert empty.inbox is not None
        assert (empty.inbox.rooms, empty.inbox.deliveries, empty.inbox.read) == (("r", "s"), 0, 0)
        first = await room.send(a, b, "one", subject="first")
        await room.send(a, "*", "two")
        assert await room.unread(b) == 2
        got = await room.receive(b, limit=1)
        assert [(m.body, m.subject, m.sender) for m in got.messages] == [("one", "first", a)]
        assert [m.body for m in (await room.receive(b)).messages] == ["two"]
        after = await room.receive(b)
        assert after.inbox is not None
        assert (after.inbox.deliveries, after.inbox.read) == (2, 2)
        assert after.inbox.last_delivery_at is not None
        assert await room.unread(b) == 0
        assert await room.ack(b, first.message_id)
        assert not await room.ack(b, first.message_id)
        with pytest.raises(ConfigError, match="message_id"):
            await room.ack(a, first.message_id)
        states = {s.message.body: s.states[b] for s in await room.sent(a)}
        assert states == {"one": "acked", "two": "read"}


STATES = ["stored", "offered", "accepted", "read", "acked", "expired", "undeliverable"]
ALLOWED = {
    "stored": {"offered", "accepted", "read", "acked", "expired", "undeliverable"},
    # offered <-> undeliverable: the member could no longer be woken, or can again.
    "offered": {"undeliverable", "accepted", "read", "acked", "expired"},
    "undeliverable": {"offered", "accepted", "read", "acked", "expired"},
    "accepted": {"read", "acked", "expired"},
    "read": {"acked"},
    "acked": set(),
    "expired": set(),
}
(TRIGGER,) = [
    s for m in MIGRATIONS for s in m.statements if "TRIGGER room_deliveries_forward_only" in s
]


async def test_delivery_states_never_move_backwards(tmp_path: Path) -> None:
    async with Room(tmp_path / "s.db") as room:
        a = (await room.join("r")).member_id
        b = (await room.join("r", autonomy="hold")).member_id
        await room.send(a, b, "x")
    conn = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
    try:
        for old in STATES:
            for new in STATES:
                conn.execute("BEGIN")
                # Put the row in `old` past the trigger, then the trigger back.
                conn.execute("DROP TRIGGER room_deliveries_forward_only")
                conn.execute("UPDATE room_deliveries SET state = ?", (old,))
                conn.execute(TRIGGER)
                try:
                    conn.execute("UPDATE room_deliveries SET state = ?", (new,))
                    moved = True
                except sqlite3.IntegrityError as exc:
                    moved = "only moves forward" not in str(exc)  # another failure: fails
                conn.execute("ROLLBACK")
                assert moved == (new in ALLOWED[old]), (old, new)
    finally:
        conn.close()


async def test_a_delivery_past_its_ttl_expires_and_is_never_received(tmp_path: Path) -> None:
    clock = FakeClock()
    async with Room(tmp_path / "s.db", clock=clock) as room:
        a = (await room.join("r")).member_id
        b = (await room.join("r")).member_id
        await room.send(a, b, "short", ttl=5)
        await room.send(a, b, "long", ttl=50)
        clock.advance(5)
        assert await room.unread(b) == 1
        states = {s.message.body: s.states[b] for s in await room.sent(a)}
        assert states == {"short": "expired", "long": "offered"}
        assert [m.body for m in (await room.receive(b)).messages] == ["long"]
        clock.advance(100)
        states = {s.message.body: s.states[b] for s in await room.sent(a)}
        assert states == {"short": "expired", "long": "read"}


async def test_history_is_whole_for_a_late_joiner_and_marks_nothing_read(tmp_path: Path) -> None:
    async with Room(tmp_path / "s.db") as room:
        a = (await room.join("r", extra_rooms=["shared"])).member_id
        b = (await room.join("r")).member_id
        await room.send(a, b, "to b")
        await room.send(a, "*", "to all")
        late = (await room.join("shared")).member_id
        bodies = [m.body for m in await room.history("shared")]
        assert bodies == ["to b", "to all"]
        assert [m.body for m in await room.history("r", limit=1)] == ["to all"]
        assert await room.unread(b) == 2
        assert (await room.receive(late)).messages == ()
        assert [m.body for m in await room.history("r")] == ["to b", "to all"]


async def test_wake_levels_set_the_first_state_and_signals_repeat_only_while_offered(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    async with Room(tmp_path / "s.db", clock=clock, retry_window=10) as room:
        a = (await room.join("r")).member_id
        woken = (await room.join("r", autonomy="wake")).member_id
        notified = (await room.join("r", autonomy="notify")).member_id
        held = (await room.join("r", autonomy="hold")).member_id
        gone = (await room.join("r", pid=2**22 + 12345)).member_id  # no such process
        await room.send(a, "*", "x")

        def states() -> dict[str, str]:
            return dict(sent[0].states)

        sent = await room.sent(a)
        assert states() == {
            woken: "offered",
            notified: "stored",
            held: "stored",
            gone: "undeliverable",
        }
        await room.sent(notified)  # a turn of its own: the signal rides on it
        sent = await room.sent(a)
        assert states()[notified] == "accepted"
        assert states()[held] == "stored"
        conn = sqlite3.connect(tmp_path / "s.db")
        try:
            signals = "SELECT signals FROM room_deliveries WHERE recipient = ?"
            clock.advance(5)
            await room.sent(a)  # activity inside the window: no repeat
            assert conn.execute(signals, (woken,)).fetchone() == (1,)
            clock.advance(6)
            await room.sent(a)
            assert conn.execute(signals, (woken,)).fetchone() == (2,)
            assert await room.accept(woken) == 1
            clock.advance(60)
            await room.sent(a)
            assert conn.execute(signals, (woken,)).fetchone() == (2,)  # accepted: never again
        finally:
            conn.close()
        assert [m.body for m in (await room.receive(gone)).messages] == ["x"]


async def test_a_timed_receive_returns_on_time_with_the_inbox_and_writes_once(
    tmp_path: Path,
) -> None:
    readings: list[float] = []

    def clock() -> float:  # read once in every transaction
        readings.append(time.time())
        return readings[-1]

    async with Room(tmp_path / "s.db", clock=clock) as room:
        b = (await room.join("r")).member_id
        before = len(readings)
        started = anyio.current_time()
        got = await room.receive(b, timeout=0.2)
        took = anyio.current_time() - started
        assert got.messages == ()
        assert got.inbox is not None
        assert took >= 0.2
        # One transaction, the first look: waking on its own commit, a wait reads only.
        assert len(readings) - before == 1
        with anyio.fail_after(5):  # generous: only a wait that never ends fails
            await room.receive(b, timeout=0.05)


async def test_a_receive_waiting_in_another_process_wakes_on_a_send(
    tmp_path: Path, anyio_backend: str
) -> None:
    path = tmp_path / "s.db"
    async with Room(path) as room, room_worker(path, backend=anyio_backend) as proc:
        sender = (await room.join("r")).member_id
        member = (await proc.call("join", room="r"))["member_id"]  # type: ignore[index]
        joined_at = {m.member_id: m.seen_at for m in await room.who("r")}[member]
        await proc.submit("receive", member=member, timeout=60)
        # The worker's receive waits once its first look (its activity) is recorded.

        async def looked() -> bool:
            return {m.member_id: m.seen_at for m in await room.who("r")}[member] != joined_at

        with anyio.fail_after(30):
            # Another process's activity is seen only in the file: look after each commit.
            await until_committed(room, looked)
        await room.send(sender, "*", "wake up", subject="s")
        with anyio.fail_after(30):
            got = await proc.answer()
        assert [m["body"] for m in got["messages"]] == ["wake up"]  # type: ignore[index]
        in_process = anyio.Event()
        result: list[object] = []

        async def wait_here() -> None:
            in_process.set()
            result.append(await room.receive(sender, timeout=60))

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_here)
            await in_process.wait()
            await proc.call("send", member=member, to=sender, body="back")
        assert [m.body for m in result[0].messages] == ["back"]  # type: ignore[attr-defined]


def signals_of(path: Path, recipient: str) -> int:
    """How many wake signals the recipient's one delivery had (read from the file)."""
    with closing(sqlite3.connect(path)) as conn:
        (signals,) = conn.execute(
            "SELECT signals FROM room_deliveries WHERE recipient = ?", (recipient,)
        ).fetchone()
    return int(signals)


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


async def test_a_rejoin_held_to_a_cap_stops_the_signals_offered_before(tmp_path: Path) -> None:
    """A wake member that re-joins into a room capped at ``hold`` is held there; like a
    member lowered by ``set_autonomy_cap``, it can no longer be woken, so a delivery offered
    before must not be re-signalled every retry window."""
    clock = FakeClock()
    key = str(uuid.uuid4())
    async with Room(tmp_path / "s.db", clock=clock, retry_window=10) as room:
        await room.set_autonomy_cap("quiet", "hold")
        sender = (await room.join("open")).member_id
        woken = (await room.join("open", harness_key=key)).member_id
        await room.send(sender, woken, "x")  # offered: one signal
        assert (await room.join("quiet", harness_key=key)).autonomy == "hold"
        clock.advance(60)
        await room.sent(sender)  # any member's activity repeats due signals
        assert signals_of(tmp_path / "s.db", woken) == 1


async def test_a_file_selector_finds_a_holder_by_the_name_it_claimed(tmp_path: Path) -> None:
    """``file:<glob>`` matches a live lease by full path, path relative to the holder's
    directory, or bare file name; a member that claimed ``config.py`` (a symlink into a
    shared directory) is reached by ``file:config.py``."""
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "config-prod.py").write_text("x")
    os.symlink(tmp_path / "shared" / "config-prod.py", tmp_path / "config.py")
    async with Room(tmp_path / "s.db") as room:
        holder = (await room.join("r", cwd=str(tmp_path))).member_id
        sender = (await room.join("r", cwd=str(tmp_path))).member_id
        assert (await room.claim(holder, "config.py")).ok
        sent = await room.send(sender, "file:config.py", "are you editing it?")
        assert sent.recipients == (holder,)
