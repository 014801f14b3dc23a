"""Review of the capacity tally (``SqliteMailbox._full``): exact within a process.

``store.mailbox`` makes "a new object over the session's rows" and "every object
opening the same session shares its entries"; design/store.md: capacity counts the
committed live entries plus this process's pending puts, "exact within a process". The
tally (the last count plus this object's puts since) misses the entries another object
of the same process committed since, so a put is accepted into a full mailbox.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from subagents import MailboxFull
from subagents.store import SqliteStore
from tests.store.support import env

pytestmark = pytest.mark.anyio


async def test_a_put_into_a_mailbox_filled_by_another_object_of_the_process_is_refused(
    tmp_path: Path,
) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        first = store.mailbox("root", capacity=2)
        second = store.mailbox("root", capacity=2)
        first.put("t1", env("t1"))
        await first.wait_committed()
        second.put("t2", env("t2"))
        await second.wait_committed()
        assert len(first) == 2  # full, and both entries committed
        with pytest.raises(MailboxFull):
            first.put("t3", env("t3"))


async def test_capacity_holds_after_another_object_fills_the_rest(tmp_path: Path) -> None:
    """The same with a larger capacity: one object puts a few, another fills the rest,
    every put committed; the first object's next new id must be refused."""
    async with SqliteStore(tmp_path / "s.db") as store:
        mine = store.mailbox("root", capacity=10)
        theirs = store.mailbox("root", capacity=10)
        for i in range(3):
            mine.put(f"m{i}", env(f"m{i}"))
        await mine.wait_committed()
        for i in range(7):
            theirs.put(f"o{i}", env(f"o{i}"))
        await theirs.wait_committed()
        assert len(mine) == 10
        with pytest.raises(MailboxFull):
            mine.put("one-too-many", env("one-too-many"))
