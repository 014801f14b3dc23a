"""The bridge and the room's unknown-id rules: an address that is not a member id but
names one (its harness key, a truncated id as ``room:<prefix>``) gets an error naming the
member meant; a bare short hex is a local address."""

from __future__ import annotations

from pathlib import Path

import pytest

from subagents import UnknownPeer
from tests.room.bridge_support import Side, bridged, failed

pytestmark = pytest.mark.anyio


async def _refusal(side: Side, address: str) -> str:
    """What a send to ``address`` says: the error raised, or its receipt's failure."""
    try:
        receipt = side.manager.send(address, "are you there?")
    except UnknownPeer as exc:
        return str(exc)
    await failed(side.manager, receipt)
    return receipt.detail


@pytest.mark.parametrize("form", ["harness key", "truncated id"])
async def test_an_address_naming_a_member_another_way_gets_an_error_naming_its_id(
    tmp_path: Path, form: str
) -> None:
    path = tmp_path / "s.db"
    async with bridged(path) as a, bridged(path) as b:
        address = b.link.harness_key if form == "harness key" else f"room:{b.link.member_id[:8]}"
        assert b.link.member_id in await _refusal(a, address)


async def test_a_bare_truncated_member_id_stays_local_with_a_hint_for_the_room(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    async with bridged(path) as a, bridged(path) as b:
        with pytest.raises(UnknownPeer, match="room:<id>"):
            a.manager.send(b.link.member_id[:8], "are you there?")
        assert await a.room.history("default") == ()  # nothing went to the room


async def test_a_truncated_local_task_id_stays_a_local_unknown_peer_naming_the_task(
    tmp_path: Path,
) -> None:
    import anyio

    from subagents import Request, RunContext
    from tests.helpers import spec

    gate = anyio.Event()

    async def waits(request: Request, ctx: RunContext) -> str:
        await gate.wait()
        return "done"

    async with bridged(tmp_path / "s.db", [spec("waits", waits)]) as a:
        handle = a.manager.spawn("waits", "go")
        try:
            with pytest.raises(UnknownPeer) as raised:
                a.manager.send(handle.task_id[:8], "hello")
            assert handle.task_id in raised.value.suggestions
        finally:
            gate.set()
