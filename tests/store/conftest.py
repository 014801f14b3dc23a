"""Fixtures of the store's tests."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from subagents.store import SqliteStore


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store file with its schema and nothing else, to copy (faster than creating one)."""
    path = tmp_path_factory.mktemp("template") / "empty.db"

    async def create() -> None:
        async with SqliteStore(path):
            pass

    anyio.run(create)
    return path
