"""The bridge and what an ask names: a truncated member id (``room:<prefix>``) or a
harness key is no selector; the ask ends as a send to it does, ``unknown`` naming the
member meant."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from tests.room.bridge_support import bridged

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("form", ["harness key", "truncated id"])
async def test_an_ask_of_a_member_named_another_way_ends_unknown_naming_its_id(
    tmp_path: Path, form: str
) -> None:
    path = tmp_path / "s.db"
    async with bridged(path) as a, bridged(path) as b:
        # A truncated id goes as room:<prefix> (a bare short hex is a local address).
        address = b.link.harness_key if form == "harness key" else f"room:{b.link.member_id[:8]}"
        with anyio.fail_after(2):
            reply = await a.manager.ask(address, "are you there?")
        assert reply.outcome == "unknown"
        assert b.link.member_id in reply.receipt.detail
