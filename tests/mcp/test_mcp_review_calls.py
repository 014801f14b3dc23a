"""Review of ``tools/call``: a ``wait_agent`` call whose arguments the toolset refuses
does nothing else first (the server's progress reporter looks its ids up before the
toolset has validated them)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from subagents import SubagentConfig
from tests.mcp.support import MODES, connected, structured

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("mode", MODES)
async def test_a_refused_task_id_is_never_looked_up_in_the_store(
    mode: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = SubagentConfig(store_path=tmp_path / "runs.db")
    async with connected(mode, config=config) as (_, client):
        with caplog.at_level(logging.WARNING, logger="subagents"):
            result = await client.call_tool("wait_agent", {"task_ids": "\ud800"})
    assert result.is_error is True
    assert structured(result) == {"error": "invalid_arguments", "field": "task_ids"}
    # The lookup the reporter makes logs a store failure for an argument that never
    # reached the store's business.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
