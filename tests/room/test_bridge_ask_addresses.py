"""The bridge and what an ask names: a truncated member id is no selector; the ask
fails as a send to it does, naming the member meant."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from subagents import ConfigError
from tests.room.bridge_support import bridged

pytestmark = pytest.mark.anyio


async def test_an_ask_of_a_truncated_member_id_is_not_refused_as_a_selector(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    async with bridged(path) as a, bridged(path) as b:
        with anyio.fail_after(2):
            try:
                await a.manager.ask(b.link.member_id[:8], "are you there?")
            except ConfigError as exc:
                assert "selector" not in str(exc)
            except Exception as exc:  # the room's refusal, naming the member meant
                assert b.link.member_id in str(exc)
