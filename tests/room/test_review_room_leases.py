"""Review of the room's leases and drift check: paths that name one file must contend for
one lease, the drift check must hash the file the path names, and a change made under
another member's lease must read CRITICAL however that lease ended."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from subagents.room import Room
from tests.room.support import FakeClock

pytestmark = pytest.mark.anyio


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


async def test_a_double_slash_path_and_its_single_slash_form_contend_for_one_lease(
    tmp_path: Path,
) -> None:
    """``//tmp/x`` and ``/tmp/x`` are one file on Linux; ``normpath`` keeps a leading
    ``//``, so two members each hold an exclusive lease on it."""
    full = str(tmp_path / "x.py")
    async with Room(tmp_path / "s.db") as room:
        a = (await room.join("r")).member_id
        b = (await room.join("r")).member_id
        assert (await room.claim(a, full)).ok
        second = await room.claim(b, "/" + full)
        assert not second.ok
        assert second.holder is not None
        assert second.holder.member_id == a


async def test_a_path_through_a_symlinked_directory_contends_with_the_real_path(
    tmp_path: Path,
) -> None:
    """Two names of one file (a repository reached through a symlink) must not give two
    exclusive holders: the lease is on the file."""
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "x.py").write_text("x")
    os.symlink(tmp_path / "real", tmp_path / "link")
    async with Room(tmp_path / "s.db") as room:
        a = (await room.join("r", cwd=str(tmp_path / "real"))).member_id
        b = (await room.join("r", cwd=str(tmp_path / "link"))).member_id
        assert (await room.claim(a, "x.py")).ok
        assert not (await room.claim(b, "x.py")).ok


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
