"""File leases: the claim rules, paths made absolute, names of one file (symlinks, a leading
``//``), renew, release, check, expiry, listings that only read, and contention from
several processes at once."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import anyio
import pytest

from subagents import ConfigError
from subagents.room import LeaseNotHeld, Room, UnknownMember
from tests.room.support import NO_SUCH_PID, FakeClock, room_worker

pytestmark = pytest.mark.anyio

BACKENDS = ("asyncio", "trio")


async def test_exclusive_blocks_everything_and_shared_blocks_only_exclusive(
    tmp_path: Path,
) -> None:
    async with Room(tmp_path / "s.db") as room:
        a, b, c = [(await room.join("r", cwd=str(tmp_path))).member_id for _ in range(3)]
        assert (await room.claim(a, "x.py")).ok
        refused = await room.claim(b, "x.py", mode="shared")
        assert not refused.ok
        assert refused.holder is not None
        assert refused.holder.member_id == a
        assert "exclusively" in refused.reason
        assert await room.release(a, "x.py")
        assert (await room.claim(b, "x.py", mode="shared")).ok
        assert (await room.claim(c, "x.py", mode="shared")).ok
        blocked = await room.claim(a, "x.py")
        assert not blocked.ok
        assert "shared by 2" in blocked.reason
        # A member's own shared lease never blocks it; the other one's does.
        assert not (await room.claim(b, "x.py", mode="exclusive")).ok
        await room.release(c, "x.py")
        upgraded = await room.claim(b, "x.py", mode="exclusive")
        assert upgraded.ok
        assert upgraded.lease is not None
        assert upgraded.lease.mode == "exclusive"


async def test_relative_and_absolute_paths_from_one_directory_contend_for_one_lease(
    tmp_path: Path,
) -> None:
    (tmp_path / "src").mkdir()
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    async with Room(tmp_path / "s.db") as room:
        a = (await room.join("r", cwd=str(tmp_path))).member_id
        b = (await room.join("r", cwd=str(tmp_path))).member_id
        c = (await room.join("r", cwd=str(elsewhere))).member_id
        got = await room.claim(a, "src/../src/x.py")
        assert got.ok
        assert got.path == str(tmp_path / "src" / "x.py")
        assert not (await room.claim(b, str(tmp_path / "src" / "x.py"))).ok
        # The same relative path from another directory is another file.
        assert (await room.claim(c, "src/x.py")).ok
        check = await room.check("src/x.py", member=b)
        assert [lease.member_id for lease in check.leases] == [a]
        assert (await room.check(str(tmp_path / "free.py"))).free
        assert [lease.path for lease in await room.leases(a)] == [str(tmp_path / "src/x.py")]


async def test_leases_expire_on_their_ttl_and_renew_extends_a_live_one(tmp_path: Path) -> None:
    clock = FakeClock()
    async with Room(tmp_path / "s.db", clock=clock) as room:
        a = (await room.join("r", cwd=str(tmp_path))).member_id
        b = (await room.join("r", cwd=str(tmp_path))).member_id
        assert (await room.claim(a, "x", ttl=10)).ok
        clock.advance(9)
        renewed = await room.renew(a, "x", ttl=10)
        assert renewed.expires_at == clock.now + 10
        clock.advance(9)
        assert not (await room.claim(b, "x")).ok
        clock.advance(1)  # exactly at its expiry: gone
        assert (await room.check("x", member=b)).free
        assert (await room.claim(b, "x")).ok
        with pytest.raises(LeaseNotHeld, match="claim it again"):
            await room.renew(a, "x")
        assert not await room.release(a, "x")


async def test_bad_lease_arguments_name_their_field(tmp_path: Path) -> None:
    async with Room(tmp_path / "s.db") as room:
        a = (await room.join("r")).member_id
        with pytest.raises(ConfigError, match=r"^mode"):
            await room.claim(a, "x", mode="mine")  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=r"^ttl"):
            await room.claim(a, "x", ttl=0)
        with pytest.raises(ConfigError, match=r"^path"):
            await room.claim(a, "")
        with pytest.raises(UnknownMember):
            await room.claim("0" * 16, "x")


def overlapping(spans: list[dict[str, object]]) -> list[tuple[object, object]]:
    """Pairs of intervals on one path, of two members, held at one instant where either
    is exclusive."""
    bad = []
    for one, two in itertools.combinations(spans, 2):
        if one["path"] != two["path"] or one["member"] == two["member"]:
            continue
        if "exclusive" not in (one["mode"], two["mode"]):
            continue
        if one["start"] < two["end"] and two["start"] < one["end"]:  # type: ignore[operator]
            bad.append((one, two))
    return bad


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_contending_processes_never_hold_an_exclusive_lease_beside_another(
    tmp_path: Path,
) -> None:
    """Four processes, two on each backend, claiming at once."""
    path = tmp_path / "s.db"
    async with Room(path):
        pass  # created once, so the workers race on claims, not on the migration
    files = [str(tmp_path / name) for name in ("a.py", "b.py")]
    logs: list[list[dict[str, object]]] = []
    joined: list[object] = []
    all_joined = anyio.Event()

    async def run(n: int) -> None:
        async with room_worker(path, backend=BACKENDS[n % 2], clock="monotonic") as proc:
            member = (await proc.call("join", room="r", label=f"w{n}"))["member_id"]  # type: ignore[index]
            joined.append(member)
            if len(joined) == 4:
                all_joined.set()
            await all_joined.wait()  # every process claims at the same time
            log = await proc.call("contend", member=member, paths=files, claims=150, seed=n)
            logs.append(log)  # type: ignore[arg-type]

    async with anyio.create_task_group() as tg:
        for n in range(4):
            tg.start_soon(run, n)
    spans = [entry for log in logs for entry in log if "path" in entry]
    claims = [entry["claim"] for log in logs for entry in log if "claim" in entry]
    assert len(logs) == 4
    assert any(claims), "no claim succeeded"
    assert not all(claims), "no claim was refused: no contention, the test proved nothing"
    assert {s["mode"] for s in spans} == {"exclusive", "shared"}
    assert not overlapping(spans)


def test_the_invariant_check_sees_an_overlap() -> None:
    one = {"path": "p", "member": "a", "mode": "exclusive", "start": 1.0, "end": 3.0}
    two = {"path": "p", "member": "b", "mode": "shared", "start": 2.0, "end": 4.0}
    three = {"path": "p", "member": "c", "mode": "shared", "start": 2.0, "end": 4.0}
    assert overlapping([one, two])
    assert not overlapping([two, three])
    assert not overlapping([one, {**two, "start": 3.0}])


async def test_a_symlinked_file_is_leased_under_the_name_claimed(tmp_path: Path) -> None:
    """The directory is resolved, the final name kept: ``current.py`` (a link to
    ``v1.py``) is its own lease, reported under the name the member used, wherever the
    link points; a final ``..`` names a directory, resolved whole."""
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "real" / "v1.py").write_text("1")
    os.symlink(tmp_path / "real", tmp_path / "repo")
    os.symlink(tmp_path / "real" / "v1.py", tmp_path / "real" / "current.py")
    real = str((tmp_path / "real").resolve())
    async with Room(tmp_path / "s.db") as room:
        a = (await room.join("r", cwd=str(tmp_path / "repo"))).member_id
        b = (await room.join("r", cwd=str(tmp_path / "repo"))).member_id
        claimed = await room.claim(a, "current.py")
        assert claimed.path == os.path.join(real, "current.py")
        assert (await room.claim(b, "v1.py")).ok
        assert [lease.path for lease in await room.leases(a)] == [claimed.path]
        assert (await room.check("sub/..", member=a)).path == real


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


async def test_a_lease_claimed_through_a_symlink_is_released_by_the_same_path(
    tmp_path: Path,
) -> None:
    """A member claims ``current.py`` (a symlink) and later releases ``current.py``; the
    link was pointed at another file meanwhile (as a deploy does). The release finds the
    lease by the name claimed: resolving the link at each call would miss it and leave the
    lease held until its TTL."""
    (tmp_path / "v1.py").write_text("1")
    (tmp_path / "v2.py").write_text("2")
    link = tmp_path / "current.py"
    os.symlink(tmp_path / "v1.py", link)
    async with Room(tmp_path / "s.db") as room:
        member = (await room.join("r", cwd=str(tmp_path))).member_id
        assert (await room.claim(member, "current.py")).ok
        link.unlink()
        os.symlink(tmp_path / "v2.py", link)
        assert await room.release(member, "current.py") is True
        assert await room.leases(member) == ()


async def test_a_double_slash_path_and_its_single_slash_form_contend_for_one_lease(
    tmp_path: Path,
) -> None:
    """``//tmp/x`` and ``/tmp/x`` are one file on Linux; ``normpath`` keeps a leading
    ``//``, so the lease's path must fold it, or two members each hold an exclusive lease
    on the one file."""
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
