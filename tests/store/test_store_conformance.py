"""The durable mailbox passes the mailbox conformance suite, on asyncio and trio: every
check, each against a fresh session of one store file."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from subagents import Mailbox
from subagents.store import SqliteMailbox, SqliteStore
from subagents.testing import check_mailbox, mailbox_checks

pytestmark = pytest.mark.anyio

NAMES = [check.name for check in mailbox_checks(Mailbox)]


@pytest.fixture(autouse=True)
def _quiet_expected_hook_errors(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """The suite feeds mailboxes raising hooks on purpose."""
    with caplog.at_level(logging.CRITICAL, logger="subagents.mailbox"):
        yield


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    async with SqliteStore(tmp_path / "store.db") as store:
        yield store


def sessions_of(store: SqliteStore) -> object:
    """The suite's factory: each call a new session of the same store."""

    def make(**kwargs: object) -> SqliteMailbox:
        return store.mailbox(uuid.uuid4().hex, **kwargs)  # type: ignore[arg-type]

    return make


@pytest.mark.parametrize("name", NAMES)
async def test_the_durable_mailbox_passes(name: str, store: SqliteStore) -> None:
    [check] = [c for c in mailbox_checks(sessions_of(store)) if c.name == name]  # type: ignore[arg-type]
    await check()


async def test_the_whole_suite_in_one_call_with_normal_sync(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "normal.db", synchronous="NORMAL") as store:
        await check_mailbox(sessions_of(store))  # type: ignore[arg-type]
        assert not store.statistics().closed
    stats = store.statistics()
    assert stats.batches > 0
    assert stats.writes >= stats.batches
    assert stats.closed
    assert stats.queued == 0
    assert stats.synchronous == "NORMAL"
