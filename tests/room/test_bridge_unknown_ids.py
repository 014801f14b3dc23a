"""The bridge and the room's unknown-id rules: an address that is not a member id but
names one (its harness key, a truncated id) gets an error naming the member meant."""

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
        address = b.link.harness_key if form == "harness key" else b.link.member_id[:8]
        assert b.link.member_id in await _refusal(a, address)
