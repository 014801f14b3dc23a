"""Members and rooms: join, leave, the two id shapes, wake levels and the room's cap, and
the unknown-id rules."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from subagents import ConfigError
from subagents.room import MEMBER_ID, Room, UnknownMember

pytestmark = pytest.mark.anyio


async def test_join_gives_a_member_id_of_its_own_shape_and_leave_keeps_it_valid(
    tmp_path: Path,
) -> None:
    async with Room(tmp_path / "s.db") as room:
        joined = await room.join("r", extra_rooms=["s", "t"], label="me", tags=["py"])
        member = joined.member_id
        assert MEMBER_ID.fullmatch(member)
        assert joined.rooms == ("r", "s", "t")
        assert await room.leave(member, "s") == ("r", "t")
        await room.claim(member, "x")
        assert await room.leave(member) == ()
        assert await room.leases(member) == ()  # leaving every room releases its leases
        assert await room.unread(member) == 0  # the id still answers
        assert [m.member_id for m in await room.who("r")] == []


async def test_a_rejoin_with_the_harness_key_is_the_same_member(tmp_path: Path) -> None:
    key = str(uuid.uuid4())
    async with Room(tmp_path / "s.db") as room:
        first = await room.join("r", harness_key=key, label="a")
        again = await room.join("s", harness_key=key.upper())
        assert again.member_id == first.member_id
        assert again.rooms == ("r", "s")
        other = await room.join("r")
        assert other.member_id != first.member_id


async def test_a_rejoin_keeps_the_level_unless_it_raises_it_up_to_the_cap(
    tmp_path: Path,
) -> None:
    key = str(uuid.uuid4())
    async with Room(tmp_path / "s.db") as room:
        assert (await room.join("r", harness_key=key, autonomy="hold")).autonomy == "hold"
        kept = await room.join("r", harness_key=key)
        assert (kept.autonomy, kept.warning) == ("hold", None)
        assert await room.set_autonomy_cap("r", "notify") == 0
        capped = await room.join("r", harness_key=key, autonomy="wake")
        assert capped.autonomy == "notify"
        assert capped.warning is not None
        assert "cap" in capped.warning
        refused = await room.join("r", harness_key=key, autonomy="hold")
        assert refused.autonomy == "notify"
        assert refused.warning is not None
        assert "'notify' stays" in refused.warning


async def test_the_room_cap_lowers_members_above_it_and_caps_new_ones(tmp_path: Path) -> None:
    async with Room(tmp_path / "s.db") as room:
        woken = (await room.join("r", autonomy="wake")).member_id
        held = (await room.join("r", autonomy="hold")).member_id
        await room.join("elsewhere", autonomy="wake")
        assert await room.set_autonomy_cap("r", "notify") == 1
        levels = {m.member_id: m.autonomy for m in await room.who()}
        assert levels[woken] == "notify"
        assert levels[held] == "hold"
        assert sorted(levels.values()) == ["hold", "notify", "wake"]
        new = await room.join("r")
        assert new.autonomy == "notify"
        assert new.warning is not None


async def test_bad_join_arguments_name_their_field(tmp_path: Path) -> None:
    async with Room(tmp_path / "s.db") as room:
        with pytest.raises(ConfigError, match=r"^room"):
            await room.join("")
        with pytest.raises(ConfigError, match=r"^extra_rooms"):
            await room.join("r", extra_rooms="s")  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=r"^autonomy"):
            await room.join("r", autonomy="loud")  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=r"^harness_key must be a UUID"):
            await room.join("r", harness_key="abc")


async def test_a_member_id_given_as_harness_key_says_which_is_which(tmp_path: Path) -> None:
    async with Room(tmp_path / "s.db") as room:
        member = (await room.join("r")).member_id
        with pytest.raises(ConfigError, match="this is a member id") as caught:
            await room.join("r", harness_key=member)
        assert caught.value.field == "harness_key"


# ------------------------------------------------------------------ unknown ids


async def test_a_harness_key_where_a_member_id_goes_names_its_member(tmp_path: Path) -> None:
    key = str(uuid.uuid4())
    async with Room(tmp_path / "s.db") as room:
        member = (await room.join("r", harness_key=key)).member_id
        with pytest.raises(UnknownMember, match="is a harness key") as caught:
            await room.receive(key)
        assert caught.value.reason == "harness_key"
        assert caught.value.suggestions == (member,)
        assert member in str(caught.value)


async def test_a_truncated_id_or_a_label_is_matched_among_members(tmp_path: Path) -> None:
    async with Room(tmp_path / "s.db") as room:
        member = (await room.join("r", label="reviewer")).member_id
        with pytest.raises(UnknownMember, match="did you mean") as caught:
            await room.unread(member[:7])
        assert caught.value.reason == "partial"
        assert caught.value.suggestions == (member,)
        with pytest.raises(UnknownMember) as by_label:
            await room.send(member, "review", "hi")
        assert by_label.value.suggestions == (member,)


async def test_a_well_formed_id_with_nothing_behind_it_is_gone_or_from_another_store(
    tmp_path: Path,
) -> None:
    async with Room(tmp_path / "one.db") as one, Room(tmp_path / "two.db") as two:
        member = (await one.join("r")).member_id
        with pytest.raises(UnknownMember, match="another store") as caught:
            await two.receive(member)
        assert caught.value.reason == "gone"
        assert caught.value.store == str(tmp_path / "two.db")


async def test_a_harness_key_with_no_member_is_gone_or_from_another_store(
    tmp_path: Path,
) -> None:
    key = str(uuid.uuid4())
    async with Room(tmp_path / "one.db") as one, Room(tmp_path / "two.db") as two:
        await one.join("r", harness_key=key)
        with pytest.raises(UnknownMember, match=r"gone .*or from another store") as caught:
            await two.unread(key)
        assert caught.value.reason == "gone"
        assert "harness key" in str(caught.value)


async def test_an_id_of_neither_shape_says_what_each_looks_like(tmp_path: Path) -> None:
    async with Room(tmp_path / "s.db") as room:
        await room.join("r")
        for given in ("zz-not-an-id", 42):
            with pytest.raises(UnknownMember, match="16 lower-case hex") as caught:
                await room.unread(given)  # type: ignore[arg-type]
            assert caught.value.reason == "malformed"


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
