"""The bridge and a session's own member id: sending to it is sending to oneself, refused
as a send to the sender's own address is."""

from __future__ import annotations

from pathlib import Path

import pytest

from subagents import ConfigError
from tests.room.bridge_support import bridged

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("form", ["{}", "room:{}"])
async def test_a_send_to_the_sessions_own_member_id_is_refused_naming_to(
    tmp_path: Path, form: str
) -> None:
    async with bridged(tmp_path / "s.db") as a:
        with pytest.raises(ConfigError, match="to"):
            a.manager.send(form.format(a.link.member_id), "to myself")
        assert await a.link.sent() == ()  # nothing stored in the room either
