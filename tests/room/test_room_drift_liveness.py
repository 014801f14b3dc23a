"""The drift check's severities with real files changed on disk, and liveness: killed
processes, members without a pid, harness keys in a running environment, prune."""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

import pytest

from subagents.room import Room
from tests.room.support import NO_SUCH_PID, FakeClock, room_worker

pytestmark = pytest.mark.anyio


async def test_no_baseline_and_an_unchanged_file_are_safe(tmp_path: Path) -> None:
    file = tmp_path / "x.py"
    file.write_text("one")
    async with Room(tmp_path / "s.db") as room:
        me = (await room.join("r", cwd=str(tmp_path))).member_id
        unread = await room.drift_check(me, "x.py")
        assert (unread.severity, unread.changed) == ("SAFE", False)
        assert "no baseline" in unread.message
        digest = await room.note_read(me, "x.py")
        assert digest == hashlib.sha256(b"one").hexdigest()
        file.write_text("one")  # rewritten, same bytes
        same = await room.drift_check(me, str(file))
        assert (same.severity, same.changed) == ("SAFE", False)


async def test_a_change_nobody_else_held_a_lease_on_is_minor(tmp_path: Path) -> None:
    file = tmp_path / "x.py"
    file.write_text("one")
    async with Room(tmp_path / "s.db") as room:
        me = (await room.join("r", cwd=str(tmp_path))).member_id
        await room.note_read(me, "x.py")
        await room.claim(me, "x.py")  # my own lease is no other member's
        file.write_text("two")
        drift = await room.drift_check(me, "x.py")
        assert (drift.severity, drift.changed, drift.holder) == ("MINOR", True, None)
        file.unlink()
        gone = await room.drift_check(me, "x.py")
        assert gone.severity == "MINOR"
        assert "deleted" in gone.message


async def test_a_change_while_another_member_holds_a_lease_is_critical(tmp_path: Path) -> None:
    file = tmp_path / "x.py"
    file.write_text("one")
    clock = FakeClock()
    async with Room(tmp_path / "s.db", clock=clock) as room:
        me = (await room.join("r", cwd=str(tmp_path))).member_id
        other = (await room.join("r", cwd=str(tmp_path))).member_id
        await room.note_read(me, "x.py")
        clock.advance(1)
        claimed = await room.claim(other, "x.py", mode="shared")
        file.write_text("two")
        drift = await room.drift_check(me, "x.py")
        assert (drift.severity, drift.changed) == ("CRITICAL", True)
        assert (drift.holder, drift.since) == (other, claimed.at)
        # Still critical once that lease ended: the change happened under it.
        await room.release(other, "x.py")
        later = await room.drift_check(me, "x.py")
        assert (later.severity, later.holder) == ("CRITICAL", other)
        # A fresh baseline: what the other member did is read now.
        await room.note_read(me, "x.py")
        file.write_text("three")
        assert (await room.drift_check(me, "x.py")).severity == "MINOR"


async def test_a_lease_that_ended_before_the_read_does_not_make_it_critical(
    tmp_path: Path,
) -> None:
    file = tmp_path / "x.py"
    file.write_text("one")
    clock = FakeClock()
    async with Room(tmp_path / "s.db", clock=clock) as room:
        me = (await room.join("r", cwd=str(tmp_path))).member_id
        other = (await room.join("r", cwd=str(tmp_path))).member_id
        await room.claim(other, "x.py", ttl=5)
        clock.advance(10)  # expired
        await room.note_read(me, "x.py")
        file.write_text("two")
        assert (await room.drift_check(me, "x.py")).severity == "MINOR"


# ------------------------------------------------------------------ liveness


async def test_a_killed_process_is_gone_and_a_member_without_pid_is_unknown(
    tmp_path: Path, anyio_backend: str
) -> None:
    path = tmp_path / "s.db"
    async with Room(path) as room:
        here = (await room.join("r")).member_id
        nopid = (await room.join("r", pid=None)).member_id
        async with room_worker(path, backend=anyio_backend) as proc:
            there = (await proc.call("join", room="r"))["member_id"]  # type: ignore[index]
            alive = {m.member_id: m.liveness for m in await room.who("r")}
            assert alive == {here: "alive", nopid: "unknown", there: "alive"}
            proc.process.kill()
            await proc.process.wait()
        after = {m.member_id: m.liveness for m in await room.who("r")}
        assert after == {here: "alive", nopid: "unknown", there: "gone"}


async def test_a_harness_key_in_a_running_environment_is_alive_without_its_pid(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    key, lost = str(uuid.uuid4()), str(uuid.uuid4())
    async with Room(path) as room, room_worker(path, env={"HARNESS_SESSION": key}):
        # Joined from processes that ended (or none): only the key says who runs.
        found = (await room.join("r", harness_key=key, pid=None)).member_id
        missing = (await room.join("r", harness_key=lost, pid=None)).member_id
        dead = (await room.join("r", harness_key=str(uuid.uuid4()), pid=2**22 + 7)).member_id
        liveness = {m.member_id: m.liveness for m in await room.who("r")}
        assert liveness == {found: "alive", missing: "unknown", dead: "gone"}
        assert os.environ.get("HARNESS_SESSION") != key


async def test_prune_removes_only_members_silent_and_gone(tmp_path: Path) -> None:
    clock = FakeClock()
    async with Room(tmp_path / "s.db", clock=clock) as room:
        silent_gone = (await room.join("r", pid=2**22 + 1)).member_id
        silent_unknown = (await room.join("r", pid=None)).member_id
        silent_alive = (await room.join("r")).member_id
        await room.claim(silent_gone, "/tmp/held-by-the-gone")
        clock.advance(100)
        recent_gone = (await room.join("r", pid=2**22 + 2)).member_id
        assert await room.prune(silent_for=50, room="elsewhere") == ()
        assert await room.prune(silent_for=50, room="r") == (silent_gone,)
        left = {m.member_id for m in await room.who("r")}
        assert left == {silent_unknown, silent_alive, recent_gone}
        assert (await room.check("/tmp/held-by-the-gone")).free
        assert await room.prune(silent_for=50) == ()


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


async def test_a_drift_check_through_a_retargeted_symlink_sees_the_change(
    tmp_path: Path,
) -> None:
    """A member reads ``current.py`` (``note_read``); the link is pointed at another file,
    so what ``current.py`` opens changed. The check must not answer SAFE "no baseline": the
    member has one, taken through the very path it checks."""
    (tmp_path / "v1.py").write_text("1")
    (tmp_path / "v2.py").write_text("2")
    link = tmp_path / "current.py"
    os.symlink(tmp_path / "v1.py", link)
    async with Room(tmp_path / "s.db") as room:
        member = (await room.join("r", cwd=str(tmp_path))).member_id
        await room.note_read(member, "current.py")
        link.unlink()
        os.symlink(tmp_path / "v2.py", link)
        drift = await room.drift_check(member, "current.py")
        assert drift.changed
        assert drift.severity != "SAFE"


async def test_a_change_under_a_lease_that_expired_unreleased_is_critical(
    tmp_path: Path,
) -> None:
    """Another member claims the file after my read, changes it, and its lease runs out
    (nobody releases it, nobody claims the path again): the change was made under its
    lease, so the check is CRITICAL, as it is after a release."""
    clock = FakeClock()
    target = tmp_path / "f.txt"
    target.write_text("one")
    async with Room(tmp_path / "s.db", clock=clock) as room:
        reader = (await room.join("r", cwd=str(tmp_path))).member_id
        writer = (await room.join("r", cwd=str(tmp_path))).member_id
        await room.note_read(reader, "f.txt")
        clock.advance(1)
        assert (await room.claim(writer, "f.txt", ttl=10)).ok
        target.write_text("two")
        clock.advance(20)  # the lease expired; its row was never removed
        drift = await room.drift_check(reader, "f.txt")
        assert drift.severity == "CRITICAL"
        assert drift.holder == writer


async def test_note_read_hashes_the_file_its_path_names(tmp_path: Path) -> None:
    """``sub/../z.txt`` where ``sub`` is a symlink to ``other/sub`` names ``other/z.txt``
    (what ``open`` reads); folding ``..`` as text hashes ``./z.txt``, another file."""
    (tmp_path / "other" / "sub").mkdir(parents=True)
    os.symlink(tmp_path / "other" / "sub", tmp_path / "sub")
    (tmp_path / "other" / "z.txt").write_text("the file the path names")
    (tmp_path / "z.txt").write_text("another file")
    async with Room(tmp_path / "s.db") as room:
        member = (await room.join("r", cwd=str(tmp_path))).member_id
        digest = await room.note_read(member, "sub/../z.txt")
    named = hashlib.sha256((tmp_path / "sub" / ".." / "z.txt").read_bytes()).hexdigest()
    assert digest == named
