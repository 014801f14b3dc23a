"""The bridge: an ``ask`` to a room member ends as soon as its question cannot reach it."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from tests.room.bridge_support import bridged

pytestmark = pytest.mark.anyio


async def test_an_ask_to_an_unknown_member_id_ends_unknown_without_waiting_for_its_timeout(
    tmp_path: Path,
) -> None:
    async with bridged(tmp_path / "s.db") as a:
        with anyio.fail_after(5):
            reply = await a.manager.ask("0123456789abcdef", "anyone?", timeout=None)
        assert reply.outcome == "unknown", reply
        assert reply.receipt.reason == "unknown"
